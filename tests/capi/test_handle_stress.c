/* The handle registry under concurrency (core/handles.cpp; docs/api.md 1.3 and 1.5). Threads, each
 * with a context of its own, create tensors and scaling metas every round, publish them, and then at
 * once: two other threads race to destroy each of them (exactly one destroy succeeds), while the owner
 * keeps calling fp8amp_amax, fp8amp_tensor_numel and fp8amp_scaling_update_many (the many-handle
 * lookup) on them, and every thread churns scratch tensors so that freed slots are reused meanwhile.
 * A call on a handle being destroyed must either see its own object (the exact numel and amax it was
 * made with, never another object's) or be refused with INVALID_HANDLE, and once refused stay refused;
 * handles destroyed in earlier rounds stay refused while their slots serve new objects; a long-lived
 * tensor and the contexts are always found; handles of the wrong kind are refused. Its real target is
 * ThreadSanitizer and AddressSanitizer (tests/sanitizers.sh): a data race in the registry, or a call
 * using an object freed by a concurrent destroy, fails it. */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t under -std=c99 */
#include <pthread.h>

#include "test_util.h"

enum { kThreads = 4, kRounds = 40, kPerRound = 6, kMetas = 3, kStale = 128, kMaxElems = 64 };

typedef struct {
    int id;
    uint64_t rng;
    fp8amp_context ctx;
    fp8amp_tensor anchor; /* lives through the whole test: always found */
    int64_t anchor_numel;
    /* This round's objects, destroyed by threads id-1 and id-2 (mod kThreads). */
    fp8amp_tensor tensors[kPerRound];
    int64_t numel[kPerRound];
    float amax[kPerRound];
    fp8amp_scaling metas[kMetas];
    /* Which of owner o's objects this thread destroyed this round (read by thread 0 after a barrier). */
    int destroyed[kThreads][kPerRound];
    int meta_destroyed[kThreads][kMetas];
    fp8amp_tensor stale[kStale]; /* handles destroyed in earlier rounds */
    int n_stale;
    long seen_live, seen_refused; /* lookups of racing handles that found the object / were refused */
    char error[512];              /* the first failure (CMocka's asserts must run on the main thread) */
} worker;

static worker g_workers[kThreads];
static pthread_barrier_t g_barrier;

#define FAILED(w, ...)                                                                             \
    do {                                                                                           \
        if (!(w)->error[0]) {                                                                      \
            int n_ = snprintf((w)->error, sizeof (w)->error, "thread %d line %d: ", (w)->id, __LINE__); \
            snprintf((w)->error + n_, sizeof (w)->error - (size_t)n_, __VA_ARGS__);                \
        }                                                                                          \
    } while (0)

/* Records a failure unless `call` returned `expected` (and, for an error, left its own message). */
#define EXPECT(w, call, expected)                                                                  \
    do {                                                                                           \
        fp8amp_status st_ = (call);                                                                \
        if (st_ != (expected) || ((expected) != FP8AMP_SUCCESS && !message_is_from(#call)))        \
            FAILED(w, "%s returned %s, expected %s (%s)", #call, fp8amp_status_name(st_),          \
                   fp8amp_status_name(expected), fp8amp_last_error_message());                     \
    } while (0)

static uint64_t next_u64(worker *w) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static float next_float(worker *w, float lo, float hi) {
    return lo + (hi - lo) * (float)((next_u64(w) >> 40) * (1.0 / 16777216.0));
}

/* A refused handle's message says why (after "fp8amp_<function>: <argument> "). */
static int refused_as_dead(void) { return strstr(fp8amp_last_error_message(), "is not a live handle") != NULL; }

/* An f32 tensor of n random elements in (-1, 1) and one of magnitude in [2, 3): returns its amax. */
static fp8amp_tensor make_random(worker *w, int64_t n, float *amax) {
    float host[kMaxElems];
    for (int64_t i = 0; i < n; ++i) host[i] = next_float(w, -0.999f, 0.999f);
    const int64_t big = (int64_t)(next_u64(w) % (uint64_t)n);
    host[big] = next_float(w, 2.0f, 3.0f) * (next_u64(w) & 1 ? -1.0f : 1.0f);
    *amax = host[big] < 0 ? -host[big] : host[big];
    fp8amp_tensor t = NULL;
    EXPECT(w, fp8amp_tensor_create(w->ctx, FP8AMP_DTYPE_F32, 1, &n, &t), FP8AMP_SUCCESS);
    EXPECT(w, fp8amp_tensor_copy_from_host(t, host, (size_t)n * sizeof(float)), FP8AMP_SUCCESS);
    return t;
}

/* The long-lived objects are found, and the wrong kind is refused. */
static void check_fixed(worker *w) {
    int64_t n = -1;
    EXPECT(w, fp8amp_tensor_numel(w->anchor, &n), FP8AMP_SUCCESS);
    if (n != w->anchor_numel) FAILED(w, "anchor numel %lld, expected %lld", (long long)n, (long long)w->anchor_numel);
    fp8amp_device d;
    EXPECT(w, fp8amp_context_device(w->ctx, &d), FP8AMP_SUCCESS);
    EXPECT(w, fp8amp_tensor_numel((fp8amp_tensor)w->ctx, &n), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT(w, fp8amp_context_device((fp8amp_context)w->anchor, &d), FP8AMP_ERROR_INVALID_HANDLE);
}

static void check_stale(worker *w, int from) {
    for (int i = from; i < w->n_stale; ++i) {
        int64_t n;
        EXPECT(w, fp8amp_tensor_numel(w->stale[i], &n), FP8AMP_ERROR_INVALID_HANDLE);
        if (!refused_as_dead()) FAILED(w, "stale handle refused with '%s'", fp8amp_last_error_message());
    }
}

/* One pass of the owner over its racing objects: found with their own values, or refused for good. */
static int owner_pass(worker *w, int gone[kPerRound], int *metas_gone) {
    int all = 1;
    for (int k = 0; k < kPerRound; ++k) {
        float amax = -1.0f;
        int64_t n = -1;
        const fp8amp_status a = fp8amp_amax(w->ctx, w->tensors[k], &amax);
        if (a == FP8AMP_SUCCESS) {
            if (gone[k]) FAILED(w, "tensor %d found again after it was refused", k);
            if (amax != w->amax[k]) FAILED(w, "tensor %d: amax %g, expected %g", k, amax, w->amax[k]);
            ++w->seen_live;
        } else if (a == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()) {
            gone[k] = 1;
            ++w->seen_refused;
        } else {
            FAILED(w, "fp8amp_amax on racing tensor %d: %s (%s)", k, fp8amp_status_name(a), fp8amp_last_error_message());
        }
        const fp8amp_status s = fp8amp_tensor_numel(w->tensors[k], &n);
        if (s == FP8AMP_SUCCESS) {
            if (gone[k]) FAILED(w, "tensor %d found again after it was refused", k);
            if (n != w->numel[k]) FAILED(w, "tensor %d: numel %lld, expected %lld", k, (long long)n, (long long)w->numel[k]);
        } else if (s == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()) {
            gone[k] = 1;
        } else {
            FAILED(w, "fp8amp_tensor_numel on racing tensor %d: %s", k, fp8amp_status_name(s));
        }
        all &= gone[k];
    }
    const fp8amp_status u = fp8amp_scaling_update_many(w->ctx, kMetas, w->metas);
    if (u == FP8AMP_ERROR_INVALID_HANDLE && strstr(fp8amp_last_error_message(), "metas[") && refused_as_dead())
        *metas_gone = 1;
    else if (u != FP8AMP_SUCCESS)
        FAILED(w, "fp8amp_scaling_update_many: %s (%s)", fp8amp_status_name(u), fp8amp_last_error_message());
    else if (*metas_gone)
        FAILED(w, "fp8amp_scaling_update_many succeeded after a meta was refused");
    return all && *metas_gone;
}

/* Destroy step `step` of this thread: tensors and metas of owners id+1 (in order) and id+2 (reversed),
 * so each object has two destroyers racing; plus a scratch tensor made and destroyed (slot churn). */
static void destroy_step(worker *w, int step) {
    const int o1 = (w->id + 1) % kThreads, o2 = (w->id + 2) % kThreads;
    const worker *a = &g_workers[o1], *b = &g_workers[o2];
    if (step < kPerRound) {
        const int k1 = step, k2 = kPerRound - 1 - step;
        fp8amp_status s = fp8amp_tensor_destroy(a->tensors[k1]);
        w->destroyed[o1][k1] = s == FP8AMP_SUCCESS;
        if (s != FP8AMP_SUCCESS && !(s == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()))
            FAILED(w, "destroy of a racing tensor: %s", fp8amp_status_name(s));
        s = fp8amp_tensor_destroy(b->tensors[k2]);
        w->destroyed[o2][k2] = s == FP8AMP_SUCCESS;
        if (s != FP8AMP_SUCCESS && !(s == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()))
            FAILED(w, "destroy of a racing tensor: %s", fp8amp_status_name(s));
    } else if (step < kPerRound + kMetas) {
        const int m = step - kPerRound;
        fp8amp_status s = fp8amp_scaling_destroy(a->metas[m]);
        w->meta_destroyed[o1][m] = s == FP8AMP_SUCCESS;
        if (s != FP8AMP_SUCCESS && !(s == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()))
            FAILED(w, "destroy of a racing meta: %s", fp8amp_status_name(s));
        s = fp8amp_scaling_destroy(b->metas[kMetas - 1 - m]);
        w->meta_destroyed[o2][kMetas - 1 - m] = s == FP8AMP_SUCCESS;
        if (s != FP8AMP_SUCCESS && !(s == FP8AMP_ERROR_INVALID_HANDLE && refused_as_dead()))
            FAILED(w, "destroy of a racing meta: %s", fp8amp_status_name(s));
    }
    float amax;
    const int64_t n = 1 + (int64_t)(next_u64(w) % kMaxElems);
    fp8amp_tensor scratch = make_random(w, n, &amax);
    float got = -1.0f;
    EXPECT(w, fp8amp_amax(w->ctx, scratch, &got), FP8AMP_SUCCESS);
    if (got != amax) FAILED(w, "scratch amax %g, expected %g", got, amax);
    EXPECT(w, fp8amp_tensor_destroy(scratch), FP8AMP_SUCCESS);
    int64_t m;
    EXPECT(w, fp8amp_tensor_numel(scratch, &m), FP8AMP_ERROR_INVALID_HANDLE);
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    fp8amp_recipe recipe;
    EXPECT(w, fp8amp_recipe_init_default(&recipe), FP8AMP_SUCCESS);
    for (int round = 0; round < kRounds; ++round) {
        /* A: make this round's objects; new handles never equal a stale one. */
        for (int k = 0; k < kPerRound; ++k) {
            w->numel[k] = 1 + (int64_t)(next_u64(w) % kMaxElems);
            w->tensors[k] = make_random(w, w->numel[k], &w->amax[k]);
            for (int i = 0; i < w->n_stale; ++i)
                if (w->tensors[k] == w->stale[i]) FAILED(w, "a new handle equals a destroyed one");
        }
        for (int m = 0; m < kMetas; ++m)
            EXPECT(w, fp8amp_scaling_create(w->ctx, &recipe, FP8AMP_DTYPE_E4M3, &w->metas[m]), FP8AMP_SUCCESS);
        memset(w->destroyed, 0, sizeof w->destroyed);
        memset(w->meta_destroyed, 0, sizeof w->meta_destroyed);
        pthread_barrier_wait(&g_barrier);

        /* B: destroy others' objects while using one's own, all threads at once. */
        int gone[kPerRound] = {0}, metas_gone = 0, mine_gone = 0;
        for (int step = 0; step < kPerRound + kMetas || !mine_gone; ++step) {
            if (step < kPerRound + kMetas) destroy_step(w, step);
            if (!mine_gone) mine_gone = owner_pass(w, gone, &metas_gone);
            check_fixed(w);
            if (w->n_stale) check_stale(w, (int)(next_u64(w) % (uint64_t)w->n_stale));
            if (w->error[0]) mine_gone = 1; /* keep to the barriers after a failure */
        }
        pthread_barrier_wait(&g_barrier);

        /* C: each object was destroyed exactly once, and every handle of the round is refused. */
        if (w->id == 0) {
            for (int o = 0; o < kThreads; ++o) {
                for (int k = 0; k < kPerRound; ++k) {
                    int count = 0;
                    for (int t = 0; t < kThreads; ++t) count += g_workers[t].destroyed[o][k];
                    if (count != 1) FAILED(w, "round %d: tensor %d of thread %d destroyed %d times", round, k, o, count);
                }
                for (int m = 0; m < kMetas; ++m) {
                    int count = 0;
                    for (int t = 0; t < kThreads; ++t) count += g_workers[t].meta_destroyed[o][m];
                    if (count != 1) FAILED(w, "round %d: meta %d of thread %d destroyed %d times", round, m, o, count);
                }
            }
        }
        for (int k = 0; k < kPerRound; ++k) {
            w->stale[(w->n_stale < kStale ? w->n_stale++ : (int)(next_u64(w) % kStale))] = w->tensors[k];
        }
        for (int m = 0; m < kMetas; ++m) {
            float s, si, a;
            EXPECT(w, fp8amp_scaling_get(w->metas[m], &s, &si, &a), FP8AMP_ERROR_INVALID_HANDLE);
        }
        check_stale(w, 0);
        pthread_barrier_wait(&g_barrier); /* before round+1 overwrites what thread 0 read */
    }
    return NULL;
}

static void test_create_lookup_destroy_race(void **state) {
    (void)state;
    memset(g_workers, 0, sizeof g_workers);
    assert_int_equal(pthread_barrier_init(&g_barrier, NULL, kThreads), 0);
    pthread_t tids[kThreads];
    for (int t = 0; t < kThreads; ++t) {
        worker *w = &g_workers[t];
        w->id = t;
        w->rng = test_rng_u64() | 1;
        EXPECT_OK(fp8amp_context_create(cpu_device(), &w->ctx));
        float amax;
        w->anchor_numel = 1 + (int64_t)(next_u64(w) % kMaxElems);
        w->anchor = make_random(w, w->anchor_numel, &amax);
        assert_string_equal(w->error, "");
    }
    for (int t = 0; t < kThreads; ++t) assert_int_equal(pthread_create(&tids[t], NULL, worker_main, &g_workers[t]), 0);
    for (int t = 0; t < kThreads; ++t) assert_int_equal(pthread_join(tids[t], NULL), 0);
    pthread_barrier_destroy(&g_barrier);
    long live = 0, refused = 0;
    for (int t = 0; t < kThreads; ++t) {
        if (g_workers[t].error[0]) print_error("%s\n", g_workers[t].error);
        assert_string_equal(g_workers[t].error, "");
        live += g_workers[t].seen_live;
        refused += g_workers[t].seen_refused;
    }
    print_message("racing lookups: %ld found their object, %ld were refused\n", live, refused);
    assert_true(refused >= kThreads * kRounds * kPerRound); /* each racing tensor was seen refused */
    for (int t = 0; t < kThreads; ++t) {
        EXPECT_OK(fp8amp_tensor_destroy(g_workers[t].anchor));
        EXPECT_OK(fp8amp_context_destroy(g_workers[t].ctx));
        EXPECT_STATUS(fp8amp_context_destroy(g_workers[t].ctx), FP8AMP_ERROR_INVALID_HANDLE);
    }
}

/* One thread: a destroyed handle stays refused through thousands of reuses of the registry's slots,
 * and no new handle equals it (the generation moved on). */
static void test_stale_handle_survives_slot_reuse(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[1] = {3};
    fp8amp_tensor dead = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
    EXPECT_OK(fp8amp_tensor_destroy(dead));
    for (int i = 0; i < 5000; ++i) {
        const int64_t n = 1 + (int64_t)(test_rng_u64() % 8);
        fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
        assert_true(t != dead);
        int64_t got = 0;
        EXPECT_OK(fp8amp_tensor_numel(t, &got));
        assert_int_equal(got, n);
        EXPECT_STATUS(fp8amp_tensor_numel(dead, &got), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_OK(fp8amp_tensor_destroy(t));
    }
    EXPECT_STATUS(fp8amp_tensor_destroy(dead), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_lookup_destroy_race),
        cmocka_unit_test(test_stale_handle_survives_slot_reuse),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
