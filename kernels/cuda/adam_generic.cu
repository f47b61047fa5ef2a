// The generic Adam/AdamW kernel: every configuration (any block size, per-tensor mode, every dtype
// pair), where adam_fast.cu's kernel has none. Each warp takes one contiguous range of units, and
// each lane handles 4 contiguous elements of a 128-element chunk, so a block's new amax is a warp
// reduction of values still in registers (block_size 128) or of a first pass over the block (larger
// blocks); per-tensor mode takes its scales from phase 1b's amaxes and runs the block-128 loop (two
// chunks' loads in flight; the PyTorch front's O3, whose E4M3 weights have masters and the rest none,
// lands here). The phases are adam.cu's.
#include <cooperative_groups.h>

#include <cstdint>

#include "adam.hpp"
#include "adam_common.cuh"
#include "adam_launch.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda {
namespace {

using namespace adam_common;  // the warp constants, find_param, end_check, fold_param_metas

// Tuning knob, overridable at build time so bench/ can compare in one device run: the least CTAs
// per SM the register allocation must allow (0: no bound; 4 forces 64 registers, with spills).
#ifndef FP8AMP_ADAM_MIN_BLOCKS
#define FP8AMP_ADAM_MIN_BLOCKS 0
#endif
constexpr int kMinBlocks = FP8AMP_ADAM_MIN_BLOCKS;

// Elements of a lane's 4 that exist when `left` elements remain from its first one.
__device__ __forceinline__ int lane_count(int64_t left) { return left <= 0 ? 0 : (left >= 4 ? 4 : int(left)); }

__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u; }

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
    // The element size of the gradient and the parameter is known only at run time here, so the loop
    // tests it per element rather than calling load_elements (one loop per size): built that way, the
    // generic kernel's code changed throughout, for no gain on this path.
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
    r.g = load_bits(p.grad, dtype_size(p.grad_dtype), i, n, p.vec_ok);
    // MASTER: some parameter has a master copy; this one has one when its pointer is set.
    r.w = (MASTER && p.master) ? load_bits(p.master, 2, i, n, true)
                               : load_bits(p.param, dtype_size(p.param_dtype), i, n, p.vec_ok);
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
        if (MASTER && p.master) {
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

// Encodes of 4 values at once, per element by from_f32 (the CPU codec's rules, NaN included).
// FP8AMP_ADAM_FAST_CODEC builds convert pairs in one hardware instruction instead (adam_common.cuh's
// pair encoders: round to nearest even, as the CPU codec) where the quad holds no NaN, whose bits only
// from_f32's explicit rule gives.
#if FP8AMP_ADAM_FAST_CODEC
__device__ __forceinline__ bool any_nan4(const float x[4]) {
    return x[0] != x[0] || x[1] != x[1] || x[2] != x[2] || x[3] != x[3];
}
#endif

__device__ __forceinline__ uint32_t pack_e4m3(const float x[4]) {
#if FP8AMP_ADAM_FAST_CODEC
    if (!any_nan4(x)) return e4m3x4(x[0], x[1], x[2], x[3]);
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
        if (kBF16) return make_uint2(bf16x2(x[0], x[1]), bf16x2(x[2], x[3]));
        return make_uint2(f16x2(x[0], x[1]), f16x2(x[2], x[3]));
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
    const uint32_t w[1] = {q};
    store_elements<4, 1>(static_cast<uint8_t *>(base) + i, n, w);
}

__device__ __forceinline__ void store_halves(void *base, int64_t i, int n, bool vec, uint2 h) {
    if (vec && n == 4) {
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i) = h;
        return;
    }
    const uint32_t w[2] = {h.x, h.y};
    store_elements<4, 2>(static_cast<uint8_t *>(base) + 2 * i, n, w);
}

__device__ __forceinline__ void store_floats(void *base, int64_t i, int n, bool vec, const float x[4]) {
    if (vec && n == 4) {
        *reinterpret_cast<float4 *>(static_cast<float *>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
        return;
    }
    // Floats, not their bits through store_elements: as words, the zeros of a lane's missing elements
    // (compute_raw) are selected as integers instead of floats (SEL for FSEL), which changed the SASS.
#pragma unroll
    for (int k = 0; k < 4; ++k)
        if (k < n) static_cast<float *>(base)[i + k] = x[k];
}

// key: the parameter's rounding_key in this step where masters are rounded stochastically.
template <bool M8, bool V16, bool MASTER>
__device__ __forceinline__ void store_chunk(const StepConfig &c, const Param &p, int64_t i, const Lane &l,
                                            const NewScales &ns, float param_scale, uint64_t key) {
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
    if (MASTER && p.master) {
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = fmul(l.w[k], ns.w);
        if (c.master_stochastic) {
            // kernels/adam.hpp's rounding, from the element's own random bits: the CPU's bytes.
            uint32_t h[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) h[k] = master_code_stochastic(y[k], rounding_bits(key, i + k));
            store_halves(p.master, i, n, true, make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16));
        } else {
            store_halves(p.master, i, n, true, pack_16<false>(y));
        }
    }
    // The parameter, in its own dtype (the CPU's codec rules: BF16/F16 overflow to inf, scaled F16 and
    // FP8 saturate).
    const bool vec = p.vec_ok;
    // Without a master the parameter is the value of record: stochastic rounding takes its codes
    // (kernels/adam.hpp bf16_code_stochastic / f16_param_code_stochastic: the CPU's bytes).
    if (c.master_stochastic && !(MASTER && p.master) &&
        (p.param_dtype == FP8AMP_DTYPE_BF16 || p.param_dtype == FP8AMP_DTYPE_F16)) {
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t r = rounding_bits(key, i + k);
            h[k] = p.param_dtype == FP8AMP_DTYPE_BF16
                       ? bf16_code_stochastic(l.w[k], r)
                       : f16_param_code_stochastic(p.param_meta ? scaled(l.w[k], param_scale) : l.w[k],
                                                   p.param_meta != nullptr, r);
        }
        store_halves(p.param, i, n, vec, make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16));
        return;
    }
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
            const int gs = dtype_size(gd);
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
        // This warp's units (128-element chunks), two chunks' loads in flight as in the update.
        const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;
        int k = ub < ue ? find_param(c, ub) : 0;
        for (int64_t u = ub; u < ue;) {
            while (k + 1 < c.nparams && c.params[k + 1].unit_begin <= u) ++k;
            if (k != cur) flush(), cur = k;
            const Param &p = c.params[k];
            const int64_t next = k + 1 < c.nparams ? c.params[k + 1].unit_begin : c.total_units;
            const BlockScales old{M8 ? p.m_scale_inv[p.scale_begin] : 1.0f, V16 ? p.v_scale_inv[p.scale_begin] : 1.0f,
                                  (MASTER && p.master) ? p.master_scale_inv[p.scale_begin] : 1.0f};
            const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
            const float f = grad_factor(c, p, loss_scale_inv);
            const int64_t i0 = (u - p.unit_begin) * kChunk + lane * 4;
            const int n0 = lane_count(p.numel - i0);
            Lane l;
            if (u + 1 < ue && u + 1 < next) {
                const int n1 = lane_count(p.numel - i0 - kChunk);
                Raw r0, r1;
                load_raw<M8, V16, MASTER>(p, i0, n0, r0);
                load_raw<M8, V16, MASTER>(p, i0 + kChunk, n1, r1);
                compute_raw<M8, V16, MASTER>(c, s, p, r0, n0, f, coef, clip, old, param_inv, l);
                lane_amax(l, acc);
                compute_raw<M8, V16, MASTER>(c, s, p, r1, n1, f, coef, clip, old, param_inv, l);
                lane_amax(l, acc);
                u += 2;
            } else {
                compute_chunk<M8, V16, MASTER>(c, s, p, i0, n0, f, coef, clip, old, param_inv, l);
                lane_amax(l, acc);
                u += 1;
            }
        }
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
                           (MASTER && p.master) ? p.master_scale_inv[si] : 1.0f};
    };
    // A 128-element block in registers: its new amax, its scales, its stores.
    auto key_of = [&](int k) {
        return c.master_stochastic ? rounding_key_at(c.rounding_seed, step + 1, k, c.params[k].element_offset) : uint64_t(0);
    };
    // Per-tensor mode: the current parameter's scales, from phase 1b's amaxes.
    NewScales tensor_scales{1.0f, 1.0f, 1.0f};
    auto finish_block = [&](const Param &p, int64_t si, int64_t i, const Lane &l, float param_scale, uint64_t key) {
        NewScales ns = tensor_scales;
        if (!per_tensor) {
            Amax a;
            lane_amax(l, a);
            ns = scales_of(warp_amax(a));
            __syncwarp();  // every lane has read the old scales
            if (lane == 0) {
                if (M8) p.m_scale_inv[si] = fdiv(1.0f, ns.m);
                if (V16) p.v_scale_inv[si] = fdiv(1.0f, ns.v);
                if (MASTER && p.master) p.master_scale_inv[si] = fdiv(1.0f, ns.w);
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) param_amax = max(param_amax, amax_bits_of(l.w[q]));
        if (l.n > 0) store_chunk<M8, V16, MASTER>(c, p, i, l, ns, param_scale, key);
    };
    if (per_tensor || c.block_size == kChunk) {
        // The common cases: one block per chunk, or one scale per tensor (written in phase 3: other
        // warps still read the old one). Two chunks per iteration, all loads issued first.
        const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;
        int k = ub < ue ? find_param(c, ub) : 0;
        for (int64_t u = ub; u < ue;) {
            while (k + 1 < c.nparams && c.params[k + 1].unit_begin <= u) ++k;
            if (k != cur) {
                flush_param(), cur = k, param_amax = 0;
                if (per_tensor) tensor_scales = tensor_scales_of(c, k);
            }
            const Param &p = c.params[k];
            const int64_t next = k + 1 < c.nparams ? c.params[k + 1].unit_begin : c.total_units;
            const int64_t lu = u - p.unit_begin, si = p.scale_begin + (per_tensor ? 0 : lu);
            const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
            const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
            const float f = grad_factor(c, p, loss_scale_inv);
            const uint64_t key = key_of(k);
            const int64_t i0 = lu * kChunk + lane * 4;
            const int n0 = lane_count(p.numel - i0);
            if (u + 1 < ue && u + 1 < next) {
                const int n1 = lane_count(p.numel - i0 - kChunk);
                Raw r0, r1;
                load_raw<M8, V16, MASTER>(p, i0, n0, r0);
                load_raw<M8, V16, MASTER>(p, i0 + kChunk, n1, r1);
                const BlockScales o0 = old_scales(p, si), o1 = old_scales(p, per_tensor ? si : si + 1);
                Lane l;
                compute_raw<M8, V16, MASTER>(c, s, p, r0, n0, f, coef, clip, o0, param_inv, l);
                finish_block(p, si, i0, l, param_scale, key);
                compute_raw<M8, V16, MASTER>(c, s, p, r1, n1, f, coef, clip, o1, param_inv, l);
                finish_block(p, si + 1, i0 + kChunk, l, param_scale, key);
                u += 2;
            } else {
                Lane l;
                compute_chunk<M8, V16, MASTER>(c, s, p, i0, n0, f, coef, clip, old_scales(p, si), param_inv, l);
                finish_block(p, si, i0, l, param_scale, key);
                u += 1;
            }
        }
    } else {
    // Blocks of several chunks (per-tensor mode took the loop above).
    for_my_units(c, warp, warps, [&](int k, const Param &p, int64_t lu) {
        if (k != cur) flush_param(), cur = k, param_amax = 0;
        const int64_t si = p.scale_begin + lu;
        const BlockScales old = old_scales(p, si);
        const float param_inv = p.param_scale_inv ? *p.param_scale_inv : 1.0f;
        const float param_scale = p.param_meta ? p.param_meta->scale : 1.0f;
        const float f = grad_factor(c, p, loss_scale_inv);
        const uint64_t key = key_of(k);
        const int64_t begin = lu * unit_elems;
        const int64_t end = min(begin + unit_elems, p.numel);
        auto count = [&](int64_t base) { return lane_count(end - base); };
        NewScales ns{1.0f, 1.0f, 1.0f};
        if (M8 || V16 || MASTER) {
            // A first pass for the block's amax, then the stores.
            Amax a;
            for (int64_t base = begin + lane * 4; base < end; base += kChunk) {
                Lane t;
                compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, t);
                lane_amax(t, a);
            }
            ns = scales_of(warp_amax(a));
        }
        // The old scales were read above (by every lane) before lane 0 replaces them.
        __syncwarp();
        if (lane == 0) {
            if (M8) p.m_scale_inv[si] = fdiv(1.0f, ns.m);
            if (V16) p.v_scale_inv[si] = fdiv(1.0f, ns.v);
            if (MASTER && p.master) p.master_scale_inv[si] = fdiv(1.0f, ns.w);
        }
        for (int64_t base = begin + lane * 4; base < end; base += kChunk) {
            Lane l;
            compute_chunk<M8, V16, MASTER>(c, s, p, base, count(base), f, coef, clip, old, param_inv, l);
#pragma unroll
            for (int q = 0; q < 4; ++q) param_amax = max(param_amax, amax_bits_of(l.w[q]));
            if (l.n > 0) store_chunk<M8, V16, MASTER>(c, p, base, l, ns, param_scale, key);
        }
    });
    }
    flush_param();

    // ---- phase 3: the metas of scaled parameters; per-tensor state scales ----
    if (!c.has_param_metas && !(per_tensor && (M8 || V16 || MASTER))) return;
    grid.sync();
    fold_param_metas<M8, V16, MASTER>(c, warp, warps, lane);
}

}  // namespace

namespace adam_launch {

template <bool M8, bool V16, bool MASTER>
void launch_generic(int device, cudaStream_t stream, const adam::StepConfig &c, int max_partials) {
    launch_cooperative(adam_kernel<M8, V16, MASTER>, device, stream, c, max_partials);
}

// Every state layout: m F32/E4M3, v F32/F16, master or not.
template void launch_generic<false, false, false>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<false, false, true>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<false, true, false>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<false, true, true>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<true, false, false>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<true, false, true>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<true, true, false>(int, cudaStream_t, const adam::StepConfig &, int);
template void launch_generic<true, true, true>(int, cudaStream_t, const adam::StepConfig &, int);

}  // namespace adam_launch
}  // namespace fp8amp::kernels::cuda
