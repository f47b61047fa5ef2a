// CUDA kernels of the communicator's device compute (kernels/comm.hpp): the arithmetic of the
// shared inline functions, element for element as the CPU reference (kernels/cpu/comm.cpp) does it,
// so that both compute the same bytes. Encoding goes through the software codec (the same function
// as on the CPU) rather than cvt.rn.satfinite, which the tests have shown to be bit-identical
// anyway; the accumulation adds in rank order 0..nranks-1 in one thread per element, so the sum's
// rounding does not depend on the launch. Everything is enqueued on the context's stream; nothing
// synchronizes except to_host/from_host.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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

// Vectorized variants for the large buckets: each thread takes 8 consecutive elements per step, so
// that one load or store moves 8 to 32 bytes (a scalar 1- or 2-byte access per thread leaves too
// few bytes in flight to reach the memory's bandwidth). The arithmetic per element is the same
// inline functions as above, so the bytes are the same; they are used when every pointer is aligned
// to its vector width (8 elements), and the last n % 8 elements go through the scalar code in the
// same kernel.
constexpr int kVec = 8;

template <fp8amp_dtype D>
__device__ void load8(const void *src, int64_t k, float s, float v[kVec]) {
    if constexpr (D == FP8AMP_DTYPE_F32) {
        const float4 a = *reinterpret_cast<const float4 *>(static_cast<const float *>(src) + k);
        const float4 b = *reinterpret_cast<const float4 *>(static_cast<const float *>(src) + k + 4);
        const float f[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = codec::canonical_f32(f[i]);
    } else if constexpr (D == FP8AMP_DTYPE_F16 || D == FP8AMP_DTYPE_BF16) {
        const uint4 u = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(src) + k);
        const uint16_t *h = reinterpret_cast<const uint16_t *>(&u);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
            v[i] = D == FP8AMP_DTYPE_F16 ? codec::decode<codec::F16>(h[i]) : codec::decode<codec::BF16>(h[i]);
    } else {
        const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const uint8_t *>(src) + k);
        const uint8_t *c = reinterpret_cast<const uint8_t *>(&u);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
            v[i] = scaled(D == FP8AMP_DTYPE_E5M2 ? codec::decode<codec::E5M2>(c[i]) : codec::decode<codec::E4M3>(c[i]), s);
    }
}

template <fp8amp_dtype D>
__device__ void store8(void *dst, int64_t k, const float v[kVec]) {
    if constexpr (D == FP8AMP_DTYPE_F32) {
        float *d = static_cast<float *>(dst) + k;
        *reinterpret_cast<float4 *>(d) = make_float4(codec::canonical_f32(v[0]), codec::canonical_f32(v[1]),
                                                     codec::canonical_f32(v[2]), codec::canonical_f32(v[3]));
        *reinterpret_cast<float4 *>(d + 4) = make_float4(codec::canonical_f32(v[4]), codec::canonical_f32(v[5]),
                                                         codec::canonical_f32(v[6]), codec::canonical_f32(v[7]));
    } else {
        uint4 u;
        uint16_t *h = reinterpret_cast<uint16_t *>(&u);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
            h[i] = static_cast<uint16_t>(D == FP8AMP_DTYPE_F16 ? codec::encode<codec::F16, false>(v[i])
                                                               : codec::encode<codec::BF16, false>(v[i]));
        *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(dst) + k) = u;
    }
}

__device__ int64_t vec_start() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ int64_t vec_step() { return int64_t(gridDim.x) * blockDim.x; }
// The scalar tail [n8, n): taken by the first block's threads.
#define FP8AMP_TAIL(n8, n) for (int64_t k = (n8) + threadIdx.x; blockIdx.x == 0 && k < (n); k += blockDim.x)

template <fp8amp_dtype D>
__global__ void amax_vec_kernel(const void *src, const float *scale_inv, int64_t n, uint32_t *amax) {
    const float s = input_scale(D, scale_inv);
    const int64_t n8 = n / kVec * kVec;
    uint32_t m = 0;
    for (int64_t k = vec_start() * kVec; k < n8; k += vec_step() * kVec) {
        float v[kVec];
        load8<D>(src, k, s, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) m = max(m, amax_bits_of(v[i]));
    }
    FP8AMP_TAIL(n8, n) m = max(m, amax_bits_of(load_real(src, D, s, k)));
    fold_max(m, amax);
}

template <fp8amp_dtype D>
__global__ void quantize_vec_kernel(const void *src, const float *src_scale_inv, int64_t n, const uint32_t *amax_bits,
                                    fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out,
                                    unsigned long long *saturated) {
    const float in_s = input_scale(D, src_scale_inv);
    const float s = comm_scale(comm_fp8_max(wire), *amax_bits);
    const int64_t n8 = n / kVec * kVec;
    unsigned long long sat = 0;
    for (int64_t k = vec_start() * kVec; k < n8; k += vec_step() * kVec) {
        float v[kVec];
        load8<D>(src, k, in_s, v);
        uint2 out;
        uint8_t *c = reinterpret_cast<uint8_t *>(&out);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const float y = scaled(v[i], s);
            sat += comm_saturates(wire, y);
            c[i] = comm_encode(wire, y);
        }
        *reinterpret_cast<uint2 *>(dst + k) = out;
    }
    FP8AMP_TAIL(n8, n) {
        const float y = scaled(load_real(src, D, in_s, k), s);
        sat += comm_saturates(wire, y);
        dst[k] = comm_encode(wire, y);
    }
    fold_count(sat, saturated);
    if (scale_inv_out && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_out = 1.0f / s;
}

__global__ void accumulate_vec_kernel(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                                      const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits) {
    const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
    const int64_t n8 = n / kVec * kVec;
    uint32_t m = 0;
    for (int64_t k = vec_start() * kVec; k < n8; k += vec_step() * kVec) {
        float sum[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum[i] = 0.0f;
        for (int j = 0; j < nranks; ++j) {  // in rank order, as the scalar kernel
            const uint2 u = *reinterpret_cast<const uint2 *>(src + j * stride + k);
            const uint8_t *c = reinterpret_cast<const uint8_t *>(&u);
#pragma unroll
            for (int i = 0; i < kVec; ++i) sum[i] = __fadd_rn(sum[i], comm_decode(wire, c[i]));
        }
        float v[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            v[i] = __fmul_rn(sum[i], f);
            m = max(m, amax_bits_of(v[i]));
        }
        *reinterpret_cast<float4 *>(dst + k) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4 *>(dst + k + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
    FP8AMP_TAIL(n8, n) {
        float sum = 0.0f;
        for (int j = 0; j < nranks; ++j) sum = __fadd_rn(sum, comm_decode(wire, src[j * stride + k]));
        const float v = __fmul_rn(sum, f);
        dst[k] = v;
        m = max(m, amax_bits_of(v));
    }
    if (amax_bits) fold_max(m, amax_bits);
}

template <fp8amp_dtype D>
__global__ void dequantize_vec_kernel(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n,
                                      void *dst) {
    const float s = *scale_inv;
    const int64_t n8 = n / kVec * kVec;
    for (int64_t k = vec_start() * kVec; k < n8; k += vec_step() * kVec) {
        float v[kVec];
        if (format == FP8AMP_DTYPE_E5M2) load8<FP8AMP_DTYPE_E5M2>(src, k, s, v);
        else load8<FP8AMP_DTYPE_E4M3>(src, k, s, v);
        store8<D>(dst, k, v);
    }
    FP8AMP_TAIL(n8, n) store_wide(dst, D, k, load_real(src, format, s, k));
}
#undef FP8AMP_TAIL

bool aligned(const void *p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
// The vector width in bytes of kVec elements of dtype d.
size_t vec_bytes(fp8amp_dtype d) { return kVec * (d == FP8AMP_DTYPE_F32 ? 4 : (d == FP8AMP_DTYPE_F16 || d == FP8AMP_DTYPE_BF16) ? 2 : 1); }
int vec_blocks(int64_t n) { return blocks_for((n + kVec - 1) / kVec); }

// Calls f(std::integral_constant<fp8amp_dtype, d>) for a runtime dtype.
template <class F>
void with_dtype(fp8amp_dtype d, F &&f) {
    switch (d) {
    case FP8AMP_DTYPE_F32: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F32>()); break;
    case FP8AMP_DTYPE_F16: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F16>()); break;
    case FP8AMP_DTYPE_BF16: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_BF16>()); break;
    case FP8AMP_DTYPE_E4M3: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>()); break;
    case FP8AMP_DTYPE_E5M2: f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>()); break;
    }
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
        if (aligned(src, vec_bytes(dtype))) {
            with_dtype(dtype, [&](auto d) {
                amax_vec_kernel<decltype(d)::value><<<vec_blocks(n), kThreads, 0, st(stream)>>>(src, src_scale_inv, n, amax_bits);
            });
        } else {
            amax_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits);
        }
        cuda::check_launch("comm amax_kernel");
    }
    void quantize(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, const uint32_t *amax_bits,
                  fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out, unsigned long long *saturated,
                  void *stream) override {
        cuda::DeviceGuard g(device_);
        if (aligned(src, vec_bytes(dtype)) && aligned(dst, kVec)) {
            with_dtype(dtype, [&](auto d) {
                quantize_vec_kernel<decltype(d)::value><<<vec_blocks(n), kThreads, 0, st(stream)>>>(
                    src, src_scale_inv, n, amax_bits, wire, dst, scale_inv_out, saturated);
            });
        } else {
            quantize_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, dtype, src_scale_inv, n, amax_bits, wire,
                                                                        dst, scale_inv_out, saturated);
        }
        cuda::check_launch("comm quantize_kernel");
    }
    void accumulate(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                    const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits, void *stream) override {
        cuda::DeviceGuard g(device_);
        if (aligned(src, kVec) && stride % kVec == 0 && aligned(dst, kVec * sizeof(float)))
            accumulate_vec_kernel<<<vec_blocks(n), kThreads, 0, st(stream)>>>(src, stride, nranks, n, wire,
                                                                              wire_scale_inv, average, dst, amax_bits);
        else
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
        if (aligned(src, kVec) && aligned(dst, vec_bytes(dtype)) && !(dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2)) {
            with_dtype(dtype, [&](auto d) {
                constexpr fp8amp_dtype D = decltype(d)::value;
                if constexpr (D == FP8AMP_DTYPE_F32 || D == FP8AMP_DTYPE_F16 || D == FP8AMP_DTYPE_BF16)
                    dequantize_vec_kernel<D><<<vec_blocks(n), kThreads, 0, st(stream)>>>(src, format, scale_inv, n, dst);
            });
        } else {
            dequantize_kernel<<<blocks_for(n), kThreads, 0, st(stream)>>>(src, format, scale_inv, n, dst, dtype);
        }
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
