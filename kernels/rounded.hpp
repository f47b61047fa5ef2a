// float32 operations each rounded once, the same on both devices: no FMA contraction (CUDA's
// __f*_rn intrinsics; on the host the files that include this are compiled with -ffp-contract=off),
// and explicit fused multiply-adds (ffma) where a formula asks for one.
// Shared by the element math of the optimizer (adam.hpp) and of the fused norms and activations
// (norm.hpp, activation.hpp), whose CPU and CUDA results must be the same bytes.
#pragma once

#include <cmath>

#include "codec.hpp"  // FP8AMP_HD

namespace fp8amp::kernels::rounded {

#if defined(__CUDA_ARCH__)
FP8AMP_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
FP8AMP_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
FP8AMP_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
FP8AMP_HD float fdiv(float a, float b) { return __fdiv_rn(a, b); }
FP8AMP_HD float fsqrt(float a) { return __fsqrt_rn(a); }
#else
inline float fmul(float a, float b) { return a * b; }
inline float fadd(float a, float b) { return a + b; }
inline float fsub(float a, float b) { return a - b; }
inline float fdiv(float a, float b) { return a / b; }
inline float fsqrt(float a) { return std::sqrt(a); }  // correctly rounded (IEEE)
#endif

// a * b + c rounded once (IEEE fusedMultiplyAdd): the same bits on both devices. glibc's fmaf is
// correctly rounded (the hardware FMA where there is one), as is __fmaf_rn.
FP8AMP_HD float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

}  // namespace fp8amp::kernels::rounded
