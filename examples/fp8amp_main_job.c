/* The main job of fp8amp, through the public C API only.
 *
 * Today: loads a real dataset (the UCI handwritten digits, exported by data/export_digits.py),
 * puts it on the chosen device, round-trips it through E4M3 and E5M2 (and F16/BF16 for comparison)
 * with fp8amp_cast, and prints error statistics per format -- for the raw pixel intensities and for
 * the standardized features a network would see. It grows into FP8 training of a classifier as the
 * FP8 Linear layer and the low-precision optimizer land.
 *
 * Usage: fp8amp_main_job --data FILE [--device auto|cpu|cuda]
 *   auto (the default) uses CUDA when a GPU is present and the CPU otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8amp/fp8amp.h"

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        fp8amp_status st_ = (call);                                                                  \
        if (st_ != FP8AMP_SUCCESS) {                                                                 \
            fprintf(stderr, "error: %s failed with %s: %s\n", #call, fp8amp_status_name(st_),       \
                    fp8amp_last_error_message());                                                    \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

typedef struct {
    uint32_t rows, cols, classes;
    float *x;   /* rows x cols */
    int32_t *y; /* rows */
} dataset;

static void die(const char *msg, const char *detail) {
    fprintf(stderr, "error: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* Reads the file written by data/export_digits.py, validating every size against the file. */
static dataset load_dataset(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the dataset (run examples/run_main_job.sh, which exports it)", path);
    char magic[8];
    uint32_t header[4];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "FP8AMPDS", 8) != 0) die("not an fp8amp dataset file", path);
    if (fread(header, sizeof header[0], 4, f) != 4 || header[0] != 1) die("unsupported dataset version", path);
    dataset d = {header[1], header[2], header[3], NULL, NULL};
    if (d.rows == 0 || d.cols == 0 || d.rows > (1u << 24) || d.cols > 4096 || d.classes < 2)
        die("implausible dataset sizes", path);
    const size_t n = (size_t)d.rows * d.cols;
    d.x = malloc(n * sizeof *d.x);
    d.y = malloc(d.rows * sizeof *d.y);
    if (!d.x || !d.y) die("out of memory", NULL);
    if (fread(d.x, sizeof *d.x, n, f) != n || fread(d.y, sizeof *d.y, d.rows, f) != d.rows)
        die("dataset file is truncated", path);
    if (fgetc(f) != EOF) die("dataset file has trailing bytes", path);
    fclose(f);
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(d.x[i])) die("dataset has non-finite features", path);
    for (uint32_t i = 0; i < d.rows; ++i)
        if (d.y[i] < 0 || (uint32_t)d.y[i] >= d.classes) die("dataset has a label out of range", path);
    return d;
}

typedef struct {
    double rel_rms;      /* ||x - x'|| / ||x|| */
    double max_abs;      /* max |x - x'| */
    double max_rel;      /* max |x - x'| / |x| over x != 0 */
    double exact;        /* fraction of elements that survive exactly */
    size_t saturated;    /* |x| above the format's largest finite value */
    size_t flushed;      /* x != 0 that came back as 0 */
} roundtrip_stats;

static double max_finite(fp8amp_dtype d) {
    switch (d) {
    case FP8AMP_DTYPE_E4M3: return 448.0;
    case FP8AMP_DTYPE_E5M2: return 57344.0;
    case FP8AMP_DTYPE_F16: return 65504.0;
    default: return 3.3895313892515355e38; /* BF16 */
    }
}

/* x (on the device, F32) -> format -> F32, then compares with the host copy. */
static roundtrip_stats roundtrip(fp8amp_context ctx, fp8amp_tensor x, const float *host_x, size_t n,
                                 const int64_t *shape, fp8amp_dtype format) {
    fp8amp_tensor low, back;
    CHECK(fp8amp_tensor_create(ctx, format, 2, shape, &low));
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &back));
    CHECK(fp8amp_cast(ctx, x, low));
    CHECK(fp8amp_cast(ctx, low, back));
    float *got = malloc(n * sizeof *got);
    if (!got) die("out of memory", NULL);
    CHECK(fp8amp_tensor_copy_to_host(back, got, n * sizeof *got));

    roundtrip_stats s = {0, 0, 0, 0, 0, 0};
    double err2 = 0, ref2 = 0;
    size_t exact = 0;
    for (size_t i = 0; i < n; ++i) {
        const double a = host_x[i], b = got[i], e = fabs(a - b);
        err2 += e * e;
        ref2 += a * a;
        if (e > s.max_abs) s.max_abs = e;
        if (a != 0 && e / fabs(a) > s.max_rel) s.max_rel = e / fabs(a);
        exact += (a == b);
        s.saturated += fabs(a) > max_finite(format);
        s.flushed += (a != 0 && b == 0);
    }
    s.rel_rms = ref2 > 0 ? sqrt(err2 / ref2) : 0;
    s.exact = (double)exact / (double)n;
    free(got);
    CHECK(fp8amp_tensor_destroy(low));
    CHECK(fp8amp_tensor_destroy(back));
    return s;
}

static void report(fp8amp_context ctx, const char *label, const float *host_x, uint32_t rows, uint32_t cols) {
    const int64_t shape[2] = {rows, cols};
    const size_t n = (size_t)rows * cols;
    fp8amp_tensor x;
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &x));
    CHECK(fp8amp_tensor_copy_from_host(x, host_x, n * sizeof *host_x));
    printf("\n%s (%u x %u):\n", label, rows, cols);
    printf("  %-6s %12s %12s %12s %9s %10s %9s\n", "format", "rel RMS err", "max abs err", "max rel err", "exact",
           "saturated", "flushed");
    const fp8amp_dtype formats[4] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16};
    for (int k = 0; k < 4; ++k) {
        const roundtrip_stats s = roundtrip(ctx, x, host_x, n, shape, formats[k]);
        printf("  %-6s %12.3e %12.3e %12.3e %8.2f%% %10zu %9zu\n", fp8amp_dtype_name(formats[k]), s.rel_rms, s.max_abs,
               s.max_rel, 100.0 * s.exact, s.saturated, s.flushed);
    }
    CHECK(fp8amp_tensor_destroy(x));
}

int main(int argc, char **argv) {
    const char *data_path = NULL;
    const char *device_arg = "auto";
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data_path = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device_arg = argv[++i];
        else {
            fprintf(stderr, "usage: %s --data FILE [--device auto|cpu|cuda]\n", argv[0]);
            return 2;
        }
    }
    if (!data_path) {
        fprintf(stderr, "usage: %s --data FILE [--device auto|cpu|cuda]\n", argv[0]);
        return 2;
    }
    if (fp8amp_version() / 10000 != FP8AMP_VERSION_MAJOR) die("libfp8amp's major version differs from the header's", NULL);

    int32_t n_gpus = 0;
    CHECK(fp8amp_device_count(FP8AMP_DEVICE_CUDA, &n_gpus));
    fp8amp_device device = {FP8AMP_DEVICE_CPU, 0};
    if (!strcmp(device_arg, "cuda") || (!strcmp(device_arg, "auto") && n_gpus > 0)) device.type = FP8AMP_DEVICE_CUDA;
    else if (strcmp(device_arg, "cpu") && strcmp(device_arg, "auto")) die("unknown --device", device_arg);

    fp8amp_context ctx;
    CHECK(fp8amp_context_create(device, &ctx));
    const uint32_t v = fp8amp_version();
    printf("fp8amp %u.%u.%u on %s\n", v / 10000, v / 100 % 100, v % 100,
           device.type == FP8AMP_DEVICE_CUDA ? "cuda:0" : "cpu");

    dataset d = load_dataset(data_path);
    printf("dataset: %s: %u samples, %u features, %u classes\n", data_path, d.rows, d.cols, d.classes);

    report(ctx, "raw pixel intensities (0..16)", d.x, d.rows, d.cols);

    /* Standardize each column (zero mean, unit variance), as the network's input layer sees them. */
    const size_t n = (size_t)d.rows * d.cols;
    float *z = malloc(n * sizeof *z);
    if (!z) die("out of memory", NULL);
    for (uint32_t c = 0; c < d.cols; ++c) {
        double mean = 0, var = 0;
        for (uint32_t r = 0; r < d.rows; ++r) mean += d.x[(size_t)r * d.cols + c];
        mean /= d.rows;
        for (uint32_t r = 0; r < d.rows; ++r) {
            const double t = d.x[(size_t)r * d.cols + c] - mean;
            var += t * t;
        }
        const double sd = sqrt(var / d.rows);
        for (uint32_t r = 0; r < d.rows; ++r)
            z[(size_t)r * d.cols + c] = sd > 0 ? (float)((d.x[(size_t)r * d.cols + c] - mean) / sd) : 0.0f;
    }
    report(ctx, "standardized features", z, d.rows, d.cols);

    printf("\nE4M3 keeps 3 mantissa bits (relative step 2^-4 near 1), E5M2 keeps 2 (2^-3) but reaches 57344:\n"
           "the reason fp8amp uses E4M3 for weights and activations and E5M2 for gradients (HYBRID).\n");
    free(z);
    free(d.x);
    free(d.y);
    CHECK(fp8amp_context_destroy(ctx));
    return 0;
}
