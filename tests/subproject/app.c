/* The subproject's program: a CPU context, a cast, a version check, through fp8amp::fp8amp. */
#include <fp8amp/fp8amp.h>
#include <stdio.h>

int main(void) {
    fp8amp_context ctx;
    fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    fp8amp_tensor src, dst;
    const int64_t shape[1] = {3};
    const float in[3] = {1.0f, -448.0f, 1000.0f};
    unsigned char out[3];
    if (fp8amp_context_create(cpu, &ctx) != FP8AMP_SUCCESS ||
        fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &src) != FP8AMP_SUCCESS ||
        fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &dst) != FP8AMP_SUCCESS ||
        fp8amp_tensor_copy_from_host(src, in, sizeof in) != FP8AMP_SUCCESS || fp8amp_cast(ctx, src, dst) != FP8AMP_SUCCESS ||
        fp8amp_tensor_copy_to_host(dst, out, sizeof out) != FP8AMP_SUCCESS) {
        fprintf(stderr, "app: %s\n", fp8amp_last_error_message());
        return 1;
    }
    /* E4M3: 1.0 is 0x38, -448 is 0xFE, 1000 saturates to 448 (0x7E) */
    if (out[0] != 0x38 || out[1] != 0xFE || out[2] != 0x7E) {
        fprintf(stderr, "app: cast gave %02x %02x %02x\n", out[0], out[1], out[2]);
        return 1;
    }
    fp8amp_tensor_destroy(src);
    fp8amp_tensor_destroy(dst);
    fp8amp_context_destroy(ctx);
    if (fp8amp_version() != FP8AMP_VERSION) {
        fprintf(stderr, "app: the library is %u, the header %u\n", (unsigned)fp8amp_version(), (unsigned)FP8AMP_VERSION);
        return 1;
    }
    printf("app: fp8amp %u as a subproject: ok\n", (unsigned)fp8amp_version());
    return 0;
}
