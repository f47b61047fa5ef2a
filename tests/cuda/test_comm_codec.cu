// The communicator's hardware FP8 decode (decode4, checked against codec::decode over all 2^32
// words) and encode (kernels/cuda/comm_codec.cuh: encode2, two values per
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32, NaN mapped explicitly) against the software codec the CPU
// reference uses (kernels/comm.hpp: comm_encode), over every float32 bit pattern: each pattern x in
// the low half of a pair whose high half is -x, and (a second pass) in the high half beside a
// scrambled partner, so that both lanes of the instruction see every input. Any difference fails,
// printing the first pattern that differs. The saturation count of the kernels does not depend on
// this (comm_saturates reads the scaled value), but their codes do: the GPU all-reduce equals the
// CPU's bytes only if this holds.
//
// Exit codes: 0 pass, 1 a mismatch or a CUDA error, 77 SKIPPED (no CUDA device, or one older than
// sm_89, which has no FP8 conversions).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "comm.hpp"
#include "comm_codec.cuh"

using namespace fp8amp::kernels;

namespace {

template <fp8amp_dtype W>
__global__ void check_kernel(uint64_t count, int pass, unsigned long long *mismatches, uint32_t *first_bad) {
    unsigned long long bad = 0;
    for (uint64_t k = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; k < count; k += uint64_t(gridDim.x) * blockDim.x) {
        const uint32_t bits = static_cast<uint32_t>(k);
        const uint32_t other = pass == 0 ? bits ^ 0x80000000u : bits * 2654435761u + 0x9E3779B9u;
        const float lo = __uint_as_float(pass == 0 ? bits : other), hi = __uint_as_float(pass == 0 ? other : bits);
        const uint32_t hw = cuda::encode2<W>(lo, hi);
        const uint32_t sw = uint32_t(comm_encode(W, lo)) | (uint32_t(comm_encode(W, hi)) << 8);
        if (hw != sw) {
            ++bad;
            atomicMin(first_bad, bits);
        }
    }
    if (bad) atomicAdd(mismatches, bad);
}

// decode4 (four codes of a word through the hardware's F16 conversions) against codec::decode, over
// every 32-bit word: every code in every byte position, beside every other; and any_special4 and
// decode4_nonnan, the all-reduce's fast path, against the same definitions.
template <fp8amp_dtype W>
__global__ void decode_kernel(uint64_t count, unsigned long long *mismatches, uint32_t *first_bad) {
    using F = std::conditional_t<W == FP8AMP_DTYPE_E4M3, fp8amp::codec::E4M3, fp8amp::codec::E5M2>;
    unsigned long long bad = 0;
    for (uint64_t k = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; k < count; k += uint64_t(gridDim.x) * blockDim.x) {
        const uint32_t w = static_cast<uint32_t>(k);
        float v[4];
        cuda::decode4<W>(w, v);
        bool same = true, special = false;
        for (int i = 0; i < 4; ++i) {
            const uint32_t c = (w >> (8 * i)) & 0xFFu;
            same = same && __float_as_uint(v[i]) == __float_as_uint(fp8amp::codec::decode<F>(c));
            special = special || (W == FP8AMP_DTYPE_E4M3 ? (c & 0x7Fu) == 0x7Fu : (c & 0x7Cu) == 0x7Cu);
        }
        // The reduction's fast path: any_special4 finds exactly the words with a NaN (E5M2: also an
        // infinity), and without one decode4_nonnan gives codec::decode's floats.
        same = same && cuda::any_special4<W>(w) == special;
        if (!special) {
            float u[4];
            cuda::decode4_nonnan<W>(w, u);
            for (int i = 0; i < 4; ++i) same = same && __float_as_uint(u[i]) == __float_as_uint(v[i]);
        }
        if (!same) {
            ++bad;
            atomicMin(first_bad, w);
        }
    }
    if (bad) atomicAdd(mismatches, bad);
}

bool ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    std::fprintf(stderr, "test_comm_codec: %s: %s\n", what, cudaGetErrorString(e));
    return false;
}

template <fp8amp_dtype W>
int check_format(const char *name) {
    unsigned long long *d_bad = nullptr;
    uint32_t *d_first = nullptr;
    if (!ok(cudaMalloc(&d_bad, sizeof *d_bad), "cudaMalloc") || !ok(cudaMalloc(&d_first, sizeof *d_first), "cudaMalloc"))
        return 1;
    int failures = 0;
    for (int pass = 0; pass < 2; ++pass) {
        cudaMemset(d_bad, 0, sizeof *d_bad);
        cudaMemset(d_first, 0xFF, sizeof *d_first);
        check_kernel<W><<<8192, 256>>>(uint64_t(1) << 32, pass, d_bad, d_first);
        if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "kernel")) return 1;
        unsigned long long bad = 0;
        uint32_t first = 0;
        cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost);
        cudaMemcpy(&first, d_first, sizeof first, cudaMemcpyDeviceToHost);
        if (bad) {
            float x;
            std::memcpy(&x, &first, sizeof x);
            std::printf("FAIL %s pass %d: %llu of 2^32 patterns differ; first 0x%08x (%g): software 0x%02x\n", name,
                        pass, bad, first, x, unsigned(comm_encode(W, x)));
            ++failures;
        } else {
            std::printf("ok   %s pass %d: hardware encode2 == software comm_encode for all 2^32 float32 patterns\n", name,
                        pass);
        }
    }
    {
        cudaMemset(d_bad, 0, sizeof *d_bad);
        cudaMemset(d_first, 0xFF, sizeof *d_first);
        decode_kernel<W><<<8192, 256>>>(uint64_t(1) << 32, d_bad, d_first);
        if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "kernel")) return 1;
        unsigned long long bad = 0;
        uint32_t first = 0;
        cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost);
        cudaMemcpy(&first, d_first, sizeof first, cudaMemcpyDeviceToHost);
        if (bad) {
            std::printf("FAIL %s decode4: %llu of 2^32 words differ from codec::decode; first 0x%08x\n", name, bad, first);
            ++failures;
        } else {
            std::printf("ok   %s decode4 == codec::decode for all 2^32 words\n", name);
        }
    }
    cudaFree(d_bad);
    cudaFree(d_first);
    return failures;
}

}  // namespace

int main() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop{};
    if (!ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
    if (prop.major * 10 + prop.minor < 89) {
        std::printf("SKIPPED: %s (sm_%d%d) has no FP8 conversions\n", prop.name, prop.major, prop.minor);
        return 77;
    }
    const int failures = check_format<FP8AMP_DTYPE_E4M3>("E4M3") + check_format<FP8AMP_DTYPE_E5M2>("E5M2");
    return failures ? 1 : 0;
}
