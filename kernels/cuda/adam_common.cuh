// What the two Adam kernels share (adam_generic.cu's and adam_fast.cu's): the warp constants, the
// gradient's unscale factor, bytes per dtype, the pair encoders, the element-by-element loads and
// stores of the edges, the search from a unit to its parameter, the end of phase 1 (the grid-wide
// reduction of the sums of squares and bad flags, the step's status, the scaler's update) and phase 3
// (the scaled parameters' metas). The arithmetic of a step is kernels/adam.hpp's, which the CPU
// backend shares too.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "adam.hpp"
#include "adam_launch.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda::adam_common {

namespace cg = cooperative_groups;
using namespace adam;
using adam_launch::kThreads;

constexpr int kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xFFFFFFFFu;

__device__ __forceinline__ float grad_factor(const StepConfig &c, const Param &p, float loss_scale_inv) {
    return fmul(fmul(c.grad_scale_inv, p.grad_scale_inv ? *p.grad_scale_inv : 1.0f), loss_scale_inv);
}

// Bytes per element of a dtype: the generic kernel's at run time, the fast kernel's in its types.
constexpr int dtype_size(int32_t dtype) {
    return dtype == FP8AMP_DTYPE_F32 ? 4 : (dtype == FP8AMP_DTYPE_F16 || dtype == FP8AMP_DTYPE_BF16) ? 2 : 1;
}

struct Amax {
    uint32_t m = 0, v = 0, w = 0;
};

struct NewScales {
    float m, v, w;  // scales to encode with
};

__device__ __forceinline__ NewScales scales_of(const Amax &a) {
    return {pow2(pow2_exponent(__uint_as_float(a.m), kE4M3Max)), pow2(pow2_exponent(__uint_as_float(a.v), kF16Max)),
            pow2(pow2_exponent(__uint_as_float(a.w), kF16Max))};
}

// Per-tensor mode: parameter k's state scales, from phase 1b's amaxes of its new m, v and master.
__device__ __forceinline__ NewScales tensor_scales_of(const StepConfig &c, int64_t k) {
    Amax a;
    a.m = c.tensor_amax[3 * k + 0], a.v = c.tensor_amax[3 * k + 1], a.w = c.tensor_amax[3 * k + 2];
    return scales_of(a);
}

// Encodes of two values in one hardware instruction (cvt.rn.satfinite.e4m3x2.f32, cvt.rn.f16x2.f32,
// cvt.rn.bf16x2.f32): round to nearest even, as the CPU codec, for values that are not NaN (the
// hardware's NaN is not the CPU codec's; the callers take from_f32 for those).
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return (lo & 0xFFFFu) | (hi << 16);
}
__device__ __forceinline__ uint32_t f16x2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t bf16x2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// The first n of N contiguous elements of ESIZE bytes each, element by element, packed little-endian
// into the words w (their other bits zero), and the store of the first n of them back: where a vector
// access cannot serve (a parameter's partial last chunk, an array not aligned for it). The generic
// kernel stores its 1- and 2-byte codes through store_elements; its loads and its float stores keep
// loops of their own (load_bits and store_floats say why).
template <int N, int ESIZE, int WORDS>
__device__ __forceinline__ void load_elements(const uint8_t *ptr, int n, uint32_t (&w)[WORDS]) {
    static_assert(N * ESIZE <= 4 * WORDS, "the words hold the N elements");
#pragma unroll
    for (int k = 0; k < WORDS; ++k) w[k] = 0u;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        if (j < n) {
            if constexpr (ESIZE == 4) w[j] = reinterpret_cast<const uint32_t *>(ptr)[j];
            else if constexpr (ESIZE == 2) w[j / 2] |= uint32_t(reinterpret_cast<const uint16_t *>(ptr)[j]) << (16 * (j % 2));
            else w[j / 4] |= uint32_t(ptr[j]) << (8 * (j % 4));
        }
    }
}

template <int N, int ESIZE, int WORDS>
__device__ __forceinline__ void store_elements(uint8_t *ptr, int n, const uint32_t (&w)[WORDS]) {
    static_assert(N * ESIZE <= 4 * WORDS, "the words hold the N elements");
#pragma unroll
    for (int j = 0; j < N; ++j) {
        if (j < n) {
            if constexpr (ESIZE == 4) reinterpret_cast<uint32_t *>(ptr)[j] = w[j];
            else if constexpr (ESIZE == 2) reinterpret_cast<uint16_t *>(ptr)[j] = uint16_t(w[j / 2] >> (16 * (j % 2)));
            else ptr[j] = uint8_t(w[j / 4] >> (8 * (j % 4)));
        }
    }
}

// The parameter owning unit u: the last k with params[k].unit_begin <= u. Each kernel's phase 1
// walks its units parameter by parameter in a loop of its own (the same few lines): through one
// shared walk taking the loop's body, the generic kernel's phase-1 prologue compiled differently.
__device__ __forceinline__ int find_param(const StepConfig &c, int64_t u) {
    int lo = 0, hi = c.nparams - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c.params[mid].unit_begin <= u) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Phase 3 (after a grid sync): per-tensor mode's state scales from the tensors' new amax, and each
// scaled parameter's meta: publish the scale_inv used, fold the history, next scale.
template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void fold_param_metas(const StepConfig &c, int64_t warp, int64_t warps, int lane) {
    const bool per_tensor = c.block_size == 0;
    for (int64_t k = warp; k < c.nparams; k += warps) {
        const Param &p = c.params[k];
        if (per_tensor && lane == 0) {
            const NewScales ns = tensor_scales_of(c, k);
            if (M8) p.m_scale_inv[p.scale_begin] = fdiv(1.0f, ns.m);
            if (V16) p.v_scale_inv[p.scale_begin] = fdiv(1.0f, ns.v);
            if (MASTER && p.master) p.master_scale_inv[p.scale_begin] = fdiv(1.0f, ns.w);
        }
        if (!p.param_meta) continue;
        ScalingState &m = *p.param_meta;
        if (lane == 0) {
            if (p.param_scale_inv) *p.param_scale_inv = m.scale_inv;
            fold_history(m);
        }
        __syncwarp();
        if (scale_due(m)) {
            uint32_t h = 0;
            if (m.most_recent) {
                h = __float_as_uint(m.history()[m.head]);
            } else {
                for (uint32_t j = lane; j < m.history_len; j += 32) h = max(h, __float_as_uint(m.history()[j]));
                h = __reduce_max_sync(kFull, h);
            }
            __syncwarp();
            if (lane == 0) apply_scale(m, __uint_as_float(h));
        }
        __syncwarp();
    }
}

// The end of phase 1, for both kernels: each thread's sum of squares and bad flag reduced over its
// CTA into c.partials, a grid sync, then every CTA reduces the partials in the same order, so all
// agree on found_inf and the norm. kSumDecides (the fast kernel, which tests no element): a sum that
// is not finite counts as found; the generic kernel's bad flag already covers every element. CTA 0
// publishes the status and updates the scaler. Returns whether the step skips, and the global norm.
struct CheckResult {
    bool found;
    float norm;
};
template <bool kSumDecides>
__device__ __forceinline__ CheckResult end_check(const StepConfig &c, cg::grid_group &grid, double sumsq, bool bad,
                                                 int lane, int64_t step) {
    __shared__ double s_sum[kWarps];
    __shared__ int s_bad[kWarps];
    for (int o = 16; o > 0; o /= 2) sumsq += __shfl_down_sync(kFull, sumsq, o);
    const int any_bad = __any_sync(kFull, bad);
    if (lane == 0) {
        s_sum[threadIdx.x / 32] = sumsq;
        s_bad[threadIdx.x / 32] = any_bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        int b = 0;
        for (int w = 0; w < kWarps; ++w) t += s_sum[w], b |= s_bad[w];
        c.partials[blockIdx.x].sumsq = t;
        c.partials[blockIdx.x].bad = b;
    }
    grid.sync();
    __shared__ double s_total;
    __shared__ int s_found;
    if (threadIdx.x < 32) {
        double t = 0.0;
        int b = 0;
        for (int i = lane; i < int(gridDim.x); i += 32) t += c.partials[i].sumsq, b |= c.partials[i].bad;
        for (int o = 16; o > 0; o /= 2) t += __shfl_down_sync(kFull, t, o);
        b = __any_sync(kFull, b);
        if (lane == 0) s_total = t, s_found = kSumDecides ? b || !(t <= 1.7976931348623157e308) : b;  // inf/NaN
    }
    __syncthreads();
    const bool found = s_found != 0;
    const float norm = float(sqrt(s_total));
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        c.status->found_inf = found ? 1 : 0;
        c.status->grad_norm = found ? __uint_as_float(codec::kF32QuietNaN) : norm;
        if (!found) c.status->step = step + 1;
        if (c.scaler) adam::scaler_update(*c.scaler, c.scaler_config, found);
    }
    return {found, norm};
}

}  // namespace fp8amp::kernels::cuda::adam_common
