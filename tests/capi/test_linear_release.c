/* fp8amp_linear_release_buffers and fp8amp_linear_memory_bytes (issue 18 point 3, docs/linear.md
 * section 5): at rest after a step a Linear holds its parameters and gradients only. Checked here:
 * after training forwards, backwards (two micro-batches), a weight update and the release, the
 * Linear's bytes are exactly its parameters' and gradients' (also counted through allocator hooks);
 * a Linear that releases at every step boundary delivers the same bytes as one that never does (the
 * FP8 and the wide GEMM paths, E4M3 and BF16 weight gradients, accumulation over micro-batches);
 * a release between a training forward and its backward keeps what that backward reads; an
 * accumulating backward after a release adds to the delivered gradient's value; a forward or
 * backward after a release whose allocations fail changes nothing and its retry gives the same
 * bytes; bad handles. */
#include <math.h>

#include "test_util.h"
#include "byte_counter.h"

enum { K = 96, N = 64, M = 48 };

static float f32_of_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The host data of a run: an F32 weight and bias, and per micro-batch x and dy (BF16). */
enum { ROUNDS = 2 };
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
    fp8amp_context ctx;
    fp8amp_linear lin;
    fp8amp_tensor x, y, dy, dx;
} layer;

static layer make_layer(fp8amp_context ctx, const run_data *d, fp8amp_gemm_policy policy, fp8amp_dtype wgrad) {
    layer L;
    L.ctx = ctx;
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = K;
    desc.out_features = N;
    desc.policy = policy;
    desc.weight_dtype = FP8AMP_DTYPE_F32; /* the PyTorch front's O1/O2 */
    desc.wgrad_dtype = wgrad;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &L.lin));
    fp8amp_tensor w, b;
    EXPECT_OK(fp8amp_linear_weight(L.lin, &w));
    EXPECT_OK(fp8amp_tensor_copy_from_host(w, d->w, sizeof d->w));
    EXPECT_OK(fp8amp_linear_bias(L.lin, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, d->b, sizeof d->b));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    test_linear_io(ctx, M, K, N, &L.x, &L.dx, &L.y, &L.dy);
    return L;
}

static void free_layer(layer *L) { test_linear_free(L->lin, L->x, L->dx, L->y, L->dy); }

/* The parameters' and gradients' bytes: F32 weight, F32 bias, the weight gradient (E4M3: with its
 * 4-byte scale slot), F32 bias gradient. */
static size_t param_bytes(fp8amp_dtype wgrad) {
    return (size_t)N * K * 4 + N * 4 + (size_t)N * K * fp8amp_dtype_size(wgrad) +
           (wgrad == FP8AMP_DTYPE_E4M3 ? 4 : 0) + N * 4;
}

/* The weight written as an optimizer would (through a handle: the Linear notices). */
static void update_weight(layer *L, int step) {
    float w[N * K];
    fp8amp_tensor t;
    EXPECT_OK(fp8amp_linear_weight(L->lin, &t));
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, w, sizeof w));
    for (size_t i = 0; i < (size_t)N * K; ++i) w[i] *= (float)(1.0 - 0.01 * (step + 1)) * (i % 2 ? 1.0f : -1.0f);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, w, sizeof w));
    EXPECT_OK(fp8amp_tensor_destroy(t));
}

/* Everything one step delivered, in host memory. */
typedef struct {
    void *y[ROUNDS], *dx[ROUNDS], *wgrad, *bgrad;
    size_t wgrad_bytes;
} results;

static void free_results(results *r) {
    for (int k = 0; k < ROUNDS; ++k) {
        free(r->y[k]);
        free(r->dx[k]);
    }
    free(r->wgrad);
    free(r->bgrad);
}

/* One step: ROUNDS micro-batches (the first overwrites the gradients, the next accumulate), the
 * gradients read, the weight updated. release: 1 releases after the update (a step boundary), 2 also
 * between each training forward and its backward (what the backward reads must stay). */
static void run_step(layer *L, const run_data *d, int step, int release, results *out) {
    for (int r = 0; r < ROUNDS; ++r) {
        EXPECT_OK(fp8amp_tensor_copy_from_host(L->x, d->x[r], tensor_bytes(L->x)));
        EXPECT_OK(fp8amp_linear_forward(L->lin, L->x, L->y, 1));
        /* (only before an overwriting backward: the given-back sum would cost an accumulating one a rounding) */
        if (release == 2 && r == 0) EXPECT_OK(fp8amp_linear_release_buffers(L->lin));
        EXPECT_OK(fp8amp_tensor_copy_from_host(L->dy, d->dy[r], tensor_bytes(L->dy)));
        EXPECT_OK(fp8amp_linear_backward(L->lin, L->dy, L->dx, r));
        out->y[r] = tensor_to_host(L->y);
        out->dx[r] = tensor_to_host(L->dx);
    }
    fp8amp_tensor g, bg;
    EXPECT_OK(fp8amp_linear_weight_grad(L->lin, &g));
    EXPECT_OK(fp8amp_linear_bias_grad(L->lin, &bg));
    out->wgrad = tensor_to_host(g);
    out->wgrad_bytes = tensor_bytes(g);
    out->bgrad = tensor_to_host(bg);
    EXPECT_OK(fp8amp_tensor_destroy(g));
    EXPECT_OK(fp8amp_tensor_destroy(bg));
    update_weight(L, step);
    if (release) EXPECT_OK(fp8amp_linear_release_buffers(L->lin));
}

static void expect_same(const results *a, const results *b) {
    for (int r = 0; r < ROUNDS; ++r) {
        assert_memory_equal(a->y[r], b->y[r], (size_t)M * N * 2);
        assert_memory_equal(a->dx[r], b->dx[r], (size_t)M * K * 2);
    }
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
    const uint16_t *dx = (const uint16_t *)r->dx[ROUNDS - 1];
    nonzero = 0;
    for (size_t j = 0; j < (size_t)M * K; ++j) {
        assert_false((dx[j] & 0x7FFF) > 0x7F80); /* BF16 NaN */
        nonzero |= (dx[j] & 0x7FFF) != 0;
    }
    assert_true(nonzero);
}

/* Three steps of two micro-batches on twin Linears, one releasing at every step boundary (release
 * 1) or also between forward and backward (release 2), the other never: the same bytes throughout;
 * after each release the Linear holds exactly its parameters and gradients. */
static void same_bytes(void **state, fp8amp_gemm_policy policy, fp8amp_dtype wgrad, int release) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    fp8amp_context ctx = make_context(dev);
    layer keep = make_layer(ctx, d, policy, wgrad), rel = make_layer(ctx, d, policy, wgrad);
    assert_int_equal(test_linear_memory_bytes(rel.lin), param_bytes(wgrad)); /* fresh: nothing beyond them */
    for (int step = 0; step < 3; ++step) {
        results a, b;
        run_step(&keep, d, step, 0, &a);
        run_step(&rel, d, step, release, &b);
        expect_sane(&a);
        expect_same(&a, &b);
        free_results(&a);
        free_results(&b);
        /* the Linear that keeps its buffers holds more: the saved input at least */
        const size_t kept = test_linear_memory_bytes(keep.lin);
        print_message("step %d: kept %zu bytes, released %zu, parameters and gradients %zu\n", step, kept,
                      test_linear_memory_bytes(rel.lin), param_bytes(wgrad));
        assert_true(kept >= param_bytes(wgrad) + (size_t)M * K);
        assert_int_equal(test_linear_memory_bytes(rel.lin), param_bytes(wgrad));
    }
    free_layer(&keep);
    free_layer(&rel);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(d);
}

static void test_same_bytes_fp8_e4m3(void **s) { same_bytes(s, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3, 1); }
static void test_same_bytes_fp8_bf16(void **s) { same_bytes(s, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_BF16, 1); }
static void test_same_bytes_wide_e4m3(void **s) { same_bytes(s, FP8AMP_GEMM_NEVER_FP8, FP8AMP_DTYPE_E4M3, 1); }
static void test_same_bytes_fp8_f32(void **s) { same_bytes(s, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_F32, 1); }
static void test_release_before_backward_fp8(void **s) { same_bytes(s, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3, 2); }
static void test_release_before_backward_wide(void **s) { same_bytes(s, FP8AMP_GEMM_NEVER_FP8, FP8AMP_DTYPE_BF16, 2); }

/* Through allocator hooks (CPU): what a release gives back is exactly what memory_bytes stopped
 * counting, and the Linear's bytes are its parameters and gradients, plus its scale slots. */
static void test_counted(void **state) {
    (void)state;
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    byte_counter c = {0, 0, 0};
    fp8amp_context ctx = make_context(cpu_device());
    EXPECT_OK(fp8amp_context_set_allocator(ctx, count_alloc, count_free, &c));
    const size_t before = c.live;
    layer L = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3);
    const size_t created = c.live - before; /* parameters, gradients, the x/y/dy/dx tensors, scale slots */
    results r;
    run_step(&L, d, 0, 0, &r);
    free_results(&r);
    const size_t held = test_linear_memory_bytes(L.lin);
    size_t pool = 0;
    EXPECT_OK(fp8amp_context_scratch_bytes(ctx, &pool));
    const size_t live = c.live;
    /* FP8 weight + transpose, saved x8^T, FP32 sum (docs/linear.md section 5) */
    /* (+ the bias in BF16 for the epilogue, and the three FP8 copies' scale slots) */
    assert_int_equal(held, param_bytes(FP8AMP_DTYPE_E4M3) + 2 * (size_t)N * K + (size_t)M * K + 4 * (size_t)N * K +
                               2 * N + 3 * 4);
    EXPECT_OK(fp8amp_linear_release_buffers(L.lin));
    assert_int_equal(test_linear_memory_bytes(L.lin), param_bytes(FP8AMP_DTYPE_E4M3));
    const size_t released = held - param_bytes(FP8AMP_DTYPE_E4M3);
    assert_int_equal(c.live, live - released);
    /* what is left beyond creation is the context's pool and workspace, plus scale slots */
    print_message("created %zu, after the step %zu, released %zu, pool %zu, left %zu\n", created, live - before,
                  released, pool, c.live - before);
    assert_true(c.live - before - created - pool <= 16 * sizeof(float));
    EXPECT_OK(fp8amp_linear_release_buffers(L.lin)); /* nothing left: a no-op */
    assert_int_equal(c.live, live - released);
    free_layer(&L);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(c.live, before);
    assert_int_equal(c.allocs, c.frees);
    free(d);
}

/* After a release an accumulating backward adds to the delivered gradient's value: BF16 (on the CPU
 * exactly bf16(g1 + dW2), dW2 from a twin with an F32 gradient) and E4M3 (within its rounding). */
static void accumulate_after_release(void **state, fp8amp_dtype wgrad) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    const int cpu = dev.type == FP8AMP_DEVICE_CPU;
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    fp8amp_context ctx = make_context(dev);
    layer A = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, wgrad);
    layer B = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_F32);
    const int64_t ws[2] = {N, K};
    fp8amp_tensor ga, gb, g32 = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, ws);
    EXPECT_OK(fp8amp_linear_weight_grad(A.lin, &ga));
    EXPECT_OK(fp8amp_linear_weight_grad(B.lin, &gb));
    float *g1 = xmalloc((size_t)N * K * 4), *dw2 = xmalloc((size_t)N * K * 4), *got = xmalloc((size_t)N * K * 4);
    for (int r = 0; r < ROUNDS; ++r) {
        for (int t = 0; t < 2; ++t) {
            layer *L = t ? &B : &A;
            EXPECT_OK(fp8amp_tensor_copy_from_host(L->x, d->x[r], tensor_bytes(L->x)));
            EXPECT_OK(fp8amp_linear_forward(L->lin, L->x, L->y, 1));
            EXPECT_OK(fp8amp_tensor_copy_from_host(L->dy, d->dy[r], tensor_bytes(L->dy)));
            /* A accumulates its second micro-batch onto the first after a release; B overwrites */
            EXPECT_OK(fp8amp_linear_backward(L->lin, L->dy, L->dx, t == 0 && r == 1));
        }
        if (r == 0) {
            if (wgrad == FP8AMP_DTYPE_E4M3)
                EXPECT_OK(fp8amp_dequantize(ctx, ga, g32));
            else
                EXPECT_OK(fp8amp_cast(ctx, ga, g32));
            EXPECT_OK(fp8amp_tensor_copy_to_host(g32, g1, (size_t)N * K * 4));
            EXPECT_OK(fp8amp_linear_release_buffers(A.lin));
            assert_int_equal(test_linear_memory_bytes(A.lin), param_bytes(wgrad));
        }
    }
    EXPECT_OK(fp8amp_tensor_copy_to_host(gb, dw2, (size_t)N * K * 4));
    if (wgrad == FP8AMP_DTYPE_E4M3)
        EXPECT_OK(fp8amp_dequantize(ctx, ga, g32));
    else
        EXPECT_OK(fp8amp_cast(ctx, ga, g32));
    EXPECT_OK(fp8amp_tensor_copy_to_host(g32, got, (size_t)N * K * 4));
    /* E4M3: the sum is quantized with the delayed scale, fitted to the first micro-batch's gradient
     * (the recipe's, with or without a release), so where g1 + dW2 outgrows it the value saturates at
     * 448 * scale_inv. The reference is the sum clamped there; each element must be within one E4M3
     * step of it (the reload is exact, the sum is rounded once; the GEMM's summation order may differ
     * from g1 + dW2 by float rounding). */
    double top = INFINITY, step_min = 0;
    if (wgrad == FP8AMP_DTYPE_E4M3) {
        fp8amp_tensor si;
        EXPECT_OK(fp8amp_tensor_scale_inv(ga, &si));
        const double scale_inv = test_read_f32_scalar(si);
        EXPECT_OK(fp8amp_tensor_destroy(si));
        assert_true(scale_inv > 0 && isfinite(scale_inv));
        top = 448.0 * scale_inv;
        step_min = ldexp(scale_inv, -9); /* E4M3's subnormal step */
    }
    double err = 0, norm = 0, off = 0;
    size_t clamped = 0;
    for (size_t i = 0; i < (size_t)N * K; ++i) {
        const double sum = (double)g1[i] + dw2[i];
        const double want = sum > top ? top : sum < -top ? -top : sum;
        clamped += want != sum;
        assert_false(got[i] != got[i]);
        if (wgrad == FP8AMP_DTYPE_BF16 && cpu) assert_true(got[i] == f32_of_bf16(test_bf16_of((float)sum)));
        if (wgrad == FP8AMP_DTYPE_E4M3) {
            int e;
            frexp(fabs(want), &e); /* |want| in [2^(e-1), 2^e): an E4M3 step there is 2^(e-4) */
            const double step = fmax(ldexp(1.0, e - 4), step_min);
            if (fabs(got[i] - want) > step)
                fail_msg("element %zu: got %g, want %g (g1 %g + dW2 %g, top %g)", i, got[i], want, g1[i], dw2[i], top);
        }
        err += ((double)got[i] - want) * ((double)got[i] - want);
        norm += want * want;
        off += ((double)got[i] - dw2[i]) * ((double)got[i] - dw2[i]);
    }
    print_message("after a release: |got - (g1 + dW2)| / |g1 + dW2| = %g (%zu of %d saturated at the delayed "
                  "scale), |got - dW2| / |g1 + dW2| = %g\n",
                  sqrt(err / norm), clamped, N * K, sqrt(off / norm));
    assert_true(norm > 0);
    assert_true(clamped < (size_t)N * K / 16); /* saturation is the tail, not the bulk */
    assert_true(sqrt(err / norm) < (wgrad == FP8AMP_DTYPE_E4M3 ? 0.0625 : 0.01));
    assert_true(sqrt(off / norm) > 0.2); /* the first micro-batch is in it (not overwritten) */
    free(g1);
    free(dw2);
    free(got);
    EXPECT_OK(fp8amp_tensor_destroy(ga));
    EXPECT_OK(fp8amp_tensor_destroy(gb));
    EXPECT_OK(fp8amp_tensor_destroy(g32));
    free_layer(&A);
    free_layer(&B);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(d);
}

static void test_accumulate_after_release_bf16(void **s) { accumulate_after_release(s, FP8AMP_DTYPE_BF16); }
static void test_accumulate_after_release_e4m3(void **s) { accumulate_after_release(s, FP8AMP_DTYPE_E4M3); }

/* Allocator hooks that refuse one allocation (the fail_at-th from now; 0: none) and count the rest. */
typedef struct {
    int count, fail_at, failed;
} failing_counter;

static void *failing_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    void *p = NULL;
    (void)device;
    (void)stream;
    failing_counter *c = (failing_counter *)user;
    if (c->fail_at && ++c->count == c->fail_at) {
        c->failed++;
        return NULL;
    }
    if (posix_memalign(&p, 256, nbytes ? nbytes : 1) != 0) return NULL;
    return p;
}

static void failing_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    (void)user;
    (void)nbytes;
    (void)device;
    (void)stream;
    free(ptr);
}

/* After a release, every allocation of the next forward and of the accumulating backward fails in
 * turn: the failed call changes no delivered byte, and the retried step ends bit-identical to a twin
 * whose calls never failed (the given-back sum is re-made from the delivered gradient on the retry). */
static void test_failed_calls_after_release(void **state) {
    (void)state;
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    for (int phase = 0; phase < 2; ++phase) { /* 0: the forward's allocations fail, 1: the backward's */
        for (int fail_at = 1;; ++fail_at) {
            failing_counter c = {0, 0, 0};
            fp8amp_context ctx = make_context(cpu_device());
            EXPECT_OK(fp8amp_context_set_allocator(ctx, failing_alloc, failing_free, &c));
            layer A = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3);
            layer B = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3);
            for (int t = 0; t < 2; ++t) { /* micro-batch 0 on both, then a release */
                layer *L = t ? &B : &A;
                EXPECT_OK(fp8amp_tensor_copy_from_host(L->x, d->x[0], tensor_bytes(L->x)));
                EXPECT_OK(fp8amp_linear_forward(L->lin, L->x, L->y, 1));
                EXPECT_OK(fp8amp_tensor_copy_from_host(L->dy, d->dy[0], tensor_bytes(L->dy)));
                EXPECT_OK(fp8amp_linear_backward(L->lin, L->dy, L->dx, 0));
                EXPECT_OK(fp8amp_linear_release_buffers(L->lin));
            }
            fp8amp_tensor ga, gb;
            EXPECT_OK(fp8amp_linear_weight_grad(A.lin, &ga));
            EXPECT_OK(fp8amp_linear_weight_grad(B.lin, &gb));
            void *g_before = tensor_to_host(ga);
            /* micro-batch 1, accumulating: B plainly; A with one allocation refused, then retried */
            EXPECT_OK(fp8amp_tensor_copy_from_host(B.x, d->x[1], tensor_bytes(B.x)));
            EXPECT_OK(fp8amp_linear_forward(B.lin, B.x, B.y, 1));
            EXPECT_OK(fp8amp_tensor_copy_from_host(B.dy, d->dy[1], tensor_bytes(B.dy)));
            EXPECT_OK(fp8amp_linear_backward(B.lin, B.dy, B.dx, 1));
            EXPECT_OK(fp8amp_tensor_copy_from_host(A.x, d->x[1], tensor_bytes(A.x)));
            EXPECT_OK(fp8amp_tensor_copy_from_host(A.dy, d->dy[1], tensor_bytes(A.dy)));
            c.count = 0;
            c.fail_at = phase == 0 ? fail_at : 0;
            fp8amp_status st = fp8amp_linear_forward(A.lin, A.x, A.y, 1);
            if (phase == 0 && st != FP8AMP_SUCCESS) {
                assert_int_equal(st, FP8AMP_ERROR_OUT_OF_MEMORY);
                c.fail_at = 0;
                EXPECT_OK(fp8amp_linear_forward(A.lin, A.x, A.y, 1));
            } else {
                assert_int_equal(st, FP8AMP_SUCCESS);
            }
            const int forward_failed = c.failed;
            c.count = 0;
            c.fail_at = phase == 1 ? fail_at : 0;
            st = fp8amp_linear_backward(A.lin, A.dy, A.dx, 1);
            if (phase == 1 && st != FP8AMP_SUCCESS) {
                assert_int_equal(st, FP8AMP_ERROR_OUT_OF_MEMORY);
                void *g_failed = tensor_to_host(ga);
                assert_memory_equal(g_failed, g_before, (size_t)N * K); /* no byte changed */
                free(g_failed);
                c.fail_at = 0;
                EXPECT_OK(fp8amp_linear_backward(A.lin, A.dy, A.dx, 1));
            } else {
                assert_int_equal(st, FP8AMP_SUCCESS);
            }
            const int failed = c.failed;
            void *a = tensor_to_host(ga), *b = tensor_to_host(gb), *dxa = tensor_to_host(A.dx), *dxb = tensor_to_host(B.dx);
            assert_memory_equal(a, b, (size_t)N * K);
            assert_memory_equal(dxa, dxb, (size_t)M * K * 2);
            assert_memory_not_equal(a, g_before, (size_t)N * K);
            free(a);
            free(b);
            free(dxa);
            free(dxb);
            free(g_before);
            EXPECT_OK(fp8amp_tensor_destroy(ga));
            EXPECT_OK(fp8amp_tensor_destroy(gb));
            free_layer(&A);
            free_layer(&B);
            EXPECT_OK(fp8amp_context_destroy(ctx));
            (void)forward_failed;
            if (!failed) { /* every allocation of the phase's call was refused once */
                print_message("phase %d: %d allocations each refused once\n", phase, fail_at - 1);
                assert_true(fail_at > 1);
                break;
            }
        }
    }
    free(d);
}

static void test_bad_arguments(void **state) {
    (void)state;
    run_data *d = xmalloc(sizeof *d);
    make_data(d);
    fp8amp_context ctx = make_context(cpu_device());
    layer L = make_layer(ctx, d, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3);
    size_t bytes = 777;
    EXPECT_STATUS(fp8amp_linear_memory_bytes(L.lin, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_linear_memory_bytes(NULL, &bytes), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_memory_bytes((fp8amp_linear)ctx, &bytes), FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(bytes, 777);
    EXPECT_STATUS(fp8amp_linear_release_buffers(NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_release_buffers((fp8amp_linear)ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_linear_release_buffers(L.lin)); /* fresh: nothing to give back */
    /* no training forward since: the backward is refused as before */
    EXPECT_STATUS(fp8amp_linear_backward(L.lin, L.dy, L.dx, 0), FP8AMP_ERROR_INVALID_ARGUMENT);
    fp8amp_linear gone = L.lin;
    free_layer(&L);
    EXPECT_STATUS(fp8amp_linear_release_buffers(gone), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_memory_bytes(gone, &bytes), FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(bytes, 777);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_same_bytes_fp8_e4m3),
        DEVICE_TESTS(test_same_bytes_fp8_bf16),
        DEVICE_TESTS(test_same_bytes_wide_e4m3),
        DEVICE_TESTS(test_same_bytes_fp8_f32),
        DEVICE_TESTS(test_release_before_backward_fp8),
        DEVICE_TESTS(test_release_before_backward_wide),
        cmocka_unit_test(test_counted),
        DEVICE_TESTS(test_accumulate_after_release_bf16),
        DEVICE_TESTS(test_accumulate_after_release_e4m3),
        cmocka_unit_test(test_failed_calls_after_release),
        cmocka_unit_test(test_bad_arguments),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
