/* The sharded optimizer (fp8amp_optimizer_set_shard, issue 20) on 2 and 3 ranks
 * (tests/mpi/CMakeLists.txt). Every rank builds the same parameters from a shared seed -- an E4M3
 * weight with an F16 master and an E4M3 gradient, a BF16 parameter with a BF16 gradient, a small F32
 * bias that lies on rank 0 alone, a second E4M3 weight with an F32 gradient; element counts that no
 * number of ranks divides (uneven shards, padded last shards) -- and its own local gradients, then:
 *   - each sharded step gives, bit for bit, the parameters (codes and scale_inv), the metas, the step
 *     count, found_inf and the gradient norm of the unsharded optimizer stepped on every rank with
 *     the same global gradients: the reduce-scatter of the local gradients (the communicator's mean,
 *     computed here once more through fp8amp_comm_reduce_scatter and gathered);
 *   - O3 with nearest and with stochastic master rounding (the shard draws the unsharded element's
 *     bits), with global max_grad_norm clipping that is active, Adam and AdamW, a loss-scale factor;
 *   - a NaN in one rank's local gradient, and an inf in another's (which the FP8 wire would saturate):
 *     the step is skipped on every rank and nothing changes (parameters, metas, step count);
 *   - every rank holds the same parameter bytes; the shard ranges tile each parameter;
 *   - a checkpoint per rank loads into a fresh sharded optimizer (collective), which then steps as
 *     the original;
 *   - the first parameter's master starts from F32 values (master_init), sliced per shard;
 *   - bad calls: set_shard after add_param, twice, with per-tensor state scales; shard_range's index.
 * Plain C: each rank prints its failures; the exit code is non-zero if any check failed.
 *
 * FP8AMP_TEST_COMM_DEVICE=cuda runs the same on GPUs (rank r on cuda:r, NCCL): SKIPPED (77) with
 * fewer GPUs than ranks. Built twice, as test_comm_mpi.c: over MPI_COMM_WORLD (test_optimizer_shard_mpi
 * under mpirun) and over the file channel (test_optimizer_shard_ranks, run by run_ranks.sh, no MPI:
 * for the GPU machines). */
#ifdef FP8AMP_TEST_CHANNEL_MPI
#define TEST_NAME "test_optimizer_shard_mpi"
#else
#define TEST_NAME "test_optimizer_shard_ranks"
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_reference.h"
#include "fp8amp/fp8amp.h"
#include "rank_channel.h"
#include "rank_check.h"

static int g_rank, g_n, g_failures;
static fp8amp_context g_ctx;
static uint64_t g_seed;

/* SplitMix64: the same stream on every rank for the same key. */
static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unit(uint64_t *s) { /* [-1, 1) */
    *s = mix(*s);
    return (double)(*s >> 11) * 0x1p-52 - 1.0;
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void check_identical_on_all_ranks(const void *bytes, size_t n, const char *what) {
    uint64_t lo = fnv(bytes, n), hi = lo;
    CH(rank_channel_allreduce_u64(&lo, 1, RANK_CHANNEL_MIN));
    CH(rank_channel_allreduce_u64(&hi, 1, RANK_CHANNEL_MAX));
    CHECK(lo == hi, "%s: the ranks hold different bytes", what);
}

static size_t esize(fp8amp_dtype d) {
    return d == FP8AMP_DTYPE_F32 ? 4 : (d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2) ? 1 : 2;
}

static uint16_t bf16_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* ---- the model: four parameters ------------------------------------------------------------------ */
#define NP 4
static const int64_t k_numel[NP] = {1000, 300, 37, 777};
static const fp8amp_dtype k_param_dtype[NP] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E4M3};
static const fp8amp_dtype k_grad_dtype[NP] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32};
#define BLOCK 128

typedef struct {
    fp8amp_tensor param[NP], grad[NP];
    fp8amp_scaling meta[NP]; /* the E4M3 parameters' metas (else NULL) */
    fp8amp_optimizer opt;
} model;

static void set_slot(fp8amp_tensor t, float v) {
    fp8amp_tensor si;
    OK(fp8amp_tensor_scale_inv(t, &si));
    OK(fp8amp_tensor_copy_from_host(si, &v, 4));
    OK(fp8amp_tensor_destroy(si));
}
static float get_slot(fp8amp_tensor t) {
    fp8amp_tensor si;
    float v = 0;
    OK(fp8amp_tensor_scale_inv(t, &si));
    OK(fp8amp_tensor_copy_to_host(si, &v, 4));
    OK(fp8amp_tensor_destroy(si));
    return v;
}
static fp8amp_scaling new_meta(fp8amp_dtype d, float scale) {
    fp8amp_recipe recipe;
    fp8amp_scaling m;
    OK(fp8amp_recipe_init_default(&recipe));
    recipe.amax_history_len = 4;
    OK(fp8amp_scaling_create(g_ctx, &recipe, d, &m));
    OK(fp8amp_scaling_set_scale(m, scale));
    return m;
}

/* The parameters' initial bytes, from the shared seed (the same on every rank and in every model). */
static void init_param(model *md, int i, uint64_t salt) {
    const int64_t n = k_numel[i];
    unsigned char *b = malloc((size_t)n * 4);
    uint64_t s = g_seed ^ (0x1000u + (uint64_t)i) ^ (salt << 40);
    int64_t j;
    for (j = 0; j < n; ++j) {
        const double u = unit(&s);
        switch (k_param_dtype[i]) {
        case FP8AMP_DTYPE_E4M3: { /* a code of magnitude 1..0x76, either sign: finite */
            uint8_t c = (uint8_t)(1 + (s >> 20) % 0x76);
            b[j] = (uint8_t)(c | ((s >> 40) & 1 ? 0x80 : 0));
            break;
        }
        case FP8AMP_DTYPE_BF16: {
            uint16_t h = bf16_of((float)(u * 0.5));
            memcpy(b + 2 * j, &h, 2);
            break;
        }
        default: {
            float f = (float)(u * 0.25);
            memcpy(b + 4 * j, &f, 4);
            break;
        }
        }
    }
    OK(fp8amp_tensor_copy_from_host(md->param[i], b, (size_t)n * esize(k_param_dtype[i])));
    if (md->meta[i]) set_slot(md->param[i], 1.0f / 64.0f);
    free(b);
}

/* shard: set_shard(comm) first (NULL: unsharded, F32 gradients: the reference takes the reduced ones). */
static void build(model *md, fp8amp_comm shard, const fp8amp_adam_desc *desc, uint64_t salt) {
    int i;
    memset(md, 0, sizeof *md);
    OK(fp8amp_optimizer_create(g_ctx, desc, &md->opt));
    if (shard) OK(fp8amp_optimizer_set_shard(md->opt, shard));
    for (i = 0; i < NP; ++i) {
        const fp8amp_dtype gd = shard ? k_grad_dtype[i] : FP8AMP_DTYPE_F32;
        fp8amp_param_desc pd;
        OK(fp8amp_tensor_create(g_ctx, k_param_dtype[i], 1, &k_numel[i], &md->param[i]));
        OK(fp8amp_tensor_create(g_ctx, gd, 1, &k_numel[i], &md->grad[i]));
        if (k_param_dtype[i] == FP8AMP_DTYPE_E4M3) {
            md->meta[i] = new_meta(FP8AMP_DTYPE_E4M3, 64.0f);
            OK(fp8amp_tensor_set_scaling(md->param[i], md->meta[i]));
        }
        if (gd == FP8AMP_DTYPE_E4M3) {
            fp8amp_scaling gm = new_meta(FP8AMP_DTYPE_E4M3, 1.0f);
            OK(fp8amp_tensor_set_scaling(md->grad[i], gm));
            OK(fp8amp_scaling_destroy(gm));
        }
        init_param(md, i, salt);
        OK(fp8amp_param_desc_init(&pd, sizeof pd));
        pd.master_dtype = k_param_dtype[i] == FP8AMP_DTYPE_E4M3 ? FP8AMP_DTYPE_F16 : FP8AMP_NO_MASTER;
        fp8amp_tensor init = NULL;
        if (i == 0) { /* the first E4M3 parameter's master starts from F32 values (master_init): sliced per shard */
            float *v = malloc(sizeof(float) * (size_t)k_numel[i]);
            uint64_t s = g_seed ^ 0x3000u ^ (salt << 40);
            int64_t j;
            for (j = 0; j < k_numel[i]; ++j) v[j] = (float)(unit(&s) * 0.75);
            OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &k_numel[i], &init));
            OK(fp8amp_tensor_copy_from_host(init, v, sizeof(float) * (size_t)k_numel[i]));
            free(v);
            pd.master_init = init;
        }
        OK(fp8amp_optimizer_add_param_ex(md->opt, md->param[i], md->grad[i], &pd));
        if (init) OK(fp8amp_tensor_destroy(init)); /* read by add_param_ex only */
    }
}

static void destroy(model *md) {
    int i;
    OK(fp8amp_optimizer_destroy(md->opt));
    for (i = 0; i < NP; ++i) {
        OK(fp8amp_tensor_destroy(md->param[i]));
        OK(fp8amp_tensor_destroy(md->grad[i]));
        if (md->meta[i]) OK(fp8amp_scaling_destroy(md->meta[i]));
    }
}

/* This rank's local gradient of parameter i at step t, as floats (what goes into the tensor);
 * poison 2: an inf at element 5 (poison 1, a NaN code, is written by poison_code). */
static void local_grad(int i, int t, int rank, int poison, float *g) {
    uint64_t s = g_seed ^ (0x2000u + (uint64_t)i) ^ ((uint64_t)t << 32) ^ ((uint64_t)(rank + 1) << 48);
    int64_t j;
    for (j = 0; j < k_numel[i]; ++j) g[j] = (float)(unit(&s) * (0.5 + i));
    if (poison == 2) g[5] = INFINITY;
}

/* Writes the local gradient into the sharded model's gradient tensor (E4M3 through fp8amp_quantize
 * with its meta's current scale; BF16 rounded here). */
static void write_grad(fp8amp_tensor grad, fp8amp_dtype d, const float *g, int64_t n) {
    if (d == FP8AMP_DTYPE_F32) {
        OK(fp8amp_tensor_copy_from_host(grad, g, (size_t)n * 4));
    } else if (d == FP8AMP_DTYPE_BF16) {
        uint16_t *h = malloc((size_t)n * 2);
        int64_t j;
        for (j = 0; j < n; ++j) h[j] = bf16_of(g[j]);
        OK(fp8amp_tensor_copy_from_host(grad, h, (size_t)n * 2));
        free(h);
    } else {
        fp8amp_tensor f;
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &f));
        OK(fp8amp_tensor_copy_from_host(f, g, (size_t)n * 4));
        OK(fp8amp_quantize(g_ctx, f, grad));
        OK(fp8amp_tensor_destroy(f));
    }
}

/* A NaN code at element 5 of an E4M3 gradient (written directly: a NaN through fp8amp_quantize would
 * also record an inf amax in the gradient's meta, which every later step would see). */
static void poison_code(fp8amp_tensor grad, int64_t n) {
    uint8_t *c = malloc((size_t)n);
    OK(fp8amp_tensor_copy_to_host(grad, c, (size_t)n));
    c[5] = 0x7F;
    OK(fp8amp_tensor_copy_from_host(grad, c, (size_t)n));
    free(c);
}

static int64_t shard_k(int64_t n) {
    int64_t k = (n + g_n - 1) / g_n;
    return (k + BLOCK - 1) / BLOCK * BLOCK;
}

/* The global gradient the sharded step works with: the local gradient as F32 (fp8amp_dequantize /
 * fp8amp_cast), padded with zeros to nranks * k, reduce-scattered (the mean, E4M3 wire) and gathered.
 * Checked against an independent reference as well (the sharded optimizer's own reduce-scatter is
 * the same fp8amp_comm_reduce_scatter, so a broken one would agree with itself): every element within
 * one E4M3 rounding per rank (on the wire scale from the amax of every rank's values) of the float64
 * mean of the ranks' local values, gathered through the side channel. */
static void reduced_grad(fp8amp_comm comm, fp8amp_tensor local, int64_t n, fp8amp_tensor out) {
    const int64_t k = shard_k(n), nk = k * g_n;
    fp8amp_tensor f, pad, shard, all;
    float *h = calloc((size_t)nk, 4);
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &f));
    {
        fp8amp_dtype d;
        OK(fp8amp_tensor_dtype(local, &d));
        if (d == FP8AMP_DTYPE_E4M3) OK(fp8amp_dequantize(g_ctx, local, f));
        else OK(fp8amp_cast(g_ctx, local, f));
    }
    OK(fp8amp_tensor_copy_to_host(f, h, (size_t)n * 4));
    float *every = malloc((size_t)n * 4 * (size_t)g_n);  /* rank j's local values at every + j * n */
    CH(rank_channel_allgather(h, (size_t)n * 4, every));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &nk, &pad));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &k, &shard));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &nk, &all));
    OK(fp8amp_tensor_copy_from_host(pad, h, (size_t)nk * 4));
    OK(fp8amp_comm_reduce_scatter(comm, pad, shard, NULL));
    OK(fp8amp_comm_all_gather(comm, shard, all, NULL, NULL));
    OK(fp8amp_tensor_copy_to_host(all, h, (size_t)nk * 4));
    {
        double amax = 0;
        int64_t e;
        int j, bad = 0;
        for (e = 0; e < (int64_t)n * g_n; ++e) amax = fmax(amax, fabs((double)every[e]));
        if (isfinite(amax) && amax > 0) { /* a NaN or inf gradient: the step is skipped (checked elsewhere) */
            const float ws = scale_ref(448, 0, 0, amax, 1.0f), wsi = reciprocal_ref(ws);
            for (e = 0; e < n; ++e) {
                double mean = 0, bound = 0;
                for (j = 0; j < g_n; ++j) {
                    const double xv = every[(size_t)j * (size_t)n + (size_t)e];
                    mean += xv;
                    bound += 0.5 * quantum_ref(&FMT_E4M3, fabs(xv) * ws) * wsi;
                }
                mean /= g_n;
                bound = bound / g_n + fabs(mean) * ldexp(1.0, -20);
                if (!(fabs((double)h[e] - mean) <= bound) && bad++ < 3)
                    CHECK(0, "reduced gradient element %lld: %.9g, float64 mean of the ranks' values %.9g, error %.3g > %.3g",
                          (long long)e, h[e], mean, fabs((double)h[e] - mean), bound);
            }
            CHECK(bad == 0, "%d elements of the reduced gradient (of %lld) beyond one E4M3 rounding of the mean", bad,
                  (long long)n);
        }
    }
    free(every);
    OK(fp8amp_tensor_copy_from_host(out, h, (size_t)n * 4));
    OK(fp8amp_tensor_destroy(f));
    OK(fp8amp_tensor_destroy(pad));
    OK(fp8amp_tensor_destroy(shard));
    OK(fp8amp_tensor_destroy(all));
    free(h);
}

/* Everything a step may change that the caller sees: parameter bytes and slots, metas, status. */
typedef struct {
    unsigned char *bytes;
    size_t n;
} snap;
static void put(snap *s, const void *p, size_t n) {
    s->bytes = realloc(s->bytes, s->n + n);
    memcpy(s->bytes + s->n, p, n);
    s->n += n;
}
static snap snapshot_ex(const model *md, int with_status) {
    snap s = {NULL, 0};
    int i;
    int64_t step = 0;
    int32_t fi = 0;
    float norm = 0;
    for (i = 0; i < NP; ++i) {
        const size_t nb = (size_t)k_numel[i] * esize(k_param_dtype[i]);
        unsigned char *b = malloc(nb);
        OK(fp8amp_tensor_copy_to_host(md->param[i], b, nb));
        put(&s, b, nb);
        free(b);
        if (md->meta[i]) {
            float sc, si, am, slot = get_slot(md->param[i]);
            float hist[4];
            OK(fp8amp_scaling_get(md->meta[i], &sc, &si, &am));
            OK(fp8amp_scaling_get_history(md->meta[i], 4, hist));
            put(&s, &sc, 4);
            put(&s, &si, 4);
            put(&s, &am, 4);
            put(&s, &slot, 4);
            put(&s, hist, sizeof hist);
        }
    }
    OK(fp8amp_optimizer_get_step(md->opt, &step));
    put(&s, &step, sizeof step);
    if (!with_status) return s;
    OK(fp8amp_optimizer_get_found_inf(md->opt, &fi));
    OK(fp8amp_optimizer_get_grad_norm(md->opt, &norm));
    put(&s, &fi, sizeof fi);
    if (!fi) put(&s, &norm, sizeof norm); /* NaN after a skip: compared apart */
    return s;
}
static snap snapshot(const model *md) { return snapshot_ex(md, 1); }
static int same(const snap *a, const snap *b) { return a->n == b->n && memcmp(a->bytes, b->bytes, a->n) == 0; }

static void step_args(fp8amp_adam_step_args *a, int t) {
    OK(fp8amp_adam_step_args_init(a, sizeof *a));
    a->grad_scale_inv = t % 2 ? 0.5f : 1.0f;
    a->lr = 1e-2f / (float)(1 + t);
}

/* Steps the sharded model and the reference on the same global gradients for `steps` steps;
 * poison_step: a step where one rank's local gradient holds a NaN code (poison_kind 1: the last
 * rank's E4M3 gradient) or an inf (2: rank 0's F32 gradient, which the FP8 wire would saturate to a
 * finite value) or both (3). */
static void run_case(fp8amp_comm comm, const char *name, fp8amp_opt_level level, int adamw, float clip, int stochastic,
                     int steps, int poison_step, int poison_kind) {
    fp8amp_adam_desc desc;
    model sh, ref;
    int t, i;
    float *g = malloc(1000 * 4);
    OK(fp8amp_opt_level_adam_init(level, &desc, sizeof desc));
    desc.adamw = adamw;
    desc.weight_decay = 0.05f;
    desc.max_grad_norm = clip;
    desc.state_block_size = BLOCK;
    desc.master_rounding = stochastic ? FP8AMP_MASTER_ROUND_STOCHASTIC : FP8AMP_MASTER_ROUND_NEAREST;
    desc.rounding_seed = 1234;
    build(&sh, comm, &desc, 0);
    build(&ref, NULL, &desc, 0);
    {
        snap a = snapshot(&sh), b = snapshot(&ref);
        CHECK(same(&a, &b), "%s: the models differ before any step", name);
        free(a.bytes);
        free(b.bytes);
    }
    /* The shard ranges tile every parameter. */
    for (i = 0; i < NP; ++i) {
        int64_t be = -1, cnt = -1, k = shard_k(k_numel[i]);
        int64_t want_b = g_rank * k < k_numel[i] ? g_rank * k : k_numel[i];
        int64_t want_c = k_numel[i] - g_rank * k;
        uint64_t sum;
        want_c = want_c < 0 ? 0 : want_c > k ? k : want_c;
        OK(fp8amp_optimizer_shard_range(sh.opt, i, &be, &cnt));
        CHECK(be == want_b && cnt == want_c, "%s: param %d shard [%lld, +%lld), expected [%lld, +%lld)", name, i,
              (long long)be, (long long)cnt, (long long)want_b, (long long)want_c);
        sum = (uint64_t)cnt;
        CH(rank_channel_allreduce_u64(&sum, 1, RANK_CHANNEL_SUM));
        CHECK(sum == (uint64_t)k_numel[i], "%s: param %d: the shards hold %llu elements, not %lld", name, i,
              (unsigned long long)sum, (long long)k_numel[i]);
        OK(fp8amp_optimizer_shard_range(ref.opt, i, &be, &cnt));
        CHECK(be == 0 && cnt == k_numel[i], "%s: an unsharded optimizer holds all of param %d", name, i);
    }
    /* The memory a sharded rank holds beyond the unsharded optimizer (bench/o3_shard_memory.py's
     * model): the state of k instead of n elements, the shard's parameter copy, and the step's
     * scratch (nranks * k of the largest shard, 4 bytes or the parameter's size). */
    {
        size_t bs = 0, br = 0, scratch = 0;
        int64_t extra = 0;
        const int64_t me = level == FP8AMP_OPT_LEVEL_O1 ? 4 : 1, ve = level == FP8AMP_OPT_LEVEL_O1 ? 4 : 2;
        const int scales = level == FP8AMP_OPT_LEVEL_O1 ? 0 : 2;
        OK(fp8amp_optimizer_state_bytes(sh.opt, &bs));
        OK(fp8amp_optimizer_state_bytes(ref.opt, &br));
        for (i = 0; i < NP; ++i) {
            const int64_t n = k_numel[i], k = shard_k(n);
            const int master = k_param_dtype[i] == FP8AMP_DTYPE_E4M3;
            const int64_t es = (int64_t)esize(k_param_dtype[i]);
            const size_t need = (size_t)(g_n * k) * (size_t)(es > 4 ? es : 4);
            extra += (k - n) * (me + ve + 2 * master) + ((k + BLOCK - 1) / BLOCK - (n + BLOCK - 1) / BLOCK) * 4 * (scales + master);
            extra += k * es; /* the shard's F32 gradient (4k) is held during a step only */
            if (need > scratch) scratch = need;
        }
        CHECK((int64_t)bs - (int64_t)br == extra + (int64_t)scratch,
              "%s: the sharded rank holds %zu bytes, the unsharded optimizer %zu: %lld more, expected %lld", name, bs, br,
              (long long)bs - (long long)br, (long long)(extra + (int64_t)scratch));
    }
    for (t = 0; t < steps; ++t) {
        fp8amp_adam_step_args a;
        const int poison = t == poison_step;
        snap before = snapshot(&sh);
        step_args(&a, t);
        for (i = 0; i < NP; ++i) {
            int p = 0;
            if (poison && (poison_kind & 1) && i == 0 && g_rank == g_n - 1) p = 1; /* a NaN code in an E4M3 gradient */
            if (poison && (poison_kind & 2) && i == 2 && g_rank == 0) p = 2;       /* an inf, which the wire would saturate */
            local_grad(i, t, g_rank, p, g);
            write_grad(sh.grad[i], k_grad_dtype[i], g, k_numel[i]);
            if (p == 1) poison_code(sh.grad[i], k_numel[i]);
            if (!poison) reduced_grad(comm, sh.grad[i], k_numel[i], ref.grad[i]);
        }
        OK(fp8amp_optimizer_step(sh.opt, &a));
        if (poison) {
            snap after = snapshot(&sh);
            int32_t fi = 0;
            float norm = 0;
            OK(fp8amp_optimizer_get_found_inf(sh.opt, &fi));
            OK(fp8amp_optimizer_get_grad_norm(sh.opt, &norm));
            CHECK(fi == 1, "%s step %d: a non-finite local gradient on one rank, found_inf %d", name, t, (int)fi);
            CHECK(norm != norm, "%s step %d: a skipped step's norm is %g, not NaN", name, t, norm);
            /* before's found_inf was 0 and carried the norm: compare the parameters and metas only */
            CHECK(after.n + 4 == before.n && memcmp(after.bytes, before.bytes, after.n - sizeof(int32_t)) == 0,
                  "%s step %d: a skipped step changed something", name, t);
            free(after.bytes);
        } else {
            OK(fp8amp_optimizer_step(ref.opt, &a));
            snap x = snapshot(&sh), y = snapshot(&ref);
            CHECK(same(&x, &y), "%s step %d: the sharded step's parameters, metas or status differ from the unsharded step's",
                  name, t);
            if (!same(&x, &y))
                for (i = 0; i < NP; ++i) {
                    float ns = 0, nr = 0;
                    OK(fp8amp_optimizer_get_grad_norm(sh.opt, &ns));
                    OK(fp8amp_optimizer_get_grad_norm(ref.opt, &nr));
                    if (i == 0) fprintf(stderr, "[rank %d]   norms %.9g / %.9g\n", g_rank, ns, nr);
                }
            check_identical_on_all_ranks(x.bytes, x.n, name);
            free(x.bytes);
            free(y.bytes);
        }
        free(before.bytes);
    }
    if (clip > 0) { /* the case meant to clip did */
        float norm = 0;
        OK(fp8amp_optimizer_get_grad_norm(sh.opt, &norm));
        CHECK(norm > clip, "%s: the norm %g does not exceed max_grad_norm %g: clipping was not exercised", name, norm, clip);
    }

    /* A checkpoint per rank, loaded (collectively) into a fresh sharded model with other values. */
    {
        size_t size = 0;
        void *blob;
        model back;
        fp8amp_adam_step_args a;
        OK(fp8amp_optimizer_save(sh.opt, NULL, 0, &size));
        blob = malloc(size);
        OK(fp8amp_optimizer_save(sh.opt, blob, size, &size));
        build(&back, comm, &desc, 99);
        OK(fp8amp_optimizer_load(back.opt, blob, size));
        {
            snap x = snapshot_ex(&sh, 0), y = snapshot_ex(&back, 0);
            CHECK(same(&x, &y), "%s: the loaded sharded optimizer's parameters, metas or step count differ", name);
            free(x.bytes);
            free(y.bytes);
        }
        step_args(&a, steps);
        for (i = 0; i < NP; ++i) {
            local_grad(i, steps, g_rank, 0, g);
            write_grad(sh.grad[i], k_grad_dtype[i], g, k_numel[i]);
            write_grad(back.grad[i], k_grad_dtype[i], g, k_numel[i]);
        }
        OK(fp8amp_optimizer_step(sh.opt, &a));
        OK(fp8amp_optimizer_step(back.opt, &a));
        {
            snap x = snapshot(&sh), y = snapshot(&back);
            CHECK(same(&x, &y), "%s: a step after the load differs from the original's", name);
            free(x.bytes);
            free(y.bytes);
        }
        destroy(&back);
        free(blob);
    }
    destroy(&sh);
    destroy(&ref);
    free(g);
    if (g_rank == 0) printf(TEST_NAME ": %s done (rank 0: %d failed checks so far)\n", name, g_failures);
}

static void test_bad_calls(fp8amp_comm comm) {
    fp8amp_adam_desc desc;
    fp8amp_optimizer opt;
    fp8amp_tensor p, gr;
    const int64_t n = 256;
    int64_t b = 0, c = 0;
    OK(fp8amp_opt_level_adam_init(FP8AMP_OPT_LEVEL_O2, &desc, sizeof desc));
    desc.state_block_size = 0;
    OK(fp8amp_optimizer_create(g_ctx, &desc, &opt));
    EXPECT(fp8amp_optimizer_set_shard(opt, comm), FP8AMP_ERROR_NOT_SUPPORTED);
    OK(fp8amp_optimizer_destroy(opt));
    desc.state_block_size = 128;
    OK(fp8amp_optimizer_create(g_ctx, &desc, &opt));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &p));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &gr));
    OK(fp8amp_optimizer_add_param(opt, p, gr));
    EXPECT(fp8amp_optimizer_set_shard(opt, comm), FP8AMP_ERROR_INVALID_ARGUMENT); /* after add_param */
    EXPECT(fp8amp_optimizer_set_shard(opt, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT(fp8amp_optimizer_shard_range(opt, 1, &b, &c), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT(fp8amp_optimizer_shard_range(opt, -1, &b, &c), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT(fp8amp_optimizer_shard_range(opt, 0, NULL, &c), FP8AMP_ERROR_INVALID_ARGUMENT);
    OK(fp8amp_optimizer_destroy(opt));
    OK(fp8amp_optimizer_create(g_ctx, &desc, &opt));
    OK(fp8amp_optimizer_set_shard(opt, comm));
    EXPECT(fp8amp_optimizer_set_shard(opt, comm), FP8AMP_ERROR_INVALID_ARGUMENT); /* twice */
    OK(fp8amp_optimizer_destroy(opt));
    OK(fp8amp_tensor_destroy(p));
    OK(fp8amp_tensor_destroy(gr));
    if (g_rank == 0) printf(TEST_NAME ": bad calls done (rank 0: %d failed checks so far)\n", g_failures);
}

int main(int argc, char **argv) {
    fp8amp_device device = {FP8AMP_DEVICE_CPU, 0};
    const char *want = getenv("FP8AMP_TEST_COMM_DEVICE");
    const int cuda = want && strcmp(want, "cuda") == 0;
    fp8amp_comm comm = NULL;
    fp8amp_comm_unique_id id;
    uint64_t total;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rank_channel_init(&argc, &argv) != 0) {
        fprintf(stderr, TEST_NAME ": %s\n", rank_channel_error());
        return 1;
    }
    g_rank = rank_channel_rank();
    g_n = rank_channel_size();
    g_seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (getenv("FP8AMP_TEST_SEED")) g_seed = strtoull(getenv("FP8AMP_TEST_SEED"), NULL, 0);
    CH(rank_channel_bcast(&g_seed, sizeof g_seed, 0));
#ifndef FP8AMP_TEST_CHANNEL_MPI
    if (!cuda) {
        if (g_rank == 0)
            fprintf(stderr, TEST_NAME ": needs FP8AMP_TEST_COMM_DEVICE=cuda: a CPU communicator of more than one rank "
                            "runs on MPI (test_optimizer_shard_mpi under mpirun checks the CPU)\n");
        return 1;
    }
#endif
    if (cuda) {
        int32_t gpus = 0;
        if (fp8amp_device_count(FP8AMP_DEVICE_CUDA, &gpus) != FP8AMP_SUCCESS) gpus = 0;
        if (gpus < g_n) {
            if (g_rank == 0) printf(TEST_NAME ": FP8AMP_TEST_COMM_DEVICE=cuda needs %d GPUs, %d seen: SKIPPED\n", g_n, gpus);
            CH(rank_channel_finalize());
            return 77;
        }
        device.type = FP8AMP_DEVICE_CUDA;
        device.index = g_rank % gpus;
    }
    if (g_rank == 0)
        printf(TEST_NAME ": %d ranks on %s, side channel %s, seed FP8AMP_TEST_SEED=%llu\n", g_n,
               cuda ? "CUDA (NCCL)" : "the CPU (MPI)", rank_channel_name(), (unsigned long long)g_seed);
    OK(fp8amp_context_create(device, &g_ctx));
    if (g_rank == 0) OK(fp8amp_comm_unique_id_create(g_ctx, &id));
    CH(rank_channel_bcast(&id, sizeof id, 0));
    OK(fp8amp_comm_create(g_ctx, &id, g_n, g_rank, &comm));

    test_bad_calls(comm);
    run_case(comm, "O3 AdamW, nearest, a NaN on the last rank", FP8AMP_OPT_LEVEL_O3, 1, 0.0f, 0, 4, 2, 1);
    run_case(comm, "O3 AdamW, stochastic masters, clipped, an inf on rank 0", FP8AMP_OPT_LEVEL_O3, 1, 0.5f, 1, 4, 1, 2);
    run_case(comm, "O3 Adam, clipped, a NaN and an inf", FP8AMP_OPT_LEVEL_O3, 0, 1.0f, 0, 4, 0, 3);
    run_case(comm, "O1 AdamW", FP8AMP_OPT_LEVEL_O1, 1, 0.0f, 0, 3, -1, 0);

    OK(fp8amp_comm_destroy(comm));
    OK(fp8amp_context_destroy(g_ctx));
    total = (uint64_t)g_failures;
    CH(rank_channel_allreduce_u64(&total, 1, RANK_CHANNEL_SUM));
    if (g_rank == 0) printf(TEST_NAME ": %s (%llu failed checks over all ranks)\n", total ? "FAILED" : "passed",
                            (unsigned long long)total);
    CH(rank_channel_finalize());
    return total ? 1 : 0;
}
