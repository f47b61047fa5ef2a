// Fused activations (GELU with the tanh approximation, SiLU, SwiGLU) whose forward writes the FP8
// input of the next GEMM and whose backward writes the FP8 dY of the GEMM before, amax fused
// (fp8amp_activation_forward / _backward).
//
// Bit identity between the CPU and CUDA needs the transcendental functions too: libm's expf/tanhf and
// CUDA's differ in their last bits. So exp is computed here from IEEE float32 multiplies and adds
// only (each rounded once; no FMA: __f*_rn on the device, -ffp-contract=off on the CPU): Cody-Waite
// reduction x = k ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor polynomial of e^r, and the exact scaling
// by 2^k. Its error is at most 1.21 ulp as measured (docs/numerics.md 8.1), far below what FP8 or
// BF16 keep.
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
using norm::fdiv;
using norm::fmul;
using norm::fsub;

FP8AMP_HD float pow2(int k) { return codec::bits_f32(static_cast<uint32_t>(127 + k) << 23); }  // -126..127

FP8AMP_HD float floor_f(float v) {
#if defined(__CUDA_ARCH__)
    return floorf(v);
#else
    return std::floor(v);
#endif
}

// e^x in float32 from IEEE multiplies and adds (see the top). NaN stays NaN; overflow gives inf;
// underflow goes through the subnormals to +0.
FP8AMP_HD float exp(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return codec::bits_f32(0x7F800000u);
    if (x < -103.97208404541015625f) return 0.0f;
    const float kf = floor_f(fadd(fmul(x, 0x1.715476p+0f /* 1/ln2 */), 0.5f));  // round(x / ln2)
    const int k = static_cast<int>(kf);
    // ln2 = hi + lo, hi with 16 significant bits, so kf * hi is exact for |k| <= 150.
    const float r = fsub(fsub(x, fmul(kf, 0.693145751953125f)), fmul(kf, 0x1.7f7d1cp-20f));
    float p = 0x1.a01a02p-13f /* 1/5040 */;
    p = fadd(fmul(p, r), 0x1.6c16c2p-10f /* 1/720 */);
    p = fadd(fmul(p, r), 0x1.111112p-7f /* 1/120 */);
    p = fadd(fmul(p, r), 0x1.555556p-5f /* 1/24 */);
    p = fadd(fmul(p, r), 0x1.555556p-3f /* 1/6 */);
    p = fadd(fmul(p, r), 0.5f);
    p = fadd(fmul(p, r), 1.0f);
    p = fadd(fmul(p, r), 1.0f);
    // p * 2^k in two exact steps (2^k itself may not be a normal float).
    if (k > 127) return fmul(fmul(p, pow2(127)), pow2(k - 127));
    if (k < -126) return fmul(fmul(p, pow2(-126)), pow2(k + 126));
    return fmul(p, pow2(k));
}

// 1 / (1 + e^-x).
FP8AMP_HD float sigmoid(float x) { return fdiv(1.0f, fadd(1.0f, exp(-x))); }

// tanh(z) = (e^2z - 1) / (e^2z + 1); +-1 beyond |z| = 10 (tanh(10) rounds to 1 in float32).
FP8AMP_HD float tanh(float z) {
    if (z != z) return z;
    if (z > 10.0f) return 1.0f;
    if (z < -10.0f) return -1.0f;
    const float e = exp(fmul(2.0f, z));
    return fdiv(fsub(e, 1.0f), fadd(e, 1.0f));
}

constexpr float kGeluC0 = 0x1.988454p-1f;  // sqrt(2 / pi)
constexpr float kGeluC1 = 0x1.6e4e26p-5f;  // 0.044715
constexpr float kGeluC1x3 = 0x1.12ba9cp-3f;  // 3 * kGeluC1, rounded

// GELU (tanh approximation): u = c0 (x + c1 x^3), y = 0.5 x (1 + tanh(u)).
FP8AMP_HD float gelu_tanh(float x) {
    const float u = fmul(kGeluC0, fadd(x, fmul(kGeluC1, fmul(fmul(x, x), x))));
    return fmul(fmul(0.5f, x), fadd(1.0f, tanh(u)));
}
// dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c0 (1 + 3 c1 x^2).
FP8AMP_HD float gelu_tanh_grad(float x) {
    const float x2 = fmul(x, x);
    const float t = tanh(fmul(kGeluC0, fadd(x, fmul(kGeluC1, fmul(x2, x)))));
    const float a = fmul(0.5f, fadd(1.0f, t));
    const float du = fmul(kGeluC0, fadd(1.0f, fmul(kGeluC1x3, x2)));
    return fadd(a, fmul(fmul(fmul(0.5f, x), fsub(1.0f, fmul(t, t))), du));
}

FP8AMP_HD float silu(float x) { return fmul(x, sigmoid(x)); }
// dy/dx = s (1 + x (1 - s)).
FP8AMP_HD float silu_grad(float x) {
    const float s = sigmoid(x);
    return fmul(s, fadd(1.0f, fmul(x, fsub(1.0f, s))));
}

// The forward's output element from its inputs: x (SwiGLU: a = x[r, c], b = x[r, cols + c]).
FP8AMP_HD float forward_value(int32_t kind, float x, float b) {
    const float y = kind == kGeluTanh ? gelu_tanh(x) : kind == kSilu ? silu(x) : fmul(silu(x), b);
    return norm::canonical(y);
}
// The backward's output element: dx = dy * f'(x); SwiGLU, for column c of the first half (da) or of
// the second (db, second_half): da = (dy * b) * silu'(a), db = dy * silu(a).
FP8AMP_HD float backward_value(int32_t kind, float dy, float x, float b, bool second_half) {
    float v;
    if (kind == kGeluTanh) v = fmul(dy, gelu_tanh_grad(x));
    else if (kind == kSilu) v = fmul(dy, silu_grad(x));
    else v = second_half ? fmul(dy, silu(x)) : fmul(fmul(dy, b), silu_grad(x));
    return norm::canonical(v);
}

}  // namespace act

namespace cpu {
void activation_forward(const ActivationArgs &args);
void activation_backward(const ActivationArgs &args);
}  // namespace cpu

namespace cuda {
void activation_forward(int device, void *stream, const ActivationArgs &args);
void activation_backward(int device, void *stream, const ActivationArgs &args);
}  // namespace cuda

}  // namespace fp8amp::kernels
