/* The smallest program that uses an installed fp8amp: found through pkg-config or find_package.
 * Quantizes a few values to E4M3 on the CPU and prints them back. */
#include <stdio.h>

#include <fp8amp/fp8amp.h>

int main(void) {
    fp8amp_context ctx;
    fp8amp_tensor x, q, back;
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    const int64_t shape[1] = {4};
    const float in[4] = {0.1f, 1.0625f, 300.0f, 1000.0f};
    float out[4];
    if (fp8amp_context_create(cpu, &ctx) != FP8AMP_SUCCESS ||
        fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &x) != FP8AMP_SUCCESS ||
        fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &q) != FP8AMP_SUCCESS ||
        fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &back) != FP8AMP_SUCCESS ||
        fp8amp_tensor_copy_from_host(x, in, sizeof in) != FP8AMP_SUCCESS || fp8amp_cast(ctx, x, q) != FP8AMP_SUCCESS ||
        fp8amp_cast(ctx, q, back) != FP8AMP_SUCCESS || fp8amp_tensor_copy_to_host(back, out, sizeof out) != FP8AMP_SUCCESS) {
        fprintf(stderr, "fp8amp error: %s\n", fp8amp_last_error_message());
        return 1;
    }
    for (int i = 0; i < 4; ++i) printf("%g -> e4m3 -> %g\n", in[i], out[i]);
    fp8amp_tensor_destroy(x);
    fp8amp_tensor_destroy(q);
    fp8amp_tensor_destroy(back);
    fp8amp_context_destroy(ctx);
    /* 0.1 -> 0.1015625, 1.0625 (a tie) -> 1, 300 -> 288, 1000 -> 448 (saturated) */
    return (out[0] == 0.1015625f && out[1] == 1.0f && out[2] == 288.0f && out[3] == 448.0f) ? 0 : 1;
}
