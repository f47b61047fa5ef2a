// A communicator (fp8amp_comm): the FP8 gradient all-reduce, reduce-scatter and all-gather of
// docs/communicator.md over a Transport (MPI, NCCL or local) and the device compute of
// kernels/comm.hpp, both chosen once, when the communicator is made, from its context's device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm.hpp"
#include "comm_transport.hpp"
#include "context.hpp"
#include "handles.hpp"

namespace fp8amp::core {

using kernels::Transport;


class Tensor;

struct CommReduceOptions {
    fp8amp_dtype wire = FP8AMP_DTYPE_E4M3;
    bool average = true;
    bool check = true;
};

class Communicator {
public:
    static constexpr HandleKind kKind = HandleKind::Communicator;

    static void unique_id(const Context &ctx, fp8amp_comm_unique_id *id);
    static std::shared_ptr<Communicator> create(std::shared_ptr<const Context> ctx, const fp8amp_comm_unique_id &id,
                                                int nranks, int rank);
    static std::shared_ptr<Communicator> adopt(std::shared_ptr<const Context> ctx, void *native);
    ~Communicator();

    const Context &context() const { return *ctx_; }  // the sharded optimizer checks its device
    int rank() const { return transport_->rank(); }
    int nranks() const { return transport_->nranks(); }
    void set_timeout(double seconds) { transport_->set_timeout(seconds); }
    void abort() { transport_->abort(); }
    uint64_t saturated() const;

    // Each validates its arguments, then (options.check) agrees with the other ranks on them, so that
    // a rank's refusal or a mismatch fails on every rank before any data moves.
    void all_reduce(const std::vector<std::shared_ptr<Tensor>> &inputs,
                    const std::vector<std::shared_ptr<Tensor>> &outputs, const CommReduceOptions &options);
    void reduce_scatter(const std::shared_ptr<Tensor> &input, const std::shared_ptr<Tensor> &output,
                        const CommReduceOptions &options);
    void all_gather(const std::shared_ptr<Tensor> &input, const std::shared_ptr<Tensor> &output,
                    const std::shared_ptr<Tensor> &output_scale_inv, bool check);

    // The agreement step on its own: runs `validate` (which throws on bad local arguments), then
    // exchanges its outcome and the signatures; throws on every rank alike when any rank refused or
    // a signature differs. Public for the boundary, whose handle lookups are validation too.
    struct Signature {
        uint64_t shapes = 0, dtypes = 0, options = 0;
    };
    // local_only: a preliminary validation (the boundary's handle lookups) whose success exchanges
    // nothing (the operation's own agreement follows) but whose failure takes part in that agreement.
    template <class Validate>
    void agreed(bool check, const char *op, Validate &&validate, bool local_only = false);

    // Every consistency check exchanges this many 32-bit words (an all-reduce MAX): the check's
    // Transport::agree_words(3) first, then, in the all-reduce, its first piece's amaxes (from word
    // kCheckHeadWords on), so that the check costs no collective of its own there; elsewhere zeros.
    // One size for every collective, so that ranks that call different ones still exchange alike.
    static constexpr size_t kCheckWords = 256;
    static constexpr size_t kCheckHeadWords = 16;  // agree_words(3) = 13, rounded up to 16

private:
    Communicator(std::shared_ptr<const Context> ctx, std::unique_ptr<kernels::CommCompute> compute,
                 std::unique_ptr<Transport> transport);
    // The consistency check on the context's stream (kCheckWords words; when failed, this rank's
    // refusal, which the others hear): throws on every rank alike when any rank refused or a signature
    // differs.
    void exchange_agreement(bool check, const char *op, bool failed, const Signature &sig);
    // The verdict of a check's decoded words (any_failed, same[3]): throws the status that says why.
    void check_verdict(const char *op, bool any_failed, const bool same[3]) const;
    // Grow-only scratch slot of the context's device memory.
    void *scratch(size_t slot, size_t nbytes, bool zero = false);
    // The same in memory registered with the transport (memory_), agreed between the ranks when it
    // grows; falls back to scratch() (and memory_ to plain) where the ranks cannot all have it.
    void *registered_scratch(size_t slot, size_t nbytes);

    std::shared_ptr<const Context> ctx_;
    std::unique_ptr<kernels::CommCompute> compute_;
    std::unique_ptr<Transport> transport_;
    std::shared_ptr<Storage> saturated_;  // unsigned long long, on the device
    // Slots: 0 small values, 1 the all-reduce's codes (the exchanges' too while it is plain memory),
    // 2 and 3 the reduce-scatter's, 4 the agreements', 5 the reduce-scatter's and all-gather's
    // exchange while slot 1 is a window (exchange_slot).
    static constexpr size_t kSlots = 6;
    // Where the reduce-scatter and the all-gather put what they exchange: slot 1, shared with the
    // all-reduce, unless the all-reduce's scratch is a symmetric window (memory_ kWindow): then a
    // plain block of its own, so that only the all-reduce's all-gathers ever name window memory
    // (NCCL sends an all-gather between windows to copy engines under NCCL_CTA_POLICY_ZERO, which
    // fails on the legacy default stream: docs/communicator.md, "Data path"), and so that the two do
    // not take turns growing and re-registering one block.
    size_t exchange_slot() const { return memory_ == Transport::kWindow ? 5 : 1; }
    std::shared_ptr<Storage> scratch_[kSlots];
    bool registered_[kSlots] = {};  // whether scratch_[slot] came from the transport (alloc_registered)
    // The other rank's copy of scratch_[slot], where every rank has its peer's (a window that NCCL
    // maps between the two ranks; agreed in registered_scratch), else nullptr: the all-reduce's
    // peer writes.
    uint8_t *peer_[kSlots] = {};
    // Where the all-reduce's scratch comes from (FP8AMP_COMM_NCCL_MEMORY when the communicator was made,
    // else the transport's default); plain from the first growth on where the ranks disagree.
    Transport::RegisteredMemory memory_ = Transport::kPlain;
};

template <class Validate>
void Communicator::agreed(bool check, const char *op, Validate &&validate, bool local_only) {
    Signature sig;
    try {
        sig = validate();
    } catch (...) {
        // Tell the others (they fail too), then report this rank's own reason.
        if (check && nranks() > 1) {
            try {
                exchange_agreement(true, op, true, sig);
            } catch (...) {
            }
        }
        throw;
    }
    if (!local_only) exchange_agreement(check, op, false, sig);
}

}  // namespace fp8amp::core
