// Exact software codecs between float32 and the 16- and 8-bit formats, usable on host and device.
//
// One template serves E4M3, E5M2, F16 and BF16, so every format rounds by the same rule: to nearest,
// ties to even, by integer arithmetic on the float32 bit pattern (no dependence on the floating-point
// rounding mode). FP8 encodes saturate (inf and out-of-range values become +-max, as PTX's
// cvt.rn.satfinite does); F16/BF16 encodes overflow to inf. Every NaN becomes the destination's
// canonical quiet NaN with the input's sign. Decoding is exact (every value of these formats is a
// float32). The CPU kernels use these functions throughout. The CUDA kernels decode with them and
// encode with the hardware conversions (cvt.rn.satfinite for FP8, __float2half_rn/__float2bfloat16_rn),
// mapping NaN to the canonical code explicitly; the tests check the two bit for bit over every
// 8- and 16-bit input.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8AMP_HD __host__ __device__ __forceinline__
#else
#define FP8AMP_HD inline
#endif

namespace fp8amp::codec {

FP8AMP_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
#endif
}

FP8AMP_HD float bits_f32(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float x;
    std::memcpy(&x, &b, sizeof x);
    return x;
#endif
}

// A binary floating-point format with E exponent bits, M mantissa bits and a sign bit.
// kIeee: the all-ones exponent encodes inf/NaN (F16, BF16, E5M2). E4M3 ("fn") is not IEEE: it has no
// infinities, and only S.1111.111 is NaN, so its largest finite value is S.1111.110 = 448.
template <int E, int M, bool kIeee>
struct Format {
    static constexpr int kExpBits = E;
    static constexpr int kManBits = M;
    static constexpr int kBias = (1 << (E - 1)) - 1;
    static constexpr bool kIsIeee = kIeee;
    static constexpr uint32_t kSignShift = E + M;
    static constexpr uint32_t kMagMask = (1u << (E + M)) - 1;
    static constexpr uint32_t kInf = ((1u << E) - 1) << M;  // meaningful for IEEE formats only
    static constexpr uint32_t kMaxFinite = kIeee ? kInf - 1 : kMagMask - 1;
    static constexpr uint32_t kQuietNaN = kIeee ? (kInf | (1u << (M - 1))) : kMagMask;
};

using E4M3 = Format<4, 3, false>;  // max 0x7E = 448, NaN 0x7F
using E5M2 = Format<5, 2, true>;   // max 0x7B = 57344, inf 0x7C, quiet NaN 0x7E
using F16 = Format<5, 10, true>;   // max 0x7BFF = 65504, inf 0x7C00, quiet NaN 0x7E00
using BF16 = Format<8, 7, true>;   // max 0x7F7F, inf 0x7F80, quiet NaN 0x7FC0

constexpr uint32_t kF32QuietNaN = 0x7FC00000u;

// Rounds the low `shift` bits away from `value`, to nearest, ties to even (1 <= shift <= 31).
FP8AMP_HD uint32_t round_shift_rne(uint32_t value, int shift) {
    const uint32_t base = value >> shift;
    const uint32_t rem = value & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    return base + ((rem > half || (rem == half && (base & 1u))) ? 1u : 0u);
}

// float32 -> code of format F. kSaturate: values beyond the largest finite (inf included) give
// +-max; otherwise they give +-inf (IEEE formats only).
template <class F, bool kSaturate>
FP8AMP_HD uint32_t encode(float x) {
    static_assert(kSaturate || F::kIsIeee, "a format without infinities must saturate");
    const uint32_t bits = f32_bits(x);
    const uint32_t sign = (bits >> 31) << F::kSignShift;
    const uint32_t mag = bits & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return sign | F::kQuietNaN;
    const int exp32 = static_cast<int>(mag >> 23);
    uint32_t code;
    if (exp32 - 127 >= 1 - F::kBias) {
        // Normal in the target (or beyond its range): round the float32 mantissa to M bits; a carry
        // moves into the exponent by itself. Then re-bias the exponent field.
        code = round_shift_rne(mag, 23 - F::kManBits) - (static_cast<uint32_t>(127 - F::kBias) << F::kManBits);
    } else {
        // Subnormal in the target: count quanta of 2^(1 - bias - M) in sig * 2^(eff - 150).
        const uint32_t sig = exp32 ? ((mag & 0x7FFFFFu) | 0x800000u) : mag;
        const int eff = exp32 ? exp32 : 1;
        const int shift = 151 - F::kBias - F::kManBits - eff;  // >= 13 for every format here
        code = shift > 25 ? 0u : round_shift_rne(sig, shift);  // sig < 2^24: below half a quantum
    }
    if (mag >= 0x7F800000u || code > F::kMaxFinite) code = kSaturate ? F::kMaxFinite : F::kInf;
    return sign | code;
}

// code of format F -> float32, exactly.
template <class F>
FP8AMP_HD float decode(uint32_t code) {
    const uint32_t sign = ((code >> F::kSignShift) & 1u) << 31;
    const uint32_t mag = code & F::kMagMask;
    const uint32_t e = mag >> F::kManBits;
    const uint32_t m = mag & ((1u << F::kManBits) - 1u);
    uint32_t out;
    if (F::kIsIeee ? (e == (1u << F::kExpBits) - 1u) : (mag == F::kMagMask)) {
        out = (F::kIsIeee && m == 0) ? 0x7F800000u : kF32QuietNaN;
    } else if (e == 0) {
        // m * 2^(1 - bias - M). For BF16 that is a float32 subnormal: place the bits directly.
        if (F::kBias == 127) {
            out = m << (23 - F::kManBits);
        } else {
            out = f32_bits(static_cast<float>(m) *
                           bits_f32(static_cast<uint32_t>(127 + 1 - F::kBias - F::kManBits) << 23));
        }
    } else {
        out = ((e + 127u - F::kBias) << 23) | (m << (23 - F::kManBits));
    }
    return bits_f32(sign | out);
}

// float32 -> float32 with NaN made canonical (what a conversion into F32 does).
FP8AMP_HD float canonical_f32(float x) {
    const uint32_t bits = f32_bits(x);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? bits_f32((bits & 0x80000000u) | kF32QuietNaN) : x;
}

}  // namespace fp8amp::codec
