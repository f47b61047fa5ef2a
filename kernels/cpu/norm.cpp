// CPU reference of the fused normalizations (kernels/norm.hpp): LayerNorm / RMSNorm forward into a
// wide or an FP8 y (amax, statistics and current scaling as cpu::quantize does them), and the
// backward with the fixed-order column sums. Compiled with -ffp-contract=off: every operation is the
// one rounding of kernels/norm.hpp, as on the GPU.
#include <algorithm>
#include <cmath>

#include "convert.hpp"
#include "kernels.hpp"
#include "norm.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels {

namespace cpu {
namespace {

using namespace norm;

bool is_fp8(fp8amp_dtype d) { return d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2; }

// mean (LayerNorm; 0 for RMSNorm) and rstd of row r, in the order of norm.hpp.
void row_stats(const NormForwardArgs &a, int64_t r, float &mean, float &rstd) {
    const int64_t base = r * a.d;
    const int g = groups(a.d), n = lanes(a.d);
    float p[kMaxLanes];
    mean = 0.0f;
    if (!a.rms) {
        std::fill(p, p + n, 0.0f);
        for (int64_t i = 0; i < a.d; ++i) p[lane_of(i, n)] = fadd(p[lane_of(i, n)], load_element(a.x, a.x_dtype, base + i));
        mean = mean_of(tree_sum(p, g), a.d);
    }
    std::fill(p, p + n, 0.0f);
    for (int64_t i = 0; i < a.d; ++i) {
        const float v = load_element(a.x, a.x_dtype, base + i);
        float &acc = p[lane_of(i, n)];
        acc = a.rms ? add_square(acc, v) : add_centered_square(acc, v, mean);
    }
    rstd = rstd_of(tree_sum(p, g), a.d, a.eps);
}

float y_at(const NormForwardArgs &a, int64_t r, int64_t i, float mean, float rstd) {
    const float x = load_element(a.x, a.x_dtype, r * a.d + i);
    const float w = weight(load_element(a.gamma, a.gamma_dtype, i), a.zero_centered);
    const float b = a.beta ? load_element(a.beta, a.beta_dtype, i) : 0.0f;
    return y_value(xhat(x, mean, rstd, a.rms), w, b, a.beta != nullptr);
}

}  // namespace

void norm_forward(const NormForwardArgs &a) {
    const bool fp8 = is_fp8(a.y_dtype);
    ScalingState *m = fp8 ? a.target.meta : nullptr;
    float scale = 1.0f;
    if (m && m->current) {
        // Current scaling: the scale comes from this y's own amax, so y is computed twice.
        uint32_t bits = 0;
        for (int64_t r = 0; r < a.rows; ++r) {
            float mean, rstd;
            row_stats(a, r, mean, rstd);
            for (int64_t i = 0; i < a.d; ++i) bits = std::max(bits, amax_bits_of(y_at(a, r, i, mean, rstd)));
        }
        m->amax_bits = bits;
        scale = compute_scale(*m, codec::bits_f32(bits), m->scale);
        m->scale = scale;
        m->scale_inv = 1.0f / scale;
    } else if (m) {
        scale = m->scale;
    }
    const float fp8_max = m ? m->fp8_max : 0.0f;
    const uint32_t mag_mask = a.y_dtype == FP8AMP_DTYPE_E5M2 ? codec::E5M2::kMagMask : codec::E4M3::kMagMask;
    uint32_t amax = 0;
    unsigned long long saturated = 0, underflowed = 0;
    for (int64_t r = 0; r < a.rows; ++r) {
        float mean, rstd;
        row_stats(a, r, mean, rstd);
        if (a.mean) a.mean[r] = canonical(mean);
        if (a.rstd) a.rstd[r] = canonical(rstd);
        for (int64_t i = 0; i < a.d; ++i) {
            const float y = y_at(a, r, i, mean, rstd);
            const int64_t e = r * a.d + i;
            if (!fp8) {
                store_element(a.y, a.y_dtype, e, y);
                continue;
            }
            amax = std::max(amax, amax_bits_of(y));
            const float s = scaled(y, scale);
            store_element(a.y, a.y_dtype, e, s);
            if (m->stats_enabled) {
                const uint32_t code = static_cast<const uint8_t *>(a.y)[e];
                if (!std::isnan(s) && std::fabs(s) > fp8_max) ++saturated;  // inf included, NaN not
                if (y != 0.0f && !std::isnan(y) && (code & mag_mask) == 0) ++underflowed;
            }
        }
    }
    if (!m) return;
    if (!m->current) m->amax_bits = std::max(m->amax_bits, amax);
    if (m->stats_enabled) {
        m->saturated += saturated;
        m->underflowed += underflowed;
        m->quantized += static_cast<unsigned long long>(a.rows * a.d);
    }
    *a.target.scale_inv = m->scale_inv;
    if (a.y_t) {
        transpose_bytes(a.y, a.y_t, static_cast<size_t>(a.rows), static_cast<size_t>(a.d));
        if (a.target.scale_inv_t) *a.target.scale_inv_t = m->scale_inv;
    }
}

size_t norm_backward_scratch_floats(int64_t, int64_t d) { return 6 * static_cast<size_t>(d); }

void norm_backward(const NormBackwardArgs &a, float *scratch) {
    // The partial column sums of the current sub-chunk (sg, sb), chunk (cg, cb) and the pair's even
    // chunk (pg, pb): norm.hpp's order.
    float *sg = scratch, *sb = scratch + a.d, *cg = scratch + 2 * a.d, *cb = scratch + 3 * a.d;
    float *pg = scratch + 4 * a.d, *pb = scratch + 5 * a.d;
    std::fill(a.dgamma, a.dgamma + a.d, 0.0f);
    if (a.dbeta) std::fill(a.dbeta, a.dbeta + a.d, 0.0f);
    const int64_t n_chunks = chunks(a.rows), n_slots = slots(a.d);
    const int g = groups(a.d), n = lanes(a.d);
    const float fd = static_cast<float>(a.d);
    float p1[kMaxLanes], p2[kMaxLanes];
    for (int64_t k = 0; k < n_chunks; ++k) {
        std::fill(cg, cg + 2 * a.d, 0.0f);  // cg and cb
        const int64_t c0 = chunk_begin(k, a.rows, n_chunks), c1 = chunk_begin(k + 1, a.rows, n_chunks);
        for (int64_t s = 0; s < n_slots; ++s) {
            std::fill(sg, sg + 2 * a.d, 0.0f);  // sg and sb
            const int64_t r0 = c0 + chunk_begin(s, c1 - c0, n_slots), r1 = c0 + chunk_begin(s + 1, c1 - c0, n_slots);
            for (int64_t r = r0; r < r1; ++r) {
                const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
                const int64_t base = r * a.d;
                std::fill(p1, p1 + n, 0.0f);
                std::fill(p2, p2 + n, 0.0f);
                for (int64_t i = 0; i < a.d; ++i) {
                    const float gv = fmul(load_element(a.dy, a.dy_dtype, base + i),
                                          weight(load_element(a.gamma, a.gamma_dtype, i), a.zero_centered));
                    const float xh = xhat(load_element(a.x, a.x_dtype, base + i), mean, rstd, a.rms);
                    if (!a.rms) p1[lane_of(i, n)] = fadd(p1[lane_of(i, n)], gv);
                    p2[lane_of(i, n)] = fadd(p2[lane_of(i, n)], fmul(gv, xh));
                }
                const float c1v = a.rms ? 0.0f : fdiv(tree_sum(p1, g), fd);
                const float c2v = fdiv(tree_sum(p2, g), fd);
                for (int64_t i = 0; i < a.d; ++i) {
                    const float dy = load_element(a.dy, a.dy_dtype, base + i);
                    const float gv = fmul(dy, weight(load_element(a.gamma, a.gamma_dtype, i), a.zero_centered));
                    const float xh = xhat(load_element(a.x, a.x_dtype, base + i), mean, rstd, a.rms);
                    store_element(a.dx, a.dx_dtype, base + i, dx_value(gv, xh, c1v, c2v, rstd, a.rms));
                    sg[i] = fadd(sg[i], fmul(dy, xh));
                    sb[i] = fadd(sb[i], dy);
                }
            }
            for (int64_t i = 0; i < a.d; ++i) {
                cg[i] = fadd(cg[i], sg[i]);
                cb[i] = fadd(cb[i], sb[i]);
            }
        }
        if (k % 2 == 0 && k + 1 < n_chunks) {  // the pair's even chunk: kept until its odd one is done
            std::copy(cg, cg + 2 * a.d, pg);   // cg and cb into pg and pb
            continue;
        }
        for (int64_t i = 0; i < a.d; ++i) {  // the pair's partial (the last chunk alone), then the sum
            a.dgamma[i] = fadd(a.dgamma[i], k % 2 ? fadd(pg[i], cg[i]) : cg[i]);
            if (a.dbeta) a.dbeta[i] = fadd(a.dbeta[i], k % 2 ? fadd(pb[i], cb[i]) : cb[i]);
        }
    }
    // Canonical NaN, as the GPU's finishing pass stores them.
    for (int64_t i = 0; i < a.d; ++i) {
        a.dgamma[i] = canonical(a.dgamma[i]);
        if (a.dbeta) a.dbeta[i] = canonical(a.dbeta[i]);
    }
}

}  // namespace cpu
}  // namespace fp8amp::kernels
