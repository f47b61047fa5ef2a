/**
 * @file fp8amp.h
 * @brief fp8amp: FP8 mixed-precision training engine. The public C header.
 *
 * This reference is generated from the header's comments (Doxygen: target fp8amp_docs); the
 * conventions they rely on -- statuses, handles, ownership, threading, struct_size and the ABI rules
 * -- and the guides and examples are in docs/api.md.
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
 * ABI (docs/api.md 1.6): enum values are fixed and append-only; option structs begin with uint32_t
 * struct_size and grow only at their end; the init functions take the caller's sizeof and write
 * only that many bytes (the ..._init_default spellings are macros that pass it); a struct of a newer
 * header is accepted by an older library when the fields it does not know are zero, and refused
 * with FP8AMP_ERROR_NOT_SUPPORTED otherwise; fp8amp_recipe, embedded in fp8amp_linear_desc, keeps
 * its 32-byte layout within FP8AMP_0. Exported symbols carry the version node of the release that
 * added them (FP8AMP_0: 0.1.0; FP8AMP_0.2: 0.2.0; FP8AMP_0.3: 0.3.0; FP8AMP_0.4: 0.4.0); SONAME libfp8amp.so.0.
 */
#ifndef FP8AMP_FP8AMP_H
#define FP8AMP_FP8AMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the exported functions: default visibility while the library itself is compiled, nothing
 *  for its users. */
#if defined(FP8AMP_BUILDING_LIBRARY) && defined(__GNUC__)
#define FP8AMP_API __attribute__((visibility("default")))
#else
#define FP8AMP_API
#endif

/** @defgroup version Version
 *  The header's version (fp8amp/version.h) and the loaded library's.
 *  @{ */

/* FP8AMP_VERSION_MAJOR/_MINOR/_PATCH and FP8AMP_VERSION (major * 10000 + minor * 100 + patch): the
 * version this header describes (the project's one source of its version), installed beside it. */
#include "fp8amp/version.h"

/** The version of the loaded library. Compare it with FP8AMP_VERSION to detect a header/library
 *  mismatch: the major versions must be equal, the library's minor not older. No status; never fails.
 *  @return major * 10000 + minor * 100 + patch, as FP8AMP_VERSION (200 for 0.2.0). */
FP8AMP_API uint32_t fp8amp_version(void);

/** @} */

/** @defgroup status Statuses and errors
 *  Every call returns an fp8amp_status; a failed call changes nothing and leaves a message (docs/api.md 1.1, 1.2).
 *  @{ */

/** What every call returns (docs/api.md 1.1: outputs are written only on success, and a failed call
 *  changes nothing). Values are fixed and append-only. */
typedef enum fp8amp_status {
    FP8AMP_SUCCESS = 0,
    FP8AMP_ERROR_INVALID_ARGUMENT = 1, /**< NULL pointer, bad enum, bad size, read-only target, ... */
    FP8AMP_ERROR_INVALID_HANDLE = 2,   /**< destroyed, foreign or wrong-kind handle */
    FP8AMP_ERROR_SHAPE_MISMATCH = 3,
    FP8AMP_ERROR_DTYPE_MISMATCH = 4,
    FP8AMP_ERROR_DEVICE_MISMATCH = 5,  /**< objects of different devices in one call */
    FP8AMP_ERROR_OUT_OF_MEMORY = 6,
    FP8AMP_ERROR_NOT_SUPPORTED = 7,    /**< this build, this machine or this library version (a newer
                                            header's struct field set) cannot do it; the message says why */
    FP8AMP_ERROR_CUDA = 8,
    FP8AMP_ERROR_CUBLAS = 9,
    FP8AMP_ERROR_NCCL = 10,
    FP8AMP_ERROR_CORRUPT_DATA = 11,
    FP8AMP_ERROR_INTERNAL = 12,
    FP8AMP_ERROR_COMM = 13             /**< a communicator's transport (MPI) failed or timed out, since 0.3.0 */
} fp8amp_status;

/** A constant string naming the status ("FP8AMP_ERROR_SHAPE_MISMATCH"), or "FP8AMP_UNKNOWN_STATUS".
 *  Never NULL. */
FP8AMP_API const char *fp8amp_status_name(fp8amp_status status);

/** The message of the last failed call on this thread ("" if none failed yet). Valid until the next
 *  fp8amp call on this thread. A successful call does not clear it. Never NULL. */
FP8AMP_API const char *fp8amp_last_error_message(void);

/** @} */

/** @defgroup types Dtypes and devices
 *  Element types and devices.
 *  @{ */

/** Element types. Values are fixed and append-only. */
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

/** Device kinds. */
typedef enum fp8amp_device_type {
    FP8AMP_DEVICE_CPU = 1, /**< same value as DLPack's kDLCPU */
    FP8AMP_DEVICE_CUDA = 2 /**< same value as DLPack's kDLCUDA */
} fp8amp_device_type;

/** A device, passed by value. index is 0 for the CPU and the CUDA ordinal for a GPU. */
typedef struct fp8amp_device {
    fp8amp_device_type type; /**< CPU or CUDA */
    int32_t index;           /**< 0 for the CPU; the CUDA device ordinal */
} fp8amp_device;

/** How many devices of a type this process can use. CPU: always 1. CUDA: the number of visible
 *  GPUs; 0 (with FP8AMP_SUCCESS) when there is no GPU, no driver, or the library was built without
 *  CUDA -- fp8amp_context_create then says which.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL count, unknown type). */
FP8AMP_API fp8amp_status fp8amp_device_count(fp8amp_device_type type, int32_t *count);

/** @} */

/** @defgroup context Contexts
 *  A context: a device, a stream and an allocator.
 *  @{ */

/** Opaque handle of a context (checked on every call: docs/api.md 1.3). */
typedef struct fp8amp_context_s *fp8amp_context;

/** Creates a context on a device. A CUDA context starts on the default stream and with cudaMalloc.
 *  Ownership: the caller destroys it with fp8amp_context_destroy. Tensors made with a context keep
 *  what they need of it alive, so destroying a context before its tensors is safe.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL out, unknown device type, negative index, CPU index
 *  other than 0); DEVICE_MISMATCH (CUDA index >= fp8amp_device_count); NOT_SUPPORTED (CUDA asked
 *  for, but the library was built without CUDA, there is no usable GPU/driver, or this build has no
 *  kernel image for the GPU's compute capability: the message says which); CUDA (the CUDA runtime
 *  failed while probing the device, e.g. out of device memory or a driver error). */
FP8AMP_API fp8amp_status fp8amp_context_create(fp8amp_device device, fp8amp_context *out);

/** Destroys a context handle. Passing NULL is a no-op success.
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_destroy(fp8amp_context ctx);

/** The context's device. Statuses: SUCCESS; INVALID_ARGUMENT (NULL out); INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_device(fp8amp_context ctx, fp8amp_device *out);

/** Makes every later operation of this context run on a borrowed cudaStream_t (NULL = the legacy
 *  default stream), e.g. a framework's current stream. fp8amp never destroys it; the caller keeps
 *  it alive while the context uses it. Operations are asynchronous with respect to the host unless
 *  documented otherwise (host copies are synchronous). Memory the context reuses across calls (the
 *  GEMM workspace, the Linears' shared scratch) was used in the old stream's order, so the new stream
 *  is made to wait (on the GPU, not the host) for the work queued on the old one so far.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (a non-NULL stream on a CPU context); CUDA. */
FP8AMP_API fp8amp_status fp8amp_context_set_stream(fp8amp_context ctx, void *cuda_stream);

/** The stream set by fp8amp_context_set_stream (NULL for the default stream and on the CPU).
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL out); INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_get_stream(fp8amp_context ctx, void **cuda_stream);

/** Allocation hook: return nbytes of memory on `device`, aligned to at least 256 bytes, usable on
 *  `stream` (the context's stream), or NULL when it cannot. nbytes is 1..PTRDIFF_MAX (a larger
 *  request fails with OUT_OF_MEMORY before the hook is called). Must not call back into fp8amp. NULL
 *  makes the call that wanted memory fail with OUT_OF_MEMORY; a misaligned block is given back
 *  through the free hook at once and that call fails with INVALID_ARGUMENT. */
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

/** The bytes the context's scratch pool holds now: the memory its Linears share for what lives only
 *  within one forward or backward call (the FP8 copies of x and dY, staged outputs, ...; docs/linear.md
 *  section 5) and fp8amp_norm_backward's partial column sums. Each of its slots grows to the largest request any call made of it and is kept, so
 *  that the next call allocates nothing; it counts once per context, not once per Linear. The
 *  cuBLASLt workspace is not included. Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL bytes); INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_context_scratch_bytes(fp8amp_context ctx, size_t *bytes);

/** Gives the scratch pool's memory and the GEMM workspace back through the allocator that served
 *  them (at a step boundary, after a run with larger batches, or before a phase that needs the
 *  memory). Each block goes back in the order of the stream it was allocated on, with no host wait:
 *  work still queued there that uses it is ordered before its next use by a stream-ordered
 *  allocator (PyTorch's caching allocator; the CUDA backend's own cudaFree waits for the device).
 *  Only when a block was used on another stream since it was allocated (the context's stream
 *  changed) does the call wait for the device first: then not while a stream is being captured into
 *  a CUDA graph. (Before 2026-11-26 it always waited.) The next call that needs scratch allocates it
 *  again (a Linear's graph replay then sees new addresses, if the allocator gives other blocks, and
 *  captures anew, see docs/linear.md 6.1). Nothing else changes: saved forwards, weight caches and
 *  gradient sums are the Linears' own. Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE; CUDA (the wait reported an earlier asynchronous failure: the
 *  pool is then kept). */
FP8AMP_API fp8amp_status fp8amp_context_release_scratch(fp8amp_context ctx);

/** @} */

/** @defgroup tensor Tensors and DLPack
 *  Tensors: contiguous row-major arrays on the context's device; DLPack import and export.
 *  @{ */

/** Opaque handle of a tensor. */
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
 *  Statuses: SUCCESS; INVALID_HANDLE (ctx); INVALID_ARGUMENT (the shape/dtype errors of
 *  fp8amp_tensor_create, NULL out, NULL or misaligned data); DEVICE_MISMATCH (a CUDA context and a
 *  pointer that CUDA does not know as memory of that device; a CPU context does not ask CUDA, so it
 *  cannot tell device pointers from host pointers). */
FP8AMP_API fp8amp_status fp8amp_tensor_wrap(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim,
                                            const int64_t *shape, void *data, fp8amp_tensor *out);

/** Points a tensor made by fp8amp_tensor_wrap at other memory the caller owns, with a new shape of
 *  ndim extents (same dtype, same context): afterwards it is as if wrapped anew over (data, ndim,
 *  shape), so one handle can serve a new buffer at every call of a framework binding (the cost of a
 *  handle lookup and, on CUDA, one pointer query; no allocation on the device). Its write counter
 *  moves (a Linear or anything else that tracks the tensor's writes sees new contents). DLPack
 *  tensors exported from it earlier keep the memory they were exported with. The same thread rules
 *  as every tensor call: not while another call uses t.
 *  Statuses, in this order: SUCCESS; INVALID_HANDLE (t); INVALID_ARGUMENT (t was not made by
 *  fp8amp_tensor_wrap -- it owns or imported its memory, or is a library object's tensor such as a
 *  Linear's weight; t has ever been bound to a scaling meta, whose scale_inv belongs to the data it
 *  held; t is a parameter or gradient of a live optimizer, which keeps its address; the shape errors
 *  of fp8amp_tensor_create; NULL or misaligned data); DEVICE_MISMATCH (as fp8amp_tensor_wrap).
 *  On failure t is unchanged. */
FP8AMP_API fp8amp_status fp8amp_tensor_rebind(fp8amp_tensor t, void *data, int32_t ndim, const int64_t *shape);

/** Destroys a tensor handle (freeing its memory if it owns it and nothing else, such as an exported
 *  DLPack tensor, still refers to it). NULL is a no-op success. Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_tensor_destroy(fp8amp_tensor t);

/** The tensor's dtype. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_dtype(fp8amp_tensor t, fp8amp_dtype *out);
/** Its number of dimensions (0 for a scalar). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_ndim(fp8amp_tensor t, int32_t *out);
/** Copies the ndim extents into shape[0..ndim), writing nothing else.
 *  @param t        the tensor
 *  @param capacity entries shape has room for; at least ndim (a scalar: 0 will do)
 *  @param shape    receives the extents; may be NULL for a scalar
 *
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL shape with ndim > 0, capacity < ndim). */
FP8AMP_API fp8amp_status fp8amp_tensor_shape(fp8amp_tensor t, int32_t capacity, int64_t *shape);
/** Its number of elements (1 for a scalar). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_numel(fp8amp_tensor t, int64_t *out);
/** Its size in bytes. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_nbytes(fp8amp_tensor t, size_t *out);
/** The data pointer (device memory for a CUDA tensor). Borrowed: valid while the tensor lives.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_tensor_data(fp8amp_tensor t, void **out);
/** The device of the tensor's memory. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
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

/* DLPack >= 1.0 (versioned structs). Declared, not defined, here, so that this header does not
 * force a dlpack.h on a program that has its own: to fill or read them, include
 * <fp8amp/dlpack.h>, DLPack v1.1's header installed with this one (or any DLPack >= 1.1 header).
 * FP8 tensors use DLPack 1.1's kDLFloat8_e4m3fn (10) and kDLFloat8_e5m2 (12) type codes. */
struct DLManagedTensorVersioned;

/** Imports a DLPack tensor without copying. On success fp8amp takes ownership of `managed` and
 *  calls its deleter when the tensor is destroyed; on failure ownership stays with the caller and
 *  nothing was called. Accepted: DLPack major version 1; dtypes float32/float16/bfloat16/
 *  float8_e4m3fn/float8_e5m2 (lanes 1); at most FP8AMP_MAX_NDIM dimensions; compact row-major
 *  strides (or NULL strides); device kDLCPU or kDLCUDAHost for a CPU context (device_id not looked
 *  at), kDLCUDA or kDLCUDAManaged of the context's ordinal for a CUDA context. A read-only tensor
 *  (DLPACK_FLAG_BITMASK_READ_ONLY) is refused as the destination of any write.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL managed or out, NULL data, an extent
 *  < 1, misaligned data, a byte_offset or byte size that runs past the end of the address space);
 *  NOT_SUPPORTED (major version != 1, a dtype fp8amp does not have, lanes !=
 *  1, more than FP8AMP_MAX_NDIM dimensions, non-contiguous strides); DEVICE_MISMATCH. */
FP8AMP_API fp8amp_status fp8amp_tensor_from_dlpack(fp8amp_context ctx,
                                                   struct DLManagedTensorVersioned *managed,
                                                   fp8amp_tensor *out);

/** Exports a tensor as a DLPack 1.1 versioned managed tensor sharing its memory. The consumer owns
 *  the result and calls its deleter exactly once. Memory fp8amp owns (fp8amp_tensor_create, or an
 *  imported DLPack tensor) stays valid until then, even if the fp8amp tensor is destroyed first;
 *  memory of a wrapped tensor still belongs to whoever wrapped it. Statuses: SUCCESS;
 *  INVALID_HANDLE; INVALID_ARGUMENT (NULL out); OUT_OF_MEMORY. */
FP8AMP_API fp8amp_status fp8amp_tensor_to_dlpack(fp8amp_tensor t, struct DLManagedTensorVersioned **out);

/** @} */

/** @defgroup conversion Conversion
 *  The codec: element-wise conversion between dtypes, with scale 1.
 *  @{ */

/** dst = convert(src), element by element, with scale 1: the codec itself. Any dtype to any dtype of
 *  the same shape (equal dtypes copy bits). Rounding is to nearest, ties to even. Into E4M3/E5M2
 *  it saturates: finite values beyond the largest and +-inf become +-max. Into F16/BF16, IEEE
 *  behaviour (overflow gives inf). A NaN stays NaN and keeps its sign; its payload becomes the
 *  destination's canonical quiet NaN (E4M3 0x7F, E5M2 0x7E, F16 0x7E00, BF16 0x7FC0, F32
 *  0x7FC00000, with the sign bit set for a negative NaN). CPU and CUDA give bit-identical results. Asynchronous on CUDA (ordered on the context's stream).
 *  src and dst may be the same tensor (nothing to do); otherwise they must not overlap in memory.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (read-only dst, src and dst overlapping);
 *  SHAPE_MISMATCH; DEVICE_MISMATCH (a tensor not on the context's device); CUDA. */
FP8AMP_API fp8amp_status fp8amp_cast(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst);

/** @} */

/** @defgroup scaling Recipes and scaling metas
 *  How FP8 scales are chosen (the numerics: docs/numerics.md section 5).
 *  @{ */

/** Which FP8 dtype each role of a Linear gets. */
typedef enum fp8amp_format {
    FP8AMP_FORMAT_E4M3 = 0,  /**< E4M3 everywhere */
    FP8AMP_FORMAT_HYBRID = 1 /**< E4M3 for weights, activations, weight gradients; E5M2 for output gradients */
} fp8amp_format;

/** When a scale is computed. */
typedef enum fp8amp_scaling_mode {
    FP8AMP_SCALING_DELAYED = 0, /**< scale from the amax history of earlier steps (Transformer Engine's recipe) */
    FP8AMP_SCALING_CURRENT = 1  /**< scale from this tensor's own amax, computed in the same quantize call */
} fp8amp_scaling_mode;

/** Which amax of the history a delayed scale is computed from. */
typedef enum fp8amp_amax_algo {
    FP8AMP_AMAX_MAX = 0,        /**< the largest amax in the history window */
    FP8AMP_AMAX_MOST_RECENT = 1 /**< the newest amax only */
} fp8amp_amax_algo;

/** How FP8 scales are chosen. Initialize with fp8amp_recipe_init_default, then change fields.
 *  scale = fp8_max / 2^margin / amax, where amax is taken from the history by amax_algo; an amax
 *  of 0, inf or NaN keeps the previous scale; a scale that overflows float32 becomes FLT_MAX, one
 *  below FLT_MIN becomes FLT_MIN (so scale_inv stays finite); power_of_two_scales rounds the scale
 *  down to a power of two (so scaling is exact). `format` is not used by a scaling meta (which is
 *  created for one FP8 dtype): it tells an FP8 Linear which dtype each role gets. */
typedef struct fp8amp_recipe {
    uint32_t struct_size;          /**< sizeof(fp8amp_recipe), set by fp8amp_recipe_init_default */
    fp8amp_format format;          /**< default HYBRID */
    fp8amp_scaling_mode mode;      /**< default DELAYED */
    int32_t margin;                /**< default 0; 0..127 */
    int32_t interval;              /**< recompute the scale every `interval` updates; default 1; >= 1 */
    int32_t amax_history_len;      /**< default 1024; 1..FP8AMP_MAX_AMAX_HISTORY */
    fp8amp_amax_algo amax_algo;    /**< default MAX */
    int32_t power_of_two_scales;   /**< default 0 (false) */
} fp8amp_recipe;

/** Largest amax_history_len of a recipe. */
#define FP8AMP_MAX_AMAX_HISTORY 65536

/** Fills the caller's recipe of `size` bytes -- pass sizeof(fp8amp_recipe) -- with the defaults above
 *  (struct_size = size), writing exactly `size` bytes (docs/api.md 1.6: a size larger than this
 *  library's struct, from a newer header, gets zeros past the fields it knows). Since 0.2.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size that is neither this library's sizeof, nor a
 *  larger multiple of its alignment up to 4096). */
FP8AMP_API fp8amp_status fp8amp_recipe_init(fp8amp_recipe *recipe, size_t size);
/** Kept for binaries built against 0.1.0: writes its 32-byte fp8amp_recipe. Source code gets the
 *  macro, which passes the sizeof of the caller's header. */
FP8AMP_API fp8amp_status (fp8amp_recipe_init_default)(fp8amp_recipe *recipe);
/** Source code's spelling of the 0.1.0 init: fp8amp_recipe_init with this header's sizeof. */
#define fp8amp_recipe_init_default(recipe) fp8amp_recipe_init((recipe), sizeof(fp8amp_recipe))

/** Opaque handle of a scaling meta. */
typedef struct fp8amp_scaling_s *fp8amp_scaling;

/** Creates a scaling meta for tensors of one scaled dtype on the context's device: E4M3, E5M2 or F16
 *  (a scaled 16-bit format: format max 65504, quantize saturates like FP8; MS-AMP's "FP16 with a
 *  scaling factor" for weights and optimizer state). The meta holds scale and scale_inv (both 1
 *  at first), the amax recorded since the last update (0 at first), the amax history (zeros) and
 *  the diagnostic counters. All of it lives on the device; reading it is an
 *  explicit call (fp8amp_scaling_get and friends).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL recipe/out, struct_size too small,
 *  a field out of range: margin, interval, amax_history_len 0 or > FP8AMP_MAX_AMAX_HISTORY, an
 *  unknown enum value, fp8_dtype included); DTYPE_MISMATCH (fp8_dtype a dtype other than
 *  E4M3/E5M2/F16); OUT_OF_MEMORY; CUDA; NOT_SUPPORTED (a newer header's struct with a field this
 *  library lacks set: docs/api.md 1.6). */
FP8AMP_API fp8amp_status fp8amp_scaling_create(fp8amp_context ctx, const fp8amp_recipe *recipe,
                                               fp8amp_dtype fp8_dtype, fp8amp_scaling *out);

/** Destroys a meta handle; tensors bound to it keep it alive. NULL is a no-op success.
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_scaling_destroy(fp8amp_scaling s);

/** Delayed scaling: folds the amax recorded since the last update into the history (row 0 becomes
 *  it, the oldest row drops out), resets the recorded amax to 0, and, every `interval`-th update,
 *  computes the next scale and scale_inv from the history. Current scaling: folds the history only
 *  (the scale is computed by each quantize). Asynchronous on CUDA: one small kernel on the stream of
 *  the meta's context. Statuses: SUCCESS; INVALID_HANDLE; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_update(fp8amp_scaling s);

/** fp8amp_scaling_update for n metas of ctx's device, in one kernel launch (per 1024 metas) on ctx's
 *  stream: the per-step update of a whole model. Statuses: SUCCESS; INVALID_HANDLE (any entry:
 *  then none is updated); INVALID_ARGUMENT (n < 0, NULL metas with n > 0, a meta listed twice);
 *  DEVICE_MISMATCH; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_update_many(fp8amp_context ctx, int32_t n, const fp8amp_scaling *metas);

/** Reads a meta's state to the host. Synchronizes with the stream of the meta's context.
 *  @param s         the meta
 *  @param scale     receives the scale, or NULL
 *  @param scale_inv receives 1/scale (float32), or NULL
 *  @param amax      receives the amax recorded since the last update (current scaling: of the last
 *                   quantize), or NULL
 *
 *  Statuses: SUCCESS; INVALID_HANDLE; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_get(fp8amp_scaling s, float *scale, float *scale_inv, float *amax);

/** A new handle (the caller destroys it) to the amax a meta recorded since its last update, where
 *  it lives: a read-only F32 scalar tensor (ndim 0) sharing those 4 bytes of the meta's device
 *  memory, kept alive by the new handle (and by DLPack exports of it), also past
 *  fp8amp_scaling_destroy. Every later kernel that records an amax into the meta, and every update
 *  (which resets it to 0), shows through it in the stream's order; a NaN or an inf recorded reads as
 *  +inf. For reading it on the device without a host wait -- fp8amp.torch's GradScaler.unscale_
 *  tests an E4M3 weight gradient's meta for a non-finite amax so -- where fp8amp_scaling_get would
 *  synchronize. Writes through the handle are refused (INVALID_ARGUMENT). Since 0.4.0 (version node
 *  FP8AMP_0.4). Statuses: SUCCESS; INVALID_HANDLE (s); INVALID_ARGUMENT (NULL out); OUT_OF_MEMORY. */
FP8AMP_API fp8amp_status fp8amp_scaling_amax_tensor(fp8amp_scaling s, fp8amp_tensor *out);

/** Copies the amax history, newest first (history[0] is the amax folded by the last update), into
 *  history[0..len). Synchronizes. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL
 *  history, capacity < the recipe's amax_history_len); CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_get_history(fp8amp_scaling s, int32_t capacity, float *history);

/** Sets scale (and scale_inv = 1/scale), e.g. to start from a calibrated value. Statuses: SUCCESS;
 *  INVALID_HANDLE; INVALID_ARGUMENT (scale not a normal float > 0, i.e. outside [FLT_MIN, FLT_MAX]);
 *  CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_set_scale(fp8amp_scaling s, float scale);

/** Numerics diagnostics of the quantizations into tensors bound to a meta, counted since the last
 *  reset when enabled: elements whose scaled value exceeded the format's largest finite value (448,
 *  57344, or 65504 for F16) and saturated (inf included, NaN not), and nonzero elements that became
 *  zero (underflow). */
typedef struct fp8amp_scaling_stats {
    uint64_t quantized; /**< elements quantized while counting was on */
    uint64_t saturated;   /**< elements that saturated (beyond the format's largest finite value) */
    uint64_t underflowed; /**< nonzero elements that became zero */
} fp8amp_scaling_stats;

/** Turns counting on (nonzero) or off (0, the default) for later quantizations.
 *  Statuses: SUCCESS; INVALID_HANDLE; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_enable_stats(fp8amp_scaling s, int32_t enable);
/** Reads the counters (synchronizes). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL); CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_get_stats(fp8amp_scaling s, fp8amp_scaling_stats *stats);
/** Sets the counters to zero. Statuses: SUCCESS; INVALID_HANDLE; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_reset_stats(fp8amp_scaling s);

/** Binds an E4M3, E5M2 or F16 tensor to a scaling meta (of the same dtype and device): quantizing
 *  into it uses the meta's scale and records amax into the meta; the tensor keeps its own copy of the
 *  scale_inv it was quantized with, which dequantize uses. Binding sets that copy to the meta's
 *  current scale_inv. NULL unbinds. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (t is a
 *  live Linear's weight, bias or gradient: the Linear owns its binding); DTYPE_MISMATCH (tensor not
 *  E4M3/E5M2/F16, or of another dtype than the meta); DEVICE_MISMATCH; OUT_OF_MEMORY; CUDA. */
FP8AMP_API fp8amp_status fp8amp_tensor_set_scaling(fp8amp_tensor t, fp8amp_scaling s);

/** A new handle (the caller destroys it) to a bound (or once-bound) tensor's scale_inv copy: an F32
 *  scalar tensor (ndim 0) sharing those 4 bytes of the tensor's device, kept alive by the new handle
 *  (and by DLPack exports of it). Reading it gives the scale_inv the tensor's data was written with;
 *  writing it (a host copy, a DLPack view: e.g. restoring a checkpoint of codes and scale) changes
 *  the value the codes stand for in every later dequantize, Linear GEMM and optimizer step. A Linear
 *  does not see such writes by itself: call fp8amp_linear_weight_changed after writing its weight's.
 *  Statuses: SUCCESS; INVALID_HANDLE (t); INVALID_ARGUMENT (NULL out; t has no slot: it was never
 *  bound to a scaling meta). */
FP8AMP_API fp8amp_status fp8amp_tensor_scale_inv(fp8amp_tensor t, fp8amp_tensor *out);

/** @} */

/** @defgroup quantize Casting with scales
 *  Quantize, dequantize and amax with a scaling meta's scales.
 *  @{ */

/** dst = fp8_rne_satfinite(src * scale) in one pass, recording max|src| into dst's meta (NaN counts as
 *  inf, so the next update keeps the previous scale). src is F32, F16 or BF16 (its values as stored: a
 *  binding of src is not applied); dst is E4M3, E5M2 or F16, bound to a meta, of the same shape. Into
 *  a scaled F16 dst: round to nearest even, then saturate like FP8 (|y| > 65504 and inf give
 *  +-65504; NaN stays NaN). Delayed scaling uses the meta's scale; current scaling
 *  computes src's amax first and the scale from it, on the device (no host round trip). dst's
 *  scale_inv copy is set to the scale_inv used. Asynchronous on CUDA.
 *  Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (src not F32/F16/BF16, dst not E4M3/E5M2/F16);
 *  INVALID_ARGUMENT (dst has no meta, read-only dst, src and dst overlapping in memory);
 *  SHAPE_MISMATCH; DEVICE_MISMATCH (a tensor or the meta not on the context's device); CUDA. */
FP8AMP_API fp8amp_status fp8amp_quantize(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst);

/** fp8amp_quantize that also writes the transposed copy dst_t = transpose(dst), as the FP8 GEMMs of
 *  Hopper need for the backward pass. src is 2-D [rows, cols] (or N-D, read as [prod(leading), last]),
 *  dst has src's shape, dst_t is 2-D [cols, rows]; dst and dst_t are bound to the same meta. Any size.
 *  Statuses: as fp8amp_quantize; also DTYPE_MISMATCH when dst and dst_t differ in dtype, and
 *  INVALID_ARGUMENT when dst and dst_t are bound to different metas or any two of src, dst and
 *  dst_t overlap in memory. */
FP8AMP_API fp8amp_status fp8amp_quantize_transpose(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst,
                                                   fp8amp_tensor dst_t);

/** dst = decode(src) * scale_inv, with src's own scale_inv copy (see fp8amp_tensor_set_scaling);
 *  src is E4M3/E5M2/F16 bound to a meta, dst F32/F16/BF16 of the same shape. Asynchronous on CUDA.
 *  Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (src not E4M3/E5M2/F16, dst not F32/F16/BF16);
 *  INVALID_ARGUMENT (src has no meta, read-only dst, src and dst overlapping in memory);
 *  SHAPE_MISMATCH; DEVICE_MISMATCH; CUDA. */
FP8AMP_API fp8amp_status fp8amp_dequantize(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst);

/** *amax = max |t| over a tensor of any dtype (NaN counts as inf). Synchronous (returns to the host).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL amax); DEVICE_MISMATCH; OUT_OF_MEMORY
 *  (CUDA: the 4-byte result buffer could not be allocated); CUDA. */
FP8AMP_API fp8amp_status fp8amp_amax(fp8amp_context ctx, fp8amp_tensor t, float *amax);

/** @} */

/** @defgroup linear FP8 Linear
 *  y = x W^T + b on FP8 GEMMs (cuBLASLt on CUDA), with FP8 weight gradients (docs/linear.md).
 *  @{ */

/** Whether a Linear runs its GEMMs in FP8 or in BF16 (FP8 GEMMs lose to BF16 on small shapes). */
typedef enum fp8amp_gemm_policy {
    FP8AMP_GEMM_AUTO = 0,       /**< FP8 where it pays and the shape allows it, BF16 otherwise (see docs) */
    FP8AMP_GEMM_ALWAYS_FP8 = 1, /**< FP8 always; a shape or GPU FP8 GEMMs cannot take is NOT_SUPPORTED */
    FP8AMP_GEMM_NEVER_FP8 = 2   /**< BF16 GEMMs with FP32 accumulation (CUDA); F32 GEMMs on the CPU */
} fp8amp_gemm_policy;

/** Which GEMM a Linear's last forward chose (its backward uses the same). */
typedef enum fp8amp_gemm_kind {
    FP8AMP_GEMM_KIND_NONE = 0, /**< no forward yet */
    FP8AMP_GEMM_KIND_FP8 = 1,
    FP8AMP_GEMM_KIND_BF16 = 2, /**< CUDA: BF16 operands, FP32 accumulation */
    FP8AMP_GEMM_KIND_F32 = 3   /**< CPU with NEVER_FP8: F32 operands and accumulation */
} fp8amp_gemm_kind;

/** The scaling metas a Linear owns, by role. */
typedef enum fp8amp_linear_role {
    FP8AMP_ROLE_INPUT = 0,       /**< x, E4M3, the recipe's mode */
    FP8AMP_ROLE_WEIGHT = 1,      /**< the FP8 copy of W, E4M3, current scaling; for E4M3 weights, W's own meta
                                      (WEIGHT_STORAGE) */
    FP8AMP_ROLE_GRAD_OUTPUT = 2, /**< dY: E5M2 (HYBRID) or E4M3 (E4M3 recipe), the recipe's mode */
    FP8AMP_ROLE_WEIGHT_GRAD = 3, /**< the E4M3 weight gradient (wgrad_dtype E4M3): current scaling under a
                                      CURRENT recipe; under a DELAYED recipe delayed scaling that the
                                      Linear updates after every backward (the first fitted to its own
                                      amax), statistics on (docs/numerics.md 9.2) */
    FP8AMP_ROLE_WEIGHT_STORAGE = 4 /**< the meta the weight itself is bound to, delayed scaling: F16
                                        weights (scaled F16) and E4M3 weights (then also the WEIGHT meta) */
} fp8amp_linear_role;

/** A Linear layer's configuration. Initialize with fp8amp_linear_desc_init_default. */
typedef struct fp8amp_linear_desc {
    uint32_t struct_size;       /**< sizeof(fp8amp_linear_desc); the first layout's size (the struct
                                     without graph_replay) is accepted too, with graph_replay 1 */
    int64_t in_features;        /**< K, >= 1 */
    int64_t out_features;       /**< N, >= 1 */
    int32_t has_bias;           /**< default 1; the bias is F32 */
    fp8amp_dtype weight_dtype;  /**< F32, F16, BF16 (default) or E4M3 (O3); F16 (scaled F16) and E4M3
                                     weights are bound to a meta (role WEIGHT_STORAGE) */
    fp8amp_dtype wgrad_dtype;   /**< E4M3 (O1, default), F32 or BF16 */
    fp8amp_recipe recipe;       /**< default: fp8amp_recipe_init_default. Embedded by value, so
                                     fp8amp_recipe never grows within FP8AMP_0 (docs/api.md 1.6) and
                                     this copy's struct_size must be sizeof(fp8amp_recipe) */
    fp8amp_gemm_policy policy;  /**< default AUTO */
    int32_t graph_replay;       /**< CUDA: 1 (default) replays a call whose launches repeat an earlier
                                     call's (same memory, shapes, dtypes, settings) as one CUDA graph
                                     launch; 0 launches every kernel each call (docs/linear.md 6) */
} fp8amp_linear_desc;

/** Fills the caller's descriptor of `size` bytes -- pass sizeof(fp8amp_linear_desc) -- with the
 *  defaults above and in_features = out_features = 0 (set them), writing exactly `size` bytes
 *  (struct_size = size; the first layout's size, 72, is accepted too). Since 0.2.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_linear_desc_init(fp8amp_linear_desc *desc, size_t size);
/** Kept for binaries built against 0.1.0: writes its 80-byte fp8amp_linear_desc. */
FP8AMP_API fp8amp_status (fp8amp_linear_desc_init_default)(fp8amp_linear_desc *desc);
/** Source code's spelling of the 0.1.0 init: fp8amp_linear_desc_init with this header's sizeof. */
#define fp8amp_linear_desc_init_default(desc) fp8amp_linear_desc_init((desc), sizeof(fp8amp_linear_desc))

/** Opaque handle of an FP8 Linear. */
typedef struct fp8amp_linear_s *fp8amp_linear;

/** Creates a Linear on the context's device: weight [out, in] (zeros: fill it), bias [out] (F32,
 *  zeros), gradient tensors (zeros) and the role metas. Allocates nothing else until the first call.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL desc/out, struct_size neither this
 *  struct's nor its first layout's,
 *  features < 1, a bad recipe, an unknown policy, graph_replay not 0 or 1, a weight_dtype or
 *  wgrad_dtype that is no fp8amp_dtype); DTYPE_MISMATCH (weight_dtype or wgrad_dtype a dtype not
 *  allowed); OUT_OF_MEMORY; CUDA; NOT_SUPPORTED (as fp8amp_scaling_create). */
FP8AMP_API fp8amp_status fp8amp_linear_create(fp8amp_context ctx, const fp8amp_linear_desc *desc,
                                              fp8amp_linear *out);

/** Destroys a Linear handle. Tensor and meta handles obtained from it stay valid (they share the
 *  objects). NULL is a no-op success. */
FP8AMP_API fp8amp_status fp8amp_linear_destroy(fp8amp_linear lin);

/** New handles to the Linear's parameter and gradient tensors (the caller destroys each handle;
 *  the tensor lives on while the Linear or a handle holds it): weight [out, in] of weight_dtype;
 *  bias [out] F32 (INVALID_ARGUMENT without has_bias); weight_grad [out, in] of wgrad_dtype (E4M3:
 *  bound to the WEIGHT_GRAD meta); bias_grad [out] F32. Write the weight through these handles
 *  (fp8amp_tensor_copy_from_host, fp8amp_cast, fp8amp_quantize, the optimizer): the Linear notices
 *  and re-quantizes its FP8 copy on the next forward. Memory written any other way (a DLPack
 *  producer, a raw pointer) needs fp8amp_linear_weight_changed. While the Linear lives these
 *  tensors are its own: fp8amp_tensor_set_scaling (unbinding, binding elsewhere, re-binding) and
 *  fp8amp_tensor_rebind on them are refused (INVALID_ARGUMENT, the message names the Linear); once
 *  the Linear is destroyed, handles still held are ordinary tensors.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out; bias without has_bias). */
FP8AMP_API fp8amp_status fp8amp_linear_weight(fp8amp_linear lin, fp8amp_tensor *out);
/** A new handle to the bias, [out] F32 (see fp8amp_linear_weight).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out; no bias: has_bias 0). */
FP8AMP_API fp8amp_status fp8amp_linear_bias(fp8amp_linear lin, fp8amp_tensor *out);
/** A new handle to the weight gradient, [out, in] of wgrad_dtype (E4M3: bound to the WEIGHT_GRAD meta;
 *  see fp8amp_linear_weight). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_linear_weight_grad(fp8amp_linear lin, fp8amp_tensor *out);
/** A new handle to the bias gradient, [out] F32 (see fp8amp_linear_weight).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_linear_bias_grad(fp8amp_linear lin, fp8amp_tensor *out);

/** A new handle to one of the Linear's scaling metas (the caller destroys it). Delayed-scaling metas
 *  (INPUT and GRAD_OUTPUT under a DELAYED recipe) need fp8amp_scaling_update (or _update_many over
 *  all the model's metas) once per step, as for any meta. Statuses: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL out, unknown role, WEIGHT_GRAD when wgrad_dtype is not E4M3,
 *  WEIGHT_STORAGE when the weight is F32 or BF16). */
FP8AMP_API fp8amp_status fp8amp_linear_scaling(fp8amp_linear lin, fp8amp_linear_role role, fp8amp_scaling *out);

/** Tells the Linear that its weight or bias was written behind its back (see fp8amp_linear_weight):
 *  the next forward re-makes its copies of them (FP8, BF16, the bias in the epilogue's dtype).
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_linear_weight_changed(fp8amp_linear lin);

/** y = x W^T + b. x is [..., in] (leading dims flattened to M rows), y is [..., out] with the same
 *  leading dims; x and y are F32, F16 or BF16 (they may differ), on the Linear's device. FP8 path:
 *  x is quantized to E4M3 with the INPUT meta, the weight's E4M3 copy (and its transpose when
 *  training) is made from the weight when it has changed since the last forward, and the GEMM
 *  accumulates in FP32 (fast accumulation on CUDA) with the bias added in the epilogue (the bias is
 *  rounded to BF16 for F32/BF16 outputs and to F16 for F16 outputs first, on both backends). With
 *  training nonzero, x is kept for backward in FP8 (its transposed E4M3 copy: 1 byte per element).
 *  Asynchronous on CUDA (the Linear's context's stream).
 *  Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (x or y FP8); SHAPE_MISMATCH (x's last dim !=
 *  in, y's shape != x's leading dims + [out]); DEVICE_MISMATCH; INVALID_ARGUMENT (read-only y, x and
 *  y overlapping, y overlapping the Linear's weight or bias); NOT_SUPPORTED (ALWAYS_FP8 with a
 *  shape or GPU FP8 GEMMs cannot take: the message says which); OUT_OF_MEMORY; CUBLAS; CUDA. */
FP8AMP_API fp8amp_status fp8amp_linear_forward(fp8amp_linear lin, fp8amp_tensor x, fp8amp_tensor y,
                                               int32_t training);

/** The GEMM a forward of `rows` rows (x's leading dims' product) of a wide input would run now: the
 *  policy's choice for this shape and device (FP8, or the wide kind: BF16 on CUDA, F32 on the CPU).
 *  A fused front asks it before letting a norm or activation write the Linear's FP8 input
 *  (fp8amp_linear_forward_fp8), so that AUTO keeps its wide GEMMs where FP8 does not pay.
 *  Since 0.4.0. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out, rows < 1);
 *  NOT_SUPPORTED (ALWAYS_FP8 with a shape or GPU FP8 GEMMs cannot take, as the forward would say). */
FP8AMP_API fp8amp_status fp8amp_linear_choose_gemm(fp8amp_linear lin, int64_t rows, int32_t training,
                                                   fp8amp_gemm_kind *out);

/** y = x W^T + b from an input the caller quantized: x8 is E4M3 [..., in] with a scale_inv (bound to
 *  a scaling meta when it was written), typically written by fp8amp_norm_forward or
 *  fp8amp_activation_forward into a tensor bound to this Linear's INPUT meta (fp8amp_linear_scaling),
 *  so that the norm or activation kernel writes the GEMM's operand itself and no wide copy of it is
 *  written and read again. The GEMM reads x8 with x8's scale_inv; the rest is fp8amp_linear_forward's
 *  FP8 path: y F32, F16 or BF16, the bias in the epilogue. With training nonzero the Linear keeps its
 *  own transposed copy of x8 (a byte transpose) and x8's scale_inv, so the backward (the same
 *  fp8amp_linear_backward, dx in a wide dtype with x8's shape) reads nothing of the caller's, which may
 *  be overwritten or freed after this call. Every output is bit-identical to fp8amp_linear_forward of
 *  a wide x whose quantize with the same meta gives x8's bytes and scale_inv. The policy AUTO runs the
 *  FP8 GEMM here at any shape it can take (the input is FP8 already; fp8amp_linear_choose_gemm says
 *  where AUTO would run a wide GEMM for a wide input). Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (x8 not E4M3, y FP8); SHAPE_MISMATCH (as
 *  fp8amp_linear_forward); DEVICE_MISMATCH; INVALID_ARGUMENT (x8 never bound to a meta: no scale_inv;
 *  the policy NEVER_FP8; read-only y; x8 and y overlapping; y overlapping the Linear's weight or bias);
 *  NOT_SUPPORTED (a shape or GPU FP8 GEMMs cannot take: the message says which); OUT_OF_MEMORY;
 *  CUBLAS; CUDA. */
FP8AMP_API fp8amp_status fp8amp_linear_forward_fp8(fp8amp_linear lin, fp8amp_tensor x8, fp8amp_tensor y,
                                                   int32_t training);

/** Backward of the last training forward. dy has y's shape (F32, F16 or BF16). Writes dx (x's shape,
 *  F32/F16/BF16; NULL skips the input gradient), the weight gradient and the bias gradient:
 *  accumulate_wgrad = 0 overwrites them, nonzero adds to them (micro-batches). Accumulation runs in
 *  FP32 (an FP32 buffer the Linear keeps for E4M3 and BF16 weight gradients), and the delivered
 *  weight_grad tensor is re-made from that sum after every backward, so no precision is lost between
 *  micro-batches. dY is quantized to GRAD_OUTPUT's dtype; dX = dY W and dW = dY^T X run in FP8 with
 *  FP32 (split) accumulation; the bias gradient is summed in FP32 from dy itself.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (no training forward since the last backward
 *  or since creation; read-only dx; dy and dx overlapping; dx overlapping the Linear's weight or
 *  gradients; dy overlapping its gradients); DTYPE_MISMATCH; SHAPE_MISMATCH (dy or dx not matching
 *  the forward's y and x); DEVICE_MISMATCH; OUT_OF_MEMORY; CUBLAS; CUDA. A failed backward keeps the
 *  saved forward (retry it); so does a failed forward: a backward after it backs the earlier
 *  training forward (docs/linear.md section 2). */
FP8AMP_API fp8amp_status fp8amp_linear_backward(fp8amp_linear lin, fp8amp_tensor dy, fp8amp_tensor dx,
                                                int32_t accumulate_wgrad);

/** Gives back the memory the Linear keeps between calls beyond its parameters and gradients, for a
 *  step boundary (after the optimizer read the gradients; docs/linear.md section 5): the FP8 and
 *  16-bit copies of the weight and bias (the next forward re-makes them), the saved input of a
 *  training forward whose backward ran, and the FP32 weight-gradient sum. A training forward still
 *  awaiting its backward keeps what that backward reads. After it, a backward with
 *  accumulate_wgrad nonzero adds to the value of the delivered weight gradient (E4M3 dequantized,
 *  BF16 widened) instead of the given-back sum: one rounding more than accumulating without the
 *  release (the delivered gradient is rounded once more). Blocks go back to the context's allocator
 *  in its stream's order, with no wait (the CUDA backend's own allocator's cudaFree does wait for the
 *  device; so does this call when the context's stream changed since the Linear last allocated).
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_linear_release_buffers(fp8amp_linear lin);

/** Lean buffers: what the Linear needs only within one call or one forward-backward pair is not kept
 *  beyond it, which lowers the training peak (docs/linear.md section 5). lean = 0 (the default):
 *  off, as before. lean = 1: a training forward makes the FP8 weight its GEMM reads in the context's
 *  scratch pool (shared by all Linears) and keeps no transposed copy; the backward re-makes W8^T
 *  from the weight in the scratch pool (one quantize of the weight, the same bits: the weight meta
 *  is current scaling) and, once it ran, gives back the saved input and the weight copies. Every
 *  output is bit-identical to lean = 0. Because the backward reads the weight again, a backward that
 *  computes dx after the weight was written since its training forward (through a tensor handle,
 *  or fp8amp_linear_weight_changed) is refused with INVALID_ARGUMENT and changes nothing (run the
 *  forward again). lean = 2: also, a backward with accumulate_wgrad = 0 sums the weight gradient in
 *  the scratch pool and keeps no FP32 sum (4 bytes per parameter less from each backward to the
 *  step), so a later backward with accumulate_wgrad nonzero adds to the value of the delivered
 *  gradient (as after fp8amp_linear_release_buffers: one rounding more; the sum it makes is kept
 *  for the backwards after it) -- the only bits that differ. The memory goes back in the stream's
 *  order with no host wait on an allocator hook (a caching allocator such as PyTorch's); the CUDA
 *  backend's own allocator (cudaFree) waits for the device at each of them: use lean with hooks.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (lean not 0, 1 or 2). Since 0.4.0. */
FP8AMP_API fp8amp_status fp8amp_linear_set_lean(fp8amp_linear lin, int32_t lean);
/** The Linear's lean level (fp8amp_linear_set_lean). Statuses: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL out). Since 0.4.0. */
FP8AMP_API fp8amp_status fp8amp_linear_get_lean(fp8amp_linear lin, int32_t *out);

/** The bytes of the context's memory the Linear's own tensors hold now: its parameters and gradients
 *  and the buffers it keeps between calls (docs/linear.md section 5); not the context's shared
 *  scratch (fp8amp_context_scratch_bytes), nor host memory of the CPU kernels' scratch.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out). */
FP8AMP_API fp8amp_status fp8amp_linear_memory_bytes(fp8amp_linear lin, size_t *out);

/** Which GEMM the last forward ran (FP8AMP_GEMM_KIND_NONE before any). Statuses: SUCCESS;
 *  INVALID_HANDLE; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_linear_gemm_kind(fp8amp_linear lin, fp8amp_gemm_kind *out);

/** How many of this Linear's forward and backward calls so far ran as one CUDA graph launch
 *  (desc.graph_replay; always 0 on the CPU). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_linear_graph_replays(fp8amp_linear lin, uint64_t *out);

/** @} */

/** @defgroup optimizer Optimizer, loss scaler, checkpoints
 *  Adam / AdamW with low-precision state (O1/O2/O3), dynamic loss scaling, checkpoints (guide: docs/api.md section 12; numerics: docs/numerics.md section 6).
 *  @{ */

/** Opaque handle of an optimizer. */
typedef struct fp8amp_optimizer_s *fp8amp_optimizer;
/** Opaque handle of a dynamic loss scaler. */
typedef struct fp8amp_grad_scaler_s *fp8amp_grad_scaler;

/** Optimization levels (MS-AMP's meaning; docs/design.md). */
typedef enum fp8amp_opt_level {
    FP8AMP_OPT_LEVEL_O1 = 1, /**< Adam m and v in F32 */
    FP8AMP_OPT_LEVEL_O2 = 2, /**< m in E4M3, v in F16, each with per-block power-of-two scales */
    FP8AMP_OPT_LEVEL_O3 = 3  /**< O2, plus an F16 master copy of the (E4M3) weights, block-scaled */
} fp8amp_opt_level;

/** master_dtype value: no master copy (O1, O2). */
#define FP8AMP_NO_MASTER (-1)
/** Largest state_block_size. */
#define FP8AMP_MAX_STATE_BLOCK 8192

/** Adam/AdamW configuration. Initialize with fp8amp_adam_desc_init_default (or
 *  fp8amp_opt_level_adam_config), then change fields. The math is torch.optim.Adam / AdamW's
 *  (amsgrad=False): bias corrections 1 - beta^step, denom = sqrt(v) / sqrt(1 - beta2^step) + eps,
 *  param -= lr / (1 - beta1^step) * m / denom; AdamW decays first (param *= 1 - lr * weight_decay),
 *  Adam adds weight_decay * param to the gradient. */
typedef struct fp8amp_adam_desc {
    uint32_t struct_size;         /**< sizeof(fp8amp_adam_desc), set by the init functions */
    int32_t adamw;                /**< 1: AdamW (decoupled decay), 0: Adam (L2 in the gradient); default 1 */
    float lr;                     /**< default 1e-3; >= 0, finite; a step may override it */
    float beta1;                  /**< default 0.9; in [0, 1) */
    float beta2;                  /**< default 0.999; in [0, 1) */
    float eps;                    /**< default 1e-8; >= 0, finite */
    float weight_decay;           /**< default 0.01 (AdamW's); >= 0, finite */
    int32_t maximize;             /**< default 0 */
    fp8amp_dtype exp_avg_dtype;   /**< m: F32 (default) or E4M3 */
    fp8amp_dtype exp_avg_sq_dtype;/**< v: F32 (default) or F16 */
    int32_t master_dtype;         /**< FP8AMP_NO_MASTER (default) or FP8AMP_DTYPE_F16 (O3) */
    int32_t state_block_size;     /**< elements per state scale: a power of two in
                                       128..FP8AMP_MAX_STATE_BLOCK (default 128), or 0 for one scale
                                       per tensor (costs an extra read pass over the state) */
    float max_grad_norm;          /**< global L2 gradient-norm clipping; 0 (default) = off; >= 0 */
    int32_t master_rounding;      /**< how each step rounds the value of record: the F16 master copies,
                                       and a BF16 or F16 parameter that has none: an
                                       fp8amp_master_rounding, FP8AMP_MASTER_ROUND_NEAREST (0, default)
                                       or FP8AMP_MASTER_ROUND_STOCHASTIC (docs/numerics.md 6.3). Since 0.4.0 */
    uint32_t rounding_seed;       /**< the seed of stochastic rounding (default 0): with the step count,
                                       the parameter's index and the element's index it decides every
                                       rounding, so runs with one seed give identical bytes on CPU and
                                       CUDA. Since 0.4.0 */
} fp8amp_adam_desc;

/** fp8amp_adam_desc.master_rounding: how a step writes an F16 master copy, and a BF16 or
 *  F16 parameter without one (it is then its own value of record; E4M3 parameters always have one
 *  or round to nearest) (docs/numerics.md 6.3). Since 0.4.0. */
typedef enum fp8amp_master_rounding {
    /** round to nearest even (0.3.0's bytes): an update smaller than half an ulp of the master
     *  (F16: 2^-11 relative; a BF16 parameter without a master: 2^-8) is lost, every step */
    FP8AMP_MASTER_ROUND_NEAREST = 0,
    /** stochastic rounding: up with the probability of the distance to the lower F16 (BF16)
     *  neighbour over the ulp, from a counter-based hash of (rounding_seed, step, parameter index, element index);
     *  unbiased, so small updates survive in expectation. No extra memory. */
    FP8AMP_MASTER_ROUND_STOCHASTIC = 1
} fp8amp_master_rounding;

/** Fills the caller's descriptor of `size` bytes -- pass sizeof(fp8amp_adam_desc) -- with the
 *  defaults above (O1 AdamW), writing exactly `size` bytes (struct_size = size). Since 0.2.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_adam_desc_init(fp8amp_adam_desc *desc, size_t size);
/** Kept for binaries built against 0.1.0: writes its 52-byte fp8amp_adam_desc. */
FP8AMP_API fp8amp_status (fp8amp_adam_desc_init_default)(fp8amp_adam_desc *desc);
/** Source code's spelling of the 0.1.0 init: fp8amp_adam_desc_init with this header's sizeof. */
#define fp8amp_adam_desc_init_default(desc) fp8amp_adam_desc_init((desc), sizeof(fp8amp_adam_desc))

/** Fills the caller's descriptor of `size` bytes (as fp8amp_adam_desc_init) with the defaults, then
 *  the state dtypes of `level`: O1 (F32 m, F32 v), O2 (E4M3 m, F16 v), O3 (E4M3 m, F16 v, F16
 *  master). Since 0.2.0. Statuses: SUCCESS; INVALID_ARGUMENT (NULL desc, unknown level, a bad size). */
FP8AMP_API fp8amp_status fp8amp_opt_level_adam_init(fp8amp_opt_level level, fp8amp_adam_desc *desc, size_t size);
/** Kept for binaries built against 0.1.0 (writes 52 bytes); source code gets the macro. */
FP8AMP_API fp8amp_status (fp8amp_opt_level_adam_config)(fp8amp_opt_level level, fp8amp_adam_desc *desc);
/** Source code's spelling of the 0.1.0 preset: fp8amp_opt_level_adam_init with this header's sizeof. */
#define fp8amp_opt_level_adam_config(level, desc) \
    fp8amp_opt_level_adam_init((level), (desc), sizeof(fp8amp_adam_desc))

/** Creates an optimizer on ctx's device (its steps run on ctx's stream). It holds no parameters yet.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL desc/out, struct_size too small, a
 *  field out of range: lr, betas, eps, weight_decay, max_grad_norm negative, non-finite or beta
 *  >= 1; state_block_size not 0 nor a power of two in 128..FP8AMP_MAX_STATE_BLOCK; master_dtype
 *  not FP8AMP_NO_MASTER or F16; master_rounding not an fp8amp_master_rounding; exp_avg_dtype or exp_avg_sq_dtype no fp8amp_dtype); DTYPE_MISMATCH
 *  (exp_avg_dtype a dtype other than F32/E4M3, exp_avg_sq_dtype other than F32/F16); OUT_OF_MEMORY;
 *  CUDA; NOT_SUPPORTED (as fp8amp_scaling_create). */
FP8AMP_API fp8amp_status fp8amp_optimizer_create(fp8amp_context ctx, const fp8amp_adam_desc *desc,
                                                 fp8amp_optimizer *out);

/** Destroys an optimizer (its state; the parameter and gradient tensors stay the caller's).
 *  NULL is a no-op success. Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_optimizer_destroy(fp8amp_optimizer opt);

/** Registers a parameter and its gradient (both kept alive by the optimizer) and allocates its state
 *  (zeros; an O3 master copy is initialized from the parameter's current value, synchronously).
 *  param: F32, BF16, F16 (unscaled, or scaled: bound to an F16 meta) or E4M3 bound to a meta;
 *  a scaled parameter's value is code * the tensor's scale_inv, and its meta must use delayed
 *  scaling (a Linear's WEIGHT_STORAGE meta does). The optimizer owns a bound parameter's meta from
 *  now on: each step writes the parameter with the meta's scale
 *  and records its amax, then folds the meta (delayed scaling: the new scale applies next step).
 *  It keeps the metas param and grad are bound to now alive (destroying their handles is safe); a
 *  tensor unbound or re-bound to another meta later makes step (param or grad), save and load
 *  (param) fail with INVALID_ARGUMENT until it is bound back to the same meta.
 *  grad: F32, F16, BF16, or E4M3/E5M2 (value = code * its scale_inv; likewise a scaled F16
 *  gradient, bound to a meta); same shape as param. Every parameter must be added before the first step.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (param added twice or overlapping a
 *  registered parameter or gradient, grad overlapping a registered parameter, param read-only, param
 *  and grad overlapping, E4M3 param without a meta, a param meta with current scaling or already
 *  another parameter's, a parameter added after the first step, O3: a parameter element not finite); SHAPE_MISMATCH (grad's shape differs); DTYPE_MISMATCH (param E5M2;
 *  F32 param with an F16 master); DEVICE_MISMATCH (param, grad or a meta not on the optimizer's device);
 *  OUT_OF_MEMORY; CUDA. Each step marks the parameters written (a Linear then re-quantizes them). */
FP8AMP_API fp8amp_status fp8amp_optimizer_add_param(fp8amp_optimizer opt, fp8amp_tensor param, fp8amp_tensor grad);

/** fp8amp_param_desc.master_dtype value: the optimizer desc's master_dtype. Since 0.4.0. */
#define FP8AMP_MASTER_DEFAULT (-2)

/** Per-parameter options of fp8amp_optimizer_add_param_ex. Initialize with fp8amp_param_desc_init.
 *  Since 0.4.0. */
typedef struct fp8amp_param_desc {
    uint32_t struct_size;  /**< sizeof(fp8amp_param_desc), set by fp8amp_param_desc_init */
    int32_t master_dtype;  /**< FP8AMP_MASTER_DEFAULT (default: the optimizer desc's master_dtype),
                                FP8AMP_NO_MASTER or FP8AMP_DTYPE_F16 (an F16 master copy: for BF16,
                                F16 and E4M3 parameters, not F32 ones) */
    /** NULL (default): the master copy starts from the parameter's own value. Otherwise the value it
     *  starts from: a tensor of the parameter's shape, F32, BF16 or F16, on the optimizer's device,
     *  finite -- typically the full-precision weights the E4M3 parameter was quantized from, which
     *  the E4M3 value has rounded to 3 mantissa bits (starting O3 from them costs accuracy:
     *  docs/numerics.md 6.3). Only for a parameter that gets a master copy; read once, by
     *  add_param_ex (not kept); the parameter itself is not written. Since 0.4.0, in the struct's
     *  second layout (16 bytes; the first, 8 bytes, has no such field and means NULL). */
    fp8amp_tensor master_init;
} fp8amp_param_desc;

/** Fills the caller's descriptor of `size` bytes -- pass sizeof(fp8amp_param_desc) -- with the
 *  defaults (master_dtype FP8AMP_MASTER_DEFAULT), writing exactly `size` bytes. Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_param_desc_init(fp8amp_param_desc *desc, size_t size);

/** fp8amp_optimizer_add_param with per-parameter options (desc may be NULL: the defaults, which is
 *  fp8amp_optimizer_add_param). An optimizer may hold parameters with an F16 master copy beside
 *  parameters without one (e.g. O3's E4M3 weights beside BF16 ones): every step is still one launch
 *  over all of them, and max_grad_norm clips by the norm of all gradients together. Since 0.4.0.
 *  Statuses: those of fp8amp_optimizer_add_param, and INVALID_ARGUMENT (desc->struct_size too small;
 *  desc->master_dtype not FP8AMP_MASTER_DEFAULT, FP8AMP_NO_MASTER or FP8AMP_DTYPE_F16);
 *  DTYPE_MISMATCH (an F16 master asked, explicitly or by default, for an F32 parameter; an E4M3
 *  parameter with master_dtype FP8AMP_NO_MASTER given explicitly: its updates below half an E4M3 ulp,
 *  2^-4 relative, would vanish; a master_init that is not F32, BF16 or F16); master_init:
 *  INVALID_HANDLE (not a live tensor), INVALID_ARGUMENT (given for a parameter without a master copy;
 *  an element not finite), SHAPE_MISMATCH (not the parameter's shape), DEVICE_MISMATCH (not on the
 *  optimizer's device). */
FP8AMP_API fp8amp_status fp8amp_optimizer_add_param_ex(fp8amp_optimizer opt, fp8amp_tensor param, fp8amp_tensor grad,
                                                       const fp8amp_param_desc *desc);

/** Per-step arguments. Initialize with fp8amp_adam_step_args_init_default. */
typedef struct fp8amp_adam_step_args {
    uint32_t struct_size;   /**< sizeof(fp8amp_adam_step_args) */
    float lr;               /**< this step's learning rate; finite; negative (the default) = the desc's lr */
    const float *lr_device; /**< optional: a float in the optimizer device's memory read by the step
                                 itself (for a schedule inside a captured CUDA graph); overrides lr.
                                 Its value is not checked (the host never sees it): keep it finite, >= 0 */
    float grad_scale_inv;   /**< every gradient is multiplied by this (e.g. 1/world_size); default 1;
                                 finite and >= 0 (ascent is desc.maximize's) */
    fp8amp_grad_scaler scaler; /**< optional: gradients are also divided by the scaler's loss scale
                                    (read on the device) and the scaler is updated from this step's
                                    found_inf on the device, in the same launch */
} fp8amp_adam_step_args;

/** Fills the caller's args of `size` bytes -- pass sizeof(fp8amp_adam_step_args) -- with the
 *  defaults, writing exactly `size` bytes (struct_size = size): lr -1 (use desc.lr), lr_device NULL,
 *  grad_scale_inv 1, scaler NULL. Since 0.2.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_adam_step_args_init(fp8amp_adam_step_args *args, size_t size);
/** Kept for binaries built against 0.1.0: writes its 32-byte fp8amp_adam_step_args. */
FP8AMP_API fp8amp_status (fp8amp_adam_step_args_init_default)(fp8amp_adam_step_args *args);
/** Source code's spelling of the 0.1.0 init: fp8amp_adam_step_args_init with this header's sizeof. */
#define fp8amp_adam_step_args_init_default(args) fp8amp_adam_step_args_init((args), sizeof(fp8amp_adam_step_args))

/** One Adam/AdamW step over every parameter: one kernel launch on CUDA, no allocation and no host
 *  synchronization (capturable in a CUDA graph). It first checks every gradient for inf/NaN (after
 *  unscaling; for FP8 gradients also NaN/inf codes and an inf amax recorded in the gradient's meta)
 *  and computes the global gradient norm; if any gradient is not finite it changes nothing --
 *  parameters, states, scales, metas and the step count stay bit-identical -- and records found_inf.
 *  Otherwise it clips (max_grad_norm), updates, and advances the step count. found_inf, the step
 *  count and the norm live on the device: read them with the getters below. args may be NULL (the
 *  defaults). Statuses: SUCCESS; INVALID_HANDLE (opt, args->scaler); INVALID_ARGUMENT (struct_size
 *  too small; lr not finite, -inf included; grad_scale_inv negative or not finite; a parameter's or
 *  gradient's meta re-bound since add_param); DEVICE_MISMATCH (a scaler of another device);
 *  CUDA; NOT_SUPPORTED (as fp8amp_scaling_create). A step with no parameters records found_inf 0
 *  and advances the step count. */
FP8AMP_API fp8amp_status fp8amp_optimizer_step(fp8amp_optimizer opt, const fp8amp_adam_step_args *args);

/* Synchronizing getters of the device-side results of the last step. Each: SUCCESS; INVALID_HANDLE;
 * INVALID_ARGUMENT (NULL out); CUDA. */
/** found_inf of the last step: 1 if it was skipped (a gradient not finite), else 0. Synchronizes.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_get_found_inf(fp8amp_optimizer opt, int32_t *found_inf);
/** The number of steps taken (skipped ones not counted). Synchronizes.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_get_step(fp8amp_optimizer opt, int64_t *step);
/** The global L2 norm of the last step's unscaled gradients before clipping (inf/NaN when found_inf).
 *  Synchronizes. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_get_grad_norm(fp8amp_optimizer opt, float *norm);

/** Number of registered parameters. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT. */
FP8AMP_API fp8amp_status fp8amp_optimizer_num_params(fp8amp_optimizer opt, int32_t *count);

/** Bytes of device (CPU backend: host) memory the optimizer holds: m, v, the master copy, their
 *  per-block scales, and its bookkeeping (parameter list, per-step scratch). Parameters and gradients
 *  are the caller's and not counted. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_optimizer_state_bytes(fp8amp_optimizer opt, size_t *bytes);

/** Serializes the optimizer (hyperparameters, step count, and per parameter: its shape and dtype,
 *  its data and scale_inv, its meta's full state with the amax history, m, v, the master copy and
 *  every block scale) into the versioned, little-endian, CRC-32-checked format of docs/api.md
 *  section 12.6: format version 1 (0.3.0's bytes) when every parameter has the desc's master choice
 *  and master_rounding is NEAREST, else version 2, which also records the rounding, its seed and
 *  each parameter's master choice. Synchronizes (reads device memory).
 *  @param opt      the optimizer
 *  @param buffer   where to write the checkpoint; NULL asks for its size only
 *  @param capacity bytes at buffer: at least the checkpoint's size (ignored when buffer is NULL)
 *  @param size     receives the checkpoint's size (buffer NULL) or the bytes written
 *
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL size, capacity too small, a parameter's
 *  meta re-bound since add_param); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_save(fp8amp_optimizer opt, void *buffer, size_t capacity, size_t *size);

/** Restores what fp8amp_optimizer_save wrote into an optimizer with the same state dtypes, block
 *  size and parameters (count, order, shapes, dtypes, master choices), on any device (a CPU
 *  checkpoint loads into a CUDA optimizer and back). Hyperparameters (lr, betas, eps, weight decay,
 *  maximize, adamw, max_grad_norm; from version 2 also master_rounding and rounding_seed) are taken
 *  from the checkpoint (a version 1 checkpoint leaves the optimizer's rounding as it is). Everything is validated before anything changes: a
 *  failure leaves the optimizer, its parameters and metas untouched.
 *  The checksum only catches accidents: every field is also checked against its domain (docs/api.md
 *  12.6 lists them: flags 0/1, hyperparameters as at create, a step count in 0..2^62, m finite, v
 *  finite and >= 0, the master finite -- each as code times its block scale --, block scales powers
 *  of two in [2^-126, 2^126], a meta's scale normal with scale_inv = 1/scale, amaxes >= 0, ...), the
 *  message naming the field and the parameter. Parameter elements must be finite too.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL data, a parameter's meta re-bound since
 *  add_param); CORRUPT_DATA (truncated, bad magic or endianness marker, checksum mismatch,
 *  inconsistent sizes, a value outside its field's domain); NOT_SUPPORTED (a
 *  format version this library does not read); SHAPE_MISMATCH (parameter count or a shape differs);
 *  DTYPE_MISMATCH (state dtypes, block size, master, or a parameter/gradient dtype or meta differs);
 *  CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_load(fp8amp_optimizer opt, const void *data, size_t size);

/** One parameter's optimizer state as tensors: what fp8amp_optimizer_param_state gives and
 *  fp8amp_optimizer_set_param_state takes (docs/api.md section 12.10). Initialize with
 *  fp8amp_param_state_init. The state tensors have the parameter's shape; each block scale tensor is
 *  F32 [ceil(numel / state_block_size)] ([1] with state_block_size 0), element b the scale_inv of
 *  elements b*block .. b*block+block-1 (value = code * scale_inv). Since 0.4.0. */
typedef struct fp8amp_param_state {
    uint32_t struct_size;               /**< sizeof(fp8amp_param_state), set by fp8amp_param_state_init */
    int32_t has_master;                 /**< out: 1 if the parameter has an F16 master copy, else 0 (set ignores it) */
    int64_t step;                       /**< out: the optimizer's step count, shared by every parameter
                                             (set ignores it: fp8amp_optimizer_set_step) */
    fp8amp_tensor exp_avg;              /**< m: F32 (O1) or E4M3 (O2/O3) */
    fp8amp_tensor exp_avg_scale_inv;    /**< E4M3 m's block scales; NULL at O1 */
    fp8amp_tensor exp_avg_sq;           /**< v: F32 (O1) or F16 (O2/O3) */
    fp8amp_tensor exp_avg_sq_scale_inv; /**< F16 v's block scales; NULL at O1 */
    fp8amp_tensor master;               /**< the F16 master copy; NULL without one */
    fp8amp_tensor master_scale_inv;     /**< its block scales; NULL without one */
    /* A scaled parameter (bound to a meta: O3's E4M3 weights) is written by each step with its
     * meta's delayed scale, so the meta's state belongs to the optimizer's state too: */
    fp8amp_tensor param_meta_history;   /**< a copy of the meta's amax history, F32 [amax_history_len],
                                             newest first; NULL for an unscaled parameter. set: given,
                                             restores the meta's state (the three fields below with it);
                                             NULL leaves the meta as it is */
    float param_meta_scale;             /**< the meta's scale (the next step writes the parameter with it) */
    float param_meta_amax;              /**< the amax the meta recorded since its last update */
    int64_t param_meta_updates;         /**< the meta's update count (the phase of the recipe's interval) */
} fp8amp_param_state;

/** Fills the caller's struct of `size` bytes -- pass sizeof(fp8amp_param_state) -- with zeros and
 *  NULL handles (struct_size = size). Since 0.4.0. Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a
 *  size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_param_state_init(fp8amp_param_state *state, size_t size);

/** Reads parameter `index`'s state (0-based, in add_param order): fills out's tensors with NEW
 *  handles, read-only views of the optimizer's own memory in the stored dtypes (no copy; a later
 *  step or set shows through them; each keeps its memory alive, also past fp8amp_optimizer_destroy).
 *  The caller destroys each non-NULL one with fp8amp_tensor_destroy. Absent parts (O1's scales, a
 *  parameter without master) are NULL. param_meta_history is a new tensor too, a copy (the meta's
 *  state lives in one allocation). On failure out is unchanged. Synchronizes.
 *  out->struct_size must be set (fp8amp_param_state_init). Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out, a bad out->struct_size, index not
 *  in 0..count-1); NOT_SUPPORTED (a sharded optimizer: its state is per rank, use
 *  fp8amp_optimizer_save); OUT_OF_MEMORY; CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_param_state(fp8amp_optimizer opt, int32_t index, fp8amp_param_state *out);

/** Writes parameter `index`'s m, v and (if it has one) master copy from the caller's tensors, each
 *  on the optimizer's device with the parameter's shape, in one of two forms per part:
 *  - exact: the stored dtype (E4M3 m / F16 v / F16 master, or F32 m and v at O1) with its block
 *    scale tensor (F32, the optimizer's block count; O1's m and v take none): copied bit-exactly
 *    (what fp8amp_optimizer_param_state gave round-trips);
 *  - values: an F32, BF16 or F16 tensor with a NULL scale tensor: quantized with the optimizer's
 *    own block scaling (per block the largest power-of-two scale with amax * scale <= 448 for m,
 *    65504 for v and the master; round to nearest), as a step writes them.
 *  exp_avg and exp_avg_sq are required; master is required for a parameter with a master copy and
 *  must be NULL for one without. m and the master must be finite, v finite and >= 0 (each value as
 *  code * scale_inv), block scales powers of two in [2^-126, 2^126]. param_meta_history, when given
 *  (the parameter must be bound to a meta; F32 [its recipe's amax_history_len], amaxes >= 0 or
 *  +inf; written around the meta's own ring head, so that writing back what
 *  fp8amp_optimizer_param_state read changes no byte), restores the meta with param_meta_scale (a
 *  normal float > 0; scale_inv becomes 1/scale),
 *  param_meta_amax (>= 0 or +inf) and param_meta_updates (0..2^32-1); its recipe and statistics
 *  counters stay. The parameter's codes and scale_inv, the step count (fp8amp_optimizer_set_step)
 *  and has_master/step of `state` are left alone. Everything is
 *  checked before anything is written: a failure changes nothing. Synchronizes. Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE (opt or a tensor); INVALID_ARGUMENT (NULL state, a bad
 *  struct_size, index out of range, a required tensor NULL, a master for a parameter without one,
 *  a scale tensor where the part has no block scales (O1), a value or scale outside its domain, a
 *  meta history for a parameter without meta);
 *  SHAPE_MISMATCH (a state tensor not of the parameter's shape, a scale tensor not [blocks]);
 *  (a meta history not [amax_history_len]); DTYPE_MISMATCH (a scale tensor or the meta history not
 *  F32, a tensor with scales not of the stored dtype, one without
 *  scales not F32/BF16/F16); DEVICE_MISMATCH (a tensor on another device); NOT_SUPPORTED (a sharded
 *  optimizer); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_set_param_state(fp8amp_optimizer opt, int32_t index,
                                                          const fp8amp_param_state *state);

/** Sets the optimizer's step count (the bias corrections of the next step use step + 1), e.g. when
 *  loading another optimizer's state with fp8amp_optimizer_set_param_state. found_inf and the
 *  gradient norm of the last step are left alone. Synchronizes. Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (step not in 0..2^62); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_set_step(fp8amp_optimizer opt, int64_t step);

/** Dynamic loss scaler: torch.cuda.amp.GradScaler's growth/backoff/interval semantics plus
 *  hysteresis (Megatron's): after a step with found_inf, the growth count resets and the hysteresis
 *  count drops by one; when it reaches 0 the scale is multiplied by backoff_factor. After
 *  growth_interval consecutive good steps the scale is multiplied by growth_factor (if the result is
 *  finite) and the hysteresis count is refilled. hysteresis 1 is exactly torch's GradScaler. */
typedef struct fp8amp_grad_scaler_desc {
    uint32_t struct_size;  /**< sizeof(fp8amp_grad_scaler_desc) */
    float init_scale;      /**< default 65536; a normal float > 0 */
    float growth_factor;   /**< default 2; > 1, finite */
    float backoff_factor;  /**< default 0.5; in (0, 1) */
    int32_t growth_interval; /**< default 2000; >= 1 */
    int32_t hysteresis;    /**< default 1; >= 1 */
} fp8amp_grad_scaler_desc;

/** Fills the caller's descriptor of `size` bytes -- pass sizeof(fp8amp_grad_scaler_desc) -- with the
 *  defaults, writing exactly `size` bytes (struct_size = size). Since 0.2.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_desc_init(fp8amp_grad_scaler_desc *desc, size_t size);
/** Kept for binaries built against 0.1.0: writes its 24-byte fp8amp_grad_scaler_desc. */
FP8AMP_API fp8amp_status (fp8amp_grad_scaler_desc_init_default)(fp8amp_grad_scaler_desc *desc);
/** Source code's spelling of the 0.1.0 init: fp8amp_grad_scaler_desc_init with this header's sizeof. */
#define fp8amp_grad_scaler_desc_init_default(desc) \
    fp8amp_grad_scaler_desc_init((desc), sizeof(fp8amp_grad_scaler_desc))

/** Creates a scaler on ctx's device (its state lives there). Statuses: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL, struct_size too small, a field out of range); OUT_OF_MEMORY; CUDA;
 *  NOT_SUPPORTED (as fp8amp_scaling_create). */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_create(fp8amp_context ctx, const fp8amp_grad_scaler_desc *desc,
                                                   fp8amp_grad_scaler *out);
/** NULL is a no-op success. Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_destroy(fp8amp_grad_scaler scaler);

/** The current loss scale (synchronizes). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT; CUDA. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_get_scale(fp8amp_grad_scaler scaler, float *scale);

/** The address of the scale (a float in the scaler device's memory), for multiplying the loss on
 *  the device without a host round trip. Valid while the scaler lives.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_scale_device_ptr(fp8amp_grad_scaler scaler, const float **scale);

/** The scaler's full state, for checkpoints. */
typedef struct fp8amp_grad_scaler_state {
    float scale;             /**< the loss scale: a normal float > 0 */
    int32_t growth_tracker;  /**< good steps since the last growth or overflow: 0..growth_interval-1 */
    int32_t hysteresis_left; /**< overflows left before the next backoff: 0..hysteresis */
} fp8amp_grad_scaler_state;
/** Reads the scaler's state (synchronizes). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL); CUDA. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_get_state(fp8amp_grad_scaler scaler, fp8amp_grad_scaler_state *state);
/** Validates (scale a normal float > 0, counts in range) and writes the scaler's state.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL, a field out of range); CUDA. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_set_state(fp8amp_grad_scaler scaler, const fp8amp_grad_scaler_state *state);

/** Updates the scaler from the found_inf of opt's last step, on the device (no host sync), for steps
 *  that were not given the scaler in their step args (a step that was given it already updated it:
 *  do not update twice). Statuses: SUCCESS; INVALID_HANDLE; DEVICE_MISMATCH; CUDA. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_update(fp8amp_grad_scaler scaler, fp8amp_optimizer opt);

/** @} */

/** @defgroup presets Presets
 *  The O1/O2/O3 optimization levels for a Linear and its optimizer together.
 *  @{ */

/** Fills both descriptors (either may be NULL), of linear_size and adam_size bytes (their sizeof
 *  where the caller was compiled; written exactly, as by the sized init functions), with the
 *  defaults, then the level's choices (MS-AMP's table; docs/design.md): FP8 GEMMs and E4M3
 *  weight gradients at every level; weights in scaled F16 (O1, O2) or E4M3 (O3); Adam state F32 +
 *  F32 (O1), E4M3 + F16 (O2, O3); an F16 master copy (O3). in_features and out_features stay 0:
 *  set them. Since 0.2.0. Statuses: SUCCESS; INVALID_ARGUMENT (both NULL, unknown level, a bad size
 *  of a non-NULL descriptor; then neither is written). */
FP8AMP_API fp8amp_status fp8amp_opt_level_init(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc,
                                               size_t linear_size, fp8amp_adam_desc *adam_desc, size_t adam_size);
/** Kept for binaries built against 0.1.0 (writes 80 and 52 bytes); source code gets the macro. */
FP8AMP_API fp8amp_status (fp8amp_opt_level_config)(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc,
                                                   fp8amp_adam_desc *adam_desc);
/** Source code's spelling of the 0.1.0 preset: fp8amp_opt_level_init with this header's sizeofs. */
#define fp8amp_opt_level_config(level, linear_desc, adam_desc)                                              \
    fp8amp_opt_level_init((level), (linear_desc), sizeof(fp8amp_linear_desc), (adam_desc), sizeof(fp8amp_adam_desc))

/** @} */

/** @defgroup comm Communicators
 *  FP8 gradient all-reduce, reduce-scatter and all-gather across processes or GPUs
 *  (docs/communicator.md). Since 0.3.0 (version node FP8AMP_0.3).
 *  @{ */

/** A communicator: nranks processes (or GPUs) that reduce and gather tensors of one context each.
 *  The backend follows the context's device: MPI for a CPU context (when the library was built with
 *  it), NCCL for a CUDA context. A one-rank communicator needs neither. Every rank calls the same
 *  operations in the same order with tensors of the same counts, shapes and dtypes. */
typedef struct fp8amp_comm_s *fp8amp_comm;

/** Size of a communicator's unique id in bytes (as NCCL's ncclUniqueId). */
#define FP8AMP_COMM_UNIQUE_ID_BYTES 128
/** Created on one rank by fp8amp_comm_unique_id_create and passed, as these bytes, to every rank by
 *  whatever channel the caller has (a file, a TCP store, MPI_Bcast, torch.distributed). */
typedef struct fp8amp_comm_unique_id {
    char internal[128]; /**< FP8AMP_COMM_UNIQUE_ID_BYTES (a literal, for binding generators) */
} fp8amp_comm_unique_id;

/** A new unique id for a communicator on ctx's device type: ncclGetUniqueId for CUDA (it also starts
 *  NCCL's bootstrap listener on this process); random bytes with a tag for the CPU (MPI) backend.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL id); NOT_SUPPORTED (no backend for the
 *  context's device in this build: the message says why); NCCL. */
FP8AMP_API fp8amp_status fp8amp_comm_unique_id_create(fp8amp_context ctx, fp8amp_comm_unique_id *id);

/** Creates this process's rank of an nranks communicator; collective: every rank calls it with the
 *  same id and nranks, and its own rank in 0..nranks-1. CUDA: ncclCommInitRank on ctx's device
 *  (with NCCL 2.28 or later, unless FP8AMP_COMM_NCCL_MEMORY=plain or =register, also a split of it with CTAPolicy
 *  NCCL_CTA_POLICY_ZERO, on which the all-reduce's scratch is a symmetric window, so that NCCL moves
 *  the all-reduce's all-gathers on copy engines: communicator.md).
 *  CPU: MPI (initialized here with MPI_THREAD_FUNNELED if the caller has not), over a duplicate of
 *  MPI_COMM_WORLD reordered by rank, which must then hold exactly nranks processes (a subset: adopt
 *  a communicator made with MPI_Comm_split). nranks 1 needs no backend at all (a local transport).
 *  The id is checked to be the same on every rank (CPU). CUDA: the id is NCCL's own ncclUniqueId and
 *  goes to ncclCommInitRank unchecked (a bad id fails there with status NCCL), and with nranks > 1
 *  the call blocks, as NCCL's does, until every rank has called it. The communicator uses ctx (its device and its
 *  current stream at each call) and keeps it alive.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL id or out, nranks < 1, rank outside
 *  0..nranks-1, an id not made by fp8amp_comm_unique_id_create for this device type, ids that differ
 *  between ranks); NOT_SUPPORTED (no backend for the device in this build, MPI world size other than
 *  nranks); NCCL; COMM (MPI failed: its message). */
FP8AMP_API fp8amp_status fp8amp_comm_create(fp8amp_context ctx, const fp8amp_comm_unique_id *id, int32_t nranks,
                                            int32_t rank, fp8amp_comm *out);

/** Adopts a communicator the caller already has: for a CUDA context, native is the ncclComm_t itself
 *  (borrowed: the caller keeps it alive and destroys it after fp8amp_comm_destroy); for a CPU
 *  context, native points at an MPI_Comm (const MPI_Comm *), which is duplicated (MPI_Comm_dup,
 *  collective), so the caller may free its own afterwards. Not collective for NCCL.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL native or out); NOT_SUPPORTED (no
 *  backend for the device in this build); NCCL; COMM. */
FP8AMP_API fp8amp_status fp8amp_comm_adopt(fp8amp_context ctx, void *native, fp8amp_comm *out);

/** Destroys a communicator handle (collective for a communicator fp8amp created: the others must
 *  destroy theirs too; one that failed or was aborted is torn down locally). NULL is a no-op success.
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_comm_destroy(fp8amp_comm comm);

/** Aborts the communicator's pending and future operations (ncclCommAbort; MPI: marks it failed,
 *  without MPI_Abort). Every later operation on it returns COMM; destroy it. Not collective. The one
 *  call that may come from another thread while an operation on the communicator runs (a watchdog):
 *  a waiting MPI operation then fails with COMM at its next poll.
 *  Statuses: SUCCESS; INVALID_HANDLE. */
FP8AMP_API fp8amp_status fp8amp_comm_abort(fp8amp_comm comm);

/** This process's rank, 0..nranks-1. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL rank). */
FP8AMP_API fp8amp_status fp8amp_comm_rank(fp8amp_comm comm, int32_t *rank);
/** The number of ranks. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL nranks). */
FP8AMP_API fp8amp_status fp8amp_comm_size(fp8amp_comm comm, int32_t *nranks);

/** How long an operation waits for its peers before the call fails and the communicator is marked
 *  failed (a rank that died or stopped taking part); default 300 s. seconds > 0. MPI: every
 *  operation (status COMM). NCCL: the waits on the host, i.e. the cross-rank argument check (status
 *  NCCL; an error NCCL reports asynchronously fails it too); the communicator is then aborted
 *  (ncclCommAbort, when it was created here). Enqueued NCCL work is not timed by the host: a watchdog
 *  calls fp8amp_comm_abort.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (seconds not > 0 or not finite). */
FP8AMP_API fp8amp_status fp8amp_comm_set_timeout(fp8amp_comm comm, double seconds);

/** Elements that saturated (scaled beyond the wire or output format's largest finite value, inf
 *  included, NaN not) in this communicator's quantizations since it was created: normally 0, since
 *  scales come from the agreed amaxes; an inf input makes it count. Synchronizes.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT; CUDA. */
FP8AMP_API fp8amp_status fp8amp_comm_get_saturated(fp8amp_comm comm, uint64_t *count);

/** Options of the reductions. Initialize with fp8amp_comm_reduce_desc_init_default. */
typedef struct fp8amp_comm_reduce_desc {
    uint32_t struct_size;    /**< sizeof(fp8amp_comm_reduce_desc) */
    fp8amp_dtype wire_dtype; /**< FP8 format on the wire for the reduce-scatter: default E4M3; or E5M2 */
    int32_t average;         /**< default 1: the mean over ranks (folded into scale_inv); 0: the sum */
    int32_t check;           /**< default 1: first verify that every rank passed the same counts, shapes
                                  and dtypes (a 1 kB exchange, which in the all-reduce also agrees the
                                  first scales; on CUDA the host waits for it, so for the work queued
                                  on the context's stream before the call: turn it off to capture the
                                  call in a CUDA graph, or once a fixed layout has been checked) */
} fp8amp_comm_reduce_desc;

/** Fills desc, of size bytes (its sizeof where the caller was compiled; written exactly), with the
 *  defaults. Statuses: SUCCESS; INVALID_ARGUMENT (NULL desc, a size this version cannot serve). */
FP8AMP_API fp8amp_status fp8amp_comm_reduce_desc_init(fp8amp_comm_reduce_desc *desc, size_t size);
/** Source code's spelling: fp8amp_comm_reduce_desc_init with this header's sizeof. */
#define fp8amp_comm_reduce_desc_init_default(desc) fp8amp_comm_reduce_desc_init((desc), sizeof(fp8amp_comm_reduce_desc))

/** Gradient all-reduce of a bucket of n tensors in one call: outputs[i] = the mean (or sum) over ranks
 *  of inputs[i]. Inputs are F32, F16, BF16, or E4M3/E5M2 read with their scale_inv (the tensor's slot,
 *  fp8amp_tensor_scale_inv). outputs[i] has inputs[i]'s shape and is F32, F16, BF16 or E4M3/E5M2; an
 *  FP8 output must have a scale_inv slot (bound to a meta once), which receives its scale_inv (its
 *  meta is not touched); outputs[i] may be inputs[i] itself (in place). Algorithm: the ranks agree on
 *  the wire's scales (all-reduces MAX of the amaxes): one per tensor with an FP8 output (its output has
 *  one scale_inv); for a wide (F32, F16, BF16) output one per scale region its elements fall in (the
 *  bucket, tensors laid end to end at multiples of 16 elements, is cut into nranks chunks of
 *  ceil(total / nranks) elements and each chunk into 4 regions, both rounded up to 16: a function of
 *  the call's sizes and nranks only), so that the amaxes of later regions are agreed while earlier
 *  ones are on the wire; every rank uses the same scale for the same element. The ranks then
 *  quantize into wire_dtype with those scales, exchange
 *  FP8 chunks (a reduce-scatter), accumulate the received codes in float32 in rank order
 *  0..nranks-1, and requantize each element of the reduced chunk with the same agreed scale
 *  (the sum of the codes times 1 / nranks, mapped onto the output's FP8 dtype, else wire_dtype: it
 *  cannot overflow, and needs no second amax), and all-gather those codes. An FP8 output's
 *  scale_inv is the wire's scale_inv (times nranks for the sum; times 2^7 or 2^-7 where its format's
 *  range differs from the wire's); a wide output gets code * its element's scale_inv rounded to its
 *  dtype. Each element is within one FP8 rounding at the scale of its tensor or region of the exact
 *  mean (sum) of the values that went on the wire. Every rank gets identical bytes; CPU and CUDA
 *  compute the same bytes, whatever the pipeline's pieces (docs/communicator.md). Asynchronous on CUDA
 *  (the context's stream), except the check (desc). desc may be NULL (the defaults).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (n < 1, NULL arrays, a read-only output, an FP8
 *  input or output without scale_inv slot, an output overlapping another tensor of the call, a bad
 *  desc);
 *  SHAPE_MISMATCH; DTYPE_MISMATCH (wire_dtype not FP8); DEVICE_MISMATCH (a tensor not on the
 *  communicator's context's device); on every rank alike (the check, before any data moves):
 *  SHAPE_MISMATCH when the ranks passed different counts or shapes, DTYPE_MISMATCH different dtypes,
 *  INVALID_ARGUMENT different options or another rank's refusal of its own arguments (that rank
 *  returns its own status); COMM (MPI failed or timed out: the communicator is then failed); NCCL;
 *  CUDA. On failure outputs are unchanged (outputs are written by the last step only; an
 *  asynchronous CUDA or NCCL failure surfaces at a later synchronizing call). */
FP8AMP_API fp8amp_status fp8amp_comm_all_reduce(fp8amp_comm comm, int32_t n, const fp8amp_tensor *inputs,
                                                const fp8amp_tensor *outputs, const fp8amp_comm_reduce_desc *desc);

/** Reduce-scatter for sharded training: input holds nranks * k elements (any shape), output k (any
 *  shape); output on rank r = the mean (or sum) over ranks of the input's elements [r*k, (r+1)*k).
 *  Same wire and float32 accumulation in rank order as fp8amp_comm_all_reduce. output F32/F16/BF16
 *  (the reduced value rounded once), or E4M3/E5M2 with a scale_inv slot, requantized with a scale of
 *  its own shard's amax (per-shard scales). Statuses: as fp8amp_comm_all_reduce (SHAPE_MISMATCH: the
 *  element counts). */
FP8AMP_API fp8amp_status fp8amp_comm_reduce_scatter(fp8amp_comm comm, fp8amp_tensor input, fp8amp_tensor output,
                                                    const fp8amp_comm_reduce_desc *desc);

/** All-gather: output (nranks * k elements, input's dtype) = every rank's input (k elements) in rank
 *  order. FP8 inputs travel as codes with their scale_inv: output_scale_inv, an F32 tensor of nranks
 *  elements, receives each shard's scale_inv (required for FP8, must be NULL otherwise). Wide dtypes
 *  travel as they are. Of desc (NULL: the defaults) only check is read. Statuses: as
 *  fp8amp_comm_all_reduce. */
FP8AMP_API fp8amp_status fp8amp_comm_all_gather(fp8amp_comm comm, fp8amp_tensor input, fp8amp_tensor output,
                                                fp8amp_tensor output_scale_inv, const fp8amp_comm_reduce_desc *desc);

/** Makes opt this rank's part of a sharded optimizer over comm's ranks (ZeRO-style O3, issue 20;
 *  docs/api.md 12.8, docs/o3.md). Call it on a fresh optimizer (no parameter yet) on every rank with
 *  the same desc; then every rank adds the same full parameters and gradients in the same order
 *  (fp8amp_optimizer_add_param/_ex, the usual rules) and each keeps m, v, the master copy and their
 *  block scales only for its shard of each parameter: elements [r*k, min((r+1)*k, n)) of a parameter of
 *  n elements on rank r, k = ceil(n / nranks) rounded up to state_block_size (so no state block
 *  spans two ranks and every block scale is the unsharded one; fp8amp_optimizer_shard_range reads it).
 *  fp8amp_optimizer_step is then collective: each full gradient (the rank's local gradient; F32, F16,
 *  BF16 or FP8 with its scale_inv) is reduce-scattered, its mean over the ranks, with FP8 on the wire
 *  and float32 accumulation (fp8amp_comm_reduce_scatter, E4M3 wire); the ranks agree (an all-gather of
 *  per-rank words) on found_inf -- a non-finite local gradient on any rank, found before the wire,
 *  or a non-finite shard after it -- and on the global gradient norm (their float64 sums of squares
 *  added in rank order); a skipped step changes nothing on any rank; otherwise each rank updates its
 *  shard exactly as the unsharded step would (global max_grad_norm clipping, stochastic rounding
 *  keyed by the element's index in the full parameter), the ranks agree on each scaled parameter's
 *  amax (its meta folds as unsharded), and the updated shards are all-gathered into the full
 *  parameters (FP8 with their scale_inv). Given the same reduced gradients, a sharded step writes the
 *  bytes of the unsharded step (the norm's float64 sum may differ in its last bits, which changes the
 *  float32 norm only when it lies within a double rounding of a float32 tie). The step synchronizes
 *  the host (CUDA: the checks go through host memory; not capturable in a graph).
 *  fp8amp_optimizer_save writes this rank's shard (its state, its slice of each parameter, the metas);
 *  fp8amp_optimizer_load of a sharded optimizer is collective: every rank loads the checkpoint its own
 *  rank saved with the same nranks (not detected otherwise), then the parameters are all-gathered.
 *  state_bytes counts the shard's state, its parameter copy and the step's scratch; the shards' F32
 *  gradients are allocated by each step and released at its end (docs/o3.md). Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (opt already holds parameters, or is already
 *  sharded); DEVICE_MISMATCH (comm on another device than opt); NOT_SUPPORTED (state_block_size 0:
 *  one scale per tensor would span the ranks). */
FP8AMP_API fp8amp_status fp8amp_optimizer_set_shard(fp8amp_optimizer opt, fp8amp_comm comm);

/** The shard of parameter `index` this rank holds: elements [*begin, *begin + *count) of the full
 *  parameter (count may be 0: a small parameter lies on the first ranks only). An unsharded
 *  optimizer holds all: begin 0, count numel. Since 0.4.0. Statuses: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL out, index not in 0..num_params-1). */
FP8AMP_API fp8amp_status fp8amp_optimizer_shard_range(fp8amp_optimizer opt, int32_t index, int64_t *begin,
                                                      int64_t *count);

/** @} */

/** @defgroup norm Fused normalization
 *  LayerNorm and RMSNorm whose forward writes the FP8 input of the next GEMM, with its transpose and
 *  the amax fused, and whose backward takes the GEMM's dX (Transformer Engine's LayerNormLinear idea;
 *  docs/api.md 14, numerics docs/numerics.md 7). Since 0.4.0 (version node FP8AMP_0.4).
 *  @{ */

/** Which normalization. Values are fixed and append-only. */
typedef enum fp8amp_norm_kind {
    FP8AMP_NORM_LAYERNORM = 0, /**< y = (x - mean) / sqrt(var + eps) * w + beta, var the biased variance */
    FP8AMP_NORM_RMSNORM = 1    /**< y = x / sqrt(mean(x^2) + eps) * w (no mean, no bias) */
} fp8amp_norm_kind;

/** A normalization's options. Initialize with fp8amp_norm_desc_init_default. The weight w of a column
 *  is gamma, or 1 + gamma with zero_centered_gamma (Transformer Engine's option: gamma is stored
 *  around 0, which suits weight decay and low-precision storage). */
typedef struct fp8amp_norm_desc {
    uint32_t struct_size;        /**< sizeof(fp8amp_norm_desc), set by the init function */
    fp8amp_norm_kind kind;       /**< default LAYERNORM */
    float eps;                   /**< added to the variance (mean square); default 1e-5; finite, >= 0 */
    int32_t zero_centered_gamma; /**< default 0; 1: w = 1 + gamma */
} fp8amp_norm_desc;

/** Fills the caller's descriptor of `size` bytes -- pass sizeof(fp8amp_norm_desc) -- with the
 *  defaults above, writing exactly `size` bytes (struct_size = size). Since 0.4.0.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL desc; a size as for fp8amp_recipe_init). */
FP8AMP_API fp8amp_status fp8amp_norm_desc_init(fp8amp_norm_desc *desc, size_t size);
/** Source code's spelling: fp8amp_norm_desc_init with this header's sizeof. */
#define fp8amp_norm_desc_init_default(desc) fp8amp_norm_desc_init((desc), sizeof(fp8amp_norm_desc))

/** The forward of a LayerNorm or RMSNorm over the last dimension, in one pass that writes the next
 *  GEMM's input. x (F32, F16 or BF16) is read as [rows, d]: d its last extent, rows the product of
 *  the others. Per row, in float32 with the fixed summation order of docs/numerics.md 7 (two passes
 *  for LayerNorm: the mean, then the variance of x - mean): rstd = 1 / sqrt(var + eps) (RMSNorm:
 *  mean(x^2) + eps), y = (x - mean) * rstd * w + beta (RMSNorm: x * rstd * w), each operation rounded
 *  once.
 *  y has x's shape and is either wide (F32, F16, BF16: y rounded once into it; an F16 y's binding is
 *  not applied) or E4M3/E5M2 bound to a scaling meta: then y is quantized as fp8amp_quantize would
 *  quantize the F32 y -- fp8_rne_satfinite(y * scale) with the meta's scale (delayed scaling), or with
 *  the scale of this y's own amax (current scaling: y is computed twice), max|y| recorded into the
 *  meta (NaN as inf), the statistics counted, y's scale_inv slot set -- byte for byte, with no F32 y
 *  in memory. A NaN y is the positive NaN. CPU and CUDA compute the same bytes. Asynchronous on CUDA.
 *  @param ctx   the context (its device and stream)
 *  @param desc  the options, or NULL for the defaults (LayerNorm, eps 1e-5)
 *  @param x     the input, [..., d], F32/F16/BF16
 *  @param gamma [d], F32/F16/BF16
 *  @param beta  [d], F32/F16/BF16, or NULL (no bias); must be NULL for RMSNorm
 *  @param y     the output, x's shape: F32/F16/BF16, or E4M3/E5M2 bound to a meta
 *  @param y_t   NULL, or with an FP8 y the transposed copy [d, rows], of y's dtype and bound to y's
 *               meta (what the weight-gradient GEMM of the backward needs, as fp8amp_quantize_transpose)
 *  @param mean  NULL, or [rows] F32: each row's mean (LayerNorm only: NULL for RMSNorm)
 *  @param rstd  NULL, or [rows] F32: each row's rstd (the backward needs mean and rstd)
 *
 *  Statuses: SUCCESS; INVALID_HANDLE (ctx, a tensor that is not NULL-able or not a live tensor);
 *  DTYPE_MISMATCH (x, gamma or beta not F32/F16/BF16; y_t not E4M3/E5M2 or of another dtype than y;
 *  mean or rstd not F32); INVALID_ARGUMENT (a bad desc; beta or mean given for RMSNorm; y_t given for
 *  a wide y; an FP8 y without a meta; y_t bound to another meta; a read-only output; any output
 *  overlapping an input or another output); DEVICE_MISMATCH (a tensor or the meta not on ctx's
 *  device); SHAPE_MISMATCH (x a scalar; gamma, beta not [d]; y not x's shape; y_t not [d, rows]; mean,
 *  rstd not [rows]); NOT_SUPPORTED (a newer header's desc with a field this library lacks set); CUDA.
 *  On failure nothing is written. */
FP8AMP_API fp8amp_status fp8amp_norm_forward(fp8amp_context ctx, const fp8amp_norm_desc *desc, fp8amp_tensor x,
                                             fp8amp_tensor gamma, fp8amp_tensor beta, fp8amp_tensor y,
                                             fp8amp_tensor y_t, fp8amp_tensor mean, fp8amp_tensor rstd);

/** The backward of fp8amp_norm_forward, from dy, the next GEMM's dX (F32, F16 or BF16, x's shape),
 *  with the forward's x, gamma, mean and rstd. Per row, in float32 with the fixed summation order of
 *  docs/numerics.md 7: g = dy * w, xhat = (x - mean) * rstd (RMSNorm: x * rstd),
 *  dx = ((g - mean(g)) - xhat * mean(g * xhat)) * rstd (RMSNorm: (g - xhat * mean(g * xhat)) * rstd),
 *  rounded once into dx's dtype. Over the rows, in a fixed order of row chunks and chunk pairs: dgamma = sum of
 *  dy * xhat, dbeta = sum of dy (written, not accumulated). A NaN result is the positive NaN. CPU and
 *  CUDA compute the same bytes. Asynchronous on CUDA; its scratch is a slot of the context's scratch
 *  pool (fp8amp_context_scratch_bytes; CUDA: min(rows, 264) * 2 * d floats; CPU: 6 * d), allocated
 *  through the context when it must grow and kept.
 *  @param ctx    the context
 *  @param desc   the forward's options, or NULL for the defaults
 *  @param dy     the gradient of y, x's shape, F32/F16/BF16
 *  @param x      the forward's input
 *  @param gamma  the forward's gamma, [d]
 *  @param mean   the forward's mean, [rows] F32 (LayerNorm: required; RMSNorm: NULL)
 *  @param rstd   the forward's rstd, [rows] F32
 *  @param dx     receives the gradient of x, x's shape, F32/F16/BF16
 *  @param dgamma receives the gradient of gamma, [d] F32
 *  @param dbeta  receives the gradient of beta, [d] F32, or NULL (RMSNorm: NULL)
 *
 *  Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (dy, x, gamma, dx not F32/F16/BF16; mean, rstd,
 *  dgamma, dbeta not F32); INVALID_ARGUMENT (a bad desc; mean NULL for LayerNorm; mean or dbeta given
 *  for RMSNorm; a read-only output; an output overlapping an input or another output); DEVICE_MISMATCH;
 *  SHAPE_MISMATCH (x a scalar; dy or dx not x's shape; gamma, dgamma, dbeta not [d]; mean, rstd not
 *  [rows]); OUT_OF_MEMORY (the scratch); NOT_SUPPORTED (as fp8amp_norm_forward); CUDA. On failure
 *  nothing is written. */
FP8AMP_API fp8amp_status fp8amp_norm_backward(fp8amp_context ctx, const fp8amp_norm_desc *desc, fp8amp_tensor dy,
                                              fp8amp_tensor x, fp8amp_tensor gamma, fp8amp_tensor mean,
                                              fp8amp_tensor rstd, fp8amp_tensor dx, fp8amp_tensor dgamma,
                                              fp8amp_tensor dbeta);

/** @} */

/** @defgroup activation Fused activations
 *  GELU, SiLU and SwiGLU whose forward writes the FP8 input of the next GEMM and whose backward writes
 *  the FP8 gradient the GEMM before takes, amax fused (Transformer Engine's LayerNormMLP idea;
 *  docs/api.md 15, numerics docs/numerics.md 8). Since 0.4.0 (version node FP8AMP_0.4).
 *  @{ */

/** Which activation. Values are fixed and append-only. */
typedef enum fp8amp_activation {
    FP8AMP_ACTIVATION_GELU_TANH = 0, /**< 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    FP8AMP_ACTIVATION_SILU = 1,      /**< x * sigmoid(x) */
    FP8AMP_ACTIVATION_SWIGLU = 2     /**< silu(a) * b, where a and b are the first and second halves of
                                          x's last dimension (the output has half of it) */
} fp8amp_activation;

/** y = kind(x), element by element (SwiGLU: per pair of halves), in float32 with exp computed from
 *  IEEE multiplies, adds and fused multiply-adds only (docs/numerics.md 8), each rounded once. x is F32, F16 or
 *  BF16, read as [rows, in_cols] (in_cols its last extent). y has x's shape (SwiGLU: the last extent
 *  halved) and is wide (F32/F16/BF16: rounded once) or E4M3/E5M2 bound to a scaling meta: quantized
 *  exactly as fp8amp_quantize quantizes the F32 y (delayed or current scaling, amax recorded with NaN
 *  as inf, statistics, scale_inv slots), byte for byte. A NaN y is the positive NaN. y_t (or NULL),
 *  with an FP8 y only: the transpose [cols, rows], bound to y's meta. CPU and CUDA compute the same
 *  bytes. Asynchronous on CUDA.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (unknown kind; y_t with a wide y; an FP8 y
 *  without a meta; y_t bound to another meta; a read-only output; an output overlapping x or the other
 *  output); DTYPE_MISMATCH (x not F32/F16/BF16; y_t not E4M3/E5M2 or not y's dtype); DEVICE_MISMATCH;
 *  SHAPE_MISMATCH (x a scalar; SwiGLU with an odd last extent; y or y_t of another shape); CUDA. On
 *  failure nothing is written. */
FP8AMP_API fp8amp_status fp8amp_activation_forward(fp8amp_context ctx, fp8amp_activation kind, fp8amp_tensor x,
                                                   fp8amp_tensor y, fp8amp_tensor y_t);

/** The backward of fp8amp_activation_forward: dx = dy * kind'(x) (SwiGLU: da = (dy * b) * silu'(a),
 *  db = dy * silu(a)), in float32 as the forward. dy (F32/F16/BF16) has the forward's y shape, dx x's
 *  shape; dx is wide, or E4M3/E5M2 bound to a meta (the next backward GEMM's dY, quantized as
 *  fp8amp_quantize would, amax fused), with dx_t (or NULL) its [in_cols, rows] transpose.
 *  Statuses: as fp8amp_activation_forward (dy not F32/F16/BF16: DTYPE_MISMATCH; dy not the forward
 *  output's shape or dx not x's: SHAPE_MISMATCH). */
FP8AMP_API fp8amp_status fp8amp_activation_backward(fp8amp_context ctx, fp8amp_activation kind, fp8amp_tensor dy,
                                                    fp8amp_tensor x, fp8amp_tensor dx, fp8amp_tensor dx_t);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FP8AMP_FP8AMP_H */
