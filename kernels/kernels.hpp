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

// ---- CPU reference kernels (portable C++) -------------------------------------------------------
namespace cpu {
// dst[i] = convert(src[i]) for n elements, by the rules of fp8amp_cast.
void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n);
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
// Asynchronous on `stream`: dst = convert(src), bit-identical to cpu::cast.
void cast(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst,
          fp8amp_dtype dst_dtype, size_t n);
}  // namespace cuda

}  // namespace fp8amp::kernels
