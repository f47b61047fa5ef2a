// Division by the Adam step's constant bc2_sqrt, shared by kernels/cuda/adam.cu and the check that
// compares it with __fdiv_rn on the GPU (bench/adam_ieee_check.cu).
#pragma once

#include <cstdint>

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
// their range checks and the branches to the slow paths: those branches split a lane's elements into
// separate basic blocks, so their dependent chains (two MUFU each) cannot overlap. The caller checks
// the ranges instead, once for several elements, and redoes them with __fsqrt_rn / __fdiv_rn when a
// value is outside (FP8AMP_ADAM_BRANCHFREE in adam.cu; checked bit for bit against those intrinsics
// on the GPU by bench/adam_ieee_check.cu).
//
// sqrt(v) for v in [2^-101, FLT_MAX] (the range __fsqrt_rn's fast path takes: its check is
// bits(v) - 0x0D000000 <= 0x727FFFFF): MUFU.RSQ, then one Newton step with a correction.
__device__ __forceinline__ float sqrt_fast(float v) {
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
// a / b with a nonzero and |a|, |a / b| in [2^-100, 2^100] and b a normal float: the reciprocal
// refined once, the quotient and one correction (the same steps as div_const, with b's reciprocal
// computed here). No intermediate is subnormal or infinite in that range; outside it the result may
// differ from __fdiv_rn (a zero a included: fma(a, y1, +0) is +0 for a = -0), so the caller checks.
__device__ __forceinline__ float div_fast(float a, float b) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(b));
    const float y1 = __fmaf_rn(y0, __fmaf_rn(-b, y0, 1.0f), y0);
    const float q0 = __fmaf_rn(a, y1, 0.0f);
    return __fmaf_rn(y1, __fmaf_rn(-b, q0, a), q0);
}

// c ? a : b, opaque to the compiler: both a and b are computed whatever c is, so a select around
// div_fast does not become a branch around it (which would split the elements' chains again).
__device__ __forceinline__ float select_f32(bool c, float a, float b) {
    float r;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %3, 0;\n\tselp.f32 %0, %1, %2, p;\n\t}"
        : "=f"(r)
        : "f"(a), "f"(b), "r"(uint32_t(c)));
    return r;
}

}  // namespace fp8amp::kernels::cuda
