/* The shared rig of the fault-injection tests (issue 22): test_fault_injection.c fails the allocations
 * made through the context's allocator hook, test_fault_injection_host.c (a separate executable: it
 * replaces malloc) the host ones. Both run a Linear (and an optimizer) on device memory served by the
 * arena allocator below, snapshot the bytes of every output, parameter, gradient, scaling meta and
 * the optimizer's save(), and compare them. Included by those two files only; built on test_util.h
 * (which it includes); everything is static inline, so a file that leaves a piece unused gets no warning. */
#ifndef FP8AMP_TEST_FAULT_RIG_H
#define FP8AMP_TEST_FAULT_RIG_H

#include "test_util.h"

/* ---- the arena allocator with an injected failure ---------------------------------------------- */

enum { kMaxBlocks = 512, kAlign = 256 };

typedef struct {
    unsigned char *base;
    size_t size;
    size_t off[kMaxBlocks], len[kMaxBlocks]; /* live blocks, sorted by offset */
    int n;
    int cpu;      /* host memory: new blocks are filled with 0xFF (NaN), so unwritten memory shows */
    int armed;    /* count calls and refuse call number fail_at */
    long calls;
    long fail_at;
    int injected; /* the refusal happened */
    int exhausted;
} arena_t;

static inline void *arena_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    arena_t *a = user;
    (void)device;
    (void)stream;
    if (a->armed) {
        const long call = a->calls++;
        if (call == a->fail_at) {
            a->injected = 1;
            return NULL;
        }
    }
    const size_t need = nbytes ? (nbytes + kAlign - 1) / kAlign * kAlign : kAlign;
    size_t pos = 0;
    int at = a->n;
    for (int i = 0; i < a->n; ++i) {
        if (a->off[i] >= pos + need) {
            at = i;
            break;
        }
        pos = (a->off[i] + a->len[i] + kAlign - 1) / kAlign * kAlign;
    }
    if (at == a->n && pos + need > a->size) {
        a->exhausted = 1;
        return NULL;
    }
    if (a->n == kMaxBlocks) {
        a->exhausted = 1;
        return NULL;
    }
    memmove(&a->off[at + 1], &a->off[at], (size_t)(a->n - at) * sizeof(size_t));
    memmove(&a->len[at + 1], &a->len[at], (size_t)(a->n - at) * sizeof(size_t));
    a->off[at] = pos;
    a->len[at] = need;
    ++a->n;
    if (a->cpu) memset(a->base + pos, 0xFF, need);
    return a->base + pos;
}

static inline void arena_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    arena_t *a = user;
    (void)nbytes;
    (void)device;
    (void)stream;
    const size_t off = (size_t)((unsigned char *)ptr - a->base);
    for (int i = 0; i < a->n; ++i) {
        if (a->off[i] == off) {
            memmove(&a->off[i], &a->off[i + 1], (size_t)(a->n - i - 1) * sizeof(size_t));
            memmove(&a->len[i], &a->len[i + 1], (size_t)(a->n - i - 1) * sizeof(size_t));
            --a->n;
            return;
        }
    }
    fail_msg("arena_free: %p is not a live block", ptr);
}

static inline void arena_arm(arena_t *a, long fail_at) {
    a->armed = 1;
    a->calls = 0;
    a->fail_at = fail_at;
    a->injected = 0;
}

static inline void arena_disarm(arena_t *a) { a->armed = 0; }

/* The arena: one tensor of a context with the built-in allocator (so that on CUDA it is device
 * memory), cpu_bytes large on the CPU and 192 MiB on CUDA. */
static inline arena_t *arena_open(fp8amp_device dev, size_t cpu_bytes, fp8amp_context *ctx, fp8amp_tensor *tensor) {
    const size_t arena_bytes = dev.type == FP8AMP_DEVICE_CUDA ? (size_t)192 << 20 : cpu_bytes;
    const int64_t arena_shape[1] = {(int64_t)arena_bytes};
    arena_t *a;
    void *base = NULL;
    *ctx = make_context(dev);
    *tensor = make_tensor(*ctx, FP8AMP_DTYPE_E4M3, 1, arena_shape);
    a = calloc(1, sizeof *a);
    assert_non_null(a);
    EXPECT_OK(fp8amp_tensor_data(*tensor, &base));
    a->base = base;
    a->size = arena_bytes;
    a->cpu = dev.type == FP8AMP_DEVICE_CPU;
    return a;
}

static inline void arena_close(arena_t *a, fp8amp_context ctx, fp8amp_tensor tensor) {
    free(a);
    EXPECT_OK(fp8amp_tensor_destroy(tensor));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- snapshots: labelled byte segments ----------------------------------------------------------- */

enum { kMaxSegs = 64 };

typedef struct {
    int n;
    char label[kMaxSegs][48];
    unsigned char *bytes[kMaxSegs];
    size_t len[kMaxSegs];
} snap_t;

static inline void snap_add(snap_t *s, const char *label, const void *bytes, size_t len) {
    assert_true(s->n < kMaxSegs);
    snprintf(s->label[s->n], sizeof s->label[0], "%s", label);
    s->bytes[s->n] = xmemdup(bytes, len);
    s->len[s->n] = len;
    ++s->n;
}

static inline void snap_tensor(snap_t *s, const char *label, fp8amp_tensor t) {
    const size_t nb = tensor_bytes(t);
    void *p = xmalloc(nb);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, p, nb));
    snap_add(s, label, p, nb);
    free(p);
}

static inline void snap_meta(snap_t *s, const char *label, fp8amp_scaling m) {
    float v[3 + 16];
    EXPECT_OK(fp8amp_scaling_get(m, &v[0], &v[1], &v[2]));
    EXPECT_OK(fp8amp_scaling_get_history(m, 16, &v[3]));
    snap_add(s, label, v, sizeof v);
}

static inline void snap_free(snap_t *s) {
    for (int i = 0; i < s->n; ++i) free(s->bytes[i]);
    s->n = 0;
}

static inline void expect_same(const snap_t *got, const snap_t *want, const char *what, long k) {
    assert_int_equal(got->n, want->n);
    for (int i = 0; i < want->n; ++i) {
        assert_string_equal(got->label[i], want->label[i]);
        if (got->len[i] != want->len[i] || memcmp(got->bytes[i], want->bytes[i], want->len[i]) != 0)
            fail_msg("%s, allocation %ld failed: '%s' differs", what, k, want->label[i]);
    }
}

static inline int message_from(const char *function) {
    const char *msg = fp8amp_last_error_message();
    const size_t n = strlen(function);
    return strncmp(msg, function, n) == 0 && msg[n] == ':' && strlen(msg) > n + 2;
}

/* ---- the Linear rig ------------------------------------------------------------------------------ */

enum { HIST = 16 };

/* The layer's size: small for the full matrix of cases; test_fault_injection_host.c adds a size large
 * enough that the CPU GEMM starts worker threads. */
typedef struct {
    int64_t K, N, M1, M2;
} dims_t;
static const dims_t kSmall = {32, 48, 16, 48};

typedef struct {
    const char *name;
    fp8amp_dtype weight_dtype, wgrad_dtype;
    fp8amp_gemm_policy policy;
    fp8amp_opt_level level; /* of the optimizer cases */
    int32_t lean;           /* fp8amp_linear_set_lean (0: not set) */
} cfg_t;

static const cfg_t kConfigs[] = {
    {"bf16 weight, e4m3 wgrad, fp8", FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O1, 0},
    {"scaled f16 weight (O2), fp8", FP8AMP_DTYPE_F16, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O2, 0},
    {"e4m3 weight (O3), fp8", FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O3, 0},
    {"f32 weight, f32 wgrad, never fp8", FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, FP8AMP_GEMM_NEVER_FP8, FP8AMP_OPT_LEVEL_O1, 0},
    {"bf16 weight, bf16 wgrad, never fp8", FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, FP8AMP_GEMM_NEVER_FP8, FP8AMP_OPT_LEVEL_O1, 0},
    /* lean Linears (issue 18): the W8 / W8^T / FP32 sum in the context's scratch, the saved input given back */
    {"scaled f16 weight (O2), fp8, lean 1", FP8AMP_DTYPE_F16, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O2, 1},
    {"e4m3 weight (O3), fp8, lean 2", FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O3, 2},
    {"bf16 weight, e4m3 wgrad, fp8, lean 2", FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_OPT_LEVEL_O1, 2},
    {"bf16 weight, bf16 wgrad, never fp8, lean 2", FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, FP8AMP_GEMM_NEVER_FP8, FP8AMP_OPT_LEVEL_O1, 2},
};

/* The host data of a case, drawn once per test: every run of the case uploads the same values. */
typedef struct {
    dims_t dm;
    float *w, *b, *x1, *dy1, *x2, *dy2, *y_junk, *dx_junk;
} data_t;

static inline float *filled(int64_t n) {
    float *p = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) p[i] = (float)test_rng_uniform(-1.0, 1.0);
    return p;
}

static inline data_t *make_data(dims_t dm) {
    data_t *d = xmalloc(sizeof *d);
    d->dm = dm;
    d->w = filled(dm.N * dm.K), d->b = filled(dm.N), d->x1 = filled(dm.M1 * dm.K), d->dy1 = filled(dm.M1 * dm.N);
    d->x2 = filled(dm.M2 * dm.K), d->dy2 = filled(dm.M2 * dm.N), d->y_junk = filled(dm.M2 * dm.N);
    d->dx_junk = filled(dm.M2 * dm.K);
    return d;
}

static inline void free_data(data_t *d) {
    float *ps[] = {d->w, d->b, d->x1, d->dy1, d->x2, d->dy2, d->y_junk, d->dx_junk};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; ++i) free(ps[i]);
    free(d);
}

typedef struct {
    fp8amp_context ctx;
    fp8amp_linear lin;
    fp8amp_tensor w, w_slot, b, wg, bg;   /* the Linear's (w_slot: the weight's scale_inv, if any) */
    fp8amp_tensor x1, dy1, y1, dx1, x2, dy2, y2, dx2;
    fp8amp_tensor x8; /* OP_FORWARD_FP8: x2 quantized with the INPUT meta (NULL otherwise) */
    fp8amp_scaling metas[5];             /* by role; NULL where the Linear has none */
    fp8amp_optimizer opt;
    dims_t dims;
} rig_t;

static inline fp8amp_tensor f32_2d(fp8amp_context ctx, int64_t rows, int64_t cols, const float *v) {
    const int64_t shape[2] = {rows, cols};
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, v, (size_t)(rows * cols) * sizeof(float)));
    return t;
}

/* Everything made with the hook in place (disarmed), so that later frees go back to the arena. */
static inline void rig_make(rig_t *r, arena_t *a, fp8amp_device dev, const cfg_t *cfg, const data_t *d) {
    const dims_t dm = d->dm;
    fp8amp_linear_desc desc;
    fp8amp_tensor w_src;
    memset(r, 0, sizeof *r);
    r->dims = dm;
    r->ctx = make_context(dev);
    EXPECT_OK(fp8amp_context_set_allocator(r->ctx, arena_alloc, arena_free, a));
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = dm.K;
    desc.out_features = dm.N;
    desc.weight_dtype = cfg->weight_dtype;
    desc.wgrad_dtype = cfg->wgrad_dtype;
    desc.policy = cfg->policy;
    desc.recipe.amax_history_len = HIST; /* DELAYED (the default): amax recorded in the metas shows */
    EXPECT_OK(fp8amp_linear_create(r->ctx, &desc, &r->lin));
    if (cfg->lean) EXPECT_OK(fp8amp_linear_set_lean(r->lin, cfg->lean));
    EXPECT_OK(fp8amp_linear_weight(r->lin, &r->w));
    w_src = f32_2d(r->ctx, dm.N, dm.K, d->w);
    EXPECT_OK(fp8amp_cast(r->ctx, w_src, r->w));
    EXPECT_OK(fp8amp_tensor_destroy(w_src));
    if (fp8amp_tensor_scale_inv(r->w, &r->w_slot) != FP8AMP_SUCCESS) r->w_slot = NULL;
    EXPECT_OK(fp8amp_linear_bias(r->lin, &r->b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(r->b, d->b, (size_t)dm.N * sizeof(float)));
    EXPECT_OK(fp8amp_linear_weight_grad(r->lin, &r->wg));
    EXPECT_OK(fp8amp_linear_bias_grad(r->lin, &r->bg));
    for (int role = 0; role < 5; ++role)
        if (fp8amp_linear_scaling(r->lin, (fp8amp_linear_role)role, &r->metas[role]) != FP8AMP_SUCCESS)
            r->metas[role] = NULL;
    r->x1 = f32_2d(r->ctx, dm.M1, dm.K, d->x1);
    r->dy1 = f32_2d(r->ctx, dm.M1, dm.N, d->dy1);
    r->y1 = f32_2d(r->ctx, dm.M1, dm.N, d->y_junk);
    r->dx1 = f32_2d(r->ctx, dm.M1, dm.K, d->dx_junk);
    r->x2 = f32_2d(r->ctx, dm.M2, dm.K, d->x2);
    r->dy2 = f32_2d(r->ctx, dm.M2, dm.N, d->dy2);
    r->y2 = f32_2d(r->ctx, dm.M2, dm.N, d->y_junk);
    r->dx2 = f32_2d(r->ctx, dm.M2, dm.K, d->dx_junk);
}

static inline void rig_free(rig_t *r) {
    fp8amp_tensor ts[] = {r->w,  r->w_slot, r->b,  r->wg, r->bg,  r->x1, r->dy1,
                          r->y1, r->dx1,    r->x2, r->dy2, r->y2, r->dx2, r->x8};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(ts[i]));
    for (int role = 0; role < 5; ++role) EXPECT_OK(fp8amp_scaling_destroy(r->metas[role]));
    EXPECT_OK(fp8amp_optimizer_destroy(r->opt));
    EXPECT_OK(fp8amp_linear_destroy(r->lin));
    EXPECT_OK(fp8amp_context_destroy(r->ctx));
}

/* The state a failed call must not change, and a retried run must reach. with_first_rows: also the
 * outputs of the first (M1-row) forward/backward, y1 and dx1. */
static inline void rig_snap(const rig_t *r, snap_t *s, int with_first_rows) {
    static const char *role_names[5] = {"INPUT meta", "WEIGHT meta", "GRAD_OUTPUT meta", "WEIGHT_GRAD meta",
                                        "WEIGHT_STORAGE meta"};
    memset(s, 0, sizeof *s);
    snap_tensor(s, "y", r->y2);
    snap_tensor(s, "dx", r->dx2);
    if (with_first_rows) {
        snap_tensor(s, "y1", r->y1);
        snap_tensor(s, "dx1", r->dx1);
    }
    snap_tensor(s, "weight", r->w);
    if (r->w_slot) snap_tensor(s, "weight scale_inv", r->w_slot);
    snap_tensor(s, "bias", r->b);
    snap_tensor(s, "weight_grad", r->wg);
    snap_tensor(s, "bias_grad", r->bg);
    {
        fp8amp_tensor slot;
        if (fp8amp_tensor_scale_inv(r->wg, &slot) == FP8AMP_SUCCESS) {
            snap_tensor(s, "weight_grad scale_inv", slot);
            EXPECT_OK(fp8amp_tensor_destroy(slot));
        }
    }
    for (int role = 0; role < 5; ++role)
        if (r->metas[role]) snap_meta(s, role_names[role], r->metas[role]);
    if (r->opt) {
        size_t size = 0;
        unsigned char *buf = save_all(r->opt, &size);
        snap_add(s, "optimizer save", buf, size);
        free(buf);
    }
}

/* The results are numbers: a sum made from unwritten (0xFF: NaN) memory must not pass as "equal to
 * the reference" because the reference made the same mistake. */
static inline void expect_finite(const rig_t *r, const char *what) {
    fp8amp_tensor ts[4] = {r->y2, r->dx2, r->wg, r->bg};
    for (int i = 0; i < 4; ++i) {
        int64_t n = 0;
        int32_t ndim = 0;
        int64_t shape[2] = {1, 1};
        fp8amp_tensor f;
        float *v;
        EXPECT_OK(fp8amp_tensor_numel(ts[i], &n));
        EXPECT_OK(fp8amp_tensor_ndim(ts[i], &ndim));
        EXPECT_OK(fp8amp_tensor_shape(ts[i], 2, shape));
        f = make_tensor(r->ctx, FP8AMP_DTYPE_F32, ndim, shape);
        EXPECT_OK(fp8amp_cast(r->ctx, ts[i], f)); /* the codes' values (a NaN code stays NaN) */
        v = xmalloc((size_t)n * sizeof(float));
        EXPECT_OK(fp8amp_tensor_copy_to_host(f, v, (size_t)n * sizeof(float)));
        for (int64_t j = 0; j < n; ++j)
            if (!(v[j] - v[j] == 0.0f)) fail_msg("%s: result %d element %lld is %g", what, i, (long long)j, (double)v[j]);
        free(v);
        EXPECT_OK(fp8amp_tensor_destroy(f));
    }
}

static inline void warm_up(rig_t *r) {
    EXPECT_OK(fp8amp_linear_forward(r->lin, r->x1, r->y1, 1));
    EXPECT_OK(fp8amp_linear_backward(r->lin, r->dy1, r->dx1, 0));
}

/* with_weight 0: the weight is left for the add_param case to add. */
static inline void make_optimizer(rig_t *r, const cfg_t *cfg, int with_weight) {
    fp8amp_adam_desc ad;
    EXPECT_OK(fp8amp_opt_level_adam_config(cfg->level, &ad));
    ad.max_grad_norm = 1.0f;
    EXPECT_OK(fp8amp_optimizer_create(r->ctx, &ad, &r->opt));
    /* An O3 optimizer keeps an F16 master copy, which an F32 parameter cannot have. */
    if (cfg->level != FP8AMP_OPT_LEVEL_O3) EXPECT_OK(fp8amp_optimizer_add_param(r->opt, r->b, r->bg));
    if (with_weight) EXPECT_OK(fp8amp_optimizer_add_param(r->opt, r->w, r->wg));
}

/* The operation under test, and what comes after it in the run. OP_FORWARD_OVER_SAVED (the host test's
 * only): a training forward while an earlier one (of other rows) is saved; after a failure the saved one
 * is backed. */
typedef enum { OP_FORWARD, OP_BACKWARD, OP_STEP, OP_LOAD, OP_ADD_PARAM, OP_FORWARD_OVER_SAVED, OP_FORWARD_FP8 } op_t;
static const char *const kOpNames[] = {"fp8amp_linear_forward",  "fp8amp_linear_backward",     "fp8amp_optimizer_step",
                                       "fp8amp_optimizer_load",  "fp8amp_optimizer_add_param", "fp8amp_linear_forward",
                                       "fp8amp_linear_forward_fp8"};

/* Whether a case runs op with cfg: an FP8 input needs a Linear that runs FP8 GEMMs. */
static inline int op_applies(op_t op, const cfg_t *cfg) {
    return op != OP_FORWARD_FP8 || cfg->policy != FP8AMP_GEMM_NEVER_FP8;
}

typedef struct {
    unsigned char *ckpt; /* OP_LOAD: the checkpoint loaded (saved after the first step) */
    size_t ckpt_size;
} extra_t;

/* Everything before the operation (no injection). */
static inline void run_prefix(rig_t *r, op_t op, const cfg_t *cfg, int warm, extra_t *x) {
    if (warm) warm_up(r);
    if (op == OP_BACKWARD) EXPECT_OK(fp8amp_linear_forward(r->lin, r->x2, r->y2, 1));
    if (op == OP_FORWARD_OVER_SAVED) EXPECT_OK(fp8amp_linear_forward(r->lin, r->x1, r->y1, 1));
    if (op == OP_FORWARD_FP8) { /* what a fused norm does: x2 quantized into the Linear's INPUT meta */
        const int64_t shape[2] = {r->dims.M2, r->dims.K};
        r->x8 = make_tensor(r->ctx, FP8AMP_DTYPE_E4M3, 2, shape);
        EXPECT_OK(fp8amp_tensor_set_scaling(r->x8, r->metas[FP8AMP_ROLE_INPUT]));
        EXPECT_OK(fp8amp_quantize(r->ctx, r->x2, r->x8));
    }
    if (op == OP_STEP || op == OP_LOAD || op == OP_ADD_PARAM) {
        if (!warm) warm_up(r);
        make_optimizer(r, cfg, op != OP_ADD_PARAM);
        EXPECT_OK(fp8amp_linear_forward(r->lin, r->x2, r->y2, 1));
        EXPECT_OK(fp8amp_linear_backward(r->lin, r->dy2, r->dx2, 0));
    }
    if (op == OP_LOAD) {
        EXPECT_OK(fp8amp_optimizer_step(r->opt, NULL));
        if (!x->ckpt) { /* the reference run saves it; every later run loads the same bytes */
            EXPECT_OK(fp8amp_optimizer_save(r->opt, NULL, 0, &x->ckpt_size));
            x->ckpt = xmalloc(x->ckpt_size);
            EXPECT_OK(fp8amp_optimizer_save(r->opt, x->ckpt, x->ckpt_size, &x->ckpt_size));
        }
        EXPECT_OK(fp8amp_optimizer_step(r->opt, NULL)); /* so that the load changes something */
    }
}

static inline fp8amp_status run_op(rig_t *r, op_t op, const extra_t *x) {
    switch (op) {
    case OP_FORWARD:
    case OP_FORWARD_OVER_SAVED: return fp8amp_linear_forward(r->lin, r->x2, r->y2, 1);
    case OP_FORWARD_FP8: return fp8amp_linear_forward_fp8(r->lin, r->x8, r->y2, 1);
    /* accumulate: the first backward's sum starts from the zero gradients, a retry must not add to
     * memory a failed attempt left behind */
    case OP_BACKWARD: return fp8amp_linear_backward(r->lin, r->dy2, r->dx2, 1);
    case OP_STEP: return fp8amp_optimizer_step(r->opt, NULL);
    case OP_LOAD: return fp8amp_optimizer_load(r->opt, x->ckpt, x->ckpt_size);
    case OP_ADD_PARAM: return fp8amp_optimizer_add_param(r->opt, r->w, r->wg);
    }
    return FP8AMP_ERROR_INTERNAL;
}

/* Everything after the operation: the rest of the step and one more forward/backward (a cache or
 * saved buffer left wrong by a failure shows here). */
static inline void run_suffix(rig_t *r, op_t op) {
    if (op == OP_FORWARD || op == OP_FORWARD_OVER_SAVED || op == OP_FORWARD_FP8)
        EXPECT_OK(fp8amp_linear_backward(r->lin, r->dy2, r->dx2, 1));
    if (op == OP_STEP || op == OP_LOAD || op == OP_ADD_PARAM) EXPECT_OK(fp8amp_optimizer_step(r->opt, NULL));
    EXPECT_OK(fp8amp_linear_forward(r->lin, r->x2, r->y2, 1));
    EXPECT_OK(fp8amp_linear_backward(r->lin, r->dy2, r->dx2, 1));
}

/* The reference run's end: the rest of the run, its state taken as what every run with a refusal must
 * reach, and the arena left empty. */
static inline void finish_reference(rig_t *r, const arena_t *a, op_t op, snap_t *want, int with_first_rows) {
    run_suffix(r, op);
    expect_finite(r, "the reference run");
    rig_snap(r, want, with_first_rows);
    rig_free(r);
    assert_int_equal(a->n, 0); /* everything went back to the arena */
}

/* After a refused allocation: the failed call changed nothing of what `before` holds. */
static inline void expect_unchanged(const rig_t *r, const snap_t *before, const char *what, long k,
                                    int with_first_rows) {
    snap_t after;
    rig_snap(r, &after, with_first_rows);
    expect_same(&after, before, what, k);
    snap_free(&after);
}

/* The end of run k: the rest of the run, its state compared with the reference's (when `compare`),
 * and everything freed back to the arena. */
static inline void finish_run(rig_t *r, const arena_t *a, op_t op, const char *what, long k, const snap_t *want,
                              int compare, snap_t *before, int with_first_rows) {
    run_suffix(r, op);
    expect_finite(r, what);
    if (compare) {
        snap_t got;
        rig_snap(r, &got, with_first_rows);
        expect_same(&got, want, what, k);
        snap_free(&got);
    }
    snap_free(before);
    rig_free(r);
    assert_false(a->exhausted);
    assert_int_equal(a->n, 0);
}

#endif /* FP8AMP_TEST_FAULT_RIG_H */
