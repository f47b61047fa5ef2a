/* The main job of fp8amp, through the public C API only.
 *
 * Loads a real dataset (the UCI handwritten digits, exported by data/export_digits.py), shows what
 * E4M3 and E5M2 do to its features, then trains a small MLP classifier (64 -> 128 -> ReLU -> 16
 * logits, of which the 10 classes are used) three ways from the same initial weights and batches:
 *   F32     on the CPU: F32 GEMMs (policy NEVER_FP8), F32 weights and gradients, AdamW with F32 state;
 *   FP8 O1  on the chosen device: FP8 GEMMs forward and backward (E4M3 x and W, E5M2 dY, delayed
 *           scaling with an amax history), scaled-F16 weights, E4M3 weight gradients, F32 AdamW state;
 *   FP8 O2  the same with AdamW state in E4M3 + F16 (fp8amp_opt_level_config).
 * It prints loss and accuracy per epoch, then each network's test accuracy and optimizer memory.
 * Everything goes through the public C API; the ReLU and the softmax loss run on the host.
 *
 * Usage: fp8amp_main_job --data FILE [--device auto|cpu|cuda] [--epochs N]
 *   auto (the default) uses CUDA when a GPU is present and the CPU otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8amp/fp8amp.h"
#include "main_job_model.h"

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

static const char *kind_name(fp8amp_linear lin) {
    fp8amp_gemm_kind k;
    CHECK(fp8amp_linear_gemm_kind(lin, &k));
    return k == FP8AMP_GEMM_KIND_FP8 ? "FP8" : k == FP8AMP_GEMM_KIND_BF16 ? "BF16" : k == FP8AMP_GEMM_KIND_F32 ? "F32" : "-";
}

enum { BATCH = 64 };

int main(int argc, char **argv) {
    const char *data_path = NULL;
    const char *device_arg = "auto";
    int epochs = 30;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data_path = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device_arg = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else data_path = NULL, i = argc;
    }
    if (!data_path || epochs < 1) {
        fprintf(stderr, "usage: %s --data FILE [--device auto|cpu|cuda] [--epochs N]\n", argv[0]);
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
    if (d.classes > LOGITS) die("this job's network has at most 16 classes", NULL);

    /* Standardize each column (zero mean, unit variance), as the network's input layer sees them. */
    const size_t n = (size_t)d.rows * d.cols;
    float *z = standardize(&d);
    report(ctx, "standardized features through each format", z, d.rows, d.cols);
    CHECK(fp8amp_context_destroy(ctx));

    /* Shuffle once into train (80%) and test (20%). */
    const int rows = (int)d.rows, cols = (int)d.cols, classes = (int)d.classes;
    const int n_test = rows / 5, n_train = rows - n_test;
    float *xs = malloc(sizeof(float) * n), *xb = malloc(sizeof(float) * BATCH * cols);
    int32_t *ys = malloc(sizeof(int32_t) * rows), yb[BATCH];
    if (!xs || !xb || !ys) die("out of memory", NULL);
    shuffle_rows(&d, z, xs, ys);

    /* One initialization (PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in))) for all networks. */
    float *w1, *b1, *w2, *b2;
    init_weights(cols, &w1, &b1, &w2, &b2);

    /* Three networks from the same initial weights, fed the same batches: F32 GEMMs and F32 Adam state
     * on the CPU (the reference), and FP8 training at O1 and O2 on the chosen device. */
    enum { NETS = 3 };
    fp8amp_linear_desc ld[NETS];
    fp8amp_adam_desc ad[NETS];
    CHECK(fp8amp_opt_level_config(FP8AMP_OPT_LEVEL_O1, &ld[0], &ad[0]));
    ld[0].weight_dtype = FP8AMP_DTYPE_F32; /* the reference: F32 weights, gradients and GEMMs */
    ld[0].wgrad_dtype = FP8AMP_DTYPE_F32;
    ld[0].policy = FP8AMP_GEMM_NEVER_FP8;
    CHECK(fp8amp_opt_level_config(FP8AMP_OPT_LEVEL_O1, &ld[1], &ad[1]));
    CHECK(fp8amp_opt_level_config(FP8AMP_OPT_LEVEL_O2, &ld[2], &ad[2]));
    for (int i = 0; i < NETS; ++i) {
        ad[i].lr = 3e-3f;
        ad[i].weight_decay = 1e-4f;
        if (i > 0) ld[i].policy = FP8AMP_GEMM_ALWAYS_FP8; /* FP8 even at this size (AUTO would pick BF16 on a GPU) */
    }
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    const char *names[NETS] = {"F32", "FP8 O1", "FP8 O2"};
    net nets[NETS];
    for (int i = 0; i < NETS; ++i)
        net_init(&nets[i], names[i], i == 0 ? cpu : device, &ld[i], &ad[i], BATCH, cols, w1, b1, w2, b2);
    const char *dev_name = device.type == FP8AMP_DEVICE_CUDA ? "cuda:0" : "cpu";
    printf("\ntraining a %d-%d-%d MLP (10 of %d logits used), batch %d, AdamW lr 3e-3, %d epochs:\n", cols, HIDDEN,
           LOGITS, LOGITS, BATCH, epochs);
    printf("  F32     CPU, F32 GEMMs, F32 weights and gradients, Adam state F32 + F32\n"
           "  FP8 O1  %s, FP8 GEMMs (E4M3 x and W, E5M2 dY, delayed scaling), scaled-F16 weights,\n"
           "          E4M3 weight gradients, Adam state F32 + F32\n"
           "  FP8 O2  the same, Adam state E4M3 + F16 (per-block scales)\n",
           dev_name);
    printf("%6s", "epoch");
    for (int i = 0; i < NETS; ++i) printf("  %8s loss %7s acc", names[i], "");
    printf("\n");
    int *perm = malloc(sizeof(int) * n_train);
    if (!perm) die("out of memory", NULL);
    for (int i = 0; i < n_train; ++i) perm[i] = i;
    const int batches = n_train / BATCH; /* the remainder of each shuffled epoch is skipped */
    for (int epoch = 1; epoch <= epochs; ++epoch) {
        shuffle(perm, n_train);
        double loss[NETS] = {0};
        int correct[NETS] = {0};
        for (int bi = 0; bi < batches; ++bi) {
            for (int r = 0; r < BATCH; ++r) {
                const int s = perm[bi * BATCH + r];
                memcpy(xb + (size_t)r * cols, xs + (size_t)s * cols, sizeof(float) * cols);
                yb[r] = ys[s];
            }
            for (int i = 0; i < NETS; ++i) loss[i] += net_step(&nets[i], xb, yb, classes, &correct[i]);
        }
        const double seen = (double)batches * BATCH;
        printf("%6d", epoch);
        for (int i = 0; i < NETS; ++i) printf("  %13.4f %10.2f%%", loss[i] / seen, 100 * correct[i] / seen);
        printf("\n");
        fflush(stdout);
    }
    printf("\ntest set (%d samples):\n", n_test);
    printf("  %-7s %-8s %-6s %9s %8s %18s %16s\n", "network", "device", "GEMMs", "accuracy", "loss", "optimizer state",
           "per parameter");
    for (int i = 0; i < NETS; ++i) {
        double test_loss;
        const double acc = net_accuracy(&nets[i], xs + (size_t)n_train * cols, ys + n_train, n_test, classes, &test_loss);
        size_t bytes;
        CHECK(fp8amp_optimizer_state_bytes(nets[i].opt, &bytes));
        const double params = (double)HIDDEN * cols + HIDDEN + (double)LOGITS * HIDDEN + LOGITS;
        printf("  %-7s %-8s %-6s %8.2f%% %8.4f %12zu bytes %11.2f B\n", names[i], i == 0 ? "cpu" : dev_name,
               kind_name(nets[i].l1.lin), 100 * acc, test_loss, bytes, bytes / params);
    }
    printf("(optimizer state includes small fixed bookkeeping; at this size it is a visible part of O2's bytes)\n");
    for (int i = 0; i < NETS; ++i) net_free(&nets[i]);
    free(w1);
    free(b1);
    free(w2);
    free(b2);
    free(perm);
    free(xs);
    free(xb);
    free(ys);
    free(z);
    free(d.x);
    free(d.y);
    return 0;
}
