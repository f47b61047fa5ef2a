// Fused LayerNorm / RMSNorm on CUDA (kernels/norm.hpp): the forward writes y (wide, or FP8 with the
// amax, statistics and scale_inv of a quantize fused), the backward dx and the column sums dgamma,
// dbeta. Bit-identical to kernels/cpu/norm.cpp: the same inline arithmetic (norm.hpp, __f*_rn), and
// the same summation orders -- a 256-thread block is the 256 lanes of a row sum (thread j takes the
// pieces of 4 elements k = j, j + 256, ...), reduced by warp shuffles then across the 8 warps, which
// is norm::tree_sum's order; the column sums add rows in order within a chunk (one block per chunk)
// and the chunks in order (a finishing kernel).
//
// Forward: one block per row (a persistent grid walks the rows). A thread keeps its elements of the
// row in registers when the row fits (kPieces pieces of 4 per thread: d <= kPieces * 1024), so x is
// read from memory once; longer rows are read again from L1/L2 in the later passes. Current scaling
// runs the kernel twice: a pass that only reduces y's amax into the meta, then the writing pass
// (as quantize.cu does with its amax kernel). y_t is written by the byte transpose of linear_aux.cu.
// Backward: one block per row chunk; the chunk's column partials stay in registers when the row fits
// (d <= 4096), else they are accumulated in the partial buffer itself (each column owned by one
// thread, so no atomics).
#include <cstdint>
#include <type_traits>

#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "norm.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda {
namespace {

using namespace casting;
static_assert(kThreads == norm::kLanes, "a block is the lanes of a row sum");
static_assert(norm::kPiece == 4, "pieces of 4 elements");

constexpr int kRowsPerPass = norm::kLanes * norm::kPiece;  // elements a block covers with one piece each

__device__ __forceinline__ float load_wide(const void *p, fp8amp_dtype dt, int64_t i) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: return to_f32<FP8AMP_DTYPE_F32>(static_cast<const float *>(p)[i]);
    case FP8AMP_DTYPE_F16: return to_f32<FP8AMP_DTYPE_F16>(static_cast<const uint16_t *>(p)[i]);
    default: return to_f32<FP8AMP_DTYPE_BF16>(static_cast<const uint16_t *>(p)[i]);
    }
}

__device__ __forceinline__ void store_wide(void *p, fp8amp_dtype dt, int64_t i, float v) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(p)[i] = from_f32<FP8AMP_DTYPE_F32>(v); return;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_F16>(v); return;
    default: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_BF16>(v); return;
    }
}

// The block's sum of one value per thread, in norm::tree_sum's order, returned to every thread.
// red: 9 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int s = 16; s > 0; s /= 2) v = norm::fadd(v, __shfl_down_sync(0xFFFFFFFFu, v, s));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // red[] may still be read by the previous sum
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < kThreads / 32 ? red[lane] : 0.0f;
        for (int s = 4; s > 0; s /= 2) v = norm::fadd(v, __shfl_down_sync(0xFFFFFFFFu, v, s));
        if (lane == 0) red[8] = v;
    }
    __syncthreads();
    return red[8];
}

// Calls f(i, slot) for this thread's elements of a row of d, in increasing order: pieces
// k = threadIdx.x + p * 256 (p = 0, 1, ...), elements 4k..4k+3; slot = 4p + e indexes a register
// cache. kPieces > 0: at most kPieces pieces (the launch guarantees d <= kPieces * 1024).
template <int kPieces, class F>
__device__ __forceinline__ void for_row(int64_t d, F &&f) {
    if constexpr (kPieces > 0) {
#pragma unroll
        for (int p = 0; p < kPieces; ++p) {
            const int64_t i0 = (int64_t(threadIdx.x) + int64_t(p) * kThreads) * 4;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (i0 + e < d) f(i0 + e, 4 * p + e);
        }
    } else {
        for (int64_t i0 = int64_t(threadIdx.x) * 4; i0 < d; i0 += kRowsPerPass)
            for (int e = 0; e < 4; ++e)
                if (i0 + e < d) f(i0 + e, 0);
    }
}

template <fp8amp_dtype D>
constexpr bool is_fp8_v = D == FP8AMP_DTYPE_E4M3 || D == FP8AMP_DTYPE_E5M2;

// y of one row into D (E4M3/E5M2; F32 stands for any wide dtype, a.y_dtype, chosen at run time).
// kWrite false: only y's amax (current scaling's first pass).
template <fp8amp_dtype S, fp8amp_dtype D, int kPieces, bool kWrite>
__global__ void __launch_bounds__(kThreads) norm_forward_kernel(const NormForwardArgs a) {
    using SrcT = typename Storage<S>::type;
    constexpr bool kFp8 = is_fp8_v<D>;
    constexpr int kCache = kPieces > 0 ? kPieces * 4 : 1;
    __shared__ float red[9];
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    bool stats = false;
    if constexpr (kFp8) {
        scale = kWrite ? quantize_scale(*meta) : 1.0f;
        fp8_max = meta->fp8_max;
        stats = kWrite && meta->stats_enabled;
    }
    const auto *x = static_cast<const SrcT *>(a.x);
    const int64_t d = a.d;
    Tally t;
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const SrcT *xr = x + r * d;
        float v[kCache];
        auto value = [&](int64_t i, int slot, bool first) {
            if constexpr (kPieces > 0) {
                if (first) v[slot] = to_f32<S>(xr[i]);
                return v[slot];
            } else {
                return to_f32<S>(xr[i]);
            }
        };
        float mean = 0.0f, acc = 0.0f;
        if (!a.rms) {
            for_row<kPieces>(d, [&](int64_t i, int slot) { acc = norm::fadd(acc, value(i, slot, true)); });
            mean = norm::mean_of(block_sum(acc, red), d);
            acc = 0.0f;
            for_row<kPieces>(d, [&](int64_t i, int slot) {
                acc = norm::fadd(acc, norm::centered_square(value(i, slot, false), mean));
            });
        } else {
            for_row<kPieces>(d, [&](int64_t i, int slot) { acc = norm::fadd(acc, norm::square(value(i, slot, true))); });
        }
        const float rstd = norm::rstd_of(block_sum(acc, red), d, a.eps);
        if (kWrite && threadIdx.x == 0) {
            if (a.mean) a.mean[r] = norm::canonical(mean);
            if (a.rstd) a.rstd[r] = norm::canonical(rstd);
        }
        for_row<kPieces>(d, [&](int64_t i, int slot) {
            const float w = norm::weight(load_wide(a.gamma, a.gamma_dtype, i), a.zero_centered);
            const float b = a.beta ? load_wide(a.beta, a.beta_dtype, i) : 0.0f;
            const float y = norm::y_value(norm::xhat(value(i, slot, false), mean, rstd, a.rms), w, b, a.beta != nullptr);
            const int64_t e = r * d + i;
            if constexpr (kFp8) {
                t.amax = max(t.amax, amax_bits_of(y));
                if constexpr (kWrite) {
                    const float s = scaled(y, scale);
                    const uint8_t q = from_f32<D>(s);
                    static_cast<uint8_t *>(a.y)[e] = q;
                    if (stats) {
                        t.saturated += (fabsf(s) > fp8_max) ? 1u : 0u;  // false for NaN
                        t.underflowed += (y != 0.0f && y == y && (q & 0x7Fu) == 0) ? 1u : 0u;
                    }
                }
            } else {
                store_wide(a.y, a.y_dtype, e, y);
            }
        });
    }
    if constexpr (kFp8) {
        if constexpr (!kWrite) {
            const uint32_t amax = block_reduce(t.amax, MaxOp());
            if (threadIdx.x == 0) atomicMax(&meta->amax_bits, amax);
        } else if (stats) {
            finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        } else {
            finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        }
    }
}

// One block per chunk of rows: dx of each row, and the chunk's column partials of dgamma (dy * xhat)
// and dbeta (dy), written to partial[(2k + 0 / 1) * d + column].
template <fp8amp_dtype SDY, fp8amp_dtype SX, int kPieces>
__global__ void __launch_bounds__(kThreads) norm_backward_kernel(const NormBackwardArgs a, float *partial,
                                                                 int64_t n_chunks) {
    using DyT = typename Storage<SDY>::type;
    using XT = typename Storage<SX>::type;
    constexpr int kCache = kPieces > 0 ? kPieces * 4 : 1;
    __shared__ float red[9];
    const int64_t k = blockIdx.x, d = a.d;
    const float fd = static_cast<float>(d);
    float *pg = partial + (2 * k) * d, *pb = partial + (2 * k + 1) * d;
    float rg[kCache], rb[kCache];  // the partials in registers (kPieces > 0)
#pragma unroll
    for (int s = 0; s < kCache; ++s) rg[s] = rb[s] = 0.0f;
    if constexpr (kPieces == 0)
        for_row<0>(d, [&](int64_t i, int) { pg[i] = pb[i] = 0.0f; });
    const auto *dy = static_cast<const DyT *>(a.dy);
    const auto *x = static_cast<const XT *>(a.x);
    const int64_t r1 = norm::chunk_begin(k + 1, a.rows, n_chunks);
    for (int64_t r = norm::chunk_begin(k, a.rows, n_chunks); r < r1; ++r) {
        const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
        const int64_t base = r * d;
        float cdy[kCache], cxh[kCache];
        float acc1 = 0.0f, acc2 = 0.0f;
        for_row<kPieces>(d, [&](int64_t i, int slot) {
            const float dyv = to_f32<SDY>(dy[base + i]);
            const float g = norm::fmul(dyv, norm::weight(load_wide(a.gamma, a.gamma_dtype, i), a.zero_centered));
            const float xh = norm::xhat(to_f32<SX>(x[base + i]), mean, rstd, a.rms);
            if (!a.rms) acc1 = norm::fadd(acc1, g);
            acc2 = norm::fadd(acc2, norm::fmul(g, xh));
            if constexpr (kPieces > 0) cdy[slot] = dyv, cxh[slot] = xh;
        });
        const float c1 = a.rms ? 0.0f : norm::fdiv(block_sum(acc1, red), fd);
        const float c2 = norm::fdiv(block_sum(acc2, red), fd);
        for_row<kPieces>(d, [&](int64_t i, int slot) {
            float dyv, xh;
            if constexpr (kPieces > 0) {
                dyv = cdy[slot], xh = cxh[slot];
            } else {
                dyv = to_f32<SDY>(dy[base + i]);
                xh = norm::xhat(to_f32<SX>(x[base + i]), mean, rstd, a.rms);
            }
            const float g = norm::fmul(dyv, norm::weight(load_wide(a.gamma, a.gamma_dtype, i), a.zero_centered));
            store_wide(a.dx, a.dx_dtype, base + i, norm::dx_value(g, xh, c1, c2, rstd, a.rms));
            if constexpr (kPieces > 0) {
                rg[slot] = norm::fadd(rg[slot], norm::fmul(dyv, xh));
                rb[slot] = norm::fadd(rb[slot], dyv);
            } else {
                pg[i] = norm::fadd(pg[i], norm::fmul(dyv, xh));
                pb[i] = norm::fadd(pb[i], dyv);
            }
        });
    }
    if constexpr (kPieces > 0)
        for_row<kPieces>(d, [&](int64_t i, int slot) {
            pg[i] = rg[slot];
            pb[i] = rb[slot];
        });
}

// dgamma[c] = sum over chunks, in order from +0, of the partials (dbeta likewise).
__global__ void __launch_bounds__(kThreads) norm_column_finish_kernel(const float *partial, int64_t n_chunks, int64_t d,
                                                                      float *dgamma, float *dbeta) {
    for (int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x; c < d; c += int64_t(gridDim.x) * kThreads) {
        float sg = 0.0f, sb = 0.0f;
        for (int64_t k = 0; k < n_chunks; ++k) {
            sg = norm::fadd(sg, partial[(2 * k) * d + c]);
            sb = norm::fadd(sb, partial[(2 * k + 1) * d + c]);
        }
        dgamma[c] = norm::canonical(sg);
        if (dbeta) dbeta[c] = norm::canonical(sb);
    }
}

// The register pieces per thread for a row of d: the smallest of 1, 2, 4, 8 (at most kMax) that holds
// it, or 0 (the row is re-read). kMax is a template argument so that larger variants are not compiled.
template <int kMax, class F>
void dispatch_pieces(int64_t d, F &&f) {
    const int64_t pieces = (d + kRowsPerPass - 1) / kRowsPerPass;
    if (pieces <= 1) return f(std::integral_constant<int, 1>());
    if (pieces <= 2) return f(std::integral_constant<int, 2>());
    if (pieces <= 4) return f(std::integral_constant<int, 4>());
    if constexpr (kMax >= 8) {
        if (pieces <= 8) return f(std::integral_constant<int, 8>());
    }
    f(std::integral_constant<int, 0>());
}

}  // namespace

void norm_forward(int device, void *stream_raw, const NormForwardArgs &a) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const bool fp8 = a.y_dtype == FP8AMP_DTYPE_E4M3 || a.y_dtype == FP8AMP_DTYPE_E5M2;
    const size_t rows = static_cast<size_t>(a.rows);
    dispatch_src(a.x_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        dispatch_pieces<8>(a.d, [&](auto p) {
            constexpr int P = decltype(p)::value;
            auto launch = [&](auto kernel) {
                kernel<<<persistent_grid(device, kernel, rows * kThreads), kThreads, 0, stream>>>(a);
                check_launch("norm_forward_kernel");
            };
            if (!fp8) return launch(norm_forward_kernel<S, FP8AMP_DTYPE_F32, P, true>);
            auto run_fp8 = [&](auto dd) {
                constexpr fp8amp_dtype D = decltype(dd)::value;
                if (a.target.current) {
                    check(cudaMemsetAsync(&a.target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
                    launch(norm_forward_kernel<S, D, P, false>);
                }
                launch(norm_forward_kernel<S, D, P, true>);
            };
            if (a.y_dtype == FP8AMP_DTYPE_E4M3) run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
            else run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
        });
    });
    if (fp8 && a.y_t) transpose_bytes(device, stream_raw, a.y, a.y_t, rows, static_cast<size_t>(a.d));
}

size_t norm_backward_partial_floats(int64_t rows, int64_t d) {
    return static_cast<size_t>(norm::chunks(rows)) * 2 * static_cast<size_t>(d);
}

void norm_backward(int device, void *stream_raw, const NormBackwardArgs &a, float *partial) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const int64_t n_chunks = norm::chunks(a.rows);
    dispatch_src(a.dy_dtype, [&](auto sdy) {
        constexpr fp8amp_dtype SDY = decltype(sdy)::value;
        dispatch_src(a.x_dtype, [&](auto sx) {
            constexpr fp8amp_dtype SX = decltype(sx)::value;
            // Registers for the dy/xhat cache and two partials: up to 4 pieces (d <= 4096; ptxas, sm_90:
            // 117 registers at 4 pieces, 64 at 2, 219 at 8, which would leave one block per SM).
            dispatch_pieces<4>(a.d, [&](auto p) {
                constexpr int P = decltype(p)::value;
                norm_backward_kernel<SDY, SX, P><<<static_cast<unsigned>(n_chunks), kThreads, 0, stream>>>(a, partial,
                                                                                                          n_chunks);
                check_launch("norm_backward_kernel");
            });
        });
    });
    const auto finish = norm_column_finish_kernel;
    const size_t blocks = (static_cast<size_t>(a.d) + kThreads - 1) / kThreads;
    finish<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(partial, n_chunks, a.d,
                                                                                           a.dgamma, a.dbeta);
    check_launch("norm_column_finish_kernel");
}

}  // namespace fp8amp::kernels::cuda
