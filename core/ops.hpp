// Element-wise operations that pick the backend of the tensors' device.
#pragma once

#include <memory>
#include <vector>

#include "context.hpp"
#include "scaling_meta.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

// dst = convert(src) (fp8amp_cast).
void cast(const Context &ctx, const Tensor &src, Tensor &dst);

// The scaled casts. Each checks, in this order, so that the status of a call with several faults is
// deterministic: dtypes (DTYPE_MISMATCH), metas (INVALID_ARGUMENT), devices of every tensor and meta
// against ctx (DEVICE_MISMATCH), writability (INVALID_ARGUMENT), shapes (SHAPE_MISMATCH), overlap
// of source and destinations (INVALID_ARGUMENT). Handles are resolved by the caller.
void quantize(const Context &ctx, const Tensor &src, Tensor &dst);                               // fp8amp_quantize
void quantize_transpose(const Context &ctx, const Tensor &src, Tensor &dst, Tensor &dst_t);      // fp8amp_quantize_transpose
void dequantize(const Context &ctx, const Tensor &src, Tensor &dst);                             // fp8amp_dequantize
float amax(const Context &ctx, const Tensor &t);                                                 // fp8amp_amax

// fp8amp_scaling_update(_many): checks devices (DEVICE_MISMATCH) and duplicates (INVALID_ARGUMENT)
// of every meta first, then updates them all in one kernel call on ctx's stream.
void update_scaling(const Context &ctx, const std::vector<std::shared_ptr<ScalingMeta>> &metas);

}  // namespace fp8amp::core
