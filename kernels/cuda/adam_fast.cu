// The fast Adam/AdamW kernel. Used when the state blocks are 128 elements, or one scale per tensor
// (O2/O3 layouts: phase 1b, a pass for each tensor's new amax, then the update with those scales), or
// no state is block-scaled (O1), and every parameter's (param dtype, grad dtype) pair is in FastPairs
// below, all with a master or none; otherwise the generic kernel (adam_generic.cu) runs. The same
// three phases (adam.cu) and the same arithmetic (kernels/adam.hpp, bit-identical to
// kernels/cpu/adam.cpp); what differs is the cost per element (docs/performance.md, "Adam"):
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
#include <cooperative_groups.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "adam.hpp"
#include "adam_common.cuh"
#include "adam_div.cuh"
#include "adam_launch.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda {
namespace {

using namespace adam_common;  // the warp constants, grad_factor, find_param, end_check, fold_param_metas

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

constexpr int kF32 = FP8AMP_DTYPE_F32, kF16 = FP8AMP_DTYPE_F16, kBF16 = FP8AMP_DTYPE_BF16,
              kE4M3 = FP8AMP_DTYPE_E4M3, kE5M2 = FP8AMP_DTYPE_E5M2;
constexpr int pair_code(int pd, int gd) { return pd * 5 + gd; }

// The pairs each state layout has a fast path for.
template <bool M8, bool V16, bool MASTER> struct FastPairs;
// (F32, E4M3) is the PyTorch front's O1/O2 Linear weight (F32 parameter, E4M3 gradient); without it
// a whole GPT step's optimizer fell back to the generic kernel (1.9 ms against about 1.2 at d = 2048).
template <> struct FastPairs<false, false, false> {  // O1: F32 m and v
    static constexpr int codes[] = {pair_code(kF32, kF32), pair_code(kF32, kE4M3), pair_code(kF16, kE4M3),
                                    pair_code(kBF16, kE4M3), pair_code(kBF16, kBF16)};
};
template <> struct FastPairs<true, true, false> {  // O2: E4M3 m, F16 v
    static constexpr int codes[] = {pair_code(kBF16, kE4M3), pair_code(kF16, kE4M3), pair_code(kF32, kF32),
                                    pair_code(kF32, kE4M3), pair_code(kBF16, kBF16)};
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
    static constexpr int GB = dtype_size(GD), PB = dtype_size(PD);
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

template <int ESIZE, bool GUARD, Cache K>
__device__ __forceinline__ Bits<8 * ESIZE> load8(const uint8_t *ptr, int n) {
    if constexpr (GUARD) {
        Bits<8 * ESIZE> b;
        load_elements<8, ESIZE>(ptr, n, b.w);
        return b;
    } else {
        return load_vec<8 * ESIZE, K>(ptr);
    }
}
template <int ESIZE, bool GUARD, Cache K>
__device__ __forceinline__ void store8(uint8_t *ptr, const Bits<8 * ESIZE> &b, int n) {
    if constexpr (GUARD) store_elements<8, ESIZE>(ptr, n, b.w);
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

// 8 values -> 8 codes of DT. FAST: the pair conversions (values finite, or for BF16/unscaled F16 not
// NaN, and within range where the format saturates); else the per-element encoders (CPU rules).
// The exact encoders of 8 values (the CPU codec's rules, NaN with its sign): not inlined, they run
// only for blocks or lanes holding inf/NaN.
template <int DT>
__device__ __noinline__ Bits<8 * dtype_size(DT)> encode8_exact(float x0, float x1, float x2, float x3, float x4, float x5,
                                                            float x6, float x7) {
    const float x[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
    Bits<8 * dtype_size(DT)> b;
#pragma unroll
    for (int k = 0; k < 2 * dtype_size(DT); ++k) b.w[k] = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if constexpr (DT == kE4M3) b.w[j / 4] |= uint32_t(from_f32<FP8AMP_DTYPE_E4M3>(x[j])) << (8 * (j % 4));
        else if constexpr (DT == kBF16) b.w[j / 2] |= uint32_t(from_f32<FP8AMP_DTYPE_BF16>(x[j])) << (16 * (j % 2));
        else b.w[j / 2] |= uint32_t(from_f32<FP8AMP_DTYPE_F16>(x[j])) << (16 * (j % 2));
    }
    return b;
}

template <int DT>
__device__ __forceinline__ Bits<8 * dtype_size(DT)> encode8(const float x[8], bool fast) {
    Bits<8 * dtype_size(DT)> b;
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
    bool sr;                    // BF16 codes rounded stochastically (no master: the value of record)
    uint64_t key;               // its rounding_key_at in this step (sr)
    bool pt;                    // per-tensor state scales (state_block_size 0): one scale_inv each, at [0]
    uint32_t am, av, aw;        // pt, the update: the tensor's new amax of m, v, master (phase 1b's)
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
    const uint32_t si = s.pt ? 0u : blk;
    r.m_inv = C::M8 ? s.m_si[si] : 1.0f;
    r.v_inv = C::V16 ? s.v_si[si] : 1.0f;
    r.w_inv = C::MASTER ? s.w_si[si] : 1.0f;
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

// e: the index of the lane's first element in the parameter (the stochastic BF16 codes' random bits).
template <class C, bool GUARD, bool FAST>
__device__ __forceinline__ void compute8(const Consts &k, const Seg &s, const Raw8<C> &r, uint32_t e, int n, New8<C> &o) {
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
                if (!C::MASTER && s.sr)  // kernels/adam.hpp bf16_code_stochastic, from each element's bits: the CPU's bytes
                    o.p[j / 2] = uint32_t(bf16_code_stochastic(wk[0], rounding_bits(s.key, e + j - 1))) |
                                 uint32_t(bf16_code_stochastic(w, rounding_bits(s.key, e + j))) << 16;
                else
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
    compute8<C, GUARD, false>(k, s, r, e, n, o);
}

// One lane's 8 elements of block `blk` (first element e): update, block scales, stores. hi: the
// lane is in the upper half-warp; lead: the half's first lane (writes the block's scales, and only
// where they changed: a power of two that most blocks keep from step to step, so that most lines of
// the scale arrays stay clean and are never written back; the same bytes either way). wseg: the
// lane's amax of its new weights over the segment (scaled parameters' metas).
// The new values of one lane's 8 elements, by the fast path where its conditions hold, else by the
// reference path.
template <class C, bool GUARD>
__device__ __forceinline__ void new8(const Consts &k, const Seg &s, const Raw8<C> &r, uint32_t e, uint32_t blk, int n,
                                     New8<C> &o) {
    compute8<C, GUARD, true>(k, s, r, e, n, o);
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
}

// Per-tensor mode, phase 1b: a lane's amax of the new m, v and master over the elements it visits
// (NaN-propagating, as the update's block amax).
struct LaneAmax {
    float m = 0.0f, v = 0.0f, w = 0.0f;
};

// The scale of the state's elements: their block's (the half-warp's amax) or, per-tensor, the
// tensor's amax from phase 1b. Every lane of the warp calls it (half_max is warp-wide; s.pt is the
// same for the whole warp).
__device__ __forceinline__ uint32_t state_amax(const Seg &s, uint32_t tensor_amax, float lane_amax, bool hi) {
    return s.pt ? tensor_amax : half_max(__float_as_uint(lane_amax), hi);
}

template <class C, bool GUARD>
__device__ __forceinline__ void update8(const Consts &k, const Seg &s, const Raw8<C> &r, uint32_t e, uint32_t blk, int n,
                                        bool hi, bool lead, float &wseg) {
    New8<C> o;
    new8<C, GUARD>(k, s, r, e, blk, n, o);
    // a block's scale_inv is stored here by the half's lead lane; per-tensor scales only in phase 3
    // (other warps still read the old one)
    lead = lead && !s.pt;
    if (C::WAMAX) wseg = max_abs_nan(wseg, o.aw);
    if (C::M8) {
        const uint32_t a = state_amax(s, s.am, o.am, hi);
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
        const uint32_t a = state_amax(s, s.av, o.av, hi);
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
        const uint32_t a = state_amax(s, s.aw, o.aw, hi);
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

// One lane's 8 elements: the update (AMAX false) or, per-tensor phase 1b, only their new amax into acc.
template <class C, bool GUARD, bool AMAX>
__device__ __forceinline__ void visit8(const Consts &k, const Seg &s, const Raw8<C> &r, uint32_t e, uint32_t blk, int n,
                                       bool hi, bool lead, float &wseg, LaneAmax &acc) {
    if constexpr (AMAX) {
        New8<C> o;
        new8<C, GUARD>(k, s, r, e, blk, n, o);
        acc.m = max_abs_nan(acc.m, o.am);
        acc.v = max_abs_nan(acc.v, o.av);
        if (C::MASTER) acc.w = max_abs_nan(acc.w, o.aw);
    } else {
        update8<C, GUARD>(k, s, r, e, blk, n, hi, lead, wseg);
    }
}

// The update (AMAX: phase 1b's amax) over global chunks [x, xend) of parameter s (chunks are numbered across parameters:
// s's are [pb, pb + its chunk count); pairs of chunks start at even numbers, the lower half-warp
// taking the first, the upper the second). x is even, or odd when its pair's first chunk belonged
// to the parameter before (or to the empty rest of its last unit). Returns where it stopped: xend, the end of s's chunks, or the odd second
// chunk of a pair cut by s's end (taken with the next parameter).
template <class C, bool AMAX>
__device__ __forceinline__ int64_t run_pairs(const Consts &k, const Seg &s, int64_t x, int64_t pb, int64_t xend, bool vec,
                                             int lane, float &wseg, LaneAmax &acc) {
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
                visit8<C, false, AMAX>(k, s, a, blk * kChunk + lane_off, blk, 8, hi, lead, wseg, acc);
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
        visit8<C, true, AMAX>(k, s, r, e, b1, n, hi, lead, wseg, acc);
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
// pt: per-tensor state scales; amax: the tensor's new amaxes are final (after phase 1b's grid sync).
__device__ __forceinline__ Seg make_seg(const StepConfig &c, const Param &p, int kk, float loss_scale_inv, uint64_t key,
                                        bool pt, bool amax) {
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
    s.sr = c.master_stochastic && p.master == nullptr;
    s.key = key;
    s.pt = pt;
    s.am = s.av = s.aw = 0;
    if (pt && amax) s.am = c.tensor_amax[3 * kk + 0], s.av = c.tensor_amax[3 * kk + 1], s.aw = c.tensor_amax[3 * kk + 2];
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
    constexpr int GB = dtype_size(GD), V = 16 / GB;  // elements per lane per 16-byte load
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

// PT: per-tensor state scales (state_block_size 0, MS-AMP's layout; O2 and O3 layouts): a separate
// instantiation, so that the block-scaled kernels carry none of phase 1b's code or registers.
template <bool M8, bool V16, bool MASTER, bool L2, bool CLIP, bool PT>
__global__ void __launch_bounds__(kThreads, kFastMinBlocks) adam_fast_kernel(const __grid_constant__ StepConfig c) {
    cg::grid_group grid = cg::this_grid();
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * kWarps;
    // Units are state blocks (block mode) or 128-element chunks (per-tensor mode, no scaled state).
    const int64_t unit_elems = c.block_size > 0 ? c.block_size : kChunk;
    constexpr bool pt = PT;
    const int64_t ub = c.total_units * warp / warps, ue = c.total_units * (warp + 1) / warps;

    // Read before the first grid sync; CTA 0 rewrites them after it.
    const int64_t step = c.status->step;
    const float loss_scale_inv = c.scaler ? fdiv(1.0f, c.scaler->scale) : 1.0f;

    // ---- phase 1: the sum of squares (inf/NaN if any gradient is not finite) ----
    if (pt)  // phase 1b's accumulators, first used after end_check's grid sync
        for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < 3 * int64_t(c.nparams);
             i += int64_t(gridDim.x) * kThreads)
            c.tensor_amax[i] = 0;
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
    // chunks of 128 elements: units are 128 (scaled state) or multiples of it (O1)
    const int64_t per = unit_elems / kChunk;
    const int64_t total_chunks = c.total_units * per;
    const int64_t pairs = (total_chunks + 1) / 2;
    // Chunks [x, xend), parameter by parameter (chunks are numbered across parameters: parameter k's
    // start at params[k].unit_begin * per): the update, or (AMAX) phase 1b's amax of the new state.
    const auto run_range = [&](int64_t x, int64_t xend, auto amax_pass) {
        constexpr bool AMAX = decltype(amax_pass)::value;
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
            const Seg s = make_seg(c, p, kk, loss_scale_inv,
                                   c.master_stochastic ? rounding_key_at(c.rounding_seed, step + 1, kk, p.element_offset)
                                                       : uint64_t(0),
                                   pt, !AMAX);
            float wseg = 0.0f;
            LaneAmax acc;
            dispatch_pairs<M8, V16, MASTER, L2, CLIP>(p.param_dtype * 5 + p.grad_dtype, [&](auto cfg) {
                x = run_pairs<decltype(cfg), AMAX>(k, s, x, pb, xend, p.vec_ok != 0, lane, wseg, acc);
            });
            if constexpr (AMAX) {
                // non-negative floats (NaN: 0x7FFFFFFF) order as their bits
                const uint32_t am = __reduce_max_sync(kFull, __float_as_uint(acc.m));
                const uint32_t av = __reduce_max_sync(kFull, __float_as_uint(acc.v));
                const uint32_t aw = __reduce_max_sync(kFull, __float_as_uint(acc.w));
                if (lane == 0) {
                    atomicMax(&c.tensor_amax[3 * kk + 0], am);
                    atomicMax(&c.tensor_amax[3 * kk + 1], av);
                    if (MASTER) atomicMax(&c.tensor_amax[3 * kk + 2], aw);
                }
            } else if (s.meta) {
                record_weight_amax(p, wseg, lane);
            }
        }
    };

    // ---- phase 1b (per-tensor state scales): every tensor's new amax of m, v, master ----
    // The update computed once more, nothing stored (m, v and the master are read twice: MS-AMP's
    // layout costs a pass; docs/performance.md). Equal warp shares of the pairs.
    if (pt) {
        run_range(2 * (pairs * warp / warps), min(total_chunks, 2 * (pairs * (warp + 1) / warps)), std::true_type{});
        grid.sync();
    }

    // ---- phase 2: the update ----
    {
        // Each warp its own contiguous share of the first 90% of the pairs, then runs of kRun pairs
        // of the rest, taken in turn from a counter: warps do not all stream at the same rate, and
        // with fixed shares alone the first warps finished their update about 10% of the step before
        // the last (H100; docs/performance.md, "Fifth round").
        constexpr int64_t kRun = 16, kFixedPercent = 90;
        const int64_t fixed = pairs * kFixedPercent / 100;
        int64_t x = 2 * (fixed * warp / warps), xend = min(total_chunks, 2 * (fixed * (warp + 1) / warps));
        for (;;) {
            run_range(x, xend, std::false_type{});
            uint32_t r = 0;
            if (lane == 0) r = atomicAdd(&c.partials[0].next_run, 1u);
            r = __shfl_sync(kFull, r, 0);
            const int64_t p0 = fixed + int64_t(r) * kRun;
            if (p0 >= pairs) break;
            x = 2 * p0, xend = min(total_chunks, 2 * (p0 + kRun));
        }
    }

    // ---- phase 3: the metas of scaled parameters; per-tensor state scales ----
    if (!c.has_param_metas && !pt) return;
    grid.sync();
    fold_param_metas<M8, V16, MASTER>(c, warp, warps, lane);
}

// The kernel for weight-decay form l2 and clipping clip.
template <bool M8, bool V16, bool MASTER, bool PT>
void launch_variant(int device, cudaStream_t stream, const adam::StepConfig &c, int max_partials, bool l2, bool clip) {
    if (l2) {
        if (clip) adam_launch::launch_cooperative(adam_fast_kernel<M8, V16, MASTER, true, true, PT>, device, stream, c, max_partials);
        else adam_launch::launch_cooperative(adam_fast_kernel<M8, V16, MASTER, true, false, PT>, device, stream, c, max_partials);
    } else {
        if (clip) adam_launch::launch_cooperative(adam_fast_kernel<M8, V16, MASTER, false, true, PT>, device, stream, c, max_partials);
        else adam_launch::launch_cooperative(adam_fast_kernel<M8, V16, MASTER, false, false, PT>, device, stream, c, max_partials);
    }
}
}  // namespace

namespace adam_launch {

template <bool M8, bool V16, bool MASTER>
bool launch_fast(int device, cudaStream_t stream, const adam::StepConfig &c, int max_partials) {
    constexpr bool kFastLayout = (M8 == V16) && (V16 || !MASTER) && (M8 || !MASTER);  // O1, O2, O3 layouts
    if constexpr (kFastLayout) {
        // blocks of 128, one scale per tensor (phase 1b), or no scaled state (O1)
        const bool blocks_ok = c.block_size == adam::kChunk || c.block_size == 0 || !(M8 || V16 || MASTER);
        const bool pairs_ok = (c.pair_mask & ~fast_pair_mask<M8, V16, MASTER>()) == 0;
        // The fast kernel computes element indices and byte offsets in 32 bits (index x element
        // size): below 2^30 elements per parameter where any array has 4-byte elements (F32 m and v,
        // or F32 params and grads), below 2^31 otherwise. Larger parameters take the generic kernel.
        const bool four_byte = !(M8 && V16) ||
                               (c.pair_mask & ((1u << pair_code(kF32, kF32)) | (1u << pair_code(kF32, kE4M3)))) != 0;
        const bool size_ok = c.max_numel < (int64_t(1) << (four_byte ? 30 : 31));
        // Every parameter with a master copy or none; stochastic rounding only of BF16 parameters
        // without masters (O1/O2 layouts): the generic kernel takes mixed masters, stochastic masters
        // and stochastic F16 parameters (kernels/adam.hpp master_code_stochastic).
        const uint32_t f16_params = 0x1Fu << (kF16 * 5);  // pair codes (F16, any gradient dtype)
        const bool master_ok = !c.mixed_master && (!c.master_stochastic || (!MASTER && (c.pair_mask & f16_params) == 0));
        if (blocks_ok && pairs_ok && size_ok && master_ok && FP8AMP_ADAM_FAST) {
            const bool l2 = !c.adamw && c.weight_decay != 0.0f, clip = c.max_grad_norm > 0.0f;
            const bool pt = M8 && c.block_size == 0;
            if constexpr (M8) {
                if (pt) {
                    launch_variant<M8, V16, MASTER, true>(device, stream, c, max_partials, l2, clip);
                    return true;
                }
            }
            launch_variant<M8, V16, MASTER, false>(device, stream, c, max_partials, l2, clip);
            return true;
        }
    }
    return false;
}

template bool launch_fast<false, false, false>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<false, false, true>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<false, true, false>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<false, true, true>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<true, false, false>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<true, false, true>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<true, true, false>(int, cudaStream_t, const adam::StepConfig &, int);
template bool launch_fast<true, true, true>(int, cudaStream_t, const adam::StepConfig &, int);

}  // namespace adam_launch
}  // namespace fp8amp::kernels::cuda
