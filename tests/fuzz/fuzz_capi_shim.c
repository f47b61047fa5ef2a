/* The calls of fuzz_capi that take an enum by value, made from C: a C caller may pass any int as an
 * enum (the header's contract: a value that is not an enumerator is refused), while in C++ even
 * holding such a value in an enum-typed variable is undefined (UBSan's -fsanitize=enum would
 * report the harness itself). */
#include "fp8amp/fp8amp.h"

fp8amp_status fuzz_context_create(int type, int32_t index, fp8amp_context *out) {
    fp8amp_device d;
    d.type = (fp8amp_device_type)type;
    d.index = index;
    return fp8amp_context_create(d, out);
}
fp8amp_status fuzz_tensor_create(fp8amp_context ctx, int dtype, int32_t ndim, const int64_t *shape, fp8amp_tensor *out) {
    return fp8amp_tensor_create(ctx, (fp8amp_dtype)dtype, ndim, shape, out);
}
fp8amp_status fuzz_tensor_wrap(fp8amp_context ctx, int dtype, int32_t ndim, const int64_t *shape, void *data,
                               fp8amp_tensor *out) {
    return fp8amp_tensor_wrap(ctx, (fp8amp_dtype)dtype, ndim, shape, data, out);
}
fp8amp_status fuzz_scaling_create(fp8amp_context ctx, const fp8amp_recipe *recipe, int dtype, fp8amp_scaling *out) {
    return fp8amp_scaling_create(ctx, recipe, (fp8amp_dtype)dtype, out);
}
fp8amp_status fuzz_linear_scaling(fp8amp_linear lin, int role, fp8amp_scaling *out) {
    return fp8amp_linear_scaling(lin, (fp8amp_linear_role)role, out);
}
fp8amp_status fuzz_device_count(int type, int32_t *count) { return fp8amp_device_count((fp8amp_device_type)type, count); }
size_t fuzz_dtype_size(int dtype) { return fp8amp_dtype_size((fp8amp_dtype)dtype); }
const char *fuzz_dtype_name(int dtype) { return fp8amp_dtype_name((fp8amp_dtype)dtype); }
const char *fuzz_status_name(int status) { return fp8amp_status_name((fp8amp_status)status); }
fp8amp_status fuzz_opt_level_adam_config(int level, fp8amp_adam_desc *desc) {
    return (fp8amp_opt_level_adam_config)((fp8amp_opt_level)level, desc); /* the FP8AMP_0 entry point */
}
fp8amp_status fuzz_opt_level_config(int level, fp8amp_linear_desc *ld, fp8amp_adam_desc *ad) {
    return (fp8amp_opt_level_config)((fp8amp_opt_level)level, ld, ad); /* the FP8AMP_0 entry point */
}
fp8amp_status fuzz_activation_forward(fp8amp_context ctx, int kind, fp8amp_tensor x, fp8amp_tensor y, fp8amp_tensor y_t) {
    return fp8amp_activation_forward(ctx, (fp8amp_activation)kind, x, y, y_t);
}
fp8amp_status fuzz_activation_backward(fp8amp_context ctx, int kind, fp8amp_tensor dy, fp8amp_tensor x, fp8amp_tensor dx,
                                       fp8amp_tensor dx_t) {
    return fp8amp_activation_backward(ctx, (fp8amp_activation)kind, dy, x, dx, dx_t);
}
