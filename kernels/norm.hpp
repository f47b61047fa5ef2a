// Fused normalization (LayerNorm, RMSNorm) whose forward writes the FP8 input of the next GEMM with
// the amax fused, and whose backward takes the GEMM's dX (fp8amp_norm_forward / _backward).
//
// The arithmetic both backends must agree on bit for bit lives here, as FP8AMP_HD inline functions
// used by the CPU reference (kernels/cpu/norm.cpp, compiled with -ffp-contract=off) and the CUDA
// kernels (kernels/cuda/norm.cu, through the __f*_rn intrinsics, which nvcc never contracts into an
// FMA). Every float32 operation is rounded once, to nearest even; the fused multiply-adds (ffma:
// __fmaf_rn / std::fma) are written out where the formulas below use one.
//
// Reduction orders (docs/numerics.md section 7.2):
// - A row's sum (mean, variance, the backward's two dot products): the row is cut into pieces of
//   kPiece = 8 consecutive elements (piece k = elements 8k..8k+7) dealt round robin to
//   lanes(d) = 32 * groups(d) lanes (piece k goes to lane k % lanes), groups(d) = 1, 2, 4, 8 for
//   d <= 1024, <= 2048, <= 4096, longer. Each lane adds its elements in increasing index order,
//   starting from +0; then the lane sums are combined by the fixed tree of tree_sum() below: within
//   each group of 32 lanes, halving strides 16, 8, 4, 2, 1 (lane l += lane l + s), then across the
//   groups, strides groups/2, ..., 1. On CUDA a row belongs to groups(d) warps (one warp per row up
//   to d = 1024, 8 warps at d > 4096): each thread is a lane holding its pieces in registers (16-byte
//   loads of BF16), the warp tree is a butterfly of shuffles (the same additions: fadd commutes
//   exactly), the group tree one shared-memory exchange behind a named barrier.
// - A column sum over rows (dgamma, dbeta): the rows are split into chunks(rows) chunks of
//   consecutive rows (chunk_begin); chunk k's rows into slots(d) = 8 / groups(d) sub-chunks of
//   consecutive rows (chunk_begin again, over the chunk's rows). A sub-chunk's partial adds its rows in
//   increasing order from +0; a chunk's partial adds its sub-chunk partials in increasing order from
//   +0; chunks 2j and 2j + 1 make pair j's partial (chunk 2j's + chunk 2j + 1's; the last chunk's
//   alone where n_chunks is odd); the result adds the pair partials in increasing order from +0.
//   (On CUDA a chunk is a 256-thread block, a sub-chunk the groups(d) warps of one of its row slots,
//   a pair a cluster of two blocks, which add their partials through distributed shared memory.)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"
#include "rounded.hpp"
#include "kernels.hpp"  // QuantizeTarget

namespace fp8amp::kernels {

// ---- the arguments ----------------------------------------------------------------------------

struct NormForwardArgs {
    bool rms = false;            // RMSNorm (else LayerNorm)
    bool zero_centered = false;  // the weight is 1 + gamma
    float eps = 1e-5f;
    int64_t rows = 0, d = 0;
    const void *x = nullptr;
    fp8amp_dtype x_dtype = FP8AMP_DTYPE_F32;
    const void *gamma = nullptr;
    fp8amp_dtype gamma_dtype = FP8AMP_DTYPE_F32;
    const void *beta = nullptr;  // or null (LayerNorm without bias; RMSNorm)
    fp8amp_dtype beta_dtype = FP8AMP_DTYPE_F32;
    void *y = nullptr;
    fp8amp_dtype y_dtype = FP8AMP_DTYPE_F32;  // F32/F16/BF16, or E4M3/E5M2 with `target`
    void *y_t = nullptr;                      // FP8 only: [d, rows], or null
    QuantizeTarget target{nullptr, nullptr};  // FP8 y: its meta and scale_inv slots
    float *mean = nullptr;                    // [rows] or null (LayerNorm only)
    float *rstd = nullptr;                    // [rows] or null
};

struct NormBackwardArgs {
    bool rms = false;
    bool zero_centered = false;
    int64_t rows = 0, d = 0;
    const void *dy = nullptr;
    fp8amp_dtype dy_dtype = FP8AMP_DTYPE_F32;
    const void *x = nullptr;
    fp8amp_dtype x_dtype = FP8AMP_DTYPE_F32;
    const void *gamma = nullptr;
    fp8amp_dtype gamma_dtype = FP8AMP_DTYPE_F32;
    const float *mean = nullptr;  // LayerNorm: [rows]
    const float *rstd = nullptr;  // [rows]
    void *dx = nullptr;
    fp8amp_dtype dx_dtype = FP8AMP_DTYPE_F32;
    float *dgamma = nullptr;  // [d]
    float *dbeta = nullptr;   // [d] or null
};

namespace norm {

constexpr int kPiece = 8;            // consecutive elements a lane takes at a time
constexpr int kMaxGroups = 8;        // warps of a row (groups of 32 lanes) at most
constexpr int kMaxLanes = 32 * kMaxGroups;
constexpr int kBlockWarps = 8;       // warps of a CUDA block: slots(d) rows at a time
// Row chunks of the column sums: 2 blocks on each of an H100's 132 SMs, one wave (the order must not
// depend on the device, so this is a constant).
constexpr int64_t kMaxChunks = 264;

// ---- float32 operations, each rounded once (rounded.hpp: no FMA contraction on either device) ----
using rounded::fadd;
using rounded::fdiv;
using rounded::ffma;
using rounded::fmul;
using rounded::fsqrt;
using rounded::fsub;

// The groups of 32 lanes (= warps) of a row of d, and its lanes.
FP8AMP_HD int groups(int64_t d) { return d <= 1024 ? 1 : d <= 2048 ? 2 : d <= 4096 ? 4 : 8; }
FP8AMP_HD int lanes(int64_t d) { return 32 * groups(d); }
// The row slots of a block (rows a CUDA block normalizes at once) = the sub-chunks of a chunk.
FP8AMP_HD int slots(int64_t d) { return kBlockWarps / groups(d); }
// The lane of element i of a row of `n_lanes` lanes.
FP8AMP_HD int lane_of(int64_t i, int n_lanes) { return static_cast<int>((i / kPiece) % n_lanes); }

// Combines the 32 * n_groups lane sums p[] (clobbered) in the fixed order described at the top.
FP8AMP_HD float tree_sum(float *p, int n_groups) {
    for (int w = 0; w < n_groups; ++w)
        for (int s = 16; s > 0; s /= 2)
            for (int l = 0; l < s; ++l) p[32 * w + l] = fadd(p[32 * w + l], p[32 * w + l + s]);
    for (int s = n_groups / 2; s > 0; s /= 2)
        for (int w = 0; w < s; ++w) p[32 * w] = fadd(p[32 * w], p[32 * (w + s)]);
    return p[0];
}

// A NaN result is stored as the positive canonical NaN: the CPU and the GPU make NaNs of different
// signs and payloads (x86's default NaN is negative), and the FP8 code of a NaN keeps its sign.
FP8AMP_HD float canonical(float v) { return v != v ? codec::bits_f32(codec::kF32QuietNaN) : v; }

// v / d. For d a power of two the product v * (1 / d) is the same number, rounded once the same way
// (both are the exact v * 2^-k rounded), at a few instructions instead of a division's dozen.
// 1 / d = 2^-k is built from its bits (k <= 62: a normal float). d >= 1: every tensor extent is
// (core/tensor.cpp), so d & (d - 1) == 0 means a power of two here.
FP8AMP_HD float div_by_d(float v, int64_t d) {
    if ((d & (d - 1)) != 0) return fdiv(v, static_cast<float>(d));
#if defined(__CUDA_ARCH__)
    const int k = __ffsll(static_cast<long long>(d)) - 1;
#else
    const int k = __builtin_ctzll(static_cast<unsigned long long>(d));
#endif
    return fmul(v, codec::bits_f32(static_cast<uint32_t>(127 - k) << 23));
}
// The statistics of a row from its lane-tree sums. LayerNorm: mean = sum / d, then (second pass)
// var = sum((x - mean)^2) / d. RMSNorm: ms = sum(x^2) / d. rstd = 1 / sqrt(var_or_ms + eps).
FP8AMP_HD float mean_of(float sum, int64_t d) { return div_by_d(sum, d); }
FP8AMP_HD float rstd_of(float sum_sq, int64_t d, float eps) {
    return fdiv(1.0f, fsqrt(fadd(div_by_d(sum_sq, d), eps)));
}
// A lane's running sum for the second statistic with one more element: acc + (x - mean)^2 (LayerNorm)
// or acc + x^2 (RMSNorm: its first pass is this one), the square and the addition one fused
// multiply-add (since 2026-11-27; before, two roundings).
FP8AMP_HD float add_centered_square(float acc, float x, float mean) {
    const float t = fsub(x, mean);
    return ffma(t, t, acc);
}
FP8AMP_HD float add_square(float acc, float x) { return ffma(x, x, acc); }

// The normalized value: (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm).
FP8AMP_HD float xhat(float x, float mean, float rstd, bool rms) { return rms ? fmul(x, rstd) : fmul(fsub(x, mean), rstd); }
// The weight of a column: gamma, or 1 + gamma (zero-centered gamma).
FP8AMP_HD float weight(float gamma, bool zero_centered) { return zero_centered ? fadd(1.0f, gamma) : gamma; }
// y = xhat * w + beta, one fused multiply-add (no beta: xhat * w), canonical NaN.
FP8AMP_HD float y_value(float xh, float w, float beta, bool has_beta) {
    return canonical(has_beta ? ffma(xh, w, beta) : fmul(xh, w));
}

// The backward of a row, from g = dy * w and xhat: c1 = sum(g) / d (LayerNorm), c2 = sum(g * xhat) / d;
// dx = ((g - c1) - xhat * c2) * rstd (LayerNorm) or (g - xhat * c2) * rstd (RMSNorm), canonical NaN.
FP8AMP_HD float dx_value(float g, float xh, float c1, float c2, float rstd, bool rms) {
    const float t = rms ? g : fsub(g, c1);
    return canonical(fmul(fsub(t, fmul(xh, c2)), rstd));
}

// Column sums: the chunks of rows (and, with n_chunks = slots(d) over a chunk's rows, its sub-chunks).
FP8AMP_HD int64_t chunks(int64_t rows) { return rows < kMaxChunks ? rows : kMaxChunks; }
// Pairs of chunks, the column sums' last level (chunk 2j, and 2j + 1 where it exists).
FP8AMP_HD int64_t chunk_pairs(int64_t n_chunks) { return (n_chunks + 1) / 2; }
FP8AMP_HD int64_t chunk_begin(int64_t k, int64_t rows, int64_t n_chunks) {
    return static_cast<int64_t>((static_cast<unsigned long long>(k) * static_cast<unsigned long long>(rows)) /
                                static_cast<unsigned long long>(n_chunks));
}

}  // namespace norm

// ---- the kernels (throw fp8amp::Error) ------------------------------------------------------------
namespace cpu {
// FP8 y: quantized with the target's meta (delayed: its scale; current: the scale of this y's amax,
// computed first), amax recorded, statistics counted, scale_inv slots written; y_t = transpose(y).
void norm_forward(const NormForwardArgs &args);
// scratch: norm_backward_scratch_floats(rows, d) floats of the caller's.
size_t norm_backward_scratch_floats(int64_t rows, int64_t d);
void norm_backward(const NormBackwardArgs &args, float *scratch);
}  // namespace cpu

namespace cuda {
// Asynchronous on `stream`, bit-identical to the cpu:: functions. partial: device memory of
// norm_backward_partial_floats(rows, d) floats.
void norm_forward(int device, void *stream, const NormForwardArgs &args);
size_t norm_backward_partial_floats(int64_t rows, int64_t d);
void norm_backward(int device, void *stream, const NormBackwardArgs &args, float *partial);
}  // namespace cuda

}  // namespace fp8amp::kernels
