// The FP8 collectives (docs/communicator.md). Per call: validate locally; agree with the other ranks
// (a small exchange of signatures of the call's counts, shapes, dtypes and options, plus whether any
// rank refused its arguments), so that a mismatch fails on every rank before data moves; then the
// algorithm, as a fixed sequence of transport operations and device compute on the context's
// stream. Outputs are written only by the last step, so a failure in any transport operation leaves
// them as they were.
#include "communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend.hpp"
#include "error.hpp"
#include "tensor.hpp"

namespace fp8amp::core {
namespace {

bool is_fp8(fp8amp_dtype d) { return d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2; }

// FNV-1a, fed field by field.
struct Hash {
    uint64_t h = 1469598103934665603ull;
    Hash &add(uint64_t v) {
        for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xFF)) * 1099511628211ull;
        return *this;
    }
};

void hash_shape(Hash &h, const Tensor &t) {
    h.add(static_cast<uint64_t>(t.ndim()));
    for (int32_t d = 0; d < t.ndim(); ++d) h.add(static_cast<uint64_t>(t.shape()[d]));
}

std::string arg(const char *array, size_t i) { return std::string(array) + "[" + std::to_string(i) + "]"; }

void check_not_overlapping(const Tensor &a, const std::string &an, const Tensor &b, const std::string &bn) {
    if (&a != &b && a.overlaps(b))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, an + " and " + bn + " overlap in memory");
}

// The all-reduce's chunk per rank: ceil(total / N) rounded up to a multiple of 16 elements (bytes on
// the wire), so that every rank's chunk starts aligned for the vectorized device code. Which rank
// reduces an element changes nothing in its value (the sum is in rank order, the scale agreed).
int64_t chunk_elements(int64_t total, int N) {
    const int64_t c = (total + N - 1) / N;
    return (c + 15) / 16 * 16;
}

// The all-reduce's pipeline pieces (docs/communicator.md, "Pipeline"): each rank chunk of C elements is
// moved in pieces (multiples of 16 elements), so that converting one piece overlaps moving another.
// Which piece an element travels in changes nothing in its value (its scale is its scale segment's,
// fixed by the regions -- region_elements -- and agreed over the whole segment at the first piece that
// holds any of it; the sum is per element), so the bytes do not depend on the schedule: the tests run
// with small pieces too (FP8AMP_COMM_PIECE_ELEMENTS, FP8AMP_COMM_PIECE_TAPER).
//
// The schedule is a function of C, P (piece_elements) and the taper D (piece_taper), values every
// rank has (C) or agrees on with the check (P, D), so it needs no agreement of its own:
//  - D = 1, or C <= P: pieces of P, the last one shorter (the schedule before the taper);
//  - D >= 2: a first and a last piece of E = P / D (rounded up to a multiple of 16; if that is not
//    below P, as D = 1), the C - 2 E elements between them in m = ceil((C - 2 E) / P) pieces of equal
//    length rounded up to 16 (the last of them shorter by the rounding; never empty, since P is a
//    multiple of 16 and m pieces of P cover the rest).
// Why a taper: the first piece's quantization and the last piece's decoding run beside no transfer
// (the pipeline's two bubbles), and the transfer stream idles for them; smaller edge pieces shrink
// them without adding transport operations (each costs a fixed ~17 us on the copy-engine path,
// fitted to the 2-H200 sweep: bench/comm_pipeline_model.py).
//
// P: FP8AMP_COMM_PIECE_ELEMENTS when set (read at every call), else where the device overlaps (CUDA)
// C / 4 and at least kMinPiece elements, with no taper by default (kTaper = 1): 4 equal pieces. The
// taper's model (4 pieces of C/8, 3C/8, 3C/8, C/8, ~37 us below 4 equal pieces on 2 H200s) did not
// hold when measured on 2 x H100 with the copy-engine setup (2026-11-26, check off): taper 3 with
// pieces of 3C/8 1391 us, no taper 1367 (3 pieces) and 4 equal pieces of C/4 1366; so equal pieces
// (measured on 2 x H200: pieces of 32M elements, 4 a chunk, 1164-1180 us, 64M 1195, 16M 1278, 8M
// 1530). One piece where nothing overlaps (CPU, whose transports are synchronous).
constexpr int64_t kMinPiece = int64_t(1) << 22;
constexpr int64_t kTaper = 1;

int64_t round16(int64_t v) { return (v + 15) / 16 * 16; }

int64_t piece_elements(int64_t C, bool overlap) {
    if (C <= 0) return 16;
    if (const char *env = std::getenv("FP8AMP_COMM_PIECE_ELEMENTS")) {
        char *end = nullptr;
        const long long v = std::strtoll(env, &end, 10);
        if (end != env && *end == '\0' && v > 0) return std::min(C, round16(v));
    }
    if (!overlap) return C;
    return std::min(C, std::max(round16((C + 3) / 4), kMinPiece));
}

// D: FP8AMP_COMM_PIECE_TAPER (an integer >= 1, read at every call), else kTaper.
int64_t piece_taper() {
    if (const char *env = std::getenv("FP8AMP_COMM_PIECE_TAPER")) {
        char *end = nullptr;
        const long long v = std::strtoll(env, &end, 10);
        if (end != env && *end == '\0' && v >= 1 && v <= (1LL << 30)) return v;
    }
    return kTaper;
}

// The pieces' bounds: piece p is [bounds[p], bounds[p + 1]); bounds.front() = 0, bounds.back() = C.
std::vector<int64_t> piece_bounds(int64_t C, int64_t P, int64_t D) {
    std::vector<int64_t> b{0};
    if (C <= 0) return b;
    const int64_t E = round16((P + D - 1) / D);
    if (D <= 1 || C <= P || E >= P) {
        for (int64_t lo = P; lo < C; lo += P) b.push_back(lo);
        b.push_back(C);
        return b;
    }
    const int64_t rest = C - 2 * E;
    b.push_back(E);
    if (rest > 0) {
        const int64_t m = (rest + P - 1) / P;
        const int64_t M = round16((rest + m - 1) / m);
        for (int64_t k = 1; k < m; ++k) b.push_back(E + k * M);
        b.push_back(C - E);
    }
    b.push_back(C);
    return b;
}

// The all-reduce's scale regions (docs/communicator.md, "Algorithm", step 1): each rank chunk of C
// elements is cut into regions of R = C / kScaleRegions elements (rounded up to a multiple of 16; the
// last one shorter), and a tensor with a wide output (F32, F16, BF16) gets one agreed wire scale per
// region it has elements in -- its scale segments. Why per region and not per tensor: the amax of a
// region can be taken and agreed while the pipeline moves an earlier piece, so that only the first
// piece's amaxes and their agreement stay before the first transfer, where a tensor's amax needs a
// pass over the whole tensor (the whole bucket, for one large tensor) first. A tensor with an FP8
// output keeps one scale (its output has one scale_inv), so one segment: the whole tensor.
//
// The regions are a function of C alone (the call's sizes and nranks), never of the device or of the
// piece schedule: the bytes depend on them, and must be the same on every rank and on both devices.
// A segment's amax is taken and agreed before the first piece that holds any of its elements, so a
// schedule that does not follow the regions (FP8AMP_COMM_PIECE_ELEMENTS, the taper, the CPU's one
// piece) changes when the amaxes are taken, never their values. The default CUDA schedule of a large
// chunk (C / 4, at least kMinPiece) is the regions themselves: kScaleRegions is its piece count.
constexpr int64_t kScaleRegions = 4;

int64_t region_elements(int64_t C) { return C <= 0 ? 16 : round16((C + kScaleRegions - 1) / kScaleRegions); }

// How the all-reduce's reduce-scatter half moves the codes (docs/communicator.md, "Data path"). Two
// ranks: by default one all-gather per piece, each rank contributing the piece of the other rank's
// chunk (for two ranks a pairwise exchange *is* an all-gather, and NCCL's all-gather runs its ring
// kernel, which reaches about twice the bandwidth of grouped ncclSend/ncclRecv on NVLink: measured 2 x
// H200, docs/communicator.md). FP8AMP_COMM_EXCHANGE=sendrecv keeps grouped sends and receives (the
// only way for more than two ranks). Read at every call; it decides which transport operations the
// call makes, so it is part of the options the ranks agree on.
enum class Exchange { Auto, SendRecv };
Exchange exchange_mode() {
    const char *env = std::getenv("FP8AMP_COMM_EXCHANGE");
    return env && std::strcmp(env, "sendrecv") == 0 ? Exchange::SendRecv : Exchange::Auto;
}

// Whether the two-rank all-reduce writes its codes straight into the peer's scratch (docs/communicator.md,
// "Peer writes"): where the scratch is a symmetric window whose peer NCCL maps into this process
// (Transport::peer_pointer, agreed when the window is registered), the quantization and the
// requantization store the codes the other rank needs over NVLink into its window, where the copy
// engines would have put them, and each transfer of the pipeline shrinks to a 16-byte all-gather that
// only orders the ranks (its completion on a rank means every rank's stores before it are done).
// FP8AMP_COMM_PEER_WRITES=0 keeps the copies (the copy-engine all-gathers of the codes); read at every
// call, and part of the options the ranks agree on, since the two move different byte counts. The
// bytes of the result do not depend on it (the same kernels, the same codes, at the same places).
bool peer_writes_wanted() {
    const char *env = std::getenv("FP8AMP_COMM_PEER_WRITES");
    return !(env && std::strcmp(env, "0") == 0);
}

// The grid of the conversions that run beside a transfer: at most FP8AMP_COMM_GRID_BLOCKS blocks (of
// 256 threads; read at every call; 0 or unset: as many as the work needs, kGridBlocks), their loops
// grid-stride beyond. Unbounded, each block converts a fixed run and retires, so that NCCL's blocks
// (on the higher-priority stream) get multiprocessors as they free up; a grid below the device's
// multiprocessor count keeps some of them free of conversions altogether and leaves NCCL more memory
// bandwidth, at the price of slower conversions -- which is faster is measured by
// bench/run_comm_2gpu.sh. Blocks persist on their multiprocessor when bounded, so a bound of several
// blocks per multiprocessor would leave NCCL none: keep it below the multiprocessor count (132 on
// H100 SXM and H200). The first piece's production and the last piece's consumption run beside
// nothing and keep the full grid. The bytes do not depend on it (every value is computed element by
// element; the amax and the saturation count are a max and a sum), so it is not agreed.
constexpr int kGridBlocks = 0;
int grid_blocks() {
    if (const char *env = std::getenv("FP8AMP_COMM_GRID_BLOCKS")) {
        char *end = nullptr;
        const long v = std::strtol(env, &end, 10);
        if (end != env && *end == '\0' && v >= 0 && v <= (1L << 20)) return static_cast<int>(v);
    }
    return kGridBlocks;
}

// Where the all-reduce's scratch comes from (docs/communicator.md, "Data path"), decided when the
// communicator is made: FP8AMP_COMM_NCCL_MEMORY=plain (the context's allocator), =register
// (ncclMemAlloc + ncclCommRegister: zero-copy send/receive between registered buffers) or =window (a
// symmetric window, registered collectively: under NCCL_CTA_POLICY_ZERO, NCCL 2.28 runs the
// all-gathers on copy engines, leaving every multiprocessor to the conversions); unset: the
// transport's default (a window for NCCL communicators fp8amp made with that CTA policy, plain
// otherwise). MPI and local transports have none: plain. Part of the options the all-reduce agrees on
// (with check), and agreed again when registered scratch grows (registered_scratch); the bytes do
// not depend on it.
Transport::RegisteredMemory nccl_memory(Transport::RegisteredMemory fallback) {
    const char *env = std::getenv("FP8AMP_COMM_NCCL_MEMORY");
    if (!env) return fallback;
    if (std::strcmp(env, "register") == 0) return Transport::kRegistered;
    if (std::strcmp(env, "window") == 0) return Transport::kWindow;
    return Transport::kPlain;
}

// The all-reduce's scratch (slot 1) for chunks of C elements over N ranks: the codes, 2 N C bytes
// (`wire` and `recv`), then kTokenBytes a rank for the ordering all-gathers of the peer writes.
constexpr size_t kTokenBytes = 16;
size_t wire_scratch_bytes(int64_t C, int N) { return static_cast<size_t>(C) * N * 2 + kTokenBytes * N; }

size_t dtype_bytes(fp8amp_dtype d) {
    return d == FP8AMP_DTYPE_F32 ? 4 : (d == FP8AMP_DTYPE_F16 || d == FP8AMP_DTYPE_BF16) ? 2 : 1;
}
// Element k of t's data.
void *element(const Tensor &t, int64_t k) {
    return static_cast<char *>(t.data()) + static_cast<size_t>(k) * dtype_bytes(t.dtype());
}

// Buffers of a failed communicator may still be named by requests pending in MPI or NCCL: they are
// kept alive until the process ends.
std::vector<std::shared_ptr<Storage>> &kept_after_failure() {
    static auto *kept = new std::vector<std::shared_ptr<Storage>>();
    return *kept;
}

}  // namespace

void Communicator::unique_id(const Context &ctx, fp8amp_comm_unique_id *id) {
    ctx.backend().comm_unique_id(id);
}

Communicator::Communicator(std::shared_ptr<const Context> ctx, std::unique_ptr<kernels::CommCompute> compute,
                           std::unique_ptr<Transport> transport)
    : ctx_(std::move(ctx)), compute_(std::move(compute)), transport_(std::move(transport)) {
    memory_ = transport_->supports_registered_memory() ? nccl_memory(transport_->default_memory()) : Transport::kPlain;
    saturated_ = ctx_->allocate(sizeof(unsigned long long));
    compute_->memset_async(saturated_->data(), 0, sizeof(unsigned long long), ctx_->stream());
}

// The device's compute and transport come from the context's backend.
std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<const Context> ctx, const fp8amp_comm_unique_id &id,
                                                   int nranks, int rank) {
    if (nranks < 1) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "nranks is " + std::to_string(nranks) + ", not >= 1");
    if (rank < 0 || rank >= nranks)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "rank is " + std::to_string(rank) + ", outside 0.." + std::to_string(nranks - 1));
    std::unique_ptr<kernels::CommCompute> compute = ctx->backend().make_comm_compute();
    std::unique_ptr<kernels::Transport> transport = ctx->backend().make_comm_transport(id, nranks, rank, *compute);
    try {
        return std::shared_ptr<Communicator>(new Communicator(std::move(ctx), std::move(compute), std::move(transport)));
    } catch (...) {
        // transport was moved only if the constructor ran; a failed allocation leaves it here.
        if (transport) transport->destroy();
        throw;
    }
}

std::shared_ptr<Communicator> Communicator::adopt(std::shared_ptr<const Context> ctx, void *native) {
    std::unique_ptr<kernels::CommCompute> compute = ctx->backend().make_comm_compute();
    std::unique_ptr<kernels::Transport> transport = ctx->backend().adopt_comm_transport(native);
    return std::shared_ptr<Communicator>(new Communicator(std::move(ctx), std::move(compute), std::move(transport)));
}

Communicator::~Communicator() {
    // A transport that failed may still have requests naming the scratch.
    if (transport_->failed()) {
        try {
            for (auto &s : scratch_)
                if (s) kept_after_failure().push_back(s);
        } catch (...) {
        }
    }
    // Memory registered with the transport goes back to it while it is alive (its release waits for
    // the stream, and deregisters -- collectively for a window, as destroy is collective); a failed
    // transport keeps it.
    for (size_t slot = 0; slot < kSlots; ++slot)
        if (registered_[slot]) scratch_[slot].reset();
    try {
        transport_->destroy();
    } catch (...) {
    }
}

uint64_t Communicator::saturated() const {
    unsigned long long v = 0;
    compute_->to_host(&v, saturated_->data(), sizeof v, ctx_->stream());
    return v;
}

void *Communicator::scratch(size_t slot, size_t nbytes, bool zero) {
    nbytes = std::max<size_t>(nbytes, 1);
    if (!scratch_[slot] || scratch_[slot]->nbytes() < nbytes) {
        // The old block may be in use by queued work: the context's stream orders the free (CUDA
        // allocators free in stream order) -- as Context::scratch does; registered memory waits for
        // the stream in free_registered. (The all-reduce's transfer stream has joined the context's
        // stream by the end of every call.)
        scratch_[slot].reset();
        registered_[slot] = false;
        scratch_[slot] = ctx_->allocate(nbytes);
        // zero: bytes the transport moves but nothing reads (gaps between tensors, the padding) are
        // defined, so that the wire never carries uninitialized memory.
        if (zero) compute_->memset_async(scratch_[slot]->data(), 0, scratch_[slot]->nbytes(), ctx_->stream());
    }
    return scratch_[slot]->data();
}

// The all-reduce's scratch in memory registered with the transport (memory_ not kPlain). Called after
// the call's arguments were agreed (so every rank asks for the same size at the same point; with
// check = 0 the caller promises as much) and only when the block must grow: the old block is released
// (a window's deregistration is collective: every rank is here), the new one allocated locally, and
// then one agreement (a host synchronization, only when growing) makes sure every rank has its memory
// and can have the mode before any rank enters the collective registration -- so that a rank out of
// memory fails every rank instead of leaving them in ncclCommWindowRegister, and where some rank's
// NCCL cannot register, every rank falls back to plain memory. (A different FP8AMP_COMM_NCCL_MEMORY
// is refused by the call's own agreement, memory_ being one of its options.)
void *Communicator::registered_scratch(size_t slot, size_t nbytes) {
    nbytes = std::max<size_t>(nbytes, 1);
    if (scratch_[slot] && scratch_[slot]->nbytes() >= nbytes) return scratch_[slot]->data();
    scratch_[slot].reset();
    registered_[slot] = false;
    peer_[slot] = nullptr;
    void *p = nullptr;
    bool failed = false;
    std::string why;
    fp8amp_status status = FP8AMP_ERROR_OUT_OF_MEMORY;
    try {
        p = transport_->alloc_registered(nbytes, memory_);
    } catch (const Error &e) {
        failed = true;
        status = e.status();
        why = e.what();
    }
    bool same = true, any_failed = failed;
    if (nranks() > 1) {
        const uint64_t sig = p ? static_cast<uint64_t>(memory_) : 0;
        auto *s = static_cast<uint32_t *>(scratch(4, 4 * Transport::agree_words(1)));
        try {
            any_failed = transport_->agree(&sig, 1, failed, &same, s, ctx_->stream());
        } catch (...) {
            if (p) transport_->free_registered(p, ctx_->stream());
            throw;
        }
    }
    if (any_failed) {
        if (p) transport_->free_registered(p, ctx_->stream());
        if (failed) fail(status, why);
        fail(FP8AMP_ERROR_OUT_OF_MEMORY, "rank " + std::to_string(rank()) + " of " + std::to_string(nranks()) +
                                             ": another rank could not allocate the all-reduce's registered scratch "
                                             "(its own message says why); nothing was exchanged");
    }
    if (!p || !same) {
        // Not available here, or not the same mode on every rank: plain memory on every rank, from
        // now on.
        if (p) transport_->free_registered(p, ctx_->stream());
        memory_ = Transport::kPlain;
        return scratch(slot, nbytes, true);
    }
    Transport *t = transport_.get();
    std::shared_ptr<const Context> ctx = ctx_;
    try {
        scratch_[slot] = std::make_shared<Storage>(p, nbytes, ctx_->device(), [t, ctx, p] { t->free_registered(p, ctx->stream()); });
    } catch (...) {
        t->free_registered(p, ctx_->stream());
        throw;
    }
    registered_[slot] = true;
    transport_->register_memory(p);  // collective for a window: every rank agreed to be here
    compute_->memset_async(p, 0, nbytes, ctx_->stream());
    // The other rank's copy of this window (two ranks: the peer writes of the all-reduce,
    // peer_writes_wanted), kept only where every rank has its peer's (agreed: a rank may see an
    // address where its peer sees none, Transport::peer_pointer; a rank without one is a refusal in
    // the agreement). Where not, the memory stays registered, for the copies.
    if (nranks() == 2) {
        void *peer = transport_->peer_pointer(p, 1 - rank());
        const uint64_t sig = 0;
        bool same = true;
        auto *s = static_cast<uint32_t *>(scratch(4, 4 * Transport::agree_words(1)));
        if (!transport_->agree(&sig, 1, peer == nullptr, &same, s, ctx_->stream()))
            peer_[slot] = static_cast<uint8_t *>(peer);
    }
    return p;
}

void Communicator::exchange_agreement(bool check, const char *op, bool failed, const Signature &sig) {
    if (!check || nranks() == 1) return;
    const uint64_t sigs[3] = {sig.shapes, sig.dtypes, sig.options};
    bool same[3] = {true, true, true};
    auto *s = static_cast<uint32_t *>(scratch(4, 4 * kCheckWords));
    const bool any_failed = transport_->agree(sigs, 3, failed, same, s, ctx_->stream(), kCheckWords);
    if (failed) return;  // the caller rethrows its own error
    check_verdict(op, any_failed, same);
}

void Communicator::check_verdict(const char *op, bool any_failed, const bool same[3]) const {
    const std::string where = std::string(op) + " on rank " + std::to_string(rank()) + " of " + std::to_string(nranks());
    if (any_failed)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             where + ": another rank refused its arguments to this call (its own message says why); nothing was exchanged");
    if (!same[0])
        fail(FP8AMP_ERROR_SHAPE_MISMATCH,
             where + ": the ranks passed different tensor counts or shapes; nothing was exchanged");
    if (!same[1])
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, where + ": the ranks passed different dtypes; nothing was exchanged");
    if (!same[2])
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             where + ": the ranks passed different options (wire_dtype, average; for the all-reduce also the "
                     "pipeline's pieces, FP8AMP_COMM_PIECE_ELEMENTS and FP8AMP_COMM_PIECE_TAPER, the exchange, FP8AMP_COMM_EXCHANGE, and the scratch's "
                     "memory, FP8AMP_COMM_NCCL_MEMORY); nothing was exchanged");
}

void Communicator::all_reduce(const std::vector<std::shared_ptr<Tensor>> &inputs,
                              const std::vector<std::shared_ptr<Tensor>> &outputs, const CommReduceOptions &o) {
    const size_t n = inputs.size();
    const int N = nranks(), r = rank();
    std::vector<int64_t> offset(n + 1, 0);
    std::vector<fp8amp_dtype> gather(n);
    int64_t P = 0, D = 1;  // the pipeline's piece and taper: part of the options the ranks agree on
    bool pair = false;  // two ranks, the reduce-scatter half as all-gathers (exchange_mode): agreed too
    bool want_peer = false;  // and the peer writes (peer_writes_wanted), where the scratch allows them
    // The streams: the context's (S) converts; the transport's operations go on a second one (X) where
    // the device has one (CUDA), ordered against S by events, so that converting one piece overlaps
    // moving another. Every hand-over is an event (no host synchronization), and S waits for X's
    // last operation before the call returns, so the call is capturable and its results are ordered
    // on S as before.
    void *S = ctx_->stream();
    void *X = S;
    int64_t C = 0;                // the chunk per rank
    std::vector<int64_t> bounds;  // the pieces of a chunk (piece_bounds)
    // The scale segments (region_elements): segment [a, b) of the bucket, all of tensor i, has one
    // agreed scale, at `slot` of the small values. In bucket order, tensor by tensor: tensor i's are
    // segs[seg_first[i] .. seg_first[i + 1]). The slots are ordered by the first piece that needs the
    // segment (its amax must be agreed before that piece's quantization), then by output format: piece
    // p's segments are the slots [group[p], group[p + 1]), one contiguous agreement.
    struct Segment {
        size_t i;
        int64_t a, b, slot;
    };
    std::vector<Segment> segs;
    std::vector<size_t> seg_first(n + 1, 0);
    std::vector<size_t> by_slot;  // the segment at each slot
    std::vector<int64_t> group;
    uint32_t *amax_in = nullptr;
    // The local amaxes of piece p's segments, each over the whole segment (also its elements in later
    // pieces), on S.
    auto amaxes_on = [&](int64_t p, void *stream) {
        for (int64_t slot = group[p]; slot < group[p + 1]; ++slot) {
            const Segment &g = segs[by_slot[slot]];
            const Tensor &in = *inputs[g.i];
            compute_->amax(element(in, g.a - offset[g.i]), in.dtype(), in.scale_inv(), g.b - g.a, amax_in + slot, stream);
        }
    };
    // The small values (scratch slot 0, 32-bit words): the check's head (kCheckHeadWords), then per
    // segment slot the agreed amax of the inputs, an unused word, the wire's and the output's
    // scale_inv, each an array of mm >= the segment count (at least the amax slots that the check's
    // exchange carries, kCheckWords - kCheckHeadWords: zeros past the segments), then the call's
    // saturation count (64 bits; 8-byte aligned, as kCheckHeadWords + 4 mm is even).
    size_t mm = 0;
    uint32_t *head = nullptr;
    auto small_words = [&] { return kCheckHeadWords + 4 * mm + 2; };
    // 1a. The first piece's amaxes (A(0)), before the check's exchange, which carries them
    // (step 1b). They write only the communicator's scratch, so a refused call still changes nothing
    // the caller sees. The other pieces' amaxes come in the pipeline, while earlier pieces are on the
    // wire.
    auto amax_pass = [&] {
        head = static_cast<uint32_t *>(scratch(0, 4 * small_words()));
        amax_in = head + kCheckHeadWords;
        compute_->memset_async(amax_in, 0, 4 * (4 * mm + 2), S);
        amaxes_on(0, S);
    };
    // The segments and their slots, from offset, gather, C and bounds (in the validation, so that the
    // amax pass beside the check can use them).
    auto make_segments = [&] {
        const int64_t R = region_elements(C);
        auto piece_of = [&](int64_t x) {  // the piece of element x of a chunk
            return static_cast<int64_t>(std::upper_bound(bounds.begin(), bounds.end(), x) - bounds.begin()) - 1;
        };
        std::vector<int64_t> need;  // the first piece that holds an element of each segment
        for (size_t i = 0; i < n; ++i) {
            seg_first[i] = segs.size();
            const int64_t end = offset[i] + inputs[i]->numel();
            if (is_fp8(outputs[i]->dtype())) {
                // One scale for the whole tensor (even an empty one: its output still gets a
                // scale_inv). Spread over several chunks it has elements in piece 0 of each but the first.
                const int64_t j0 = C > 0 ? offset[i] / C : 0, j1 = C > 0 && end > offset[i] ? (end - 1) / C : j0;
                segs.push_back({i, offset[i], end, 0});
                need.push_back(j1 > j0 || C == 0 ? 0 : piece_of(offset[i] - j0 * C));
                continue;
            }
            for (int64_t a = offset[i]; a < end;) {
                const int64_t j = a / C, k = (a - j * C) / R;
                const int64_t b = std::min(end, j * C + std::min((k + 1) * R, C));
                segs.push_back({i, a, b, 0});
                need.push_back(piece_of(a - j * C));
                a = b;
            }
        }
        seg_first[n] = segs.size();
        mm = std::max(segs.size(), kCheckWords - kCheckHeadWords);
        by_slot.resize(segs.size());
        for (size_t s = 0; s < segs.size(); ++s) by_slot[s] = s;
        std::stable_sort(by_slot.begin(), by_slot.end(), [&](size_t x, size_t y) {
            return need[x] != need[y] ? need[x] < need[y] : gather[segs[x].i] < gather[segs[y].i];
        });
        const int64_t pieces = std::max<int64_t>(1, static_cast<int64_t>(bounds.size()) - 1);
        group.assign(static_cast<size_t>(pieces) + 1, 0);
        for (size_t slot = 0; slot < by_slot.size(); ++slot) {
            segs[by_slot[slot]].slot = static_cast<int64_t>(slot);
            ++group[static_cast<size_t>(need[by_slot[slot]]) + 1];
        }
        for (int64_t p = 0; p < pieces; ++p) group[p + 1] += group[p];
    };
    auto validate = [&] {
        Signature sig;
        Hash shapes, dtypes, options;
        shapes.add(n);
        options.add(static_cast<uint64_t>(o.wire)).add(o.average);
        if (!is_fp8(o.wire))
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "desc->wire_dtype is " + std::string(fp8amp_dtype_name(o.wire)) +
                                                  ", not an FP8 dtype (E4M3 or E5M2)");
        for (size_t i = 0; i < n; ++i) {
            const Tensor &in = *inputs[i], &out = *outputs[i];
            check_on_device(*ctx_, in, arg("inputs", i).c_str());
            check_on_device(*ctx_, out, arg("outputs", i).c_str());
            check_writable(out, arg("outputs", i).c_str());
            if (!in.same_shape(out))
                fail(FP8AMP_ERROR_SHAPE_MISMATCH, arg("outputs", i) + " is " + out.describe() + ", " + arg("inputs", i) +
                                                      " is " + in.describe() + ": the shapes differ");
            if (is_fp8(in.dtype()) && !in.scale_inv())
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, arg("inputs", i) + " is FP8 but has no scale_inv (it was never "
                                                                       "bound to a scaling meta), so its values are unknown");
            if (is_fp8(out.dtype()) && !out.scale_inv())
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, arg("outputs", i) + " is FP8 but has no scale_inv slot to receive "
                                                                        "its scale (bind it to a scaling meta once)");
            // No output may share bytes with another output or with another input (one rank's outputs
            // are written only at the end, but its inputs are read at the start).
            for (size_t j = 0; j < n; ++j) {
                if (j == i) continue;
                if (out.overlaps(*inputs[j]))
                    fail(FP8AMP_ERROR_INVALID_ARGUMENT, arg("outputs", i) + " overlaps " + arg("inputs", j));
                if (out.overlaps(*outputs[j]))
                    fail(FP8AMP_ERROR_INVALID_ARGUMENT, arg("outputs", i) + " overlaps " + arg("outputs", j));
            }
            // outputs[i] may be inputs[i] itself, not a part of it.
            if (&out != &in && out.overlaps(in))
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, arg("outputs", i) + " overlaps " + arg("inputs", i));
            gather[i] = is_fp8(out.dtype()) ? out.dtype() : o.wire;
            // Each tensor starts at a multiple of 16 elements of the bucket, so that every piece of
            // every tensor starts aligned for the vectorized device code (the gaps are never read).
            offset[i + 1] = offset[i] + round16(in.numel());
            hash_shape(shapes, in);
            dtypes.add(static_cast<uint64_t>(in.dtype())).add(static_cast<uint64_t>(out.dtype()));
        }
        // The piece size decides how many transport operations the call makes, so every rank must use
        // the same (FP8AMP_COMM_PIECE_ELEMENTS set on some ranks only would otherwise hang them).
        const int64_t chunk = chunk_elements(offset[n], N);
        X = compute_->side_stream(S);
        P = piece_elements(chunk, X != S);
        D = piece_taper();
        pair = N == 2 && exchange_mode() == Exchange::Auto;
        want_peer = pair && peer_writes_wanted();
        // The scratch's memory too: registering a window is collective (registered_scratch).
        options.add(static_cast<uint64_t>(P)).add(static_cast<uint64_t>(D)).add(pair).add(static_cast<uint64_t>(memory_));
        options.add(want_peer);
        sig.shapes = shapes.h;
        sig.dtypes = dtypes.h;
        sig.options = options.h;
        // The scratch too, before the agreement: a rank out of memory refuses like any other. (Memory
        // registered with the transport comes after the agreement: its registration is collective.)
        C = chunk;
        bounds = piece_bounds(C, P, D);
        make_segments();
        scratch(0, 4 * small_words());
        if (memory_ == Transport::kPlain) scratch(1, wire_scratch_bytes(chunk, N), true);
        return sig;
    };
    const char *const op = "fp8amp_comm_all_reduce";
    Signature sig;
    try {
        sig = validate();
        amax_pass();
    } catch (...) {
        // Tell the others (they fail too), then report this rank's own reason.
        if (o.check && N > 1) {
            try {
                exchange_agreement(true, op, true, sig);
            } catch (...) {
            }
        }
        throw;
    }

    const int64_t pieces = static_cast<int64_t>(bounds.size()) - 1;
    const int blocks = grid_blocks();
    // The per-piece agreements of the amaxes go on a third stream Y (CUDA), so that they need not
    // queue behind the piece on the wire (X).
    void *const Y = X == S ? S : compute_->agreement_stream(S);
    // Small per-segment values: the agreed amax of the inputs, the wire's and the output's scale_inv
    // (16 bytes a segment: amax_in, an unused word, wire_si, out_si).
    float *wire_si = reinterpret_cast<float *>(amax_in + 2 * mm), *out_si = reinterpret_cast<float *>(amax_in + 3 * mm);
    // One allocation of 2 N C bytes: `wire` (the first N C) and `recv` (the next N C), so that the
    // two-rank layout below may address one rank's codes in each from one base and a stride; then
    // kTokenBytes a rank for the peer writes' ordering all-gathers (`token`).
    const size_t wire_bytes = wire_scratch_bytes(C, N);
    // Registered memory that must grow is registered collectively, so only after the check's verdict;
    // already large enough (every call after the first with the same sizes), it is there before.
    uint8_t *wire = nullptr, *recv = nullptr, *token = nullptr;
    // The peer writes (peer_writes_wanted): the peer's copy of the window, at the same offsets as
    // this rank's; set with the scratch, before any quantization.
    bool peer = false;
    uint8_t *peer_wire = nullptr, *peer_recv = nullptr;
    auto get_wire = [&] {
        wire = static_cast<uint8_t *>(memory_ == Transport::kPlain ? scratch(1, wire_bytes, true)
                                                                   : registered_scratch(1, wire_bytes));
        recv = wire + static_cast<size_t>(C) * N;
        token = wire + static_cast<size_t>(C) * N * 2;
        if (!want_peer || memory_ != Transport::kWindow || !peer_[1]) return;
        peer_wire = peer_[1];  // the peer's copy of scratch_[1], whose data() wire is
        peer_recv = peer_wire + (recv - wire);
        peer = true;
    };
    if (memory_ == Transport::kPlain || (scratch_[1] && scratch_[1]->nbytes() >= wire_bytes)) get_wire();
    // The call's saturations, counted in scratch and added to the communicator's count once its last
    // transfer is enqueued: a refused call (whose first quantization may have run, step 1b) or one
    // that failed while enqueuing counts none.
    auto *sat = reinterpret_cast<unsigned long long *>(amax_in + 4 * mm);
    const int64_t lo_r = static_cast<int64_t>(r) * C;

    // Where the codes are (docs/communicator.md, "Data path"), for piece p = [lo, hi) of a chunk, L =
    // hi - lo bytes. Every piece has its own bytes (nothing of piece p is touched by another piece's
    // operations), so the pieces can be at different steps at once:
    //  - reduce-scatter half, two ranks (pair): one in-place all-gather of recv[2 lo, 2 lo + 2 L):
    //    rank r contributes, at its block r, its codes of the piece of the other rank's chunk and
    //    receives, at block 1 - r, the other rank's codes of the piece of its own chunk;
    //  - reduce-scatter half, otherwise: rank r's codes of chunk j's piece at wire[N lo + j L, ...)
    //    (piece-major, the second half's blocks: the piece's all-gather overwrites them after its
    //    sends), received at recv + j C + lo;
    //  - a rank's own chunk is never quantized into memory: the requantization reads its input and
    //    quantizes it in registers (reduce_requantize's OwnInput), so its codes are neither written
    //    nor read back, nor copied to itself;
    //  - all-gather half: piece-major, wire[N lo, N lo + N L), rank j's codes at block j: one
    //    in-place all-gather per piece.
    auto piece = [&](int64_t p) { return std::make_pair(bounds[p], bounds[p + 1]); };
    // The codes of every other rank for element k of this rank's piece p: rank j's at base + j *
    // stride (j != r; base + r * stride is never read). Two ranks: the peer's codes at block 1 - r of
    // the piece's first all-gather, so base = peer - (1 - r) * L with stride L.
    auto codes_of = [&](int64_t lo, int64_t hi, int64_t k) -> std::pair<const uint8_t *, int64_t> {
        if (!pair) return {recv + lo + k, C};
        const int64_t L = hi - lo;
        return {recv + 2 * lo + k, L};
    };
    // Where rank r quantizes its codes of element k of piece p of chunk j (j != r): with the peer
    // writes, at the same place in the peer's window, where the all-gather would have copied them.
    auto wire_of = [&](int64_t lo, int64_t hi, int j, int64_t k) -> uint8_t * {
        const int64_t L = hi - lo;
        return pair ? (peer ? peer_recv : recv) + 2 * lo + r * L + k : wire + N * lo + j * L + k;
    };
    // Where the conversions overlap the transfers (X != S: CUDA), the requantization writes this rank's
    // own chunk of the outputs as well (from the codes it has in registers: no pass over them after
    // the all-gather); otherwise (CPU: synchronous, one piece) the outputs are all written in the last
    // step, after every transfer, so that a failed transfer leaves them unchanged.
    const bool own_outputs_early = X != S;

    // f(i, a, b) for each tensor i with elements in the bucket range [lo, hi): its part [a, b).
    auto each = [&](int64_t lo, int64_t hi, auto &&f) {
        size_t i = static_cast<size_t>(std::upper_bound(offset.begin(), offset.end() - 1, lo) - offset.begin());
        for (i = i > 0 ? i - 1 : 0; i < n && offset[i] < hi; ++i) {
            const int64_t a = std::max(lo, offset[i]), b = std::min(hi, offset[i] + inputs[i]->numel());
            if (a < b) f(i, a, b);
        }
    };

    // f(i, slot, a, b) for each scale segment with elements in the bucket range [lo, hi): its part
    // [a, b) of tensor i, and the segment's slot.
    auto each_segment = [&](int64_t lo, int64_t hi, auto &&f) {
        each(lo, hi, [&](size_t i, int64_t a, int64_t b) {
            const Segment *g = segs.data() + seg_first[i], *last = segs.data() + seg_first[i + 1];
            g = std::upper_bound(g, last, a, [](int64_t v, const Segment &s) { return v < s.b; });
            for (; g < last && g->a < b; ++g) f(i, g->slot, std::max(a, g->a), std::min(b, g->b));
        });
    };
    // The agreement of piece p's amaxes (all-reduce MAX, on `stream`) and, on S, their scales: one
    // launch per output format.
    auto agree_amaxes = [&](int64_t p, void *stream) {
        if (group[p + 1] > group[p])
            transport_->allreduce_max_u32(amax_in + group[p], static_cast<size_t>(group[p + 1] - group[p]), stream);
    };
    auto scales = [&](int64_t p) {
        for (int64_t s = group[p]; s < group[p + 1];) {
            const fp8amp_dtype f = gather[segs[by_slot[s]].i];
            int64_t e = s + 1;
            while (e < group[p + 1] && gather[segs[by_slot[e]].i] == f) ++e;
            compute_->all_reduce_scales(amax_in + s, e - s, o.wire, f, N, o.average, wire_si + s, out_si + s, S);
            s = e;
        }
    };
    auto has_amaxes = [&](int64_t p) { return group[p + 1] > group[p]; };

    // The steps of piece p: quantize (Q, on S: piece p of every rank's chunk onto the wire with the
    // agreed scale), reduce-scatter (RS, on X: piece p of chunk j to rank j), reduce + requantize (R,
    // on S: the float32 sum in rank order of piece p of this rank's chunk, requantized with the same
    // agreed scale into this rank's block of the piece's all-gather; no new amax, so no agreement
    // and no second pass), all-gather (AG, on X, in place) and decode (D, on S: every rank's block of
    // the piece into the outputs, codes or their values).
    auto quantize_piece = [&](int64_t p) {
        const int64_t lo = piece(p).first, hi = piece(p).second;  // not a structured binding: C++17 lambdas cannot capture one (clang refuses)
        for (int j = 0; j < N; ++j) {
            if (j == r) continue;  // read by the requantization itself
            each_segment(j * C + lo, j * C + hi, [&](size_t i, int64_t slot, int64_t a, int64_t b) {
                const Tensor &in = *inputs[i];
                compute_->quantize(element(in, a - offset[i]), in.dtype(), in.scale_inv(), b - a, amax_in + slot,
                                   o.wire, wire_of(lo, hi, j, a - j * C - lo), nullptr, sat, S);
            });
        }
    };
    // The peer writes' transfer: a 16-byte all-gather of `token` on X, which completes on a rank only
    // once every rank has reached it, that is (X waits for S first) once every rank's conversions
    // before it, and so their stores into this rank's window, are done.
    auto order_ranks = [&] { transport_->all_gather_scratch(token + kTokenBytes * r, token, kTokenBytes, X); };
    auto reduce_scatter_piece = [&](int64_t p) {
        if (N == 1) return;
        if (peer) return order_ranks();
        const int64_t lo = piece(p).first, hi = piece(p).second;  // not a structured binding: C++17 lambdas cannot capture one (clang refuses)
        const size_t L = static_cast<size_t>(hi - lo);
        if (pair) {
            transport_->all_gather_scratch(recv + 2 * lo + r * L, recv + 2 * lo, L, X);
            return;
        }
        transport_->group_start();
        for (int j = 0; j < N; ++j) {
            if (j == r) continue;
            transport_->send(wire + N * lo + j * L, L, j, X);
            transport_->recv(recv + j * C + lo, L, j, X);
        }
        transport_->group_end(X);
    };
    auto reduce_piece = [&](int64_t p) {
        const int64_t lo = piece(p).first, hi = piece(p).second;  // not a structured binding: C++17 lambdas cannot capture one (clang refuses)
        // This rank's block of the piece's all-gather; with the peer writes, in the peer's window.
        uint8_t *block = (peer ? peer_wire : wire) + N * lo + r * (hi - lo);
        each_segment(lo_r + lo, lo_r + hi, [&](size_t i, int64_t slot, int64_t a, int64_t b) {
            const auto [src, stride] = codes_of(lo, hi, a - lo_r - lo);
            const Tensor &in = *inputs[i];
            Tensor &out = *outputs[i];
            const kernels::CommCompute::OwnInput own{element(in, a - offset[i]), in.dtype(), in.scale_inv(), amax_in + slot};
            const kernels::CommCompute::OwnOutput early{own_outputs_early ? element(out, a - offset[i]) : nullptr,
                                                        out.dtype(), out_si + slot};
            compute_->reduce_requantize(src, stride, N, r, own, b - a, o.wire, gather[i], block + (a - lo_r - lo), early,
                                        sat, S);
        });
    };
    auto all_gather_piece = [&](int64_t p) {
        if (N == 1) return;
        if (peer) return order_ranks();
        const int64_t lo = piece(p).first, hi = piece(p).second;  // not a structured binding: C++17 lambdas cannot capture one (clang refuses)
        const size_t L = static_cast<size_t>(hi - lo);
        transport_->all_gather_scratch(wire + N * lo + r * L, wire + N * lo, L, X);
    };
    auto decode_piece = [&](int64_t p, void *stream) {
        const int64_t lo = piece(p).first, hi = piece(p).second;  // not a structured binding: C++17 lambdas cannot capture one (clang refuses)
        for (int j = 0; j < N; ++j) {
            if (j == r && own_outputs_early) continue;  // written by the requantization
            const uint8_t *block = wire + N * lo + j * (hi - lo);
            each_segment(j * C + lo, j * C + hi, [&](size_t i, int64_t slot, int64_t a, int64_t b) {
                Tensor &out = *outputs[i];
                const uint8_t *codes = block + (a - j * C - lo);
                if (is_fp8(out.dtype()))
                    compute_->copy_async(element(out, a - offset[i]), codes, static_cast<size_t>(b - a), stream);
                else
                    compute_->dequantize(codes, gather[i], out_si + slot, b - a, element(out, a - offset[i]),
                                         out.dtype(), stream);
            });
        }
    };

    // 1b. The first piece's scales for all ranks: the max over the ranks of its segments' amaxes (the
    // pass above, on S), on X once A(0) is done; from it the wire's scale_inv and the output's
    // (comm_requant_scale_inv), on S, before any piece. (X is idle until the first piece's transfer,
    // which needs these scales anyway.) With the check, that agreement *is* the check's exchange:
    // the check's words (put in front of the amaxes) and the first kCheckWords - kCheckHeadWords amax
    // slots go in one all-reduce MAX -- a size every rank knows without agreeing on anything, so a
    // mismatch cannot hang it -- and the host reads the check's words back while S computes the
    // scales and the first quantization (Q(0), into the wire scratch, its saturations into the call's
    // count). So the check adds no collective and no gap on the device: the host waits for the
    // verdict while Q(0) runs, then enqueues the rest. (It does wait for the caller's work queued on
    // S before the call: A(0) follows it, and the agreement needs A(0).) A refused call has written
    // scratch only (A(0), the scales, Q(0)'s codes and count; with the peer writes Q(0)'s codes went into
    // the peer's window: harmless, since a call reads there only codes its peer stored in that call before
    // the ordering all-gather it waits for, and the refused Q(0) is done before the next call's first
    // collective). Where piece 0's segments do not fit the exchange (a bucket of hundreds of
    // small tensors), their own agreement follows the check, as without it; where the wire scratch
    // must grow first (registered memory: collective), Q(0) follows the verdict.
    compute_->record(0, S);
    compute_->wait(0, X);
    // The later pieces' amaxes (A(t), t >= 1) go on the agreement stream Y with their agreements
    // (CUDA; the CPU's Y is S): they depend on nothing S does after the first agreement (a segment's
    // elements lie in pieces >= the one that needs it, which no requantization or decoding has
    // written before that piece's quantization, and Q(t) waits for G(t), after A(t) on Y), so they
    // run beside S's conversions instead of queuing between them. Y waits once, for the first
    // agreement (slot 1): the slots' zeroing and A(0) on S, the inputs the caller made before the
    // call, and the check's exchange of the first amax slots, all done. (Measured on 2 x H100:
    // 1227-1232 us a call without the check against 1246 with these amaxes on S, in one run.)
    bool later_amaxes_started = false;
    auto start_later_amaxes = [&] {
        if (later_amaxes_started) return;
        later_amaxes_started = true;
        compute_->wait(1, Y);
    };
    bool first_agreed = false;     // piece 0's amaxes agreed by the check's exchange
    bool first_quantized = false;  // and Q(0) enqueued before the verdict
    bool second_amaxes = false;    // and A(1)
    if (o.check && N > 1) {
        const size_t words = Transport::agree_words(3);
        std::vector<uint32_t> w(kCheckHeadWords, 0u);
        const uint64_t sigs[3] = {sig.shapes, sig.dtypes, sig.options};
        Transport::encode_agreement(sigs, 3, false, w.data());
        try {
            transport_->put_words(head, w.data(), kCheckHeadWords, X);
            transport_->allreduce_max_u32(head, kCheckWords, X);
        } catch (...) {
            try {  // S stays ordered after X, whatever the outcome
                compute_->record(1, X);
                compute_->wait(1, S);
            } catch (...) {
            }
            throw;
        }
        compute_->record(1, X);
        compute_->wait(1, S);
        first_agreed = group[1] <= static_cast<int64_t>(kCheckWords - kCheckHeadWords);
        if (first_agreed) {
            scales(0);
            if (wire) {
                compute_->set_grid_limit(0);
                quantize_piece(0);
                first_quantized = true;
                // And the next piece's amaxes (on Y, as the pipeline puts them): more work queued
                // while the host waits, so that the device does not wait for the host's enqueuing of
                // the rest after the verdict (measured on 2 x H100: with Q(0) alone queued, the check
                // added 8-150 us to a call, varying from call to call; with A(1) too, 4-27 us).
                if (pieces > 1 && has_amaxes(1)) {
                    start_later_amaxes();
                    amaxes_on(1, Y);
                    second_amaxes = true;
                }
            }
        }
        try {
            transport_->fetch_words(head, words, X);
            transport_->fetched_words(w.data(), words, X, "the consistency check");
            bool same[3] = {true, true, true};
            const bool any_failed = Transport::decode_agreement(w.data(), 3, same);
            check_verdict(op, any_failed, same);
        } catch (...) {
            // A refused (or failed) call returns with A(1) perhaps still queued on Y: S waits for it
            // (slot 6), so that the caller's next work on S -- freeing the inputs it reads, the next
            // call's use of the amax slots it writes -- comes after it.
            if (later_amaxes_started) {
                try {
                    compute_->record(6, Y);
                    compute_->wait(6, S);
                } catch (...) {
                }
            }
            throw;
        }
    }
    if (!wire) get_wire();
    if (!first_agreed) {
        agree_amaxes(0, X);
        // The peer writes store into the other rank's window, which that rank's previous call read:
        // its reads must be done first. Any collective on X after S's earlier work orders that (the
        // check's exchange, piece 0's agreement); where neither ran, an ordering all-gather does.
        if (peer && !(o.check && N > 1) && !has_amaxes(0)) order_ranks();
        compute_->record(1, X);
        compute_->wait(1, S);
        scales(0);
    }

    // 2-7, a pipeline of the pieces over the streams (S: Q, R, D; X: RS, AG; Y: A, G; A(0) on S,
    // before the first agreement). At step t the host enqueues
    //   S: Q(t) (after G(t))  -> X: RS(t)  ;  Y: A(t+1) -> G(t+1)  ;
    //   S: R(t-1) (after RS(t-1))  -> X: AG(t-1)  ;  S: D(t-2) (after AG(t-2))
    // where A(p) is the local amax of the segments piece p needs first and G(p) their agreement (the
    // segments' scales follow on S right before Q(p)): A(t+1) and G(t+1) run on their own stream
    // beside the transfers and the conversions (Y waits once, for the first agreement:
    // start_later_amaxes), and A(t+1) reads inputs that no R or D has written (a segment's elements lie in
    // pieces >= the one that needs it, requantized after Q(t+1), which waits for G(t+1), and decoded
    // at step >= t + 3). Slot 7 (G(t+1) done, waited by S at step t + 1 before its next record)
    // hands them back; every Y operation is joined back to S. So the transfers of pieces t and t - 1
    // overlap the conversions of pieces t - 1, t - 2 and t + 1 and the amaxes of piece t + 1;
    // every hand-over is an event (no host synchronization): slot 0 S -> X (recorded and waited
    // at once), slots 2 + t % 2 "RS(t) done" and 4 + t % 2 "AG(t) done" alternate, so that a slot is
    // recorded again only after the wait for its previous mark was enqueued (a wait sees the latest
    // record). S waits for X's last operation before the call returns (the last D waits for the last
    // AG), so the call is ordered on S and capturable. The CPU (synchronous, one stream) runs the same
    // sequence in this order, which is one order the GPU's streams may take: a piece that read data
    // not yet written on the GPU reads it unwritten on the CPU too, so the CPU tests with small pieces
    // (FP8AMP_COMM_PIECE_ELEMENTS) check the pipeline's ordering as well. With the CPU's default of one
    // piece every transfer comes before any output is written, so that a failed transfer leaves the
    // outputs unchanged. The conversions that run beside a transfer get the grid of grid_blocks(); the
    // first quantization and the last decoding run beside nothing (full grid).
    //
    // With the peer writes, X carries no copies, only the ordering all-gathers, and the decodings go
    // there instead of S: D(t - 2) right after AG(t - 2) on X, enqueued at the start of step t, so that
    // it runs beside Q(t) and R(t - 1) on S, whose stores into the peer's window load NVLink while the
    // decoding loads the memory. D(t - 2) writes the outputs of piece t - 2 of the other rank's chunk,
    // which nothing on S or Y reads or writes after step t - 2 (Q(t) and A(t + 1) read pieces >= t, R
    // writes this rank's own chunk); S waits for X's last decoding before the call returns.
    for (int64_t t = 0; t < pieces + 2; ++t) {
        compute_->set_grid_limit(t == 0 ? 0 : blocks);
        if (peer && t >= 2) {
            if (t - 2 == pieces - 1) compute_->set_grid_limit(0);
            decode_piece(t - 2, X);
            compute_->set_grid_limit(blocks);
        }
        if (t < pieces) {
            if (t >= 1 && has_amaxes(t)) {
                compute_->wait(7, S);
                scales(t);
            }
            if (t > 0 || !first_quantized) quantize_piece(t);
            compute_->record(0, S);
            compute_->wait(0, X);
            reduce_scatter_piece(t);
            compute_->record(2 + int(t % 2), X);
            if (t + 1 < pieces && has_amaxes(t + 1)) {
                start_later_amaxes();
                if (t > 0 || !second_amaxes) amaxes_on(t + 1, Y);
                agree_amaxes(t + 1, Y);
                compute_->record(7, Y);
            }
        }
        if (t >= 1 && t - 1 < pieces) {
            compute_->wait(2 + int((t - 1) % 2), S);
            reduce_piece(t - 1);
            compute_->record(0, S);
            compute_->wait(0, X);
            all_gather_piece(t - 1);
            compute_->record(4 + int((t - 1) % 2), X);
            // Every transfer enqueued, every saturation counted (Q and R; the decodings count none):
            // the call's count joins the communicator's, on S before the last decodings.
            if (t == pieces) compute_->add_count(static_cast<unsigned long long *>(saturated_->data()), sat, S);
        }
        if (t >= 2 && !peer) {
            compute_->wait(4 + int((t - 2) % 2), S);
            if (t - 2 == pieces - 1) compute_->set_grid_limit(0);
            decode_piece(t - 2, S);
        }
    }
    if (peer) {
        compute_->record(0, X);
        compute_->wait(0, S);
    }
    compute_->set_grid_limit(0);
    for (size_t i = 0; i < n; ++i) {
        Tensor &out = *outputs[i];
        if (is_fp8(out.dtype())) compute_->copy_async(out.scale_inv(), out_si + segs[seg_first[i]].slot, sizeof(float), S);
        out.mark_written();
    }
}

void Communicator::reduce_scatter(const std::shared_ptr<Tensor> &input, const std::shared_ptr<Tensor> &output,
                                  const CommReduceOptions &o) {
    const int N = nranks(), r = rank();
    const size_t xs = exchange_slot();
    bool pair = false;  // two ranks: the exchange as one all-gather (exchange_mode), agreed
    agreed(o.check, "fp8amp_comm_reduce_scatter", [&] {
        Signature sig;
        Hash shapes, dtypes, options;
        pair = N == 2 && exchange_mode() == Exchange::Auto;
        options.add(static_cast<uint64_t>(o.wire)).add(o.average).add(pair);
        if (!is_fp8(o.wire))
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "desc->wire_dtype is " + std::string(fp8amp_dtype_name(o.wire)) +
                                                  ", not an FP8 dtype (E4M3 or E5M2)");
        check_on_device(*ctx_, *input, "input");
        check_on_device(*ctx_, *output, "output");
        check_writable(*output, "output");
        if (input->numel() != output->numel() * N)
            fail(FP8AMP_ERROR_SHAPE_MISMATCH, "input is " + input->describe() + " and output " + output->describe() +
                                                  ": input must hold nranks (" + std::to_string(N) +
                                                  ") times output's elements");
        if (is_fp8(input->dtype()) && !input->scale_inv())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "input is FP8 but has no scale_inv (never bound to a scaling meta)");
        if (is_fp8(output->dtype()) && !output->scale_inv())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT,
                 "output is FP8 but has no scale_inv slot to receive its scale (bind it to a scaling meta once)");
        check_not_overlapping(*output, "output", *input, "input");
        if (output.get() == input.get()) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "output is input");
        hash_shape(shapes, *input);
        hash_shape(shapes, *output);
        dtypes.add(static_cast<uint64_t>(input->dtype())).add(static_cast<uint64_t>(output->dtype()));
        sig.shapes = shapes.h;
        sig.dtypes = dtypes.h;
        sig.options = options.h;
        const size_t k = static_cast<size_t>(output->numel());
        scratch(0, 16);
        if (pair) {
            scratch(xs, static_cast<size_t>(round16(static_cast<int64_t>(k))) * 3, true);
        } else {
            scratch(xs, k * N);
            scratch(2, k * N);
        }
        if (output->dtype() != FP8AMP_DTYPE_F32 && !is_fp8(output->dtype())) scratch(3, k * sizeof(float));
        return sig;
    });

    void *stream = ctx_->stream();
    const int64_t k = output->numel();
    const size_t total = static_cast<size_t>(k) * static_cast<size_t>(N);
    auto *small = static_cast<uint32_t *>(scratch(0, 16));
    uint32_t *amax_in = small, *amax_out = small + 1;
    float *wire_si = reinterpret_cast<float *>(small + 2);
    const bool direct = output->dtype() == FP8AMP_DTYPE_F32;  // accumulate straight into the output
    auto *red = direct || is_fp8(output->dtype())
                    ? static_cast<float *>(output->data())  // (unused for FP8)
                    : static_cast<float *>(scratch(3, static_cast<size_t>(k) * sizeof(float)));
    auto *sat = static_cast<unsigned long long *>(saturated_->data());

    compute_->memset_async(small, 0, 8, stream);
    compute_->amax(input->data(), input->dtype(), input->scale_inv(), input->numel(), amax_in, stream);
    transport_->allreduce_max_u32(amax_in, 1, stream);
    // Slice j of the input goes to rank j, as in the all-reduce's first half ("Data path" in
    // docs/communicator.md): two ranks, one in-place all-gather of B[0, 2 K) (K: k rounded up to 16,
    // so that every block starts aligned), rank r contributing its codes of slice 1 - r at block r
    // and receiving the other rank's codes of slice r at block 1 - r, its own codes of slice r at
    // B + 2 K; otherwise grouped sends and receives to the other ranks, rank j's codes arriving at
    // recv + j k and this rank's own slice quantized straight into recv + r k (no copy to itself).
    const uint8_t *codes = nullptr;  // rank j's codes of slice r at codes + j * stride
    int64_t stride = k;
    auto quantize_slice = [&](int j, uint8_t *dst) {
        compute_->quantize(element(*input, static_cast<int64_t>(j) * k), input->dtype(), input->scale_inv(), k, amax_in,
                           o.wire, dst, wire_si, sat, stream);
    };
    if (pair) {
        const int64_t K = round16(k);
        auto *B = static_cast<uint8_t *>(scratch(xs, static_cast<size_t>(K) * 3, true));
        quantize_slice(1 - r, B + r * K);
        quantize_slice(r, B + 2 * K);
        transport_->all_gather(B + r * K, B, static_cast<size_t>(K), stream);
        const uint8_t *own = B + 2 * K, *peer = B + (1 - r) * K;
        codes = r == 0 ? own : peer;
        stride = r == 0 ? peer - own : own - peer;
    } else {
        auto *wire = static_cast<uint8_t *>(scratch(xs, total));
        auto *recv = static_cast<uint8_t *>(scratch(2, total));
        for (int j = 0; j < N; ++j) quantize_slice(j, (j == r ? recv : wire) + static_cast<size_t>(j) * k);
        if (N > 1) {
            transport_->group_start();
            for (int j = 0; j < N; ++j) {
                if (j == r) continue;
                transport_->send(wire + static_cast<size_t>(j) * k, static_cast<size_t>(k), j, stream);
                transport_->recv(recv + static_cast<size_t>(j) * k, static_cast<size_t>(k), j, stream);
            }
            transport_->group_end(stream);
        }
        codes = recv;
    }
    // From here on nothing can fail: the output is written.
    if (is_fp8(output->dtype())) {
        // Per-shard scale: this shard's own amax. Two passes over the FP8 codes (the amax of the
        // reduced values, then the same values again, quantized), no float32 buffer.
        compute_->accumulate(codes, stride, N, k, o.wire, wire_si, o.average, nullptr, amax_out, stream);
        compute_->scale_inv(amax_out, output->dtype(), output->scale_inv(), stream);
        compute_->accumulate_quantize(codes, stride, N, k, o.wire, wire_si, o.average, amax_out, output->dtype(),
                                      static_cast<uint8_t *>(output->data()), sat, stream);
    } else {
        compute_->accumulate(codes, stride, N, k, o.wire, wire_si, o.average, red, amax_out, stream);
        if (!direct) compute_->convert(red, k, output->data(), output->dtype(), stream);
    }
    output->mark_written();
}

void Communicator::all_gather(const std::shared_ptr<Tensor> &input, const std::shared_ptr<Tensor> &output,
                              const std::shared_ptr<Tensor> &output_scale_inv, bool check) {
    const int N = nranks();
    const size_t xs = exchange_slot();
    agreed(check, "fp8amp_comm_all_gather", [&] {
        Signature sig;
        Hash shapes, dtypes;
        check_on_device(*ctx_, *input, "input");
        check_on_device(*ctx_, *output, "output");
        check_writable(*output, "output");
        if (output->dtype() != input->dtype())
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "output is " + output->describe() + ", input " + input->describe() +
                                                  ": an all-gather keeps the dtype");
        if (output->numel() != input->numel() * N)
            fail(FP8AMP_ERROR_SHAPE_MISMATCH, "output is " + output->describe() + " and input " + input->describe() +
                                                  ": output must hold nranks (" + std::to_string(N) +
                                                  ") times input's elements");
        check_not_overlapping(*output, "output", *input, "input");
        if (output.get() == input.get()) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "output is input");
        if (is_fp8(input->dtype())) {
            if (!input->scale_inv())
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, "input is FP8 but has no scale_inv (never bound to a scaling meta)");
            if (!output_scale_inv)
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, "output_scale_inv is NULL, but input is FP8: it receives the "
                                                    "scale_inv of each rank's shard");
            check_on_device(*ctx_, *output_scale_inv, "output_scale_inv");
            check_writable(*output_scale_inv, "output_scale_inv");
            if (output_scale_inv->dtype() != FP8AMP_DTYPE_F32)
                fail(FP8AMP_ERROR_DTYPE_MISMATCH, "output_scale_inv is " + output_scale_inv->describe() + ", not F32");
            if (output_scale_inv->numel() != N)
                fail(FP8AMP_ERROR_SHAPE_MISMATCH, "output_scale_inv is " + output_scale_inv->describe() + ", not of nranks (" +
                                                      std::to_string(N) + ") elements");
            check_not_overlapping(*output_scale_inv, "output_scale_inv", *input, "input");
            check_not_overlapping(*output_scale_inv, "output_scale_inv", *output, "output");
        } else if (output_scale_inv) {
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "output_scale_inv is given, but input is " + input->describe() +
                                                    ", not FP8: pass NULL");
        }
        hash_shape(shapes, *input);
        hash_shape(shapes, *output);
        dtypes.add(static_cast<uint64_t>(input->dtype()));
        sig.shapes = shapes.h;
        sig.dtypes = dtypes.h;
        scratch(xs, input->nbytes() * N);
        scratch(0, sizeof(float) * N);
        return sig;
    });
    void *stream = ctx_->stream();
    // Gathered through scratch, so that a failure leaves the output unchanged.
    const size_t bytes = input->nbytes();
    const bool fp8 = is_fp8(input->dtype());
    auto *buf = static_cast<uint8_t *>(scratch(xs, bytes * N));
    auto *scales = static_cast<float *>(scratch(0, sizeof(float) * N));
    transport_->all_gather(input->data(), buf, bytes, stream);
    if (fp8) transport_->all_gather(input->scale_inv(), scales, sizeof(float), stream);
    compute_->copy_async(output->data(), buf, bytes * N, stream);
    if (fp8) {
        compute_->copy_async(output_scale_inv->data(), scales, sizeof(float) * N, stream);
        output_scale_inv->mark_written();
    }
    output->mark_written();
}

}  // namespace fp8amp::core
