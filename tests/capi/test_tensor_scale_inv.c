/* fp8amp_tensor_scale_inv: the F32 scalar tensor sharing a bound tensor's scale_inv slot. Checked:
 * it reads the scale the data was quantized with (against the meta and against an independent float
 * computation of current scaling); a value written into it is what dequantize and a Linear's GEMM use
 * (codes decoded by the test's own reference codec); it outlives the tensor's handle; refusals.
 * Device-dependent tests run on the CPU and on CUDA (skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"


static void fill_values(float *f, size_t n, double lo, double hi) {
    size_t i;
    for (i = 0; i < n; ++i) {
        const double x = test_rng_uniform(lo, hi);
        f[i] = (float)(test_rng_uniform(0.0, 1.0) < 0.5 ? -x : x);
    }
}

static void test_scale_inv_reads_and_writes_the_slot(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t shape[2] = {8, 16};
    float src_v[128], out_v[128], amax = 0.0f, meta_inv = 0.0f, slot, v;
    uint8_t codes[128];
    fp8amp_recipe r;
    fp8amp_scaling meta = NULL;
    fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    fp8amp_tensor out = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    fp8amp_tensor q = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, shape);
    fp8amp_tensor s = NULL;
    int32_t ndim = -1;
    fp8amp_dtype dtype = FP8AMP_DTYPE_E5M2;
    size_t i;

    fill_values(src_v, 128, 0.25, 40.0);
    for (i = 0; i < 128; ++i) amax = fabsf(src_v[i]) > amax ? fabsf(src_v[i]) : amax;
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, src_v, sizeof src_v));
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = FP8AMP_SCALING_CURRENT;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, meta));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));

    EXPECT_OK(fp8amp_tensor_scale_inv(q, &s));
    EXPECT_OK(fp8amp_tensor_ndim(s, &ndim));
    EXPECT_OK(fp8amp_tensor_dtype(s, &dtype));
    assert_int_equal(ndim, 0);
    assert_int_equal(dtype, FP8AMP_DTYPE_F32);
    slot = test_read_f32_scalar(s);
    EXPECT_OK(fp8amp_scaling_get(meta, NULL, &meta_inv, NULL));
    assert_memory_equal(&slot, &meta_inv, sizeof slot);
    /* Current scaling, margin 0: scale = 448 / amax, scale_inv its float reciprocal. */
    assert_true(fabs((double)slot - (double)amax / 448.0) <= 1e-6 * (double)amax / 448.0);

    /* A written value is what dequantize multiplies the codes by. */
    v = slot * (float)test_rng_uniform(1.5, 3.0);
    EXPECT_OK(fp8amp_tensor_copy_from_host(s, &v, sizeof v));
    EXPECT_OK(fp8amp_dequantize(ctx, q, out));
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, codes, sizeof codes));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out, out_v, sizeof out_v));
    for (i = 0; i < 128; ++i) {
        const float expect = (float)decode_ref(&FMT_E4M3, codes[i]) * v;
        assert_memory_equal(&out_v[i], &expect, sizeof expect);
        assert_true(out_v[i] != 0.0f);
    }

    /* The slot outlives the tensor's handle (the slot handle keeps it). */
    EXPECT_OK(fp8amp_tensor_destroy(q));
    slot = test_read_f32_scalar(s);
    assert_memory_equal(&slot, &v, sizeof v);
    /* The slot tensor is no wrapped view: it cannot be re-pointed. */
    EXPECT_STATUS(fp8amp_tensor_rebind(s, &v, 0, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_destroy(s));
    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_tensor_destroy(out));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* An E4M3 Linear weight (O3) written as codes + scale_inv from outside, as a framework restoring a
 * checkpoint does: doubling the slot doubles the output exactly (a power of two in the epilogue's
 * scale), and the output matches the float64 product of the codes at that scale. */
static void test_linear_e4m3_weight_slot(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    enum { M = 16, K = 32, N = 16 };
    const int64_t xs[2] = {M, K}, ys[2] = {M, N};
    fp8amp_linear_desc d;
    fp8amp_linear lin = NULL;
    fp8amp_tensor w = NULL, slot = NULL, x, y;
    uint8_t codes[N * K];
    float xv[M * K], y1[M * N], y2[M * N], zero_bias[N], v;
    size_t i;

    EXPECT_OK(fp8amp_linear_desc_init_default(&d));
    d.in_features = K;
    d.out_features = N;
    d.weight_dtype = FP8AMP_DTYPE_E4M3;
    d.recipe.mode = FP8AMP_SCALING_CURRENT;
    d.policy = FP8AMP_GEMM_ALWAYS_FP8;
    EXPECT_OK(fp8amp_linear_create(ctx, &d, &lin));
    EXPECT_OK(fp8amp_linear_weight(lin, &w));
    EXPECT_OK(fp8amp_tensor_scale_inv(w, &slot));
    /* Random finite codes (no NaN: 0x7F/0xFF), nonzero. */
    for (i = 0; i < sizeof codes; ++i) {
        uint8_t c;
        do c = (uint8_t)test_rng_uniform(1.0, 256.0);
        while ((c & 0x7F) == 0x7F || (c & 0x7F) == 0);
        codes[i] = c;
    }
    EXPECT_OK(fp8amp_tensor_copy_from_host(w, codes, sizeof codes));
    v = (float)ldexp(test_rng_uniform(1.0, 2.0), -6);
    EXPECT_OK(fp8amp_tensor_copy_from_host(slot, &v, sizeof v));
    {
        fp8amp_tensor b = NULL;
        for (i = 0; i < N; ++i) zero_bias[i] = 0.0f;
        EXPECT_OK(fp8amp_linear_bias(lin, &b));
        EXPECT_OK(fp8amp_tensor_copy_from_host(b, zero_bias, sizeof zero_bias));
        EXPECT_OK(fp8amp_tensor_destroy(b));
    }
    EXPECT_OK(fp8amp_linear_weight_changed(lin));
    fill_values(xv, M * K, 0.25, 2.0);
    x = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, xs);
    y = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, ys);
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, xv, sizeof xv));
    EXPECT_OK(fp8amp_linear_forward(lin, x, y, 0));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, y1, sizeof y1));
    {
        /* Against float64 x . (codes * v)^T: x goes through E4M3 too, so at FP8 precision. */
        double err2 = 0.0, ref2 = 0.0;
        int64_t m, n, k;
        for (m = 0; m < M; ++m)
            for (n = 0; n < N; ++n) {
                double ref = 0.0;
                for (k = 0; k < K; ++k) ref += (double)xv[m * K + k] * decode_ref(&FMT_E4M3, codes[n * K + k]) * v;
                err2 += (y1[m * N + n] - ref) * (y1[m * N + n] - ref);
                ref2 += ref * ref;
            }
        assert_true(ref2 > 0.0);
        assert_true(sqrt(err2 / ref2) < 0.08);
    }
    v *= 2.0f;
    EXPECT_OK(fp8amp_tensor_copy_from_host(slot, &v, sizeof v));
    EXPECT_OK(fp8amp_linear_weight_changed(lin));
    EXPECT_OK(fp8amp_linear_forward(lin, x, y, 0));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, y2, sizeof y2));
    for (i = 0; i < M * N; ++i) {
        const float twice = 2.0f * y1[i];
        assert_memory_equal(&y2[i], &twice, sizeof twice);
    }
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_tensor_destroy(y));
    EXPECT_OK(fp8amp_tensor_destroy(slot));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_scale_inv_bad_arguments(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t shape[1] = {16};
    fp8amp_tensor e4m3 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, shape);
    fp8amp_tensor f32 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
    fp8amp_tensor dead = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, shape);
    fp8amp_tensor out = SENTINEL_TENSOR;
    fp8amp_recipe r;
    fp8amp_scaling meta = NULL;

    EXPECT_STATUS(fp8amp_tensor_scale_inv(e4m3, &out), FP8AMP_ERROR_INVALID_ARGUMENT); /* never bound */
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_scale_inv(f32, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4m3, meta));
    EXPECT_STATUS(fp8amp_tensor_scale_inv(e4m3, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_scale_inv(NULL, &out), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_tensor_destroy(dead));
    EXPECT_STATUS(fp8amp_tensor_scale_inv(dead, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    /* Unbinding keeps the slot (and its value, the meta's scale_inv at binding: 1 for a new meta). */
    EXPECT_OK(fp8amp_tensor_set_scaling(e4m3, NULL));
    EXPECT_OK(fp8amp_tensor_scale_inv(e4m3, &out));
    assert_true(test_read_f32_scalar(out) == 1.0f);
    EXPECT_OK(fp8amp_tensor_destroy(out));
    EXPECT_OK(fp8amp_tensor_destroy(e4m3));
    EXPECT_OK(fp8amp_tensor_destroy(f32));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_scale_inv_reads_and_writes_the_slot),
        DEVICE_TESTS(test_linear_e4m3_weight_slot),
        DEVICE_TESTS(test_scale_inv_bad_arguments),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
