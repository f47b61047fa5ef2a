/* Host cost of the handle registry: nanoseconds per call of tiny CPU operations through the public
 * C API, with 1, 2, 4, ... threads each on a context of its own (docs/api.md 1.5: different
 * contexts are independent). The operations do almost no work, so the time is the call overhead:
 * the boundary guard, the handle lookups (one per handle argument) and the dispatch.
 *   numel  fp8amp_tensor_numel(t)                  1 lookup, a getter
 *   amax   fp8amp_amax(ctx, t)  on 16 f32          2 lookups
 *   cast   fp8amp_cast(ctx, src, dst) 16 f32->e4m3 3 lookups
 * Each measurement runs every thread for `iters` calls after a barrier and reports the mean ns per
 * call seen by one thread (wall time of that thread / iters, averaged over the threads); it is
 * repeated `reps` times and the minimum and the median are printed. Perfect scaling keeps the
 * 2-thread figure at the 1-thread one; a lock that serializes the threads at least doubles it.
 * Usage: bench_handles [iters=200000] [reps=9] [max_threads=2]; prints one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8amp/fp8amp.h"

enum { kOps = 3, kElems = 16 };
static const char *const kOpNames[kOps] = {"numel", "amax", "cast"};

static long g_iters;
static int g_op, g_threads;
static pthread_barrier_t g_barrier;

typedef struct {
    fp8amp_context ctx;
    fp8amp_tensor src, dst;
    double ns_per_call;
    int failed;
} worker;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_handles: %s failed: %s\n", what, fp8amp_last_error_message());
    exit(1);
}

static void *run(void *arg) {
    worker *w = (worker *)arg;
    int64_t n = 0;
    float amax = 0.0f;
    fp8amp_status bad = FP8AMP_SUCCESS;
    pthread_barrier_wait(&g_barrier);
    const double t0 = now_ns();
    switch (g_op) {
    case 0:
        for (long i = 0; i < g_iters; ++i) bad |= fp8amp_tensor_numel(w->src, &n);
        break;
    case 1:
        for (long i = 0; i < g_iters; ++i) bad |= fp8amp_amax(w->ctx, w->src, &amax);
        break;
    default:
        for (long i = 0; i < g_iters; ++i) bad |= fp8amp_cast(w->ctx, w->src, w->dst);
        break;
    }
    w->ns_per_call = (now_ns() - t0) / (double)g_iters;
    w->failed = bad != FP8AMP_SUCCESS || (g_op == 0 && n != kElems) || (g_op == 1 && !(amax > 0.0f));
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    g_iters = argc > 1 ? atol(argv[1]) : 200000;
    const int reps = argc > 2 ? atoi(argv[2]) : 9;
    const int max_threads = argc > 3 ? atoi(argv[3]) : 2;
    if (g_iters <= 0 || reps <= 0 || max_threads <= 0 || max_threads > 64) {
        fprintf(stderr, "usage: bench_handles [iters>0] [reps>0] [max_threads 1..64]\n");
        return 2;
    }
    worker *workers = calloc((size_t)max_threads, sizeof *workers);
    double *samples = calloc((size_t)reps, sizeof *samples);
    if (!workers || !samples) return 1;
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    const int64_t shape[1] = {kElems};
    float host[kElems];
    srand((unsigned)time(NULL));
    for (int i = 0; i < kElems; ++i) host[i] = (float)(rand() % 2001 - 1000) / 100.0f + 0.5f;
    for (int t = 0; t < max_threads; ++t) {
        if (fp8amp_context_create(cpu, &workers[t].ctx)) die("fp8amp_context_create");
        if (fp8amp_tensor_create(workers[t].ctx, FP8AMP_DTYPE_F32, 1, shape, &workers[t].src))
            die("fp8amp_tensor_create");
        if (fp8amp_tensor_create(workers[t].ctx, FP8AMP_DTYPE_E4M3, 1, shape, &workers[t].dst))
            die("fp8amp_tensor_create");
        if (fp8amp_tensor_copy_from_host(workers[t].src, host, sizeof host)) die("fp8amp_tensor_copy_from_host");
    }

    printf("{\"iters\": %ld, \"reps\": %d, \"results\": [", g_iters, reps);
    int first = 1;
    for (g_op = 0; g_op < kOps; ++g_op) {
        for (g_threads = 1; g_threads <= max_threads; g_threads *= 2) {
            pthread_t ids[64];
            for (int r = 0; r < reps; ++r) {
                pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads);
                for (int t = 0; t < g_threads; ++t)
                    if (pthread_create(&ids[t], NULL, run, &workers[t])) return 1;
                double sum = 0.0;
                for (int t = 0; t < g_threads; ++t) {
                    pthread_join(ids[t], NULL);
                    if (workers[t].failed) die(kOpNames[g_op]);
                    sum += workers[t].ns_per_call;
                }
                pthread_barrier_destroy(&g_barrier);
                samples[r] = sum / g_threads;
            }
            qsort(samples, (size_t)reps, sizeof *samples, cmp_double);
            printf("%s\n  {\"op\": \"%s\", \"threads\": %d, \"ns_per_call_min\": %.1f, \"ns_per_call_median\": %.1f}",
                   first ? "" : ",", kOpNames[g_op], g_threads, samples[0], samples[reps / 2]);
            first = 0;
        }
    }
    printf("\n]}\n");
    for (int t = 0; t < max_threads; ++t) {
        fp8amp_tensor_destroy(workers[t].dst);
        fp8amp_tensor_destroy(workers[t].src);
        fp8amp_context_destroy(workers[t].ctx);
    }
    free(samples);
    free(workers);
    return 0;
}
