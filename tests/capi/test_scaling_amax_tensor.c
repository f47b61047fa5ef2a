/* fp8amp_scaling_amax_tensor: the read-only F32 scalar tensor sharing a meta's recorded amax. Checked on
 * fresh random data: it reads what fp8amp_scaling_get reads, and the max |x| the test computes itself;
 * it is live (a later quantize that records a larger amax shows through it, an update resets it to 0);
 * a NaN or an inf recorded reads as +inf (what a device-side finite test relies on); writes
 * through it are refused and change nothing; it outlives the meta's handle; bad arguments. Runs on the
 * CPU and on CUDA (skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>

#include "test_util.h"


/* n values of random sign with magnitudes in [lo, hi); returns their max |x|. */
static float fill_values(float *f, size_t n, double lo, double hi) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        const double x = test_rng_uniform(lo, hi);
        f[i] = (float)(test_rng_uniform(0.0, 1.0) < 0.5 ? -x : x);
        amax = fabsf(f[i]) > amax ? fabsf(f[i]) : amax;
    }
    return amax;
}

static void test_amax_tensor_reads_the_recorded_amax(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t shape[2] = {9, 13};
    enum { N = 9 * 13 };
    float v[N], got, meta_amax = -1.0f;
    fp8amp_recipe r;
    fp8amp_scaling meta = NULL;
    fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    fp8amp_tensor q = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, shape);
    fp8amp_tensor a = NULL;
    int32_t ndim = -1;
    fp8amp_dtype dtype = FP8AMP_DTYPE_E5M2;

    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = FP8AMP_SCALING_DELAYED;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, meta));
    EXPECT_OK(fp8amp_scaling_amax_tensor(meta, &a));
    EXPECT_OK(fp8amp_tensor_ndim(a, &ndim));
    EXPECT_OK(fp8amp_tensor_dtype(a, &dtype));
    assert_int_equal(ndim, 0);
    assert_int_equal(dtype, FP8AMP_DTYPE_F32);
    assert_true(test_read_f32_scalar(a) == 0.0f); /* nothing recorded yet */

    /* A quantize records max |x| (delayed scaling: folded in by the next update). */
    const float amax1 = fill_values(v, N, 0.5, 30.0);
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    got = test_read_f32_scalar(a);
    EXPECT_OK(fp8amp_scaling_get(meta, NULL, NULL, &meta_amax));
    assert_memory_equal(&got, &meta_amax, sizeof got);
    assert_memory_equal(&got, &amax1, sizeof got);

    /* Live: a larger amax recorded later shows through; an update resets it to 0. */
    const float amax2 = fill_values(v, N, 40.0, 90.0);
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    got = test_read_f32_scalar(a);
    assert_memory_equal(&got, &amax2, sizeof got);
    EXPECT_OK(fp8amp_scaling_update(meta));
    assert_true(test_read_f32_scalar(a) == 0.0f);

    /* An inf, and a NaN, are recorded as +inf (the codes saturate; the amax does not hide them). */
    fill_values(v, N, 0.5, 30.0);
    v[(size_t)test_rng_uniform(0.0, (double)N)] = -INFINITY;
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    got = test_read_f32_scalar(a);
    assert_true(isinf(got) && got > 0.0f);
    EXPECT_OK(fp8amp_scaling_update(meta));
    assert_true(test_read_f32_scalar(a) == 0.0f);
    fill_values(v, N, 0.5, 30.0);
    v[(size_t)test_rng_uniform(0.0, (double)N)] = NAN;
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    got = test_read_f32_scalar(a);
    assert_true(isinf(got) && got > 0.0f);
    EXPECT_OK(fp8amp_scaling_update(meta));

    /* Read-only: a write is refused and changes nothing. */
    const float amax3 = fill_values(v, N, 0.5, 2.0), bogus = 1234.5f;
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    EXPECT_STATUS(fp8amp_tensor_copy_from_host(a, &bogus, sizeof bogus), FP8AMP_ERROR_INVALID_ARGUMENT);
    got = test_read_f32_scalar(a);
    assert_memory_equal(&got, &amax3, sizeof got);
    EXPECT_OK(fp8amp_scaling_get(meta, NULL, NULL, &meta_amax));
    assert_memory_equal(&meta_amax, &amax3, sizeof got);

    /* It outlives the meta's handle (the view keeps the meta's memory). */
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    got = test_read_f32_scalar(a);
    assert_memory_equal(&got, &amax3, sizeof got);
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_amax_tensor_bad_arguments(void **state) {
    (void)state;
    fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    fp8amp_context ctx = make_context(cpu);
    fp8amp_recipe r;
    fp8amp_scaling meta = NULL, dead = NULL;
    fp8amp_tensor out = SENTINEL_TENSOR;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &dead));
    EXPECT_OK(fp8amp_scaling_destroy(dead));
    EXPECT_STATUS(fp8amp_scaling_amax_tensor(meta, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_scaling_amax_tensor(NULL, &out), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_amax_tensor(dead, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR); /* a refused call writes nothing */
    EXPECT_STATUS(fp8amp_scaling_amax_tensor((fp8amp_scaling)ctx, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_amax_tensor_reads_the_recorded_amax),
        cmocka_unit_test(test_amax_tensor_bad_arguments),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
