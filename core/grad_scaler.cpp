#include "grad_scaler.hpp"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "backend.hpp"  // kernels/backend.hpp
#include "struct_size.hpp"

namespace fp8amp::core {

using kernels::adam::ScalerState;

namespace {
bool normal_positive(float x) { return x >= FLT_MIN && x <= FLT_MAX; }
}  // namespace

GradScaler::GradScaler(std::shared_ptr<const Context> ctx, const fp8amp_grad_scaler_desc &caller_desc)
    : ctx_(std::move(ctx)) {
    const fp8amp_grad_scaler_desc desc =
        read_sized(caller_desc, "desc", "fp8amp_grad_scaler_desc", "fp8amp_grad_scaler_desc_init_default");
    if (!normal_positive(desc.init_scale))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->init_scale " + std::to_string(desc.init_scale) + " is not a normal float > 0");
    if (!(desc.growth_factor > 1.0f && desc.growth_factor <= FLT_MAX))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->growth_factor " + std::to_string(desc.growth_factor) + " is not a finite value > 1");
    if (!(desc.backoff_factor > 0.0f && desc.backoff_factor < 1.0f))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->backoff_factor " + std::to_string(desc.backoff_factor) + " is not in (0, 1)");
    if (desc.growth_interval < 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->growth_interval " + std::to_string(desc.growth_interval) + " is less than 1");
    if (desc.hysteresis < 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->hysteresis " + std::to_string(desc.hysteresis) + " is less than 1");
    config_ = {desc.growth_factor, desc.backoff_factor, desc.growth_interval, desc.hysteresis};
    storage_ = ctx_->allocate(sizeof(ScalerState));
    set_state({desc.init_scale, 0, desc.hysteresis});
}

fp8amp_grad_scaler_state GradScaler::get_state() const {
    ScalerState s{};
    ctx_->backend().copy_to_host(&s, state(), sizeof s);
    return {s.scale, s.growth_tracker, s.hysteresis_left};
}

void GradScaler::set_state(const fp8amp_grad_scaler_state &in) {
    if (!normal_positive(in.scale))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->scale " + std::to_string(in.scale) + " is not a normal float > 0");
    if (in.growth_tracker < 0 || in.growth_tracker >= config_.growth_interval)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->growth_tracker " + std::to_string(in.growth_tracker) + " is outside 0.." +
                                                std::to_string(config_.growth_interval - 1));
    if (in.hysteresis_left < 0 || in.hysteresis_left > config_.hysteresis)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "state->hysteresis_left " + std::to_string(in.hysteresis_left) +
                                                " is outside 0.." + std::to_string(config_.hysteresis));
    const ScalerState s{in.scale, in.growth_tracker, in.hysteresis_left, 0};
    ctx_->backend().copy_to_device(state(), &s, sizeof s);
}

}  // namespace fp8amp::core
