// The fused Adam/AdamW step on CUDA: one cooperative launch of a persistent grid (sized by occupancy)
// for every parameter of the optimizer, no allocation, no host synchronization (graph-capturable).
//
// Work is a list of units: state blocks (per-tensor mode: 128-element chunks) of all parameters,
// numbered globally; each warp takes one contiguous range of units, and each lane handles 4
// contiguous elements of a 128-element chunk, so a block's new amax is a warp reduction of values
// still in registers (block_size 128) or of a first pass over the block (larger blocks).
//   phase 1  every gradient: finiteness (NaN/inf codes, overflow of the unscaling, an inf amax in an
//            FP8 gradient's meta) and the sum of squares; one Partial per CTA.   -- grid sync --
//            every CTA reduces the partials in the same order: found_inf, norm, clip coefficient.
//            If found_inf, nobody writes anything (CTA 0 records found_inf, updates the scaler).
//   phase 1b per-tensor mode only: the new amax of every tensor's m, v, master. -- grid sync --
//   phase 2  the update: new values, block scales from their new amax, stores; scaled parameters
//            are written with their meta's scale and their amax recorded.
//   phase 3  (scaled parameters only)                                          -- grid sync --
//            each such meta: publish the scale_inv used, fold the history, next scale.
// The step count, the scaler's scale and the slots are read before the first sync and written only
// after it, so no CTA can see a half-updated value. The arithmetic is kernels/adam.hpp's, shared with
// kernels/cpu/adam.cpp: with clipping off the two backends agree bit for bit.
#include <cooperative_groups.h>

#include <cstdint>

#include "adam.hpp"
#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace adam;

// Tuning knob, overridable at build time so bench/ can compare in one device run: the least CTAs
// per SM the register allocation must allow (0: no bound; 4 forces 64 registers, with spills).
#ifndef FP8AMP_ADAM_MIN_BLOCKS
#define FP8AMP_ADAM_MIN_BLOCKS 0
#endif
constexpr int kMinBlocks = FP8AMP_ADAM_MIN_BLOCKS;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xFFFFFFFFu;

// Elements of a lane's 4 that exist when `left` elements remain from its first one.
__device__ __forceinline__ int lane_count(int64_t left) { return left <= 0 ? 0 : (left >= 4 ? 4 : int(left)); }

__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u; }

__device__ __forceinline__ float grad_factor(const StepConfig &c, const Param &p, float loss_scale_inv) {
    return fmul(fmul(c.grad_scale_inv, p.grad_scale_inv ? *p.grad_scale_inv : 1.0f), loss_scale_inv);
}

// Exact hardware decodes (every E4M3/E5M2/F16 value is a float32): the software codec's values for
// every non-NaN code, at a fraction of its instructions (the step is memory-bound only if decoding
// is cheap). NaN codes decode to some NaN, which is all the finiteness check needs.
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t pair, bool e4m3) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), e4m3 ? __NV_E4M3 : __NV_E5M2);
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}
__device__ __forceinline__ float f16_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Four contiguous elements starting at i (n of them valid) of a parameter or gradient, decoded.
__device__ __forceinline__ void load4(const void *base, int32_t dtype, int64_t i, int n, bool vec, float out[4]) {
    if (vec && n == 4) {
        switch (dtype) {
        case FP8AMP_DTYPE_F32: {
            const float4 q = *reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i);
            out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
            return;
        }
        case FP8AMP_DTYPE_F16:
        case FP8AMP_DTYPE_BF16: {
            const uint2 q = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + i);
            const uint16_t h[4] = {uint16_t(q.x), uint16_t(q.x >> 16), uint16_t(q.y), uint16_t(q.y >> 16)};
#pragma unroll
            for (int k = 0; k < 4; ++k)
                out[k] = dtype == FP8AMP_DTYPE_F16 ? f16_to_float(h[k]) : __uint_as_float(uint32_t(h[k]) << 16);
            return;
        }
        default: {
            const uint32_t q = *reinterpret_cast<const uint32_t *>(static_cast<const uint8_t *>(base) + i);
            const float2 lo = fp8x2_to_float2(q & 0xFFFFu, dtype == FP8AMP_DTYPE_E4M3);
            const float2 hi = fp8x2_to_float2(q >> 16, dtype == FP8AMP_DTYPE_E4M3);
            out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
            return;
        }
        }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = k < n ? load_value(base, dtype, i + k) : 0.0f;
}

// The per-lane view of one chunk: new values of 4 elements.
struct Lane {
    float w[4], m[4], v[4];
    int n;
};

struct BlockScales {
    float m_inv, v_inv, w_inv;  // scale_inv of the stored (old) state
};

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void compute_chunk(const StepConfig &c, const StepScalars &s, const Param &p, int64_t i,
                                              int n, float f, float coef, bool clip, const BlockScales &old,
                                              float param_inv, Lane &out) {
    out.n = n;
    float g[4], w[4], m[4], v[4];
    load4(p.grad, p.grad_dtype, i, n, p.vec_ok, g);
    const bool full = n == 4;
    if (MASTER) {
        if (full) {
            const uint2 q = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p.master) + i);
            const uint16_t h[4] = {uint16_t(q.x), uint16_t(q.x >> 16), uint16_t(q.y), uint16_t(q.y >> 16)};
#pragma unroll
            for (int k = 0; k < 4; ++k) w[k] = fmul(f16_to_float(h[k]), old.w_inv);
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                w[k] = k < n ? fmul(codec::decode<codec::F16>(static_cast<const uint16_t *>(p.master)[i + k]), old.w_inv) : 0.0f;
        }
    } else {
        load4(p.param, p.param_dtype, i, n, p.vec_ok, w);
        if (p.param_scale_inv) {
#pragma unroll
            for (int k = 0; k < 4; ++k) w[k] = fmul(w[k], param_inv);
        }
    }
    if (M8) {
        uint32_t q = 0;
        if (full) {
            q = *reinterpret_cast<const uint32_t *>(static_cast<const uint8_t *>(p.m) + i);
        } else {
            for (int k = 0; k < 4; ++k) if (k < n) q |= uint32_t(static_cast<const uint8_t *>(p.m)[i + k]) << (8 * k);
        }
        const float2 lo = fp8x2_to_float2(q & 0xFFFFu, true), hi = fp8x2_to_float2(q >> 16, true);
        m[0] = fmul(lo.x, old.m_inv), m[1] = fmul(lo.y, old.m_inv), m[2] = fmul(hi.x, old.m_inv), m[3] = fmul(hi.y, old.m_inv);
    } else if (full) {
        const float4 q = *reinterpret_cast<const float4 *>(static_cast<const float *>(p.m) + i);
        m[0] = q.x, m[1] = q.y, m[2] = q.z, m[3] = q.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) m[k] = k < n ? static_cast<const float *>(p.m)[i + k] : 0.0f;
    }
    if (V16) {
        uint16_t h[4] = {0, 0, 0, 0};
        if (full) {
            const uint2 q = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p.v) + i);
            h[0] = uint16_t(q.x), h[1] = uint16_t(q.x >> 16), h[2] = uint16_t(q.y), h[3] = uint16_t(q.y >> 16);
        } else {
            for (int k = 0; k < 4; ++k) if (k < n) h[k] = static_cast<const uint16_t *>(p.v)[i + k];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = fmul(f16_to_float(h[k]), old.v_inv);
    } else if (full) {
        const float4 q = *reinterpret_cast<const float4 *>(static_cast<const float *>(p.v) + i);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = k < n ? static_cast<const float *>(p.v)[i + k] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float gk = fmul(g[k], f);
        if (clip) gk = fmul(gk, coef);
        adam_element(c, s, gk, w[k], m[k], v[k]);
        // Invalid lanes hold zeros, which take no part in an amax.
        out.w[k] = k < n ? w[k] : 0.0f;
        out.m[k] = k < n ? m[k] : 0.0f;
        out.v[k] = k < n ? v[k] : 0.0f;
    }
}

struct Amax {
    uint32_t m = 0, v = 0, w = 0;
};

__device__ __forceinline__ void lane_amax(const Lane &l, Amax &a) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        a.m = max(a.m, amax_bits_of(l.m[k]));
        a.v = max(a.v, amax_bits_of(l.v[k]));
        a.w = max(a.w, amax_bits_of(l.w[k]));
    }
}

__device__ __forceinline__ Amax warp_amax(Amax a) {
    a.m = __reduce_max_sync(kFull, a.m);
    a.v = __reduce_max_sync(kFull, a.v);
    a.w = __reduce_max_sync(kFull, a.w);
    return a;
}

struct NewScales {
    float m, v, w;  // scales to encode with
};

__device__ __forceinline__ NewScales scales_of(const Amax &a) {
    return {pow2(pow2_exponent(__uint_as_float(a.m), kE4M3Max)), pow2(pow2_exponent(__uint_as_float(a.v), kF16Max)),
            pow2(pow2_exponent(__uint_as_float(a.w), kF16Max))};
}

__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void store_chunk(const Param &p, int64_t i, const Lane &l, const NewScales &ns,
                                            float param_scale) {
    const int n = l.n;
    const bool full = n == 4;
    if (M8) {
        uint32_t q = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) q |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(fmul(l.m[k], ns.m))) << (8 * k);
        if (full) {
            *reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(p.m) + i) = q;
        } else {
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<uint8_t *>(p.m)[i + k] = uint8_t(q >> (8 * k));
        }
    } else if (full) {
        *reinterpret_cast<float4 *>(static_cast<float *>(p.m) + i) = make_float4(l.m[0], l.m[1], l.m[2], l.m[3]);
    } else {
        for (int k = 0; k < 4; ++k) if (k < n) static_cast<float *>(p.m)[i + k] = l.m[k];
    }
    if (V16) {
        uint16_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = f16_bits(fmul(l.v[k], ns.v));
        if (full) {
            *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p.v) + i) =
                make_uint2(h[0] | uint32_t(h[1]) << 16, h[2] | uint32_t(h[3]) << 16);
        } else {
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<uint16_t *>(p.v)[i + k] = h[k];
        }
    } else if (full) {
        *reinterpret_cast<float4 *>(static_cast<float *>(p.v) + i) = make_float4(l.v[0], l.v[1], l.v[2], l.v[3]);
    } else {
        for (int k = 0; k < 4; ++k) if (k < n) static_cast<float *>(p.v)[i + k] = l.v[k];
    }
    if (MASTER) {
        uint16_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = f16_bits(fmul(l.w[k], ns.w));
        if (full) {
            *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p.master) + i) =
                make_uint2(h[0] | uint32_t(h[1]) << 16, h[2] | uint32_t(h[3]) << 16);
        } else {
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<uint16_t *>(p.master)[i + k] = h[k];
        }
    }
    // The parameter, in its own dtype (the CPU's codec rules: BF16/F16 overflow to inf, FP8 saturates).
    switch (p.param_dtype) {
    case FP8AMP_DTYPE_F32:
        if (full && p.vec_ok)
            *reinterpret_cast<float4 *>(static_cast<float *>(p.param) + i) = make_float4(l.w[0], l.w[1], l.w[2], l.w[3]);
        else
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<float *>(p.param)[i + k] = l.w[k];
        break;
    case FP8AMP_DTYPE_BF16:
    case FP8AMP_DTYPE_F16: {
        uint16_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            h[k] = p.param_dtype == FP8AMP_DTYPE_BF16 ? from_f32<FP8AMP_DTYPE_BF16>(l.w[k]) : from_f32<FP8AMP_DTYPE_F16>(l.w[k]);
        if (full && p.vec_ok)
            *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p.param) + i) =
                make_uint2(h[0] | uint32_t(h[1]) << 16, h[2] | uint32_t(h[3]) << 16);
        else
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<uint16_t *>(p.param)[i + k] = h[k];
        break;
    }
    default: {  // E4M3 bound to its meta
        uint32_t q = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) q |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(scaled(l.w[k], param_scale))) << (8 * k);
        if (full && p.vec_ok)
            *reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(p.param) + i) = q;
        else
            for (int k = 0; k < 4; ++k) if (k < n) static_cast<uint8_t *>(p.param)[i + k] = uint8_t(q >> (8 * k));
        break;
    }
    }
}

// The parameter owning unit u: the last k with params[k].unit_begin <= u.
__device__ __forceinline__ int find_param(const StepConfig &c, int64_t u) {
    int lo = 0, hi = c.nparams - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c.params[mid].unit_begin <= u) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Walks this warp's contiguous range of units: body(k, param, unit index within the param).
template <class Body>
__device__ __forceinline__ void for_my_units(const StepConfig &c, int64_t warp, int64_t warps, Body &&body) {
    const int64_t begin = c.total_units * warp / warps;
    const int64_t end = c.total_units * (warp + 1) / warps;
    if (begin >= end) return;
    int k = find_param(c, begin);
    for (int64_t u = begin; u < end; ++u) {
        while (k + 1 < c.nparams && c.params[k + 1].unit_begin <= u) ++k;
        body(k, c.params[k], u - c.params[k].unit_begin);
    }
}

template <bool M8, bool V16, bool MASTER>
__global__ void __launch_bounds__(kThreads, kMinBlocks) adam_kernel(const __grid_constant__ StepConfig c) {
    cg::grid_group grid = cg::this_grid();
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * kWarps;
    const bool per_tensor = c.block_size == 0;
    const int64_t unit_elems = per_tensor ? kChunk : c.block_size;

    // Read before the first grid sync; CTA 0 rewrites them after it.
    const int64_t step = c.status->step;
    const float loss_scale_inv = c.scaler ? fdiv(1.0f, c.scaler->scale) : 1.0f;

    // ---- phase 1 ----
    if (per_tensor)
        for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < 3 * int64_t(c.nparams);
             i += int64_t(gridDim.x) * kThreads)
            c.tensor_amax[i] = 0;
    double sumsq = 0.0;
    bool bad = false;
    for_my_units(c, warp, warps, [&](int k, const Param &p, int64_t lu) {
        const float f = grad_factor(c, p, loss_scale_inv);
        if (lu == 0 && p.grad_meta && p.grad_meta->amax_bits >= 0x7F800000u) bad = true;
        const int64_t begin = lu * unit_elems;
        const int64_t end = min(begin + unit_elems, p.numel);
        for (int64_t base = begin + lane * 4; base < end; base += 128) {
            float g[4];
            const int n = lane_count(end - base);
            load4(p.grad, p.grad_dtype, base, n, p.vec_ok, g);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float x = fmul(g[q], f);
                if (q < n) {
                    bad |= !finite(x);
                    sumsq += double(x) * double(x);
                }
            }
        }
    });
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

    // Every CTA reduces the partials in the same order, so all agree on found_inf and the norm.
    __shared__ double s_total;
    __shared__ int s_found;
    if (threadIdx.x < 32) {
        double t = 0.0;
        int b = 0;
        for (int i = lane; i < int(gridDim.x); i += 32) t += c.partials[i].sumsq, b |= c.partials[i].bad;
        for (int o = 16; o > 0; o /= 2) t += __shfl_down_sync(kFull, t, o);
        b = __any_sync(kFull, b);
        if (lane == 0) s_total = t, s_found = b;
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
    if (found) return;  // uniform across the grid: nothing is written

    const float lr = c.lr_device ? *c.lr_device : c.lr;
    const StepScalars s = step_scalars(c, lr, step + 1);
    const bool clip = c.max_grad_norm > 0.0f;
    float coef = 1.0f;
    if (clip) {
        coef = fdiv(c.max_grad_norm, fadd(norm, 1e-6f));
        if (coef > 1.0f) coef = 1.0f;
    }

    // ---- phase 1b: per-tensor amax of the new state ----
    if (per_tensor && (M8 || V16 || MASTER)) {
        int cur = -1;
        Amax acc;
        auto flush = [&]() {
            if (cur < 0) return;
            const Amax r = warp_amax(acc);
            if (lane == 0) {
                atomicMax(&c.tensor_amax[3 * cur + 0], r.m);
                atomicMax(&c.tensor_amax[3 * cur + 1], r.v);
                atomicMax(&c.tensor_amax[3 * cur + 2], r.w);
            }
            acc = Amax();
        };
        for_my_units(c, warp, warps, [&](int k, const Param &p, int64_t lu) {
            if (k != cur) flush(), cur = k;
            const BlockScales old{M8 ? p.m_scale_inv[p.scale_begin] : 1.0f, V16 ? p.v_scale_inv[p.scale_begin] : 1.0f,
                                  MASTER ? p.master_scale_inv[p.scale_begin] : 1.0f};
            const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
            const float f = grad_factor(c, p, loss_scale_inv);
            const int64_t base = lu * kChunk + lane * 4;
            Lane l;
            compute_chunk<M8, V16, MASTER>(c, s, p, base, lane_count(p.numel - base), f, coef,
                                           clip, old, param_inv, l);
            lane_amax(l, acc);
        });
        flush();
        grid.sync();
    }

    // ---- phase 2: the update ----
    int cur = -1;
    uint32_t param_amax = 0;
    auto flush_param = [&]() {
        if (cur < 0 || !c.params[cur].param_meta) return;
        const uint32_t r = __reduce_max_sync(kFull, param_amax);
        if (lane == 0) atomicMax(&c.params[cur].param_meta->amax_bits, r);
    };
    for_my_units(c, warp, warps, [&](int k, const Param &p, int64_t lu) {
        if (k != cur) flush_param(), cur = k, param_amax = 0;
        const int64_t si = p.scale_begin + (per_tensor ? 0 : lu);
        const BlockScales old{M8 ? p.m_scale_inv[si] : 1.0f, V16 ? p.v_scale_inv[si] : 1.0f,
                              MASTER ? p.master_scale_inv[si] : 1.0f};
        const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
        const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
        const float f = grad_factor(c, p, loss_scale_inv);
        const int64_t begin = lu * unit_elems;
        const int64_t end = min(begin + unit_elems, p.numel);
        auto count = [&](int64_t base) { return lane_count(end - base); };
        NewScales ns{1.0f, 1.0f, 1.0f};
        Lane l;
        bool have = false;
        if (per_tensor) {
            Amax a;
            a.m = c.tensor_amax[3 * k + 0], a.v = c.tensor_amax[3 * k + 1], a.w = c.tensor_amax[3 * k + 2];
            ns = scales_of(a);
        } else if (M8 || V16 || MASTER) {
            Amax a;
            if (end - begin <= kChunk) {
                compute_chunk<M8, V16, MASTER>(c, s, p, begin + lane * 4, count(begin + lane * 4), f, coef, clip, old,
                                               param_inv, l);
                have = true;
                lane_amax(l, a);
            } else {
                for (int64_t base = begin + lane * 4; base < end; base += kChunk) {
                    Lane t;
                    compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, t);
                    lane_amax(t, a);
                }
            }
            ns = scales_of(warp_amax(a));
        }
        // Block mode: the old scales were read above (by every lane) before lane 0 replaces them.
        // Per-tensor mode: other warps still read them; phase 3 writes them after a grid sync.
        __syncwarp();
        if (lane == 0 && !per_tensor) {
            if (M8) p.m_scale_inv[si] = fdiv(1.0f, ns.m);
            if (V16) p.v_scale_inv[si] = fdiv(1.0f, ns.v);
            if (MASTER) p.master_scale_inv[si] = fdiv(1.0f, ns.w);
        }
        for (int64_t base = begin + lane * 4; base < end; base += kChunk) {
            if (!have) compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, l);
            have = false;
#pragma unroll
            for (int q = 0; q < 4; ++q) param_amax = max(param_amax, amax_bits_of(l.w[q]));
            if (l.n > 0) store_chunk<M8, V16, MASTER>(p, base, l, ns, param_scale);
        }
    });
    flush_param();

    // ---- phase 3: the metas of scaled parameters; per-tensor state scales ----
    if (!c.has_param_metas && !(per_tensor && (M8 || V16 || MASTER))) return;
    grid.sync();
    for (int64_t k = warp; k < c.nparams; k += warps) {
        const Param &p = c.params[k];
        if (per_tensor && lane == 0) {
            Amax a;
            a.m = c.tensor_amax[3 * k + 0], a.v = c.tensor_amax[3 * k + 1], a.w = c.tensor_amax[3 * k + 2];
            const NewScales ns = scales_of(a);
            if (M8) p.m_scale_inv[p.scale_begin] = fdiv(1.0f, ns.m);
            if (V16) p.v_scale_inv[p.scale_begin] = fdiv(1.0f, ns.v);
            if (MASTER) p.master_scale_inv[p.scale_begin] = fdiv(1.0f, ns.w);
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

__global__ void scaler_update_kernel(ScalerState *scaler, ScalerConfig config, const Status *status) {
    adam::scaler_update(*scaler, config, status->found_inf != 0);
}

template <bool M8, bool V16, bool MASTER>
void launch(int device, cudaStream_t stream, const StepConfig &config, int max_partials) {
    auto kernel = adam_kernel<M8, V16, MASTER>;
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0), "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    int grid = per_sm * multiprocessor_count(device);
    if (grid > max_partials) grid = max_partials;
    if (grid < 1) fail(FP8AMP_ERROR_CUDA, "adam_kernel: no block fits on a multiprocessor");
    StepConfig c = config;
    void *args[] = {&c};
    check(cudaLaunchCooperativeKernel(reinterpret_cast<const void *>(kernel), dim3(grid), dim3(kThreads), args, 0, stream),
          "cudaLaunchCooperativeKernel (adam_kernel)");
}

}  // namespace

void memset(int device, void *stream, void *dst, int value, size_t nbytes) {
    DeviceGuard guard(device);
    check(cudaMemsetAsync(dst, value, nbytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

int adam_grid_size(int device) {
    DeviceGuard guard(device);
    return multiprocessor_count(device) * (2048 / kThreads);
}

void adam_step(int device, void *stream_raw, const StepConfig &config, int max_partials) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const int key = (config.m_fp8 ? 4 : 0) | (config.v_f16 ? 2 : 0) | (config.has_master ? 1 : 0);
    switch (key) {
    case 0: launch<false, false, false>(device, stream, config, max_partials); break;
    case 1: launch<false, false, true>(device, stream, config, max_partials); break;
    case 2: launch<false, true, false>(device, stream, config, max_partials); break;
    case 3: launch<false, true, true>(device, stream, config, max_partials); break;
    case 4: launch<true, false, false>(device, stream, config, max_partials); break;
    case 5: launch<true, false, true>(device, stream, config, max_partials); break;
    case 6: launch<true, true, false>(device, stream, config, max_partials); break;
    default: launch<true, true, true>(device, stream, config, max_partials); break;
    }
}

void scaler_update(int device, void *stream, ScalerState *scaler, const ScalerConfig &config, const Status *status) {
    DeviceGuard guard(device);
    scaler_update_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scaler, config, status);
    check_launch("scaler_update_kernel");
}

}  // namespace fp8amp::kernels::cuda
