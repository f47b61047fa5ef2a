/* Adam/AdamW with low-precision state (fp8amp_optimizer_*, fp8amp_grad_scaler_*), through the public
 * API only, against an independent float64 Adam/AdamW written here from torch.optim's documented
 * algorithm (never from the library's code):
 *   - O1 (F32 state) trajectories over hundreds of steps, Adam and AdamW, maximize, weight decay,
 *     gradient clipping: within float32 rounding of the float64 reference;
 *   - O2 (E4M3 m + F16 v) and O3 (+ F16 master of E4M3 weights) training a random quadratic problem:
 *     within the bounds documented in docs/numerics.md;
 *   - low-precision parameters and gradients (BF16, F16, E4M3/E5M2 gradients with their metas);
 *   - skip on overflow (inf, NaN, FP8 NaN codes, an inf amax in a gradient's meta, unscaling
 *     overflow): every byte of the optimizer's checkpoint but the step status stays identical;
 *   - the loss scaler against a host model of torch's GradScaler with hysteresis;
 *   - checkpoints: round trip, cross-device, truncation, flipped bits, version, parameter count;
 *   - CPU and CUDA bit-identical; bad inputs with their specific statuses; memory per parameter.
 * Every test runs on the CPU and on CUDA (skipped without a GPU) on fresh random data. */
#include "fp8_reference.h"
#include "test_util.h"

#define MAXP 4
/* Test-only pseudo dtype: an F16 tensor bound to an F16 meta (scaled F16, MS-AMP's O1/O2 weights). */
#define F16S ((fp8amp_dtype)100)
static fp8amp_dtype real_dtype(fp8amp_dtype d) { return d == F16S ? FP8AMP_DTYPE_F16 : d; }
static int is_scaled(fp8amp_dtype d) { return d == F16S || d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2; }

/* ---- a float64 Adam/AdamW (torch.optim semantics, amsgrad=False) ------------------------------ */

typedef struct {
    double lr, beta1, beta2, eps, wd, max_norm;
    int adamw, maximize;
} ref_cfg;

typedef struct {
    int n;
    int64_t numel[MAXP];
    double *p[MAXP], *m[MAXP], *v[MAXP];
    long step;
} ref_adam;

static void ref_init(ref_adam *r, int n, const int64_t *numel, double *const *p0) {
    r->n = n;
    r->step = 0;
    for (int k = 0; k < n; ++k) {
        r->numel[k] = numel[k];
        r->p[k] = xmemdup(p0[k], sizeof(double) * (size_t)numel[k]);
        r->m[k] = calloc((size_t)numel[k], sizeof(double));
        r->v[k] = calloc((size_t)numel[k], sizeof(double));
    }
}

static void ref_free(ref_adam *r) {
    for (int k = 0; k < r->n; ++k) free(r->p[k]), free(r->m[k]), free(r->v[k]);
}

/* One step with gradients g (already unscaled). Returns the global norm before clipping. */
static double ref_step(ref_adam *r, const ref_cfg *c, double *const *g) {
    double sumsq = 0.0;
    for (int k = 0; k < r->n; ++k)
        for (int64_t i = 0; i < r->numel[k]; ++i) sumsq += g[k][i] * g[k][i];
    const double norm = sqrt(sumsq);
    double coef = 1.0;
    if (c->max_norm > 0) {
        coef = c->max_norm / (norm + 1e-6);
        if (coef > 1.0) coef = 1.0;
    }
    r->step += 1;
    const double bc1 = 1.0 - pow(c->beta1, (double)r->step);
    const double bc2 = 1.0 - pow(c->beta2, (double)r->step);
    for (int k = 0; k < r->n; ++k) {
        for (int64_t i = 0; i < r->numel[k]; ++i) {
            double gi = g[k][i] * coef;
            double *p = &r->p[k][i];
            if (c->maximize) gi = -gi;
            if (c->adamw)
                *p *= 1.0 - c->lr * c->wd;
            else
                gi += c->wd * *p;
            r->m[k][i] = c->beta1 * r->m[k][i] + (1.0 - c->beta1) * gi;
            r->v[k][i] = c->beta2 * r->v[k][i] + (1.0 - c->beta2) * gi * gi;
            const double denom = sqrt(r->v[k][i]) / sqrt(bc2) + c->eps;
            *p -= c->lr / bc1 * r->m[k][i] / denom;
        }
    }
    return norm;
}

static ref_cfg ref_cfg_of(const fp8amp_adam_desc *d) {
    ref_cfg c;
    c.lr = d->lr;
    c.beta1 = d->beta1;
    c.beta2 = d->beta2;
    c.eps = d->eps;
    c.wd = d->weight_decay;
    c.max_norm = d->max_grad_norm;
    c.adamw = d->adamw;
    c.maximize = d->maximize;
    return c;
}

/* ---- a problem: parameters and gradients of chosen dtypes, registered with an optimizer -------- */

typedef struct {
    fp8amp_context ctx;
    fp8amp_optimizer opt;
    int n;
    int64_t numel[MAXP];
    fp8amp_dtype pdt[MAXP], gdt[MAXP];
    fp8amp_tensor p[MAXP], g[MAXP], stage[MAXP]; /* stage: F32 staging for writes and reads */
    fp8amp_scaling pm[MAXP], gm[MAXP];
} problem;

static fp8amp_recipe recipe_of(fp8amp_scaling_mode mode) {
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = mode;
    r.amax_history_len = 16;
    return r;
}

static void upload_f64(fp8amp_tensor t, const double *x, int64_t n) {
    float *f = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) f[i] = (float)x[i];
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, f, sizeof(float) * (size_t)n));
    free(f);
}

static void download_f64(fp8amp_tensor t, double *x, int64_t n) {
    float *f = xmalloc(sizeof(float) * (size_t)n);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, f, sizeof(float) * (size_t)n));
    for (int64_t i = 0; i < n; ++i) x[i] = f[i];
    free(f);
}

/* Writes values x (rounded to float32) into tensor t of any dtype: F32 directly, F16/BF16 by the
 * codec (fp8amp_cast), FP8 by a quantize with t's meta. Then x receives what t now holds. */
static void write_values(problem *pb, int k, fp8amp_tensor t, fp8amp_dtype dt, double *x) {
    const int64_t n = pb->numel[k];
    if (dt == FP8AMP_DTYPE_F32) {
        upload_f64(t, x, n);
        download_f64(t, x, n);
        return;
    }
    upload_f64(pb->stage[k], x, n);
    if (is_scaled(dt)) {
        EXPECT_OK(fp8amp_quantize(pb->ctx, pb->stage[k], t));
        EXPECT_OK(fp8amp_dequantize(pb->ctx, t, pb->stage[k]));
    } else {
        EXPECT_OK(fp8amp_cast(pb->ctx, pb->stage[k], t));
        EXPECT_OK(fp8amp_cast(pb->ctx, t, pb->stage[k]));
    }
    download_f64(pb->stage[k], x, n);
}

/* The values of parameter k as a model sees them (FP8: dequantized with its scale_inv). */
static void read_param(problem *pb, int k, double *x) {
    if (pb->pdt[k] == FP8AMP_DTYPE_F32) {
        download_f64(pb->p[k], x, pb->numel[k]);
    } else {
        if (is_scaled(pb->pdt[k]))
            EXPECT_OK(fp8amp_dequantize(pb->ctx, pb->p[k], pb->stage[k]));
        else
            EXPECT_OK(fp8amp_cast(pb->ctx, pb->p[k], pb->stage[k]));
        download_f64(pb->stage[k], x, pb->numel[k]);
    }
}

/* Creates the tensors (initial values p0, which receive the stored values) and the optimizer. */
static void problem_init(problem *pb, fp8amp_device dev, const fp8amp_adam_desc *desc, int n, const int64_t *numel,
                         const fp8amp_dtype *pdt, const fp8amp_dtype *gdt, double *const *p0) {
    memset(pb, 0, sizeof *pb);
    pb->ctx = make_context(dev);
    pb->n = n;
    for (int k = 0; k < n; ++k) {
        pb->numel[k] = numel[k];
        pb->pdt[k] = pdt[k];
        pb->gdt[k] = gdt[k];
        pb->p[k] = make_tensor(pb->ctx, real_dtype(pdt[k]), 1, &numel[k]);
        pb->g[k] = make_tensor(pb->ctx, real_dtype(gdt[k]), 1, &numel[k]);
        pb->stage[k] = make_tensor(pb->ctx, FP8AMP_DTYPE_F32, 1, &numel[k]);
        if (is_scaled(pdt[k])) {
            fp8amp_recipe r = recipe_of(FP8AMP_SCALING_DELAYED);
            r.margin = 1;
            EXPECT_OK(fp8amp_scaling_create(pb->ctx, &r, real_dtype(pdt[k]), &pb->pm[k]));
            double amax = 0;
            for (int64_t i = 0; i < numel[k]; ++i) amax = fmax(amax, fabs(p0[k][i]));
            const double fmax_ = real_dtype(pdt[k]) == FP8AMP_DTYPE_F16 ? 65504.0 : 448.0;
            EXPECT_OK(fp8amp_scaling_set_scale(pb->pm[k], (float)(fmax_ / 2 / amax)));
            EXPECT_OK(fp8amp_tensor_set_scaling(pb->p[k], pb->pm[k]));
        }
        if (is_scaled(gdt[k])) {
            fp8amp_recipe r = recipe_of(FP8AMP_SCALING_CURRENT);
            EXPECT_OK(fp8amp_scaling_create(pb->ctx, &r, real_dtype(gdt[k]), &pb->gm[k]));
            EXPECT_OK(fp8amp_tensor_set_scaling(pb->g[k], pb->gm[k]));
        }
        write_values(pb, k, pb->p[k], pdt[k], p0[k]);
    }
    EXPECT_OK(fp8amp_optimizer_create(pb->ctx, desc, &pb->opt));
    for (int k = 0; k < n; ++k) EXPECT_OK(fp8amp_optimizer_add_param(pb->opt, pb->p[k], pb->g[k]));
}

static void problem_free(problem *pb) {
    EXPECT_OK(fp8amp_optimizer_destroy(pb->opt));
    for (int k = 0; k < pb->n; ++k) {
        EXPECT_OK(fp8amp_tensor_destroy(pb->p[k]));
        EXPECT_OK(fp8amp_tensor_destroy(pb->g[k]));
        EXPECT_OK(fp8amp_tensor_destroy(pb->stage[k]));
        EXPECT_OK(fp8amp_scaling_destroy(pb->pm[k]));
        EXPECT_OK(fp8amp_scaling_destroy(pb->gm[k]));
    }
    EXPECT_OK(fp8amp_context_destroy(pb->ctx));
}

static double **alloc_arrays(int n, const int64_t *numel) {
    double **a = xmalloc(sizeof(double *) * MAXP);
    for (int k = 0; k < MAXP; ++k) a[k] = k < n ? xmalloc(sizeof(double) * (size_t)numel[k]) : NULL;
    return a;
}

static void free_arrays(double **a) {
    for (int k = 0; k < MAXP; ++k) free(a[k]);
    free(a);
}

static void fill_uniform(double **a, int n, const int64_t *numel, double lo, double hi) {
    for (int k = 0; k < n; ++k)
        for (int64_t i = 0; i < numel[k]; ++i) a[k][i] = test_rng_uniform(lo, hi);
}

static const int64_t kShapes[3] = {1000, 481, 300}; /* tails that are not multiples of 128 */

/* ---- O1 trajectories: float32 within rounding of float64 -------------------------------------- */

static void o1_run(void **state, int adamw, int maximize, float wd, float max_norm) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O1, &d));
    d.adamw = adamw;
    d.maximize = maximize;
    d.weight_decay = wd;
    d.lr = 3e-3f;
    d.max_grad_norm = max_norm;
    const fp8amp_dtype f32[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32};
    double **p0 = alloc_arrays(3, kShapes), **g = alloc_arrays(3, kShapes), **cur = alloc_arrays(3, kShapes);
    fill_uniform(p0, 3, kShapes, -1, 1);
    problem pb;
    problem_init(&pb, variant_device(state), &d, 3, kShapes, f32, f32, p0);
    ref_adam ref;
    ref_init(&ref, 3, kShapes, p0);
    const ref_cfg rc = ref_cfg_of(&d);
    const int steps = 300;
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
        /* Random gradients of varied magnitudes (some tiny: v near 0 exercises eps). */
        for (int k = 0; k < 3; ++k)
            for (int64_t i = 0; i < kShapes[k]; ++i)
                g[k][i] = test_rng_uniform(-1, 1) * (i % 7 == 0 ? 1e-4 : 1.0) * (max_norm > 0 ? 3.0 : 1.0);
        for (int k = 0; k < 3; ++k) write_values(&pb, k, pb.g[k], FP8AMP_DTYPE_F32, g[k]);
        /* an lr schedule: every step its own lr, nothing re-created */
        fp8amp_adam_step_args args;
        EXPECT_OK(fp8amp_adam_step_args_init_default(&args));
        args.lr = d.lr * (float)(0.5 + (s % 10) / 10.0);
        ref_cfg rs = rc;
        rs.lr = args.lr;
        EXPECT_OK(fp8amp_optimizer_step(pb.opt, &args));
        const double norm = ref_step(&ref, &rs, g);
        float lib_norm = 0;
        EXPECT_OK(fp8amp_optimizer_get_grad_norm(pb.opt, &lib_norm));
        assert_true(fabs(lib_norm - norm) <= 1e-6 * norm);
    }
    for (int k = 0; k < 3; ++k) {
        read_param(&pb, k, cur[k]);
        for (int64_t i = 0; i < kShapes[k]; ++i) {
            const double err = fabs(cur[k][i] - ref.p[k][i]) / (1.0 + fabs(ref.p[k][i]));
            if (err > worst) worst = err;
        }
    }
    int64_t step = 0;
    int32_t found = 1;
    EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
    EXPECT_OK(fp8amp_optimizer_get_found_inf(pb.opt, &found));
    assert_int_equal(step, steps);
    assert_int_equal(found, 0);
    print_message("O1 adamw=%d maximize=%d wd=%g clip=%g: max relative deviation from float64 after %d steps %.3g\n",
                  adamw, maximize, wd, max_norm, steps, worst);
    /* documented bound (docs/numerics.md): 2e-5, i.e. a few hundred float32 ulps after 300 steps */
    assert_true(worst <= 2e-5);
    /* and the parameters did move: the check is not vacuous */
    double moved = 0;
    for (int64_t i = 0; i < kShapes[0]; ++i) moved = fmax(moved, fabs(ref.p[0][i] - p0[0][i]));
    assert_true(moved > 0.1);
    ref_free(&ref);
    problem_free(&pb);
    free_arrays(p0), free_arrays(g), free_arrays(cur);
}

static void test_o1_adamw_matches_float64(void **state) {
    require_variant(state);
    o1_run(state, 1, 0, 0.01f, 0.0f);
}
static void test_o1_adam_l2_matches_float64(void **state) {
    require_variant(state);
    o1_run(state, 0, 0, 0.05f, 0.0f);
}
static void test_o1_maximize_matches_float64(void **state) {
    require_variant(state);
    o1_run(state, 1, 1, 0.0f, 0.0f);
}
static void test_o1_clipping_matches_float64(void **state) {
    require_variant(state);
    o1_run(state, 1, 0, 0.01f, 1.0f);
}

/* ---- O2/O3: training a random quadratic, against the float64 optimizer on the same problem ----- */

/* loss = 1/2 sum a (p - t)^2, gradient a (p - t) + noise; each optimizer follows its own params. */
static void quadratic_run(void **state, fp8amp_opt_level level, int32_t block, fp8amp_dtype pdt, fp8amp_dtype gdt,
                          double bound) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(level, &d));
    d.lr = 1e-2f;
    d.state_block_size = block;
    const fp8amp_dtype pd[3] = {pdt, pdt, pdt}, gd[3] = {gdt, gdt, gdt};
    double **p0 = alloc_arrays(3, kShapes), **t = alloc_arrays(3, kShapes), **a = alloc_arrays(3, kShapes);
    double **g = alloc_arrays(3, kShapes), **gr = alloc_arrays(3, kShapes), **cur = alloc_arrays(3, kShapes);
    fill_uniform(p0, 3, kShapes, -1, 1);
    fill_uniform(t, 3, kShapes, -1, 1);
    fill_uniform(a, 3, kShapes, 0.05, 2);
    problem pb;
    problem_init(&pb, variant_device(state), &d, 3, kShapes, pd, gd, p0); /* p0 now holds the stored values */
    ref_adam ref;
    ref_init(&ref, 3, kShapes, p0);
    const ref_cfg rc = ref_cfg_of(&d);
    const int steps = 400;
    for (int s = 0; s < steps; ++s) {
        for (int k = 0; k < 3; ++k) {
            read_param(&pb, k, cur[k]);
            for (int64_t i = 0; i < kShapes[k]; ++i) {
                const double noise = test_rng_uniform(-0.05, 0.05);
                g[k][i] = a[k][i] * (cur[k][i] - t[k][i]) + noise;
                gr[k][i] = a[k][i] * (ref.p[k][i] - t[k][i]) + noise;
            }
            write_values(&pb, k, pb.g[k], gdt, g[k]);
        }
        EXPECT_OK(fp8amp_optimizer_step(pb.opt, NULL));
        int32_t found = 1;
        EXPECT_OK(fp8amp_optimizer_get_found_inf(pb.opt, &found));
        assert_int_equal(found, 0);
        ref_step(&ref, &rc, gr);
    }
    /* deviation relative to the distance the float64 optimizer travelled */
    double dev = 0, travel = 0, loss = 0, ref_loss = 0, loss0 = 0;
    for (int k = 0; k < 3; ++k) {
        read_param(&pb, k, cur[k]);
        for (int64_t i = 0; i < kShapes[k]; ++i) {
            dev += (cur[k][i] - ref.p[k][i]) * (cur[k][i] - ref.p[k][i]);
            travel += (ref.p[k][i] - p0[k][i]) * (ref.p[k][i] - p0[k][i]);
            loss += 0.5 * a[k][i] * (cur[k][i] - t[k][i]) * (cur[k][i] - t[k][i]);
            ref_loss += 0.5 * a[k][i] * (ref.p[k][i] - t[k][i]) * (ref.p[k][i] - t[k][i]);
            loss0 += 0.5 * a[k][i] * (p0[k][i] - t[k][i]) * (p0[k][i] - t[k][i]);
        }
    }
    const double rel = sqrt(dev / travel);
    print_message("O%d block %d param %s%s grad %s%s: deviation/travel %.4f, loss %.5f (float64 %.5f, start %.3f)\n",
                  (int)level, block, fp8amp_dtype_name(real_dtype(pdt)), pdt == F16S ? " (scaled)" : "",
                  fp8amp_dtype_name(real_dtype(gdt)), gdt == F16S ? " (scaled)" : "", rel, loss, ref_loss, loss0);
    assert_true(rel <= bound);
    assert_true(loss <= ref_loss * 1.5 + 0.02 * loss0); /* it trains about as well */
    assert_true(loss < 0.1 * loss0);
    ref_free(&ref);
    problem_free(&pb);
    free_arrays(p0), free_arrays(t), free_arrays(a), free_arrays(g), free_arrays(gr), free_arrays(cur);
}

/* The quadratic runs are split into tests of a few runs each (one pass of 400 steps per run) so that
 * tests/run_gpu_sanitizers.sh can spread them over processes (SHARDS): under racecheck one run takes
 * minutes on an H100, more with an FP8 gradient. */
static void test_o1_quadratic_wide_io(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 1e-4);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, 0.05);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_F16, 0.02);
}

static void test_o1_quadratic_e4m3_grads(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E4M3, 0.05);
}

static void test_o1_quadratic_e5m2_grads(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E5M2, 0.1);
}

static void test_o1_quadratic_scaled_f16(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, F16S, FP8AMP_DTYPE_E4M3, 0.02); /* MS-AMP O1 */
    quadratic_run(state, FP8AMP_OPT_LEVEL_O1, 128, F16S, F16S, 0.02);
}

static void test_o2_quadratic_block_sizes(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O2, 128, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 0.05);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O2, 1024, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 0.05);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O2, 0, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 0.08);
}

static void test_o2_quadratic_low_precision_io(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O2, 128, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, 0.08);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O2, 128, F16S, FP8AMP_DTYPE_E4M3, 0.05); /* MS-AMP O2 */
}

static void test_o3_quadratic_fp8_params(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O3, 128, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E4M3, 0.1);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O3, 0, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F32, 0.1);
}

static void test_o3_quadratic_other_params(void **state) {
    require_variant(state);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O3, 256, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, 0.08);
    quadratic_run(state, FP8AMP_OPT_LEVEL_O3, 128, F16S, FP8AMP_DTYPE_E4M3, 0.08);
}

/* ---- skip on overflow ------------------------------------------------------------------------ */

/* Status bytes of the checkpoint (docs/api.md 12.6): found_inf at 80..84, grad_norm at 84..88. */
#define CKPT_STATUS_BEGIN 80
#define CKPT_STATUS_END 88

static void expect_same_except_status(const unsigned char *a, size_t na, const unsigned char *b, size_t nb) {
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, CKPT_STATUS_BEGIN);
    assert_memory_equal(a + CKPT_STATUS_END, b + CKPT_STATUS_END, na - 4 - CKPT_STATUS_END);
}

typedef enum { BAD_INF, BAD_NAN, BAD_FP8_NAN_CODE, BAD_FP8_INF_SOURCE, BAD_UNSCALE_OVERFLOW } bad_kind;

static void overflow_run(void **state, fp8amp_opt_level level, bad_kind kind) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(level, &d));
    const int64_t shapes[2] = {700, 333};
    const fp8amp_dtype p_low = level == FP8AMP_OPT_LEVEL_O3 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F32;
    const fp8amp_dtype pd[2] = {p_low, level == FP8AMP_OPT_LEVEL_O3 ? FP8AMP_DTYPE_BF16 : F16S};
    const fp8amp_dtype gd[2] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F32};
    double **p0 = alloc_arrays(2, shapes), **g = alloc_arrays(2, shapes);
    fill_uniform(p0, 2, shapes, -1, 1);
    problem pb;
    problem_init(&pb, variant_device(state), &d, 2, shapes, pd, gd, p0);
    fp8amp_grad_scaler_desc sd;
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    fp8amp_grad_scaler scaler;
    EXPECT_OK(fp8amp_grad_scaler_create(pb.ctx, &sd, &scaler));
    fp8amp_adam_step_args args;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&args));
    args.scaler = scaler;
    for (int s = 0; s < 3; ++s) {
        fill_uniform(g, 2, shapes, -65536, 65536); /* scaled by the loss scale 65536 */
        for (int k = 0; k < 2; ++k) write_values(&pb, k, pb.g[k], gd[k], g[k]);
        EXPECT_OK(fp8amp_optimizer_step(pb.opt, &args));
    }
    size_t na = 0, nb = 0;
    unsigned char *before = save_all(pb.opt, &na);
    unsigned char *param_before[2];
    for (int k = 0; k < 2; ++k) {
        const size_t n = tensor_bytes(pb.p[k]);
        param_before[k] = xmalloc(n);
        EXPECT_OK(fp8amp_tensor_copy_to_host(pb.p[k], param_before[k], n));
    }
    /* the bad gradients */
    fill_uniform(g, 2, shapes, -1000, 1000);
    const int64_t where = (int64_t)(test_rng_u64() % 333);
    switch (kind) {
    case BAD_INF: g[1][where] = (where & 1) ? INFINITY : -INFINITY; break;
    case BAD_NAN: g[1][where] = NAN; break;
    case BAD_FP8_INF_SOURCE: g[0][where] = INFINITY; break; /* quantize saturates it, records amax inf */
    case BAD_UNSCALE_OVERFLOW: g[1][where] = 3e38; break;   /* finite, but the step multiplies it */
    case BAD_FP8_NAN_CODE: break;
    }
    upload_f64(pb.stage[0], g[0], shapes[0]);
    EXPECT_OK(fp8amp_quantize(pb.ctx, pb.stage[0], pb.g[0]));
    upload_f64(pb.g[1], g[1], shapes[1]);
    if (kind == BAD_FP8_NAN_CODE) {
        uint8_t *codes = xmalloc((size_t)shapes[0]);
        EXPECT_OK(fp8amp_tensor_copy_to_host(pb.g[0], codes, (size_t)shapes[0]));
        codes[where] = (where & 1) ? 0x7F : 0xFF;
        EXPECT_OK(fp8amp_tensor_copy_from_host(pb.g[0], codes, (size_t)shapes[0]));
        free(codes);
    }
    float scale_before = 0, scale_after = 0;
    EXPECT_OK(fp8amp_grad_scaler_get_scale(scaler, &scale_before));
    fp8amp_adam_step_args bad_args = args;
    if (kind == BAD_UNSCALE_OVERFLOW) bad_args.grad_scale_inv = 1e30f * 65536.0f;
    EXPECT_OK(fp8amp_optimizer_step(pb.opt, &bad_args));
    int32_t found = 0;
    int64_t step = 0;
    EXPECT_OK(fp8amp_optimizer_get_found_inf(pb.opt, &found));
    EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
    assert_int_equal(found, 1);
    assert_int_equal(step, 3);
    float norm = 0;
    EXPECT_OK(fp8amp_optimizer_get_grad_norm(pb.opt, &norm));
    assert_true(isnan(norm));
    EXPECT_OK(fp8amp_grad_scaler_get_scale(scaler, &scale_after));
    assert_true(scale_after == scale_before * 0.5f);
    unsigned char *after = save_all(pb.opt, &nb);
    expect_same_except_status(before, na, after, nb);
    for (int k = 0; k < 2; ++k) {
        const size_t n = tensor_bytes(pb.p[k]);
        unsigned char *now = xmalloc(n);
        EXPECT_OK(fp8amp_tensor_copy_to_host(pb.p[k], now, n));
        assert_memory_equal(now, param_before[k], n);
        free(now);
        free(param_before[k]);
    }
    /* a good step afterwards goes on */
    fill_uniform(g, 2, shapes, -1, 1);
    for (int k = 0; k < 2; ++k) write_values(&pb, k, pb.g[k], gd[k], g[k]);
    EXPECT_OK(fp8amp_optimizer_step(pb.opt, &args));
    EXPECT_OK(fp8amp_optimizer_get_found_inf(pb.opt, &found));
    EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
    assert_int_equal(found, 0);
    assert_int_equal(step, 4);
    free(before), free(after);
    EXPECT_OK(fp8amp_grad_scaler_destroy(scaler));
    problem_free(&pb);
    free_arrays(p0), free_arrays(g);
}

static void test_skip_on_overflow_changes_nothing(void **state) {
    require_variant(state);
    const fp8amp_opt_level levels[3] = {FP8AMP_OPT_LEVEL_O1, FP8AMP_OPT_LEVEL_O2, FP8AMP_OPT_LEVEL_O3};
    for (int l = 0; l < 3; ++l)
        for (int kind = BAD_INF; kind <= BAD_UNSCALE_OVERFLOW; ++kind) overflow_run(state, levels[l], (bad_kind)kind);
}

/* ---- the loss scaler ----------------------------------------------------------------------------- */

typedef struct {
    double scale;
    int tracker, hyst_left;
} scaler_model;

static void scaler_model_update(scaler_model *m, const fp8amp_grad_scaler_desc *d, int found) {
    if (found) {
        m->tracker = 0;
        m->hyst_left -= 1;
        if (m->hyst_left <= 0) {
            m->scale *= d->backoff_factor;
            m->hyst_left = 0;
        }
    } else if (++m->tracker == d->growth_interval) {
        m->tracker = 0;
        m->hyst_left = d->hysteresis;
        m->scale *= d->growth_factor;
    }
}

static void test_grad_scaler_semantics(void **state) {
    require_variant(state);
    for (int standalone = 0; standalone < 2; ++standalone) {
        fp8amp_adam_desc d;
        EXPECT_OK(fp8amp_adam_desc_init_default(&d));
        const int64_t shape[1] = {257};
        const fp8amp_dtype f32[1] = {FP8AMP_DTYPE_F32};
        double **p0 = alloc_arrays(1, shape), **g = alloc_arrays(1, shape);
        fill_uniform(p0, 1, shape, -1, 1);
        problem pb;
        problem_init(&pb, variant_device(state), &d, 1, shape, f32, f32, p0);
        fp8amp_grad_scaler_desc sd;
        EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
        sd.init_scale = 1024.0f;
        sd.growth_interval = 3;
        sd.hysteresis = 2;
        fp8amp_grad_scaler scaler;
        EXPECT_OK(fp8amp_grad_scaler_create(pb.ctx, &sd, &scaler));
        scaler_model model = {1024.0, 0, 2};
        fp8amp_adam_step_args args;
        EXPECT_OK(fp8amp_adam_step_args_init_default(&args));
        if (!standalone) args.scaler = scaler;
        for (int s = 0; s < 40; ++s) {
            const int bad = (test_rng_u64() % 4) == 0;
            fill_uniform(g, 1, shape, -1, 1);
            if (bad) g[0][s % 257] = NAN;
            upload_f64(pb.g[0], g[0], shape[0]);
            EXPECT_OK(fp8amp_optimizer_step(pb.opt, &args));
            if (standalone) EXPECT_OK(fp8amp_grad_scaler_update(scaler, pb.opt));
            scaler_model_update(&model, &sd, bad);
            fp8amp_grad_scaler_state st;
            EXPECT_OK(fp8amp_grad_scaler_get_state(scaler, &st));
            assert_true(st.scale == (float)model.scale);
            assert_int_equal(st.growth_tracker, model.tracker);
            assert_int_equal(st.hysteresis_left, model.hyst_left);
        }
        /* set_state validates and round-trips */
        fp8amp_grad_scaler_state st = {512.0f, 1, 1}, back;
        EXPECT_OK(fp8amp_grad_scaler_set_state(scaler, &st));
        EXPECT_OK(fp8amp_grad_scaler_get_state(scaler, &back));
        assert_memory_equal(&st, &back, sizeof st);
        st.scale = 0.0f;
        EXPECT_STATUS(fp8amp_grad_scaler_set_state(scaler, &st), FP8AMP_ERROR_INVALID_ARGUMENT);
        st.scale = 2.0f;
        st.growth_tracker = 3;
        EXPECT_STATUS(fp8amp_grad_scaler_set_state(scaler, &st), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_OK(fp8amp_grad_scaler_get_state(scaler, &back));
        assert_true(back.scale == 512.0f && back.growth_tracker == 1 && back.hysteresis_left == 1);
        EXPECT_OK(fp8amp_grad_scaler_destroy(scaler));
        problem_free(&pb);
        free_arrays(p0), free_arrays(g);
    }
}

/* Scaled gradients through the scaler give bit-identically the unscaled run (power-of-two scale). */
static void test_scaler_unscales_exactly(void **state) {
    require_variant(state);
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &d));
    const int64_t shape[1] = {1000};
    const fp8amp_dtype f32[1] = {FP8AMP_DTYPE_F32};
    double **p0 = alloc_arrays(1, shape), **g = alloc_arrays(1, shape), **gs = alloc_arrays(1, shape);
    fill_uniform(p0, 1, shape, -1, 1);
    problem a, b;
    problem_init(&a, variant_device(state), &d, 1, shape, f32, f32, p0);
    problem_init(&b, variant_device(state), &d, 1, shape, f32, f32, p0);
    fp8amp_grad_scaler_desc sd;
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    fp8amp_grad_scaler scaler;
    EXPECT_OK(fp8amp_grad_scaler_create(b.ctx, &sd, &scaler));
    fp8amp_adam_step_args args;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&args));
    args.scaler = scaler;
    args.grad_scale_inv = 0.25f; /* also, say, 1/world_size */
    fp8amp_adam_step_args plain;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&plain));
    plain.grad_scale_inv = 0.25f;
    for (int s = 0; s < 20; ++s) {
        fill_uniform(g, 1, shape, -1, 1);
        for (int64_t i = 0; i < shape[0]; ++i) g[0][i] = (float)g[0][i], gs[0][i] = g[0][i] * 65536.0;
        upload_f64(a.g[0], g[0], shape[0]);
        upload_f64(b.g[0], gs[0], shape[0]);
        EXPECT_OK(fp8amp_optimizer_step(a.opt, &plain));
        EXPECT_OK(fp8amp_optimizer_step(b.opt, &args));
    }
    size_t na, nb;
    unsigned char *sa = save_all(a.opt, &na), *sb = save_all(b.opt, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(sa, sb, na);
    free(sa), free(sb);
    EXPECT_OK(fp8amp_grad_scaler_destroy(scaler));
    problem_free(&a);
    problem_free(&b);
    free_arrays(p0), free_arrays(g), free_arrays(gs);
}

/* ---- checkpoints --------------------------------------------------------------------------------- */


typedef struct {
    fp8amp_opt_level level;
    int32_t block;
    fp8amp_dtype pdt, gdt;
} ckpt_case;

static const ckpt_case kCkptCases[5] = {
    {FP8AMP_OPT_LEVEL_O1, 128, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32},
    {FP8AMP_OPT_LEVEL_O2, 128, F16S, F16S},
    {FP8AMP_OPT_LEVEL_O2, 256, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3},
    {FP8AMP_OPT_LEVEL_O3, 128, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E4M3},
    {FP8AMP_OPT_LEVEL_O3, 0, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F32},
};

static void train_steps(problem *pb, int steps, double **g) {
    for (int s = 0; s < steps; ++s) {
        fill_uniform(g, pb->n, pb->numel, -1, 1);
        for (int k = 0; k < pb->n; ++k) write_values(pb, k, pb->g[k], pb->gdt[k], g[k]);
        EXPECT_OK(fp8amp_optimizer_step(pb->opt, NULL));
    }
}

/* Same gradients into two problems (those of `a`, read back, written to `b`'s raw tensors). */
static void train_both(problem *a, problem *b, int steps, double **g) {
    for (int s = 0; s < steps; ++s) {
        fill_uniform(g, a->n, a->numel, -1, 1);
        for (int k = 0; k < a->n; ++k) {
            write_values(a, k, a->g[k], a->gdt[k], g[k]);
            const size_t n = tensor_bytes(a->g[k]);
            unsigned char *raw = xmalloc(n);
            EXPECT_OK(fp8amp_tensor_copy_to_host(a->g[k], raw, n));
            EXPECT_OK(fp8amp_tensor_copy_from_host(b->g[k], raw, n));
            free(raw);
            if (a->gm[k]) { /* FP8 gradients: the same scale_inv too */
                float scale = 0;
                EXPECT_OK(fp8amp_scaling_get(a->gm[k], &scale, NULL, NULL));
                EXPECT_OK(fp8amp_scaling_set_scale(b->gm[k], scale));
                EXPECT_OK(fp8amp_tensor_set_scaling(b->g[k], b->gm[k]));
            }
        }
        EXPECT_OK(fp8amp_optimizer_step(a->opt, NULL));
        EXPECT_OK(fp8amp_optimizer_step(b->opt, NULL));
    }
}

/* Two optimizers' checkpoints: byte for byte the same, except the last step's gradient norm (offset
 * 84, docs/api.md 12.6) and the checksum that covers it. The norm is a float64 sum whose order differs
 * between the CPU and CUDA, and the CUDA fast kernel sums E4M3/E5M2/F16 squares in float32 partials,
 * so it can differ in its last bits (docs/numerics.md 6.1, within 2^-20 relative); rounded to float32
 * it usually agrees, but not always on millions of elements. With clipping off it takes no part in
 * the update: parameters, states, scales and metas must still agree bit for bit. */
static void expect_same_checkpoint(problem *a, problem *b) {
    enum { kNormAt = 84 };
    size_t na, nb;
    unsigned char *sa = save_all(a->opt, &na), *sb = save_all(b->opt, &nb);
    assert_int_equal(na, nb);
    float norm_a, norm_b;
    memcpy(&norm_a, sa + kNormAt, 4), memcpy(&norm_b, sb + kNormAt, 4);
    if (memcmp(sa + kNormAt, sb + kNormAt, 4) != 0) {
        assert_true(isfinite(norm_a) && isfinite(norm_b));
        assert_true(fabs((double)norm_a - (double)norm_b) <= ldexp(fabs((double)norm_a), -20));
    }
    memset(sa + kNormAt, 0, 4), memset(sb + kNormAt, 0, 4);
    assert_memory_equal(sa, sb, na - 4);
    free(sa), free(sb);
}

static void roundtrip_case(fp8amp_device from, fp8amp_device to, const ckpt_case *cc) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(cc->level, &d));
    d.state_block_size = cc->block;
    const int64_t shapes[3] = {640, 1000, 129};
    const fp8amp_dtype pd[3] = {cc->pdt, cc->pdt, cc->pdt}, gd[3] = {cc->gdt, cc->gdt, cc->gdt};
    double **p0 = alloc_arrays(3, shapes), **g = alloc_arrays(3, shapes);
    fill_uniform(p0, 3, shapes, -1, 1);
    problem a, b;
    problem_init(&a, from, &d, 3, shapes, pd, gd, p0);
    train_steps(&a, 5, g);
    size_t n = 0;
    unsigned char *ck = save_all(a.opt, &n);
    /* b: other initial values, another lr, on `to` */
    fill_uniform(p0, 3, shapes, -2, 2);
    fp8amp_adam_desc d2 = d;
    d2.lr = 0.5f;
    problem_init(&b, to, &d2, 3, shapes, pd, gd, p0);
    EXPECT_OK(fp8amp_optimizer_load(b.opt, ck, n));
    expect_same_checkpoint(&a, &b);
    int64_t step = 0;
    EXPECT_OK(fp8amp_optimizer_get_step(b.opt, &step));
    assert_int_equal(step, 5);
    /* both go on identically (clipping off: CPU and CUDA agree bit for bit) */
    train_both(&a, &b, 4, g);
    expect_same_checkpoint(&a, &b);
    free(ck);
    problem_free(&a);
    problem_free(&b);
    free_arrays(p0), free_arrays(g);
}

/* CPU and CUDA bit-identical on parameters large enough that every warp of the CUDA step takes many
 * state blocks (the fast kernel's loop, its odd last block, partial last blocks), in the O1, O2 and
 * O3 layouts, with several (param, grad) dtype pairs in one optimizer, Adam with L2 and maximize,
 * and gradients with exact zeros (v = 0: sqrt(0), m = 0: 0 / denom), a whole tensor of them too. */
typedef struct {
    fp8amp_opt_level level;
    int adamw, maximize;
    float wd;
    fp8amp_dtype pdt[3], gdt[3];
    int32_t block; /* state_block_size; 0: the level's; -1: 0, one scale per tensor (MS-AMP's layout) */
} many_blocks_case;

/* Three steps of each case on the CPU and on CUDA from the same values, then the same checkpoint. */
static void many_blocks_run(const many_blocks_case *cases, size_t ncases, const int64_t shapes[3]) {
    double **p0 = alloc_arrays(3, shapes), **p0b = alloc_arrays(3, shapes), **g = alloc_arrays(3, shapes);
    for (size_t c = 0; c < ncases; ++c) {
        const many_blocks_case *cc = &cases[c];
        fp8amp_adam_desc d;
        EXPECT_OK(fp8amp_opt_level_adam_config(cc->level, &d));
        d.adamw = cc->adamw;
        d.maximize = cc->maximize;
        d.weight_decay = cc->wd;
        if (cc->block) d.state_block_size = cc->block < 0 ? 0 : cc->block;
        fill_uniform(p0, 3, shapes, -1, 1);
        /* b starts from the same original values: problem_init overwrites p0 with what a's tensors
         * hold, and a scaled parameter's meta records the amax of the values quantized into it, so
         * b quantizing a's rounded values would record a different amax (in its last bits), which
         * the first step's fold keeps whenever the new weights stay below it */
        for (int k = 0; k < 3; ++k) memcpy(p0b[k], p0[k], sizeof(double) * (size_t)shapes[k]);
        problem a, b;
        problem_init(&a, cpu_device(), &d, 3, shapes, cc->pdt, cc->gdt, p0);
        problem_init(&b, cuda_device(0), &d, 3, shapes, cc->pdt, cc->gdt, p0b);
        for (int s = 0; s < 3; ++s) {
            fill_uniform(g, 3, shapes, -1, 1);
            for (int64_t i = 0; i < shapes[0]; i += 5) g[0][i] = 0.0; /* scattered exact zeros */
            for (int64_t i = 0; i < shapes[2]; ++i) g[2][i] = 0.0;    /* a tensor that never moves */
            /* scattered tiny gradients (kept by F32/BF16 gradients, zero in E4M3): m below 2^-100,
             * where a fast division would lose bits (the kernel's slow or reference path) */
            for (int64_t i = 3; i < shapes[1]; i += 7) g[1][i] *= 1e-33;
            for (int k = 0; k < 3; ++k) {
                write_values(&a, k, a.g[k], a.gdt[k], g[k]);
                const size_t n = tensor_bytes(a.g[k]);
                unsigned char *raw = xmalloc(n);
                EXPECT_OK(fp8amp_tensor_copy_to_host(a.g[k], raw, n));
                EXPECT_OK(fp8amp_tensor_copy_from_host(b.g[k], raw, n));
                free(raw);
                if (a.gm[k]) {
                    float scale = 0;
                    EXPECT_OK(fp8amp_scaling_get(a.gm[k], &scale, NULL, NULL));
                    EXPECT_OK(fp8amp_scaling_set_scale(b.gm[k], scale));
                    EXPECT_OK(fp8amp_tensor_set_scaling(b.g[k], b.gm[k]));
                }
            }
            EXPECT_OK(fp8amp_optimizer_step(a.opt, NULL));
            EXPECT_OK(fp8amp_optimizer_step(b.opt, NULL));
        }
        int32_t found = 1;
        EXPECT_OK(fp8amp_optimizer_get_found_inf(b.opt, &found));
        assert_int_equal(found, 0);
        expect_same_checkpoint(&a, &b);
        problem_free(&a);
        problem_free(&b);
    }
    free_arrays(p0), free_arrays(p0b), free_arrays(g);
}

static void test_cpu_cuda_bit_identical_many_blocks(void **state) {
    require_variant(state); /* registered for CUDA only: it compares the two devices */
    const fp8amp_dtype F32 = FP8AMP_DTYPE_F32, BF16 = FP8AMP_DTYPE_BF16, E4M3 = FP8AMP_DTYPE_E4M3;
    const many_blocks_case cases[] = {
        {FP8AMP_OPT_LEVEL_O2, 1, 0, 0.01f, {BF16, BF16, F32}, {E4M3, E4M3, F32}, 0},
        {FP8AMP_OPT_LEVEL_O2, 0, 1, 0.05f, {F16S, BF16, BF16}, {E4M3, BF16, E4M3}, 0},
        {FP8AMP_OPT_LEVEL_O1, 1, 0, 0.01f, {F32, F32, F32}, {F32, F32, F32}, 0},
        {FP8AMP_OPT_LEVEL_O1, 0, 1, 0.05f, {F16S, BF16, BF16}, {E4M3, E4M3, BF16}, 0},
        /* the PyTorch front's O1/O2 layout: F32 weights with E4M3 gradients beside F32 parameters
         * with F32 gradients (norms, embeddings) in one optimizer */
        {FP8AMP_OPT_LEVEL_O2, 1, 0, 0.01f, {F32, F32, F32}, {E4M3, F32, E4M3}, 0},
        {FP8AMP_OPT_LEVEL_O1, 1, 0, 0.01f, {F32, F32, BF16}, {E4M3, F32, E4M3}, 0},
        /* O1 with units of 2 and 8 chunks: the last unit of the 4477 elements holds an empty chunk
         * (256) or several (1024), which the update's chunk numbering skips */
        {FP8AMP_OPT_LEVEL_O1, 1, 0, 0.01f, {F32, BF16, BF16}, {F32, E4M3, BF16}, 256},
        {FP8AMP_OPT_LEVEL_O1, 0, 0, 0.0f, {BF16, F32, F16S}, {E4M3, F32, E4M3}, 1024},
        {FP8AMP_OPT_LEVEL_O3, 1, 0, 0.01f, {E4M3, E4M3, BF16}, {E4M3, E4M3, E4M3}, 0},
        {FP8AMP_OPT_LEVEL_O3, 0, 1, 0.05f, {F16S, BF16, E4M3}, {E4M3, BF16, E4M3}, 0},
        /* one scale per tensor: the fast kernel's phase 1b (every tensor's new amax) */
        {FP8AMP_OPT_LEVEL_O2, 1, 0, 0.01f, {BF16, BF16, F32}, {E4M3, E4M3, F32}, -1},
        {FP8AMP_OPT_LEVEL_O2, 0, 1, 0.05f, {F16S, F32, BF16}, {E4M3, E4M3, BF16}, -1},
        {FP8AMP_OPT_LEVEL_O3, 1, 0, 0.01f, {E4M3, E4M3, BF16}, {E4M3, E4M3, E4M3}, -1},
        {FP8AMP_OPT_LEVEL_O3, 0, 1, 0.05f, {F16S, BF16, E4M3}, {E4M3, BF16, E4M3}, -1},
    };
    const int64_t full[3] = {1000003, 262144, 4477}; /* 7813 blocks (the last partial), 2048, 35 */
    const int64_t small[3] = {100003, 26240, 4477};  /* 782 blocks (the last partial), 205, 35 */
    many_blocks_run(cases, sizeof cases / sizeof cases[0], test_small() ? small : full);
}

/* The same with about 23 state blocks per warp of an H100's grid (3168 warps), where the test above
 * gives each warp 3: long runs of the fast kernel's pair loop, pairs cut by a parameter's end, warp
 * ranges and the update's counter-dealt runs of 16 pairs that end inside one parameter and go on in
 * the next; O2 and O3 (the block scales).
 * With millions of elements this is also where the reported gradient norm can differ in its last
 * bit between the two devices (expect_same_checkpoint). */
static void test_cpu_cuda_bit_identical_long_ranges(void **state) {
    require_variant(state);
    const fp8amp_dtype BF16 = FP8AMP_DTYPE_BF16, E4M3 = FP8AMP_DTYPE_E4M3, F32 = FP8AMP_DTYPE_F32;
    const many_blocks_case cases[] = {
        {FP8AMP_OPT_LEVEL_O2, 1, 0, 0.01f, {BF16, BF16, F32}, {E4M3, E4M3, F32}, 0},
        {FP8AMP_OPT_LEVEL_O2, 0, 0, 0.01f, {F32, F32, F32}, {E4M3, F32, E4M3}, 0},
        {FP8AMP_OPT_LEVEL_O3, 0, 1, 0.05f, {F16S, BF16, E4M3}, {E4M3, BF16, E4M3}, 0},
        /* per tensor: phase 1b's warp shares cut tensors anywhere, many warps add to one amax */
        {FP8AMP_OPT_LEVEL_O2, 1, 0, 0.01f, {BF16, BF16, F32}, {E4M3, E4M3, F32}, -1},
        {FP8AMP_OPT_LEVEL_O3, 0, 1, 0.05f, {F16S, BF16, E4M3}, {E4M3, BF16, E4M3}, -1},
    };
    const int64_t full[3] = {9000011, 262151, 4477}; /* 70313 blocks, 2049, 35 (the last ones partial) */
    /* under the sanitizers (test_small) about 3 blocks per warp, as the test above */
    const int64_t small[3] = {1000011, 26247, 4477}; /* 7813, 206, 35 (the last ones partial) */
    many_blocks_run(cases, sizeof cases / sizeof cases[0], test_small() ? small : full);
}

/* The gradient check of E4M3 gradients, whose CUDA fast kernel sums the squares of the codes in
 * float32 partials and scales by f^2 once when the largest E4M3 value times the unscale factor f is
 * finite, and checks element by element otherwise (docs/numerics.md 6.1). 2^21 elements, so that on
 * a large GPU (3168 warps on an H100) each warp's range spans several 16-byte loads per lane:
 *   1. f = 0.37 (the float32 partials): the norm against float64;
 *   2. f = 2^120 (448 * f overflows float32: the per-element form) with a code of 448 among codes of
 *      at most 2^-4: that element's unscaled value is inf, so the step is skipped;
 *   3. the same f without that code: every unscaled value is finite (below 2^116), the step is
 *      taken and the norm (below 2^126) matches float64. */
static double fp8_grads_norm(fp8amp_context ctx, fp8amp_tensor g, fp8amp_tensor stage, double *x, int64_t n,
                             double unscale) {
    EXPECT_OK(fp8amp_dequantize(ctx, g, stage));
    download_f64(stage, x, n);
    double sumsq = 0.0;
    for (int64_t i = 0; i < n; ++i) sumsq += (x[i] * unscale) * (x[i] * unscale);
    return sqrt(sumsq);
}

static void test_grad_norm_of_fp8_gradients(void **state) {
    require_variant(state);
    const int64_t n = (INT64_C(1) << 21) + 333;
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_tensor p = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, &n), g = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_tensor stage = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    fp8amp_recipe r = recipe_of(FP8AMP_SCALING_DELAYED); /* quantize uses the scale we set */
    fp8amp_scaling gm;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &gm));
    EXPECT_OK(fp8amp_tensor_set_scaling(g, gm));
    double *x = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) x[i] = test_rng_uniform(-1, 1);
    upload_f64(stage, x, n);
    EXPECT_OK(fp8amp_cast(ctx, stage, p));
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &d));
    fp8amp_optimizer opt;
    EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
    EXPECT_OK(fp8amp_optimizer_add_param(opt, p, g));
    fp8amp_adam_step_args args;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&args));
    int32_t found = 0;
    int64_t step = 0;
    float norm = 0;

    /* 1: codes over E4M3's whole range (scale 1), f = rn(0.37) */
    EXPECT_OK(fp8amp_scaling_set_scale(gm, 1.0f));
    for (int64_t i = 0; i < n; ++i) x[i] = test_rng_uniform(-400, 400) * (i % 3 == 0 ? 1e-3 : 1.0);
    upload_f64(stage, x, n);
    EXPECT_OK(fp8amp_quantize(ctx, stage, g));
    args.grad_scale_inv = 0.37f;
    EXPECT_OK(fp8amp_optimizer_step(opt, &args));
    EXPECT_OK(fp8amp_optimizer_get_found_inf(opt, &found));
    assert_int_equal(found, 0);
    double want = fp8_grads_norm(ctx, g, stage, x, n, (double)0.37f);
    EXPECT_OK(fp8amp_optimizer_get_grad_norm(opt, &norm));
    assert_true(fabs(norm - want) <= 1e-6 * want);

    /* 2: scale_inv 2^100 and grad_scale_inv 2^20: f = 2^120; one code of 448 */
    EXPECT_OK(fp8amp_scaling_set_scale(gm, 0x1p-100f));
    for (int64_t i = 0; i < n; ++i) x[i] = test_rng_uniform(-0x1p96, 0x1p96); /* codes within +-2^-4 */
    const int64_t where = (int64_t)(test_rng_u64() % (uint64_t)n);
    const double kept = x[where];
    x[where] = 448.0 * 0x1p100;
    upload_f64(stage, x, n);
    EXPECT_OK(fp8amp_quantize(ctx, stage, g));
    args.grad_scale_inv = 0x1p20f;
    EXPECT_OK(fp8amp_optimizer_step(opt, &args));
    EXPECT_OK(fp8amp_optimizer_get_found_inf(opt, &found));
    assert_int_equal(found, 1);
    EXPECT_OK(fp8amp_optimizer_get_step(opt, &step));
    assert_int_equal(step, 1);

    /* 3: the same without that code */
    x[where] = kept;
    upload_f64(stage, x, n);
    EXPECT_OK(fp8amp_quantize(ctx, stage, g));
    EXPECT_OK(fp8amp_optimizer_step(opt, &args));
    EXPECT_OK(fp8amp_optimizer_get_found_inf(opt, &found));
    assert_int_equal(found, 0);
    want = fp8_grads_norm(ctx, g, stage, x, n, 0x1p20);
    assert_true(want > 0x1p100 && want < 0x1p127);
    EXPECT_OK(fp8amp_optimizer_get_grad_norm(opt, &norm));
    assert_true(fabs(norm - want) <= 1e-6 * want);

    free(x);
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_tensor_destroy(p));
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_tensor_destroy(stage));
    EXPECT_OK(fp8amp_scaling_destroy(gm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* lr read by the step from device memory (a schedule inside a captured graph) equals lr by value. */
static void test_lr_from_device_memory(void **state) {
    require_variant(state);
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &d));
    const int64_t shape[1] = {777}, one[1] = {1};
    const fp8amp_dtype f32[1] = {FP8AMP_DTYPE_F32};
    double **p0 = alloc_arrays(1, shape), **g = alloc_arrays(1, shape);
    fill_uniform(p0, 1, shape, -1, 1);
    problem a, b;
    problem_init(&a, variant_device(state), &d, 1, shape, f32, f32, p0);
    problem_init(&b, variant_device(state), &d, 1, shape, f32, f32, p0);
    fp8amp_tensor lr = make_tensor(b.ctx, FP8AMP_DTYPE_F32, 1, one);
    void *lr_ptr = NULL;
    EXPECT_OK(fp8amp_tensor_data(lr, &lr_ptr));
    fp8amp_adam_step_args by_value, by_device;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&by_value));
    EXPECT_OK(fp8amp_adam_step_args_init_default(&by_device));
    by_device.lr = 123.0f; /* ignored: lr_device overrides it */
    by_device.lr_device = (const float *)lr_ptr;
    for (int s = 0; s < 6; ++s) {
        const float value = 1e-3f * (float)(s + 1);
        by_value.lr = value;
        EXPECT_OK(fp8amp_tensor_copy_from_host(lr, &value, sizeof value));
        fill_uniform(g, 1, shape, -1, 1);
        upload_f64(a.g[0], g[0], shape[0]);
        upload_f64(b.g[0], g[0], shape[0]);
        EXPECT_OK(fp8amp_optimizer_step(a.opt, &by_value));
        EXPECT_OK(fp8amp_optimizer_step(b.opt, &by_device));
    }
    expect_same_checkpoint(&a, &b);
    EXPECT_OK(fp8amp_tensor_destroy(lr));
    problem_free(&a);
    problem_free(&b);
    free_arrays(p0), free_arrays(g);
}

static void test_checkpoint_roundtrip(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    for (int c = 0; c < 5; ++c) roundtrip_case(dev, dev, &kCkptCases[c]);
}

static void test_checkpoint_across_devices_and_cpu_cuda_bit_identical(void **state) {
    require_variant(state); /* registered for CUDA only: it moves checkpoints between the two devices */
    for (int c = 0; c < 5; ++c) {
        roundtrip_case(cuda_device(0), cpu_device(), &kCkptCases[c]);
        roundtrip_case(cpu_device(), cuda_device(0), &kCkptCases[c]);
    }
}

static void test_checkpoint_refuses_bad_input(void **state) {
    require_variant(state);
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O3, &d));
    const int64_t shapes[2] = {300, 200};
    const fp8amp_dtype pd[2] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_BF16}, gd[2] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32};
    double **p0 = alloc_arrays(2, shapes), **g = alloc_arrays(2, shapes);
    fill_uniform(p0, 2, shapes, -1, 1);
    problem a, b;
    problem_init(&a, variant_device(state), &d, 2, shapes, pd, gd, p0);
    train_steps(&a, 3, g);
    size_t n = 0, nb = 0, nb2 = 0;
    unsigned char *ck = save_all(a.opt, &n);
    assert_int_equal(crc32_bitwise(ck, n - 4), (uint32_t)ck[n - 4] | (uint32_t)ck[n - 3] << 8 |
                                                   (uint32_t)ck[n - 2] << 16 | (uint32_t)ck[n - 1] << 24);
    fill_uniform(p0, 2, shapes, -1, 1);
    problem_init(&b, variant_device(state), &d, 2, shapes, pd, gd, p0);
    train_steps(&b, 1, g);
    unsigned char *b_before = save_all(b.opt, &nb);
    unsigned char *bad = xmalloc(n);
    /* truncated */
    const size_t cuts[6] = {0, 10, 27, 100, n / 2, n - 1};
    for (int i = 0; i < 6; ++i) EXPECT_STATUS(fp8amp_optimizer_load(b.opt, ck, cuts[i]), FP8AMP_ERROR_CORRUPT_DATA);
    /* flipped bits anywhere */
    for (int i = 0; i < 40; ++i) {
        memcpy(bad, ck, n);
        const size_t at = (size_t)(test_rng_u64() % n);
        bad[at] ^= (unsigned char)(1u << (test_rng_u64() % 8));
        EXPECT_STATUS(fp8amp_optimizer_load(b.opt, bad, n), FP8AMP_ERROR_CORRUPT_DATA);
    }
    /* a future format version (with a valid checksum) */
    memcpy(bad, ck, n);
    put_u32(bad + 8, 3); /* 2 is 0.4.0's format (per-parameter masters) */
    put_u32(bad + n - 4, crc32_bitwise(bad, n - 4));
    EXPECT_STATUS(fp8amp_optimizer_load(b.opt, bad, n), FP8AMP_ERROR_NOT_SUPPORTED);
    /* an invalid value behind a valid checksum: beta1 = 1 */
    memcpy(bad, ck, n);
    put_u32(bad + 32, 0x3F800000u);
    put_u32(bad + n - 4, crc32_bitwise(bad, n - 4));
    EXPECT_STATUS(fp8amp_optimizer_load(b.opt, bad, n), FP8AMP_ERROR_CORRUPT_DATA);
    /* NULL */
    EXPECT_STATUS(fp8amp_optimizer_load(b.opt, NULL, n), FP8AMP_ERROR_INVALID_ARGUMENT);
    unsigned char *b_after = save_all(b.opt, &nb2);
    assert_int_equal(nb, nb2);
    assert_memory_equal(b_before, b_after, nb);
    /* wrong parameter count, other layout */
    problem c1, c2;
    problem_init(&c1, variant_device(state), &d, 1, shapes, pd, gd, p0);
    EXPECT_STATUS(fp8amp_optimizer_load(c1.opt, ck, n), FP8AMP_ERROR_SHAPE_MISMATCH);
    fp8amp_adam_desc d2 = d;
    d2.state_block_size = 256;
    problem_init(&c2, variant_device(state), &d2, 2, shapes, pd, gd, p0);
    EXPECT_STATUS(fp8amp_optimizer_load(c2.opt, ck, n), FP8AMP_ERROR_DTYPE_MISMATCH);
    int64_t step = -1;
    EXPECT_OK(fp8amp_optimizer_get_step(c1.opt, &step));
    assert_int_equal(step, 0);
    /* the buffer API */
    size_t size = 0;
    EXPECT_STATUS(fp8amp_optimizer_save(a.opt, bad, n - 1, &size), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_save(a.opt, bad, n, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    free(ck), free(bad), free(b_before), free(b_after);
    problem_free(&a);
    problem_free(&b);
    problem_free(&c1);
    problem_free(&c2);
    free_arrays(p0), free_arrays(g);
}

/* ---- bad inputs -------------------------------------------------------------------------------- */

static void test_bad_inputs(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    fp8amp_context ctx = make_context(dev);
    fp8amp_adam_desc d, bad;
    EXPECT_OK(fp8amp_adam_desc_init_default(&d));
    fp8amp_optimizer opt = NULL;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, NULL, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_create(NULL, &d, &opt), FP8AMP_ERROR_INVALID_HANDLE);
    bad = d, bad.struct_size = 8;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.lr = -1;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.beta2 = 1.0f;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.eps = NAN;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.state_block_size = 100;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.state_block_size = 64;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    bad = d, bad.exp_avg_dtype = FP8AMP_DTYPE_BF16;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_DTYPE_MISMATCH);
    bad = d, bad.exp_avg_sq_dtype = FP8AMP_DTYPE_E4M3;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_DTYPE_MISMATCH);
    bad = d, bad.master_dtype = FP8AMP_DTYPE_BF16;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(opt);
    EXPECT_STATUS(fp8amp_opt_level_adam_init((fp8amp_opt_level)4, &d, sizeof d), FP8AMP_ERROR_INVALID_ARGUMENT);

    EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
    const int64_t s10[1] = {10}, s11[1] = {11};
    fp8amp_tensor p = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, s10), g = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, s10);
    fp8amp_tensor g11 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, s11), g2 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, s10);
    fp8amp_tensor p8 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, s10), p5 = make_tensor(ctx, FP8AMP_DTYPE_E5M2, 1, s10);
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p, g11), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p, p), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p5, g), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p8, g), FP8AMP_ERROR_INVALID_ARGUMENT); /* no meta */
    fp8amp_recipe rc = recipe_of(FP8AMP_SCALING_CURRENT);
    fp8amp_scaling cur;
    EXPECT_OK(fp8amp_scaling_create(ctx, &rc, FP8AMP_DTYPE_E4M3, &cur));
    EXPECT_OK(fp8amp_tensor_set_scaling(p8, cur));
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p8, g), FP8AMP_ERROR_INVALID_ARGUMENT); /* current scaling */
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, (fp8amp_tensor)ctx, g), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_optimizer_add_param((fp8amp_optimizer)ctx, p, g), FP8AMP_ERROR_INVALID_HANDLE);
    int32_t count = -1;
    EXPECT_OK(fp8amp_optimizer_num_params(opt, &count));
    assert_int_equal(count, 0);
    EXPECT_OK(fp8amp_optimizer_add_param(opt, p, g));
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, p, g2), FP8AMP_ERROR_INVALID_ARGUMENT); /* twice */
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, g2, p), FP8AMP_ERROR_INVALID_ARGUMENT); /* grad is a param */
    EXPECT_OK(fp8amp_optimizer_num_params(opt, &count));
    assert_int_equal(count, 1);
    if (dev.type == FP8AMP_DEVICE_CUDA) {
        fp8amp_context cpu = make_context(cpu_device());
        fp8amp_tensor pc = make_tensor(cpu, FP8AMP_DTYPE_F32, 1, s10), gc = make_tensor(cpu, FP8AMP_DTYPE_F32, 1, s10);
        EXPECT_STATUS(fp8amp_optimizer_add_param(opt, pc, g2), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_optimizer_add_param(opt, g2, gc), FP8AMP_ERROR_DEVICE_MISMATCH);
        fp8amp_grad_scaler_desc sd;
        EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
        fp8amp_grad_scaler cs;
        EXPECT_OK(fp8amp_grad_scaler_create(cpu, &sd, &cs));
        fp8amp_adam_step_args a;
        EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
        a.scaler = cs;
        EXPECT_STATUS(fp8amp_optimizer_step(opt, &a), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_grad_scaler_update(cs, opt), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_OK(fp8amp_grad_scaler_destroy(cs));
        EXPECT_OK(fp8amp_tensor_destroy(pc));
        EXPECT_OK(fp8amp_tensor_destroy(gc));
        EXPECT_OK(fp8amp_context_destroy(cpu));
    }
    /* O3 master for an F32 parameter */
    fp8amp_adam_desc d3;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O3, &d3));
    fp8amp_optimizer opt3;
    EXPECT_OK(fp8amp_optimizer_create(ctx, &d3, &opt3));
    fp8amp_tensor g3 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, s10);
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt3, g2, g3), FP8AMP_ERROR_DTYPE_MISMATCH);
    /* step arguments */
    fp8amp_adam_step_args a;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
    a.struct_size = 4;
    EXPECT_STATUS(fp8amp_optimizer_step(opt, &a), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
    a.grad_scale_inv = NAN;
    EXPECT_STATUS(fp8amp_optimizer_step(opt, &a), FP8AMP_ERROR_INVALID_ARGUMENT);
    a.grad_scale_inv = 1.0f;
    a.scaler = (fp8amp_grad_scaler)opt;
    EXPECT_STATUS(fp8amp_optimizer_step(opt, &a), FP8AMP_ERROR_INVALID_HANDLE);
    int64_t step = -1;
    EXPECT_OK(fp8amp_optimizer_get_step(opt, &step));
    assert_int_equal(step, 0);
    const float ones[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT_OK(fp8amp_tensor_copy_from_host(g, ones, sizeof ones));
    EXPECT_OK(fp8amp_tensor_copy_from_host(p, ones, sizeof ones));
    EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
    EXPECT_STATUS(fp8amp_optimizer_add_param(opt, g2, g3), FP8AMP_ERROR_INVALID_ARGUMENT); /* after a step */
    EXPECT_STATUS(fp8amp_optimizer_get_step(opt, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_state_bytes(opt, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* destroyed handles */
    EXPECT_OK(fp8amp_optimizer_destroy(opt3));
    EXPECT_STATUS(fp8amp_optimizer_step(opt3, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_optimizer_destroy(opt3), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_optimizer_destroy(NULL));
    EXPECT_OK(fp8amp_grad_scaler_destroy(NULL));
    fp8amp_grad_scaler_desc sd;
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    fp8amp_grad_scaler gs = NULL;
    sd.backoff_factor = 1.0f;
    EXPECT_STATUS(fp8amp_grad_scaler_create(ctx, &sd, &gs), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    sd.hysteresis = 0;
    EXPECT_STATUS(fp8amp_grad_scaler_create(ctx, &sd, &gs), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    sd.struct_size = (uint32_t)sizeof sd - 4;
    EXPECT_STATUS(fp8amp_grad_scaler_create(ctx, &sd, &gs), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "fp8amp_grad_scaler_desc_init_default"));
    assert_null(gs);
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    fp8amp_tensor all[] = {p, g, g11, g2, g3, p8, p5};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(cur));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- memory ------------------------------------------------------------------------------------- */

static void test_state_bytes_per_parameter(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    const int64_t shapes[2] = {1 << 20, 3 << 18};
    const double nparams = (double)(shapes[0] + shapes[1]);
    const fp8amp_opt_level levels[3] = {FP8AMP_OPT_LEVEL_O1, FP8AMP_OPT_LEVEL_O2, FP8AMP_OPT_LEVEL_O3};
    const double weight_bytes[3] = {0, 0, 1}; /* O3 counts its E4M3 weights too */
    const double bound[3] = {8.05, 3.1, 6.1};
    for (int l = 0; l < 3; ++l) {
        fp8amp_adam_desc d;
        EXPECT_OK(fp8amp_opt_level_adam_config(levels[l], &d));
        fp8amp_context ctx = make_context(dev);
        fp8amp_optimizer opt;
        EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
        /* the fixed bookkeeping (status, per-CTA scratch on CUDA): at most 64 KiB whatever the model */
        size_t base = 0;
        EXPECT_OK(fp8amp_optimizer_state_bytes(opt, &base));
        assert_true(base > 0 && base <= 65536);
        fp8amp_tensor t[4];
        fp8amp_scaling m[2] = {NULL, NULL};
        for (int k = 0; k < 2; ++k) {
            const fp8amp_dtype pdt = levels[l] == FP8AMP_OPT_LEVEL_O3 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F32;
            t[2 * k] = make_tensor(ctx, pdt, 1, &shapes[k]);
            t[2 * k + 1] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &shapes[k]);
            if (pdt == FP8AMP_DTYPE_E4M3) {
                fp8amp_recipe r = recipe_of(FP8AMP_SCALING_DELAYED);
                EXPECT_OK(fp8amp_scaling_create(ctx, &r, pdt, &m[k]));
                EXPECT_OK(fp8amp_tensor_set_scaling(t[2 * k], m[k]));
                unsigned char *zeros = calloc((size_t)shapes[k], 1);
                EXPECT_OK(fp8amp_tensor_copy_from_host(t[2 * k], zeros, (size_t)shapes[k]));
                free(zeros);
            }
            EXPECT_OK(fp8amp_optimizer_add_param(opt, t[2 * k], t[2 * k + 1]));
        }
        size_t bytes = 0;
        EXPECT_OK(fp8amp_optimizer_state_bytes(opt, &bytes));
        /* per parameter: everything but the fixed bookkeeping (which the parameter list adds to) */
        const double per = (double)(bytes - base) / nparams + weight_bytes[l];
        print_message("O%d: %zu state bytes (%zu fixed), %.4f bytes per parameter (bound %.2f)\n", l + 1, bytes, base,
                      per, bound[l]);
        assert_true(per <= bound[l]);
        assert_true(per >= bound[l] - 0.2); /* and it is not under-reported */
        EXPECT_OK(fp8amp_optimizer_destroy(opt));
        for (int k = 0; k < 4; ++k) EXPECT_OK(fp8amp_tensor_destroy(t[k]));
        for (int k = 0; k < 2; ++k) EXPECT_OK(fp8amp_scaling_destroy(m[k]));
        EXPECT_OK(fp8amp_context_destroy(ctx));
    }
}

static void test_presets(void **state) {
    (void)state;
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_adam_desc_init_default(&d));
    assert_int_equal(d.struct_size, sizeof d);
    assert_int_equal(d.adamw, 1);
    assert_true(d.lr == 1e-3f && d.beta1 == 0.9f && d.beta2 == 0.999f && d.eps == 1e-8f && d.weight_decay == 0.01f);
    assert_int_equal(d.state_block_size, 128);
    assert_int_equal(d.master_dtype, FP8AMP_NO_MASTER);
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O1, &d));
    assert_int_equal(d.exp_avg_dtype, FP8AMP_DTYPE_F32);
    assert_int_equal(d.exp_avg_sq_dtype, FP8AMP_DTYPE_F32);
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &d));
    assert_int_equal(d.exp_avg_dtype, FP8AMP_DTYPE_E4M3);
    assert_int_equal(d.exp_avg_sq_dtype, FP8AMP_DTYPE_F16);
    assert_int_equal(d.master_dtype, FP8AMP_NO_MASTER);
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O3, &d));
    assert_int_equal(d.master_dtype, FP8AMP_DTYPE_F16);
    EXPECT_STATUS(fp8amp_adam_desc_init(NULL, sizeof(fp8amp_adam_desc)), FP8AMP_ERROR_INVALID_ARGUMENT);
    fp8amp_grad_scaler_desc s;
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&s));
    assert_true(s.init_scale == 65536.0f && s.growth_factor == 2.0f && s.backoff_factor == 0.5f);
    assert_int_equal(s.growth_interval, 2000);
    assert_int_equal(s.hysteresis, 1);
}

/* ---- with the FP8 Linear: the optimizer steps a Linear's scaled-F16 weight from its E4M3 gradient -- */

static void test_trains_an_fp8_linear(void **state) {
    require_variant(state);
    enum { IN = 64, OUT = 16, B = 64 };
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_linear_desc ld;
    EXPECT_OK(fp8amp_linear_desc_init_default(&ld));
    ld.in_features = IN;
    ld.out_features = OUT;
    ld.weight_dtype = FP8AMP_DTYPE_F16; /* scaled F16 (MS-AMP O2 weights) */
    ld.wgrad_dtype = FP8AMP_DTYPE_E4M3;
    fp8amp_linear lin;
    EXPECT_OK(fp8amp_linear_create(ctx, &ld, &lin));
    fp8amp_tensor w, b, gw, gb;
    fp8amp_scaling wmeta;
    EXPECT_OK(fp8amp_linear_weight(lin, &w));
    EXPECT_OK(fp8amp_linear_bias(lin, &b));
    EXPECT_OK(fp8amp_linear_weight_grad(lin, &gw));
    EXPECT_OK(fp8amp_linear_bias_grad(lin, &gb));
    EXPECT_OK(fp8amp_linear_scaling(lin, FP8AMP_ROLE_WEIGHT_STORAGE, &wmeta));
    const int64_t wshape[2] = {OUT, IN}, xshape[2] = {B, IN}, yshape[2] = {B, OUT};
    fp8amp_tensor w32 = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, wshape);
    fp8amp_tensor x = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, xshape), y = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, yshape);
    fp8amp_tensor dy = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, yshape);
    float *hw = xmalloc(sizeof(float) * OUT * IN), *ht = xmalloc(sizeof(float) * OUT * IN);
    float *hx = xmalloc(sizeof(float) * B * IN), *hy = xmalloc(sizeof(float) * B * OUT), *hdy = xmalloc(sizeof(float) * B * OUT);
    float *hg = xmalloc(sizeof(float) * OUT * IN), *hw1 = xmalloc(sizeof(float) * OUT * IN);
    for (int i = 0; i < OUT * IN; ++i) hw[i] = (float)test_rng_uniform(-0.1, 0.1), ht[i] = (float)test_rng_uniform(-0.3, 0.3);
    for (int i = 0; i < B * IN; ++i) hx[i] = (float)test_rng_uniform(-1, 1);
    EXPECT_OK(fp8amp_scaling_set_scale(wmeta, 65504.0f / 2 / 0.1f));
    EXPECT_OK(fp8amp_tensor_copy_from_host(w32, hw, sizeof(float) * OUT * IN));
    EXPECT_OK(fp8amp_quantize(ctx, w32, w));
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, hx, sizeof(float) * B * IN));
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &d));
    d.lr = 1e-2f;
    fp8amp_optimizer opt;
    EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
    EXPECT_OK(fp8amp_optimizer_add_param(opt, w, gw));
    EXPECT_OK(fp8amp_optimizer_add_param(opt, b, gb));
    double first_loss = 0, loss = 0;
    for (int step = 0; step < 150; ++step) {
        EXPECT_OK(fp8amp_linear_forward(lin, x, y, 1));
        EXPECT_OK(fp8amp_tensor_copy_to_host(y, hy, sizeof(float) * B * OUT));
        loss = 0;
        for (int r = 0; r < B; ++r)
            for (int o = 0; o < OUT; ++o) {
                double target = 0;
                for (int i = 0; i < IN; ++i) target += (double)hx[r * IN + i] * ht[o * IN + i];
                const double e = hy[r * OUT + o] - target;
                loss += e * e / B;
                hdy[r * OUT + o] = (float)(2 * e / B);
            }
        if (step == 0) first_loss = loss;
        EXPECT_OK(fp8amp_tensor_copy_from_host(dy, hdy, sizeof(float) * B * OUT));
        EXPECT_OK(fp8amp_linear_backward(lin, dy, NULL, 0));
        if (step == 0) { /* the weight and the gradient as the optimizer reads them */
            EXPECT_OK(fp8amp_dequantize(ctx, w, w32));
            EXPECT_OK(fp8amp_tensor_copy_to_host(w32, hw, sizeof(float) * OUT * IN));
            EXPECT_OK(fp8amp_dequantize(ctx, gw, w32));
            EXPECT_OK(fp8amp_tensor_copy_to_host(w32, hg, sizeof(float) * OUT * IN));
        }
        EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
        if (step == 0) {
            /* Adam's first step: m_hat = g, v_hat = g^2, so w1 = w0 (1 - lr wd) - lr g / (|g| + eps). */
            EXPECT_OK(fp8amp_dequantize(ctx, w, w32));
            EXPECT_OK(fp8amp_tensor_copy_to_host(w32, hw1, sizeof(float) * OUT * IN));
            int moved = 0;
            for (int i = 0; i < OUT * IN; ++i) {
                const double g = hg[i];
                const double ref = hw[i] * (1.0 - 1e-2 * 0.01) - 1e-2 * g / (fabs(g) + 1e-8);
                assert_true(fabs(hw1[i] - ref) <= 1e-3 * fabs(ref) + 1e-6); /* scaled F16: 2^-11 relative */
                moved += hw1[i] != hw[i];
            }
            assert_true(moved > OUT * IN / 2);
        }
    }
    print_message("Linear (scaled F16 weight, E4M3 weight gradient) + O2 AdamW: loss %.4f -> %.5f in 150 steps\n",
                  first_loss, loss);
    assert_true(loss < 0.05 * first_loss);
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_scaling_destroy(wmeta));
    fp8amp_tensor all[] = {w, b, gw, gb, w32, x, y, dy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(hw), free(ht), free(hx), free(hy), free(hdy), free(hg), free(hw1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        DEVICE_TESTS(test_o1_adamw_matches_float64),
        DEVICE_TESTS(test_o1_adam_l2_matches_float64),
        DEVICE_TESTS(test_o1_maximize_matches_float64),
        DEVICE_TESTS(test_o1_clipping_matches_float64),
        DEVICE_TESTS(test_o1_quadratic_wide_io),
        DEVICE_TESTS(test_o1_quadratic_e4m3_grads),
        DEVICE_TESTS(test_o1_quadratic_e5m2_grads),
        DEVICE_TESTS(test_o1_quadratic_scaled_f16),
        DEVICE_TESTS(test_o2_quadratic_block_sizes),
        DEVICE_TESTS(test_o2_quadratic_low_precision_io),
        DEVICE_TESTS(test_o3_quadratic_fp8_params),
        DEVICE_TESTS(test_o3_quadratic_other_params),
        DEVICE_TESTS(test_skip_on_overflow_changes_nothing),
        DEVICE_TESTS(test_grad_scaler_semantics),
        DEVICE_TESTS(test_scaler_unscales_exactly),
        DEVICE_TESTS(test_lr_from_device_memory),
        DEVICE_TESTS(test_grad_norm_of_fp8_gradients),
        DEVICE_TESTS(test_checkpoint_roundtrip),
        {"test_checkpoint_across_devices_and_cpu_cuda_bit_identical[cuda]",
         test_checkpoint_across_devices_and_cpu_cuda_bit_identical, NULL, NULL, (void *)&VARIANT_CUDA},
        {"test_cpu_cuda_bit_identical_many_blocks[cuda]", test_cpu_cuda_bit_identical_many_blocks, NULL, NULL,
         (void *)&VARIANT_CUDA},
        {"test_cpu_cuda_bit_identical_long_ranges[cuda]", test_cpu_cuda_bit_identical_long_ranges, NULL, NULL,
         (void *)&VARIANT_CUDA},
        DEVICE_TESTS(test_checkpoint_refuses_bad_input),
        DEVICE_TESTS(test_bad_inputs),
        DEVICE_TESTS(test_state_bytes_per_parameter),
        DEVICE_TESTS(test_trains_an_fp8_linear),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
