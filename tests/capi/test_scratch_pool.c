/* The context's scratch pool (docs/linear.md section 5): what lives only within one Linear call comes
 * from slots that every Linear of the context shares, grown to the largest request, not from per-Linear
 * buffers. Checked here: several Linears of different sizes on one context give the same bytes as each
 * on a context of its own (forwards of all before their backwards, micro-batch accumulation, the BF16/F32
 * path and the FP8 path); the memory the calls leave allocated (counted through the allocator hooks)
 * is the Linears' own buffers plus one pool the size of the largest need, not the sum; a Linear at rest
 * holds no transient buffer of its own; fp8amp_context_scratch_bytes / _release_scratch. */
#include "test_util.h"
#include "byte_counter.h"

/* Layer shapes: in (K), out (N), rows (M). All multiples of 16 (CUDA's FP8 GEMMs). The first is the
 * largest in every dimension, so its needs bound every scratch slot. */
enum { NL = 3 };
static const int64_t SHAPES[NL][3] = {{256, 512, 256}, {64, 128, 32}, {128, 48, 96}};

typedef struct {
    fp8amp_linear lin;
    fp8amp_tensor x, y, dy, dx;
} layer;

/* The host data of one layer's calls: weight (BF16), bias (F32), and per round x and dy (BF16). */
typedef struct {
    uint16_t *w;
    float *b;
    uint16_t *x[2], *dy[2];
} layer_data;

static void make_data(layer_data *d, int i) {
    const size_t k = (size_t)SHAPES[i][0], n = (size_t)SHAPES[i][1], m = (size_t)SHAPES[i][2];
    d->w = xmalloc(n * k * 2);
    test_fill_bf16(d->w, n * k, 0.1);
    d->b = xmalloc(n * 4);
    for (size_t j = 0; j < n; ++j) d->b[j] = (float)test_rng_uniform(-1, 1);
    for (int r = 0; r < 2; ++r) {
        d->x[r] = xmalloc(m * k * 2);
        test_fill_bf16(d->x[r], m * k, 2.0);
        d->dy[r] = xmalloc(m * n * 2);
        test_fill_bf16(d->dy[r], m * n, 0.5);
    }
}

static void free_data(layer_data *d) {
    free(d->w);
    free(d->b);
    for (int r = 0; r < 2; ++r) {
        free(d->x[r]);
        free(d->dy[r]);
    }
}

static layer make_layer(fp8amp_context ctx, int i, const layer_data *d, fp8amp_gemm_policy policy) {
    layer L;
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = SHAPES[i][0];
    desc.out_features = SHAPES[i][1];
    desc.policy = policy;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &L.lin));
    fp8amp_tensor w, b;
    EXPECT_OK(fp8amp_linear_weight(L.lin, &w));
    EXPECT_OK(fp8amp_tensor_copy_from_host(w, d->w, (size_t)(SHAPES[i][0] * SHAPES[i][1]) * 2));
    EXPECT_OK(fp8amp_linear_weight_changed(L.lin));
    EXPECT_OK(fp8amp_linear_bias(L.lin, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, d->b, (size_t)SHAPES[i][1] * 4));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    test_linear_io(ctx, SHAPES[i][2], SHAPES[i][0], SHAPES[i][1], &L.x, &L.dx, &L.y, &L.dy);
    return L;
}

static void free_layer(layer *L) { test_linear_free(L->lin, L->x, L->dx, L->y, L->dy); }

/* What one layer's calls delivered: y and dx of each round, and the gradients after both. */
typedef struct {
    void *y[2], *dx[2], *wgrad, *bgrad;
} results;

static void free_results(results *r) {
    for (int k = 0; k < 2; ++k) {
        free(r->y[k]);
        free(r->dx[k]);
    }
    free(r->wgrad);
    free(r->bgrad);
}

/* Two micro-batches: round 0 overwrites the gradients, round 1 accumulates. Each round runs every
 * layer's training forward first, then the backwards in reverse order, so that every saved forward
 * outlives the other layers' calls on the shared scratch. */
static void run_rounds(layer *Ls, const layer_data *D, int count, results *out) {
    for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < count; ++i) {
            EXPECT_OK(fp8amp_tensor_copy_from_host(Ls[i].x, D[i].x[r], tensor_bytes(Ls[i].x)));
            EXPECT_OK(fp8amp_linear_forward(Ls[i].lin, Ls[i].x, Ls[i].y, 1));
        }
        for (int i = count - 1; i >= 0; --i) {
            EXPECT_OK(fp8amp_tensor_copy_from_host(Ls[i].dy, D[i].dy[r], tensor_bytes(Ls[i].dy)));
            EXPECT_OK(fp8amp_linear_backward(Ls[i].lin, Ls[i].dy, Ls[i].dx, r));
        }
        for (int i = 0; i < count; ++i) {
            out[i].y[r] = tensor_to_host(Ls[i].y);
            out[i].dx[r] = tensor_to_host(Ls[i].dx);
        }
    }
    for (int i = 0; i < count; ++i) {
        fp8amp_tensor g, bg;
        EXPECT_OK(fp8amp_linear_weight_grad(Ls[i].lin, &g));
        EXPECT_OK(fp8amp_linear_bias_grad(Ls[i].lin, &bg));
        out[i].wgrad = tensor_to_host(g);
        out[i].bgrad = tensor_to_host(bg);
        EXPECT_OK(fp8amp_tensor_destroy(g));
        EXPECT_OK(fp8amp_tensor_destroy(bg));
    }
}

/* with_wgrad 0: the E4M3 weight gradients are not compared (a second run of the same Linears scales
 * them from the amax history the first run left: delayed scaling). */
static void expect_same(const results *a, const results *b, int i, int with_wgrad) {
    const size_t k = (size_t)SHAPES[i][0], n = (size_t)SHAPES[i][1], m = (size_t)SHAPES[i][2];
    for (int r = 0; r < 2; ++r) {
        assert_memory_equal(a->y[r], b->y[r], m * n * 2);
        assert_memory_equal(a->dx[r], b->dx[r], m * k * 2);
    }
    if (with_wgrad) assert_memory_equal(a->wgrad, b->wgrad, n * k); /* E4M3 */
    assert_memory_equal(a->bgrad, b->bgrad, n * 4);
}

/* Some value must be non-zero and nothing NaN: a run that wrote nothing cannot pass. */
static void expect_sane(const results *r, int i) {
    const size_t n = (size_t)SHAPES[i][1];
    const float *bg = (const float *)r->bgrad;
    int nonzero = 0;
    for (size_t j = 0; j < n; ++j) {
        assert_false(bg[j] != bg[j]);
        nonzero |= bg[j] != 0;
    }
    assert_true(nonzero);
    const unsigned char *g = (const unsigned char *)r->wgrad;
    nonzero = 0;
    for (size_t j = 0; j < n * (size_t)SHAPES[i][0]; ++j) {
        assert_false((g[j] & 0x7F) == 0x7F); /* E4M3 NaN */
        nonzero |= (g[j] & 0x7F) != 0;
    }
    assert_true(nonzero);
}

/* One context for all layers vs one context each: the same bytes, for both GEMM paths. */
static void shared_equals_separate(void **state, fp8amp_gemm_policy policy) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    layer_data D[NL];
    for (int i = 0; i < NL; ++i) make_data(&D[i], i);

    fp8amp_context shared = make_context(dev);
    layer Ls[NL];
    for (int i = 0; i < NL; ++i) Ls[i] = make_layer(shared, i, &D[i], policy);
    results got[NL];
    run_rounds(Ls, D, NL, got);

    size_t pool = 0;
    EXPECT_OK(fp8amp_context_scratch_bytes(shared, &pool));
    assert_true(pool > 0);
    size_t sum = 0, largest = 0;
    for (int i = 0; i < NL; ++i) {
        fp8amp_context own = make_context(dev);
        layer L = make_layer(own, i, &D[i], policy);
        results want;
        run_rounds(&L, &D[i], 1, &want);
        expect_sane(&want, i);
        expect_same(&got[i], &want, i, 1);
        size_t b = 0;
        EXPECT_OK(fp8amp_context_scratch_bytes(own, &b));
        sum += b;
        if (b > largest) largest = b;
        free_results(&want);
        free_layer(&L);
        EXPECT_OK(fp8amp_context_destroy(own));
    }
    /* The first layer is the largest in every dimension: its needs bound every slot. */
    assert_int_equal(pool, largest);
    assert_true(pool < sum);

    /* Released, the pool is empty; the next calls grow it again and deliver the same bytes. */
    EXPECT_OK(fp8amp_context_release_scratch(shared));
    EXPECT_OK(fp8amp_context_scratch_bytes(shared, &pool));
    assert_int_equal(pool, 0);
    EXPECT_OK(fp8amp_context_release_scratch(shared)); /* empty: a no-op */
    results again[NL];
    run_rounds(Ls, D, NL, again);
    for (int i = 0; i < NL; ++i) expect_same(&got[i], &again[i], i, 0);
    EXPECT_OK(fp8amp_context_scratch_bytes(shared, &pool));
    assert_int_equal(pool, largest);

    for (int i = 0; i < NL; ++i) {
        free_results(&got[i]);
        free_results(&again[i]);
        free_layer(&Ls[i]);
        free_data(&D[i]);
    }
    EXPECT_OK(fp8amp_context_destroy(shared));
}

static void test_shared_equals_separate_fp8(void **state) { shared_equals_separate(state, FP8AMP_GEMM_ALWAYS_FP8); }
static void test_shared_equals_separate_wide(void **state) { shared_equals_separate(state, FP8AMP_GEMM_NEVER_FP8); }

/* Bytes live through the hooks of a fresh counted CPU context after creating the given layers
 * (*created) and after their two rounds (returned); the pool's size in *pool. */
static size_t counted_run(const int *which, int count, const layer_data *D, size_t *created, size_t *pool) {
    byte_counter c = {0, 0, 0};
    fp8amp_context ctx = make_context(cpu_device());
    EXPECT_OK(fp8amp_context_set_allocator(ctx, count_alloc, count_free, &c));
    layer Ls[NL];
    layer_data Dw[NL];
    for (int j = 0; j < count; ++j) {
        Ls[j] = make_layer(ctx, which[j], &D[which[j]], FP8AMP_GEMM_ALWAYS_FP8);
        Dw[j] = D[which[j]];
    }
    *created = c.live;
    results r[NL];
    run_rounds(Ls, Dw, count, r);
    const size_t after = c.live;
    EXPECT_OK(fp8amp_context_scratch_bytes(ctx, pool));
    /* The pool's memory came through the hooks: releasing it gives exactly that back. */
    EXPECT_OK(fp8amp_context_release_scratch(ctx));
    assert_int_equal(c.live, after - *pool);
    for (int j = 0; j < count; ++j) {
        free_results(&r[j]);
        free_layer(&Ls[j]);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(c.live, 0); /* everything went back through the hooks */
    assert_int_equal(c.allocs, c.frees);
    return after;
}

/* What the calls leave allocated is each Linear's own buffers plus one pool of the largest need. */
static void test_pool_is_largest_not_sum(void **state) {
    (void)state;
    layer_data D[NL];
    for (int i = 0; i < NL; ++i) make_data(&D[i], i);
    const int all[NL] = {0, 1, 2};
    size_t created_all, pool_all;
    const size_t after_all = counted_run(all, NL, D, &created_all, &pool_all);
    size_t own_sum = 0, pool_sum = 0, pool_max = 0;
    for (int i = 0; i < NL; ++i) {
        size_t created, pool;
        const size_t after = counted_run(&i, 1, D, &created, &pool);
        own_sum += after - created - pool; /* this Linear's own buffers after its calls */
        pool_sum += pool;
        if (pool > pool_max) pool_max = pool;
    }
    assert_int_equal(pool_all, pool_max);
    assert_true(pool_all < pool_sum);
    assert_int_equal(after_all - created_all, own_sum + pool_max);
    for (int i = 0; i < NL; ++i) free_data(&D[i]);
}

/* A Linear at rest after a training forward and backward holds what the next calls need (its FP8
 * weight and transposed copy, the saved x8^T, the FP32 weight-gradient sum: docs/linear.md 5) and
 * 4-byte scale slots, no transient buffer. Before the bias gradient's partial sums moved into the
 * pool, each Linear kept its own (4 * (ceil(M/128) + 1) * N bytes: 6 KiB here). */
static void test_linear_at_rest_holds_no_transient(void **state) {
    (void)state;
    layer_data D[NL];
    for (int i = 0; i < NL; ++i) make_data(&D[i], i);
    const int i = 2;
    size_t created, pool;
    const size_t after = counted_run(&i, 1, D, &created, &pool);
    const size_t k = (size_t)SHAPES[i][0], n = (size_t)SHAPES[i][1], m = (size_t)SHAPES[i][2];
    const size_t kept = n * k /* w8 */ + k * n /* w8t */ + k * m /* x8t */ + 4 * n * k /* FP32 sum */;
    const size_t own = after - created - pool;
    print_message("own buffers after the calls: %zu bytes (expected %zu + scale slots)\n", own, kept);
    assert_true(own >= kept);
    assert_true(own - kept <= 64 * sizeof(float)); /* 4-byte scale_inv slots, nothing else */
    for (int j = 0; j < NL; ++j) free_data(&D[j]);
}

static void test_bad_arguments(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    size_t bytes = 12345;
    EXPECT_STATUS(fp8amp_context_scratch_bytes(ctx, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_context_scratch_bytes(ctx, &bytes));
    assert_int_equal(bytes, 0);
    EXPECT_OK(fp8amp_context_release_scratch(ctx));
    EXPECT_STATUS(fp8amp_context_scratch_bytes(NULL, &bytes), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_release_scratch(NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    bytes = 777;
    EXPECT_STATUS(fp8amp_context_scratch_bytes(ctx, &bytes), FP8AMP_ERROR_INVALID_HANDLE); /* destroyed */
    assert_int_equal(bytes, 777);
    EXPECT_STATUS(fp8amp_context_release_scratch(ctx), FP8AMP_ERROR_INVALID_HANDLE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_shared_equals_separate_fp8),
        DEVICE_TESTS(test_shared_equals_separate_wide),
        cmocka_unit_test(test_pool_is_largest_not_sum),
        cmocka_unit_test(test_linear_at_rest_holds_no_transient),
        cmocka_unit_test(test_bad_arguments),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
