/* rank_channel.h through files in a shared directory (no MPI): for the GPU machines, which have
 * none. The protocol is described in rank_channel.h; tests/mpi/run_ranks.sh sets the environment. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rank_channel.h"

enum { KIND_BCAST = 1, KIND_ALLREDUCE, KIND_ALLGATHER, KIND_BARRIER };
static const char *const k_kind_name[] = {"?", "bcast", "allreduce_u64", "allgather", "barrier"};

/* Every file starts with this header; every rank checks every rank's header. */
typedef struct {
    char magic[8];
    uint64_t seq;
    uint32_t rank, nranks;
    uint32_t kind;
    int32_t root;   /* bcast: the root; else -1 */
    uint64_t count; /* bcast, allgather: bytes; allreduce: values */
    uint64_t op;    /* allreduce: rank_channel_op; else 0 */
    uint64_t payload;
} header_t;

static const char k_magic[8] = "FP8RCH1";

static int g_rank = -1, g_size = 0, g_failed = 0;
static uint64_t g_seq = 0; /* of the last collective started */
static double g_timeout = 120.0;
static char g_dir[4096];
static char g_error[1024], g_first[1024]; /* the last error; the one that failed the channel */

static int fail(int permanent, const char *fmt, ...) {
    va_list ap;
    int n = snprintf(g_error, sizeof g_error, "rank_channel (files) on rank %d of %d: ", g_rank, g_size);
    if (n < 0 || (size_t)n >= sizeof g_error) n = 0;
    va_start(ap, fmt);
    vsnprintf(g_error + n, sizeof g_error - (size_t)n, fmt, ap);
    va_end(ap);
    if (permanent && !g_failed) {
        g_failed = 1;
        memcpy(g_first, g_error, sizeof g_first);
    }
    return -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void path_of(char *out, size_t size, uint64_t seq, int rank, int temporary) {
    snprintf(out, size, "%s/%s%llu.%d", g_dir, temporary ? ".tmp." : "", (unsigned long long)seq, rank);
}

static int env_int(const char *name, long lo, long hi, long *out) {
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) return fail(1, "%s is not set: start the ranks with tests/mpi/run_ranks.sh N <exe> [args]", name);
    errno = 0;
    *out = strtol(v, &end, 10);
    if (errno || *end || *out < lo || *out > hi)
        return fail(1, "%s=\"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
    return 0;
}

int rank_channel_init(int *argc, char ***argv) {
    long rank, size;
    const char *dir = getenv("FP8AMP_TEST_CHANNEL_DIR"), *timeout = getenv("FP8AMP_TEST_CHANNEL_TIMEOUT");
    struct stat st;
    char mine[4200];
    (void)argc;
    (void)argv;
    if (env_int("FP8AMP_TEST_NRANKS", 1, 4096, &size)) return -1;
    g_size = (int)size;
    if (env_int("FP8AMP_TEST_RANK", 0, size - 1, &rank)) return -1;
    g_rank = (int)rank;
    if (!dir || !*dir) return fail(1, "FP8AMP_TEST_CHANNEL_DIR is not set: start the ranks with tests/mpi/run_ranks.sh");
    if (strlen(dir) >= sizeof g_dir - 64) return fail(1, "FP8AMP_TEST_CHANNEL_DIR is too long");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fail(1, "FP8AMP_TEST_CHANNEL_DIR=\"%s\" is not a directory", dir);
    strcpy(g_dir, dir);
    if (timeout && *timeout) {
        char *end;
        g_timeout = strtod(timeout, &end);
        if (*end || !(g_timeout > 0) || g_timeout > 1e6)
            return fail(1, "FP8AMP_TEST_CHANNEL_TIMEOUT=\"%s\" is not a number of seconds in (0, 1e6]", timeout);
    }
    /* A directory left from an earlier run would feed this one its old files: refuse it. Before
     * this rank's first file, no other rank can be past collective #1, so any file of a later
     * collective, or this rank's own of #1, is stale. */
    path_of(mine, sizeof mine, 1, g_rank, 0);
    if (access(mine, F_OK) == 0)
        return fail(1, "%s exists already: FP8AMP_TEST_CHANNEL_DIR must be a fresh, empty directory per run", mine);
    {
        DIR *d = opendir(g_dir);
        struct dirent *e;
        if (!d) return fail(1, "cannot list FP8AMP_TEST_CHANNEL_DIR=\"%s\": %s", g_dir, strerror(errno));
        while ((e = readdir(d)) != NULL) {
            unsigned long long seq;
            int r, used = 0;
            if (sscanf(e->d_name, "%llu.%d%n", &seq, &r, &used) == 2 && e->d_name[used] == 0 && seq >= 2) {
                snprintf(mine, sizeof mine, "%s/%s", g_dir, e->d_name);
                closedir(d);
                return fail(1, "%s is left from an earlier run: FP8AMP_TEST_CHANNEL_DIR must be a fresh, empty "
                               "directory per run (run_ranks.sh makes one)", mine);
            }
        }
        closedir(d);
    }
    return 0;
}

int rank_channel_rank(void) { return g_rank; }
int rank_channel_size(void) { return g_size; }
const char *rank_channel_name(void) { return "files"; }
const char *rank_channel_error(void) { return g_error; }

static int write_all(int fd, const void *p, size_t n) {
    const char *b = (const char *)p;
    while (n > 0) {
        const ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads "<seq>.<rank>" whole into *out (malloc'd). 1: read; 0: not there yet; -1: an error. */
static int read_part(uint64_t seq, int rank, unsigned char **out) {
    char path[4200];
    struct stat st;
    unsigned char *buf;
    size_t got = 0;
    int fd;
    path_of(path, sizeof path, seq, rank, 0);
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return fail(1, "cannot open %s: %s", path, strerror(errno));
    }
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(header_t)) {
        close(fd);
        return fail(1, "%s is shorter than its header (written by something else?)", path);
    }
    buf = malloc((size_t)st.st_size);
    if (!buf) {
        close(fd);
        return fail(1, "out of memory reading %s (%lld bytes)", path, (long long)st.st_size);
    }
    while (got < (size_t)st.st_size) {
        const ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            free(buf);
            return fail(1, "cannot read %s: %s", path, r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    {
        const uint64_t want = sizeof(header_t) + ((const header_t *)buf)->payload;
        if (got != want) {
            free(buf);
            return fail(1, "%s holds %zu bytes, its header says %llu (written by something else?)", path, got,
                        (unsigned long long)want);
        }
    }
    *out = buf;
    return 1;
}

static void describe(char *out, size_t size, const header_t *h) {
    const char *kind = h->kind >= 1 && h->kind <= 4 ? k_kind_name[h->kind] : "?";
    if (h->kind == KIND_BCAST)
        snprintf(out, size, "%s(%llu bytes, root %d)", kind, (unsigned long long)h->count, h->root);
    else if (h->kind == KIND_ALLREDUCE)
        snprintf(out, size, "%s(%llu values, %s)", kind, (unsigned long long)h->count,
                 h->op == RANK_CHANNEL_MIN ? "min" : h->op == RANK_CHANNEL_MAX ? "max" : "sum");
    else if (h->kind == KIND_ALLGATHER)
        snprintf(out, size, "%s(%llu bytes)", kind, (unsigned long long)h->count);
    else
        snprintf(out, size, "%s", kind);
}

/* One collective: writes this rank's part, waits for and reads every rank's part into parts[]
 * (each the whole file, header first; the caller frees them with free_parts). */
static int exchange(const header_t *mine, const void *payload, unsigned char **parts) {
    char tmp[4200], path[4200];
    const double t0 = now_s();
    double nap = 20e-6;
    int fd, j, missing;
    if (g_failed) return fail(1, "the channel failed earlier (%s)", g_first);
    /* Write to a temporary name, then rename: a reader sees the whole file or none. */
    path_of(tmp, sizeof tmp, mine->seq, g_rank, 1);
    path_of(path, sizeof path, mine->seq, g_rank, 0);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return fail(1, "cannot create %s: %s", tmp, strerror(errno));
    if (write_all(fd, mine, sizeof *mine) != 0 || write_all(fd, payload, (size_t)mine->payload) != 0) {
        const int e = errno;
        close(fd);
        unlink(tmp);
        return fail(1, "cannot write %s: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return fail(1, "cannot write %s: %s", path, strerror(e));
    }
    for (j = 0; j < g_size; ++j) parts[j] = NULL;
    for (;;) {
        missing = 0;
        for (j = 0; j < g_size; ++j) {
            if (parts[j]) continue;
            const int r = read_part(mine->seq, j, &parts[j]);
            if (r < 0) return -1;
            if (r == 0) ++missing;
        }
        if (!missing) break;
        if (now_s() - t0 > g_timeout) {
            char who[512] = "";
            size_t used = 0;
            char what[128];
            for (j = 0; j < g_size && used < sizeof who - 16; ++j)
                if (!parts[j]) used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "", j);
            describe(what, sizeof what, mine);
            for (j = 0; j < g_size; ++j) free(parts[j]);
            return fail(1,
                        "timed out after %g s waiting for rank(s) %s at collective #%llu (%s) in %s: a rank "
                        "died, hangs, or never started (FP8AMP_TEST_CHANNEL_TIMEOUT sets the wait)",
                        g_timeout, who, (unsigned long long)mine->seq, what, g_dir);
        }
        {
            struct timespec ts;
            ts.tv_sec = 0;
            ts.tv_nsec = (long)(nap * 1e9);
            nanosleep(&ts, NULL);
            if (nap < 1e-3) nap *= 2;
        }
    }
    /* Every rank has written seq, so every rank has finished reading seq - 1: this rank's file of
     * seq - 1 is read by no one any more. */
    if (mine->seq > 1) {
        path_of(path, sizeof path, mine->seq - 1, g_rank, 0);
        unlink(path);
    }
    /* Every rank reads every header, so a mismatch fails every rank alike (and the channel, whose
     * sequence stayed in step, still works). */
    for (j = 0; j < g_size; ++j) {
        const header_t *h = (const header_t *)parts[j];
        char theirs[128], ours[128];
        if (memcmp(h->magic, k_magic, sizeof k_magic) != 0 || h->seq != mine->seq || h->rank != (uint32_t)j ||
            h->nranks != (uint32_t)g_size) {
            int i;
            for (i = 0; i < g_size; ++i) free(parts[i]);
            return fail(1, "the file of rank %d at collective #%llu is not this run's (magic, sequence, rank or "
                           "size differ): is FP8AMP_TEST_CHANNEL_DIR shared with another run?",
                        j, (unsigned long long)mine->seq);
        }
        const header_t *h0 = (const header_t *)parts[0];
        if (h->kind != h0->kind || h->root != h0->root || h->count != h0->count || h->op != h0->op) {
            int i;
            describe(theirs, sizeof theirs, h);
            describe(ours, sizeof ours, h0);
            for (i = 0; i < g_size; ++i) free(parts[i]);
            /* Described against rank 0's call, so every rank prints the same message. */
            return fail(0, "collective #%llu does not match across ranks: rank 0 called %s, rank %d called %s",
                        (unsigned long long)mine->seq, ours, j, theirs);
        }
    }
    return 0;
}

static void free_parts(unsigned char **parts) {
    int j;
    for (j = 0; j < g_size; ++j) free(parts[j]);
    free(parts);
}

static int collective(uint32_t kind, int root, uint64_t count, uint64_t op, const void *payload, uint64_t bytes,
                      unsigned char ***parts_out) {
    header_t h;
    unsigned char **parts;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, k_magic, sizeof k_magic);
    h.seq = ++g_seq;
    h.rank = (uint32_t)g_rank;
    h.nranks = (uint32_t)g_size;
    h.kind = kind;
    h.root = root;
    h.count = count;
    h.op = op;
    h.payload = bytes;
    if (g_size <= 0) return fail(1, "rank_channel_init was not called, or failed");
    parts = calloc((size_t)g_size, sizeof *parts);
    if (!parts) return fail(1, "out of memory");
    if (exchange(&h, payload, parts) != 0) {
        free(parts);
        return -1;
    }
    *parts_out = parts;
    return 0;
}

int rank_channel_bcast(void *buf, size_t bytes, int root) {
    unsigned char **parts;
    if (root < 0 || root >= g_size) return fail(0, "bcast: root %d is not a rank of %d", root, g_size);
    if (collective(KIND_BCAST, root, bytes, 0, buf, g_rank == root ? bytes : 0, &parts) != 0) return -1;
    if (g_rank != root) memcpy(buf, parts[root] + sizeof(header_t), bytes);
    free_parts(parts);
    return 0;
}

int rank_channel_allreduce_u64(uint64_t *values, size_t count, rank_channel_op op) {
    unsigned char **parts;
    size_t k;
    int j;
    if (op != RANK_CHANNEL_MIN && op != RANK_CHANNEL_MAX && op != RANK_CHANNEL_SUM)
        return fail(0, "allreduce_u64: op %d is not MIN, MAX or SUM", (int)op);
    if (collective(KIND_ALLREDUCE, -1, count, (uint64_t)op, values, count * 8, &parts) != 0) return -1;
    /* In rank order, from every rank's file (this rank's own included), so that every rank computes
     * the same result from the same bytes. */
    for (k = 0; k < count; ++k) {
        uint64_t acc = 0;
        for (j = 0; j < g_size; ++j) {
            uint64_t v;
            memcpy(&v, parts[j] + sizeof(header_t) + 8 * k, 8);
            if (j == 0)
                acc = v;
            else if (op == RANK_CHANNEL_MIN)
                acc = v < acc ? v : acc;
            else if (op == RANK_CHANNEL_MAX)
                acc = v > acc ? v : acc;
            else
                acc += v;
        }
        values[k] = acc;
    }
    free_parts(parts);
    return 0;
}

int rank_channel_allgather(const void *mine, size_t bytes, void *all) {
    unsigned char **parts;
    int j;
    if (collective(KIND_ALLGATHER, -1, bytes, 0, mine, bytes, &parts) != 0) return -1;
    for (j = 0; j < g_size; ++j) memcpy((unsigned char *)all + (size_t)j * bytes, parts[j] + sizeof(header_t), bytes);
    free_parts(parts);
    return 0;
}

int rank_channel_barrier(void) {
    unsigned char **parts;
    if (collective(KIND_BARRIER, -1, 0, 0, NULL, 0, &parts) != 0) return -1;
    free_parts(parts);
    return 0;
}

int rank_channel_finalize(void) {
    /* A last barrier deletes this rank's file of the collective before it; the barrier's own files
     * stay (a rank cannot know when the others have read them): run_ranks.sh removes the directory. */
    if (g_failed) return fail(1, "the channel failed earlier (%s)", g_first);
    return rank_channel_barrier();
}
