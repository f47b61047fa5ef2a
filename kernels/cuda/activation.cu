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

// 4 consecutive elements from p + i (aligned to 4 elements: the caller checked), of a run-time dtype.
__device__ __forceinline__ void load4_any(const void *p, fp8amp_dtype dt, int64_t i, float f[4]) {
    if (dt == FP8AMP_DTYPE_F32) {
        const float4 v = *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
        f[0] = to_f32<FP8AMP_DTYPE_F32>(v.x), f[1] = to_f32<FP8AMP_DTYPE_F32>(v.y);
        f[2] = to_f32<FP8AMP_DTYPE_F32>(v.z), f[3] = to_f32<FP8AMP_DTYPE_F32>(v.w);
        return;
    }
    const uint2 v = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p) + i);
    const uint16_t h[4] = {uint16_t(v.x & 0xFFFFu), uint16_t(v.x >> 16), uint16_t(v.y & 0xFFFFu), uint16_t(v.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; ++e)
        f[e] = dt == FP8AMP_DTYPE_F16 ? to_f32<FP8AMP_DTYPE_F16>(h[e]) : to_f32<FP8AMP_DTYPE_BF16>(h[e]);
}

__device__ __forceinline__ void store4_any(void *p, fp8amp_dtype dt, int64_t i, const float f[4]) {
    if (dt == FP8AMP_DTYPE_F32) {
        *reinterpret_cast<float4 *>(static_cast<float *>(p) + i) = make_float4(f[0], f[1], f[2], f[3]);
        return;
    }
    uint16_t h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        h[e] = dt == FP8AMP_DTYPE_F16 ? from_f32<FP8AMP_DTYPE_F16>(f[e]) : from_f32<FP8AMP_DTYPE_BF16>(f[e]);
    *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p) + i) =
        make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
}

__device__ __forceinline__ bool aligned4(const void *p, fp8amp_dtype dt) {
    const size_t size = dt == FP8AMP_DTYPE_F32 ? 4 : dt == FP8AMP_DTYPE_E4M3 || dt == FP8AMP_DTYPE_E5M2 ? 1 : 2;
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % (4 * size) == 0;
}

// D: E4M3/E5M2, or F32 standing for a wide out (a.out_dtype at run time). kWrite false: amax only.
// A thread takes 4 consecutive output elements at a time. When the rows (and SwiGLU's halves) are
// multiples of 4 elements and the buffers aligned, the 4 share a row, so the row/column is computed
// once for them and every input is read, and the output written, as one vector; otherwise each
// element finds its own row and column.
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
    const bool vec = a.cols % 4 == 0 && aligned4(a.x, a.x_dtype) && (!kBackward || aligned4(a.dy, a.dy_dtype)) &&
                     aligned4(a.out, kFp8 ? D : a.out_dtype);
    const bool narrow = n < (int64_t(1) << 32);  // 32-bit index arithmetic (the usual case) is cheaper
    auto row_col = [&](int64_t e, int64_t &r, int64_t &j) {
        if (narrow) {
            r = uint32_t(e) / uint32_t(out_cols);
            j = uint32_t(e) - uint32_t(r) * uint32_t(out_cols);
        } else {
            r = e / out_cols;
            j = e - r * out_cols;
        }
    };
    Tally t;
    const int64_t groups = (n + 3) / 4;
    for (int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * kThreads) {
        const int64_t e0 = 4 * g;
        const int left = n - e0 < 4 ? int(n - e0) : 4;
        float y[4];
        if (vec) {  // left == 4: n is a multiple of 4
            int64_t r, j;
            row_col(e0, r, j);
            if constexpr (!kBackward) {
                float x[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                load4_any(a.x, a.x_dtype, r * in_cols + j, x);
                if (glu) load4_any(a.x, a.x_dtype, r * in_cols + a.cols + j, b);
#pragma unroll
                for (int e = 0; e < 4; ++e) y[e] = act::forward_value(a.kind, x[e], b[e]);
            } else {
                const bool second = glu && j >= a.cols;
                const int64_t c = second ? j - a.cols : j;
                float dy[4], x[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                load4_any(a.dy, a.dy_dtype, r * a.cols + c, dy);
                load4_any(a.x, a.x_dtype, r * in_cols + c, x);
                if (glu) load4_any(a.x, a.x_dtype, r * in_cols + a.cols + c, b);
#pragma unroll
                for (int e = 0; e < 4; ++e) y[e] = act::backward_value(a.kind, dy[e], x[e], b[e], second);
            }
        } else {
#pragma unroll  // constant indices keep y[] in registers
            for (int e = 0; e < 4; ++e) {
                if (e >= left) break;
                int64_t r, j;
                row_col(e0 + e, r, j);
                if constexpr (!kBackward) {
                    const float x = load_any(a.x, a.x_dtype, r * in_cols + j);
                    const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + j) : 0.0f;
                    y[e] = act::forward_value(a.kind, x, b);
                } else {
                    const bool second = glu && j >= a.cols;
                    const int64_t c = second ? j - a.cols : j;
                    const float dy = load_any(a.dy, a.dy_dtype, r * a.cols + c);
                    const float x = load_any(a.x, a.x_dtype, r * in_cols + c);
                    const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
                    y[e] = act::backward_value(a.kind, dy, x, b, second);
                }
            }
        }
        if constexpr (kFp8) {
            uint32_t packed = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (e >= left) break;
                t.amax = max(t.amax, amax_bits_of(y[e]));
                if constexpr (kWrite) {
                    const float s = scaled(y[e], scale);
                    const uint8_t q = from_f32<D>(s);
                    packed |= uint32_t(q) << (8 * e);
                    if (stats) {
                        t.saturated += (fabsf(s) > fp8_max) ? 1u : 0u;  // false for NaN
                        t.underflowed += (y[e] != 0.0f && y[e] == y[e] && (q & 0x7Fu) == 0) ? 1u : 0u;
                    }
                }
            }
            if constexpr (kWrite) {
                auto *out = static_cast<uint8_t *>(a.out) + e0;
                if (vec) {
                    *reinterpret_cast<uint32_t *>(out) = packed;
                } else {
                    for (int e = 0; e < 4; ++e)
                        if (e < left) out[e] = uint8_t(packed >> (8 * e));
                }
            }
        } else if (vec) {
            store4_any(a.out, a.out_dtype, e0, y);
        } else {
            #pragma unroll
            for (int e = 0; e < 4; ++e)
                if (e < left) store_any(a.out, a.out_dtype, e0 + e, y[e]);
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
        kernel<<<persistent_grid(device, kernel, (n + 3) / 4), kThreads, 0, stream>>>(a);
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
