// The fused Adam/AdamW step on CUDA: one cooperative launch of a persistent grid (sized by occupancy)
// for every parameter of the optimizer, no allocation, no host synchronization (graph-capturable).
//
// Work is a list of units: state blocks (per-tensor mode: 128-element chunks) of all parameters,
// numbered globally; each warp takes one contiguous range of units (the fast kernel's update: most
// of them, the rest in runs from a counter, see run_pairs), and each lane handles 4
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

#include <cfloat>
#include <cstdint>
#include <utility>

#include "adam.hpp"
#include "cuda_common.cuh"
#include "adam_div.cuh"
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
// The fast kernel's register bound: CTAs of 256 threads per SM it must allow.
#ifndef FP8AMP_ADAM_FAST_MIN_BLOCKS
#define FP8AMP_ADAM_FAST_MIN_BLOCKS 3
#endif
constexpr int kFastMinBlocks = FP8AMP_ADAM_FAST_MIN_BLOCKS;


// Measurement only: 1 skips the fast kernel's gradient check (the update then runs as if every
// gradient were finite), so the update's share of a step can be timed. Never set in a build that trains.
#ifndef FP8AMP_ADAM_SKIP_CHECK
#define FP8AMP_ADAM_SKIP_CHECK 0
#endif
// Measurement only (bench/adam_device_run.sh): 1 stops the fast kernel after the check phase, so the
// check's share of a step can be timed. Never set in a build that trains.
#ifndef FP8AMP_ADAM_PHASE1_ONLY
#define FP8AMP_ADAM_PHASE1_ONLY 0
#endif
// 0: always the generic kernel (for comparisons); 1: the fast kernel where it applies.
#ifndef FP8AMP_ADAM_FAST
#define FP8AMP_ADAM_FAST 1
#endif
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xFFFFFFFFu;

// Elements of a lane's 4 that exist when `left` elements remain from its first one.
__device__ __forceinline__ int lane_count(int64_t left) { return left <= 0 ? 0 : (left >= 4 ? 4 : int(left)); }

__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u; }

__device__ __forceinline__ float grad_factor(const StepConfig &c, const Param &p, float loss_scale_inv) {
    return fmul(fmul(c.grad_scale_inv, p.grad_scale_inv ? *p.grad_scale_inv : 1.0f), loss_scale_inv);
}

// Exact hardware decodes (every E4M3/E5M2/F16 value is a float32, see bits_value): the software
// codec's values for every non-NaN code, at a fraction of its instructions. NaN codes decode to some
// NaN, which is all the finiteness check needs.
// 1: decodes by exponent re-biasing and paired hardware encodes (below); 0 (the default): per-element
// hardware conversions. Both are exact and pass the same tests on an H100, but 1 needs ~110 registers
// (2 CTAs per SM instead of 3) and measured slower: O2 step 3.04 vs 2.42 ms (docs/performance.md).
#ifndef FP8AMP_ADAM_FAST_CODEC
#define FP8AMP_ADAM_FAST_CODEC 0
#endif

#if FP8AMP_ADAM_FAST_CODEC
// Exact decodes on the FMA pipe instead of the conversion pipe (16 per SM and clock on Hopper): the
// code's exponent and mantissa bits placed into a float32, then one multiply by 2^(127 - bias)
// re-biases it -- exact for normal and subnormal codes alike (IEEE multiply, no flush to zero).
// inf/NaN codes are mapped explicitly.
__device__ __forceinline__ float f16_to_float(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, mag = h & 0x7FFFu;
    if (mag >= 0x7C00u) return __uint_as_float(sign | 0x7F800000u | (mag & 0x3FFu) << 13);
    return __fmul_rn(__uint_as_float(sign | mag << 13), 0x1p112f);
}
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
    const uint32_t sign = (b & 0x80u) << 24, mag = b & 0x7Fu;
    if (mag == 0x7Fu) return __uint_as_float(sign | 0x7FC00000u);
    return __fmul_rn(__uint_as_float(sign | mag << 20), 0x1p120f);
}
__device__ __forceinline__ float e5m2_to_float(uint32_t b) {
    const uint32_t sign = (b & 0x80u) << 24, mag = b & 0x7Fu;
    if (mag >= 0x7Cu) return __uint_as_float(sign | 0x7F800000u | (mag & 3u) << 21);
    return __fmul_rn(__uint_as_float(sign | mag << 21), 0x1p112f);
}
#else
__device__ __forceinline__ float f16_to_float(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }
__device__ __forceinline__ float fp8_to_float(uint32_t b, bool e4m3) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), e4m3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(*reinterpret_cast<const __half *>(&h));
}
__device__ __forceinline__ float e4m3_to_float(uint32_t b) { return fp8_to_float(b, true); }
__device__ __forceinline__ float e5m2_to_float(uint32_t b) { return fp8_to_float(b, false); }
#endif

// The per-lane view of one chunk: new values of 4 elements.
struct Lane {
    float w[4], m[4], v[4];
    int n;
};

struct BlockScales {
    float m_inv, v_inv, w_inv;  // scale_inv of the stored (old) state
};

__device__ __forceinline__ int dtype_bytes(int32_t dtype) {
    return dtype == FP8AMP_DTYPE_F32 ? 4 : (dtype == FP8AMP_DTYPE_F16 || dtype == FP8AMP_DTYPE_BF16) ? 2 : 1;
}

// The bits of 4 contiguous elements (n valid) of an array of esize-byte elements, packed little-endian
// into 1, 2 or 4 words: one vector load for a whole aligned quad, element loads otherwise. Loading
// bits first and decoding later lets a warp issue the loads of several chunks before it uses any.
__device__ __forceinline__ uint4 load_bits(const void *base, int esize, int64_t i, int n, bool vec) {
    if (vec && n == 4) {
        if (esize == 4) return *reinterpret_cast<const uint4 *>(static_cast<const uint32_t *>(base) + i);
        if (esize == 2) {
            const uint2 q = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + i);
            return make_uint4(q.x, q.y, 0u, 0u);
        }
        return make_uint4(*reinterpret_cast<const uint32_t *>(static_cast<const uint8_t *>(base) + i), 0u, 0u, 0u);
    }
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (k < n) {
            if (esize == 4) w[k] = static_cast<const uint32_t *>(base)[i + k];
            else if (esize == 2) w[k / 2] |= uint32_t(static_cast<const uint16_t *>(base)[i + k]) << (16 * (k % 2));
            else w[0] |= uint32_t(static_cast<const uint8_t *>(base)[i + k]) << (8 * k);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint32_t word_of(const uint4 &r, int j) { return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w; }

// Element k (a constant after unrolling) of load_bits' result, decoded exactly.
__device__ __forceinline__ float bits_value(const uint4 &r, int32_t dtype, int k) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return __uint_as_float(word_of(r, k));
    case FP8AMP_DTYPE_F16: return f16_to_float((word_of(r, k / 2) >> (16 * (k % 2))) & 0xFFFFu);
    case FP8AMP_DTYPE_BF16: return __uint_as_float((word_of(r, k / 2) >> (16 * (k % 2))) << 16);
    case FP8AMP_DTYPE_E4M3: return e4m3_to_float((r.x >> (8 * k)) & 0xFFu);
    default: return e5m2_to_float((r.x >> (8 * k)) & 0xFFu);
    }
}

struct Raw {
    uint4 g, w, m, v;  // gradient, weight (parameter or master), m, v
};

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void load_raw(const Param &p, int64_t i, int n, Raw &r) {
    r.g = load_bits(p.grad, dtype_bytes(p.grad_dtype), i, n, p.vec_ok);
    r.w = MASTER ? load_bits(p.master, 2, i, n, true) : load_bits(p.param, dtype_bytes(p.param_dtype), i, n, p.vec_ok);
    r.m = load_bits(p.m, M8 ? 1 : 4, i, n, true);
    r.v = load_bits(p.v, V16 ? 2 : 4, i, n, true);
}

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void compute_raw(const StepConfig &c, const StepScalars &s, const Param &p, const Raw &r,
                                            int n, float f, float coef, bool clip, const BlockScales &old,
                                            float param_inv, Lane &out) {
    out.n = n;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float g = fmul(bits_value(r.g, p.grad_dtype, k), f);
        if (clip) g = fmul(g, coef);
        float w;
        if (MASTER) {
            w = fmul(bits_value(r.w, FP8AMP_DTYPE_F16, k), old.w_inv);
        } else {
            w = bits_value(r.w, p.param_dtype, k);
            if (p.param_scale_inv) w = fmul(w, param_inv);
        }
        float m = M8 ? fmul(bits_value(r.m, FP8AMP_DTYPE_E4M3, k), old.m_inv) : __uint_as_float(word_of(r.m, k));
        float v = V16 ? fmul(bits_value(r.v, FP8AMP_DTYPE_F16, k), old.v_inv) : __uint_as_float(word_of(r.v, k));
        adam_element(c, s, g, w, m, v);
        // Invalid lanes hold zeros, which take no part in an amax.
        out.w[k] = k < n ? w : 0.0f;
        out.m[k] = k < n ? m : 0.0f;
        out.v[k] = k < n ? v : 0.0f;
    }
}

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void compute_chunk(const StepConfig &c, const StepScalars &s, const Param &p, int64_t i,
                                              int n, float f, float coef, bool clip, const BlockScales &old,
                                              float param_inv, Lane &out) {
    Raw r;
    load_raw<M8, V16, MASTER>(p, i, n, r);
    compute_raw<M8, V16, MASTER>(c, s, p, r, n, f, coef, clip, old, param_inv, out);
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

// Encodes of 4 values at once. The fast path converts pairs in one hardware instruction
// (cvt.rn.satfinite.e4m3x2.f32, cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32: round to nearest even, as the
// CPU codec); a quad holding a NaN takes from_f32's explicit NaN rule, so the bits match the CPU's.
__device__ __forceinline__ bool any_nan4(const float x[4]) {
    return x[0] != x[0] || x[1] != x[1] || x[2] != x[2] || x[3] != x[3];
}

__device__ __forceinline__ uint32_t pack_e4m3(const float x[4]) {
#if FP8AMP_ADAM_FAST_CODEC
    if (!any_nan4(x)) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x[0], x[1]), __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x[2], x[3]), __NV_SATFINITE, __NV_E4M3);
        return (lo & 0xFFFFu) | (hi & 0xFFFFu) << 16;
    }
#endif
    uint32_t q = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) q |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(x[k])) << (8 * k);
    return q;
}

template <bool kBF16>
__device__ __forceinline__ uint2 pack_16(const float x[4]) {
#if FP8AMP_ADAM_FAST_CODEC
    if (!any_nan4(x)) {
        if (kBF16) {
            const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
            return make_uint2(*reinterpret_cast<const uint32_t *>(&a), *reinterpret_cast<const uint32_t *>(&b));
        }
        const __half2 a = __floats2half2_rn(x[0], x[1]), b = __floats2half2_rn(x[2], x[3]);
        return make_uint2(*reinterpret_cast<const uint32_t *>(&a), *reinterpret_cast<const uint32_t *>(&b));
    }
#endif
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = kBF16 ? from_f32<FP8AMP_DTYPE_BF16>(x[k]) : from_f32<FP8AMP_DTYPE_F16>(x[k]);
    return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

__device__ __forceinline__ void store_bytes(void *base, int64_t i, int n, bool vec, uint32_t q) {
    if (vec && n == 4) {
        *reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(base) + i) = q;
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
        if (k < n) static_cast<uint8_t *>(base)[i + k] = uint8_t(q >> (8 * k));
}

__device__ __forceinline__ void store_halves(void *base, int64_t i, int n, bool vec, uint2 h) {
    if (vec && n == 4) {
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i) = h;
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
        if (k < n) static_cast<uint16_t *>(base)[i + k] = uint16_t((k < 2 ? h.x : h.y) >> (16 * (k % 2)));
}

__device__ __forceinline__ void store_floats(void *base, int64_t i, int n, bool vec, const float x[4]) {
    if (vec && n == 4) {
        *reinterpret_cast<float4 *>(static_cast<float *>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
        if (k < n) static_cast<float *>(base)[i + k] = x[k];
}

template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void store_chunk(const Param &p, int64_t i, const Lane &l, const NewScales &ns,
                                            float param_scale) {
    const int n = l.n;
    float y[4];
    if (M8) {
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = fmul(l.m[k], ns.m);
        store_bytes(p.m, i, n, true, pack_e4m3(y));
    } else {
        store_floats(p.m, i, n, true, l.m);
    }
    if (V16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = fmul(l.v[k], ns.v);
        store_halves(p.v, i, n, true, pack_16<false>(y));
    } else {
        store_floats(p.v, i, n, true, l.v);
    }
    if (MASTER) {
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = fmul(l.w[k], ns.w);
        store_halves(p.master, i, n, true, pack_16<false>(y));
    }
    // The parameter, in its own dtype (the CPU's codec rules: BF16/F16 overflow to inf, scaled F16 and
    // FP8 saturate).
    const bool vec = p.vec_ok;
    switch (p.param_dtype) {
    case FP8AMP_DTYPE_F32: store_floats(p.param, i, n, vec, l.w); break;
    case FP8AMP_DTYPE_BF16: store_halves(p.param, i, n, vec, pack_16<true>(l.w)); break;
    case FP8AMP_DTYPE_F16:
        if (p.param_meta) {
            // Scaled F16 saturates at 65504 (values in (65504, 65520) round to it anyway); NaN stays.
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                y[k] = scaled(l.w[k], param_scale);
                if (y[k] > 65504.0f) y[k] = 65504.0f;
                if (y[k] < -65504.0f) y[k] = -65504.0f;
            }
            store_halves(p.param, i, n, vec, pack_16<false>(y));
        } else {
            store_halves(p.param, i, n, vec, pack_16<false>(l.w));
        }
        break;
    default:  // E4M3 bound to its meta
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = scaled(l.w[k], param_scale);
        store_bytes(p.param, i, n, vec, pack_e4m3(y));
        break;
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

// Phase 3 (after a grid sync): per-tensor mode's state scales from the tensors' new amax, and each
// scaled parameter's meta: publish the scale_inv used, fold the history, next scale.
template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void fold_param_metas(const StepConfig &c, int64_t warp, int64_t warps, int lane) {
    const bool per_tensor = c.block_size == 0;
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
    // This warp's units as element ranges of each parameter, kBatch chunks of loads in flight per lane.
    constexpr int kBatch = 8;
    double sumsq = 0.0;
    bool bad = false;
    {
        const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;
        int k = ub < ue ? find_param(c, ub) : 0;
        for (int64_t u = ub; u < ue;) {
            while (k + 1 < c.nparams && c.params[k + 1].unit_begin <= u) ++k;
            const Param &p = c.params[k];
            const int64_t next = k + 1 < c.nparams ? c.params[k + 1].unit_begin : c.total_units;
            const int64_t stop = min(ue, next);
            if (u == p.unit_begin && p.grad_meta && p.grad_meta->amax_bits >= 0x7F800000u) bad = true;
            const float f = grad_factor(c, p, loss_scale_inv);
            const int32_t gd = p.grad_dtype;
            const int gs = dtype_bytes(gd);
            const bool vec = p.vec_ok;
            const void *grad = p.grad;
            const int64_t e1 = min((stop - p.unit_begin) * unit_elems, p.numel);
            for (int64_t base = (u - p.unit_begin) * unit_elems + lane * 4; base < e1; base += kChunk * kBatch) {
                uint4 r[kBatch];
#pragma unroll
                for (int j = 0; j < kBatch; ++j) r[j] = load_bits(grad, gs, base + j * kChunk, lane_count(e1 - base - j * kChunk), vec);
#pragma unroll
                for (int j = 0; j < kBatch; ++j) {
                    const int n = lane_count(e1 - base - j * kChunk);
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const float x = fmul(bits_value(r[j], gd, q), f);
                        if (q < n) {
                            bad |= !finite(x);
                            sumsq += double(x) * double(x);
                        }
                    }
                }
            }
            u = stop;
        }
    }
    const CheckResult check = end_check<false>(c, grid, sumsq, bad, lane, step);
    if (check.found) return;  // uniform across the grid: nothing is written
    const float norm = check.norm;

    const float lr = c.lr_device ? *c.lr_device : c.lr;
    const StepScalars s = step_scalars(c, lr, step + 1);
    const bool clip = c.max_grad_norm > 0.0f;
    float coef = 1.0f;
    if (clip) coef = clip_coefficient(c.max_grad_norm, norm);

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
    auto old_scales = [&](const Param &p, int64_t si) {
        return BlockScales{M8 ? p.m_scale_inv[si] : 1.0f, V16 ? p.v_scale_inv[si] : 1.0f,
                           MASTER ? p.master_scale_inv[si] : 1.0f};
    };
    // A 128-element block in registers: its new amax, its scales, its stores.
    auto finish_block = [&](const Param &p, int64_t si, int64_t i, const Lane &l, float param_scale) {
        Amax a;
        lane_amax(l, a);
        const NewScales ns = scales_of(warp_amax(a));
        __syncwarp();  // every lane has read the old scales
        if (lane == 0) {
            if (M8) p.m_scale_inv[si] = fdiv(1.0f, ns.m);
            if (V16) p.v_scale_inv[si] = fdiv(1.0f, ns.v);
            if (MASTER) p.master_scale_inv[si] = fdiv(1.0f, ns.w);
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) param_amax = max(param_amax, amax_bits_of(l.w[q]));
        if (l.n > 0) store_chunk<M8, V16, MASTER>(p, i, l, ns, param_scale);
    };
    if (!per_tensor && c.block_size == kChunk) {
        // The common case: one block per chunk. Two blocks per iteration, all loads issued first.
        const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;
        int k = ub < ue ? find_param(c, ub) : 0;
        for (int64_t u = ub; u < ue;) {
            while (k + 1 < c.nparams && c.params[k + 1].unit_begin <= u) ++k;
            if (k != cur) flush_param(), cur = k, param_amax = 0;
            const Param &p = c.params[k];
            const int64_t next = k + 1 < c.nparams ? c.params[k + 1].unit_begin : c.total_units;
            const int64_t lu = u - p.unit_begin, si = p.scale_begin + lu;
            const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
            const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
            const float f = grad_factor(c, p, loss_scale_inv);
            const int64_t i0 = lu * kChunk + lane * 4;
            const int n0 = lane_count(p.numel - i0);
            if (u + 1 < ue && u + 1 < next) {
                const int n1 = lane_count(p.numel - i0 - kChunk);
                Raw r0, r1;
                load_raw<M8, V16, MASTER>(p, i0, n0, r0);
                load_raw<M8, V16, MASTER>(p, i0 + kChunk, n1, r1);
                const BlockScales o0 = old_scales(p, si), o1 = old_scales(p, si + 1);
                Lane l;
                compute_raw<M8, V16, MASTER>(c, s, p, r0, n0, f, coef, clip, o0, param_inv, l);
                finish_block(p, si, i0, l, param_scale);
                compute_raw<M8, V16, MASTER>(c, s, p, r1, n1, f, coef, clip, o1, param_inv, l);
                finish_block(p, si + 1, i0 + kChunk, l, param_scale);
                u += 2;
            } else {
                Lane l;
                compute_chunk<M8, V16, MASTER>(c, s, p, i0, n0, f, coef, clip, old_scales(p, si), param_inv, l);
                finish_block(p, si, i0, l, param_scale);
                u += 1;
            }
        }
    } else {
    for_my_units(c, warp, warps, [&](int k, const Param &p, int64_t lu) {
        if (k != cur) flush_param(), cur = k, param_amax = 0;
        const int64_t si = p.scale_begin + (per_tensor ? 0 : lu);
        const BlockScales old = old_scales(p, si);
        const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
        const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
        const float f = grad_factor(c, p, loss_scale_inv);
        const int64_t begin = lu * unit_elems;
        const int64_t end = min(begin + unit_elems, p.numel);
        auto count = [&](int64_t base) { return lane_count(end - base); };
        NewScales ns{1.0f, 1.0f, 1.0f};
        if (per_tensor) {
            Amax a;
            a.m = c.tensor_amax[3 * k + 0], a.v = c.tensor_amax[3 * k + 1], a.w = c.tensor_amax[3 * k + 2];
            ns = scales_of(a);
        } else if (M8 || V16 || MASTER) {
            // Blocks of several chunks: a first pass for the block's amax, then the stores.
            Amax a;
            for (int64_t base = begin + lane * 4; base < end; base += kChunk) {
                Lane t;
                compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, t);
                lane_amax(t, a);
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
            Lane l;
            compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, l);
#pragma unroll
            for (int q = 0; q < 4; ++q) param_amax = max(param_amax, amax_bits_of(l.w[q]));
            if (l.n > 0) store_chunk<M8, V16, MASTER>(p, base, l, ns, param_scale);
        }
    });
    }
    flush_param();

    // ---- phase 3: the metas of scaled parameters; per-tensor state scales ----
    if (!c.has_param_metas && !(per_tensor && (M8 || V16 || MASTER))) return;
    grid.sync();
    fold_param_metas<M8, V16, MASTER>(c, warp, warps, lane);
}

// =================================================================================================
// The fast kernel. Used when the state blocks are 128 elements (or no state is block-scaled: O1)
// and every parameter's (param dtype, grad dtype) pair is in FastPairs below; otherwise the generic
// kernel above runs. The same three phases and the same arithmetic (kernels/adam.hpp, bit-identical
// to kernels/cpu/adam.cpp); what differs is the cost per element (docs/performance.md, "Adam"):
//  - a half-warp per 128-element block: 16 lanes x 8 contiguous elements, two blocks (a pair of
//    chunks) per warp iteration, 8- and 16-byte vector loads; each warp takes a contiguous range of
//    pairs, and the last 10% of the pairs go in runs of 16 to whichever warp is free (run_pairs);
//  - a block's scale_inv is stored only where it changed (update8);
//  - dtypes, the weight-decay form and clipping are template parameters: no per-element switches;
//  - a block's amax is a NaN-propagating float max per lane (one FMNMX per value) and one
//    redux.sync per half-warp; its power-of-two scale comes from the amax bits by integer operations
//    (the values of pow2_exponent, checked over every float);
//  - encodes of two values per instruction (cvt.rn.satfinite.e4m3x2.f32, cvt.rn.f16x2.f32,
//    cvt.rn.bf16x2.f32: round to nearest even as the CPU codec, for finite values in range). A
//    block whose new amax is inf/NaN, or a lane whose new weights hold a NaN, takes the per-element
//    encoders with the CPU's NaN and saturation rules instead (a branch never taken in training);
//  - the gradient check reads 16 bytes per lane and sums squares in float64; it needs no per-element
//    finiteness test: a float64 sum of squares of finite float32 values is finite (< 2^31 * 2^256),
//    and one inf/NaN element makes it inf/NaN, so the sum itself says whether the step must skip.
// A pair of which only one chunk is the parameter's (its first or its last) gives its second
// half-warp the first half's chunk again: both halves compute the same values and store the same
// bytes to the same addresses in the same instructions, so no lane needs a predicate.

constexpr int kF32 = FP8AMP_DTYPE_F32, kF16 = FP8AMP_DTYPE_F16, kBF16 = FP8AMP_DTYPE_BF16,
              kE4M3 = FP8AMP_DTYPE_E4M3, kE5M2 = FP8AMP_DTYPE_E5M2;
constexpr int pair_code(int pd, int gd) { return pd * 5 + gd; }
constexpr int dt_size(int dt) { return dt == kF32 ? 4 : (dt == kF16 || dt == kBF16) ? 2 : 1; }

// The pairs each state layout has a fast path for.
template <bool M8, bool V16, bool MASTER> struct FastPairs;
template <> struct FastPairs<false, false, false> {  // O1: F32 m and v
    static constexpr int codes[] = {pair_code(kF32, kF32), pair_code(kF16, kE4M3), pair_code(kBF16, kE4M3),
                                    pair_code(kBF16, kBF16)};
};
template <> struct FastPairs<true, true, false> {  // O2: E4M3 m, F16 v
    static constexpr int codes[] = {pair_code(kBF16, kE4M3), pair_code(kF16, kE4M3), pair_code(kF32, kF32),
                                    pair_code(kBF16, kBF16)};
};
template <> struct FastPairs<true, true, true> {  // O3: + F16 master
    static constexpr int codes[] = {pair_code(kE4M3, kE4M3), pair_code(kBF16, kE4M3), pair_code(kF16, kE4M3),
                                    pair_code(kBF16, kBF16)};
};
template <bool M8, bool V16, bool MASTER>
constexpr uint32_t fast_pair_mask() {
    uint32_t mask = 0;
    for (int code : FastPairs<M8, V16, MASTER>::codes) mask |= 1u << code;
    return mask;
}

// How the fast kernel's streams meet the caches (each byte is read or written once per step).
// evict_first: ld.global.cs / st.global.cs. no_allocate: ld.global.nc.L1::no_allocate and
// write-back stores. The non-coherent path is safe here although the kernel writes what it read:
// every byte is read by the one lane that later writes it, before it writes it, and never read
// again in the launch (the reference path re-reads before any store), and no L1 line is allocated
// that could go stale; the caches start clean at each launch. normal: ld.global.ca (loads only: the
// gradient check that runs back to front, so that the update finds its last loads in L2).
// Measured on an H100 (docs/performance.md, "Adam"): no_allocate with the check run back to front
// took the O2 step (BF16 params, E4M3 gradients) from 1.305 to 1.286 ms and left O3 and O2 with F32
// gradients within 0.5%, but made O1 (F32 m and v) 2.8% slower; so O2 and O3 use it and O1 keeps
// evict_first.
enum class Cache { evict_first, no_allocate, normal };

template <int PD_, int GD_, bool M8_, bool V16_, bool MASTER_, bool L2_, bool CLIP_>
struct Cfg {
    static constexpr int PD = PD_, GD = GD_;
    static constexpr bool M8 = M8_, V16 = V16_, MASTER = MASTER_;
    static constexpr bool L2 = L2_;      // Adam with weight decay: g += wd * p (else p *= decay: AdamW or none)
    static constexpr bool CLIP = CLIP_;  // g *= clip coefficient
    static constexpr int GB = dt_size(GD), PB = dt_size(PD);
    static constexpr int WB = MASTER ? 2 : PB;                        // bytes per element of the weight read
    static constexpr bool SCALABLE = PD == kF16 || PD == kE4M3;        // may carry a scale_inv / meta
    static constexpr bool WAMAX = MASTER || PD != kF32;                 // the new weights' amax is needed
    static constexpr Cache CACHE = M8 ? Cache::no_allocate : Cache::evict_first;
};

template <int BYTES> struct Bits {
    uint32_t w[BYTES / 4];
};

template <Cache K, class T>
__device__ __forceinline__ T load_hinted(const T *p) {
    if constexpr (K == Cache::evict_first) {
        return __ldcs(p);
    } else if constexpr (K == Cache::normal) {
        return __ldca(p);
    } else {
        T q;
        if constexpr (sizeof(T) == 8)
            asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(q.x), "=r"(q.y) : "l"(p));
        else
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                         : "l"(p));
        return q;
    }
}
template <Cache K, class T>
__device__ __forceinline__ void store_hinted(T *p, T v) {
    static_assert(K != Cache::normal, "stores are evict_first or write-back");
    if constexpr (K == Cache::evict_first) __stcs(p, v);
    else __stwb(p, v);
}

// BYTES contiguous bytes (aligned to min(BYTES, 16)) as vector loads.
template <int BYTES, Cache K = Cache::evict_first>
__device__ __forceinline__ Bits<BYTES> load_vec(const uint8_t *ptr) {
    Bits<BYTES> b;
    if constexpr (BYTES == 8) {
        const uint2 q = load_hinted<K>(reinterpret_cast<const uint2 *>(ptr));
        b.w[0] = q.x, b.w[1] = q.y;
    } else {
#pragma unroll
        for (int k = 0; k < BYTES / 16; ++k) {
            const uint4 q = load_hinted<K>(reinterpret_cast<const uint4 *>(ptr) + k);
            b.w[4 * k] = q.x, b.w[4 * k + 1] = q.y, b.w[4 * k + 2] = q.z, b.w[4 * k + 3] = q.w;
        }
    }
    return b;
}

template <int BYTES, Cache K>
__device__ __forceinline__ void store_vec(uint8_t *ptr, const Bits<BYTES> &b) {
    if constexpr (BYTES == 8) {
        store_hinted<K>(reinterpret_cast<uint2 *>(ptr), make_uint2(b.w[0], b.w[1]));
    } else {
#pragma unroll
        for (int k = 0; k < BYTES / 16; ++k)
            store_hinted<K>(reinterpret_cast<uint4 *>(ptr) + k, make_uint4(b.w[4 * k], b.w[4 * k + 1], b.w[4 * k + 2], b.w[4 * k + 3]));
    }
}

// The first n (of 8) elements of ESIZE bytes each, element by element; the others are zero.
template <int ESIZE>
__device__ __forceinline__ Bits<8 * ESIZE> load_guarded(const uint8_t *ptr, int n) {
    Bits<8 * ESIZE> b;
#pragma unroll
    for (int k = 0; k < 2 * ESIZE; ++k) b.w[k] = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j < n) {
            if constexpr (ESIZE == 4) b.w[j] = reinterpret_cast<const uint32_t *>(ptr)[j];
            else if constexpr (ESIZE == 2) b.w[j / 2] |= uint32_t(reinterpret_cast<const uint16_t *>(ptr)[j]) << (16 * (j % 2));
            else b.w[j / 4] |= uint32_t(ptr[j]) << (8 * (j % 4));
        }
    }
    return b;
}

template <int ESIZE>
__device__ __forceinline__ void store_guarded(uint8_t *ptr, const Bits<8 * ESIZE> &b, int n) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j < n) {
            if constexpr (ESIZE == 4) reinterpret_cast<uint32_t *>(ptr)[j] = b.w[j];
            else if constexpr (ESIZE == 2) reinterpret_cast<uint16_t *>(ptr)[j] = uint16_t(b.w[j / 2] >> (16 * (j % 2)));
            else ptr[j] = uint8_t(b.w[j / 4] >> (8 * (j % 4)));
        }
    }
}

template <int ESIZE, bool GUARD, Cache K>
__device__ __forceinline__ Bits<8 * ESIZE> load8(const uint8_t *ptr, int n) {
    if constexpr (GUARD) return load_guarded<ESIZE>(ptr, n);
    else return load_vec<8 * ESIZE, K>(ptr);
}
template <int ESIZE, bool GUARD, Cache K>
__device__ __forceinline__ void store8(uint8_t *ptr, const Bits<8 * ESIZE> &b, int n) {
    if constexpr (GUARD) store_guarded<ESIZE>(ptr, b, n);
    else store_vec<8 * ESIZE, K>(ptr, b);
}

// Element j (a constant after unrolling) of 8 elements of dtype DT, decoded exactly (NaN codes give
// some NaN). The pair conversions are shared between j and j ^ 1 by the compiler.
template <int DT, int BYTES>
__device__ __forceinline__ float decode8(const Bits<BYTES> &b, int j) {
    if constexpr (DT == kF32) {
        return __uint_as_float(b.w[j]);
    } else if constexpr (DT == kBF16) {
        return __uint_as_float((j & 1) ? (b.w[j / 2] & 0xFFFF0000u) : (b.w[j / 2] << 16));
    } else if constexpr (DT == kF16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&b.w[j / 2]));
        return (j & 1) ? f.y : f.x;
    } else {
        const uint32_t word = b.w[j / 4];
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((j & 2) ? (word >> 16) : (word & 0xFFFFu));
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, DT == kE4M3 ? __NV_E4M3 : __NV_E5M2);
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        return (j & 1) ? f.y : f.x;
    }
}

// The max of x over this lane's half-warp (hi: lanes 16..31), as two full-warp redux.sync: a
// redux.sync whose mask differs between the halves is emulated by a loop.
__device__ __forceinline__ uint32_t half_max(uint32_t x, bool hi) {
    const uint32_t lo_max = __reduce_max_sync(kFull, hi ? 0u : x);
    const uint32_t hi_max = __reduce_max_sync(kFull, hi ? x : 0u);
    return hi ? hi_max : lo_max;
}

// max(a, |x|), NaN-propagating: a lane's amax; NaN wins (and its bits, 0x7FFFFFFF, exceed inf's).
__device__ __forceinline__ float max_abs_nan(float a, float x) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(fabsf(x)));
    return r;
}

// The bits of the block scale 2^k for a block amax given as float bits (NaN bits allowed): the
// largest 2^k with amax * 2^k <= fmax (= (1 + MF/2^23) * 2^EF), k in [-126, 126]; 1 for an amax of 0,
// inf or NaN. Equals pow2(pow2_exponent(...)) for every input (checked over all 2^31 patterns).
// (a + 0x7FFFFF - MF) carries into the exponent exactly when a's mantissa exceeds fmax's.
template <int EF, uint32_t MF>
__device__ __forceinline__ uint32_t scale_bits(uint32_t a) {
    uint32_t sb = ((254u + EF) << 23) - ((a + (0x7FFFFFu - MF)) & 0xFF800000u);
    sb = min(sb, 253u << 23);
    return (a - 1u) >= 0x7F7FFFFFu ? (127u << 23) : sb;
}
__device__ __forceinline__ uint32_t inverse_bits(uint32_t scale_bits) { return (254u << 23) - scale_bits; }  // 1/2^k, exact

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

// 8 values -> 8 codes of DT. FAST: the pair conversions (values finite, or for BF16/unscaled F16 not
// NaN, and within range where the format saturates); else the per-element encoders (CPU rules).
// The exact encoders of 8 values (the CPU codec's rules, NaN with its sign): not inlined, they run
// only for blocks or lanes holding inf/NaN.
template <int DT>
__device__ __noinline__ Bits<8 * dt_size(DT)> encode8_exact(float x0, float x1, float x2, float x3, float x4, float x5,
                                                            float x6, float x7) {
    const float x[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
    Bits<8 * dt_size(DT)> b;
#pragma unroll
    for (int k = 0; k < 2 * dt_size(DT); ++k) b.w[k] = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if constexpr (DT == kE4M3) b.w[j / 4] |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(x[j])) << (8 * (j % 4));
        else if constexpr (DT == kBF16) b.w[j / 2] |= uint32_t(from_f32<FP8AMP_DTYPE_BF16>(x[j])) << (16 * (j % 2));
        else b.w[j / 2] |= uint32_t(from_f32<FP8AMP_DTYPE_F16>(x[j])) << (16 * (j % 2));
    }
    return b;
}

template <int DT>
__device__ __forceinline__ Bits<8 * dt_size(DT)> encode8(const float x[8], bool fast) {
    Bits<8 * dt_size(DT)> b;
    if constexpr (DT == kF32) {
#pragma unroll
        for (int j = 0; j < 8; ++j) b.w[j] = __float_as_uint(x[j]);
    } else if (__builtin_expect(!fast, 0)) {
        b = encode8_exact<DT>(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
    } else if constexpr (DT == kE4M3) {
        b.w[0] = e4m3x4(x[0], x[1], x[2], x[3]);
        b.w[1] = e4m3x4(x[4], x[5], x[6], x[7]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) b.w[k] = DT == kBF16 ? bf16x2(x[2 * k], x[2 * k + 1]) : f16x2(x[2 * k], x[2 * k + 1]);
    }
    return b;
}

// x, as a value the compiler keeps in a register (a kernel parameter is otherwise re-read from the
// constant bank at every use: one more instruction each time).
__device__ __forceinline__ float in_register(float x) {
    float r;
    asm("mov.b32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// The step's per-element constants.
struct Consts {
    float omb1, omb2, beta2, eps, bc2, step_size, decay, wd, coef;
    ConstDiv div;  // of bc2
};

// One parameter as the fast path reads it (loaded once per segment).
struct Seg {
    const uint8_t *grad;
    uint8_t *param, *m, *v, *master;
    float *m_si, *v_si, *w_si;  // block scale_inv arrays
    int64_t numel;
    float f;                    // unscale factor; negated for maximize
    float param_inv;            // the param's scale_inv (1: unscaled)
    float param_scale;          // its meta's scale (1: no meta)
    bool meta;                  // scaled parameter: written with param_scale, amax recorded
    bool scale_ok;              // param_scale finite and nonzero: scaled(w) is NaN only for a NaN w
};

// The raw bits of one lane's 8 elements and its block's old scales.
template <class C> struct Raw8 {
    Bits<8 * C::GB> g;
    Bits<8 * C::WB> w;
    Bits<C::M8 ? 8 : 32> m;
    Bits<C::V16 ? 16 : 32> v;
    float m_inv, v_inv, w_inv;
};

// One lane's 8 elements from e, and block blk's old scale_inv of m, v and the master (1 where there
// is none).
template <class C, bool GUARD>
__device__ __forceinline__ void load_raw8(const Seg &s, uint32_t e, uint32_t blk, int n, Raw8<C> &r) {
    r.g = load8<C::GB, GUARD, C::CACHE>(s.grad + e * C::GB, n);
    r.w = load8<C::WB, GUARD, C::CACHE>((C::MASTER ? s.master : s.param) + e * C::WB, n);
    r.m = load8<C::M8 ? 1 : 4, GUARD, C::CACHE>(s.m + e * (C::M8 ? 1 : 4), n);
    r.v = load8<C::V16 ? 2 : 4, GUARD, C::CACHE>(s.v + e * (C::V16 ? 2 : 4), n);
    r.m_inv = C::M8 ? s.m_si[blk] : 1.0f;
    r.v_inv = C::V16 ? s.v_si[blk] : 1.0f;
    r.w_inv = C::MASTER ? s.w_si[blk] : 1.0f;
}

// The new values of one lane's 8 elements. FAST: sqrt(v) / bc2_sqrt by div_const, the parameter's
// codes by the pair conversions (valid when no new v is inf/NaN and no new weight is NaN: the caller
// checks and otherwise calls again with FAST false, the reference operations and encoders). m and v
// come back as floats (their block scale is not known yet), the weights as floats in nw (master:
// block-scaled later) and as the parameter's codes in pw. Missing elements (GUARD, j >= n) give zeros.
template <class C> struct New8 {
    float m[8], v[8];
    float w[C::MASTER ? 8 : 1];
    uint32_t p[2 * C::PB];  // the parameter's codes, packed
    float am, av, aw;       // the lane's NaN-propagating amax of |m|, |v|, |w|
};

template <class C, bool GUARD, bool FAST>
__device__ __forceinline__ void compute8(const Consts &k, const Seg &s, const Raw8<C> &r, int n, New8<C> &o) {
    o.am = o.av = o.aw = 0.0f;
    float wk[4];  // weights waiting to be encoded with their neighbours
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float g = fmul(decode8<C::GD>(r.g, j), s.f);
        if (C::CLIP) g = fmul(g, k.coef);
        float w;
        if (C::MASTER) w = fmul(decode8<kF16>(r.w, j), r.w_inv);
        else if (C::SCALABLE) w = fmul(decode8<C::PD>(r.w, j), s.param_inv);
        else w = decode8<C::PD>(r.w, j);
        float m = C::M8 ? fmul(decode8<kE4M3>(r.m, j), r.m_inv) : decode8<kF32>(r.m, j);
        float v = C::V16 ? fmul(decode8<kF16>(r.v, j), r.v_inv) : decode8<kF32>(r.v, j);
        // adam_element (kernels/adam.hpp); maximize is folded into s.f
        if (C::L2) g = fadd(g, fmul(k.wd, w));
        else w = fmul(w, k.decay);
        m = fadd(m, fmul(k.omb1, fsub(g, m)));
        v = fadd(fmul(v, k.beta2), fmul(fmul(k.omb2, g), g));
        const float sq = fsqrt(v);
        const float denom = fadd(FAST ? div_const(sq, k.div) : fdiv(sq, k.bc2), k.eps);
        w = fsub(w, fmul(k.step_size, fdiv(m, denom)));
        if (GUARD && j >= n) m = v = w = 0.0f;  // missing elements take no part in an amax
        o.m[j] = m, o.v[j] = v;
        if (C::MASTER) o.w[j] = w;
        o.am = max_abs_nan(o.am, m);
        o.av = max_abs_nan(o.av, v);
        if (C::WAMAX) o.aw = max_abs_nan(o.aw, w);
        // the parameter's codes (O3: the parameter is written from the master value, with its meta)
        if constexpr (C::PD == kF32) {
            o.p[j] = __float_as_uint(w);
        } else if constexpr (C::PD == kBF16 || C::PD == kF16) {
            if (j % 2 == 0) {
                wk[0] = w;
            } else if (C::PD == kBF16) {
                o.p[j / 2] = FAST ? bf16x2(wk[0], w) : (from_f32<FP8AMP_DTYPE_BF16>(wk[0]) | uint32_t(from_f32<FP8AMP_DTYPE_BF16>(w)) << 16);
            } else if (FAST) {
                // scaled F16: the product by a finite nonzero scale, saturated (NaN: not FAST)
                o.p[j / 2] = s.meta ? f16x2(fminf(fmaxf(fmul(wk[0], s.param_scale), -65504.0f), 65504.0f),
                                            fminf(fmaxf(fmul(w, s.param_scale), -65504.0f), 65504.0f))
                                    : f16x2(wk[0], w);
            } else {
                float y0 = wk[0], y1 = w;
                if (s.meta) {  // the generic kernel's rule: scaled(), then saturate; NaN kept
                    y0 = scaled(y0, s.param_scale), y1 = scaled(y1, s.param_scale);
                    if (y0 > 65504.0f) y0 = 65504.0f;
                    if (y0 < -65504.0f) y0 = -65504.0f;
                    if (y1 > 65504.0f) y1 = 65504.0f;
                    if (y1 < -65504.0f) y1 = -65504.0f;
                }
                o.p[j / 2] = from_f32<FP8AMP_DTYPE_F16>(y0) | uint32_t(from_f32<FP8AMP_DTYPE_F16>(y1)) << 16;
            }
        } else {  // E4M3, bound to its meta
            wk[j % 4] = FAST ? fmul(w, s.param_scale) : scaled(w, s.param_scale);
            if (j % 4 == 3) {
                if (FAST) {
                    o.p[j / 4] = e4m3x4(wk[0], wk[1], wk[2], wk[3]);
                } else {
                    uint32_t q = 0;
#pragma unroll
                    for (int i = 0; i < 4; ++i) q |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(wk[i])) << (8 * i);
                    o.p[j / 4] = q;
                }
            }
        }
    }
}

// The reference path of one lane's 8 elements (inputs loaded again: nothing is stored yet). Not
// inlined: it is never taken in training, and out of line it costs the hot loop neither code nor
// registers.
template <class C, bool GUARD>
__device__ __noinline__ void compute8_reference(const Consts &k, const Seg &s, uint32_t e, uint32_t blk, int n, New8<C> &o) {
    Raw8<C> r;
    load_raw8<C, GUARD>(s, e, blk, n, r);
    compute8<C, GUARD, false>(k, s, r, n, o);
}

// One lane's 8 elements of block `blk` (first element e): update, block scales, stores. hi: the
// lane is in the upper half-warp; lead: the half's first lane (writes the block's scales, and only
// where they changed: a power of two that most blocks keep from step to step, so that most lines of
// the scale arrays stay clean and are never written back; the same bytes either way). wseg: the
// lane's amax of its new weights over the segment (scaled parameters' metas).
template <class C, bool GUARD>
__device__ __forceinline__ void update8(const Consts &k, const Seg &s, const Raw8<C> &r, uint32_t e, uint32_t blk, int n,
                                        bool hi, bool lead, float &wseg) {
    New8<C> o;
    compute8<C, GUARD, true>(k, s, r, n, o);
    // The fast path's conditions (never false in training): every new v finite (div_const), no new
    // weight NaN (the pair encoders' NaN is not the CPU's), a usable meta scale.
    bool rare = !(o.av <= FLT_MAX);
    // (denom >= eps: with eps >= 2^-100 it is a normal float, at most 2^76 for a finite v)
    if (C::PD != kF32) rare |= o.aw != o.aw;
    if (C::SCALABLE) rare |= s.meta && !s.scale_ok;
    if (__builtin_expect(rare, 0)) {
        New8<C> ref;
        compute8_reference<C, GUARD>(k, s, e, blk, n, ref);
        o = ref;
    }
    if (C::WAMAX) wseg = max_abs_nan(wseg, o.aw);
    if (C::M8) {
        const uint32_t a = half_max(__float_as_uint(o.am), hi);
        const uint32_t sb = scale_bits<8, 0x600000u>(a);
        const float sc = __uint_as_float(sb);
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = fmul(o.m[j], sc);
        store8<1, GUARD, C::CACHE>(s.m + e, encode8<kE4M3>(y, a < 0x7F800000u), n);
        if (lead && inverse_bits(sb) != __float_as_uint(r.m_inv))  // only a changed scale
            s.m_si[blk] = __uint_as_float(inverse_bits(sb));
    } else {
        store8<4, GUARD, C::CACHE>(s.m + e * 4, encode8<kF32>(o.m, true), n);
    }
    if (C::V16) {
        const uint32_t a = half_max(__float_as_uint(o.av), hi);
        const uint32_t sb = scale_bits<15, 0x7FE000u>(a);
        const float sc = __uint_as_float(sb);
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = fmul(o.v[j], sc);
        store8<2, GUARD, C::CACHE>(s.v + e * 2, encode8<kF16>(y, a < 0x7F800000u), n);
        if (lead && inverse_bits(sb) != __float_as_uint(r.v_inv))  // only a changed scale
            s.v_si[blk] = __uint_as_float(inverse_bits(sb));
    } else {
        store8<4, GUARD, C::CACHE>(s.v + e * 4, encode8<kF32>(o.v, true), n);
    }
    if constexpr (C::MASTER) {
        const uint32_t a = half_max(__float_as_uint(o.aw), hi);
        const uint32_t sb = scale_bits<15, 0x7FE000u>(a);
        const float sc = __uint_as_float(sb);
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = fmul(o.w[j], sc);
        store8<2, GUARD, C::CACHE>(s.master + e * 2, encode8<kF16>(y, a < 0x7F800000u), n);
        if (lead && inverse_bits(sb) != __float_as_uint(r.w_inv))  // only a changed scale
            s.w_si[blk] = __uint_as_float(inverse_bits(sb));
    }
    Bits<8 * C::PB> pb;
#pragma unroll
    for (int i = 0; i < 2 * C::PB; ++i) pb.w[i] = o.p[i];
    store8<C::PB, GUARD, C::CACHE>(s.param + e * C::PB, pb, n);
}

// The update over global chunks [x, xend) of parameter s (chunks are numbered across parameters:
// s's are [pb, pb + its chunk count); pairs of chunks start at even numbers, the lower half-warp
// taking the first, the upper the second). x is even, or odd when its pair's first chunk belonged
// to the parameter before (or to the empty rest of its last unit). Returns where it stopped: xend, the end of s's chunks, or the odd second
// chunk of a pair cut by s's end (taken with the next parameter).
template <class C>
__device__ __forceinline__ int64_t run_pairs(const Consts &k, const Seg &s, int64_t x, int64_t pb, int64_t xend, bool vec,
                                             int lane, float &wseg) {
    const bool hi = lane >= 16;
    const bool lead = (lane & 15) == 0;
    const uint32_t lane_off = (lane & 15) * 8;
    // chunk indices within the parameter fit 32 bits (the launch checks its size)
    const int64_t lim = xend - pb;
    const uint32_t nch = uint32_t(min(lim, (s.numel + kChunk - 1) / kChunk));  // s's chunks below xend
    const uint32_t nfull = vec ? uint32_t(min(lim, s.numel / kChunk)) : 0u;    // ... that are full, aligned
    const uint32_t odd_base = uint32_t(pb & 1);  // a pair starts at xl where (xl & 1) == odd_base
    uint32_t xl = uint32_t(x - pb);
    for (;;) {
        if ((xl & 1) == odd_base) {
            for (; xl + 2 <= nfull; xl += 2) {
                const uint32_t blk = xl + (hi ? 1 : 0);
                Raw8<C> a;
                load_raw8<C, false>(s, blk * kChunk + lane_off, blk, 8, a);
                update8<C, false>(k, s, a, blk * kChunk + lane_off, blk, 8, hi, lead, wseg);
            }
        }
        if (xl >= nch) break;
        // A pair cut by the parameter's start or end, or holding its last partial (or unaligned)
        // chunk: its chunks of this parameter, guarded.
        const bool pair_start = (xl & 1) == odd_base;
        const uint32_t second = pair_start && xl + 1 < nch ? xl + 1 : xl;
        const uint32_t b1 = hi ? second : xl;
        const uint32_t e = b1 * kChunk + lane_off;
        const int n = int(max(int64_t(0), min(int64_t(8), s.numel - int64_t(e))));
        Raw8<C> r;
        load_raw8<C, true>(s, e, b1, n, r);
        update8<C, true>(k, s, r, e, b1, n, hi, lead, wseg);
        if (pair_start && second == xl) return pb + xl + 1;  // the pair's second chunk is past this parameter
        xl = (pair_start ? xl : xl - 1) + 2;
    }
    return pb + xl;
}

// Calls body(Cfg<...>{}) with the configuration of pair `code` (one of FastPairs' codes).
template <bool M8, bool V16, bool MASTER, bool L2, bool CLIP, int CODE, int... REST, class Body>
__device__ __forceinline__ void dispatch_pair(int code, Body &&body) {
    if (code == CODE) {
        body(Cfg<CODE / 5, CODE % 5, M8, V16, MASTER, L2, CLIP>{});
    } else if constexpr (sizeof...(REST) > 0) {
        dispatch_pair<M8, V16, MASTER, L2, CLIP, REST...>(code, body);
    }
}

template <bool M8, bool V16, bool MASTER, bool L2, bool CLIP, class Body, size_t... I>
__device__ __forceinline__ void dispatch_pairs_of(std::index_sequence<I...>, int code, Body &&body) {
    dispatch_pair<M8, V16, MASTER, L2, CLIP, FastPairs<M8, V16, MASTER>::codes[I]...>(code, body);
}

template <bool M8, bool V16, bool MASTER, bool L2, bool CLIP, class Body>
__device__ __forceinline__ void dispatch_pairs(int code, Body &&body) {
    dispatch_pairs_of<M8, V16, MASTER, L2, CLIP>(
        std::make_index_sequence<sizeof(FastPairs<M8, V16, MASTER>::codes) / sizeof(int)>(), code, body);
}

// Parameter p as the update's loops read it.
__device__ __forceinline__ Seg make_seg(const StepConfig &c, const Param &p, float loss_scale_inv) {
    Seg s;
    s.grad = static_cast<const uint8_t *>(p.grad);
    s.param = static_cast<uint8_t *>(p.param);
    s.m = static_cast<uint8_t *>(p.m);
    s.v = static_cast<uint8_t *>(p.v);
    s.master = static_cast<uint8_t *>(p.master);
    s.m_si = p.m_scale_inv + p.scale_begin;
    s.v_si = p.v_scale_inv + p.scale_begin;
    s.w_si = p.master_scale_inv + p.scale_begin;
    s.numel = p.numel;
    s.f = grad_factor(c, p, loss_scale_inv);
    if (c.maximize) s.f = -s.f;
    s.param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
    s.meta = p.param_meta != nullptr;
    s.param_scale = s.meta ? p.param_meta->scale : 1.0f;
    s.scale_ok = s.param_scale != 0.0f && fabsf(s.param_scale) <= FLT_MAX;
    return s;
}

// A scaled parameter's meta gets the warp's amax of the new weights it wrote.
__device__ __forceinline__ void record_weight_amax(const Param &p, float wseg, int lane) {
    uint32_t a = __reduce_max_sync(kFull, __float_as_uint(wseg));
    if (a > 0x7F800000u) a = 0x7F800000u;  // NaN counts as inf (amax_bits_of)
    if (lane == 0) atomicMax(&p.param_meta->amax_bits, a);
}

// The largest finite value of an 8- or 16-bit gradient dtype.
template <int GD>
constexpr float max_finite() {
    return GD == kE4M3 ? 448.0f : GD == kE5M2 ? 57344.0f : 65504.0f;
}

// The float32 sum of the squares of the V values of dtype GD in b (exact decodes). For E4M3, E5M2
// and F16 it is finite unless a code is inf/NaN: at most 16 squares below 2^32.
template <int GD, int V>
__device__ __forceinline__ float sum_squares(const Bits<16> &b) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const float x = decode8<GD>(b, j);
        s = __fmaf_rn(x, x, s);
    }
    return s;
}

// Phase 1 over elements [e0, e1) of a gradient: the sum of squares of the unscaled values, in float64
// (inf/NaN when a value is not finite).
// E4M3, E5M2 and F16 gradients whose largest finite value stays finite once unscaled (so that only
// inf and NaN codes can make an unscaled value non-finite: the per-element check of the generic form
// is then implied) take a cheaper form: the squares of the decoded codes summed in float32 per
// 16-byte load (relative error below 2^-20), these partials in float64, times f^2 once. It spares
// the per-element float64 conversion, which Hopper issues at a quarter of the FP32 rate, and keeps
// four loads in flight per lane: this pass reads one byte per parameter and is otherwise bound by
// its arithmetic (the check of 2^28 E4M3 gradients: 111 -> 95 us on an H100, docs/performance.md).
// K: the loads' cache hint (Cache).
template <int GD, Cache K>
__device__ __forceinline__ void check_grad(const uint8_t *grad, int64_t e0, int64_t e1, bool vec, float f, int lane,
                                           double &acc0, double &acc1) {
    constexpr int GB = dt_size(GD), V = 16 / GB;  // elements per lane per 16-byte load
    int64_t e = e0;
    if constexpr (GD != kF32 && GD != kBF16) {
        if (vec && fabsf(fmul(max_finite<GD>(), f)) <= FLT_MAX) {
            constexpr int64_t kStep = 32 * V;  // elements per warp-wide 16-byte load
            double c0 = 0.0, c1 = 0.0;
            for (; e + 4 * kStep <= e1; e += 4 * kStep) {
                Bits<16> b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) b[i] = load_vec<16, K>(grad + (e + i * kStep + lane * V) * GB);
                c0 += double(sum_squares<GD, V>(b[0])) + double(sum_squares<GD, V>(b[1]));
                c1 += double(sum_squares<GD, V>(b[2])) + double(sum_squares<GD, V>(b[3]));
            }
            for (; e + kStep <= e1; e += kStep) c0 += double(sum_squares<GD, V>(load_vec<16, K>(grad + (e + lane * V) * GB)));
            const double f2 = double(f) * double(f);
            acc0 += c0 * f2;
            acc1 += c1 * f2;
        }
    }
    if (vec) {  // e0 is a multiple of 128 elements: 16-byte aligned
        constexpr int64_t kStep = 32 * V;
        for (; e + 2 * kStep <= e1; e += 2 * kStep) {
            const Bits<16> a = load_vec<16, K>(grad + (e + lane * V) * GB);
            const Bits<16> b = load_vec<16, K>(grad + (e + kStep + lane * V) * GB);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float x = fmul(decode8<GD>(a, j), f), y = fmul(decode8<GD>(b, j), f);
                acc0 += double(x) * double(x);
                acc1 += double(y) * double(y);
            }
        }
        for (; e + kStep <= e1; e += kStep) {
            const Bits<16> a = load_vec<16, K>(grad + (e + lane * V) * GB);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float x = fmul(decode8<GD>(a, j), f);
                acc0 += double(x) * double(x);
            }
        }
    }
    for (int64_t i = e + lane; i < e1; i += 32) {
        const float x = fmul(load_value(grad, GD, i), f);
        acc1 += double(x) * double(x);
    }
}

template <bool M8, bool V16, bool MASTER, bool L2, bool CLIP>
__global__ void __launch_bounds__(kThreads, kFastMinBlocks) adam_fast_kernel(const __grid_constant__ StepConfig c) {
    cg::grid_group grid = cg::this_grid();
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * kWarps;
    // Units are state blocks (block mode) or 128-element chunks (per-tensor mode, no scaled state).
    const int64_t unit_elems = c.block_size > 0 ? c.block_size : kChunk;
    const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;

    // Read before the first grid sync; CTA 0 rewrites them after it.
    const int64_t step = c.status->step;
    const float loss_scale_inv = c.scaler ? fdiv(1.0f, c.scaler->scale) : 1.0f;

    // ---- phase 1: the sum of squares (inf/NaN if any gradient is not finite) ----
    double acc0 = 0.0, acc1 = 0.0;
    bool bad = false;
    // O2, O3: the check runs back to front with normal-priority loads (below); O1 streams evict-first.
    constexpr Cache kCheckCache = M8 ? Cache::normal : Cache::evict_first;
    // Units [rb, re) of this warp's range.
    const auto check_units = [&](int64_t rb, int64_t re) {
        if (FP8AMP_ADAM_SKIP_CHECK) return;
        int kk = rb < re ? find_param(c, rb) : 0;
        for (int64_t u = rb; u < re;) {
            while (kk + 1 < c.nparams && c.params[kk + 1].unit_begin <= u) ++kk;
            const Param &p = c.params[kk];
            const int64_t next = kk + 1 < c.nparams ? c.params[kk + 1].unit_begin : c.total_units;
            const int64_t stop = min(re, next);
            if (u == p.unit_begin && p.grad_meta && p.grad_meta->amax_bits >= 0x7F800000u) bad = true;
            const float f = grad_factor(c, p, loss_scale_inv);
            const int64_t e0 = (u - p.unit_begin) * unit_elems, e1 = min((stop - p.unit_begin) * unit_elems, p.numel);
            const auto *grad = static_cast<const uint8_t *>(p.grad);
            const bool vec = p.vec_ok;
            switch (p.grad_dtype) {
            case kF32: check_grad<kF32, kCheckCache>(grad, e0, e1, vec, f, lane, acc0, acc1); break;
            case kF16: check_grad<kF16, kCheckCache>(grad, e0, e1, vec, f, lane, acc0, acc1); break;
            case kBF16: check_grad<kBF16, kCheckCache>(grad, e0, e1, vec, f, lane, acc0, acc1); break;
            case kE4M3: check_grad<kE4M3, kCheckCache>(grad, e0, e1, vec, f, lane, acc0, acc1); break;
            default: check_grad<kE5M2, kCheckCache>(grad, e0, e1, vec, f, lane, acc0, acc1); break;
            }
            u = stop;
        }
    };
    if constexpr (M8) {
        // O2, O3: runs of kRun units from the last to the first, loaded with the normal L2 priority,
        // so that the update, which starts at the front, finds the gradients read last still in L2
        // (Cfg::CACHE says why O1 does not)
        constexpr int64_t kRun = 32;
        if (ue > ub)
            for (int64_t rb = ub + (ue - ub - 1) / kRun * kRun; rb >= ub; rb -= kRun) check_units(rb, min(rb + kRun, ue));
    } else {
        check_units(ub, ue);
    }
    // the update's run counter (below), first read after end_check's grid sync
    if (blockIdx.x == 0 && threadIdx.x == 0) c.partials[0].next_run = 0;
    const CheckResult check = end_check<true>(c, grid, acc0 + acc1, bad, lane, step);
    if (check.found) return;  // uniform across the grid: nothing is written
    const float norm = check.norm;
#if FP8AMP_ADAM_PHASE1_ONLY
    return;
#endif

    // ---- phase 2: the update ----
    const float lr = c.lr_device ? *c.lr_device : c.lr;
    const StepScalars ss = step_scalars(c, lr, step + 1);
    Consts k;
    k.omb1 = ss.one_minus_beta1, k.omb2 = ss.one_minus_beta2, k.beta2 = in_register(c.beta2), k.eps = in_register(c.eps);
    k.bc2 = ss.bc2_sqrt, k.step_size = ss.step_size, k.decay = ss.decay, k.wd = in_register(c.weight_decay), k.coef = 1.0f;
    k.div = make_const_div(ss.bc2_sqrt);
    if (CLIP) k.coef = clip_coefficient(c.max_grad_norm, norm);
    {
        // chunks of 128 elements: units are 128 (scaled state) or multiples of it (O1)
        const int64_t per = unit_elems / kChunk;
        // Each warp its own contiguous share of the first 90% of the pairs, then runs of kRun pairs
        // of the rest, taken in turn from a counter: warps do not all stream at the same rate, and
        // with fixed shares alone the first warps finished their update about 10% of the step before
        // the last (H100; docs/performance.md, "Fifth round").
        constexpr int64_t kRun = 16, kFixedPercent = 90;
        const int64_t total_chunks = c.total_units * per;
        const int64_t pairs = (total_chunks + 1) / 2;
        const int64_t fixed = pairs * kFixedPercent / 100;
        // Chunks are numbered across parameters: parameter k's start at params[k].unit_begin * per.
        int64_t x = 2 * (fixed * warp / warps), xend = min(total_chunks, 2 * (fixed * (warp + 1) / warps));
        for (;;) {
            // chunks [x, xend), parameter by parameter
            int kk = x < xend ? find_param(c, x / per) : 0;
            while (x < xend) {
                while (kk + 1 < c.nparams && c.params[kk + 1].unit_begin * per <= x) ++kk;
                const Param &p = c.params[kk];
                const int64_t pb = p.unit_begin * per;
                if (x >= pb + (p.numel + kChunk - 1) / kChunk) {
                    // past the parameter's last element, in the rest of its last unit (O1 units of
                    // several chunks): on to the next parameter's first chunk
                    x = min(xend, kk + 1 < c.nparams ? c.params[kk + 1].unit_begin * per : total_chunks);
                    continue;
                }
                const Seg s = make_seg(c, p, loss_scale_inv);
                float wseg = 0.0f;
                dispatch_pairs<M8, V16, MASTER, L2, CLIP>(p.param_dtype * 5 + p.grad_dtype, [&](auto cfg) {
                    x = run_pairs<decltype(cfg)>(k, s, x, pb, xend, p.vec_ok != 0, lane, wseg);
                });
                if (s.meta) record_weight_amax(p, wseg, lane);
            }
            uint32_t r = 0;
            if (lane == 0) r = atomicAdd(&c.partials[0].next_run, 1u);
            r = __shfl_sync(kFull, r, 0);
            const int64_t p0 = fixed + int64_t(r) * kRun;
            if (p0 >= pairs) break;
            x = 2 * p0, xend = min(total_chunks, 2 * (p0 + kRun));
        }
    }

    // ---- phase 3: the metas of scaled parameters ----
    if (!c.has_param_metas) return;
    grid.sync();
    fold_param_metas<M8, V16, MASTER>(c, warp, warps, lane);
}

__global__ void scaler_update_kernel(ScalerState *scaler, ScalerConfig config, const Status *status) {
    adam::scaler_update(*scaler, config, status->found_inf != 0);
}

template <class Kernel>
void launch_kernel(Kernel kernel, int device, cudaStream_t stream, const StepConfig &config, int max_partials) {
    const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads);
    int grid = per_sm * multiprocessor_count(device);
    if (grid > max_partials) grid = max_partials;
    if (grid < 1) fail(FP8AMP_ERROR_CUDA, "adam_kernel: no block fits on a multiprocessor");
    StepConfig c = config;
    void *args[] = {&c};
    check(cudaLaunchCooperativeKernel(reinterpret_cast<const void *>(kernel), dim3(grid), dim3(kThreads), args, 0, stream),
          "cudaLaunchCooperativeKernel (adam_kernel)");
}

// The fast kernel when the configuration has one (see above), else the generic one.
template <bool M8, bool V16, bool MASTER>
void launch(int device, cudaStream_t stream, const StepConfig &c, int max_partials) {
    constexpr bool kFastLayout = (M8 == V16) && (V16 || !MASTER) && (M8 || !MASTER);  // O1, O2, O3 layouts
    if constexpr (kFastLayout) {
        const bool blocks_ok = c.block_size == kChunk || !(M8 || V16 || MASTER);
        const bool pairs_ok = (c.pair_mask & ~fast_pair_mask<M8, V16, MASTER>()) == 0;
        // The fast kernel computes element indices and byte offsets in 32 bits (index x element
        // size): below 2^30 elements per parameter where any array has 4-byte elements (F32 m and v,
        // or F32 params and grads), below 2^31 otherwise. Larger parameters take the generic kernel.
        const bool four_byte = !(M8 && V16) || (c.pair_mask & (1u << pair_code(kF32, kF32))) != 0;
        const bool size_ok = c.max_numel < (int64_t(1) << (four_byte ? 30 : 31));
        if (blocks_ok && pairs_ok && size_ok && FP8AMP_ADAM_FAST) {
            const bool l2 = !c.adamw && c.weight_decay != 0.0f, clip = c.max_grad_norm > 0.0f;
            if (l2) {
                if (clip) launch_kernel(adam_fast_kernel<M8, V16, MASTER, true, true>, device, stream, c, max_partials);
                else launch_kernel(adam_fast_kernel<M8, V16, MASTER, true, false>, device, stream, c, max_partials);
            } else {
                if (clip) launch_kernel(adam_fast_kernel<M8, V16, MASTER, false, true>, device, stream, c, max_partials);
                else launch_kernel(adam_fast_kernel<M8, V16, MASTER, false, false>, device, stream, c, max_partials);
            }
            return;
        }
    }
    launch_kernel(adam_kernel<M8, V16, MASTER>, device, stream, c, max_partials);
}

}  // namespace

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
