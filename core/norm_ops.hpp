// Fused normalization (fp8amp_norm_forward / fp8amp_norm_backward): argument checks, then one backend
// call on the context's stream. The arithmetic is kernels/norm.hpp's.
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

}  // namespace fp8amp::core
