// The transport of a communicator: the few collective primitives the FP8 algorithm of
// core/communicator.cpp needs, over memory of the communicator's device. Implementations: local (one
// rank, no library), MPI (CPU tensors; kernels/cpu/mpi_transport.cpp) and NCCL (CUDA tensors; kernels/cuda/nccl_transport.cpp).
// Operations are enqueued on `stream` (NCCL) or complete before returning (MPI, local). A failure
// throws fp8amp::Error (COMM for MPI, NCCL for NCCL) and leaves the transport failed: every later
// call throws COMM with the first failure's message.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels {

class Transport {
public:
    virtual ~Transport() = default;
    virtual int rank() const = 0;
    virtual int nranks() const = 0;
    virtual const char *name() const = 0;

    // In-place element-wise max over ranks of count uint32 values (non-negative float bits).
    virtual void allreduce_max_u32(uint32_t *buf, size_t count, void *stream) = 0;
    // Grouped point-to-point: between group_start and group_end, sends and receives are posted and
    // all complete at group_end (ncclGroupStart/End; MPI: Isend/Irecv then one wait).
    virtual void group_start() = 0;
    virtual void send(const void *buf, size_t nbytes, int peer, void *stream) = 0;
    virtual void recv(void *buf, size_t nbytes, int peer, void *stream) = 0;
    virtual void group_end(void *stream) = 0;
    // recv[r * nbytes .. (r+1) * nbytes) = rank r's send; send may be recv + rank * nbytes (in place).
    virtual void all_gather(const void *send, void *recv, size_t nbytes, void *stream) = 0;
    // The all-reduce's own all-gathers (in place, into its registered scratch, on its transfer
    // stream): where the transport has a copy-engine path that accepts them (NCCL with its copy-engine
    // split, FP8AMP_COMM_NCCL_MEMORY=window with NCCL 2.28+), they take it; every other all-gather (the
    // reduce-scatter's exchange, fp8amp_comm_all_gather) stays on all_gather.
    virtual void all_gather_scratch(const void *send, void *recv, size_t nbytes, void *stream) {
        all_gather(send, recv, nbytes, stream);
    }
    // Agreement on k 64-bit signatures and a flag, identical on every rank: same[i] tells whether
    // every rank passed the same sigs[i]; the result whether any rank passed failed. Synchronous: the
    // words go to `scratch` (agree_words(k) words of the communicator's memory: device memory on
    // NCCL, host memory on MPI), are all-reduced there in place by allreduce_max_u32 on `stream`, and
    // come back (put_words, fetch_words, fetched_words). `words` (at least agree_words(k); 0: that
    // many) is the size of the exchange, zeros after the encoding: every rank must pass the same
    // (core/communicator.cpp's checks all exchange kCheckWords; the all-reduce's carries its first
    // amaxes there instead of zeros, with the same encoding).
    bool agree(const uint64_t *sigs, size_t k, bool failed, bool *same, uint32_t *scratch, void *stream,
               size_t words = 0) {
        std::vector<uint32_t> w(std::max(words, agree_words(k)), 0u);
        encode_agreement(sigs, k, failed, w.data());
        put_words(scratch, w.data(), w.size(), stream);
        allreduce_max_u32(scratch, w.size(), stream);
        fetch_words(scratch, agree_words(k), stream);
        fetched_words(w.data(), agree_words(k), stream, "the consistency check");
        return decode_agreement(w.data(), k, same);
    }
    // The encoding: each signature as its two 32-bit halves, then the halves of its complement, then
    // the flag. An element-wise max over the ranks gives max(h) and max(~h) = ~min(h) for every half
    // h, which are equal exactly when every rank's h is; so a signature agrees exactly when both its
    // halves do.
    static size_t agree_words(size_t k) { return 4 * k + 1; }
    static void encode_agreement(const uint64_t *sigs, size_t k, bool failed, uint32_t *words) {
        for (size_t i = 0; i < k; ++i) {
            words[2 * i] = static_cast<uint32_t>(sigs[i] >> 32);
            words[2 * i + 1] = static_cast<uint32_t>(sigs[i]);
            words[2 * k + 2 * i] = ~words[2 * i];
            words[2 * k + 2 * i + 1] = ~words[2 * i + 1];
        }
        words[4 * k] = failed ? 1 : 0;
    }
    static bool decode_agreement(const uint32_t *words, size_t k, bool *same) {
        for (size_t i = 0; i < k; ++i)
            same[i] = words[2 * i] == ~words[2 * k + 2 * i] && words[2 * i + 1] == ~words[2 * k + 2 * i + 1];
        return words[4 * k] != 0;
    }
    // The host side of an agreement, in `stream`'s order: put_words copies n host words into the
    // communicator's memory at dst (on NCCL through pinned memory, so that the host does not block);
    // fetch_words enqueues the copy of n words at src back to the host, and fetched_words waits for it
    // -- as wait() does on NCCL: against the timeout, watching NCCL's asynchronous errors, so that a
    // peer that died fails the call instead of hanging it -- and hands them over. One fetch at a time.
    // MPI completes each operation before returning. Not for one-rank transports (nothing to agree).
    virtual void put_words(uint32_t *dst, const uint32_t *src, size_t n, void *stream) = 0;
    virtual void fetch_words(const uint32_t *src, size_t n, void *stream) = 0;
    virtual void fetched_words(uint32_t *dst, size_t n, void *stream, const char *what) = 0;

    // Device memory registered with the transport, for the all-reduce's scratch (FP8AMP_COMM_NCCL_MEMORY,
    // core/communicator.cpp). NCCL: ncclMemAlloc, then ncclCommRegister (kRegistered: zero-copy
    // ncclSend/ncclRecv between registered buffers) or, collectively, ncclCommWindowRegister with
    // NCCL_WIN_COLL_SYMMETRIC (kWindow: under NCCL_CTA_POLICY_ZERO, NCCL 2.28 runs all-gathers on
    // copy engines, without blocks). Two steps, so that the ranks can agree between them that every
    // one of them has the memory before any enters the collective registration:
    // alloc_registered allocates (local; nullptr where the transport has none -- MPI, local -- or the
    // NCCL in the process lacks the functions: the caller allocates as usual then), register_memory
    // registers (collective for a window). free_registered waits for `stream` first (the memory may
    // be in use by queued work), deregisters what was registered (collective for a window, like the
    // registration) and frees.
    enum RegisteredMemory { kPlain = 0, kRegistered = 1, kWindow = 2 };
    virtual void *alloc_registered(size_t nbytes, RegisteredMemory mode) {
        (void)nbytes, (void)mode;
        return nullptr;
    }
    virtual void register_memory(void *p) { (void)p; }
    // Whether alloc_registered can give memory at all (NCCL with ncclMemAlloc in the process).
    virtual bool supports_registered_memory() const { return false; }
    virtual void free_registered(void *p, void *stream) { (void)p, (void)stream; }
    // The memory the all-reduce's scratch uses when FP8AMP_COMM_NCCL_MEMORY is not set: NCCL
    // communicators made by fp8amp with their copy-engine split (a split with CTAPolicy =
    // NCCL_CTA_POLICY_ZERO: NCCL 2.28 or later, the window functions present, use_copy_engine_split)
    // answer kWindow; everything else kPlain.
    virtual RegisteredMemory default_memory() const { return kPlain; }
    // Where `peer` has the byte at p of its own registered memory (the same offset in its copy of the
    // window that holds p), as an address of this process that this rank's kernels can load from and
    // store to (over NVLink): NCCL maps every rank of a symmetric
    // window's load/store-accessible team (its "LSA" team, the GPUs of one NVLink domain) into each
    // process (ncclGetLsaPointer of NCCL's device API, computed here on the host). nullptr where there
    // is no such mapping: p not in a registered window, the peer outside the team as far as this rank
    // can tell, an NCCL older than 2.28 or a transport without windows. A rank that cannot tell (the
    // team's size is not in the window) may answer an address where the peer answers nullptr: the
    // caller agrees on the answer between the ranks before using it (core/communicator.cpp).
    virtual void *peer_pointer(const void *p, int peer) const {
        (void)p, (void)peer;
        return nullptr;
    }

    // MPI: how long an operation waits for its peers. Others ignore it.
    virtual void set_timeout(double seconds) { (void)seconds; }
    // Whether an operation failed or abort() was called: every later operation throws COMM.
    virtual bool failed() const = 0;
    // Marks the transport failed (and aborts NCCL's pending work); not collective.
    virtual void abort() = 0;
    // Collective teardown of a healthy transport; a failed one is torn down locally.
    virtual void destroy() = 0;
};

// One rank: reductions are the identity, a send to self is a copy (through copy, the device's).
std::unique_ptr<Transport> make_local_transport(void (*copy)(void *ctx, void *dst, const void *src, size_t n, void *stream),
                                                void *copy_ctx);

// MPI (kernels/cpu/mpi_transport.cpp, or NOT_SUPPORTED stubs in a build without MPI).
bool mpi_available(std::string *why);
void mpi_unique_id(fp8amp_comm_unique_id *id);  // also without MPI (one-rank communicators)
void check_cpu_unique_id(const fp8amp_comm_unique_id &id);
std::unique_ptr<Transport> make_mpi_transport(const fp8amp_comm_unique_id &id, int nranks, int rank);
std::unique_ptr<Transport> adopt_mpi_transport(const void *mpi_comm);

// NCCL (kernels/cuda/nccl_transport.cpp, or NOT_SUPPORTED stubs in a build without CUDA/NCCL).
bool nccl_available(std::string *why);
void nccl_unique_id(fp8amp_comm_unique_id *id);
std::unique_ptr<Transport> make_nccl_transport(const fp8amp_comm_unique_id &id, int nranks, int rank, int device);
std::unique_ptr<Transport> adopt_nccl_transport(void *nccl_comm, int device);

}  // namespace fp8amp::kernels
