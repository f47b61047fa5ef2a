/* fp8amp_linear_set_lean (issue 18, peak training memory; docs/linear.md section 5): a lean Linear
 * keeps only what a later call needs. Checked here: over steps of three micro-batches (the weight
 * changed between steps as by an optimizer), a level-1 Linear delivers the same bytes (y, dX, weight
 * and bias gradients) as a plain twin throughout, accumulation included; a level-2 Linear the same
 * bytes as a plain twin without accumulation, and with it the same bytes as a plain twin that
 * releases its buffers after each step's first backward (the accumulation then starts from the
 * delivered gradient in both); FP8 and wide GEMM paths, E4M3/BF16/F32 weight gradients, F32 and BF16
 * weights. After a lean training forward the Linear holds its parameters and the saved input (no FP8
 * weight copy); after its backward, its parameters (plus the bias's epilogue copy, and at level 1
 * the FP32 sum). A lean backward re-makes W8^T from the weight, so it refuses to compute dX when the
 * weight was written since its forward (and changes nothing). Through counting allocator hooks, a
 * chain of Linears trained lean peaks lower than the same chain kept, by at least the FP8 weight
 * copies and saved inputs (and at level 2 the FP32 sums) the plain chain's earlier Linears hold at
 * its last backward. Bad arguments. */
#include <math.h>

#include "test_util.h"

enum { K = 96, N = 64, M = 48 };

/* Per micro-batch x and dy (BF16); the first backward of a step overwrites, the others accumulate. */
enum { ROUNDS = 3 };
typedef struct {
    float w[N * K], b[N];
    uint16_t x[ROUNDS][M * K], dy[ROUNDS][M * N];
} run_data;

static void make_data(run_data *d) {
    for (size_t i = 0; i < (size_t)N * K; ++i) d->w[i] = (float)test_rng_uniform(-0.1, 0.1);
    for (size_t i = 0; i < N; ++i) d->b[i] = (float)test_rng_uniform(-1, 1);
    for (int r = 0; r < ROUNDS; ++r) {
        test_fill_bf16(d->x[r], (size_t)M * K, 2.0);
        test_fill_bf16(d->dy[r], (size_t)M * N, 0.5);
    }
}

typedef struct {
    fp8amp_linear lin;
    fp8amp_tensor x, y, dy, dx;
    fp8amp_dtype wdt;
} layer;

/* The weight written as an optimizer would (through a handle: the Linear notices); F32 or BF16. */
static void write_weight(layer *L, const float *w) {
    fp8amp_tensor t;
    EXPECT_OK(fp8amp_linear_weight(L->lin, &t));
    if (L->wdt == FP8AMP_DTYPE_F32) {
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, w, (size_t)N * K * 4));
    } else {
        uint16_t *h = xmalloc((size_t)N * K * 2);
        for (size_t i = 0; i < (size_t)N * K; ++i) h[i] = test_bf16_of(w[i]);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, h, (size_t)N * K * 2));
        free(h);
    }
    EXPECT_OK(fp8amp_tensor_destroy(t));
}

static layer make_layer(fp8amp_context ctx, const run_data *d, fp8amp_gemm_policy policy, fp8amp_dtype wdt,
                        fp8amp_dtype wgrad, int lean) {
    layer L;
    L.wdt = wdt;
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = K;
    desc.out_features = N;
    desc.policy = policy;
    desc.weight_dtype = wdt;
    desc.wgrad_dtype = wgrad;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &L.lin));
    int32_t got = 7;
    EXPECT_OK(fp8amp_linear_get_lean(L.lin, &got));
    assert_int_equal(got, 0); /* the default */
    EXPECT_OK(fp8amp_linear_set_lean(L.lin, lean));
    EXPECT_OK(fp8amp_linear_get_lean(L.lin, &got));
    assert_int_equal(got, lean);
    write_weight(&L, d->w);
    fp8amp_tensor b;
    EXPECT_OK(fp8amp_linear_bias(L.lin, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, d->b, sizeof d->b));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    test_linear_io(ctx, M, K, N, &L.x, &L.dx, &L.y, &L.dy);
    return L;
}

static void free_layer(layer *L) { test_linear_free(L->lin, L->x, L->dx, L->y, L->dy); }

/* Everything one micro-batch delivered, in host memory. */
typedef struct {
    void *y, *dx, *wgrad, *bgrad;
    size_t wgrad_bytes;
} results;

static void free_results(results *r) {
    free(r->y);
    free(r->dx);
    free(r->wgrad);
    free(r->bgrad);
}

/* Micro-batch r of a step: a training forward, a backward (accumulating unless r == 0), the outputs
 * and gradients read. release_first: release_buffers right after the first backward. */
static void micro_batch(layer *L, const run_data *d, int r, int release_first, int accum, results *out) {
    EXPECT_OK(fp8amp_tensor_copy_from_host(L->x, d->x[r], tensor_bytes(L->x)));
    EXPECT_OK(fp8amp_linear_forward(L->lin, L->x, L->y, 1));
    EXPECT_OK(fp8amp_tensor_copy_from_host(L->dy, d->dy[r], tensor_bytes(L->dy)));
    EXPECT_OK(fp8amp_linear_backward(L->lin, L->dy, L->dx, accum && r > 0));
    if (release_first && r == 0) EXPECT_OK(fp8amp_linear_release_buffers(L->lin));
    out->y = tensor_to_host(L->y);
    out->dx = tensor_to_host(L->dx);
    fp8amp_tensor g, bg;
    EXPECT_OK(fp8amp_linear_weight_grad(L->lin, &g));
    EXPECT_OK(fp8amp_linear_bias_grad(L->lin, &bg));
    out->wgrad = tensor_to_host(g);
    out->wgrad_bytes = tensor_bytes(g);
    out->bgrad = tensor_to_host(bg);
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_tensor_destroy(bg));
}

static void expect_same(const results *a, const results *b) {
    assert_memory_equal(a->y, b->y, (size_t)M * N * 2);
    assert_memory_equal(a->dx, b->dx, (size_t)M * K * 2);
    assert_int_equal(a->wgrad_bytes, b->wgrad_bytes);
    assert_memory_equal(a->wgrad, b->wgrad, a->wgrad_bytes);
    assert_memory_equal(a->bgrad, b->bgrad, (size_t)N * 4);
}

/* Nothing NaN, something non-zero: a run that wrote nothing cannot pass. */
static void expect_sane(const results *r) {
    const float *bg = (const float *)r->bgrad;
    int nonzero = 0;
    for (size_t j = 0; j < N; ++j) {
        assert_false(bg[j] != bg[j]);
        nonzero |= bg[j] != 0;
    }
    assert_true(nonzero);
    const uint16_t *dx = (const uint16_t *)r->dx;
    nonzero = 0;
    for (size_t j = 0; j < (size_t)M * K; ++j) {
        assert_false((dx[j] & 0x7FFF) > 0x7F80); /* BF16 NaN */
        nonzero |= (dx[j] & 0x7FFF) != 0;
    }
    assert_true(nonzero);
}

/* The parameters' and gradients' bytes: the weight, F32 bias, the weight gradient (E4M3: with its
 * 4-byte scale slot), F32 bias gradient. */
static size_t param_bytes(fp8amp_dtype wdt, fp8amp_dtype wgrad) {
    return (size_t)N * K * fp8amp_dtype_size(wdt) + N * 4 + (size_t)N * K * fp8amp_dtype_size(wgrad) +
           (wgrad == FP8AMP_DTYPE_E4M3 ? 4 : 0) + N * 4;
}

/* Three steps of ROUNDS micro-batches on three twins: `keep` (plain), `rel` (plain, releasing its
 * buffers after each step's first backward) and `lean`. Every micro-batch's y and dX, and the first
 * micro-batch's gradients, are the same bytes in all three; the accumulated gradients of `lean` are
 * those of `rel`. Between steps the weight changes (as an optimizer's update). */
static void lean_same_bytes(void **state, fp8amp_gemm_policy policy, fp8amp_dtype wdt, fp8amp_dtype wgrad, int accum,
                            int level) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    fp8amp_context ctx = make_context(dev);
    layer keep = make_layer(ctx, d, policy, wdt, wgrad, 0), rel = make_layer(ctx, d, policy, wdt, wgrad, 0),
          lean = make_layer(ctx, d, policy, wdt, wgrad, level);
    float *w = xmemdup(d->w, sizeof d->w);
    const int fp8 = policy == FP8AMP_GEMM_ALWAYS_FP8;
    for (int step = 0; step < 3; ++step) {
        for (int r = 0; r < ROUNDS; ++r) {
            results a, b, c;
            micro_batch(&keep, d, r, 0, accum, &a);
            micro_batch(&rel, d, r, 1, accum, &b);
            micro_batch(&lean, d, r, 0, accum, &c);
            expect_sane(&c);
            /* Level 1 changes no bit, nor does level 2 without accumulation; with it, level 2's first
             * accumulation (one rounding more) moves the gradients, and under the delayed recipe (the
             * default) the WEIGHT_GRAD meta's amax history too, hence the next steps' gradient
             * scales: there it equals `rel`. An F32 gradient is its own sum: lean changes nothing. */
            if (level == 1 || !accum || (step == 0 && r == 0) || wgrad == FP8AMP_DTYPE_F32) {
                expect_same(&a, &c);
            } else {
                assert_memory_equal(a.y, c.y, (size_t)M * N * 2);
                assert_memory_equal(a.dx, c.dx, (size_t)M * K * 2);
            }
            if (level == 2) expect_same(&b, &c);
            free_results(&a);
            free_results(&b);
            free_results(&c);
            /* after a lean backward: the parameters and gradients, the bias's BF16 epilogue copy (FP8
             * path), and the FP32 sum that an accumulating backward made and keeps for the next one */
            const size_t sum = (level == 1 || (accum && r > 0)) && wgrad != FP8AMP_DTYPE_F32 ? (size_t)N * K * 4 : 0;
            const size_t held = test_linear_memory_bytes(lean.lin);
            assert_true(held >= param_bytes(wdt, wgrad) + sum);
            assert_true(held - param_bytes(wdt, wgrad) - sum <= 4 * N);
        }
        for (size_t i = 0; i < (size_t)N * K; ++i) w[i] *= (float)(1.0 - 0.01 * (step + 1)) * (i % 2 ? 1.0f : -1.0f);
        write_weight(&keep, w);
        write_weight(&rel, w);
        write_weight(&lean, w);
    }
    /* a lean training forward holds its parameters and the saved input (FP8 path: x8^T; wide path: x
     * and the weight in the wide dtype); its backward gives them back (a Linear of its own: another
     * call on the twins would move their scaling metas) */
    layer probe = make_layer(ctx, d, policy, wdt, wgrad, level);
    const size_t kept_sum = level == 1 && wgrad != FP8AMP_DTYPE_F32 ? (size_t)N * K * 4 : 0;
    for (int step = 0; step < 2; ++step) {
        EXPECT_OK(fp8amp_tensor_copy_from_host(probe.x, d->x[step], tensor_bytes(probe.x)));
        EXPECT_OK(fp8amp_linear_forward(probe.lin, probe.x, probe.y, 1));
        const size_t fwd = test_linear_memory_bytes(probe.lin);
        EXPECT_OK(fp8amp_tensor_copy_from_host(probe.dy, d->dy[step], tensor_bytes(probe.dy)));
        EXPECT_OK(fp8amp_linear_backward(probe.lin, probe.dy, NULL, 0));
        const size_t bwd = test_linear_memory_bytes(probe.lin);
        EXPECT_OK(fp8amp_linear_release_buffers(probe.lin));
        assert_int_equal(test_linear_memory_bytes(probe.lin), param_bytes(wdt, wgrad));
        /* after the backward: the parameters and at most the bias's epilogue copy */
        assert_true(bwd >= param_bytes(wdt, wgrad) + kept_sum);
        assert_true(bwd - param_bytes(wdt, wgrad) - kept_sum <= 4 * N);
        /* the forward held the saved input beyond that: x8^T with its scale slot (no W8 nor W8^T, which
         * the backward re-makes), or x in the wide dtype */
        assert_true(fwd + kept_sum > bwd);
        if (fp8)
            assert_int_equal(fwd + kept_sum - bwd, (size_t)M * K + 4);
        else
            assert_true(fwd + kept_sum - bwd >= (size_t)M * K * 2);
    }
    free_layer(&probe);
    free(w);
    free_layer(&keep);
    free_layer(&rel);
    free_layer(&lean);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(d);
}

#define SAME(name, policy, wdt, wgrad, accum, level) \
    static void name(void **s) { lean_same_bytes(s, FP8AMP_GEMM_##policy, FP8AMP_DTYPE_##wdt, FP8AMP_DTYPE_##wgrad, accum, level); }
SAME(test_l1_fp8_e4m3, ALWAYS_FP8, F32, E4M3, 1, 1)
SAME(test_l1_fp8_bf16, ALWAYS_FP8, F32, BF16, 1, 1)
SAME(test_l1_fp8_bf16w, ALWAYS_FP8, BF16, E4M3, 1, 1)
SAME(test_l1_wide_e4m3, NEVER_FP8, F32, E4M3, 1, 1)
SAME(test_l2_fp8_e4m3, ALWAYS_FP8, F32, E4M3, 1, 2)
SAME(test_l2_fp8_e4m3_noacc, ALWAYS_FP8, F32, E4M3, 0, 2)
SAME(test_l2_fp8_bf16, ALWAYS_FP8, F32, BF16, 1, 2)
SAME(test_l2_fp8_f32, ALWAYS_FP8, F32, F32, 1, 2)
SAME(test_l2_fp8_bf16w, ALWAYS_FP8, BF16, E4M3, 1, 2)
SAME(test_l2_wide_e4m3, NEVER_FP8, F32, E4M3, 1, 2)
SAME(test_l2_wide_e4m3_noacc, NEVER_FP8, F32, E4M3, 0, 2)
SAME(test_l2_wide_bf16w, NEVER_FP8, BF16, BF16, 1, 2)

/* Counting hooks that also record the high-water mark. */
typedef struct {
    size_t live, peak;
} peak_counter;

static void *peak_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    (void)device;
    (void)stream;
    void *p = NULL;
    if (posix_memalign(&p, 256, nbytes ? nbytes : 1) != 0) return NULL;
    peak_counter *c = (peak_counter *)user;
    c->live += nbytes;
    if (c->live > c->peak) c->peak = c->live;
    return p;
}

static void peak_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    (void)device;
    (void)stream;
    ((peak_counter *)user)->live -= nbytes;
    free(ptr);
}

/* A chain of L square Linears (K -> K), one training step (forwards, then backwards in reverse,
 * each on its own context with counting hooks): the plain chain ends its backward holding, per
 * Linear, the FP32 sum (4 K^2), the FP8 weight and transpose (2 K^2) and the saved x8^T (M K); the
 * lean one at most one FP32 sum and one FP8 weight (in the shared scratch). Its peak is lower by at
 * least what the plain chain's earlier Linears hold then. The outputs are the same bytes. */
static void chain_peak(int level) {
    enum { L = 4, KK = 256, MM = 128 };
    uint16_t *x = xmalloc((size_t)MM * KK * 2), *dy = xmalloc((size_t)MM * KK * 2);
    test_fill_bf16(x, (size_t)MM * KK, 2.0);
    test_fill_bf16(dy, (size_t)MM * KK, 0.5);
    float *w = xmalloc((size_t)L * KK * KK * 4); /* the same weights in both chains */
    for (size_t j = 0; j < (size_t)L * KK * KK; ++j) w[j] = (float)test_rng_uniform(-0.15, 0.15);
    size_t peaks[2], live_after[2], pool[2];
    void *dx_host[2];
    for (int lean = 0; lean < 2; ++lean) {
        peak_counter c = {0, 0};
        fp8amp_context ctx = make_context(cpu_device());
        EXPECT_OK(fp8amp_context_set_allocator(ctx, peak_alloc, peak_free, &c));
        fp8amp_linear lin[L];
        fp8amp_tensor act[L + 1], grad[L + 1];
        const int64_t s[2] = {MM, KK};
        for (int i = 0; i <= L; ++i) {
            act[i] = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, s);
            grad[i] = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, s);
        }
        for (int i = 0; i < L; ++i) {
            fp8amp_linear_desc desc;
            EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
            desc.in_features = desc.out_features = KK;
            desc.policy = FP8AMP_GEMM_ALWAYS_FP8;
            desc.weight_dtype = FP8AMP_DTYPE_F32;
            EXPECT_OK(fp8amp_linear_create(ctx, &desc, &lin[i]));
            EXPECT_OK(fp8amp_linear_set_lean(lin[i], lean ? level : 0));
            fp8amp_tensor t;
            EXPECT_OK(fp8amp_linear_weight(lin[i], &t));
            EXPECT_OK(fp8amp_tensor_copy_from_host(t, w + (size_t)i * KK * KK, (size_t)KK * KK * 4));
            EXPECT_OK(fp8amp_tensor_destroy(t));
        }
        EXPECT_OK(fp8amp_tensor_copy_from_host(act[0], x, (size_t)MM * KK * 2));
        EXPECT_OK(fp8amp_tensor_copy_from_host(grad[L], dy, (size_t)MM * KK * 2));
        const size_t base = c.live;
        c.peak = c.live;
        for (int i = 0; i < L; ++i) EXPECT_OK(fp8amp_linear_forward(lin[i], act[i], act[i + 1], 1));
        for (int i = L - 1; i >= 0; --i) EXPECT_OK(fp8amp_linear_backward(lin[i], grad[i + 1], grad[i], 0));
        peaks[lean] = c.peak - base;
        EXPECT_OK(fp8amp_context_scratch_bytes(ctx, &pool[lean]));
        live_after[lean] = c.live - base;
        dx_host[lean] = tensor_to_host(grad[0]);
        for (int i = 0; i < L; ++i) EXPECT_OK(fp8amp_linear_destroy(lin[i]));
        for (int i = 0; i <= L; ++i) {
            EXPECT_OK(fp8amp_tensor_destroy(act[i]));
            EXPECT_OK(fp8amp_tensor_destroy(grad[i]));
        }
        EXPECT_OK(fp8amp_context_destroy(ctx));
        assert_int_equal(c.live, 0);
    }
    assert_memory_equal(dx_host[0], dx_host[1], (size_t)MM * KK * 2);
    const uint16_t *dx = (const uint16_t *)dx_host[1];
    int nonzero = 0;
    for (size_t j = 0; j < (size_t)MM * KK; ++j) {
        assert_false((dx[j] & 0x7FFF) > 0x7F80);
        nonzero |= (dx[j] & 0x7FFF) != 0;
    }
    assert_true(nonzero);
    print_message("lean %d, chain of %d: peak %zu bytes plain, %zu lean; held after the backward %zu plain, %zu lean\n", level, L,
                  peaks[0], peaks[1], live_after[0], live_after[1]);
    /* what the plain chain's first L-1 Linears hold at its last backward, beyond the lean chain's */
    const size_t per = (level == 2 ? 4 * (size_t)KK * KK : 0) + 2 * (size_t)KK * KK + (size_t)MM * KK;
    /* (the lean chain's scratch pool is larger by the shared FP32 sum and FP8 weight: counted) */
    print_message("scratch pool %zu bytes plain, %zu lean\n", pool[0], pool[1]);
    assert_true(pool[1] >= pool[0]);
    assert_true(peaks[1] + (L - 1) * per <= peaks[0] + (pool[1] - pool[0]));
    assert_true(live_after[1] + L * per <= live_after[0] + (pool[1] - pool[0]));
    free(dx_host[0]);
    free(dx_host[1]);
    free(w);
    free(x);
    free(dy);
}

/* A lean backward re-makes the weight's FP8 transpose from the weight: after the weight was written
 * (through a handle, or fp8amp_linear_weight_changed) since the training forward it refuses to run
 * (INVALID_ARGUMENT, nothing changed) unless it computes no dX; a new forward makes it run. */
static void weight_written(void **state, int how) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    fp8amp_context ctx = make_context(dev);
    layer L = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E4M3, 1);
    layer R = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E4M3, 0);
    float *w2 = xmalloc(sizeof d->w);
    for (size_t i = 0; i < (size_t)N * K; ++i) w2[i] = (float)test_rng_uniform(-0.1, 0.1);
    EXPECT_OK(fp8amp_tensor_copy_from_host(L.x, d->x[0], tensor_bytes(L.x)));
    EXPECT_OK(fp8amp_tensor_copy_from_host(L.dy, d->dy[0], tensor_bytes(L.dy)));
    EXPECT_OK(fp8amp_tensor_copy_from_host(R.x, d->x[0], tensor_bytes(R.x)));
    EXPECT_OK(fp8amp_tensor_copy_from_host(R.dy, d->dy[0], tensor_bytes(R.dy)));
    EXPECT_OK(fp8amp_linear_forward(L.lin, L.x, L.y, 1));
    if (how == 0)
        write_weight(&L, w2);
    else
        EXPECT_OK(fp8amp_linear_weight_changed(L.lin));
    fp8amp_tensor g;
    EXPECT_OK(fp8amp_linear_weight_grad(L.lin, &g));
    void *g_before = tensor_to_host(g), *dx_before = tensor_to_host(L.dx);
    EXPECT_STATUS(fp8amp_linear_backward(L.lin, L.dy, L.dx, 0), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "lean"));
    void *g_after = tensor_to_host(g), *dx_after = tensor_to_host(L.dx);
    assert_memory_equal(g_before, g_after, tensor_bytes(g));
    assert_memory_equal(dx_before, dx_after, tensor_bytes(L.dx));
    /* a new forward, then the backward runs: the same bytes as a plain twin's with that weight */
    if (how == 0) write_weight(&R, w2);
    EXPECT_OK(fp8amp_linear_forward(L.lin, L.x, L.y, 1));
    EXPECT_OK(fp8amp_linear_backward(L.lin, L.dy, L.dx, 0));
    EXPECT_OK(fp8amp_linear_forward(R.lin, R.x, R.y, 1));
    EXPECT_OK(fp8amp_linear_backward(R.lin, R.dy, R.dx, 0));
    void *dxl = tensor_to_host(L.dx), *dxr = tensor_to_host(R.dx);
    assert_memory_equal(dxl, dxr, tensor_bytes(L.dx));
    /* without dX the backward needs no weight copy: it runs after a write too */
    EXPECT_OK(fp8amp_linear_forward(L.lin, L.x, L.y, 1));
    write_weight(&L, d->w);
    EXPECT_OK(fp8amp_linear_backward(L.lin, L.dy, NULL, 0));
    free(g_before);
    free(g_after);
    free(dx_before);
    free(dx_after);
    free(dxl);
    free(dxr);
    free(w2);
    EXPECT_OK(fp8amp_tensor_destroy(g));
    free_layer(&L);
    free_layer(&R);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(d);
}

static void test_weight_written(void **s) { weight_written(s, 0); }
static void test_weight_changed(void **s) { weight_written(s, 1); }

static void test_chain_peak_1(void **state) {
    (void)state;
    chain_peak(1);
}

static void test_chain_peak_2(void **state) {
    (void)state;
    chain_peak(2);
}

static void test_bad_arguments(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = K;
    desc.out_features = N;
    fp8amp_linear lin;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &lin));
    int32_t got = 7;
    EXPECT_STATUS(fp8amp_linear_set_lean(lin, 3), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_linear_set_lean(lin, -1), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_linear_get_lean(lin, &got));
    assert_int_equal(got, 0); /* a refused call changed nothing */
    EXPECT_OK(fp8amp_linear_set_lean(lin, 2));
    EXPECT_STATUS(fp8amp_linear_set_lean(lin, 7), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_linear_get_lean(lin, &got));
    assert_int_equal(got, 2);
    EXPECT_STATUS(fp8amp_linear_get_lean(lin, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_linear_set_lean(NULL, 1), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_set_lean((fp8amp_linear)ctx, 1), FP8AMP_ERROR_INVALID_HANDLE);
    got = 7;
    EXPECT_STATUS(fp8amp_linear_get_lean((fp8amp_linear)ctx, &got), FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(got, 7);
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_STATUS(fp8amp_linear_set_lean(lin, 1), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_l1_fp8_e4m3),  DEVICE_TESTS(test_l1_fp8_bf16),        DEVICE_TESTS(test_l1_fp8_bf16w),
        DEVICE_TESTS(test_l1_wide_e4m3), DEVICE_TESTS(test_l2_fp8_e4m3),        DEVICE_TESTS(test_l2_fp8_e4m3_noacc),
        DEVICE_TESTS(test_l2_fp8_bf16),  DEVICE_TESTS(test_l2_fp8_f32),         DEVICE_TESTS(test_l2_fp8_bf16w),
        DEVICE_TESTS(test_l2_wide_e4m3), DEVICE_TESTS(test_l2_wide_e4m3_noacc), DEVICE_TESTS(test_l2_wide_bf16w),
        DEVICE_TESTS(test_weight_written), DEVICE_TESTS(test_weight_changed),
        cmocka_unit_test(test_chain_peak_1), cmocka_unit_test(test_chain_peak_2), cmocka_unit_test(test_bad_arguments),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
