// Tensors: a dtype, a shape and a share of a Storage on one device. Always contiguous, row-major.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "context.hpp"
#include "fp8amp/dlpack.h"
#include "enums.hpp"

namespace fp8amp::core {

class ScalingMeta;

class Tensor {
public:
    static constexpr HandleKind kKind = HandleKind::Tensor;

    // An owning tensor from ctx's allocator.
    // The tensor keeps its context alive: host copies run on that context's current stream.
    static std::shared_ptr<Tensor> create(std::shared_ptr<const Context> ctx, fp8amp_dtype dtype, int32_t ndim,
                                          const int64_t *shape);
    // A tensor over memory the caller owns.
    static std::shared_ptr<Tensor> wrap(std::shared_ptr<const Context> ctx, fp8amp_dtype dtype, int32_t ndim,
                                        const int64_t *shape, void *data);
    // A tensor over a DLPack producer's memory. It takes ownership of `managed` (calls its deleter when
    // the storage goes) only after adopt_dlpack(): the caller arms it once nothing else can fail.
    static std::shared_ptr<Tensor> from_dlpack(std::shared_ptr<const Context> ctx, DLManagedTensorVersioned *managed);
    void adopt_dlpack() {
        if (dlpack_armed_) *dlpack_armed_ = true;
    }
    // A tensor over a library-owned storage from byte `offset` on, sharing it: an optimizer's state
    // read through fp8amp_optimizer_param_state, a meta's recorded amax (fp8amp_scaling_amax_tensor).
    // read_only: writes through this handle are refused.
    static std::shared_ptr<Tensor> view(std::shared_ptr<const Context> ctx, std::shared_ptr<Storage> storage,
                                        fp8amp_dtype dtype, int32_t ndim, const int64_t *shape, bool read_only,
                                        size_t offset = 0);
    // A DLPack view sharing this tensor's storage; the consumer calls its deleter.
    DLManagedTensorVersioned *to_dlpack() const;

    // fp8amp_tensor_rebind: points a tensor made by wrap() at other caller-owned memory with a new
    // shape (same dtype and context), as if wrapped anew; validates everything first, so a failure
    // changes nothing. Refused for tensors that own or import their memory, that were ever bound to a
    // scaling meta, or whose address an optimizer holds (pin_address).
    void rebind(void *data, int32_t ndim, const int64_t *shape);
    // An object that keeps this tensor's data address (an optimizer's device-side parameter list)
    // pins it while it lives: rebind() is refused meanwhile.
    void pin_address() { address_pins_.fetch_add(1, std::memory_order_relaxed); }
    void unpin_address() { address_pins_.fetch_sub(1, std::memory_order_relaxed); }
    // A library object that relies on this tensor's binding (a Linear quantizes into its E4M3 weight
    // gradient with the meta it bound, reads its scaled weight through its own) marks it owned while
    // it lives: set_scaling() and rebind() are refused with a message naming `owner` (a static
    // string, e.g. "a Linear's weight"); null releases it.
    void set_owner(const char *owner) { owner_.store(owner, std::memory_order_relaxed); }

    fp8amp_dtype dtype() const { return dtype_; }
    int32_t ndim() const { return ndim_; }
    const int64_t *shape() const { return shape_.data(); }
    int64_t numel() const { return numel_; }
    size_t nbytes() const { return nbytes_; }
    void *data() const { return data_; }
    const fp8amp_device &device() const { return device_; }
    bool read_only() const { return read_only_; }
    bool same_shape(const Tensor &other) const;
    bool overlaps(const Tensor &other) const;  // do the two tensors' bytes share any address?
    std::string describe() const;  // "e4m3[4, 8] on cuda:0", for messages

    // Host copies (synchronous), in the stream order of the tensor's context.
    void copy_from_host(const void *src, size_t nbytes);
    void copy_to_host(void *dst, size_t nbytes) const;

    // fp8amp_tensor_set_scaling: binds this scaled-dtype (E4M3, E5M2, F16) tensor to a meta of its dtype and device (null
    // unbinds) and sets the tensor's scale_inv slot to the meta's current scale_inv.
    void set_scaling(std::shared_ptr<ScalingMeta> meta);
    ScalingMeta *scaling() const { return scaling_.get(); }
    // The binding itself, for an owner that must keep the meta alive (the optimizer: a parameter's meta).
    const std::shared_ptr<ScalingMeta> &scaling_shared() const { return scaling_; }
    // The scale_inv this tensor was last quantized with (device memory; 4 bytes from the context's
    // allocator, made by the first binding), or null if it was never bound.
    float *scale_inv() const { return scale_inv_ ? static_cast<float *>(scale_inv_->data()) : nullptr; }
    // fp8amp_tensor_scale_inv: an F32 scalar tensor sharing that slot (it keeps the slot's memory
    // alive); INVALID_ARGUMENT when this tensor has no slot (never bound to a meta).
    std::shared_ptr<Tensor> scale_inv_tensor() const;

    // A counter of the writes this library made to the tensor (host copies, casts, quantizes, the
    // optimizer): a Linear re-quantizes its weight when it moved. Writes made outside the library
    // (a DLPack producer, a raw pointer) are not seen.
    uint64_t version() const { return version_; }
    void mark_written() { ++version_; }

private:
    // A validated dtype + shape (INVALID_ARGUMENT otherwise), computed before anything is changed.
    struct Layout {
        int32_t ndim = 0;
        std::array<int64_t, FP8AMP_MAX_NDIM> shape{};
        int64_t numel = 1;
        size_t nbytes = 0;
    };
    static Layout checked_layout(fp8amp_dtype dtype, int32_t ndim, const int64_t *shape);
    // Throws unless `data` can hold `dtype` elements on ctx's device (NULL, alignment, CUDA ownership).
    static void check_borrowed_data(const Context &ctx, fp8amp_dtype dtype, const void *data);

    Tensor() = default;
    void set_shape(fp8amp_dtype dtype, int32_t ndim, const int64_t *shape);

    fp8amp_dtype dtype_ = FP8AMP_DTYPE_F32;
    int32_t ndim_ = 0;
    std::array<int64_t, FP8AMP_MAX_NDIM> shape_{};
    int64_t numel_ = 1;
    size_t nbytes_ = 0;
    void *data_ = nullptr;
    fp8amp_device device_{FP8AMP_DEVICE_CPU, 0};
    bool read_only_ = false;
    bool borrowed_ = false;  // made by wrap(): the memory is the caller's, with no owner to keep
    std::atomic<int32_t> address_pins_{0};
    std::atomic<const char *> owner_{nullptr};  // see set_owner
    std::shared_ptr<const Context> ctx_;
    std::shared_ptr<bool> dlpack_armed_;
    std::shared_ptr<Storage> storage_;  // keeps the memory alive; also held by exported DLPack views
    std::shared_ptr<ScalingMeta> scaling_;
    std::shared_ptr<Storage> scale_inv_;
    uint64_t version_ = 0;
};

// Throws INVALID_ARGUMENT unless `dtype` is one of fp8amp_dtype's values. Taken by reference and read
// as an integer (enum_value): a caller's out-of-range value must not be loaded as the enum.
void check_dtype(const fp8amp_dtype &dtype, const char *argument);
// Throws DEVICE_MISMATCH unless the tensor lives on the context's device.
void check_on_device(const Context &ctx, const Tensor &t, const char *argument);
// Throws INVALID_ARGUMENT if the tensor may not be written.
void check_writable(const Tensor &t, const char *argument);
// Throws DTYPE_MISMATCH unless t is F32, F16 or BF16 (a plain, unscaled dtype).
void check_wide(const Tensor &t, const char *argument);

}  // namespace fp8amp::core
