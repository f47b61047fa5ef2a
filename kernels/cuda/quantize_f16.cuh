// Scaled F16 casting on CUDA (kernels/cuda/quantize_f16.cu): quantize into, quantize + transpose
// into, and dequantize from an F16 tensor bound to a scaling meta. quantize.cu forwards its F16
// cases here, so that its tuned FP8 kernels stay as they are; the numerics are kernels/cpu's, bit
// for bit (one float32 multiply by the scale, one RNE satfinite rounding into F16).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels.hpp"

namespace fp8amp::kernels::cuda::scaled_f16 {

// dst (F16) = f16_rne_satfinite(src * scale), recording amax and statistics into target.meta. Under
// current scaling the caller has already written src's amax into target.meta->amax_bits (as
// quantize.cu does for FP8), and the kernel computes the scale from it.
void quantize(int device, cudaStream_t stream, const void *src, fp8amp_dtype src_dtype, void *dst, size_t n,
              const QuantizeTarget &target);

// quantize of src [rows, cols] into dst [rows, cols] and dst_t [cols, rows] (both F16), one pass.
void quantize_transpose(int device, cudaStream_t stream, const void *src, fp8amp_dtype src_dtype, void *dst,
                        void *dst_t, size_t rows, size_t cols, const QuantizeTarget &target);

// dst = decode_f16(src) * (*scale_inv), rounded into dst_dtype (F32, F16 or BF16).
void dequantize(int device, cudaStream_t stream, const void *src, void *dst, fp8amp_dtype dst_dtype, size_t n,
                const float *scale_inv);

}  // namespace fp8amp::kernels::cuda::scaled_f16
