// CPU reference for fp8amp_cast: every element goes through float32 (which holds every value of the
// five dtypes exactly) and is rounded once into the destination by the shared codec.
#include <cstring>

#include "codec.hpp"
#include "error.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cpu {
namespace {

template <class Store>
void convert_all(fp8amp_dtype src_dtype, const void *src, size_t n, Store store) {
    // One switch outside the loop keeps the loop body free of dispatch.
    switch (src_dtype) {
    case FP8AMP_DTYPE_F32:
        for (size_t i = 0; i < n; ++i) store(i, codec::canonical_f32(static_cast<const float *>(src)[i]));
        return;
    case FP8AMP_DTYPE_F16:
        for (size_t i = 0; i < n; ++i) store(i, codec::decode<codec::F16>(static_cast<const uint16_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_BF16:
        for (size_t i = 0; i < n; ++i) store(i, codec::decode<codec::BF16>(static_cast<const uint16_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_E4M3:
        for (size_t i = 0; i < n; ++i) store(i, codec::decode<codec::E4M3>(static_cast<const uint8_t *>(src)[i]));
        return;
    case FP8AMP_DTYPE_E5M2:
        for (size_t i = 0; i < n; ++i) store(i, codec::decode<codec::E5M2>(static_cast<const uint8_t *>(src)[i]));
        return;
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu::cast: unknown source dtype");
}

}  // namespace

void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n) {
    if (src_dtype == dst_dtype) {
        std::memmove(dst, src, n * fp8amp_dtype_size(src_dtype));
        return;
    }
    switch (dst_dtype) {
    case FP8AMP_DTYPE_F32: {
        auto *out = static_cast<float *>(dst);
        convert_all(src_dtype, src, n, [out](size_t i, float v) { out[i] = v; });
        return;
    }
    case FP8AMP_DTYPE_F16: {
        auto *out = static_cast<uint16_t *>(dst);
        convert_all(src_dtype, src, n, [out](size_t i, float v) {
            out[i] = static_cast<uint16_t>(codec::encode<codec::F16, false>(v));
        });
        return;
    }
    case FP8AMP_DTYPE_BF16: {
        auto *out = static_cast<uint16_t *>(dst);
        convert_all(src_dtype, src, n, [out](size_t i, float v) {
            out[i] = static_cast<uint16_t>(codec::encode<codec::BF16, false>(v));
        });
        return;
    }
    case FP8AMP_DTYPE_E4M3: {
        auto *out = static_cast<uint8_t *>(dst);
        convert_all(src_dtype, src, n, [out](size_t i, float v) {
            out[i] = static_cast<uint8_t>(codec::encode<codec::E4M3, true>(v));
        });
        return;
    }
    case FP8AMP_DTYPE_E5M2: {
        auto *out = static_cast<uint8_t *>(dst);
        convert_all(src_dtype, src, n, [out](size_t i, float v) {
            out[i] = static_cast<uint8_t>(codec::encode<codec::E5M2, true>(v));
        });
        return;
    }
    }
    fail(FP8AMP_ERROR_INTERNAL, "cpu::cast: unknown destination dtype");
}

}  // namespace fp8amp::kernels::cpu
