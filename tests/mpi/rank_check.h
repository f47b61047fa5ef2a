/* The multi-rank tests' checks (test_comm_mpi.c, test_optimizer_shard.c, test_rank_channel.c): a
 * failed check prints the rank, the place and a message to stderr and counts a failure, so that a
 * rank goes on and every rank reaches the collectives the others wait in; the test reports the count
 * at its end. The including file defines `static int g_rank, g_failures;` and includes
 * rank_channel.h (CH) and, for EXPECT / OK, fp8amp/fp8amp.h. */
#ifndef FP8AMP_TESTS_RANK_CHECK_H
#define FP8AMP_TESTS_RANK_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                               \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: ", g_rank, __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                              \
            fputc('\n', stderr);                                                                       \
            ++g_failures;                                                                              \
        }                                                                                              \
    } while (0)

/* A call of the library that must return `expected`. */
#define EXPECT(call, expected)                                                                         \
    do {                                                                                               \
        const fp8amp_status st_ = (call);                                                              \
        CHECK(st_ == (expected), "%s returned %s, expected %s: %s", #call, fp8amp_status_name(st_),    \
              fp8amp_status_name(expected), fp8amp_last_error_message());                             \
    } while (0)
#define OK(call) EXPECT(call, FP8AMP_SUCCESS)

/* The side channel failed (a rank is gone, or timed out) outside the cases that expect it: nothing
 * further can be checked. */
#define CH(call)                                                                                       \
    do {                                                                                               \
        if ((call) != 0) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: %s failed: %s\n", g_rank, __FILE__, __LINE__, #call,      \
                    rank_channel_error());                                                             \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

#endif
