// The boundary of the optimizer and the loss scaler (fp8amp.h "Adam / AdamW ..."): argument checks,
// handle lookups, and core calls; no engine logic.
#include <algorithm>
#include <cstring>

#include "communicator.hpp"
#include "context.hpp"
#include "fp8amp/fp8amp.h"
#include "grad_scaler.hpp"
#include "boundary.hpp"
#include "optimizer.hpp"
#include "struct_size.hpp"
#include "tensor.hpp"

// The sized-struct rules of struct_size.hpp for fp8amp_param_desc (new in 0.4.0: its first layout
// is this one), found by argument-dependent lookup as api_comm.cpp's for fp8amp_comm_reduce_desc.
inline constexpr size_t fields_end(const fp8amp_param_desc *) {
    return offsetof(fp8amp_param_desc, master_init) + sizeof(fp8amp_tensor);
}
// fp8amp_param_desc's first layout (struct_size and master_dtype; master_init came after): accepted,
// with master_init NULL.
inline constexpr size_t kParamDescFirstLayout = offsetof(fp8amp_param_desc, master_init);
inline constexpr size_t released_size(const fp8amp_param_desc *) { return kParamDescFirstLayout; }
inline constexpr size_t fields_end(const fp8amp_param_state *) {
    return offsetof(fp8amp_param_state, param_meta_updates) + sizeof(int64_t);
}
inline constexpr size_t released_size(const fp8amp_param_state *) { return sizeof(fp8amp_param_state); }

using fp8amp::fail;
using fp8amp::read_sized;
using fp8amp::capi::publish;
using fp8amp::capi::require;
using fp8amp::core::Context;
using fp8amp::core::GradScaler;
using fp8amp::core::lookup;
using fp8amp::core::Optimizer;
using fp8amp::core::Tensor;

extern "C" {

namespace {
fp8amp_adam_desc default_adam_desc() {
    fp8amp_adam_desc d{};
    d.struct_size = sizeof d;
    d.adamw = 1;
    d.lr = 1e-3f;
    d.beta1 = 0.9f;
    d.beta2 = 0.999f;
    d.eps = 1e-8f;
    d.weight_decay = 0.01f;
    d.maximize = 0;
    d.exp_avg_dtype = FP8AMP_DTYPE_F32;
    d.exp_avg_sq_dtype = FP8AMP_DTYPE_F32;
    d.master_dtype = FP8AMP_NO_MASTER;
    d.state_block_size = 128;
    d.max_grad_norm = 0.0f;
    return d;
}

// level: the caller's fp8amp_opt_level, taken as the integer it holds (core/enums.hpp enum_value):
// an out-of-range value must not be loaded as the enum, not even to pass it on.
fp8amp_adam_desc level_adam_desc(int32_t level) {
    if (level != FP8AMP_OPT_LEVEL_O1 && level != FP8AMP_OPT_LEVEL_O2 && level != FP8AMP_OPT_LEVEL_O3)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "level " + std::to_string(level) + " is not O1, O2 or O3");
    fp8amp_adam_desc d = default_adam_desc();
    if (level != FP8AMP_OPT_LEVEL_O1) {
        d.exp_avg_dtype = FP8AMP_DTYPE_E4M3;
        d.exp_avg_sq_dtype = FP8AMP_DTYPE_F16;
    }
    if (level == FP8AMP_OPT_LEVEL_O3) d.master_dtype = FP8AMP_DTYPE_F16;
    return d;
}

fp8amp_adam_step_args default_step_args() {
    fp8amp_adam_step_args a{};
    a.struct_size = sizeof a;
    a.lr = -1.0f;
    a.lr_device = nullptr;
    a.grad_scale_inv = 1.0f;
    a.scaler = nullptr;
    return a;
}

fp8amp_grad_scaler_desc default_scaler_desc() {
    fp8amp_grad_scaler_desc d{};
    d.struct_size = sizeof d;
    d.init_scale = 65536.0f;
    d.growth_factor = 2.0f;
    d.backoff_factor = 0.5f;
    d.growth_interval = 2000;
    d.hysteresis = 1;
    return d;
}
}  // namespace

// Each sized init writes the caller's sizeof; each FP8AMP_0 entry point (named in parentheses: the
// header's macro of that name means the sized one) writes 0.1.0's layout, which its callers have.
FP8AMP_API fp8amp_status fp8amp_adam_desc_init(fp8amp_adam_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, default_adam_desc(), "fp8amp_adam_desc");
    });
}

FP8AMP_API fp8amp_status(fp8amp_adam_desc_init_default)(fp8amp_adam_desc *desc) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, fp8amp::kReleased010AdamDesc, default_adam_desc(), "fp8amp_adam_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_opt_level_adam_init(fp8amp_opt_level level, fp8amp_adam_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, level_adam_desc(fp8amp::core::enum_value(level)), "fp8amp_adam_desc");
    });
}

FP8AMP_API fp8amp_status(fp8amp_opt_level_adam_config)(fp8amp_opt_level level, fp8amp_adam_desc *desc) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, fp8amp::kReleased010AdamDesc, level_adam_desc(fp8amp::core::enum_value(level)), "fp8amp_adam_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_create(fp8amp_context ctx, const fp8amp_adam_desc *desc, fp8amp_optimizer *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(desc, "desc");
        require(out, "out");
        publish(std::make_shared<Optimizer>(std::move(c), *desc), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_destroy(fp8amp_optimizer opt) {
    FP8AMP_GUARD({
        if (opt) fp8amp::core::unregister_object(opt, Optimizer::kKind, "opt");
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_add_param(fp8amp_optimizer opt, fp8amp_tensor param, fp8amp_tensor grad) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        auto p = lookup<Tensor>(param, "param");
        auto g = lookup<Tensor>(grad, "grad");
        o->add_param(std::move(p), std::move(g));
    });
}

FP8AMP_API fp8amp_status fp8amp_param_desc_init(fp8amp_param_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp_param_desc d{};
        d.struct_size = sizeof d;
        d.master_dtype = FP8AMP_MASTER_DEFAULT;
        fp8amp::write_sized(desc, size, d, "fp8amp_param_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_add_param_ex(fp8amp_optimizer opt, fp8amp_tensor param, fp8amp_tensor grad,
                                                       const fp8amp_param_desc *desc) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        auto p = lookup<Tensor>(param, "param");
        auto g = lookup<Tensor>(grad, "grad");
        int32_t master = FP8AMP_MASTER_DEFAULT;
        std::shared_ptr<Tensor> init;
        if (desc) {
            const fp8amp_param_desc d = read_sized(*desc, "desc", "fp8amp_param_desc", "fp8amp_param_desc_init");
            master = d.master_dtype;
            if (d.master_init) init = lookup<Tensor>(d.master_init, "desc->master_init");
        }
        o->add_param(std::move(p), std::move(g), master, init.get());
    });
}

FP8AMP_API fp8amp_status fp8amp_adam_step_args_init(fp8amp_adam_step_args *args, size_t size) {
    FP8AMP_GUARD({
        require(args, "args");
        fp8amp::write_sized(args, size, default_step_args(), "fp8amp_adam_step_args");
    });
}

FP8AMP_API fp8amp_status(fp8amp_adam_step_args_init_default)(fp8amp_adam_step_args *args) {
    FP8AMP_GUARD({
        require(args, "args");
        fp8amp::write_sized(args, fp8amp::kReleased010StepArgs, default_step_args(), "fp8amp_adam_step_args");
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_step(fp8amp_optimizer opt, const fp8amp_adam_step_args *args) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        fp8amp_adam_step_args a = default_step_args();
        if (args) a = read_sized(*args, "args", "fp8amp_adam_step_args", "fp8amp_adam_step_args_init_default");
        std::shared_ptr<GradScaler> scaler = a.scaler ? lookup<GradScaler>(a.scaler, "args->scaler") : nullptr;
        o->step(a.lr, a.lr_device, a.grad_scale_inv, scaler.get());
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_get_found_inf(fp8amp_optimizer opt, int32_t *found_inf) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(found_inf, "found_inf");
        *found_inf = o->status().found_inf;
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_get_step(fp8amp_optimizer opt, int64_t *step) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(step, "step");
        *step = o->status().step;
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_get_grad_norm(fp8amp_optimizer opt, float *norm) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(norm, "norm");
        *norm = o->status().grad_norm;
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_num_params(fp8amp_optimizer opt, int32_t *count) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(count, "count");
        *count = o->num_params();
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_set_shard(fp8amp_optimizer opt, fp8amp_comm comm) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        auto c = lookup<fp8amp::core::Communicator>(comm, "comm");
        o->set_shard(std::move(c));
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_shard_range(fp8amp_optimizer opt, int32_t index, int64_t *begin,
                                                      int64_t *count) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(begin, "begin");
        require(count, "count");
        int64_t b = 0;
        int64_t n = 0;
        o->shard_range(index, b, n);
        *begin = b;
        *count = n;
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_state_bytes(fp8amp_optimizer opt, size_t *bytes) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(bytes, "bytes");
        *bytes = o->state_bytes();
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_save(fp8amp_optimizer opt, void *buffer, size_t capacity, size_t *size) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(size, "size");
        const size_t needed = o->save(nullptr);
        if (!buffer) {
            *size = needed;
            return;
        }
        if (capacity < needed)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "capacity " + std::to_string(capacity) + " is less than the " +
                                                    std::to_string(needed) + " bytes of the checkpoint");
        *size = o->save(static_cast<unsigned char *>(buffer));
    });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_load(fp8amp_optimizer opt, const void *data, size_t size) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        require(data, "data");
        o->load(static_cast<const unsigned char *>(data), size);
    });
}

FP8AMP_API fp8amp_status fp8amp_param_state_init(fp8amp_param_state *state, size_t size) {
    FP8AMP_GUARD({
        require(state, "state");
        fp8amp_param_state d{};
        d.struct_size = sizeof d;
        fp8amp::write_sized(state, size, d, "fp8amp_param_state");
    });
}

namespace {
// The bodies of fp8amp_optimizer_param_state and _set_param_state (out of FP8AMP_GUARD: their
// braced initializers hold commas the macro would split at).
void param_state_impl(fp8amp_optimizer opt, int32_t index, fp8amp_param_state *out) {
    auto o = lookup<Optimizer>(opt, "opt");
    require(out, "out");
    // Checks out->struct_size (and that a newer caller's extra fields are zero) before anything.
    fp8amp_param_state r = read_sized(*out, "out", "fp8amp_param_state", "fp8amp_param_state_init");
    const uint32_t caller_size = out->struct_size;
    Optimizer::StateTensors views = o->param_state(index);
    const int64_t step = o->status().step;
    // Registers every view, or none: a failure part-way unregisters those already published.
    std::shared_ptr<Tensor> *parts[7] = {&views.m, &views.m_scale, &views.v, &views.v_scale, &views.master,
                                         &views.master_scale, &views.meta_history};
    fp8amp_tensor handles[7] = {};
    try {
        for (int k = 0; k < 7; ++k)
            if (*parts[k]) handles[k] = reinterpret_cast<fp8amp_tensor>(fp8amp::core::register_handle(std::move(*parts[k])));
    } catch (...) {
        for (fp8amp_tensor h : handles)
            if (h) fp8amp::core::unregister_object(h, Tensor::kKind, "view");
        throw;
    }
    r.has_master = handles[4] ? 1 : 0;
    r.step = step;
    r.exp_avg = handles[0];
    r.exp_avg_scale_inv = handles[1];
    r.exp_avg_sq = handles[2];
    r.exp_avg_sq_scale_inv = handles[3];
    r.master = handles[4];
    r.master_scale_inv = handles[5];
    r.param_meta_history = handles[6];
    r.param_meta_scale = views.meta_scale;
    r.param_meta_amax = views.meta_amax;
    r.param_meta_updates = views.meta_updates;
    r.struct_size = caller_size;
    std::memcpy(out, &r, std::min<size_t>(caller_size, sizeof r));
}

void set_param_state_impl(fp8amp_optimizer opt, int32_t index, const fp8amp_param_state *state) {
    auto o = lookup<Optimizer>(opt, "opt");
    require(state, "state");
    const fp8amp_param_state s = read_sized(*state, "state", "fp8amp_param_state", "fp8amp_param_state_init");
    // Each tensor is looked up (and kept alive) for the call; NULL stays null.
    auto get = [](fp8amp_tensor h, const char *name) { return h ? lookup<Tensor>(h, name) : nullptr; };
    const auto m = get(s.exp_avg, "state->exp_avg"), ms = get(s.exp_avg_scale_inv, "state->exp_avg_scale_inv"),
               v = get(s.exp_avg_sq, "state->exp_avg_sq"), vs = get(s.exp_avg_sq_scale_inv, "state->exp_avg_sq_scale_inv"),
               w = get(s.master, "state->master"), ws = get(s.master_scale_inv, "state->master_scale_inv"),
               mh = get(s.param_meta_history, "state->param_meta_history");
    Optimizer::StateInput in;
    in.m = m.get();
    in.m_scale = ms.get();
    in.v = v.get();
    in.v_scale = vs.get();
    in.master = w.get();
    in.master_scale = ws.get();
    in.meta_history = mh.get();
    in.meta_scale = s.param_meta_scale;
    in.meta_amax = s.param_meta_amax;
    in.meta_updates = s.param_meta_updates;
    o->set_param_state(index, in);
}
}  // namespace

FP8AMP_API fp8amp_status fp8amp_optimizer_param_state(fp8amp_optimizer opt, int32_t index, fp8amp_param_state *out) {
    FP8AMP_GUARD({ param_state_impl(opt, index, out); });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_set_param_state(fp8amp_optimizer opt, int32_t index,
                                                          const fp8amp_param_state *state) {
    FP8AMP_GUARD({ set_param_state_impl(opt, index, state); });
}

FP8AMP_API fp8amp_status fp8amp_optimizer_set_step(fp8amp_optimizer opt, int64_t step) {
    FP8AMP_GUARD({
        auto o = lookup<Optimizer>(opt, "opt");
        o->set_step(step);
    });
}

/* ---- loss scaler ---- */

FP8AMP_API fp8amp_status fp8amp_grad_scaler_desc_init(fp8amp_grad_scaler_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, default_scaler_desc(), "fp8amp_grad_scaler_desc");
    });
}

FP8AMP_API fp8amp_status(fp8amp_grad_scaler_desc_init_default)(fp8amp_grad_scaler_desc *desc) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, fp8amp::kReleased010ScalerDesc, default_scaler_desc(), "fp8amp_grad_scaler_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_create(fp8amp_context ctx, const fp8amp_grad_scaler_desc *desc,
                                                   fp8amp_grad_scaler *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(desc, "desc");
        require(out, "out");
        publish(std::make_shared<GradScaler>(std::move(c), *desc), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_destroy(fp8amp_grad_scaler scaler) {
    FP8AMP_GUARD({
        if (scaler) fp8amp::core::unregister_object(scaler, GradScaler::kKind, "scaler");
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_get_scale(fp8amp_grad_scaler scaler, float *scale) {
    FP8AMP_GUARD({
        auto s = lookup<GradScaler>(scaler, "scaler");
        require(scale, "scale");
        *scale = s->get_state().scale;
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_scale_device_ptr(fp8amp_grad_scaler scaler, const float **scale) {
    FP8AMP_GUARD({
        auto s = lookup<GradScaler>(scaler, "scaler");
        require(scale, "scale");
        *scale = &s->state()->scale;
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_get_state(fp8amp_grad_scaler scaler, fp8amp_grad_scaler_state *state) {
    FP8AMP_GUARD({
        auto s = lookup<GradScaler>(scaler, "scaler");
        require(state, "state");
        *state = s->get_state();
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_set_state(fp8amp_grad_scaler scaler, const fp8amp_grad_scaler_state *state) {
    FP8AMP_GUARD({
        auto s = lookup<GradScaler>(scaler, "scaler");
        require(state, "state");
        s->set_state(*state);
    });
}

FP8AMP_API fp8amp_status fp8amp_grad_scaler_update(fp8amp_grad_scaler scaler, fp8amp_optimizer opt) {
    FP8AMP_GUARD({
        auto s = lookup<GradScaler>(scaler, "scaler");
        auto o = lookup<Optimizer>(opt, "opt");
        if (!fp8amp::core::same_device(s->device(), o->device()))
            fail(FP8AMP_ERROR_DEVICE_MISMATCH, "scaler is on " + fp8amp::core::device_name(s->device()) + ", opt on " +
                                                   fp8amp::core::device_name(o->device()));
        o->update_scaler(*s);
    });
}

}  // extern "C"
