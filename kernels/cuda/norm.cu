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
// read from memory once; longer rows are read again from L1/L2 in the later passes. A piece moves as
// one 8/16-byte load and one 4-byte FP8 store when the rows are aligned. Current scaling runs the
// kernel twice: a pass that only reduces y's amax into the meta, then the writing pass (as
// quantize.cu does with its amax kernel). y_t is written by the byte transpose of linear_aux.cu.
// Backward: one block per row chunk; the chunk's column partials stay in registers when the row fits
// (d <= 4096), else they are accumulated in the partial buffer itself (each column owned by one
// thread, so no atomics); the row's two dot products share one block reduction.
//
// Tried and measured slower on an H100 (docs/performance.md): one warp per row (8 rows a block, no
// block barrier, the same summation order through 8 lane sums a thread) -- 1.6x slower at d = 1024
// and 1.4-2x at d = 4096..12288, whether the row was kept in registers (80-128 registers) or read
// again from L1/L2.
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

// Two block sums at once (the backward's two dot products), each in norm::tree_sum's order: the
// same additions as two block_sum calls, with half the barriers. red2: 18 floats of shared memory.
__device__ __forceinline__ void block_sum2(float &a, float &b, float *red2) {
    for (int s = 16; s > 0; s /= 2) {
        a = norm::fadd(a, __shfl_down_sync(0xFFFFFFFFu, a, s));
        b = norm::fadd(b, __shfl_down_sync(0xFFFFFFFFu, b, s));
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // red2[] may still be read by the previous sum
    if (lane == 0) red2[warp] = a, red2[9 + warp] = b;
    __syncthreads();
    if (warp == 0) {
        a = lane < kThreads / 32 ? red2[lane] : 0.0f;
        b = lane < kThreads / 32 ? red2[9 + lane] : 0.0f;
        for (int s = 4; s > 0; s /= 2) {
            a = norm::fadd(a, __shfl_down_sync(0xFFFFFFFFu, a, s));
            b = norm::fadd(b, __shfl_down_sync(0xFFFFFFFFu, b, s));
        }
        if (lane == 0) red2[8] = a, red2[17] = b;
    }
    __syncthreads();
    a = red2[8], b = red2[17];
}

struct Piece {
    float v[4];
};

// A row's piece of 4 consecutive elements i0..i0+3 (i0 % 4 == 0) as floats; elements at or past d
// read as 0 and are never used. vec: the row is 4-element aligned (d % 4 == 0 and an aligned base),
// so a whole piece is one 8- or 16-byte load -- the loads of a warp then cover one contiguous span.
template <fp8amp_dtype S>
__device__ __forceinline__ void load_piece(const typename Storage<S>::type *row, int64_t i0, int64_t d, bool vec,
                                           float f[4]) {
    if (vec && i0 + 4 <= d) {
        if constexpr (S == FP8AMP_DTYPE_F32) {
            const float4 v = *reinterpret_cast<const float4 *>(row + i0);
            f[0] = to_f32<S>(v.x), f[1] = to_f32<S>(v.y), f[2] = to_f32<S>(v.z), f[3] = to_f32<S>(v.w);
        } else {
            const uint2 v = *reinterpret_cast<const uint2 *>(row + i0);
            f[0] = to_f32<S>(uint16_t(v.x & 0xFFFFu)), f[1] = to_f32<S>(uint16_t(v.x >> 16));
            f[2] = to_f32<S>(uint16_t(v.y & 0xFFFFu)), f[3] = to_f32<S>(uint16_t(v.y >> 16));
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = i0 + e < d ? to_f32<S>(row[i0 + e]) : 0.0f;
}

// Stores a piece of a wide output (F32/F16/BF16 chosen at run time) at element i (the piece's first).
__device__ __forceinline__ void store_wide_piece(void *p, fp8amp_dtype dt, int64_t i, int64_t left, bool vec,
                                                 const float f[4]) {
    if (vec && left >= 4) {
        if (dt == FP8AMP_DTYPE_F32) {
            *reinterpret_cast<float4 *>(static_cast<float *>(p) + i) = make_float4(f[0], f[1], f[2], f[3]);
        } else {
            uint16_t h[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
                h[e] = dt == FP8AMP_DTYPE_F16 ? from_f32<FP8AMP_DTYPE_F16>(f[e]) : from_f32<FP8AMP_DTYPE_BF16>(f[e]);
            *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p) + i) =
                make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
        }
        return;
    }
#pragma unroll  // constant indices keep f[] in registers
    for (int e = 0; e < 4; ++e)
        if (e < left) store_wide(p, dt, i + e, f[e]);
}

// Whether p + 4k elements of `size` bytes are 4-element aligned for every k (with d % 4 == 0).
__device__ __forceinline__ bool piece_aligned(const void *p, int64_t d, size_t size) {
    return d % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * size) == 0;
}

__device__ __forceinline__ size_t wide_size(fp8amp_dtype dt) { return dt == FP8AMP_DTYPE_F32 ? 4 : 2; }

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

// Calls f(i0, p) for this thread's pieces of a row of d, in increasing order: pieces
// k = threadIdx.x + p * 256 (p = 0, 1, ...), elements i0 = 4k..4k+3 (some may be past d at the end).
// kPieces > 0: at most kPieces pieces (the launch guarantees d <= kPieces * 1024), p indexes a
// register cache of 4 floats per piece; kPieces == 0: any d, p is 0.
template <int kPieces, class F>
__device__ __forceinline__ void for_pieces(int64_t d, F &&f) {
    if constexpr (kPieces > 0) {
#pragma unroll
        for (int p = 0; p < kPieces; ++p) {
            const int64_t i0 = (int64_t(threadIdx.x) + int64_t(p) * kThreads) * 4;
            if (i0 < d) f(i0, p);
        }
    } else {
        for (int64_t i0 = int64_t(threadIdx.x) * 4; i0 < d; i0 += kRowsPerPass) f(i0, 0);
    }
}

template <fp8amp_dtype D>
constexpr bool is_fp8_v = D == FP8AMP_DTYPE_E4M3 || D == FP8AMP_DTYPE_E5M2;

// The weight (gamma or 1 + gamma) and beta of a piece's columns (0 past d).
__device__ __forceinline__ void load_affine(const NormForwardArgs &a, int64_t i0, float w[4], float b[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const bool in = i0 + e < a.d;
        w[e] = in ? norm::weight(load_wide(a.gamma, a.gamma_dtype, i0 + e), a.zero_centered) : 0.0f;
        b[e] = in && a.beta ? load_wide(a.beta, a.beta_dtype, i0 + e) : 0.0f;
    }
}

// y of one row into D (E4M3/E5M2; F32 stands for any wide dtype, a.y_dtype, chosen at run time).
// kWrite false: only y's amax (current scaling's first pass). Loads and stores move whole pieces
// (8/16-byte loads, 4-byte FP8 stores) when the rows are aligned.
template <fp8amp_dtype S, fp8amp_dtype D, int kPieces, bool kWrite>
__global__ void __launch_bounds__(kThreads) norm_forward_kernel(const NormForwardArgs a) {
    using SrcT = typename Storage<S>::type;
    constexpr bool kFp8 = is_fp8_v<D>;
    constexpr int kCache = kPieces > 0 ? kPieces * 4 : 4;
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
    const bool vec_x = piece_aligned(a.x, d, sizeof(SrcT));
    const bool vec_y = piece_aligned(a.y, d, kFp8 ? 1 : wide_size(a.y_dtype));
    // Short rows: the weight and bias of this thread's columns stay in registers across the rows the
    // block normalizes (8 or 16 floats; for longer rows the registers are worth more as the row cache).
    constexpr bool kAffineCache = kPieces > 0 && kPieces <= 2;
    float gw[kAffineCache ? kCache : 1], gb[kAffineCache ? kCache : 1];
    if constexpr (kAffineCache) for_pieces<kPieces>(d, [&](int64_t i0, int p) { load_affine(a, i0, gw + 4 * p, gb + 4 * p); });
    Tally t;
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const SrcT *xr = x + r * d;
        float v[kCache];
        // The piece's values: from the register cache (filled by the first pass), or read again.
        auto piece = [&](int64_t i0, int p, bool first) -> float * {
            if constexpr (kPieces > 0) {
                if (first) load_piece<S>(xr, i0, d, vec_x, v + 4 * p);
                return v + 4 * p;
            } else {
                load_piece<S>(xr, i0, d, vec_x, v + 0);  // kCache is 4 here
                return v;
            }
        };
        float mean = 0.0f, acc = 0.0f;
        if (!a.rms) {
            for_pieces<kPieces>(d, [&](int64_t i0, int p) {
                const float *f = piece(i0, p, true);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (i0 + e < d) acc = norm::fadd(acc, f[e]);
            });
            mean = norm::mean_of(block_sum(acc, red), d);
            acc = 0.0f;
            for_pieces<kPieces>(d, [&](int64_t i0, int p) {
                const float *f = piece(i0, p, false);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (i0 + e < d) acc = norm::fadd(acc, norm::centered_square(f[e], mean));
            });
        } else {
            for_pieces<kPieces>(d, [&](int64_t i0, int p) {
                const float *f = piece(i0, p, true);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (i0 + e < d) acc = norm::fadd(acc, norm::square(f[e]));
            });
        }
        const float rstd = norm::rstd_of(block_sum(acc, red), d, a.eps);
        if (kWrite && threadIdx.x == 0) {
            if (a.mean) a.mean[r] = norm::canonical(mean);
            if (a.rstd) a.rstd[r] = norm::canonical(rstd);
        }
        for_pieces<kPieces>(d, [&](int64_t i0, int p) {
            const float *f = piece(i0, p, false);
            float wl[4], bl[4];
            const float *w = wl, *b = bl;
            if constexpr (kAffineCache) {
                w = gw + 4 * p, b = gb + 4 * p;
            } else {
                load_affine(a, i0, wl, bl);
            }
            float y[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) y[e] = norm::y_value(norm::xhat(f[e], mean, rstd, a.rms), w[e], b[e], a.beta != nullptr);
            const int64_t left = d - i0, base = r * d + i0;
            if constexpr (kFp8) {
                uint32_t packed = 0;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (e >= left) break;
                    t.amax = max(t.amax, amax_bits_of(y[e]));
                    if constexpr (kWrite) {
                        const float sv = scaled(y[e], scale);
                        const uint8_t q = from_f32<D>(sv);
                        packed |= uint32_t(q) << (8 * e);
                        if (stats) {
                            t.saturated += (fabsf(sv) > fp8_max) ? 1u : 0u;  // false for NaN
                            t.underflowed += (y[e] != 0.0f && y[e] == y[e] && (q & 0x7Fu) == 0) ? 1u : 0u;
                        }
                    }
                }
                if constexpr (kWrite) {
                    auto *out = static_cast<uint8_t *>(a.y) + base;
                    if (vec_y && left >= 4) {
                        *reinterpret_cast<uint32_t *>(out) = packed;
                    } else {
                        for (int e = 0; e < 4; ++e)
                            if (e < left) out[e] = uint8_t(packed >> (8 * e));
                    }
                }
            } else {
                store_wide_piece(a.y, a.y_dtype, base, left, vec_y, y);
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
// and dbeta (dy), written to partial[(2k + 0 / 1) * d + column]. Pieces move as whole vectors when
// aligned, as in the forward; the weight of this thread's columns stays in registers (kPieces > 0).
template <fp8amp_dtype SDY, fp8amp_dtype SX, int kPieces>
__global__ void __launch_bounds__(kThreads) norm_backward_kernel(const NormBackwardArgs a, float *partial,
                                                                 int64_t n_chunks) {
    using DyT = typename Storage<SDY>::type;
    using XT = typename Storage<SX>::type;
    constexpr int kCache = kPieces > 0 ? kPieces * 4 : 4;
    __shared__ float red2[18];
    const int64_t k = blockIdx.x, d = a.d;
    const float fd = static_cast<float>(d);
    float *pg = partial + (2 * k) * d, *pb = partial + (2 * k + 1) * d;
    const bool vec_dy = piece_aligned(a.dy, d, sizeof(DyT)), vec_x = piece_aligned(a.x, d, sizeof(XT));
    const bool vec_dx = piece_aligned(a.dx, d, wide_size(a.dx_dtype));
    auto weights = [&](int64_t i0, float w[4]) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            w[e] = i0 + e < d ? norm::weight(load_wide(a.gamma, a.gamma_dtype, i0 + e), a.zero_centered) : 0.0f;
    };
    float rg[kCache], rb[kCache], gw[kCache];  // the partials and weights in registers (kPieces > 0)
#pragma unroll
    for (int s = 0; s < kCache; ++s) rg[s] = rb[s] = 0.0f;
    if constexpr (kPieces > 0) {
        for_pieces<kPieces>(d, [&](int64_t i0, int p) { weights(i0, gw + 4 * p); });
    } else {
        for_pieces<0>(d, [&](int64_t i0, int) {
            for (int e = 0; e < 4 && i0 + e < d; ++e) pg[i0 + e] = pb[i0 + e] = 0.0f;
        });
    }
    const auto *dy = static_cast<const DyT *>(a.dy);
    const auto *x = static_cast<const XT *>(a.x);
    const int64_t r1 = norm::chunk_begin(k + 1, a.rows, n_chunks);
    for (int64_t r = norm::chunk_begin(k, a.rows, n_chunks); r < r1; ++r) {
        const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
        const int64_t base = r * d;
        float cdy[kCache], cxh[kCache];  // dy and xhat of the row (kPieces > 0)
        // This piece's dy, xhat and weight: loaded, or (second pass, kPieces > 0) from the cache.
        auto load = [&](int64_t i0, int p, float *dyv, float *xh, float *w) {
            float xv[4];
            load_piece<SDY>(dy + base, i0, d, vec_dy, dyv);
            load_piece<SX>(x + base, i0, d, vec_x, xv);
#pragma unroll
            for (int e = 0; e < 4; ++e) xh[e] = norm::xhat(xv[e], mean, rstd, a.rms);
            if constexpr (kPieces > 0) {
#pragma unroll
                for (int e = 0; e < 4; ++e) w[e] = gw[4 * p + e];
            } else {
                weights(i0, w);
            }
        };
        float acc1 = 0.0f, acc2 = 0.0f;
        for_pieces<kPieces>(d, [&](int64_t i0, int p) {
            float dyv[4], xh[4], w[4];
            load(i0, p, dyv, xh, w);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (i0 + e >= d) break;
                const float g = norm::fmul(dyv[e], w[e]);
                if (!a.rms) acc1 = norm::fadd(acc1, g);
                acc2 = norm::fadd(acc2, norm::fmul(g, xh[e]));
            }
            if constexpr (kPieces > 0) {
#pragma unroll
                for (int e = 0; e < 4; ++e) cdy[4 * p + e] = dyv[e], cxh[4 * p + e] = xh[e];
            }
        });
        block_sum2(acc1, acc2, red2);
        const float c1 = a.rms ? 0.0f : norm::fdiv(acc1, fd);
        const float c2 = norm::fdiv(acc2, fd);
        for_pieces<kPieces>(d, [&](int64_t i0, int p) {
            float dyv[4], xh[4], w[4], dx[4];
            if constexpr (kPieces > 0) {
#pragma unroll
                for (int e = 0; e < 4; ++e) dyv[e] = cdy[4 * p + e], xh[e] = cxh[4 * p + e], w[e] = gw[4 * p + e];
            } else {
                load(i0, p, dyv, xh, w);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float g = norm::fmul(dyv[e], w[e]);
                dx[e] = norm::dx_value(g, xh[e], c1, c2, rstd, a.rms);
                if (i0 + e >= d) continue;
                if constexpr (kPieces > 0) {
                    rg[4 * p + e] = norm::fadd(rg[4 * p + e], norm::fmul(dyv[e], xh[e]));
                    rb[4 * p + e] = norm::fadd(rb[4 * p + e], dyv[e]);
                } else {
                    pg[i0 + e] = norm::fadd(pg[i0 + e], norm::fmul(dyv[e], xh[e]));
                    pb[i0 + e] = norm::fadd(pb[i0 + e], dyv[e]);
                }
            }
            store_wide_piece(a.dx, a.dx_dtype, base + i0, d - i0, vec_dx, dx);
        });
    }
    if constexpr (kPieces > 0)
        for_pieces<kPieces>(d, [&](int64_t i0, int p) {
            for (int e = 0; e < 4; ++e)
            if (i0 + e < d) pg[i0 + e] = rg[4 * p + e], pb[i0 + e] = rb[4 * p + e];
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
    auto with_kernel = [&](auto s, auto dd, auto write, auto &&go) {
        constexpr fp8amp_dtype S = decltype(s)::value, D = decltype(dd)::value;
        constexpr bool W = decltype(write)::value;
        dispatch_pieces<8>(a.d, [&](auto p) { go(norm_forward_kernel<S, D, decltype(p)::value, W>, rows * kThreads); });
    };
    auto launch = [&](auto kernel, size_t threads) {
        kernel<<<persistent_grid(device, kernel, threads), kThreads, 0, stream>>>(a);
        check_launch("norm_forward_kernel");
    };
    dispatch_src(a.x_dtype, [&](auto s) {
        if (!fp8) return with_kernel(s, std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F32>(), std::true_type(), launch);
        auto run_fp8 = [&](auto dd) {
            if (a.target.current) {
                check(cudaMemsetAsync(&a.target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
                with_kernel(s, dd, std::false_type(), launch);
            }
            with_kernel(s, dd, std::true_type(), launch);
        };
        if (a.y_dtype == FP8AMP_DTYPE_E4M3) run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
        else run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
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
            // The dy/xhat cache and two partials in registers up to 4 pieces (d <= 4096; 8 pieces would
            // take over 200 registers and leave one block per SM).
            const unsigned grid = static_cast<unsigned>(n_chunks);
            dispatch_pieces<4>(a.d, [&](auto p) {
                norm_backward_kernel<SDY, SX, decltype(p)::value><<<grid, kThreads, 0, stream>>>(a, partial, n_chunks);
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
