/* Host time of the CPU GEMM through the C API: an FP8 Linear forward (quantize x, GEMM, bias) on a CPU
 * context, ns per call (the median of `reps` calls after warm-up), for M x K x N shapes, plus an FNV-1a
 * hash of y's bytes so that two builds can be compared bit for bit (fixed seed: the same input every run).
 * Build: cc -O2 bench/bench_cpu_gemm.c -Icapi/include -L<build> -lfp8amp -o bench_cpu_gemm
 * Usage: bench_cpu_gemm [M K N reps]...   (default: 64 64 64 2000, 512 512 512 20) */
#define _POSIX_C_SOURCE 199309L
#include <fp8amp/fp8amp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        fp8amp_status st_ = (call);                                                                \
        if (st_ != FP8AMP_SUCCESS) {                                                               \
            fprintf(stderr, "%s: %s\n", #call, fp8amp_last_error_message());                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint32_t lcg = 12345u;
static float next_value(void) {
    lcg = lcg * 1664525u + 1013904223u;
    return ((lcg >> 8) / 16777216.0f - 0.5f) * 4.0f;
}

static void run(fp8amp_context ctx, int64_t m, int64_t k, int64_t n, int reps) {
    fp8amp_linear_desc d;
    fp8amp_linear lin;
    fp8amp_tensor w, x, y;
    int64_t xs[2] = {m, k}, ys[2] = {m, n}, ws[2] = {n, k};
    float *host = malloc(sizeof(float) * (size_t)(m * k > n * k ? (m * k > m * n ? m * k : m * n) : (n * k > m * n ? n * k : m * n)));
    double *t = malloc(sizeof(double) * (size_t)reps);
    CHECK(fp8amp_linear_desc_init(&d, sizeof d));
    d.in_features = k;
    d.out_features = n;
    d.has_bias = 0;
    d.weight_dtype = FP8AMP_DTYPE_F32;
    d.policy = FP8AMP_GEMM_ALWAYS_FP8;
    CHECK(fp8amp_linear_create(ctx, &d, &lin));
    CHECK(fp8amp_linear_weight(lin, &w));
    for (int64_t i = 0; i < n * k; ++i) host[i] = next_value();
    CHECK(fp8amp_tensor_copy_from_host(w, host, sizeof(float) * (size_t)(n * k)));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, xs, &x));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, ys, &y));
    for (int64_t i = 0; i < m * k; ++i) host[i] = next_value();
    CHECK(fp8amp_tensor_copy_from_host(x, host, sizeof(float) * (size_t)(m * k)));
    for (int i = 0; i < 3; ++i) CHECK(fp8amp_linear_forward(lin, x, y, 0));
    for (int i = 0; i < reps; ++i) {
        double t0 = now_ns();
        CHECK(fp8amp_linear_forward(lin, x, y, 0));
        t[i] = now_ns() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    CHECK(fp8amp_tensor_copy_to_host(y, host, sizeof(float) * (size_t)(m * n)));
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(float) * (size_t)(m * n); ++i) h = (h ^ ((unsigned char *)host)[i]) * 1099511628211ull;
    printf("%lld x %lld x %lld: median %.0f ns/call (min %.0f, %d calls), y hash %016llx\n", (long long)m,
           (long long)k, (long long)n, t[reps / 2], t[0], reps, (unsigned long long)h);
    (void)ws;
    fp8amp_tensor_destroy(w);
    fp8amp_tensor_destroy(x);
    fp8amp_tensor_destroy(y);
    fp8amp_linear_destroy(lin);
    free(host);
    free(t);
}

int main(int argc, char **argv) {
    fp8amp_context ctx;
    fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    CHECK(fp8amp_context_create(cpu, &ctx));
    if (argc >= 5) {
        for (int a = 1; a + 3 < argc; a += 4) run(ctx, atoll(argv[a]), atoll(argv[a + 1]), atoll(argv[a + 2]), atoi(argv[a + 3]));
    } else {
        run(ctx, 64, 64, 64, 2000);
        run(ctx, 512, 512, 512, 20);
    }
    fp8amp_context_destroy(ctx);
    return 0;
}
