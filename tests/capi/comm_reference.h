/* A model of the communicator's reductions (docs/communicator.md) for the tests: from each rank's
 * real input values it computes, with fp8_reference.h's independent codecs and plain float32 C
 * arithmetic, the codes and scale_inv every rank must receive (bit for bit), and the exact float64
 * mean of the values that went on the wire, against which the result's error is bounded by one FP8
 * rounding. */
#ifndef FP8AMP_COMM_REFERENCE_H
#define FP8AMP_COMM_REFERENCE_H

#include <float.h>
#include <stdlib.h>

#include "fp8_reference.h"

/* The value quantum of format f at magnitude a (a in the format's scaled units). */
static inline double quantum_ref(const format_t *f, double a) {
    const int emin = 1 - f->bias;
    int e = a > 0 ? ilogb(a) : emin;
    if (e < emin) e = emin;
    return ldexp(1.0, e - f->man_bits);
}

/* The reduce-scatter (its FP8 shard requantized with the shard's own amax).
 * x[j][k]: rank j's k-th real input value (a float32 value), j < N, k < n. Writes the wire scale
 * (scale_out), the reduced values before requantization (v, float32), the gathered codes (codes, in
 * format g) with their scale_inv (*si2_out), and wire_mean[k] = the exact mean (or sum) of the wire
 * values. Returns the wire's scale_inv. */
static inline float comm_reduce_ref(const format_t *wire, const format_t *g, int N, size_t n, double *const *x,
                                    int average, float *v, uint8_t *codes, float *si2_out, double *wire_mean) {
    double amax = 0;
    int j;
    size_t k;
    for (j = 0; j < N; ++j)
        for (k = 0; k < n; ++k)
            if (fabs(x[j][k]) > amax) amax = fabs(x[j][k]);
    const float s = scale_ref(fp8_max_ref(wire), 0, 0, amax, 1.0f);
    const float si = reciprocal_ref(s);
    const float f = average ? si / (float)N : si;
    double amax2 = 0;
    for (k = 0; k < n; ++k) {
        float acc = 0.0f;
        double exact = 0;
        for (j = 0; j < N; ++j) {
            const double w = decode_ref(wire, encode_scaled_ref(wire, mul_f32_ref(x[j][k], s)));
            acc = acc + (float)w;
            exact += w * (double)si;
        }
        wire_mean[k] = average ? exact / N : exact;
        v[k] = acc * f;
        if (fabs((double)v[k]) > amax2) amax2 = fabs((double)v[k]);
    }
    const float s2 = scale_ref(fp8_max_ref(g), 0, 0, amax2, 1.0f);
    *si2_out = reciprocal_ref(s2);
    for (k = 0; k < n; ++k) codes[k] = (uint8_t)encode_scaled_ref(g, mul_f32_ref((double)v[k], s2));
    return si;
}

/* The all-reduce (docs/communicator.md, "Algorithm"): the wire as comm_reduce_ref, then the float32
 * sum in rank order of each element's decoded codes requantized with the *wire's* scale, no new amax:
 * y = sum * g with g = (1/N) * (fp8_max(g) / fp8_max(wire)) (the second factor a power of two), one
 * float32 rounding, then one rounding into format g; the output's scale_inv is the wire's (the
 * mean) or the wire's times N (the sum), divided by that power of two. Writes y (in g's scaled
 * units, float32) to y_out, the codes, *si2_out and wire_mean as comm_reduce_ref; returns the
 * wire's scale_inv. Plain float32 C arithmetic (x86-64: FLT_EVAL_METHOD 0). */
static inline float comm_all_reduce_ref(const format_t *wire, const format_t *g, int N, size_t n, double *const *x,
                                        int average, float *y_out, uint8_t *codes, float *si2_out,
                                        double *wire_mean) {
    double amax = 0;
    int j;
    size_t k;
    for (j = 0; j < N; ++j)
        for (k = 0; k < n; ++k)
            if (fabs(x[j][k]) > amax) amax = fabs(x[j][k]);
    const float s = scale_ref(fp8_max_ref(wire), 0, 0, amax, 1.0f);
    const float si = reciprocal_ref(s);
    const float ratio = (float)(fp8_max_ref(g) / fp8_max_ref(wire)); /* 1, 2^7 or 2^-7: exact */
    const float gf = (1.0f / (float)N) * ratio;
    for (k = 0; k < n; ++k) {
        float acc = 0.0f;
        double exact = 0;
        for (j = 0; j < N; ++j) {
            const double w = decode_ref(wire, encode_scaled_ref(wire, mul_f32_ref(x[j][k], s)));
            acc = acc + (float)w;
            exact += w * (double)si;
        }
        wire_mean[k] = average ? exact / N : exact;
        y_out[k] = (float)mul_f32_ref(acc, gf);
        codes[k] = (uint8_t)encode_scaled_ref(g, y_out[k]);
    }
    *si2_out = (average ? si : si * (float)N) / ratio;
    if (*si2_out > FLT_MAX) *si2_out = FLT_MAX; /* a zero code times inf would be a NaN */
    return si;
}

/* The all-reduce's bucket layout and scale regions (docs/communicator.md, "Algorithm"): tensor i
 * starts at offsets[i], a multiple of 16 (each tensor's element count rounded up to 16); the bucket's
 * total is cut into N chunks of C = ceil(total / N) rounded up to 16, each chunk into regions of
 * ceil(C / 4) rounded up to 16 elements (the last one shorter). A tensor with a wide output (F32,
 * F16, BF16) has one agreed scale per region it has elements in; one with an FP8 output one scale. */
static inline int64_t comm_round16_ref(int64_t v) { return (v + 15) / 16 * 16; }
/* offsets[0..count] for the tensors' element counts; returns the total (offsets[count]). */
static inline int64_t comm_offsets_ref(const int64_t *numel, int count, int64_t *offsets) {
    int i;
    offsets[0] = 0;
    for (i = 0; i < count; ++i) offsets[i + 1] = offsets[i] + comm_round16_ref(numel[i]);
    return offsets[count];
}
static inline int64_t comm_chunk_ref(int64_t total, int N) { return comm_round16_ref((total + N - 1) / N); }
static inline int64_t comm_region_ref(int64_t C) { return C <= 0 ? 16 : comm_round16_ref((C + 3) / 4); }
/* seg[k] = the scale region of element k of a tensor with a wide output at bucket offset `offset`
 * (chunk * 4 + region within the chunk: non-decreasing in k). */
static inline void comm_segments_ref(int64_t offset, size_t n, int64_t C, int *seg) {
    const int64_t R = comm_region_ref(C);
    size_t k;
    for (k = 0; k < n; ++k) {
        const int64_t pos = offset + (int64_t)k, j = pos / C;
        seg[k] = (int)(j * 4 + (pos - j * C) / R);
    }
}

/* The all-reduce of one tensor whose elements have their own scale per segment: comm_all_reduce_ref
 * over each run of equal seg[k] (seg NULL: one run, an FP8 output's one scale). Writes, per element,
 * the output's scale_inv (si2_out) and the wire's (wsi_out) besides y_out, codes and wire_mean. */
static inline void comm_all_reduce_segments_ref(const format_t *wire, const format_t *g, int N, size_t n,
                                                double *const *x, int average, const int *seg, float *y_out,
                                                uint8_t *codes, float *si2_out, float *wsi_out, double *wire_mean) {
    double **xs = (double **)malloc(sizeof(double *) * (size_t)N);
    size_t k0 = 0, k;
    int j;
    while (k0 < n) {
        size_t k1 = k0 + 1;
        float si2, wsi;
        if (!seg) k1 = n;
        while (k1 < n && seg[k1] == seg[k0]) ++k1;
        for (j = 0; j < N; ++j) xs[j] = x[j] + k0;
        wsi = comm_all_reduce_ref(wire, g, N, k1 - k0, xs, average, y_out + k0, codes + k0, &si2, wire_mean + k0);
        for (k = k0; k < k1; ++k) {
            si2_out[k] = si2;
            wsi_out[k] = wsi;
        }
        k0 = k1;
    }
    free(xs);
}

/* The output element a wide dtype d gets for code c of format g with scale_inv si2. */
static inline double comm_wide_ref(fp8amp_dtype d, const format_t *g, uint8_t c, float si2) {
    const double y = mul_f32_ref(decode_ref(g, c), si2);
    return d == FP8AMP_DTYPE_F32 ? y : round_ref(format_of(d), y);
}

/* Deterministic per-(seed, stream) random numbers, so that every rank can regenerate every other
 * rank's inputs for the reference. */
static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double uniform01(uint64_t *s) { return (double)(splitmix64(s) >> 11) * ldexp(1.0, -53); }
/* A float32 value of random sign and magnitude 2^[e_lo, e_hi), never 0. */
static inline float random_value(uint64_t *s, int e_lo, int e_hi) {
    const double m = ldexp(1.0, e_lo) * pow(2.0, uniform01(s) * (e_hi - e_lo));
    return (float)((splitmix64(s) & 1) ? -m : m);
}

#endif
