// Fused normalization (fp8amp_norm_forward / fp8amp_norm_backward) and fused activations
// (fp8amp_activation_forward / _backward): argument checks, then one backend call on the context's
// stream. The arithmetic is kernels/norm.hpp's and kernels/activation.hpp's.
#pragma once

#include "context.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

struct NormOptions {
    bool rms = false;            // RMSNorm (else LayerNorm)
    float eps = 1e-5f;
    bool zero_centered = false;  // the weight is 1 + gamma
};

// Checks, in this order, so that a call with several faults gets a deterministic status: dtypes
// (DTYPE_MISMATCH), which optional tensors the kind allows or needs and metas (INVALID_ARGUMENT),
// devices (DEVICE_MISMATCH), writability (INVALID_ARGUMENT), shapes (SHAPE_MISMATCH), overlaps
// (INVALID_ARGUMENT). Null pointers are the optional tensors the caller passed as NULL.
void norm_forward(const Context &ctx, const NormOptions &o, const Tensor &x, const Tensor &gamma, const Tensor *beta,
                  Tensor &y, Tensor *y_t, Tensor *mean, Tensor *rstd);
void norm_backward(const Context &ctx, const NormOptions &o, const Tensor &dy, const Tensor &x, const Tensor &gamma,
                   const Tensor *mean, const Tensor &rstd, Tensor &dx, Tensor &dgamma, Tensor *dbeta);

// Fused activations (fp8amp_activation_forward / _backward), kind an fp8amp_activation value (checked
// here: INVALID_ARGUMENT). The same order of checks.
void activation_forward(const Context &ctx, int32_t kind, const Tensor &x, Tensor &y, Tensor *y_t);
void activation_backward(const Context &ctx, int32_t kind, const Tensor &dy, const Tensor &x, Tensor &dx, Tensor *dx_t);

}  // namespace fp8amp::core
