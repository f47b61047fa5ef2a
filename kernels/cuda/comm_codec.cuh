// The hardware FP8 encode of the communicator's kernels (kernels/cuda/comm.cu), in a header of its
// own so that tests/cuda/test_comm_codec.cu compiles the very function it checks.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels::cuda {

// Two FP8 codes of format W, a in the low byte, with the software codec's bytes (comm_encode):
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 rounds the exact float32 to nearest, ties to even, once (no
// intermediate format), into the format's subnormals as well (a float32 subnormal input is far below
// half the smallest FP8 subnormal, so it gives a signed zero either way), and with .satfinite every
// finite result beyond the largest finite value and every infinity become +-max: the definition
// codec::encode<F, true> implements with integer arithmetic. NaN is where they differ (the hardware
// writes 0x7F/0x7E without the sign), so NaN inputs get the canonical code with their sign here.
// tests/cuda/test_comm_codec.cu compares this function with comm_encode for all 2^32 float32 bit
// patterns (the pairs as well as each half) on the device.
template <fp8amp_dtype W>
__device__ __forceinline__ uint32_t encode2(float a, float b) {
    uint32_t p = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, W == FP8AMP_DTYPE_E4M3 ? __NV_E4M3 : __NV_E5M2);
    using F = std::conditional_t<W == FP8AMP_DTYPE_E4M3, codec::E4M3, codec::E5M2>;
    if (a != a) p = (p & 0xFF00u) | ((__float_as_uint(a) >> 24) & 0x80u) | F::kQuietNaN;
    if (b != b) p = (p & 0x00FFu) | ((((__float_as_uint(b) >> 24) & 0x80u) | F::kQuietNaN) << 8);
    return p;
}

// The values of the four FP8 codes of w (byte k is code k), exactly codec::decode's floats: E4M3
// pairs through the hardware's cvt.rn.f16x2.e4m3x2 (exact: every finite E4M3 value, subnormals
// included, is a normal F16), E5M2 as the high byte of an F16 (E5M2 is F16 without its low mantissa
// byte); then F16 -> float32, exact. NaN codes are mapped explicitly to the canonical float32 NaN
// with the code's sign, as the software decode gives (the hardware's NaN results need not keep the
// sign, and the E4M3 NaN code converts to a finite F16 pattern). About 2 instructions a code where
// the software decode, with its subnormal branch, takes a dozen; tests/cuda/test_comm_codec.cu
// compares the two over all 2^32 words.
// decode4 without the NaN fix-up: exact for every code that is not a NaN (E5M2's infinities
// included: an E5M2 code is the high byte of the F16 of the same value).
template <fp8amp_dtype W>
__device__ __forceinline__ void decode4_nonnan(uint32_t w, float v[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const auto two = static_cast<unsigned short>(w >> (16 * h));
        __half2_raw r;
        if constexpr (W == FP8AMP_DTYPE_E4M3) {
            r = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
        } else {
            r.x = static_cast<unsigned short>((two & 0xFFu) << 8);
            r.y = static_cast<unsigned short>(two & 0xFF00u);
        }
        const float2 f = __half22float2(__half2(r));
        v[2 * h] = f.x;
        v[2 * h + 1] = f.y;
    }
}
template <fp8amp_dtype W>
__device__ __forceinline__ void decode4(uint32_t w, float v[4]) {
    decode4_nonnan<W>(w, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t c = (w >> (8 * k)) & 0xFFu;
        const bool nan = W == FP8AMP_DTYPE_E4M3 ? (c & 0x7Fu) == 0x7Fu : (c & 0x7Fu) > 0x7Cu;
        if (nan) v[k] = __uint_as_float(((c & 0x80u) << 24) | codec::kF32QuietNaN);
    }
}

// Whether any of the four codes of w is special: a NaN (E4M3: the low seven bits all ones) or, for
// E5M2, any code with the exponent all ones (an infinity or a NaN: inf + -inf makes a NaN in the
// sum). Bytewise without carries: the masked byte is at most 0x7F (E4M3) or 0x7C (E5M2), and adding
// 1 (4) sets its bit 7 exactly when it is the special pattern.
template <fp8amp_dtype W>
__device__ __forceinline__ bool any_special4(uint32_t w) {
    if constexpr (W == FP8AMP_DTYPE_E4M3) return (((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0u;
    else return (((w & 0x7C7C7C7Cu) + 0x04040404u) & 0x80808080u) != 0u;
}

}  // namespace fp8amp::kernels::cuda
