/* Allocator hooks must return 256-byte aligned memory (fp8amp_alloc_fn, issue 22 defect 8). A hook
 * that returns a misaligned block is refused: the block goes straight back through free_fn (nothing
 * leaks), the calling function fails with INVALID_ARGUMENT, and nothing else changes. Before the
 * check, such a block was used as it was: misaligned accesses (UBSan's alignment reports; a crash
 * for an address such as 1). */
#include "test_util.h"

/* A pool that hands out blocks at `offset` bytes past a 512-byte boundary and records every call. */
typedef struct {
    size_t offset;
    int allocs, frees, live;
    void *base[16];
    void *given[16];
    size_t nbytes[16];
    int wrong_free; /* free_fn got a pointer or size it never gave out */
} pool;

static void *pool_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    pool *p = (pool *)user;
    (void)device;
    (void)stream;
    if (p->allocs >= 16) return NULL;
    /* C99 has no aligned_alloc: over-allocate and round up to the 512-byte boundary */
    void *base = malloc(nbytes + p->offset + 512);
    if (!base) return NULL;
    const int i = p->allocs++;
    p->base[i] = base;
    p->given[i] = (char *)(((uintptr_t)base + 511) / 512 * 512) + p->offset;
    p->nbytes[i] = nbytes;
    p->live++;
    return p->given[i];
}

static void pool_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    pool *p = (pool *)user;
    (void)device;
    (void)stream;
    for (int i = 0; i < p->allocs; ++i) {
        if (p->given[i] == ptr && p->base[i]) {
            if (p->nbytes[i] != nbytes) p->wrong_free++;
            free(p->base[i]);
            p->base[i] = NULL;
            p->frees++;
            p->live--;
            return;
        }
    }
    p->wrong_free++;
}

static const size_t kMisaligned[] = {1, 2, 4, 8, 16, 32, 64, 128, 255, 129};

/* Each allocating function, with a hook returning misaligned blocks: INVALID_ARGUMENT, the message
 * says why, the block was freed once through the hook, *out untouched. */
static void test_misaligned_hook_is_refused(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof kMisaligned / sizeof kMisaligned[0]; ++k) {
        pool p;
        memset(&p, 0, sizeof p);
        p.offset = kMisaligned[k];
        fp8amp_context ctx;
        EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx));
        EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc, pool_free, &p));

        const int64_t shape[2] = {1 + (int64_t)(test_rng_u64() % 64), 1 + (int64_t)(test_rng_u64() % 64)};
        fp8amp_tensor t = (fp8amp_tensor)(uintptr_t)0x1234;
        EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "not aligned to 256 bytes"));
        assert_true(t == (fp8amp_tensor)(uintptr_t)0x1234);
        assert_int_equal(p.allocs, 1);
        assert_int_equal(p.frees, 1);

        fp8amp_recipe r;
        EXPECT_OK(fp8amp_recipe_init_default(&r));
        r.amax_history_len = 1 + (int32_t)(test_rng_u64() % 100);
        fp8amp_scaling s = (fp8amp_scaling)(uintptr_t)0x1234;
        EXPECT_STATUS(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_true(s == (fp8amp_scaling)(uintptr_t)0x1234);

        fp8amp_linear_desc ld;
        EXPECT_OK(fp8amp_linear_desc_init_default(&ld));
        ld.in_features = 16;
        ld.out_features = 16;
        fp8amp_linear lin = (fp8amp_linear)(uintptr_t)0x1234;
        EXPECT_STATUS(fp8amp_linear_create(ctx, &ld, &lin), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_true(lin == (fp8amp_linear)(uintptr_t)0x1234);

        /* every block was given back, each once and with its size */
        assert_int_equal(p.live, 0);
        assert_int_equal(p.frees, p.allocs);
        assert_int_equal(p.wrong_free, 0);
        EXPECT_OK(fp8amp_context_destroy(ctx));
        assert_int_equal(p.live, 0);
    }
}

/* The scale_inv slot is allocated on first binding: a misaligned block there leaves the tensor unbound. */
static void test_misaligned_scale_inv_slot(void **state) {
    (void)state;
    pool p;
    memset(&p, 0, sizeof p);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx));
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s));
    const int64_t n = 8 + (int64_t)(test_rng_u64() % 100);
    fp8amp_tensor q;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, &n, &q));
    p.offset = 4;
    EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc, pool_free, &p));
    EXPECT_STATUS(fp8amp_tensor_set_scaling(q, s), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_int_equal(p.allocs, 1);
    assert_int_equal(p.live, 0);
    fp8amp_tensor slot = (fp8amp_tensor)(uintptr_t)0x1234;
    EXPECT_STATUS(fp8amp_tensor_scale_inv(q, &slot), FP8AMP_ERROR_INVALID_ARGUMENT); /* never bound */
    assert_true(slot == (fp8amp_tensor)(uintptr_t)0x1234);
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(p.wrong_free, 0);
}

/* Aligned blocks (256 past a 512 boundary, and 0) are accepted and work: the check refuses nothing
 * the contract allows. */
static void test_aligned_hook_works(void **state) {
    (void)state;
    const size_t offsets[2] = {0, 256};
    for (int k = 0; k < 2; ++k) {
        pool p;
        memset(&p, 0, sizeof p);
        p.offset = offsets[k];
        fp8amp_context ctx;
        EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx));
        EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc, pool_free, &p));
        const int64_t n = 1 + (int64_t)(test_rng_u64() % 1000);
        float *host = (float *)xmalloc((size_t)n * sizeof(float));
        float *back = (float *)xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; ++i) host[i] = (float)test_rng_uniform(-100.0, 100.0);
        fp8amp_tensor t;
        EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, &n, &t));
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, host, (size_t)n * sizeof(float)));
        EXPECT_OK(fp8amp_tensor_copy_to_host(t, back, (size_t)n * sizeof(float)));
        assert_memory_equal(host, back, (size_t)n * sizeof(float));
        assert_int_equal(p.allocs, 1);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        EXPECT_OK(fp8amp_context_destroy(ctx));
        assert_int_equal(p.live, 0);
        assert_int_equal(p.wrong_free, 0);
        free(host);
        free(back);
    }
}

/* After a refusal the context is unchanged: with a good allocator it works as before. */
static void test_context_usable_after_refusal(void **state) {
    (void)state;
    pool bad, good;
    memset(&bad, 0, sizeof bad);
    memset(&good, 0, sizeof good);
    bad.offset = 1;
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx));
    EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc, pool_free, &bad));
    const int64_t n = 1 + (int64_t)(test_rng_u64() % 100);
    fp8amp_tensor t;
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_BF16, 1, &n, &t), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc, pool_free, &good));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_BF16, 1, &n, &t));
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_set_allocator(ctx, NULL, NULL, NULL));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_BF16, 1, &n, &t));
    void *data = NULL;
    EXPECT_OK(fp8amp_tensor_data(t, &data));
    assert_int_equal((uintptr_t)data % 256, 0);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(bad.live + good.live, 0);
    assert_int_equal(bad.wrong_free + good.wrong_free, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misaligned_hook_is_refused),
        cmocka_unit_test(test_misaligned_scale_inv_slot),
        cmocka_unit_test(test_aligned_hook_works),
        cmocka_unit_test(test_context_usable_after_refusal),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
