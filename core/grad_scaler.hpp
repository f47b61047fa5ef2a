// The dynamic loss scaler: its state lives on the device (kernels/adam.hpp ScalerState) so that the
// optimizer's step can read the scale and update it without a host round trip.
#pragma once

#include <memory>

#include "adam.hpp"  // kernels/adam.hpp
#include "context.hpp"

namespace fp8amp::core {

class GradScaler {
public:
    static constexpr HandleKind kKind = HandleKind::GradScaler;

    GradScaler(std::shared_ptr<const Context> ctx, const fp8amp_grad_scaler_desc &caller_desc);

    const Context &context() const { return *ctx_; }
    const fp8amp_device &device() const { return ctx_->device(); }
    kernels::adam::ScalerState *state() const { return static_cast<kernels::adam::ScalerState *>(storage_->data()); }
    const kernels::adam::ScalerConfig &config() const { return config_; }

    fp8amp_grad_scaler_state get_state() const;      // synchronous
    void set_state(const fp8amp_grad_scaler_state &s);  // validated, synchronous

private:
    std::shared_ptr<const Context> ctx_;
    kernels::adam::ScalerConfig config_{};
    std::shared_ptr<Storage> storage_;
};

}  // namespace fp8amp::core
