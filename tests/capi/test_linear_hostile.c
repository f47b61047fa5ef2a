/* A Linear's tensors against calls that would break the Linear (issue 22, defect 2).
 *
 * Every tensor a Linear hands out (weight, bias, weight_grad, bias_grad, and the scale_inv slot of a
 * scaled weight or gradient) is the Linear's: fp8amp_tensor_set_scaling on it (unbinding, binding to
 * another meta, re-binding to its own meta, which would reset the scale its codes stand for) and
 * fp8amp_tensor_rebind are refused with INVALID_ARGUMENT and a message naming the owner, and the
 * refused call leaves the Linear working: a forward and backward afterwards give exactly the bytes of
 * a twin Linear that was never touched. Before the fix, unbinding an E4M3 weight gradient returned
 * SUCCESS and the next backward dereferenced the missing meta (a crash). Each test runs on the CPU
 * and on CUDA (skipped without a GPU), with fresh random data. */
#include "test_util.h"

enum { K = 32, N = 48, M = 32 };

typedef struct {
    const char *name;
    fp8amp_dtype weight_dtype, wgrad_dtype;
} hostile_cfg;

static const hostile_cfg kConfigs[] = {
    {"bf16 weight, e4m3 wgrad", FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3},
    {"scaled f16 weight (O1/O2)", FP8AMP_DTYPE_F16, FP8AMP_DTYPE_E4M3},
    {"e4m3 weight (O3)", FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E4M3},
    {"f32 weight, bf16 wgrad", FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16},
};

static float *random_floats(size_t n) {
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) p[i] = (float)test_rng_uniform(-1.0, 1.0);
    return p;
}

static fp8amp_tensor f32_tensor(fp8amp_context ctx, int64_t rows, int64_t cols, const float *values) {
    const int64_t shape[2] = {rows, cols};
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, values, (size_t)(rows * cols) * sizeof(float)));
    return t;
}

static fp8amp_linear make_linear(fp8amp_context ctx, const hostile_cfg *cfg, fp8amp_tensor w_src, const float *bias) {
    fp8amp_linear_desc d;
    fp8amp_linear lin = NULL;
    fp8amp_tensor w, b;
    EXPECT_OK(fp8amp_linear_desc_init_default(&d));
    d.in_features = K;
    d.out_features = N;
    d.weight_dtype = cfg->weight_dtype;
    d.wgrad_dtype = cfg->wgrad_dtype;
    d.policy = FP8AMP_GEMM_ALWAYS_FP8;
    d.recipe.mode = FP8AMP_SCALING_CURRENT;
    EXPECT_OK(fp8amp_linear_create(ctx, &d, &lin));
    EXPECT_OK(fp8amp_linear_weight(lin, &w));
    EXPECT_OK(fp8amp_cast(ctx, w_src, w)); /* scale 1: the scaled weights' slot holds 1 */
    EXPECT_OK(fp8amp_linear_bias(lin, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, bias, N * sizeof(float)));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    return lin;
}

/* One forward + backward; the bytes of y, dx, the weight gradient and the bias gradient. */
static void run_step(fp8amp_context ctx, fp8amp_linear lin, fp8amp_tensor x, fp8amp_tensor dy, unsigned char *out,
                     size_t *out_len) {
    const int64_t ys[2] = {M, N}, xs[2] = {M, K};
    fp8amp_tensor y = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, ys), dx = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, xs);
    fp8amp_tensor wg, bg;
    size_t off = 0, nb;
    EXPECT_OK(fp8amp_linear_forward(lin, x, y, 1));
    EXPECT_OK(fp8amp_linear_backward(lin, dy, dx, 0));
    EXPECT_OK(fp8amp_linear_weight_grad(lin, &wg));
    EXPECT_OK(fp8amp_linear_bias_grad(lin, &bg));
    fp8amp_tensor parts[4] = {y, dx, wg, bg};
    for (int i = 0; i < 4; ++i) {
        nb = tensor_bytes(parts[i]);
        EXPECT_OK(fp8amp_tensor_copy_to_host(parts[i], out + off, nb));
        off += nb;
    }
    *out_len = off;
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(parts[i]));
}

/* fp8amp_tensor_set_scaling / fp8amp_tensor_rebind on `t` are refused, naming the Linear. */
static void expect_refused(fp8amp_tensor t, fp8amp_scaling other, const char *what) {
    float word = 0.0f;
    const int64_t one = 1;
    print_message("  %s\n", what);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "Linear"));
    EXPECT_STATUS(fp8amp_tensor_rebind(t, &word, 1, &one), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "Linear"));
    if (other) {
        fp8amp_status st = fp8amp_tensor_set_scaling(t, other);
        /* A meta of another dtype is DTYPE_MISMATCH for an unscaled tensor; for the Linear's scaled
         * tensors the ownership check comes first. */
        assert_true(st == FP8AMP_ERROR_INVALID_ARGUMENT || st == FP8AMP_ERROR_DTYPE_MISMATCH);
    }
}

static void test_owned_tensors_refuse_rebinding(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    for (size_t c = 0; c < sizeof kConfigs / sizeof kConfigs[0]; ++c) {
        const hostile_cfg *cfg = &kConfigs[c];
        fp8amp_context ctx = make_context(dev);
        float *wv = random_floats(N * K), *bv = random_floats(N), *xv = random_floats(M * K), *dyv = random_floats(M * N);
        fp8amp_tensor w_src = f32_tensor(ctx, N, K, wv), x = f32_tensor(ctx, M, K, xv), dy = f32_tensor(ctx, M, N, dyv);
        fp8amp_linear lin = make_linear(ctx, cfg, w_src, bv), twin = make_linear(ctx, cfg, w_src, bv);
        fp8amp_tensor w, b, wg, bg;
        fp8amp_scaling e4m3_meta, f16_meta, own;
        fp8amp_recipe r;
        unsigned char *got = xmalloc(4 * (M * N + M * K + 2 * N * K + N) * 4), *want = xmalloc(4 * (M * N + M * K + 2 * N * K + N) * 4);
        size_t got_len, want_len;
        print_message("%s\n", cfg->name);

        EXPECT_OK(fp8amp_recipe_init_default(&r));
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &e4m3_meta));
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &f16_meta));
        /* A step first, so that every cache and saved buffer exists when the hostile calls come. */
        run_step(ctx, lin, x, dy, got, &got_len);
        run_step(ctx, twin, x, dy, want, &want_len);

        EXPECT_OK(fp8amp_linear_weight(lin, &w));
        EXPECT_OK(fp8amp_linear_bias(lin, &b));
        EXPECT_OK(fp8amp_linear_weight_grad(lin, &wg));
        EXPECT_OK(fp8amp_linear_bias_grad(lin, &bg));
        expect_refused(w, cfg->weight_dtype == FP8AMP_DTYPE_F16 ? f16_meta : e4m3_meta, "weight");
        expect_refused(b, NULL, "bias");
        expect_refused(wg, e4m3_meta, "weight_grad");
        expect_refused(bg, NULL, "bias_grad");
        /* Re-binding a scaled tensor to its own meta would reset its scale_inv slot to the meta's:
         * refused too. */
        if (cfg->wgrad_dtype == FP8AMP_DTYPE_E4M3) {
            EXPECT_OK(fp8amp_linear_scaling(lin, FP8AMP_ROLE_WEIGHT_GRAD, &own));
            EXPECT_STATUS(fp8amp_tensor_set_scaling(wg, own), FP8AMP_ERROR_INVALID_ARGUMENT);
            EXPECT_OK(fp8amp_scaling_destroy(own));
        }
        if (cfg->weight_dtype == FP8AMP_DTYPE_E4M3 || cfg->weight_dtype == FP8AMP_DTYPE_F16) {
            fp8amp_tensor slot;
            EXPECT_OK(fp8amp_linear_scaling(lin, FP8AMP_ROLE_WEIGHT_STORAGE, &own));
            EXPECT_STATUS(fp8amp_tensor_set_scaling(w, own), FP8AMP_ERROR_INVALID_ARGUMENT);
            EXPECT_OK(fp8amp_scaling_destroy(own));
            /* The scale_inv slot's tensor is no wrap either: rebind refused. */
            EXPECT_OK(fp8amp_tensor_scale_inv(w, &slot));
            {
                float word = 0.0f;
                EXPECT_STATUS(fp8amp_tensor_rebind(slot, &word, 0, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
            }
            EXPECT_OK(fp8amp_tensor_destroy(slot));
        }

        /* The Linear still works, bit for bit like its untouched twin. */
        run_step(ctx, lin, x, dy, got, &got_len);
        run_step(ctx, twin, x, dy, want, &want_len);
        assert_int_equal(got_len, want_len);
        assert_memory_equal(got, want, want_len);

        /* After the Linear is gone the tensors are ordinary again: the handles may do as they like. */
        EXPECT_OK(fp8amp_linear_destroy(lin));
        EXPECT_OK(fp8amp_linear_destroy(twin));
        if (cfg->wgrad_dtype == FP8AMP_DTYPE_E4M3) EXPECT_OK(fp8amp_tensor_set_scaling(wg, NULL));

        fp8amp_tensor all[] = {w, b, wg, bg, w_src, x, dy};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
        EXPECT_OK(fp8amp_scaling_destroy(e4m3_meta));
        EXPECT_OK(fp8amp_scaling_destroy(f16_meta));
        EXPECT_OK(fp8amp_context_destroy(ctx));
        free(wv), free(bv), free(xv), free(dyv), free(got), free(want);
    }
}

/* The Linear's own tensors as the outputs or inputs of its calls. A backward given its own weight
 * gradient as dy overwrote dy with dW before summing the bias gradient from it (a wrong bias
 * gradient, SUCCESS); dx over the weight, or over a gradient the same call writes, and y over the
 * weight or bias (read by the GEMM that writes y: a race on CUDA) are just as wrong. Each is
 * INVALID_ARGUMENT naming the tensor, and the refused call changes nothing: a forward and backward
 * afterwards match an untouched twin's. A square F32 Linear (M = N = K), so that the shapes fit. */
static void test_own_tensors_as_arguments(void **state) {
    require_variant(state);
    enum { S = 32 };
    const fp8amp_device dev = variant_device(state);
    static const fp8amp_gemm_policy policies[2] = {FP8AMP_GEMM_NEVER_FP8, FP8AMP_GEMM_ALWAYS_FP8};
    for (int pi = 0; pi < 2; ++pi) {
        fp8amp_context ctx = make_context(dev);
        fp8amp_linear lin[2];
        fp8amp_tensor w[2], b[2], wg[2], bg[2];
        float *wv = random_floats(S * S), *bv = random_floats(S), *xv = random_floats(S * S), *dyv = random_floats(S * S);
        fp8amp_tensor x = f32_tensor(ctx, S, S, xv), dy = f32_tensor(ctx, S, S, dyv), y = f32_tensor(ctx, S, S, xv),
                      dx = f32_tensor(ctx, S, S, xv), w_src = f32_tensor(ctx, S, S, wv), bias_view;
        unsigned char *got[2];
        print_message("policy %d\n", (int)policies[pi]);
        for (int i = 0; i < 2; ++i) {
            fp8amp_linear_desc d;
            EXPECT_OK(fp8amp_linear_desc_init_default(&d));
            d.in_features = d.out_features = S;
            d.weight_dtype = FP8AMP_DTYPE_F32;
            d.wgrad_dtype = FP8AMP_DTYPE_F32;
            d.policy = policies[pi];
            d.recipe.mode = FP8AMP_SCALING_CURRENT;
            EXPECT_OK(fp8amp_linear_create(ctx, &d, &lin[i]));
            EXPECT_OK(fp8amp_linear_weight(lin[i], &w[i]));
            EXPECT_OK(fp8amp_cast(ctx, w_src, w[i]));
            EXPECT_OK(fp8amp_linear_bias(lin[i], &b[i]));
            EXPECT_OK(fp8amp_tensor_copy_from_host(b[i], bv, S * sizeof(float)));
            EXPECT_OK(fp8amp_linear_weight_grad(lin[i], &wg[i]));
            EXPECT_OK(fp8amp_linear_bias_grad(lin[i], &bg[i]));
            got[i] = xmalloc((3 * S * S + S) * sizeof(float));
        }
        /* y over the weight; y over the bias (a 1-row view of the bias: [1, S] = x's 1 row) */
        EXPECT_STATUS(fp8amp_linear_forward(lin[0], x, w[0], 1), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "weight"));
        {
            void *bias_data;
            const int64_t row[2] = {1, S};
            fp8amp_tensor x_row;
            EXPECT_OK(fp8amp_tensor_data(b[0], &bias_data));
            EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, row, bias_data, &bias_view));
            x_row = f32_tensor(ctx, 1, S, xv);
            EXPECT_STATUS(fp8amp_linear_forward(lin[0], x_row, bias_view, 0), FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_non_null(strstr(fp8amp_last_error_message(), "bias"));
            EXPECT_OK(fp8amp_tensor_destroy(x_row));
        }
        for (int i = 0; i < 2; ++i) EXPECT_OK(fp8amp_linear_forward(lin[i], x, y, 1));
        /* dy over the weight gradient (written by the same call, then read for the bias gradient) */
        EXPECT_OK(fp8amp_tensor_copy_from_host(wg[0], dyv, S * S * sizeof(float)));
        EXPECT_STATUS(fp8amp_linear_backward(lin[0], wg[0], dx, 0), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "weight gradient"));
        /* dx over the weight (read by the dX GEMM), over the weight gradient (written by the dW GEMM) */
        EXPECT_STATUS(fp8amp_linear_backward(lin[0], dy, w[0], 0), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "weight"));
        EXPECT_STATUS(fp8amp_linear_backward(lin[0], dy, wg[0], 0), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "weight gradient"));
        /* Refused calls changed nothing: the saved forward is there, the results match the twin's. */
        for (int i = 0; i < 2; ++i) {
            EXPECT_OK(fp8amp_linear_backward(lin[i], dy, dx, 0));
            EXPECT_OK(fp8amp_tensor_copy_to_host(dx, got[i], S * S * sizeof(float)));
            EXPECT_OK(fp8amp_tensor_copy_to_host(wg[i], got[i] + S * S * sizeof(float), S * S * sizeof(float)));
            EXPECT_OK(fp8amp_tensor_copy_to_host(bg[i], got[i] + 2 * S * S * sizeof(float), S * sizeof(float)));
            EXPECT_OK(fp8amp_tensor_copy_to_host(w[i], got[i] + (2 * S * S + S) * sizeof(float), S * S * sizeof(float)));
        }
        assert_memory_equal(got[0], got[1], (3 * S * S + S) * sizeof(float));
        for (int i = 0; i < 2; ++i) {
            fp8amp_tensor ts[4] = {w[i], b[i], wg[i], bg[i]};
            for (int j = 0; j < 4; ++j) EXPECT_OK(fp8amp_tensor_destroy(ts[j]));
            EXPECT_OK(fp8amp_linear_destroy(lin[i]));
            free(got[i]);
        }
        fp8amp_tensor rest[] = {x, dy, y, dx, w_src, bias_view};
        for (size_t j = 0; j < sizeof rest / sizeof rest[0]; ++j) EXPECT_OK(fp8amp_tensor_destroy(rest[j]));
        EXPECT_OK(fp8amp_context_destroy(ctx));
        free(wv), free(bv), free(xv), free(dyv);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_owned_tensors_refuse_rebinding),
        DEVICE_TESTS(test_own_tensors_as_arguments),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
