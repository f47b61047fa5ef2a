// The one internal interface between core and the numeric kernels. Core includes this header and
// nothing of CUDA: the CUDA side (kernels/cuda) is compiled only when the build has CUDA, and
// kernels/cuda/cuda_disabled.cpp provides the same functions, answering NOT_SUPPORTED, otherwise.
// Every function reports failure by throwing fp8amp::Error (kernels/error.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels {

struct ScalingState;  // kernels/scaling.hpp
namespace adam {
struct StepConfig;    // kernels/adam.hpp
struct ScalerState;
struct ScalerConfig;
struct Status;
}  // namespace adam

// What a quantize writes besides the FP8 data: the meta it records into (amax, statistics; its scale,
// under current scaling) and the tensor's own scale_inv copy.
struct QuantizeTarget {
    ScalingState *meta;            // device (or host, on the CPU backend) memory
    float *scale_inv;              // the destination tensor's scale_inv slot
    float *scale_inv_t = nullptr;  // the transposed copy's slot (quantize_transpose), or null
    // Host-side mirrors of the meta's configuration, so launches never read device memory:
    bool current = false;  // current scaling: compute this tensor's amax and scale first
    bool stats = false;    // count saturated / underflowed elements
};

// ---- CPU reference kernels (portable C++) -------------------------------------------------------
// Same semantics as the CUDA functions below, bit for bit; memory is host memory.
namespace cpu {
// dst[i] = convert(src[i]) for n elements, by the rules of fp8amp_cast.
void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n);
// max |src| (NaN counts as inf), as amax bits (see scaling.hpp).
uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n);
// dst = fp8(src * scale); records amax and statistics; current scaling computes the scale first.
void quantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
              const QuantizeTarget &target);
// quantize of src [rows, cols] into dst [rows, cols] and dst_t [cols, rows].
void quantize_transpose(const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t, fp8amp_dtype dst_dtype,
                        size_t rows, size_t cols, const QuantizeTarget &target);
// dst = decode(src) * (*scale_inv), rounded into dst_dtype.
void dequantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                const float *scale_inv);
// fp8amp_scaling_update of each meta.
void update_scaling(ScalingState *const *metas, size_t n);
// One Adam/AdamW step over the parameter list of `config` (kernels/adam.hpp).
void adam_step(const adam::StepConfig &config);
// Loss-scaler update from a step's found_inf.
void scaler_update(adam::ScalerState *scaler, const adam::ScalerConfig &config, const adam::Status *status);
}  // namespace cpu

// ---- CUDA runtime and kernels -------------------------------------------------------------------
namespace cuda {
// True when this library was built with CUDA kernels.
bool built_with_cuda();
// Number of usable GPUs; 0 when there is no GPU, no driver or no CUDA build (then *why says which).
int device_count(std::string *why);
// Throws NOT_SUPPORTED (with the reason) or DEVICE_MISMATCH when `device` cannot be used.
void check_device(int device);
// Device memory. malloc throws OUT_OF_MEMORY when cudaMalloc cannot serve the request.
void *malloc(int device, size_t nbytes);
void free(int device, void *ptr) noexcept;
// The CUDA ordinal a pointer belongs to, or -1 for host memory the driver does not know.
int pointer_device(const void *ptr);
// Synchronous host<->device copies ordered after the work already queued on `stream`.
void copy_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes);
void copy_to_host(int device, void *stream, void *dst, const void *src, size_t nbytes);
void synchronize(int device, void *stream);
void copy_device_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes);  // async
void memset(int device, void *stream, void *dst, int value, size_t nbytes);                        // async
// Asynchronous on `stream`, bit-identical to their cpu:: counterparts (device memory throughout).
void cast(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst,
          fp8amp_dtype dst_dtype, size_t n);
void amax(int device, void *stream, const void *src, fp8amp_dtype src_dtype, size_t n, uint32_t *amax_bits);
void quantize(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
              size_t n, const QuantizeTarget &target);
void quantize_transpose(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                        fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target);
void dequantize(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                size_t n, const float *scale_inv);
// Updates n metas (device pointers) in one launch per 1024 metas.
void update_scaling(int device, void *stream, ScalingState *const *metas, size_t n);
// One Adam/AdamW step: one cooperative launch on `stream`, no host synchronization. bit-identical to
// cpu::adam_step when clipping is off. max_partials: how many Partial slots config.partials holds.
void adam_step(int device, void *stream, const adam::StepConfig &config, int max_partials);
// The number of Partial slots adam_step needs on this device (its persistent grid size).
int adam_grid_size(int device);
// Loss-scaler update from a step's found_inf, on the device (one tiny kernel).
void scaler_update(int device, void *stream, adam::ScalerState *scaler, const adam::ScalerConfig &config,
                   const adam::Status *status);
}  // namespace cuda

}  // namespace fp8amp::kernels
