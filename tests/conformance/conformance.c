/* The conformance scenario's C runner (tests/conformance/SCENARIO.md): the reference file every other
 * binding's runner must reproduce byte for byte. Usage: conformance OUTPUT_PATH.
 * Exits 0 on success; on a failed call prints the call, its status name and the library's message to
 * stderr and exits 1. C99 against the public header only. */
#include <fp8amp/fp8amp.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M 16  /* rows of X, DY */
#define K 32  /* in_features */
#define N 24  /* out_features */

/* Every call goes through CHECK: the first failure ends the run with the library's message. */
#define CHECK(call)                                                                                  \
    do {                                                                                             \
        fp8amp_status st_ = (call);                                                                  \
        if (st_ != FP8AMP_SUCCESS) {                                                                 \
            fprintf(stderr, "conformance: %s failed: %s: %s\n", #call, fp8amp_status_name(st_),      \
                    fp8amp_last_error_message());                                                    \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* The inputs of SCENARIO.md, "Inputs": exact integers divided in float32. The integer products fit
 * in int64 (i < 768, factors < 2^17). */
static void make_inputs(float *x, float *w, float *b, float *dy) {
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 2003 - 1001) / 173.0f;
    for (int64_t i = 0; i < N * K; i++) w[i] = (float)((i * 104729) % 1999 - 999) / 4096.0f;
    for (int64_t i = 0; i < N; i++) b[i] = (float)((i * 31) % 17 - 8) / 64.0f;
    for (int64_t i = 0; i < M * N; i++) dy[i] = (float)((i * 31337) % 997 - 498) / 256.0f;
}

static fp8amp_tensor tensor(fp8amp_context ctx, fp8amp_dtype dtype, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    fp8amp_tensor t;
    CHECK(fp8amp_tensor_create(ctx, dtype, cols > 0 ? 2 : 1, shape, &t));
    return t;
}

/* Appends the tensor's bytes to the output file. */
static void record(FILE *f, fp8amp_tensor t, size_t nbytes, const char *name) {
    size_t have;
    CHECK(fp8amp_tensor_nbytes(t, &have));
    if (have != nbytes) {
        fprintf(stderr, "conformance: %s has %zu bytes, the scenario says %zu\n", name, have, nbytes);
        exit(1);
    }
    unsigned char *buf = malloc(nbytes);
    if (!buf) {
        fprintf(stderr, "conformance: out of memory\n");
        exit(1);
    }
    CHECK(fp8amp_tensor_copy_to_host(t, buf, nbytes));
    if (fwrite(buf, 1, nbytes, f) != nbytes) {
        fprintf(stderr, "conformance: writing %s failed\n", name);
        exit(1);
    }
    free(buf);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTPUT_PATH\n", argv[0]);
        return 2;
    }
    /* The file is little-endian by definition; this runner writes host order, so it refuses a
     * big-endian host rather than write a different file. */
    const uint32_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        fprintf(stderr, "conformance: this runner writes the host's byte order and needs a little-endian host\n");
        return 1;
    }
    static float x[M * K], w[N * K], b[N], dy[M * N];
    make_inputs(x, w, b, dy);

    fp8amp_context ctx;
    fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    CHECK(fp8amp_context_create(cpu, &ctx));

    /* 1. Quantize / dequantize with a default-recipe E4M3 meta at scale 4. */
    fp8amp_recipe recipe;
    CHECK(fp8amp_recipe_init(&recipe, sizeof recipe));
    fp8amp_scaling meta;
    CHECK(fp8amp_scaling_create(ctx, &recipe, FP8AMP_DTYPE_E4M3, &meta));
    CHECK(fp8amp_scaling_set_scale(meta, 4.0f));
    fp8amp_tensor tx = tensor(ctx, FP8AMP_DTYPE_F32, M, K);
    CHECK(fp8amp_tensor_copy_from_host(tx, x, sizeof x));
    fp8amp_tensor tq = tensor(ctx, FP8AMP_DTYPE_E4M3, M, K);
    CHECK(fp8amp_tensor_set_scaling(tq, meta));
    CHECK(fp8amp_quantize(ctx, tx, tq));
    fp8amp_tensor td = tensor(ctx, FP8AMP_DTYPE_F32, M, K);
    CHECK(fp8amp_dequantize(ctx, tq, td));

    /* 2. The Linear: BF16 weight from W by fp8amp_cast, F32 bias from B, forward and backward. */
    fp8amp_linear_desc ld;
    CHECK(fp8amp_linear_desc_init(&ld, sizeof ld));
    ld.in_features = K;
    ld.out_features = N;
    ld.has_bias = 1;
    ld.weight_dtype = FP8AMP_DTYPE_BF16;
    ld.wgrad_dtype = FP8AMP_DTYPE_E4M3;
    ld.policy = FP8AMP_GEMM_ALWAYS_FP8;
    fp8amp_linear lin;
    CHECK(fp8amp_linear_create(ctx, &ld, &lin));
    fp8amp_tensor weight, bias, wgrad, bgrad, wgrad_si;
    CHECK(fp8amp_linear_weight(lin, &weight));
    CHECK(fp8amp_linear_bias(lin, &bias));
    fp8amp_tensor tw = tensor(ctx, FP8AMP_DTYPE_F32, N, K);
    CHECK(fp8amp_tensor_copy_from_host(tw, w, sizeof w));
    CHECK(fp8amp_cast(ctx, tw, weight));
    CHECK(fp8amp_tensor_copy_from_host(bias, b, sizeof b));
    fp8amp_tensor ty = tensor(ctx, FP8AMP_DTYPE_F32, M, N);
    CHECK(fp8amp_linear_forward(lin, tx, ty, 1));
    fp8amp_tensor tdy = tensor(ctx, FP8AMP_DTYPE_F32, M, N);
    CHECK(fp8amp_tensor_copy_from_host(tdy, dy, sizeof dy));
    fp8amp_tensor tdx = tensor(ctx, FP8AMP_DTYPE_F32, M, K);
    CHECK(fp8amp_linear_backward(lin, tdy, tdx, 0));
    CHECK(fp8amp_linear_weight_grad(lin, &wgrad));
    CHECK(fp8amp_linear_bias_grad(lin, &bgrad));
    CHECK(fp8amp_tensor_scale_inv(wgrad, &wgrad_si));

    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    record(f, tq, 512, "Q");
    record(f, td, 2048, "D");
    record(f, ty, 1536, "Y");
    record(f, tdx, 2048, "DX");
    record(f, wgrad, 768, "WGRAD");
    record(f, wgrad_si, 4, "WGRAD_SCALE_INV");
    record(f, bgrad, 96, "BGRAD");

    /* 3. One O2 AdamW step over the weight and the bias. */
    fp8amp_adam_desc ad;
    CHECK(fp8amp_opt_level_adam_init(FP8AMP_OPT_LEVEL_O2, &ad, sizeof ad));
    ad.lr = 1e-3f;
    fp8amp_optimizer opt;
    CHECK(fp8amp_optimizer_create(ctx, &ad, &opt));
    CHECK(fp8amp_optimizer_add_param(opt, weight, wgrad));
    CHECK(fp8amp_optimizer_add_param(opt, bias, bgrad));
    fp8amp_adam_step_args args;
    CHECK(fp8amp_adam_step_args_init_default(&args));
    CHECK(fp8amp_optimizer_step(opt, &args));
    int32_t found_inf = -1;
    CHECK(fp8amp_optimizer_get_found_inf(opt, &found_inf));
    record(f, weight, 1536, "W_AFTER");
    record(f, bias, 96, "B_AFTER");
    /* The optimizer's checkpoint after the step: its length (uint64) and its bytes. */
    size_t ckpt_size = 0;
    CHECK(fp8amp_optimizer_save(opt, NULL, 0, &ckpt_size));
    unsigned char *ckpt = malloc(ckpt_size ? ckpt_size : 1);
    if (!ckpt) {
        fprintf(stderr, "conformance: out of memory\n");
        return 1;
    }
    CHECK(fp8amp_optimizer_save(opt, ckpt, ckpt_size, &ckpt_size));
    const uint64_t ckpt_len = ckpt_size;
    if (fwrite(&found_inf, 4, 1, f) != 1 || fwrite(&ckpt_len, 8, 1, f) != 1 ||
        fwrite(ckpt, 1, ckpt_size, f) != ckpt_size || fclose(f) != 0) {
        fprintf(stderr, "conformance: writing %s failed\n", argv[1]);
        return 1;
    }
    free(ckpt);

    CHECK(fp8amp_optimizer_destroy(opt));
    fp8amp_tensor all[] = {tx, tq, td, tw, ty, tdy, tdx, weight, bias, wgrad, bgrad, wgrad_si};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK(fp8amp_tensor_destroy(all[i]));
    CHECK(fp8amp_linear_destroy(lin));
    CHECK(fp8amp_scaling_destroy(meta));
    CHECK(fp8amp_context_destroy(ctx));
    return 0;
}
