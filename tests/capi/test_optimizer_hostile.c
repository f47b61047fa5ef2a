/* Hostile inputs to the optimizer (issue 22, defects 1 and 6), through the public API only:
 *   - a parameter's scaling meta unbound (and its handle destroyed) or re-bound to another meta after
 *     fp8amp_optimizer_add_param: step, save and load refuse (INVALID_ARGUMENT, naming the parameter)
 *     instead of reading or writing a freed meta, and work again once the original binding is back;
 *   - step arguments and desc fields out of their documented domains (lr = -inf, NaN, inf, negative
 *     grad_scale_inv, betas outside [0, 1), ...): INVALID_ARGUMENT, nothing changed;
 * Every test runs on the CPU and on CUDA (skipped without a GPU) on fresh random data. */
#include <float.h>
#include <math.h>

#include "test_util.h"

/* ---- small helpers ------------------------------------------------------------------------------ */

static unsigned char *save_all(fp8amp_optimizer opt, size_t *size) {
    EXPECT_OK(fp8amp_optimizer_save(opt, NULL, 0, size));
    unsigned char *buf = xmalloc(*size);
    size_t written = 0;
    EXPECT_OK(fp8amp_optimizer_save(opt, buf, *size, &written));
    assert_int_equal(written, *size);
    return buf;
}

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

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_unbound_and_destroyed_meta_is_refused),
        DEVICE_TESTS(test_rebound_meta_is_refused_until_restored),
        DEVICE_TESTS(test_step_refuses_out_of_domain_arguments),
        DEVICE_TESTS(test_create_refuses_out_of_domain_desc),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
