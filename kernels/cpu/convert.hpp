// Per-dtype element access shared by the CPU kernels: every element goes through float32 (which
// holds every value of the five dtypes exactly) and is rounded once into its destination by the
// shared codec. One switch outside each loop keeps the loop bodies free of dispatch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec.hpp"
#include "error.hpp"
#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels::cpu {

// Calls visit(i, value) for the n elements of src, decoded exactly to float32 (an F32 NaN is made
// canonical, as a conversion does; FP8 codes are decoded without any scale).
template <class Visit>
void for_each_value(const void *src, fp8amp_dtype dtype, size_t n, Visit &&visit) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32:
        for (size_t i = 0; i < n; ++i) visit(i, codec::canonical_f32(static_cast<const float *>(src)[i]));
        return;
    case FP8AMP_DTYPE_F16:
        for (size_t i = 0; i < n; ++i) visit(i, codec::decode<codec::F16>(static_cast<const uint16_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_BF16:
        for (size_t i = 0; i < n; ++i) visit(i, codec::decode<codec::BF16>(static_cast<const uint16_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_E4M3:
        for (size_t i = 0; i < n; ++i) visit(i, codec::decode<codec::E4M3>(static_cast<const uint8_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_E5M2:
        for (size_t i = 0; i < n; ++i) visit(i, codec::decode<codec::E5M2>(static_cast<const uint8_t *>(src)[i]));
        return;
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu kernels: unknown source dtype");
}

// Calls body(store), where store(i, v) writes float32 v as element i of dst, rounded into `dtype` by
// the rules of fp8amp_cast (canonical NaN into F32; IEEE overflow into F16/BF16; saturation into FP8).
template <class Body>
void with_store(void *dst, fp8amp_dtype dtype, Body &&body) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: {
        auto *out = static_cast<float *>(dst);
        body([out](size_t i, float v) { out[i] = codec::canonical_f32(v); });
        return;
    }
    case FP8AMP_DTYPE_F16: {
        auto *out = static_cast<uint16_t *>(dst);
        body([out](size_t i, float v) { out[i] = static_cast<uint16_t>(codec::encode<codec::F16, false>(v)); });
        return;
    }
    case FP8AMP_DTYPE_BF16: {
        auto *out = static_cast<uint16_t *>(dst);
        body([out](size_t i, float v) { out[i] = static_cast<uint16_t>(codec::encode<codec::BF16, false>(v)); });
        return;
    }
    case FP8AMP_DTYPE_E4M3: {
        auto *out = static_cast<uint8_t *>(dst);
        body([out](size_t i, float v) { out[i] = static_cast<uint8_t>(codec::encode<codec::E4M3, true>(v)); });
        return;
    }
    case FP8AMP_DTYPE_E5M2: {
        auto *out = static_cast<uint8_t *>(dst);
        body([out](size_t i, float v) { out[i] = static_cast<uint8_t>(codec::encode<codec::E5M2, true>(v)); });
        return;
    }
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu kernels: unknown destination dtype");
}

// One element at a time, where a loop cannot be split by dtype (the fused norms and activations read
// several operands per element): element i of a wide (F32/F16/BF16) array exactly as float32 (an F32
// NaN made canonical), and float32 v written as element i of dst rounded as with_store does (any of
// the five dtypes; FP8 unscaled and saturating).
inline float load_element(const void *src, fp8amp_dtype dtype, int64_t i) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return codec::canonical_f32(static_cast<const float *>(src)[i]);
    case FP8AMP_DTYPE_F16: return codec::decode<codec::F16>(static_cast<const uint16_t *>(src)[i]);
    case FP8AMP_DTYPE_BF16: return codec::decode<codec::BF16>(static_cast<const uint16_t *>(src)[i]);
    default: break;
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu kernels: a wide operand is not F32/F16/BF16");
}

inline void store_element(void *dst, fp8amp_dtype dtype, int64_t i, float v) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(dst)[i] = codec::canonical_f32(v); return;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(dst)[i] = static_cast<uint16_t>(codec::encode<codec::F16, false>(v)); return;
    case FP8AMP_DTYPE_BF16: static_cast<uint16_t *>(dst)[i] = static_cast<uint16_t>(codec::encode<codec::BF16, false>(v)); return;
    case FP8AMP_DTYPE_E4M3: static_cast<uint8_t *>(dst)[i] = static_cast<uint8_t>(codec::encode<codec::E4M3, true>(v)); return;
    case FP8AMP_DTYPE_E5M2: static_cast<uint8_t *>(dst)[i] = static_cast<uint8_t>(codec::encode<codec::E5M2, true>(v)); return;
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu kernels: unknown destination dtype");
}

}  // namespace fp8amp::kernels::cpu
