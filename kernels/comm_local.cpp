// The one-rank transport: no library, no peers. A send to oneself is a copy at the end of the group.
#include <atomic>
#include <vector>

#include "comm_transport.hpp"
#include "error.hpp"

namespace fp8amp::kernels {
namespace {

class LocalTransport final : public Transport {
public:
    using CopyFn = void (*)(void *, void *, const void *, size_t, void *);
    LocalTransport(CopyFn copy, void *copy_ctx) : copy_(copy), copy_ctx_(copy_ctx) {}
    int rank() const override { return 0; }
    int nranks() const override { return 1; }
    const char *name() const override { return "local"; }
    void allreduce_max_u32(uint32_t *, size_t, void *) override { check(); }
    void group_start() override {
        check();
        sends_.clear();
        recvs_.clear();
    }
    void send(const void *buf, size_t nbytes, int, void *) override { sends_.push_back({const_cast<void *>(buf), nbytes}); }
    void recv(void *buf, size_t nbytes, int, void *) override { recvs_.push_back({buf, nbytes}); }
    void group_end(void *stream) override {
        if (sends_.size() != recvs_.size()) fail(FP8AMP_ERROR_INTERNAL, "local transport: unmatched send/recv");
        for (size_t i = 0; i < sends_.size(); ++i) {
            if (sends_[i].nbytes != recvs_[i].nbytes) fail(FP8AMP_ERROR_INTERNAL, "local transport: size mismatch");
            if (sends_[i].buf != recvs_[i].buf) copy_(copy_ctx_, recvs_[i].buf, sends_[i].buf, sends_[i].nbytes, stream);
        }
        sends_.clear();
        recvs_.clear();
    }
    void all_gather(const void *send, void *recv, size_t nbytes, void *stream) override {
        check();
        if (send != recv) copy_(copy_ctx_, recv, send, nbytes, stream);
    }
    // One rank has nothing to agree: the communicator never asks (its agreements need two ranks).
    void put_words(uint32_t *, const uint32_t *, size_t, void *) override { no_agreement(); }
    void fetch_words(const uint32_t *, size_t, void *) override { no_agreement(); }
    void fetched_words(uint32_t *, size_t, void *, const char *) override { no_agreement(); }
    bool failed() const override { return aborted_.load(); }
    void abort() override { aborted_.store(true); }
    void destroy() override {}

private:
    [[noreturn]] static void no_agreement() {
        fail(FP8AMP_ERROR_INTERNAL, "local transport: a one-rank communicator has no agreement to make");
    }
    void check() const {
        if (aborted_.load()) fail(FP8AMP_ERROR_COMM, "the communicator was aborted (fp8amp_comm_abort): destroy it");
    }
    struct Buf {
        void *buf;
        size_t nbytes;
    };
    CopyFn copy_;
    void *copy_ctx_;
    std::vector<Buf> sends_, recvs_;
    std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Transport> make_local_transport(void (*copy)(void *, void *, const void *, size_t, void *), void *copy_ctx) {
    return std::make_unique<LocalTransport>(copy, copy_ctx);
}

}  // namespace fp8amp::kernels
