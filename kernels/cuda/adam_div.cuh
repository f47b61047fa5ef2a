// Division by the Adam step's constant bc2_sqrt, shared by kernels/cuda/adam_fast.cu and the check
// that compares it with __fdiv_rn on the GPU (bench/adam_ieee_check.cu).
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

}  // namespace fp8amp::kernels::cuda
