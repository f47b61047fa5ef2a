/* Threads (fp8amp.h: different contexts may be used from different threads concurrently; objects may
 * be destroyed on any thread). Several threads each run a whole training step on their own context --
 * a Linear forward and backward (the CPU GEMM spreads big products over threads of its own), casts
 * and quantizes, an optimizer step -- while sharing the handle registry, and hand tensors to each other
 * to destroy. Every thread must get bit-identical results to the same step run alone first. Its real
 * target is ThreadSanitizer (tests/sanitizers.sh): a data race anywhere on these paths fails it. */
#include <pthread.h>

#include "test_util.h"

enum { kThreads = 4, kIters = 2, kM = 64, kK = 128, kN = 128 };

static float g_x[kM * kK], g_dy[kM * kN], g_w[kN * kK];

typedef struct {
    uint16_t weight[kN * kK]; /* the BF16 weight after the optimizer step */
    float y[kM * kN];
    float dx[kM * kK];
    float amax;
    fp8amp_tensor handoff; /* a tensor this thread made, destroyed by the next thread */
    int failed;
} step_result;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != FP8AMP_SUCCESS) {                                                            \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                   \
                    fp8amp_last_error_message());                                                  \
            r->failed = 1;                                                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* One training step on a fresh CPU context; everything it made is destroyed, except `handoff`. */
static void run_step(step_result *r) {
    fp8amp_context ctx;
    CHECK(fp8amp_context_create(cpu_device(), &ctx));
    fp8amp_linear_desc ld;
    CHECK(fp8amp_linear_desc_init_default(&ld));
    ld.in_features = kK;
    ld.out_features = kN;
    ld.policy = FP8AMP_GEMM_ALWAYS_FP8;
    fp8amp_linear lin;
    CHECK(fp8amp_linear_create(ctx, &ld, &lin));
    fp8amp_tensor w, wg, x, y, dy, dx, w32;
    CHECK(fp8amp_linear_weight(lin, &w));
    CHECK(fp8amp_linear_weight_grad(lin, &wg));
    const int64_t ws[2] = {kN, kK}, xs[2] = {kM, kK}, ys[2] = {kM, kN};
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, ws, &w32));
    CHECK(fp8amp_tensor_copy_from_host(w32, g_w, sizeof g_w));
    CHECK(fp8amp_cast(ctx, w32, w));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, xs, &x));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, ys, &y));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, ys, &dy));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, xs, &dx));
    CHECK(fp8amp_tensor_copy_from_host(x, g_x, sizeof g_x));
    CHECK(fp8amp_tensor_copy_from_host(dy, g_dy, sizeof g_dy));

    fp8amp_adam_desc ad;
    CHECK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O2, &ad));
    fp8amp_optimizer opt;
    CHECK(fp8amp_optimizer_create(ctx, &ad, &opt));
    CHECK(fp8amp_optimizer_add_param(opt, w, wg));

    CHECK(fp8amp_linear_forward(lin, x, y, 1));
    CHECK(fp8amp_linear_backward(lin, dy, dx, 0));
    CHECK(fp8amp_optimizer_step(opt, NULL));
    CHECK(fp8amp_amax(ctx, y, &r->amax));
    CHECK(fp8amp_tensor_copy_to_host(y, r->y, sizeof r->y));
    CHECK(fp8amp_tensor_copy_to_host(dx, r->dx, sizeof r->dx));
    CHECK(fp8amp_tensor_copy_to_host(w, r->weight, sizeof r->weight));

    CHECK(fp8amp_optimizer_destroy(opt));
    CHECK(fp8amp_linear_destroy(lin));
    fp8amp_tensor mine[] = {w, wg, x, y, dy, dx};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; ++i) CHECK(fp8amp_tensor_destroy(mine[i]));
    r->handoff = w32; /* outlives its context; another thread destroys it */
    CHECK(fp8amp_context_destroy(ctx));
}

typedef struct {
    step_result result[kIters];
    fp8amp_tensor to_destroy; /* the handoff of another thread's step, or NULL */
    int destroy_failed;
} worker;

static void *worker_main(void *arg) {
    worker *wk = (worker *)arg;
    for (int it = 0; it < kIters; ++it) run_step(&wk->result[it]);
    if (wk->to_destroy && fp8amp_tensor_destroy(wk->to_destroy) != FP8AMP_SUCCESS) wk->destroy_failed = 1;
    return NULL;
}

static void test_concurrent_contexts(void **state) {
    (void)state;
    for (int i = 0; i < kM * kK; ++i) g_x[i] = (float)test_rng_uniform(-3.0, 3.0);
    for (int i = 0; i < kM * kN; ++i) g_dy[i] = (float)test_rng_uniform(-1.0, 1.0);
    for (int i = 0; i < kN * kK; ++i) g_w[i] = (float)test_rng_uniform(-0.2, 0.2);

    static step_result alone;
    memset(&alone, 0, sizeof alone);
    run_step(&alone);
    assert_false(alone.failed);
    assert_true(alone.amax > 0.0f);

    static worker workers[kThreads];
    pthread_t tids[kThreads];
    memset(workers, 0, sizeof workers);
    workers[0].to_destroy = alone.handoff; /* made on this thread, destroyed on a worker */
    for (int t = 0; t < kThreads; ++t) assert_int_equal(pthread_create(&tids[t], NULL, worker_main, &workers[t]), 0);
    for (int t = 0; t < kThreads; ++t) assert_int_equal(pthread_join(tids[t], NULL), 0);
    for (int t = 0; t < kThreads; ++t) {
        assert_false(workers[t].destroy_failed);
        for (int it = 0; it < kIters; ++it) {
            const step_result *r = &workers[t].result[it];
            assert_false(r->failed);
            assert_memory_equal(r->y, alone.y, sizeof alone.y);
            assert_memory_equal(r->dx, alone.dx, sizeof alone.dx);
            assert_memory_equal(r->weight, alone.weight, sizeof alone.weight);
            assert_true(r->amax == alone.amax);
            /* handoffs of workers: destroyed here, on the main thread, after their contexts */
            EXPECT_OK(fp8amp_tensor_destroy(r->handoff));
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_contexts)};
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
