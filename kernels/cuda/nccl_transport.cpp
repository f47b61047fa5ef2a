// The NCCL transport (CUDA tensors): stock NCCL from the CUDA toolkit, no fork, no preload. Every
// operation is enqueued on the given stream (the context's) with no host synchronization, except
// agree(), which reads 56 bytes back (the consistency check; off for graph capture). Built when the
// library has CUDA and NCCL (cmake/comm.cmake); the stubs at the end say why otherwise.
#include "comm_transport.hpp"
#include "error.hpp"

#if FP8AMP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#if NCCL_VERSION_CODE >= 22800 && __has_include(<nccl_device/impl/core__types.h>)
#include <nccl_device/impl/core__types.h>  // ncclWindow_vidmem: where a window's peers are mapped
#define FP8AMP_NCCL_WINDOW_LAYOUT 1
#else
#define FP8AMP_NCCL_WINDOW_LAYOUT 0
#endif

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#endif

namespace fp8amp::kernels {

#if FP8AMP_HAVE_NCCL
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(fp8amp_comm_unique_id), "the id holds an ncclUniqueId");

void check_cuda(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail(FP8AMP_ERROR_CUDA, std::string(what) + ": " + cudaGetErrorString(e));
}

// Restores the calling thread's current device when it goes.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    }
    ~DeviceGuard() { cudaSetDevice(previous_); }

private:
    int previous_ = 0;
};

// The registration functions of the libnccl this library is bound to (the one that defines
// ncclAllReduce for it), looked up at run time: ncclCommWindowRegister came with NCCL 2.27, and the
// NCCL in the process (PyTorch's, say) may be older than the header this was built with. Windows are
// declared as void * (ncclWindow_t is a pointer).
struct NcclRegistration {
    ncclResult_t (*mem_alloc)(void **, size_t) = nullptr;
    ncclResult_t (*mem_free)(void *) = nullptr;
    ncclResult_t (*reg)(ncclComm_t, void *, size_t, void **) = nullptr;
    ncclResult_t (*dereg)(ncclComm_t, void *) = nullptr;
    ncclResult_t (*win_reg)(ncclComm_t, void *, size_t, void **, int) = nullptr;
    ncclResult_t (*win_dereg)(ncclComm_t, void *) = nullptr;

    static const NcclRegistration &get() {
        static const NcclRegistration r = [] {
            NcclRegistration f;
            Dl_info info{};
            if (!dladdr(reinterpret_cast<void *>(&ncclAllReduce), &info) || !info.dli_fname) return f;
            void *lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
            if (!lib) return f;
            auto sym = [&](auto &fn, const char *name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name)); };
            sym(f.mem_alloc, "ncclMemAlloc");
            sym(f.mem_free, "ncclMemFree");
            sym(f.reg, "ncclCommRegister");
            sym(f.dereg, "ncclCommDeregister");
            sym(f.win_reg, "ncclCommWindowRegister");
            sym(f.win_dereg, "ncclCommWindowDeregister");
            return f;  // the handle stays open: the library is loaded for the process's life anyway
        }();
        return r;
    }
};
constexpr int kWinCollSymmetric = 0x01;  // NCCL_WIN_COLL_SYMMETRIC (nccl.h 2.27+)

class NcclTransport final : public Transport {
public:
    NcclTransport(ncclComm_t comm, int device, bool owned) : comm_(comm), device_(device), owned_(owned) {
        call(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
        call(ncclCommCount(comm_, &nranks_), "ncclCommCount");
    }
    int rank() const override { return rank_; }
    int nranks() const override { return nranks_; }
    const char *name() const override { return "NCCL"; }

    void allreduce_max_u32(uint32_t *buf, size_t count, void *stream) override {
        check_alive();
        call(ncclAllReduce(buf, buf, count, ncclUint32, ncclMax, comm_, static_cast<cudaStream_t>(stream)),
             "ncclAllReduce");
    }
    void group_start() override {
        check_alive();
        call(ncclGroupStart(), "ncclGroupStart");
    }
    void send(const void *buf, size_t nbytes, int peer, void *stream) override {
        call(ncclSend(buf, nbytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream)), "ncclSend");
    }
    void recv(void *buf, size_t nbytes, int peer, void *stream) override {
        call(ncclRecv(buf, nbytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream)), "ncclRecv");
    }
    void group_end(void *) override { call(ncclGroupEnd(), "ncclGroupEnd"); }
    void all_gather(const void *send_buf, void *recv_buf, size_t nbytes, void *stream) override {
        check_alive();
        call(ncclAllGather(send_buf, recv_buf, nbytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
             "ncclAllGather");
    }
    // The all-reduce's in-place all-gathers into its window scratch: on the copy-engine communicator
    // where there is one (CTA policy NCCL_CTA_POLICY_ZERO: NCCL 2.28 runs an all-gather whose send and
    // receive buffers both lie in symmetric windows on copy engines), when copy_engine_ok says NCCL's
    // copy-engine path can take it; everything else on the default-policy communicator.
    void all_gather_scratch(const void *send_buf, void *recv_buf, size_t nbytes, void *stream) override {
        check_alive();
        ncclComm_t c = ce_comm_ && copy_engine_ok(send_buf, recv_buf, nbytes, stream) ? ce_comm_ : comm_;
        call(ncclAllGather(send_buf, recv_buf, nbytes, ncclUint8, c, static_cast<cudaStream_t>(stream)),
             "ncclAllGather");
    }
    // Through pinned memory both ways: a copy from or into pageable memory would block the host until
    // the stream reached it -- forever, if a peer never joins -- before fetched_words could time it
    // out. One agreement at a time (the communicator's calls are not concurrent), so one buffer each
    // way: a put's copy has run by the time fetched_words returns.
    void put_words(uint32_t *dst, const uint32_t *src, size_t n, void *stream) override {
        check_alive();
        DeviceGuard guard(device_);  // the copies and the stream are the communicator's device's
        uint32_t *pinned = pinned_buffer(n);
        std::memcpy(pinned, src, n * sizeof(uint32_t));
        check_cuda(cudaMemcpyAsync(dst, pinned, n * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(stream)),
                   "cudaMemcpyAsync (the consistency check)");
    }
    void fetch_words(const uint32_t *src, size_t n, void *stream) override {
        check_alive();
        DeviceGuard guard(device_);
        uint32_t *pinned = pinned_buffer(n) + pinned_count_ / 2;
        check_cuda(cudaMemcpyAsync(pinned, src, n * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                   static_cast<cudaStream_t>(stream)),
                   "cudaMemcpyAsync (the consistency check)");
    }
    void fetched_words(uint32_t *dst, size_t n, void *stream, const char *what) override {
        DeviceGuard guard(device_);
        wait(static_cast<cudaStream_t>(stream), what);
        std::memcpy(dst, pinned_ + pinned_count_ / 2, n * sizeof(uint32_t));
    }
    ~NcclTransport() override {
        // After a failure the check's copy into the pinned buffer may still be queued behind NCCL
        // work that never finishes (an adopted communicator is not aborted here), and cudaFreeHost
        // synchronizes the whole device: it would hang the destroy. The buffer is kept then, as the
        // communicator's scratch is (core/communicator.cpp).
        if (pinned_ && !failed()) cudaFreeHost(pinned_);
    }
    void *alloc_registered(size_t nbytes, RegisteredMemory mode) override {
        const NcclRegistration &f = NcclRegistration::get();
        if (mode == kPlain || !f.mem_alloc || !f.mem_free) return nullptr;
        if (mode == kRegistered && (!f.reg || !f.dereg)) return nullptr;
        if (mode == kWindow && (!f.win_reg || !f.win_dereg)) return nullptr;
        check_alive();
        DeviceGuard guard(device_);
        nbytes = (nbytes + (size_t(1) << 21) - 1) & ~((size_t(1) << 21) - 1);  // whole 2 MB pages (windows: 4 kB)
        void *p = nullptr;
        // Not through call(): running out of memory leaves the communicator usable (the caller tells
        // the other ranks in its agreement, and every rank fails alike).
        const ncclResult_t r = f.mem_alloc(&p, nbytes);
        if (r != ncclSuccess || !p)
            fail(FP8AMP_ERROR_OUT_OF_MEMORY, "ncclMemAlloc of " + std::to_string(nbytes) +
                                                 " bytes (the all-reduce's scratch; FP8AMP_COMM_NCCL_MEMORY=plain uses "
                                                 "the context's allocator) failed: " + ncclGetErrorString(r));
        std::lock_guard<std::mutex> lock(mutex_);
        registered_[p] = {nullptr, mode, nbytes, false, Lsa{}};
        return p;
    }
    void register_memory(void *p) override {
        const NcclRegistration &f = NcclRegistration::get();
        Registered reg{};
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = registered_.find(p);
            if (it == registered_.end() || it->second.done) return;
            reg = it->second;
        }
        check_alive();
        DeviceGuard guard(device_);
        void *handle = nullptr;
        call(reg.mode == kWindow ? f.win_reg(window_comm(), p, reg.nbytes, &handle, kWinCollSymmetric)
                                 : f.reg(comm_, p, reg.nbytes, &handle),
             reg.mode == kWindow ? "ncclCommWindowRegister (the communicator's scratch; FP8AMP_COMM_NCCL_MEMORY=plain avoids it)"
                                 : "ncclCommRegister (FP8AMP_COMM_NCCL_MEMORY=register)");
        const Lsa lsa = reg.mode == kWindow && handle ? window_lsa(handle) : Lsa{};
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = registered_.find(p);
        if (it != registered_.end()) {
            it->second.handle = handle;
            it->second.done = true;
            it->second.lsa = lsa;
        }
    }
    void *peer_pointer(const void *p, int peer) const override {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = registered_.upper_bound(const_cast<void *>(p));
        if (it == registered_.begin()) return nullptr;
        --it;
        const Registered &reg = it->second;
        const auto *base = static_cast<const char *>(it->first), *q = static_cast<const char *>(p);
        if (!reg.lsa.flat_base || q >= base + reg.nbytes || peer < 0 || peer >= nranks_) return nullptr;
        // The peer's index in the LSA team, as ncclGetPeerPointer computes it (the team holds
        // consecutive world ranks); below 0 it is outside. The team's size is not in the window, so
        // an index past its end cannot be told here: for two ranks in two teams, rank 1 sees index
        // -1 and answers nullptr, and the caller's agreement makes that the answer of both.
        const long index = static_cast<long>(reg.lsa.lsa_rank) + (peer - reg.lsa.world_rank);
        if (index < 0) return nullptr;
        return reg.lsa.flat_base + static_cast<size_t>(index) * (static_cast<size_t>(reg.lsa.stride4g) << 32) +
               (q - base);
    }
    void free_registered(void *p, void *stream) override {
        const NcclRegistration &f = NcclRegistration::get();
        Registered reg{};
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = registered_.find(p);
            if (it == registered_.end()) return;
            reg = it->second;
            registered_.erase(it);
        }
        // A failed or aborted communicator may still have work naming the memory: keep it.
        if (failed()) return;
        try {  // called from a Storage's release (a destructor): nothing may escape
            DeviceGuard guard(device_);
            if (cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) != cudaSuccess) return;
            if (reg.done) {
                if (reg.mode == kWindow) f.win_dereg(window_comm(), reg.handle);
                else f.dereg(comm_, reg.handle);
            }
            f.mem_free(p);
        } catch (...) {
        }
    }
    RegisteredMemory default_memory() const override { return default_memory_; }
    bool supports_registered_memory() const override {
        const NcclRegistration &f = NcclRegistration::get();
        return f.mem_alloc && f.mem_free;
    }
    void set_default_memory(RegisteredMemory m) { default_memory_ = m; }
    // The communicator's copy-engine twin (made by ncclCommSplit with CTAPolicy NCCL_CTA_POLICY_ZERO;
    // owned): windows are registered on it and the all-gathers into them run on it.
    void set_ce_comm(ncclComm_t ce) { ce_comm_ = ce; }
    void set_timeout(double seconds) override { timeout_s_ = seconds; }
    bool failed() const override { return aborted_.load() || !failure_.empty(); }
    // May come from another thread (a watchdog), as ncclCommAbort may: once, and only a flag besides.
    // An adopted communicator is the caller's to abort; this one only stops using it. The mutex keeps
    // ncclCommAbort (which frees the communicator) from running during a poll of wait(), whose
    // ncclCommGetAsyncError would read freed memory; the waiting thread sees the flag at its next
    // poll and fails with COMM.
    //
    // The default-policy communicator goes first: a peer that stopped taking part leaves its kernel
    // (the check's exchange, or the data path's) spinning on the device, and only its abort flag stops
    // it. The copy-engine twin's teardown unmaps its symmetric memory (cuMemUnmap in NCCL's window
    // and copy-engine finalization), which waits for the device: aborted first, it waited forever for
    // that kernel (the lost-rank case that hung on 2 H100s, tests/mpi/test_comm_mpi.c).
    void abort() override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!aborted_.exchange(true) && owned_) abort_both();
    }
    void destroy() override {
        if (!owned_ || aborted_.load()) return;
        DeviceGuard guard(device_);
        if (failure_.empty()) {
            if (ce_comm_) ncclCommDestroy(ce_comm_);
            ncclCommDestroy(comm_);
        } else {
            abort_both();
        }
    }

private:
    // Waits for the stream as cudaStreamSynchronize would, but never forever: NCCL kernels whose peer
    // died or stopped taking part spin on the GPU, so a plain synchronize would hang the process.
    // Polls the stream and ncclCommGetAsyncError (a network or remote error NCCL detected) until
    // the timeout (fp8amp_comm_set_timeout, default 300 s); either failure aborts the communicator
    // (ncclCommAbort stops its kernels, so the stream drains) and fails with NCCL.
    void wait(cudaStream_t s, const char *what) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
        for (long polls = 0;; ++polls) {
            const cudaError_t q = cudaStreamQuery(s);
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) check_cuda(q, what);
            ncclResult_t async = ncclSuccess;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                if (aborted_.load())
                    fail(FP8AMP_ERROR_COMM, std::string(what) + " on rank " + std::to_string(rank_) + " of " +
                                                std::to_string(nranks_) +
                                                ": the communicator was aborted (fp8amp_comm_abort) while it waited; "
                                                "destroy it");
                if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) async = ncclSuccess;
                if (async == ncclSuccess && ce_comm_ && ncclCommGetAsyncError(ce_comm_, &async) != ncclSuccess)
                    async = ncclSuccess;
            }
            if (async != ncclSuccess && async != ncclInProgress)
                fail_and_abort(std::string(what) + ": NCCL reported an asynchronous error: " + ncclGetErrorString(async));
            if (std::chrono::steady_clock::now() > deadline)
                fail_and_abort(std::string(what) + " timed out after " + std::to_string(timeout_s_) + " s on rank " +
                               std::to_string(rank_) + " of " + std::to_string(nranks_) +
                               ": a peer died or stopped taking part");
            // Spin briefly for latency, then sleep between polls.
            if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    // The pinned buffer of the agreements: put_words' half first, fetch_words' second. Grown (never in
    // practice: the agreements are a few dozen words) only between agreements, when no copy names it.
    uint32_t *pinned_buffer(size_t n) {
        if (2 * n > pinned_count_) {
            const size_t count = std::max<size_t>(2 * n, 2 * kPinnedWords);
            void *p = nullptr;
            check_cuda(cudaMallocHost(&p, count * sizeof(uint32_t)), "cudaMallocHost (the consistency check)");
            if (pinned_) cudaFreeHost(pinned_);
            pinned_ = static_cast<uint32_t *>(p);
            pinned_count_ = count;
        }
        return pinned_;
    }
    static constexpr size_t kPinnedWords = 512;
    // ncclCommAbort of both communicators, the default-policy one first (abort() says why).
    void abort_both() {
        ncclCommAbort(comm_);
        if (ce_comm_) ncclCommAbort(ce_comm_);
    }
    [[noreturn]] void fail_and_abort(const std::string &msg) {
        failure_ = msg;
        abort();
        fail(FP8AMP_ERROR_NCCL, msg + "; the communicator was aborted: destroy it");
    }
    void check_alive() const {
        if (aborted_.load()) fail(FP8AMP_ERROR_COMM, "the communicator was aborted (fp8amp_comm_abort): destroy it");
        if (!failure_.empty()) fail(FP8AMP_ERROR_COMM, "the communicator failed earlier: " + failure_ + "; destroy it");
    }
    void call(ncclResult_t r, const char *what) {
        if (r == ncclSuccess || r == ncclInProgress) return;
        std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
        const char *last = ncclGetLastError(comm_);
        if (last && *last) msg += std::string(" (") + last + ")";
        // An invalid argument leaves NCCL usable; anything else (a system or remote error) does not.
        if (r != ncclInvalidArgument && r != ncclInvalidUsage) failure_ = msg;
        fail(FP8AMP_ERROR_NCCL, msg);
    }

    ncclComm_t window_comm() const { return ce_comm_ ? ce_comm_ : comm_; }
    // Whether NCCL's copy-engine all-gather (ncclCeAllGather, src/ce_coll.cc of NCCL 2.28) can take
    // this one; docs/communicator.md, "Data path", says where each condition comes from:
    //  - a stream other than the legacy default stream: NCCL issues the copies with
    //    cudaMemcpyBatchAsync (CUDA 12.8+ runtime and driver, outside graph capture), which refuses
    //    the legacy NULL stream with cudaErrorInvalidValue -- NCCL then fails with "Cuda failure
    //    'invalid argument'" in ce_coll.cc. This is what failed on 2 H200s: the reduce-scatter's
    //    exchange on the context's stream, the default stream in the C tests, while the all-reduce's
    //    all-gathers (on the communicator's own transfer stream) passed;
    //  - at least one byte (NCCL drops an empty collective anyway);
    //  - both buffers inside registered symmetric windows of this communicator (NCCL picks the
    //    copy-engine path only then, and addresses the peers' copies at the receive buffer's offset
    //    in its window: the whole receive range, nranks * nbytes, must lie in the window).
    bool copy_engine_ok(const void *send_buf, const void *recv_buf, size_t nbytes, void *stream) {
        const auto s = static_cast<cudaStream_t>(stream);
        if (s == nullptr || s == cudaStreamLegacy || nbytes == 0) return false;
        return in_window(recv_buf, nbytes * static_cast<size_t>(nranks_)) && in_window(send_buf, nbytes);
    }
    // Whether [p, p + nbytes) lies in one registered window block.
    bool in_window(const void *p, size_t nbytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = registered_.upper_bound(const_cast<void *>(p));
        if (it == registered_.begin()) return false;
        --it;
        const auto *base = static_cast<const char *>(it->first), *q = static_cast<const char *>(p);
        // A null handle: NCCL registered no window (no symmetric support: it answers success then).
        return it->second.mode == kWindow && it->second.done && it->second.handle && q + nbytes <= base + it->second.nbytes;
    }

    ncclComm_t comm_;
    ncclComm_t ce_comm_ = nullptr;
    int device_;
    bool owned_;
    int rank_ = 0, nranks_ = 1;
    std::atomic<bool> aborted_{false};
    mutable std::mutex mutex_;  // abort() against the polls of wait()
    std::string failure_;
    double timeout_s_ = 300.0;
    uint32_t *pinned_ = nullptr;  // host side of the agreements (pinned_buffer)
    size_t pinned_count_ = 0;
    // Where a window's LSA team is mapped in this process (ncclWindow_vidmem's first fields: NCCL's
    // device API reads them on the device, ncclGetLsaPointer): rank i of the team at flat_base + i *
    // stride4g * 4 GiB. Read once from the window when it is registered; empty where NCCL is older
    // than 2.28 (another layout) or the read fails (no peer reads then).
    struct Lsa {
        char *flat_base = nullptr;
        int lsa_rank = 0, world_rank = 0;
        uint32_t stride4g = 0;
    };
    static Lsa window_lsa(void *handle) {
        Lsa lsa;
#if FP8AMP_NCCL_WINDOW_LAYOUT
        int version = 0;
        if (ncclGetVersion(&version) != ncclSuccess || version < 22800) return lsa;
        // Only the fields up to stride4G, which every 2.28 release has in this order (later fields
        // came and went between releases).
        ncclWindow_vidmem w{};
        constexpr size_t kPrefix = offsetof(ncclWindow_vidmem, stride4G) + sizeof w.stride4G;
        if (cudaMemcpy(&w, handle, kPrefix, cudaMemcpyDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            return lsa;
        }
        if (!w.lsaFlatBase || w.stride4G == 0) return lsa;
        lsa.flat_base = w.lsaFlatBase;
        lsa.lsa_rank = w.lsaRank;
        lsa.world_rank = w.worldRank;
        lsa.stride4g = w.stride4G;
#else
        (void)handle;
#endif
        return lsa;
    }
    struct Registered {
        void *handle = nullptr;
        RegisteredMemory mode = kPlain;
        size_t nbytes = 0;
        bool done = false;  // registered (register_memory), not only allocated
        Lsa lsa;            // a window's peers (window_lsa)
    };
    RegisteredMemory default_memory_ = kPlain;
    std::map<void *, Registered> registered_;  // alloc_registered's blocks (under mutex_)
};

void nccl_check(ncclResult_t r, const char *what) {
    if (r != ncclSuccess) fail(FP8AMP_ERROR_NCCL, std::string(what) + " failed: " + ncclGetErrorString(r));
}

}  // namespace

bool nccl_available(std::string *) { return true; }

void nccl_unique_id(fp8amp_comm_unique_id *id) {
    ncclUniqueId nid;
    nccl_check(ncclGetUniqueId(&nid), "ncclGetUniqueId");
    std::memcpy(id->internal, &nid, sizeof nid);
}

// Whether a communicator made here gets the copy-engine setup (docs/communicator.md, "Data path"): its
// all-reduce scratch a symmetric window, registered on a split of the communicator whose CTAPolicy is
// NCCL_CTA_POLICY_ZERO, under which NCCL 2.28 runs the all-reduce's all-gathers of window memory on
// copy engines and leaves every multiprocessor to the conversions (measured on 2 x H200: 1180-1204 us
// against 1674 for the plain setup; 2 x H100, check off: 1391 against 1861, docs/communicator.md). The default
// where the library's header and the NCCL in the process are 2.28 or later with its window functions;
// FP8AMP_COMM_NCCL_MEMORY=plain (or =register) keeps the plain setup. Only the all-gathers
// that NCCL's copy-engine path accepts go to the split
// (NcclTransport::copy_engine_ok: not on the legacy default stream, where cudaMemcpyBatchAsync fails
// -- the cause of the reduce-scatter's failure on 2 H200s --, both buffers in a window); every other
// collective stays on the communicator itself (default policy). NCCL_CTA_POLICY in the environment
// would apply to both communicators; fp8amp does not need it. Every input is the same on every rank
// of one job (the same library, the same environment); where not, the all-reduce's agreement refuses
// the call (the memory mode is one of its options) or, where only the registration functions differ,
// it falls back to plain memory on every rank (core/communicator.cpp, registered_scratch). NCCL
// itself registers a window only where the communicator has symmetric support and answers success
// with a null window otherwise (its ncclCommWindowRegister), so the setup is harmless where copy
// engines cannot be used.
bool use_copy_engine_split() {
#if defined(NCCL_CTA_POLICY_ZERO)
    // The default (unset or =window); =plain or =register keep the communicator alone. It was opt-in
    // while a lost rank hung it on 2 H100s: the abort order fixed that (NcclTransport::abort).
    const char *env = std::getenv("FP8AMP_COMM_NCCL_MEMORY");
    if (env && std::strcmp(env, "window") != 0) return false;
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess || version < 22800) return false;
    const NcclRegistration &f = NcclRegistration::get();
    return f.mem_alloc && f.mem_free && f.win_reg && f.win_dereg;
#else
    return false;
#endif
}

std::unique_ptr<Transport> make_nccl_transport(const fp8amp_comm_unique_id &id, int nranks, int rank, int device) {
    DeviceGuard guard(device);
    ncclUniqueId nid;
    std::memcpy(&nid, id.internal, sizeof nid);
    ncclComm_t comm = nullptr, ce = nullptr;
    // One rank moves nothing (the all-reduce makes no transfer): the plain setup.
    const bool zero_cta = nranks > 1 && use_copy_engine_split();
    nccl_check(ncclCommInitRank(&comm, nranks, nid, rank), "ncclCommInitRank");
#if defined(NCCL_CTA_POLICY_ZERO)
    // The copy-engine twin: a split of the same ranks whose CTA policy is NCCL_CTA_POLICY_ZERO (the
    // all-reduce's all-gathers into its window scratch run on copy engines). Only those go there
    // (all_gather_scratch, copy_engine_ok); every other collective stays on the default-policy
    // communicator. Collective, like the init: every rank makes the same choice.
    if (zero_cta) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
        const ncclResult_t r = ncclCommSplit(comm, 0, rank, &ce, &config);
        if (r != ncclSuccess) {
            ncclCommDestroy(comm);
            nccl_check(r, "ncclCommSplit (the copy-engine communicator; FP8AMP_COMM_NCCL_MEMORY=plain avoids it)");
        }
    }
#endif
    try {
        auto t = std::make_unique<NcclTransport>(comm, device, true);
        if (ce) {
            t->set_ce_comm(ce);
            t->set_default_memory(Transport::kWindow);
        }
        return t;
    } catch (...) {
        if (ce) ncclCommDestroy(ce);
        ncclCommDestroy(comm);
        throw;
    }
}

std::unique_ptr<Transport> adopt_nccl_transport(void *nccl_comm, int device) {
    auto comm = static_cast<ncclComm_t>(nccl_comm);
    int comm_device = -1;
    nccl_check(ncclCommCuDevice(comm, &comm_device), "ncclCommCuDevice");
    if (comm_device != device)
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "native: the NCCL communicator is on cuda:" + std::to_string(comm_device) +
                                               ", the context on cuda:" + std::to_string(device));
    return std::make_unique<NcclTransport>(comm, device, false);
}

#else

namespace {
const char *kNoNccl = "this library was built without CUDA and NCCL, so a CUDA communicator is not available";
}
bool nccl_available(std::string *why) {
    if (why) *why = kNoNccl;
    return false;
}
void nccl_unique_id(fp8amp_comm_unique_id *) { fail(FP8AMP_ERROR_NOT_SUPPORTED, kNoNccl); }
std::unique_ptr<Transport> make_nccl_transport(const fp8amp_comm_unique_id &, int, int, int) {
    fail(FP8AMP_ERROR_NOT_SUPPORTED, kNoNccl);
}
std::unique_ptr<Transport> adopt_nccl_transport(void *, int) { fail(FP8AMP_ERROR_NOT_SUPPORTED, kNoNccl); }

#endif

}  // namespace fp8amp::kernels
