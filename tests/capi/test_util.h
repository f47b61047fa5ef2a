/* Shared helpers of the CMocka tests. The tests see fp8amp only through the public header (plus the
 * DLPack specification's structs, which a DLPack producer or consumer would include anyway). */
#ifndef FP8AMP_TEST_UTIL_H
#define FP8AMP_TEST_UTIL_H

#include <fnmatch.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fp8amp/fp8amp.h"

/* True when the thread's last error message comes from the function that `call_text` calls: messages
 * begin with the failing function's name, so this proves the message is this call's, not a stale one. */
static inline int message_is_from(const char *call_text) {
    const char *paren = strchr(call_text, '(');
    const size_t n = paren ? (size_t)(paren - call_text) : strlen(call_text);
    const char *msg = fp8amp_last_error_message();
    return strlen(msg) > n + 2 && strncmp(msg, call_text, n) == 0 && msg[n] == ':';
}

/* Asserts that `call` returns `expected`; on failure prints the library's message. For an error
 * status it also asserts that the message is this call's and says something. */
#define EXPECT_STATUS(call, expected)                                                              \
    do {                                                                                           \
        fp8amp_status st_ = (call);                                                                \
        if (st_ != (expected))                                                                     \
            print_error("%s:%d: %s returned %s, expected %s (message: %s)\n", __FILE__, __LINE__, \
                        #call, fp8amp_status_name(st_), fp8amp_status_name(expected),              \
                        fp8amp_last_error_message());                                              \
        assert_int_equal(st_, (expected));                                                         \
        if ((expected) != FP8AMP_SUCCESS) assert_true(message_is_from(#call));                     \
    } while (0)

#define EXPECT_OK(call) EXPECT_STATUS(call, FP8AMP_SUCCESS)

static inline fp8amp_device cpu_device(void) {
    fp8amp_device d = {FP8AMP_DEVICE_CPU, 0};
    return d;
}

static inline fp8amp_device cuda_device(int index) {
    fp8amp_device d = {FP8AMP_DEVICE_CUDA, index};
    return d;
}

/* True when a CUDA device can be used; GPU variants of tests call skip() otherwise, so that they
 * report SKIPPED, never PASSED, on a machine without a GPU. */
static inline int have_cuda(void) {
    int32_t n = 0;
    return fp8amp_device_count(FP8AMP_DEVICE_CUDA, &n) == FP8AMP_SUCCESS && n > 0;
}

#define SKIP_WITHOUT_CUDA()                                                                        \
    do {                                                                                           \
        if (!have_cuda()) {                                                                        \
            print_message("no CUDA device: skipping GPU variant\n");                               \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* The device of a test variant: state points at an fp8amp_device_type value. */
static inline fp8amp_device variant_device(void **state) {
    const fp8amp_device_type type = *(const fp8amp_device_type *)*state;
    return type == FP8AMP_DEVICE_CUDA ? cuda_device(0) : cpu_device();
}

static const fp8amp_device_type VARIANT_CPU = FP8AMP_DEVICE_CPU;
static const fp8amp_device_type VARIANT_CUDA = FP8AMP_DEVICE_CUDA;

/* Skips when the variant is CUDA and there is no GPU. */
static inline void require_variant(void **state) {
    if (*(const fp8amp_device_type *)*state == FP8AMP_DEVICE_CUDA) SKIP_WITHOUT_CUDA();
}

/* Runs a test once on the CPU and once on CUDA (the CUDA run is skipped without a GPU). */
#define DEVICE_TESTS(fn)                                                                           \
    {#fn "[cpu]", fn, NULL, NULL, (void *)&VARIANT_CPU}, {#fn "[cuda]", fn, NULL, NULL, (void *)&VARIANT_CUDA}

/* Fresh random data for every run: a 64-bit xorshift seeded from FP8AMP_TEST_SEED or the clock.
 * The seed is printed so that a failure can be replayed. */
static uint64_t test_rng_state;

static inline void test_rng_seed(void) {
    const char *env = getenv("FP8AMP_TEST_SEED");
    test_rng_state = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
    if (test_rng_state == 0) test_rng_state = 88172645463325252ull;
    print_message("FP8AMP_TEST_SEED=%llu\n", (unsigned long long)test_rng_state);
}

/* The group setup of every test file: seeds the generator once per run. */
static inline int test_setup_rng(void **state) {
    (void)state;
    test_rng_seed();
    return 0;
}

static inline uint64_t test_rng_u64(void) {
    uint64_t x = test_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return test_rng_state = x;
}

/* Uniform in [lo, hi). */
static inline double test_rng_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(test_rng_u64() >> 11) * (1.0 / 9007199254740992.0);
}

/* BF16 of a float, rounded to nearest even (finite inputs: the test data; no NaN handling). */
static inline uint16_t test_bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* n BF16 values uniform in [-scale, scale) (then rounded). */
static inline void test_fill_bf16(uint16_t *p, size_t n, double scale) {
    for (size_t i = 0; i < n; ++i) p[i] = test_bf16_of((float)test_rng_uniform(-scale, scale));
}

/* FP8AMP_TEST_SMALL=1 (set by tests/run_gpu_sanitizers.sh): the few tests whose point is size shrink
 * to sizes that still cross the same boundaries (partial last blocks, more than one launch), so that
 * compute-sanitizer's racecheck, which serializes shared-memory accesses, finishes in minutes. The
 * normal suite always runs the full sizes. */
static inline int test_small(void) {
    const char *env = getenv("FP8AMP_TEST_SMALL");
    return env && *env && strcmp(env, "0") != 0;
}

/* FP8AMP_TEST_FILTER=pattern: run only the tests whose name matches the shell pattern (fnmatch).
 * FP8AMP_TEST_SHARD=i/n: of those, run only the ones whose position in the list is i modulo n, so that
 * one slow executable can be split across processes (tests/run_gpu_sanitizers.sh SHARDS=n runs
 * racecheck of test_optimizer as n processes at once). Unset, every test runs. A malformed shard or a
 * pattern that matches nothing fails the run rather than silently running nothing. Use as
 *   return run_tests_sharded(tests, sizeof tests / sizeof tests[0], setup, teardown); */
static inline int run_tests_sharded(const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
                                    CMFixtureFunction teardown) {
    const char *env = getenv("FP8AMP_TEST_SHARD"), *pattern = getenv("FP8AMP_TEST_FILTER");
    if ((!env || !*env) && (!pattern || !*pattern)) return _cmocka_run_group_tests("tests", tests, n, setup, teardown);
    unsigned shard = 0, shards = 1;
    char tail = 0;
    if (env && *env && (sscanf(env, "%u/%u%c", &shard, &shards, &tail) != 2 || shards == 0 || shard >= shards)) {
        fprintf(stderr, "FP8AMP_TEST_SHARD=%s: expected i/n with 0 <= i < n\n", env);
        return 1;
    }
    struct CMUnitTest *kept = (struct CMUnitTest *)calloc(n ? n : 1, sizeof *kept);
    if (!kept) return 1;
    size_t matched = 0, m = 0;
    for (size_t i = 0; i < n; ++i) {
        if (pattern && *pattern && fnmatch(pattern, tests[i].name, 0) != 0) continue;
        if (matched++ % shards == shard) kept[m++] = tests[i];
    }
    if (matched == 0) {
        fprintf(stderr, "FP8AMP_TEST_FILTER=%s matches no test\n", pattern);
        free(kept);
        return 1;
    }
    int failed = _cmocka_run_group_tests("tests", kept, m, setup, teardown);
    free(kept);
    return failed;
}

/* Allocation and object helpers that fail the test instead of returning NULL. */
static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static inline void *xmemdup(const void *src, size_t n) {
    void *p = xmalloc(n);
    memcpy(p, src, n);
    return p;
}

static inline fp8amp_context make_context(fp8amp_device device) {
    fp8amp_context ctx = NULL;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    assert_non_null(ctx);
    return ctx;
}

static inline fp8amp_tensor make_tensor(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape) {
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_create(ctx, dtype, ndim, shape, &t));
    assert_non_null(t);
    return t;
}

/* A Linear's four BF16 activations for M rows: x and dx [M, K], y and dy [M, N]. */
static inline void test_linear_io(fp8amp_context ctx, int64_t M, int64_t K, int64_t N, fp8amp_tensor *x,
                                  fp8amp_tensor *dx, fp8amp_tensor *y, fp8amp_tensor *dy) {
    const int64_t xs[2] = {M, K}, ys[2] = {M, N};
    *x = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, xs);
    *dx = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, xs);
    *y = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, ys);
    *dy = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, ys);
}

/* Destroys a Linear and its four activations (test_linear_io). */
static inline void test_linear_free(fp8amp_linear lin, fp8amp_tensor x, fp8amp_tensor dx, fp8amp_tensor y,
                                    fp8amp_tensor dy) {
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_tensor_destroy(y));
    EXPECT_OK(fp8amp_tensor_destroy(dy));
    EXPECT_OK(fp8amp_tensor_destroy(dx));
    EXPECT_OK(fp8amp_linear_destroy(lin));
}

/* fp8amp_linear_memory_bytes. */
static inline size_t test_linear_memory_bytes(fp8amp_linear lin) {
    size_t b = 0;
    EXPECT_OK(fp8amp_linear_memory_bytes(lin, &b));
    return b;
}

/* A handle value no call returns: a refused call must leave an out-parameter holding it untouched. */
#define SENTINEL_TENSOR ((fp8amp_tensor)(uintptr_t)0x7a7a7a7a)

/* The value of an F32 scalar tensor (a scale_inv slot, a meta's amax view), read to the host. */
static inline float test_read_f32_scalar(fp8amp_tensor t) {
    float v = -1.0f;
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, &v, sizeof v));
    return v;
}

static inline size_t tensor_bytes(fp8amp_tensor t) {
    size_t n = 0;
    EXPECT_OK(fp8amp_tensor_nbytes(t, &n));
    return n;
}

/* A tensor filled from host bytes (host may be NULL: left as created). */
static inline fp8amp_tensor tensor_from_host(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape,
                                             const void *host) {
    fp8amp_tensor t = make_tensor(ctx, dtype, ndim, shape);
    if (host) EXPECT_OK(fp8amp_tensor_copy_from_host(t, host, tensor_bytes(t)));
    return t;
}

/* A tensor's bytes in a new host buffer (the caller frees it). */
static inline void *tensor_to_host(fp8amp_tensor t) {
    const size_t n = tensor_bytes(t);
    void *p = xmalloc(n);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, p, n));
    return p;
}

/* A scaling meta with the default recipe in `mode`, a history of 4, the given scale and counting on. */
static inline fp8amp_scaling counting_meta(fp8amp_context ctx, fp8amp_dtype dt, fp8amp_scaling_mode mode, float scale) {
    fp8amp_recipe r;
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = mode;
    r.amax_history_len = 4;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, dt, &s));
    EXPECT_OK(fp8amp_scaling_set_scale(s, scale));
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    return s;
}

static inline size_t numel_of(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= (size_t)shape[i];
    return n;
}

/* Asserts that the tensor holds exactly these bytes (nbytes must be its byte size); the host buffer is
 * poisoned first, so that a copy that writes nothing cannot pass. */
static inline void expect_bytes(fp8amp_tensor t, const void *want, size_t nbytes) {
    assert_int_equal(tensor_bytes(t), nbytes);
    void *got = xmalloc(nbytes);
    memset(got, 0xA5, nbytes);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, got, nbytes));
    assert_memory_equal(got, want, nbytes);
    free(got);
}

static inline void assert_device_equal(fp8amp_device a, fp8amp_device b) {
    assert_int_equal(a.type, b.type);
    assert_int_equal(a.index, b.index);
}

/* Little-endian store, as the checkpoint format writes its fields. */
static inline void put_u32(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; ++k) p[k] = (unsigned char)(v >> (8 * k));
}

/* Allocator hooks that count their calls (user: an alloc_counter); host memory, 256-byte aligned. */
typedef struct {
    int allocs, frees;
} alloc_counter;

static inline void *counter_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    void *p = NULL;
    (void)device;
    (void)stream;
    ((alloc_counter *)user)->allocs++;
    return posix_memalign(&p, 256, nbytes ? nbytes : 1) == 0 ? p : NULL;
}

static inline void counter_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    (void)nbytes;
    (void)device;
    (void)stream;
    ((alloc_counter *)user)->frees++;
    free(ptr);
}

/* An optimizer's whole checkpoint (fp8amp_optimizer_save), in a buffer the caller frees. */
static inline unsigned char *save_all(fp8amp_optimizer opt, size_t *size) {
    EXPECT_OK(fp8amp_optimizer_save(opt, NULL, 0, size));
    unsigned char *buf = xmalloc(*size);
    size_t written = 0;
    EXPECT_OK(fp8amp_optimizer_save(opt, buf, *size, &written));
    assert_int_equal(written, *size);
    return buf;
}

/* CRC-32 (zlib's) computed bit by bit, independent of the library's table. */
static inline uint32_t crc32_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

#endif
