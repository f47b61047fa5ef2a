// How many thread block clusters of C blocks an H100 holds at once (cudaOccupancyMaxActiveClusters),
// for blocks shaped like the norm backward's: 256 threads, __launch_bounds__(256, 2), S KB of dynamic
// shared memory. It tells which cluster size keeps the backward's 264 blocks (norm::kMaxChunks: 2 a
// SM) in one wave, should its chunks' partials be added through distributed shared memory
// (docs/performance.md, "The norm backward's finishing kernel").
//
// Build and run: nvcc -O2 -arch=sm_90 bench/cluster_occupancy.cu -o cluster_occupancy && ./cluster_occupancy
#include <cstdio>

#include <cuda_runtime.h>

__global__ void __launch_bounds__(256, 2) probe(float *p) {
    extern __shared__ float s[];
    s[threadIdx.x] = 1.0f;
    if (p) p[0] = s[0];
}

int main() {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        std::printf("no CUDA device\n");
        return 1;
    }
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024);
    std::printf("SMs %d\n", sms);
    for (int kb : {16, 48, 64, 96, 100, 110}) {
        for (int c : {1, 2, 4, 8}) {  // 8: the largest portable cluster
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(264, 1, 1);
            cfg.blockDim = dim3(256, 1, 1);
            cfg.dynamicSmemBytes = size_t(kb) * 1024;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = unsigned(c);
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            int n = -1;
            const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe, &cfg);
            std::printf("smem %3d KB cluster %d: max active clusters %4d (blocks %4d)%s%s\n", kb, c, n, n * c,
                        e ? " " : "", e ? cudaGetErrorString(e) : "");
        }
    }
    return 0;
}
