// CPU reference for the scaled casts and the scaling update: amax, quantize (with amax recording,
// current scaling and statistics), quantize + transpose, dequantize, and the delayed-scaling update.
// The scaled destinations are E4M3, E5M2 and F16 (scaled F16 saturates like FP8: satfinite).
// The CUDA kernels (kernels/cuda/quantize.cu) follow the same steps and give the same bits:
//   - every product is one float32 multiply, x * scale, rounded once into the destination by the codec;
//   - the multiply is scaling.hpp's scaled(): a NaN element keeps its sign on both backends;
//   - amax is max over elements of amax_bits_of(decode(x)) (scaling.hpp): NaN counts as +inf.
#include <algorithm>
#include <cmath>

#include "convert.hpp"
#include "kernels.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::cpu {
namespace {

// dst[i] = encode<F, saturating>(src[i] * scale), counting saturated and underflowed elements when
// kCount. Code is the storage of F: uint8_t for E4M3/E5M2, uint16_t for F16 (a scaled F16 tensor
// saturates like FP8, so that a too-small scale clamps at 65504 instead of making an inf).
template <class F, class Code, bool kCount>
void quantize_elements(const void *src, fp8amp_dtype src_dtype, Code *dst, size_t n, float scale, float fp8_max,
                       unsigned long long *saturated, unsigned long long *underflowed) {
    unsigned long long sat = 0, under = 0;
    for_each_value(src, src_dtype, n, [&](size_t i, float x) {
        const float y = scaled(x, scale);
        const auto code = static_cast<Code>(codec::encode<F, true>(y));
        dst[i] = code;
        if (kCount) {
            if (!std::isnan(y) && std::fabs(y) > fp8_max) ++sat;  // inf included, NaN not
            if (x != 0.0f && !std::isnan(x) && (code & F::kMagMask) == 0) ++under;
        }
    });
    if (kCount) {
        *saturated += sat;
        *underflowed += under;
    }
}

template <class F, class Code>
void quantize_as(const void *src, fp8amp_dtype src_dtype, Code *dst, size_t n, float scale, ScalingState &m) {
    if (m.stats_enabled) {
        quantize_elements<F, Code, true>(src, src_dtype, dst, n, scale, m.fp8_max, &m.saturated, &m.underflowed);
        m.quantized += n;
    } else {
        quantize_elements<F, Code, false>(src, src_dtype, dst, n, scale, m.fp8_max, nullptr, nullptr);
    }
}

// dst_t[c * rows + r] = dst[r * cols + c], blocked so that both sides are read and written in
// cache-sized tiles.
template <class Code>
void transpose(const void *dst, void *dst_t, size_t rows, size_t cols) {
    const auto *q = static_cast<const Code *>(dst);
    auto *t = static_cast<Code *>(dst_t);
    constexpr size_t kTile = 64;
    for (size_t r0 = 0; r0 < rows; r0 += kTile)
        for (size_t c0 = 0; c0 < cols; c0 += kTile) {
            const size_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
            for (size_t r = r0; r < r1; ++r)
                for (size_t c = c0; c < c1; ++c) t[c * rows + r] = q[r * cols + c];
        }
}

}  // namespace

uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n) {
    uint32_t bits = 0;
    for_each_value(src, src_dtype, n, [&bits](size_t, float x) { bits = std::max(bits, amax_bits_of(x)); });
    return bits;
}

void quantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
              const QuantizeTarget &target) {
    ScalingState &m = *target.meta;
    const uint32_t bits = amax(src, src_dtype, n);
    float scale;
    if (m.current) {
        // Current scaling: the scale comes from this tensor's own amax, now.
        m.amax_bits = bits;
        scale = compute_scale(m, codec::bits_f32(bits), m.scale);
        m.scale = scale;
        m.scale_inv = 1.0f / scale;
    } else {
        scale = m.scale;
        m.amax_bits = std::max(m.amax_bits, bits);
    }
    switch (dst_dtype) {
    case FP8AMP_DTYPE_E4M3: quantize_as<codec::E4M3>(src, src_dtype, static_cast<uint8_t *>(dst), n, scale, m); break;
    case FP8AMP_DTYPE_E5M2: quantize_as<codec::E5M2>(src, src_dtype, static_cast<uint8_t *>(dst), n, scale, m); break;
    case FP8AMP_DTYPE_F16: quantize_as<codec::F16>(src, src_dtype, static_cast<uint16_t *>(dst), n, scale, m); break;
    default: fail(FP8AMP_ERROR_INTERNAL, "cpu::quantize: the destination is not a scaled dtype");
    }
    *target.scale_inv = m.scale_inv;
    if (target.scale_inv_t) *target.scale_inv_t = m.scale_inv;
}

namespace {

// The column sums fused into quantize_transpose (a Linear's bias gradient), in the order kernels.hpp
// fixes (kColSumBlockRows): the CUDA kernel's order, so that both give the same bits. partial holds
// one row per block, then one row of lane sums.
void column_sums_fixed_order(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols,
                             const QuantizeTarget &t) {
    const size_t blocks = column_sum_blocks(rows);
    float *const lane = t.col_partial + blocks * cols;
    for (size_t b = 0; b < blocks; ++b) {
        float *const block = t.col_partial + b * cols;
        std::fill(block, block + cols, 0.0f);
        for (size_t g = 0; g < kColSumLanes; ++g) {
            std::fill(lane, lane + cols, 0.0f);
            for (size_t r = b * kColSumBlockRows + g; r < std::min(rows, (b + 1) * kColSumBlockRows); r += kColSumLanes)
                for (size_t c = 0; c < cols; ++c)
                    lane[c] += load_element(src, src_dtype, static_cast<int64_t>(r * cols + c));
            for (size_t c = 0; c < cols; ++c) block[c] += lane[c];
        }
    }
    for (size_t c = 0; c < cols; ++c) {
        float total = 0.0f;
        for (size_t b = 0; b < blocks; ++b) total += t.col_partial[b * cols + c];
        t.col_sum[c] = t.col_accumulate ? t.col_sum[c] + total : total;
    }
}

}  // namespace

void quantize_transpose(const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t, fp8amp_dtype dst_dtype,
                        size_t rows, size_t cols, const QuantizeTarget &target) {
    if (target.col_sum && (dst_dtype != FP8AMP_DTYPE_E4M3 && dst_dtype != FP8AMP_DTYPE_E5M2))
        fail(FP8AMP_ERROR_INTERNAL, "cpu::quantize_transpose: fused column sums need an FP8 destination");
    if (target.col_sum) column_sums_fixed_order(src, src_dtype, rows, cols, target);
    quantize(src, src_dtype, dst, dst_dtype, rows * cols, target);
    if (dst_dtype == FP8AMP_DTYPE_F16)
        transpose<uint16_t>(dst, dst_t, rows, cols);
    else
        transpose<uint8_t>(dst, dst_t, rows, cols);
}

void dequantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                const float *scale_inv) {
    const float s = *scale_inv;
    with_store(dst, dst_dtype, [&](auto store) {
        for_each_value(src, src_dtype, n, [&](size_t i, float x) { store(i, scaled(x, s)); });
    });
}

void update_scaling(ScalingState *const *metas, size_t n) {
    for (size_t k = 0; k < n; ++k) {
        ScalingState &m = *metas[k];
        fold_history(m);
        if (!scale_due(m)) continue;
        const float *h = m.history();
        uint32_t a = 0;
        if (m.most_recent) {
            a = codec::f32_bits(h[m.head]);
        } else {
            // Entries are non-negative or +inf: their bits order like their values.
            for (uint32_t i = 0; i < m.history_len; ++i) a = std::max(a, codec::f32_bits(h[i]));
        }
        apply_scale(m, codec::bits_f32(a));
    }
}

}  // namespace fp8amp::kernels::cpu
