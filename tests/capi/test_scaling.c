/* Recipes and scaling meta: defaults, validation, and the scale arithmetic of delayed and current
 * scaling checked against a float64 model over long random amax sequences (fp8amp_scaling_update and
 * _update_many), with the special cases of docs/numerics.md section 5.4: amax 0/inf/NaN keeps the previous
 * scale, an overflowing scale becomes FLT_MAX, power-of-two scales round down, interval > 1,
 * margin > 0, MAX and MOST_RECENT over a ring of amax_history_len.
 *
 * The amax a meta records is driven through the public API only: quantizing an F32 tensor whose
 * max |x| the test chooses. Each test runs on the CPU and on CUDA (skipped without a GPU); the model
 * is the same for both, so the CUDA run is held to the same bits as the CPU run. */
#include "fp8_reference.h"
#include "test_util.h"

#define DRV_N 8 /* elements of the tensors that drive a meta's amax */

/* ---- a float64 model of one meta ------------------------------------------------------------ */

typedef struct {
    double fp8_max;
    int margin, interval, len, most_recent, pow2, current;
    float scale, scale_inv;
    double recorded; /* amax recorded since the last update (NaN recorded as inf) */
    double *hist;    /* newest first */
    long updates;
} model_t;

static void model_init(model_t *m, const fp8amp_recipe *r, fp8amp_dtype d) {
    m->fp8_max = fp8_max_ref(format_of(d));
    m->margin = r->margin;
    m->interval = r->interval;
    m->len = r->amax_history_len;
    m->most_recent = r->amax_algo == FP8AMP_AMAX_MOST_RECENT;
    m->pow2 = r->power_of_two_scales != 0;
    m->current = r->mode == FP8AMP_SCALING_CURRENT;
    m->scale = 1.0f;
    m->scale_inv = 1.0f;
    m->recorded = 0.0;
    m->hist = calloc((size_t)m->len, sizeof(double));
    assert_non_null(m->hist);
    m->updates = 0;
}

static void model_free(model_t *m) { free(m->hist); }

static void model_set_scale(model_t *m, double amax) {
    m->scale = scale_ref(m->fp8_max, m->margin, m->pow2, amax, m->scale);
    m->scale_inv = reciprocal_ref(m->scale);
}

/* A quantize of a tensor whose max |x| is amax. */
static void model_quantize(model_t *m, double amax) {
    if (isnan(amax)) amax = INFINITY;
    if (m->current) {
        m->recorded = amax;
        model_set_scale(m, amax);
    } else if (amax > m->recorded) {
        m->recorded = amax;
    }
}

static void model_update(model_t *m) {
    memmove(m->hist + 1, m->hist, (size_t)(m->len - 1) * sizeof(double));
    m->hist[0] = m->recorded;
    m->recorded = 0.0;
    m->updates += 1;
    if (m->current || m->updates % m->interval != 0) return;
    double a = m->hist[0];
    if (!m->most_recent)
        for (int k = 1; k < m->len; ++k)
            if (m->hist[k] > a) a = m->hist[k];
    model_set_scale(m, a);
}

/* Asserts that the meta's scale, scale_inv, recorded amax and history equal the model's, bit for bit. */
static void expect_model(fp8amp_scaling s, const model_t *m, const char *where, long step) {
    float scale, scale_inv, amax;
    EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
    float *h = malloc((size_t)m->len * sizeof(float));
    assert_non_null(h);
    EXPECT_OK(fp8amp_scaling_get_history(s, m->len, h));
    int ok = f32_bits(scale) == f32_bits(m->scale) && f32_bits(scale_inv) == f32_bits(m->scale_inv) &&
             f32_bits(amax) == f32_bits((float)m->recorded);
    if (!ok)
        print_error("%s, step %ld (margin %d, interval %d, len %d, %s, pow2 %d, %s): scale %a / %a, scale_inv %a / %a, "
                    "amax %a / %a (library / model)\n",
                    where, step, m->margin, m->interval, m->len, m->most_recent ? "most recent" : "max", m->pow2,
                    m->current ? "current" : "delayed", scale, m->scale, scale_inv, m->scale_inv, amax,
                    (float)m->recorded);
    for (int k = 0; ok && k < m->len; ++k) {
        if (f32_bits(h[k]) != f32_bits((float)m->hist[k])) {
            print_error("%s, step %ld: history[%d] is %a, the model says %a\n", where, step, k, h[k], m->hist[k]);
            ok = 0;
        }
    }
    free(h);
    assert_true(ok);
}

/* ---- driving a meta's amax through quantize -------------------------------------------------- */

typedef struct {
    fp8amp_context ctx;
    fp8amp_tensor src;    /* f32 [DRV_N] */
    fp8amp_tensor dst[3]; /* e4m3, e5m2 and f16 [DRV_N], rebound to each meta before quantizing */
} driver_t;

static void driver_init(driver_t *d, fp8amp_context ctx) {
    const int64_t shape[1] = {DRV_N};
    d->ctx = ctx;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &d->src));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &d->dst[0]));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E5M2, 1, shape, &d->dst[1]));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F16, 1, shape, &d->dst[2]));
}

static void driver_free(driver_t *d) {
    EXPECT_OK(fp8amp_tensor_destroy(d->src));
    EXPECT_OK(fp8amp_tensor_destroy(d->dst[0]));
    EXPECT_OK(fp8amp_tensor_destroy(d->dst[1]));
    EXPECT_OK(fp8amp_tensor_destroy(d->dst[2]));
}

static float random_sign(float x) { return (test_rng_u64() & 1) ? -x : x; }

/* Fills v with DRV_N values whose max |x| is exactly amax (inf: one infinite element; NaN: one NaN). */
static void values_with_amax(float amax, float *v) {
    const size_t at = (size_t)(test_rng_u64() % DRV_N);
    for (size_t i = 0; i < DRV_N; ++i) {
        if (amax == 0.0f)
            v[i] = random_sign(0.0f);
        else if (isinf(amax) || isnan(amax))
            v[i] = (float)test_rng_uniform(-1e30, 1e30);
        else
            v[i] = random_sign((float)(amax * test_rng_uniform(0.0, 1.0)));
    }
    v[at] = random_sign(amax);
}

/* Quantizes one tensor whose max |x| is amax into each of the n metas (of dtypes dtypes[i]). */
static void driver_record(driver_t *d, float amax, int n, const fp8amp_scaling *metas, const fp8amp_dtype *dtypes) {
    float v[DRV_N];
    values_with_amax(amax, v);
    EXPECT_OK(fp8amp_tensor_copy_from_host(d->src, v, sizeof v));
    for (int i = 0; i < n; ++i) {
        fp8amp_tensor dst = d->dst[dtypes[i] == FP8AMP_DTYPE_E4M3 ? 0 : (dtypes[i] == FP8AMP_DTYPE_E5M2 ? 1 : 2)];
        EXPECT_OK(fp8amp_tensor_set_scaling(dst, metas[i]));
        EXPECT_OK(fp8amp_quantize(d->ctx, d->src, dst));
    }
}

/* Mostly normal amaxes over 80 binades, with zeros, infinities, NaNs, float32 subnormals (scales that
 * overflow to FLT_MAX) and, where the margin keeps the scale a normal float, FLT_MAX. */
static float random_amax(int allow_huge) {
    const uint64_t r = test_rng_u64() % 100;
    if (r < 3) return 0.0f;
    if (r < 5) return INFINITY;
    if (r < 7) return NAN;
    if (r < 9) return (test_rng_u64() & 1) ? 1e-40f : bits_f32(1u + (uint32_t)(test_rng_u64() % 0x7FFFFFu));
    if (r < 10 && allow_huge) return FLT_MAX;
    return (float)ldexp(test_rng_uniform(1.0, 2.0), (int)(test_rng_u64() % 81) - 40);
}

static fp8amp_recipe make_recipe(fp8amp_scaling_mode mode, int margin, int interval, int len, fp8amp_amax_algo algo,
                                 int pow2) {
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = mode;
    r.margin = margin;
    r.interval = interval;
    r.amax_history_len = len;
    r.amax_algo = algo;
    r.power_of_two_scales = pow2;
    return r;
}

/* ---- state snapshots: "nothing changed" --------------------------------------------------------- */

#define SNAP_MAX_HISTORY 64

typedef struct {
    float scale, scale_inv, amax;
    float hist[SNAP_MAX_HISTORY];
    fp8amp_scaling_stats stats;
} snapshot_t;

static void snapshot(fp8amp_scaling s, int len, snapshot_t *out) {
    assert_true(len <= SNAP_MAX_HISTORY);
    memset(out, 0, sizeof *out);
    EXPECT_OK(fp8amp_scaling_get(s, &out->scale, &out->scale_inv, &out->amax));
    EXPECT_OK(fp8amp_scaling_get_history(s, len, out->hist));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &out->stats));
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_recipe_defaults(void **state) {
    (void)state;
    fp8amp_recipe r;
    memset(&r, 0xA5, sizeof r);
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    assert_int_equal(r.struct_size, sizeof(fp8amp_recipe));
    assert_int_equal(r.format, FP8AMP_FORMAT_HYBRID);
    assert_int_equal(r.mode, FP8AMP_SCALING_DELAYED);
    assert_int_equal(r.margin, 0);
    assert_int_equal(r.interval, 1);
    assert_int_equal(r.amax_history_len, 1024);
    assert_int_equal(r.amax_algo, FP8AMP_AMAX_MAX);
    assert_int_equal(r.power_of_two_scales, 0);
    EXPECT_STATUS(fp8amp_recipe_init(NULL, sizeof(fp8amp_recipe)), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* the enum values are fixed (ABI) */
    assert_int_equal(FP8AMP_FORMAT_E4M3, 0);
    assert_int_equal(FP8AMP_FORMAT_HYBRID, 1);
    assert_int_equal(FP8AMP_SCALING_DELAYED, 0);
    assert_int_equal(FP8AMP_SCALING_CURRENT, 1);
    assert_int_equal(FP8AMP_AMAX_MAX, 0);
    assert_int_equal(FP8AMP_AMAX_MOST_RECENT, 1);
    assert_int_equal(FP8AMP_MAX_AMAX_HISTORY, 65536);
}

static void test_new_meta_state(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    const fp8amp_dtype dtypes[3] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_F16};
    for (int k = 0; k < 3; ++k) {
        fp8amp_scaling s;
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, dtypes[k], &s));
        float scale = -1, scale_inv = -1, amax = -1;
        EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
        assert_true(scale == 1.0f && scale_inv == 1.0f && amax == 0.0f);
        /* any output may be NULL */
        EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, NULL));
        scale = -1;
        EXPECT_OK(fp8amp_scaling_get(s, &scale, NULL, NULL));
        assert_true(scale == 1.0f);

        /* history: 1024 zeros, written into history[0..1024) only */
        float *h = malloc(1100 * sizeof(float));
        assert_non_null(h);
        for (int i = 0; i < 1100; ++i) h[i] = -7.0f;
        EXPECT_OK(fp8amp_scaling_get_history(s, 1100, h));
        for (int i = 0; i < 1024; ++i) assert_true(f32_bits(h[i]) == 0);
        for (int i = 1024; i < 1100; ++i) assert_true(h[i] == -7.0f);
        for (int i = 0; i < 1100; ++i) h[i] = -7.0f;
        EXPECT_STATUS(fp8amp_scaling_get_history(s, 1023, h), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_STATUS(fp8amp_scaling_get_history(s, -1, h), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_STATUS(fp8amp_scaling_get_history(s, 1024, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
        for (int i = 0; i < 1100; ++i) assert_true(h[i] == -7.0f);
        free(h);

        fp8amp_scaling_stats st;
        memset(&st, 0xFF, sizeof st);
        EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
        assert_true(st.quantized == 0 && st.saturated == 0 && st.underflowed == 0);
        EXPECT_STATUS(fp8amp_scaling_get_stats(s, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);

        /* an update of a fresh meta: amax 0 keeps scale 1, and row 0 becomes that 0 */
        EXPECT_OK(fp8amp_scaling_update(s));
        EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
        assert_true(scale == 1.0f && scale_inv == 1.0f && amax == 0.0f);
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    /* the largest history length */
    r.amax_history_len = FP8AMP_MAX_AMAX_HISTORY;
    fp8amp_scaling big;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &big));
    float *h = malloc(FP8AMP_MAX_AMAX_HISTORY * sizeof(float));
    assert_non_null(h);
    EXPECT_OK(fp8amp_scaling_update(big));
    EXPECT_OK(fp8amp_scaling_get_history(big, FP8AMP_MAX_AMAX_HISTORY, h));
    for (int i = 0; i < FP8AMP_MAX_AMAX_HISTORY; ++i) assert_true(h[i] == 0.0f);
    free(h);
    EXPECT_OK(fp8amp_scaling_destroy(big));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_bad_recipes(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    fp8amp_scaling const sentinel = (fp8amp_scaling)(uintptr_t)0x1234;
    fp8amp_scaling out = sentinel;
    fp8amp_recipe good, r;
    EXPECT_OK(fp8amp_recipe_init_default(&good));

#define EXPECT_BAD_RECIPE(field, value)                                                            \
    do {                                                                                           \
        r = good;                                                                                  \
        r.field = value;                                                                           \
        EXPECT_STATUS(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &out),                     \
                      FP8AMP_ERROR_INVALID_ARGUMENT);                                              \
        assert_true(out == sentinel);                                                              \
    } while (0)

    EXPECT_BAD_RECIPE(struct_size, 0);
    EXPECT_BAD_RECIPE(struct_size, 4);
    EXPECT_BAD_RECIPE(struct_size, (uint32_t)sizeof(fp8amp_recipe) - 1);
    EXPECT_BAD_RECIPE(format, (fp8amp_format)2);
    EXPECT_BAD_RECIPE(format, (fp8amp_format)-1);
    EXPECT_BAD_RECIPE(mode, (fp8amp_scaling_mode)2);
    EXPECT_BAD_RECIPE(mode, (fp8amp_scaling_mode)-1);
    EXPECT_BAD_RECIPE(margin, -1);
    EXPECT_BAD_RECIPE(margin, 128);
    EXPECT_BAD_RECIPE(margin, INT32_MIN);
    EXPECT_BAD_RECIPE(interval, 0);
    EXPECT_BAD_RECIPE(interval, -3);
    EXPECT_BAD_RECIPE(amax_history_len, 0);
    EXPECT_BAD_RECIPE(amax_history_len, -1);
    EXPECT_BAD_RECIPE(amax_history_len, FP8AMP_MAX_AMAX_HISTORY + 1);
    EXPECT_BAD_RECIPE(amax_history_len, 100000);
    EXPECT_BAD_RECIPE(amax_algo, (fp8amp_amax_algo)2);
    EXPECT_BAD_RECIPE(amax_algo, (fp8amp_amax_algo)-1);
#undef EXPECT_BAD_RECIPE

    /* not a scaled dtype (E4M3, E5M2, F16: test_scaled_f16.c covers F16): DTYPE_MISMATCH; not an
     * fp8amp_dtype at all: INVALID_ARGUMENT (test_enums.c) */
    const fp8amp_dtype not_fp8[4] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, (fp8amp_dtype)5, (fp8amp_dtype)99};
    for (int k = 0; k < 4; ++k) {
        EXPECT_STATUS(fp8amp_scaling_create(ctx, &good, not_fp8[k], &out),
                      k < 2 ? FP8AMP_ERROR_DTYPE_MISMATCH : FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_true(out == sentinel);
    }
    /* NULLs and handles */
    EXPECT_STATUS(fp8amp_scaling_create(ctx, NULL, FP8AMP_DTYPE_E4M3, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_scaling_create(ctx, &good, FP8AMP_DTYPE_E4M3, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_scaling_create(NULL, &good, FP8AMP_DTYPE_E4M3, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_true(out == sentinel);

    /* the edges of every range are accepted; so is a larger struct from a newer header */
    const fp8amp_recipe edges[] = {
        make_recipe(FP8AMP_SCALING_DELAYED, 127, 1, 1, FP8AMP_AMAX_MAX, 0),
        make_recipe(FP8AMP_SCALING_CURRENT, 0, INT32_MAX, FP8AMP_MAX_AMAX_HISTORY, FP8AMP_AMAX_MOST_RECENT, 1),
    };
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; ++k) {
        fp8amp_scaling s;
        EXPECT_OK(fp8amp_scaling_create(ctx, &edges[k], FP8AMP_DTYPE_E5M2, &s));
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    struct {
        fp8amp_recipe r;
        int32_t future_field;
    } bigger;
    bigger.r = good;
    bigger.r.struct_size = (uint32_t)sizeof bigger;
    bigger.future_field = 0;
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &bigger.r, FP8AMP_DTYPE_E4M3, &s));
    r = good;
    r.format = FP8AMP_FORMAT_E4M3;
    fp8amp_scaling s2;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s2));

    /* destroy: NULL is a no-op success; twice is an invalid handle; so is another kind */
    EXPECT_OK(fp8amp_scaling_destroy(NULL));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_STATUS(fp8amp_scaling_destroy(s), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_update(s), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_get(s, NULL, NULL, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_set_scale(s, 2.0f), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_enable_stats(s, 1), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_reset_stats(s), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_destroy((fp8amp_scaling)ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_update(NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_scaling_destroy(s2));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* One long random run of a recipe against the model. */
static void run_against_model(fp8amp_device device, const fp8amp_recipe *r, fp8amp_dtype dtype, long steps) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    driver_t drv;
    driver_init(&drv, ctx);
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, r, dtype, &s));
    model_t m;
    model_init(&m, r, dtype);
    for (long step = 0; step < steps; ++step) {
        const int quantizes = (int)(test_rng_u64() % 4); /* 0..3 tensors per step */
        for (int q = 0; q < quantizes; ++q) {
            const float amax = random_amax(r->margin <= 5);
            driver_record(&drv, amax, 1, &s, &dtype);
            model_quantize(&m, amax);
        }
        expect_model(s, &m, "after quantize", step);
        EXPECT_OK(fp8amp_scaling_update(s));
        model_update(&m);
        expect_model(s, &m, "after update", step);
    }
    model_free(&m);
    EXPECT_OK(fp8amp_scaling_destroy(s));
    driver_free(&drv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_scales_match_float64_model(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const struct {
        fp8amp_recipe r;
        long steps;
    } cases[] = {
        {make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 16, FP8AMP_AMAX_MAX, 0), 300},
        {make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 1, FP8AMP_AMAX_MAX, 0), 200},
        {make_recipe(FP8AMP_SCALING_DELAYED, 3, 1, 1024, FP8AMP_AMAX_MAX, 0), 1100}, /* the ring wraps */
        {make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 7, FP8AMP_AMAX_MOST_RECENT, 0), 200},
        {make_recipe(FP8AMP_SCALING_DELAYED, 2, 3, 5, FP8AMP_AMAX_MAX, 1), 300},
        {make_recipe(FP8AMP_SCALING_DELAYED, 20, 7, 33, FP8AMP_AMAX_MOST_RECENT, 1), 300},
        {make_recipe(FP8AMP_SCALING_DELAYED, 1, 2, 64, FP8AMP_AMAX_MAX, 1), 300},
        {make_recipe(FP8AMP_SCALING_DELAYED, 5, 4, 3, FP8AMP_AMAX_MOST_RECENT, 0), 200},
        {make_recipe(FP8AMP_SCALING_CURRENT, 0, 1, 8, FP8AMP_AMAX_MAX, 0), 200},
        {make_recipe(FP8AMP_SCALING_CURRENT, 4, 1, 3, FP8AMP_AMAX_MOST_RECENT, 1), 200},
        {make_recipe(FP8AMP_SCALING_CURRENT, 9, 5, 2, FP8AMP_AMAX_MAX, 0), 100},
        /* the largest margins: 2^-margin is not a normal float at 127 */
        {make_recipe(FP8AMP_SCALING_DELAYED, 126, 1, 4, FP8AMP_AMAX_MAX, 0), 100},
        {make_recipe(FP8AMP_SCALING_DELAYED, 127, 1, 4, FP8AMP_AMAX_MAX, 1), 100},
        {make_recipe(FP8AMP_SCALING_CURRENT, 127, 1, 2, FP8AMP_AMAX_MOST_RECENT, 0), 100},
    };
    /* every scaled dtype: the two FP8 formats and scaled F16 (format max 65504) */
    const fp8amp_dtype dtypes[3] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_F16};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k)
        for (int d = 0; d < 3; ++d) {
            /* test_small: at most 40 steps, still twice the history where it is short (so the ring
             * wraps in most cases; the 1024-long ring wraps in the full run only) */
            long steps = cases[k].steps;
            if (test_small()) {
                const long wrap = 2L * cases[k].r.amax_history_len + 4;
                steps = wrap < 40 ? wrap : 40;
                if (steps > cases[k].steps) steps = cases[k].steps;
            }
            run_against_model(device, &cases[k].r, dtypes[d], steps);
        }
}

/* The special cases, by hand (known answers) and against the model. */
static void test_special_amax_values(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    driver_t drv;
    driver_init(&drv, ctx);
    const fp8amp_dtype e4m3 = FP8AMP_DTYPE_E4M3, e5m2 = FP8AMP_DTYPE_E5M2;
    float scale, scale_inv, amax;

    /* MAX over a ring of 4: an inf (or NaN) keeps the previous scale for as long as it is in the window */
    fp8amp_recipe r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 4, FP8AMP_AMAX_MAX, 0);
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    model_t m;
    model_init(&m, &r, e4m3);
    const float seq[] = {0.0f, 2.0f, NAN, 1.0f, 0.5f, 0.25f, 0.125f, INFINITY, 3.0f, 3.0f, 3.0f, 3.0f, 0.0f};
    const float want_scale[] = {1, 224, 224, 224, 224, 224, 448, 448, 448, 448, 448, 448.0f / 3.0f, 448.0f / 3.0f};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; ++i) {
        driver_record(&drv, seq[i], 1, &s, &e4m3);
        model_quantize(&m, seq[i]);
        EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, &amax));
        if (isnan(seq[i])) assert_true(isinf(amax) && amax > 0); /* NaN is recorded as +inf */
        EXPECT_OK(fp8amp_scaling_update(s));
        model_update(&m);
        expect_model(s, &m, "ring of 4", (long)i);
        EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
        assert_true(scale == want_scale[i]);
        assert_true(scale_inv == 1.0f / want_scale[i]);
        assert_true(amax == 0.0f);
    }
    model_free(&m);
    EXPECT_OK(fp8amp_scaling_destroy(s));

    /* a scale that overflows float32 becomes FLT_MAX; power of two: 2^127 */
    for (int pow2 = 0; pow2 < 2; ++pow2) {
        const float tiny[3] = {1e-40f, bits_f32(1), FLT_MIN / 4};
        for (int t = 0; t < 3; ++t) {
            r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 1, FP8AMP_AMAX_MAX, pow2);
            EXPECT_OK(fp8amp_scaling_create(ctx, &r, e5m2, &s));
            model_init(&m, &r, e5m2);
            driver_record(&drv, tiny[t], 1, &s, &e5m2);
            model_quantize(&m, tiny[t]);
            EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, &amax));
            assert_true(amax == tiny[t]);
            EXPECT_OK(fp8amp_scaling_update(s));
            model_update(&m);
            expect_model(s, &m, "overflowing scale", t);
            EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, NULL));
            assert_true(scale == (pow2 ? 0x1p127f : FLT_MAX));
            assert_true(scale_inv == (float)(1.0 / (double)scale));
            model_free(&m);
            EXPECT_OK(fp8amp_scaling_destroy(s));
        }
    }

    /* a scale below FLT_MIN (huge amax, large margin) becomes FLT_MIN, so scale_inv stays finite */
    for (int pow2 = 0; pow2 < 2; ++pow2) {
        r = make_recipe(FP8AMP_SCALING_DELAYED, 100, 1, 1, FP8AMP_AMAX_MAX, pow2);
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
        model_init(&m, &r, e4m3);
        driver_record(&drv, FLT_MAX, 1, &s, &e4m3);
        model_quantize(&m, FLT_MAX);
        EXPECT_OK(fp8amp_scaling_update(s));
        model_update(&m);
        expect_model(s, &m, "underflowing scale", pow2);
        EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, NULL));
        assert_true(scale == FLT_MIN);
        assert_true(scale_inv == 0x1p126f);
        model_free(&m);
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }

    /* margin and power of two by hand: 448 / 2^2 / 3 = 37.33.. -> 32; E5M2 57344 / 2 / 1000 = 28.672 -> 16 */
    r = make_recipe(FP8AMP_SCALING_DELAYED, 2, 1, 2, FP8AMP_AMAX_MAX, 1);
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    driver_record(&drv, 3.0f, 1, &s, &e4m3);
    EXPECT_OK(fp8amp_scaling_update(s));
    EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, NULL));
    assert_true(scale == 32.0f && scale_inv == 0.03125f);
    EXPECT_OK(fp8amp_scaling_destroy(s));
    r = make_recipe(FP8AMP_SCALING_DELAYED, 1, 1, 2, FP8AMP_AMAX_MAX, 1);
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e5m2, &s));
    driver_record(&drv, 1000.0f, 1, &s, &e5m2);
    EXPECT_OK(fp8amp_scaling_update(s));
    EXPECT_OK(fp8amp_scaling_get(s, &scale, NULL, NULL));
    assert_true(scale == 16.0f);
    EXPECT_OK(fp8amp_scaling_destroy(s));

    /* the largest margin: 448 / 2^127 / 0.5 = 1.75 * 2^-118, a normal float (2^-127 itself is not) */
    r = make_recipe(FP8AMP_SCALING_DELAYED, 127, 1, 2, FP8AMP_AMAX_MAX, 0);
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    driver_record(&drv, 0.5f, 1, &s, &e4m3);
    EXPECT_OK(fp8amp_scaling_update(s));
    EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, NULL));
    assert_true(scale == 0x1.cp-118f);
    assert_true(scale_inv == (float)(1.0 / (double)scale));
    EXPECT_OK(fp8amp_scaling_destroy(s));

    /* interval 3: the scale moves on updates 3, 6, ... only; the history moves on every update */
    r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 3, 2, FP8AMP_AMAX_MOST_RECENT, 0);
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    const float amaxes[6] = {1.0f, 2.0f, 4.0f, 8.0f, 16.0f, 32.0f};
    const float scales[6] = {1.0f, 1.0f, 112.0f, 112.0f, 112.0f, 14.0f};
    for (int i = 0; i < 6; ++i) {
        driver_record(&drv, amaxes[i], 1, &s, &e4m3);
        EXPECT_OK(fp8amp_scaling_update(s));
        float h[2];
        EXPECT_OK(fp8amp_scaling_get_history(s, 2, h));
        assert_true(h[0] == amaxes[i]);
        assert_true(h[1] == (i ? amaxes[i - 1] : 0.0f));
        EXPECT_OK(fp8amp_scaling_get(s, &scale, NULL, NULL));
        assert_true(scale == scales[i]);
    }
    EXPECT_OK(fp8amp_scaling_destroy(s));

    /* the amax recorded between updates is the max over every quantize since the last update */
    r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 2, FP8AMP_AMAX_MAX, 0);
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    driver_record(&drv, 5.0f, 1, &s, &e4m3);
    driver_record(&drv, 7.0f, 1, &s, &e4m3);
    driver_record(&drv, 6.0f, 1, &s, &e4m3);
    EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, &amax));
    assert_true(amax == 7.0f);
    EXPECT_OK(fp8amp_scaling_update(s));
    EXPECT_OK(fp8amp_scaling_get(s, &scale, NULL, &amax));
    assert_true(scale == 64.0f && amax == 0.0f);
    EXPECT_OK(fp8amp_scaling_destroy(s));

    driver_free(&drv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Current scaling: each quantize computes the scale from its own input and uses it in the same call;
 * the update folds the history and leaves the scale alone. */
static void test_current_scaling(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    const size_t n = 1031;
    const int64_t shape[1] = {(int64_t)n};
    float *x = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    uint8_t *q = malloc(n);
    assert_non_null(x);
    assert_non_null(back);
    assert_non_null(q);
    for (int d = 0; d < 2; ++d) {
        const fp8amp_dtype dtype = d ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3;
        const format_t *f = format_of(dtype);
        for (int margin = 0; margin <= 3; margin += 3) {
            fp8amp_recipe r = make_recipe(FP8AMP_SCALING_CURRENT, margin, 1, 4, FP8AMP_AMAX_MAX, margin == 3);
            fp8amp_scaling s;
            fp8amp_tensor src, dst, out;
            EXPECT_OK(fp8amp_scaling_create(ctx, &r, dtype, &s));
            EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &src));
            EXPECT_OK(fp8amp_tensor_create(ctx, dtype, 1, shape, &dst));
            EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &out));
            EXPECT_OK(fp8amp_tensor_set_scaling(dst, s));
            model_t m;
            model_init(&m, &r, dtype);
            for (int round = 0; round < 8; ++round) {
                /* round 3: all zeros, which keeps the previous scale */
                const double spread = ldexp(1.0, (int)(test_rng_u64() % 61) - 30);
                for (size_t i = 0; i < n; ++i) x[i] = round == 3 ? 0.0f : (float)(test_rng_uniform(-1, 1) * spread);
                EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, n * sizeof(float)));
                EXPECT_OK(fp8amp_quantize(ctx, src, dst));
                const double a = amax_ref(FP8AMP_DTYPE_F32, x, n);
                model_quantize(&m, a);
                expect_model(s, &m, "current scaling, after quantize", round);
                /* the data was quantized with the new scale, and dst's scale_inv is its inverse */
                EXPECT_OK(fp8amp_tensor_copy_to_host(dst, q, n));
                for (size_t i = 0; i < n; ++i) {
                    const uint32_t want = encode_fp8_ref(f, mul_f32_ref(x[i], m.scale));
                    if (q[i] != want) {
                        print_error("x %a scale %a: got 0x%02x, want 0x%02x\n", x[i], m.scale, q[i], want);
                        fail();
                    }
                }
                EXPECT_OK(fp8amp_dequantize(ctx, dst, out));
                EXPECT_OK(fp8amp_tensor_copy_to_host(out, back, n * sizeof(float)));
                for (size_t i = 0; i < n; ++i)
                    assert_true(f32_bits(back[i]) == f32_bits((float)mul_f32_ref(decode_ref(f, q[i]), m.scale_inv)));
                if (round != 3 && margin == 0) {
                    /* the largest element lands on (or next to) the format's largest value */
                    uint32_t top = 0;
                    for (size_t i = 0; i < n; ++i)
                        if ((q[i] & 0x7Fu) > top) top = q[i] & 0x7Fu;
                    assert_int_equal(top, max_finite_code(f));
                }
                EXPECT_OK(fp8amp_scaling_update(s));
                model_update(&m);
                expect_model(s, &m, "current scaling, after update", round);
            }
            model_free(&m);
            EXPECT_OK(fp8amp_tensor_destroy(src));
            EXPECT_OK(fp8amp_tensor_destroy(dst));
            EXPECT_OK(fp8amp_tensor_destroy(out));
            EXPECT_OK(fp8amp_scaling_destroy(s));
        }
    }
    free(x);
    free(back);
    free(q);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Many metas of varied recipes: one update_many equals one update of each, bit for bit. More than
 * 1024 metas, so that the CUDA side needs more than one launch. */
static void test_update_many_equals_single_updates(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    driver_t drv;
    driver_init(&drv, ctx);
    enum { N = 1030 };
    const int STEPS = test_small() ? 2 : 4;
    fp8amp_scaling *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    fp8amp_dtype *dtypes = malloc(N * sizeof *dtypes);
    int *lens = malloc(N * sizeof *lens);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(dtypes);
    assert_non_null(lens);
    for (int i = 0; i < N; ++i) {
        const fp8amp_recipe r = make_recipe((test_rng_u64() % 5 == 0) ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED,
                                            (int)(test_rng_u64() % 6), 1 + (int)(test_rng_u64() % 3),
                                            1 + (int)(test_rng_u64() % 40),
                                            (test_rng_u64() & 1) ? FP8AMP_AMAX_MOST_RECENT : FP8AMP_AMAX_MAX,
                                            (int)(test_rng_u64() & 1));
        const fp8amp_dtype scaled_dtypes[3] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_F16};
        dtypes[i] = scaled_dtypes[test_rng_u64() % 3];
        lens[i] = r.amax_history_len;
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, dtypes[i], &a[i]));
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, dtypes[i], &b[i]));
    }
    for (int step = 0; step < STEPS; ++step) {
        for (int i = 0; i < N; ++i) {
            const fp8amp_scaling pair[2] = {a[i], b[i]};
            const fp8amp_dtype pair_dtypes[2] = {dtypes[i], dtypes[i]};
            if (test_rng_u64() % 8) driver_record(&drv, random_amax(1), 2, pair, pair_dtypes);
        }
        EXPECT_OK(fp8amp_scaling_update_many(ctx, N, a));
        for (int i = 0; i < N; ++i) EXPECT_OK(fp8amp_scaling_update(b[i]));
        for (int i = 0; i < N; ++i) {
            snapshot_t sa, sb;
            snapshot(a[i], lens[i], &sa);
            snapshot(b[i], lens[i], &sb);
            if (memcmp(&sa, &sb, sizeof sa) != 0)
                print_error("step %d, meta %d: update_many gives scale %a, one update %a\n", step, i, sa.scale, sb.scale);
            assert_memory_equal(&sa, &sb, sizeof sa);
        }
    }
    /* n = 0 is an empty batch, with or without an array */
    EXPECT_OK(fp8amp_scaling_update_many(ctx, 0, NULL));
    EXPECT_OK(fp8amp_scaling_update_many(ctx, 0, a));
    for (int i = 0; i < N; ++i) {
        EXPECT_OK(fp8amp_scaling_destroy(a[i]));
        EXPECT_OK(fp8amp_scaling_destroy(b[i]));
    }
    free(a);
    free(b);
    free(dtypes);
    free(lens);
    driver_free(&drv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A failed update_many updates none of its metas. */
static void test_update_many_bad_input(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    driver_t drv;
    driver_init(&drv, ctx);
    enum { N = 6, LEN = 5 };
    fp8amp_scaling m[N];
    const fp8amp_dtype e4m3 = FP8AMP_DTYPE_E4M3;
    const fp8amp_recipe r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, LEN, FP8AMP_AMAX_MAX, 0);
    for (int i = 0; i < N; ++i) {
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &m[i]));
        /* a non-trivial state: a scale from an update, and a recorded amax that an update would fold */
        driver_record(&drv, (float)(i + 1), 1, &m[i], &e4m3);
        EXPECT_OK(fp8amp_scaling_update(m[i]));
        driver_record(&drv, (float)(10 * i + 3), 1, &m[i], &e4m3);
    }
    snapshot_t before[N];
    for (int i = 0; i < N; ++i) snapshot(m[i], LEN, &before[i]);

    fp8amp_scaling dead;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &dead));
    EXPECT_OK(fp8amp_scaling_destroy(dead));
    fp8amp_tensor some_tensor = drv.src;

    const fp8amp_scaling dup[4] = {m[0], m[1], m[2], m[1]};
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 4, dup), FP8AMP_ERROR_INVALID_ARGUMENT);
    const fp8amp_scaling with_dead[4] = {m[0], m[1], dead, m[3]};
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 4, with_dead), FP8AMP_ERROR_INVALID_HANDLE);
    const fp8amp_scaling with_null[3] = {m[0], NULL, m[2]};
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 3, with_null), FP8AMP_ERROR_INVALID_HANDLE);
    const fp8amp_scaling with_tensor[3] = {m[0], (fp8amp_scaling)some_tensor, m[2]};
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 3, with_tensor), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, -1, m), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 2, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_scaling_update_many(NULL, N, m), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_scaling_update_many((fp8amp_context)m[0], N, m), FP8AMP_ERROR_INVALID_HANDLE);
    if (have_cuda()) {
        /* a meta of the other device, listed last */
        fp8amp_context other;
        const int is_cuda = variant_device(state).type == FP8AMP_DEVICE_CUDA;
        EXPECT_OK(fp8amp_context_create(is_cuda ? cpu_device() : cuda_device(0), &other));
        fp8amp_scaling foreign;
        EXPECT_OK(fp8amp_scaling_create(other, &r, e4m3, &foreign));
        const fp8amp_scaling mixed[3] = {m[0], m[1], foreign};
        EXPECT_STATUS(fp8amp_scaling_update_many(ctx, 3, mixed), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_scaling_update_many(other, 3, mixed), FP8AMP_ERROR_DEVICE_MISMATCH);
        snapshot_t f;
        snapshot(foreign, LEN, &f);
        assert_true(f.hist[0] == 0.0f && f.scale == 1.0f);
        EXPECT_OK(fp8amp_scaling_destroy(foreign));
        EXPECT_OK(fp8amp_context_destroy(other));
    }
    for (int i = 0; i < N; ++i) {
        snapshot_t now;
        snapshot(m[i], LEN, &now);
        assert_memory_equal(&now, &before[i], sizeof now);
    }
    /* and a good call still works afterwards */
    EXPECT_OK(fp8amp_scaling_update_many(ctx, N, m));
    for (int i = 0; i < N; ++i) {
        snapshot_t now;
        snapshot(m[i], LEN, &now);
        assert_true(now.hist[0] == (float)(10 * i + 3) && now.amax == 0.0f);
        assert_true(now.scale == 448.0f / (float)(10 * i + 3));
        EXPECT_OK(fp8amp_scaling_destroy(m[i]));
    }
    driver_free(&drv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_set_scale(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    driver_t drv;
    driver_init(&drv, ctx);
    const fp8amp_dtype e4m3 = FP8AMP_DTYPE_E4M3;
    fp8amp_recipe r = make_recipe(FP8AMP_SCALING_DELAYED, 0, 1, 3, FP8AMP_AMAX_MAX, 0);
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, e4m3, &s));
    driver_record(&drv, 3.0f, 1, &s, &e4m3);
    snapshot_t before, now;
    const float good[] = {2.5f, 1e-30f, 3e38f, 0x1p-126f, 7.0f};
    for (size_t k = 0; k < sizeof good / sizeof good[0]; ++k) {
        EXPECT_OK(fp8amp_scaling_set_scale(s, good[k]));
        snapshot(s, 3, &now);
        assert_true(now.scale == good[k]);
        assert_true(f32_bits(now.scale_inv) == f32_bits(reciprocal_ref(good[k])));
        assert_true(now.amax == 3.0f); /* the recorded amax and the history are left alone */
        assert_true(now.hist[0] == 0.0f);
    }
    snapshot(s, 3, &before);
    const float bad[] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, -FLT_MIN, FLT_MIN / 4};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        EXPECT_STATUS(fp8amp_scaling_set_scale(s, bad[k]), FP8AMP_ERROR_INVALID_ARGUMENT);
        snapshot(s, 3, &now);
        assert_memory_equal(&now, &before, sizeof now);
    }
    /* the set scale is what the next quantize uses: 1.5 * 7 = 10.5 -> E4M3 10 (tie to even) */
    const int64_t one[1] = {1};
    fp8amp_tensor x, q;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, one, &x));
    EXPECT_OK(fp8amp_tensor_create(ctx, e4m3, 1, one, &q));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    const float v = 1.5f;
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, &v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    uint8_t code;
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, &code, 1));
    assert_int_equal(code, encode_fp8_ref(&FMT_E4M3, 10.0));
    assert_int_equal(code, 0x52);
    /* an update replaces it from the history: max(3, 1.5) -> 448 / 3 */
    EXPECT_OK(fp8amp_scaling_update(s));
    snapshot(s, 3, &now);
    assert_true(now.scale == 448.0f / 3.0f);

    /* a meta lives on while a tensor is bound to it, even after its handle is destroyed */
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, &code, 1));
    assert_int_equal(code, encode_fp8_ref(&FMT_E4M3, mul_f32_ref(1.5, 448.0f / 3.0f)));
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    driver_free(&drv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The model itself, on answers known by hand. */
static void test_model_known_values(void **state) {
    (void)state;
    assert_true(scale_ref(448.0, 0, 0, 2.0, 1.0f) == 224.0f);
    assert_true(scale_ref(448.0, 1, 0, 2.0, 1.0f) == 112.0f);
    assert_true(scale_ref(448.0, 0, 1, 3.0, 1.0f) == 128.0f);
    assert_true(scale_ref(448.0, 0, 0, 0.0, 5.0f) == 5.0f);
    assert_true(scale_ref(448.0, 0, 0, INFINITY, 5.0f) == 5.0f);
    assert_true(scale_ref(448.0, 0, 0, NAN, 5.0f) == 5.0f);
    assert_true(scale_ref(448.0, 0, 0, 1e-40, 5.0f) == FLT_MAX);
    assert_true(scale_ref(448.0, 100, 0, FLT_MAX, 5.0f) == FLT_MIN); /* would be subnormal */
    assert_true(scale_ref(448.0, 100, 1, FLT_MAX, 5.0f) == FLT_MIN);
    assert_true(scale_ref(448.0, 0, 1, 1e-40, 5.0f) == 0x1p127f);
    assert_true(scale_ref(57344.0, 0, 0, 57344.0, 5.0f) == 1.0f);
    assert_true(scale_ref(448.0, 0, 0, 3.0, 1.0f) == 448.0f / 3.0f);
    assert_true(reciprocal_ref(4.0f) == 0.25f);
    assert_true(mul_f32_ref(NAN, 2.0f) != mul_f32_ref(NAN, 2.0f));
    assert_true(mul_f32_ref(FLT_MAX, 2.0f) == INFINITY);
    assert_true(mul_f32_ref(-FLT_MAX, 1.0f) == -FLT_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recipe_defaults),
        cmocka_unit_test(test_model_known_values),
        DEVICE_TESTS(test_new_meta_state),
        DEVICE_TESTS(test_bad_recipes),
        DEVICE_TESTS(test_scales_match_float64_model),
        DEVICE_TESTS(test_special_amax_values),
        DEVICE_TESTS(test_current_scaling),
        DEVICE_TESTS(test_update_many_equals_single_updates),
        DEVICE_TESTS(test_update_many_bad_input),
        DEVICE_TESTS(test_set_scale),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
