/* Host cost of the handle registry: nanoseconds per call of tiny CPU operations through the public
 * C API, with 1, 2, 4, ... threads each on a context of its own (docs/api.md 1.5: different contexts
 * are independent). The operations do almost no work, so the time is the call overhead: the boundary
 * guard, the handle lookups (one per handle argument) and the dispatch.
 *   numel  fp8amp_tensor_numel(t)                  1 lookup, a getter
 *   amax   fp8amp_amax(ctx, t)  on 16 f32          2 lookups
 *   cast   fp8amp_cast(ctx, src, dst) 16 f32->e4m3 3 lookups
 * A measurement is a time window: the threads start together at a barrier and call the operation in
 * a loop for `window_us`, counting their calls. So all threads are inside their loops for the same
 * wall-clock window (a fixed number of calls per thread would let the scheduler of a loaded machine,
 * or an unfair mutex, run them one after the other and hide contention). Per thread: wall ns per call = window / calls, and thread-CPU ns per
 * call (leaves out time preempted by other processes, and time asleep on a contended mutex, but
 * counts spinning and futex calls); each averaged over the threads. Repeated `reps` times; min and
 * median are printed. Perfect scaling keeps the n-thread figures at the 1-thread ones; a lock that
 * serializes the threads multiplies the wall figure by n.
 * Usage: bench_handles [window_us=5000] [reps=21] [max_threads=2]; prints one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8amp/fp8amp.h"

enum { kOps = 3, kElems = 16 };
static const char *const kOpNames[kOps] = {"numel", "amax", "cast"};

static int g_op;
static double g_window_ns;
static pthread_barrier_t g_barrier;

typedef struct {
    fp8amp_context ctx;
    fp8amp_tensor src, dst;
    double wall_ns, cpu_ns;
    long calls;
    int failed;
} worker;

static double clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_handles: %s failed: %s\n", what, fp8amp_last_error_message());
    exit(1);
}

/* The clock is read every 16 calls (a vDSO call, about 20 ns: about 1 ns a call). Each thread ends
 * its own window, so none depends on another being scheduled to stop it (under RT=1 a main thread
 * that had to wake up to raise a flag could wait for a core forever). */
#define LOOP(call)                                                                                 \
    do {                                                                                           \
        for (int i_ = 0; i_ < 16; ++i_) bad |= (call);                                             \
        calls += 16;                                                                               \
    } while (clock_ns(CLOCK_MONOTONIC) < t0 + g_window_ns)

static void *run(void *arg) {
    worker *w = (worker *)arg;
    int64_t n = 0;
    float amax = 0.0f;
    long calls = 0;
    fp8amp_status bad = FP8AMP_SUCCESS;
    pthread_barrier_wait(&g_barrier);
    const double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), t0 = clock_ns(CLOCK_MONOTONIC);
    switch (g_op) {
    case 0: LOOP(fp8amp_tensor_numel(w->src, &n)); break;
    case 1: LOOP(fp8amp_amax(w->ctx, w->src, &amax)); break;
    default: LOOP(fp8amp_cast(w->ctx, w->src, w->dst)); break;
    }
    w->wall_ns = clock_ns(CLOCK_MONOTONIC) - t0;
    w->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    w->calls = calls;
    w->failed = bad != FP8AMP_SUCCESS || (g_op == 0 && n != kElems) || (g_op == 1 && !(amax > 0.0f));
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const long window_us = argc > 1 ? atol(argv[1]) : 5000;
    const int reps = argc > 2 ? atoi(argv[2]) : 21;
    const int max_threads = argc > 3 ? atoi(argv[3]) : 2;
    if (window_us <= 0 || reps <= 0 || max_threads <= 0 || max_threads > 64) {
        fprintf(stderr, "usage: bench_handles [window_us>0] [reps>0] [max_threads 1..64]\n");
        return 2;
    }
    worker *workers = calloc((size_t)max_threads, sizeof *workers);
    double *wall = calloc((size_t)reps, sizeof *wall), *cpu = calloc((size_t)reps, sizeof *cpu);
    if (!workers || !wall || !cpu) return 1;
    const fp8amp_device device = {FP8AMP_DEVICE_CPU, 0};
    const int64_t shape[1] = {kElems};
    float host[kElems];
    srand((unsigned)time(NULL));
    for (int i = 0; i < kElems; ++i) host[i] = (float)(rand() % 2001 - 1000) / 100.0f + 0.5f;
    for (int t = 0; t < max_threads; ++t) {
        if (fp8amp_context_create(device, &workers[t].ctx)) die("fp8amp_context_create");
        if (fp8amp_tensor_create(workers[t].ctx, FP8AMP_DTYPE_F32, 1, shape, &workers[t].src))
            die("fp8amp_tensor_create");
        if (fp8amp_tensor_create(workers[t].ctx, FP8AMP_DTYPE_E4M3, 1, shape, &workers[t].dst))
            die("fp8amp_tensor_create");
        if (fp8amp_tensor_copy_from_host(workers[t].src, host, sizeof host)) die("fp8amp_tensor_copy_from_host");
    }
    g_window_ns = (double)window_us * 1e3;

    printf("{\"window_us\": %ld, \"reps\": %d, \"results\": [", window_us, reps);
    int first = 1;
    for (g_op = 0; g_op < kOps; ++g_op) {
        for (int threads = 1; threads <= max_threads; threads *= 2) {
            pthread_t ids[64];
            for (int r = 0; r < reps; ++r) {
                pthread_barrier_init(&g_barrier, NULL, (unsigned)threads + 1);
                for (int t = 0; t < threads; ++t)
                    if (pthread_create(&ids[t], NULL, run, &workers[t])) return 1;
                pthread_barrier_wait(&g_barrier);
                double w = 0.0, c = 0.0;
                for (int t = 0; t < threads; ++t) {
                    pthread_join(ids[t], NULL);
                    if (workers[t].failed) die(kOpNames[g_op]);
                    w += workers[t].wall_ns / (double)workers[t].calls;
                    c += workers[t].cpu_ns / (double)workers[t].calls;
                }
                pthread_barrier_destroy(&g_barrier);
                wall[r] = w / threads;
                cpu[r] = c / threads;
            }
            qsort(wall, (size_t)reps, sizeof *wall, cmp_double);
            qsort(cpu, (size_t)reps, sizeof *cpu, cmp_double);
            printf("%s\n  {\"op\": \"%s\", \"threads\": %d, \"ns_per_call_min\": %.1f, \"ns_per_call_median\": %.1f, "
                   "\"cpu_ns_per_call_min\": %.1f, \"cpu_ns_per_call_median\": %.1f}",
                   first ? "" : ",", kOpNames[g_op], threads, wall[0], wall[reps / 2], cpu[0], cpu[reps / 2]);
            first = 0;
        }
    }
    printf("\n]}\n");
    for (int t = 0; t < max_threads; ++t) {
        fp8amp_tensor_destroy(workers[t].dst);
        fp8amp_tensor_destroy(workers[t].src);
        fp8amp_context_destroy(workers[t].ctx);
    }
    free(cpu);
    free(wall);
    free(workers);
    return 0;
}
