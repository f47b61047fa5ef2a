// Checks on the GPU that the Adam kernel's division by the step constant bc2_sqrt (div_const,
// kernels/cuda/adam_div.cuh) gives __fdiv_rn's bits: for every non-negative finite float a in the
// range the kernel uses it for (+0 and [2^-75, 2^64]) and divisors b that the step produces (bc2_sqrt
// of beta2 in {0.9, 0.95, 0.98, 0.99, 0.999, 0.9999} at steps 1..4096) plus random b in [2^-12, 1]
// and the ends of that range. Also counts (for information) mismatches outside that range of a.
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
using fp8amp::kernels::cuda::make_const_div;

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
    return tin ? 1 : 0;
}
