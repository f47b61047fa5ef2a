/* Hostile inputs to the optimizer (issue 22, defects 1, 5 and 6), through the public API only:
 *   - a parameter's scaling meta unbound (and its handle destroyed) or re-bound to another meta after
 *     fp8amp_optimizer_add_param: step, save and load refuse (INVALID_ARGUMENT, naming the parameter)
 *     instead of reading or writing a freed meta, and work again once the original binding is back;
 *   - step arguments and desc fields out of their documented domains (lr = -inf, NaN, inf, negative
 *     grad_scale_inv, betas outside [0, 1), ...): INVALID_ARGUMENT, nothing changed;
 *   - checkpoints with a VALID checksum (recomputed here, bit by bit) holding a value outside its
 *     field's domain -- every header field, and per parameter its scale_inv slot, its meta's state,
 *     m, v, the master copy and every block scale: CORRUPT_DATA, a message naming the field (and the
 *     parameter), and the optimizer's own checkpoint byte-identical afterwards; and valid edge values
 *     (a huge but legal step count, an infinite gradient norm, tiny block scales) still load.
 * Every test runs on the CPU and on CUDA (skipped without a GPU) on fresh random data. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h" /* f32_bits, bits_f32 */
#include "test_util.h"

/* ---- small helpers ------------------------------------------------------------------------------ */

static size_t dtype_size(int32_t dt) { return dt == FP8AMP_DTYPE_F32 ? 4 : (dt == FP8AMP_DTYPE_E4M3 || dt == FP8AMP_DTYPE_E5M2) ? 1 : 2; }

/* Random F32 values in [-1, 1) into an F32 tensor of n elements. */
static void upload_random(fp8amp_tensor t, int64_t n) {
    float *f = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) f[i] = (float)test_rng_uniform(-1, 1);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, f, sizeof(float) * (size_t)n));
    free(f);
}

/* Random finite codes of magnitude about 2^-5 .. 2^2 (E4M3 or F16) into a tensor of n elements. */
static void upload_random_codes(fp8amp_tensor t, fp8amp_dtype dt, int64_t n) {
    const size_t es = dtype_size(dt);
    unsigned char *raw = xmalloc(es * (size_t)n);
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = test_rng_u64();
        if (dt == FP8AMP_DTYPE_E4M3) { /* bias 7: exponent field 2..9 */
            raw[i] = (unsigned char)((r & 0x80u) | (uint32_t)(2 + (r >> 8) % 8) << 3 | (uint32_t)((r >> 16) & 7u));
        } else { /* F16, bias 15: exponent field 10..17 */
            const uint16_t c = (uint16_t)((r & 0x8000u) | (uint32_t)(10 + (r >> 20) % 8) << 10 | (uint32_t)((r >> 32) & 0x3FFu));
            memcpy(raw + 2 * i, &c, 2);
        }
    }
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, raw, es * (size_t)n));
    free(raw);
}

/* ---- a small problem: two parameters of one kind, F32 gradients -------------------------------- */

#define NP 2
static const int64_t kNumel[NP] = {300, 200}; /* a partial last block of 128 in each */

typedef struct {
    fp8amp_context ctx;
    fp8amp_optimizer opt;
    fp8amp_dtype pdt;
    fp8amp_tensor p[NP], g[NP];
    fp8amp_scaling pm[NP];
} problem;

/* level O1: F32 parameters; O2: scaled F16 parameters (F16 metas); O3: E4M3 parameters with metas. */
static void problem_init(problem *pb, fp8amp_device dev, fp8amp_opt_level level) {
    memset(pb, 0, sizeof *pb);
    pb->ctx = make_context(dev);
    pb->pdt = level == FP8AMP_OPT_LEVEL_O1 ? FP8AMP_DTYPE_F32 : level == FP8AMP_OPT_LEVEL_O2 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_E4M3;
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(level, &d));
    EXPECT_OK(fp8amp_optimizer_create(pb->ctx, &d, &pb->opt));
    for (int k = 0; k < NP; ++k) {
        pb->p[k] = make_tensor(pb->ctx, pb->pdt, 1, &kNumel[k]);
        pb->g[k] = make_tensor(pb->ctx, FP8AMP_DTYPE_F32, 1, &kNumel[k]);
        if (pb->pdt == FP8AMP_DTYPE_F32) {
            upload_random(pb->p[k], kNumel[k]);
        } else {
            fp8amp_recipe r;
            EXPECT_OK(fp8amp_recipe_init_default(&r));
            r.amax_history_len = 8;
            EXPECT_OK(fp8amp_scaling_create(pb->ctx, &r, pb->pdt, &pb->pm[k]));
            EXPECT_OK(fp8amp_tensor_set_scaling(pb->p[k], pb->pm[k]));
            upload_random_codes(pb->p[k], pb->pdt, kNumel[k]);
        }
        EXPECT_OK(fp8amp_optimizer_add_param(pb->opt, pb->p[k], pb->g[k]));
    }
}

static void problem_steps(problem *pb, int steps) {
    for (int s = 0; s < steps; ++s) {
        for (int k = 0; k < NP; ++k) upload_random(pb->g[k], kNumel[k]);
        EXPECT_OK(fp8amp_optimizer_step(pb->opt, NULL));
        int32_t found = 1;
        EXPECT_OK(fp8amp_optimizer_get_found_inf(pb->opt, &found));
        assert_int_equal(found, 0);
    }
}

static void problem_free(problem *pb) {
    EXPECT_OK(fp8amp_optimizer_destroy(pb->opt));
    for (int k = 0; k < NP; ++k) {
        EXPECT_OK(fp8amp_tensor_destroy(pb->p[k]));
        EXPECT_OK(fp8amp_tensor_destroy(pb->g[k]));
        EXPECT_OK(fp8amp_scaling_destroy(pb->pm[k]));
    }
    EXPECT_OK(fp8amp_context_destroy(pb->ctx));
}

/* ---- defect 1: the optimizer and its parameters' metas ------------------------------------------ */

/* The reproducer: bind, add, unbind, destroy the meta, then save / load / step. Before the
 * fix save read the freed meta (valgrind: invalid reads in Optimizer::serialize) and returned
 * SUCCESS; load wrote it. */
static void test_unbound_and_destroyed_meta_is_refused(void **state) {
    require_variant(state);
    for (int level = FP8AMP_OPT_LEVEL_O2; level <= FP8AMP_OPT_LEVEL_O3; ++level) {
        problem pb;
        problem_init(&pb, variant_device(state), (fp8amp_opt_level)level);
        problem_steps(&pb, 2);
        size_t n = 0;
        unsigned char *before = save_all(pb.opt, &n);
        EXPECT_OK(fp8amp_tensor_set_scaling(pb.p[1], NULL));
        EXPECT_OK(fp8amp_scaling_destroy(pb.pm[1]));
        pb.pm[1] = NULL;
        size_t size = 0;
        EXPECT_STATUS(fp8amp_optimizer_save(pb.opt, NULL, 0, &size), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "parameter #1"));
        unsigned char *buf = xmalloc(n);
        EXPECT_STATUS(fp8amp_optimizer_save(pb.opt, buf, n, &size), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_STATUS(fp8amp_optimizer_load(pb.opt, before, n), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "parameter #1"));
        for (int k = 0; k < NP; ++k) upload_random(pb.g[k], kNumel[k]);
        EXPECT_STATUS(fp8amp_optimizer_step(pb.opt, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
        int64_t step = -1;
        EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
        assert_int_equal(step, 2);
        free(buf), free(before);
        problem_free(&pb); /* destroys the optimizer, which held the last reference to the meta */
    }
}

/* Re-bound to another meta (of the same recipe): refused likewise; bound back to the meta of
 * add_param, everything works again and nothing changed meanwhile. A gradient's meta re-bound is
 * refused by the step only (save and load do not use it). */
static void test_rebound_meta_is_refused_until_restored(void **state) {
    require_variant(state);
    problem pb;
    problem_init(&pb, variant_device(state), FP8AMP_OPT_LEVEL_O3);
    size_t n = 0, n2 = 0;
    unsigned char *before = save_all(pb.opt, &n); /* before any step: re-binding restores the slot exactly */
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.amax_history_len = 8;
    fp8amp_scaling other;
    EXPECT_OK(fp8amp_scaling_create(pb.ctx, &r, FP8AMP_DTYPE_E4M3, &other));
    EXPECT_OK(fp8amp_tensor_set_scaling(pb.p[0], other));
    size_t size = 0;
    EXPECT_STATUS(fp8amp_optimizer_save(pb.opt, NULL, 0, &size), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "parameter #0"));
    EXPECT_STATUS(fp8amp_optimizer_load(pb.opt, before, n), FP8AMP_ERROR_INVALID_ARGUMENT);
    for (int k = 0; k < NP; ++k) upload_random(pb.g[k], kNumel[k]);
    EXPECT_STATUS(fp8amp_optimizer_step(pb.opt, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* the other meta saw nothing */
    float scale = 0, amax = -1;
    EXPECT_OK(fp8amp_scaling_get(other, &scale, NULL, &amax));
    assert_true(scale == 1.0f && amax == 0.0f);
    /* back to the original binding */
    EXPECT_OK(fp8amp_tensor_set_scaling(pb.p[0], pb.pm[0]));
    unsigned char *again = save_all(pb.opt, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(before, again, n);
    EXPECT_OK(fp8amp_optimizer_load(pb.opt, before, n));
    problem_steps(&pb, 1);

    /* an FP8 gradient's meta, re-bound and destroyed: the step refuses, save and load work */
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O1, &d));
    fp8amp_optimizer opt;
    EXPECT_OK(fp8amp_optimizer_create(pb.ctx, &d, &opt));
    const int64_t n64 = 64;
    fp8amp_tensor p = make_tensor(pb.ctx, FP8AMP_DTYPE_F32, 1, &n64), g = make_tensor(pb.ctx, FP8AMP_DTYPE_E4M3, 1, &n64);
    fp8amp_scaling gm;
    EXPECT_OK(fp8amp_scaling_create(pb.ctx, &r, FP8AMP_DTYPE_E4M3, &gm));
    EXPECT_OK(fp8amp_tensor_set_scaling(g, gm));
    upload_random(p, n64);
    upload_random_codes(g, FP8AMP_DTYPE_E4M3, n64);
    EXPECT_OK(fp8amp_optimizer_add_param(opt, p, g));
    EXPECT_OK(fp8amp_tensor_set_scaling(g, NULL));
    EXPECT_OK(fp8amp_scaling_destroy(gm));
    EXPECT_STATUS(fp8amp_optimizer_step(opt, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "parameter #0"));
    size_t on = 0;
    unsigned char *ock = save_all(opt, &on);
    EXPECT_OK(fp8amp_optimizer_load(opt, ock, on));
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_tensor_destroy(p));
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_scaling_destroy(other));
    free(ock), free(before), free(again);
    problem_free(&pb);
}

/* ---- defect 6: hyperparameters of the step and of the desc ------------------------------------- */

static void test_step_refuses_out_of_domain_arguments(void **state) {
    require_variant(state);
    problem pb;
    problem_init(&pb, variant_device(state), FP8AMP_OPT_LEVEL_O2);
    problem_steps(&pb, 1);
    size_t n = 0, n2 = 0;
    unsigned char *before = save_all(pb.opt, &n);
    for (int k = 0; k < NP; ++k) upload_random(pb.g[k], kNumel[k]);
    const float bad_lr[3] = {-INFINITY, INFINITY, NAN};
    for (int i = 0; i < 3; ++i) {
        fp8amp_adam_step_args a;
        EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
        a.lr = bad_lr[i];
        EXPECT_STATUS(fp8amp_optimizer_step(pb.opt, &a), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "args->lr"));
    }
    const float bad_inv[5] = {-INFINITY, INFINITY, NAN, -1.0f, -(float)test_rng_uniform(1e-30, 1e30)};
    for (int i = 0; i < 5; ++i) {
        fp8amp_adam_step_args a;
        EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
        a.grad_scale_inv = bad_inv[i];
        EXPECT_STATUS(fp8amp_optimizer_step(pb.opt, &a), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "args->grad_scale_inv"));
    }
    unsigned char *after = save_all(pb.opt, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(before, after, n);
    /* a finite negative lr still means the desc's, and grad_scale_inv 0 is a valid (null) update */
    fp8amp_adam_step_args a;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
    a.lr = -(float)test_rng_uniform(1, 1e30);
    EXPECT_OK(fp8amp_optimizer_step(pb.opt, &a));
    a.grad_scale_inv = 0.0f;
    EXPECT_OK(fp8amp_optimizer_step(pb.opt, &a));
    int64_t step = 0;
    EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
    assert_int_equal(step, 3);
    free(before), free(after);
    problem_free(&pb);
}

static void test_create_refuses_out_of_domain_desc(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_adam_desc_init_default(&d));
    const float nonneg_bad[5] = {-1.0f, -INFINITY, INFINITY, NAN, -FLT_MIN};
    const float beta_bad[6] = {-0.1f, 1.0f, 1.5f, INFINITY, -INFINITY, NAN};
    enum { LR, EPS, WD, MGN, B1, B2, FIELDS };
    const char *names[FIELDS] = {"desc->lr", "desc->eps", "desc->weight_decay", "desc->max_grad_norm", "desc->beta1", "desc->beta2"};
    for (int f = 0; f < FIELDS; ++f) {
        const int nvals = f < B1 ? 5 : 6;
        for (int i = 0; i < nvals; ++i) {
            fp8amp_adam_desc bad = d;
            const float x = f < B1 ? nonneg_bad[i] : beta_bad[i];
            float *field[FIELDS] = {&bad.lr, &bad.eps, &bad.weight_decay, &bad.max_grad_norm, &bad.beta1, &bad.beta2};
            *field[f] = x;
            fp8amp_optimizer opt = NULL;
            EXPECT_STATUS(fp8amp_optimizer_create(ctx, &bad, &opt), FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_non_null(strstr(fp8amp_last_error_message(), names[f]));
            assert_null(opt);
        }
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- defect 5: checkpoints with a valid checksum and an invalid value --------------------------- */




static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; ++k) p[k] = (unsigned char)(v >> (8 * k));
}

static void put_f32(unsigned char *p, float x) { put_u32(p, f32_bits(x)); }

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static void fix_crc(unsigned char *blob, size_t n) { put_u32(blob + n - 4, crc32_bitwise(blob, n - 4)); }

/* Offsets of the fields of one parameter in a checkpoint (docs/api.md 12.6). 0: absent. */
typedef struct {
    int32_t dtype;
    int64_t numel, nscales;
    size_t meta_flag, data, slot, meta, history, m, m_scale, v, v_scale, master, master_scale;
    uint32_t history_len;
} ck_param;

typedef struct {
    int m8, v16, master;
    ck_param p[NP];
} ck_layout;

enum {
    kAdamw = 24, kLr = 28, kBeta1 = 32, kBeta2 = 36, kEps = 40, kWd = 44, kMaximize = 48, kMgn = 68,
    kStep = 72, kFoundInf = 80, kGradNorm = 84, kCount = 88, kFirstParam = 92
};
/* offsets inside a meta's state */
enum { kMetaScale = 0, kMetaScaleInv = 4, kMetaAmax = 8, kMetaHead = 12, kMetaLen = 20, kMetaStats = 44, kMetaSize = 76 };

static ck_layout parse(const unsigned char *b, size_t n) {
    ck_layout L;
    memset(&L, 0, sizeof L);
    L.m8 = (int32_t)get_u32(b + 52) == FP8AMP_DTYPE_E4M3;
    L.v16 = (int32_t)get_u32(b + 56) == FP8AMP_DTYPE_F16;
    L.master = (int32_t)get_u32(b + 60) == FP8AMP_DTYPE_F16;
    assert_int_equal(get_u32(b + kCount), NP);
    size_t at = kFirstParam;
    for (int k = 0; k < NP; ++k) {
        ck_param *q = &L.p[k];
        const int32_t pd = (int32_t)get_u32(b + at), ndim = (int32_t)get_u32(b + at + 8);
        at += 12;
        q->dtype = pd;
        q->numel = 1;
        for (int32_t d = 0; d < ndim; ++d, at += 8) q->numel *= (int64_t)get_u64(b + at);
        q->meta_flag = at;
        const int has_meta = b[at] != 0;
        at += 1;
        q->nscales = (int64_t)get_u64(b + at);
        at += 8;
        q->data = at;
        at += (size_t)q->numel * dtype_size(pd);
        if (has_meta) {
            q->slot = at;
            q->meta = at + 4;
            q->history_len = get_u32(b + q->meta + kMetaLen);
            q->history = q->meta + kMetaSize;
            at = q->history + 4u * q->history_len;
        }
        q->m = at;
        at += (size_t)q->numel * (L.m8 ? 1 : 4);
        if (L.m8) q->m_scale = at, at += 4u * (size_t)q->nscales;
        q->v = at;
        at += (size_t)q->numel * (L.v16 ? 2 : 4);
        if (L.v16) q->v_scale = at, at += 4u * (size_t)q->nscales;
        if (L.master) {
            q->master = at, at += 2u * (size_t)q->numel;
            q->master_scale = at, at += 4u * (size_t)q->nscales;
        }
    }
    assert_int_equal(at + 4, n);
    return L;
}

/* A crafted value: where to write (an offset into the blob), what (1, 4 or 8 bytes), and what the
 * refusal's message must name. */
typedef struct {
    const char *what;
    size_t at;
    int bytes;
    uint64_t value;
    const char *names; /* a substring of the message */
    const char *names2; /* another one (the parameter), or NULL */
} crafted;

static void apply(unsigned char *blob, const crafted *c) {
    if (c->bytes == 1) blob[c->at] = (unsigned char)c->value;
    else if (c->bytes == 2) blob[c->at] = (unsigned char)c->value, blob[c->at + 1] = (unsigned char)(c->value >> 8);
    else if (c->bytes == 4) put_u32(blob + c->at, (uint32_t)c->value);
    else put_u64(blob + c->at, c->value);
}

#define MAXC 96
typedef struct {
    crafted c[MAXC];
    int n;
} crafted_list;

static void add(crafted_list *l, const char *what, size_t at, int bytes, uint64_t value, const char *names, const char *names2) {
    assert_true(l->n < MAXC);
    assert_true(at != 0);
    crafted c = {what, at, bytes, value, names, names2};
    l->c[l->n++] = c;
}

static uint64_t fbits(float x) { return f32_bits(x); }

/* A random element index in [0, n). */
static size_t pick(int64_t n) { return (size_t)(test_rng_u64() % (uint64_t)n); }

static void invalid_values(const ck_layout *L, const unsigned char *ck, crafted_list *l) {
    /* header */
    add(l, "adamw 2", kAdamw, 4, 2, "adamw", NULL);
    add(l, "maximize -1", kMaximize, 4, 0xFFFFFFFFu, "maximize", NULL);
    add(l, "lr NaN", kLr, 4, fbits(NAN), "lr", NULL);
    add(l, "lr -inf", kLr, 4, fbits(-INFINITY), "lr", NULL);
    add(l, "lr negative", kLr, 4, fbits(-(float)test_rng_uniform(1e-6, 1)), "lr", NULL);
    add(l, "beta1 1", kBeta1, 4, fbits(1.0f), "beta1", NULL);
    add(l, "beta2 NaN", kBeta2, 4, fbits(NAN), "beta2", NULL);
    add(l, "eps -inf", kEps, 4, fbits(-INFINITY), "eps", NULL);
    add(l, "weight_decay +inf", kWd, 4, fbits(INFINITY), "weight_decay", NULL);
    add(l, "max_grad_norm NaN", kMgn, 4, fbits(NAN), "max_grad_norm", NULL);
    add(l, "step -1", kStep, 8, (uint64_t)-1, "step", NULL);
    add(l, "step INT64_MAX", kStep, 8, (uint64_t)INT64_MAX, "step", NULL);
    add(l, "step 2^62 + 1", kStep, 8, ((uint64_t)1 << 62) + 1, "step", NULL);
    add(l, "found_inf 2", kFoundInf, 4, 2, "found_inf", NULL);
    add(l, "grad_norm negative", kGradNorm, 4, fbits(-(float)test_rng_uniform(1e-3, 10)), "grad_norm", NULL);
    add(l, "grad_norm NaN with found_inf 0", kGradNorm, 4, fbits(NAN), "grad_norm", NULL);
    /* per parameter */
    static const char *who[NP] = {"parameter #0", "parameter #1"};
    for (int k = 0; k < NP; ++k) {
        const ck_param *q = &L->p[k];
        const char *w = who[k];
        if (q->meta) {
            add(l, "meta flag 2", q->meta_flag, 1, 2, "meta flag", w);
            add(l, "slot +inf", q->slot, 4, fbits(INFINITY), "scale_inv", w);
            add(l, "slot 0", q->slot, 4, 0, "scale_inv", w);
            add(l, "slot negative", q->slot, 4, fbits(-1.0f), "scale_inv", w);
            add(l, "slot NaN", q->slot, 4, fbits(NAN), "scale_inv", w);
            add(l, "meta scale 0", q->meta + kMetaScale, 4, 0, "scale", w);
            add(l, "meta scale +inf", q->meta + kMetaScale, 4, fbits(INFINITY), "scale", w);
            add(l, "meta scale subnormal", q->meta + kMetaScale, 4, 1, "scale", w);
            add(l, "meta scale_inv +inf", q->meta + kMetaScaleInv, 4, fbits(INFINITY), "scale_inv", w);
            add(l, "meta scale_inv 0", q->meta + kMetaScaleInv, 4, 0, "scale_inv", w);
            add(l, "meta scale_inv NaN", q->meta + kMetaScaleInv, 4, fbits(NAN), "scale_inv", w);
            {
                const float scale = bits_f32(get_u32(ck + q->meta + kMetaScale));
                add(l, "meta scale_inv not 1/scale", q->meta + kMetaScaleInv, 4, fbits(2.0f / scale), "scale_inv", w);
            }
            add(l, "meta amax NaN", q->meta + kMetaAmax, 4, 0x7FC00000u, "amax", w);
            add(l, "meta amax negative", q->meta + kMetaAmax, 4, fbits(-1.0f), "amax", w);
            add(l, "meta head = length", q->meta + kMetaHead, 4, q->history_len, "head", w);
            add(l, "meta stats_enabled 2", q->meta + kMetaStats, 4, 2, "stats_enabled", w);
            add(l, "history NaN", q->history + 4 * pick(q->history_len), 4, 0x7FC00001u, "history", w);
            add(l, "history negative", q->history + 4 * pick(q->history_len), 4, fbits(-0.5f), "history", w);
        }
        {
            /* the parameter's own values: a NaN and an infinity in its dtype (E4M3 has no infinity) */
            const size_t es = dtype_size(q->dtype);
            const size_t at = q->data + es * pick(q->numel), at2 = q->data + es * pick(q->numel);
            switch (q->dtype) {
            case FP8AMP_DTYPE_F32:
                add(l, "param NaN", at, 4, 0x7FC00000u, "parameter element", w);
                add(l, "param -inf", at2, 4, fbits(-INFINITY), "parameter element", w);
                break;
            case FP8AMP_DTYPE_BF16:
                add(l, "param NaN", at, 2, 0x7FC1, "parameter element", w);
                add(l, "param +inf", at2, 2, 0x7F80, "parameter element", w);
                break;
            case FP8AMP_DTYPE_F16:
                add(l, "param NaN", at, 2, 0x7E00, "parameter element", w);
                add(l, "param -inf", at2, 2, 0xFC00, "parameter element", w);
                break;
            case FP8AMP_DTYPE_E4M3:
                add(l, "param NaN", at, 1, 0x7F, "parameter element", w);
                add(l, "param -NaN", at2, 1, 0xFF, "parameter element", w);
                break;
            default: /* E5M2 */
                add(l, "param NaN", at, 1, 0x7E, "parameter element", w);
                add(l, "param +inf", at2, 1, 0x7C, "parameter element", w);
                break;
            }
        }
        if (L->m8) {
            add(l, "m code NaN", q->m + pick(q->numel), 1, 0x7F, "m element", w);
            add(l, "m code -NaN", q->m + pick(q->numel), 1, 0xFF, "m element", w);
            add(l, "m block scale 3", q->m_scale + 4 * pick(q->nscales), 4, fbits(3.0f), "m block scale", w);
            add(l, "m block scale 0", q->m_scale + 4 * pick(q->nscales), 4, 0, "m block scale", w);
            add(l, "m block scale +inf", q->m_scale + 4 * pick(q->nscales), 4, fbits(INFINITY), "m block scale", w);
            add(l, "m block scale 2^127", q->m_scale + 4 * pick(q->nscales), 4, fbits(0x1p127f), "m block scale", w);
        } else {
            add(l, "m NaN", q->m + 4 * pick(q->numel), 4, fbits(NAN), "m element", w);
            add(l, "m -inf", q->m + 4 * pick(q->numel), 4, fbits(-INFINITY), "m element", w);
        }
        if (L->v16) {
            add(l, "v code negative", q->v + 2 * pick(q->numel), 2, 0xBC00, "v element", w);
            add(l, "v code +inf", q->v + 2 * pick(q->numel), 2, 0x7C00, "v element", w);
            add(l, "v code NaN", q->v + 2 * pick(q->numel), 2, 0x7E00, "v element", w);
            add(l, "v block scale -1", q->v_scale + 4 * pick(q->nscales), 4, fbits(-1.0f), "v block scale", w);
            add(l, "v block scale NaN", q->v_scale + 4 * pick(q->nscales), 4, fbits(NAN), "v block scale", w);
        } else {
            add(l, "v negative", q->v + 4 * pick(q->numel), 4, fbits(-(float)test_rng_uniform(1e-8, 1)), "v element", w);
            add(l, "v NaN", q->v + 4 * pick(q->numel), 4, fbits(NAN), "v element", w);
            add(l, "v +inf", q->v + 4 * pick(q->numel), 4, fbits(INFINITY), "v element", w);
        }
        if (L->master) {
            add(l, "master code +inf", q->master + 2 * pick(q->numel), 2, 0x7C00, "master element", w);
            add(l, "master code NaN", q->master + 2 * pick(q->numel), 2, 0xFE01, "master element", w);
            add(l, "master block scale subnormal", q->master_scale + 4 * pick(q->nscales), 4, 0x00400000u, "master block scale", w);
        }
    }
}

/* Values whose codes and scales are each valid but whose product overflows float32: element 0 of the
 * last parameter set to the format's largest code in a block of scale_inv 2^126. Two writes each. */
static void overflow_pair(const ck_layout *L, crafted_list *l, int which) {
    const ck_param *q = &L->p[NP - 1];
    if (which == 0 && L->m8) {
        add(l, "m 448 * 2^126 (code)", q->m, 1, 0x7E, "m element", "parameter #1");
        add(l, "m 448 * 2^126 (scale)", q->m_scale, 4, fbits(0x1p126f), "m element", "parameter #1");
    } else if (which == 1 && L->v16) {
        add(l, "v 65504 * 2^126 (code)", q->v, 2, 0x7BFF, "v element", "parameter #1");
        add(l, "v 65504 * 2^126 (scale)", q->v_scale, 4, fbits(0x1p126f), "v element", "parameter #1");
    } else if (which == 2 && L->master) {
        add(l, "master 65504 * 2^126 (code)", q->master, 2, 0x7BFF, "master element", "parameter #1");
        add(l, "master 65504 * 2^126 (scale)", q->master_scale, 4, fbits(0x1p126f), "master element", "parameter #1");
    }
}

static void expect_refused(fp8amp_optimizer opt, const unsigned char *ck, size_t n, const crafted *c, int count,
                           const unsigned char *state_before, size_t state_n) {
    unsigned char *bad = xmemdup(ck, n);
    for (int i = 0; i < count; ++i) apply(bad, &c[i]);
    fix_crc(bad, n);
    const fp8amp_status st = fp8amp_optimizer_load(opt, bad, n);
    if (st != FP8AMP_ERROR_CORRUPT_DATA || !strstr(fp8amp_last_error_message(), c[0].names) ||
        (c[0].names2 && !strstr(fp8amp_last_error_message(), c[0].names2)))
        print_error("crafted '%s' (offset %zu): load returned %s, message '%s' (expected CORRUPT_DATA naming '%s'%s%s)\n",
                    c[0].what, c[0].at, fp8amp_status_name(st), st ? fp8amp_last_error_message() : "",
                    c[0].names, c[0].names2 ? " and " : "", c[0].names2 ? c[0].names2 : "");
    assert_int_equal(st, FP8AMP_ERROR_CORRUPT_DATA);
    assert_non_null(strstr(fp8amp_last_error_message(), c[0].names));
    if (c[0].names2) assert_non_null(strstr(fp8amp_last_error_message(), c[0].names2));
    size_t n2 = 0;
    unsigned char *after = save_all(opt, &n2);
    assert_int_equal(n2, state_n);
    assert_memory_equal(after, state_before, state_n);
    free(after), free(bad);
}

static void load_invalid_values_case(fp8amp_device dev, fp8amp_opt_level level) {
    problem a, b;
    problem_init(&a, dev, level);
    problem_steps(&a, 3);
    size_t n = 0, nb = 0;
    unsigned char *ck = save_all(a.opt, &n);
    const ck_layout L = parse(ck, n);
    problem_init(&b, dev, level);
    problem_steps(&b, 1);
    unsigned char *b_before = save_all(b.opt, &nb);

    crafted_list l;
    l.n = 0;
    invalid_values(&L, ck, &l);
    int refused = 0;
    for (int i = 0; i < l.n; ++i, ++refused) expect_refused(b.opt, ck, n, &l.c[i], 1, b_before, nb);
    for (int which = 0; which < 3; ++which) {
        crafted_list pair;
        pair.n = 0;
        overflow_pair(&L, &pair, which);
        if (pair.n) expect_refused(b.opt, ck, n, pair.c, pair.n, b_before, nb), ++refused;
    }
    print_message("level O%d: %d crafted checkpoints with a valid checksum refused, the optimizer unchanged\n",
                  (int)level, refused);

    /* found_inf 1 with a finite norm: a skipped step records NaN */
    {
        crafted c[2] = {{"found_inf 1, finite norm", kFoundInf, 4, 1, "grad_norm", NULL},
                        {"", kGradNorm, 4, fbits(1.0f), "grad_norm", NULL}};
        expect_refused(b.opt, ck, n, c, 2, b_before, nb);
    }

    /* Valid edge values still load: the largest step count, an infinite norm (an overflowing sum of
     * squares of finite gradients), found_inf 1 with NaN, the smallest block scales, v = 0. */
    const crafted ok[] = {
        {"step 2^62", kStep, 8, (uint64_t)1 << 62, "", NULL},
        {"grad_norm +inf", kGradNorm, 4, fbits(INFINITY), "", NULL},
        {"lr 0", kLr, 4, 0, "", NULL},
        {"v = 0", L.p[0].v, L.v16 ? 2 : 4, 0, "", NULL},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; ++i) {
        unsigned char *good = xmemdup(ck, n);
        apply(good, &ok[i]);
        if (L.m8) put_f32(good + L.p[1].m_scale, 0x1p-126f);
        if (L.v16) put_f32(good + L.p[1].v_scale, 0x1p-126f);
        fix_crc(good, n);
        EXPECT_OK(fp8amp_optimizer_load(b.opt, good, n));
        size_t n3 = 0;
        unsigned char *now = save_all(b.opt, &n3);
        assert_int_equal(n3, n);
        assert_memory_equal(now, good, n); /* the state is exactly what was loaded */
        free(now), free(good);
    }
    {
        unsigned char *good = xmemdup(ck, n);
        put_u32(good + kFoundInf, 1);
        put_f32(good + kGradNorm, NAN);
        fix_crc(good, n);
        EXPECT_OK(fp8amp_optimizer_load(b.opt, good, n));
        free(good);
    }
    /* and the unmodified checkpoint, after which both go on alike */
    EXPECT_OK(fp8amp_optimizer_load(b.opt, ck, n));
    size_t n4 = 0;
    unsigned char *now = save_all(b.opt, &n4);
    assert_memory_equal(now, ck, n);
    free(now), free(ck), free(b_before);
    problem_free(&a);
    problem_free(&b);
}

static void test_load_refuses_invalid_values_behind_a_valid_checksum(void **state) {
    require_variant(state);
    for (int level = FP8AMP_OPT_LEVEL_O1; level <= FP8AMP_OPT_LEVEL_O3; ++level)
        load_invalid_values_case(variant_device(state), (fp8amp_opt_level)level);
}

/* After loading the largest step count, a step still works (no overflow: the step count is checked
 * at load so that its increments cannot overflow) and gives finite parameters. */
static void test_step_after_largest_step_count(void **state) {
    require_variant(state);
    problem pb;
    problem_init(&pb, variant_device(state), FP8AMP_OPT_LEVEL_O1);
    problem_steps(&pb, 1);
    size_t n = 0;
    unsigned char *ck = save_all(pb.opt, &n);
    put_u64(ck + kStep, (uint64_t)1 << 62);
    fix_crc(ck, n);
    EXPECT_OK(fp8amp_optimizer_load(pb.opt, ck, n));
    problem_steps(&pb, 2);
    int64_t step = 0;
    EXPECT_OK(fp8amp_optimizer_get_step(pb.opt, &step));
    assert_true(step == ((int64_t)1 << 62) + 2);
    for (int k = 0; k < NP; ++k) {
        float *x = xmalloc(sizeof(float) * (size_t)kNumel[k]);
        EXPECT_OK(fp8amp_tensor_copy_to_host(pb.p[k], x, sizeof(float) * (size_t)kNumel[k]));
        for (int64_t i = 0; i < kNumel[k]; ++i) assert_true(isfinite(x[i]));
        free(x);
    }
    free(ck);
    problem_free(&pb);
}

/* The loss scaler's state is not in the optimizer's checkpoint (it is saved beside it with
 * fp8amp_grad_scaler_get_state): its restore, fp8amp_grad_scaler_set_state, and its desc refuse every
 * value outside their domains, naming the field, and leave the scaler as it was. */
static void test_grad_scaler_state_domains(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_grad_scaler_desc sd;
    EXPECT_OK(fp8amp_grad_scaler_desc_init_default(&sd));
    sd.growth_interval = 2 + (int32_t)(test_rng_u64() % 100);
    sd.hysteresis = 2 + (int32_t)(test_rng_u64() % 5);
    fp8amp_grad_scaler sc = NULL;
    EXPECT_OK(fp8amp_grad_scaler_create(ctx, &sd, &sc));
    const fp8amp_grad_scaler_state good = {(float)test_rng_uniform(1, 1e6), sd.growth_interval - 1, sd.hysteresis};
    EXPECT_OK(fp8amp_grad_scaler_set_state(sc, &good));
    const float bad_scale[6] = {NAN, INFINITY, -INFINITY, 0.0f, -1.0f, FLT_MIN / 2};
    for (int i = 0; i < 6; ++i) {
        fp8amp_grad_scaler_state st = good;
        st.scale = bad_scale[i];
        EXPECT_STATUS(fp8amp_grad_scaler_set_state(sc, &st), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "scale"));
    }
    const int32_t bad_tracker[3] = {-1, sd.growth_interval, INT32_MIN};
    for (int i = 0; i < 3; ++i) {
        fp8amp_grad_scaler_state st = good;
        st.growth_tracker = bad_tracker[i];
        EXPECT_STATUS(fp8amp_grad_scaler_set_state(sc, &st), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "growth_tracker"));
    }
    const int32_t bad_hyst[3] = {-1, sd.hysteresis + 1, INT32_MAX};
    for (int i = 0; i < 3; ++i) {
        fp8amp_grad_scaler_state st = good;
        st.hysteresis_left = bad_hyst[i];
        EXPECT_STATUS(fp8amp_grad_scaler_set_state(sc, &st), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "hysteresis_left"));
    }
    fp8amp_grad_scaler_state back;
    EXPECT_OK(fp8amp_grad_scaler_get_state(sc, &back));
    assert_memory_equal(&back, &good, sizeof good);
    /* the desc */
    struct {
        const char *name;
        float init_scale, growth, backoff;
        int32_t interval, hyst;
    } bad_desc[] = {
        {"init_scale", NAN, 2, 0.5f, 10, 1},      {"init_scale", INFINITY, 2, 0.5f, 10, 1},
        {"init_scale", FLT_MIN / 4, 2, 0.5f, 10, 1}, {"growth_factor", 1, 1.0f, 0.5f, 10, 1},
        {"growth_factor", 1, NAN, 0.5f, 10, 1},   {"growth_factor", 1, INFINITY, 0.5f, 10, 1},
        {"backoff_factor", 1, 2, 0.0f, 10, 1},    {"backoff_factor", 1, 2, 1.0f, 10, 1},
        {"backoff_factor", 1, 2, NAN, 10, 1},     {"growth_interval", 1, 2, 0.5f, 0, 1},
        {"hysteresis", 1, 2, 0.5f, 10, -1},
    };
    for (size_t i = 0; i < sizeof bad_desc / sizeof bad_desc[0]; ++i) {
        fp8amp_grad_scaler_desc d = sd;
        d.init_scale = bad_desc[i].init_scale;
        d.growth_factor = bad_desc[i].growth;
        d.backoff_factor = bad_desc[i].backoff;
        d.growth_interval = bad_desc[i].interval;
        d.hysteresis = bad_desc[i].hyst;
        fp8amp_grad_scaler other = NULL;
        EXPECT_STATUS(fp8amp_grad_scaler_create(ctx, &d, &other), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), bad_desc[i].name));
        assert_null(other);
    }
    EXPECT_OK(fp8amp_grad_scaler_destroy(sc));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_unbound_and_destroyed_meta_is_refused),
        DEVICE_TESTS(test_rebound_meta_is_refused_until_restored),
        DEVICE_TESTS(test_step_refuses_out_of_domain_arguments),
        DEVICE_TESTS(test_create_refuses_out_of_domain_desc),
        DEVICE_TESTS(test_load_refuses_invalid_values_behind_a_valid_checksum),
        DEVICE_TESTS(test_step_after_largest_step_count),
        DEVICE_TESTS(test_grad_scaler_state_domains),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
