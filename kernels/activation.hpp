// Fused activations (GELU with the tanh approximation, SiLU, SwiGLU) whose forward writes the FP8
// input of the next GEMM and whose backward writes the FP8 dY of the GEMM before, amax fused
// (fp8amp_activation_forward / _backward).
//
// Bit identity between the CPU and CUDA needs the transcendental functions too: libm's expf/tanhf and
// CUDA's differ in their last bits. So every function here is a fixed sequence of IEEE float32
// operations, each rounded once to nearest even, the same on both devices: multiplies and adds
// (__f*_rn on the device; the CPU file is compiled with -ffp-contract=off, so nothing is contracted
// behind our back) and explicit fused multiply-adds (ffma: __fmaf_rn / std::fma, both correctly
// rounded); no division, no branch (selects only). e^v (v <= 0 only: every caller passes -|z|) is a
// magic-number rounding, an FMA Cody-Waite reduction, a degree-6 minimax polynomial by FMA Horner and
// a two-multiply scaling (GELU's in base 2, exp2_neg: an exact-add reduction); GELU-tanh and SiLU are
// x * sigmoid(.), sigmoid from e = e^-|z| and 1 / (1 + e) by an FMA Newton reciprocal. About 30
// operations an element where the first version needed ~55. Measured errors against float64 (a dense sweep): docs/numerics.md 8.1.
#pragma once

#include <cmath>
#include <cstdint>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"
#include "kernels.hpp"  // QuantizeTarget
#include "norm.hpp"     // norm::fadd and friends, norm::canonical

namespace fp8amp::kernels {

// Values of fp8amp_activation (fp8amp.h).
enum ActivationKind : int32_t { kGeluTanh = 0, kSilu = 1, kSwiglu = 2 };

// Forward: x [rows, in_cols] -> out [rows, cols] (SwiGLU: in_cols = 2 cols; else equal).
// Backward: dy [rows, cols], x [rows, in_cols] -> out = dx [rows, in_cols].
struct ActivationArgs {
    int32_t kind = kGeluTanh;
    int64_t rows = 0, cols = 0;  // the forward's output columns
    const void *x = nullptr;
    fp8amp_dtype x_dtype = FP8AMP_DTYPE_F32;
    const void *dy = nullptr;  // backward only
    fp8amp_dtype dy_dtype = FP8AMP_DTYPE_F32;
    void *out = nullptr;  // y or dx: wide, or E4M3/E5M2 with `target`
    fp8amp_dtype out_dtype = FP8AMP_DTYPE_F32;
    void *out_t = nullptr;  // FP8 only: the transpose of out, or null
    QuantizeTarget target{nullptr, nullptr};
};

namespace act {

using norm::fadd;
using norm::fmul;
using norm::fsub;

using rounded::ffma;  // a * b + c rounded once

// max(v, lo) with IEEE maxNum semantics (a NaN v gives lo), the same on both devices.
FP8AMP_HD float fmax_num(float v, float lo) {
#if defined(__CUDA_ARCH__)
    return fmaxf(v, lo);
#else
    return std::fmax(v, lo);
#endif
}

// -|v| (exact: the sign bit set; an operand modifier on the GPU).
FP8AMP_HD float neg_abs(float v) {
#if defined(__CUDA_ARCH__)
    return -fabsf(v);
#else
    return -std::fabs(v);
#endif
}

// 1 / d for d in [1, 2] (every caller's d is 1 + e^-|z|) without a division: a quadratic minimax first
// guess (relative error 2^-6.6) and two Newton steps y += y (1 - d y), each two FMAs: 2^-26 before the
// last rounding, so within 0.672 ulp (every float32 d in [1, 2]; 4.3% of them not the correctly
// rounded 1 / d); the same bits on both devices, and six FMAs where an IEEE division costs a
// reciprocal, five FMAs, a range check and a branch on the GPU.
FP8AMP_HD float rcp_1_2(float d) {
    float y = ffma(ffma(0x1.4afd6ep-2f, d, -0x1.745d1ep+0f), d, 0x1.0f83e4p+1f);
    y = ffma(y, ffma(-d, y, 1.0f), y);
    return ffma(y, ffma(-d, y, 1.0f), y);
}

// e^v for v <= 0 (every caller passes -|z|), in [+0, 1]: no overflow, so no branch.
//   v = max(v, -104)                       e^-104 and below round to +0 alike; a NaN v becomes -104,
//                                          so the callers carry the NaN through their other operands
//   t = fma(v, 1/ln2, 1.5 * 2^23)          round(v / ln2) + 1.5 * 2^23 (the magic-number rounding:
//   k = t - 1.5 * 2^23                     exact, |v / ln2| < 2^22), ties to even
//   r = fma(k, -ln2_lo, fma(k, -ln2_hi, v))   |r| <= ln2 / 2 (+ a few ulp)
//   p = 1 + r (1 + r q(r))                 q: degree-4 minimax of (e^r - 1 - r) / r^2 (FMA Horner)
//   e^v = (p * 2^(k + 64)) * 2^-64         k in [-150, 0]: 2^(k + 64) is a normal float, the first
//                                          product is exact, the second rounds once (into the
//                                          subnormals where e^v is one). 2^(k + 64) is made from t's
//                                          bits: t's low mantissa bits hold k, so bits(t) << 23 is
//                                          k << 23 modulo 2^32.
FP8AMP_HD float exp_neg(float v) {
    v = fmax_num(v, -104.0f);
    const float t = ffma(v, 0x1.715476p+0f, 0x1.8p23f);
    const float k = fsub(t, 0x1.8p23f);
    float r = ffma(k, -0x1.62e430p-1f, v);
    r = ffma(k, 0x1.05c610p-29f, r);
    float q = 0x1.6a23d0p-10f;
    q = ffma(q, r, 0x1.123a20p-7f);
    q = ffma(q, r, 0x1.5558f2p-5f);
    q = ffma(q, r, 0x1.555492p-3f);
    q = ffma(q, r, 0x1.fffffcp-2f);
    const float p = ffma(ffma(q, r, 1.0f), r, 1.0f);
    const float s = codec::bits_f32((codec::f32_bits(t) << 23) + (uint32_t(127 + 64) << 23));
    return fmul(fmul(p, s), 0x1p-64f);
}

// 2^w for w <= 0, as exp_neg but with the argument already in base 2, so the reduction is exact
// adds instead of the Cody-Waite FMAs (two operations fewer): GELU folds 1/ln2 into its constants.
//   w = max(w, -150)          2^-150 and below round to +0 (a NaN w gives -150, as in exp_neg)
//   t = w + 1.5 * 2^23        k = t - 1.5 * 2^23 = round(w), ties to even
//   r = w - k                 exact (|r| <= 1/2: w and k are within a factor 2, or k = 0)
//   p = 1 + r q(r)            q: degree-4 minimax of (2^r - 1) / r on |r| <= 1/2 (FMA Horner;
//                             relative error 2^-23.1 before the roundings, 2.04 ulp in all: one FMA
//                             fewer than degree 5's 0.95 ulp, GELU's error within 1 ulp of before)
//   2^w = (p * 2^(k + 64)) * 2^-64   as in exp_neg
FP8AMP_HD float exp2_neg(float w) {
    w = fmax_num(w, -150.0f);
    const float t = fadd(w, 0x1.8p23f);
    const float r = fsub(w, fsub(t, 0x1.8p23f));
    float q = 0x1.5bb99ep-10f;
    q = ffma(q, r, 0x1.3ceafap-7f);
    q = ffma(q, r, 0x1.c6b756p-5f);
    q = ffma(q, r, 0x1.ebf9bap-3f);
    q = ffma(q, r, 0x1.62e42ap-1f);
    const float p = ffma(q, r, 1.0f);
    const float s = codec::bits_f32((codec::f32_bits(t) << 23) + (uint32_t(127 + 64) << 23));
    return fmul(fmul(p, s), 0x1p-64f);
}

// The logistic function through e = e^-|z| (never overflows) and d = 1 + e in [1, 2]:
//   sigmoid(z) = 1 / d (z >= 0), e / d (z < 0);  sigmoid(z) (1 - sigmoid(z)) = e / d^2.
// A NaN z gives e = e^-104 (finite); the callers' other operands (z itself) carry the NaN.

constexpr float kGeluA = 0x1.988454p+0f;   // 2 sqrt(2 / pi)
constexpr float kGeluB = 0x1.2444f2p-4f;   // 2 sqrt(2 / pi) * 0.044715, rounded once
constexpr float kGeluB3 = 0x1.b6676cp-3f;  // 3 * that, rounded once
constexpr float kGeluA2 = 0x1.26aec2p+1f;  // kGeluA / ln2 (z in base 2), rounded once
constexpr float kGeluB2 = 0x1.a5a7d0p-4f;  // kGeluB / ln2, rounded once

// GELU (tanh approximation) as 0.5 x (1 + tanh(u)) = x sigmoid(2u), 2u = z = x (A + B x^2):
//   y = (x >= 0 ? x : x e) * rcp(1 + e),  e = e^-|z| = 2^-|z2|,  z2 = z / ln2 = x (A2 + B2 x^2)
FP8AMP_HD float gelu_tanh(float x) {
    const float z2 = fmul(x, ffma(kGeluB2, fmul(x, x), kGeluA2));
    const float e = exp2_neg(neg_abs(z2));
    return fmul(x >= 0.0f ? x : fmul(x, e), rcp_1_2(fadd(1.0f, e)));
}

// A finite x beyond +-1e4 (x^2 or x^3 would overflow for x beyond ~1.8e19, and inf * 0 make a NaN)
// gives the same gradient as +-1e4, the limit (1 or 0) to float32; +-inf likewise: f'(+inf) = 1,
// f'(-inf) = +0. The selects keep a NaN x (every comparison with it is false).
FP8AMP_HD float grad_clamp(float x) {
    x = x < -1e4f ? -1e4f : x;
    return x > 1e4f ? 1e4f : x;
}

// dy/dx = sigmoid(z) + x z' sigmoid(z) (1 - sigmoid(z)),  z' = A + 3B x^2:
//   rd = 1 / d;  s = (x >= 0 ? rd : e rd);  s + (x z') (e rd^2)    (the last step one FMA)
FP8AMP_HD float gelu_tanh_grad(float x) {
    x = grad_clamp(x);
    const float x2 = fmul(x, x);
    const float e = exp2_neg(neg_abs(fmul(x, ffma(kGeluB2, x2, kGeluA2))));
    const float rd = rcp_1_2(fadd(1.0f, e));
    const float s = x >= 0.0f ? rd : fmul(e, rd);
    return ffma(fmul(x, ffma(kGeluB3, x2, kGeluA)), fmul(fmul(e, rd), rd), s);
}

// SiLU's shared parts: e = e^-|x|, d = 1 + e, num = (x >= 0 ? x : x e), so silu(x) = num / d. The
// SwiGLU backward (CUDA) computes silu(a) and silu'(a) from one evaluation; the CPU calls the two
// functions, which compute the same parts the same way (same bits).
struct SiluParts {
    float e, d, num;
};
FP8AMP_HD SiluParts silu_parts(float x) {
    const float e = exp_neg(neg_abs(x));
    return {e, fadd(1.0f, e), x >= 0.0f ? x : fmul(x, e)};
}
FP8AMP_HD float silu_of(const SiluParts &p) { return fmul(p.num, rcp_1_2(p.d)); }
// dy/dx = s + x s (1 - s) = s + (x e) rd^2, s = sigmoid(x) (rd or e rd), rd = 1 / d. e comes from the
// unclamped x: for |x| >= 1e4 both give e^-104 (exp_neg's clamp), so it equals e of grad_clamp(x).
FP8AMP_HD float silu_grad_of(const SiluParts &p, float x) {
    x = grad_clamp(x);
    const float rd = rcp_1_2(p.d);
    const float s = x >= 0.0f ? rd : fmul(p.e, rd);
    return ffma(fmul(x, p.e), fmul(rd, rd), s);
}
FP8AMP_HD float silu(float x) { return silu_of(silu_parts(x)); }
FP8AMP_HD float silu_grad(float x) { return silu_grad_of(silu_parts(x), x); }

// The forward's output element from its inputs: x (SwiGLU: a = x[r, c], b = x[r, cols + c]); NaN
// not yet canonical (forward_value makes it so).
FP8AMP_HD float forward_raw(int32_t kind, float x, float b) {
    return kind == kGeluTanh ? gelu_tanh(x) : kind == kSilu ? silu(x) : fmul(silu(x), b);
}
FP8AMP_HD float forward_value(int32_t kind, float x, float b) { return norm::canonical(forward_raw(kind, x, b)); }
// The backward's output element: dx = dy * f'(x); SwiGLU, for column c of the first half (da) or of
// the second (db, second_half): da = (dy * b) * silu'(a), db = dy * silu(a).
FP8AMP_HD float backward_raw(int32_t kind, float dy, float x, float b, bool second_half) {
    if (kind == kGeluTanh) return fmul(dy, gelu_tanh_grad(x));
    if (kind == kSilu) return fmul(dy, silu_grad(x));
    return second_half ? fmul(dy, silu(x)) : fmul(fmul(dy, b), silu_grad(x));
}
FP8AMP_HD float backward_value(int32_t kind, float dy, float x, float b, bool second_half) {
    return norm::canonical(backward_raw(kind, dy, x, b, second_half));
}
// SwiGLU's two backward elements of column c from one evaluation: the same bits as backward_raw's.
FP8AMP_HD void swiglu_backward_raw(float dy, float a, float b, float &da, float &db) {
    const SiluParts p = silu_parts(a);
    db = fmul(dy, silu_of(p));
    da = fmul(fmul(dy, b), silu_grad_of(p, a));
}

// ---- the forwards' table of BF16 inputs (CUDA) ---------------------------------------------------
// GELU and SiLU of a BF16 x depend on x's 16 bits only, so the CUDA forwards of BF16 inputs (the
// stream kernel: not SwiGLU's, not the ones that write y_t too) read f(x) from a table in shared
// memory for the inputs that occur most -- |x| in [2^-11, 32): 16 exponents of 128 mantissas, both
// signs, 4096 floats (16 KB) -- and compute the formula above for the others (zeros, tinier or larger
// magnitudes, inf, NaN). A lookup is a few integer operations where the formula is ~30 float ones,
// which is what held those forwards below copy speed (docs/performance.md, "the forwards' table").
// The entries are the CPU's values of the same functions (cpu::activation_table), so the table
// changes no bit: f(x) is the same number whichever way it is found (tests/capi/test_activation.c
// checks all 2^16 inputs against the CPU).
namespace table {
constexpr uint32_t kFirstExponent = 116;              // biased: 2^-11
constexpr uint32_t kBase = kFirstExponent << 7;        // magnitude bits (x & 0x7FFF) of the first entry
constexpr uint32_t kHalf = 16u << 7;                   // entries a sign: 16 exponents x 128 mantissas
constexpr uint32_t kEntries = 2 * kHalf;               // [0, kHalf): x >= 0; [kHalf, kEntries): x < 0
// Entry i's input, as BF16 bits.
FP8AMP_HD uint16_t input_bits(uint32_t i) {
    return static_cast<uint16_t>(((i / kHalf) << 15) | (kBase + i % kHalf));
}
// Whether BF16 bits b have an entry.
FP8AMP_HD bool covers(uint32_t b) { return ((b & 0x7FFFu) - kBase) < kHalf; }
}  // namespace table

}  // namespace act

namespace cpu {
void activation_forward(const ActivationArgs &args);
void activation_backward(const ActivationArgs &args);
// out[i] = f(act::table::input_bits(i)) for i < act::table::kEntries, f = GELU (tanh) or SiLU (kind):
// the entries the CUDA forwards read.
void activation_table(int32_t kind, float *out);
}  // namespace cpu

namespace cuda {
void activation_forward(int device, void *stream, const ActivationArgs &args);
void activation_backward(int device, void *stream, const ActivationArgs &args);
// Puts the forwards' tables (cpu::activation_table) into the device's memory (the CUDA backend's
// creation calls it, for every context). Synchronous; throws CUDA.
void activation_prepare(int device);
}  // namespace cuda

}  // namespace fp8amp::kernels
