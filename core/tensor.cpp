#include "tensor.hpp"

#include <cstring>
#include <limits>
#include <new>
#include <sstream>

#include "backend.hpp"  // kernels/backend.hpp
#include "scaling_meta.hpp"

namespace fp8amp::core {

void check_dtype(const fp8amp_dtype &dtype, const char *argument) {
    const int32_t v = enum_value(dtype);
    if (v < FP8AMP_DTYPE_F32 || v > FP8AMP_DTYPE_E5M2)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " is not an fp8amp_dtype (" + std::to_string(v) + ")");
}

void check_on_device(const Context &ctx, const Tensor &t, const char *argument) {
    if (!same_device(ctx.device(), t.device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, std::string(argument) + " is on " + device_name(t.device()) +
                                               " but the context is on " + device_name(ctx.device()));
}

void check_writable(const Tensor &t, const char *argument) {
    if (t.read_only())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " is read-only (imported with DLPack's read-only flag)");
}

void check_wide(const Tensor &t, const char *argument) {
    if (is_fp8(t.dtype()))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string(argument) + " is " + t.describe() + ": it must be f32, f16 or bf16");
}

bool Tensor::overlaps(const Tensor &other) const {
    const auto *a0 = static_cast<const char *>(data_);
    const auto *b0 = static_cast<const char *>(other.data_);
    return a0 < b0 + other.nbytes_ && b0 < a0 + nbytes_;
}

Tensor::Layout Tensor::checked_layout(fp8amp_dtype dtype, int32_t ndim, const int64_t *shape) {
    check_dtype(dtype, "dtype");
    if (ndim < 0 || ndim > FP8AMP_MAX_NDIM)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "ndim " + std::to_string(ndim) + " is outside 0.." + std::to_string(FP8AMP_MAX_NDIM));
    if (ndim > 0 && !shape) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "shape is NULL but ndim is " + std::to_string(ndim));
    const size_t elem = fp8amp_dtype_size(dtype);
    Layout l;
    for (int32_t i = 0; i < ndim; ++i) {
        if (shape[i] < 1)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "shape[" + std::to_string(i) + "] is " + std::to_string(shape[i]) +
                                                    ": every extent must be at least 1");
        if (l.numel > std::numeric_limits<int64_t>::max() / shape[i])
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "the number of elements overflows int64");
        l.numel *= shape[i];
        l.shape[i] = shape[i];
    }
    if (static_cast<uint64_t>(l.numel) > std::numeric_limits<size_t>::max() / elem)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "the byte size overflows size_t");
    l.ndim = ndim;
    l.nbytes = static_cast<size_t>(l.numel) * elem;
    return l;
}

void Tensor::set_shape(fp8amp_dtype dtype, int32_t ndim, const int64_t *shape) {
    const Layout l = checked_layout(dtype, ndim, shape);
    dtype_ = dtype;
    ndim_ = l.ndim;
    shape_ = l.shape;
    numel_ = l.numel;
    nbytes_ = l.nbytes;
}

void Tensor::check_borrowed_data(const Context &ctx, fp8amp_dtype dtype, const void *data) {
    if (!data) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "data is NULL");
    if (reinterpret_cast<uintptr_t>(data) % fp8amp_dtype_size(dtype) != 0)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "data is not aligned to the element size");
    const std::string foreign = ctx.backend().foreign_memory(data);
    if (!foreign.empty())
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "data is " + foreign + ", not memory of " + device_name(ctx.device()));
}

std::shared_ptr<Tensor> Tensor::create(std::shared_ptr<const Context> ctx, fp8amp_dtype dtype, int32_t ndim,
                                       const int64_t *shape) {
    std::shared_ptr<Tensor> t(new Tensor());
    t->set_shape(dtype, ndim, shape);
    t->storage_ = ctx->allocate(t->nbytes_);
    t->data_ = t->storage_->data();
    t->device_ = ctx->device();
    t->ctx_ = std::move(ctx);
    return t;
}

std::shared_ptr<Tensor> Tensor::wrap(std::shared_ptr<const Context> ctx, fp8amp_dtype dtype, int32_t ndim,
                                     const int64_t *shape, void *data) {
    std::shared_ptr<Tensor> t(new Tensor());
    t->set_shape(dtype, ndim, shape);
    check_borrowed_data(*ctx, dtype, data);
    t->storage_ = std::make_shared<Storage>(data, t->nbytes_, ctx->device(), nullptr);
    t->data_ = data;
    t->device_ = ctx->device();
    t->borrowed_ = true;
    t->ctx_ = std::move(ctx);
    return t;
}

void Tensor::rebind(void *data, int32_t ndim, const int64_t *shape) {
    if (const char *owner = owner_.load(std::memory_order_relaxed))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "t (" + describe() + ") is " + owner +
                                                ", which keeps its memory: it cannot be pointed at other memory");
    if (!borrowed_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "t (" + describe() + ") was not made by fp8amp_tensor_wrap: only a wrapped tensor can be pointed at "
             "other memory (this one owns or imported its memory, or is a library object's tensor)");
    if (scale_inv_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "t (" + describe() + ") has been bound to a scaling meta: its scale_inv "
                                            "belongs to the data it holds, so it cannot be pointed at other memory");
    if (address_pins_.load(std::memory_order_relaxed) > 0)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "t (" + describe() + ") is a parameter or gradient of a live optimizer, which keeps its address");
    const Layout l = checked_layout(dtype_, ndim, shape);
    check_borrowed_data(*ctx_, dtype_, data);
    auto storage = std::make_shared<Storage>(data, l.nbytes, device_, nullptr);
    // Nothing can fail past this point.
    ndim_ = l.ndim;
    shape_ = l.shape;
    numel_ = l.numel;
    nbytes_ = l.nbytes;
    data_ = data;
    storage_ = std::move(storage);
}

namespace {

fp8amp_dtype dtype_from_dlpack(const DLDataType &d) {
    if (d.lanes != 1)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "DLPack vector dtypes (lanes " + std::to_string(d.lanes) + ") are not supported");
    if (d.code == kDLFloat && d.bits == 32) return FP8AMP_DTYPE_F32;
    if (d.code == kDLFloat && d.bits == 16) return FP8AMP_DTYPE_F16;
    if (d.code == kDLBfloat && d.bits == 16) return FP8AMP_DTYPE_BF16;
    if (d.code == kDLFloat8_e4m3fn && d.bits == 8) return FP8AMP_DTYPE_E4M3;
    if (d.code == kDLFloat8_e5m2 && d.bits == 8) return FP8AMP_DTYPE_E5M2;
    fail(FP8AMP_ERROR_NOT_SUPPORTED, "DLPack dtype (code " + std::to_string(d.code) + ", bits " +
                                         std::to_string(d.bits) +
                                         ") is not one of float32, float16, bfloat16, float8_e4m3fn, float8_e5m2");
}

DLDataType dtype_to_dlpack(fp8amp_dtype dtype) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return {kDLFloat, 32, 1};
    case FP8AMP_DTYPE_F16: return {kDLFloat, 16, 1};
    case FP8AMP_DTYPE_BF16: return {kDLBfloat, 16, 1};
    case FP8AMP_DTYPE_E4M3: return {kDLFloat8_e4m3fn, 8, 1};
    case FP8AMP_DTYPE_E5M2: return {kDLFloat8_e5m2, 8, 1};
    }
    fail(FP8AMP_ERROR_INTERNAL, "unknown dtype");
}

// What an exported DLPack tensor owns: its shape/strides and a share of the storage.
struct DlpackExport {
    DLManagedTensorVersioned managed{};
    std::array<int64_t, FP8AMP_MAX_NDIM> shape{};
    std::array<int64_t, FP8AMP_MAX_NDIM> strides{};
    std::shared_ptr<Storage> storage;
};

void delete_export(DLManagedTensorVersioned *self) {
    if (self) delete static_cast<DlpackExport *>(self->manager_ctx);
}

}  // namespace

std::shared_ptr<Tensor> Tensor::from_dlpack(std::shared_ptr<const Context> ctx, DLManagedTensorVersioned *managed) {
    if (!managed) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "managed is NULL");
    if (managed->version.major != DLPACK_MAJOR_VERSION)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "DLPack major version " + std::to_string(managed->version.major) +
                                             " is not supported (fp8amp reads version 1.x)");
    const DLTensor &dl = managed->dl_tensor;
    const fp8amp_dtype dtype = dtype_from_dlpack(dl.dtype);
    if (dl.ndim > FP8AMP_MAX_NDIM)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "DLPack tensor has " + std::to_string(dl.ndim) + " dimensions; fp8amp takes at most " +
                                             std::to_string(FP8AMP_MAX_NDIM));
    std::shared_ptr<Tensor> t(new Tensor());
    t->set_shape(dtype, dl.ndim, dl.shape);
    if (!dl.data) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "DLPack tensor has NULL data");

    const fp8amp_device &dev = ctx->device();
    const int32_t dl_type = enum_value(dl.device.device_type);  // the producer's: any int (enums.hpp)
    const bool device_ok = dev.type == FP8AMP_DEVICE_CPU
                               ? (dl_type == kDLCPU || dl_type == kDLCUDAHost)
                               : ((dl_type == kDLCUDA || dl_type == kDLCUDAManaged) && dl.device.device_id == dev.index);
    if (!device_ok)
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "DLPack tensor is on device type " + std::to_string(dl_type) + " id " +
                                               std::to_string(dl.device.device_id) + ", the context on " +
                                               device_name(dev));
    if (dl.strides) {
        int64_t expected = 1;
        for (int32_t i = dl.ndim - 1; i >= 0; --i) {
            if (dl.shape[i] != 1 && dl.strides[i] != expected)
                fail(FP8AMP_ERROR_NOT_SUPPORTED,
                     "DLPack tensor is not contiguous row-major (stride of dimension " + std::to_string(i) + " is " +
                         std::to_string(dl.strides[i]) + ", expected " + std::to_string(expected) + ")");
            expected *= dl.shape[i];
        }
    }
    // A hostile byte_offset (or size) must not wrap the address space: the pointer sum would be
    // undefined and the tensor would alias unrelated memory.
    const uintptr_t base = reinterpret_cast<uintptr_t>(dl.data);
    if (dl.byte_offset > UINTPTR_MAX - base || t->nbytes_ > UINTPTR_MAX - base - dl.byte_offset)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "DLPack tensor's byte_offset " + std::to_string(dl.byte_offset) + " and " +
                                                std::to_string(t->nbytes_) + " bytes run past the end of the address space");
    void *data = static_cast<char *>(dl.data) + dl.byte_offset;
    if (reinterpret_cast<uintptr_t>(data) % fp8amp_dtype_size(dtype) != 0)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "DLPack tensor data is not aligned to its element size");

    // The producer's deleter runs with the storage only once the caller has armed it (after the
    // handle is registered): until then a failure leaves `managed` with the caller, untouched.
    auto deleter = managed->deleter;
    auto armed = std::make_shared<bool>(false);
    t->storage_ = std::make_shared<Storage>(data, t->nbytes_, dev, [managed, deleter, armed] {
        if (*armed && deleter) deleter(managed);
    });
    t->dlpack_armed_ = std::move(armed);
    t->data_ = data;
    t->device_ = dev;
    t->read_only_ = (managed->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    t->ctx_ = std::move(ctx);
    return t;
}

DLManagedTensorVersioned *Tensor::to_dlpack() const {
    auto *e = new (std::nothrow) DlpackExport();
    if (!e) fail(FP8AMP_ERROR_OUT_OF_MEMORY, "cannot allocate the DLPack export");
    e->storage = storage_;
    int64_t stride = 1;
    for (int32_t i = ndim_ - 1; i >= 0; --i) {
        e->shape[i] = shape_[i];
        e->strides[i] = stride;
        stride *= shape_[i];
    }
    DLManagedTensorVersioned &m = e->managed;
    m.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    m.manager_ctx = e;
    m.deleter = delete_export;
    m.flags = read_only_ ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    m.dl_tensor.data = data_;
    m.dl_tensor.device = {device_.type == FP8AMP_DEVICE_CUDA ? kDLCUDA : kDLCPU, device_.index};
    m.dl_tensor.ndim = ndim_;
    m.dl_tensor.dtype = dtype_to_dlpack(dtype_);
    m.dl_tensor.shape = e->shape.data();
    m.dl_tensor.strides = e->strides.data();
    m.dl_tensor.byte_offset = 0;
    return &m;
}

bool Tensor::same_shape(const Tensor &other) const {
    if (ndim_ != other.ndim_) return false;
    for (int32_t i = 0; i < ndim_; ++i)
        if (shape_[i] != other.shape_[i]) return false;
    return true;
}

std::string Tensor::describe() const {
    std::ostringstream s;
    s << fp8amp_dtype_name(dtype_) << "[";
    for (int32_t i = 0; i < ndim_; ++i) s << (i ? ", " : "") << shape_[i];
    s << "] on " << device_name(device_);
    return s.str();
}

void Tensor::copy_from_host(const void *src, size_t nbytes) {
    if (!src) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "src is NULL");
    check_writable(*this, "t");
    if (nbytes != nbytes_)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "nbytes is " + std::to_string(nbytes) + " but the tensor (" + describe() +
                                              ") holds " + std::to_string(nbytes_) + " bytes");
    ctx_->backend().copy_to_device(data_, src, nbytes);
    mark_written();
}

void Tensor::copy_to_host(void *dst, size_t nbytes) const {
    if (!dst) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "dst is NULL");
    if (nbytes != nbytes_)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "nbytes is " + std::to_string(nbytes) + " but the tensor (" + describe() +
                                              ") holds " + std::to_string(nbytes_) + " bytes");
    ctx_->backend().copy_to_host(dst, data_, nbytes);
}

std::shared_ptr<Tensor> Tensor::view(std::shared_ptr<const Context> ctx, std::shared_ptr<Storage> storage,
                                     fp8amp_dtype dtype, int32_t ndim, const int64_t *shape, bool read_only,
                                     size_t offset) {
    std::shared_ptr<Tensor> t(new Tensor());
    t->set_shape(dtype, ndim, shape);
    if (offset > storage->nbytes() || t->nbytes_ > storage->nbytes() - offset)
        fail(FP8AMP_ERROR_INTERNAL, "a view of " + std::to_string(t->nbytes_) + " bytes at offset " +
                                        std::to_string(offset) + " of a storage of " + std::to_string(storage->nbytes()));
    t->data_ = static_cast<char *>(storage->data()) + offset;
    t->device_ = ctx->device();
    t->read_only_ = read_only;
    t->storage_ = std::move(storage);
    t->ctx_ = std::move(ctx);
    return t;
}

std::shared_ptr<Tensor> Tensor::scale_inv_tensor() const {
    if (!scale_inv_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "t (" + describe() + ") has no scale_inv slot: it was never bound to a scaling meta");
    std::shared_ptr<Tensor> t(new Tensor());
    t->set_shape(FP8AMP_DTYPE_F32, 0, nullptr);
    t->storage_ = scale_inv_;
    t->data_ = scale_inv_->data();
    t->device_ = device_;
    t->read_only_ = false;
    t->ctx_ = ctx_;
    return t;
}

void Tensor::set_scaling(std::shared_ptr<ScalingMeta> meta) {
    // Unbinding, binding to another meta, even re-binding to the same one (which resets the scale_inv
    // the codes stand for) would break the owner, which quantizes into or reads the tensor through the
    // binding it made.
    if (const char *owner = owner_.load(std::memory_order_relaxed))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "t (" + describe() + ") is " + owner +
                                                ", which keeps its scaling binding: it cannot be unbound or re-bound "
                                                "while the owner lives");
    if (!meta) {
        scaling_.reset();  // the scale_inv slot stays: the data keeps the scale it was quantized with
        return;
    }
    if (!is_scaled_dtype(dtype_))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH,
             "t is " + describe() + ": only an e4m3, e5m2 or f16 tensor can be bound to a scaling meta");
    if (meta->dtype() != dtype_)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "t is " + describe() + " but s is an " + meta->describe());
    if (!same_device(meta->device(), device_))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "t is " + describe() + " but s is an " + meta->describe());
    if (!scale_inv_) scale_inv_ = ctx_->allocate(sizeof(float));
    ctx_->backend().copy_on_device(scale_inv_->data(), meta->scale_inv_field(), sizeof(float));
    scaling_ = std::move(meta);
}

}  // namespace fp8amp::core
