// The hardware FP8 encode of the communicator's kernels (kernels/cuda/comm.cu), in a header of its
// own so that tests/cuda/test_comm_codec.cu compiles the very function it checks.
#pragma once

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
}  // namespace fp8amp::kernels::cuda
