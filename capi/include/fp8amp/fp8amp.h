/*
 * fp8amp: FP8 mixed-precision training engine. The one public C header.
 *
 * C99. Every function returns an fp8amp_status (pure getters of constants excepted); outputs go
 * through pointer arguments and are written only on success. On failure the call changes nothing,
 * and fp8amp_last_error_message() (thread-local) says what went wrong.
 *
 * Handles are opaque. Each carries a kind and a generation and is checked on every call against a
 * registry of live objects: a destroyed handle, a handle of another kind, or a pointer that is not
 * a handle at all gives FP8AMP_ERROR_INVALID_HANDLE, never a crash.
 *
 * Threading: the library is thread-safe at the level of objects. A context, and the tensors made
 * with it, are used by one thread at a time (like a CUDA stream); different contexts may be used
 * from different threads concurrently. Error messages are per thread.
 *
 * ABI: enum values are fixed and append-only; option structs begin with uint32_t struct_size so that
 * they can grow; exported symbols carry the version node FP8AMP_0; SONAME libfp8amp.so.0.
 */
#ifndef FP8AMP_FP8AMP_H
#define FP8AMP_FP8AMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FP8AMP_BUILDING_LIBRARY) && defined(__GNUC__)
#define FP8AMP_API __attribute__((visibility("default")))
#else
#define FP8AMP_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define FP8AMP_VERSION_MAJOR 0
#define FP8AMP_VERSION_MINOR 1
#define FP8AMP_VERSION_PATCH 0
/** The version this header describes, as major * 10000 + minor * 100 + patch. */
#define FP8AMP_VERSION (FP8AMP_VERSION_MAJOR * 10000 + FP8AMP_VERSION_MINOR * 100 + FP8AMP_VERSION_PATCH)

/** The version of the loaded library, encoded as FP8AMP_VERSION. Compare the two to detect a
 *  header/library mismatch: the major versions must be equal, the library's minor not older. */
FP8AMP_API uint32_t fp8amp_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */

typedef enum fp8amp_status {
    FP8AMP_SUCCESS = 0,
    FP8AMP_ERROR_INVALID_ARGUMENT = 1, /**< NULL pointer, bad enum, bad size, read-only target, ... */
    FP8AMP_ERROR_INVALID_HANDLE = 2,   /**< destroyed, foreign or wrong-kind handle */
    FP8AMP_ERROR_SHAPE_MISMATCH = 3,
    FP8AMP_ERROR_DTYPE_MISMATCH = 4,
    FP8AMP_ERROR_DEVICE_MISMATCH = 5,  /**< objects of different devices in one call */
    FP8AMP_ERROR_OUT_OF_MEMORY = 6,
    FP8AMP_ERROR_NOT_SUPPORTED = 7,    /**< this build or this machine cannot do it; the message says why */
    FP8AMP_ERROR_CUDA = 8,
    FP8AMP_ERROR_CUBLAS = 9,
    FP8AMP_ERROR_NCCL = 10,
    FP8AMP_ERROR_CORRUPT_DATA = 11,
    FP8AMP_ERROR_INTERNAL = 12
} fp8amp_status;

/** A constant string naming the status ("FP8AMP_ERROR_SHAPE_MISMATCH"), or "FP8AMP_UNKNOWN_STATUS".
 *  Never NULL. */
FP8AMP_API const char *fp8amp_status_name(fp8amp_status status);

/** The message of the last failed call on this thread ("" if none failed yet). Valid until the next
 *  fp8amp call on this thread. A successful call does not clear it. Never NULL. */
FP8AMP_API const char *fp8amp_last_error_message(void);

/* ---------------------------------------------------------------------------------------------
 * Types, devices
 * ------------------------------------------------------------------------------------------- */

typedef enum fp8amp_dtype {
    FP8AMP_DTYPE_F32 = 0,
    FP8AMP_DTYPE_F16 = 1,
    FP8AMP_DTYPE_BF16 = 2,
    FP8AMP_DTYPE_E4M3 = 3, /**< float8 e4m3fn: bias 7, max 448, no infinities, NaN = S.1111.111 */
    FP8AMP_DTYPE_E5M2 = 4  /**< float8 e5m2: bias 15, max 57344, IEEE infinities and NaNs */
} fp8amp_dtype;

/** Bytes per element of a dtype; 0 for a value that is not an fp8amp_dtype. */
FP8AMP_API size_t fp8amp_dtype_size(fp8amp_dtype dtype);
/** A constant name ("e4m3"); "unknown" for a value that is not an fp8amp_dtype. Never NULL. */
FP8AMP_API const char *fp8amp_dtype_name(fp8amp_dtype dtype);

typedef enum fp8amp_device_type {
    FP8AMP_DEVICE_CPU = 1, /**< same value as DLPack's kDLCPU */
    FP8AMP_DEVICE_CUDA = 2 /**< same value as DLPack's kDLCUDA */
} fp8amp_device_type;

/** A device, passed by value. index is 0 for the CPU and the CUDA ordinal for a GPU. */
typedef struct fp8amp_device {
    fp8amp_device_type type;
    int32_t index;
} fp8amp_device;

/** How many devices of a type this process can use. CPU: always 1. CUDA: the number of visible
 *  GPUs; 0 (with FP8AMP_SUCCESS) when there is no GPU, no driver, or the library was built without
 *  CUDA -- fp8amp_context_create then says which.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL count, unknown type). */
FP8AMP_API fp8amp_status fp8amp_device_count(fp8amp_device_type type, int32_t *count);

/* ---------------------------------------------------------------------------------------------
 * Context: a device, a stream and an allocator
 * ------------------------------------------------------------------------------------------- */

typedef struct fp8amp_context_s *fp8amp_context;

/** Creates a context on a device. A CUDA context starts on the default stream and with cudaMalloc.
 *  Ownership: the caller destroys it with fp8amp_context_destroy. Tensors made with a context keep
 *  what they need of it alive, so destroying a context before its tensors is safe.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL out, unknown device type, negative index, CPU index
 *  other than 0); DEVICE_MISMATCH (CUDA index >= fp8amp_device_count); NOT_SUPPORTED (CUDA asked
 *  for, but the library was built without CUDA or there is no usable GPU/driver: the message says
 *  which); CUDA. */
FP8AMP_API fp8amp_status fp8amp_context_create(fp8amp_device device, fp8amp_context *out);

/** Destroys a context handle. Passing NULL is a no-op success.
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_destroy(fp8amp_context ctx);

/** The context's device. Statuses: SUCCESS; INVALID_ARGUMENT (NULL out); INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_device(fp8amp_context ctx, fp8amp_device *out);

/** Makes every later operation of this context run on a borrowed cudaStream_t (NULL = the legacy
 *  default stream), e.g. a framework's current stream. fp8amp never destroys it; the caller keeps
 *  it alive while the context uses it. Operations are asynchronous with respect to the host unless
 *  documented otherwise (host copies are synchronous).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (a non-NULL stream on a CPU context). */
FP8AMP_API fp8amp_status fp8amp_context_set_stream(fp8amp_context ctx, void *cuda_stream);

/** The stream set by fp8amp_context_set_stream (NULL for the default stream and on the CPU).
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL out); INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_get_stream(fp8amp_context ctx, void **cuda_stream);

/** Allocation hook: return nbytes of memory on `device`, aligned to at least 256 bytes, usable on
 *  `stream` (the context's stream), or NULL when it cannot. Must not call back into fp8amp. */
typedef void *(*fp8amp_alloc_fn)(void *user_data, size_t nbytes, fp8amp_device device, void *stream);
/** Release hook: frees what the matching fp8amp_alloc_fn returned. */
typedef void (*fp8amp_free_fn)(void *user_data, void *ptr, size_t nbytes, fp8amp_device device,
                               void *stream);

/** Routes every allocation that later calls on this context make (tensors and workspaces) through
 *  the hooks, so that a host framework's caching allocator can serve them; both NULL restores the
 *  built-in allocator (cudaMalloc / aligned host memory). Memory already allocated is freed through
 *  the hooks that allocated it, so switching is safe at any time. user_data is borrowed and must
 *  outlive every allocation made through it.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (exactly one of the two hooks NULL). */
FP8AMP_API fp8amp_status fp8amp_context_set_allocator(fp8amp_context ctx, fp8amp_alloc_fn alloc_fn,
                                                      fp8amp_free_fn free_fn, void *user_data);

/** Waits until all work issued through the context is done (the stream, on CUDA).
 *  Statuses: SUCCESS; INVALID_HANDLE; CUDA (an earlier asynchronous failure surfaces here). */
FP8AMP_API fp8amp_status fp8amp_context_synchronize(fp8amp_context ctx);

/* ---------------------------------------------------------------------------------------------
 * Tensors: contiguous row-major arrays on the context's device
 * ------------------------------------------------------------------------------------------- */

typedef struct fp8amp_tensor_s *fp8amp_tensor;

/** Largest number of dimensions a tensor may have. A tensor of 0 dimensions is a scalar. */
#define FP8AMP_MAX_NDIM 8

/** Creates an owning tensor on the context's device; its contents are unspecified until written.
 *  shape has ndim entries (may be NULL when ndim is 0); every extent must be >= 1.
 *  Statuses: SUCCESS; INVALID_HANDLE (ctx); INVALID_ARGUMENT (NULL out, unknown dtype, ndim outside
 *  0..FP8AMP_MAX_NDIM, NULL shape with ndim > 0, an extent < 1, a byte size that overflows);
 *  OUT_OF_MEMORY (the allocator could not provide the bytes); CUDA. */
FP8AMP_API fp8amp_status fp8amp_tensor_create(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim,
                                              const int64_t *shape, fp8amp_tensor *out);

/** Wraps memory the caller owns (contiguous, row-major, on the context's device) without copying.
 *  The caller keeps it alive until the tensor is destroyed. data must be aligned to the dtype size.
 *  Statuses: as fp8amp_tensor_create, plus INVALID_ARGUMENT for NULL or misaligned data. Whether a
 *  pointer really lies on the context's device is checked only where the platform can tell (CUDA
 *  pointer attributes): a CUDA context refuses host pointers with DEVICE_MISMATCH. */
FP8AMP_API fp8amp_status fp8amp_tensor_wrap(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim,
                                            const int64_t *shape, void *data, fp8amp_tensor *out);

/** Destroys a tensor handle (freeing its memory if it owns it and nothing else, such as an exported
 *  DLPack tensor, still refers to it). NULL is a no-op success. Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_tensor_destroy(fp8amp_tensor t);

/** Getters. Each: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_dtype(fp8amp_tensor t, fp8amp_dtype *out);
FP8AMP_API fp8amp_status fp8amp_tensor_ndim(fp8amp_tensor t, int32_t *out);
/** Copies the ndim extents into shape[0..ndim). INVALID_ARGUMENT also when capacity < ndim. */
FP8AMP_API fp8amp_status fp8amp_tensor_shape(fp8amp_tensor t, int32_t capacity, int64_t *shape);
FP8AMP_API fp8amp_status fp8amp_tensor_numel(fp8amp_tensor t, int64_t *out);
FP8AMP_API fp8amp_status fp8amp_tensor_nbytes(fp8amp_tensor t, size_t *out);
/** The data pointer (device memory for a CUDA tensor). Borrowed: valid while the tensor lives. */
FP8AMP_API fp8amp_status fp8amp_tensor_data(fp8amp_tensor t, void **out);
FP8AMP_API fp8amp_status fp8amp_tensor_device(fp8amp_tensor t, fp8amp_device *out);

/** Copies nbytes (which must equal the tensor's byte size) from host memory into the tensor.
 *  Synchronous: src may be reused when it returns.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL src, read-only tensor);
 *  SHAPE_MISMATCH (nbytes differs from the tensor's byte size); CUDA. */
FP8AMP_API fp8amp_status fp8amp_tensor_copy_from_host(fp8amp_tensor t, const void *src, size_t nbytes);

/** Copies the tensor into host memory (nbytes must equal its byte size). Synchronous: waits for the
 *  work already issued on the context's stream.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL dst); SHAPE_MISMATCH; CUDA. */
FP8AMP_API fp8amp_status fp8amp_tensor_copy_to_host(fp8amp_tensor t, void *dst, size_t nbytes);

/* DLPack >= 1.0 (versioned structs). Declared, not defined, here: include dlpack.h to use them.
 * FP8 tensors use DLPack 1.1's kDLFloat8_e4m3fn (10) and kDLFloat8_e5m2 (12) type codes. */
struct DLManagedTensorVersioned;

/** Imports a DLPack tensor without copying. On success fp8amp takes ownership of `managed` and
 *  calls its deleter when the tensor is destroyed; on failure ownership stays with the caller and
 *  nothing was called. Accepted: DLPack major version 1; dtypes float32/float16/bfloat16/
 *  float8_e4m3fn/float8_e5m2 (lanes 1); compact row-major strides (or NULL strides); device kDLCPU
 *  or kDLCUDAHost for a CPU context, kDLCUDA of the context's ordinal for a CUDA context. A
 *  read-only tensor (DLPACK_FLAG_BITMASK_READ_ONLY) is refused as the destination of any write.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL, empty or malformed tensor);
 *  NOT_SUPPORTED (major version != 1, a dtype fp8amp does not have, non-contiguous strides);
 *  DEVICE_MISMATCH. */
FP8AMP_API fp8amp_status fp8amp_tensor_from_dlpack(fp8amp_context ctx,
                                                   struct DLManagedTensorVersioned *managed,
                                                   fp8amp_tensor *out);

/** Exports a tensor as a DLPack 1.1 versioned managed tensor sharing its memory. The consumer owns
 *  the result and calls its deleter exactly once; the memory stays valid until then, even if the
 *  fp8amp tensor is destroyed first. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out);
 *  OUT_OF_MEMORY. */
FP8AMP_API fp8amp_status fp8amp_tensor_to_dlpack(fp8amp_tensor t, struct DLManagedTensorVersioned **out);

/* ---------------------------------------------------------------------------------------------
 * Conversion
 * ------------------------------------------------------------------------------------------- */

/** dst = convert(src), element by element, with scale 1: the codec itself. Any dtype to any dtype of
 *  the same shape (equal dtypes copy bits). Rounding is to nearest, ties to even. Into E4M3/E5M2
 *  it saturates: finite values beyond the largest and +-inf become +-max. Into F16/BF16, IEEE
 *  behaviour (overflow gives inf). A NaN stays NaN and keeps its sign; its payload becomes the
 *  destination's canonical quiet NaN (E4M3 0x7F, E5M2 0x7E, F16 0x7E00, BF16 0x7FC0, F32
 *  0x7FC00000, with the sign bit set for a negative NaN). CPU and CUDA give bit-identical results. Asynchronous on CUDA (ordered on the context's stream).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (read-only dst); SHAPE_MISMATCH;
 *  DEVICE_MISMATCH (a tensor not on the context's device); CUDA. */
FP8AMP_API fp8amp_status fp8amp_cast(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FP8AMP_FP8AMP_H */
