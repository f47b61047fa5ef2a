// Adam/AdamW with low-precision state: the data both backends share (the parameter list as it lives
// in device memory, the per-step configuration, the device-side status and loss-scaler state) and
// the element arithmetic, written once for host and device so that the CPU reference and the CUDA
// kernel do the same float32 operations in the same order (bit-identical results; see
// docs/numerics.md "Optimizer"). Every float operation goes through fmul/fadd/fsub/fdiv/fsqrt below:
// on the device they are the round-to-nearest intrinsics, which nvcc never contracts into an FMA;
// on the host the file that includes this is compiled with -ffp-contract=off.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"
#include "rounded.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::adam {

constexpr int kChunk = 128;  // elements per warp iteration (32 lanes x 4); state blocks are multiples

// The largest step count a checkpoint may hold (fp8amp_optimizer_load refuses more). Each step adds
// one to the count (step + 1 in both backends' int64 arithmetic), so from here it would take another
// 2^62 steps -- over 100,000 years at a million steps a second -- to overflow.
constexpr int64_t kMaxStep = int64_t(1) << 62;

// One registered parameter, as the step reads it. All pointers are device (CPU backend: host) memory.
struct Param {
    void *param;
    const void *grad;
    void *m;                  // exp_avg data (F32 or E4M3)
    float *m_scale_inv;       // per-block (or per-tensor) scale_inv of m; null for F32 m
    void *v;                  // exp_avg_sq data (F32 or F16)
    float *v_scale_inv;
    void *master;             // F16 master copy (O3) or null
    float *master_scale_inv;
    float *param_scale_inv;   // the param tensor's scale_inv slot (scaled params) or null
    ScalingState *param_meta; // the param's meta (scaled params) or null
    const float *grad_scale_inv;     // an FP8 gradient tensor's scale_inv slot, or null (scale 1)
    const ScalingState *grad_meta;   // an FP8 gradient's meta, or null
    int64_t numel;
    int64_t unit_begin;       // index of this parameter's first work unit in the global list
    int64_t scale_begin;      // index of its first block scale in the optimizer-wide scale arrays
    int32_t param_dtype;      // fp8amp_dtype
    int32_t grad_dtype;
    int32_t vec_ok;           // param and grad are 16-byte aligned: whole chunks load as vectors
    int32_t pad_;
    // The index of element 0 in the full parameter, for stochastic rounding: a sharded optimizer's
    // shard (core/optimizer_shard.cpp) draws the bits of the unsharded element (rounding_key_at).
    int64_t element_offset;
};

// Device-side results of the steps. Written only by the step (and load / the getters' readers).
struct Status {
    int64_t step;       // steps taken (skipped ones not counted)
    int32_t found_inf;  // 1: the last step saw a non-finite gradient and changed nothing
    float grad_norm;    // global L2 norm of the unscaled gradients of the last step, before clipping
};

// Loss scaler state (device memory) and its configuration (host values passed by value).
struct ScalerState {
    float scale;
    int32_t growth_tracker;
    int32_t hysteresis_left;
    int32_t pad_;
};
struct ScalerConfig {
    float growth_factor;
    float backoff_factor;
    int32_t growth_interval;
    int32_t hysteresis;
};

// Per-CTA (CPU: one) partial results of the gradient check.
struct Partial {
    double sumsq;
    int32_t bad;
    uint32_t next_run;  // CTA 0's: the CUDA update's next run of pairs to take
};

// Everything one step needs, passed by value to the kernel.
struct StepConfig {
    const Param *params;
    int32_t nparams;
    int32_t block_size;      // elements per state scale; 0: one scale per tensor
    int64_t total_units;     // work units: state blocks (per-tensor mode: 128-element chunks)
    int32_t m_fp8;           // m in E4M3 (else F32)
    int32_t v_f16;           // v in F16 (else F32)
    int32_t has_master;      // some parameter has a master copy (Param::master not null)
    int32_t mixed_master;    // ... and some has none (the CUDA fast kernel takes neither case)
    int32_t master_stochastic; // FP8AMP_MASTER_ROUND_STOCHASTIC: masters rounded by master_code_stochastic,
                               // BF16/F16 parameters without one by bf16_code_stochastic / f16_param_code_stochastic
    uint32_t rounding_seed;
    int32_t adamw;
    int32_t maximize;
    int32_t has_param_metas; // some parameter is scaled: its meta is folded after the update
    uint32_t pair_mask;      // bit (param_dtype * 5 + grad_dtype) set for every pair present (CUDA picks its kernel)
    int64_t max_numel;       // the largest parameter's element count
    float lr;
    const float *lr_device;  // overrides lr when set
    float beta1, beta2, eps, weight_decay;
    float max_grad_norm;     // 0: no clipping
    float grad_scale_inv;
    Status *status;
    ScalerState *scaler;     // or null
    ScalerConfig scaler_config;
    Partial *partials;       // CUDA: one per CTA
    uint32_t *tensor_amax;   // per-tensor mode: 3 per parameter (m, v, master), amax bits
};

// ---- arithmetic shared by both backends: float32 operations each rounded once (rounded.hpp) ----
using rounded::fadd;
using rounded::fdiv;
using rounded::fmul;
using rounded::fsqrt;
using rounded::fsub;

// beta^n by binary exponentiation in double: only IEEE multiplications, so both backends agree
// (library pow() implementations differ in their last bits).
FP8AMP_HD double pow_int(double beta, int64_t n) {
    double result = 1.0, base = beta;
    while (n > 0) {
        if (n & 1) result = result * base;
        base = base * base;
        n >>= 1;
    }
    return result;
}

// The scalars of step number `step` (1-based, the step being taken), as torch computes them in
// double on the host and rounds to float32 when they meet a float32 tensor.
struct StepScalars {
    float step_size;       // lr / (1 - beta1^step)
    float bc2_sqrt;        // sqrt(1 - beta2^step)
    float decay;           // 1 - lr * weight_decay (AdamW)
    float one_minus_beta1; // 1 - beta1 (lerp weight)
    float one_minus_beta2;
};

FP8AMP_HD StepScalars step_scalars(const StepConfig &c, float lr, int64_t step) {
    StepScalars s;
    const double bc1 = 1.0 - pow_int(static_cast<double>(c.beta1), step);
    const double bc2 = 1.0 - pow_int(static_cast<double>(c.beta2), step);
    s.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
    s.bc2_sqrt = static_cast<float>(sqrt(bc2));
    s.decay = static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<double>(c.weight_decay));
    s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(c.beta1));
    s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(c.beta2));
    return s;
}

// The gradient-norm clipping factor (max_norm > 0), torch.nn.utils.clip_grad_norm_'s:
// min(1, max_norm / (norm + 1e-6)) in float32.
FP8AMP_HD float clip_coefficient(float max_norm, float norm) {
    const float coef = fdiv(max_norm, fadd(norm, 1e-6f));
    return coef > 1.0f ? 1.0f : coef;
}

// One element of Adam/AdamW in float32, torch.optim's order of operations (non-capturable,
// non-fused path): g is the unscaled, clipped gradient; p, m, v are updated in place.
//
// The CUDA fast kernel (kernels/cuda/adam_fast.cu) does the same operations with two exact rewrites:
// it folds maximize into the unscale factor (rn(d * -f) = -rn(d * f), RNE is symmetric), and it
// specializes the weight-decay branch at compile time.
FP8AMP_HD void adam_element(const StepConfig &c, const StepScalars &s, float g, float &p, float &m, float &v) {
    if (c.maximize) g = -g;
    if (c.adamw) {
        p = fmul(p, s.decay);
    } else if (c.weight_decay != 0.0f) {
        g = fadd(g, fmul(c.weight_decay, p));
    }
    m = fadd(m, fmul(s.one_minus_beta1, fsub(g, m)));          // exp_avg.lerp_(grad, 1 - beta1)
    v = fadd(fmul(v, c.beta2), fmul(fmul(s.one_minus_beta2, g), g));  // mul_(beta2).addcmul_(g, g, 1-beta2)
    const float denom = fadd(fdiv(fsqrt(v), s.bc2_sqrt), c.eps);
    p = fsub(p, fmul(s.step_size, fdiv(m, denom)));            // addcdiv_(m, denom, -step_size)
}

// Block scales are powers of two (exact scaling, identical on both backends): the largest 2^k with
// amax * 2^k <= fmax, k limited to [-126, 126] so that scale and scale_inv are normal floats. An amax
// of 0 (or not finite: never stored, the step is skipped) gives scale 1.
FP8AMP_HD int pow2_exponent(float amax, float fmax) {
    const uint32_t a = codec::f32_bits(amax) & 0x7FFFFFFFu;
    if (a == 0 || a >= 0x7F800000u) return 0;
    const uint32_t f = codec::f32_bits(fmax);
    int ea, ma_le;
    if (a < 0x00800000u) {
        // subnormal amax: < 2^-126, so k is at least 126 + exponent of fmax; clamp handles it
        return 126;
    }
    ea = static_cast<int>(a >> 23) - 127;
    const int ef = static_cast<int>(f >> 23) - 127;
    ma_le = (a & 0x7FFFFFu) <= (f & 0x7FFFFFu);  // mantissa of amax <= mantissa of fmax
    int k = ef - ea - (ma_le ? 0 : 1);
    if (k > 126) k = 126;
    if (k < -126) k = -126;
    return k;
}
FP8AMP_HD float pow2(int k) { return codec::bits_f32(static_cast<uint32_t>(127 + k) << 23); }

constexpr float kE4M3Max = 448.0f;
constexpr float kF16Max = 65504.0f;

// Decoding and encoding of one element by runtime dtype (parameters and gradients).
FP8AMP_HD float load_value(const void *base, int32_t dtype, int64_t i) {
    switch (dtype) {
    case FP8AMP_DTYPE_F32: return static_cast<const float *>(base)[i];
    case FP8AMP_DTYPE_F16: return codec::decode<codec::F16>(static_cast<const uint16_t *>(base)[i]);
    case FP8AMP_DTYPE_BF16: return codec::decode<codec::BF16>(static_cast<const uint16_t *>(base)[i]);
    case FP8AMP_DTYPE_E4M3: return codec::decode<codec::E4M3>(static_cast<const uint8_t *>(base)[i]);
    default: return codec::decode<codec::E5M2>(static_cast<const uint8_t *>(base)[i]);
    }
}

// ---- stochastic rounding of the master copy (FP8AMP_MASTER_ROUND_STOCHASTIC) --------------------
// The random bits are a pure function of (seed, step, parameter index, element index) -- a
// counter-based generator, no state -- so the CPU and every CUDA grid shape draw the same bits for
// the same element, and the bytes stay identical. The mixer is SplitMix64's finalizer (Steele, Lea,
// Flood 2014; the 64-bit MurmurHash3 fmix with better constants): integer operations only.
FP8AMP_HD uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio: SplitMix64's increment

// The key of one parameter in one step (step: the 1-based number of the step being taken).
FP8AMP_HD uint64_t rounding_key(uint32_t seed, int64_t step, int32_t param_index) {
    const uint64_t a = mix64(static_cast<uint64_t>(seed) * kGolden + static_cast<uint64_t>(step));
    return mix64(a ^ (static_cast<uint64_t>(static_cast<uint32_t>(param_index)) * kGolden + 0x632BE59BD9B4E019ull));
}
// The key of a parameter's elements counted from `offset`: rounding_bits(rounding_key_at(..., o), i)
// is rounding_bits(rounding_key(...), o + i) (the bits depend on key + i * kGolden, modulo 2^64).
FP8AMP_HD uint64_t rounding_key_at(uint32_t seed, int64_t step, int32_t param_index, int64_t offset) {
    return rounding_key(seed, step, param_index) + static_cast<uint64_t>(offset) * kGolden;
}
// 24 random bits for element i of the parameter whose key this is.
FP8AMP_HD uint32_t rounding_bits(uint64_t key, int64_t i) {
    return static_cast<uint32_t>(mix64(key + static_cast<uint64_t>(i) * kGolden) >> 40);
}

// The F16 code of x (already multiplied by its block scale, so |x| <= 65504, finite) rounded
// stochastically: of the two F16 values lo <= |x| < hi around it, hi with probability
// (|x| - lo) / (hi - lo), from 24 random bits r (up when r * 2^-24 < that fraction). Every step is
// exact: lo is |x| truncated to F16, |x| - lo is exact (both lie in one binade of F16's grid, which is
// coarser than float32's), hi - lo is a power of two, and so is the division by it. For a normal
// F16 the fraction has at most 13 bits, so the probability is exactly the fraction; below F16's
// normals (|x| < 2^-14) it is within 2^-24 of it. E[decode(code)] = x: updates far below half an
// ulp still move the master in expectation (docs/numerics.md 6.3).
FP8AMP_HD uint16_t master_code_stochastic(float x, uint32_t r) {
    const uint32_t sign = (codec::f32_bits(x) >> 16) & 0x8000u;
    const float a = codec::bits_f32(codec::f32_bits(x) & 0x7FFFFFFFu);
    uint32_t mag = codec::encode<codec::F16, true>(a) & 0x7FFFu;  // nearest; one below if above a
    float lo = codec::decode<codec::F16>(static_cast<uint16_t>(mag));
    if (lo > a) {
        mag -= 1;
        lo = codec::decode<codec::F16>(static_cast<uint16_t>(mag));
    }
    const float rest = fsub(a, lo);
    if (rest > 0.0f) {  // then lo < 65504 and mag + 1 is a finite code
        const float ulp = fsub(codec::decode<codec::F16>(static_cast<uint16_t>(mag + 1)), lo);
        const float frac = fdiv(rest, ulp);  // in (0, 1), exact
        if (fmul(static_cast<float>(r), 0x1p-24f) < frac) mag += 1;
    }
    return static_cast<uint16_t>(sign | mag);
}

// A parameter without a master copy is its own value of record: under FP8AMP_MASTER_ROUND_STOCHASTIC
// its BF16 or F16 codes are rounded stochastically too, from the same bits (else an update below
// half its ulp -- 2^-9 relative for BF16 -- is lost, and so is every weight-decay term; numerics.md
// 6.3). BF16: the 16 bits of x below BF16's last place plus 16 random bits carry into that place
// with probability (those bits) / 2^16, exactly the distance to the lower neighbour over the ulp
// (normal or subnormal alike: BF16 is float32's upper half). Inf and NaN keep the nearest code; a
// finite x above BF16's largest value may round up to inf, as BF16 parameters overflow (nearest
// takes x >= 0x7F7F8000 there).
FP8AMP_HD uint16_t bf16_code_stochastic(float x, uint32_t r) {
    const uint32_t b = codec::f32_bits(x);
    if ((b & 0x7F800000u) == 0x7F800000u) return static_cast<uint16_t>(codec::encode<codec::BF16, false>(x));
    return static_cast<uint16_t>((b + (r >> 8)) >> 16);  // |x|'s bits + 0xFFFF at most: no carry into the sign
}
// An F16 parameter's code (x already multiplied by a scaled parameter's scale): stochastic like the
// master where |x| <= 65504, else the nearest rule of its kind (saturating for scaled F16, inf for
// unscaled; NaN stays NaN).
FP8AMP_HD uint16_t f16_param_code_stochastic(float x, bool saturate, uint32_t r) {
    if (fabsf(x) <= 65504.0f) return master_code_stochastic(x, r);
    return static_cast<uint16_t>(saturate ? codec::encode<codec::F16, true>(x) : codec::encode<codec::F16, false>(x));
}

// Scaler update from one step's found_inf (torch GradScaler + Megatron hysteresis).
FP8AMP_HD void scaler_update(ScalerState &s, const ScalerConfig &c, bool found_inf) {
    if (found_inf) {
        s.growth_tracker = 0;
        s.hysteresis_left -= 1;
        if (s.hysteresis_left <= 0) {
            float next = fmul(s.scale, c.backoff_factor);
            if (next < FLT_MIN) next = FLT_MIN;  // keep 1/scale finite
            s.scale = next;
            s.hysteresis_left = 0;
        }
    } else {
        s.growth_tracker += 1;
        if (s.growth_tracker >= c.growth_interval) {
            const float next = fmul(s.scale, c.growth_factor);
            if (next <= FLT_MAX) s.scale = next;  // torch: grow only to a finite scale
            s.growth_tracker = 0;
            s.hysteresis_left = c.hysteresis;
        }
    }
}

}  // namespace fp8amp::kernels::adam
