/* Random test inputs shared by the scaled-cast tests (test_quantize.c, test_scaled_f16.c): values of
 * an IEEE dtype over chosen binades with zeros, subnormals and specials, and non-power-of-two scales.
 * Uses the run's seeded generator (test_util.h) and the format tables of fp8_reference.h. */
#ifndef FP8AMP_TEST_GEN_H
#define FP8AMP_TEST_GEN_H

#include "fp8_reference.h"
#include "test_util.h"

/* n random finite values of an IEEE dtype (F32/F16/BF16) with unbiased exponents in [e_lo, e_hi]
 * (clamped to the format), random signs and mantissas, some zeros and subnormals; with `specials`,
 * a few infinities and NaNs (with and without sign, canonical or not) at random places. */
static inline void gen_values(fp8amp_dtype d, void *buf, size_t n, int e_lo, int e_hi, int specials) {
    const format_t *f = format_of(d);
    const int emin = 1 - f->bias, emax = (1 << f->exp_bits) - 2 - f->bias;
    /* both ends clamped into the format's normal range, so that lo <= hi whenever e_lo <= e_hi */
    const int lo = e_lo < emin ? emin : (e_lo > emax ? emax : e_lo);
    const int hi = e_hi > emax ? emax : (e_hi < emin ? emin : e_hi);
    const uint32_t sign_shift = (uint32_t)(f->exp_bits + f->man_bits);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = test_rng_u64();
        const uint32_t sign = (uint32_t)(r & 1) << sign_shift;
        uint32_t code;
        if (r % 61 == 0)
            code = sign; /* a zero of either sign */
        else if (r % 67 == 1)
            code = sign | (uint32_t)((r >> 8) & ((1u << f->man_bits) - 1)); /* subnormal */
        else
            code = make_code(f, (int)(r & 1), lo + (int)((r >> 8) % (uint64_t)(hi - lo + 1)), (uint32_t)(r >> 20));
        set_code(d, buf, i, code);
    }
    if (specials && n >= 8) {
        const uint32_t inf = ((1u << f->exp_bits) - 1) << f->man_bits;
        const uint32_t s = 1u << sign_shift;
        const uint32_t nan_payload = d == FP8AMP_DTYPE_F32 ? 0x12345u : 1u; /* a non-canonical NaN */
        const uint32_t codes[6] = {inf, s | inf, inf | (1u << (f->man_bits - 1)), s | inf | (1u << (f->man_bits - 1)),
                                   inf | nan_payload, s | inf | nan_payload};
        for (int k = 0; k < 6; ++k) set_code(d, buf, (size_t)(test_rng_u64() % n), codes[k]);
    }
}

/* A random scale that is not a power of two, so that x * scale really rounds. */
static inline float random_scale(int e_lo, int e_hi) {
    return (float)ldexp(test_rng_uniform(1.0, 2.0), e_lo + (int)(test_rng_u64() % (uint64_t)(e_hi - e_lo + 1)));
}

#endif
