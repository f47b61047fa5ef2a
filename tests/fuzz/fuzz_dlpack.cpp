// libFuzzer target: fp8amp_tensor_from_dlpack of a DLManagedTensorVersioned decoded from the input
// (version, dtype, ndim, shape, strides, byte_offset, device, flags, deleter), over a real host buffer
// of an input-chosen size (ASan red zones around it). Oracle: the import is accepted exactly when
// the header's contract says so; a refusal gives a specific status and a message and calls nothing;
// an accepted tensor reports the producer's dtype, shape and address, reads and writes the producer's
// bytes (read-only ones refuse writes), and its deleter runs exactly once, when the last fp8amp
// reference goes (the handle and an export of it).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <vector>

#include "fp8amp/dlpack.h"
#include "fuzz_common.hpp"

namespace {

struct Producer {
    int deleter_calls = 0;
};

void deleter(DLManagedTensorVersioned *self) {
    FUZZ_CHECK(self != nullptr, "deleter called with NULL");
    ++static_cast<Producer *>(self->manager_ctx)->deleter_calls;
}

int expected_dtype(const DLDataType &d) {  // -1: not one fp8amp takes
    if (d.lanes != 1) return -1;
    if (d.code == kDLFloat && d.bits == 32) return FP8AMP_DTYPE_F32;
    if (d.code == kDLFloat && d.bits == 16) return FP8AMP_DTYPE_F16;
    if (d.code == kDLBfloat && d.bits == 16) return FP8AMP_DTYPE_BF16;
    if (d.code == kDLFloat8_e4m3fn && d.bits == 8) return FP8AMP_DTYPE_E4M3;
    if (d.code == kDLFloat8_e5m2 && d.bits == 8) return FP8AMP_DTYPE_E5M2;
    return -1;
}

const uint8_t kCodes[] = {kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLFloat8_e4m3fn, kDLFloat8_e5m2, 3, 6, 255};
const uint8_t kBits[] = {8, 16, 32, 64, 0, 255};
// DLPack's other device types go up to kDLMAIA 17 (kDLHexagon 16, ...); -1 a garbage value.
const int32_t kDevices[] = {kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged, 0, 7, 16, 17, -1};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size) {
    FuzzedDataProvider in(bytes, size);
    fp8amp_device cpu{FP8AMP_DEVICE_CPU, 0};
    fp8amp_context ctx = nullptr;
    FUZZ_CHECK(fp8amp_context_create(cpu, &ctx) == FP8AMP_SUCCESS, "a CPU context");

    // The producer's memory: an exact-size heap block, so that any access past it is reported.
    const size_t buf_size = in.ConsumeIntegralInRange<size_t>(0, 512);
    uint8_t *buf = static_cast<uint8_t *>(std::malloc(buf_size ? buf_size : 1));
    for (size_t i = 0; i < buf_size; ++i) buf[i] = static_cast<uint8_t>(i * 131u + 7u);

    Producer producer;
    DLManagedTensorVersioned m{};
    int64_t shape[12], strides[12];
    m.version.major = in.ConsumeBool() ? 1u : in.ConsumeIntegral<uint32_t>();
    m.version.minor = in.ConsumeIntegral<uint32_t>();
    m.manager_ctx = &producer;
    m.deleter = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : deleter;
    m.flags = in.ConsumeBool() ? DLPACK_FLAG_BITMASK_READ_ONLY : in.ConsumeIntegralInRange<uint64_t>(0, 3) << 1;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) m.flags = in.ConsumeIntegral<uint64_t>();
    DLTensor &dl = m.dl_tensor;
    const bool odd_dtype = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    dl.dtype.code = odd_dtype ? in.ConsumeIntegral<uint8_t>() : in.PickValueInArray(kCodes);
    dl.dtype.bits = odd_dtype ? in.ConsumeIntegral<uint8_t>() : in.PickValueInArray(kBits);
    dl.dtype.lanes = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<uint16_t>() : 1;
    dl.ndim = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegralInRange<int32_t>(-3, 12)
                                                          : in.ConsumeIntegralInRange<int32_t>(0, 4);
    const int nd = dl.ndim < 0 ? 0 : dl.ndim > 12 ? 12 : dl.ndim;
    for (int i = 0; i < nd; ++i)
        shape[i] = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegral<int64_t>()
                                                               : in.ConsumeIntegralInRange<int64_t>(0, 9);
    const int shape_mode = in.ConsumeIntegralInRange<int>(0, 7);
    dl.shape = shape_mode == 0 ? nullptr : shape;
    const int stride_mode = in.ConsumeIntegralInRange<int>(0, 3);  // 0 NULL, 1 compact, 2 compact then a change, 3 random
    {
        int64_t expected = 1;
        for (int i = nd - 1; i >= 0; --i) {
            strides[i] = expected;
            expected *= (shape[i] >= 1 && shape[i] <= 9) ? shape[i] : 1;
        }
        if (stride_mode == 2 && nd > 0) strides[in.ConsumeIntegralInRange<int>(0, nd - 1)] = in.ConsumeIntegral<int64_t>();
        if (stride_mode == 3)
            for (int i = 0; i < nd; ++i) strides[i] = in.ConsumeIntegralInRange<int64_t>(-2, 64);
    }
    dl.strides = stride_mode == 0 ? nullptr : strides;
    const int data_mode = in.ConsumeIntegralInRange<int>(0, 15);
    dl.data = data_mode == 0 ? nullptr : buf + (data_mode == 1 ? in.ConsumeIntegralInRange<size_t>(0, 3) : 0);
    dl.byte_offset = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                                 : in.ConsumeIntegralInRange<uint64_t>(0, 64);
    // Stored as a C producer stores it: any int32 (a C++ enum load of a value outside the enum's
    // range is undefined, so the harness never loads it as the enum).
    const int32_t device_type = in.PickValueInArray(kDevices);
    std::memcpy(&dl.device.device_type, &device_type, sizeof device_type);
    dl.device.device_id = in.ConsumeIntegralInRange<int32_t>(-1, 2);
    const int ctx_mode = in.ConsumeIntegralInRange<int>(0, 15);  // 0 NULL ctx, 1 a destroyed one, 2 not a handle
    fp8amp_context use_ctx = ctx;
    fp8amp_context dead = nullptr;
    if (ctx_mode == 0) use_ctx = nullptr;
    if (ctx_mode == 1) {
        fp8amp_context_create(cpu, &dead);
        fp8amp_context_destroy(dead);
        use_ctx = dead;
    }
    if (ctx_mode == 2) use_ctx = reinterpret_cast<fp8amp_context>(&producer);
    const bool null_out = in.ConsumeIntegralInRange<int>(0, 31) == 0;
    const bool null_managed = in.ConsumeIntegralInRange<int>(0, 31) == 0;

    // What the header's contract says about this import.
    const int dtype = expected_dtype(dl.dtype);
    bool valid = ctx_mode > 2 && !null_out && !null_managed && m.version.major == 1 && dtype >= 0 && dl.ndim >= 0 &&
                 dl.ndim <= FP8AMP_MAX_NDIM && (dl.ndim == 0 || dl.shape) && dl.data &&
                 (device_type == kDLCPU || device_type == kDLCUDAHost);
    int64_t numel = 1;
    if (valid) {
        for (int i = 0; i < dl.ndim; ++i) {
            if (shape[i] < 1 || numel > INT64_MAX / shape[i]) { valid = false; break; }
            numel *= shape[i];
        }
    }
    if (valid && dl.strides) {
        int64_t expected = 1;
        for (int i = dl.ndim - 1; i >= 0; --i) {
            if (shape[i] != 1 && strides[i] != expected) valid = false;
            expected *= shape[i];
        }
    }
    const size_t elem = dtype >= 0 ? fp8amp_dtype_size(static_cast<fp8amp_dtype>(dtype)) : 1;
    if (valid && static_cast<uint64_t>(numel) > SIZE_MAX / elem) valid = false;
    const uintptr_t address = reinterpret_cast<uintptr_t>(dl.data);
    // An offset that wraps the address space does not describe memory: it must be refused.
    const size_t nbytes = valid ? static_cast<size_t>(numel) * elem : 0;
    if (valid && (dl.byte_offset > UINTPTR_MAX - address || nbytes > UINTPTR_MAX - address - dl.byte_offset))
        valid = false;
    if (valid && (address + dl.byte_offset) % elem != 0) valid = false;

    fp8amp_tensor t = reinterpret_cast<fp8amp_tensor>(&shape);  // poison: must stay on failure
    fuzz::poison_message("fp8amp_tensor_from_dlpack");
    const fp8amp_status s = fp8amp_tensor_from_dlpack(use_ctx, null_managed ? nullptr : &m, null_out ? nullptr : &t);
    if (s != FP8AMP_SUCCESS) {
        fuzz::check_failure("fp8amp_tensor_from_dlpack", s);
        FUZZ_CHECK(!valid, "a valid import was refused with %s", fp8amp_status_name(s));
        FUZZ_CHECK(t == reinterpret_cast<fp8amp_tensor>(&shape), "a refused import wrote *out");
        FUZZ_CHECK(producer.deleter_calls == 0, "a refused import called the deleter");
    } else {
        FUZZ_CHECK(valid, "an invalid import was accepted (dtype code %d bits %d lanes %d, ndim %d, device %d, "
                          "byte_offset %llu)", dl.dtype.code, dl.dtype.bits, dl.dtype.lanes, dl.ndim,
                   device_type, static_cast<unsigned long long>(dl.byte_offset));
        FUZZ_CHECK(producer.deleter_calls == 0, "the deleter ran while the tensor lives");
        fp8amp_dtype got_dtype;
        int32_t got_ndim;
        int64_t got_shape[FP8AMP_MAX_NDIM];
        size_t got_nbytes;
        void *got_data;
        FUZZ_CHECK(fp8amp_tensor_dtype(t, &got_dtype) == FP8AMP_SUCCESS && got_dtype == dtype, "dtype");
        FUZZ_CHECK(fp8amp_tensor_ndim(t, &got_ndim) == FP8AMP_SUCCESS && got_ndim == dl.ndim, "ndim");
        FUZZ_CHECK(fp8amp_tensor_shape(t, FP8AMP_MAX_NDIM, got_shape) == FP8AMP_SUCCESS, "shape");
        for (int i = 0; i < dl.ndim; ++i) FUZZ_CHECK(got_shape[i] == shape[i], "shape[%d]", i);
        FUZZ_CHECK(fp8amp_tensor_nbytes(t, &got_nbytes) == FP8AMP_SUCCESS && got_nbytes == nbytes, "nbytes");
        FUZZ_CHECK(fp8amp_tensor_data(t, &got_data) == FP8AMP_SUCCESS &&
                       got_data == static_cast<uint8_t *>(dl.data) + dl.byte_offset, "data address");
        // Touch the memory only when the producer described memory it has (the library cannot know).
        const uintptr_t start = address + dl.byte_offset;
        const bool inside = start >= reinterpret_cast<uintptr_t>(buf) &&
                            start - reinterpret_cast<uintptr_t>(buf) <= buf_size &&
                            nbytes <= buf_size - (start - reinterpret_cast<uintptr_t>(buf));
        if (inside) {
            std::vector<uint8_t> host(nbytes + 1), pattern(nbytes + 1);
            FUZZ_CHECK(fp8amp_tensor_copy_to_host(t, host.data(), nbytes) == FP8AMP_SUCCESS, "copy_to_host");
            FUZZ_CHECK(std::memcmp(host.data(), got_data, nbytes) == 0, "copy_to_host read other bytes");
            for (size_t i = 0; i < nbytes; ++i) pattern[i] = static_cast<uint8_t>(host[i] ^ 0x5A);
            fuzz::poison_message("fp8amp_tensor_copy_from_host");
            const fp8amp_status w = fp8amp_tensor_copy_from_host(t, pattern.data(), nbytes);
            if (m.flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
                FUZZ_CHECK(w == FP8AMP_ERROR_INVALID_ARGUMENT, "a write into a read-only import gave %s",
                           fp8amp_status_name(w));
                fuzz::check_failure("fp8amp_tensor_copy_from_host", w);
                FUZZ_CHECK(std::memcmp(host.data(), got_data, nbytes) == 0, "a refused write changed the bytes");
            } else {
                FUZZ_CHECK(w == FP8AMP_SUCCESS, "copy_from_host into a writable import: %s", fp8amp_status_name(w));
                FUZZ_CHECK(std::memcmp(pattern.data(), got_data, nbytes) == 0, "copy_from_host wrote other bytes");
            }
        }
        // An export shares the storage: the producer's deleter waits for the export's deleter too.
        DLManagedTensorVersioned *exported = nullptr;
        const bool do_export = in.ConsumeBool();
        if (do_export) FUZZ_CHECK(fp8amp_tensor_to_dlpack(t, &exported) == FP8AMP_SUCCESS && exported, "to_dlpack");
        FUZZ_CHECK(fp8amp_tensor_destroy(t) == FP8AMP_SUCCESS, "destroy");
        if (do_export) {
            FUZZ_CHECK(producer.deleter_calls == 0, "the deleter ran while an export lives");
            FUZZ_CHECK(exported->dl_tensor.data != nullptr, "export data");
            exported->deleter(exported);
        }
        FUZZ_CHECK(producer.deleter_calls == (m.deleter ? 1 : 0), "the deleter ran %d times", producer.deleter_calls);
        // The handle is dead now.
        fuzz::poison_message("fp8amp_tensor_ndim");
        const fp8amp_status d = fp8amp_tensor_ndim(t, &got_ndim);
        FUZZ_CHECK(d == FP8AMP_ERROR_INVALID_HANDLE, "a destroyed tensor answered %s", fp8amp_status_name(d));
        fuzz::check_failure("fp8amp_tensor_ndim", d);
    }
    FUZZ_CHECK(fp8amp_context_destroy(ctx) == FP8AMP_SUCCESS, "context destroy");
    std::free(buf);
    return 0;
}
