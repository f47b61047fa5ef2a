// Scaled F16 casting on CUDA: the F16 targets of quantize / quantize_transpose and the F16 source of
// dequantize (see quantize_f16.cuh). Kept apart from quantize.cu, whose FP8 kernels are tuned to the
// byte: these are plain, vectorized (8 elements per 16- or 32-byte access) grid-stride kernels and a
// 32x32 shared-memory transpose, which is enough for F16 weights and optimizer state.
//
// Numerics, identical to kernels/cpu/quantize.cpp:
//   - decode exactly (the shared software codec), one float32 multiply (scaling.hpp's scaled());
//   - encode RNE satfinite: a non-NaN y is clamped to [-65504, 65504] and converted by the hardware
//     (cvt.rn.f16x2.f32). Clamping first is exactly satfinite: every |y| <= 65504 is converted
//     without overflow, every |y| > 65504 (inf included) becomes +-65504 -- what RNE gives anyway in
//     (65504, 65520) and what saturation gives beyond. A NaN becomes the canonical 0x7E00 with y's
//     sign, explicitly (the hardware's NaN output is not specified to the bit);
//   - statistics: saturated = |y| > 65504 (NaN not), underflowed = x nonzero and not NaN, code +-0.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "quantize_f16.cuh"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda::scaled_f16 {
namespace {

using namespace casting;  // the pack, the reduction, the tally, the epilogue, the launch helpers

constexpr int kVec = 8;  // elements per vector access
constexpr float kF16Max = 65504.0f;

__device__ __forceinline__ uint32_t nan_code(float y) { return ((codec::f32_bits(y) >> 31) << 15) | codec::F16::kQuietNaN; }

__device__ __forceinline__ float clamp_f16(float y) { return fminf(fmaxf(y, -kF16Max), kF16Max); }

// RNE satfinite float32 -> F16 of one value.
__device__ __forceinline__ uint16_t f16_satfinite(float y) {
    if (y != y) return static_cast<uint16_t>(nan_code(y));
    return __half_as_ushort(__float2half_rn(clamp_f16(y)));
}

// Two at once: a in the low half, b in the high half (one paired conversion).
__device__ __forceinline__ uint32_t f16x2_satfinite(float a, float b) {
    const __half2 h = __floats2half2_rn(clamp_f16(a), clamp_f16(b));
    uint32_t w;
    memcpy(&w, &h, sizeof w);
    if (a != a) w = (w & 0xFFFF0000u) | nan_code(a);
    if (b != b) w = (w & 0x0000FFFFu) | (nan_code(b) << 16);
    return w;
}

template <bool kStats>
__device__ __forceinline__ void count(float x, float y, uint32_t code, Tally &t) {
    t.amax = max(t.amax, amax_bits_of(x));
    if (kStats) {
        t.saturated += fabsf(y) > kF16Max ? 1u : 0u;  // false for NaN
        t.underflowed += (x != 0.0f && x == x && (code & 0x7FFFu) == 0) ? 1u : 0u;
    }
}

template <bool kStats>
__device__ __forceinline__ uint16_t quantize_one(float x, float scale, Tally &t) {
    const float y = scaled(x, scale);
    const uint16_t q = f16_satfinite(y);
    count<kStats>(x, y, q, t);
    return q;
}

template <fp8amp_dtype S, bool kVectorized, bool kStats>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const typename Storage<S>::type *__restrict__ src,
                                                            uint16_t *__restrict__ dst, size_t n, ScalingState *meta,
                                                            float *scale_inv, float *scale_inv_t) {
    using SrcT = typename Storage<S>::type;
    const float scale = quantize_scale(*meta);
    Tally t;
    const size_t stride = size_t(gridDim.x) * kThreads;
    const size_t first = blockIdx.x * size_t(kThreads) + threadIdx.x;
    size_t done = 0;
    if (kVectorized) {
        const size_t packs = n / kVec;
        const auto *in = reinterpret_cast<const PackN<SrcT, kVec> *>(src);
        auto *out = reinterpret_cast<PackN<uint32_t, kVec / 2> *>(dst);
        for (size_t i = first; i < packs; i += stride) {
            const PackN<SrcT, kVec> a = in[i];
            float x[kVec], y[kVec];
#pragma unroll
            for (int k = 0; k < kVec; ++k) {
                x[k] = to_f32<S>(a.v[k]);
                y[k] = scaled(x[k], scale);
            }
            PackN<uint32_t, kVec / 2> b;
#pragma unroll
            for (int k = 0; k < kVec / 2; ++k) {
                b.v[k] = f16x2_satfinite(y[2 * k], y[2 * k + 1]);
                count<kStats>(x[2 * k], y[2 * k], b.v[k] & 0xFFFFu, t);
                count<kStats>(x[2 * k + 1], y[2 * k + 1], b.v[k] >> 16, t);
            }
            out[i] = b;
        }
        done = packs * kVec;
    }
    for (size_t i = done + first; i < n; i += stride) dst[i] = quantize_one<kStats>(to_f32<S>(src[i]), scale, t);
    finish_block<kStats>(t, meta, scale, scale_inv, scale_inv_t, n);
}

// 32 x 32 tiles, 256 threads: each thread quantizes 4 elements of a tile (coalesced along rows of
// src and dst), the codes go through shared memory (32-bit slots, row pitch 33: conflict-free in
// both directions) and come out along rows of dst_t.
constexpr int kTile = 32;

template <fp8amp_dtype S, bool kStats>
__global__ void __launch_bounds__(kThreads) quantize_transpose_kernel(const typename Storage<S>::type *__restrict__ src,
                                                                      uint16_t *__restrict__ dst,
                                                                      uint16_t *__restrict__ dst_t, size_t rows,
                                                                      size_t cols, ScalingState *meta, float *scale_inv,
                                                                      float *scale_inv_t) {
    __shared__ uint32_t tile[kTile][kTile + 1];
    const float scale = quantize_scale(*meta);
    Tally t;
    const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
    const size_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
    for (size_t id = blockIdx.x; id < tiles_r * tiles_c; id += gridDim.x) {
        const size_t r0 = (id / tiles_c) * kTile, c0 = (id % tiles_c) * kTile;
        for (int j = ty; j < kTile; j += kThreads / kTile) {
            const size_t r = r0 + j, c = c0 + tx;
            if (r < rows && c < cols) {
                const uint16_t q = quantize_one<kStats>(to_f32<S>(src[r * cols + c]), scale, t);
                dst[r * cols + c] = q;
                tile[j][tx] = q;
            }
        }
        __syncthreads();
        for (int j = ty; j < kTile; j += kThreads / kTile) {
            const size_t c = c0 + j, r = r0 + tx;  // row c of dst_t, column r
            if (c < cols && r < rows) dst_t[c * rows + r] = static_cast<uint16_t>(tile[tx][j]);
        }
        __syncthreads();  // the tile is reused by this block's next tile
    }
    finish_block<kStats>(t, meta, scale, scale_inv, scale_inv_t, rows * cols);
}

template <fp8amp_dtype D, bool kVectorized>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint16_t *__restrict__ src,
                                                              typename Storage<D>::type *__restrict__ dst, size_t n,
                                                              const float *scale_inv_ptr) {
    using DstT = typename Storage<D>::type;
    const float s = *scale_inv_ptr;
    const size_t stride = size_t(gridDim.x) * kThreads;
    const size_t first = blockIdx.x * size_t(kThreads) + threadIdx.x;
    size_t done = 0;
    if (kVectorized) {
        const size_t packs = n / kVec;
        const auto *in = reinterpret_cast<const PackN<uint16_t, kVec> *>(src);
        auto *out = reinterpret_cast<PackN<DstT, kVec> *>(dst);
        for (size_t i = first; i < packs; i += stride) {
            const PackN<uint16_t, kVec> a = in[i];
            PackN<DstT, kVec> b;
#pragma unroll
            for (int k = 0; k < kVec; ++k) b.v[k] = from_f32<D>(scaled(to_f32<FP8AMP_DTYPE_F16>(a.v[k]), s));
            out[i] = b;
        }
        done = packs * kVec;
    }
    for (size_t i = done + first; i < n; i += stride)
        dst[i] = from_f32<D>(scaled(to_f32<FP8AMP_DTYPE_F16>(src[i]), s));
}

template <class T, int N = kVec>
bool vec_aligned(const void *p) {
    return reinterpret_cast<uintptr_t>(p) % alignof(PackN<T, N>) == 0;
}

}  // namespace

void quantize(int device, cudaStream_t stream, const void *src, fp8amp_dtype src_dtype, void *dst, size_t n,
              const QuantizeTarget &target) {
    dispatch_src(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        using SrcT = typename Storage<S>::type;
        dispatch_bool(vec_aligned<SrcT>(src) && vec_aligned<uint16_t>(dst), [&](auto v) {
            dispatch_bool(target.stats, [&](auto st) {
                const auto kernel = quantize_kernel<S, decltype(v)::value, decltype(st)::value>;
                kernel<<<persistent_grid(device, kernel, n / kVec + 1), kThreads, 0, stream>>>(
                    static_cast<const SrcT *>(src), static_cast<uint16_t *>(dst), n, target.meta, target.scale_inv,
                    target.scale_inv_t);
            });
        });
    });
    check_launch("scaled_f16::quantize_kernel");
}

void quantize_transpose(int device, cudaStream_t stream, const void *src, fp8amp_dtype src_dtype, void *dst,
                        void *dst_t, size_t rows, size_t cols, const QuantizeTarget &target) {
    const size_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
    dispatch_src(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        using SrcT = typename Storage<S>::type;
        dispatch_bool(target.stats, [&](auto st) {
            const auto kernel = quantize_transpose_kernel<S, decltype(st)::value>;
            kernel<<<persistent_grid(device, kernel, tiles * kThreads), kThreads, 0, stream>>>(
                static_cast<const SrcT *>(src), static_cast<uint16_t *>(dst), static_cast<uint16_t *>(dst_t), rows,
                cols, target.meta, target.scale_inv, target.scale_inv_t);
        });
    });
    check_launch("scaled_f16::quantize_transpose_kernel");
}

void dequantize(int device, cudaStream_t stream, const void *src, void *dst, fp8amp_dtype dst_dtype, size_t n,
                const float *scale_inv) {
    dispatch_src(dst_dtype, [&](auto d) {
        constexpr fp8amp_dtype D = decltype(d)::value;
        using DstT = typename Storage<D>::type;
        dispatch_bool(vec_aligned<uint16_t>(src) && vec_aligned<DstT>(dst), [&](auto v) {
            const auto kernel = dequantize_kernel<D, decltype(v)::value>;
            kernel<<<persistent_grid(device, kernel, n / kVec + 1), kThreads, 0, stream>>>(
                static_cast<const uint16_t *>(src), static_cast<DstT *>(dst), n, scale_inv);
        });
    });
    check_launch("scaled_f16::dequantize_kernel");
}

}  // namespace fp8amp::kernels::cuda::scaled_f16
