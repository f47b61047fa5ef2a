// A context: one device, the stream work is issued on, and the allocator that serves its memory.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "fp8amp/fp8amp.h"
#include "handles.hpp"

namespace fp8amp::kernels {
class Backend;  // kernels/backend.hpp
}

namespace fp8amp::core {

bool same_device(const fp8amp_device &a, const fp8amp_device &b);
std::string device_name(const fp8amp_device &d);
// How many devices of that type (an fp8amp_device_type value) there are; INVALID_ARGUMENT when the
// type is unknown (fp8amp_device_count).
int32_t device_count(int32_t type);

// A block of memory and how to give it back. Tensors share it; the last owner frees it.
class Storage {
public:
    Storage(void *data, size_t nbytes, fp8amp_device device, std::function<void()> release)
        : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}
    ~Storage() {
        if (release_) release_();
    }
    Storage(const Storage &) = delete;
    Storage &operator=(const Storage &) = delete;
    void *data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    fp8amp_device device() const { return device_; }

private:
    void *data_;
    size_t nbytes_;
    fp8amp_device device_;
    std::function<void()> release_;
};

class Context {
public:
    static constexpr HandleKind kKind = HandleKind::Context;

    explicit Context(fp8amp_device device);

    const fp8amp_device &device() const { return device_; }
    // The device's backend, made once with the context: every kernel, copy and launch goes through it.
    kernels::Backend &backend() const { return *backend_; }
    void *stream() const;
    void set_stream(void *stream);
    void set_allocator(fp8amp_alloc_fn alloc_fn, fp8amp_free_fn free_fn, void *user_data);

    // nbytes on the context's device through the current allocator; OUT_OF_MEMORY when refused.
    std::shared_ptr<Storage> allocate(size_t nbytes) const;
    void synchronize() const;

    // The GEMM workspace (the backend's gemm_workspace_bytes(), when not 0), from the context's
    // allocator, made on first use. A context is used by one thread at a time, which makes the lazy
    // creation safe.
    Storage &gemm_workspace() const;

    // Scratch memory that the Linears of this context share for what lives only within one call
    // (the FP8 copies of x and dY, staging outputs, a dequantized weight, the bias gradient's partial
    // column sums; slot 5: fp8amp_norm_backward's partial column sums): slot `slot` (< kScratchSlots) grows to the largest size asked of it and is reused
    // in the stream order of the context's stream (set_stream orders the new stream after the old
    // one). The pointer is valid until the next call that asks the same slot for more, or until
    // release_scratch. A call must ask each slot once: a second, larger request would free the
    // memory that the call's first request described.
    static constexpr size_t kScratchSlots = 8;
    void *scratch(size_t slot, size_t nbytes) const;
    // The bytes the scratch slots hold now (fp8amp_context_scratch_bytes).
    size_t scratch_bytes() const;
    // Gives the scratch slots' memory and the GEMM workspace back to the allocator
    // (fp8amp_context_release_scratch), in the order of the stream each was allocated on: the host
    // waits for the device only when one was used on another stream since (see free_scratch_slot).
    // The next call that needs them allocates them again.
    void release_scratch() const;

private:
    fp8amp_device device_;
    // Shared with the Storage its malloc served, which frees through it (and may outlive the context).
    std::shared_ptr<kernels::Backend> backend_;
    fp8amp_alloc_fn alloc_fn_ = nullptr;
    fp8amp_free_fn free_fn_ = nullptr;
    void *alloc_user_data_ = nullptr;
    mutable std::shared_ptr<Storage> gemm_workspace_;
    mutable std::shared_ptr<Storage> scratch_[kScratchSlots];
    // The stream each slot was allocated on, and whether a call used it on another (free_scratch_slot).
    mutable void *scratch_stream_[kScratchSlots] = {};
    mutable bool scratch_crossed_[kScratchSlots] = {};
    // The same for the GEMM workspace (used by the GEMMs of every Linear of the context).
    mutable void *workspace_stream_ = nullptr;
    mutable bool workspace_crossed_ = false;
    void free_scratch_slot(size_t slot) const;
};

}  // namespace fp8amp::core
