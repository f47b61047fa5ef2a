#include "context.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "enums.hpp"
#include "backend.hpp"  // kernels/backend.hpp

namespace fp8amp::core {

namespace {
// What fp8amp_alloc_fn promises (fp8amp.h): the kernels' vector loads and the optimizer's state
// layout assume it, so a hook's block is checked against it.
constexpr uintptr_t kHookAlignment = 256;
}

// Devices may come from callers, so their type is read as an integer (enums.hpp).
bool same_device(const fp8amp_device &a, const fp8amp_device &b) {
    return enum_value(a.type) == enum_value(b.type) && a.index == b.index;
}

std::string device_name(const fp8amp_device &d) {
    const int32_t type = enum_value(d.type);
    if (type == FP8AMP_DEVICE_CPU) return "cpu";
    if (type == FP8AMP_DEVICE_CUDA) return "cuda:" + std::to_string(d.index);
    return "unknown device type " + std::to_string(type);
}

int32_t device_count(int32_t type) {
    const kernels::BackendType *backend = kernels::find_backend_type(type);
    if (!backend) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "unknown device type " + std::to_string(type));
    return backend->device_count(nullptr);
}

Context::Context(fp8amp_device device) : device_(device) {
    // The caller's device.type is validated as an integer; only then is it loaded as the enum.
    const int32_t type = enum_value(device.type);
    const kernels::BackendType *backend = kernels::find_backend_type(type);
    if (!backend)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "device.type " + std::to_string(type) + " is not an fp8amp_device_type");
    backend_ = backend->create(device.index);  // validates the index and that the device can be used
}

void *Context::stream() const { return backend_->stream(); }

void Context::set_stream(void *stream) {
    // Memory this context reuses across calls (the GEMM workspace, the scratch slots) was last used in
    // the old stream's order: the new stream waits for what the old one has queued so far.
    bool shared_memory = gemm_workspace_ != nullptr;
    for (const auto &s : scratch_) shared_memory = shared_memory || s != nullptr;
    backend_->set_stream(stream, shared_memory);
}

void Context::set_allocator(fp8amp_alloc_fn alloc_fn, fp8amp_free_fn free_fn, void *user_data) {
    if ((alloc_fn == nullptr) != (free_fn == nullptr))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "alloc_fn and free_fn must both be set, or both be NULL");
    alloc_fn_ = alloc_fn;
    free_fn_ = free_fn;
    alloc_user_data_ = alloc_fn ? user_data : nullptr;
}

std::shared_ptr<Storage> Context::allocate(size_t nbytes) const {
    const fp8amp_device device = device_;
    // No allocator can give more than PTRDIFF_MAX bytes as one object (pointer differences over it are
    // undefined), and a hook that rounds such a size up could wrap it to a small block: refuse it here,
    // before any allocator sees it (a 1-D F16 tensor of INT64_MAX elements is 2^64 - 2 bytes).
    if (nbytes > static_cast<size_t>(PTRDIFF_MAX))
        fail(FP8AMP_ERROR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(nbytes) +
                                             " bytes: more than PTRDIFF_MAX, the largest object size");
    if (alloc_fn_) {
        // The hooks and stream in force now are the ones that free this block, whatever comes later.
        const fp8amp_free_fn free_fn = free_fn_;
        void *const user = alloc_user_data_;
        void *const stream = backend_->stream();
        void *data = alloc_fn_(user, nbytes, device, stream);
        if (!data)
            fail(FP8AMP_ERROR_OUT_OF_MEMORY,
                 "the context's allocator hook returned NULL for " + std::to_string(nbytes) + " bytes");
        if (reinterpret_cast<uintptr_t>(data) % kHookAlignment != 0) {
            // A misaligned block would give misaligned accesses (a crash, or undefined behaviour):
            // refuse it, giving it back first so that nothing leaks.
            const uintptr_t address = reinterpret_cast<uintptr_t>(data);
            free_fn(user, data, nbytes, device, stream);
            char hex[2 + 2 * sizeof address + 1];
            std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(address));
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "the context's allocator hook returned " + std::string(hex) + " for " +
                                                    std::to_string(nbytes) + " bytes, which is not aligned to " +
                                                    std::to_string(kHookAlignment) + " bytes as fp8amp_alloc_fn must be");
        }
        try {
            return std::make_shared<Storage>(data, nbytes, device,
                                             [=] { free_fn(user, data, nbytes, device, stream); });
        } catch (...) {
            free_fn(user, data, nbytes, device, stream);
            throw;
        }
    }
    // No hook: the backend's own allocator. The block holds the backend, which frees it.
    const std::shared_ptr<kernels::Backend> backend = backend_;
    void *data = backend->malloc(nbytes);
    try {
        return std::make_shared<Storage>(data, nbytes, device, [backend, data] { backend->free(data); });
    } catch (...) {
        backend->free(data);
        throw;
    }
}

void Context::synchronize() const { backend_->synchronize(); }

Storage &Context::gemm_workspace() const {
    if (!gemm_workspace_) {
        gemm_workspace_ = allocate(backend_->gemm_workspace_bytes());
        workspace_stream_ = backend_->stream();
    }
    if (workspace_stream_ != backend_->stream()) workspace_crossed_ = true;
    return *gemm_workspace_;
}

// Frees a slot. A stream-ordered allocator (torch's caching allocator) ties a block to the stream it
// was allocated on and hands it out again in that stream's order only; cudaFree (the CUDA backend's
// own allocator) waits for the device anyway. A slot used on another stream since it was allocated
// (the context's stream changed) may still be read there, and nothing would order the block's next
// owner after that work: the host waits for it first (rare: a stream change, then growth or a release).
void Context::free_scratch_slot(size_t slot) const {
    std::shared_ptr<Storage> &s = scratch_[slot];
    if (!s) return;
    if (scratch_crossed_[slot]) backend_->synchronize();
    s.reset();
    scratch_crossed_[slot] = false;
}

void *Context::scratch(size_t slot, size_t nbytes) const {
    if (slot >= kScratchSlots) fail(FP8AMP_ERROR_INTERNAL, "scratch slot out of range");
    std::shared_ptr<Storage> &s = scratch_[slot];
    if (!s || s->nbytes() < nbytes) {
        // Rounded up to 64 KiB, so that slightly larger requests (a few more rows) do not reallocate.
        constexpr size_t kGranule = size_t{64} << 10;
        const size_t rounded = (nbytes + kGranule - 1) / kGranule * kGranule;
        free_scratch_slot(slot);  // give the old memory back before asking for the new
        s = allocate(rounded >= nbytes ? rounded : nbytes);
        scratch_stream_[slot] = backend_->stream();
    }
    if (scratch_stream_[slot] != backend_->stream()) scratch_crossed_[slot] = true;
    return s->data();
}

size_t Context::scratch_bytes() const {
    size_t total = 0;
    for (const auto &s : scratch_)
        if (s) total += s->nbytes();
    return total;
}

void Context::release_scratch() const {
    // Each block goes back in the order of the stream it was allocated on, without a host wait (as
    // when a slot grows, free_scratch_slot): a stream-ordered allocator (torch's caching allocator)
    // hands it out again only after the work queued there, which includes every call that used it
    // unless the context's stream changed since; cudaFree (the CUDA backend's own allocator) waits for
    // the device anyway. A block used on another stream since it was allocated may still be read
    // there: then the host waits for the device first, once (issue 18: the front releases at every
    // step, where a wait would stall the host's lead over the GPU).
    bool crossed = workspace_crossed_ && gemm_workspace_ != nullptr;
    for (size_t i = 0; i < kScratchSlots; ++i) crossed = crossed || (scratch_[i] && scratch_crossed_[i]);
    if (crossed) backend_->synchronize();
    for (size_t i = 0; i < kScratchSlots; ++i) {
        scratch_[i].reset();
        scratch_crossed_[i] = false;
    }
    gemm_workspace_.reset();
    workspace_crossed_ = false;
}

}  // namespace fp8amp::core
