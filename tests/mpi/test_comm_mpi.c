/* The CPU communicator under mpirun (issue 17): run with 2 and 3 ranks (tests/mpi/CMakeLists.txt).
 * Every rank regenerates every rank's inputs from a shared seed, so each can compute the reference:
 *   - all-reduce of a bucket of five tensors of mixed dtypes (F32, BF16, E4M3 with a per-rank
 *     scale_inv; FP8, F32 and BF16 outputs, one in place) equals, bit for bit, the model of
 *     comm_reference.h; its error against the exact float64 mean of the wire values is at most one
 *     rounding of the output format, and against the exact mean of the inputs at most that plus the
 *     wire's rounding, whatever the number of ranks; every rank holds identical bytes;
 *   - reduce-scatter into F32 and into E4M3 shards (per-shard scales), all-gather of E4M3 shards with
 *     their scale_inv, and an adopted MPI_Comm giving the same bytes as a created communicator;
 *   - mismatched counts, shapes, dtypes, options and a bad handle on one rank: refused on every rank,
 *     outputs unchanged;
 *   - a rank that stops taking part: the others fail with FP8AMP_ERROR_COMM within the timeout, or
 *     as soon as a watchdog thread calls fp8amp_comm_abort.
 * Plain C: each rank prints its failures; the exit code is non-zero if any check failed.
 *
 * FP8AMP_TEST_COMM_DEVICE=cuda runs the same checks on GPUs (rank r on cuda:r; at least as many GPUs
 * as ranks, or SKIPPED with 77) through NCCL, against the same model: the GPU bytes must equal what the CPU run checks. The
 * MPI-only parts (an adopted MPI_Comm, the MPI timeout of a silent rank) are left out there; the
 * NCCL check's timeout and a watchdog's abort of it are checked instead (test_lost_rank_nccl).
 *
 * The ranks share the seed and the communicator id, and compare their bytes, through a side channel
 * outside the communicator under test (rank_channel.h). This source is built twice
 * (tests/mpi/CMakeLists.txt):
 *   - test_comm_mpi (FP8AMP_TEST_CHANNEL_MPI): the channel is MPI_COMM_WORLD; run under mpirun, on
 *     the CPU (ctest mpi.comm.np2, np3) or on GPUs (mpi.comm.cuda.np2);
 *   - test_comm_ranks (FP8AMP_TEST_CHANNEL_FILES): no MPI at all, the channel is a directory of files;
 *     run by tests/mpi/run_ranks.sh N (ctest comm.cuda.ranks.np2), for the GPU machines, which have
 *     no MPI. CUDA only (FP8AMP_TEST_COMM_DEVICE=cuda): a CPU communicator of more than one rank is
 *     itself MPI. The adopted MPI_Comm is left out. */
#ifdef FP8AMP_TEST_CHANNEL_MPI
#include <mpi.h>
#define TEST_NAME "test_comm_mpi"
#else
#define TEST_NAME "test_comm_ranks"
#endif
#include <pthread.h>
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t g_seed;
static fp8amp_context g_ctx;

/* Rank 0 says which part is done (so that a run stopped midway, e.g. a hang on the GPUs, shows where),
 * with this rank's failures so far. */
static void done(const char *what) {
    if (g_rank == 0) printf(TEST_NAME ": %s done (rank 0: %d failed checks so far)\n", what, g_failures);
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Every rank passes the same 64-bit digest of its output bytes. */
static void check_identical_on_all_ranks(const void *bytes, size_t n, const char *what) {
    uint64_t h = fnv(bytes, n), lo = h, hi = h;
    CH(rank_channel_allreduce_u64(&lo, 1, RANK_CHANNEL_MIN));
    CH(rank_channel_allreduce_u64(&hi, 1, RANK_CHANNEL_MAX));
    CHECK(lo == hi, "%s: the ranks hold different bytes", what);
}

static fp8amp_comm make_comm(void) {
    fp8amp_comm_unique_id id;
    fp8amp_comm comm = NULL;
    if (g_rank == 0) OK(fp8amp_comm_unique_id_create(g_ctx, &id));
    CH(rank_channel_bcast(&id, sizeof id, 0)); /* the caller's own channel */
    OK(fp8amp_comm_create(g_ctx, &id, g_n, g_rank, &comm));
    return comm;
}

/* An FP8 tensor bound to a meta (so it has a scale_inv slot), with the given codes and scale_inv. */
static fp8amp_tensor make_fp8(fp8amp_dtype d, int64_t numel, const uint8_t *codes, float scale_inv) {
    fp8amp_recipe recipe;
    fp8amp_scaling meta;
    fp8amp_tensor t, si;
    OK(fp8amp_recipe_init_default(&recipe));
    OK(fp8amp_scaling_create(g_ctx, &recipe, d, &meta));
    OK(fp8amp_tensor_create(g_ctx, d, 1, &numel, &t));
    OK(fp8amp_tensor_set_scaling(t, meta));
    OK(fp8amp_scaling_destroy(meta));
    if (codes) OK(fp8amp_tensor_copy_from_host(t, codes, (size_t)numel));
    OK(fp8amp_tensor_scale_inv(t, &si));
    OK(fp8amp_tensor_copy_from_host(si, &scale_inv, 4));
    OK(fp8amp_tensor_destroy(si));
    return t;
}

static float read_scale_inv(fp8amp_tensor t) {
    fp8amp_tensor si;
    float v = 0;
    OK(fp8amp_tensor_scale_inv(t, &si));
    OK(fp8amp_tensor_copy_to_host(si, &v, 4));
    OK(fp8amp_tensor_destroy(si));
    return v;
}

/* ---- the bucket all-reduce ------------------------------------------------------------------- */

enum { NT = 5 };
static const int64_t k_numel[NT] = {1000, 37, 1, 4099, 300};
static const fp8amp_dtype k_in[NT] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F32,
                                      FP8AMP_DTYPE_F32};
static const fp8amp_dtype k_out[NT] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E5M2,
                                       FP8AMP_DTYPE_F32 /* in place */};
static const int k_elo[NT] = {-8, -3, -12, 2, -20}, k_ehi[NT] = {0, 4, -6, 10, -18};

/* Rank j's inputs for tensor i: the host bytes (dtype k_in[i]) and their real values. */
static void gen_input(int j, int i, void *bytes, double *real, float *scale_inv) {
    uint64_t s = g_seed ^ (0x1000193ull * (uint64_t)(j + 1)) ^ (0x7F4A7C15ull * (uint64_t)(i + 1));
    int64_t k;
    *scale_inv = 1.0f;
    if (k_in[i] == FP8AMP_DTYPE_E4M3) *scale_inv = ldexpf(1.0f, -14 + j) * (1.0f + 0.25f * j); /* per rank */
    for (k = 0; k < k_numel[i]; ++k) {
        const float x = random_value(&s, k_elo[i], k_ehi[i]);
        switch (k_in[i]) {
        case FP8AMP_DTYPE_F32:
            ((float *)bytes)[k] = x;
            real[k] = x;
            break;
        case FP8AMP_DTYPE_BF16: {
            const uint16_t c = (uint16_t)code_of_value_ref(&FMT_BF16, round_ref(&FMT_BF16, x));
            ((uint16_t *)bytes)[k] = c;
            real[k] = decode_ref(&FMT_BF16, c);
            break;
        }
        default: {
            const uint8_t c = (uint8_t)encode_fp8_ref(&FMT_E4M3, ldexp(x, 10));
            ((uint8_t *)bytes)[k] = c;
            real[k] = mul_f32_ref(decode_ref(&FMT_E4M3, c), *scale_inv);
        }
        }
    }
}

static void test_all_reduce_on(fp8amp_comm comm, const char *label, int average, uint64_t *digest) {
    fp8amp_tensor in[NT], out[NT];
    void *mine[NT];
    int i, j;
    fp8amp_comm_reduce_desc desc;
    OK(fp8amp_comm_reduce_desc_init_default(&desc));
    desc.average = average;
    for (i = 0; i < NT; ++i) {
        const size_t bytes = (size_t)k_numel[i] * fp8amp_dtype_size(k_in[i]);
        double *real = malloc(sizeof(double) * (size_t)k_numel[i]);
        float si;
        mine[i] = malloc(bytes);
        gen_input(g_rank, i, mine[i], real, &si);
        free(real);
        if (k_in[i] == FP8AMP_DTYPE_E4M3) {
            in[i] = make_fp8(k_in[i], k_numel[i], mine[i], si);
        } else {
            OK(fp8amp_tensor_create(g_ctx, k_in[i], 1, &k_numel[i], &in[i]));
            OK(fp8amp_tensor_copy_from_host(in[i], mine[i], bytes));
        }
        if (k_out[i] == FP8AMP_DTYPE_E4M3 || k_out[i] == FP8AMP_DTYPE_E5M2)
            out[i] = make_fp8(k_out[i], k_numel[i], NULL, 1.0f);
        else if (i == 4)
            out[i] = in[i];
        else
            OK(fp8amp_tensor_create(g_ctx, k_out[i], 1, &k_numel[i], &out[i]));
    }
    OK(fp8amp_comm_all_reduce(comm, NT, in, out, &desc));

    *digest = 1469598103934665603ull;
    int64_t offsets[NT + 1];
    const int64_t C = comm_chunk_ref(comm_offsets_ref(k_numel, NT, offsets), g_n);
    for (i = 0; i < NT; ++i) {
        const size_t n = (size_t)k_numel[i];
        const int fp8_out = k_out[i] == FP8AMP_DTYPE_E4M3 || k_out[i] == FP8AMP_DTYPE_E5M2;
        const format_t *g = fp8_out ? format_of(k_out[i]) : &FMT_E4M3;
        double **x = malloc(sizeof(double *) * (size_t)g_n), *wire_mean = malloc(sizeof(double) * n);
        double *true_mean = calloc(n, sizeof(double)), *wire_err = calloc(n, sizeof(double));
        float *v = malloc(sizeof(float) * n), *si2s = malloc(sizeof(float) * n), *wsis = malloc(sizeof(float) * n);
        int *seg = malloc(sizeof(int) * n);
        uint8_t *codes = malloc(n);
        const size_t out_bytes = n * fp8amp_dtype_size(k_out[i]);
        unsigned char *got = malloc(out_bytes);
        void *scratch = malloc(n * 4);
        size_t k;
        for (j = 0; j < g_n; ++j) {
            float sij;
            x[j] = malloc(sizeof(double) * n);
            gen_input(j, i, scratch, x[j], &sij);
        }
        /* Wide outputs: one scale per scale region of the bucket; FP8 outputs: one per tensor. */
        comm_segments_ref(offsets[i], n, C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, g, g_n, n, x, average, fp8_out ? NULL : seg, v, codes, si2s, wsis,
                                     wire_mean);
        OK(fp8amp_tensor_copy_to_host(out[i], got, out_bytes));
        check_identical_on_all_ranks(got, out_bytes, label);
        *digest = fnv(got, out_bytes) ^ (*digest * 31);
        if (fp8_out) {
            const float got_si = read_scale_inv(out[i]);
            CHECK(memcmp(got, codes, n) == 0, "%s tensor %d: the codes differ from the model", label, i);
            CHECK(got_si == si2s[0], "%s tensor %d: scale_inv %g, model %g", label, i, got_si, si2s[0]);
            check_identical_on_all_ranks(&got_si, 4, label);
        }
        for (k = 0; k < n; ++k) {
            double y, bound, wire_bound = 0;
            const double m = wire_mean[k];
            const float si2 = si2s[k], wsi = wsis[k];
            for (j = 0; j < g_n; ++j) {
                true_mean[k] += x[j][k];
                /* The wire's rounding of x[j][k]: half a quantum at its scaled magnitude. */
                wire_bound += 0.5 * quantum_ref(&FMT_E4M3, fabs(x[j][k]) / wsi) * wsi;
            }
            if (average) {
                true_mean[k] /= g_n;
                wire_bound /= g_n;
            }
            if (fp8_out) {
                y = mul_f32_ref(decode_ref(g, got[k]), si2);
            } else {
                const double want = comm_wide_ref(k_out[i], g, codes[k], si2);
                y = value_at(k_out[i], got, k);
                CHECK(y == want, "%s tensor %d element %zu: %.9g, model %.9g", label, i, k, y, want);
            }
            CHECK(!isnan(y), "%s tensor %d element %zu is NaN", label, i, k);
            /* One rounding of the output (in its scaled units), float32 slack for the sum and the
             * factor, and for a wide output the rounding into its dtype. */
            bound = 0.5 * quantum_ref(g, fmax(fabs(m), fabs(y)) / si2) * si2 + fabs(m) * ldexp(1.0, -21);
            if (k_out[i] == FP8AMP_DTYPE_BF16) bound += 0.5 * quantum_ref(&FMT_BF16, fabs(y));
            CHECK(fabs(y - m) <= bound, "%s tensor %d element %zu: %.9g vs wire mean %.9g, error %.3g > %.3g", label,
                  i, k, y, m, fabs(y - m), bound);
            CHECK(fabs(y - true_mean[k]) <= bound + wire_bound,
                  "%s tensor %d element %zu: %.9g vs exact mean %.9g, error %.3g > %.3g", label, i, k, y,
                  true_mean[k], fabs(y - true_mean[k]), bound + wire_bound);
        }
        for (j = 0; j < g_n; ++j) free(x[j]);
        free(x);
        free(wire_mean);
        free(true_mean);
        free(wire_err);
        free(v);
        free(si2s);
        free(wsis);
        free(seg);
        free(codes);
        free(got);
        free(scratch);
    }
    for (i = 0; i < NT; ++i) {
        if (out[i] != in[i]) OK(fp8amp_tensor_destroy(out[i]));
        OK(fp8amp_tensor_destroy(in[i]));
        free(mine[i]);
    }
}

/* ---- per-region scales ----------------------------------------------------------------------- */

/* A bucket whose magnitudes fall by 2^5 from one scale region to the next (4 a chunk, N chunks:
 * 2^55 in all for 3 ranks) on every rank: a wide-output tensor spanning several chunks, regions and
 * (with FP8AMP_COMM_PIECE_ELEMENTS) pipeline pieces, a BF16 tensor and an FP8 output across region
 * boundaries. Fresh random data from the shared seed. The bytes equal the model (one agreed scale per
 * region a wide output has elements in, one per tensor for the FP8 output) on every rank, and every
 * element is within one rounding at its segment's scale of the exact mean of the wire values, and
 * within that plus the wire's rounding of the exact mean of the inputs. */
enum { GT = 3 };
static const fp8amp_dtype k_gin[GT] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32};
static const fp8amp_dtype k_gout[GT] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3};

static void gen_region_input(int j, int i, const int64_t *offsets, int64_t C, void *bytes, double *real, int64_t n) {
    uint64_t s = g_seed ^ 0x5EEDF00Dull ^ (0x1000193ull * (uint64_t)(j + 1)) ^ (0x7F4A7C15ull * (uint64_t)(i + 1));
    const int64_t R = comm_region_ref(C);
    int64_t k;
    for (k = 0; k < n; ++k) {
        const int64_t pos = offsets[i] + k, q = (pos / C) * 4 + (pos % C) / R; /* the bucket's region */
        const float x = random_value(&s, 4 - 5 * (int)q, 7 - 5 * (int)q);
        if (k_gin[i] == FP8AMP_DTYPE_BF16) {
            const uint16_t c = (uint16_t)code_of_value_ref(&FMT_BF16, round_ref(&FMT_BF16, x));
            ((uint16_t *)bytes)[k] = c;
            real[k] = decode_ref(&FMT_BF16, c);
        } else {
            ((float *)bytes)[k] = x;
            real[k] = x;
        }
    }
}

static void test_all_reduce_regions(fp8amp_comm comm, int average) {
    uint64_t s = g_seed ^ 0xA11CE5ull;
    int64_t numel[GT], offsets[GT + 1], C;
    fp8amp_tensor in[GT], out[GT];
    fp8amp_comm_reduce_desc desc;
    const char *label = average ? "per-region all-reduce (mean)" : "per-region all-reduce (sum)";
    int i, j;
    numel[0] = 3000 + (int64_t)(splitmix64(&s) % 3000);
    numel[1] = 200 + (int64_t)(splitmix64(&s) % 600);
    numel[2] = 500 + (int64_t)(splitmix64(&s) % 1500);
    C = comm_chunk_ref(comm_offsets_ref(numel, GT, offsets), g_n);
    OK(fp8amp_comm_reduce_desc_init_default(&desc));
    desc.average = average;
    for (i = 0; i < GT; ++i) {
        void *bytes = malloc((size_t)numel[i] * 4);
        double *real = malloc(sizeof(double) * (size_t)numel[i]);
        gen_region_input(g_rank, i, offsets, C, bytes, real, numel[i]);
        OK(fp8amp_tensor_create(g_ctx, k_gin[i], 1, &numel[i], &in[i]));
        OK(fp8amp_tensor_copy_from_host(in[i], bytes, (size_t)numel[i] * fp8amp_dtype_size(k_gin[i])));
        if (k_gout[i] == FP8AMP_DTYPE_E4M3) out[i] = make_fp8(FP8AMP_DTYPE_E4M3, numel[i], NULL, 1.0f);
        else OK(fp8amp_tensor_create(g_ctx, k_gout[i], 1, &numel[i], &out[i]));
        free(bytes);
        free(real);
    }
    OK(fp8amp_comm_all_reduce(comm, GT, in, out, &desc));
    for (i = 0; i < GT; ++i) {
        const size_t n = (size_t)numel[i], out_bytes = n * fp8amp_dtype_size(k_gout[i]);
        const int fp8_out = k_gout[i] == FP8AMP_DTYPE_E4M3;
        double **x = malloc(sizeof(double *) * (size_t)g_n), *wire_mean = malloc(sizeof(double) * n);
        float *v = malloc(sizeof(float) * n), *si2s = malloc(sizeof(float) * n), *wsis = malloc(sizeof(float) * n);
        int *seg = malloc(sizeof(int) * n);
        uint8_t *codes = malloc(n);
        unsigned char *got = malloc(out_bytes);
        void *scratch = malloc(n * 4);
        size_t k;
        int bad = 0;
        for (j = 0; j < g_n; ++j) {
            x[j] = malloc(sizeof(double) * n);
            gen_region_input(j, i, offsets, C, scratch, x[j], numel[i]);
        }
        comm_segments_ref(offsets[i], n, C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, &FMT_E4M3, g_n, n, x, average, fp8_out ? NULL : seg, v, codes, si2s,
                                     wsis, wire_mean);
        if (i == 0) CHECK(seg[n - 1] > seg[0], "%s tensor %d: in one region only (the test's premise)", label, i);
        OK(fp8amp_tensor_copy_to_host(out[i], got, out_bytes));
        check_identical_on_all_ranks(got, out_bytes, label);
        if (fp8_out) {
            const float got_si = read_scale_inv(out[i]);
            CHECK(memcmp(got, codes, n) == 0, "%s tensor %d: the codes differ from the model", label, i);
            CHECK(got_si == si2s[0], "%s tensor %d: scale_inv %g, model %g", label, i, got_si, si2s[0]);
        }
        for (k = 0; k < n && bad < 5; ++k) {
            const double m = wire_mean[k];
            double y, bound, true_mean = 0, wire_bound = 0;
            for (j = 0; j < g_n; ++j) {
                true_mean += x[j][k];
                wire_bound += 0.5 * quantum_ref(&FMT_E4M3, fabs(x[j][k]) / wsis[k]) * wsis[k];
            }
            if (average) {
                true_mean /= g_n;
                wire_bound /= g_n;
            }
            if (fp8_out) {
                y = mul_f32_ref(decode_ref(&FMT_E4M3, got[k]), si2s[k]);
            } else {
                const double want = comm_wide_ref(k_gout[i], &FMT_E4M3, codes[k], si2s[k]);
                y = value_at(k_gout[i], got, k);
                if (y != want) ++bad;
                CHECK(y == want, "%s tensor %d element %zu: %.9g, model %.9g", label, i, k, y, want);
            }
            bound = 0.5 * quantum_ref(&FMT_E4M3, fmax(fabs(m), fabs(y)) / si2s[k]) * si2s[k] + fabs(m) * ldexp(1.0, -21);
            if (k_gout[i] == FP8AMP_DTYPE_BF16) bound += 0.5 * quantum_ref(&FMT_BF16, fabs(y));
            if (fabs(y - m) > bound || fabs(y - true_mean) > bound + wire_bound) ++bad;
            CHECK(fabs(y - m) <= bound, "%s tensor %d element %zu: %.9g vs wire mean %.9g, error %.3g > %.3g", label,
                  i, k, y, m, fabs(y - m), bound);
            CHECK(fabs(y - true_mean) <= bound + wire_bound,
                  "%s tensor %d element %zu: %.9g vs exact mean %.9g, error %.3g > %.3g", label, i, k, y, true_mean,
                  fabs(y - true_mean), bound + wire_bound);
        }
        for (j = 0; j < g_n; ++j) free(x[j]);
        free(x);
        free(wire_mean);
        free(v);
        free(si2s);
        free(wsis);
        free(seg);
        free(codes);
        free(got);
        free(scratch);
    }
    for (i = 0; i < GT; ++i) {
        OK(fp8amp_tensor_destroy(in[i]));
        OK(fp8amp_tensor_destroy(out[i]));
    }
}

/* ---- a bucket of many small tensors ---------------------------------------------------------- */

/* Hundreds of small tensors (1..40 elements, F32 in; F32 out, every third BF16): with one pipeline
 * piece (the CPU's default, and the GPU's for a bucket this small) the first piece holds more scale
 * segments than the check's exchange carries beside it (kCheckWords - kCheckHeadWords = 240), so
 * their amaxes get an agreement of their own after the check; with pieces of 48 elements (the
 * "pieces" variants) the first piece's few segments travel in the check's exchange. Either way the
 * bytes equal the model's on every rank. Then the same bucket less its last tensor on one rank, and
 * a rank that refuses its desc: refused on every rank (the exchange has one size, so neither hangs). */
static void test_all_reduce_many(fp8amp_comm comm) {
    uint64_t s = g_seed ^ 0x3A4E1ull;
    const int nt = 300 + (int)(splitmix64(&s) % 61);
    int64_t *numel = malloc(sizeof(int64_t) * (size_t)nt), *offsets = malloc(sizeof(int64_t) * (size_t)(nt + 1));
    fp8amp_tensor *in = malloc(sizeof(fp8amp_tensor) * (size_t)nt), *out = malloc(sizeof(fp8amp_tensor) * (size_t)nt);
    fp8amp_dtype *od = malloc(sizeof(fp8amp_dtype) * (size_t)nt);
    const char *label = "all-reduce of many small tensors";
    fp8amp_comm_reduce_desc desc;
    int64_t C;
    int i, j, bad = 0;
    for (i = 0; i < nt; ++i) {
        numel[i] = 1 + (int64_t)(splitmix64(&s) % 40);
        od[i] = i % 3 == 2 ? FP8AMP_DTYPE_BF16 : FP8AMP_DTYPE_F32;
    }
    C = comm_chunk_ref(comm_offsets_ref(numel, nt, offsets), g_n);
    /* Rank j's inputs: fresh random values from the shared seed, magnitudes 2^-6..2^6 by tensor. */
    float **x = malloc(sizeof(float *) * (size_t)g_n);
    for (j = 0; j < g_n; ++j) {
        uint64_t sj = g_seed ^ (0x51A11ull * (uint64_t)(j + 1));
        x[j] = malloc(sizeof(float) * (size_t)offsets[nt]);
        for (i = 0; i < nt; ++i) {
            const int e = (int)(i % 13) - 6;
            int64_t k;
            for (k = 0; k < numel[i]; ++k) x[j][offsets[i] + k] = random_value(&sj, e - 3, e);
        }
    }
    for (i = 0; i < nt; ++i) {
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &numel[i], &in[i]));
        OK(fp8amp_tensor_copy_from_host(in[i], x[g_rank] + offsets[i], sizeof(float) * (size_t)numel[i]));
        OK(fp8amp_tensor_create(g_ctx, od[i], 1, &numel[i], &out[i]));
    }
    OK(fp8amp_comm_reduce_desc_init_default(&desc));
    OK(fp8amp_comm_all_reduce(comm, nt, in, out, &desc));
    for (i = 0; i < nt && bad < 5; ++i) {
        const size_t n = (size_t)numel[i], out_bytes = n * fp8amp_dtype_size(od[i]);
        double **xd = malloc(sizeof(double *) * (size_t)g_n), *wire_mean = malloc(sizeof(double) * n);
        float *v = malloc(sizeof(float) * n), *si2s = malloc(sizeof(float) * n), *wsis = malloc(sizeof(float) * n);
        int *seg = malloc(sizeof(int) * n);
        uint8_t *codes = malloc(n);
        unsigned char *got = malloc(out_bytes);
        size_t k;
        for (j = 0; j < g_n; ++j) {
            xd[j] = malloc(sizeof(double) * n);
            for (k = 0; k < n; ++k) xd[j][k] = x[j][offsets[i] + (int64_t)k];
        }
        comm_segments_ref(offsets[i], n, C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, &FMT_E4M3, g_n, n, xd, 1, seg, v, codes, si2s, wsis, wire_mean);
        OK(fp8amp_tensor_copy_to_host(out[i], got, out_bytes));
        check_identical_on_all_ranks(got, out_bytes, label);
        for (k = 0; k < n; ++k) {
            const double want = comm_wide_ref(od[i], &FMT_E4M3, codes[k], si2s[k]), y = value_at(od[i], got, k);
            if (y != want) ++bad;
            CHECK(y == want, "%s: tensor %d of %d element %zu: %.9g, model %.9g", label, i, nt, k, y, want);
            CHECK(!isnan(y), "%s: tensor %d element %zu is NaN", label, i, k);
        }
        for (j = 0; j < g_n; ++j) free(xd[j]);
        free(xd);
        free(wire_mean);
        free(v);
        free(si2s);
        free(wsis);
        free(seg);
        free(codes);
        free(got);
    }
    OK(fp8amp_comm_set_timeout(comm, 20.0)); /* a rank left waiting fails with COMM instead of hanging */
    EXPECT(fp8amp_comm_all_reduce(comm, g_rank == g_n - 1 ? nt - 1 : nt, in, out, &desc), FP8AMP_ERROR_SHAPE_MISMATCH);
    if (g_rank == g_n - 1) desc.struct_size = 3;
    EXPECT(fp8amp_comm_all_reduce(comm, nt, in, out, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
    OK(fp8amp_comm_set_timeout(comm, 300.0));
    for (i = 0; i < nt; ++i) {
        OK(fp8amp_tensor_destroy(in[i]));
        OK(fp8amp_tensor_destroy(out[i]));
    }
    for (j = 0; j < g_n; ++j) free(x[j]);
    free(x);
    free(numel);
    free(offsets);
    free(in);
    free(out);
    free(od);
}

/* A refused call counts no saturations, though its first quantization may have run before the
 * verdict (docs/communicator.md, "Bad input"): every rank's input holds an inf in every chunk's first
 * piece (amax inf, so scale 1, so the inf saturates wherever it is quantized); one rank passes a
 * longer tensor, so every rank refuses, and the count stays. The same call with equal shapes counts. */
static void test_refused_counts_nothing(fp8amp_comm comm) {
    uint64_t s = g_seed ^ 0x5A7ull, before = 0, after = 0;
    const int64_t n = 64 * g_n, n_odd = g_rank == g_n - 1 ? n + 16 : n;
    fp8amp_tensor a, out;
    float *host = malloc(sizeof(float) * (size_t)(n + 16));
    int64_t k;
    for (k = 0; k < n + 16; ++k) host[k] = random_value(&s, -4, 4);
    for (k = 0; k < n + 16; k += 16) host[k] = INFINITY;
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n_odd, &a));
    OK(fp8amp_tensor_copy_from_host(a, host, sizeof(float) * (size_t)n_odd));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n_odd, &out));
    OK(fp8amp_comm_get_saturated(comm, &before));
    OK(fp8amp_comm_set_timeout(comm, 20.0));
    EXPECT(fp8amp_comm_all_reduce(comm, 1, &a, &out, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
    OK(fp8amp_comm_set_timeout(comm, 300.0));
    OK(fp8amp_comm_get_saturated(comm, &after));
    CHECK(after == before, "a refused call counted %llu saturations", (unsigned long long)(after - before));
    OK(fp8amp_tensor_destroy(a));
    OK(fp8amp_tensor_destroy(out));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &a));
    OK(fp8amp_tensor_copy_from_host(a, host, sizeof(float) * (size_t)n));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &out));
    OK(fp8amp_comm_all_reduce(comm, 1, &a, &out, NULL));
    OK(fp8amp_comm_get_saturated(comm, &after));
    CHECK(after > before, "the saturating call counted nothing");
    OK(fp8amp_tensor_destroy(a));
    OK(fp8amp_tensor_destroy(out));
    free(host);
}

/* ---- reduce-scatter and all-gather ----------------------------------------------------------- */

static void test_reduce_scatter(fp8amp_comm comm) {
    const int64_t k = 513, total = k * g_n;
    fp8amp_tensor in, out32, out8;
    double **x = malloc(sizeof(double *) * (size_t)g_n);
    float *mine = malloc(sizeof(float) * (size_t)total), *got32 = malloc(sizeof(float) * (size_t)k);
    uint8_t *got8 = malloc((size_t)k);
    int j;
    int64_t e;
    for (j = 0; j < g_n; ++j) {
        uint64_t s = g_seed ^ 0xABCDEFull ^ ((uint64_t)j << 40);
        x[j] = malloc(sizeof(double) * (size_t)total);
        for (e = 0; e < total; ++e) {
            const float v = random_value(&s, -10, -2);
            x[j][e] = v;
            if (j == g_rank) mine[e] = v;
        }
    }
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &total, &in));
    OK(fp8amp_tensor_copy_from_host(in, mine, sizeof(float) * (size_t)total));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &k, &out32));
    out8 = make_fp8(FP8AMP_DTYPE_E4M3, k, NULL, 1.0f);
    OK(fp8amp_comm_reduce_scatter(comm, in, out32, NULL));
    OK(fp8amp_comm_reduce_scatter(comm, in, out8, NULL));
    OK(fp8amp_tensor_copy_to_host(out32, got32, sizeof(float) * (size_t)k));
    OK(fp8amp_tensor_copy_to_host(out8, got8, (size_t)k));
    {
        /* The model: the wire scale comes from the whole input (all ranks), the F32 shard is the
         * reduced value; the E4M3 shard is requantized with its own shard's amax. */
        double amax = 0, amax2 = 0;
        float s, si, f, s2, si2;
        for (j = 0; j < g_n; ++j)
            for (e = 0; e < total; ++e) amax = fmax(amax, fabs(x[j][e]));
        s = scale_ref(448, 0, 0, amax, 1.0f);
        si = reciprocal_ref(s);
        f = si / (float)g_n;
        float *v = malloc(sizeof(float) * (size_t)k);
        for (e = 0; e < k; ++e) {
            float acc = 0;
            double exact = 0, wire_bound = 0;
            for (j = 0; j < g_n; ++j) {
                const double xv = x[j][g_rank * k + e];
                const double w = decode_ref(&FMT_E4M3, encode_scaled_ref(&FMT_E4M3, mul_f32_ref(xv, s)));
                acc = acc + (float)w;
                exact += xv;
                wire_bound += 0.5 * quantum_ref(&FMT_E4M3, fabs(xv) * s) * si;
            }
            v[e] = acc * f;
            amax2 = fmax(amax2, fabs((double)v[e]));
            CHECK(got32[e] == v[e], "reduce-scatter F32 element %lld: %.9g, model %.9g", (long long)e, got32[e], v[e]);
            CHECK(fabs(got32[e] - exact / g_n) <= wire_bound / g_n + fabs(exact) * ldexp(1.0, -21),
                  "reduce-scatter F32 element %lld: error %.3g", (long long)e, fabs(got32[e] - exact / g_n));
        }
        s2 = scale_ref(448, 0, 0, amax2, 1.0f);
        si2 = reciprocal_ref(s2);
        CHECK(read_scale_inv(out8) == si2, "reduce-scatter E4M3: scale_inv %g, model %g", read_scale_inv(out8), si2);
        for (e = 0; e < k; ++e) {
            const uint8_t want = (uint8_t)encode_scaled_ref(&FMT_E4M3, mul_f32_ref(v[e], s2));
            CHECK(got8[e] == want, "reduce-scatter E4M3 element %lld: code 0x%02x, model 0x%02x", (long long)e, got8[e],
                  want);
        }
        free(v);
    }
    /* All-gather the E4M3 shards with their per-shard scale_inv. */
    {
        const int64_t n = (int64_t)g_n;
        fp8amp_tensor gathered, scales;
        uint8_t *all = malloc((size_t)total);
        float *all_si = malloc(sizeof(float) * (size_t)g_n), my_si = read_scale_inv(out8);
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_E4M3, 1, &total, &gathered));
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &scales));
        OK(fp8amp_comm_all_gather(comm, out8, gathered, scales, NULL));
        OK(fp8amp_tensor_copy_to_host(gathered, all, (size_t)total));
        OK(fp8amp_tensor_copy_to_host(scales, all_si, sizeof(float) * (size_t)g_n));
        CHECK(memcmp(all + g_rank * k, got8, (size_t)k) == 0, "all-gather: this rank's shard differs");
        CHECK(all_si[g_rank] == my_si, "all-gather: this rank's scale_inv differs");
        {
            /* Every rank's shard, as the others hold it. */
            uint8_t *ref = malloc((size_t)total);
            float *ref_si = malloc(sizeof(float) * (size_t)g_n);
            CH(rank_channel_allgather(got8, (size_t)k, ref));
            CH(rank_channel_allgather(&my_si, sizeof my_si, ref_si));
            CHECK(memcmp(all, ref, (size_t)total) == 0, "all-gather: codes differ from the side channel's");
            CHECK(memcmp(all_si, ref_si, sizeof(float) * (size_t)g_n) == 0, "all-gather: scale_inv differ");
            free(ref);
            free(ref_si);
        }
        /* Wide dtypes travel as they are; FP8 without output_scale_inv is refused on every rank. */
        {
            fp8amp_tensor g32;
            float *all32 = malloc(sizeof(float) * (size_t)total);
            OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &total, &g32));
            OK(fp8amp_comm_all_gather(comm, out32, g32, NULL, NULL));
            OK(fp8amp_tensor_copy_to_host(g32, all32, sizeof(float) * (size_t)total));
            CHECK(memcmp(all32 + g_rank * k, got32, sizeof(float) * (size_t)k) == 0, "all-gather F32: own shard");
            EXPECT(fp8amp_comm_all_gather(comm, out8, gathered, NULL, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
            OK(fp8amp_tensor_destroy(g32));
            free(all32);
        }
        OK(fp8amp_tensor_destroy(gathered));
        OK(fp8amp_tensor_destroy(scales));
        free(all);
        free(all_si);
    }
    for (j = 0; j < g_n; ++j) free(x[j]);
    free(x);
    free(mine);
    free(got32);
    free(got8);
    OK(fp8amp_tensor_destroy(in));
    OK(fp8amp_tensor_destroy(out32));
    OK(fp8amp_tensor_destroy(out8));
}

/* ---- mismatched calls: refused on every rank ------------------------------------------------- */

static void test_mismatch(fp8amp_comm comm) {
    const int odd = g_rank == g_n - 1; /* the rank that differs */
    const int64_t n = 64, n_odd = odd ? 65 : 64;
    fp8amp_tensor a, b, out_a, out_b;
    float host[65], before[65], after[65];
    int i;
    fp8amp_comm_reduce_desc desc;
    for (i = 0; i < 65; ++i) host[i] = (float)(i + 1) * (g_rank + 1) * 0.01f;
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &a));
    OK(fp8amp_tensor_copy_from_host(a, host, sizeof(float) * 64));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n_odd, &b));
    OK(fp8amp_tensor_copy_from_host(b, host, sizeof(float) * (size_t)n_odd));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &out_a));
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n_odd, &out_b));
    for (i = 0; i < 65; ++i) before[i] = -1.0f - i;
    OK(fp8amp_tensor_copy_from_host(out_a, before, sizeof(float) * 64));
    OK(fp8amp_tensor_copy_from_host(out_b, before, sizeof(float) * (size_t)n_odd));
    {
        /* A shape that differs on one rank. */
        fp8amp_tensor ins[2] = {a, b}, outs[2] = {out_a, out_b};
        EXPECT(fp8amp_comm_all_reduce(comm, 2, ins, outs, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
        /* A count that differs. */
        EXPECT(fp8amp_comm_all_reduce(comm, odd ? 1 : 2, ins, outs, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
        /* A desc that only one rank gets wrong: its own refusal, heard by the others (a short
         * timeout, so that a rank left waiting fails the test with COMM instead of hanging it). */
        OK(fp8amp_comm_set_timeout(comm, 20.0));
        OK(fp8amp_comm_reduce_desc_init_default(&desc));
        if (odd) desc.struct_size = 3;
        EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
        OK(fp8amp_comm_set_timeout(comm, 300.0));
        /* Options that differ. */
        OK(fp8amp_comm_reduce_desc_init_default(&desc));
        if (odd) desc.wire_dtype = FP8AMP_DTYPE_E5M2;
        EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
        /* A pipeline piece that differs (FP8AMP_COMM_PIECE_ELEMENTS, read at each call, set on one
         * rank only): it changes how many transfers the call makes, so it is agreed like an option.
         * Every rank's piece here is the whole 32-element chunk (or 48 under the pieces ctest) but
         * the odd rank's 16. */
        {
            const char *env = getenv("FP8AMP_COMM_PIECE_ELEMENTS");
            char *saved = env ? strdup(env) : NULL;
            OK(fp8amp_comm_set_timeout(comm, 20.0));
            if (odd) setenv("FP8AMP_COMM_PIECE_ELEMENTS", "16", 1);
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
            CHECK(strstr(fp8amp_last_error_message(), "FP8AMP_COMM_PIECE_ELEMENTS") != NULL, "message: %s",
                  fp8amp_last_error_message());
            if (saved) setenv("FP8AMP_COMM_PIECE_ELEMENTS", saved, 1);
            else unsetenv("FP8AMP_COMM_PIECE_ELEMENTS");
            free(saved);
            OK(fp8amp_comm_set_timeout(comm, 300.0));
        }
        /* A taper that differs (FP8AMP_COMM_PIECE_TAPER, read at each call, set on one rank only): the
         * first and last pieces' length, so the number and bounds of the pieces, so agreed like the
         * piece. In pieces of 16 elements on every rank, so that the taper could change the schedule
         * on the even ranks (5: edges of 16, the default 3 or a set value; the odd rank's 1: equal
         * pieces -- the same here, since 16 / D rounds up to 16, but agreed all the same). */
        {
            const char *env = getenv("FP8AMP_COMM_PIECE_TAPER"), *penv = getenv("FP8AMP_COMM_PIECE_ELEMENTS");
            char *saved = env ? strdup(env) : NULL, *psaved = penv ? strdup(penv) : NULL;
            OK(fp8amp_comm_set_timeout(comm, 20.0));
            setenv("FP8AMP_COMM_PIECE_ELEMENTS", "16", 1);
            setenv("FP8AMP_COMM_PIECE_TAPER", odd ? "1" : "5", 1);
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
            CHECK(strstr(fp8amp_last_error_message(), "FP8AMP_COMM_PIECE_TAPER") != NULL, "message: %s",
                  fp8amp_last_error_message());
            if (saved) setenv("FP8AMP_COMM_PIECE_TAPER", saved, 1);
            else unsetenv("FP8AMP_COMM_PIECE_TAPER");
            if (psaved) setenv("FP8AMP_COMM_PIECE_ELEMENTS", psaved, 1);
            else unsetenv("FP8AMP_COMM_PIECE_ELEMENTS");
            free(saved);
            free(psaved);
            OK(fp8amp_comm_set_timeout(comm, 300.0));
        }
        /* The reduce-scatter half's exchange (FP8AMP_COMM_EXCHANGE, read at each call) set on one rank
         * only: with two ranks it changes the transport operations (one all-gather a piece or grouped
         * sends and receives), so it is agreed like an option; with more ranks there is one way (and
         * a successful call here would change the outputs that later checks compare). */
        if (g_n == 2) {
            const char *env = getenv("FP8AMP_COMM_EXCHANGE");
            char *saved = env ? strdup(env) : NULL;
            const int sendrecv = env && strcmp(env, "sendrecv") == 0;
            OK(fp8amp_comm_set_timeout(comm, 20.0));
            if (odd) setenv("FP8AMP_COMM_EXCHANGE", sendrecv ? "auto" : "sendrecv", 1);
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
            CHECK(strstr(fp8amp_last_error_message(), "FP8AMP_COMM_EXCHANGE") != NULL, "message: %s",
                  fp8amp_last_error_message());
            if (saved) setenv("FP8AMP_COMM_EXCHANGE", saved, 1);
            else unsetenv("FP8AMP_COMM_EXCHANGE");
            free(saved);
            OK(fp8amp_comm_set_timeout(comm, 300.0));
        }
    }
    {
        /* A dtype that differs. */
        fp8amp_tensor h;
        const int64_t n64 = 64;
        OK(fp8amp_tensor_create(g_ctx, odd ? FP8AMP_DTYPE_BF16 : FP8AMP_DTYPE_F32, 1, &n64, &h));
        OK(fp8amp_cast(g_ctx, a, h));
        {
            fp8amp_tensor ins[1] = {h}, outs[1] = {out_a};
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL), FP8AMP_ERROR_DTYPE_MISMATCH);
        }
        OK(fp8amp_tensor_destroy(h));
    }
    {
        /* One rank's own refusal (a destroyed handle; a wrong shape): the others fail too. */
        fp8amp_tensor dead;
        const int64_t n64 = 64;
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n64, &dead));
        OK(fp8amp_tensor_destroy(dead));
        {
            fp8amp_tensor ins[1] = {odd ? dead : a}, outs[1] = {out_a};
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL),
                   odd ? FP8AMP_ERROR_INVALID_HANDLE : FP8AMP_ERROR_INVALID_ARGUMENT);
        }
        {
            fp8amp_tensor ins[1] = {a}, outs[1] = {odd ? out_b : out_a};
            EXPECT(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL),
                   odd ? FP8AMP_ERROR_SHAPE_MISMATCH : FP8AMP_ERROR_INVALID_ARGUMENT);
        }
        {
            /* Well-formed on the other ranks: nranks * 64 elements against 64. */
            fp8amp_tensor big;
            const int64_t nbig = 64 * (int64_t)g_n;
            float *zeros = calloc((size_t)nbig, sizeof(float)), *big_after = malloc(sizeof(float) * (size_t)nbig);
            OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &nbig, &big));
            OK(fp8amp_tensor_copy_from_host(big, zeros, sizeof(float) * (size_t)nbig));
            EXPECT(fp8amp_comm_reduce_scatter(comm, odd ? dead : big, out_a, NULL),
                   odd ? FP8AMP_ERROR_INVALID_HANDLE : FP8AMP_ERROR_INVALID_ARGUMENT);
            EXPECT(fp8amp_comm_all_gather(comm, odd ? dead : a, big, NULL, NULL),
                   odd ? FP8AMP_ERROR_INVALID_HANDLE : FP8AMP_ERROR_INVALID_ARGUMENT);
            /* An all-gather whose sizes differ on one rank. */
            EXPECT(fp8amp_comm_all_gather(comm, odd ? b : a, odd ? out_b : big, NULL, NULL),
                   odd ? FP8AMP_ERROR_SHAPE_MISMATCH : FP8AMP_ERROR_INVALID_ARGUMENT);
            OK(fp8amp_tensor_copy_to_host(big, big_after, sizeof(float) * (size_t)nbig));
            CHECK(memcmp(zeros, big_after, sizeof(float) * (size_t)nbig) == 0, "a refused all-gather changed its output");
            OK(fp8amp_tensor_destroy(big));
            free(zeros);
            free(big_after);
        }
    }
    /* Nothing was written, and the communicator still works. */
    OK(fp8amp_tensor_copy_to_host(out_a, after, sizeof(float) * 64));
    CHECK(memcmp(before, after, sizeof(float) * 64) == 0, "a refused call changed out_a");
    OK(fp8amp_tensor_copy_to_host(out_b, after, sizeof(float) * (size_t)n_odd));
    CHECK(memcmp(before, after, sizeof(float) * (size_t)n_odd) == 0, "a refused call changed out_b");
    {
        fp8amp_tensor ins[1] = {a}, outs[1] = {out_a};
        OK(fp8amp_comm_all_reduce(comm, 1, ins, outs, NULL));
    }
    {
        /* A bucket smaller than the number of ranks (one element: some ranks' chunks are padding
         * only), with and without the check: the same bytes on every rank, the mean (N + 1) / 2 of
         * the values rank + 1 within the wire's rounding of each value plus one E4M3 rounding at the
         * scale used: the agreed wire scale s = 448 / N (the mean is requantized with it). */
        const int64_t one = 1;
        fp8amp_tensor t1, o1, o2;
        const float v = (float)(g_rank + 1);
        float r1 = 0, r2 = 0;
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &one, &t1));
        OK(fp8amp_tensor_copy_from_host(t1, &v, 4));
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &one, &o1));
        OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &one, &o2));
        OK(fp8amp_comm_all_reduce(comm, 1, &t1, &o1, NULL));
        OK(fp8amp_comm_reduce_desc_init_default(&desc));
        desc.check = 0;
        OK(fp8amp_comm_all_reduce(comm, 1, &t1, &o2, &desc));
        OK(fp8amp_tensor_copy_to_host(o1, &r1, 4));
        OK(fp8amp_tensor_copy_to_host(o2, &r2, 4));
        CHECK(r1 == r2, "check = 0 gave %.9g, check = 1 %.9g", r2, r1);
        check_identical_on_all_ranks(&r1, 4, "one-element bucket");
        {
            const double mean = (g_n + 1) / 2.0;
            const float s = scale_ref(448.0, 0, 0, (double)g_n, 1.0f);
            double bound = 0.5 * quantum_ref(&FMT_E4M3, mean * s) / s;
            int j;
            for (j = 0; j < g_n; ++j) bound += 0.5 * quantum_ref(&FMT_E4M3, (j + 1) * (double)s) / s / g_n;
            CHECK(fabs(r1 - mean) <= bound * 1.0001, "one-element mean %.9g, exact %.9g, error %.3g > %.3g", r1, mean,
                  fabs(r1 - mean), bound);
        }
        OK(fp8amp_tensor_destroy(t1));
        OK(fp8amp_tensor_destroy(o1));
        OK(fp8amp_tensor_destroy(o2));
    }
    OK(fp8amp_tensor_destroy(a));
    OK(fp8amp_tensor_destroy(b));
    OK(fp8amp_tensor_destroy(out_a));
    OK(fp8amp_tensor_destroy(out_b));
}

/* ---- a rank that stops taking part ----------------------------------------------------------- */

static void *abort_later(void *comm) {
    sleep(1);
    if (fp8amp_comm_abort((fp8amp_comm)comm) != FP8AMP_SUCCESS) ++g_failures;
    return NULL;
}

/* A watchdog thread aborts a waiting operation (long timeout) of `watched`: COMM after about 1 s,
 * saying why. */
static void expect_watchdog_abort(fp8amp_comm watched, fp8amp_tensor t) {
    const double t0 = now_s();
    pthread_t dog;
    OK(fp8amp_comm_set_timeout(watched, 120.0));
    CHECK(pthread_create(&dog, NULL, abort_later, watched) == 0, "pthread_create");
    EXPECT(fp8amp_comm_all_reduce(watched, 1, &t, &t, NULL), FP8AMP_ERROR_COMM);
    pthread_join(dog, NULL);
    CHECK(now_s() - t0 < 10.0, "the abort took %.2f s to interrupt the wait", now_s() - t0);
    CHECK(strstr(fp8amp_last_error_message(), "fp8amp_comm_abort") != NULL, "message: %s",
          fp8amp_last_error_message());
}

static void test_lost_rank(void) {
    const double timeout = 2.0;
    const int lost = g_rank == g_n - 1;
    fp8amp_comm watched = make_comm(), comm = make_comm();
    const int64_t n = 4096;
    fp8amp_tensor t;
    float *host = malloc(sizeof(float) * (size_t)n);
    int64_t e;
    for (e = 0; e < n; ++e) host[e] = 0.5f + (float)e;
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &t));
    OK(fp8amp_tensor_copy_from_host(t, host, sizeof(float) * (size_t)n));
    OK(fp8amp_comm_set_timeout(comm, timeout));
    EXPECT(fp8amp_comm_set_timeout(comm, 0.0), FP8AMP_ERROR_INVALID_ARGUMENT);
    if (lost) {
        /* Gone, as far as the others can tell: it never calls (on either communicator). */
        sleep(3 * (unsigned)timeout);
        OK(fp8amp_comm_abort(comm));
        OK(fp8amp_comm_abort(watched));
        EXPECT(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL), FP8AMP_ERROR_COMM);
    } else {
        double t0;
        float *after = malloc(sizeof(float) * (size_t)n);
        expect_watchdog_abort(watched, t);
        t0 = now_s();
        EXPECT(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL), FP8AMP_ERROR_COMM);
        const double waited = now_s() - t0;
        CHECK(waited >= timeout * 0.9 && waited < timeout + 5.0, "failed after %.2f s, timeout %.1f s", waited, timeout);
        CHECK(strstr(fp8amp_last_error_message(), "timed out") != NULL, "message: %s", fp8amp_last_error_message());
        /* Failed for good: the next call fails at once, and the tensor is unchanged. */
        EXPECT(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL), FP8AMP_ERROR_COMM);
        OK(fp8amp_tensor_copy_to_host(t, after, sizeof(float) * (size_t)n));
        CHECK(memcmp(after, host, sizeof(float) * (size_t)n) == 0, "a failed call changed its tensor");
        free(after);
    }
    OK(fp8amp_comm_destroy(comm));
    OK(fp8amp_comm_destroy(watched));
    OK(fp8amp_tensor_destroy(t));
    free(host);
}

/* The same on GPUs (NCCL): operations are enqueued, so only the cross-rank check waits on the host
 * (docs/communicator.md, "A rank that dies"). Every rank first reduces once on both communicators
 * (NCCL connects its peers lazily, in the host part of the first operation, which the timeout cannot
 * cover); then the last rank stops taking part: the others' check must fail with FP8AMP_ERROR_NCCL
 * "timed out" after the timeout (2 s) and well before 30 s, and a watchdog's fp8amp_comm_abort must
 * interrupt a waiting check (long timeout) with FP8AMP_ERROR_COMM within 10 s; either way the
 * context's stream must drain (the communicator was aborted: ncclCommAbort stops its kernels), so
 * that copying the tensor back returns, and the tensor is unchanged. bindings/python/tests/
 * test_torch_comm.py::test_nccl_timeout_two_ranks checks the same through PyTorch. */
static void test_lost_rank_nccl(void) {
    const double timeout = 2.0;
    const int lost = g_rank == g_n - 1;
    fp8amp_comm watched = make_comm(), comm = make_comm();
    const int64_t n = 4096;
    fp8amp_tensor t;
    float *host = malloc(sizeof(float) * (size_t)n), *after = malloc(sizeof(float) * (size_t)n);
    int64_t e;
    for (e = 0; e < n; ++e) host[e] = 0.5f + (float)e;
    OK(fp8amp_tensor_create(g_ctx, FP8AMP_DTYPE_F32, 1, &n, &t));
    OK(fp8amp_tensor_copy_from_host(t, host, sizeof(float) * (size_t)n));
    OK(fp8amp_comm_all_reduce(watched, 1, &t, &t, NULL));
    OK(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL));
    OK(fp8amp_tensor_copy_to_host(t, host, sizeof(float) * (size_t)n)); /* what a failed call must keep */
    CH(rank_channel_barrier());
    if (!lost) {
        double t0;
        expect_watchdog_abort(watched, t);
        OK(fp8amp_comm_set_timeout(comm, timeout));
        t0 = now_s();
        EXPECT(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL), FP8AMP_ERROR_NCCL);
        {
            const double waited = now_s() - t0;
            CHECK(waited >= timeout * 0.9 && waited < 30.0, "failed after %.2f s, timeout %.1f s", waited, timeout);
        }
        CHECK(strstr(fp8amp_last_error_message(), "timed out") != NULL, "message: %s", fp8amp_last_error_message());
        EXPECT(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL), FP8AMP_ERROR_COMM); /* failed for good */
        /* The stream drains (a hang here: the abort did not stop NCCL's kernels). */
        OK(fp8amp_tensor_copy_to_host(t, after, sizeof(float) * (size_t)n));
        CHECK(memcmp(after, host, sizeof(float) * (size_t)n) == 0, "a failed call changed its tensor");
    }
    CH(rank_channel_barrier()); /* the silent rank waits here while the others time out */
    OK(fp8amp_comm_abort(comm)); /* the peers are gone: neither teardown may wait for the other */
    OK(fp8amp_comm_abort(watched));
    OK(fp8amp_comm_destroy(comm));
    OK(fp8amp_comm_destroy(watched));
    OK(fp8amp_tensor_destroy(t));
    free(host);
    free(after);
}

int main(int argc, char **argv) {
    fp8amp_device device = {FP8AMP_DEVICE_CPU, 0};
    const char *want = getenv("FP8AMP_TEST_COMM_DEVICE");
    int cuda = want && strcmp(want, "cuda") == 0;
    fp8amp_comm comm, adopted, late;
    uint64_t digest_created = 0, digest_adopted = 1;
    uint64_t total;
    /* Line by line, so that a rank stopped by the launcher (another failed) has said how far it got. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rank_channel_init(&argc, &argv) != 0) {
        fprintf(stderr, TEST_NAME ": %s\n", rank_channel_error());
        return 1;
    }
    g_rank = rank_channel_rank();
    g_n = rank_channel_size();
#ifndef FP8AMP_TEST_CHANNEL_MPI
    if (!cuda) {
        if (g_rank == 0)
            fprintf(stderr, TEST_NAME ": needs FP8AMP_TEST_COMM_DEVICE=cuda: this build has no MPI, and a CPU "
                            "communicator of more than one rank runs on MPI (test_comm_mpi under mpirun checks "
                            "the CPU)\n");
        return 1;
    }
#endif
    g_seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (getenv("FP8AMP_TEST_SEED")) g_seed = strtoull(getenv("FP8AMP_TEST_SEED"), NULL, 0);
    CH(rank_channel_bcast(&g_seed, sizeof g_seed, 0));
    if (g_rank == 0)
        printf(TEST_NAME ": %d ranks, side channel %s, seed FP8AMP_TEST_SEED=%llu\n", g_n, rank_channel_name(),
               (unsigned long long)g_seed);
    if (cuda) {
        int32_t gpus = 0;
        OK(fp8amp_device_count(FP8AMP_DEVICE_CUDA, &gpus));
        if (gpus < g_n) { /* NCCL refuses two ranks on one GPU */
            if (g_rank == 0) printf(TEST_NAME ": FP8AMP_TEST_COMM_DEVICE=cuda needs %d GPUs, %d seen: SKIPPED\n", g_n, gpus);
            CH(rank_channel_finalize());
            return 77;
        }
        device.type = FP8AMP_DEVICE_CUDA;
        device.index = g_rank % gpus;
    }
    if (g_rank == 0) printf(TEST_NAME ": on %s\n", cuda ? "CUDA (NCCL)" : "the CPU (MPI)");
#ifndef FP8AMP_TEST_CHANNEL_MPI
    if (g_rank == 0)
        printf(TEST_NAME ": side channel of files, no MPI: the MPI-only parts (an adopted MPI_Comm, the "
                         "CPU communicator) are left out\n");
#endif
    OK(fp8amp_context_create(device, &g_ctx));

    comm = make_comm();
    {
        int32_t r = -1, n = -1;
        OK(fp8amp_comm_rank(comm, &r));
        OK(fp8amp_comm_size(comm, &n));
        CHECK(r == g_rank && n == g_n, "rank %d size %d", r, n);
    }
    if (!cuda) {
        /* More ranks than the MPI world holds: refused on every rank, nothing made. */
        fp8amp_comm_unique_id id;
        fp8amp_comm none = NULL;
        if (g_rank == 0) OK(fp8amp_comm_unique_id_create(g_ctx, &id));
        CH(rank_channel_bcast(&id, sizeof id, 0));
        EXPECT(fp8amp_comm_create(g_ctx, &id, g_n + 1, g_rank, &none), FP8AMP_ERROR_NOT_SUPPORTED);
        CHECK(none == NULL, "a refused create wrote its output");
    }
    test_all_reduce_on(comm, "all-reduce (mean)", 1, &digest_created);
    {
        uint64_t d;
        test_all_reduce_on(comm, "all-reduce (sum)", 0, &d);
    }
    done("the bucket all-reduce (mean, sum)");
    test_all_reduce_regions(comm, 1);
    test_all_reduce_regions(comm, 0);
    done("per-region scales (mean, sum)");
    test_all_reduce_many(comm);
    done("a bucket of many small tensors");
#ifdef FP8AMP_TEST_CHANNEL_MPI
    if (!cuda) {
        /* The same call through an adopted MPI_Comm: the same bytes. */
        MPI_Comm world = MPI_COMM_WORLD;
        OK(fp8amp_comm_adopt(g_ctx, &world, &adopted));
        test_all_reduce_on(adopted, "all-reduce (adopted MPI_Comm)", 1, &digest_adopted);
        CHECK(digest_created == digest_adopted, "the adopted communicator gave other bytes");
        OK(fp8amp_comm_destroy(adopted));
    }
#else
    (void)adopted;
    (void)digest_adopted;
#endif
    test_reduce_scatter(comm);
    done("reduce-scatter and all-gather");
    test_mismatch(comm);
    done("mismatched calls");
    {
        uint64_t sat = 1;
        OK(fp8amp_comm_get_saturated(comm, &sat));
        CHECK(sat == 0, "%llu elements saturated", (unsigned long long)sat);
    }
    test_refused_counts_nothing(comm);
    done("a refused call counts no saturations");
    OK(fp8amp_comm_destroy(comm));
    if (!cuda) test_lost_rank();
    else test_lost_rank_nccl(); /* only the check waits on the host (docs/communicator.md) */
    late = make_comm(); /* destroyed after MPI_Finalize, below */

    OK(fp8amp_context_destroy(g_ctx));
    total = (uint64_t)g_failures;
    CH(rank_channel_allreduce_u64(&total, 1, RANK_CHANNEL_SUM));
    if (g_rank == 0) printf(TEST_NAME ": %d ranks, %llu failed checks\n", g_n, (unsigned long long)total);
    CH(rank_channel_finalize()); /* MPI_Finalize for test_comm_mpi */
    /* After MPI_Finalize a communicator can still be destroyed: it must not call MPI any more (Open
     * MPI aborts the process on MPI_Comm_free after finalization). */
    if (fp8amp_comm_destroy(late) != FP8AMP_SUCCESS) {
        fprintf(stderr, "[rank %d] fp8amp_comm_destroy after MPI_Finalize: %s\n", g_rank, fp8amp_last_error_message());
        total += 1;
    }
    return total == 0 ? 0 : 1;
}
