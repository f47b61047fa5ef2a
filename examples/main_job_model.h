/* The main job's model and data, shared by fp8amp_main_job.c and fp8amp_data_parallel.c: the dataset
 * reader, the 64 -> 128 -> ReLU -> 16 MLP of two fp8amp Linears with its Adam optimizer, one training
 * step split into its gradient (forward, backward, delayed-scaling update) and its optimizer step, and
 * the held-out evaluation. Header-only (static functions), for examples only; public C API only.
 */
#ifndef FP8AMP_EXAMPLES_MAIN_JOB_MODEL_H
#define FP8AMP_EXAMPLES_MAIN_JOB_MODEL_H

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

/* ---- training -------------------------------------------------------------------------------- */

enum { HIDDEN = 128, LOGITS = 16 }; /* LOGITS: 10 classes padded to FP8's multiple of 16 */

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
    int batch;                                          /* rows of one training batch */
    fp8amp_tensor x, y1, a1, logits, dlogits, da1, dy1; /* one training batch */
    float *h_y1, *h_g, *h_logits, *h_dl;                /* its host-side buffers (ReLU, loss) */
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

/* Fisher-Yates with the job's generator (every process that draws the same sequence gets the same
 * permutation: the data-parallel ranks rely on it). */
static void shuffle(int *perm, int n) {
    for (int i = n - 1; i > 0; --i) {
        const int j = (int)(rng_uniform() * (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* Each column standardized (zero mean, unit variance), as the network's input layer sees them. */
static float *standardize(const dataset *d) {
    float *z = xcalloc((size_t)d->rows * d->cols);
    for (uint32_t c = 0; c < d->cols; ++c) {
        double mean = 0, var = 0;
        for (uint32_t r = 0; r < d->rows; ++r) mean += d->x[(size_t)r * d->cols + c];
        mean /= d->rows;
        for (uint32_t r = 0; r < d->rows; ++r) {
            const double t = d->x[(size_t)r * d->cols + c] - mean;
            var += t * t;
        }
        const double sd = sqrt(var / d->rows);
        for (uint32_t r = 0; r < d->rows; ++r)
            z[(size_t)r * d->cols + c] = sd > 0 ? (float)((d->x[(size_t)r * d->cols + c] - mean) / sd) : 0.0f;
    }
    return z;
}

/* The rows of z (d's standardized features) and d's labels in one shuffled order, into xs and ys; the
 * caller takes the first 80% as the training set and the rest as the held-out set. */
static void shuffle_rows(const dataset *d, const float *z, float *xs, int32_t *ys) {
    const int rows = (int)d->rows, cols = (int)d->cols;
    int *order = malloc(sizeof(int) * rows);
    if (!order) die("out of memory", NULL);
    for (int i = 0; i < rows; ++i) order[i] = i;
    shuffle(order, rows);
    for (int i = 0; i < rows; ++i) {
        memcpy(xs + (size_t)i * cols, z + (size_t)order[i] * cols, sizeof(float) * cols);
        ys[i] = d->y[order[i]];
    }
    free(order);
}

/* One initialization (PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in))) of the two layers. */
static void init_weights(int cols, float **w1, float **b1, float **w2, float **b2) {
    *w1 = xcalloc((size_t)HIDDEN * cols);
    *b1 = xcalloc(HIDDEN);
    *w2 = xcalloc((size_t)LOGITS * HIDDEN);
    *b2 = xcalloc(LOGITS);
    for (size_t i = 0; i < (size_t)HIDDEN * cols; ++i) (*w1)[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (int i = 0; i < HIDDEN; ++i) (*b1)[i] = (float)((2 * rng_uniform() - 1) / sqrt(cols));
    for (size_t i = 0; i < (size_t)LOGITS * HIDDEN; ++i) (*w2)[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));
    for (int i = 0; i < LOGITS; ++i) (*b2)[i] = (float)((2 * rng_uniform() - 1) / sqrt(HIDDEN));
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
                     const fp8amp_adam_desc *ad, int batch, int in, const float *w1, const float *b1, const float *w2,
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
    m->batch = batch;
    m->x = new_tensor(m->ctx, batch, in);
    m->y1 = new_tensor(m->ctx, batch, HIDDEN);
    m->a1 = new_tensor(m->ctx, batch, HIDDEN);
    m->logits = new_tensor(m->ctx, batch, LOGITS);
    m->dlogits = new_tensor(m->ctx, batch, LOGITS);
    m->da1 = new_tensor(m->ctx, batch, HIDDEN);
    m->dy1 = new_tensor(m->ctx, batch, HIDDEN);
    m->h_y1 = xcalloc((size_t)batch * HIDDEN);
    m->h_g = xcalloc((size_t)batch * HIDDEN);
    m->h_logits = xcalloc((size_t)batch * LOGITS);
    m->h_dl = xcalloc((size_t)batch * LOGITS);
}

static void net_free(net *m) {
    fp8amp_tensor ts[7] = {m->x, m->y1, m->a1, m->logits, m->dlogits, m->da1, m->dy1};
    for (int i = 0; i < 7; ++i) CHECK(fp8amp_tensor_destroy(ts[i]));
    free(m->h_y1);
    free(m->h_g);
    free(m->h_logits);
    free(m->h_dl);
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

/* The gradients of one training batch (host arrays of m->batch rows), forward and backward through
 * the public API, then the delayed-scaling update of the metas; the mean loss is over m->batch rows
 * (so data-parallel ranks whose gradients are averaged get the gradient of the combined batch).
 * Returns the summed loss. */
static double net_grad(net *m, const float *xb, const int32_t *yb, int classes, int *correct) {
    const int B = m->batch;
    float *y1 = m->h_y1, *g = m->h_g, *logits = m->h_logits, *dl = m->h_dl;
    const size_t hidden_bytes = sizeof(float) * (size_t)B * HIDDEN, logit_bytes = sizeof(float) * (size_t)B * LOGITS;
    CHECK(fp8amp_tensor_copy_from_host(m->x, xb, sizeof(float) * (size_t)B * m->l1.in));
    CHECK(fp8amp_linear_forward(m->l1.lin, m->x, m->y1, 1));
    CHECK(fp8amp_tensor_copy_to_host(m->y1, y1, hidden_bytes));
    for (int i = 0; i < B * HIDDEN; ++i) g[i] = y1[i] > 0 ? y1[i] : 0.0f; /* ReLU */
    CHECK(fp8amp_tensor_copy_from_host(m->a1, g, hidden_bytes));
    CHECK(fp8amp_linear_forward(m->l2.lin, m->a1, m->logits, 1));
    CHECK(fp8amp_tensor_copy_to_host(m->logits, logits, logit_bytes));
    const double loss = softmax_xent(logits, yb, B, classes, dl, correct);
    CHECK(fp8amp_tensor_copy_from_host(m->dlogits, dl, logit_bytes));
    CHECK(fp8amp_linear_backward(m->l2.lin, m->dlogits, m->da1, 0));
    CHECK(fp8amp_tensor_copy_to_host(m->da1, g, hidden_bytes));
    for (int i = 0; i < B * HIDDEN; ++i) g[i] = y1[i] > 0 ? g[i] : 0.0f; /* ReLU' */
    CHECK(fp8amp_tensor_copy_from_host(m->dy1, g, hidden_bytes));
    CHECK(fp8amp_linear_backward(m->l1.lin, m->dy1, NULL, 0));
    CHECK(fp8amp_scaling_update_many(m->ctx, 4, m->metas)); /* delayed scaling: fold this step's amaxes */
    return loss;
}

/* One training step on a batch: its gradients, then the optimizer (inline: no unused-function warning
 * where a program, as the data-parallel one, steps between the two itself). */
static inline double net_step(net *m, const float *xb, const int32_t *yb, int classes, int *correct) {
    const double loss = net_grad(m, xb, yb, classes, correct);
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

#endif
