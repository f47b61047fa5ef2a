// CUDA kernels of the communicator's device compute (kernels/comm.hpp): the arithmetic of the
// shared inline functions, element for element as the CPU reference (kernels/cpu/comm.cpp) does it,
// so that both compute the same bytes. Everything is enqueued on the given stream; nothing
// synchronizes except to_host/from_host.
//
// Speed (issue 17): the large conversions run at memory bandwidth --
//  - dequantize is the library's own kernel (kernels/cuda/quantize.cu: cuda::dequantize with its
//    per-block result table), whose results are the comm's (scaled() then one rounding into the
//    destination) bit for bit; the amax of a wide input is wide_amax_kernel (cuda::amax's bits, but
//    not persistent), cuda::amax where the input is not aligned for its packs;
//  - quantize, the fused accumulate + requantize and the all-reduce's reduce + requantize (which
//    also quantizes this rank's own chunk from its input, in registers) move 16-byte packs of the
//    wide data (8-byte runs of codes in the last), and encode two values per instruction with the
//    hardware conversion cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (encode2, comm_codec.cuh), which gives
//    the software codec's bytes for every float32 that is not a NaN (why: encode2's comment;
//    tests/cuda/test_comm_codec.cu checks all 2^32 inputs on the device); NaN is mapped explicitly.
//    Saturation is counted from the scaled value (comm_saturates), not from the code, so the count
//    does not depend on the encoder;
//  - the grids are not persistent: each block converts a fixed run of packs and retires, so that the
//    NCCL kernels the pipeline runs beside these (core/communicator.cpp) find multiprocessors free;
//    beside a transfer the communicator may bound them (set_grid_limit: at most k blocks, every loop
//    grid-stride), so that they leave multiprocessors and memory bandwidth to NCCL.
// The scalar kernels serve unaligned pointers and the tails, with the software codec throughout.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "casting_common.cuh"
#include "comm.hpp"
#include "cuda_common.cuh"
#include "comm_codec.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 4096 ? (b < 1 ? 1 : b) : 4096);  // grid-stride beyond
}

__device__ float load_real(const void *src, fp8amp_dtype dtype, float s, int64_t k) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return codec::canonical_f32(static_cast<const float *>(src)[k]);
    case FP8AMP_DTYPE_F16: return codec::decode<codec::F16>(static_cast<const uint16_t *>(src)[k]);
    case FP8AMP_DTYPE_BF16: return codec::decode<codec::BF16>(static_cast<const uint16_t *>(src)[k]);
    case FP8AMP_DTYPE_E4M3: return scaled(codec::decode<codec::E4M3>(static_cast<const uint8_t *>(src)[k]), s);
    case FP8AMP_DTYPE_E5M2: return scaled(codec::decode<codec::E5M2>(static_cast<const uint8_t *>(src)[k]), s);
    }
    return 0.0f;
}

// As cpu::with_store: canonical NaN into F32, IEEE rounding into F16/BF16.
__device__ void store_wide(void *dst, fp8amp_dtype dtype, int64_t k, float v) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(dst)[k] = codec::canonical_f32(v); break;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(dst)[k] = static_cast<uint16_t>(codec::encode<codec::F16, false>(v)); break;
    case FP8AMP_DTYPE_BF16: static_cast<uint16_t *>(dst)[k] = static_cast<uint16_t>(codec::encode<codec::BF16, false>(v)); break;
    default: break;
    }
}

__device__ float input_scale(fp8amp_dtype dtype, const float *scale_inv) {
    return (dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2) ? *scale_inv : 1.0f;
}

// Block-wide max of non-negative bits, then one atomic.
__device__ void fold_max(uint32_t local, uint32_t *target) {
    for (int o = 16; o > 0; o >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, o));
    if ((threadIdx.x & 31) == 0 && local) atomicMax(target, local);
}
__device__ void fold_count(unsigned long long local, unsigned long long *target) {
    for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(target, local);
}

__global__ void amax_kernel(const void *src, fp8amp_dtype dtype, const float *scale_inv, int64_t n, uint32_t *amax) {
    const float s = input_scale(dtype, scale_inv);
    uint32_t m = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        m = max(m, amax_bits_of(load_real(src, dtype, s, k)));
    fold_max(m, amax);
}

__global__ void quantize_kernel(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n,
                                const uint32_t *amax_bits, fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out,
                                unsigned long long *saturated) {
    const float in_s = input_scale(dtype, src_scale_inv);
    const float fp8_max = comm_fp8_max(wire);
    const float s = comm_scale(fp8_max, *amax_bits);
    unsigned long long sat = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float y = scaled(load_real(src, dtype, in_s, k), s);
        sat += comm_saturates(wire, y);
        dst[k] = comm_encode(wire, y);
    }
    fold_count(sat, saturated);
    if (scale_inv_out && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_out = 1.0f / s;
}

__global__ void accumulate_kernel(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                                  const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    uint32_t m = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float v = comm_reduce(wire, nranks, f, [&](int j) { return src[j * stride + k]; });
        if (dst) dst[k] = v;
        m = max(m, amax_bits_of(v));
    }
    if (amax_bits) fold_max(m, amax_bits);
}

__global__ void add_count_kernel(unsigned long long *dst, const unsigned long long *src) { *dst += *src; }

__global__ void scale_inv_kernel(const uint32_t *amax_bits, fp8amp_dtype format, float *out) {
    *out = 1.0f / comm_scale(comm_fp8_max(format), *amax_bits);
}

__global__ void dequantize_kernel(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n,
                                  void *dst, fp8amp_dtype dtype) {
    const float s = *scale_inv;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        store_wide(dst, dtype, k, load_real(src, format, s, k));
}

__global__ void convert_kernel(const float *src, int64_t n, void *dst, fp8amp_dtype dtype) {
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        store_wide(dst, dtype, k, src[k]);
}

// ---- the vectorized kernels -----------------------------------------------------------------------

constexpr int kVec = 8;     // elements per pack of quantize (16 bytes of BF16/F16 in, 8 codes out)
constexpr int kCodes = 16;  // codes per pack of the accumulation (16 bytes of each rank in)
constexpr int kPacksPerThread = 4;

// A grid of blocks that each take kThreads * kPacksPerThread packs and retire (the loops are
// grid-stride all the same, so a capped grid stays correct).
int tile_blocks(int64_t packs) {
    const int64_t per_block = int64_t(kThreads) * kPacksPerThread;
    const int64_t b = (packs + per_block - 1) / per_block;
    return static_cast<int>(b < 1 ? 1 : (b > (int64_t(1) << 20) ? (int64_t(1) << 20) : b));
}

// The values of a pack of kVec source elements: what load_real gives, bit for bit where it matters
// (a BF16 NaN keeps its sign and its payload here, load_real makes it the canonical one; either NaN
// goes through scaled() unchanged and is encoded as the canonical code with its sign, and its amax
// is inf either way).
template <fp8amp_dtype S>
using SrcPack = cuda::casting::PackN<typename cuda::Storage<S>::type, kVec>;
template <fp8amp_dtype S>
__device__ __forceinline__ void unpack(const SrcPack<S> &a, float in_s, float x[kVec]) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        if constexpr (S == FP8AMP_DTYPE_BF16) x[i] = __uint_as_float(static_cast<uint32_t>(a.v[i]) << 16);
        else if constexpr (S == FP8AMP_DTYPE_F32) x[i] = a.v[i];
        else if constexpr (S == FP8AMP_DTYPE_F16) x[i] = codec::decode<codec::F16>(a.v[i]);
        else x[i] = scaled(cuda::to_f32<S>(a.v[i]), in_s);
    }
}
template <fp8amp_dtype S>
__device__ __forceinline__ void load_pack(const void *src, int64_t pack, float in_s, float x[kVec]) {
    unpack<S>(static_cast<const SrcPack<S> *>(src)[pack], in_s, x);
}

// A pack of the wide inputs or outputs that a pass touches once (the gradients, 2 bytes an element
// and more), loaded or stored with the evict-first hint (ld.global.cs / st.global.cs): so that they
// do not push out of L2 the codes (1 byte an element) that a copy engine reads or a kernel reads back
// right after they were written or received. Changes no byte.
template <class P>
__device__ __forceinline__ P load_once(const P *p) {
    static_assert(sizeof(P) % 8 == 0 && sizeof(P) <= 32, "packs of 8, 16 or 32 bytes");
    P v;
    if constexpr (sizeof(P) == 8) {
        const uint2 u = __ldcs(reinterpret_cast<const uint2 *>(p));
        memcpy(&v, &u, sizeof u);
    } else {
        uint4 u[sizeof(P) / 16];
#pragma unroll
        for (size_t i = 0; i < sizeof(P) / 16; ++i) u[i] = __ldcs(reinterpret_cast<const uint4 *>(p) + i);
        memcpy(&v, u, sizeof u);
    }
    return v;
}

// K values (a multiple of 4) scaled by s and encoded into `format` W, four codes a word, with the
// saturations counted into sat.
template <fp8amp_dtype W, int K, class Count>
__device__ __forceinline__ void encode_pack(const float *v, float s, Count &sat, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < K; i += 2) {
        const float y0 = scaled(v[i], s), y1 = scaled(v[i + 1], s);
        sat += comm_saturates(W, y0) + comm_saturates(W, y1);
        const uint32_t pair = cuda::encode2<W>(y0, y1);
        if (i % 4 == 0) w[i / 4] = pair;
        else w[i / 4] |= pair << 16;
    }
}

template <fp8amp_dtype S, fp8amp_dtype W>
__global__ void __launch_bounds__(kThreads) quantize_vec_kernel(const void *__restrict__ src, const float *src_scale_inv, int64_t n,
                                                                const uint32_t *amax_bits, uint8_t *__restrict__ dst,
                                                                float *scale_inv_out, unsigned long long *saturated) {
    const float in_s = input_scale(S, src_scale_inv);
    const float s = comm_scale(comm_fp8_max(W), *amax_bits);
    const int64_t packs = n / kVec;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    unsigned long long sat = 0;
    // Two packs a thread per iteration, both loads issued before any arithmetic.
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += 2 * step) {
        const int64_t p1 = p + step;
        const SrcPack<S> a = load_once(static_cast<const SrcPack<S> *>(src) + p);
        SrcPack<S> b{};
        if (p1 < packs) b = load_once(static_cast<const SrcPack<S> *>(src) + p1);
        float x[kVec];
        uint32_t w[kVec / 4];
        unpack<S>(a, in_s, x);
        encode_pack<W, kVec>(x, s, sat, w);
        reinterpret_cast<uint2 *>(dst)[p] = make_uint2(w[0], w[1]);
        if (p1 < packs) {
            unpack<S>(b, in_s, x);
            encode_pack<W, kVec>(x, s, sat, w);
            reinterpret_cast<uint2 *>(dst)[p1] = make_uint2(w[0], w[1]);
        }
    }
    // The tail, with the software codec.
    for (int64_t k = packs * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float y = scaled(load_real(src, S, in_s, k), s);
        sat += comm_saturates(W, y);
        dst[k] = comm_encode(W, y);
    }
    fold_count(sat, saturated);
    if (scale_inv_out && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_out = 1.0f / s;
}

// The amax of an FP8 input's values (code * its scale_inv); wide inputs use cuda::amax.
template <fp8amp_dtype S>
__global__ void __launch_bounds__(kThreads) amax_vec_kernel(const void *src, const float *scale_inv, int64_t n,
                                                            uint32_t *amax) {
    const float s = input_scale(S, scale_inv);
    const int64_t packs = n / kVec;
    uint32_t m = 0;
#pragma unroll 2  // two packs' loads in flight (the pointers are __restrict__)
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
        float x[kVec];
        load_pack<S>(src, p, s, x);
#pragma unroll
        for (int i = 0; i < kVec; ++i) m = max(m, amax_bits_of(x[i]));
    }
    for (int64_t k = packs * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        m = max(m, amax_bits_of(load_real(src, S, s, k)));
    fold_max(m, amax);
}

// The amax of a wide input (F32, F16, BF16) for the all-reduce's first pass: max of amax_bits_of(value)
// -- cuda::amax's bits (kernels/cuda/quantize.cu), computed the same way (16-bit formats reduced on
// their bit patterns, magnitudes ordering like their bits, NaN above inf, converted once). Each block
// takes tiles of kT * kAmaxPacks packs (64 kB of BF16 with 256 threads), with kAmaxInFlight packs'
// loads issued before any arithmetic, and folds them with one atomic: a grid of 256-thread blocks, a
// tile each, that retire (not persistent; grid-stride beyond set_grid_limit's cap). (Tiles, not a
// grid-stride walk per thread, so that one block's loads stay within a few contiguous runs.)
constexpr int kAmaxPacks = 16;
constexpr int kAmaxInFlight = 4;

template <fp8amp_dtype S>
__device__ __forceinline__ uint32_t wide_pack_amax(const SrcPack<S> &a) {
    if constexpr (S == FP8AMP_DTYPE_F16 || S == FP8AMP_DTYPE_BF16) {
        uint32_t w[kVec / 2];
        memcpy(w, a.v, sizeof w);
        uint32_t m2 = 0;
#pragma unroll
        for (int k = 0; k < kVec / 2; ++k) m2 = __vmaxu2(m2, w[k] & 0x7FFF7FFFu);
        const uint32_t code = max(m2 & 0xFFFFu, m2 >> 16);
        if constexpr (S == FP8AMP_DTYPE_BF16) return min(code << 16, 0x7F800000u);
        else return code > 0x7C00u ? 0x7F800000u : __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(code))));
    } else {
        uint32_t m = 0;
#pragma unroll
        for (int k = 0; k < kVec; ++k) m = max(m, amax_bits_of(a.v[k]));
        return m;
    }
}

template <fp8amp_dtype S, int kT>
__global__ void __launch_bounds__(kT) wide_amax_kernel(const void *__restrict__ src, int64_t n, uint32_t *amax) {
    const auto *in = static_cast<const SrcPack<S> *>(src);
    const int64_t packs = n / kVec;
    const int64_t tile = int64_t(kT) * kAmaxPacks;
    uint32_t m = 0;
    for (int64_t base = blockIdx.x * tile; base < packs; base += int64_t(gridDim.x) * tile) {
#pragma unroll
        for (int u0 = 0; u0 < kAmaxPacks; u0 += kAmaxInFlight) {
            SrcPack<S> a[kAmaxInFlight];
#pragma unroll
            for (int u = 0; u < kAmaxInFlight; ++u) {
                const int64_t p = base + int64_t(u0 + u) * kT + threadIdx.x;
                if (p < packs) a[u] = load_once(in + p);
                else a[u] = SrcPack<S>{};
            }
#pragma unroll
            for (int u = 0; u < kAmaxInFlight; ++u) m = max(m, wide_pack_amax<S>(a[u]));
        }
    }
    // The tail (n % kVec elements), by the first block.
    if (blockIdx.x == 0)
        for (int64_t k = packs * kVec + threadIdx.x; k < n; k += kT) m = max(m, amax_bits_of(load_real(src, S, 1.0f, k)));
    // One atomic a block: the warps' maxima through shared memory.
    __shared__ uint32_t warp_max[kT / 32];
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < kT / 32 ? warp_max[threadIdx.x] : 0u;
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x == 0 && m) atomicMax(amax, m);
    }
}

// The reduced values of kCodes consecutive elements (comm_reduce's arithmetic, rank by rank over 16-
// byte loads): sum_j decode(code_j) in rank order with comm_add, then scaled() by f. The codes are
// decoded four at a time by decode4, which gives codec::decode's floats.
template <fp8amp_dtype W>
__device__ __forceinline__ void reduce_pack(const uint8_t *src, int64_t stride, int nranks, int64_t pack, float f,
                                            float v[kCodes]) {
#pragma unroll
    for (int i = 0; i < kCodes; ++i) v[i] = 0.0f;
    for (int j = 0; j < nranks; ++j) {
        const uint4 u = reinterpret_cast<const uint4 *>(src + j * stride)[pack];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float d[4];
            cuda::decode4<W>(w[q], d);  // codec::decode's floats (comm_codec.cuh)
#pragma unroll
            for (int k = 0; k < 4; ++k) v[4 * q + k] = comm_add(v[4 * q + k], d[k]);
        }
    }
#pragma unroll
    for (int i = 0; i < kCodes; ++i) v[i] = scaled(v[i], f);
}

// The accumulation's first pass: the amax of the reduced values (and, for the reduce-scatter's
// float32 output, the values themselves when dst is not null).
template <fp8amp_dtype W>
__global__ void __launch_bounds__(kThreads) accumulate_vec_kernel(const uint8_t *__restrict__ src, int64_t stride, int nranks,
                                                                  int64_t n, const float *wire_scale_inv, bool average,
                                                                  float *__restrict__ dst, uint32_t *amax_bits) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    const int64_t packs = n / kCodes;
    uint32_t m = 0;
#pragma unroll 2  // two packs' loads in flight (the pointers are __restrict__)
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
        float v[kCodes];
        reduce_pack<W>(src, stride, nranks, p, f, v);
#pragma unroll
        for (int i = 0; i < kCodes; ++i) m = max(m, amax_bits_of(v[i]));
        if (dst) {
            auto *d = reinterpret_cast<float4 *>(dst + p * kCodes);
#pragma unroll
            for (int i = 0; i < kCodes / 4; ++i) d[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
        }
    }
    for (int64_t k = packs * kCodes + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float v = comm_reduce(W, nranks, f, [&](int j) { return src[j * stride + k]; });
        if (dst) dst[k] = v;
        m = max(m, amax_bits_of(v));
    }
    if (amax_bits) fold_max(m, amax_bits);
}

// The second pass: the same values again (from the FP8 codes; nothing in float32 was stored),
// quantized with the scale of the agreed amax of the reduced values.
template <fp8amp_dtype W, fp8amp_dtype O>
__global__ void __launch_bounds__(kThreads) accumulate_quantize_vec_kernel(const uint8_t *__restrict__ src, int64_t stride, int nranks,
                                                                           int64_t n, const float *wire_scale_inv,
                                                                           bool average, const uint32_t *amax_bits,
                                                                           uint8_t *__restrict__ dst,
                                                                           unsigned long long *saturated) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    const float s = comm_scale(comm_fp8_max(O), *amax_bits);
    const int64_t packs = n / kCodes;
    unsigned long long sat = 0;
#pragma unroll 2  // two packs' loads in flight (the pointers are __restrict__)
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
        float v[kCodes];
        reduce_pack<W>(src, stride, nranks, p, f, v);
        uint32_t w[kCodes / 4];
        encode_pack<O, kCodes>(v, s, sat, w);
        reinterpret_cast<uint4 *>(dst)[p] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    for (int64_t k = packs * kCodes + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float y = scaled(comm_reduce(W, nranks, f, [&](int j) { return src[j * stride + k]; }), s);
        sat += comm_saturates(O, y);
        dst[k] = comm_encode(O, y);
    }
    fold_count(sat, saturated);
}

// ---- the all-reduce's reduce + requantize (one pass, no amax) ----------------------------------
//
// CommCompute::reduce_requantize: for each element of this rank's piece, the other ranks' codes
// (received), this rank's own code (made here from its input, as quantize would: never stored),
// their float32 sum in rank order, requantized with the agreed scale into the piece's all-gather
// block and, where the pipeline asks for it, decoded into the output as well. A thread's unit is
// kVec = 8 elements: one 16-byte load of a BF16/F16 input (8 bytes of codes from each other rank, 8
// codes out, 16 bytes of a BF16 output), so that every load and store of a warp covers one contiguous
// run (units of 16 elements made each thread's 32-byte accesses two half-sector loads or stores a
// warp instruction apart: the first H100 run of this kernel moved its 6 bytes an element at 1.65 TB/s
// beside the transfers, against 2.3-2.4 for the quantization and the decoding).

constexpr int kUnitWords = kVec / 4;  // 32-bit words of codes in a unit
constexpr int kUnitsInFlight = 4;     // units per thread whose loads are issued before any arithmetic
// The grid (tile_blocks of the unit count) gives each thread kPacksPerThread units: one iteration.
static_assert(kUnitsInFlight == kPacksPerThread, "reduce_requantize's grid assumes one iteration a thread");

// The codes of a unit, NR ranks (compile-time), kUnitWords words each.
template <int NR>
struct RankUnit {
    uint2 c[NR];
};
// This rank's codes of a unit: its input's elements quantized as quantize_vec_kernel quantizes them
// (unpack, scaled by s, encode2; saturations counted).
template <fp8amp_dtype S, fp8amp_dtype W, class Count>
__device__ __forceinline__ uint2 own_codes(const SrcPack<S> &a, float in_s, float s, Count &sat) {
    float x[kVec];
    uint32_t w[kUnitWords];
    unpack<S>(a, in_s, x);
    encode_pack<W, kVec>(x, s, sat, w);
    return make_uint2(w[0], w[1]);
}
// The requantized codes of a unit over NR ranks (compile-time), into kUnitWords words.
// Fast path (no code of the unit is special, any_special4: the usual case): the sum in rank order
// is plain float32 additions from +0 (__fadd_rn, never contracted), exactly what comm_add does when
// no operand is a NaN and no infinity can meet its opposite; times g (finite and nonzero, so no
// NaN); encoded by the hardware's satfinite conversion, which for a non-NaN value is the software
// codec (encode2's comment). Otherwise the general definition, element by element (comm_add,
// scaled, encode2 with its NaN mapping). Either way the bytes of comm_reduce + comm_encode.
template <fp8amp_dtype W, fp8amp_dtype O, int NR, class Count>
__device__ __forceinline__ void requantize_unit(const RankUnit<NR> &r, float g, Count &sat, uint32_t out[kUnitWords]) {
    bool special = false;
#pragma unroll
    for (int j = 0; j < NR; ++j)
#pragma unroll
        special = special || cuda::any_special4<W>(r.c[j].x) || cuda::any_special4<W>(r.c[j].y);
    float v[kVec];
    if (!special) {
#pragma unroll
        for (int j = 0; j < NR; ++j) {
#pragma unroll
            for (int q = 0; q < kUnitWords; ++q) {
                float d[4];
                cuda::decode4_nonnan<W>(q == 0 ? r.c[j].x : r.c[j].y, d);
#pragma unroll
                for (int k = 0; k < 4; ++k) v[4 * q + k] = __fadd_rn(j == 0 ? 0.0f : v[4 * q + k], d[k]);
            }
        }
#pragma unroll
        for (int i = 0; i < kVec; i += 2) {
            const float y0 = __fmul_rn(v[i], g), y1 = __fmul_rn(v[i + 1], g);
            sat += comm_saturates(O, y0) + comm_saturates(O, y1);
            const uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE,
                                                           O == FP8AMP_DTYPE_E4M3 ? __NV_E4M3 : __NV_E5M2);
            if (i % 4 == 0) out[i / 4] = pair;
            else out[i / 4] |= pair << 16;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
#pragma unroll
        for (int q = 0; q < kUnitWords; ++q) {
            float d[4];
            cuda::decode4<W>(q == 0 ? r.c[j].x : r.c[j].y, d);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[4 * q + k] = comm_add(v[4 * q + k], d[k]);
        }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = scaled(v[i], g);
    encode_pack<O, kVec>(v, 1.0f, sat, out);
}

// The output's kVec elements of unit u from their requantized codes w (format O): the codes
// themselves for an O output, else from_f32<D>(scaled(decode(code), si)) -- the bits of
// cuda::dequantize's table (quantize.cu, table_word) and of the CPU's decode -- one 16-byte store, evict-first
// (two for F32). out: 16-byte aligned.
template <fp8amp_dtype O, fp8amp_dtype D>
__device__ __forceinline__ void store_decoded(void *out, int64_t u, const uint32_t w[kUnitWords], float si) {
    float v[kVec];
#pragma unroll
    for (int q = 0; q < kUnitWords; ++q) cuda::decode4<O>(w[q], v + 4 * q);
    if constexpr (D == FP8AMP_DTYPE_F32) {
        auto *d = reinterpret_cast<float4 *>(out) + u * 2;
#pragma unroll
        for (int i = 0; i < 2; ++i)
            __stcs(d + i, make_float4(cuda::from_f32<D>(scaled(v[4 * i], si)), cuda::from_f32<D>(scaled(v[4 * i + 1], si)),
                               cuda::from_f32<D>(scaled(v[4 * i + 2], si)), cuda::from_f32<D>(scaled(v[4 * i + 3], si))));
    } else {
        uint32_t h[kVec / 2];
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i)
            h[i] = uint32_t(cuda::from_f32<D>(scaled(v[2 * i], si))) | uint32_t(cuda::from_f32<D>(scaled(v[2 * i + 1], si))) << 16;
        __stcs(reinterpret_cast<uint4 *>(out) + u, make_uint4(h[0], h[1], h[2], h[3]));
    }
}
template <fp8amp_dtype O>
__device__ __forceinline__ void store_out(void *out, fp8amp_dtype dtype, int64_t u, const uint32_t w[kUnitWords], float si) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: store_decoded<O, FP8AMP_DTYPE_F32>(out, u, w, si); break;
    case FP8AMP_DTYPE_F16: store_decoded<O, FP8AMP_DTYPE_F16>(out, u, w, si); break;
    case FP8AMP_DTYPE_BF16: store_decoded<O, FP8AMP_DTYPE_BF16>(out, u, w, si); break;
    default: reinterpret_cast<uint2 *>(out)[u] = make_uint2(w[0], w[1]); break;  // the codes (dtype O)
    }
}
// One element of the same (the tails and unaligned buffers), with the software codec: the CPU's bytes.
__device__ __forceinline__ void store_out_element(void *out, fp8amp_dtype dtype, fp8amp_dtype format, int64_t k,
                                                  uint8_t code, float si) {
    if (dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2) static_cast<uint8_t *>(out)[k] = code;
    else store_wide(out, dtype, k, scaled(comm_decode(format, code), si));
}
// Element k of the pass, with the software codec (the tails and unaligned buffers).
__device__ __forceinline__ uint8_t reduce_requantize_element(const uint8_t *src, int64_t stride, int nranks, int own,
                                                             const void *in, fp8amp_dtype in_dtype, float in_s,
                                                             float s, fp8amp_dtype wire, fp8amp_dtype format, float g,
                                                             int64_t k, unsigned long long &sat) {
    const float q = scaled(load_real(in, in_dtype, in_s, k), s);
    sat += comm_saturates(wire, q);
    const uint8_t mine = comm_encode(wire, q);
    const float y = comm_reduce(wire, nranks, g, [&](int j) { return j == own ? mine : src[j * stride + k]; });
    sat += comm_saturates(format, y);
    return comm_encode(format, y);
}

// NR ranks known at compile time (1 and 2: the one-rank communicator and the two-rank benchmark) and
// O = W; more ranks, or another output format, take the generic kernel below. Each thread takes
// kUnitsInFlight units per iteration (grid-stride between them, so that a warp's accesses stay
// contiguous), the loads of all of them issued before any arithmetic; the grid is not persistent
// (tile_blocks) unless capped. in and out may be the same buffer (in place): a unit's elements are
// read before they are written, by the same thread.
template <fp8amp_dtype S, fp8amp_dtype W, fp8amp_dtype O, int NR>
__global__ void __launch_bounds__(kThreads) reduce_requantize_vec_kernel(
    const uint8_t *__restrict__ src, int64_t stride, int own, const void *in, const float *in_scale_inv,
    const uint32_t *amax_bits, int64_t n, uint8_t *__restrict__ dst, void *out, fp8amp_dtype out_dtype,
    const float *out_scale_inv, unsigned long long *saturated) {
    const float in_s = input_scale(S, in_scale_inv);
    const float s = comm_scale(comm_fp8_max(W), *amax_bits);
    const float g = comm_requant_factor(W, O, NR);
    static_assert(NR == 1 || NR == 2, "one or two ranks; more take reduce_requantize_any_kernel");
    const float si = out && out_dtype != O ? *out_scale_inv : 1.0f;
    const int64_t units = n / kVec;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    const auto *own_in = static_cast<const SrcPack<S> *>(in);
    unsigned sat = 0;
    for (int64_t u0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u0 < units; u0 += kUnitsInFlight * step) {
        // The other rank's codes (two ranks) and this rank's input of each unit.
        uint2 other[kUnitsInFlight];
        SrcPack<S> x[kUnitsInFlight];
#pragma unroll
        for (int k = 0; k < kUnitsInFlight; ++k) {
            const int64_t u = u0 + k * step < units ? u0 + k * step : u0;  // past the end: unit u0 again, not stored
            if constexpr (NR == 2) other[k] = __ldg(reinterpret_cast<const uint2 *>(src + (1 - own) * stride) + u);
            x[k] = load_once(own_in + u);
        }
#pragma unroll
        for (int k = 0; k < kUnitsInFlight; ++k) {
            const int64_t u = u0 + k * step;
            if (u < units) {
                uint32_t w[kUnitWords];
                // Rank order, by selects (no index that depends on own: the units stay in registers).
                const uint2 mine = own_codes<S, W>(x[k], in_s, s, sat);
                RankUnit<NR> r;
                if constexpr (NR == 1) {
                    r.c[0] = mine;
                } else {
                    r.c[0] = own == 0 ? mine : other[k];
                    r.c[1] = own == 0 ? other[k] : mine;
                }
                requantize_unit<W, O, NR>(r, g, sat, w);
                reinterpret_cast<uint2 *>(dst)[u] = make_uint2(w[0], w[1]);
                if (out) store_out<O>(out, out_dtype, u, w, si);
            }
        }
    }
    unsigned long long tail_sat = sat;
    for (int64_t k = units * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += step) {
        dst[k] = reduce_requantize_element(src, stride, NR, own, in, S, in_s, s, W, O, g, k, tail_sat);
        if (out) store_out_element(out, out_dtype, O, k, dst[k], si);
    }
    fold_count(tail_sat, saturated);
}

// Any number of ranks (a runtime loop over them; 8-byte loads), any output format, and the generic
// arithmetic (comm_add, scaled, encode2 with its NaN mapping).
template <fp8amp_dtype S, fp8amp_dtype W, fp8amp_dtype O>
__global__ void __launch_bounds__(kThreads) reduce_requantize_any_kernel(
    const uint8_t *__restrict__ src, int64_t stride, int nranks, int own, const void *in, const float *in_scale_inv,
    const uint32_t *amax_bits, int64_t n, uint8_t *__restrict__ dst, void *out, fp8amp_dtype out_dtype,
    const float *out_scale_inv, unsigned long long *saturated) {
    const float in_s = input_scale(S, in_scale_inv);
    const float s = comm_scale(comm_fp8_max(W), *amax_bits);
    const float g = comm_requant_factor(W, O, nranks);
    const float si = out && out_dtype != O ? *out_scale_inv : 1.0f;
    const int64_t units = n / kVec;
    const auto *own_in = static_cast<const SrcPack<S> *>(in);
    unsigned long long sat = 0;
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const uint2 mine = own_codes<S, W>(load_once(own_in + u), in_s, s, sat);
        float v[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = 0.0f;
        for (int j = 0; j < nranks; ++j) {
            const uint2 c = j == own ? mine : __ldg(reinterpret_cast<const uint2 *>(src + j * stride) + u);
            const uint32_t w[kUnitWords] = {c.x, c.y};
#pragma unroll
            for (int q = 0; q < kUnitWords; ++q) {
                float d[4];
                cuda::decode4<W>(w[q], d);
#pragma unroll
                for (int k = 0; k < 4; ++k) v[4 * q + k] = comm_add(v[4 * q + k], d[k]);
            }
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = scaled(v[i], g);
        uint32_t w[kUnitWords];
        encode_pack<O, kVec>(v, 1.0f, sat, w);
        reinterpret_cast<uint2 *>(dst)[u] = make_uint2(w[0], w[1]);
        if (out) store_out<O>(out, out_dtype, u, w, si);
    }
    for (int64_t k = units * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        dst[k] = reduce_requantize_element(src, stride, nranks, own, in, S, in_s, s, W, O, g, k, sat);
        if (out) store_out_element(out, out_dtype, O, k, dst[k], si);
    }
    fold_count(sat, saturated);
}

// Unaligned buffers: element by element.
__global__ void reduce_requantize_kernel(const uint8_t *src, int64_t stride, int nranks, int own, const void *in,
                                         fp8amp_dtype in_dtype, const float *in_scale_inv, const uint32_t *amax_bits,
                                         int64_t n, fp8amp_dtype wire, fp8amp_dtype format, uint8_t *dst, void *out,
                                         fp8amp_dtype out_dtype, const float *out_scale_inv,
                                         unsigned long long *saturated) {
    const float in_s = input_scale(in_dtype, in_scale_inv);
    const float s = comm_scale(comm_fp8_max(wire), *amax_bits);
    const float g = comm_requant_factor(wire, format, nranks);
    const float si = out && out_dtype != format ? *out_scale_inv : 1.0f;
    unsigned long long sat = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        dst[k] = reduce_requantize_element(src, stride, nranks, own, in, in_dtype, in_s, s, wire, format, g, k, sat);
        if (out) store_out_element(out, out_dtype, format, k, dst[k], si);
    }
    fold_count(sat, saturated);
}

__global__ void all_reduce_scales_kernel(const uint32_t *amax_bits, int64_t count, fp8amp_dtype wire,
                                         fp8amp_dtype format, int nranks, bool average, float *wire_scale_inv,
                                         float *out_scale_inv) {
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < count; k += int64_t(gridDim.x) * blockDim.x) {
        const float si = 1.0f / comm_scale(comm_fp8_max(wire), amax_bits[k]);
        wire_scale_inv[k] = si;
        out_scale_inv[k] = comm_requant_scale_inv(si, wire, format, nranks, average);
    }
}

__global__ void accumulate_quantize_kernel(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                                           const float *wire_scale_inv, bool average, const uint32_t *amax_bits,
                                           fp8amp_dtype format, uint8_t *dst, unsigned long long *saturated) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    const float s = comm_scale(comm_fp8_max(format), *amax_bits);
    unsigned long long sat = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float y = scaled(comm_reduce(wire, nranks, f, [&](int j) { return src[j * stride + k]; }), s);
        sat += comm_saturates(format, y);
        dst[k] = comm_encode(format, y);
    }
    fold_count(sat, saturated);
}

bool aligned(const void *p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
size_t dtype_bytes(fp8amp_dtype d) {
    return d == FP8AMP_DTYPE_F32 ? 4 : (d == FP8AMP_DTYPE_F16 || d == FP8AMP_DTYPE_BF16) ? 2 : 1;
}

// Calls f(std::integral_constant<fp8amp_dtype, d>) for a runtime dtype.
template <class F>
void with_dtype(fp8amp_dtype d, F &&f) {
    switch (d) {
    case FP8AMP_DTYPE_F32: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F32>()); break;
    case FP8AMP_DTYPE_F16: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F16>()); break;
    case FP8AMP_DTYPE_BF16: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_BF16>()); break;
    case FP8AMP_DTYPE_E4M3: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>()); break;
    case FP8AMP_DTYPE_E5M2: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>()); break;
    }
}
// The same for an FP8 dtype (E4M3 or E5M2).
template <class F>
void with_fp8(fp8amp_dtype d, F &&f) {
    if (d == FP8AMP_DTYPE_E5M2) f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
    else f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
}

}  // namespace

namespace {

class CudaCommCompute final : public CommCompute {
public:
    explicit CudaCommCompute(int device) : device_(device) {}
    ~CudaCommCompute() override {
        cuda::DeviceGuardNoThrow g(device_);
        for (cudaEvent_t e : events_)
            if (e) cudaEventDestroy(e);
        if (side_) cudaStreamDestroy(side_);  // returns at once; queued work still completes
        if (agree_) cudaStreamDestroy(agree_);
    }
    void memset_async(void *dst, int value, size_t nbytes, void *stream) override {
        if (!nbytes) return;
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemsetAsync(dst, value, nbytes, st(stream)), "cudaMemsetAsync");
    }
    void add_count(unsigned long long *dst, const unsigned long long *src, void *stream) override {
        cuda::DeviceGuard g(device_);
        add_count_kernel<<<1, 1, 0, st(stream)>>>(dst, src);
        cuda::check_launch("comm add_count_kernel");
    }
    void copy_async(void *dst, const void *src, size_t nbytes, void *stream) override {
        if (!nbytes || dst == src) return;
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, st(stream)), "cudaMemcpyAsync");
    }
    void to_host(void *dst, const void *src, size_t nbytes, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, st(stream)), "cudaMemcpyAsync");
        cuda::check(cudaStreamSynchronize(st(stream)), "cudaStreamSynchronize");
    }
    void from_host(void *dst, const void *src, size_t nbytes, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, st(stream)), "cudaMemcpyAsync");
        cuda::check(cudaStreamSynchronize(st(stream)), "cudaStreamSynchronize");
    }
    void amax(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, uint32_t *amax_bits,
              void *stream) override {
        if (n <= 0) return;
        const bool wide = dtype == FP8AMP_DTYPE_F32 || dtype == FP8AMP_DTYPE_F16 || dtype == FP8AMP_DTYPE_BF16;
        if (wide && !aligned(src, kVec * dtype_bytes(dtype))) {
            // max of amax_bits_of(value): the comm's amax of a wide input, bit for bit.
            cuda::amax(device_, stream, src, dtype, static_cast<size_t>(n), amax_bits);
            return;
        }
        cuda::DeviceGuard g(device_);
        if (wide) {
            const int64_t tiles = (n / kVec + int64_t(kThreads) * kAmaxPacks - 1) / (int64_t(kThreads) * kAmaxPacks);
            const int grid = capped(static_cast<int>(tiles < 1 ? 1 : (tiles > (int64_t(1) << 20) ? (int64_t(1) << 20) : tiles)));
            with_dtype(dtype, [&](auto d) {
                constexpr fp8amp_dtype S = decltype(d)::value;
                if constexpr (S == FP8AMP_DTYPE_F32 || S == FP8AMP_DTYPE_F16 || S == FP8AMP_DTYPE_BF16)
                    wide_amax_kernel<S, kThreads><<<grid, kThreads, 0, st(stream)>>>(src, n, amax_bits);
            });
            cuda::check_launch("comm wide_amax_kernel");
            return;
        }
        if (aligned(src, kVec)) {
            with_fp8(dtype, [&](auto d) {
                amax_vec_kernel<decltype(d)::value><<<capped(tile_blocks(n / kVec)), kThreads, 0, st(stream)>>>(
                    src, src_scale_inv, n, amax_bits);
            });
        } else {
            amax_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits);
        }
        cuda::check_launch("comm amax_kernel");
    }
    void quantize(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, const uint32_t *amax_bits,
                  fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out, unsigned long long *saturated,
                  void *stream) override {
        if (n <= 0 && !scale_inv_out) return;
        cuda::DeviceGuard g(device_);
        if (aligned(src, kVec * dtype_bytes(dtype)) && aligned(dst, kVec)) {
            with_dtype(dtype, [&](auto d) {
                with_fp8(wire, [&](auto w) {
                    quantize_vec_kernel<decltype(d)::value, decltype(w)::value>
                        <<<capped(tile_blocks(n / kVec)), kThreads, 0, st(stream)>>>(src, src_scale_inv, n, amax_bits, dst,
                                                                           scale_inv_out, saturated);
                });
            });
        } else {
            quantize_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits, wire,
                                                                        dst, scale_inv_out, saturated);
        }
        cuda::check_launch("comm quantize_kernel");
    }
    // Vectorized when every rank's codes start 16-byte aligned (src, stride) and dst too.
    static bool accumulate_aligned(const uint8_t *src, int64_t stride, const void *dst, size_t dst_align) {
        return aligned(src, kCodes) && stride % kCodes == 0 && (!dst || aligned(dst, dst_align));
    }
    void accumulate(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                    const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits, void *stream) override {
        if (n <= 0) return;
        cuda::DeviceGuard g(device_);
        if (accumulate_aligned(src, stride, dst, 16)) {
            with_fp8(wire, [&](auto w) {
                accumulate_vec_kernel<decltype(w)::value><<<capped(tile_blocks(n / kCodes)), kThreads, 0, st(stream)>>>(
                    src, stride, nranks, n, wire_scale_inv, average, dst, amax_bits);
            });
        } else {
            accumulate_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(src, stride, nranks, n, wire, wire_scale_inv,
                                                                          average, dst, amax_bits);
        }
        cuda::check_launch("comm accumulate_kernel");
    }
    void accumulate_quantize(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                             const float *wire_scale_inv, bool average, const uint32_t *amax_bits, fp8amp_dtype format,
                             uint8_t *dst, unsigned long long *saturated, void *stream) override {
        if (n <= 0) return;
        cuda::DeviceGuard g(device_);
        if (accumulate_aligned(src, stride, dst, kCodes)) {
            with_fp8(wire, [&](auto w) {
                with_fp8(format, [&](auto o) {
                    accumulate_quantize_vec_kernel<decltype(w)::value, decltype(o)::value>
                        <<<capped(tile_blocks(n / kCodes)), kThreads, 0, st(stream)>>>(src, stride, nranks, n, wire_scale_inv,
                                                                             average, amax_bits, dst, saturated);
                });
            });
        } else {
            accumulate_quantize_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(
                src, stride, nranks, n, wire, wire_scale_inv, average, amax_bits, format, dst, saturated);
        }
        cuda::check_launch("comm accumulate_quantize_kernel");
    }
    void reduce_requantize(const uint8_t *src, int64_t stride, int nranks, int own, const OwnInput &in, int64_t n,
                           fp8amp_dtype wire, fp8amp_dtype format, uint8_t *dst, const OwnOutput &out,
                           unsigned long long *saturated, void *stream) override {
        if (n <= 0) return;
        cuda::DeviceGuard g(device_);
        // Vectorized when the other ranks' codes and dst are 8-byte aligned (stride too), the output
        // 16-byte aligned and the input aligned for its packs (as quantize requires).
        if (aligned(src, kVec) && stride % kVec == 0 && aligned(dst, kVec) && aligned(in.data, kVec * dtype_bytes(in.dtype)) &&
            (!out.data || aligned(out.data, 16))) {
            const int grid = capped(tile_blocks(n / kVec));
            with_dtype(in.dtype, [&](auto d) {
                with_fp8(wire, [&](auto w) {
                    with_fp8(format, [&](auto o) {
                        constexpr fp8amp_dtype S = decltype(d)::value, W = decltype(w)::value, O = decltype(o)::value;
                        if constexpr (W == O) {
                            if (nranks == 1) {
                                reduce_requantize_vec_kernel<S, W, O, 1><<<grid, kThreads, 0, st(stream)>>>(
                                    src, stride, own, in.data, in.scale_inv, in.amax_bits, n, dst, out.data, out.dtype,
                                    out.scale_inv, saturated);
                                return;
                            }
                            if (nranks == 2) {
                                reduce_requantize_vec_kernel<S, W, O, 2><<<grid, kThreads, 0, st(stream)>>>(
                                    src, stride, own, in.data, in.scale_inv, in.amax_bits, n, dst, out.data, out.dtype,
                                    out.scale_inv, saturated);
                                return;
                            }
                        }
                        reduce_requantize_any_kernel<S, W, O><<<grid, kThreads, 0, st(stream)>>>(
                            src, stride, nranks, own, in.data, in.scale_inv, in.amax_bits, n, dst, out.data, out.dtype,
                            out.scale_inv, saturated);
                    });
                });
            });
        } else {
            reduce_requantize_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(
                src, stride, nranks, own, in.data, in.dtype, in.scale_inv, in.amax_bits, n, wire, format, dst, out.data,
                out.dtype, out.scale_inv, saturated);
        }
        cuda::check_launch("comm reduce_requantize_kernel");
    }
    void all_reduce_scales(const uint32_t *amax_bits, int64_t count, fp8amp_dtype wire, fp8amp_dtype format,
                           int nranks, bool average, float *wire_scale_inv, float *out_scale_inv,
                           void *stream) override {
        if (count <= 0) return;
        cuda::DeviceGuard g(device_);
        all_reduce_scales_kernel<<<1, 256, 0, st(stream)>>>(amax_bits, count, wire, format, nranks, average,
                                                            wire_scale_inv, out_scale_inv);
        cuda::check_launch("comm all_reduce_scales_kernel");
    }
    void requantize(const float *src, int64_t n, const uint32_t *amax_bits, fp8amp_dtype format, uint8_t *dst,
                    float *scale_inv_out, unsigned long long *saturated, void *stream) override {
        quantize(src, FP8AMP_DTYPE_F32, nullptr, n, amax_bits, format, dst, scale_inv_out, saturated, stream);
    }
    void scale_inv(const uint32_t *amax_bits, fp8amp_dtype format, float *out, void *stream) override {
        cuda::DeviceGuard g(device_);
        scale_inv_kernel<<<1, 1, 0, st(stream)>>>(amax_bits, format, out);
        cuda::check_launch("comm scale_inv_kernel");
    }
    void dequantize(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n, void *dst,
                    fp8amp_dtype dtype, void *stream) override {
        if (n <= 0) return;
        if (dtype == FP8AMP_DTYPE_F32 || dtype == FP8AMP_DTYPE_F16 || dtype == FP8AMP_DTYPE_BF16) {
            // from_f32<dtype>(scaled(decode(code), scale_inv)) through a per-block table of the 256
            // results: store_wide(load_real(...)) bit for bit (canonical NaN with its sign, RNE).
            cuda::dequantize(device_, stream, src, format, dst, dtype, static_cast<size_t>(n), scale_inv,
                             /*yield_sms=*/true, static_cast<unsigned>(max_blocks_));
            return;
        }
        cuda::DeviceGuard g(device_);
        dequantize_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(src, format, scale_inv, n, dst, dtype);
        cuda::check_launch("comm dequantize_kernel");
    }
    void convert(const float *src, int64_t n, void *dst, fp8amp_dtype dtype, void *stream) override {
        if (n <= 0) return;
        cuda::DeviceGuard g(device_);
        convert_kernel<<<capped(blocks_for(n)), kThreads, 0, st(stream)>>>(src, n, dst, dtype);
        cuda::check_launch("comm convert_kernel");
    }

    void set_grid_limit(int max_blocks) override { max_blocks_ = max_blocks > 0 ? max_blocks : 0; }

    void *side_stream(void *) override {
        if (!side_) {
            cuda::DeviceGuard g(device_);
            int least = 0, greatest = 0;
            cuda::check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
            cuda::check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, greatest),
                        "cudaStreamCreateWithPriority (the communicator's transfer stream)");
            cuda::check(cudaStreamCreateWithPriority(&agree_, cudaStreamNonBlocking, greatest),
                        "cudaStreamCreateWithPriority (the communicator's agreement stream)");
            // Every event now too, so that a call captured in a graph (after a first call, as the
            // scratch requires) creates nothing.
            for (int slot = 0; slot < kEventSlots; ++slot) event(slot);
        }
        return side_;
    }
    void *agreement_stream(void *stream) override {
        side_stream(stream);
        return agree_;
    }
    void record(int slot, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaEventRecord(event(slot), st(stream)), "cudaEventRecord");
    }
    void wait(int slot, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaStreamWaitEvent(st(stream), event(slot), 0), "cudaStreamWaitEvent");
    }

private:
    static cudaStream_t st(void *s) { return static_cast<cudaStream_t>(s); }
    // The grid of a launch under set_grid_limit (every kernel here loops grid-stride).
    int capped(int blocks) const { return max_blocks_ > 0 && blocks > max_blocks_ ? max_blocks_ : blocks; }
    cudaEvent_t event(int slot) {
        if (!events_[slot])
            cuda::check(cudaEventCreateWithFlags(&events_[slot], cudaEventDisableTiming), "cudaEventCreateWithFlags");
        return events_[slot];
    }
    int device_;
    int max_blocks_ = 0;  // set_grid_limit's cap, 0: none
    cudaStream_t side_ = nullptr;
    cudaStream_t agree_ = nullptr;  // agreement_stream, made with side_
    cudaEvent_t events_[kEventSlots] = {};
};

}  // namespace

std::unique_ptr<CommCompute> make_cuda_comm_compute(int device) { return std::make_unique<CudaCommCompute>(device); }

}  // namespace fp8amp::kernels
