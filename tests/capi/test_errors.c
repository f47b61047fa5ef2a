/* Version, status and dtype names, the per-thread error message, and fp8amp_device_count. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "test_util.h"

/* ---- version --------------------------------------------------------------------------------- */

static void test_version_matches_header(void **state) {
    (void)state;
    const uint32_t v = fp8amp_version();
    assert_int_equal(FP8AMP_VERSION,
                     FP8AMP_VERSION_MAJOR * 10000 + FP8AMP_VERSION_MINOR * 100 + FP8AMP_VERSION_PATCH);
    /* The library these tests were built with is the one this header describes. */
    assert_int_equal(v, FP8AMP_VERSION);
    assert_int_equal(v / 10000, FP8AMP_VERSION_MAJOR);
    assert_int_equal(v / 100 % 100, FP8AMP_VERSION_MINOR);
    assert_int_equal(v % 100, FP8AMP_VERSION_PATCH);
    /* A constant: asking again gives the same answer. */
    assert_int_equal(fp8amp_version(), v);
}

/* ---- status names ---------------------------------------------------------------------------- */

static void test_status_names(void **state) {
    (void)state;
    static const struct {
        fp8amp_status status;
        int value;
        const char *name;
    } table[] = {
        {FP8AMP_SUCCESS, 0, "FP8AMP_SUCCESS"},
        {FP8AMP_ERROR_INVALID_ARGUMENT, 1, "FP8AMP_ERROR_INVALID_ARGUMENT"},
        {FP8AMP_ERROR_INVALID_HANDLE, 2, "FP8AMP_ERROR_INVALID_HANDLE"},
        {FP8AMP_ERROR_SHAPE_MISMATCH, 3, "FP8AMP_ERROR_SHAPE_MISMATCH"},
        {FP8AMP_ERROR_DTYPE_MISMATCH, 4, "FP8AMP_ERROR_DTYPE_MISMATCH"},
        {FP8AMP_ERROR_DEVICE_MISMATCH, 5, "FP8AMP_ERROR_DEVICE_MISMATCH"},
        {FP8AMP_ERROR_OUT_OF_MEMORY, 6, "FP8AMP_ERROR_OUT_OF_MEMORY"},
        {FP8AMP_ERROR_NOT_SUPPORTED, 7, "FP8AMP_ERROR_NOT_SUPPORTED"},
        {FP8AMP_ERROR_CUDA, 8, "FP8AMP_ERROR_CUDA"},
        {FP8AMP_ERROR_CUBLAS, 9, "FP8AMP_ERROR_CUBLAS"},
        {FP8AMP_ERROR_NCCL, 10, "FP8AMP_ERROR_NCCL"},
        {FP8AMP_ERROR_CORRUPT_DATA, 11, "FP8AMP_ERROR_CORRUPT_DATA"},
        {FP8AMP_ERROR_INTERNAL, 12, "FP8AMP_ERROR_INTERNAL"},
        {FP8AMP_ERROR_COMM, 13, "FP8AMP_ERROR_COMM"},
    };
    size_t i;
    for (i = 0; i < sizeof table / sizeof table[0]; ++i) {
        /* Enum values are part of the ABI: fixed numbers. */
        assert_int_equal((int)table[i].status, table[i].value);
        const char *name = fp8amp_status_name(table[i].status);
        assert_non_null(name);
        assert_string_equal(name, table[i].name);
        /* Constant strings: the same pointer every time. */
        assert_ptr_equal(fp8amp_status_name(table[i].status), name);
    }
    {
        static const int unknown[] = {14, 15, 100, -1, 0x7fffffff, -0x7fffffff - 1};
        for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
            const char *name = fp8amp_status_name((fp8amp_status)unknown[i]);
            assert_non_null(name);
            assert_string_equal(name, "FP8AMP_UNKNOWN_STATUS");
        }
    }
}

/* ---- dtypes ---------------------------------------------------------------------------------- */

static void test_dtype_size_and_name(void **state) {
    (void)state;
    static const struct {
        fp8amp_dtype dtype;
        int value;
        size_t size;
        const char *name;
    } table[] = {
        {FP8AMP_DTYPE_F32, 0, 4, "f32"},  {FP8AMP_DTYPE_F16, 1, 2, "f16"},   {FP8AMP_DTYPE_BF16, 2, 2, "bf16"},
        {FP8AMP_DTYPE_E4M3, 3, 1, "e4m3"}, {FP8AMP_DTYPE_E5M2, 4, 1, "e5m2"},
    };
    size_t i;
    for (i = 0; i < sizeof table / sizeof table[0]; ++i) {
        assert_int_equal((int)table[i].dtype, table[i].value);
        assert_int_equal(fp8amp_dtype_size(table[i].dtype), table[i].size);
        assert_non_null(fp8amp_dtype_name(table[i].dtype));
        assert_string_equal(fp8amp_dtype_name(table[i].dtype), table[i].name);
    }
    {
        static const int unknown[] = {5, 6, 255, -1, 0x7fffffff};
        for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
            assert_int_equal(fp8amp_dtype_size((fp8amp_dtype)unknown[i]), 0);
            assert_non_null(fp8amp_dtype_name((fp8amp_dtype)unknown[i]));
            assert_string_equal(fp8amp_dtype_name((fp8amp_dtype)unknown[i]), "unknown");
        }
    }
}

/* ---- last error message ---------------------------------------------------------------------- */

#define MSG_CAP 512

static void copy_message(char *dst) {
    const char *m = fp8amp_last_error_message();
    assert_non_null(m);
    assert_true(strlen(m) < MSG_CAP);
    strcpy(dst, m);
}

static void test_message_after_failure(void **state) {
    (void)state;
    char first[MSG_CAP], second[MSG_CAP];
    int32_t n = -7;

    EXPECT_STATUS(fp8amp_device_count((fp8amp_device_type)42, &n), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_int_equal(n, -7);
    copy_message(first);
    assert_true(strlen(first) > strlen("fp8amp_device_count: "));
    assert_non_null(strstr(first, "42")); /* it names the bad value */

    /* A successful call does not clear it. */
    EXPECT_OK(fp8amp_device_count(FP8AMP_DEVICE_CPU, &n));
    assert_int_equal(n, 1);
    assert_string_equal(fp8amp_last_error_message(), first);

    /* The next failure replaces it with its own. */
    EXPECT_STATUS(fp8amp_context_destroy((fp8amp_context)(uintptr_t)0x1234), FP8AMP_ERROR_INVALID_HANDLE);
    copy_message(second);
    assert_string_not_equal(first, second);
    assert_int_equal(strncmp(second, "fp8amp_context_destroy: ", strlen("fp8amp_context_destroy: ")), 0);
}

typedef struct {
    char initial[MSG_CAP]; /* the thread's message before it made any call */
    fp8amp_status status;
    char after[MSG_CAP];
} thread_b_result;

static void *thread_b(void *arg) {
    thread_b_result *r = (thread_b_result *)arg;
    const char *m = fp8amp_last_error_message();
    snprintf(r->initial, MSG_CAP, "%s", m ? m : "(NULL)");
    r->status = fp8amp_tensor_destroy((fp8amp_tensor)(uintptr_t)0x5678);
    m = fp8amp_last_error_message();
    snprintf(r->after, MSG_CAP, "%s", m ? m : "(NULL)");
    return NULL;
}

static void test_message_is_per_thread(void **state) {
    (void)state;
    char mine[MSG_CAP];
    thread_b_result b;
    pthread_t tid;

    memset(&b, 0, sizeof b);
    EXPECT_STATUS(fp8amp_device_count(FP8AMP_DEVICE_CUDA, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    copy_message(mine);
    const char *mine_ptr = fp8amp_last_error_message();

    assert_int_equal(pthread_create(&tid, NULL, thread_b, &b), 0);
    assert_int_equal(pthread_join(tid, NULL), 0);

    /* Thread B started with an empty message and got its own failure... */
    assert_string_equal(b.initial, "");
    assert_int_equal(b.status, FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(strncmp(b.after, "fp8amp_tensor_destroy: ", strlen("fp8amp_tensor_destroy: ")), 0);
    /* ...which did not touch this thread's. */
    assert_string_equal(fp8amp_last_error_message(), mine);
    assert_ptr_equal(fp8amp_last_error_message(), mine_ptr);
    assert_true(message_is_from("fp8amp_device_count(FP8AMP_DEVICE_CUDA, NULL)"));
}

/* Several threads fail concurrently, each with a message naming its own value; each must always
 * read back its own. */
#define STRESS_THREADS 4
#define STRESS_ITERS 2000

typedef struct {
    int id;
    int wrong_status;
    int wrong_message;
    int count_changed;
} stress_result;

static void *stress_thread(void *arg) {
    stress_result *r = (stress_result *)arg;
    char expect[64];
    int i;
    const int bad_type = 1000 + r->id;
    snprintf(expect, sizeof expect, "unknown device type %d", bad_type);
    for (i = 0; i < STRESS_ITERS; ++i) {
        int32_t n = -3;
        if (fp8amp_device_count((fp8amp_device_type)bad_type, &n) != FP8AMP_ERROR_INVALID_ARGUMENT) r->wrong_status++;
        if (n != -3) r->count_changed++;
        /* A successful call in between must not clear it either. */
        if (fp8amp_device_count(FP8AMP_DEVICE_CPU, &n) != FP8AMP_SUCCESS || n != 1) r->wrong_status++;
        const char *m = fp8amp_last_error_message();
        if (strncmp(m, "fp8amp_device_count: ", 21) != 0 || !strstr(m, expect)) r->wrong_message++;
    }
    return NULL;
}

static void test_message_concurrent_threads(void **state) {
    (void)state;
    pthread_t tids[STRESS_THREADS];
    stress_result results[STRESS_THREADS];
    int i;
    for (i = 0; i < STRESS_THREADS; ++i) {
        memset(&results[i], 0, sizeof results[i]);
        results[i].id = i;
        assert_int_equal(pthread_create(&tids[i], NULL, stress_thread, &results[i]), 0);
    }
    for (i = 0; i < STRESS_THREADS; ++i) assert_int_equal(pthread_join(tids[i], NULL), 0);
    for (i = 0; i < STRESS_THREADS; ++i) {
        assert_int_equal(results[i].wrong_status, 0);
        assert_int_equal(results[i].wrong_message, 0);
        assert_int_equal(results[i].count_changed, 0);
    }
}

/* ---- device count ---------------------------------------------------------------------------- */

static void test_device_count(void **state) {
    (void)state;
    int32_t n = -1;
    EXPECT_OK(fp8amp_device_count(FP8AMP_DEVICE_CPU, &n));
    assert_int_equal(n, 1);

    n = -1;
    EXPECT_OK(fp8amp_device_count(FP8AMP_DEVICE_CUDA, &n));
    assert_true(n >= 0);
    print_message("CUDA devices: %d\n", (int)n);
    {
        /* Stable between calls. */
        int32_t again = -1;
        EXPECT_OK(fp8amp_device_count(FP8AMP_DEVICE_CUDA, &again));
        assert_int_equal(again, n);
    }

    EXPECT_STATUS(fp8amp_device_count(FP8AMP_DEVICE_CPU, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_device_count(FP8AMP_DEVICE_CUDA, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_device_count((fp8amp_device_type)7, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    {
        static const int bad[] = {0, 3, 13, -1, 1000};
        size_t i;
        for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
            int32_t c = 12345;
            EXPECT_STATUS(fp8amp_device_count((fp8amp_device_type)bad[i], &c), FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_int_equal(c, 12345);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_matches_header),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_dtype_size_and_name),
        cmocka_unit_test(test_message_after_failure),
        cmocka_unit_test(test_message_is_per_thread),
        cmocka_unit_test(test_message_concurrent_threads),
        cmocka_unit_test(test_device_count),
    };
    test_rng_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
