// CPU reference of the fused Adam/AdamW step (kernels/adam.hpp has the shared arithmetic). The same
// three phases as the CUDA kernel: (1) check every gradient and sum its squares, (2) unless a
// gradient was not finite, update each state block -- compute its new values, take the block's new
// amax, choose the block's power-of-two scales, store -- and record the parameters' amax, (3) fold
// the metas of scaled parameters and publish the step's status. Compiled with -ffp-contract=off.
// Phase 2's per-block values live in the caller's scratch (adam_scratch_floats): no host allocation
// while the step runs, since one failing there would leave part of the update written (issue 22).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "adam.hpp"
#include "codec.hpp"
#include "kernels.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::cpu {

using namespace adam;

namespace {

bool finite(float x) { return (codec::f32_bits(x) & 0x7F800000u) != 0x7F800000u; }

// The factor that turns a stored gradient into the unscaled gradient: the step's grad_scale_inv,
// times the gradient tensor's own scale_inv (FP8), times 1/loss scale -- in this order on both backends.
float grad_factor(const StepConfig &c, const Param &p, float loss_scale_inv) {
    return fmul(fmul(c.grad_scale_inv, p.grad_scale_inv ? *p.grad_scale_inv : 1.0f), loss_scale_inv);
}

// Publishes the slot, folds the history and computes the next scale (fp8amp_scaling_update's rule).
void fold_meta(ScalingState &s, float *slot) {
    if (slot) *slot = s.scale_inv;  // the parameter was just written with this meta's scale
    fold_history(s);
    if (scale_due(s)) {
        float h = 0.0f;
        if (s.most_recent) {
            h = s.history()[s.head];
        } else {
            for (uint32_t k = 0; k < s.history_len; ++k) h = std::fmax(h, s.history()[k]);
        }
        apply_scale(s, h);
    }
}

}  // namespace

size_t adam_scratch_floats(int32_t block_size, int64_t max_numel) {
    const int64_t block = block_size > 0 ? std::min<int64_t>(block_size, max_numel) : max_numel;
    return 3 * static_cast<size_t>(std::max<int64_t>(block, 0));
}

void adam_step(const StepConfig &c, float *scratch) {
    Status &status = *c.status;
    const int64_t step = status.step;
    const float loss_scale_inv = c.scaler ? fdiv(1.0f, c.scaler->scale) : 1.0f;

    // Phase 1: finiteness and the sum of squares of the unscaled gradients.
    double sumsq = 0.0;
    bool bad = false;
    for (int32_t k = 0; k < c.nparams; ++k) {
        const Param &p = c.params[k];
        const float f = grad_factor(c, p, loss_scale_inv);
        if (p.grad_meta && p.grad_meta->amax_bits >= 0x7F800000u) bad = true;  // saturated quantize
        for (int64_t i = 0; i < p.numel; ++i) {
            const float g = fmul(load_value(p.grad, p.grad_dtype, i), f);
            if (!finite(g)) bad = true;  // a NaN/inf code, or an overflow of the unscaling
            sumsq += static_cast<double>(g) * static_cast<double>(g);
        }
    }
    const float norm = static_cast<float>(std::sqrt(sumsq));
    status.grad_norm = bad ? codec::bits_f32(codec::kF32QuietNaN) : norm;
    status.found_inf = bad ? 1 : 0;
    if (bad) {
        if (c.scaler) adam::scaler_update(*c.scaler, c.scaler_config, true);
        return;
    }

    // Phase 2: the update, block by block.
    const float lr = c.lr_device ? *c.lr_device : c.lr;
    const StepScalars s = step_scalars(c, lr, step + 1);
    const bool clip = c.max_grad_norm > 0.0f;
    const float coef = clip ? clip_coefficient(c.max_grad_norm, norm) : 1.0f;
    // A block's new parameter, m and v values, kept until the block's scales are known.
    const size_t block_max = adam_scratch_floats(c.block_size, c.max_numel) / 3;
    float *const np = scratch, *const nm = scratch + block_max, *const nv = scratch + 2 * block_max;
    for (int32_t k = 0; k < c.nparams; ++k) {
        const Param &p = c.params[k];
        const float f = grad_factor(c, p, loss_scale_inv);
        const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
        const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
        const int64_t bs = c.block_size > 0 ? c.block_size : p.numel;
        const int64_t nblocks = (p.numel + bs - 1) / bs;
        // Per parameter: an optimizer may hold parameters with a master copy beside ones without.
        const bool master = p.master != nullptr;
        const uint64_t key = c.master_stochastic ? rounding_key_at(c.rounding_seed, step + 1, k, p.element_offset) : 0;
        // without a master the parameter is the value of record: its BF16/F16 codes take the rounding
        const bool param_stochastic = c.master_stochastic && !master;
        uint32_t param_amax = 0;
        for (int64_t b = 0; b < nblocks; ++b) {
            const int64_t begin = b * bs;
            const int64_t len = std::min<int64_t>(bs, p.numel - begin);
            const int64_t si = p.scale_begin + b;  // this block's scale slot
            const float m_inv = c.m_fp8 ? p.m_scale_inv[si] : 1.0f;
            const float v_inv = c.v_f16 ? p.v_scale_inv[si] : 1.0f;
            const float w_inv = master ? p.master_scale_inv[si] : 1.0f;
            uint32_t am = 0, av = 0, aw = 0;
            for (int64_t j = 0; j < len; ++j) {
                const int64_t i = begin + j;
                float g = fmul(load_value(p.grad, p.grad_dtype, i), f);
                if (clip) g = fmul(g, coef);
                float w;
                if (master)
                    w = fmul(codec::decode<codec::F16>(static_cast<const uint16_t *>(p.master)[i]), w_inv);
                else if (p.param_scale_inv)
                    w = fmul(load_value(p.param, p.param_dtype, i), param_inv);
                else
                    w = load_value(p.param, p.param_dtype, i);
                float m = c.m_fp8 ? fmul(codec::decode<codec::E4M3>(static_cast<const uint8_t *>(p.m)[i]), m_inv)
                                  : static_cast<const float *>(p.m)[i];
                float v = c.v_f16 ? fmul(codec::decode<codec::F16>(static_cast<const uint16_t *>(p.v)[i]), v_inv)
                                  : static_cast<const float *>(p.v)[i];
                adam_element(c, s, g, w, m, v);
                np[j] = w;
                nm[j] = m;
                nv[j] = v;
                am = std::max(am, amax_bits_of(m));
                av = std::max(av, amax_bits_of(v));
                aw = std::max(aw, amax_bits_of(w));
            }
            param_amax = std::max(param_amax, aw);
            const float m_scale = pow2(pow2_exponent(codec::bits_f32(am), kE4M3Max));
            const float v_scale = pow2(pow2_exponent(codec::bits_f32(av), kF16Max));
            const float w_scale = pow2(pow2_exponent(codec::bits_f32(aw), kF16Max));
            if (c.m_fp8) p.m_scale_inv[si] = fdiv(1.0f, m_scale);
            if (c.v_f16) p.v_scale_inv[si] = fdiv(1.0f, v_scale);
            if (master) p.master_scale_inv[si] = fdiv(1.0f, w_scale);
            for (int64_t j = 0; j < len; ++j) {
                const int64_t i = begin + j;
                if (c.m_fp8)
                    static_cast<uint8_t *>(p.m)[i] = static_cast<uint8_t>(codec::encode<codec::E4M3, true>(fmul(nm[j], m_scale)));
                else
                    static_cast<float *>(p.m)[i] = nm[j];
                if (c.v_f16)
                    static_cast<uint16_t *>(p.v)[i] = static_cast<uint16_t>(codec::encode<codec::F16, true>(fmul(nv[j], v_scale)));
                else
                    static_cast<float *>(p.v)[i] = nv[j];
                if (master)
                    static_cast<uint16_t *>(p.master)[i] =
                        c.master_stochastic ? master_code_stochastic(fmul(np[j], w_scale), rounding_bits(key, i))
                                            : static_cast<uint16_t>(codec::encode<codec::F16, true>(fmul(np[j], w_scale)));
                const float w = np[j];
                switch (p.param_dtype) {
                case FP8AMP_DTYPE_F32: static_cast<float *>(p.param)[i] = w; break;
                case FP8AMP_DTYPE_BF16:
                    static_cast<uint16_t *>(p.param)[i] =
                        param_stochastic ? bf16_code_stochastic(w, rounding_bits(key, i))
                                         : static_cast<uint16_t>(codec::encode<codec::BF16, false>(w));
                    break;
                case FP8AMP_DTYPE_F16: {
                    const float y = p.param_meta ? scaled(w, param_scale) : w;
                    static_cast<uint16_t *>(p.param)[i] =
                        param_stochastic ? f16_param_code_stochastic(y, p.param_meta != nullptr, rounding_bits(key, i))
                        : p.param_meta   ? static_cast<uint16_t>(codec::encode<codec::F16, true>(y))
                                         : static_cast<uint16_t>(codec::encode<codec::F16, false>(y));
                    break;
                }
                default:  // E4M3, bound to its meta
                    static_cast<uint8_t *>(p.param)[i] =
                        static_cast<uint8_t>(codec::encode<codec::E4M3, true>(scaled(w, param_scale)));
                    break;
                }
            }
        }
        if (p.param_meta) p.param_meta->amax_bits = std::max(p.param_meta->amax_bits, param_amax);
    }

    // Phase 3: the metas of scaled parameters, then the status and the scaler.
    for (int32_t k = 0; k < c.nparams; ++k)
        if (c.params[k].param_meta) fold_meta(*c.params[k].param_meta, c.params[k].param_scale_inv);
    status.step = step + 1;
    if (c.scaler) adam::scaler_update(*c.scaler, c.scaler_config, false);
}

void scaler_update(ScalerState *scaler, const ScalerConfig &config, const Status *status) {
    adam::scaler_update(*scaler, config, status->found_inf != 0);
}

}  // namespace fp8amp::kernels::cpu
