// Checks on the GPU that the Adam kernel's division by the step constant bc2_sqrt (div_const,
// kernels/cuda/adam_div.cuh) gives __fdiv_rn's bits: for every non-negative finite float a in the
// range the kernel uses it for (+0 and [2^-75, 2^64]) and divisors b that the step produces (bc2_sqrt
// of beta2 in {0.9, 0.95, 0.98, 0.99, 0.999, 0.9999} at steps 1..4096) plus random b in [2^-12, 1]
// and the ends of that range. Also counts (for information) mismatches outside that range of a.
// Then the lean forms of FP8AMP_ADAM_LEAN: sqrt_lean (with the kernel's max(., 0) for v = +0) against
// __fsqrt_rn for v = +0 and every v in [2^-101, FLT_MAX], and div_lean against __fdiv_rn for a = +-0
// and every a of either sign with |a| in [2^-100, 2^100], divisors b in [2^-100, 2^76] (the step's
// denom = sqrt(v) / bc2_sqrt + eps, checked by the kernel), counted where the kernel's lane check
// lets it through: |a / b| (exact quotient) >= 2^-100, |a / b| <= 2^100.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 -I kernels bench/adam_ieee_check.cu -o adam_ieee_check
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/adam_div.cuh"

using fp8amp::kernels::cuda::div_const;
using fp8amp::kernels::cuda::div_lean;
using fp8amp::kernels::cuda::make_const_div;
using fp8amp::kernels::cuda::sqrt_lean;

__global__ void check_sqrt_lean(unsigned long long *bad, uint32_t *first) {
    unsigned long long n = 0;
    for (uint64_t i = 0x0C000000ull + uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= 0x7F7FFFFFull;
         i += uint64_t(gridDim.x) * blockDim.x) {
        const uint32_t bits = i < 0x0D000000ull ? 0u : uint32_t(i);  // +0 (many times), then the range
        const float v = __uint_as_float(bits);
        if (__float_as_uint(fmaxf(sqrt_lean(v), 0.0f)) != __float_as_uint(__fsqrt_rn(v))) {
            ++n;
            atomicCAS(first, 0u, bits | 1u);
        }
    }
    atomicAdd(bad, n);
}

// The kernel's lane check passes a nonzero a when |a| >= 2^-100, |a| / dmax >= 2^-100 and |a| <= 2^99 eps
// <= 2^100 (so |a / b| <= 2^100): here every quotient with |a / b| in [2^-100, 2^100] by exact tests
// (products by powers of two, exact in double), and a = +-0 for every b.
__global__ void check_div_lean(const float *bs, int nb, unsigned long long *bad, unsigned long long *used, uint32_t *first) {
    const uint32_t lo = 0x0D800000u, hi = 0x71800000u;  // 2^-100, 2^100
    for (int k = 0; k < nb; ++k) {
        const float b = bs[k];
        unsigned long long n = 0, u = 0;
        if (blockIdx.x == 0 && threadIdx.x < 2) {
            const float a = threadIdx.x ? -0.0f : 0.0f;
            if (__float_as_uint(div_lean(a, b)) != __float_as_uint(__fdiv_rn(a, b))) ++n, atomicCAS(first, 0u, 0x80000000u);
            ++u;
        }
        for (uint64_t i = lo + uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= hi; i += uint64_t(gridDim.x) * blockDim.x) {
            for (int sign = 0; sign < 2; ++sign) {
                const float a = __uint_as_float(uint32_t(i) | (sign ? 0x80000000u : 0u));
                const double aa = fabs(double(a));
                if (!(aa >= 0x1p-100 * double(b) && aa <= 0x1p100 * double(b))) continue;  // the kernel redoes these
                ++u;
                if (__float_as_uint(div_lean(a, b)) != __float_as_uint(__fdiv_rn(a, b))) {
                    ++n;
                    atomicCAS(first, 0u, uint32_t(i));
                }
            }
        }
        atomicAdd(bad, n);
        atomicAdd(used, u);
    }
}

__global__ void check(const float *bs, int nb, unsigned long long *bad_in, unsigned long long *bad_out, uint32_t *first) {
    const uint32_t lo = 0x1A000000u, hi = 0x5F800000u;  // 2^-75, 2^64
    for (int k = 0; k < nb; ++k) {
        const float b = bs[k];
        const auto d = make_const_div(b);
        unsigned long long in = 0, out = 0;
        for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= 0x7F7FFFFFull;
             i += uint64_t(gridDim.x) * blockDim.x) {
            const uint32_t bits = uint32_t(i);
            const float a = __uint_as_float(bits);
            const float q = div_const(a, d), r = __fdiv_rn(a, b);
            if (__float_as_uint(q) != __float_as_uint(r)) {
                if (bits == 0 || (bits >= lo && bits <= hi)) {
                    ++in;
                    atomicCAS(first, 0u, bits);
                } else {
                    ++out;
                }
            }
        }
        atomicAdd(&bad_in[k], in);
        atomicAdd(&bad_out[k], out);
    }
}

int main() {
    std::vector<float> bs;
    const double betas[] = {0.9, 0.95, 0.98, 0.99, 0.999, 0.9999};
    for (double b2 : betas) {
        const float beta2 = float(b2);
        for (int t = 1; t <= 4096; t = t < 64 ? t + 1 : t * 2) {
            double p = 1.0, base = beta2;  // pow_int, as kernels/adam.hpp
            for (int n = t; n > 0; n >>= 1) {
                if (n & 1) p *= base;
                base *= base;
            }
            bs.push_back(float(std::sqrt(1.0 - p)));
        }
    }
    bs.push_back(0x1p-12f);
    bs.push_back(1.0f);
    bs.push_back(std::nextafter(1.0f, 0.0f));
    std::mt19937 rng(12345);
    std::uniform_real_distribution<double> u(-12.0, 0.0);
    for (int i = 0; i < 256; ++i) bs.push_back(float(std::exp2(u(rng))));
    const int nb = int(bs.size());
    float *dbs;
    unsigned long long *din, *dout;
    uint32_t *dfirst;
    cudaMalloc(&dbs, nb * sizeof(float));
    cudaMalloc(&din, nb * sizeof(unsigned long long));
    cudaMalloc(&dout, nb * sizeof(unsigned long long));
    cudaMalloc(&dfirst, sizeof(uint32_t));
    cudaMemcpy(dbs, bs.data(), nb * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(din, 0, nb * sizeof(unsigned long long));
    cudaMemset(dout, 0, nb * sizeof(unsigned long long));
    cudaMemset(dfirst, 0, sizeof(uint32_t));
    check<<<132 * 16, 256>>>(dbs, nb, din, dout, dfirst);
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        std::printf("CUDA error: %s\n", cudaGetErrorString(err));
        return 2;
    }
    std::vector<unsigned long long> in(nb), out(nb);
    uint32_t first = 0;
    cudaMemcpy(in.data(), din, nb * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    cudaMemcpy(out.data(), dout, nb * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    cudaMemcpy(&first, dfirst, sizeof first, cudaMemcpyDeviceToHost);
    unsigned long long tin = 0, tout = 0;
    for (int k = 0; k < nb; ++k) tin += in[k], tout += out[k];
    std::printf("div_const vs __fdiv_rn: %d divisors x 2^31 dividends: %llu mismatches in the kernel's range "
                "(+0, [2^-75, 2^64]), %llu outside it (not used)%s\n",
                nb, tin, tout, tin ? "" : "  OK");
    if (tin) std::printf("first mismatching dividend bits: 0x%08x\n", first);

    // The lean forms (FP8AMP_ADAM_LEAN).
    unsigned long long *dbad, *dused;
    uint32_t *dfirst2;
    cudaMalloc(&dbad, 2 * sizeof(unsigned long long));
    cudaMalloc(&dused, sizeof(unsigned long long));
    cudaMalloc(&dfirst2, 2 * sizeof(uint32_t));
    cudaMemset(dbad, 0, 2 * sizeof(unsigned long long));
    cudaMemset(dused, 0, sizeof(unsigned long long));
    cudaMemset(dfirst2, 0, 2 * sizeof(uint32_t));
    check_sqrt_lean<<<132 * 16, 256>>>(dbad, dfirst2);
    std::vector<float> ds = {0x1p-100f, std::nextafter(0x1p-100f, 1.0f), 1e-8f, 1e-6f, 1.0f, 0x1p76f,
                             std::nextafter(0x1p76f, 0.0f)};
    std::uniform_real_distribution<double> w(-100.0, 76.0);
    for (int i = 0; i < 120; ++i) ds.push_back(float(std::exp2(w(rng))));
    float *dds;
    cudaMalloc(&dds, ds.size() * sizeof(float));
    cudaMemcpy(dds, ds.data(), ds.size() * sizeof(float), cudaMemcpyHostToDevice);
    check_div_lean<<<132 * 16, 256>>>(dds, int(ds.size()), dbad + 1, dused, dfirst2 + 1);
    const cudaError_t err2 = cudaDeviceSynchronize();
    if (err2 != cudaSuccess) {
        std::printf("CUDA error: %s\n", cudaGetErrorString(err2));
        return 2;
    }
    unsigned long long bad[2] = {0, 0}, used = 0;
    uint32_t firsts[2] = {0, 0};
    cudaMemcpy(bad, dbad, sizeof bad, cudaMemcpyDeviceToHost);
    cudaMemcpy(&used, dused, sizeof used, cudaMemcpyDeviceToHost);
    cudaMemcpy(firsts, dfirst2, sizeof firsts, cudaMemcpyDeviceToHost);
    std::printf("sqrt_lean vs __fsqrt_rn: v = +0 and every v in [2^-101, FLT_MAX]: %llu mismatches%s\n", bad[0],
                bad[0] ? "" : "  OK");
    if (bad[0]) std::printf("first mismatching v bits (| 1): 0x%08x\n", firsts[0]);
    std::printf("div_lean vs __fdiv_rn: %zu divisors in [2^-100, 2^76] x (+-0 and every +-a in [2^-100, 2^100] with "
                "|a / b| in [2^-100, 2^100]): %llu quotients, %llu mismatches%s\n",
                ds.size(), used, bad[1], bad[1] ? "" : "  OK");
    if (bad[1]) std::printf("first mismatching dividend bits: 0x%08x\n", firsts[1]);
    return (tin || bad[0] || bad[1]) ? 1 : 0;
}
