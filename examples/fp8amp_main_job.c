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

/* ---- training -------------------------------------------------------------------------------- */

enum { HIDDEN = 128, LOGITS = 16, BATCH = 64 }; /* LOGITS: 10 classes padded to FP8's multiple of 16 */

typedef struct {
    fp8amp_linear lin;
    fp8amp_tensor w, b, gw, gb;
    int in, out;
} layer;

typedef struct {
    const char *name;
    fp8amp_context ctx;
    layer l1, l2;
    fp8amp_optimizer opt;
    fp8amp_scaling metas[4]; /* the delayed-scaling metas (inputs, output gradients), updated per step */
    fp8amp_tensor x, y1, a1, logits, dlogits, da1, dy1; /* one training batch */
} net;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rng_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *xcalloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) die("out of memory", NULL);
    return p;
}

static fp8amp_tensor new_tensor(fp8amp_context ctx, int64_t rows, int64_t cols) {
    const int64_t shape[2] = {rows, cols};
    fp8amp_tensor t;
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t));
    return t;
}

/* A Linear from a descriptor, its weight written from F32 host values: a scaled (F16, E4M3) weight
 * through fp8amp_quantize with its WEIGHT_STORAGE meta, a plain one by copy; the bias by copy. */
static void layer_init(layer *l, fp8amp_context ctx, fp8amp_linear_desc d, int in, int out, const float *w0,
                       const float *b0) {
    d.in_features = in;
    d.out_features = out;
    CHECK(fp8amp_linear_create(ctx, &d, &l->lin));
    CHECK(fp8amp_linear_weight(l->lin, &l->w));
    CHECK(fp8amp_linear_bias(l->lin, &l->b));
    CHECK(fp8amp_linear_weight_grad(l->lin, &l->gw));
    CHECK(fp8amp_linear_bias_grad(l->lin, &l->gb));
    l->in = in;
    l->out = out;
    const size_t nw = (size_t)in * out;
    fp8amp_tensor w32 = new_tensor(ctx, out, in);
    CHECK(fp8amp_tensor_copy_from_host(w32, w0, nw * sizeof(float)));
    if (d.weight_dtype == FP8AMP_DTYPE_F16 || d.weight_dtype == FP8AMP_DTYPE_E4M3) {
        fp8amp_scaling storage;
        CHECK(fp8amp_linear_scaling(l->lin, FP8AMP_ROLE_WEIGHT_STORAGE, &storage));
        CHECK(fp8amp_quantize(ctx, w32, l->w)); /* records the weight's amax ... */
        CHECK(fp8amp_scaling_update(storage));  /* ... which sets a scale that fits it ... */
        CHECK(fp8amp_quantize(ctx, w32, l->w)); /* ... for the weight's first real write */
        CHECK(fp8amp_scaling_destroy(storage));
    } else {
        CHECK(fp8amp_cast(ctx, w32, l->w));
    }
    CHECK(fp8amp_tensor_destroy(w32));
    CHECK(fp8amp_tensor_copy_from_host(l->b, b0, (size_t)out * sizeof(float)));
}

static void layer_free(layer *l) {
    CHECK(fp8amp_tensor_destroy(l->w));
    CHECK(fp8amp_tensor_destroy(l->b));
    CHECK(fp8amp_tensor_destroy(l->gw));
    CHECK(fp8amp_tensor_destroy(l->gb));
    CHECK(fp8amp_linear_destroy(l->lin));
}

static void net_init(net *m, const char *name, fp8amp_device device, const fp8amp_linear_desc *ld,
                     const fp8amp_adam_desc *ad, int in, const float *w1, const float *b1, const float *w2,
                     const float *b2) {
    m->name = name;
    CHECK(fp8amp_context_create(device, &m->ctx));
    layer_init(&m->l1, m->ctx, *ld, in, HIDDEN, w1, b1);
    layer_init(&m->l2, m->ctx, *ld, HIDDEN, LOGITS, w2, b2);
    CHECK(fp8amp_optimizer_create(m->ctx, ad, &m->opt));
    layer *ls[2] = {&m->l1, &m->l2};
    for (int i = 0; i < 2; ++i) {
        CHECK(fp8amp_optimizer_add_param(m->opt, ls[i]->w, ls[i]->gw));
        CHECK(fp8amp_optimizer_add_param(m->opt, ls[i]->b, ls[i]->gb));
    }
    CHECK(fp8amp_linear_scaling(m->l1.lin, FP8AMP_ROLE_INPUT, &m->metas[0]));
    CHECK(fp8amp_linear_scaling(m->l1.lin, FP8AMP_ROLE_GRAD_OUTPUT, &m->metas[1]));
    CHECK(fp8amp_linear_scaling(m->l2.lin, FP8AMP_ROLE_INPUT, &m->metas[2]));
    CHECK(fp8amp_linear_scaling(m->l2.lin, FP8AMP_ROLE_GRAD_OUTPUT, &m->metas[3]));
    m->x = new_tensor(m->ctx, BATCH, in);
    m->y1 = new_tensor(m->ctx, BATCH, HIDDEN);
    m->a1 = new_tensor(m->ctx, BATCH, HIDDEN);
    m->logits = new_tensor(m->ctx, BATCH, LOGITS);
    m->dlogits = new_tensor(m->ctx, BATCH, LOGITS);
    m->da1 = new_tensor(m->ctx, BATCH, HIDDEN);
    m->dy1 = new_tensor(m->ctx, BATCH, HIDDEN);
}

static void net_free(net *m) {
    fp8amp_tensor ts[7] = {m->x, m->y1, m->a1, m->logits, m->dlogits, m->da1, m->dy1};
    for (int i = 0; i < 7; ++i) CHECK(fp8amp_tensor_destroy(ts[i]));
    for (int i = 0; i < 4; ++i) CHECK(fp8amp_scaling_destroy(m->metas[i]));
    CHECK(fp8amp_optimizer_destroy(m->opt));
    layer_free(&m->l1);
    layer_free(&m->l2);
    CHECK(fp8amp_context_destroy(m->ctx));
}

/* Softmax cross-entropy over the first `classes` logits of each row; writes dlogits = (p - onehot)/rows
 * (0 for the padding logits) when dl is not NULL; returns the summed loss and counts correct rows. */
static double softmax_xent(const float *logits, const int32_t *labels, int rows, int classes, float *dl,
                           int *correct) {
    double loss = 0;
    for (int r = 0; r < rows; ++r) {
        const float *z = logits + (size_t)r * LOGITS;
        int best = 0;
        double mx = z[0];
        for (int c = 1; c < classes; ++c)
            if (z[c] > mx) mx = z[best = c];
        double sum = 0;
        for (int c = 0; c < classes; ++c) sum += exp(z[c] - mx);
        loss += log(sum) - (z[labels[r]] - mx);
        *correct += best == labels[r];
        if (dl)
            for (int c = 0; c < LOGITS; ++c)
                dl[(size_t)r * LOGITS + c] =
                    c < classes ? (float)((exp(z[c] - mx) / sum - (c == labels[r])) / rows) : 0.0f;
    }
    return loss;
}

/* One training step on a batch (host arrays), forward and backward through the public API. */
static double net_step(net *m, const float *xb, const int32_t *yb, int classes, int *correct) {
    static float y1[BATCH * HIDDEN], g[BATCH * HIDDEN], logits[BATCH * LOGITS], dl[BATCH * LOGITS];
    CHECK(fp8amp_tensor_copy_from_host(m->x, xb, sizeof(float) * BATCH * m->l1.in));
    CHECK(fp8amp_linear_forward(m->l1.lin, m->x, m->y1, 1));
    CHECK(fp8amp_tensor_copy_to_host(m->y1, y1, sizeof y1));
    for (int i = 0; i < BATCH * HIDDEN; ++i) g[i] = y1[i] > 0 ? y1[i] : 0.0f; /* ReLU */
    CHECK(fp8amp_tensor_copy_from_host(m->a1, g, sizeof g));
    CHECK(fp8amp_linear_forward(m->l2.lin, m->a1, m->logits, 1));
    CHECK(fp8amp_tensor_copy_to_host(m->logits, logits, sizeof logits));
    const double loss = softmax_xent(logits, yb, BATCH, classes, dl, correct);
    CHECK(fp8amp_tensor_copy_from_host(m->dlogits, dl, sizeof dl));
    CHECK(fp8amp_linear_backward(m->l2.lin, m->dlogits, m->da1, 0));
    CHECK(fp8amp_tensor_copy_to_host(m->da1, g, sizeof g));
    for (int i = 0; i < BATCH * HIDDEN; ++i) g[i] = y1[i] > 0 ? g[i] : 0.0f; /* ReLU' */
    CHECK(fp8amp_tensor_copy_from_host(m->dy1, g, sizeof g));
    CHECK(fp8amp_linear_backward(m->l1.lin, m->dy1, NULL, 0));
    CHECK(fp8amp_scaling_update_many(m->ctx, 4, m->metas)); /* delayed scaling: fold this step's amaxes */
    CHECK(fp8amp_optimizer_step(m->opt, NULL)); /* one fused launch for all parameters */
    return loss;
}

/* Accuracy (and mean loss) over rows [0, n) of x, in one inference forward per layer. */
static double net_accuracy(net *m, const float *x, const int32_t *y, int n, int classes, double *mean_loss) {
    fp8amp_tensor tx = new_tensor(m->ctx, n, m->l1.in), ty1 = new_tensor(m->ctx, n, HIDDEN),
                  ta1 = new_tensor(m->ctx, n, HIDDEN), tz = new_tensor(m->ctx, n, LOGITS);
    float *h = xcalloc((size_t)n * HIDDEN), *z = xcalloc((size_t)n * LOGITS);
    CHECK(fp8amp_tensor_copy_from_host(tx, x, sizeof(float) * (size_t)n * m->l1.in));
    CHECK(fp8amp_linear_forward(m->l1.lin, tx, ty1, 0));
    CHECK(fp8amp_tensor_copy_to_host(ty1, h, sizeof(float) * (size_t)n * HIDDEN));
    for (size_t i = 0; i < (size_t)n * HIDDEN; ++i) h[i] = h[i] > 0 ? h[i] : 0.0f;
    CHECK(fp8amp_tensor_copy_from_host(ta1, h, sizeof(float) * (size_t)n * HIDDEN));
    CHECK(fp8amp_linear_forward(m->l2.lin, ta1, tz, 0));
    CHECK(fp8amp_tensor_copy_to_host(tz, z, sizeof(float) * (size_t)n * LOGITS));
    int correct = 0;
    const double loss = softmax_xent(z, y, n, classes, NULL, &correct);
    if (mean_loss) *mean_loss = loss / n;
    free(h);
    free(z);
    fp8amp_tensor ts[4] = {tx, ty1, ta1, tz};
    for (int i = 0; i < 4; ++i) CHECK(fp8amp_tensor_destroy(ts[i]));
    return (double)correct / n;
}

static const char *kind_name(fp8amp_linear lin) {
    fp8amp_gemm_kind k;
    CHECK(fp8amp_linear_gemm_kind(lin, &k));
    return k == FP8AMP_GEMM_KIND_FP8 ? "FP8" : k == FP8AMP_GEMM_KIND_BF16 ? "BF16" : k == FP8AMP_GEMM_KIND_F32 ? "F32" : "-";
}

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
    report(ctx, "standardized features through each format", z, d.rows, d.cols);
    CHECK(fp8amp_context_destroy(ctx));

    /* Shuffle once into train (80%) and test (20%). */
    const int rows = (int)d.rows, cols = (int)d.cols, classes = (int)d.classes;
    int *order = malloc(sizeof(int) * rows);
    if (!order) die("out of memory", NULL);
    for (int i = 0; i < rows; ++i) order[i] = i;
    for (int i = rows - 1; i > 0; --i) {
        const int j = (int)(rng_uniform() * (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    const int n_test = rows / 5, n_train = rows - n_test;
    float *xs = malloc(sizeof(float) * n), *xb = malloc(sizeof(float) * BATCH * cols);
    int32_t *ys = malloc(sizeof(int32_t) * rows), yb[BATCH];
    if (!xs || !xb || !ys) die("out of memory", NULL);
    for (int i = 0; i < rows; ++i) {
        memcpy(xs + (size_t)i * cols, z + (size_t)order[i] * cols, sizeof(float) * cols);
        ys[i] = d.y[order[i]];
    }

    /* One initialization (PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in))) for all networks. */
    float *w1 = xcalloc((size_t)HIDDEN * cols), *b1 = xcalloc(HIDDEN), *w2 = xcalloc((size_t)LOGITS * HIDDEN),
          *b2 = xcalloc(LOGITS);
    for (size_t i = 0; i < (size_t)HIDDEN * cols; ++i) w1[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (int i = 0; i < HIDDEN; ++i) b1[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (size_t i = 0; i < (size_t)LOGITS * HIDDEN; ++i) w2[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));
    for (int i = 0; i < LOGITS; ++i) b2[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));

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
        net_init(&nets[i], names[i], i == 0 ? cpu : device, &ld[i], &ad[i], cols, w1, b1, w2, b2);
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
        for (int i = n_train - 1; i > 0; --i) {
            const int j = (int)(rng_uniform() * (i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
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
    free(order);
    free(xs);
    free(xb);
    free(ys);
    free(z);
    free(d.x);
    free(d.y);
    return 0;
}
