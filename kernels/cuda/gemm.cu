// GEMMs on cuBLASLt, for the Linear layer. One engine per context holds the cuBLASLt handle and a
// cache of plans: for each (shape, dtypes, layouts, epilogue, accumulation mode, pointer alignment)
// the matmul descriptor, the four matrix layouts and the algorithm the heuristic chose. A warm call
// only sets the per-call pointers (scales, bias) on the cached descriptor and launches: no heuristic
// query, no allocation.
//
// Row-major D[m, n] = A[m, k] B[n, k]^T is column-major D^T[n, m] = B A^T, so cuBLASLt's "A" is our
// B and its "B" is our A. A K-contiguous operand is a transposed column-major matrix, which is the
// "TN" layout Hopper's FP8 kernels require.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <tuple>

#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda {

namespace {

[[noreturn]] void throw_cublas(cublasStatus_t st, const char *what) {
    const fp8amp_status status = st == CUBLAS_STATUS_ALLOC_FAILED ? FP8AMP_ERROR_OUT_OF_MEMORY
                                 : st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH
                                     ? FP8AMP_ERROR_NOT_SUPPORTED
                                     : FP8AMP_ERROR_CUBLAS;
    fail(status, std::string(what) + ": " + cublasLtGetStatusName(st) + " (" + cublasLtGetStatusString(st) + ")");
}

void check_cublas(cublasStatus_t st, const char *what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw_cublas(st, what);
}

cudaDataType_t cuda_type(fp8amp_dtype d) {
    switch (d) {
    case FP8AMP_DTYPE_F32: return CUDA_R_32F;
    case FP8AMP_DTYPE_F16: return CUDA_R_16F;
    case FP8AMP_DTYPE_BF16: return CUDA_R_16BF;
    case FP8AMP_DTYPE_E4M3: return CUDA_R_8F_E4M3;
    case FP8AMP_DTYPE_E5M2: return CUDA_R_8F_E5M2;
    }
    fail(FP8AMP_ERROR_INTERNAL, "gemm: unknown dtype");
}

bool is_fp8(fp8amp_dtype d) { return d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2; }

// The largest power of two (up to 256) that divides the address: cuBLASLt picks kernels by it.
uint32_t alignment_of(const void *p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align) align /= 2;
    return align;
}

using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, bool, bool, bool, bool, int, uint32_t>;

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

}  // namespace

struct GemmEngine {
    int device = 0;
    cublasLtHandle_t handle = nullptr;
    std::map<PlanKey, std::unique_ptr<Plan>> plans;
    ~GemmEngine() {
        plans.clear();
        if (handle) cublasLtDestroy(handle);
    }
};

std::shared_ptr<GemmEngine> gemm_engine_create(int device) {
    DeviceGuard guard(device);
    auto engine = std::make_shared<GemmEngine>();
    engine->device = device;
    check_cublas(cublasLtCreate(&engine->handle), "cublasLtCreate");
    return engine;
}

std::string fp8_gemm_unsupported_reason(int device) {
    int major = 0, minor = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    if (major * 10 + minor >= 89) return {};
    return "FP8 GEMMs need compute capability 8.9 or newer; cuda:" + std::to_string(device) + " has " +
           std::to_string(major) + "." + std::to_string(minor);
}

namespace {

std::unique_ptr<Plan> make_plan(GemmEngine &engine, const GemmArgs &g, uint32_t align, size_t workspace_bytes) {
    auto plan = std::make_unique<Plan>();
    const bool fp8 = is_fp8(g.a.dtype);
    check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // cuBLASLt's A is our B (n x k), its B is our A (k x m): see the top of the file.
    const cublasOperation_t op_a = g.b.k_contiguous ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = g.a.k_contiguous ? CUBLAS_OP_N : CUBLAS_OP_T;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA");
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB");
    if (fp8) {
        const int8_t fast = g.fast_accum ? 1 : 0;
        check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                     "FAST_ACCUM");
    }
    if (g.bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                     "EPILOGUE");
        const int32_t bias_type = cuda_type(g.bias_dtype);
        check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type),
                     "BIAS_DATA_TYPE");
    }
    const auto m = static_cast<uint64_t>(g.m), n = static_cast<uint64_t>(g.n), k = static_cast<uint64_t>(g.k);
    // Column-major shapes (rows, cols, ld) of the stored matrices.
    if (g.b.k_contiguous)
        check_cublas(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(g.b.dtype), k, n, k), "layout A");
    else
        check_cublas(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(g.b.dtype), n, k, n), "layout A");
    if (g.a.k_contiguous)
        check_cublas(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(g.a.dtype), k, m, k), "layout B");
    else
        check_cublas(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(g.a.dtype), m, k, m), "layout B");
    check_cublas(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(g.d_dtype), n, m, n), "layout C");
    check_cublas(cublasLtMatrixLayoutCreate(&plan->d, cuda_type(g.d_dtype), n, m, n), "layout D");

    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    struct PrefGuard {
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
    } pref_guard{pref};
    const uint64_t ws = workspace_bytes;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                 "MAX_WORKSPACE_BYTES");
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align), "MIN_ALIGNMENT");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_cublas(cublasLtMatmulAlgoGetHeuristic(engine.handle, plan->desc, plan->a, plan->b, plan->c, plan->d, pref, 1,
                                                &result, &found),
                 "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "cuBLASLt has no algorithm for this GEMM (m " + std::to_string(g.m) + ", n " +
                                             std::to_string(g.n) + ", k " + std::to_string(g.k) + ")");
    plan->algo = result.algo;
    return plan;
}

// The cached plan of this GEMM, made (host allocations, a heuristic query) if it is new.
Plan &plan_for(GemmEngine &engine, const GemmArgs &g, size_t workspace_bytes) {
    const uint32_t align = std::min(std::min(alignment_of(g.a.data), alignment_of(g.b.data)), alignment_of(g.d));
    const PlanKey key{g.m,           g.n,           g.k,          static_cast<int>(g.a.dtype), static_cast<int>(g.b.dtype),
                      static_cast<int>(g.d_dtype), g.bias ? static_cast<int>(g.bias_dtype) : -1, g.a.k_contiguous,
                      g.b.k_contiguous, g.fast_accum, g.accumulate, 0, align};
    auto it = engine.plans.find(key);
    if (it == engine.plans.end()) it = engine.plans.emplace(key, make_plan(engine, g, align, workspace_bytes)).first;
    return *it->second;
}

}  // namespace

void gemm_prepare(GemmEngine &engine, int device, const GemmArgs &g, size_t workspace_bytes) {
    DeviceGuard guard(device);
    (void)plan_for(engine, g, workspace_bytes);
}

void gemm(GemmEngine &engine, int device, void *stream, const GemmArgs &g, void *workspace, size_t workspace_bytes) {
    DeviceGuard guard(device);
    Plan &plan = plan_for(engine, g, workspace_bytes);
    // Per-call pointers on the cached descriptor: the operands' scale_inv (the dequantizing factors)
    // and the bias. cuBLASLt's A is our B.
    if (is_fp8(g.a.dtype)) {
        check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b.scale_inv,
                                                    sizeof g.b.scale_inv),
                     "A_SCALE_POINTER");
        check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a.scale_inv,
                                                    sizeof g.a.scale_inv),
                     "B_SCALE_POINTER");
    }
    if (g.bias)
        check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias),
                     "BIAS_POINTER");
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    // cuBLASLt allocates host memory inside cublasLtMatmul, and a refused allocation there leaves it as
    // std::bad_alloc rather than CUBLAS_STATUS_ALLOC_FAILED (seen with CUDA 13.0's cuBLASLt under
    // tests/capi/test_fault_injection_host.c). Say where it happened: it comes after this call's
    // earlier kernels were queued, the one case where a failed call may have changed state
    // (docs/api.md 1.1), unlike fp8amp's own allocations, which all come before its first launch.
    cublasStatus_t st;
    try {
        st = cublasLtMatmul(engine.handle, plan.desc, &alpha, g.b.data, plan.a, g.a.data, plan.b, &beta, g.d, plan.c, g.d,
                            plan.d, &plan.algo, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    } catch (const std::bad_alloc &) {
        fail(FP8AMP_ERROR_OUT_OF_MEMORY,
             "cublasLtMatmul: a host allocation inside cuBLASLt failed (std::bad_alloc), after this call's earlier "
             "kernels were queued");
    }
    check_cublas(st, "cublasLtMatmul");
}

}  // namespace fp8amp::kernels::cuda
