// Host cost of the CUDA calls an fp8amp Linear is made of, on the machine at hand: a kernel
// launch, a cuBLASLt matmul, and a CUDA graph launch holding the same work. It tells what a
// forward call's host time can be at best on this machine (the Linear's own overhead is measured by
// bench_linear.py --sections host). The GPU is kept busy by a spinning kernel, so no call waits for
// it, and the number of calls stays well below the launch queue's depth.
//
// Build and run: nvcc -O2 -arch=sm_90 bench/launch_cost.cu -lcublasLt -o launch_cost && ./launch_cost
// Prints one JSON object (µs per call).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#define CHECK(x)                                                                                      \
    do {                                                                                              \
        auto e_ = (x);                                                                                \
        if (e_ != 0) {                                                                                \
            std::fprintf(stderr, "%s failed (%d) at line %d\n", #x, static_cast<int>(e_), __LINE__); \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

__global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__global__ void empty_kernel() {}

__global__ void scale_kernel(const __nv_bfloat16 *x, __nv_bfloat16 *y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(__bfloat162float(x[i]) * 2.0f);
}

// Mean host µs per call of fn over `calls` calls, behind a spinning kernel when busy.
static double host_us(cudaStream_t s, const std::function<void()> &fn, bool busy, int calls = 200) {
    for (int i = 0; i < 20; ++i) fn();
    CHECK(cudaStreamSynchronize(s));
    cudaEvent_t done;
    CHECK(cudaEventCreate(&done));
    if (busy) spin<<<1, 1, 0, s>>>(2'000'000'000LL);  // about a second
    CHECK(cudaEventRecord(done, s));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const auto t1 = std::chrono::steady_clock::now();
    const bool went_idle = busy && cudaEventQuery(done) == cudaSuccess;
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventDestroy(done));
    if (went_idle) std::fprintf(stderr, "warning: the GPU went idle during a busy timing\n");
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int m = 16, k = 1024, n = 1024;
    __nv_bfloat16 *x, *w, *y, *x2;
    CHECK(cudaMalloc(&x, m * k * 2));
    CHECK(cudaMalloc(&x2, m * k * 2));
    CHECK(cudaMalloc(&w, n * k * 2));
    CHECK(cudaMalloc(&y, m * n * 2));
    CHECK(cudaMemset(x, 0, m * k * 2));
    CHECK(cudaMemset(w, 0, n * k * 2));
    void *ws;
    const size_t ws_bytes = 32u << 20;
    CHECK(cudaMalloc(&ws, ws_bytes));

    cublasLtHandle_t lt;
    CHECK(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
    CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
    CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref;
    CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    if (!found) return 1;
    const float alpha = 1.0f, beta = 0.0f;
    auto matmul = [&] {
        CHECK(cublasLtMatmul(lt, desc, &alpha, w, la, x2, lb, &beta, y, lc, y, lc, &res.algo, ws, ws_bytes, s));
    };
    auto kernel = [&] { scale_kernel<<<(m * k + 255) / 256, 256, 0, s>>>(x, x2, m * k); };

    // The same work captured once: kernel + matmul, and the kernel alone.
    auto capture = [&](const std::function<void()> &fn) {
        cudaStream_t cs;
        CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        std::swap(s, cs);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        fn();
        cudaGraph_t g;
        CHECK(cudaStreamEndCapture(s, &g));
        std::swap(s, cs);
        CHECK(cudaStreamDestroy(cs));
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        CHECK(cudaGraphDestroy(g));
        return e;
    };
    cudaGraphExec_t g_kernel = capture(kernel);
    cudaGraphExec_t g_both = capture([&] { kernel(); matmul(); });
    const auto c0 = std::chrono::steady_clock::now();
    cudaGraphExec_t g_timed = capture([&] { kernel(); matmul(); });
    const double capture_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
    CHECK(cudaGraphUpload(g_both, s));

    int dev = 0;
    cudaStreamCaptureStatus cst;
    std::printf("{\n");
    for (int busy = 1; busy >= 0; --busy) {
        const char *tag = busy ? "busy" : "idle";
        std::printf("  \"empty_kernel_%s\": %.2f,\n", tag, host_us(s, [&] { empty_kernel<<<1, 32, 0, s>>>(); }, busy));
        std::printf("  \"elementwise_kernel_%s\": %.2f,\n", tag, host_us(s, kernel, busy));
        std::printf("  \"cublasLtMatmul_16x1024x1024_bf16_%s\": %.2f,\n", tag, host_us(s, matmul, busy));
        std::printf("  \"kernel_then_matmul_%s\": %.2f,\n", tag, host_us(s, [&] { kernel(); matmul(); }, busy));
        std::printf("  \"graph_launch_kernel_%s\": %.2f,\n", tag,
                    host_us(s, [&] { CHECK(cudaGraphLaunch(g_kernel, s)); }, busy));
        std::printf("  \"graph_launch_kernel_and_matmul_%s\": %.2f,\n", tag,
                    host_us(s, [&] { CHECK(cudaGraphLaunch(g_both, s)); }, busy));
    }
    std::printf("  \"cudaGetDevice\": %.3f,\n", host_us(s, [&] { CHECK(cudaGetDevice(&dev)); }, false, 10000));
    std::printf("  \"cudaStreamIsCapturing\": %.3f,\n",
                host_us(s, [&] { CHECK(cudaStreamIsCapturing(s, &cst)); }, false, 10000));
    std::printf("  \"capture_and_instantiate_kernel_and_matmul\": %.1f\n}\n", capture_us);
    CHECK(cudaGraphExecDestroy(g_timed));
    return 0;
}
