// CUDA kernels of the communicator's device compute (kernels/comm.hpp): the arithmetic of the
// shared inline functions, element for element as the CPU reference (kernels/cpu/comm.cpp) does it,
// so that both compute the same bytes. Encoding goes through the software codec (the same function
// as on the CPU) rather than cvt.rn.satfinite, which the tests have shown to be bit-identical
// anyway; the accumulation adds in rank order 0..nranks-1 in one thread per element, so the sum's
// rounding does not depend on the launch. Everything is enqueued on the context's stream; nothing
// synchronizes except to_host/from_host.
#include <cuda_runtime.h>

#include "comm.hpp"
#include "cuda_common.cuh"

namespace fp8amp::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 4096 ? (b < 1 ? 1 : b) : 4096);  // grid-stride beyond
}

__device__ float load_real(const void *src, fp8amp_dtype dtype, float s, int64_t k) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return codec::canonical_f32(static_cast<const float *>(src)[k]);
    case FP8AMP_DTYPE_F16: return codec::decode<codec::F16>(static_cast<const uint16_t *>(src)[k]);
    case FP8AMP_DTYPE_BF16: return codec::decode<codec::BF16>(static_cast<const uint16_t *>(src)[k]);
    case FP8AMP_DTYPE_E4M3: return scaled(codec::decode<codec::E4M3>(static_cast<const uint8_t *>(src)[k]), s);
    case FP8AMP_DTYPE_E5M2: return scaled(codec::decode<codec::E5M2>(static_cast<const uint8_t *>(src)[k]), s);
    }
    return 0.0f;
}

// As cpu::with_store: canonical NaN into F32, IEEE rounding into F16/BF16.
__device__ void store_wide(void *dst, fp8amp_dtype dtype, int64_t k, float v) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(dst)[k] = codec::canonical_f32(v); break;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(dst)[k] = static_cast<uint16_t>(codec::encode<codec::F16, false>(v)); break;
    case FP8AMP_DTYPE_BF16: static_cast<uint16_t *>(dst)[k] = static_cast<uint16_t>(codec::encode<codec::BF16, false>(v)); break;
    default: break;
    }
}

__device__ float input_scale(fp8amp_dtype dtype, const float *scale_inv) {
    return (dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2) ? *scale_inv : 1.0f;
}

// Block-wide max of non-negative bits, then one atomic.
__device__ void fold_max(uint32_t local, uint32_t *target) {
    for (int o = 16; o > 0; o >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, o));
    if ((threadIdx.x & 31) == 0 && local) atomicMax(target, local);
}
__device__ void fold_count(unsigned long long local, unsigned long long *target) {
    for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(target, local);
}

__global__ void amax_kernel(const void *src, fp8amp_dtype dtype, const float *scale_inv, int64_t n, uint32_t *amax) {
    const float s = input_scale(dtype, scale_inv);
    uint32_t m = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        m = max(m, amax_bits_of(load_real(src, dtype, s, k)));
    fold_max(m, amax);
}

__global__ void quantize_kernel(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n,
                                const uint32_t *amax_bits, fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out,
                                unsigned long long *saturated) {
    const float in_s = input_scale(dtype, src_scale_inv);
    const float fp8_max = comm_fp8_max(wire);
    const float s = comm_scale(fp8_max, *amax_bits);
    unsigned long long sat = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        const float y = scaled(load_real(src, dtype, in_s, k), s);
        sat += comm_saturates(wire, y);
        dst[k] = comm_encode(wire, y);
    }
    fold_count(sat, saturated);
    if (scale_inv_out && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_out = 1.0f / s;
}

__global__ void accumulate_kernel(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                                  const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    uint32_t m = 0;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
        float sum = 0.0f;
        for (int j = 0; j < nranks; ++j) sum = __fadd_rn(sum, comm_decode(wire, src[j * stride + k]));
        const float v = __fmul_rn(sum, f);
        dst[k] = v;
        m = max(m, amax_bits_of(v));
    }
    if (amax_bits) fold_max(m, amax_bits);
}

__global__ void scale_inv_kernel(const uint32_t *amax_bits, fp8amp_dtype format, float *out) {
    *out = 1.0f / comm_scale(comm_fp8_max(format), *amax_bits);
}

__global__ void dequantize_kernel(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n,
                                  void *dst, fp8amp_dtype dtype) {
    const float s = *scale_inv;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        store_wide(dst, dtype, k, load_real(src, format, s, k));
}

__global__ void convert_kernel(const float *src, int64_t n, void *dst, fp8amp_dtype dtype) {
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
        store_wide(dst, dtype, k, src[k]);
}

class CudaCommCompute final : public CommCompute {
public:
    explicit CudaCommCompute(int device) : device_(device) {}
    void memset_async(void *dst, int value, size_t nbytes, void *stream) override {
        if (!nbytes) return;
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemsetAsync(dst, value, nbytes, st(stream)), "cudaMemsetAsync");
    }
    void copy_async(void *dst, const void *src, size_t nbytes, void *stream) override {
        if (!nbytes || dst == src) return;
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, st(stream)), "cudaMemcpyAsync");
    }
    void to_host(void *dst, const void *src, size_t nbytes, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, st(stream)), "cudaMemcpyAsync");
        cuda::check(cudaStreamSynchronize(st(stream)), "cudaStreamSynchronize");
    }
    void from_host(void *dst, const void *src, size_t nbytes, void *stream) override {
        cuda::DeviceGuard g(device_);
        cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, st(stream)), "cudaMemcpyAsync");
        cuda::check(cudaStreamSynchronize(st(stream)), "cudaStreamSynchronize");
    }
    void amax(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, uint32_t *amax_bits,
              void *stream) override {
        cuda::DeviceGuard g(device_);
        amax_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits);
        cuda::check_launch("comm amax_kernel");
    }
    void quantize(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, const uint32_t *amax_bits,
                  fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out, unsigned long long *saturated,
                  void *stream) override {
        cuda::DeviceGuard g(device_);
        quantize_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits, wire, dst,
                                                                    scale_inv_out, saturated);
        cuda::check_launch("comm quantize_kernel");
    }
    void accumulate(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                    const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits, void *stream) override {
        cuda::DeviceGuard g(device_);
        accumulate_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, stride, nranks, n, wire, wire_scale_inv,
                                                                      average, dst, amax_bits);
        cuda::check_launch("comm accumulate_kernel");
    }
    void requantize(const float *src, int64_t n, const uint32_t *amax_bits, fp8amp_dtype format, uint8_t *dst,
                    float *scale_inv_out, unsigned long long *saturated, void *stream) override {
        quantize(src, FP8AMP_DTYPE_F32, nullptr, n, amax_bits, format, dst, scale_inv_out, saturated, stream);
    }
    void scale_inv(const uint32_t *amax_bits, fp8amp_dtype format, float *out, void *stream) override {
        cuda::DeviceGuard g(device_);
        scale_inv_kernel<<<1, 1, 0, st(stream)>>>(amax_bits, format, out);
        cuda::check_launch("comm scale_inv_kernel");
    }
    void dequantize(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n, void *dst,
                    fp8amp_dtype dtype, void *stream) override {
        cuda::DeviceGuard g(device_);
        dequantize_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, format, scale_inv, n, dst, dtype);
        cuda::check_launch("comm dequantize_kernel");
    }
    void convert(const float *src, int64_t n, void *dst, fp8amp_dtype dtype, void *stream) override {
        cuda::DeviceGuard g(device_);
        convert_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, n, dst, dtype);
        cuda::check_launch("comm convert_kernel");
    }

private:
    static cudaStream_t st(void *s) { return static_cast<cudaStream_t>(s); }
    int device_;
};

}  // namespace

std::unique_ptr<CommCompute> make_cuda_comm_compute(int device) { return std::make_unique<CudaCommCompute>(device); }

}  // namespace fp8amp::kernels
