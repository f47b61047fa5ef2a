/* The main job of fp8amp, through the public C API only.
 *
 * Loads a real dataset (the UCI handwritten digits, exported by data/export_digits.py), shows what
 * E4M3 and E5M2 do to its features, then trains a small MLP classifier (64 -> 128 -> ReLU -> 16
 * logits, of which the 10 classes are used) with fp8amp Linear layers: FP8 GEMMs forward and
 * backward, E4M3 weight gradients (O1), delayed scaling with an amax history -- on the chosen device.
 * Beside it, the same network from the same initial weights and batches is trained with F32 GEMMs
 * on the CPU (policy NEVER_FP8), and the two test accuracies are printed side by side. The optimizer
 * is SGD with momentum on F32 master weights kept on the host.
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
    fp8amp_context ctx;
    fp8amp_linear lin;
    fp8amp_tensor w, b, gw, gb, gw_f32; /* gw_f32: an E4M3/BF16 weight gradient made F32, for the host */
    int in, out;
    float *w_host, *b_host, *vw, *vb, *gw_host, *gb_host; /* F32 master weights, momenta, gradients */
} layer;

typedef struct {
    const char *name;
    fp8amp_context ctx;
    layer l1, l2;
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

static void layer_init(layer *l, fp8amp_context ctx, int in, int out, fp8amp_gemm_policy policy,
                       fp8amp_dtype wgrad_dtype, const float *w0, const float *b0) {
    fp8amp_linear_desc d;
    CHECK(fp8amp_linear_desc_init_default(&d));
    d.in_features = in;
    d.out_features = out;
    d.weight_dtype = FP8AMP_DTYPE_F32; /* the device copy of the host's F32 master weights */
    d.wgrad_dtype = wgrad_dtype;
    d.policy = policy;
    l->ctx = ctx;
    CHECK(fp8amp_linear_create(ctx, &d, &l->lin));
    CHECK(fp8amp_linear_weight(l->lin, &l->w));
    CHECK(fp8amp_linear_bias(l->lin, &l->b));
    CHECK(fp8amp_linear_weight_grad(l->lin, &l->gw));
    CHECK(fp8amp_linear_bias_grad(l->lin, &l->gb));
    l->gw_f32 = wgrad_dtype == FP8AMP_DTYPE_F32 ? NULL : new_tensor(ctx, out, in);
    l->in = in;
    l->out = out;
    const size_t nw = (size_t)in * out;
    l->w_host = xcalloc(nw);
    l->vw = xcalloc(nw);
    l->gw_host = xcalloc(nw);
    l->b_host = xcalloc((size_t)out);
    l->vb = xcalloc((size_t)out);
    l->gb_host = xcalloc((size_t)out);
    memcpy(l->w_host, w0, nw * sizeof(float));
    memcpy(l->b_host, b0, (size_t)out * sizeof(float));
    CHECK(fp8amp_tensor_copy_from_host(l->w, l->w_host, nw * sizeof(float)));
    CHECK(fp8amp_tensor_copy_from_host(l->b, l->b_host, (size_t)out * sizeof(float)));
}

static void layer_free(layer *l) {
    CHECK(fp8amp_tensor_destroy(l->w));
    CHECK(fp8amp_tensor_destroy(l->b));
    CHECK(fp8amp_tensor_destroy(l->gw));
    CHECK(fp8amp_tensor_destroy(l->gb));
    CHECK(fp8amp_tensor_destroy(l->gw_f32));
    CHECK(fp8amp_linear_destroy(l->lin));
    free(l->w_host);
    free(l->vw);
    free(l->gw_host);
    free(l->b_host);
    free(l->vb);
    free(l->gb_host);
}

/* SGD with momentum on the host's master weights. Re-writing the device weight tells the Linear to
 * re-quantize its FP8 copy on the next forward. */
static void layer_sgd(layer *l, float lr, float momentum) {
    const size_t nw = (size_t)l->in * l->out;
    if (l->gw_f32) {
        fp8amp_dtype g;
        CHECK(fp8amp_tensor_dtype(l->gw, &g));
        if (g == FP8AMP_DTYPE_E4M3) CHECK(fp8amp_dequantize(l->ctx, l->gw, l->gw_f32));
        else CHECK(fp8amp_cast(l->ctx, l->gw, l->gw_f32));
        CHECK(fp8amp_tensor_copy_to_host(l->gw_f32, l->gw_host, nw * sizeof(float)));
    } else {
        CHECK(fp8amp_tensor_copy_to_host(l->gw, l->gw_host, nw * sizeof(float)));
    }
    CHECK(fp8amp_tensor_copy_to_host(l->gb, l->gb_host, (size_t)l->out * sizeof(float)));
    for (size_t i = 0; i < nw; ++i) {
        l->vw[i] = momentum * l->vw[i] + l->gw_host[i];
        l->w_host[i] -= lr * l->vw[i];
    }
    for (int i = 0; i < l->out; ++i) {
        l->vb[i] = momentum * l->vb[i] + l->gb_host[i];
        l->b_host[i] -= lr * l->vb[i];
    }
    CHECK(fp8amp_tensor_copy_from_host(l->w, l->w_host, nw * sizeof(float)));
    CHECK(fp8amp_tensor_copy_from_host(l->b, l->b_host, (size_t)l->out * sizeof(float)));
}

static void net_init(net *m, const char *name, fp8amp_device device, fp8amp_gemm_policy policy, fp8amp_dtype wgrad,
                     int in, const float *w1, const float *b1, const float *w2, const float *b2) {
    m->name = name;
    CHECK(fp8amp_context_create(device, &m->ctx));
    layer_init(&m->l1, m->ctx, in, HIDDEN, policy, wgrad, w1, b1);
    layer_init(&m->l2, m->ctx, HIDDEN, LOGITS, policy, wgrad, w2, b2);
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
static double net_step(net *m, const float *xb, const int32_t *yb, int classes, float lr, int *correct) {
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
    layer_sgd(&m->l1, lr, 0.9f);
    layer_sgd(&m->l2, lr, 0.9f);
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

    /* One initialization (PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in))) for both networks. */
    float *w1 = xcalloc((size_t)HIDDEN * cols), *b1 = xcalloc(HIDDEN), *w2 = xcalloc((size_t)LOGITS * HIDDEN),
          *b2 = xcalloc(LOGITS);
    for (size_t i = 0; i < (size_t)HIDDEN * cols; ++i) w1[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (int i = 0; i < HIDDEN; ++i) b1[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (size_t i = 0; i < (size_t)LOGITS * HIDDEN; ++i) w2[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));
    for (int i = 0; i < LOGITS; ++i) b2[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));

    net fp8, ref;
    net_init(&fp8, "FP8", device, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_DTYPE_E4M3, cols, w1, b1, w2, b2);
    net_init(&ref, "F32", (fp8amp_device){FP8AMP_DEVICE_CPU, 0}, FP8AMP_GEMM_NEVER_FP8, FP8AMP_DTYPE_F32, cols, w1, b1,
             w2, b2);
    printf("\ntraining a %d-%d-%d MLP (10 of %d logits used), batch %d, SGD lr 0.05 momentum 0.9, %d epochs\n",
           cols, HIDDEN, LOGITS, LOGITS, BATCH, epochs);
    printf("  FP8 network on %s: E4M3 activations and weights, %s output gradients, E4M3 weight gradients,\n"
           "  delayed scaling (amax history 1024); F32 network on the CPU: the same steps with F32 GEMMs.\n",
           device.type == FP8AMP_DEVICE_CUDA ? "cuda:0" : "cpu", "E5M2");
    printf("%6s  %10s %9s  %10s %9s\n", "epoch", "FP8 loss", "FP8 acc", "F32 loss", "F32 acc");
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
        double loss[2] = {0, 0};
        int correct[2] = {0, 0};
        for (int bi = 0; bi < batches; ++bi) {
            for (int r = 0; r < BATCH; ++r) {
                const int s = perm[bi * BATCH + r];
                memcpy(xb + (size_t)r * cols, xs + (size_t)s * cols, sizeof(float) * cols);
                yb[r] = ys[s];
            }
            loss[0] += net_step(&fp8, xb, yb, classes, 0.05f, &correct[0]);
            loss[1] += net_step(&ref, xb, yb, classes, 0.05f, &correct[1]);
        }
        const double seen = (double)batches * BATCH;
        printf("%6d  %10.4f %8.2f%%  %10.4f %8.2f%%\n", epoch, loss[0] / seen, 100 * correct[0] / seen, loss[1] / seen,
               100 * correct[1] / seen);
        fflush(stdout);
    }
    double test_loss[2];
    const double acc_fp8 = net_accuracy(&fp8, xs + (size_t)n_train * cols, ys + n_train, n_test, classes, &test_loss[0]);
    const double acc_ref = net_accuracy(&ref, xs + (size_t)n_train * cols, ys + n_train, n_test, classes, &test_loss[1]);
    printf("\ntest set (%d samples):  FP8 (%s GEMMs on %s): accuracy %.2f%%, loss %.4f   |   F32 (CPU): accuracy %.2f%%, "
           "loss %.4f\n",
           n_test, kind_name(fp8.l1.lin), device.type == FP8AMP_DEVICE_CUDA ? "cuda:0" : "cpu", 100 * acc_fp8,
           test_loss[0], 100 * acc_ref, test_loss[1]);

    net_free(&fp8);
    net_free(&ref);
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
