/* Data-parallel training of the main job's MLP (main_job_model.h) over MPI ranks on the CPU, with the
 * gradients all-reduced in FP8 (issue 17; docs/communicator.md, "Example: data-parallel training").
 *
 * Every rank builds the same network from the same initial weights (FP8 O1 by default: FP8 GEMMs,
 * scaled-F16 weights, E4M3 weight gradients, F32 AdamW state, as the main job's "FP8 O1") and draws
 * the same shuffles. Each global batch of --batch rows is cut into nranks equal slices; rank r runs
 * forward and backward on slice r (its loss is the mean over its slice), then ONE
 * fp8amp_comm_all_reduce call averages the gradients of all four parameters (both layers' weight and
 * bias gradients, in place: E4M3 on the wire, float32 accumulation in rank order, the mean folded
 * into scale_inv), and every rank steps its own optimizer. The mean of the slices' mean gradients is
 * the combined batch's mean gradient, so nranks = 1 (runnable without mpirun) is the single-process
 * reference on the combined batch. Every rank receives identical gradient bytes, so the parameters
 * stay identical: a checksum of every parameter's bytes (and scale_inv) is compared across ranks
 * every --check-every steps and at the end, and the run fails if any rank differs.
 *
 * The delayed-scaling metas (the amax histories of the Linears' inputs and output gradients) record
 * each rank's slice. After each step's update the ranks agree on their scales: the minimum over ranks
 * of each meta's scale (one MPI_Allreduce of 4 floats), which is the scale of the largest amax, i.e.
 * the scale the single process computes from the combined batch (a scale is fp8_max / amax of the
 * history, non-increasing in the amax), like Transformer Engine's amax reduction over the data-
 * parallel group; then every rank also evaluates the held-out set identically (checked). With
 * --local-scales each rank keeps its own scales (its evaluation may then differ from rank 0's). What
 * remains different from the reference is the FP8 rounding of each rank's partial gradient on the
 * wire, and of its slice's activations and output gradients (docs/communicator.md: measured sizes).
 *
 * Usage: [mpirun -n N] fp8amp_data_parallel --data FILE [--epochs N] [--steps N] [--batch B]
 *                                           [--check-every N] [--opt-level O1|O2] [--seed S]
 *                                           [--local-scales]
 *   --steps N stops after N optimizer steps in all (the test); --batch is the global batch (60 by
 *   default: divisible by 1..6 ranks), a multiple of the number of ranks; --seed varies the split,
 *   the initial weights and the batch order (0, the default: the main job's).
 * Output (rank 0): per-epoch training loss and accuracy over the combined batches, then
 *   "final held-out loss L accuracy A%" and "parameters identical on all N ranks (checksum H)".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8amp/fp8amp.h"
#include "main_job_model.h"

#ifdef FP8AMP_EXAMPLE_HAVE_MPI
#include <mpi.h>
#endif

static int g_rank = 0, g_nranks = 1;

/* Sums over ranks (the training loss and accuracy of the combined batches). */
static double sum_double(double v) {
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    if (g_nranks > 1) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
    return v;
}

/* FNV-1a over bytes. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* The delayed-scaling agreement: each meta's scale becomes the minimum over ranks (see the top). */
static void agree_on_scales(fp8amp_scaling *metas, int n) {
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    float scales[8];
    if (g_nranks == 1) return;
    for (int i = 0; i < n; ++i) CHECK(fp8amp_scaling_get(metas[i], &scales[i], NULL, NULL));
    MPI_Allreduce(MPI_IN_PLACE, scales, n, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    for (int i = 0; i < n; ++i) CHECK(fp8amp_scaling_set_scale(metas[i], scales[i]));
#else
    (void)metas;
    (void)n;
#endif
}

/* Whether v is the same (bit for bit) on every rank. */
static int same_on_all_ranks(double v) {
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    if (g_nranks > 1) {
        double lo = v, hi = v;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return memcmp(&lo, &hi, sizeof lo) == 0;
    }
#endif
    (void)v;
    return 1;
}

static uint64_t hash_tensor(uint64_t h, fp8amp_tensor t) {
    size_t nbytes;
    CHECK(fp8amp_tensor_nbytes(t, &nbytes));
    void *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) die("out of memory", NULL);
    CHECK(fp8amp_tensor_copy_to_host(t, buf, nbytes));
    h = fnv1a(h, buf, nbytes);
    free(buf);
    fp8amp_tensor si = NULL;
    /* A scaled tensor's value is its bytes times its scale_inv: hash that too where it has a slot. */
    if (fp8amp_tensor_scale_inv(t, &si) == FP8AMP_SUCCESS && si) {
        float s;
        CHECK(fp8amp_tensor_copy_to_host(si, &s, sizeof s));
        h = fnv1a(h, &s, sizeof s);
        CHECK(fp8amp_tensor_destroy(si));
    }
    return h;
}

/* A checksum of every parameter's bytes; fails the run (on every rank) unless all ranks agree. */
static uint64_t check_params_agree(net *m, long step) {
    uint64_t h = 0xCBF29CE484222325ull;
    layer *ls[2] = {&m->l1, &m->l2};
    for (int i = 0; i < 2; ++i) {
        h = hash_tensor(h, ls[i]->w);
        h = hash_tensor(h, ls[i]->b);
    }
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    if (g_nranks > 1) {
        uint64_t lo = h, hi = h;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        if (lo != hi) {
            fprintf(stderr, "error: rank %d: parameters differ across ranks after step %ld (checksum %016llx; min %016llx, max %016llx)\n",
                    g_rank, step, (unsigned long long)h, (unsigned long long)lo, (unsigned long long)hi);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
#else
    (void)step;
#endif
    return h;
}

int main(int argc, char **argv) {
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    /* FUNNELED, as fp8amp_comm_create would initialize it; without mpirun this is a world of one. */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);
#endif
    const char *data_path = NULL, *level = "O1";
    int epochs = 10, global_batch = 60, check_every = 10, local_scales = 0;
    long max_steps = -1;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data_path = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) max_steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) global_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check-every") && i + 1 < argc) check_every = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--opt-level") && i + 1 < argc) level = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--local-scales")) local_scales = 1;
        else data_path = NULL, i = argc;
    }
    if (!data_path || epochs < 1 || global_batch < 1 || check_every < 1 || max_steps == 0 ||
        (strcmp(level, "O1") && strcmp(level, "O2"))) {
        if (g_rank == 0)
            fprintf(stderr,
                    "usage: %s --data FILE [--epochs N] [--steps N] [--batch B] [--check-every N] [--opt-level O1|O2] [--seed S] [--local-scales]\n",
                    argv[0]);
        return 2;
    }
    if (global_batch % g_nranks) die("--batch must be a multiple of the number of ranks", NULL);
    const int local_batch = global_batch / g_nranks;
    rng_state ^= seed * 0x9E3779B97F4A7C15ull; /* seed 0: the main job's sequence (split, init, order) */
    if (!rng_state) rng_state = 1;             /* xorshift's one fixed point */

    dataset d = load_dataset(data_path);
    if (d.classes > LOGITS) die("this job's network has at most 16 classes", NULL);
    const int rows = (int)d.rows, cols = (int)d.cols, classes = (int)d.classes;
    float *z = standardize(&d);
    const int n_test = rows / 5, n_train = rows - n_test;
    float *xs = malloc(sizeof(float) * (size_t)rows * cols), *xb = malloc(sizeof(float) * (size_t)local_batch * cols);
    int32_t *ys = malloc(sizeof(int32_t) * rows), *yb = malloc(sizeof(int32_t) * local_batch);
    if (!xs || !xb || !ys || !yb) die("out of memory", NULL);
    shuffle_rows(&d, z, xs, ys); /* the same generator on every rank: the same split and order */
    float *w1, *b1, *w2, *b2;
    init_weights(cols, &w1, &b1, &w2, &b2);

    fp8amp_linear_desc ld;
    fp8amp_adam_desc ad;
    CHECK(fp8amp_opt_level_config(strcmp(level, "O2") ? FP8AMP_OPT_LEVEL_O1 : FP8AMP_OPT_LEVEL_O2, &ld, &ad));
    ad.lr = 3e-3f;
    ad.weight_decay = 1e-4f;
    ld.policy = FP8AMP_GEMM_ALWAYS_FP8;
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    net m;
    net_init(&m, level, cpu, &ld, &ad, local_batch, cols, w1, b1, w2, b2);

    /* The communicator: an id made on rank 0 and given to the others by MPI_Bcast. */
    fp8amp_comm_unique_id id;
    if (g_rank == 0) CHECK(fp8amp_comm_unique_id_create(m.ctx, &id));
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    fp8amp_comm comm;
    CHECK(fp8amp_comm_create(m.ctx, &id, g_nranks, g_rank, &comm));
    fp8amp_comm_reduce_desc rd;
    CHECK(fp8amp_comm_reduce_desc_init_default(&rd));
    rd.average = 1;                                                 /* the mean over ranks */
    const fp8amp_tensor bucket[4] = {m.l1.gw, m.l1.gb, m.l2.gw, m.l2.gb}; /* every gradient, one call */

    if (g_rank == 0) {
        printf("fp8amp data-parallel: %d rank%s, global batch %d (%d per rank), FP8 %s on the CPU, AdamW lr 3e-3\n",
               g_nranks, g_nranks > 1 ? "s" : "", global_batch, local_batch, level);
        printf("gradients: one fp8amp_comm_all_reduce of 4 tensors per step (E4M3 wire, mean); delayed scales %s\n",
               local_scales ? "per rank" : "agreed across ranks (min)");
        printf("%6s %10s %10s\n", "epoch", "loss", "acc");
    }
    int *perm = malloc(sizeof(int) * n_train);
    if (!perm) die("out of memory", NULL);
    for (int i = 0; i < n_train; ++i) perm[i] = i;
    const int batches = n_train / global_batch; /* the remainder of each shuffled epoch is skipped */
    if (batches == 0) die("--batch is larger than the training set", NULL);
    long step = 0;
    uint64_t checksum = 0;
    for (int epoch = 1; epoch <= epochs && step != max_steps; ++epoch) {
        shuffle(perm, n_train);
        double loss = 0, correct = 0;
        int done = 0;
        for (int bi = 0; bi < batches && step != max_steps; ++bi, ++done) {
            for (int r = 0; r < local_batch; ++r) { /* this rank's slice of global batch bi */
                const int s = perm[bi * global_batch + g_rank * local_batch + r];
                memcpy(xb + (size_t)r * cols, xs + (size_t)s * cols, sizeof(float) * cols);
                yb[r] = ys[s];
            }
            int c = 0;
            loss += net_grad(&m, xb, yb, classes, &c);
            correct += c;
            if (!local_scales) agree_on_scales(m.metas, 4);
            CHECK(fp8amp_comm_all_reduce(comm, 4, bucket, bucket, &rd)); /* in place */
            CHECK(fp8amp_optimizer_step(m.opt, NULL));
            if (++step % check_every == 0) checksum = check_params_agree(&m, step);
        }
        loss = sum_double(loss);
        correct = sum_double(correct);
        const double seen = (double)done * global_batch;
        if (g_rank == 0) {
            printf("%6d %10.4f %9.2f%%\n", epoch, loss / seen, 100 * correct / seen);
            fflush(stdout);
        }
    }
    checksum = check_params_agree(&m, step);
    uint64_t saturated;
    CHECK(fp8amp_comm_get_saturated(comm, &saturated));
    double test_loss;
    const double acc = net_accuracy(&m, xs + (size_t)n_train * cols, ys + n_train, n_test, classes, &test_loss);
    const int eval_agrees = same_on_all_ranks(test_loss) && same_on_all_ranks(acc);
    if (!local_scales && !eval_agrees) die("the ranks' held-out evaluations differ despite agreed scales", NULL);
    if (g_rank == 0) {
        printf("steps %ld, gradient elements saturated on the wire: %llu\n", step, (unsigned long long)saturated);
        printf("final held-out loss %.6f accuracy %.2f%% (%d samples)\n", test_loss, 100 * acc, n_test);
        printf("parameters identical on all %d rank%s (checksum %016llx)\n", g_nranks, g_nranks > 1 ? "s" : "",
               (unsigned long long)checksum);
        printf("held-out evaluation %s (scales %s)\n", eval_agrees ? "identical on all ranks" : "differs across ranks",
               local_scales ? "per rank" : "agreed");
    }
    CHECK(fp8amp_comm_destroy(comm));
    net_free(&m);
    free(w1);
    free(b1);
    free(w2);
    free(b2);
    free(perm);
    free(xs);
    free(xb);
    free(ys);
    free(yb);
    free(z);
    free(d.x);
    free(d.y);
#ifdef FP8AMP_EXAMPLE_HAVE_MPI
    MPI_Finalize();
#endif
    return 0;
}
