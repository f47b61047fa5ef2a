// How adam.cu reaches the two Adam kernels, each in its own file with its launcher: the block size
// both are built for, the cooperative launch of a persistent grid, and the launchers' declarations
// (each defined, for every state layout, beside its kernel).
#pragma once

#include <cuda_runtime.h>

#include "adam.hpp"
#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda::adam_launch {

// Threads per CTA of both kernels (adam_grid_size counts the CTAs that fit at this size).
constexpr int kThreads = 256;

// One cooperative launch of `kernel` on a persistent grid: as many CTAs as fit on the device at once
// (the kernel's own occupancy), at most max_partials (the Partial slots the caller provides).
template <class Kernel>
void launch_cooperative(Kernel kernel, int device, cudaStream_t stream, const adam::StepConfig &config,
                        int max_partials) {
    const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads);
    int grid = per_sm * multiprocessor_count(device);
    if (grid > max_partials) grid = max_partials;
    if (grid < 1) fail(FP8AMP_ERROR_CUDA, "adam_kernel: no block fits on a multiprocessor");
    adam::StepConfig c = config;
    void *args[] = {&c};
    check(cudaLaunchCooperativeKernel(reinterpret_cast<const void *>(kernel), dim3(grid), dim3(kThreads), args, 0, stream),
          "cudaLaunchCooperativeKernel (adam_kernel)");
}

// The generic kernel (adam_generic.cu): every configuration.
template <bool M8, bool V16, bool MASTER>
void launch_generic(int device, cudaStream_t stream, const adam::StepConfig &c, int max_partials);

// The fast kernel (adam_fast.cu) where the configuration has one, returning true; false, with
// nothing launched, where it has none.
template <bool M8, bool V16, bool MASTER>
bool launch_fast(int device, cudaStream_t stream, const adam::StepConfig &c, int max_partials);

}  // namespace fp8amp::kernels::cuda::adam_launch
