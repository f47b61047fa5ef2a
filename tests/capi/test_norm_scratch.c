/* fp8amp_norm_backward's scratch (its partial column sums) comes from a slot of the context's scratch
 * pool, kept between calls: a call allocates only when the slot must grow (before: a fresh block every
 * call -- on CUDA cudaMalloc + cudaFree, and cudaFree waits for the device). Checked on fresh random
 * data of odd shapes: the pool grows once (fp8amp_context_scratch_bytes; on the CPU also the allocator
 * hooks' count), and calls that reuse the slot -- the same call again, and after a larger call left
 * its own partials in the slot -- give the same bytes as the first call. */
#include "test_util.h"

/* One LayerNorm problem on a context: the forward's inputs and statistics, the backward's outputs. */
typedef struct {
    int64_t rows, d;
    fp8amp_tensor x, dy, gamma, beta, y, mean, rstd, dx, dgamma, dbeta;
} problem;

static void problem_make(problem *p, fp8amp_context ctx, int64_t rows, int64_t d) {
    p->rows = rows;
    p->d = d;
    const int64_t shape[2] = {rows, d};
    const size_t n = (size_t)(rows * d);
    uint16_t *x = xmalloc(n * 2), *dy = xmalloc(n * 2);
    float *g = xmalloc((size_t)d * 4), *b = xmalloc((size_t)d * 4);
    for (int64_t r = 0; r < rows; ++r) {
        const double off = test_rng_uniform(-3.0, 3.0), spread = test_rng_uniform(0.25, 4.0);
        for (int64_t i = 0; i < d; ++i) {
            x[r * d + i] = test_bf16_of((float)(off + spread * test_rng_uniform(-1.0, 1.0)));
            dy[r * d + i] = test_bf16_of((float)test_rng_uniform(-1.0, 1.0));
        }
    }
    for (int64_t i = 0; i < d; ++i) {
        g[i] = (float)test_rng_uniform(0.25, 2.0);
        b[i] = (float)test_rng_uniform(-1.0, 1.0);
    }
    p->x = tensor_from_host(ctx, FP8AMP_DTYPE_BF16, 2, shape, x);
    p->dy = tensor_from_host(ctx, FP8AMP_DTYPE_BF16, 2, shape, dy);
    p->gamma = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &d, g);
    p->beta = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &d, b);
    p->y = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, shape);
    p->mean = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &rows);
    p->rstd = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &rows);
    p->dx = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, shape);
    p->dgamma = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &d);
    p->dbeta = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &d);
    EXPECT_OK(fp8amp_norm_forward(ctx, NULL, p->x, p->gamma, p->beta, p->y, NULL, p->mean, p->rstd));
    free(x);
    free(dy);
    free(g);
    free(b);
}

static void problem_free(problem *p) {
    fp8amp_tensor *all[] = {&p->x, &p->dy, &p->gamma, &p->beta, &p->y, &p->mean, &p->rstd, &p->dx, &p->dgamma, &p->dbeta};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(*all[i]));
}

/* The backward's outputs after one call, on the host: dx, dgamma, dbeta concatenated. */
static unsigned char *backward_bytes(fp8amp_context ctx, problem *p, size_t *nbytes) {
    EXPECT_OK(fp8amp_norm_backward(ctx, NULL, p->dy, p->x, p->gamma, p->mean, p->rstd, p->dx, p->dgamma, p->dbeta));
    const size_t a = tensor_bytes(p->dx), b = tensor_bytes(p->dgamma), c = tensor_bytes(p->dbeta);
    unsigned char *out = xmalloc(a + b + c);
    EXPECT_OK(fp8amp_tensor_copy_to_host(p->dx, out, a));
    EXPECT_OK(fp8amp_tensor_copy_to_host(p->dgamma, out + a, b));
    EXPECT_OK(fp8amp_tensor_copy_to_host(p->dbeta, out + a + b, c));
    *nbytes = a + b + c;
    return out;
}

static size_t scratch_bytes(fp8amp_context ctx) {
    size_t n = 0;
    EXPECT_OK(fp8amp_context_scratch_bytes(ctx, &n));
    return n;
}

static void test_backward_reuses_scratch(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int cpu = device.type == FP8AMP_DEVICE_CPU;
    fp8amp_context ctx = make_context(device);
    alloc_counter count = {0, 0};
    if (cpu) EXPECT_OK(fp8amp_context_set_allocator(ctx, counter_alloc, counter_free, &count));
    /* odd shapes; the second's rows are long enough that its scratch needs more than the pool's 64 KiB
     * granule on either backend (CPU: 6 * d floats), and its partials fill more of the slot */
    problem small, large;
    problem_make(&small, ctx, 37 + (int64_t)(test_rng_u64() % 40), 300 + (int64_t)(test_rng_u64() % 200));
    problem_make(&large, ctx, 41 + (int64_t)(test_rng_u64() % 30), 4200 + (int64_t)(test_rng_u64() % 400));
    assert_int_equal(scratch_bytes(ctx), 0); /* the forward needs no scratch */

    size_t n1 = 0, n2 = 0, n3 = 0, nl1 = 0, nl2 = 0;
    const int allocs0 = count.allocs;
    unsigned char *first = backward_bytes(ctx, &small, &n1);
    const size_t after_first = scratch_bytes(ctx);
    assert_true(after_first > 0); /* the slot holds the partials now */
    if (cpu) assert_int_equal(count.allocs, allocs0 + 1);

    unsigned char *second = backward_bytes(ctx, &small, &n2);
    assert_int_equal(scratch_bytes(ctx), after_first); /* reused, not grown */
    if (cpu) assert_int_equal(count.allocs, allocs0 + 1);
    assert_int_equal(n1, n2);
    assert_memory_equal(first, second, n1);

    /* a larger call grows the slot once, then reuses it */
    unsigned char *l1 = backward_bytes(ctx, &large, &nl1);
    const size_t after_large = scratch_bytes(ctx);
    assert_true(after_large > after_first);
    unsigned char *l2 = backward_bytes(ctx, &large, &nl2);
    assert_int_equal(scratch_bytes(ctx), after_large);
    if (cpu) assert_int_equal(count.allocs, allocs0 + 2);
    assert_int_equal(nl1, nl2);
    assert_memory_equal(l1, l2, nl1);

    /* the small call on the slot the large one left its partials in: the same bytes as at first */
    unsigned char *third = backward_bytes(ctx, &small, &n3);
    assert_int_equal(scratch_bytes(ctx), after_large);
    if (cpu) assert_int_equal(count.allocs, allocs0 + 2);
    assert_memory_equal(first, third, n1);

    /* released, the next call allocates again and still gives the same bytes */
    EXPECT_OK(fp8amp_context_release_scratch(ctx));
    assert_int_equal(scratch_bytes(ctx), 0);
    free(third);
    third = backward_bytes(ctx, &small, &n3);
    assert_int_equal(scratch_bytes(ctx), after_first);
    assert_memory_equal(first, third, n1);

    free(first);
    free(second);
    free(third);
    free(l1);
    free(l2);
    problem_free(&small);
    problem_free(&large);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_backward_reuses_scratch),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
