// The boundary of the fused normalizations and activations (fp8amp.h "Fused normalization", "Fused
// activations"): the descriptor, handle lookups and core calls; no engine logic.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "boundary.hpp"
#include "context.hpp"
#include "fp8amp/fp8amp.h"
#include "norm_ops.hpp"
#include "struct_size.hpp"
#include "tensor.hpp"

// The sized-struct rules of struct_size.hpp for fp8amp_norm_desc (new in 0.4.0: its first layout is
// this one), beside the struct in the global namespace, as api_comm.cpp does for its descriptor.
inline constexpr size_t fields_end(const fp8amp_norm_desc *) {
    return offsetof(fp8amp_norm_desc, zero_centered_gamma) + 4;
}
inline constexpr size_t released_size(const fp8amp_norm_desc *) { return sizeof(fp8amp_norm_desc); }

using fp8amp::fail;
using fp8amp::read_sized;
using fp8amp::capi::require;
using fp8amp::core::Context;
using fp8amp::core::lookup;
using fp8amp::core::NormOptions;
using fp8amp::core::Tensor;

namespace {

fp8amp_norm_desc default_norm_desc() {
    fp8amp_norm_desc d{};
    d.struct_size = sizeof d;
    d.kind = FP8AMP_NORM_LAYERNORM;
    d.eps = 1e-5f;
    d.zero_centered_gamma = 0;
    return d;
}

NormOptions options_of(const fp8amp_norm_desc *caller) {
    const fp8amp_norm_desc d =
        caller ? read_sized(*caller, "desc", "fp8amp_norm_desc", "fp8amp_norm_desc_init_default") : default_norm_desc();
    // Read as an integer: a caller's out-of-range value must not be loaded as the enum.
    int32_t kind;
    std::memcpy(&kind, &d.kind, sizeof kind);
    if (kind != FP8AMP_NORM_LAYERNORM && kind != FP8AMP_NORM_RMSNORM)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "desc->kind is " + std::to_string(kind) + ", not FP8AMP_NORM_LAYERNORM (0) or FP8AMP_NORM_RMSNORM (1)");
    if (!(d.eps >= 0.0f) || !std::isfinite(d.eps))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->eps is " + std::to_string(d.eps) + ": it must be finite and >= 0");
    if (d.zero_centered_gamma != 0 && d.zero_centered_gamma != 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "desc->zero_centered_gamma is " + std::to_string(d.zero_centered_gamma) + ", not 0 or 1");
    NormOptions o;
    o.rms = kind == FP8AMP_NORM_RMSNORM;
    o.eps = d.eps;
    o.zero_centered = d.zero_centered_gamma != 0;
    return o;
}

// An optional tensor argument: NULL stays null, anything else must be a live tensor handle.
std::shared_ptr<Tensor> optional_tensor(fp8amp_tensor t, const char *argument) {
    return t ? lookup<Tensor>(t, argument) : nullptr;
}

}  // namespace

FP8AMP_API fp8amp_status fp8amp_norm_desc_init(fp8amp_norm_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, default_norm_desc(), "fp8amp_norm_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_norm_forward(fp8amp_context ctx, const fp8amp_norm_desc *desc, fp8amp_tensor x,
                                             fp8amp_tensor gamma, fp8amp_tensor beta, fp8amp_tensor y,
                                             fp8amp_tensor y_t, fp8amp_tensor mean, fp8amp_tensor rstd) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        const NormOptions o = options_of(desc);
        auto xs = lookup<Tensor>(x, "x");
        auto g = lookup<Tensor>(gamma, "gamma");
        auto b = optional_tensor(beta, "beta");
        auto ys = lookup<Tensor>(y, "y");
        auto yt = optional_tensor(y_t, "y_t");
        auto m = optional_tensor(mean, "mean");
        auto r = optional_tensor(rstd, "rstd");
        fp8amp::core::norm_forward(*c, o, *xs, *g, b.get(), *ys, yt.get(), m.get(), r.get());
    });
}

FP8AMP_API fp8amp_status fp8amp_norm_backward(fp8amp_context ctx, const fp8amp_norm_desc *desc, fp8amp_tensor dy,
                                              fp8amp_tensor x, fp8amp_tensor gamma, fp8amp_tensor mean,
                                              fp8amp_tensor rstd, fp8amp_tensor dx, fp8amp_tensor dgamma,
                                              fp8amp_tensor dbeta) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        const NormOptions o = options_of(desc);
        auto d = lookup<Tensor>(dy, "dy");
        auto xs = lookup<Tensor>(x, "x");
        auto g = lookup<Tensor>(gamma, "gamma");
        auto m = optional_tensor(mean, "mean");
        auto r = lookup<Tensor>(rstd, "rstd");
        auto dxs = lookup<Tensor>(dx, "dx");
        auto dg = lookup<Tensor>(dgamma, "dgamma");
        auto db = optional_tensor(dbeta, "dbeta");
        fp8amp::core::norm_backward(*c, o, *d, *xs, *g, m.get(), *r, *dxs, *dg, db.get());
    });
}

FP8AMP_API fp8amp_status fp8amp_activation_forward(fp8amp_context ctx, fp8amp_activation kind, fp8amp_tensor x,
                                                   fp8amp_tensor y, fp8amp_tensor y_t) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        int32_t k;  // read as an integer: an out-of-range value must not be loaded as the enum
        std::memcpy(&k, &kind, sizeof k);
        auto xs = lookup<Tensor>(x, "x");
        auto ys = lookup<Tensor>(y, "y");
        auto yt = optional_tensor(y_t, "y_t");
        fp8amp::core::activation_forward(*c, k, *xs, *ys, yt.get());
    });
}

FP8AMP_API fp8amp_status fp8amp_activation_backward(fp8amp_context ctx, fp8amp_activation kind, fp8amp_tensor dy,
                                                    fp8amp_tensor x, fp8amp_tensor dx, fp8amp_tensor dx_t) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        int32_t k;
        std::memcpy(&k, &kind, sizeof k);
        auto d = lookup<Tensor>(dy, "dy");
        auto xs = lookup<Tensor>(x, "x");
        auto dxs = lookup<Tensor>(dx, "dx");
        auto dxt = optional_tensor(dx_t, "dx_t");
        fp8amp::core::activation_backward(*c, k, *d, *xs, *dxs, dxt.get());
    });
}
