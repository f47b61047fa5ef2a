/* Per-parameter master copies and the master's rounding (issue 20), through the public API:
 *   - a tiny update (far below half an F16 ulp of the master): NEAREST leaves every master byte as it
 *     was; STOCHASTIC moves each element by 0 or one ulp, and the mean move is the exact update within
 *     a 6-sigma bound;
 *   - stochastic rounding is deterministic: the same seed gives identical checkpoints, another seed
 *     other bytes, and two steps with the same update round different elements;
 *   - one optimizer holding parameters with and without a master (fp8amp_optimizer_add_param_ex)
 *     gives bit for bit what two optimizers give (nearest and stochastic rounding); with
 *     max_grad_norm the norm is global over all of them;
 *   - checkpoints: 0.3.0's format (version 1) when nothing new is used, version 2 with per-parameter
 *     masters, a round trip, and a checkpoint refused by an optimizer with other master choices;
 *   - a parameter without a master (BF16, F16) is its own value of record: STOCHASTIC rounds its
 *     codes the same way (a tiny update's mean move exact, NEAREST unchanged), with the CPU's bytes
 *     on CUDA in both of its kernels;
 *   - master_init: the master starts from the given full-precision values, not the E4M3 codes;
 *     bad master_init values refused;
 *   - bad input: a master for an F32 parameter, no master for an E4M3 one, an unknown master dtype,
 *     a bad struct_size, an unknown rounding: their statuses, and nothing changed.
 * Every test runs on the CPU and on CUDA (skipped without a GPU) on fresh random data. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

static float f16_value(uint16_t c) { return (float)decode_ref(format_of(FP8AMP_DTYPE_F16), c); }

/* Parses a one-parameter checkpoint's master: the last arrays before the CRC are the master codes
 * (n F16) and its block scales (nscales floats; docs/api.md 12.6). Writes code * scale_inv. */
static void master_of(fp8amp_optimizer opt, int64_t n, int64_t nscales, float *out) {
    size_t size = 0;
    unsigned char *ck = save_all(opt, &size);
    const unsigned char *scales = ck + size - 4 - 4 * (size_t)nscales;
    const unsigned char *codes = scales - 2 * (size_t)n;
    for (int64_t i = 0; i < n; ++i) {
        uint16_t c;
        float inv;
        memcpy(&c, codes + 2 * i, 2);
        memcpy(&inv, scales + 4 * (i / 128), 4);
        out[i] = f16_value(c) * inv;
    }
    free(ck);
}

static uint32_t ck_version(fp8amp_optimizer opt) {
    size_t size = 0;
    unsigned char *ck = save_all(opt, &size);
    uint32_t v;
    memcpy(&v, ck + 8, 4);
    free(ck);
    return v;
}

static void upload_f32(fp8amp_tensor t, const float *v, int64_t n) {
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, v, sizeof(float) * (size_t)n));
}

/* BF16 tensor holding `values` rounded to BF16 (so that the master starts exactly there). */
static fp8amp_tensor bf16_tensor(fp8amp_context ctx, const float *values, int64_t n) {
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, &n);
    uint16_t *h = xmalloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; ++i) h[i] = (uint16_t)(f32_bits(values[i]) >> 16); /* truncation: exact BF16 */
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, h, 2 * (size_t)n));
    free(h);
    return t;
}

static int32_t g_block = 128; /* make_opt's state_block_size */

static fp8amp_optimizer make_opt(fp8amp_context ctx, fp8amp_opt_level level, int32_t rounding, uint32_t seed, float lr,
                                 float max_norm) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(level, &d));
    d.lr = lr;
    d.eps = 0.0f;
    d.weight_decay = 0.0f;
    d.master_rounding = rounding;
    d.rounding_seed = seed;
    d.max_grad_norm = max_norm;
    d.state_block_size = g_block;
    fp8amp_optimizer opt = NULL;
    EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
    return opt;
}

/* ---- tiny updates ---------------------------------------------------------------------------- */

enum { TN = 8192 };

/* A stochastically rounded tiny update (-lr, far below half an ulp) of TN values with `mant` stored
 * fraction bits: each moved by 0 or one ulp down, some moved, the mean move the exact update within
 * 6 sigma (sigma from the per-element variance ulp * lr). */
static void check_tiny_moves(const char *what, const float *before, const float *after, int mant, float lr) {
    double sum = 0.0, var = 0.0;
    int moved = 0;
    for (int i = 0; i < TN; ++i) {
        const double ulp = ldexp(1.0, (int)floor(log2((double)before[i])) - mant);
        const double d = (double)after[i] - (double)before[i];
        if (!(d == 0.0 || d == -ulp)) fail_msg("%s, element %d: %.9g -> %.9g (ulp %.3g)", what, i, (double)before[i], (double)after[i], ulp);
        moved += d != 0.0;
        sum += d;
        var += ulp * lr;
    }
    const double mean = sum / TN, sigma = sqrt(var) / TN;
    print_message("%s, stochastic: %d of %d moved, mean %.3g (exact %.3g, sigma %.2g)\n", what, moved, TN, mean, -(double)lr, sigma);
    assert_true(moved > 0);
    assert_true(fabs(mean + (double)lr) <= 6.0 * sigma);
}

static void test_tiny_update_nearest_vs_stochastic(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t n = TN;
    float *w = xmalloc(sizeof(float) * TN), *g = xmalloc(sizeof(float) * TN);
    float *before = xmalloc(sizeof(float) * TN), *after = xmalloc(sizeof(float) * TN);
    for (int i = 0; i < TN; ++i) {
        w[i] = (float)test_rng_uniform(0.51, 0.99); /* inside one binade: moving down is one 2^-11 ulp */
        g[i] = (float)test_rng_uniform(0.5, 2.0); /* positive: the first step's update is -lr exactly */
    }
    const float lr = 0x1p-16f; /* half an F16 ulp in [0.5, 1) is 2^-12: 16 times larger */
    for (int sr = 0; sr < 2; ++sr) {
        fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, sr ? FP8AMP_MASTER_ROUND_STOCHASTIC : FP8AMP_MASTER_ROUND_NEAREST,
                                        (uint32_t)test_rng_u64(), lr, 0.0f);
        fp8amp_tensor p = bf16_tensor(ctx, w, n), gt = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
        EXPECT_OK(fp8amp_optimizer_add_param(opt, p, gt));
        upload_f32(gt, g, n);
        master_of(opt, n, TN / 128, before);
        EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
        master_of(opt, n, TN / 128, after);
        if (!sr) {
            for (int i = 0; i < TN; ++i) assert_true(f32_bits(after[i]) == f32_bits(before[i]));
            assert_int_equal(ck_version(opt), 1); /* nothing new used: 0.3.0's format */
        } else {
            check_tiny_moves("F16 master", before, after, 10, lr);
            assert_int_equal(ck_version(opt), 2); /* the rounding is recorded */
        }
        EXPECT_OK(fp8amp_optimizer_destroy(opt));
        EXPECT_OK(fp8amp_tensor_destroy(p));
        EXPECT_OK(fp8amp_tensor_destroy(gt));
    }
    free(w), free(g), free(before), free(after);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_stochastic_rounding_is_deterministic(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t n = 1000;
    float w[1000], g[1000], m1[1000], m2[1000], m3[1000];
    for (int i = 0; i < n; ++i) {
        w[i] = (float)test_rng_uniform(0.5, 0.99);
        g[i] = (float)test_rng_uniform(0.5, 2.0);
    }
    const uint32_t seed = (uint32_t)test_rng_u64();
    unsigned char *ck[3];
    size_t size[3];
    float *moved_first = xmalloc(sizeof(float) * 1000);
    for (int r = 0; r < 3; ++r) {
        fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_STOCHASTIC, r == 2 ? seed ^ 1u : seed,
                                        0x1p-14f, 0.0f);
        fp8amp_tensor p = bf16_tensor(ctx, w, n), gt = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
        EXPECT_OK(fp8amp_optimizer_add_param(opt, p, gt));
        upload_f32(gt, g, n);
        master_of(opt, n, 8, m1);
        EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
        master_of(opt, n, 8, m2);
        EXPECT_OK(fp8amp_optimizer_step(opt, NULL)); /* same gradient: almost the same update */
        master_of(opt, n, 8, m3);
        if (r == 0) {
            /* the elements that moved in step 1 and in step 2 are not the same set: the step is in the key */
            int differ = 0;
            for (int i = 0; i < n; ++i) differ += (m2[i] != m1[i]) != (m3[i] != m2[i]);
            assert_true(differ > 0);
            memcpy(moved_first, m2, sizeof(float) * 1000);
        }
        ck[r] = save_all(opt, &size[r]);
        EXPECT_OK(fp8amp_optimizer_destroy(opt));
        EXPECT_OK(fp8amp_tensor_destroy(p));
        EXPECT_OK(fp8amp_tensor_destroy(gt));
    }
    assert_int_equal(size[0], size[1]);
    assert_memory_equal(ck[0], ck[1], size[0]); /* same seed: same bytes */
    assert_int_equal(size[0], size[2]);
    /* another seed: the same checkpoint but for the seed field (and the CRC) would mean same rounding */
    assert_true(memcmp(ck[0] + 100, ck[2] + 100, size[0] - 104) != 0);
    for (int r = 0; r < 3; ++r) free(ck[r]);
    free(moved_first);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- mixed masters in one optimizer ------------------------------------------------------------ */

/* Parameters: A BF16 with an F16 master, B BF16 without, C F32 without. */
#define MN 3
static const int64_t kMixNumel[MN] = {700, 333, 129};

typedef struct {
    fp8amp_tensor p[MN], g[MN];
} mixset;

static void mix_make(fp8amp_context ctx, mixset *s, float *const init[MN]) {
    for (int k = 0; k < MN; ++k) {
        s->p[k] = k == 2 ? make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &kMixNumel[k]) : bf16_tensor(ctx, init[k], kMixNumel[k]);
        if (k == 2) upload_f32(s->p[k], init[k], kMixNumel[k]);
        s->g[k] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &kMixNumel[k]);
    }
}

static void mix_free(mixset *s) {
    for (int k = 0; k < MN; ++k) {
        EXPECT_OK(fp8amp_tensor_destroy(s->p[k]));
        EXPECT_OK(fp8amp_tensor_destroy(s->g[k]));
    }
}

static void add_with(fp8amp_optimizer opt, fp8amp_tensor p, fp8amp_tensor g, int32_t master) {
    fp8amp_param_desc pd;
    EXPECT_OK(fp8amp_param_desc_init(&pd, sizeof pd));
    assert_int_equal(pd.master_dtype, FP8AMP_MASTER_DEFAULT);
    pd.master_dtype = master;
    EXPECT_OK(fp8amp_optimizer_add_param_ex(opt, p, g, &pd));
}

static void test_mixed_masters_equal_two_optimizers(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    float *init[MN], *grads[MN];
    for (int k = 0; k < MN; ++k) {
        init[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        grads[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        for (int64_t i = 0; i < kMixNumel[k]; ++i) init[k][i] = (float)test_rng_uniform(-0.05, 0.05);
    }
    /* blocks of 128 and 512, and per tensor */
    for (int sr = 0; sr < 6; ++sr) {
        g_block = sr / 2 == 0 ? 128 : sr / 2 == 1 ? 512 : 0;
        const int32_t rounding = sr % 2 ? FP8AMP_MASTER_ROUND_STOCHASTIC : FP8AMP_MASTER_ROUND_NEAREST;
        const uint32_t seed = (uint32_t)test_rng_u64();
        mixset one, two, pad;
        mix_make(ctx, &one, init);
        mix_make(ctx, &two, init);
        mix_make(ctx, &pad, init);
        /* one optimizer, O2 desc: A with a master by add_param_ex, B explicitly without, C by default */
        fp8amp_optimizer mixed = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, rounding, seed, 1e-3f, 0.0f);
        add_with(mixed, one.p[0], one.g[0], FP8AMP_DTYPE_F16);
        add_with(mixed, one.p[1], one.g[1], FP8AMP_NO_MASTER);
        EXPECT_OK(fp8amp_optimizer_add_param_ex(mixed, one.p[2], one.g[2], NULL));
        /* two optimizers: O3 for A, O2 for B and C, each at its index in the mixed one (the random bits
         * are drawn per parameter index: stochastic rounding takes the masters, and the parameters
         * without one); o2's index 0 is a stand-in for A, stepped and not compared */
        fp8amp_optimizer o3 = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, rounding, seed, 1e-3f, 0.0f);
        fp8amp_optimizer o2 = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, rounding, seed, 1e-3f, 0.0f);
        EXPECT_OK(fp8amp_optimizer_add_param(o3, two.p[0], two.g[0]));
        EXPECT_OK(fp8amp_optimizer_add_param(o2, pad.p[0], pad.g[0]));
        EXPECT_OK(fp8amp_optimizer_add_param(o2, two.p[1], two.g[1]));
        EXPECT_OK(fp8amp_optimizer_add_param(o2, two.p[2], two.g[2]));
        for (int step = 0; step < 6; ++step) {
            for (int k = 0; k < MN; ++k) {
                for (int64_t i = 0; i < kMixNumel[k]; ++i) grads[k][i] = (float)test_rng_uniform(-1, 1) * (k == 1 ? 1e-3f : 1.0f);
                upload_f32(one.g[k], grads[k], kMixNumel[k]);
                upload_f32(two.g[k], grads[k], kMixNumel[k]);
                upload_f32(pad.g[k], grads[k], kMixNumel[k]);
            }
            EXPECT_OK(fp8amp_optimizer_step(mixed, NULL));
            EXPECT_OK(fp8amp_optimizer_step(o3, NULL));
            EXPECT_OK(fp8amp_optimizer_step(o2, NULL));
            for (int k = 0; k < MN; ++k) {
                const size_t nb = tensor_bytes(one.p[k]);
                unsigned char *a = xmalloc(nb), *b = xmalloc(nb);
                EXPECT_OK(fp8amp_tensor_copy_to_host(one.p[k], a, nb));
                EXPECT_OK(fp8amp_tensor_copy_to_host(two.p[k], b, nb));
                assert_memory_equal(a, b, nb);
                free(a), free(b);
            }
        }
        /* the master of A is the O3 optimizer's: the mixed checkpoint's A section ends like o3's */
        assert_int_equal(ck_version(mixed), 2);
        assert_int_equal(ck_version(o3), sr % 2 ? 2 : 1);
        int64_t st = 0;
        EXPECT_OK(fp8amp_optimizer_get_step(mixed, &st));
        assert_int_equal(st, 6);
        EXPECT_OK(fp8amp_optimizer_destroy(mixed));
        EXPECT_OK(fp8amp_optimizer_destroy(o3));
        EXPECT_OK(fp8amp_optimizer_destroy(o2));
        mix_free(&one);
        mix_free(&two);
        mix_free(&pad);
    }
    g_block = 128;
    for (int k = 0; k < MN; ++k) free(init[k]), free(grads[k]);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* max_grad_norm over parameters with and without a master: the norm is global (float64 sum of all
 * squares), and the step equals an unclipped twin given the gradients times the clip coefficient. */
static void test_mixed_masters_clip_globally(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    float *init[MN], *grads[MN];
    for (int k = 0; k < MN; ++k) {
        init[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        grads[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        for (int64_t i = 0; i < kMixNumel[k]; ++i) init[k][i] = (float)test_rng_uniform(-0.05, 0.05);
    }
    mixset one, two;
    mix_make(ctx, &one, init);
    mix_make(ctx, &two, init);
    const float max_norm = 0.5f;
    fp8amp_optimizer clipped = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, max_norm);
    fp8amp_optimizer twin = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    for (int k = 0; k < MN; ++k) {
        const int32_t master = k == 0 ? FP8AMP_DTYPE_F16 : FP8AMP_NO_MASTER;
        add_with(clipped, one.p[k], one.g[k], master);
        add_with(twin, two.p[k], two.g[k], master);
    }
    for (int step = 0; step < 4; ++step) {
        double sumsq = 0.0;
        for (int k = 0; k < MN; ++k)
            for (int64_t i = 0; i < kMixNumel[k]; ++i) {
                grads[k][i] = (float)test_rng_uniform(-0.1, 0.1);
                sumsq += (double)grads[k][i] * grads[k][i];
            }
        for (int k = 0; k < MN; ++k) upload_f32(one.g[k], grads[k], kMixNumel[k]);
        EXPECT_OK(fp8amp_optimizer_step(clipped, NULL));
        float norm = 0.0f;
        EXPECT_OK(fp8amp_optimizer_get_grad_norm(clipped, &norm));
        assert_true(fabs((double)norm - sqrt(sumsq)) <= 1e-6 * sqrt(sumsq));
        assert_true(norm > max_norm); /* the clip is active */
        float coef = max_norm / (norm + 1e-6f);
        if (coef > 1.0f) coef = 1.0f;
        for (int k = 0; k < MN; ++k) {
            for (int64_t i = 0; i < kMixNumel[k]; ++i) grads[k][i] = grads[k][i] * coef;
            upload_f32(two.g[k], grads[k], kMixNumel[k]);
        }
        EXPECT_OK(fp8amp_optimizer_step(twin, NULL));
        for (int k = 0; k < MN; ++k) {
            const size_t nb = tensor_bytes(one.p[k]);
            unsigned char *a = xmalloc(nb), *b = xmalloc(nb);
            EXPECT_OK(fp8amp_tensor_copy_to_host(one.p[k], a, nb));
            EXPECT_OK(fp8amp_tensor_copy_to_host(two.p[k], b, nb));
            assert_memory_equal(a, b, nb);
            free(a), free(b);
        }
    }
    EXPECT_OK(fp8amp_optimizer_destroy(clipped));
    EXPECT_OK(fp8amp_optimizer_destroy(twin));
    mix_free(&one);
    mix_free(&two);
    for (int k = 0; k < MN; ++k) free(init[k]), free(grads[k]);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- checkpoints ------------------------------------------------------------------------------- */

static void test_mixed_masters_checkpoint(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    float *init[MN], *grads[MN];
    for (int k = 0; k < MN; ++k) {
        init[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        grads[k] = xmalloc(sizeof(float) * (size_t)kMixNumel[k]);
        for (int64_t i = 0; i < kMixNumel[k]; ++i) {
            init[k][i] = (float)test_rng_uniform(-0.05, 0.05);
            grads[k][i] = (float)test_rng_uniform(-1, 1);
        }
    }
    mixset a, b, c;
    mix_make(ctx, &a, init);
    mix_make(ctx, &b, init);
    mix_make(ctx, &c, init);
    fp8amp_optimizer oa = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_STOCHASTIC, 7, 1e-3f, 0.0f);
    fp8amp_optimizer ob = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 5e-3f, 0.0f);
    fp8amp_optimizer oc = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    for (int k = 0; k < MN; ++k) {
        add_with(oa, a.p[k], a.g[k], k == 0 ? FP8AMP_DTYPE_F16 : FP8AMP_NO_MASTER);
        add_with(ob, b.p[k], b.g[k], k == 0 ? FP8AMP_DTYPE_F16 : FP8AMP_NO_MASTER);
        /* c: B gets the master instead of A */
        add_with(oc, c.p[k], c.g[k], k == 1 ? FP8AMP_DTYPE_F16 : FP8AMP_NO_MASTER);
        upload_f32(a.g[k], grads[k], kMixNumel[k]);
        upload_f32(b.g[k], grads[k], kMixNumel[k]);
    }
    for (int s = 0; s < 3; ++s) EXPECT_OK(fp8amp_optimizer_step(oa, NULL));
    size_t n = 0, n2 = 0, nc = 0;
    unsigned char *ck = save_all(oa, &n);
    uint32_t version;
    memcpy(&version, ck + 8, 4);
    assert_int_equal(version, 2);
    /* other master choices: refused, nothing changed */
    unsigned char *before = save_all(oc, &nc);
    EXPECT_STATUS(fp8amp_optimizer_load(oc, ck, n), FP8AMP_ERROR_DTYPE_MISMATCH);
    unsigned char *after = save_all(oc, &n2);
    assert_int_equal(nc, n2);
    assert_memory_equal(before, after, nc);
    free(after);
    /* round trip: ob takes the rounding, seed, lr from the checkpoint and saves the same bytes */
    EXPECT_OK(fp8amp_optimizer_load(ob, ck, n));
    unsigned char *again = save_all(ob, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(ck, again, n);
    free(again);
    /* both go on identically (the stochastic rounding included) */
    for (int k = 0; k < MN; ++k) {
        upload_f32(a.g[k], init[k], kMixNumel[k]);
        upload_f32(b.g[k], init[k], kMixNumel[k]);
    }
    EXPECT_OK(fp8amp_optimizer_step(oa, NULL));
    EXPECT_OK(fp8amp_optimizer_step(ob, NULL));
    unsigned char *ca = save_all(oa, &n), *cb = save_all(ob, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(ca, cb, n);
    free(ca), free(cb), free(ck), free(before);
    EXPECT_OK(fp8amp_optimizer_destroy(oa));
    EXPECT_OK(fp8amp_optimizer_destroy(ob));
    EXPECT_OK(fp8amp_optimizer_destroy(oc));
    mix_free(&a), mix_free(&b), mix_free(&c);
    for (int k = 0; k < MN; ++k) free(init[k]), free(grads[k]);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A checkpoint in 0.3.0's format (version 1) still loads. It is made here from a version 2 one by
 * hand, following docs/api.md 12.6 -- drop the rounding fields after the desc and each parameter's
 * has-master byte, set the version, the size and the CRC --, so the reader of version 1 is checked
 * against the documented layout, not against this library's writer. Loaded into an optimizer that
 * rounds to nearest, it is saved back as exactly those bytes; an optimizer whose desc has no master
 * but whose parameters each have one (add_param_ex) loads it too; one whose parameters have none
 * refuses it (DTYPE_MISMATCH), unchanged. */
enum { VN0 = 300, VN1 = 129 };

static void test_version1_checkpoint_loads(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t numel[2] = {VN0, VN1};
    float *w[2], *g[2];
    fp8amp_tensor p[4][2], gt[4][2];
    for (int k = 0; k < 2; ++k) {
        w[k] = xmalloc(sizeof(float) * (size_t)numel[k]);
        g[k] = xmalloc(sizeof(float) * (size_t)numel[k]);
        for (int64_t i = 0; i < numel[k]; ++i) {
            w[k][i] = (float)test_rng_uniform(-0.1, 0.1);
            g[k][i] = (float)test_rng_uniform(-1, 1);
        }
        for (int o = 0; o < 4; ++o) {
            p[o][k] = bf16_tensor(ctx, w[k], numel[k]);
            gt[o][k] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &numel[k]);
        }
    }
    fp8amp_optimizer src = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_STOCHASTIC, (uint32_t)test_rng_u64(), 1e-3f, 0.0f);
    fp8amp_optimizer near = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-2f, 0.0f);
    fp8amp_optimizer ex = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-2f, 0.0f);
    fp8amp_optimizer none = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-2f, 0.0f);
    for (int k = 0; k < 2; ++k) {
        EXPECT_OK(fp8amp_optimizer_add_param(src, p[0][k], gt[0][k]));
        EXPECT_OK(fp8amp_optimizer_add_param(near, p[1][k], gt[1][k]));
        add_with(ex, p[2][k], gt[2][k], FP8AMP_DTYPE_F16);
        EXPECT_OK(fp8amp_optimizer_add_param(none, p[3][k], gt[3][k]));
        upload_f32(gt[0][k], g[k], numel[k]);
    }
    for (int s = 0; s < 3; ++s) EXPECT_OK(fp8amp_optimizer_step(src, NULL));
    size_t n2 = 0;
    unsigned char *v2 = save_all(src, &n2);
    uint32_t version;
    memcpy(&version, v2 + 8, 4);
    assert_int_equal(version, 2);
    /* convert */
    unsigned char *v1 = xmalloc(n2);
    size_t at = 0, from = 0;
    memcpy(v1, v2, 72); /* header (24 bytes) and desc (48) */
    at = from = 72;
    from += 8; /* master_rounding, rounding_seed */
    memcpy(v1 + at, v2 + from, 20); /* step, found_inf, grad_norm, count */
    at += 20, from += 20;
    for (int k = 0; k < 2; ++k) {
        const size_t n = (size_t)numel[k], ns = (n + 127) / 128;
        memcpy(v1 + at, v2 + from, 21); /* dtypes, ndim, shape, has-meta */
        at += 21, from += 21;
        assert_int_equal(v2[from], 1); /* has-master */
        from += 1;
        const size_t rest = 8 + 2 * n + (n + 4 * ns) + (2 * n + 4 * ns) + (2 * n + 4 * ns);
        memcpy(v1 + at, v2 + from, rest);
        at += rest, from += rest;
    }
    assert_int_equal(from, n2 - 4);
    const size_t n1 = at + 4;
    put_u32(v1 + 8, 1);
    for (int b = 0; b < 8; ++b) v1[16 + b] = (unsigned char)((uint64_t)n1 >> (8 * b));
    put_u32(v1 + n1 - 4, crc32_bitwise(v1, n1 - 4));
    /* refused where the parameters have no master: nothing changed */
    size_t nb = 0, na = 0;
    unsigned char *before = save_all(none, &nb);
    EXPECT_STATUS(fp8amp_optimizer_load(none, v1, n1), FP8AMP_ERROR_DTYPE_MISMATCH);
    unsigned char *after = save_all(none, &na);
    assert_int_equal(na, nb);
    assert_memory_equal(before, after, nb);
    /* loads; saved back byte for byte */
    EXPECT_OK(fp8amp_optimizer_load(near, v1, n1));
    size_t nn = 0;
    unsigned char *back = save_all(near, &nn);
    assert_int_equal(nn, n1);
    assert_memory_equal(back, v1, n1);
    EXPECT_OK(fp8amp_optimizer_load(ex, v1, n1));
    int64_t st = 0;
    EXPECT_OK(fp8amp_optimizer_get_step(ex, &st));
    assert_int_equal(st, 3);
    free(v1), free(v2), free(back), free(before), free(after);
    EXPECT_OK(fp8amp_optimizer_destroy(src));
    EXPECT_OK(fp8amp_optimizer_destroy(near));
    EXPECT_OK(fp8amp_optimizer_destroy(ex));
    EXPECT_OK(fp8amp_optimizer_destroy(none));
    for (int k = 0; k < 2; ++k) {
        for (int o = 0; o < 4; ++o) {
            EXPECT_OK(fp8amp_tensor_destroy(p[o][k]));
            EXPECT_OK(fp8amp_tensor_destroy(gt[o][k]));
        }
        free(w[k]), free(g[k]);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- CPU and CUDA: the same bytes ---------------------------------------------------------------- */

/* Mixed masters and stochastic rounding on the CPU and on CUDA from the same bytes: after 3 steps
 * the checkpoints are identical but for the gradient norm (a float64 sum in another order: within
 * 2^-20 relative, as test_optimizer.c's expect_same_checkpoint) -- the random bits depend on
 * (seed, step, parameter, element) only, not on the grid. Blocks of 128 and 256 and per tensor;
 * BF16 and E4M3 (bound to a meta) parameters with a master, BF16 and F32 ones without; long enough
 * that every warp of the grid takes several blocks. CUDA only (skipped without a GPU). */
#define XN 4
/* Destroys the CPU (d = 0) and CUDA (d = 1) sides of a comparison: each side's optimizer, its n
 * parameters and gradients (p and g: [2][n] arrays, row d the side's) and its meta. */
static void free_twins(fp8amp_optimizer opt[2], fp8amp_tensor *p, fp8amp_tensor *g, int n, fp8amp_scaling meta[2]) {
    for (int d = 0; d < 2; ++d) {
        EXPECT_OK(fp8amp_optimizer_destroy(opt[d]));
        for (int k = 0; k < n; ++k) {
            EXPECT_OK(fp8amp_tensor_destroy(p[d * n + k]));
            EXPECT_OK(fp8amp_tensor_destroy(g[d * n + k]));
        }
        EXPECT_OK(fp8amp_scaling_destroy(meta[d]));
    }
}

static void test_cpu_cuda_identical_mixed_masters(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const int64_t numel[XN] = {test_small() ? 20001 : 700001, 4477, 1000, 129};
    const fp8amp_dtype pdt[XN] = {FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32};
    const int32_t master[XN] = {FP8AMP_DTYPE_F16, FP8AMP_DTYPE_F16, FP8AMP_NO_MASTER, FP8AMP_NO_MASTER};
    const int32_t blocks[3] = {128, 256, 0};
    fp8amp_context ctx[2] = {make_context(cpu_device()), make_context(cuda_device(0))};
    for (int bi = 0; bi < 3; ++bi)
        for (int sr = 0; sr < 2; ++sr) {
            const uint32_t seed = (uint32_t)test_rng_u64();
            fp8amp_optimizer opt[2];
            fp8amp_tensor p[2][XN], g[2][XN];
            fp8amp_scaling meta[2] = {NULL, NULL};
            const float e4_scale = 64.0f;
            for (int d = 0; d < 2; ++d) {
                fp8amp_adam_desc desc;
                EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &desc));
                desc.lr = 1e-3f;
                desc.state_block_size = blocks[bi];
                desc.master_rounding = sr ? FP8AMP_MASTER_ROUND_STOCHASTIC : FP8AMP_MASTER_ROUND_NEAREST;
                desc.rounding_seed = seed;
                EXPECT_OK(fp8amp_optimizer_create(ctx[d], &desc, &opt[d]));
                fp8amp_recipe r;
                EXPECT_OK(fp8amp_recipe_init_default(&r));
                EXPECT_OK(fp8amp_scaling_create(ctx[d], &r, FP8AMP_DTYPE_E4M3, &meta[d]));
                EXPECT_OK(fp8amp_scaling_set_scale(meta[d], e4_scale));
                for (int k = 0; k < XN; ++k) {
                    p[d][k] = make_tensor(ctx[d], pdt[k], 1, &numel[k]);
                    g[d][k] = make_tensor(ctx[d], FP8AMP_DTYPE_F32, 1, &numel[k]);
                    if (pdt[k] == FP8AMP_DTYPE_E4M3) EXPECT_OK(fp8amp_tensor_set_scaling(p[d][k], meta[d]));
                }
            }
            /* the same parameter bytes on both */
            for (int k = 0; k < XN; ++k) {
                const size_t nb = tensor_bytes(p[0][k]);
                unsigned char *raw = xmalloc(nb);
                for (int64_t i = 0; i < numel[k]; ++i) {
                    const float v = (float)test_rng_uniform(-0.05, 0.05);
                    if (pdt[k] == FP8AMP_DTYPE_F32) memcpy(raw + 4 * i, &v, 4);
                    else if (pdt[k] == FP8AMP_DTYPE_BF16) {
                        const uint16_t h = (uint16_t)(f32_bits(v) >> 16);
                        memcpy(raw + 2 * i, &h, 2);
                    } else {
                        raw[i] = (unsigned char)encode_fp8_ref(format_of(FP8AMP_DTYPE_E4M3), (double)v * e4_scale);
                    }
                }
                for (int d = 0; d < 2; ++d) {
                    EXPECT_OK(fp8amp_tensor_copy_from_host(p[d][k], raw, nb));
                    add_with(opt[d], p[d][k], g[d][k], master[k]);
                }
                free(raw);
            }
            for (int step = 0; step < 3; ++step)
                for (int k = 0; k < XN; ++k) {
                    float *gv = xmalloc(sizeof(float) * (size_t)numel[k]);
                    for (int64_t i = 0; i < numel[k]; ++i) gv[i] = (float)test_rng_uniform(-1, 1);
                    upload_f32(g[0][k], gv, numel[k]);
                    upload_f32(g[1][k], gv, numel[k]);
                    free(gv);
                    if (k == XN - 1) {
                        EXPECT_OK(fp8amp_optimizer_step(opt[0], NULL));
                        EXPECT_OK(fp8amp_optimizer_step(opt[1], NULL));
                    }
                }
            enum { kNormAt = 92 }; /* version 2: 8 bytes of rounding fields before the status */
            size_t na, nb;
            unsigned char *sa = save_all(opt[0], &na), *sb = save_all(opt[1], &nb);
            assert_int_equal(na, nb);
            uint32_t version;
            memcpy(&version, sa + 8, 4);
            assert_int_equal(version, 2);
            float norm_a, norm_b;
            memcpy(&norm_a, sa + kNormAt, 4), memcpy(&norm_b, sb + kNormAt, 4);
            assert_true(isfinite(norm_a) && isfinite(norm_b));
            assert_true(fabs((double)norm_a - (double)norm_b) <= ldexp(fabs((double)norm_a), -20));
            memset(sa + kNormAt, 0, 4), memset(sb + kNormAt, 0, 4);
            if (memcmp(sa, sb, na - 4) != 0) {
                size_t at = 0;
                while (sa[at] == sb[at]) ++at;
                fail_msg("block %d, %s: the checkpoints differ first at byte %zu of %zu", blocks[bi],
                         sr ? "stochastic" : "nearest", at, na);
            }
            free(sa), free(sb);
            free_twins(opt, &p[0][0], &g[0][0], XN, meta);
        }
    EXPECT_OK(fp8amp_context_destroy(ctx[0]));
    EXPECT_OK(fp8amp_context_destroy(ctx[1]));
}

/* ---- parameters without a master: their own value of record -------------------------------------- */

/* Host copy of a 16-bit parameter's values (BF16 or unscaled F16). */
static void values16(fp8amp_tensor t, fp8amp_dtype dt, int64_t n, float *out) {
    uint16_t *h = xmalloc(2 * (size_t)n);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, h, 2 * (size_t)n));
    for (int64_t i = 0; i < n; ++i) {
        if (dt == FP8AMP_DTYPE_BF16) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&out[i], &u, 4);
        } else {
            out[i] = f16_value(h[i]);
        }
    }
    free(h);
}

/* A BF16 or F16 parameter without a master (O2's layout, the PyTorch front's O1/O2 weights) and an
 * update 16 times below half its ulp: NEAREST leaves every code as it was, STOCHASTIC moves each
 * element by 0 or one ulp down and the mean move is the exact update within 6 sigma. */
static void test_tiny_update_param_without_master(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t n = TN;
    float *w = xmalloc(sizeof(float) * TN), *g = xmalloc(sizeof(float) * TN);
    float *before = xmalloc(sizeof(float) * TN), *after = xmalloc(sizeof(float) * TN);
    for (int di = 0; di < 2; ++di) {
        const fp8amp_dtype dt = di ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_BF16;
        const int mant = di ? 10 : 7;                              /* stored fraction bits */
        const float lr = di ? 0x1p-16f : 0x1p-13f;                 /* half an ulp in [0.5, 1) / 16 */
        for (int i = 0; i < TN; ++i) {
            w[i] = (float)test_rng_uniform(0.51, 0.99);
            g[i] = (float)test_rng_uniform(0.5, 2.0); /* positive: the first step's update is -lr exactly */
        }
        for (int sr = 0; sr < 2; ++sr) {
            fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O2,
                                            sr ? FP8AMP_MASTER_ROUND_STOCHASTIC : FP8AMP_MASTER_ROUND_NEAREST,
                                            (uint32_t)test_rng_u64(), lr, 0.0f);
            fp8amp_tensor p = make_tensor(ctx, dt, 1, &n), gt = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
            fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
            upload_f32(src, w, n);
            EXPECT_OK(fp8amp_cast(ctx, src, p));
            EXPECT_OK(fp8amp_optimizer_add_param(opt, p, gt)); /* O2: no master */
            upload_f32(gt, g, n);
            values16(p, dt, n, before);
            EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
            values16(p, dt, n, after);
            if (sr) {
                check_tiny_moves(di ? "F16 without a master" : "BF16 without a master", before, after, mant, lr);
            } else {
                for (int i = 0; i < TN; ++i)
                    if (after[i] != before[i]) fail_msg("nearest, element %d: %.9g -> %.9g", i, (double)before[i], (double)after[i]);
            }
            EXPECT_OK(fp8amp_optimizer_destroy(opt));
            EXPECT_OK(fp8amp_tensor_destroy(p));
            EXPECT_OK(fp8amp_tensor_destroy(gt));
            EXPECT_OK(fp8amp_tensor_destroy(src));
        }
    }
    free(w), free(g), free(before), free(after);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Stochastically rounded parameters without masters give the CPU's bytes on CUDA: BF16 parameters
 * with BF16 gradients at O1 and O2 (the fast kernel's pairs), and beside them a scaled and an unscaled
 * F16 parameter (the generic kernel), over three steps, in odd sizes. */
static void test_cpu_cuda_identical_param_rounding(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    enum { PN = 4 };
    const int64_t numel[PN] = {test_small() ? 20001 : 300001, 1000, 4477, 129};
    fp8amp_context ctx[2] = {make_context(cpu_device()), make_context(cuda_device(0))};
    for (int cfg = 0; cfg < 3; ++cfg) {
        /* cfg 0: O2, all BF16 (fast); 1: O1, all BF16 (fast); 2: O2 with F16 parameters (generic) */
        const fp8amp_opt_level level = cfg == 1 ? FP8AMP_OPT_LEVEL_O1 : FP8AMP_OPT_LEVEL_O2;
        const fp8amp_dtype pdt[PN] = {FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, cfg == 2 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_BF16,
                                      cfg == 2 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_BF16};
        const int scaled[PN] = {0, 0, cfg == 2, 0};
        const uint32_t seed = (uint32_t)test_rng_u64();
        fp8amp_optimizer opt[2];
        fp8amp_tensor p[2][PN], g[2][PN];
        fp8amp_scaling meta[2];
        for (int d = 0; d < 2; ++d) {
            fp8amp_adam_desc desc;
            EXPECT_OK(fp8amp_opt_level_adam_config(level, &desc));
            desc.lr = 1e-3f;
            desc.master_rounding = FP8AMP_MASTER_ROUND_STOCHASTIC;
            desc.rounding_seed = seed;
            EXPECT_OK(fp8amp_optimizer_create(ctx[d], &desc, &opt[d]));
            fp8amp_recipe r;
            EXPECT_OK(fp8amp_recipe_init_default(&r));
            EXPECT_OK(fp8amp_scaling_create(ctx[d], &r, FP8AMP_DTYPE_F16, &meta[d]));
            EXPECT_OK(fp8amp_scaling_set_scale(meta[d], 256.0f));
            for (int k = 0; k < PN; ++k) {
                p[d][k] = make_tensor(ctx[d], pdt[k], 1, &numel[k]);
                g[d][k] = make_tensor(ctx[d], FP8AMP_DTYPE_BF16, 1, &numel[k]);
                if (scaled[k]) EXPECT_OK(fp8amp_tensor_set_scaling(p[d][k], meta[d]));
            }
        }
        for (int k = 0; k < PN; ++k) {
            float *v = xmalloc(sizeof(float) * (size_t)numel[k]);
            for (int64_t i = 0; i < numel[k]; ++i) v[i] = (float)test_rng_uniform(-0.05, 0.05);
            for (int d = 0; d < 2; ++d) {
                fp8amp_tensor src = make_tensor(ctx[d], FP8AMP_DTYPE_F32, 1, &numel[k]);
                upload_f32(src, v, numel[k]);
                if (scaled[k])
                    EXPECT_OK(fp8amp_quantize(ctx[d], src, p[d][k]));
                else
                    EXPECT_OK(fp8amp_cast(ctx[d], src, p[d][k]));
                EXPECT_OK(fp8amp_tensor_destroy(src));
                EXPECT_OK(fp8amp_optimizer_add_param(opt[d], p[d][k], g[d][k]));
            }
            free(v);
        }
        for (int step = 0; step < 3; ++step) {
            for (int k = 0; k < PN; ++k) {
                uint16_t *gv = xmalloc(2 * (size_t)numel[k]);
                test_fill_bf16(gv, (size_t)numel[k], 1.0);
                for (int d = 0; d < 2; ++d) EXPECT_OK(fp8amp_tensor_copy_from_host(g[d][k], gv, 2 * (size_t)numel[k]));
                free(gv);
            }
            for (int d = 0; d < 2; ++d) EXPECT_OK(fp8amp_optimizer_step(opt[d], NULL));
            for (int k = 0; k < PN; ++k) {
                const size_t nb = tensor_bytes(p[0][k]);
                unsigned char *a = xmalloc(nb), *b = xmalloc(nb);
                EXPECT_OK(fp8amp_tensor_copy_to_host(p[0][k], a, nb));
                EXPECT_OK(fp8amp_tensor_copy_to_host(p[1][k], b, nb));
                if (memcmp(a, b, nb) != 0) {
                    size_t at = 0;
                    while (a[at] == b[at]) ++at;
                    fail_msg("configuration %d, step %d, parameter %d: CPU and CUDA differ first at byte %zu of %zu",
                             cfg, step, k, at, nb);
                }
                free(a), free(b);
            }
        }
        free_twins(opt, &p[0][0], &g[0][0], PN, meta);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx[0]));
    EXPECT_OK(fp8amp_context_destroy(ctx[1]));
}

/* ---- bad input ----------------------------------------------------------------------------------- */

static void test_bad_master_choices(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t n = 200;
    float v[200];
    for (int i = 0; i < n; ++i) v[i] = (float)test_rng_uniform(-1, 1);
    fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    fp8amp_tensor f32p = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), g = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    upload_f32(f32p, v, n);
    fp8amp_tensor e4 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_scaling meta;
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4, meta));
    fp8amp_param_desc pd;
    EXPECT_OK(fp8amp_param_desc_init(&pd, sizeof pd));
    pd.master_dtype = FP8AMP_DTYPE_F16;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, f32p, g, &pd), FP8AMP_ERROR_DTYPE_MISMATCH);
    pd.master_dtype = FP8AMP_NO_MASTER;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_DTYPE_MISMATCH);
    pd.master_dtype = FP8AMP_DTYPE_BF16;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, f32p, g, &pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    pd.master_dtype = 77;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, f32p, g, &pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    pd.master_dtype = FP8AMP_NO_MASTER;
    pd.struct_size = 2;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, f32p, g, &pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_param_desc_init(NULL, sizeof pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    int32_t count = -1;
    EXPECT_OK(fp8amp_optimizer_num_params(opt, &count));
    assert_int_equal(count, 0);
    size_t bytes0 = 0, bytes1 = 0;
    EXPECT_OK(fp8amp_optimizer_state_bytes(opt, &bytes0));
    /* the refused calls changed nothing: a good call now works, and registers one parameter */
    pd.struct_size = sizeof pd;
    EXPECT_OK(fp8amp_optimizer_add_param_ex(opt, f32p, g, &pd));
    EXPECT_OK(fp8amp_optimizer_num_params(opt, &count));
    assert_int_equal(count, 1);
    EXPECT_OK(fp8amp_optimizer_state_bytes(opt, &bytes1));
    assert_true(bytes1 > bytes0);
    /* an unknown rounding at create */
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O3, &d));
    d.master_rounding = 2;
    fp8amp_optimizer none = NULL;
    EXPECT_STATUS(fp8amp_optimizer_create(ctx, &d, &none), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(none);
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_tensor_destroy(f32p));
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_tensor_destroy(e4));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- master_init: the master copy starts from the full-precision weights -------------------------- */

/* fp8amp_param_desc.master_init: an E4M3 parameter's F16 master starts from the F32 values it was
 * quantized from, within F16's rounding of them (2^-11 relative), not from the E4M3 codes (2^-4):
 * starting O3 from the E4M3-rounded weights cost +0.6% held-out loss on a GPT (docs/numerics.md 6.4).
 * The control optimizer without master_init shows the test tells the two apart. Bad master_init:
 * statuses, and nothing registered. */
static void test_master_init(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    enum { MN1 = 1000 };
    const int64_t n = MN1, nscales = (MN1 + 127) / 128;
    float *x = xmalloc(sizeof(float) * MN1), *got = xmalloc(sizeof(float) * MN1);
    for (int i = 0; i < n; ++i) x[i] = (float)(test_rng_uniform(-1, 1) * ldexp(1.0, -(int)test_rng_uniform(0, 7)));
    fp8amp_tensor f32x = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), g = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    upload_f32(f32x, x, n);
    upload_f32(g, x, n); /* any finite gradient */
    fp8amp_tensor e4 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n), e4b = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_scaling meta, metab;
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = FP8AMP_SCALING_DELAYED;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &metab));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4, meta));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4b, metab));
    EXPECT_OK(fp8amp_quantize(ctx, f32x, e4));
    EXPECT_OK(fp8amp_quantize(ctx, f32x, e4b));

    fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    fp8amp_param_desc pd;
    EXPECT_OK(fp8amp_param_desc_init(&pd, sizeof pd));
    assert_null(pd.master_init);
    /* bad master_init: refused, nothing registered */
    fp8amp_tensor shorter = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &(int64_t){n - 1});
    fp8amp_tensor as2d = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, (int64_t[]){2, n / 2});
    fp8amp_tensor e4init = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_tensor nan_init = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    x[n / 3] = NAN;
    upload_f32(nan_init, x, n);
    EXPECT_OK(fp8amp_tensor_copy_to_host(f32x, x, sizeof(float) * (size_t)n)); /* x again, without the NaN */
    pd.master_init = shorter;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_SHAPE_MISMATCH);
    pd.master_init = as2d;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_SHAPE_MISMATCH);
    pd.master_init = e4init;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_DTYPE_MISMATCH);
    pd.master_init = nan_init;
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    pd.master_init = (fp8amp_tensor)(void *)meta; /* a handle of another kind */
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd), FP8AMP_ERROR_INVALID_HANDLE);
    pd.master_init = f32x; /* for an F32 parameter without a master copy */
    pd.master_dtype = FP8AMP_NO_MASTER;
    fp8amp_tensor f32p = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), g2 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    upload_f32(f32p, x, n);
    EXPECT_STATUS(fp8amp_optimizer_add_param_ex(opt, f32p, g2, &pd), FP8AMP_ERROR_INVALID_ARGUMENT);
    int32_t count = -1;
    EXPECT_OK(fp8amp_optimizer_num_params(opt, &count));
    assert_int_equal(count, 0);

    /* the master starts from x (kept only during the call: destroyed before the step) */
    fp8amp_tensor init = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    upload_f32(init, x, n);
    pd.master_dtype = FP8AMP_MASTER_DEFAULT;
    pd.master_init = init;
    EXPECT_OK(fp8amp_optimizer_add_param_ex(opt, e4, g, &pd));
    EXPECT_OK(fp8amp_tensor_destroy(init));
    master_of(opt, n, nscales, got);
    double worst = 0;
    for (int i = 0; i < n; ++i) worst = fmax(worst, fabs((double)got[i] - x[i]) / fabs((double)x[i]));
    assert_true(worst <= ldexp(1.0, -11));
    /* the control: from the E4M3 codes, up to 2^-4 off (and more for E4M3's subnormals) */
    fp8amp_optimizer ctl = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    EXPECT_OK(fp8amp_optimizer_add_param(ctl, e4b, g));
    master_of(ctl, n, nscales, got);
    double worst_ctl = 0;
    for (int i = 0; i < n; ++i) worst_ctl = fmax(worst_ctl, fabs((double)got[i] - x[i]) / fabs((double)x[i]));
    assert_true(worst_ctl > ldexp(1.0, -6));
    /* the first layout (8 bytes, no master_init): accepted, the master from the parameter */
    fp8amp_optimizer old = make_opt(ctx, FP8AMP_OPT_LEVEL_O3, FP8AMP_MASTER_ROUND_NEAREST, 0, 1e-3f, 0.0f);
    fp8amp_param_desc first;
    memset(&first, 0xAB, sizeof first); /* bytes past the first layout are not read */
    EXPECT_OK(fp8amp_param_desc_init(&first, offsetof(fp8amp_param_desc, master_init)));
    assert_int_equal(first.struct_size, offsetof(fp8amp_param_desc, master_init));
    fp8amp_tensor e4c = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_scaling metac;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &metac));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4c, metac));
    EXPECT_OK(fp8amp_quantize(ctx, f32x, e4c));
    EXPECT_OK(fp8amp_optimizer_add_param_ex(old, e4c, g2, &first));
    float *got_old = xmalloc(sizeof(float) * MN1);
    master_of(old, n, nscales, got_old);
    master_of(ctl, n, nscales, got);
    assert_memory_equal(got_old, got, sizeof(float) * (size_t)n);
    /* and the step works */
    fp8amp_adam_step_args a;
    EXPECT_OK(fp8amp_adam_step_args_init_default(&a));
    EXPECT_OK(fp8amp_optimizer_step(opt, &a));
    free(got_old);
    EXPECT_OK(fp8amp_optimizer_destroy(old));
    EXPECT_OK(fp8amp_optimizer_destroy(ctl));
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    fp8amp_tensor ts[] = {f32x, g, e4, e4b, e4c, shorter, as2d, e4init, nan_init, f32p, g2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(ts[i]));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_scaling_destroy(metab));
    EXPECT_OK(fp8amp_scaling_destroy(metac));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(x);
    free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_tiny_update_nearest_vs_stochastic),
        DEVICE_TESTS(test_stochastic_rounding_is_deterministic),
        DEVICE_TESTS(test_mixed_masters_equal_two_optimizers),
        DEVICE_TESTS(test_mixed_masters_clip_globally),
        DEVICE_TESTS(test_mixed_masters_checkpoint),
        DEVICE_TESTS(test_version1_checkpoint_loads),
        DEVICE_TESTS(test_bad_master_choices),
        DEVICE_TESTS(test_master_init),
        cmocka_unit_test(test_cpu_cuda_identical_mixed_masters),
        DEVICE_TESTS(test_tiny_update_param_without_master),
        cmocka_unit_test(test_cpu_cuda_identical_param_rounding),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
