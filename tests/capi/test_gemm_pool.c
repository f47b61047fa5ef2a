/* The CPU GEMM's worker threads (kernels/cpu/gemm.cpp, RowPool): a persistent pool shared by every CPU
 * context of the process, started on the first GEMM big enough to want it.
 *   - A worker that cannot be started (pthread_create refused, interposed here as in
 *     test_fault_injection_host.c) costs nothing but speed: the call succeeds, its rows run on the
 *     calling thread, and the bytes are those of the run whose workers did start. This must be the
 *     first parallel GEMM of the process (test_fault_injection_host.c only refuses the pool's first
 *     start once, in its unrefused reference run), so it is the first test here.
 *   - Once started, the workers stay: later calls start no thread.
 *   - Several threads calling GEMMs at once (one pool, one job at a time: the others run alone) all
 *     get the bytes of a single-threaded run. Under ThreadSanitizer (tests/sanitizers.sh) this is the
 *     pool's race check.
 * CPU only: the pool is the CPU backend's. Fresh random data (FP8AMP_TEST_SEED replays a run). The
 * interposer needs glibc and no sanitizer allocator; under ASan/TSan the first test skips. */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <pthread.h>
#include <unistd.h>

#include "test_util.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define POOL_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define POOL_SANITIZED 1
#endif
#if defined(__GLIBC__) && !defined(POOL_SANITIZED)
#define POOL_INTERPOSER 1
#endif

#if POOL_INTERPOSER
static int refuse_threads; /* set while the first test wants every thread start refused */
static long thread_starts;  /* pthread_create calls seen (refused or not) */

#include <dlfcn.h>
#include <errno.h>

typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static pthread_create_fn real_pthread_create; /* resolved in main, before any thread */

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg) {
    __atomic_fetch_add(&thread_starts, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&refuse_threads, __ATOMIC_SEQ_CST)) return EAGAIN;
    return real_pthread_create(thread, attr, start, arg);
}
#endif

/* A Linear whose forward GEMM is 64 x 256 x 256 (4 Mi multiply-adds: the pool is wanted with two
 * cores or more), F32 weight and bias, FP8 GEMMs, on its own CPU context. */
enum { kRows = 64, kIn = 256, kOut = 256 };

typedef struct layer {
    fp8amp_context ctx;
    fp8amp_linear lin;
    fp8amp_tensor x, y;
} layer_t;

static float weight_data[kOut * kIn], bias_data[kOut], x_data[kRows * kIn];

static void make_data(void) {
    for (size_t i = 0; i < kOut * kIn; ++i) weight_data[i] = (float)test_rng_uniform(-1.0, 1.0);
    for (size_t i = 0; i < kOut; ++i) bias_data[i] = (float)test_rng_uniform(-1.0, 1.0);
    for (size_t i = 0; i < kRows * kIn; ++i) x_data[i] = (float)test_rng_uniform(-4.0, 4.0);
}

static void layer_make(layer_t *l) {
    const int64_t xs[2] = {kRows, kIn}, ys[2] = {kRows, kOut};
    fp8amp_linear_desc d;
    fp8amp_tensor w, b;
    l->ctx = make_context(cpu_device());
    EXPECT_OK(fp8amp_linear_desc_init(&d, sizeof d));
    d.in_features = kIn;
    d.out_features = kOut;
    d.weight_dtype = FP8AMP_DTYPE_F32;
    d.policy = FP8AMP_GEMM_ALWAYS_FP8;
    EXPECT_OK(fp8amp_linear_create(l->ctx, &d, &l->lin));
    EXPECT_OK(fp8amp_linear_weight(l->lin, &w));
    EXPECT_OK(fp8amp_tensor_copy_from_host(w, weight_data, sizeof weight_data));
    EXPECT_OK(fp8amp_linear_bias(l->lin, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, bias_data, sizeof bias_data));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    l->x = make_tensor(l->ctx, FP8AMP_DTYPE_F32, 2, xs);
    l->y = make_tensor(l->ctx, FP8AMP_DTYPE_F32, 2, ys);
    EXPECT_OK(fp8amp_tensor_copy_from_host(l->x, x_data, sizeof x_data));
}

static void layer_free(layer_t *l) {
    EXPECT_OK(fp8amp_tensor_destroy(l->x));
    EXPECT_OK(fp8amp_tensor_destroy(l->y));
    EXPECT_OK(fp8amp_linear_destroy(l->lin));
    EXPECT_OK(fp8amp_context_destroy(l->ctx));
}

/* One forward (no CMocka asserts: also called from worker threads), y into out. */
static fp8amp_status layer_forward(layer_t *l, float *out) {
    fp8amp_status st = fp8amp_linear_forward(l->lin, l->x, l->y, 0);
    if (st == FP8AMP_SUCCESS) st = fp8amp_tensor_copy_to_host(l->y, out, sizeof(float) * kRows * kOut);
    return st;
}

static int finite_and_nonzero(const float *y, size_t n) {
    size_t nonzero = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!(y[i] == y[i]) || y[i] - y[i] != 0.0f) return 0;
        nonzero += y[i] != 0.0f;
    }
    return nonzero > n / 2;
}

static void test_refused_worker_start(void **state) {
    (void)state;
#if !POOL_INTERPOSER
    skip(); /* a sanitizer's runtime owns pthread_create */
#else
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) skip(); /* one core: the GEMM never wants a worker */
    static float serial[kRows * kOut], pooled[kRows * kOut], again[kRows * kOut];
    layer_t l;
    make_data();
    layer_make(&l);

    thread_starts = 0;
    __atomic_store_n(&refuse_threads, 1, __ATOMIC_SEQ_CST);
    const fp8amp_status st = layer_forward(&l, serial);
    __atomic_store_n(&refuse_threads, 0, __ATOMIC_SEQ_CST);
    EXPECT_OK(st);
    assert_true(thread_starts >= 1); /* the pool tried, was refused, and the caller did the rows */
    assert_true(finite_and_nonzero(serial, kRows * kOut));

    thread_starts = 0;
    EXPECT_OK(layer_forward(&l, pooled)); /* the next call starts the workers */
    assert_true(thread_starts >= 1);
    assert_memory_equal(serial, pooled, sizeof serial);

    thread_starts = 0;
    EXPECT_OK(layer_forward(&l, again)); /* they stay: no thread start */
    assert_int_equal(thread_starts, 0);
    assert_memory_equal(serial, again, sizeof serial);
    layer_free(&l);
#endif
}

enum { kCallers = 4, kCalls = 6 };

typedef struct caller {
    layer_t *layer;
    const float *want;
    int mismatches;
    fp8amp_status status;
} caller_t;

static void *caller_main(void *arg) {
    caller_t *c = (caller_t *)arg;
    float *y = (float *)malloc(sizeof(float) * kRows * kOut);
    if (!y) {
        c->status = FP8AMP_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    for (int i = 0; i < kCalls && c->status == FP8AMP_SUCCESS; ++i) {
        c->status = layer_forward(c->layer, y);
        if (c->status == FP8AMP_SUCCESS && memcmp(y, c->want, sizeof(float) * kRows * kOut) != 0) ++c->mismatches;
    }
    free(y);
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    static float want[kRows * kOut];
    layer_t layers[kCallers];
    caller_t callers[kCallers];
    pthread_t threads[kCallers];
    make_data();
    for (int i = 0; i < kCallers; ++i) layer_make(&layers[i]);
    EXPECT_OK(layer_forward(&layers[0], want));
    assert_true(finite_and_nonzero(want, kRows * kOut));
    for (int i = 0; i < kCallers; ++i) {
        callers[i].layer = &layers[i];
        callers[i].want = want;
        callers[i].mismatches = 0;
        callers[i].status = FP8AMP_SUCCESS;
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    }
    for (int i = 0; i < kCallers; ++i) assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (int i = 0; i < kCallers; ++i) {
        if (callers[i].status != FP8AMP_SUCCESS)
            fail_msg("caller %d: %s", i, fp8amp_status_name(callers[i].status));
        assert_int_equal(callers[i].mismatches, 0);
        layer_free(&layers[i]);
    }
}

int main(void) {
#if POOL_INTERPOSER
    void *sym = dlsym(RTLD_NEXT, "pthread_create");
    if (!sym) {
        fprintf(stderr, "dlsym(pthread_create) failed\n");
        return 1;
    }
    memcpy(&real_pthread_create, &sym, sizeof sym); /* an object pointer to a function pointer, portably */
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_worker_start), /* first: no parallel GEMM may run before it */
        cmocka_unit_test(test_concurrent_callers),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
