/* The tests' side channel between ranks: how the multi-rank tests share a seed and a communicator
 * id, and check that every rank holds the same bytes, outside the communicator under test.
 *
 * Two implementations with this one interface, chosen when the test is built:
 *   - rank_channel_mpi.c: MPI_COMM_WORLD (the processes of mpirun);
 *   - rank_channel_files.c: a directory shared by N processes on one machine, for the GPU machines,
 *     which have no MPI. The launcher tests/mpi/run_ranks.sh starts the N processes with
 *       FP8AMP_TEST_RANK         this process's rank, 0 <= r < N
 *       FP8AMP_TEST_NRANKS       N
 *       FP8AMP_TEST_CHANNEL_DIR  an empty directory, fresh for this run
 *       FP8AMP_TEST_CHANNEL_TIMEOUT  seconds a collective waits for the other ranks (default 120)
 *     Each collective has a sequence number s (1, 2, ...): rank r writes its part to "<s>.<r>"
 *     atomically (a temporary name, then rename), then waits until the N files of s exist, reads
 *     them and computes the result itself. Every rank reads every rank's header (the kind of
 *     collective, its sizes, the root), so ranks that call different collectives or sizes all fail
 *     alike with a message, rather than read garbage. A rank deletes its own file of s once it has
 *     seen every file of s + 1 (every rank has then finished reading s). A rank that is missing makes
 *     the others fail after the timeout, naming it; never a hang.
 *
 * Every function returns 0 on success, or -1 with a message in rank_channel_error() (the ranks
 * then should stop: the channel is left failed, and every later call fails at once). */
#ifndef FP8AMP_TEST_RANK_CHANNEL_H
#define FP8AMP_TEST_RANK_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

typedef enum { RANK_CHANNEL_MIN, RANK_CHANNEL_MAX, RANK_CHANNEL_SUM } rank_channel_op;

/* argc/argv go to MPI_Init (the file channel ignores them). */
int rank_channel_init(int *argc, char ***argv);
int rank_channel_rank(void);
int rank_channel_size(void);
/* "MPI" or "files". */
const char *rank_channel_name(void);
/* bytes from root's buf into every rank's buf; every rank passes the same bytes and root. */
int rank_channel_bcast(void *buf, size_t bytes, int root);
/* values[0..count) combined element by element over the ranks, in place (SUM wraps modulo 2^64). */
int rank_channel_allreduce_u64(uint64_t *values, size_t count, rank_channel_op op);
/* all[r * bytes ..] = rank r's mine[0..bytes); every rank passes the same bytes. */
int rank_channel_allgather(const void *mine, size_t bytes, void *all);
int rank_channel_barrier(void);
/* The last call (MPI_Finalize; the file channel removes what it can of its own files). */
int rank_channel_finalize(void);
const char *rank_channel_error(void);

#endif
