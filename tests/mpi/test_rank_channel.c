/* The tests' side channel (rank_channel.h) checked on its own, on the CPU, so that the GPU tests that
 * rely on it (test_comm_ranks through run_ranks.sh) rest on something tested here and in CI.
 *
 *   test_rank_channel [rounds]   (default 200) every round, with fresh random data: a bcast from a
 *       rotating root of a random length (0 included), an allreduce_u64 MIN, MAX and SUM of a random
 *       count of full-range values, an allgather of a random length, now and then a barrier. Every
 *       rank regenerates every rank's data from the shared seed and the round, so it checks each
 *       result against what it computes itself. The file channel also: a call that differs on one
 *       rank (another length; another collective) fails on every rank with the same message, and the
 *       channel still works after it.
 *   test_rank_channel --missing  (file channel) the last rank never takes part: the others must fail
 *       with the timeout message naming it, after FP8AMP_TEST_CHANNEL_TIMEOUT seconds (the ctest sets
 *       2) and well before twice that, and every later call must fail at once. Never a hang.
 *
 * Built twice: against the file channel (ctest channel.files.np3 and channel.files.missing.np3
 * through run_ranks.sh, no MPI) and, where MPI is found, against MPI (channel.mpi.np3, mpirun). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rank_channel.h"
#include "rank_check.h"

static int g_rank, g_n, g_failures;

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The random stream of (seed, round, what, rank): every rank can regenerate any rank's. */
static uint64_t stream(uint64_t seed, int round, int what, int rank) {
    uint64_t s = seed ^ ((uint64_t)round * 0xD1B54A32D192ED03ull) ^ ((uint64_t)(what + 1) << 56) ^
                 ((uint64_t)(rank + 7) * 0x8CB92BA72F3D8DD7ull);
    splitmix64(&s);
    return s;
}

static void fill(uint64_t s, unsigned char *p, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) p[i] = (unsigned char)(splitmix64(&s) >> 24);
}

/* A full-range value, now and then a small one or an extreme, so that MIN and MAX see ties and ends. */
static uint64_t value(uint64_t *s) {
    const uint64_t v = splitmix64(s);
    switch (v & 7) {
    case 0: return 0;
    case 1: return UINT64_MAX;
    case 2: return (v >> 3) & 15;
    default: return v;
    }
}

static void round_of(uint64_t seed, int round) {
    uint64_t shape = stream(seed, round, 0, -1);
    const int root = (int)(splitmix64(&shape) % (uint64_t)g_n);
    const size_t bcast_len = (splitmix64(&shape) % 5 == 0) ? 0 : (size_t)(splitmix64(&shape) % 3000);
    const size_t count = 1 + (size_t)(splitmix64(&shape) % 64);
    const size_t gather_len = (splitmix64(&shape) % 7 == 0) ? 0 : (size_t)(splitmix64(&shape) % 2000);
    unsigned char *buf = malloc(bcast_len + 1), *want = malloc(bcast_len + 1);
    uint64_t *v = malloc(8 * count), *want_min = malloc(8 * count), *want_max = malloc(8 * count),
             *want_sum = malloc(8 * count);
    unsigned char *mine = malloc(gather_len + 1), *all = malloc(gather_len * (size_t)g_n + 1),
                  *want_all = malloc(gather_len * (size_t)g_n + 1);
    size_t k;
    int j, op;

    /* bcast: the root's bytes replace what the others held (their own random bytes). */
    fill(stream(seed, round, 1, root), want, bcast_len);
    fill(stream(seed, round, 2, g_rank), buf, bcast_len);
    if (g_rank == root) memcpy(buf, want, bcast_len);
    CH(rank_channel_bcast(buf, bcast_len, root));
    CHECK(memcmp(buf, want, bcast_len) == 0, "round %d: bcast of %zu bytes from root %d: other bytes", round,
          bcast_len, root);

    /* allreduce MIN, MAX and SUM (wrapping) of every rank's values. */
    for (j = 0; j < g_n; ++j) {
        uint64_t s = stream(seed, round, 3, j);
        for (k = 0; k < count; ++k) {
            const uint64_t x = value(&s);
            want_min[k] = j == 0 || x < want_min[k] ? x : want_min[k];
            want_max[k] = j == 0 || x > want_max[k] ? x : want_max[k];
            want_sum[k] = j == 0 ? x : want_sum[k] + x;
        }
    }
    for (op = 0; op < 3; ++op) {
        const rank_channel_op o = op == 0 ? RANK_CHANNEL_MIN : op == 1 ? RANK_CHANNEL_MAX : RANK_CHANNEL_SUM;
        const uint64_t *w = op == 0 ? want_min : op == 1 ? want_max : want_sum;
        uint64_t s = stream(seed, round, 3, g_rank);
        for (k = 0; k < count; ++k) v[k] = value(&s);
        CH(rank_channel_allreduce_u64(v, count, o));
        for (k = 0; k < count; ++k)
            CHECK(v[k] == w[k], "round %d: allreduce %s of %zu values, element %zu: %llu, expected %llu", round,
                  op == 0 ? "min" : op == 1 ? "max" : "sum", count, k, (unsigned long long)v[k],
                  (unsigned long long)w[k]);
    }

    /* allgather: every rank's bytes in rank order. */
    for (j = 0; j < g_n; ++j) fill(stream(seed, round, 4, j), want_all + (size_t)j * gather_len, gather_len);
    fill(stream(seed, round, 4, g_rank), mine, gather_len);
    memset(all, 0xA5, gather_len * (size_t)g_n);
    CH(rank_channel_allgather(mine, gather_len, all));
    CHECK(memcmp(all, want_all, gather_len * (size_t)g_n) == 0, "round %d: allgather of %zu bytes: other bytes",
          round, gather_len);

    if (round % 10 == 3) CH(rank_channel_barrier());
    free(buf);
    free(want);
    free(v);
    free(want_min);
    free(want_max);
    free(want_sum);
    free(mine);
    free(all);
    free(want_all);
}

#ifdef FP8AMP_TEST_CHANNEL_FILES
/* Calls that differ on one rank: every rank fails with the same message, then the channel goes on. */
static void mismatches(void) {
    const int odd = g_rank == g_n - 1;
    unsigned char buf[16] = {1, 2, 3};
    unsigned char *all = malloc(16 * (size_t)g_n);
    uint64_t v[2] = {1, 2};
    int i;
    if (g_n < 2) return;
    for (i = 0; i < 2; ++i) {
        int rc;
        if (i == 0) /* another length on one rank */
            rc = rank_channel_bcast(buf, odd ? 16 : 8, 0);
        else /* another collective on one rank */
            rc = odd ? rank_channel_allreduce_u64(v, 2, RANK_CHANNEL_MAX) : rank_channel_allgather(buf, 16, all);
        CHECK(rc != 0, "mismatch %d: the call succeeded", i);
        CHECK(strstr(rank_channel_error(), "does not match across ranks") != NULL, "mismatch %d: message: %s", i,
              rank_channel_error());
        {
            /* The same message on every rank (after the "on rank r" prefix): its digest's MIN and MAX
             * over the ranks agree. A successful call leaves rank_channel_error() as it was. */
            const char *m = strstr(rank_channel_error(), "collective #");
            uint64_t h = 1469598103934665603ull, lo, hi;
            for (; m && *m; ++m) h = (h ^ (unsigned char)*m) * 1099511628211ull;
            lo = hi = h;
            CH(rank_channel_allreduce_u64(&lo, 1, RANK_CHANNEL_MIN));
            CH(rank_channel_allreduce_u64(&hi, 1, RANK_CHANNEL_MAX));
            CHECK(lo == hi, "mismatch %d: the ranks' messages differ (this rank's: %s)", i, rank_channel_error());
        }
    }
    if (g_rank == 0) printf("test_rank_channel: mismatched calls refused on every rank alike: %s\n", rank_channel_error());
    free(all);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int missing(void) {
    const char *t = getenv("FP8AMP_TEST_CHANNEL_TIMEOUT");
    const double timeout = t ? atof(t) : 120.0, t0 = now_s();
    char expect[64], message[1024];
    double waited;
    if (g_n < 2) {
        fprintf(stderr, "test_rank_channel --missing needs at least 2 ranks\n");
        return 1;
    }
    if (g_rank == g_n - 1) {
        printf("test_rank_channel: rank %d leaves without taking part\n", g_rank);
        return 0;
    }
    CHECK(rank_channel_barrier() != 0, "a barrier without rank %d succeeded", g_n - 1);
    waited = now_s() - t0;
    snprintf(message, sizeof message, "%s", rank_channel_error());
    CHECK(strstr(rank_channel_error(), "timed out") != NULL, "message: %s", rank_channel_error());
    snprintf(expect, sizeof expect, "rank(s) %d ", g_n - 1);
    CHECK(strstr(rank_channel_error(), expect) != NULL, "the message does not name rank %d: %s", g_n - 1,
          rank_channel_error());
    CHECK(waited >= timeout * 0.95 && waited < 2 * timeout + 3, "failed after %.2f s, timeout %g s", waited, timeout);
    {
        /* Failed for good: the next call fails at once. */
        const double t1 = now_s();
        uint64_t v = 1;
        CHECK(rank_channel_allreduce_u64(&v, 1, RANK_CHANNEL_SUM) != 0, "a call after the timeout succeeded");
        CHECK(now_s() - t1 < 0.5, "a call after the timeout waited %.2f s", now_s() - t1);
        CHECK(strstr(rank_channel_error(), "failed earlier") != NULL, "message: %s", rank_channel_error());
    }
    if (g_rank == 0) printf("test_rank_channel: after %.2f s: %s\n", waited, message);
    if (g_failures) fprintf(stderr, "[rank %d] %d failed checks\n", g_rank, g_failures);
    return g_failures ? 1 : 0;
}
#endif

int main(int argc, char **argv) {
    int rounds = 200, round;
    uint64_t seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid(), total;
    /* Line by line, so that a rank stopped by the launcher (another failed) has said how far it got. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rank_channel_init(&argc, &argv) != 0) {
        fprintf(stderr, "test_rank_channel: %s\n", rank_channel_error());
        return 1;
    }
    g_rank = rank_channel_rank();
    g_n = rank_channel_size();
#ifdef FP8AMP_TEST_CHANNEL_FILES
    if (argc > 1 && strcmp(argv[1], "--missing") == 0) return missing();
#endif
    if (argc > 1) rounds = atoi(argv[1]);
    if (getenv("FP8AMP_TEST_SEED")) seed = strtoull(getenv("FP8AMP_TEST_SEED"), NULL, 0);
    CH(rank_channel_bcast(&seed, sizeof seed, 0));
    if (g_rank == 0)
        printf("test_rank_channel: %s channel, %d ranks, %d rounds, seed FP8AMP_TEST_SEED=%llu\n", rank_channel_name(),
               g_n, rounds, (unsigned long long)seed);
    {
        /* The seed itself, as every rank received it. */
        uint64_t *seeds = malloc(8 * (size_t)g_n);
        int j;
        CH(rank_channel_allgather(&seed, 8, seeds));
        for (j = 0; j < g_n; ++j) CHECK(seeds[j] == seed, "rank %d holds seed %llu", j, (unsigned long long)seeds[j]);
        free(seeds);
    }
    for (round = 0; round < rounds; ++round) round_of(seed, round);
#ifdef FP8AMP_TEST_CHANNEL_FILES
    mismatches();
    round_of(seed, rounds); /* and the channel still works */
#endif
    total = (uint64_t)g_failures;
    CH(rank_channel_allreduce_u64(&total, 1, RANK_CHANNEL_SUM));
    if (g_rank == 0) printf("test_rank_channel: %d ranks, %llu failed checks\n", g_n, (unsigned long long)total);
    CH(rank_channel_finalize());
    return total == 0 ? 0 : 1;
}
