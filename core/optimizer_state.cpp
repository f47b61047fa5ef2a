// One parameter's optimizer state as tensors (fp8amp_optimizer_param_state, _set_param_state,
// _set_step; docs/api.md section 12.10): the per-parameter access torch-style checkpoints need
// (torch.save, torch.distributed.checkpoint, safetensors) beside the opaque blob of
// fp8amp_optimizer_save. Reads are views of the state's own memory; writes take either the stored
// form (bit-exact) or values, which are quantized with the block scaling the step uses
// (kernels/cpu/adam.cpp), and are validated completely before anything is written.
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec.hpp"
#include "optimizer.hpp"
#include "scaling.hpp"  // kernels/scaling.hpp: amax_bits_of, ScalingState
#include "scaling_meta.hpp"

namespace fp8amp::core {

namespace adam = kernels::adam;

namespace {

std::string num(double x) { return std::to_string(x); }

// A block scale_inv as the steps write it: 1 / 2^k with k in [-126, 126] (adam::pow2_exponent).
bool pow2_normal(float x) {
    const uint32_t b = codec::f32_bits(x);
    return (b & 0x807FFFFFu) == 0 && (b >> 23) >= 1 && (b >> 23) <= 253;
}

// One part of the state (m, v or the master) as it will be written: its bytes and block scales.
struct Image {
    std::vector<unsigned char> data;
    std::vector<float> scales;
};

}  // namespace

Optimizer::StateTensors Optimizer::param_state(int32_t index) const {
    if (comm_)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "the optimizer is sharded: each rank holds a slice of the state with the "
                                         "unsharded block scales; save it with fp8amp_optimizer_save");
    if (index < 0 || index >= num_params())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "index " + std::to_string(index) + " is not in 0.." + std::to_string(num_params() - 1) +
                                                " (the optimizer holds " + std::to_string(num_params()) + " parameters)");
    const Entry &e = entries_[static_cast<size_t>(index)];
    const Tensor &p = *e.param;
    const bool m8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3, v16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    const int64_t blocks[1] = {e.nscales};
    StateTensors s;
    s.m = Tensor::view(ctx_, e.m, m8 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F32, p.ndim(), p.shape(), true);
    s.v = Tensor::view(ctx_, e.v, v16 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_F32, p.ndim(), p.shape(), true);
    if (m8) s.m_scale = Tensor::view(ctx_, e.m_scale, FP8AMP_DTYPE_F32, 1, blocks, true);
    if (v16) s.v_scale = Tensor::view(ctx_, e.v_scale, FP8AMP_DTYPE_F32, 1, blocks, true);
    if (e.master) {
        s.master = Tensor::view(ctx_, e.master, FP8AMP_DTYPE_F16, p.ndim(), p.shape(), true);
        s.master_scale = Tensor::view(ctx_, e.master_scale, FP8AMP_DTYPE_F32, 1, blocks, true);
    }
    if (e.param_meta) {
        const int64_t len = e.param_meta->recipe().amax_history_len;
        std::vector<float> history(static_cast<size_t>(len));
        e.param_meta->get_history(static_cast<int32_t>(len), history.data());
        kernels::ScalingState st{};
        to_host(&st, e.param_meta->state(), sizeof st);
        s.meta_history = Tensor::create(ctx_, FP8AMP_DTYPE_F32, 1, &len);
        s.meta_history->copy_from_host(history.data(), history.size() * 4);
        s.meta_scale = st.scale;
        s.meta_amax = codec::bits_f32(st.amax_bits);
        s.meta_updates = st.updates;
    }
    return s;
}

void Optimizer::set_step(int64_t step) {
    if (step < 0 || step > adam::kMaxStep)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "step " + std::to_string(step) + " is not in 0.." + std::to_string(adam::kMaxStep) +
                                                " (a count the steps' int64 arithmetic cannot overflow)");
    adam::Status st = status();
    st.step = step;
    to_device(status_->data(), &st, sizeof st);
    ctx_->synchronize();
}

void Optimizer::set_param_state(int32_t index, const StateInput &in) {
    if (comm_)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "the optimizer is sharded: each rank holds a slice of the state with the "
                                         "unsharded block scales; load it with fp8amp_optimizer_load");
    if (index < 0 || index >= num_params())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "index " + std::to_string(index) + " is not in 0.." + std::to_string(num_params() - 1) +
                                                " (the optimizer holds " + std::to_string(num_params()) + " parameters)");
    const Entry &e = entries_[static_cast<size_t>(index)];
    const Tensor &p = *e.param;
    const int64_t n = p.numel();
    const int64_t bs = desc_.state_block_size > 0 ? desc_.state_block_size : std::max<int64_t>(n, 1);
    const bool m8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3, v16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    const std::string who = " (parameter #" + std::to_string(index) + ", " + p.describe() + ")";

    // One part: t (required here) with its optional scale tensor ts, into `out` in the stored form.
    // stored: the stored dtype; scaled: whether it has block scales (with fmax the format's largest).
    auto prepare = [&](const Tensor *t, const Tensor *ts, fp8amp_dtype stored, bool scaled, float fmax, bool nonneg,
                       const std::string &name, Image &out) {
        const std::string sname = name + "_scale_inv";
        check_on_device(*ctx_, *t, name.c_str());
        if (!t->same_shape(p))
            fail(FP8AMP_ERROR_SHAPE_MISMATCH, name + " is " + t->describe() + ", not of the parameter's shape" + who);
        std::vector<unsigned char> raw(t->nbytes());
        to_host(raw.data(), t->data(), raw.size());
        const size_t es = fp8amp_dtype_size(stored);
        out.data.assign(static_cast<size_t>(n) * es, 0);
        auto check_value = [&](float x, int64_t j, const char *how) {
            if (!(x <= FLT_MAX && x >= (nonneg ? 0.0f : -FLT_MAX)))
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, name + " element " + std::to_string(j) + " is " + num(x) + how +
                                                        (nonneg ? ", not a finite value >= 0" : ", not finite") + who);
        };
        if (ts) {  // the exact, stored form
            if (!scaled)
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, sname + " is given, but " + name + " is stored as f32 without block scales"
                                                    " (O1): pass NULL" + who);
            if (t->dtype() != stored)
                fail(FP8AMP_ERROR_DTYPE_MISMATCH, name + " is " + t->describe() + " with block scales: the stored form is " +
                                                      fp8amp_dtype_name(stored) + " (pass NULL as " + sname +
                                                      " to give values to quantize)" + who);
            check_on_device(*ctx_, *ts, sname.c_str());
            if (ts->dtype() != FP8AMP_DTYPE_F32)
                fail(FP8AMP_ERROR_DTYPE_MISMATCH, sname + " is " + ts->describe() + ", not f32" + who);
            if (ts->ndim() != 1 || ts->shape()[0] != e.nscales)
                fail(FP8AMP_ERROR_SHAPE_MISMATCH, sname + " is " + ts->describe() + ", not f32[" + std::to_string(e.nscales) +
                                                      "] (one scale per block of " + std::to_string(bs) + " elements)" + who);
            out.scales.resize(static_cast<size_t>(e.nscales));
            to_host(out.scales.data(), ts->data(), out.scales.size() * 4);
            for (size_t b = 0; b < out.scales.size(); ++b)
                if (!pow2_normal(out.scales[b]))
                    fail(FP8AMP_ERROR_INVALID_ARGUMENT, sname + " element " + std::to_string(b) + " (" + num(out.scales[b]) +
                                                            ") is not a power of two in [2^-126, 2^126]" + who);
            for (int64_t j = 0; j < n; ++j) {
                const float x = adam::fmul(adam::load_value(raw.data(), stored, j), out.scales[static_cast<size_t>(j / bs)]);
                check_value(x, j, " (code times its block's scale_inv)");
            }
            out.data = std::move(raw);
            return;
        }
        // Values: F32, BF16 or F16, quantized as the step writes the state.
        if (t->dtype() != FP8AMP_DTYPE_F32 && t->dtype() != FP8AMP_DTYPE_BF16 && t->dtype() != FP8AMP_DTYPE_F16)
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, name + " is " + t->describe() + " without " + sname +
                                                  ": values to quantize are f32, bf16 or f16 (an fp8 tensor needs its scales)" + who);
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
            x[static_cast<size_t>(j)] = adam::load_value(raw.data(), t->dtype(), j);
            check_value(x[static_cast<size_t>(j)], j, "");
        }
        if (!scaled) {  // O1: F32, no scales
            std::memcpy(out.data.data(), x.data(), x.size() * 4);
            return;
        }
        out.scales.resize(static_cast<size_t>(e.nscales));
        for (int64_t b = 0; b < e.nscales; ++b) {
            const int64_t lo = b * bs, hi = std::min<int64_t>(n, lo + bs);
            uint32_t amax = 0;
            for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, kernels::amax_bits_of(x[static_cast<size_t>(i)]));
            const float s = adam::pow2(adam::pow2_exponent(codec::bits_f32(amax), fmax));
            out.scales[static_cast<size_t>(b)] = adam::fdiv(1.0f, s);
            for (int64_t i = lo; i < hi; ++i) {
                const float y = adam::fmul(x[static_cast<size_t>(i)], s);
                if (stored == FP8AMP_DTYPE_E4M3)
                    out.data[static_cast<size_t>(i)] = static_cast<uint8_t>(codec::encode<codec::E4M3, true>(y));
                else {
                    const uint16_t c = static_cast<uint16_t>(codec::encode<codec::F16, true>(y));
                    std::memcpy(out.data.data() + 2 * static_cast<size_t>(i), &c, 2);
                }
            }
        }
    };

    if (!in.m) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->exp_avg is NULL" + who);
    if (!in.v) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->exp_avg_sq is NULL" + who);
    if (e.master && !in.master)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->master is NULL, but the parameter has an f16 master copy" + who);
    if (!e.master && (in.master || in.master_scale))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string("state->") + (in.master ? "master" : "master_scale_inv") +
                                                " is given, but the parameter has no master copy" + who);
    Image m, v, w;
    prepare(in.m, in.m_scale, m8 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F32, m8, adam::kE4M3Max, false, "state->exp_avg", m);
    prepare(in.v, in.v_scale, v16 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_F32, v16, adam::kF16Max, true, "state->exp_avg_sq", v);
    if (e.master) prepare(in.master, in.master_scale, FP8AMP_DTYPE_F16, true, adam::kF16Max, false, "state->master", w);
    // The parameter's meta: its whole state, as the step and the update read it, built here.
    std::vector<unsigned char> meta;
    if (in.meta_history) {
        const Tensor &h = *in.meta_history;
        if (!e.param_meta)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->param_meta_history is given, but the parameter is not bound to a "
                                                "scaling meta" + who);
        const uint32_t len = static_cast<uint32_t>(e.param_meta->recipe().amax_history_len);
        check_on_device(*ctx_, h, "state->param_meta_history");
        if (h.dtype() != FP8AMP_DTYPE_F32)
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "state->param_meta_history is " + h.describe() + ", not f32" + who);
        if (h.ndim() != 1 || h.shape()[0] != len)
            fail(FP8AMP_ERROR_SHAPE_MISMATCH, "state->param_meta_history is " + h.describe() + ", not f32[" +
                                                  std::to_string(len) + "] (the meta's amax_history_len)" + who);
        std::vector<float> history(len);
        to_host(history.data(), h.data(), 4u * len);
        for (uint32_t k = 0; k < len; ++k)
            if (codec::f32_bits(history[k]) > 0x7F800000u)
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->param_meta_history element " + std::to_string(k) + " (" +
                                                        num(history[k]) + ") is negative or NaN" + who);
        if (!(in.meta_scale >= FLT_MIN && in.meta_scale <= FLT_MAX))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->param_meta_scale " + num(in.meta_scale) +
                                                    " is not a normal float > 0" + who);
        if (codec::f32_bits(in.meta_amax) > 0x7F800000u)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->param_meta_amax " + num(in.meta_amax) + " is negative or NaN" + who);
        if (in.meta_updates < 0 || in.meta_updates > int64_t(UINT32_MAX))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->param_meta_updates " + std::to_string(in.meta_updates) +
                                                    " is not in 0..2^32-1" + who);
        meta.resize(kernels::ScalingState::bytes(len));
        to_host(meta.data(), e.param_meta->state(), meta.size());  // the recipe's fields and the counters stay
        kernels::ScalingState st;
        std::memcpy(&st, meta.data(), sizeof st);
        st.scale = in.meta_scale;
        st.scale_inv = 1.0f / in.meta_scale;
        st.amax_bits = codec::f32_bits(in.meta_amax);
        st.updates = static_cast<uint32_t>(in.meta_updates);
        // The history goes around the meta's own head, newest first (ScalingState::ring_slot, as
        // ScalingMeta::get_history reads it), so that writing back what fp8amp_optimizer_param_state
        // read leaves the meta's bytes, and a checkpoint, as they were.
        const uint32_t head = st.head < len ? st.head : 0;
        st.head = head;
        std::memcpy(meta.data(), &st, sizeof st);
        for (uint32_t k = 0; k < len; ++k)
            std::memcpy(meta.data() + sizeof st + 4u * kernels::ScalingState::ring_slot(head, len, k), &history[k], 4);
    }

    // Everything passed: write.
    const size_t scale_bytes = static_cast<size_t>(e.nscales) * 4;
    to_device(e.m->data(), m.data.data(), m.data.size());
    if (m8) to_device(e.m_scale->data(), m.scales.data(), scale_bytes);
    to_device(e.v->data(), v.data.data(), v.data.size());
    if (v16) to_device(e.v_scale->data(), v.scales.data(), scale_bytes);
    if (e.master) {
        to_device(e.master->data(), w.data.data(), w.data.size());
        to_device(e.master_scale->data(), w.scales.data(), scale_bytes);
    }
    if (!meta.empty()) to_device(e.param_meta->state(), meta.data(), meta.size());
    ctx_->synchronize();
}

}  // namespace fp8amp::core
