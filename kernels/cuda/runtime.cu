// CUDA runtime services for core: device discovery, memory, copies, synchronization. Every CUDA
// error becomes an fp8amp::Error with the runtime's own message; the caller's current device is
// restored after each call so fp8amp never disturbs a host framework's device state.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char *what) {
    (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
    const fp8amp_status status = (err == cudaErrorMemoryAllocation)      ? FP8AMP_ERROR_OUT_OF_MEMORY
                                 : (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
                                     ? FP8AMP_ERROR_NOT_SUPPORTED
                                     : FP8AMP_ERROR_CUDA;
    fail(status, std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

DeviceGuard::DeviceGuard(int device) {
    int current = -1;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) {
        check(cudaSetDevice(device), "cudaSetDevice");
        previous_ = current;
    }
}

DeviceGuard::~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

DeviceGuardNoThrow::DeviceGuardNoThrow(int device) noexcept {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (current != device && cudaSetDevice(device) == cudaSuccess) previous_ = current;
}

DeviceGuardNoThrow::~DeviceGuardNoThrow() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

int multiprocessor_count(int device) {
    static int cached[64] = {0};
    if (device >= 0 && device < 64 && cached[device] > 0) return cached[device];
    int n = 0;
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    if (device >= 0 && device < 64) cached[device] = n;
    return n;
}

int resident_blocks_per_sm(const void *kernel, int device, int threads, bool max_shared) {
    // A fixed open-addressed table, no map: this runs between the launches of one call (a
    // LaunchList's later steps), where a std::bad_alloc would come after earlier steps changed state
    // (issue 22). With the table full (far more kernel/device pairs than fp8amp has) the answer is
    // asked again each time instead of cached.
    struct Slot {
        const void *kernel;
        int device;
        int per_sm;
    };
    static constexpr size_t kSlots = 1024;  // a power of two
    static std::mutex mutex;
    static Slot cache[kSlots] = {};
    std::lock_guard<std::mutex> lock(mutex);
    const size_t hash = (reinterpret_cast<uintptr_t>(kernel) >> 4) * 31u + static_cast<size_t>(device);
    size_t free_slot = kSlots;
    for (size_t probe = 0; probe < kSlots; ++probe) {
        Slot &slot = cache[(hash + probe) & (kSlots - 1)];
        if (!slot.kernel) {
            free_slot = (hash + probe) & (kSlots - 1);
            break;
        }
        if (slot.kernel == kernel && slot.device == device) return slot.per_sm;
    }
    if (max_shared)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
              "cudaFuncSetAttribute (shared-memory carveout)");
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (free_slot < kSlots) cache[free_slot] = {kernel, device, per_sm};
    return per_sm;
}

bool built_with_cuda() { return true; }

int device_count(std::string *why) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (why) *why = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
        return 0;
    }
    if (n == 0 && why) *why = "the CUDA runtime reports no device";
    return n;
}

namespace {
// Never launched: asking for its attributes tells whether this build has a kernel image (machine
// code or PTX) that the GPU can run -- decided by the GPU's capability, not by its name.
__global__ void kernel_image_probe() {}
}  // namespace

void check_device(int device) {
    std::string why;
    const int n = device_count(&why);
    if (n == 0) fail(FP8AMP_ERROR_NOT_SUPPORTED, "no usable CUDA device: " + why);
    if (device < 0 || device >= n)
        fail(FP8AMP_ERROR_DEVICE_MISMATCH,
             "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " visible)");
    DeviceGuard guard(device);
    cudaFuncAttributes attributes{};
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel_image_probe);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        int major = 0, minor = 0;
        (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        fail(FP8AMP_ERROR_NOT_SUPPORTED,
             "this fp8amp build has no kernel image for cuda:" + std::to_string(device) + " (compute capability " +
                 std::to_string(major) + "." + std::to_string(minor) + ", " + cudaGetErrorString(err) +
                 "): rebuild with -DCMAKE_CUDA_ARCHITECTURES including it");
    }
}

void *malloc(int device, size_t nbytes) {
    DeviceGuard guard(device);
    void *ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, nbytes);
    if (err != cudaSuccess) throw_cuda(err, ("cudaMalloc of " + std::to_string(nbytes) + " bytes").c_str());
    return ptr;
}

void free(int device, void *ptr) noexcept {
    if (!ptr) return;
    DeviceGuardNoThrow guard(device);
    (void)cudaFree(ptr);
}

int pointer_device(const void *ptr) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) ? attr.device : -1;
}

void copy_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes) {
    DeviceGuard guard(device);
    auto s = static_cast<cudaStream_t>(stream);
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (host to device)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void copy_to_host(int device, void *stream, void *dst, const void *src, size_t nbytes) {
    DeviceGuard guard(device);
    auto s = static_cast<cudaStream_t>(stream);
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void stream_join(int device, void *from, void *to) {
    DeviceGuard guard(device);
    auto a = static_cast<cudaStream_t>(from), b = static_cast<cudaStream_t>(to);
    cudaStreamCaptureStatus sa = cudaStreamCaptureStatusNone, sb = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(a, &sa), "cudaStreamIsCapturing");
    check(cudaStreamIsCapturing(b, &sb), "cudaStreamIsCapturing");
    if (sa != cudaStreamCaptureStatusNone || sb != cudaStreamCaptureStatusNone) return;  // the capture's order
    cudaEvent_t event;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t recorded = cudaEventRecord(event, a);
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(b, event, 0) : recorded;
    (void)cudaEventDestroy(event);  // the wait already holds what it needs
    check(waited, "cudaEventRecord / cudaStreamWaitEvent");
}

void memset(int device, void *stream, void *dst, int value, size_t nbytes) {
    DeviceGuard guard(device);
    check(cudaMemsetAsync(dst, value, nbytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void synchronize(int device, void *stream) {
    DeviceGuard guard(device);
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

}  // namespace fp8amp::kernels::cuda
