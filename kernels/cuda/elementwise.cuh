// Element conversions shared by the CUDA kernels. FP8 encodes use the hardware conversion
// (cvt.rn.satfinite on sm_89+, through cuda_fp8.h); NaN is mapped to the canonical code explicitly
// so that results do not depend on what the hardware does with NaN payloads and stay bit-identical
// to kernels/cpu. Decodes are the exact software codec.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels::cuda {

template <fp8amp_dtype D> struct Storage;
template <> struct Storage<FP8AMP_DTYPE_F32> { using type = float; };
template <> struct Storage<FP8AMP_DTYPE_F16> { using type = uint16_t; };
template <> struct Storage<FP8AMP_DTYPE_BF16> { using type = uint16_t; };
template <> struct Storage<FP8AMP_DTYPE_E4M3> { using type = uint8_t; };
template <> struct Storage<FP8AMP_DTYPE_E5M2> { using type = uint8_t; };

template <fp8amp_dtype D>
__device__ __forceinline__ float to_f32(typename Storage<D>::type v) {
    if constexpr (D == FP8AMP_DTYPE_F32) return codec::canonical_f32(v);
    // F16 and BF16 widen exactly in hardware / by a shift (codec::decode's value for every code);
    // only a NaN needs codec::decode's canonical quiet NaN (sign kept). A few instructions instead of
    // the software decode's dozen, which dominated the row kernels that read their input 3 times.
    if constexpr (D == FP8AMP_DTYPE_F16 || D == FP8AMP_DTYPE_BF16) {
        const float f = D == FP8AMP_DTYPE_F16 ? __half2float(__ushort_as_half(v)) : __uint_as_float(uint32_t(v) << 16);
        return f == f ? f : __uint_as_float((uint32_t(v) & 0x8000u) << 16 | codec::kF32QuietNaN);
    }
    if constexpr (D == FP8AMP_DTYPE_E4M3) return codec::decode<codec::E4M3>(v);
    if constexpr (D == FP8AMP_DTYPE_E5M2) return codec::decode<codec::E5M2>(v);
}

template <fp8amp_dtype D>
__device__ __forceinline__ typename Storage<D>::type from_f32(float x) {
    const uint32_t sign = codec::f32_bits(x) >> 31;
    const bool nan = x != x;
    if constexpr (D == FP8AMP_DTYPE_F32) return codec::canonical_f32(x);
    if constexpr (D == FP8AMP_DTYPE_F16)
        return nan ? static_cast<uint16_t>((sign << 15) | codec::F16::kQuietNaN) : __half_as_ushort(__float2half_rn(x));
    if constexpr (D == FP8AMP_DTYPE_BF16)
        return nan ? static_cast<uint16_t>((sign << 15) | codec::BF16::kQuietNaN)
                   : __bfloat16_as_ushort(__float2bfloat16_rn(x));
    if constexpr (D == FP8AMP_DTYPE_E4M3)
        return nan ? static_cast<uint8_t>((sign << 7) | codec::E4M3::kQuietNaN)
                   : static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    if constexpr (D == FP8AMP_DTYPE_E5M2)
        return nan ? static_cast<uint8_t>((sign << 7) | codec::E5M2::kQuietNaN)
                   : static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
}

}  // namespace fp8amp::kernels::cuda
