/* The fused normalizations: fp8amp_norm_forward / fp8amp_norm_backward (LayerNorm, RMSNorm), checked
 * on fresh random data of odd shapes against
 * - float64 references (the forward's y, mean and rstd; the backward's dx, dgamma, dbeta) within the
 *   float32 tolerances of docs/numerics.md 7.4;
 * - the library's own unfused path: an FP8 y must be byte for byte what fp8amp_quantize makes of the
 *   F32 y with the same scale (and the same recorded amax, scale, scale_inv and statistics), y_t its
 *   transpose, and a BF16/F16 y or dx what fp8amp_cast makes of the F32 one;
 * - NaN and inf inputs as fp8amp_quantize handles them; every bad input gets its status and changes
 *   nothing.
 * Each test runs on the CPU and on CUDA (skipped without a GPU); test_cpu_cuda_identical compares
 * the two byte for byte. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

/* ---- data ------------------------------------------------------------------------------------- */

/* v rounded into a wide dtype's code (F32: the float), stored as element i of buf. */
static void put_value(fp8amp_dtype d, void *buf, size_t i, double v) {
    if (d == FP8AMP_DTYPE_F32) {
        ((float *)buf)[i] = (float)v;
        return;
    }
    const format_t *f = format_of(d);
    set_code(d, buf, i, code_of_value_ref(f, round_ref(f, v)));
}

/* rows x d values: per row an offset in [-off, off] plus uniform noise of a random spread, so that
 * rows differ in mean and variance and LayerNorm's centering cancels digits. */
static void gen_rows(fp8amp_dtype dt, void *buf, int64_t rows, int64_t d, double off) {
    for (int64_t r = 0; r < rows; ++r) {
        const double o = test_rng_uniform(-off, off), spread = ldexp(1.0, (int)(test_rng_u64() % 7) - 3);
        for (int64_t i = 0; i < d; ++i) put_value(dt, buf, (size_t)(r * d + i), o + spread * test_rng_uniform(-1.0, 1.0));
    }
}

static void gen_vector(fp8amp_dtype dt, void *buf, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; ++i) put_value(dt, buf, (size_t)i, test_rng_uniform(lo, hi));
}

static fp8amp_tensor make_vector(fp8amp_context ctx, fp8amp_dtype dt, int64_t n, const void *host) {
    return tensor_from_host(ctx, dt, 1, &n, host);
}

static fp8amp_norm_desc make_desc(fp8amp_norm_kind kind, int zero_centered, float eps) {
    fp8amp_norm_desc desc;
    EXPECT_OK(fp8amp_norm_desc_init_default(&desc));
    desc.kind = kind;
    desc.zero_centered_gamma = zero_centered;
    desc.eps = eps;
    return desc;
}

/* ---- one forward -------------------------------------------------------------------------------- */

/* A problem: its inputs on the host. */
typedef struct {
    fp8amp_norm_desc desc;
    int64_t rows, d;
    fp8amp_dtype x_dt, g_dt, b_dt;
    int has_beta;
    void *x, *gamma, *beta;
} problem_t;

static void problem_make(problem_t *p, fp8amp_norm_kind kind, int zero_centered, int64_t rows, int64_t d,
                         fp8amp_dtype x_dt, fp8amp_dtype g_dt, int has_beta) {
    memset(p, 0, sizeof *p);
    p->desc = make_desc(kind, zero_centered, (float)ldexp(test_rng_uniform(1.0, 2.0), -(int)(test_rng_u64() % 20) - 3));
    p->rows = rows;
    p->d = d;
    p->x_dt = x_dt;
    p->g_dt = g_dt;
    p->b_dt = (test_rng_u64() & 1) ? FP8AMP_DTYPE_F32 : g_dt;
    p->has_beta = kind == FP8AMP_NORM_LAYERNORM && has_beta;
    p->x = xmalloc((size_t)(rows * d) * 4);
    p->gamma = xmalloc((size_t)d * 4);
    p->beta = xmalloc((size_t)d * 4);
    gen_rows(x_dt, p->x, rows, d, 4.0);
    if (zero_centered)
        gen_vector(g_dt, p->gamma, d, -0.5, 0.5);
    else
        gen_vector(g_dt, p->gamma, d, 0.25, 2.0);
    gen_vector(p->b_dt, p->beta, d, -1.0, 1.0);
}

static void problem_free(problem_t *p) {
    free(p->x);
    free(p->gamma);
    free(p->beta);
}

/* The outputs of a forward, on the host. */
typedef struct {
    void *y, *y_t;
    float *mean, *rstd;
    float scale, scale_inv, amax, y_scale_inv, y_t_scale_inv;
    fp8amp_scaling_stats stats;
} fwd_t;

static void fwd_free(fwd_t *f) {
    free(f->y);
    free(f->y_t);
    free(f->mean);
    free(f->rstd);
}

/* Set: run_forward's FP8 metas count no statistics (the CUDA lean forward has a variant without them). */
static int g_stats_off;

/* Runs the forward on `device` into y of dtype y_dt (FP8: bound to a fresh meta of `mode` with scale
 * `scale`, counting statistics unless g_stats_off; with_t: also y_t). */
static void run_forward(fp8amp_device device, const problem_t *p, fp8amp_dtype y_dt, fp8amp_scaling_mode mode,
                        float scale, int with_t, fwd_t *out) {
    memset(out, 0, sizeof *out);
    const int rms = p->desc.kind == FP8AMP_NORM_RMSNORM;
    const int fp8 = y_dt == FP8AMP_DTYPE_E4M3 || y_dt == FP8AMP_DTYPE_E5M2;
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t shape[2] = {p->rows, p->d}, tshape[2] = {p->d, p->rows};
    fp8amp_tensor x = tensor_from_host(ctx, p->x_dt, 2, shape, p->x);
    fp8amp_tensor g = make_vector(ctx, p->g_dt, p->d, p->gamma);
    fp8amp_tensor b = p->has_beta ? make_vector(ctx, p->b_dt, p->d, p->beta) : NULL;
    fp8amp_tensor y = tensor_from_host(ctx, y_dt, 2, shape, NULL), yt = NULL;
    fp8amp_tensor mean = rms ? NULL : make_vector(ctx, FP8AMP_DTYPE_F32, p->rows, NULL);
    fp8amp_tensor rstd = make_vector(ctx, FP8AMP_DTYPE_F32, p->rows, NULL);
    /* poison: every element must be written */
    size_t nbytes;
    EXPECT_OK(fp8amp_tensor_nbytes(y, &nbytes));
    void *poison = xmalloc(nbytes);
    memset(poison, 0xA5, nbytes);
    EXPECT_OK(fp8amp_tensor_copy_from_host(y, poison, nbytes));
    fp8amp_scaling s = NULL;
    if (fp8) {
        s = counting_meta(ctx, y_dt, mode, scale);
        if (g_stats_off) EXPECT_OK(fp8amp_scaling_enable_stats(s, 0));
        EXPECT_OK(fp8amp_tensor_set_scaling(y, s));
        if (with_t) {
            yt = tensor_from_host(ctx, y_dt, 2, tshape, poison);
            EXPECT_OK(fp8amp_tensor_set_scaling(yt, s));
        }
    }
    free(poison);
    EXPECT_OK(fp8amp_norm_forward(ctx, &p->desc, x, g, b, y, yt, mean, rstd));
    out->y = tensor_to_host(y);
    if (yt) out->y_t = tensor_to_host(yt);
    if (mean) out->mean = tensor_to_host(mean);
    out->rstd = tensor_to_host(rstd);
    if (s) {
        EXPECT_OK(fp8amp_scaling_get(s, &out->scale, &out->scale_inv, &out->amax));
        EXPECT_OK(fp8amp_scaling_get_stats(s, &out->stats));
        fp8amp_tensor si;
        EXPECT_OK(fp8amp_tensor_scale_inv(y, &si));
        EXPECT_OK(fp8amp_tensor_copy_to_host(si, &out->y_scale_inv, 4));
        EXPECT_OK(fp8amp_tensor_destroy(si));
        if (yt) {
            EXPECT_OK(fp8amp_tensor_scale_inv(yt, &si));
            EXPECT_OK(fp8amp_tensor_copy_to_host(si, &out->y_t_scale_inv, 4));
            EXPECT_OK(fp8amp_tensor_destroy(si));
        }
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    fp8amp_tensor all[7] = {x, g, b, y, yt, mean, rstd};
    for (int i = 0; i < 7; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The unfused path: quantize (or cast) the host F32 y on `device` with a fresh meta of `mode` and
 * `scale`; returns the codes and fills the meta's readings into *out (y left NULL). */
static uint8_t *unfused_quantize(fp8amp_device device, const float *y32, int64_t rows, int64_t d, fp8amp_dtype dt,
                                 fp8amp_scaling_mode mode, float scale, fwd_t *out) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t shape[2] = {rows, d};
    fp8amp_tensor src = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, shape, y32);
    fp8amp_tensor q = tensor_from_host(ctx, dt, 2, shape, NULL);
    fp8amp_scaling s = counting_meta(ctx, dt, mode, scale);
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    uint8_t *codes = tensor_to_host(q);
    EXPECT_OK(fp8amp_scaling_get(s, &out->scale, &out->scale_inv, &out->amax));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &out->stats));
    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    return codes;
}

static void *cast_f32(fp8amp_device device, const float *v, int64_t n, fp8amp_dtype dt) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    fp8amp_tensor a = make_vector(ctx, FP8AMP_DTYPE_F32, n, v), b = make_vector(ctx, dt, n, NULL);
    EXPECT_OK(fp8amp_cast(ctx, a, b));
    void *out = tensor_to_host(b);
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    return out;
}

/* ---- float64 references ------------------------------------------------------------------------ */

static double weight_ref(const problem_t *p, int64_t i) {
    const double g = value_at(p->g_dt, p->gamma, (size_t)i);
    return p->desc.zero_centered_gamma ? 1.0 + g : g;
}

static void stats_ref(const problem_t *p, int64_t r, double *mean, double *rstd) {
    const int rms = p->desc.kind == FP8AMP_NORM_RMSNORM;
    double s = 0.0, q = 0.0;
    for (int64_t i = 0; i < p->d; ++i) s += value_at(p->x_dt, p->x, (size_t)(r * p->d + i));
    *mean = rms ? 0.0 : s / (double)p->d;
    for (int64_t i = 0; i < p->d; ++i) {
        const double t = value_at(p->x_dt, p->x, (size_t)(r * p->d + i)) - *mean;
        q += t * t;
    }
    *rstd = 1.0 / sqrt(q / (double)p->d + (double)p->desc.eps);
}

/* Worst ratio of |got - ref| to its bound over y, mean and rstd (<= 1 passes). The bound of y:
 * kTolY * ((|xhat| + 1 + |mean| * rstd) * |w| + |beta|): each rounding of the float32 evaluation is
 * relative to one of these magnitudes, and the centering's error grows with |mean| / std. */
static const double kTolY = 0x1p-20, kTolStat = 0x1p-21;

static double check_forward_ref(const problem_t *p, const fwd_t *f, const char *what) {
    const int rms = p->desc.kind == FP8AMP_NORM_RMSNORM;
    double worst = 0.0;
    int reported = 0;
    for (int64_t r = 0; r < p->rows; ++r) {
        double mean, rstd;
        stats_ref(p, r, &mean, &rstd);
        double e = fabs((double)f->rstd[r] - rstd) / (kTolStat * rstd);
        if (!rms) {
            const double emean = fabs((double)f->mean[r] - mean) / (kTolStat * (fabs(mean) + 1.0 / rstd));
            if (emean > e) e = emean;
        }
        if (e > worst) worst = e;
        for (int64_t i = 0; i < p->d; ++i) {
            const double x = value_at(p->x_dt, p->x, (size_t)(r * p->d + i)), w = weight_ref(p, i);
            const double b = p->has_beta ? value_at(p->b_dt, p->beta, (size_t)i) : 0.0;
            const double xh = (x - mean) * rstd, want = xh * w + b;
            const double got = ((const float *)f->y)[r * p->d + i];
            const double bound = kTolY * ((fabs(xh) + 1.0 + fabs(mean) * rstd) * fabs(w) + fabs(b));
            const double ey = fabs(got - want) / bound;
            if (!(ey <= 1.0) && reported++ < 5)
                print_error("%s: y[%lld, %lld] = %.9g, float64 %.9g\n", what, (long long)r, (long long)i, got, want);
            if (!(ey <= worst)) worst = ey; /* NaN too */
        }
    }
    return worst;
}

/* ---- tests: forward ----------------------------------------------------------------------------- */

typedef struct {
    int64_t rows, d;
} shape_t;

static const shape_t kShapes[] = {{1, 1}, {3, 7}, {17, 1023}, {5, 1024}, {2, 4099}, {64, 96}, {1, 8193}, {33, 20}};
#define NSHAPES (sizeof kShapes / sizeof kShapes[0])
static const fp8amp_dtype WIDE[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F16};

static void test_forward_vs_float64(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    double worst = 0.0;
    for (int kind = 0; kind < 2; ++kind)
        for (int zc = 0; zc < 2; ++zc)
            for (size_t s = 0; s < NSHAPES; ++s) {
                problem_t p;
                problem_make(&p, (fp8amp_norm_kind)kind, zc, kShapes[s].rows, kShapes[s].d, WIDE[(s + kind) % 3],
                             WIDE[(s + zc) % 3], (int)(s % 3 != 2));
                fwd_t f;
                run_forward(device, &p, FP8AMP_DTYPE_F32, FP8AMP_SCALING_DELAYED, 1.0f, 0, &f);
                char what[128];
                snprintf(what, sizeof what, "%s zc=%d [%lld, %lld] x %s", kind ? "rmsnorm" : "layernorm", zc,
                         (long long)p.rows, (long long)p.d, fp8amp_dtype_name(p.x_dt));
                const double e = check_forward_ref(&p, &f, what);
                if (!(e <= 1.0)) print_error("%s: error %.3g of the bound\n", what, e);
                assert_true(e <= 1.0);
                if (e > worst) worst = e;
                fwd_free(&f);
                problem_free(&p);
            }
    print_message("forward: worst error %.3g of the documented bound\n", worst);
}

/* The fused FP8 output is the unfused quantize of the F32 output, byte for byte, with the same meta
 * readings; y_t is its transpose; the wide outputs are casts of the F32 one. */
static void test_fp8_output_is_quantized_f32(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    for (size_t s = 0; s < NSHAPES; ++s)
        for (int k = 0; k < 4; ++k) {
            const fp8amp_norm_kind kind = (k & 1) ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM;
            const fp8amp_dtype dt = (k & 2) ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3;
            const fp8amp_scaling_mode mode = ((s + (size_t)k) % 3 == 0) ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
            problem_t p;
            problem_make(&p, kind, (int)(s & 1), kShapes[s].rows, kShapes[s].d, WIDE[s % 3], WIDE[(s + 1) % 3], 1);
            const int64_t n = p.rows * p.d;
            /* scales that saturate part of y (y is of order 1-10) and ones that do not */
            const float scale = (float)ldexp(test_rng_uniform(1.0, 2.0), (int)(test_rng_u64() % 12) - 2);
            fwd_t f32, q, ref;
            run_forward(device, &p, FP8AMP_DTYPE_F32, FP8AMP_SCALING_DELAYED, 1.0f, 0, &f32);
            run_forward(device, &p, dt, mode, scale, 1, &q);
            uint8_t *codes = unfused_quantize(device, f32.y, p.rows, p.d, dt, mode, scale, &ref);
            assert_memory_equal(q.y, codes, (size_t)n);
            for (int64_t r = 0; r < p.rows; ++r)
                for (int64_t c = 0; c < p.d; ++c)
                    assert_int_equal(((uint8_t *)q.y_t)[c * p.rows + r], codes[r * p.d + c]);
            /* independently: the codes of y * scale by the brute-force encoder */
            const format_t *fmt = format_of(dt);
            for (int64_t i = 0; i < n; ++i)
                assert_int_equal(codes[i], encode_fp8_ref(fmt, mul_f32_ref(((float *)f32.y)[i], ref.scale)));
            assert_true(f32_bits(q.amax) == f32_bits(ref.amax));
            assert_true(f32_bits(q.amax) == f32_bits((float)amax_ref(FP8AMP_DTYPE_F32, f32.y, (size_t)n)));
            assert_true(f32_bits(q.scale) == f32_bits(ref.scale));
            assert_true(f32_bits(q.scale_inv) == f32_bits(ref.scale_inv));
            assert_true(f32_bits(q.y_scale_inv) == f32_bits(ref.scale_inv));
            assert_true(f32_bits(q.y_t_scale_inv) == f32_bits(ref.scale_inv));
            assert_memory_equal(&q.stats, &ref.stats, sizeof q.stats);
            if (mode == FP8AMP_SCALING_DELAYED) assert_true(f32_bits(q.scale) == f32_bits(scale));
            /* mean and rstd do not depend on y's dtype */
            if (f32.mean) assert_memory_equal(q.mean, f32.mean, (size_t)p.rows * 4);
            assert_memory_equal(q.rstd, f32.rstd, (size_t)p.rows * 4);
            free(codes);
            fwd_free(&q);
            /* wide outputs */
            for (int w = 1; w < 3; ++w) {
                fwd_t o;
                run_forward(device, &p, WIDE[w], FP8AMP_SCALING_DELAYED, 1.0f, 0, &o);
                void *want = cast_f32(device, f32.y, n, WIDE[w]);
                assert_memory_equal(o.y, want, (size_t)n * 2);
                free(want);
                fwd_free(&o);
            }
            fwd_free(&f32);
            problem_free(&p);
        }
}

/* NULL desc = the defaults; mean and rstd may be NULL; zero-centered gamma equals gamma + 1. */
static void test_defaults_and_options(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    problem_t p;
    problem_make(&p, FP8AMP_NORM_LAYERNORM, 0, 9, 301, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 1);
    p.desc.eps = 1e-5f;
    gen_vector(p.g_dt, p.gamma, p.d, 0.5, 2.0); /* so that gamma - 1 is exact (Sterbenz) */
    fwd_t a;
    run_forward(device, &p, FP8AMP_DTYPE_F32, FP8AMP_SCALING_DELAYED, 1.0f, 0, &a);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t shape[2] = {p.rows, p.d};
    fp8amp_tensor x = tensor_from_host(ctx, p.x_dt, 2, shape, p.x), g = make_vector(ctx, p.g_dt, p.d, p.gamma);
    fp8amp_tensor b = make_vector(ctx, p.b_dt, p.d, p.beta), y = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, shape, NULL);
    EXPECT_OK(fp8amp_norm_forward(ctx, NULL, x, g, b, y, NULL, NULL, NULL));
    float *got = tensor_to_host(y);
    assert_memory_equal(got, a.y, (size_t)(p.rows * p.d) * 4);
    free(got);
    /* zero-centered: gamma' = gamma - 1 exactly (gamma in [0.25, 2) as F32: the subtraction is exact) */
    float *gz = xmalloc((size_t)p.d * 4);
    for (int64_t i = 0; i < p.d; ++i) gz[i] = ((float *)p.gamma)[i] - 1.0f;
    EXPECT_OK(fp8amp_tensor_copy_from_host(g, gz, (size_t)p.d * 4));
    fp8amp_norm_desc desc = make_desc(FP8AMP_NORM_LAYERNORM, 1, 1e-5f);
    EXPECT_OK(fp8amp_norm_forward(ctx, &desc, x, g, b, y, NULL, NULL, NULL));
    got = tensor_to_host(y);
    assert_memory_equal(got, a.y, (size_t)(p.rows * p.d) * 4);
    free(got);
    free(gz);
    fp8amp_tensor all[4] = {x, g, b, y};
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    fwd_free(&a);
    problem_free(&p);
}

/* NaN and inf inputs: a row holding one gives NaN (positive) everywhere in that row; the FP8 output
 * is then the positive NaN code and the recorded amax inf, as fp8amp_quantize records a NaN; the
 * other rows are unaffected. */
static void test_nan_and_inf(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    for (int kind = 0; kind < 2; ++kind) {
        problem_t p;
        problem_make(&p, (fp8amp_norm_kind)kind, 0, 6, 37, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 1);
        float *x = p.x;
        x[1 * 37 + 5] = NAN;
        x[2 * 37 + 0] = -NAN;
        x[3 * 37 + 36] = INFINITY;
        x[4 * 37 + 7] = -INFINITY;
        fwd_t f32, q, ref, clean;
        run_forward(device, &p, FP8AMP_DTYPE_F32, FP8AMP_SCALING_DELAYED, 1.0f, 0, &f32);
        run_forward(device, &p, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 16.0f, 1, &q);
        const float *y = f32.y;
        for (int r = 1; r <= 4; ++r) {
            if (kind == 1 && r >= 3) {
                /* RMSNorm of a row with an infinity: mean(x^2) = inf, rstd = 0, so y is inf * 0 = NaN
                 * there and a zero elsewhere */
                assert_true(f32_bits(f32.rstd[r]) == 0u);
                for (int i = 0; i < 37; ++i) {
                    const int at_inf = (r == 3 && i == 36) || (r == 4 && i == 7);
                    assert_true(at_inf ? f32_bits(y[r * 37 + i]) == 0x7FC00000u : y[r * 37 + i] == 0.0f);
                }
                continue;
            }
            /* a NaN in the row (or, for LayerNorm, an infinity: the mean is inf, inf - inf is NaN)
             * makes the statistics and the whole row the positive NaN */
            assert_true(f32_bits(f32.rstd[r]) == 0x7FC00000u);
            if (kind == 0) assert_true(f32_bits(f32.mean[r]) == 0x7FC00000u || isinf(f32.mean[r]));
            for (int i = 0; i < 37; ++i) assert_true(f32_bits(y[r * 37 + i]) == 0x7FC00000u);
            for (int i = 0; i < 37; ++i) assert_int_equal(((uint8_t *)q.y)[r * 37 + i], 0x7F);
        }
        uint8_t *codes = unfused_quantize(device, f32.y, p.rows, p.d, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 16.0f, &ref);
        assert_memory_equal(q.y, codes, (size_t)(p.rows * p.d));
        assert_true(isinf(q.amax) && q.amax > 0);
        assert_memory_equal(&q.stats, &ref.stats, sizeof q.stats);
        /* rows 0 and 5 are what they are without the specials */
        x[1 * 37 + 5] = x[2 * 37 + 0] = x[3 * 37 + 36] = x[4 * 37 + 7] = 1.0f;
        run_forward(device, &p, FP8AMP_DTYPE_F32, FP8AMP_SCALING_DELAYED, 1.0f, 0, &clean);
        assert_memory_equal(clean.y, f32.y, 37 * 4);
        assert_memory_equal((float *)clean.y + 5 * 37, (float *)f32.y + 5 * 37, 37 * 4);
        free(codes);
        fwd_free(&f32);
        fwd_free(&q);
        fwd_free(&clean);
        problem_free(&p);
    }
}

/* ---- backward --------------------------------------------------------------------------------- */

typedef struct {
    void *dx;
    float *dgamma, *dbeta;
} bwd_t;

static void bwd_free(bwd_t *b) {
    free(b->dx);
    free(b->dgamma);
    free(b->dbeta);
}

/* Runs the forward (for mean and rstd) and then the backward of dy (dtype dy_dt) into dx of dx_dt;
 * LayerNorm with dbeta unless with_dbeta is 0. */
static void run_backward_db(fp8amp_device device, const problem_t *p, fp8amp_dtype dy_dt, const void *dy,
                            fp8amp_dtype dx_dt, int with_dbeta, bwd_t *out) {
    const int rms = p->desc.kind == FP8AMP_NORM_RMSNORM;
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t shape[2] = {p->rows, p->d};
    fp8amp_tensor x = tensor_from_host(ctx, p->x_dt, 2, shape, p->x), g = make_vector(ctx, p->g_dt, p->d, p->gamma);
    fp8amp_tensor y = tensor_from_host(ctx, FP8AMP_DTYPE_BF16, 2, shape, NULL);
    fp8amp_tensor mean = rms ? NULL : make_vector(ctx, FP8AMP_DTYPE_F32, p->rows, NULL);
    fp8amp_tensor rstd = make_vector(ctx, FP8AMP_DTYPE_F32, p->rows, NULL);
    fp8amp_tensor dyt = tensor_from_host(ctx, dy_dt, 2, shape, dy), dx = tensor_from_host(ctx, dx_dt, 2, shape, NULL);
    fp8amp_tensor dg = make_vector(ctx, FP8AMP_DTYPE_F32, p->d, NULL);
    fp8amp_tensor db = rms || !with_dbeta ? NULL : make_vector(ctx, FP8AMP_DTYPE_F32, p->d, NULL);
    EXPECT_OK(fp8amp_norm_forward(ctx, &p->desc, x, g, NULL, y, NULL, mean, rstd));
    EXPECT_OK(fp8amp_norm_backward(ctx, &p->desc, dyt, x, g, mean, rstd, dx, dg, db));
    out->dx = tensor_to_host(dx);
    out->dgamma = tensor_to_host(dg);
    out->dbeta = db ? tensor_to_host(db) : NULL;
    fp8amp_tensor all[9] = {x, g, y, mean, rstd, dyt, dx, dg, db};
    for (int i = 0; i < 9; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void run_backward(fp8amp_device device, const problem_t *p, fp8amp_dtype dy_dt, const void *dy,
                         fp8amp_dtype dx_dt, bwd_t *out) {
    run_backward_db(device, p, dy_dt, dy, dx_dt, 1, out);
}

/* Bounds: dx within kTolDx * rstd * (|g| + mean|g| + m * mean|g| * m) (the magnitudes of the three
 * terms whose cancellation makes dx), dgamma within kTolCol * sum |dy| * m, dbeta within kTolCol *
 * sum |dy|, where m = |xhat| + 1 + |mean| * rstd is the magnitude xhat's float32 error is relative to
 * (x - mean cancels: its error is relative to |mean|, as in the forward's bound). */
static const double kTolDx = 0x1p-20, kTolCol = 0x1p-20;

static double check_backward_ref(const problem_t *p, fp8amp_dtype dy_dt, const void *dy, const bwd_t *b,
                                 const char *what) {
    const int rms = p->desc.kind == FP8AMP_NORM_RMSNORM;
    const int64_t rows = p->rows, d = p->d;
    double *dg = calloc((size_t)d, sizeof(double)), *db = calloc((size_t)d, sizeof(double));
    double *dg_mag = calloc((size_t)d, sizeof(double)), *db_mag = calloc((size_t)d, sizeof(double));
    assert_true(dg && db && dg_mag && db_mag);
    double worst = 0.0;
    int reported = 0;
    for (int64_t r = 0; r < rows; ++r) {
        double mean, rstd, c1 = 0, c2 = 0, a1 = 0, a2 = 0;
        stats_ref(p, r, &mean, &rstd);
        for (int64_t i = 0; i < d; ++i) {
            const double g = value_at(dy_dt, dy, (size_t)(r * d + i)) * weight_ref(p, i);
            const double xh = (value_at(p->x_dt, p->x, (size_t)(r * d + i)) - mean) * rstd;
            const double m = fabs(xh) + 1.0 + fabs(mean) * rstd;
            c1 += g, c2 += g * xh, a1 += fabs(g), a2 += fabs(g) * m;
        }
        c1 /= (double)d, c2 /= (double)d, a1 /= (double)d, a2 /= (double)d;
        for (int64_t i = 0; i < d; ++i) {
            const double dyv = value_at(dy_dt, dy, (size_t)(r * d + i));
            const double g = dyv * weight_ref(p, i);
            const double xh = (value_at(p->x_dt, p->x, (size_t)(r * d + i)) - mean) * rstd;
            const double want = rstd * (g - (rms ? 0.0 : c1) - xh * c2);
            const double m = fabs(xh) + 1.0 + fabs(mean) * rstd;
            const double bound = kTolDx * rstd * (fabs(g) + a1 + m * a2) + 1e-30;
            const double got = ((const float *)b->dx)[r * d + i];
            const double e = fabs(got - want) / bound;
            if (!(e <= 1.0) && reported++ < 5)
                print_error("%s: dx[%lld, %lld] = %.9g, float64 %.9g\n", what, (long long)r, (long long)i, got, want);
            if (!(e <= worst)) worst = e;
            dg[i] += dyv * xh, dg_mag[i] += fabs(dyv) * m, db[i] += dyv, db_mag[i] += fabs(dyv);
        }
    }
    for (int64_t i = 0; i < d; ++i) {
        double e = fabs(b->dgamma[i] - dg[i]) / (kTolCol * dg_mag[i] + 1e-30);
        if (!rms) {
            const double eb = fabs(b->dbeta[i] - db[i]) / (kTolCol * db_mag[i] + 1e-30);
            if (!(eb <= e)) e = eb;
        }
        if (!(e <= 1.0) && reported++ < 10)
            print_error("%s: dgamma[%lld] = %.9g (float64 %.9g)\n", what, (long long)i, b->dgamma[i], dg[i]);
        if (!(e <= worst)) worst = e;
    }
    free(dg), free(db), free(dg_mag), free(db_mag);
    return worst;
}

static const shape_t kBwdShapes[] = {{1, 1}, {3, 7}, {17, 1023}, {5, 1024}, {2, 4099}, {1030, 9}, {600, 33}, {1, 8193}};
#define NBWD (sizeof kBwdShapes / sizeof kBwdShapes[0])

static void test_backward_vs_float64(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    double worst = 0.0;
    for (int kind = 0; kind < 2; ++kind)
        for (int zc = 0; zc < 2; ++zc)
            for (size_t s = 0; s < NBWD; ++s) {
                problem_t p;
                problem_make(&p, (fp8amp_norm_kind)kind, zc, kBwdShapes[s].rows, kBwdShapes[s].d, WIDE[(s + kind) % 3],
                             WIDE[(s + zc) % 3], 0);
                const int64_t n = p.rows * p.d;
                const fp8amp_dtype dy_dt = WIDE[(s + (size_t)zc) % 2];
                void *dy = xmalloc((size_t)n * 4);
                gen_rows(dy_dt, dy, p.rows, p.d, 0.5);
                bwd_t b;
                run_backward(device, &p, dy_dt, dy, FP8AMP_DTYPE_F32, &b);
                char what[128];
                snprintf(what, sizeof what, "%s zc=%d [%lld, %lld] dy %s", kind ? "rmsnorm" : "layernorm", zc,
                         (long long)p.rows, (long long)p.d, fp8amp_dtype_name(dy_dt));
                const double e = check_backward_ref(&p, dy_dt, dy, &b, what);
                if (!(e <= 1.0)) print_error("%s: error %.3g of the bound\n", what, e);
                assert_true(e <= 1.0);
                if (e > worst) worst = e;
                /* a 16-bit dx is the F32 dx rounded once */
                bwd_t b16;
                const fp8amp_dtype dx_dt = WIDE[1 + s % 2];
                run_backward(device, &p, dy_dt, dy, dx_dt, &b16);
                void *want = cast_f32(device, b.dx, n, dx_dt);
                assert_memory_equal(b16.dx, want, (size_t)n * 2);
                assert_memory_equal(b16.dgamma, b.dgamma, (size_t)p.d * 4);
                free(want);
                bwd_free(&b16);
                bwd_free(&b);
                free(dy);
                problem_free(&p);
            }
    print_message("backward: worst error %.3g of the documented bound\n", worst);
}

/* ---- CPU and CUDA: the same bytes ----------------------------------------------------------------- */

static void test_cpu_cuda_identical(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    /* Every path of the CUDA kernels (kernels/cuda/norm.cu): 1, 2, 4, 8 warps a row; 1, 2, 4, 8 register
     * pieces a lane and rows read again (d = 20000); the backward's partials in shared memory and, past
     * 24576, in the partial buffer; whole 16-byte pieces, 8-byte halves (d % 8 == 4) and element by element
     * (odd d) with a partial last piece; more rows than chunks (264) and chunks of fewer rows than slots;
     * y_t written by the forward itself (rows % 32 == 0, d % 4 == 0, d <= 2048) or by the byte transpose. */
    const shape_t shapes[] = {{1, 1},     {3, 7},      {17, 1023}, {256, 1024}, {300, 4096}, {7, 8193},
                              {1030, 9},  {2048, 768}, {64, 12288}, {40, 300},  {33, 1536},  {5, 2044},
                              {7, 3001},  {3, 5000},   {3, 20000}, {2, 30001},  {531, 100},  {270, 2052},
                              {32, 2044}, {96, 20}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int k = 0; k < 4; ++k) {
            problem_t p;
            problem_make(&p, (k & 1) ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM, (k >> 1) & 1, shapes[s].rows,
                         shapes[s].d, WIDE[(s + (size_t)k) % 3], WIDE[s % 3], 1);
            const int64_t n = p.rows * p.d;
            const fp8amp_scaling_mode mode = (k & 2) ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
            const fp8amp_dtype ys[4] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2};
            for (int j = 0; j < 4; ++j) {
                fwd_t a, b;
                run_forward(cpu_device(), &p, ys[j], mode, 3.0f, j >= 2, &a);
                run_forward(cuda_device(0), &p, ys[j], mode, 3.0f, j >= 2, &b);
                assert_memory_equal(a.y, b.y, (size_t)n * fp8amp_dtype_size(ys[j]));
                if (j >= 2) {
                    assert_memory_equal(a.y_t, b.y_t, (size_t)n);
                    assert_memory_equal(&a.stats, &b.stats, sizeof a.stats);
                    assert_true(f32_bits(a.amax) == f32_bits(b.amax) && f32_bits(a.scale) == f32_bits(b.scale));
                    assert_true(f32_bits(a.scale_inv) == f32_bits(b.scale_inv));
                }
                if (a.mean) assert_memory_equal(a.mean, b.mean, (size_t)p.rows * 4);
                assert_memory_equal(a.rstd, b.rstd, (size_t)p.rows * 4);
                fwd_free(&a);
                fwd_free(&b);
            }
            const fp8amp_dtype dy_dt = WIDE[(size_t)k % 2];
            void *dy = xmalloc((size_t)n * 4);
            gen_rows(dy_dt, dy, p.rows, p.d, 0.5);
            bwd_t a, b;
            run_backward(cpu_device(), &p, dy_dt, dy, WIDE[s % 3], &a);
            run_backward(cuda_device(0), &p, dy_dt, dy, WIDE[s % 3], &b);
            assert_memory_equal(a.dx, b.dx, (size_t)n * fp8amp_dtype_size(WIDE[s % 3]));
            assert_memory_equal(a.dgamma, b.dgamma, (size_t)p.d * 4);
            if (a.dbeta) assert_memory_equal(a.dbeta, b.dbeta, (size_t)p.d * 4);
            bwd_free(&a);
            bwd_free(&b);
            free(dy);
            problem_free(&p);
        }
}

/* The codes of a NaN / -NaN / inf / -inf in a wide dtype's storage (t = 0..3). */
static uint32_t special_code(fp8amp_dtype dt, int t) {
    static const uint32_t f32[4] = {0x7FC00000u, 0xFFC00000u, 0x7F800000u, 0xFF800000u};
    static const uint32_t bf16[4] = {0x7FC0u, 0xFFC0u, 0x7F80u, 0xFF80u};
    static const uint32_t f16[4] = {0x7E00u, 0xFE00u, 0x7C00u, 0xFC00u};
    return dt == FP8AMP_DTYPE_F32 ? f32[t] : dt == FP8AMP_DTYPE_BF16 ? bf16[t] : f16[t];
}

/* CPU and CUDA: the same bytes where some rows hold a NaN or an infinity (the CUDA forward makes the
 * NaN code only in a piece whose max |y| is NaN or inf, so the specials land in full and partial pieces
 * and with x of every wide dtype); for LayerNorm without beta (the kernels skip the addition); for every
 * output dtype (E4M3, E5M2 with y_t, BF16, F16, F32); and for d on both sides of the shared-memory copy
 * of gamma/beta (forward: d <= 12288 with register pieces; backward: partials + 4 d bytes <= 100 KB;
 * d = 13000 and 9000 read gamma per piece). */
static void test_cpu_cuda_identical_specials(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const shape_t shapes[] = {{67, 1024}, {40, 4096}, {9, 4100}, {5, 13000}, {33, 37}, {12, 12288}, {6, 9000}, {64, 2048}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int k = 0; k < 4; ++k) {
            problem_t p;
            /* k == 0: LayerNorm without beta */
            problem_make(&p, (k & 1) ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM, (k >> 1) & 1, shapes[s].rows,
                         shapes[s].d, WIDE[(s + (size_t)k) % 3], WIDE[(s + 1) % 3], k != 0);
            const int64_t n = p.rows * p.d;
            /* a few specials in random rows (row 0 kept clean), at random columns */
            for (int t = 0; t < 6 && p.rows > 1; ++t) {
                const int64_t r = 1 + (int64_t)(test_rng_u64() % (uint64_t)(p.rows - 1)), i = (int64_t)(test_rng_u64() % (uint64_t)p.d);
                set_code(p.x_dt, p.x, (size_t)(r * p.d + i), special_code(p.x_dt, t % 4));
            }
            const fp8amp_scaling_mode mode = (k & 2) ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
            const fp8amp_dtype ys[5] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_F32};
            for (int j = 0; j < 5; ++j) {
                fwd_t a, b;
                const int fp8 = j < 2;
                run_forward(cpu_device(), &p, ys[j], mode, 5.0f, fp8, &a);
                run_forward(cuda_device(0), &p, ys[j], mode, 5.0f, fp8, &b);
                assert_memory_equal(a.y, b.y, (size_t)n * fp8amp_dtype_size(ys[j]));
                if (fp8) {
                    assert_memory_equal(a.y_t, b.y_t, (size_t)n);
                    assert_memory_equal(&a.stats, &b.stats, sizeof a.stats);
                    assert_true(f32_bits(a.amax) == f32_bits(b.amax) && f32_bits(a.scale) == f32_bits(b.scale));
                    assert_true(f32_bits(a.scale_inv) == f32_bits(b.scale_inv));
                }
                if (a.mean) assert_memory_equal(a.mean, b.mean, (size_t)p.rows * 4);
                assert_memory_equal(a.rstd, b.rstd, (size_t)p.rows * 4);
                fwd_free(&a);
                fwd_free(&b);
            }
            const fp8amp_dtype dy_dt = WIDE[(size_t)(k + 1) % 3];
            void *dy = xmalloc((size_t)n * 4);
            gen_rows(dy_dt, dy, p.rows, p.d, 0.5);
            for (int dxi = 0; dxi < 3; ++dxi) {
                bwd_t a, b;
                run_backward(cpu_device(), &p, dy_dt, dy, WIDE[dxi], &a);
                run_backward(cuda_device(0), &p, dy_dt, dy, WIDE[dxi], &b);
                assert_memory_equal(a.dx, b.dx, (size_t)n * fp8amp_dtype_size(WIDE[dxi]));
                assert_memory_equal(a.dgamma, b.dgamma, (size_t)p.d * 4);
                if (a.dbeta) assert_memory_equal(a.dbeta, b.dbeta, (size_t)p.d * 4);
                bwd_free(&a);
                bwd_free(&b);
            }
            free(dy);
            problem_free(&p);
        }
}

/* CPU and CUDA: the same bytes on both sides of every choice between the CUDA kernels' lean and general
 * forms (kernels/cuda/norm.cu). The lean forward (norm_forward_fast_kernel) takes d % 8 == 0 with x
 * 16-byte aligned, d <= 12288 (gamma/beta in shared memory, at most 6 pieces a lane) and no fused
 * y_t (a current-scaling forward with a fused y_t runs its amax pass lean, its writing pass general);
 * the lean backward (norm_backward_fast_kernel) takes dy, x and dx of one dtype with d % 8 == 0 and up
 * to 6 pieces a lane (d <= 12288; F32: 4, d <= 8192), gamma in shared memory up to 4 pieces and, at
 * 5-6, for RMSNorm only (LayerNorm's two partial arrays leave no room: gamma in registers). So: each
 * dtype; 1, 2, 3 (a lane without its last piece), 4, 5, 6 pieces with 1, 2, 4, 8 warps a row, rows
 * every lane covers with whole pieces (256, 512, 1024, 2048, 4096, 8192, 12288; at 4 and 6 pieces
 * the lean forward's and LayerNorm's lean backward's variants without piece tests) and rows that
 * leave some lane short (64, 392, 520, 2560, 9000, ...); d = 8192
 * (4 pieces) and 8200 (5: F32's backward goes general), 12288 (6) against 12296 (7: both general),
 * d % 8 == 4; dx or dy of another dtype than x; LayerNorm with and without beta/dbeta, RMSNorm;
 * zero-centered gamma; FP8 y delayed and current, with and without y_t, and BF16 y; rows fewer than
 * the chunks, fewer than a chunk's slots, and many; a few NaN / inf in x and dy. y_t past d = 2048 is
 * the byte transpose's (linear_aux.cu): its 16-byte path takes whole 64 x 64 tiles when rows and d
 * are multiples of 16 (96 x 4112: edge tiles on both sides go byte by byte; 128 x 2560: whole tiles),
 * the byte path everything else (700 x 256, 9 x 4096, ...). With rows % 32 == 0 and d <= 2048 the
 * forward writes y_t itself (the general kernel) unless the lean forward runs and rows and d are
 * multiples of 16 (64 x 2048, 96 x 1024, 64 x 768, 32 x 256: lean forward + 16-byte transpose; 64 x 520:
 * d % 16 == 8, fused). y_t is checked for E4M3 under delayed scaling and E5M2 under current. The FP8
 * forwards run with the metas' statistics on for half the cases and off for the others (the lean
 * forward's loop without them is its own kernel). */
/* The backward on the CPU and on CUDA: dx, dgamma and dbeta byte for byte. */
static void assert_backward_cpu_cuda_identical(const problem_t *p, fp8amp_dtype dy_dt, const void *dy, fp8amp_dtype dx_dt,
                                               int with_dbeta) {
    bwd_t a, b;
    run_backward_db(cpu_device(), p, dy_dt, dy, dx_dt, with_dbeta, &a);
    run_backward_db(cuda_device(0), p, dy_dt, dy, dx_dt, with_dbeta, &b);
    assert_memory_equal(a.dx, b.dx, (size_t)(p->rows * p->d) * fp8amp_dtype_size(dx_dt));
    assert_memory_equal(a.dgamma, b.dgamma, (size_t)p->d * 4);
    assert_true((a.dbeta == NULL) == (b.dbeta == NULL));
    if (a.dbeta) assert_memory_equal(a.dbeta, b.dbeta, (size_t)p->d * 4);
    bwd_free(&a);
    bwd_free(&b);
}

static void test_cpu_cuda_identical_lean_paths(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const shape_t shapes[] = {{700, 256}, {3, 512},    {300, 520}, {2100, 1024}, {70, 1040}, {64, 2048},
                              {9, 4096},  {271, 4096}, {5, 8192},  {4, 8200},    {6, 4100},  {1, 64},
                              {6, 9000},  {5, 12288},  {3, 12296}, {96, 4112}, {128, 2560}, {64, 520}, {33, 392},
                              {96, 1024}, {32, 256},   {64, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int k = 0; k < 12; ++k) {
            /* k % 3: the dtype of x (and of dy, dx below); k / 3: LayerNorm with beta / dbeta, without,
             * RMSNorm, and LayerNorm with dy and dx of other dtypes than x */
            const int variant = k / 3;
            const fp8amp_dtype dt = WIDE[k % 3];
            problem_t p;
            problem_make(&p, variant == 2 ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM, (int)((s + (size_t)k) & 1),
                         shapes[s].rows, shapes[s].d, dt, WIDE[(s + 1) % 3], variant != 1);
            const int64_t n = p.rows * p.d;
            const fp8amp_dtype dy_dt = variant == 3 ? WIDE[(k + 1) % 3] : dt, dx_dt = variant == 3 ? WIDE[(k + 2) % 3] : dt;
            void *dy = xmalloc((size_t)n * 4);
            gen_rows(dy_dt, dy, p.rows, p.d, 0.5);
            if (s % 2 == 1 && p.rows > 1)
                for (int t = 0; t < 4; ++t) {
                    const int64_t r = 1 + (int64_t)(test_rng_u64() % (uint64_t)(p.rows - 1)), i = (int64_t)(test_rng_u64() % (uint64_t)p.d);
                    if (t < 2) set_code(p.x_dt, p.x, (size_t)(r * p.d + i), special_code(p.x_dt, (t + k) % 4));
                    else set_code(dy_dt, dy, (size_t)(r * p.d + i), special_code(dy_dt, (t + k) % 4));
                }
            const fp8amp_dtype ys[3] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_BF16};
            for (int j = 0; j < 3; ++j) {
                const int fp8 = j < 2, with_t = (j == 1 && (k & 1)) || (j == 0 && !(k & 1));
                const fp8amp_scaling_mode mode = j == 1 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
                fwd_t fa, fb;
                const int stats_off = (int)((s + (size_t)k + (size_t)j) % 2);
                g_stats_off = stats_off;
                run_forward(cpu_device(), &p, ys[j], mode, 3.0f, with_t, &fa);
                run_forward(cuda_device(0), &p, ys[j], mode, 3.0f, with_t, &fb);
                g_stats_off = 0;
                assert_memory_equal(fa.y, fb.y, (size_t)n * fp8amp_dtype_size(ys[j]));
                if (with_t) assert_memory_equal(fa.y_t, fb.y_t, (size_t)n);
                if (fp8) {
                    assert_memory_equal(&fa.stats, &fb.stats, sizeof fa.stats);
                    if (stats_off) assert_true(fb.stats.quantized == 0 && fb.stats.saturated == 0 && fb.stats.underflowed == 0);
                    else assert_true(fb.stats.quantized > 0);
                    assert_true(f32_bits(fa.amax) == f32_bits(fb.amax) && f32_bits(fa.scale) == f32_bits(fb.scale));
                    assert_true(f32_bits(fa.scale_inv) == f32_bits(fb.scale_inv));
                }
                if (fa.mean) assert_memory_equal(fa.mean, fb.mean, (size_t)p.rows * 4);
                assert_memory_equal(fa.rstd, fb.rstd, (size_t)p.rows * 4);
                fwd_free(&fa);
                fwd_free(&fb);
            }
            assert_backward_cpu_cuda_identical(&p, dy_dt, dy, dx_dt, variant != 1);
            free(dy);
            problem_free(&p);
        }
}

/* ---- descriptors and bad input ------------------------------------------------------------------- */

static void test_desc(void **state) {
    (void)state;
    fp8amp_norm_desc d;
    memset(&d, 0x5A, sizeof d);
    EXPECT_OK(fp8amp_norm_desc_init(&d, sizeof d));
    assert_int_equal(d.struct_size, sizeof d);
    assert_int_equal(d.kind, FP8AMP_NORM_LAYERNORM);
    assert_true(d.eps == 1e-5f);
    assert_int_equal(d.zero_centered_gamma, 0);
    EXPECT_STATUS(fp8amp_norm_desc_init(NULL, sizeof d), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_norm_desc_init(&d, 3), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* a newer header's struct: the tail is zeroed */
    struct {
        fp8amp_norm_desc d;
        uint32_t newer[4];
    } big;
    memset(&big, 0x5A, sizeof big);
    EXPECT_OK(fp8amp_norm_desc_init(&big.d, sizeof big));
    assert_int_equal(big.d.struct_size, sizeof big);
    for (int i = 0; i < 4; ++i) assert_int_equal(big.newer[i], 0);
}

/* Snapshot of every output and the meta, to prove that a failed call wrote nothing. */
typedef struct {
    fp8amp_tensor t[8];
    void *bytes[8];
    int n;
} snap_t;

static void snap_take(snap_t *s, const fp8amp_tensor *t, int n) {
    s->n = n;
    for (int i = 0; i < n; ++i) {
        s->t[i] = t[i];
        s->bytes[i] = tensor_to_host(t[i]);
    }
}

static void snap_check_free(snap_t *s) {
    for (int i = 0; i < s->n; ++i) {
        size_t nbytes;
        EXPECT_OK(fp8amp_tensor_nbytes(s->t[i], &nbytes));
        void *now = tensor_to_host(s->t[i]);
        assert_memory_equal(now, s->bytes[i], nbytes);
        free(now);
        free(s->bytes[i]);
    }
}

static void test_bad_input(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx, other;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int other_cuda = device.type == FP8AMP_DEVICE_CPU && have_cuda();
    const int have_other = device.type == FP8AMP_DEVICE_CUDA || other_cuda;
    if (have_other) EXPECT_OK(fp8amp_context_create(device.type == FP8AMP_DEVICE_CUDA ? cpu_device() : cuda_device(0), &other));
    const int64_t R = 3, D = 5, sh[2] = {3, 5}, sht[2] = {5, 3}, bad_sh[2] = {3, 6};
    float xs[15], gs[5];
    for (int i = 0; i < 15; ++i) xs[i] = (float)test_rng_uniform(-2, 2);
    for (int i = 0; i < 5; ++i) gs[i] = (float)test_rng_uniform(0.5, 2);
    fp8amp_tensor x = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, sh, xs), g = make_vector(ctx, FP8AMP_DTYPE_F32, D, gs);
    fp8amp_tensor b = make_vector(ctx, FP8AMP_DTYPE_F32, D, gs);
    fp8amp_tensor y = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sh, NULL), yt = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sht, NULL);
    fp8amp_tensor y_unbound = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sh, NULL);
    fp8amp_tensor yt_e5 = tensor_from_host(ctx, FP8AMP_DTYPE_E5M2, 2, sht, NULL), yt_other = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sht, NULL);
    fp8amp_tensor yt_bad = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sh, NULL), y32 = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, sh, NULL);
    fp8amp_tensor y_badshape = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, bad_sh, NULL);
    fp8amp_tensor mean = make_vector(ctx, FP8AMP_DTYPE_F32, R, NULL), rstd = make_vector(ctx, FP8AMP_DTYPE_F32, R, NULL);
    fp8amp_tensor mean16 = make_vector(ctx, FP8AMP_DTYPE_BF16, R, NULL), rstd_long = make_vector(ctx, FP8AMP_DTYPE_F32, R + 1, NULL);
    fp8amp_tensor g_long = make_vector(ctx, FP8AMP_DTYPE_F32, D + 1, NULL), x_e4 = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, sh, NULL);
    fp8amp_tensor scalar;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 0, NULL, &scalar));
    fp8amp_tensor dx = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, sh, NULL), dy = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, sh, xs);
    fp8amp_tensor dg = make_vector(ctx, FP8AMP_DTYPE_F32, D, NULL), dbt = make_vector(ctx, FP8AMP_DTYPE_F32, D, NULL);
    fp8amp_tensor dg16 = make_vector(ctx, FP8AMP_DTYPE_BF16, D, NULL);
    fp8amp_scaling m = counting_meta(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 2.0f);
    fp8amp_scaling m2 = counting_meta(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 2.0f);
    fp8amp_scaling m5 = counting_meta(ctx, FP8AMP_DTYPE_E5M2, FP8AMP_SCALING_DELAYED, 2.0f);
    EXPECT_OK(fp8amp_tensor_set_scaling(y, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt_bad, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt_other, m2));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt_e5, m5));
    fp8amp_tensor x_other = NULL;
    if (have_other) x_other = tensor_from_host(other, FP8AMP_DTYPE_F32, 2, sh, xs);
    /* outputs poisoned, then snapshotted */
    const fp8amp_tensor outs[8] = {y, yt, y32, mean, rstd, dx, dg, dbt};
    uint8_t poison[64];
    memset(poison, 0x3C, sizeof poison);
    for (int i = 0; i < 8; ++i) {
        size_t nb;
        EXPECT_OK(fp8amp_tensor_nbytes(outs[i], &nb));
        EXPECT_OK(fp8amp_tensor_copy_from_host(outs[i], poison, nb));
    }
    snap_t snap;
    snap_take(&snap, outs, 8);
    float scale0, amax0;
    fp8amp_scaling_stats stats0, stats1;
    EXPECT_OK(fp8amp_scaling_get(m, &scale0, NULL, &amax0));
    EXPECT_OK(fp8amp_scaling_get_stats(m, &stats0));

    fp8amp_norm_desc ln = make_desc(FP8AMP_NORM_LAYERNORM, 0, 1e-5f), rms = make_desc(FP8AMP_NORM_RMSNORM, 0, 1e-5f);
    fp8amp_norm_desc bad = ln;
    const fp8amp_status IH = FP8AMP_ERROR_INVALID_HANDLE, IA = FP8AMP_ERROR_INVALID_ARGUMENT,
                        SM = FP8AMP_ERROR_SHAPE_MISMATCH, DT = FP8AMP_ERROR_DTYPE_MISMATCH,
                        DM = FP8AMP_ERROR_DEVICE_MISMATCH;
    /* handles */
    EXPECT_STATUS(fp8amp_norm_forward(NULL, &ln, x, g, b, y, yt, mean, rstd), IH);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, NULL, g, b, y, yt, mean, rstd), IH);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, NULL, b, y, yt, mean, rstd), IH);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, NULL, yt, mean, rstd), IH);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, (fp8amp_tensor)m, y, yt, mean, rstd), IH);
    /* desc */
    bad.kind = (fp8amp_norm_kind)7;
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &bad, x, g, b, y, yt, mean, rstd), IA);
    bad = ln;
    bad.eps = -1.0f;
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &bad, x, g, b, y, yt, mean, rstd), IA);
    bad.eps = NAN;
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &bad, x, g, b, y, yt, mean, rstd), IA);
    bad = ln;
    bad.zero_centered_gamma = 2;
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &bad, x, g, b, y, yt, mean, rstd), IA);
    bad = ln;
    bad.struct_size = 3;
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &bad, x, g, b, y, yt, mean, rstd), IA);
    /* dtypes */
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x_e4, g, b, y, yt, mean, rstd), DT);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt_e5, mean, rstd), DT);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, y32, mean, rstd), DT);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt, mean16, rstd), DT);
    /* kind's optional tensors, metas */
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &rms, x, g, b, y, yt, NULL, rstd), IA);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &rms, x, g, NULL, y, yt, mean, rstd), IA);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y_unbound, NULL, mean, rstd), IA);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt_other, mean, rstd), IA);
    /* shapes */
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, scalar, g, b, y32, NULL, mean, rstd), SM);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g_long, b, y, yt, mean, rstd), SM);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, g_long, y, yt, mean, rstd), SM);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y_badshape, NULL, mean, rstd), SM);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt_bad, mean, rstd), SM);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt, mean, rstd_long), SM);
    /* overlaps: an output that is an input or another output */
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x, g, b, y32, NULL, mean, mean), IA);
    EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, dx, g, b, dx, NULL, mean, rstd), IA);
    /* devices */
    if (have_other) EXPECT_STATUS(fp8amp_norm_forward(ctx, &ln, x_other, g, b, y, yt, mean, rstd), DM);
    /* backward */
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, NULL, rstd, dx, dg, dbt), IA);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &rms, dy, x, g, mean, rstd, dx, dg, NULL), IA);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &rms, dy, x, g, NULL, rstd, dx, dg, dbt), IA);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, x_e4, x, g, mean, rstd, dx, dg, dbt), DT);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, y, dg, dbt), DT);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dx, dg16, dbt), DT);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd_long, dx, dg, dbt), SM);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, y_badshape, dg, dbt), SM);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dx, g_long, dbt), SM);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dy, dg, dbt), IA);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dx, dg, dg), IA);
    EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dx, NULL, dbt), IH);
    if (have_other) EXPECT_STATUS(fp8amp_norm_backward(ctx, &ln, x_other, x, g, mean, rstd, dx, dg, dbt), DM);
    /* nothing changed */
    snap_check_free(&snap);
    float scale1, amax1;
    EXPECT_OK(fp8amp_scaling_get(m, &scale1, NULL, &amax1));
    EXPECT_OK(fp8amp_scaling_get_stats(m, &stats1));
    assert_true(f32_bits(scale0) == f32_bits(scale1) && f32_bits(amax0) == f32_bits(amax1));
    assert_memory_equal(&stats0, &stats1, sizeof stats0);
    /* and the good calls work */
    EXPECT_OK(fp8amp_norm_forward(ctx, &ln, x, g, b, y, yt, mean, rstd));
    EXPECT_OK(fp8amp_norm_backward(ctx, &ln, dy, x, g, mean, rstd, dx, dg, dbt));

    fp8amp_tensor all[] = {x, g, b, y, yt, y_unbound, yt_e5, yt_other, yt_bad, y32, y_badshape, mean, rstd, mean16,
                           rstd_long, g_long, x_e4, scalar, dx, dy, dg, dbt, dg16, x_other};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(m));
    EXPECT_OK(fp8amp_scaling_destroy(m2));
    EXPECT_OK(fp8amp_scaling_destroy(m5));
    if (have_other) EXPECT_OK(fp8amp_context_destroy(other));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The lean backward without thread block clusters (FP8AMP_NORM_CLUSTERS=0: the path of GPUs before
 * sm_90, where each block writes its chunk's partial row and the finishing kernel pairs the rows):
 * the same bytes as the CPU, odd chunk counts (rows < 264) included. */
static void test_cpu_cuda_identical_backward_without_clusters(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const shape_t shapes[] = {{1, 64}, {3, 512}, {37, 1024}, {263, 256}, {265, 520}, {700, 2048}, {5, 12288}, {129, 4096}};
    for (int off = 1; off >= 0; --off) {
        assert_int_equal(setenv("FP8AMP_NORM_CLUSTERS", off ? "0" : "1", 1), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
            for (int k = 0; k < 6; ++k) {
                const int rms = k / 3 == 1;
                const fp8amp_dtype dt = WIDE[k % 3];
                problem_t p;
                problem_make(&p, rms ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM, (int)((s + (size_t)k) & 1),
                             shapes[s].rows, shapes[s].d, dt, WIDE[(s + 1) % 3], !rms);
                const int64_t n = p.rows * p.d;
                void *dy = xmalloc((size_t)n * 4);
                gen_rows(dt, dy, p.rows, p.d, 0.5);
                assert_backward_cpu_cuda_identical(&p, dt, dy, dt, !rms);
                free(dy);
                problem_free(&p);
            }
    }
    assert_int_equal(unsetenv("FP8AMP_NORM_CLUSTERS"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_desc),
        DEVICE_TESTS(test_forward_vs_float64),
        DEVICE_TESTS(test_fp8_output_is_quantized_f32),
        DEVICE_TESTS(test_defaults_and_options),
        DEVICE_TESTS(test_nan_and_inf),
        DEVICE_TESTS(test_backward_vs_float64),
        DEVICE_TESTS(test_bad_input),
        cmocka_unit_test(test_cpu_cuda_identical),
        cmocka_unit_test(test_cpu_cuda_identical_specials),
        cmocka_unit_test(test_cpu_cuda_identical_lean_paths),
        cmocka_unit_test(test_cpu_cuda_identical_backward_without_clusters),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
