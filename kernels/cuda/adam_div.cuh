// Division by the Adam step's constant bc2_sqrt, shared by kernels/cuda/adam.cu and the check that
// compares it with __fdiv_rn on the GPU (bench/adam_ieee_check.cu).
#pragma once

namespace fp8amp::kernels::cuda {

// x / b for the step's constant b = bc2_sqrt, b's refined reciprocal computed once per launch: the
// fast path of div.rn.f32 as ptxas expands __fdiv_rn (y0 = rcp.approx(b), y1 = fma(y0, fma(-b, y0, 1),
// y0); q0 = a * y1, r = fma(-b, q0, a), q = fma(y1, r, q0)), which __fdiv_rn takes when FCHK finds the
// operands in range. Here a = sqrt(v) is +0 or in [2^-75, 2^64] (v finite and not negative: the
// caller checks, else it takes the reference path) and b = sqrt(1 - beta2^t) is in [2^-12, 1]: far
// from overflow and underflow, where the sequence is __fdiv_rn's, bit for bit (checked on the GPU
// against __fdiv_rn by bench/adam_ieee_check.cu). It saves 7 of the 10 instructions of a division.
struct ConstDiv {
    float b, y1;
};
__device__ __forceinline__ ConstDiv make_const_div(float b) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(b));
    return {b, __fmaf_rn(y0, __fmaf_rn(-b, y0, 1.0f), y0)};
}
__device__ __forceinline__ float div_const(float a, const ConstDiv &d) {
    const float q0 = __fmul_rn(d.y1, a);  // = fma(y1, a, +0) for every a but -0, which sqrt(v) never is here
    return __fmaf_rn(d.y1, __fmaf_rn(-d.b, q0, a), q0);
}

// The fast paths of sqrt.rn.f32 and div.rn.f32 as ptxas expands __fsqrt_rn and __fdiv_rn, without
// their range checks and branches (FP8AMP_ADAM_LEAN in adam.cu): those branches put each element's
// two MUFU chains in basic blocks of their own, with convergence barriers around each, so a lane's
// elements cannot overlap and every element pays about eight instructions of scaffolding. The caller
// checks the ranges below instead, a few instructions per element and one test per lane, and redoes
// a lane outside them on the reference path. Both are checked bit for bit against the intrinsics on
// the GPU by bench/adam_ieee_check.cu.
//
// sqrt(v) for v in [2^-101, FLT_MAX] (the range of __fsqrt_rn's fast path: bits(v) - 0x0D000000 <=
// 0x727FFFFF): MUFU.RSQ, then one Newton step with a correction. NaN for v = +0 (rsqrt gives inf).
__device__ __forceinline__ float sqrt_lean(float v) {
    float r;
    asm("{\n\t.reg .f32 y, s, h, e;\n\t"
        "rsqrt.approx.ftz.f32 y, %1;\n\t"
        "mul.ftz.f32 s, %1, y;\n\t"
        "mul.ftz.f32 h, y, 0f3F000000;\n\t"
        "neg.f32 e, s;\n\t"
        "fma.rn.f32 e, e, s, %1;\n\t"
        "fma.rn.f32 %0, e, h, s;\n\t}"
        : "=f"(r)
        : "f"(v));
    return r;
}
// a / b for b in [2^-100, 2^76] and a = +-0 or |a|, |a / b| in [2^-100, 2^100]: the reciprocal refined
// once, the quotient a * y1 and one correction. __fdiv_rn's fast path computes q0 = fma(a, y1, +0),
// r = fma(-b, q0, a), q = fma(y1, r, q0); here q0 = a * y1, r' = fma(b, q0, -a) = -r and
// q = fma(-y1, r', q0): the same value for a nonzero a (the negations are exact), and for a = +-0 the
// zero of a's sign, as __fdiv_rn gives (fma(a, y1, +0) would give +0 for a = -0).
__device__ __forceinline__ float div_lean(float a, float b) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(b));
    const float y1 = __fmaf_rn(y0, __fmaf_rn(-b, y0, 1.0f), y0);
    const float q0 = __fmul_rn(a, y1);
    return __fmaf_rn(-y1, __fmaf_rn(b, q0, -a), q0);
}

}  // namespace fp8amp::kernels::cuda
