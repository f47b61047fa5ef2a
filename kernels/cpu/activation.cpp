// CPU reference of the fused activations (kernels/activation.hpp): each output element from the
// shared inline arithmetic, into a wide dtype or quantized like cpu::quantize (amax, statistics,
// current scaling's two passes, scale_inv slots), then the byte transpose. Compiled with
// -ffp-contract=off, as the arithmetic is the GPU's operation for operation.
#include <algorithm>
#include <cmath>

#include "activation.hpp"
#include "convert.hpp"
#include "error.hpp"
#include "kernels.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::cpu {
namespace {

// Writes out[0 .. rows * out_cols) = value(r, j) into a wide or an FP8 out.
template <class Value>
void write_out(const ActivationArgs &a, int64_t out_cols, Value &&value) {
    const bool fp8 = a.out_dtype == FP8AMP_DTYPE_E4M3 || a.out_dtype == FP8AMP_DTYPE_E5M2;
    const int64_t n = a.rows * out_cols;
    if (!fp8) {
        for (int64_t r = 0; r < a.rows; ++r)
            for (int64_t j = 0; j < out_cols; ++j) store_element(a.out, a.out_dtype, r * out_cols + j, value(r, j));
        return;
    }
    ScalingState &m = *a.target.meta;
    float scale = m.scale;
    if (m.current) {
        uint32_t bits = 0;
        for (int64_t r = 0; r < a.rows; ++r)
            for (int64_t j = 0; j < out_cols; ++j) bits = std::max(bits, amax_bits_of(value(r, j)));
        m.amax_bits = bits;
        scale = compute_scale(m, codec::bits_f32(bits), m.scale);
        m.scale = scale;
        m.scale_inv = 1.0f / scale;
    }
    const bool e5 = a.out_dtype == FP8AMP_DTYPE_E5M2;
    auto *q = static_cast<uint8_t *>(a.out);
    uint32_t amax = 0;
    unsigned long long saturated = 0, underflowed = 0;
    for (int64_t r = 0; r < a.rows; ++r)
        for (int64_t j = 0; j < out_cols; ++j) {
            const float y = value(r, j);
            amax = std::max(amax, amax_bits_of(y));
            const float s = scaled(y, scale);
            const uint8_t code = static_cast<uint8_t>(e5 ? codec::encode<codec::E5M2, true>(s) : codec::encode<codec::E4M3, true>(s));
            q[r * out_cols + j] = code;
            if (m.stats_enabled) {
                if (!std::isnan(s) && std::fabs(s) > m.fp8_max) ++saturated;  // inf included, NaN not
                if (y != 0.0f && !std::isnan(y) && (code & 0x7Fu) == 0) ++underflowed;
            }
        }
    if (!m.current) m.amax_bits = std::max(m.amax_bits, amax);
    if (m.stats_enabled) {
        m.saturated += saturated;
        m.underflowed += underflowed;
        m.quantized += static_cast<unsigned long long>(n);
    }
    *a.target.scale_inv = m.scale_inv;
    if (a.out_t) {
        transpose_bytes(a.out, a.out_t, static_cast<size_t>(a.rows), static_cast<size_t>(out_cols));
        if (a.target.scale_inv_t) *a.target.scale_inv_t = m.scale_inv;
    }
}

}  // namespace

void activation_forward(const ActivationArgs &a) {
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    write_out(a, a.cols, [&](int64_t r, int64_t c) {
        const float x = load_element(a.x, a.x_dtype, r * in_cols + c);
        const float b = glu ? load_element(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
        return act::forward_value(a.kind, x, b);
    });
}

void activation_backward(const ActivationArgs &a) {
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    write_out(a, in_cols, [&](int64_t r, int64_t j) {
        const bool second = glu && j >= a.cols;
        const int64_t c = second ? j - a.cols : j;
        const float dy = load_element(a.dy, a.dy_dtype, r * a.cols + c);
        const float x = load_element(a.x, a.x_dtype, r * in_cols + c);
        const float b = glu ? load_element(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
        return act::backward_value(a.kind, dy, x, b, second);
    });
}

void activation_table(int32_t kind, float *out) {
    if (kind != kGeluTanh && kind != kSilu) fail(FP8AMP_ERROR_INTERNAL, "activation_table: GELU or SiLU only");
    for (uint32_t i = 0; i < act::table::kEntries; ++i) {
        const float x = codec::bits_f32(uint32_t(act::table::input_bits(i)) << 16);  // BF16 -> float: exact
        out[i] = act::forward_raw(kind, x, 0.0f);  // finite for every entry: no NaN to make canonical
    }
}

}  // namespace fp8amp::kernels::cpu
