// The MPI transport (CPU tensors). Built when CMake finds MPI (FP8AMP_MPI, cmake/comm.cmake);
// without it, the stubs at the end say why.
//
// Failures never hang and never abort the process: the communicator is a duplicate with the
// MPI_ERRORS_RETURN handler, so an MPI error comes back as a code (turned into COMM with
// MPI_Error_string's message), and every operation is non-blocking (MPI_Isend/Irecv/Iallreduce),
// completed by polling MPI_Testall against a deadline (fp8amp_comm_set_timeout, default 300 s). A
// peer that died or stopped taking part makes the operation fail with COMM when the deadline passes.
// After a failure the transport is failed: its requests may still be pending in MPI, so the buffers
// they name (the communicator's scratch) are never freed, and later calls fail at once.
#include "comm_transport.hpp"
#include "error.hpp"

#include <cstring>
#include <random>

#if FP8AMP_HAVE_MPI
#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#endif

namespace fp8amp::kernels {

namespace {
constexpr char kMpiIdTag[16] = "fp8amp-mpi-id1";
}

// Without MPI too: a one-rank CPU communicator needs an id but no MPI.
void check_cpu_unique_id(const fp8amp_comm_unique_id &id) {
    if (std::memcmp(id.internal, kMpiIdTag, sizeof kMpiIdTag) != 0)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "id was not made by fp8amp_comm_unique_id_create for a CPU context");
}

void mpi_unique_id(fp8amp_comm_unique_id *id) {
    fp8amp_comm_unique_id out{};
    std::memcpy(out.internal, kMpiIdTag, sizeof kMpiIdTag);
    std::random_device rd;
    for (size_t i = sizeof kMpiIdTag; i < sizeof kMpiIdTag + 16; ++i) out.internal[i] = static_cast<char>(rd());
    *id = out;
}


#if FP8AMP_HAVE_MPI
namespace {

// MPI was initialized here: finalize it when the process exits (Open MPI's launcher reports a
// process that exits without MPI_Finalize as failed).
bool g_we_initialized = false;
void finalize_at_exit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

std::string mpi_message(int code) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<size_t>(len));
}

void ensure_initialized() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) fail(FP8AMP_ERROR_NOT_SUPPORTED, "MPI was already finalized in this process");
    if (initialized) return;
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) fail(FP8AMP_ERROR_COMM, "MPI_Init_thread failed: " + mpi_message(rc));
    g_we_initialized = true;
    std::atexit(finalize_at_exit);
}

// FNV-1a over bytes: the id check.
uint64_t fnv1a(const void *data, size_t n, uint64_t h = 1469598103934665603ull) {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

class MpiTransport final : public Transport {
public:
    explicit MpiTransport(MPI_Comm comm) : comm_(comm) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &nranks_);
    }
    int rank() const override { return rank_; }
    int nranks() const override { return nranks_; }
    const char *name() const override { return "MPI"; }

    void allreduce_max_u32(uint32_t *buf, size_t count, void *) override {
        check_alive();
        if (count > static_cast<size_t>(INT_MAX)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "too many values to all-reduce");
        MPI_Request req;
        call(MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_UINT32_T, MPI_MAX, comm_, &req),
             "MPI_Iallreduce");
        requests_.push_back(req);
        wait("MPI_Iallreduce (max)");
    }
    void group_start() override {
        check_alive();
        requests_.clear();
    }
    void send(const void *buf, size_t nbytes, int peer, void *) override {
        for_pieces(nbytes, [&](size_t off, int len) {
            MPI_Request req;
            call(MPI_Isend(static_cast<const char *>(buf) + off, len, MPI_BYTE, peer, kTag, comm_, &req), "MPI_Isend");
            requests_.push_back(req);
        });
    }
    void recv(void *buf, size_t nbytes, int peer, void *) override {
        for_pieces(nbytes, [&](size_t off, int len) {
            MPI_Request req;
            call(MPI_Irecv(static_cast<char *>(buf) + off, len, MPI_BYTE, peer, kTag, comm_, &req), "MPI_Irecv");
            requests_.push_back(req);
        });
    }
    void group_end(void *) override { wait("the exchange (MPI_Isend/MPI_Irecv)"); }
    // One MPI_Iallgather (MPI_IN_PLACE when send is this rank's block of recv), completed by polling
    // like every other operation; blocks beyond MPI's int count are moved pairwise instead.
    void all_gather(const void *send_buf, void *recv_buf, size_t nbytes, void *stream) override {
        char *out = static_cast<char *>(recv_buf);
        char *mine = out + static_cast<size_t>(rank_) * nbytes;
        if (nbytes <= kPiece) {
            check_alive();
            requests_.clear();
            MPI_Request req;
            const int count = static_cast<int>(nbytes);
            call(MPI_Iallgather(send_buf == mine ? MPI_IN_PLACE : send_buf, count, MPI_BYTE, out, count, MPI_BYTE,
                                comm_, &req),
                 "MPI_Iallgather");
            requests_.push_back(req);
            wait("MPI_Iallgather");
            return;
        }
        group_start();
        for (int p = 0; p < nranks_; ++p) {
            if (p == rank_) continue;
            send(send_buf, nbytes, p, stream);
            recv(out + static_cast<size_t>(p) * nbytes, nbytes, p, stream);
        }
        group_end(stream);
        if (send_buf != mine && nbytes) std::memmove(mine, send_buf, nbytes);
    }
    // The communicator's memory is host memory: the words move by memcpy, and allreduce_max_u32 has
    // completed (against the timeout) before fetch_words.
    void put_words(uint32_t *dst, const uint32_t *src, size_t n, void *) override {
        check_alive();
        std::memcpy(dst, src, n * sizeof(uint32_t));
    }
    void fetch_words(const uint32_t *src, size_t n, void *) override {
        check_alive();
        fetched_.assign(src, src + n);
    }
    void fetched_words(uint32_t *dst, size_t n, void *, const char *) override {
        check_alive();
        if (fetched_.size() != n) fail(FP8AMP_ERROR_INTERNAL, "MPI transport: fetched_words without its fetch_words");
        std::memcpy(dst, fetched_.data(), n * sizeof(uint32_t));
        fetched_.clear();
    }
    void set_timeout(double seconds) override { timeout_s_ = seconds; }
    bool failed() const override { return aborted_.load() || !failure_.empty(); }
    // May come from another thread (a watchdog) while an operation waits: it only raises the flag,
    // which the waiting loop reads, and calls no MPI.
    void abort() override { aborted_.store(true); }
    void destroy() override {
        // A healthy communicator is freed (collective in MPI's terms: every rank destroys it); a
        // failed one may have requests pending on it and is left to MPI_Finalize.
        // After MPI_Finalize (a communicator left to the handle registry's teardown at exit), MPI
        // may not be called at all.
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (failure_.empty() && !finalized) MPI_Comm_free(&comm_);
    }

private:
    static constexpr int kTag = 0x0f8a;
    static constexpr size_t kPiece = size_t{1} << 30;  // MPI counts are int: send in pieces of 1 GiB

    template <class F>
    void for_pieces(size_t nbytes, F &&f) {
        for (size_t off = 0; off < nbytes; off += kPiece) f(off, static_cast<int>(std::min(kPiece, nbytes - off)));
    }
    void check_alive() const {
        if (aborted_.load()) fail(FP8AMP_ERROR_COMM, "the communicator was aborted (fp8amp_comm_abort): destroy it");
        if (!failure_.empty()) fail(FP8AMP_ERROR_COMM, "the communicator failed earlier: " + failure_ + "; destroy it");
    }
    void call(int rc, const char *what) {
        if (rc == MPI_SUCCESS) return;
        failure_ = std::string(what) + " failed on rank " + std::to_string(rank_) + ": " + mpi_message(rc);
        fail(FP8AMP_ERROR_COMM, failure_);
    }
    // Completes requests_ by polling, or fails when the deadline passes (a peer gone).
    void wait(const char *what) {
        using clock = std::chrono::steady_clock;
        const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s_);
        std::vector<MPI_Status> statuses(requests_.size());
        for (long spins = 0;; ++spins) {
            int done = 0;
            const int rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, statuses.data());
            if (rc != MPI_SUCCESS) {
                std::string msg = mpi_message(rc);
                if (rc == MPI_ERR_IN_STATUS)
                    for (const MPI_Status &s : statuses)
                        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
                            msg = mpi_message(s.MPI_ERROR);
                            break;
                        }
                requests_.clear();
                failure_ = std::string(what) + " failed on rank " + std::to_string(rank_) + ": " + msg;
                fail(FP8AMP_ERROR_COMM, failure_);
            }
            if (done) {
                requests_.clear();
                return;
            }
            if (aborted_.load()) {
                requests_.clear();
                failure_ = std::string(what) + " was interrupted by fp8amp_comm_abort on rank " + std::to_string(rank_);
                fail(FP8AMP_ERROR_COMM, failure_);
            }
            if (clock::now() > deadline) {
                requests_.clear();
                failure_ = std::string(what) + " timed out after " + std::to_string(timeout_s_) + " s on rank " +
                           std::to_string(rank_) + " of " + std::to_string(nranks_) +
                           ": a peer died or stopped taking part (fp8amp_comm_set_timeout sets the limit)";
                fail(FP8AMP_ERROR_COMM, failure_);
            }
            // Spin briefly for latency, then yield the core (ranks often outnumber cores).
            if (spins > 2000) {
                const timespec ts{0, 50000};
                nanosleep(&ts, nullptr);
            } else {
                sched_yield();
            }
        }
    }

    MPI_Comm comm_;
    int rank_ = 0, nranks_ = 1;
    double timeout_s_ = 300.0;
    std::vector<MPI_Request> requests_;
    std::vector<uint32_t> fetched_;  // fetch_words until fetched_words
    std::string failure_;  // written and read by the thread that uses the communicator
    std::atomic<bool> aborted_{false};
};

std::unique_ptr<Transport> from_dup(MPI_Comm dup) {
    const int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) fail(FP8AMP_ERROR_COMM, "MPI_Comm_set_errhandler failed: " + mpi_message(rc));
    return std::make_unique<MpiTransport>(dup);
}

}  // namespace

bool mpi_available(std::string *) { return true; }

std::unique_ptr<Transport> make_mpi_transport(const fp8amp_comm_unique_id &id, int nranks, int rank) {
    check_cpu_unique_id(id);
    ensure_initialized();
    // Errors during the setup come back as codes too.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != nranks)
        fail(FP8AMP_ERROR_NOT_SUPPORTED,
             "nranks is " + std::to_string(nranks) + " but MPI_COMM_WORLD has " + std::to_string(world) +
                 " processes: fp8amp_comm_create spans the whole world; for a subset, make an MPI_Comm with "
                 "MPI_Comm_split and fp8amp_comm_adopt it");
    MPI_Comm ordered;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &ordered);
    if (rc != MPI_SUCCESS) fail(FP8AMP_ERROR_COMM, "MPI_Comm_split failed: " + mpi_message(rc));
    auto t = from_dup(ordered);
    auto *mpi = static_cast<MpiTransport *>(t.get());
    // Each rank passed a distinct rank exactly when the split put it there; and the ids must match.
    // One agreement over both, so that every rank refuses alike.
    const uint64_t sig = fnv1a(id.internal, sizeof id.internal, static_cast<uint64_t>(nranks));
    bool same_id = false;
    std::vector<uint32_t> words(Transport::agree_words(1));  // host memory: MPI's own
    const bool misplaced = mpi->agree(&sig, 1, mpi->rank() != rank, &same_id, words.data(), nullptr);
    if (!same_id || misplaced) {
        t->destroy();
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             !same_id ? "the ranks passed different ids or nranks to fp8amp_comm_create"
                      : "two ranks passed the same rank to fp8amp_comm_create (each must pass its own, 0..nranks-1)");
    }
    return t;
}

std::unique_ptr<Transport> adopt_mpi_transport(const void *mpi_comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "native: MPI is not initialized, so it cannot be an MPI_Comm");
    MPI_Comm dup;
    const int rc = MPI_Comm_dup(*static_cast<const MPI_Comm *>(mpi_comm), &dup);
    if (rc != MPI_SUCCESS) fail(FP8AMP_ERROR_COMM, "MPI_Comm_dup failed: " + mpi_message(rc));
    return from_dup(dup);
}

#else  // no MPI in this build

namespace {
const char *kNoMpi =
    "this library was built without MPI, so a CPU communicator of more than one rank is not available "
    "(install libopenmpi-dev and configure with -DFP8AMP_MPI=ON)";
}
bool mpi_available(std::string *why) {
    if (why) *why = kNoMpi;
    return false;
}
std::unique_ptr<Transport> make_mpi_transport(const fp8amp_comm_unique_id &, int, int) {
    fail(FP8AMP_ERROR_NOT_SUPPORTED, kNoMpi);
}
std::unique_ptr<Transport> adopt_mpi_transport(const void *) { fail(FP8AMP_ERROR_NOT_SUPPORTED, kNoMpi); }

#endif

}  // namespace fp8amp::kernels
