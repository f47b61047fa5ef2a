// fp8amp_cast on CUDA: one element-wise pass, 8 elements per thread with vector loads and stores
// when both pointers allow it (conversions in elementwise.cuh).
#include <cstdint>

#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda {
namespace {

constexpr int kVec = 8;
constexpr int kThreads = 256;

template <class T>
struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
};

template <fp8amp_dtype S, fp8amp_dtype D>
__global__ void cast_vector_kernel(const typename Storage<S>::type *__restrict__ src,
                                   typename Storage<D>::type *__restrict__ dst, size_t n_packs) {
    using SrcPack = Pack<typename Storage<S>::type>;
    using DstPack = Pack<typename Storage<D>::type>;
    const auto *in = reinterpret_cast<const SrcPack *>(src);
    auto *out = reinterpret_cast<DstPack *>(dst);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_packs; i += size_t(gridDim.x) * blockDim.x) {
        const SrcPack a = in[i];
        DstPack b;
#pragma unroll
        for (int k = 0; k < kVec; ++k) b.v[k] = from_f32<D>(to_f32<S>(a.v[k]));
        out[i] = b;
    }
}

template <fp8amp_dtype S, fp8amp_dtype D>
__global__ void cast_scalar_kernel(const typename Storage<S>::type *__restrict__ src,
                                   typename Storage<D>::type *__restrict__ dst, size_t begin, size_t n) {
    for (size_t i = begin + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

unsigned grid_for(int device, size_t work_items) {
    const size_t wanted = (work_items + kThreads - 1) / kThreads;
    const size_t cap = size_t(multiprocessor_count(device)) * 16;  // enough blocks in flight to fill the chip
    return static_cast<unsigned>(wanted < cap ? (wanted ? wanted : 1) : cap);
}

template <fp8amp_dtype S, fp8amp_dtype D>
void launch(int device, cudaStream_t stream, const void *src_raw, void *dst_raw, size_t n) {
    using SrcT = typename Storage<S>::type;
    using DstT = typename Storage<D>::type;
    const auto *src = static_cast<const SrcT *>(src_raw);
    auto *dst = static_cast<DstT *>(dst_raw);
    const bool aligned = reinterpret_cast<uintptr_t>(src) % alignof(Pack<SrcT>) == 0 &&
                         reinterpret_cast<uintptr_t>(dst) % alignof(Pack<DstT>) == 0;
    size_t done = 0;
    if (aligned && n >= kVec) {
        const size_t packs = n / kVec;
        cast_vector_kernel<S, D><<<grid_for(device, packs), kThreads, 0, stream>>>(src, dst, packs);
        check_launch("cast_vector_kernel");
        done = packs * kVec;
    }
    if (done < n) {
        cast_scalar_kernel<S, D><<<grid_for(device, n - done), kThreads, 0, stream>>>(src, dst, done, n);
        check_launch("cast_scalar_kernel");
    }
}

template <fp8amp_dtype S>
void launch_to(int device, cudaStream_t stream, const void *src, void *dst, fp8amp_dtype dst_dtype, size_t n) {
    switch (dst_dtype) {
    case FP8AMP_DTYPE_F32: return launch<S, FP8AMP_DTYPE_F32>(device, stream, src, dst, n);
    case FP8AMP_DTYPE_F16: return launch<S, FP8AMP_DTYPE_F16>(device, stream, src, dst, n);
    case FP8AMP_DTYPE_BF16: return launch<S, FP8AMP_DTYPE_BF16>(device, stream, src, dst, n);
    case FP8AMP_DTYPE_E4M3: return launch<S, FP8AMP_DTYPE_E4M3>(device, stream, src, dst, n);
    case FP8AMP_DTYPE_E5M2: return launch<S, FP8AMP_DTYPE_E5M2>(device, stream, src, dst, n);
    }
    fail(FP8AMP_ERROR_INTERNAL, "cuda::cast: unknown destination dtype");
}

}  // namespace

void cast(int device, void *stream_raw, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
          size_t n) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    if (src_dtype == dst_dtype) {
        check(cudaMemcpyAsync(dst, src, n * fp8amp_dtype_size(src_dtype), cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync (device to device)");
        return;
    }
    switch (src_dtype) {
    case FP8AMP_DTYPE_F32: return launch_to<FP8AMP_DTYPE_F32>(device, stream, src, dst, dst_dtype, n);
    case FP8AMP_DTYPE_F16: return launch_to<FP8AMP_DTYPE_F16>(device, stream, src, dst, dst_dtype, n);
    case FP8AMP_DTYPE_BF16: return launch_to<FP8AMP_DTYPE_BF16>(device, stream, src, dst, dst_dtype, n);
    case FP8AMP_DTYPE_E4M3: return launch_to<FP8AMP_DTYPE_E4M3>(device, stream, src, dst, dst_dtype, n);
    case FP8AMP_DTYPE_E5M2: return launch_to<FP8AMP_DTYPE_E5M2>(device, stream, src, dst, dst_dtype, n);
    }
    fail(FP8AMP_ERROR_INTERNAL, "cuda::cast: unknown source dtype");
}

}  // namespace fp8amp::kernels::cuda
