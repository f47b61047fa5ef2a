// Fused activations on CUDA (kernels/activation.hpp): GELU (tanh), SiLU, SwiGLU forward into a wide
// or FP8 y, backward into a wide or FP8 dx, the quantize's amax, statistics and scale_inv fused (the
// per-block epilogue of casting_common.cuh), the transpose by the byte transpose of linear_aux.cu.
// Bit-identical to kernels/cpu/activation.cpp: each output element is the same inline arithmetic of
// the inputs (act::forward_value / backward_value, exp from __f*_rn multiplies and adds), and the
// amax and counters are order-independent integer reductions. Current scaling runs the kernel twice:
// an amax-only pass, then the writing pass.
#include <cstdint>
#include <type_traits>

#include "activation.hpp"
#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda {
namespace {

using namespace casting;

__device__ __forceinline__ float load_any(const void *p, fp8amp_dtype dt, int64_t i) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: return to_f32<FP8AMP_DTYPE_F32>(static_cast<const float *>(p)[i]);
    case FP8AMP_DTYPE_F16: return to_f32<FP8AMP_DTYPE_F16>(static_cast<const uint16_t *>(p)[i]);
    default: return to_f32<FP8AMP_DTYPE_BF16>(static_cast<const uint16_t *>(p)[i]);
    }
}

__device__ __forceinline__ void store_any(void *p, fp8amp_dtype dt, int64_t i, float v) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(p)[i] = from_f32<FP8AMP_DTYPE_F32>(v); return;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_F16>(v); return;
    default: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_BF16>(v); return;
    }
}

// D: E4M3/E5M2, or F32 standing for a wide out (a.out_dtype at run time). kWrite false: amax only.
template <fp8amp_dtype D, bool kWrite, bool kBackward>
__global__ void __launch_bounds__(kThreads) activation_kernel(const ActivationArgs a) {
    constexpr bool kFp8 = D == FP8AMP_DTYPE_E4M3 || D == FP8AMP_DTYPE_E5M2;
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    const int64_t out_cols = kBackward ? in_cols : a.cols;
    const int64_t n = a.rows * out_cols;
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    bool stats = false;
    if constexpr (kFp8) {
        scale = kWrite ? quantize_scale(*meta) : 1.0f;
        fp8_max = meta->fp8_max;
        stats = kWrite && meta->stats_enabled;
    }
    const bool narrow = n < (int64_t(1) << 32);  // 32-bit index arithmetic (the usual case) is cheaper
    Tally t;
    for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < n; e += int64_t(gridDim.x) * kThreads) {
        int64_t r, j;
        if (narrow) {
            r = uint32_t(e) / uint32_t(out_cols);
            j = uint32_t(e) - uint32_t(r) * uint32_t(out_cols);
        } else {
            r = e / out_cols;
            j = e - r * out_cols;
        }
        float y;
        if constexpr (!kBackward) {
            const float x = load_any(a.x, a.x_dtype, r * in_cols + j);
            const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + j) : 0.0f;
            y = act::forward_value(a.kind, x, b);
        } else {
            const bool second = glu && j >= a.cols;
            const int64_t c = second ? j - a.cols : j;
            const float dy = load_any(a.dy, a.dy_dtype, r * a.cols + c);
            const float x = load_any(a.x, a.x_dtype, r * in_cols + c);
            const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
            y = act::backward_value(a.kind, dy, x, b, second);
        }
        if constexpr (kFp8) {
            t.amax = max(t.amax, amax_bits_of(y));
            if constexpr (kWrite) {
                const float s = scaled(y, scale);
                const uint8_t q = from_f32<D>(s);
                static_cast<uint8_t *>(a.out)[e] = q;
                if (stats) {
                    t.saturated += (fabsf(s) > fp8_max) ? 1u : 0u;  // false for NaN
                    t.underflowed += (y != 0.0f && y == y && (q & 0x7Fu) == 0) ? 1u : 0u;
                }
            }
        } else {
            store_any(a.out, a.out_dtype, e, y);
        }
    }
    if constexpr (kFp8) {
        if constexpr (!kWrite) {
            const uint32_t amax = block_reduce(t.amax, MaxOp());
            if (threadIdx.x == 0) atomicMax(&meta->amax_bits, amax);
        } else if (stats) {
            finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(n));
        } else {
            finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(n));
        }
    }
}

template <bool kBackward>
void run(int device, void *stream_raw, const ActivationArgs &a) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const int64_t in_cols = a.kind == kSwiglu ? 2 * a.cols : a.cols;
    const int64_t out_cols = kBackward ? in_cols : a.cols;
    const size_t n = static_cast<size_t>(a.rows * out_cols);
    auto launch = [&](auto kernel) {
        kernel<<<persistent_grid(device, kernel, n), kThreads, 0, stream>>>(a);
        check_launch("activation_kernel");
    };
    const bool fp8 = a.out_dtype == FP8AMP_DTYPE_E4M3 || a.out_dtype == FP8AMP_DTYPE_E5M2;
    if (!fp8) {
        launch(activation_kernel<FP8AMP_DTYPE_F32, true, kBackward>);
        return;
    }
    auto run_fp8 = [&](auto dd) {
        constexpr fp8amp_dtype D = decltype(dd)::value;
        if (a.target.current) {
            check(cudaMemsetAsync(&a.target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
            launch(activation_kernel<D, false, kBackward>);
        }
        launch(activation_kernel<D, true, kBackward>);
    };
    if (a.out_dtype == FP8AMP_DTYPE_E4M3) run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
    else run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
    if (a.out_t) transpose_bytes(device, stream_raw, a.out, a.out_t, static_cast<size_t>(a.rows), static_cast<size_t>(out_cols));
}

}  // namespace

void activation_forward(int device, void *stream, const ActivationArgs &a) { run<false>(device, stream, a); }
void activation_backward(int device, void *stream, const ActivationArgs &a) { run<true>(device, stream, a); }

}  // namespace fp8amp::kernels::cuda
