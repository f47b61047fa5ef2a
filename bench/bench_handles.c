/* Host cost of the handle registry: nanoseconds per call of tiny CPU operations through the public
 * C API, with 1, 2, 4, ... threads each on a context of its own (docs/api.md 1.5: different
 * contexts are independent). The operations do almost no work, so the time is the call overhead:
 * the boundary guard, the handle lookups (one per handle argument) and the dispatch.
 *   numel  fp8amp_tensor_numel(t)                  1 lookup, a getter
 *   amax   fp8amp_amax(ctx, t)  on 16 f32          2 lookups
 *   cast   fp8amp_cast(ctx, src, dst) 16 f32->e4m3 3 lookups
 * Each measurement runs every thread for `iters` calls after a barrier and reports the mean ns per
 * call seen by one thread (wall time of that thread / iters, averaged over the threads); it is
 * repeated `reps` times and the minimum and the median are printed; so are the same of the thread
 * CPU time per call (which leaves out time preempted by other processes, and time asleep on a
 * contended mutex), and, for several threads, the wall figures of only the reps in which the threads'
 * loops overlapped for at least 90% of the span (on a loaded machine the scheduler may run them one
 * after the other, which hides contention). Perfect scaling keeps the
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
    double ns_per_call, cpu_ns_per_call, t0, t1;
    int failed;
} worker;

static double clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static double now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

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
    const double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
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
    const double t1 = now_ns();
    w->cpu_ns_per_call = (clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)g_iters;
    w->ns_per_call = (t1 - t0) / (double)g_iters;
    w->t0 = t0;
    w->t1 = t1;
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
    double *cpu_samples = calloc((size_t)reps, sizeof *cpu_samples);
    double *overlapped = calloc((size_t)reps, sizeof *overlapped);
    if (!workers || !samples || !cpu_samples || !overlapped) return 1;
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
            int n_overlapped = 0;
            for (int r = 0; r < reps; ++r) {
                pthread_barrier_init(&g_barrier, NULL, (unsigned)g_threads);
                for (int t = 0; t < g_threads; ++t)
                    if (pthread_create(&ids[t], NULL, run, &workers[t])) return 1;
                double sum = 0.0, cpu = 0.0, first_start = 1e300, last_start = 0, first_end = 1e300, last_end = 0;
                for (int t = 0; t < g_threads; ++t) {
                    pthread_join(ids[t], NULL);
                    if (workers[t].failed) die(kOpNames[g_op]);
                    sum += workers[t].ns_per_call;
                    cpu += workers[t].cpu_ns_per_call;
                    if (workers[t].t0 < first_start) first_start = workers[t].t0;
                    if (workers[t].t0 > last_start) last_start = workers[t].t0;
                    if (workers[t].t1 < first_end) first_end = workers[t].t1;
                    if (workers[t].t1 > last_end) last_end = workers[t].t1;
                }
                pthread_barrier_destroy(&g_barrier);
                samples[r] = sum / g_threads;
                cpu_samples[r] = cpu / g_threads;
                /* The share of the whole span during which all threads were running their loops: a
                 * rep in which the scheduler ran them one after the other measures no contention. */
                const double overlap = (first_end - last_start) / (last_end - first_start);
                if (overlap >= 0.9) overlapped[n_overlapped++] = samples[r];
            }
            qsort(samples, (size_t)reps, sizeof *samples, cmp_double);
            qsort(cpu_samples, (size_t)reps, sizeof *cpu_samples, cmp_double);
            qsort(overlapped, (size_t)n_overlapped, sizeof *overlapped, cmp_double);
            printf("%s\n  {\"op\": \"%s\", \"threads\": %d, \"ns_per_call_min\": %.1f, \"ns_per_call_median\": %.1f, "
                   "\"cpu_ns_per_call_min\": %.1f, \"cpu_ns_per_call_median\": %.1f, \"reps_overlapped\": %d",
                   first ? "" : ",", kOpNames[g_op], g_threads, samples[0], samples[reps / 2], cpu_samples[0],
                   cpu_samples[reps / 2], n_overlapped);
            if (n_overlapped)
                printf(", \"overlapped_ns_per_call_min\": %.1f, \"overlapped_ns_per_call_median\": %.1f",
                       overlapped[0], overlapped[n_overlapped / 2]);
            printf("}");
            first = 0;
        }
    }
    printf("\n]}\n");
    for (int t = 0; t < max_threads; ++t) {
        fp8amp_tensor_destroy(workers[t].dst);
        fp8amp_tensor_destroy(workers[t].src);
        fp8amp_context_destroy(workers[t].ctx);
    }
    free(overlapped);
    free(cpu_samples);
    free(samples);
    free(workers);
    return 0;
}
