/* rank_channel.h over MPI_COMM_WORLD: what test_comm_mpi did inline before the channel existed. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>

#include "rank_channel.h"

static int g_rank, g_size;
static char g_error[512];

static int fail(int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
    snprintf(g_error, sizeof g_error, "rank_channel (MPI) %s on rank %d of %d: %s", what, g_rank, g_size, text);
    return -1;
}

static int too_big(size_t bytes, const char *what) {
    snprintf(g_error, sizeof g_error, "rank_channel (MPI) %s: %zu bytes is more than MPI's int count", what, bytes);
    return -1;
}

int rank_channel_init(int *argc, char ***argv) {
    int rc = MPI_Init(argc, argv);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Init");
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    return 0;
}

int rank_channel_rank(void) { return g_rank; }
int rank_channel_size(void) { return g_size; }
const char *rank_channel_name(void) { return "MPI"; }
const char *rank_channel_error(void) { return g_error; }

int rank_channel_bcast(void *buf, size_t bytes, int root) {
    int rc;
    if (bytes > INT_MAX) return too_big(bytes, "bcast");
    rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Bcast");
}

int rank_channel_allreduce_u64(uint64_t *values, size_t count, rank_channel_op op) {
    const MPI_Op mop = op == RANK_CHANNEL_MIN ? MPI_MIN : op == RANK_CHANNEL_MAX ? MPI_MAX : MPI_SUM;
    int rc;
    if (count > INT_MAX) return too_big(count * 8, "allreduce");
    rc = MPI_Allreduce(MPI_IN_PLACE, values, (int)count, MPI_UINT64_T, mop, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Allreduce");
}

int rank_channel_allgather(const void *mine, size_t bytes, void *all) {
    int rc;
    if (bytes > INT_MAX) return too_big(bytes, "allgather");
    rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Allgather");
}

int rank_channel_barrier(void) {
    const int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Barrier");
}

int rank_channel_finalize(void) {
    const int rc = MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Finalize");
}
