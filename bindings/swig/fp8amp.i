/* fp8amp.i -- the language-neutral part of fp8amp's SWIG interface (issue 21).
 *
 * It wraps the public header capi/include/fp8amp/fp8amp.h as it is: every function keeps its C name
 * (minus the "fp8amp_" prefix, which the module already says) and its C arguments, so the header's
 * doc comments and docs/api.md are the reference of the generated layer too. What it adds:
 *   - statuses become the language's error: every function returning fp8amp_status raises, after
 *     its outputs are written and its temporaries freed, when the status is not FP8AMP_SUCCESS
 *     (the "ret" typemap below), carrying the status and fp8amp_last_error_message() read on the
 *     same thread right after the call;
 *   - handles are opaque values of the language (the library encodes a registry slot in them: it
 *     never dereferences one, so a stale value is INVALID_HANDLE, never a crash);
 *   - out-parameters and (count, pointer) pairs get the generic typemap names listed below;
 *   - option structs get a constructor that fills the defaults with the sized init of the header
 *     (fp8amp_recipe_init(r, sizeof *r) ...), so no binding ever passes a sizeof by hand;
 *   - byte / float / 16-bit-code copies in and out of a tensor (the header takes a void pointer and
 *     a byte count), and the O1/O2/O3 presets without their sizeof arguments, as small C helpers
 *     fp8amp_swig_*, wrapped under the name without that prefix (tensor_copy_from_host_floats,
 *     opt_level_init); the sized inits (fp8amp_recipe_init, ...) are the structs' constructors.
 *
 * A language file sets %module, then, before %include-ing this file, defines:
 *   FP8AMP_SWIG_RAISE(status)  C code (inside the wrapper) that raises the language's error for a
 *                              failed status; fp8amp_last_error_message() gives the message.
 *   FP8AMP_SWIG_HANDLE(TYPE)   a SWIG macro giving the typemaps of the handle type TYPE passed by
 *                              value, as an out-parameter `TYPE *OUTPUT`, and as an input array
 *                              `(int32_t COUNT, const TYPE *HANDLES)`.
 *   typemaps for  T *OUTPUT               (T: int32_t, int64_t, uint64_t, size_t, float, and the
 *                                          enums fp8amp_dtype and fp8amp_gemm_kind),
 *                 (int32_t COUNT, const int64_t *IN_ARRAY)    an input array and its length,
 *                 (int32_t COUNT, int64_t *INOUT_ARRAY), (int32_t COUNT, float *INOUT_ARRAY)
 *                                                            an array the call fills,
 *                 (const void *IN_BYTES, size_t NBYTES), (void *OUT_BYTES, size_t NBYTES)
 *                                                            a caller's memory block (zero copy),
 *                 (const int8_t / int16_t / float *IN_ARRAY, size_t LENGTH) and the OUT_ARRAY ones
 *                                                            a language array of elements,
 *                 (void *NULLABLE_OUT_BYTES, size_t NBYTES)  optimizer_save's buffer (NULL asks the size).
 * bindings/java/fp8amp_java.i is the example (under 300 lines, most of them JNI array plumbing).
 *
 * Not wrapped here (each needs a pointer the language cannot give safely, or a second library):
 * fp8amp_tensor_wrap / _rebind / _data (raw device or host addresses), the DLPack import/export,
 * fp8amp_context_set_stream / _get_stream (a cudaStream_t), fp8amp_context_set_allocator (C
 * function pointers called from any thread), fp8amp_grad_scaler_scale_device_ptr and
 * fp8amp_adam_step_args.lr_device (device addresses), and the communicators (fp8amp_comm_*: a
 * multi-process job is launched by mpirun/NCCL around the language, see docs/communicator.md). The
 * 0.1.0 compatibility entry points (fp8amp_*_init_default as functions, fp8amp_*_config) are left
 * out on purpose: they write 0.1.0's struct sizes.
 */

%include <stdint.i>

%{
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "fp8amp/fp8amp.h"
%}

/* ---- names: drop the prefix the module already carries --------------------------------------- */
/* Types get their C name without "fp8amp_" in CamelCase (fp8amp_linear_desc -> LinearDesc), enum
 * items lose "FP8AMP_" (FP8AMP_DTYPE_E4M3 -> DType.DTYPE_E4M3: C enum items share one scope, so
 * FORMAT_E4M3 must stay apart from DTYPE_E4M3), functions lose "fp8amp_" (tensor_create). */
%rename(Status) fp8amp_status;
%rename(DType) fp8amp_dtype;
%rename(DeviceType) fp8amp_device_type;
%rename(Device) fp8amp_device;
%rename(Format) fp8amp_format;
%rename(ScalingMode) fp8amp_scaling_mode;
%rename(AmaxAlgo) fp8amp_amax_algo;
%rename(Recipe) fp8amp_recipe;
%rename(ScalingStats) fp8amp_scaling_stats;
%rename(GemmPolicy) fp8amp_gemm_policy;
%rename(GemmKind) fp8amp_gemm_kind;
%rename(LinearRole) fp8amp_linear_role;
%rename(LinearDesc) fp8amp_linear_desc;
%rename(OptLevel) fp8amp_opt_level;
%rename(AdamDesc) fp8amp_adam_desc;
%rename(AdamStepArgs) fp8amp_adam_step_args;
%rename(GradScalerDesc) fp8amp_grad_scaler_desc;
%rename(GradScalerState) fp8amp_grad_scaler_state;
%rename(NormKind) fp8amp_norm_kind;
%rename(NormDesc) fp8amp_norm_desc;
%rename(Activation) fp8amp_activation;
%rename("%(strip:[FP8AMP_])s", %$isenumitem) "";
%rename("%(regex:/^fp8amp_(.*)$/\\1/)s", %$isfunction) "";

/* ---- not wrapped (see the top of this file) --------------------------------------------------- */
%ignore fp8amp_tensor_wrap;
%ignore fp8amp_tensor_rebind;
%ignore fp8amp_tensor_data;
%ignore fp8amp_tensor_from_dlpack;
%ignore fp8amp_tensor_to_dlpack;
%ignore DLManagedTensorVersioned;
%ignore fp8amp_context_set_stream;
%ignore fp8amp_context_get_stream;
%ignore fp8amp_context_set_allocator;
%ignore fp8amp_alloc_fn;
%ignore fp8amp_free_fn;
%ignore fp8amp_grad_scaler_scale_device_ptr;
%ignore fp8amp_adam_step_args::lr_device;
%ignore fp8amp_recipe_init;
%ignore fp8amp_recipe_init_default;
%ignore fp8amp_linear_desc_init;
%ignore fp8amp_linear_desc_init_default;
%ignore fp8amp_adam_desc_init;
%ignore fp8amp_adam_desc_init_default;
%ignore fp8amp_opt_level_adam_init;
%ignore fp8amp_opt_level_adam_config;
%ignore fp8amp_adam_step_args_init;
%ignore fp8amp_adam_step_args_init_default;
%ignore fp8amp_grad_scaler_desc_init;
%ignore fp8amp_grad_scaler_desc_init_default;
%ignore fp8amp_opt_level_init;
%ignore fp8amp_opt_level_config;
%ignore fp8amp_norm_desc_init;
%rename("$ignore", regextarget=1) "^fp8amp_comm_";
/* The sharded optimizer needs a communicator (not wrapped, above). */
%ignore fp8amp_optimizer_set_shard;
%ignore fp8amp_optimizer_shard_range;
%rename("$ignore", regextarget=1) "^FP8AMP_COMM_";
/* One parameter's state as tensor handles (a struct of handles the callee fills with new ones, which
 * the handle typemaps cannot express): the wrapped languages keep fp8amp_optimizer_save / _load. */
%ignore fp8amp_param_state;
%ignore fp8amp_param_state_init;
%ignore fp8amp_optimizer_param_state;
%ignore fp8amp_optimizer_set_param_state;
%ignore fp8amp_optimizer_set_step;
/* Read-only: the constructors below set it; a caller changing it would describe another layout. */
%immutable fp8amp_recipe::struct_size;
%immutable fp8amp_linear_desc::struct_size;
%immutable fp8amp_adam_desc::struct_size;
%immutable fp8amp_adam_step_args::struct_size;
%immutable fp8amp_grad_scaler_desc::struct_size;
%immutable fp8amp_norm_desc::struct_size;

/* ---- statuses: raise after outputs are written and temporaries freed -------------------------- */
%typemap(ret) fp8amp_status %{
  if ($1 != FP8AMP_SUCCESS) {
    FP8AMP_SWIG_RAISE($1);
  }
%}

/* ---- handles, out-parameters, arrays ---------------------------------------------------------- */
FP8AMP_SWIG_HANDLE(fp8amp_context)
FP8AMP_SWIG_HANDLE(fp8amp_tensor)
FP8AMP_SWIG_HANDLE(fp8amp_scaling)
FP8AMP_SWIG_HANDLE(fp8amp_linear)
FP8AMP_SWIG_HANDLE(fp8amp_optimizer)
FP8AMP_SWIG_HANDLE(fp8amp_grad_scaler)

%apply fp8amp_context *OUTPUT { fp8amp_context *out };
%apply fp8amp_tensor *OUTPUT { fp8amp_tensor *out };
%apply fp8amp_scaling *OUTPUT { fp8amp_scaling *out };
%apply fp8amp_linear *OUTPUT { fp8amp_linear *out };
%apply fp8amp_optimizer *OUTPUT { fp8amp_optimizer *out };
%apply fp8amp_grad_scaler *OUTPUT { fp8amp_grad_scaler *out };
%apply (int32_t COUNT, const fp8amp_scaling *HANDLES) { (int32_t n, const fp8amp_scaling *metas) };

%apply int32_t *OUTPUT { int32_t *count, int32_t *out, int32_t *found_inf };
%apply int64_t *OUTPUT { int64_t *out, int64_t *step };
%apply uint64_t *OUTPUT { uint64_t *out };
%apply size_t *OUTPUT { size_t *out, size_t *bytes, size_t *size };
%apply float *OUTPUT { float *amax, float *scale, float *scale_inv, float *norm };
%apply fp8amp_dtype *OUTPUT { fp8amp_dtype *out };
%apply fp8amp_gemm_kind *OUTPUT { fp8amp_gemm_kind *out };

%apply (int32_t COUNT, const int64_t *IN_ARRAY) { (int32_t ndim, const int64_t *shape) };
%apply (int32_t COUNT, int64_t *INOUT_ARRAY) { (int32_t capacity, int64_t *shape) };
%apply (int32_t COUNT, float *INOUT_ARRAY) { (int32_t capacity, float *history) };
%apply (const void *IN_BYTES, size_t NBYTES) { (const void *src, size_t nbytes) };
/* a checkpoint to load: the language's byte array */
%apply (const int8_t *IN_ARRAY, size_t LENGTH) { (const void *data, size_t size) };
%apply (void *OUT_BYTES, size_t NBYTES) { (void *dst, size_t nbytes) };
%apply (void *NULLABLE_OUT_BYTES, size_t NBYTES) { (void *buffer, size_t capacity) };

/* ---- the header itself ------------------------------------------------------------------------ */
#define FP8AMP_API
%include "fp8amp/version.h"
%include "fp8amp/fp8amp.h"

/* ---- option structs: constructors fill the library's defaults (the sized init) ---------------- */
/* The init cannot fail with this header's sizeof; calloc's NULL is the language's out-of-memory. */
%define FP8AMP_SWIG_DEFAULTS(TYPE, INIT)
%extend TYPE {
  TYPE() {
    TYPE *self_ = (TYPE *)calloc(1, sizeof(TYPE));
    if (self_) (void)INIT(self_, sizeof(TYPE));
    return self_;
  }
  ~TYPE() { free($self); }
}
%enddef
FP8AMP_SWIG_DEFAULTS(fp8amp_recipe, fp8amp_recipe_init)
FP8AMP_SWIG_DEFAULTS(fp8amp_linear_desc, fp8amp_linear_desc_init)
FP8AMP_SWIG_DEFAULTS(fp8amp_adam_desc, fp8amp_adam_desc_init)
FP8AMP_SWIG_DEFAULTS(fp8amp_adam_step_args, fp8amp_adam_step_args_init)
FP8AMP_SWIG_DEFAULTS(fp8amp_grad_scaler_desc, fp8amp_grad_scaler_desc_init)
FP8AMP_SWIG_DEFAULTS(fp8amp_norm_desc, fp8amp_norm_desc_init)

/* ---- helpers: typed host copies and the presets ----------------------------------------------- */
%apply (const int8_t *IN_ARRAY, size_t LENGTH) { (const int8_t *src, size_t count) };
%apply (const int16_t *IN_ARRAY, size_t LENGTH) { (const int16_t *src, size_t count) };
%apply (const float *IN_ARRAY, size_t LENGTH) { (const float *src, size_t count) };
%apply (int8_t *OUT_ARRAY, size_t LENGTH) { (int8_t *dst, size_t count) };
%apply (int16_t *OUT_ARRAY, size_t LENGTH) { (int16_t *dst, size_t count) };
%apply (float *OUT_ARRAY, size_t LENGTH) { (float *dst, size_t count) };
%rename("%(regex:/^fp8amp_swig_(.*)$/\\1/)s", regextarget=1, %$isfunction) "^fp8amp_swig_";
%inline %{
/* fp8amp_tensor_copy_from_host / _to_host with `count` elements of 1, 2 or 4 bytes (FP8 codes,
 * F16/BF16 codes, F32 values): the library checks count * size against the tensor's byte size. */
fp8amp_status fp8amp_swig_tensor_copy_from_host_bytes(fp8amp_tensor t, const int8_t *src, size_t count) {
  return fp8amp_tensor_copy_from_host(t, src, count);
}
fp8amp_status fp8amp_swig_tensor_copy_from_host_shorts(fp8amp_tensor t, const int16_t *src, size_t count) {
  return fp8amp_tensor_copy_from_host(t, src, count * sizeof(int16_t));
}
fp8amp_status fp8amp_swig_tensor_copy_from_host_floats(fp8amp_tensor t, const float *src, size_t count) {
  return fp8amp_tensor_copy_from_host(t, src, count * sizeof(float));
}
fp8amp_status fp8amp_swig_tensor_copy_to_host_bytes(fp8amp_tensor t, int8_t *dst, size_t count) {
  return fp8amp_tensor_copy_to_host(t, dst, count);
}
fp8amp_status fp8amp_swig_tensor_copy_to_host_shorts(fp8amp_tensor t, int16_t *dst, size_t count) {
  return fp8amp_tensor_copy_to_host(t, dst, count * sizeof(int16_t));
}
fp8amp_status fp8amp_swig_tensor_copy_to_host_floats(fp8amp_tensor t, float *dst, size_t count) {
  return fp8amp_tensor_copy_to_host(t, dst, count * sizeof(float));
}
/* The presets (fp8amp_opt_level_init / fp8amp_opt_level_adam_init) with this header's sizeofs;
 * either descriptor may be NULL. */
fp8amp_status fp8amp_swig_opt_level_init(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc,
                                         fp8amp_adam_desc *adam_desc) {
  return fp8amp_opt_level_init(level, linear_desc, sizeof(fp8amp_linear_desc), adam_desc, sizeof(fp8amp_adam_desc));
}
fp8amp_status fp8amp_swig_opt_level_adam_init(fp8amp_opt_level level, fp8amp_adam_desc *desc) {
  return fp8amp_opt_level_adam_init(level, desc, sizeof(fp8amp_adam_desc));
}
%}
