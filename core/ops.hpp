// Element-wise operations that pick the backend of the tensors' device.
#pragma once

#include "context.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

// dst = convert(src) (fp8amp_cast).
void cast(const Context &ctx, const Tensor &src, Tensor &dst);

}  // namespace fp8amp::core
