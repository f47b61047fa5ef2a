/* One parameter's optimizer state as tensors (fp8amp_optimizer_param_state, _set_param_state,
 * _set_step; docs/api.md 12.10), through the public API:
 *   - round trip: the views of a trained optimizer (O1, O2, O3; block sizes 128, 256 and per-tensor)
 *     written into a fresh optimizer give bit for bit its state, and both then take the same step to
 *     the same bytes; written back into the optimizer itself, they leave its checkpoint byte for byte;
 *   - the views are read-only, live (a step shows through them) and outlive the optimizer;
 *   - values (F32 / BF16) are quantized exactly as the reference block scaling says: per block the
 *     largest power-of-two scale with amax * scale <= 448 (E4M3 m) or 65504 (F16 v, master), codes
 *     rounded to nearest;
 *   - bad input: every refusal has its status, and the state is unchanged after it.
 * Every test runs on the CPU and on CUDA (skipped without a GPU) on fresh random data. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

enum { NPARAM = 4 };

/* Four parameters: F32 [300] (no master), BF16 [5, 61] (master at O3), BF16 [130], and E4M3 [70] bound
 * to a delayed meta (master at O3): its meta's state is part of the optimizer's. */
typedef struct {
    fp8amp_context ctx;
    fp8amp_optimizer opt;
    fp8amp_tensor param[NPARAM], grad[NPARAM];
    int64_t numel[NPARAM];
    fp8amp_scaling meta; /* parameter 3's */
} rig_t;

static const int32_t kNdim[NPARAM] = {1, 2, 1, 1};
static const int64_t kShape[NPARAM][2] = {{300, 0}, {5, 61}, {130, 0}, {70, 0}};
static const fp8amp_dtype kDtype[NPARAM] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3};

static void fill_random(fp8amp_tensor t, fp8amp_dtype dt, int64_t n, double lo, double hi) {
    if (dt == FP8AMP_DTYPE_F32) {
        float *h = xmalloc(4 * (size_t)n);
        for (int64_t i = 0; i < n; ++i) h[i] = (float)test_rng_uniform(lo, hi);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, h, 4 * (size_t)n));
        free(h);
    } else if (dt == FP8AMP_DTYPE_E4M3) { /* finite codes of magnitude < 2^(hi) */
        uint8_t *h = xmalloc((size_t)n);
        for (int64_t i = 0; i < n; ++i) {
            h[i] = (uint8_t)(test_rng_u64() % 0x7Fu);
            if (test_rng_u64() & 1u) h[i] |= 0x80u;
        }
        (void)lo;
        (void)hi;
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, h, (size_t)n));
        free(h);
    } else { /* BF16 by truncation */
        uint16_t *h = xmalloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; ++i) h[i] = (uint16_t)(f32_bits((float)test_rng_uniform(lo, hi)) >> 16);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, h, 2 * (size_t)n));
        free(h);
    }
}

static fp8amp_optimizer make_opt(fp8amp_context ctx, fp8amp_opt_level level, int32_t block) {
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_opt_level_adam_config(level, &d));
    d.lr = 1e-2f;
    d.state_block_size = block;
    fp8amp_optimizer opt = NULL;
    EXPECT_OK(fp8amp_optimizer_create(ctx, &d, &opt));
    return opt;
}

/* A rig with fresh random parameters; params_from (may be NULL) gives their bytes instead. */
static void rig_make(rig_t *r, fp8amp_context ctx, fp8amp_opt_level level, int32_t block, const rig_t *params_from) {
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    r->opt = make_opt(ctx, level, block);
    for (int i = 0; i < NPARAM; ++i) {
        r->param[i] = make_tensor(ctx, kDtype[i], kNdim[i], kShape[i]);
        r->grad[i] = make_tensor(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i]);
        r->numel[i] = (int64_t)numel_of(kNdim[i], kShape[i]);
        if (kDtype[i] == FP8AMP_DTYPE_E4M3) {
            r->meta = counting_meta(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 1.0f);
            EXPECT_OK(fp8amp_tensor_set_scaling(r->param[i], r->meta));
        }
        if (params_from) {
            void *h = tensor_to_host(params_from->param[i]);
            EXPECT_OK(fp8amp_tensor_copy_from_host(r->param[i], h, tensor_bytes(r->param[i])));
            free(h);
            if (kDtype[i] == FP8AMP_DTYPE_E4M3) { /* the codes' scale_inv: the model's, not the optimizer's */
                fp8amp_tensor from, to;
                EXPECT_OK(fp8amp_tensor_scale_inv(params_from->param[i], &from));
                EXPECT_OK(fp8amp_tensor_scale_inv(r->param[i], &to));
                void *slot = tensor_to_host(from);
                EXPECT_OK(fp8amp_tensor_copy_from_host(to, slot, 4));
                free(slot);
                EXPECT_OK(fp8amp_tensor_destroy(from));
                EXPECT_OK(fp8amp_tensor_destroy(to));
            }
        } else {
            fill_random(r->param[i], kDtype[i], r->numel[i], -2.0, 2.0);
        }
        /* O3: the F32 parameter takes no master; the BF16 ones the desc's */
        fp8amp_param_desc pd;
        EXPECT_OK(fp8amp_param_desc_init(&pd, sizeof pd));
        if (kDtype[i] == FP8AMP_DTYPE_F32) pd.master_dtype = FP8AMP_NO_MASTER;
        EXPECT_OK(fp8amp_optimizer_add_param_ex(r->opt, r->param[i], r->grad[i], &pd));
    }
}

static void rig_free(rig_t *r) {
    EXPECT_OK(fp8amp_optimizer_destroy(r->opt));
    EXPECT_OK(fp8amp_scaling_destroy(r->meta));
    for (int i = 0; i < NPARAM; ++i) {
        EXPECT_OK(fp8amp_tensor_destroy(r->param[i]));
        EXPECT_OK(fp8amp_tensor_destroy(r->grad[i]));
    }
}

static void random_grads(rig_t *r) {
    for (int i = 0; i < NPARAM; ++i) fill_random(r->grad[i], FP8AMP_DTYPE_F32, r->numel[i], -1.0, 1.0);
}

static void copy_grads(rig_t *dst, const rig_t *src) {
    for (int i = 0; i < NPARAM; ++i) {
        void *h = tensor_to_host(src->grad[i]);
        EXPECT_OK(fp8amp_tensor_copy_from_host(dst->grad[i], h, tensor_bytes(dst->grad[i])));
        free(h);
    }
}

static void step(fp8amp_optimizer opt) { EXPECT_OK(fp8amp_optimizer_step(opt, NULL)); }

enum { NPARTS = 7 };
static fp8amp_tensor *part(fp8amp_param_state *s, int k) {
    fp8amp_tensor *parts[NPARTS] = {&s->exp_avg, &s->exp_avg_scale_inv, &s->exp_avg_sq, &s->exp_avg_sq_scale_inv,
                                    &s->master, &s->master_scale_inv, &s->param_meta_history};
    return parts[k];
}

static void get_state(fp8amp_optimizer opt, int32_t index, fp8amp_param_state *s) {
    EXPECT_OK(fp8amp_param_state_init(s, sizeof *s));
    EXPECT_OK(fp8amp_optimizer_param_state(opt, index, s));
}

static void free_state(fp8amp_param_state *s) {
    for (int k = 0; k < NPARTS; ++k) EXPECT_OK(fp8amp_tensor_destroy(*part(s, k)));
}

/* Every part's bytes, concatenated (a snapshot of one parameter's state). */
static unsigned char *state_bytes(fp8amp_optimizer opt, int32_t index, size_t *size) {
    fp8amp_param_state s;
    get_state(opt, index, &s);
    size_t total = 0;
    for (int k = 0; k < NPARTS; ++k)
        if (*part(&s, k)) total += tensor_bytes(*part(&s, k));
    unsigned char *buf = xmalloc(total + 24);
    size_t at = 0;
    for (int k = 0; k < NPARTS; ++k)
        if (*part(&s, k)) {
            const size_t n = tensor_bytes(*part(&s, k));
            EXPECT_OK(fp8amp_tensor_copy_to_host(*part(&s, k), buf + at, n));
            at += n;
        }
    memcpy(buf + at, &s.step, 8);
    memcpy(buf + at + 8, &s.param_meta_scale, 4);
    memcpy(buf + at + 12, &s.param_meta_amax, 4);
    memcpy(buf + at + 16, &s.param_meta_updates, 8);
    free_state(&s);
    *size = total + 24;
    return buf;
}

static void expect_same_state(fp8amp_optimizer a, fp8amp_optimizer b) {
    for (int32_t i = 0; i < NPARAM; ++i) {
        size_t na = 0, nb = 0;
        unsigned char *sa = state_bytes(a, i, &na), *sb = state_bytes(b, i, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(sa, sb, na);
        free(sa);
        free(sb);
    }
}

static void expect_same_params(const rig_t *a, const rig_t *b) {
    for (int i = 0; i < NPARAM; ++i) {
        void *h = tensor_to_host(a->param[i]);
        expect_bytes(b->param[i], h, tensor_bytes(a->param[i]));
        free(h);
    }
}

static void round_trip(void **state, fp8amp_opt_level level, int32_t block) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    rig_t a, b;
    rig_make(&a, ctx, level, block, NULL);
    const int steps = 2 + (int)(test_rng_u64() % 3);
    for (int k = 0; k < steps; ++k) {
        random_grads(&a);
        step(a.opt);
    }
    rig_make(&b, ctx, level, block, &a);
    for (int32_t i = 0; i < NPARAM; ++i) {
        fp8amp_param_state s;
        get_state(a.opt, i, &s);
        assert_int_equal(s.step, steps);
        assert_int_equal(s.has_master, level == FP8AMP_OPT_LEVEL_O3 && kDtype[i] != FP8AMP_DTYPE_F32);
        assert_int_equal(s.param_meta_history != NULL, kDtype[i] == FP8AMP_DTYPE_E4M3);
        if (s.param_meta_history) { /* the meta as fp8amp_scaling_get reads it */
            float scale = 0.0f, amax = 0.0f, history[4];
            EXPECT_OK(fp8amp_scaling_get(a.meta, &scale, NULL, &amax));
            EXPECT_OK(fp8amp_scaling_get_history(a.meta, 4, history));
            assert_int_equal(f32_bits(s.param_meta_scale), f32_bits(scale));
            assert_int_equal(f32_bits(s.param_meta_amax), f32_bits(amax));
            assert_int_equal(s.param_meta_updates, steps);
            expect_bytes(s.param_meta_history, history, sizeof history);
        }
        assert_int_equal(s.master != NULL, s.has_master);
        assert_int_equal(s.exp_avg_scale_inv != NULL, level != FP8AMP_OPT_LEVEL_O1);
        fp8amp_dtype dt;
        EXPECT_OK(fp8amp_tensor_dtype(s.exp_avg, &dt));
        assert_int_equal(dt, level == FP8AMP_OPT_LEVEL_O1 ? FP8AMP_DTYPE_F32 : FP8AMP_DTYPE_E4M3);
        EXPECT_OK(fp8amp_tensor_dtype(s.exp_avg_sq, &dt));
        assert_int_equal(dt, level == FP8AMP_OPT_LEVEL_O1 ? FP8AMP_DTYPE_F32 : FP8AMP_DTYPE_F16);
        if (s.exp_avg_scale_inv) {
            int64_t nscales = 0;
            EXPECT_OK(fp8amp_tensor_numel(s.exp_avg_scale_inv, &nscales));
            assert_int_equal(nscales, block ? (a.numel[i] + block - 1) / block : 1);
        }
        EXPECT_OK(fp8amp_optimizer_set_param_state(b.opt, i, &s)); /* the views, straight in: the exact form */
        free_state(&s);
    }
    EXPECT_OK(fp8amp_optimizer_set_step(b.opt, steps));
    expect_same_state(a.opt, b.opt);
    /* a's own views written back into a change nothing: its checkpoint keeps every byte, the meta's
     * history ring included (its head where the steps left it: not 0 unless they filled the ring) */
    {
        size_t n0 = 0, n1 = 0;
        EXPECT_OK(fp8amp_optimizer_save(a.opt, NULL, 0, &n0));
        unsigned char *c0 = xmalloc(n0), *c1 = xmalloc(n0);
        EXPECT_OK(fp8amp_optimizer_save(a.opt, c0, n0, &n0));
        for (int32_t i = 0; i < NPARAM; ++i) {
            fp8amp_param_state s;
            get_state(a.opt, i, &s);
            EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, i, &s));
            free_state(&s);
        }
        EXPECT_OK(fp8amp_optimizer_save(a.opt, c1, n0, &n1));
        assert_int_equal(n0, n1);
        assert_memory_equal(c0, c1, n0);
        free(c0);
        free(c1);
    }
    /* the same next step gives the same bytes */
    random_grads(&a);
    copy_grads(&b, &a);
    step(a.opt);
    step(b.opt);
    expect_same_params(&a, &b);
    expect_same_state(a.opt, b.opt);
    rig_free(&a);
    rig_free(&b);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_round_trip_o1(void **state) { round_trip(state, FP8AMP_OPT_LEVEL_O1, 128); }
static void test_round_trip_o2(void **state) { round_trip(state, FP8AMP_OPT_LEVEL_O2, 128); }
static void test_round_trip_o3(void **state) { round_trip(state, FP8AMP_OPT_LEVEL_O3, 128); }
static void test_round_trip_o3_block256(void **state) { round_trip(state, FP8AMP_OPT_LEVEL_O3, 256); }
static void test_round_trip_o2_per_tensor(void **state) { round_trip(state, FP8AMP_OPT_LEVEL_O2, 0); }

static void test_views_read_only_live_and_owned(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    rig_t a;
    rig_make(&a, ctx, FP8AMP_OPT_LEVEL_O3, 128, NULL);
    random_grads(&a);
    step(a.opt);
    fp8amp_param_state s;
    get_state(a.opt, 1, &s);
    void *before = tensor_to_host(s.exp_avg_sq);
    const size_t n = tensor_bytes(s.exp_avg_sq);
    /* read-only: a write through the view is refused and changes nothing */
    EXPECT_STATUS(fp8amp_tensor_copy_from_host(s.exp_avg_sq, before, n), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* live: the next step shows through */
    random_grads(&a);
    step(a.opt);
    void *after = tensor_to_host(s.exp_avg_sq);
    assert_true(memcmp(before, after, n) != 0);
    /* owned: the views outlive the optimizer */
    rig_free(&a);
    expect_bytes(s.exp_avg_sq, after, n);
    free(before);
    free(after);
    free_state(&s);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The reference quantization of n values into block-scaled `f` (fmax its largest value). */
static void quantize_ref(const float *x, int64_t n, int64_t block, const format_t *f, double top, uint32_t *codes,
                         float *scale_inv) {
    const int64_t bs = block ? block : n;
    for (int64_t b = 0; b * bs < n; ++b) {
        double amax = 0.0;
        for (int64_t i = b * bs; i < n && i < (b + 1) * bs; ++i) amax = fmax(amax, fabs((double)x[i]));
        int k = 0;
        if (amax > 0.0) {
            k = -200;
            while (amax * ldexp(1.0, k + 1) <= top) ++k; /* the largest k with amax * 2^k <= fmax */
            for (; amax * ldexp(1.0, k) > top;) --k;
            if (k > 126) k = 126;
            if (k < -126) k = -126;
        }
        scale_inv[b] = (float)ldexp(1.0, -k);
        for (int64_t i = b * bs; i < n && i < (b + 1) * bs; ++i) codes[i] = encode_scaled_ref(f, mul_f32_ref(x[i], (float)ldexp(1.0, k)));
    }
}

static void expect_quantized(fp8amp_tensor codes_t, fp8amp_tensor scales_t, const float *x, int64_t n, int64_t block,
                             fp8amp_dtype dt, double top) {
    const int64_t nb = block ? (n + block - 1) / block : 1;
    uint32_t *want = xmalloc(4 * (size_t)n);
    float *want_inv = xmalloc(4 * (size_t)nb);
    quantize_ref(x, n, block, format_of(dt), top, want, want_inv);
    unsigned char *got = tensor_to_host(codes_t);
    float *got_inv = tensor_to_host(scales_t);
    for (int64_t b = 0; b < nb; ++b) assert_int_equal(f32_bits(got_inv[b]), f32_bits(want_inv[b]));
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t c = dt == FP8AMP_DTYPE_E4M3 ? got[i] : ((uint16_t *)got)[i];
        if (c != want[i]) fail_msg("element %lld: code 0x%x, want 0x%x (value %g)", (long long)i, c, want[i], (double)x[i]);
    }
    free(want);
    free(want_inv);
    free(got);
    free(got_inv);
}

static void test_values_quantized_as_reference(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int32_t blocks[3] = {128, 256, 0};
    const int32_t block = blocks[test_rng_u64() % 3];
    rig_t a;
    rig_make(&a, ctx, FP8AMP_OPT_LEVEL_O3, block, NULL);
    const int32_t i = 1; /* BF16 [5, 61] with a master */
    const int64_t n = a.numel[i];
    float *m = xmalloc(4 * (size_t)n), *v = xmalloc(4 * (size_t)n), *w = xmalloc(4 * (size_t)n);
    for (int64_t j = 0; j < n; ++j) {
        /* magnitudes over many binades, so blocks get different scales and small values go subnormal */
        m[j] = (float)(test_rng_uniform(-1.0, 1.0) * ldexp(1.0, (int)(test_rng_u64() % 30) - 20));
        v[j] = (float)(test_rng_uniform(0.0, 1.0) * ldexp(1.0, (int)(test_rng_u64() % 40) - 30));
        w[j] = (float)test_rng_uniform(-3.0, 3.0);
    }
    fp8amp_tensor tm = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], m);
    fp8amp_tensor tv = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], v);
    fp8amp_tensor tw = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], w);
    fp8amp_param_state in;
    EXPECT_OK(fp8amp_param_state_init(&in, sizeof in));
    in.exp_avg = tm;
    in.exp_avg_sq = tv;
    in.master = tw;
    EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, i, &in));
    fp8amp_param_state s;
    get_state(a.opt, i, &s);
    expect_quantized(s.exp_avg, s.exp_avg_scale_inv, m, n, block, FP8AMP_DTYPE_E4M3, 448.0);
    expect_quantized(s.exp_avg_sq, s.exp_avg_sq_scale_inv, v, n, block, FP8AMP_DTYPE_F16, 65504.0);
    expect_quantized(s.master, s.master_scale_inv, w, n, block, FP8AMP_DTYPE_F16, 65504.0);
    free_state(&s);
    EXPECT_OK(fp8amp_tensor_destroy(tm));
    EXPECT_OK(fp8amp_tensor_destroy(tv));
    EXPECT_OK(fp8amp_tensor_destroy(tw));
    free(m);
    free(v);
    free(w);
    rig_free(&a);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* O1: BF16 values are widened into the F32 state exactly. */
static void test_o1_values_widened(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    rig_t a;
    rig_make(&a, ctx, FP8AMP_OPT_LEVEL_O1, 128, NULL);
    const int32_t i = 0;
    const int64_t n = a.numel[i];
    fp8amp_tensor tm = make_tensor(ctx, FP8AMP_DTYPE_BF16, kNdim[i], kShape[i]);
    fp8amp_tensor tv = make_tensor(ctx, FP8AMP_DTYPE_BF16, kNdim[i], kShape[i]);
    fill_random(tm, FP8AMP_DTYPE_BF16, n, -1.0, 1.0);
    fill_random(tv, FP8AMP_DTYPE_BF16, n, 0.0, 1.0);
    fp8amp_param_state in;
    EXPECT_OK(fp8amp_param_state_init(&in, sizeof in));
    in.exp_avg = tm;
    in.exp_avg_sq = tv;
    EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, i, &in));
    fp8amp_param_state s;
    get_state(a.opt, i, &s);
    uint16_t *hm = tensor_to_host(tm), *hv = tensor_to_host(tv);
    float *gm = tensor_to_host(s.exp_avg), *gv = tensor_to_host(s.exp_avg_sq);
    for (int64_t j = 0; j < n; ++j) {
        assert_int_equal(f32_bits(gm[j]), (uint32_t)hm[j] << 16);
        assert_int_equal(f32_bits(gv[j]), (uint32_t)hv[j] << 16);
    }
    free(hm);
    free(hv);
    free(gm);
    free(gv);
    free_state(&s);
    EXPECT_OK(fp8amp_tensor_destroy(tm));
    EXPECT_OK(fp8amp_tensor_destroy(tv));
    rig_free(&a);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Snapshot of every parameter's state and the step count, compared after each refused call. */
typedef struct {
    unsigned char *bytes[NPARAM];
    size_t size[NPARAM];
} snap_t;

static void snap(fp8amp_optimizer opt, snap_t *s) {
    for (int32_t i = 0; i < NPARAM; ++i) s->bytes[i] = state_bytes(opt, i, &s->size[i]);
}

static void expect_unchanged(fp8amp_optimizer opt, const snap_t *s) {
    for (int32_t i = 0; i < NPARAM; ++i) {
        size_t n = 0;
        unsigned char *now = state_bytes(opt, i, &n);
        assert_int_equal(n, s->size[i]);
        assert_memory_equal(now, s->bytes[i], n);
        free(now);
    }
}

static void snap_free(snap_t *s) {
    for (int32_t i = 0; i < NPARAM; ++i) free(s->bytes[i]);
}

#define REFUSED(call, status)                                                                      \
    do {                                                                                           \
        EXPECT_STATUS(call, status);                                                               \
        expect_unchanged(a.opt, &before);                                                          \
    } while (0)

static void test_bad_input(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    fp8amp_context ctx = make_context(dev);
    rig_t a;
    rig_make(&a, ctx, FP8AMP_OPT_LEVEL_O3, 128, NULL);
    random_grads(&a);
    step(a.opt);
    snap_t before;
    snap(a.opt, &before);
    fp8amp_param_state good1, good0; /* the exact state of parameter 1 (master) and 0 (none) */
    get_state(a.opt, 1, &good1);
    get_state(a.opt, 0, &good0);
    fp8amp_param_state s = good1, out;

    /* get: NULL out, bad struct_size, bad index; out unchanged */
    EXPECT_STATUS(fp8amp_optimizer_param_state(a.opt, 0, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_param_state(NULL, 0, &out), FP8AMP_ERROR_INVALID_HANDLE);
    memset(&out, 0, sizeof out);
    out.struct_size = 3;
    EXPECT_STATUS(fp8amp_optimizer_param_state(a.opt, 0, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(out.exp_avg);
    EXPECT_OK(fp8amp_param_state_init(&out, sizeof out));
    EXPECT_STATUS(fp8amp_optimizer_param_state(a.opt, NPARAM, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_optimizer_param_state(a.opt, -1, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(out.exp_avg);
    assert_int_equal(out.step, 0);
    EXPECT_STATUS(fp8amp_param_state_init(NULL, sizeof out), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_param_state_init(&out, 2), FP8AMP_ERROR_INVALID_ARGUMENT);

    /* set: NULL, struct_size, index */
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    s.struct_size = 0;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    s = good1;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, NPARAM, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, -1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* parameter 1's state for parameter 2 (another shape) */
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 2, &s), FP8AMP_ERROR_SHAPE_MISMATCH);
    /* parameter 1's state for parameter 0 (no master) */
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 0, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* a required part NULL */
    s.exp_avg = NULL;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    s = good1;
    s.exp_avg_sq = NULL;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    s = good1;
    s.master = NULL;
    s.master_scale_inv = NULL;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* a master for the parameter without one */
    s = good0;
    s.master = good1.master;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 0, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* E4M3 codes without their scales: DTYPE_MISMATCH */
    s = good1;
    s.exp_avg_scale_inv = NULL;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_DTYPE_MISMATCH);
    /* scales of the wrong length / dtype; a state tensor of another dtype with scales */
    s = good1;
    {
        const int64_t two = 2;
        fp8amp_tensor short_scales = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &two);
        const float ones[2] = {1.0f, 1.0f};
        EXPECT_OK(fp8amp_tensor_copy_from_host(short_scales, ones, sizeof ones));
        s.exp_avg_scale_inv = short_scales;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_SHAPE_MISMATCH);
        EXPECT_OK(fp8amp_tensor_destroy(short_scales));
        int64_t nb = 0;
        EXPECT_OK(fp8amp_tensor_numel(good1.exp_avg_scale_inv, &nb));
        fp8amp_tensor f16_scales = make_tensor(ctx, FP8AMP_DTYPE_F16, 1, &nb);
        s.exp_avg_scale_inv = f16_scales;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_DTYPE_MISMATCH);
        EXPECT_OK(fp8amp_tensor_destroy(f16_scales));
        /* F16 values with m's scales: not the stored dtype (E4M3) */
        s = good1;
        s.exp_avg = good1.exp_avg_sq;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_DTYPE_MISMATCH);
        /* a scale that is not a power of two; one that is 0 */
        float *sc = tensor_to_host(good1.exp_avg_sq_scale_inv);
        sc[nb - 1] *= 1.5f;
        fp8amp_tensor bad_scales = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &nb, sc);
        s = good1;
        s.exp_avg_sq_scale_inv = bad_scales;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        sc[nb - 1] = 0.0f;
        EXPECT_OK(fp8amp_tensor_copy_from_host(bad_scales, sc, 4 * (size_t)nb));
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 1, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_OK(fp8amp_tensor_destroy(bad_scales));
        free(sc);
    }
    /* values: NaN in m, a negative v, inf in the master; an E5M2 tensor; wrong shape */
    {
        const int32_t i = 1;
        const int64_t n = a.numel[i];
        float *x = xmalloc(4 * (size_t)n);
        for (int64_t j = 0; j < n; ++j) x[j] = (float)test_rng_uniform(0.0, 1.0);
        const int64_t at = (int64_t)(test_rng_u64() % (uint64_t)n);
        fp8amp_tensor ok = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], x);
        x[at] = NAN;
        fp8amp_tensor nan_t = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], x);
        x[at] = -0.5f;
        fp8amp_tensor neg_t = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], x);
        x[at] = INFINITY;
        fp8amp_tensor inf_t = tensor_from_host(ctx, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], x);
        fp8amp_param_state vals;
        EXPECT_OK(fp8amp_param_state_init(&vals, sizeof vals));
        vals.exp_avg = nan_t;
        vals.exp_avg_sq = ok;
        vals.master = ok;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_INVALID_ARGUMENT);
        vals.exp_avg = ok;
        vals.exp_avg_sq = neg_t;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_INVALID_ARGUMENT);
        vals.exp_avg_sq = ok;
        vals.master = inf_t;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_INVALID_ARGUMENT);
        fp8amp_tensor e5 = make_tensor(ctx, FP8AMP_DTYPE_E5M2, kNdim[i], kShape[i]);
        vals.master = e5;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_DTYPE_MISMATCH);
        const int64_t flat = n;
        fp8amp_tensor flat_t = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &flat, NULL);
        vals.master = flat_t;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_SHAPE_MISMATCH);
        /* a destroyed tensor handle */
        vals.master = inf_t;
        EXPECT_OK(fp8amp_tensor_destroy(inf_t));
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_INVALID_HANDLE);
        /* a tensor of the other device */
        if (dev.type == FP8AMP_DEVICE_CUDA) {
            fp8amp_context cpu = make_context(cpu_device());
            fp8amp_tensor host_t = tensor_from_host(cpu, FP8AMP_DTYPE_F32, kNdim[i], kShape[i], NULL);
            vals.master = host_t;
            REFUSED(fp8amp_optimizer_set_param_state(a.opt, i, &vals), FP8AMP_ERROR_DEVICE_MISMATCH);
            EXPECT_OK(fp8amp_tensor_destroy(host_t));
            EXPECT_OK(fp8amp_context_destroy(cpu));
        }
        EXPECT_OK(fp8amp_tensor_destroy(ok));
        EXPECT_OK(fp8amp_tensor_destroy(nan_t));
        EXPECT_OK(fp8amp_tensor_destroy(neg_t));
        EXPECT_OK(fp8amp_tensor_destroy(e5));
        EXPECT_OK(fp8amp_tensor_destroy(flat_t));
        free(x);
    }
    /* the meta's state: for a parameter without meta; wrong length or dtype; out of domain */
    {
        fp8amp_param_state g3;
        get_state(a.opt, 3, &g3);
        assert_non_null(g3.param_meta_history);
        s = good0;
        s.param_meta_history = g3.param_meta_history;
        s.param_meta_scale = 1.0f;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 0, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        const int64_t five = 5;
        float *h = tensor_to_host(g3.param_meta_history);
        fp8amp_tensor long_h = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &five);
        fp8amp_tensor f16_h = make_tensor(ctx, FP8AMP_DTYPE_F16, 1, (const int64_t[]){4});
        h[test_rng_u64() % 4] = -1.0f;
        fp8amp_tensor neg_h = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, (const int64_t[]){4}, h);
        s = g3;
        s.param_meta_history = long_h;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_SHAPE_MISMATCH);
        s.param_meta_history = f16_h;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_DTYPE_MISMATCH);
        s.param_meta_history = neg_h;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        s = g3;
        s.param_meta_scale = 0.0f;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        s.param_meta_scale = INFINITY;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        s = g3;
        s.param_meta_amax = NAN;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        s = g3;
        s.param_meta_updates = -1;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        s.param_meta_updates = (int64_t)UINT32_MAX + 1;
        REFUSED(fp8amp_optimizer_set_param_state(a.opt, 3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        /* a valid other meta state goes in, and the original back */
        s = g3;
        s.param_meta_scale = 0.25f;
        EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, 3, &s));
        float scale = 0.0f;
        EXPECT_OK(fp8amp_scaling_get(a.meta, &scale, NULL, NULL));
        assert_true(scale == 0.25f);
        EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, 3, &g3));
        expect_unchanged(a.opt, &before);
        EXPECT_OK(fp8amp_tensor_destroy(long_h));
        EXPECT_OK(fp8amp_tensor_destroy(f16_h));
        EXPECT_OK(fp8amp_tensor_destroy(neg_h));
        free(h);
        free_state(&g3);
    }
    /* set_step: out of range; a bad handle */
    REFUSED(fp8amp_optimizer_set_step(a.opt, -1), FP8AMP_ERROR_INVALID_ARGUMENT);
    REFUSED(fp8amp_optimizer_set_step(a.opt, ((int64_t)1 << 62) + 1), FP8AMP_ERROR_INVALID_ARGUMENT);
    REFUSED(fp8amp_optimizer_set_step(NULL, 3), FP8AMP_ERROR_INVALID_HANDLE);
    /* and the good state still goes in */
    EXPECT_OK(fp8amp_optimizer_set_param_state(a.opt, 1, &good1));
    expect_unchanged(a.opt, &before);
    free_state(&good1);
    free_state(&good0);
    snap_free(&before);
    rig_free(&a);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* O1 has no block scales: a scale tensor is refused. */
static void test_o1_refuses_scales(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    rig_t a;
    rig_make(&a, ctx, FP8AMP_OPT_LEVEL_O1, 128, NULL);
    random_grads(&a);
    step(a.opt);
    snap_t before;
    snap(a.opt, &before);
    fp8amp_param_state s;
    get_state(a.opt, 0, &s);
    assert_null(s.exp_avg_scale_inv);
    const int64_t three = 3;
    const float ones[3] = {1.0f, 1.0f, 1.0f};
    fp8amp_tensor scales = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &three, ones);
    s.exp_avg_scale_inv = scales;
    REFUSED(fp8amp_optimizer_set_param_state(a.opt, 0, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
    s.exp_avg_scale_inv = NULL;
    EXPECT_OK(fp8amp_tensor_destroy(scales));
    free_state(&s);
    snap_free(&before);
    rig_free(&a);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A sharded optimizer (one rank) refuses both: its state is per rank. */
static void test_sharded_not_supported(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_comm_unique_id id;
    fp8amp_comm comm = NULL;
    EXPECT_OK(fp8amp_comm_unique_id_create(ctx, &id));
    EXPECT_OK(fp8amp_comm_create(ctx, &id, 1, 0, &comm));
    fp8amp_optimizer opt = make_opt(ctx, FP8AMP_OPT_LEVEL_O2, 128);
    EXPECT_OK(fp8amp_optimizer_set_shard(opt, comm));
    const int64_t n = 200;
    fp8amp_tensor p = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), g = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    fill_random(p, FP8AMP_DTYPE_F32, n, -1.0, 1.0);
    EXPECT_OK(fp8amp_optimizer_add_param(opt, p, g));
    fp8amp_param_state s;
    EXPECT_OK(fp8amp_param_state_init(&s, sizeof s));
    EXPECT_STATUS(fp8amp_optimizer_param_state(opt, 0, &s), FP8AMP_ERROR_NOT_SUPPORTED);
    assert_null(s.exp_avg);
    s.exp_avg = p;
    s.exp_avg_sq = p;
    EXPECT_STATUS(fp8amp_optimizer_set_param_state(opt, 0, &s), FP8AMP_ERROR_NOT_SUPPORTED);
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_tensor_destroy(p));
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_round_trip_o1),
        DEVICE_TESTS(test_round_trip_o2),
        DEVICE_TESTS(test_round_trip_o3),
        DEVICE_TESTS(test_round_trip_o3_block256),
        DEVICE_TESTS(test_round_trip_o2_per_tensor),
        DEVICE_TESTS(test_views_read_only_live_and_owned),
        DEVICE_TESTS(test_values_quantized_as_reference),
        DEVICE_TESTS(test_o1_values_widened),
        DEVICE_TESTS(test_bad_input),
        DEVICE_TESTS(test_o1_refuses_scales),
        DEVICE_TESTS(test_sharded_not_supported),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
