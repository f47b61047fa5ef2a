/* Independent references for the scaled-cast and scaling tests, written from the format definitions
 * and double arithmetic, never from the library's bit-twiddling (same approach as test_cast.c):
 *   - decode_ref: the format definitions evaluated with ldexp in double precision;
 *   - encode_fp8_ref: brute force over all 256 codes (nearest value, ties to the even code,
 *     saturation to +-max, NaN to the canonical NaN with the input's sign);
 *   - round_ref: round-to-nearest-even into F16/BF16 by double arithmetic (overflow gives inf);
 *   - encode_satfinite_ieee_ref: scaled F16's encode, round_ref then saturation to +-65504, the code
 *     assembled from the value by double arithmetic (code_of_value_ref);
 *   - mul_f32_ref: x * s rounded once to float32 (the product of two float32 values is exact in
 *     double), a NaN x passing through unchanged (sign included) and a NaN made by the product
 *     itself (0 * inf, with a degenerate scale) positive;
 *   - scale_ref: scale = fp8_max / 2^margin / amax evaluated in double, then rounded to float32 and
 *     kept within [FLT_MIN, FLT_MAX]. */
#ifndef FP8AMP_FP8_REFERENCE_H
#define FP8AMP_FP8_REFERENCE_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8amp/fp8amp.h"

typedef struct {
    fp8amp_dtype dtype;
    int exp_bits, man_bits, bias;
    int ieee; /* all-ones exponent = inf/NaN */
} format_t;

static const format_t FMT_E4M3 = {FP8AMP_DTYPE_E4M3, 4, 3, 7, 0};
static const format_t FMT_E5M2 = {FP8AMP_DTYPE_E5M2, 5, 2, 15, 1};
static const format_t FMT_F16 = {FP8AMP_DTYPE_F16, 5, 10, 15, 1};
static const format_t FMT_BF16 = {FP8AMP_DTYPE_BF16, 8, 7, 127, 1};
static const format_t FMT_F32 = {FP8AMP_DTYPE_F32, 8, 23, 127, 1};

static inline const format_t *format_of(fp8amp_dtype d) {
    switch (d) {
    case FP8AMP_DTYPE_E4M3: return &FMT_E4M3;
    case FP8AMP_DTYPE_E5M2: return &FMT_E5M2;
    case FP8AMP_DTYPE_F16: return &FMT_F16;
    case FP8AMP_DTYPE_BF16: return &FMT_BF16;
    case FP8AMP_DTYPE_F32: return &FMT_F32;
    default: return NULL;
    }
}

static inline uint32_t f32_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static inline float bits_f32(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

static inline double decode_ref(const format_t *f, uint32_t code) {
    const int sign = (code >> (f->exp_bits + f->man_bits)) & 1;
    const uint32_t e = (code >> f->man_bits) & ((1u << f->exp_bits) - 1);
    const uint32_t m = code & ((1u << f->man_bits) - 1);
    const uint32_t e_max = (1u << f->exp_bits) - 1;
    double v;
    if (f->ieee && e == e_max)
        v = m ? NAN : INFINITY;
    else if (!f->ieee && e == e_max && m == (1u << f->man_bits) - 1)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->man_bits);
    else
        v = ldexp(1.0 + ldexp((double)m, -f->man_bits), (int)e - f->bias);
    return sign ? -v : v;
}

static inline uint32_t canonical_nan(const format_t *f, int sign) {
    const uint32_t mag = f->ieee ? ((((1u << f->exp_bits) - 1) << f->man_bits) | (1u << (f->man_bits - 1)))
                                 : ((1u << (f->exp_bits + f->man_bits)) - 1);
    return ((uint32_t)sign << (f->exp_bits + f->man_bits)) | mag;
}

static inline uint32_t max_finite_code(const format_t *f) {
    return f->ieee ? ((((1u << f->exp_bits) - 1) << f->man_bits) - 1) : ((1u << (f->exp_bits + f->man_bits)) - 2);
}

static inline double fp8_max_ref(const format_t *f) { return decode_ref(f, max_finite_code(f)); }

/* Brute force: the nearest of all finite codes, ties to the even code; saturating. */
static inline uint32_t encode_fp8_ref(const format_t *f, double x) {
    static double table[2][256]; /* decode_ref of each code, filled once per format */
    static int filled[2];
    const int sign = signbit(x) ? 1 : 0;
    if (isnan(x)) return canonical_nan(f, sign);
    const double a = fabs(x);
    const uint32_t top = max_finite_code(f);
    const int t = f->ieee ? 1 : 0;
    if (!filled[t]) {
        for (uint32_t c = 0; c < 256; ++c) table[t][c] = decode_ref(f, c);
        filled[t] = 1;
    }
    uint32_t best = 0;
    double best_err = INFINITY;
    if (a >= table[t][top]) {
        best = top;
    } else {
        for (uint32_t c = 0; c <= top; ++c) {
            const double err = fabs(table[t][c] - a);
            if (err < best_err || (err == best_err && (c & 1u) == 0)) {
                best = c;
                best_err = err;
            }
        }
    }
    return ((uint32_t)sign << (f->exp_bits + f->man_bits)) | best;
}

/* Round-to-nearest-even into an IEEE format by double arithmetic; overflow gives inf. */
static inline double round_ref(const format_t *f, double x) {
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    const int emin = 1 - f->bias;
    int e = ilogb(fabs(x));
    if (e < emin) e = emin;
    const double quantum = ldexp(1.0, e - f->man_bits);
    const double q = fabs(x) / quantum;
    double r = floor(q);
    const double frac = q - r;
    if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) == 1.0)) r += 1.0;
    double v = r * quantum;
    if (v > fp8_max_ref(f)) v = INFINITY;
    return x < 0 ? -v : v;
}


/* The code of a value v that format f (IEEE, exponent and mantissa fields) represents exactly (a
 * result of round_ref), assembled from its sign, binade and quanta by double arithmetic. */
static inline uint32_t code_of_value_ref(const format_t *f, double v) {
    const uint32_t sign = (uint32_t)(signbit(v) ? 1 : 0) << (f->exp_bits + f->man_bits);
    const uint32_t inf = ((1u << f->exp_bits) - 1) << f->man_bits;
    const double a = fabs(v);
    if (isinf(a)) return sign | inf;
    if (a == 0.0) return sign;
    const int emin = 1 - f->bias;
    const int e = ilogb(a);
    if (e < emin) return sign | (uint32_t)(a / ldexp(1.0, emin - f->man_bits)); /* subnormal: quanta */
    const uint32_t man = (uint32_t)(a / ldexp(1.0, e - f->man_bits)) - (1u << f->man_bits);
    return sign | ((uint32_t)(e + f->bias) << f->man_bits) | man;
}

/* Scaled F16 (and any IEEE format used as a scaled format): round to nearest even, then saturate:
 * results beyond the largest finite value (inf included) become +-max, as FP8's satfinite does;
 * NaN becomes the canonical quiet NaN with the input's sign. */
static inline uint32_t encode_satfinite_ieee_ref(const format_t *f, double x) {
    if (isnan(x)) return canonical_nan(f, signbit(x) ? 1 : 0);
    double r = round_ref(f, x);
    if (isinf(r)) r = r < 0 ? -fp8_max_ref(f) : fp8_max_ref(f);
    return code_of_value_ref(f, r);
}

/* The code a quantize into scaled dtype f writes for the scaled value y. */
static inline uint32_t encode_scaled_ref(const format_t *f, double y) {
    return f->dtype == FP8AMP_DTYPE_F16 ? encode_satfinite_ieee_ref(f, y) : encode_fp8_ref(f, y);
}

/* x * s rounded once to float32 (x and s are float32 values, so the double product is exact); a
 * product beyond float32's range becomes +-inf; a NaN x passes through unchanged. */
static inline double mul_f32_ref(double x, float s) {
    if (isnan(x)) return x;
    const double p = x * (double)s;
    if (isnan(p)) return NAN;
    /* the largest float32 plus half an ulp: from there on, round to nearest gives inf */
    if (fabs(p) >= ldexp(2.0 - ldexp(1.0, -24), 127)) return p < 0 ? -INFINITY : INFINITY;
    return (double)(float)p;
}

/* The scale a recipe gives for amax, given the previous scale: fp8_max / 2^margin / amax in double,
 * rounded to float32 (FLT_MAX where that overflows), optionally rounded down to a power of two; the
 * previous scale when amax is 0, inf or NaN. */
static inline float scale_ref(double fp8_max, int margin, int pow2, double amax, float previous) {
    if (!(amax > 0.0) || isinf(amax)) return previous;
    const double q = fp8_max / ldexp(1.0, margin) / amax;
    double s = q >= (double)FLT_MAX ? (double)FLT_MAX : (double)(float)q;
    if (s < (double)FLT_MIN) s = (double)FLT_MIN; /* so that 1/scale stays finite */
    if (pow2) s = ldexp(1.0, ilogb(s));
    return (float)s;
}

/* 1 / s rounded to float32 (inf where that overflows, for a subnormal s). */
static inline float reciprocal_ref(float s) {
    const double q = 1.0 / (double)s;
    return fabs(q) >= ldexp(2.0 - ldexp(1.0, -24), 127) ? (q < 0 ? -INFINITY : INFINITY) : (float)q;
}

/* Element i of a host buffer of dtype d, exactly. The buffer need not be aligned for d (tests pack
 * outputs of several dtypes into one byte buffer): the element is copied out, not dereferenced. */
static inline double value_at(fp8amp_dtype d, const void *buf, size_t i) {
    const unsigned char *b = (const unsigned char *)buf;
    switch (d) {
    case FP8AMP_DTYPE_F32: {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    case FP8AMP_DTYPE_F16:
    case FP8AMP_DTYPE_BF16: {
        uint16_t c;
        memcpy(&c, b + 2 * i, 2);
        return decode_ref(format_of(d), c);
    }
    default: return decode_ref(format_of(d), b[i]);
    }
}

/* Writes code into element i of a host buffer of dtype d. */
static inline void set_code(fp8amp_dtype d, void *buf, size_t i, uint32_t code) {
    switch (d) {
    case FP8AMP_DTYPE_F32: ((uint32_t *)buf)[i] = code; break;
    case FP8AMP_DTYPE_F16:
    case FP8AMP_DTYPE_BF16: ((uint16_t *)buf)[i] = (uint16_t)code; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)code; break;
    }
}

/* A code of format f with the given sign, unbiased exponent e (normal range of f) and mantissa bits. */
static inline uint32_t make_code(const format_t *f, int sign, int e, uint32_t man) {
    return ((uint32_t)sign << (f->exp_bits + f->man_bits)) | ((uint32_t)(e + f->bias) << f->man_bits) |
           (man & ((1u << f->man_bits) - 1));
}

/* max |x| over the buffer as the library records it: NaN counts as inf. */
static inline double amax_ref(fp8amp_dtype d, const void *buf, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double v = fabs(value_at(d, buf, i));
        if (isnan(v)) return INFINITY;
        if (v > m) m = v;
    }
    return m;
}

#endif
