/* The largest margin follows the scale formula like any other (docs/api.md section 8, the recipes
 * table): scale = fp8_max * 2^-margin / amax in float32, Transformer Engine's formula, with
 * fp8_max * 2^-127 exact (a normal float for every scaled format). So E4M3 with margin 127 and an
 * amax of 1e-30 gives 448 * 2^-127 / 1e-30 = 2.6331074e-06, not FLT_MIN; FLT_MIN is only the clamp
 * of a smaller quotient (margin 127: an amax above 224 for E4M3). Checked through a delayed update of
 * a meta fed by a quantize of fresh random data (the amax is the data's, read back from the meta),
 * and through current scaling, on each backend. */
#include <float.h>
#include <math.h>

#include "test_util.h"

/* The scale the docs promise, in float32 like the library: one division of the exact dividend. */
static float expected_scale(float fp8_max, float amax) {
    const float target = fp8_max * 0x1p-64f * 0x1p-63f; /* fp8_max * 2^-127, exact */
    float scale = target / amax;
    return scale < FLT_MIN ? FLT_MIN : scale;
}

/* Quantizes n random values of magnitude up to about `magnitude` into an FP8 tensor bound to a meta
 * of the recipe (margin 127), then (delayed) updates the meta; returns scale and amax. */
static void scale_after(fp8amp_device device, fp8amp_scaling_mode mode, fp8amp_dtype dtype, double magnitude,
                        float *scale, float *amax) {
    fp8amp_context ctx = make_context(device);
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.margin = 127;
    r.mode = mode;
    r.amax_history_len = 4;
    fp8amp_scaling meta;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, dtype, &meta));
    enum { N = 257 };
    const int64_t shape[1] = {N};
    float x[N];
    for (int i = 0; i < N; ++i) x[i] = (float)(test_rng_uniform(-1.0, 1.0) * magnitude);
    fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
    fp8amp_tensor dst = make_tensor(ctx, dtype, 1, shape);
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
    EXPECT_OK(fp8amp_tensor_set_scaling(dst, meta));
    EXPECT_OK(fp8amp_quantize(ctx, src, dst));
    float recorded = 0;
    EXPECT_OK(fp8amp_scaling_get(meta, NULL, NULL, &recorded));
    if (mode == FP8AMP_SCALING_DELAYED) EXPECT_OK(fp8amp_scaling_update(meta));
    EXPECT_OK(fp8amp_scaling_get(meta, scale, NULL, NULL));
    *amax = recorded;
    float want_amax = 0;
    for (int i = 0; i < N; ++i) want_amax = fabsf(x[i]) > want_amax ? fabsf(x[i]) : want_amax;
    assert_true(recorded == want_amax);
    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_tensor_destroy(dst));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_margin_127_follows_the_formula(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    /* The documented example, exactly: amax 1e-30 with E4M3. */
    {
        fp8amp_context ctx = make_context(device);
        fp8amp_recipe r;
        EXPECT_OK(fp8amp_recipe_init_default(&r));
        r.margin = 127;
        r.amax_history_len = 2;
        fp8amp_scaling meta;
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
        const int64_t shape[1] = {3};
        const float x[3] = {1e-30f, -0.5e-30f, 0.25e-30f};
        fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
        fp8amp_tensor dst = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, shape);
        EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
        EXPECT_OK(fp8amp_tensor_set_scaling(dst, meta));
        EXPECT_OK(fp8amp_quantize(ctx, src, dst));
        EXPECT_OK(fp8amp_scaling_update(meta));
        float scale = 0;
        EXPECT_OK(fp8amp_scaling_get(meta, &scale, NULL, NULL));
        assert_true(scale == 2.6331074e-06f);
        assert_true(scale == expected_scale(448.0f, 1e-30f));
        EXPECT_OK(fp8amp_tensor_destroy(src));
        EXPECT_OK(fp8amp_tensor_destroy(dst));
        EXPECT_OK(fp8amp_scaling_destroy(meta));
        EXPECT_OK(fp8amp_context_destroy(ctx));
    }
    /* Random data over magnitudes on both sides of the FLT_MIN clamp, each format, both modes. */
    const struct { fp8amp_dtype dtype; float fp8_max; } formats[] = {
        {FP8AMP_DTYPE_E4M3, 448.0f}, {FP8AMP_DTYPE_E5M2, 57344.0f}, {FP8AMP_DTYPE_F16, 65504.0f}};
    const double magnitudes[] = {1e-35, 1e-30, 1e-20, 1.0, 100.0, 1e3, 1e6};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; ++f)
        for (size_t m = 0; m < sizeof magnitudes / sizeof magnitudes[0]; ++m)
            for (int mode = 0; mode < 2; ++mode) {
                float scale = 0, amax = 0;
                scale_after(device, (fp8amp_scaling_mode)mode, formats[f].dtype, magnitudes[m], &scale, &amax);
                const float want = expected_scale(formats[f].fp8_max, amax);
                if (scale != want)
                    fail_msg("dtype %d, amax %g, mode %d: scale %a, want %a", formats[f].dtype, (double)amax, mode,
                             (double)scale, (double)want);
                /* above the clamp the scale is not FLT_MIN: the formula, not a constant */
                if (amax < formats[f].fp8_max * 0x1p-127f / FLT_MIN) assert_true(scale > FLT_MIN);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_margin_127_follows_the_formula),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
