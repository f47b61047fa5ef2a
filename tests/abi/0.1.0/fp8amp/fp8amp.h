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
 *  float8_e4m3fn/float8_e5m2 (lanes 1); at most FP8AMP_MAX_NDIM dimensions; compact row-major
 *  strides (or NULL strides); device kDLCPU or kDLCUDAHost for a CPU context (device_id not looked
 *  at), kDLCUDA or kDLCUDAManaged of the context's ordinal for a CUDA context. A read-only tensor
 *  (DLPACK_FLAG_BITMASK_READ_ONLY) is refused as the destination of any write.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL managed or out, NULL data, an extent
 *  < 1, misaligned data); NOT_SUPPORTED (major version != 1, a dtype fp8amp does not have, lanes !=
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

/* ---------------------------------------------------------------------------------------------
 * Conversion
 * ------------------------------------------------------------------------------------------- */

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

/* ---------------------------------------------------------------------------------------------
 * Recipes and scaling meta (docs/design.md section 4)
 * ------------------------------------------------------------------------------------------- */

typedef enum fp8amp_format {
    FP8AMP_FORMAT_E4M3 = 0,  /**< E4M3 everywhere */
    FP8AMP_FORMAT_HYBRID = 1 /**< E4M3 for weights, activations, weight gradients; E5M2 for output gradients */
} fp8amp_format;

typedef enum fp8amp_scaling_mode {
    FP8AMP_SCALING_DELAYED = 0, /**< scale from the amax history of earlier steps (Transformer Engine's recipe) */
    FP8AMP_SCALING_CURRENT = 1  /**< scale from this tensor's own amax, computed in the same quantize call */
} fp8amp_scaling_mode;

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

#define FP8AMP_MAX_AMAX_HISTORY 65536

/** Fills *recipe with the defaults above. Statuses: SUCCESS; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_recipe_init_default(fp8amp_recipe *recipe);

typedef struct fp8amp_scaling_s *fp8amp_scaling;

/** Creates a scaling meta for tensors of one scaled dtype on the context's device: E4M3, E5M2 or F16
 *  (a scaled 16-bit format: format max 65504, quantize saturates like FP8; MS-AMP's "FP16 with a
 *  scaling factor" for weights and optimizer state). The meta holds scale and scale_inv (both 1
 *  at first), the amax recorded since the last update (0 at first), the amax history (zeros) and
 *  the diagnostic counters. All of it lives on the device; reading it is an
 *  explicit call (fp8amp_scaling_get and friends).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL recipe/out, struct_size too small,
 *  a field out of range: margin, interval, amax_history_len 0 or > FP8AMP_MAX_AMAX_HISTORY, an
 *  unknown enum value); DTYPE_MISMATCH (fp8_dtype not E4M3/E5M2/F16); OUT_OF_MEMORY; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_create(fp8amp_context ctx, const fp8amp_recipe *recipe,
                                               fp8amp_dtype fp8_dtype, fp8amp_scaling *out);

/** Destroys a meta handle; tensors bound to it keep it alive. NULL is a no-op success. */
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

/** Reads scale, scale_inv and the amax recorded since the last update to the host (any output may be
 *  NULL). Synchronizes with the meta's stream. Statuses: SUCCESS; INVALID_HANDLE; CUDA. */
FP8AMP_API fp8amp_status fp8amp_scaling_get(fp8amp_scaling s, float *scale, float *scale_inv, float *amax);

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
    uint64_t saturated;
    uint64_t underflowed;
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
 *  current scale_inv. NULL unbinds. Statuses: SUCCESS; INVALID_HANDLE; DTYPE_MISMATCH (tensor not
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

/* ---------------------------------------------------------------------------------------------
 * Casting with scales
 * ------------------------------------------------------------------------------------------- */

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

/* ---------------------------------------------------------------------------------------------
 * FP8 Linear: y = x W^T + b on FP8 GEMMs (cuBLASLt on CUDA), with FP8 weight gradients
 * ------------------------------------------------------------------------------------------- */

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
    FP8AMP_ROLE_WEIGHT_GRAD = 3, /**< the E4M3 weight gradient (wgrad_dtype E4M3), current scaling */
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
    fp8amp_recipe recipe;       /**< default: fp8amp_recipe_init_default */
    fp8amp_gemm_policy policy;  /**< default AUTO */
    int32_t graph_replay;       /**< CUDA: 1 (default) replays a call whose launches repeat an earlier
                                     call's (same memory, shapes, dtypes, settings) as one CUDA graph
                                     launch; 0 launches every kernel each call (docs/linear.md 6) */
} fp8amp_linear_desc;

/** Fills *desc with the defaults above and in_features = out_features = 0 (set them).
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_linear_desc_init_default(fp8amp_linear_desc *desc);

typedef struct fp8amp_linear_s *fp8amp_linear;

/** Creates a Linear on the context's device: weight [out, in] (zeros: fill it), bias [out] (F32,
 *  zeros), gradient tensors (zeros) and the role metas. Allocates nothing else until the first call.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL desc/out, struct_size neither this
 *  struct's nor its first layout's,
 *  features < 1, a bad recipe, an unknown policy, graph_replay not 0 or 1); DTYPE_MISMATCH
 *  (weight_dtype or wgrad_dtype not allowed); OUT_OF_MEMORY; CUDA. */
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
 *  producer, a raw pointer) needs fp8amp_linear_weight_changed.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL out; bias without has_bias). */
FP8AMP_API fp8amp_status fp8amp_linear_weight(fp8amp_linear lin, fp8amp_tensor *out);
FP8AMP_API fp8amp_status fp8amp_linear_bias(fp8amp_linear lin, fp8amp_tensor *out);
FP8AMP_API fp8amp_status fp8amp_linear_weight_grad(fp8amp_linear lin, fp8amp_tensor *out);
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
 *  y overlapping); NOT_SUPPORTED (ALWAYS_FP8 with a shape or GPU FP8 GEMMs cannot take: the message
 *  says which); OUT_OF_MEMORY; CUBLAS; CUDA. */
FP8AMP_API fp8amp_status fp8amp_linear_forward(fp8amp_linear lin, fp8amp_tensor x, fp8amp_tensor y,
                                               int32_t training);

/** Backward of the last training forward. dy has y's shape (F32, F16 or BF16). Writes dx (x's shape,
 *  F32/F16/BF16; NULL skips the input gradient), the weight gradient and the bias gradient:
 *  accumulate_wgrad = 0 overwrites them, nonzero adds to them (micro-batches). Accumulation runs in
 *  FP32 (an FP32 buffer the Linear keeps for E4M3 and BF16 weight gradients), and the delivered
 *  weight_grad tensor is re-made from that sum after every backward, so no precision is lost between
 *  micro-batches. dY is quantized to GRAD_OUTPUT's dtype; dX = dY W and dW = dY^T X run in FP8 with
 *  FP32 (split) accumulation; the bias gradient is summed in FP32 from dy itself.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (no training forward since the last backward
 *  or since creation; read-only dx; overlaps); DTYPE_MISMATCH; SHAPE_MISMATCH (dy or dx not matching
 *  the forward's y and x); DEVICE_MISMATCH; OUT_OF_MEMORY; CUBLAS; CUDA. */
FP8AMP_API fp8amp_status fp8amp_linear_backward(fp8amp_linear lin, fp8amp_tensor dy, fp8amp_tensor dx,
                                                int32_t accumulate_wgrad);

/** Which GEMM the last forward ran (FP8AMP_GEMM_KIND_NONE before any). Statuses: SUCCESS;
 *  INVALID_HANDLE; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_linear_gemm_kind(fp8amp_linear lin, fp8amp_gemm_kind *out);

/** How many of this Linear's forward and backward calls so far ran as one CUDA graph launch
 *  (desc.graph_replay; always 0 on the CPU). Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_linear_graph_replays(fp8amp_linear lin, uint64_t *out);

/* ---------------------------------------------------------------------------------------------
 * Adam / AdamW with low-precision state (O1/O2/O3), dynamic loss scaling, checkpoints
 * (docs/design.md section 3; docs/api.md section 12; numerics in docs/numerics.md)
 * ------------------------------------------------------------------------------------------- */

typedef struct fp8amp_optimizer_s *fp8amp_optimizer;
typedef struct fp8amp_grad_scaler_s *fp8amp_grad_scaler;

/** Optimization levels (MS-AMP's meaning, docs/design.md section 1). */
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
} fp8amp_adam_desc;

/** Fills *desc with the defaults above (O1 AdamW). Statuses: SUCCESS; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_adam_desc_init_default(fp8amp_adam_desc *desc);

/** Fills *desc with the defaults, then the state dtypes of `level`: O1 (F32 m, F32 v), O2 (E4M3 m,
 *  F16 v), O3 (E4M3 m, F16 v, F16 master). Statuses: SUCCESS; INVALID_ARGUMENT (NULL desc, unknown
 *  level). */
FP8AMP_API fp8amp_status fp8amp_opt_level_adam_config(fp8amp_opt_level level, fp8amp_adam_desc *desc);

/** Creates an optimizer on ctx's device (its steps run on ctx's stream). It holds no parameters yet.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL desc/out, struct_size too small, a
 *  field out of range: lr, betas, eps, weight_decay, max_grad_norm negative, non-finite or beta
 *  >= 1; state_block_size not 0 nor a power of two in 128..FP8AMP_MAX_STATE_BLOCK; master_dtype
 *  not FP8AMP_NO_MASTER or F16); DTYPE_MISMATCH (exp_avg_dtype not F32/E4M3, exp_avg_sq_dtype not
 *  F32/F16); OUT_OF_MEMORY; CUDA. */
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
 *  grad: F32, F16, BF16, or E4M3/E5M2 (value = code * its scale_inv; likewise a scaled F16
 *  gradient, bound to a meta); same shape as param. Every parameter must be added before the first step.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (param added twice, param read-only, param
 *  and grad overlapping, E4M3 param without a meta, a param meta with current scaling, a parameter
 *  added after the first step); SHAPE_MISMATCH (grad's shape differs); DTYPE_MISMATCH (param E5M2;
 *  F32 param with an F16 master); DEVICE_MISMATCH (param, grad or a meta not on the optimizer's device);
 *  OUT_OF_MEMORY; CUDA. Each step marks the parameters written (a Linear then re-quantizes them). */
FP8AMP_API fp8amp_status fp8amp_optimizer_add_param(fp8amp_optimizer opt, fp8amp_tensor param, fp8amp_tensor grad);

/** Per-step arguments. Initialize with fp8amp_adam_step_args_init_default. */
typedef struct fp8amp_adam_step_args {
    uint32_t struct_size;   /**< sizeof(fp8amp_adam_step_args) */
    float lr;               /**< this step's learning rate; negative (the default) = the desc's lr */
    const float *lr_device; /**< optional: a float in the optimizer device's memory read by the step
                                 itself (for a schedule inside a captured CUDA graph); overrides lr */
    float grad_scale_inv;   /**< every gradient is multiplied by this (e.g. 1/world_size); default 1 */
    fp8amp_grad_scaler scaler; /**< optional: gradients are also divided by the scaler's loss scale
                                    (read on the device) and the scaler is updated from this step's
                                    found_inf on the device, in the same launch */
} fp8amp_adam_step_args;

/** Defaults: lr -1 (use desc.lr), lr_device NULL, grad_scale_inv 1, scaler NULL.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_adam_step_args_init_default(fp8amp_adam_step_args *args);

/** One Adam/AdamW step over every parameter: one kernel launch on CUDA, no allocation and no host
 *  synchronization (capturable in a CUDA graph). It first checks every gradient for inf/NaN (after
 *  unscaling; for FP8 gradients also NaN/inf codes and an inf amax recorded in the gradient's meta)
 *  and computes the global gradient norm; if any gradient is not finite it changes nothing --
 *  parameters, states, scales, metas and the step count stay bit-identical -- and records found_inf.
 *  Otherwise it clips (max_grad_norm), updates, and advances the step count. found_inf, the step
 *  count and the norm live on the device: read them with the getters below. args may be NULL (the
 *  defaults). Statuses: SUCCESS; INVALID_HANDLE (opt, args->scaler); INVALID_ARGUMENT (struct_size
 *  too small, grad_scale_inv or lr non-finite); DEVICE_MISMATCH (a scaler of another device);
 *  CUDA. A step with no parameters records found_inf 0 and advances the step count. */
FP8AMP_API fp8amp_status fp8amp_optimizer_step(fp8amp_optimizer opt, const fp8amp_adam_step_args *args);

/** Synchronizing getters of the device-side results of the last step: found_inf (1 if it was
 *  skipped), the number of steps taken (skipped ones not counted), and the global L2 norm of the
 *  unscaled gradients before clipping (inf/NaN when found_inf). Each: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL out); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_get_found_inf(fp8amp_optimizer opt, int32_t *found_inf);
FP8AMP_API fp8amp_status fp8amp_optimizer_get_step(fp8amp_optimizer opt, int64_t *step);
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
 *  section 12.6. buffer NULL: *size receives the byte count. Otherwise capacity must be at least
 *  that, and *size receives the bytes written. Synchronizes (reads device memory).
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL size, capacity too small); CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_save(fp8amp_optimizer opt, void *buffer, size_t capacity, size_t *size);

/** Restores what fp8amp_optimizer_save wrote into an optimizer with the same state dtypes, block
 *  size and parameters (count, order, shapes, dtypes), on any device (a CPU checkpoint loads into a
 *  CUDA optimizer and back). Hyperparameters (lr, betas, eps, weight decay, maximize, adamw,
 *  max_grad_norm) are taken from the checkpoint. Everything is validated before anything changes: a
 *  failure leaves the optimizer, its parameters and metas untouched.
 *  Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT (NULL data); CORRUPT_DATA (truncated, bad
 *  magic or endianness marker, checksum mismatch, inconsistent sizes or values); NOT_SUPPORTED (a
 *  format version this library does not read); SHAPE_MISMATCH (parameter count or a shape differs);
 *  DTYPE_MISMATCH (state dtypes, block size, master, or a parameter/gradient dtype or meta differs);
 *  CUDA. */
FP8AMP_API fp8amp_status fp8amp_optimizer_load(fp8amp_optimizer opt, const void *data, size_t size);

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

/** Fills *desc with the defaults. Statuses: SUCCESS; INVALID_ARGUMENT (NULL). */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_desc_init_default(fp8amp_grad_scaler_desc *desc);

/** Creates a scaler on ctx's device (its state lives there). Statuses: SUCCESS; INVALID_HANDLE;
 *  INVALID_ARGUMENT (NULL, struct_size too small, a field out of range); OUT_OF_MEMORY; CUDA. */
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

/** The scaler's full state, for checkpoints: scale, good steps since the last growth or overflow,
 *  and hysteresis count left. get synchronizes; set validates (scale a normal float > 0, counts in
 *  range) and writes. Statuses: SUCCESS; INVALID_HANDLE; INVALID_ARGUMENT; CUDA. */
typedef struct fp8amp_grad_scaler_state {
    float scale;
    int32_t growth_tracker;
    int32_t hysteresis_left;
} fp8amp_grad_scaler_state;
FP8AMP_API fp8amp_status fp8amp_grad_scaler_get_state(fp8amp_grad_scaler scaler, fp8amp_grad_scaler_state *state);
FP8AMP_API fp8amp_status fp8amp_grad_scaler_set_state(fp8amp_grad_scaler scaler, const fp8amp_grad_scaler_state *state);

/** Updates the scaler from the found_inf of opt's last step, on the device (no host sync), for steps
 *  that were not given the scaler in their step args (a step that was given it already updated it:
 *  do not update twice). Statuses: SUCCESS; INVALID_HANDLE; DEVICE_MISMATCH; CUDA. */
FP8AMP_API fp8amp_status fp8amp_grad_scaler_update(fp8amp_grad_scaler scaler, fp8amp_optimizer opt);

/* ---------------------------------------------------------------------------------------------
 * Presets: the O1/O2/O3 optimization levels for a Linear and its optimizer together
 * ------------------------------------------------------------------------------------------- */

/** Fills both descriptors (either may be NULL) with the defaults, then the level's choices
 *  (MS-AMP's table, docs/design.md section 1): FP8 GEMMs and E4M3 weight gradients at every level;
 *  weights in scaled F16 (O1, O2) or E4M3 (O3); Adam state F32 + F32 (O1), E4M3 + F16 (O2, O3);
 *  an F16 master copy (O3). in_features and out_features stay 0: set them.
 *  Statuses: SUCCESS; INVALID_ARGUMENT (both NULL, unknown level). */
FP8AMP_API fp8amp_status fp8amp_opt_level_config(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc,
                                                 fp8amp_adam_desc *adam_desc);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FP8AMP_FP8AMP_H */
