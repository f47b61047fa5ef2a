/* The optimizer through the public C API, on plain parameter/gradient tensors from any source:
 * fit w to a random linear least-squares problem with O2 AdamW (E4M3 m + F16 v), a dynamic loss
 * scaler, gradient clipping, and a checkpoint round trip. Gradients are computed here on the host
 * and copied in; in a real job a framework or an FP8 Linear writes them into the same tensor.
 *
 * Usage: optimizer_example [cpu|cuda]     Prints the loss every 50 steps; exits 0 if it converged. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8amp/fp8amp.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        fp8amp_status st_ = (call);                                                                \
        if (st_ != FP8AMP_SUCCESS) {                                                               \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, fp8amp_status_name(st_),                 \
                    fp8amp_last_error_message());                                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { N = 256, ROWS = 512 };

int main(int argc, char **argv) {
    fp8amp_device dev = {FP8AMP_DEVICE_CPU, 0};
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) dev.type = FP8AMP_DEVICE_CUDA;
    fp8amp_context ctx;
    CHECK(fp8amp_context_create(dev, &ctx));

    /* The problem: minimize |A w - y|^2 / ROWS. */
    static float A[ROWS][N], y[ROWS], w[N], g[N], r[ROWS];
    srand(7);
    for (int i = 0; i < ROWS; ++i)
        for (int j = 0; j < N; ++j) A[i][j] = (float)rand() / RAND_MAX - 0.5f;
    for (int j = 0; j < N; ++j) w[j] = (float)rand() / RAND_MAX - 0.5f; /* the target */
    for (int i = 0; i < ROWS; ++i) {
        y[i] = 0;
        for (int j = 0; j < N; ++j) y[i] += A[i][j] * w[j];
    }
    memset(w, 0, sizeof w);

    /* The parameter and its gradient: plain F32 tensors. */
    const int64_t shape[1] = {N};
    fp8amp_tensor param, grad;
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &param));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &grad));
    CHECK(fp8amp_tensor_copy_from_host(param, w, sizeof w));

    /* O2 AdamW, clipping at norm 1. */
    fp8amp_adam_desc desc;
    CHECK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &desc));
    desc.lr = 2e-2f;
    desc.weight_decay = 0.0f;
    desc.max_grad_norm = 1.0f;
    fp8amp_optimizer opt;
    CHECK(fp8amp_optimizer_create(ctx, &desc, &opt));
    CHECK(fp8amp_optimizer_add_param(opt, param, grad));

    /* The loss scaler: gradients arrive multiplied by its scale; the step unscales them. */
    fp8amp_grad_scaler_desc sdesc;
    CHECK(fp8amp_grad_scaler_desc_init_default(&sdesc));
    fp8amp_grad_scaler scaler;
    CHECK(fp8amp_grad_scaler_create(ctx, &sdesc, &scaler));
    fp8amp_adam_step_args args;
    CHECK(fp8amp_adam_step_args_init_default(&args));
    args.scaler = scaler;

    double loss = 0;
    for (int step = 1; step <= 400; ++step) {
        CHECK(fp8amp_tensor_copy_to_host(param, w, sizeof w));
        float scale;
        CHECK(fp8amp_grad_scaler_get_scale(scaler, &scale)); /* a real job keeps it on the device */
        loss = 0;
        for (int i = 0; i < ROWS; ++i) {
            r[i] = -y[i];
            for (int j = 0; j < N; ++j) r[i] += A[i][j] * w[j];
            loss += (double)r[i] * r[i] / ROWS;
        }
        for (int j = 0; j < N; ++j) {
            double s = 0;
            for (int i = 0; i < ROWS; ++i) s += 2.0 * r[i] * A[i][j] / ROWS;
            g[j] = (float)(s * scale); /* the gradient of loss * scale */
        }
        if (step == 100) g[3] = INFINITY; /* an overflow: this step is skipped, the scale backs off */
        CHECK(fp8amp_tensor_copy_from_host(grad, g, sizeof g));
        args.lr = step < 300 ? 2e-2f : 5e-3f; /* any schedule: lr is a per-step argument */
        CHECK(fp8amp_optimizer_step(opt, &args));
        if (step % 50 == 0 || step == 100) {
            int32_t skipped;
            int64_t taken;
            float norm;
            CHECK(fp8amp_optimizer_get_found_inf(opt, &skipped));
            CHECK(fp8amp_optimizer_get_step(opt, &taken));
            CHECK(fp8amp_optimizer_get_grad_norm(opt, &norm));
            printf("step %3d: loss %.6f, grad norm %.4g, skipped %d, steps taken %lld, loss scale %g\n", step, loss,
                   norm, skipped, (long long)taken, scale);
        }
    }

    /* A checkpoint: size, write, load back (into the same optimizer here; any optimizer with the
     * same parameters, on any device, takes it). */
    size_t size = 0, bytes = 0;
    CHECK(fp8amp_optimizer_save(opt, NULL, 0, &size));
    void *ckpt = malloc(size);
    CHECK(fp8amp_optimizer_save(opt, ckpt, size, &size));
    CHECK(fp8amp_optimizer_load(opt, ckpt, size));
    CHECK(fp8amp_optimizer_state_bytes(opt, &bytes));
    printf("checkpoint %zu bytes; optimizer holds %zu bytes for %d parameters\n", size, bytes, N);
    free(ckpt);

    CHECK(fp8amp_grad_scaler_destroy(scaler));
    CHECK(fp8amp_optimizer_destroy(opt));
    CHECK(fp8amp_tensor_destroy(param));
    CHECK(fp8amp_tensor_destroy(grad));
    CHECK(fp8amp_context_destroy(ctx));
    return loss < 1e-3 ? 0 : 1;
}
