/* The fused activations: fp8amp_activation_forward / fp8amp_activation_backward (GELU with the tanh
 * approximation, SiLU, SwiGLU), checked on fresh random data of odd shapes against
 * - float64 references (libm's tanh and exp in double) within the float32 tolerances of
 *   docs/numerics.md 8.3;
 * - the unfused path: an FP8 y or dx must be byte for byte what fp8amp_quantize makes of the F32 one
 *   (same recorded amax, scale, scale_inv and statistics; delayed and current scaling), its transpose
 *   the transpose; a 16-bit output what fp8amp_cast makes of the F32 one;
 * - NaN and inf inputs; every bad input gets its status and changes nothing.
 * Each test runs on the CPU and on CUDA (skipped without a GPU); test_cpu_cuda_identical compares
 * the two byte for byte. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

enum { GELU = FP8AMP_ACTIVATION_GELU_TANH, SILU = FP8AMP_ACTIVATION_SILU, SWIGLU = FP8AMP_ACTIVATION_SWIGLU };
static const char *const kNames[3] = {"gelu_tanh", "silu", "swiglu"};
static const fp8amp_dtype WIDE[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F16};

static void put_value(fp8amp_dtype d, void *buf, size_t i, double v) {
    if (d == FP8AMP_DTYPE_F32) {
        ((float *)buf)[i] = (float)v;
        return;
    }
    const format_t *f = format_of(d);
    set_code(d, buf, i, code_of_value_ref(f, round_ref(f, v)));
}

/* Mostly [-8, 8], some tiny and some large magnitudes (the tails of exp and tanh), some zeros. */
static void gen_x(fp8amp_dtype dt, void *buf, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = test_rng_u64() % 20;
        double v = test_rng_uniform(-8.0, 8.0);
        if (r == 0) v = ldexp(test_rng_uniform(-1.0, 1.0), -(int)(test_rng_u64() % 30));
        if (r == 1) v = test_rng_uniform(-120.0, 120.0);
        if (r == 2 && dt != FP8AMP_DTYPE_F16) v = test_rng_uniform(-1e4, 1e4);
        if (r == 3) v = 0.0;
        put_value(dt, buf, i, v);
    }
}

typedef struct {
    void *out, *out_t;
    float scale, scale_inv, amax, slot, slot_t;
    fp8amp_scaling_stats stats;
} run_t;

static void run_free(run_t *r) {
    free(r->out);
    free(r->out_t);
}

/* One forward (dy NULL) or backward on `device`: x [rows, in_cols] of x_dt, dy [rows, cols]; out of
 * out_dt (FP8: a fresh meta of mode and scale; with_t: its transpose too). */
static void run_act(fp8amp_device device, int kind, int64_t rows, int64_t cols, fp8amp_dtype x_dt, const void *x,
                    fp8amp_dtype dy_dt, const void *dy, fp8amp_dtype out_dt, fp8amp_scaling_mode mode, float scale,
                    int with_t, run_t *res) {
    memset(res, 0, sizeof *res);
    const int64_t in_cols = kind == SWIGLU ? 2 * cols : cols, out_cols = dy ? in_cols : cols;
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t xs[2] = {rows, in_cols}, ys[2] = {rows, cols}, os[2] = {rows, out_cols}, ts[2] = {out_cols, rows};
    fp8amp_tensor tx = tensor_from_host(ctx, x_dt, 2, xs, x), tdy = dy ? tensor_from_host(ctx, dy_dt, 2, ys, dy) : NULL;
    fp8amp_tensor out = tensor_from_host(ctx, out_dt, 2, os, NULL), out_t = NULL;
    const int fp8 = out_dt == FP8AMP_DTYPE_E4M3 || out_dt == FP8AMP_DTYPE_E5M2;
    size_t nbytes;
    EXPECT_OK(fp8amp_tensor_nbytes(out, &nbytes));
    void *poison = xmalloc(nbytes);
    memset(poison, 0xA5, nbytes);
    EXPECT_OK(fp8amp_tensor_copy_from_host(out, poison, nbytes));
    fp8amp_scaling s = NULL;
    if (fp8) {
        s = counting_meta(ctx, out_dt, mode, scale);
        EXPECT_OK(fp8amp_tensor_set_scaling(out, s));
        if (with_t) {
            out_t = tensor_from_host(ctx, out_dt, 2, ts, poison);
            EXPECT_OK(fp8amp_tensor_set_scaling(out_t, s));
        }
    }
    free(poison);
    if (dy)
        EXPECT_OK(fp8amp_activation_backward(ctx, (fp8amp_activation)kind, tdy, tx, out, out_t));
    else
        EXPECT_OK(fp8amp_activation_forward(ctx, (fp8amp_activation)kind, tx, out, out_t));
    res->out = tensor_to_host(out);
    if (out_t) res->out_t = tensor_to_host(out_t);
    if (s) {
        EXPECT_OK(fp8amp_scaling_get(s, &res->scale, &res->scale_inv, &res->amax));
        EXPECT_OK(fp8amp_scaling_get_stats(s, &res->stats));
        fp8amp_tensor si;
        EXPECT_OK(fp8amp_tensor_scale_inv(out, &si));
        EXPECT_OK(fp8amp_tensor_copy_to_host(si, &res->slot, 4));
        EXPECT_OK(fp8amp_tensor_destroy(si));
        if (out_t) {
            EXPECT_OK(fp8amp_tensor_scale_inv(out_t, &si));
            EXPECT_OK(fp8amp_tensor_copy_to_host(si, &res->slot_t, 4));
            EXPECT_OK(fp8amp_tensor_destroy(si));
        }
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    fp8amp_tensor all[4] = {tx, tdy, out, out_t};
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* fp8amp_quantize of a host F32 array [rows, cols] with a fresh meta; the meta's readings into *res. */
static uint8_t *unfused_quantize(fp8amp_device device, const float *v, int64_t rows, int64_t cols, fp8amp_dtype dt,
                                 fp8amp_scaling_mode mode, float scale, run_t *res) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t shape[2] = {rows, cols};
    fp8amp_tensor src = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, shape, v), q = tensor_from_host(ctx, dt, 2, shape, NULL);
    fp8amp_scaling s = counting_meta(ctx, dt, mode, scale);
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    uint8_t *codes = tensor_to_host(q);
    EXPECT_OK(fp8amp_scaling_get(s, &res->scale, &res->scale_inv, &res->amax));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &res->stats));
    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    return codes;
}

static void *cast_f32(fp8amp_device device, const float *v, int64_t n, fp8amp_dtype dt) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    fp8amp_tensor a = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 1, &n, v), b = tensor_from_host(ctx, dt, 1, &n, NULL);
    EXPECT_OK(fp8amp_cast(ctx, a, b));
    void *out = tensor_to_host(b);
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    return out;
}

/* ---- float64 references ---------------------------------------------------------------------- */

static const double kC0 = 0.79788456080286535588, kC1 = 0.044715;

static double sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu64(double x) { return x * sigmoid64(x); }
static double gelu64(double x) { return 0.5 * x * (1.0 + tanh(kC0 * (x + kC1 * x * x * x))); }
static double silu_grad64(double x) {
    const double s = sigmoid64(x);
    return s * (1.0 + x * (1.0 - s));
}
static double gelu_grad64(double x) {
    const double t = tanh(kC0 * (x + kC1 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kC0 * (1.0 + 3.0 * kC1 * x * x);
}

/* Error bounds (docs/numerics.md 8.3): 2^-21 of the magnitudes each rounding is relative to. y (GELU,
 * SiLU): |x| + |y|; SwiGLU: |b| (|a| + |silu(a)|). dx: |dy| (1 + |x| + |x|^3 / 4) (the derivative's
 * terms), times (1 + |b|) for SwiGLU's da, and |dy| (|a| + |silu(a)|) for db. */
static const double kTol = 0x1p-21;

static double ref_forward(int kind, double a, double b, double *mag) {
    if (kind == GELU) {
        const double y = gelu64(a);
        *mag = fabs(a) + fabs(y);
        return y;
    }
    const double s = silu64(a);
    *mag = fabs(a) + fabs(s);
    if (kind == SILU) return s;
    *mag *= fabs(b);
    return s * b;
}

static double ref_backward(int kind, double dy, double a, double b, int second, double *mag) {
    const double deriv_mag = 1.0 + fabs(a) + fabs(a * a * a) / 4.0;
    if (kind == GELU) {
        *mag = fabs(dy) * deriv_mag;
        return dy * gelu_grad64(a);
    }
    if (kind == SILU) {
        *mag = fabs(dy) * deriv_mag;
        return dy * silu_grad64(a);
    }
    if (second) {
        *mag = fabs(dy) * (fabs(a) + fabs(silu64(a)));
        return dy * silu64(a);
    }
    *mag = fabs(dy) * deriv_mag * (1.0 + fabs(b));
    return dy * b * silu_grad64(a);
}

typedef struct {
    int64_t rows, cols;
} shape_t;
static const shape_t kShapes[] = {{1, 1}, {3, 7}, {17, 1023}, {5, 1024}, {2, 4099}, {64, 96}, {1, 8193}, {33, 20}};
#define NSHAPES (sizeof kShapes / sizeof kShapes[0])

/* A problem's inputs on the host. */
typedef struct {
    int kind;
    int64_t rows, cols, in_cols;
    fp8amp_dtype x_dt, dy_dt;
    void *x, *dy;
} prob_t;

static void prob_make(prob_t *p, int kind, int64_t rows, int64_t cols, fp8amp_dtype x_dt, fp8amp_dtype dy_dt) {
    p->kind = kind;
    p->rows = rows;
    p->cols = cols;
    p->in_cols = kind == SWIGLU ? 2 * cols : cols;
    p->x_dt = x_dt;
    p->dy_dt = dy_dt;
    p->x = xmalloc((size_t)(rows * p->in_cols) * 4);
    p->dy = xmalloc((size_t)(rows * cols) * 4);
    gen_x(x_dt, p->x, (size_t)(rows * p->in_cols));
    for (int64_t i = 0; i < rows * cols; ++i) put_value(dy_dt, p->dy, (size_t)i, test_rng_uniform(-2.0, 2.0));
}

static void prob_free(prob_t *p) {
    free(p->x);
    free(p->dy);
}

static double a_at(const prob_t *p, int64_t r, int64_t c) { return value_at(p->x_dt, p->x, (size_t)(r * p->in_cols + c)); }
static double b_at(const prob_t *p, int64_t r, int64_t c) {
    return p->kind == SWIGLU ? value_at(p->x_dt, p->x, (size_t)(r * p->in_cols + p->cols + c)) : 0.0;
}

static void test_vs_float64(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    double worst_f = 0.0, worst_b = 0.0;
    for (int kind = 0; kind < 3; ++kind)
        for (size_t s = 0; s < NSHAPES; ++s) {
            prob_t p;
            prob_make(&p, kind, kShapes[s].rows, kShapes[s].cols, WIDE[(s + (size_t)kind) % 3], WIDE[s % 2]);
            run_t f, b;
            run_act(device, kind, p.rows, p.cols, p.x_dt, p.x, 0, NULL, FP8AMP_DTYPE_F32, 0, 1.0f, 0, &f);
            run_act(device, kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, p.dy, FP8AMP_DTYPE_F32, 0, 1.0f, 0, &b);
            int bad = 0;
            for (int64_t r = 0; r < p.rows; ++r)
                for (int64_t c = 0; c < p.cols; ++c) {
                    double mag;
                    const double want = ref_forward(kind, a_at(&p, r, c), b_at(&p, r, c), &mag);
                    const double got = ((float *)f.out)[r * p.cols + c];
                    const double e = fabs(got - want) / (kTol * mag + 1e-300);
                    if (!(e <= 1.0) && bad++ < 5)
                        print_error("%s forward: x %.9g (b %.9g): got %.9g, float64 %.9g\n", kNames[kind], a_at(&p, r, c),
                                    b_at(&p, r, c), got, want);
                    if (!(e <= worst_f)) worst_f = e;
                }
            for (int64_t r = 0; r < p.rows; ++r)
                for (int64_t j = 0; j < p.in_cols; ++j) {
                    const int second = kind == SWIGLU && j >= p.cols;
                    const int64_t c = second ? j - p.cols : j;
                    double mag;
                    const double dy = value_at(p.dy_dt, p.dy, (size_t)(r * p.cols + c));
                    const double want = ref_backward(kind, dy, a_at(&p, r, c), b_at(&p, r, c), second, &mag);
                    const double got = ((float *)b.out)[r * p.in_cols + j];
                    const double e = fabs(got - want) / (kTol * mag + 1e-300);
                    if (!(e <= 1.0) && bad++ < 10)
                        print_error("%s backward: x %.9g dy %.9g: got %.9g, float64 %.9g\n", kNames[kind], a_at(&p, r, c),
                                    dy, got, want);
                    if (!(e <= worst_b)) worst_b = e;
                }
            assert_int_equal(bad, 0);
            run_free(&f);
            run_free(&b);
            prob_free(&p);
        }
    print_message("worst error: forward %.3g, backward %.3g of the documented bound\n", worst_f, worst_b);
}

/* The fused FP8 output (forward y, backward dx) is the unfused quantize of the F32 output; the 16-bit
 * outputs are casts of it. */
static void test_fp8_output_is_quantized_f32(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    for (int kind = 0; kind < 3; ++kind)
        for (size_t s = 0; s < NSHAPES; ++s)
            for (int backward = 0; backward < 2; ++backward) {
                prob_t p;
                prob_make(&p, kind, kShapes[s].rows, kShapes[s].cols, WIDE[s % 3], WIDE[(s + 1) % 3]);
                const int64_t out_cols = backward ? p.in_cols : p.cols, n = p.rows * out_cols;
                const void *dy = backward ? p.dy : NULL;
                const fp8amp_dtype dt = ((s + (size_t)kind) & 1) ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3;
                const fp8amp_scaling_mode mode = (s % 3 == 0) ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
                const float scale = (float)ldexp(test_rng_uniform(1.0, 2.0), (int)(test_rng_u64() % 10) - 2);
                run_t f32, q, ref;
                run_act(device, kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, dy, FP8AMP_DTYPE_F32, 0, 1.0f, 0, &f32);
                run_act(device, kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, dy, dt, mode, scale, 1, &q);
                uint8_t *codes = unfused_quantize(device, f32.out, p.rows, out_cols, dt, mode, scale, &ref);
                assert_memory_equal(q.out, codes, (size_t)n);
                for (int64_t r = 0; r < p.rows; ++r)
                    for (int64_t c = 0; c < out_cols; ++c)
                        assert_int_equal(((uint8_t *)q.out_t)[c * p.rows + r], codes[r * out_cols + c]);
                const format_t *fmt = format_of(dt);
                for (int64_t i = 0; i < n; ++i)
                    assert_int_equal(codes[i], encode_fp8_ref(fmt, mul_f32_ref(((float *)f32.out)[i], ref.scale)));
                assert_true(f32_bits(q.amax) == f32_bits(ref.amax));
                assert_true(f32_bits(q.amax) == f32_bits((float)amax_ref(FP8AMP_DTYPE_F32, f32.out, (size_t)n)));
                assert_true(f32_bits(q.scale) == f32_bits(ref.scale));
                assert_true(f32_bits(q.scale_inv) == f32_bits(ref.scale_inv));
                assert_true(f32_bits(q.slot) == f32_bits(ref.scale_inv) && f32_bits(q.slot_t) == f32_bits(ref.scale_inv));
                assert_memory_equal(&q.stats, &ref.stats, sizeof q.stats);
                free(codes);
                run_free(&q);
                for (int w = 1; w < 3; ++w) {
                    run_t o;
                    run_act(device, kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, dy, WIDE[w], 0, 1.0f, 0, &o);
                    void *want = cast_f32(device, f32.out, n, WIDE[w]);
                    assert_memory_equal(o.out, want, (size_t)n * 2);
                    free(want);
                    run_free(&o);
                }
                run_free(&f32);
                prob_free(&p);
            }
}

/* NaN in, positive NaN out (FP8 0x7F, amax recorded as inf); inf as the formulas give it. */
static void test_nan_and_inf(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const float x[8] = {NAN, -NAN, INFINITY, -INFINITY, 1.0f, -1.0f, 100.0f, -100.0f};
    for (int kind = 0; kind < 2; ++kind) {
        run_t f, q;
        run_act(device, kind, 1, 8, FP8AMP_DTYPE_F32, x, 0, NULL, FP8AMP_DTYPE_F32, 0, 1.0f, 0, &f);
        run_act(device, kind, 1, 8, FP8AMP_DTYPE_F32, x, 0, NULL, FP8AMP_DTYPE_E4M3, 0, 2.0f, 0, &q);
        const float *y = f.out;
        assert_true(f32_bits(y[0]) == 0x7FC00000u && f32_bits(y[1]) == 0x7FC00000u);
        assert_true(isinf(y[2]) && y[2] > 0);                  /* f(+inf) = +inf */
        assert_true(f32_bits(y[3]) == 0x7FC00000u);            /* -inf * 0 */
        assert_true(y[6] == 100.0f && fabsf(y[7]) < 1e-30f);   /* the tails */
        assert_int_equal(((uint8_t *)q.out)[0], 0x7F);
        assert_int_equal(((uint8_t *)q.out)[1], 0x7F);
        assert_int_equal(((uint8_t *)q.out)[2], 0x7E); /* +inf saturates to 448 */
        assert_true(isinf(q.amax) && q.amax > 0);
        run_free(&f);
        run_free(&q);
    }
}

/* CUDA's current-scaling amax pass for BF16 x (kernels/cuda/activation.cu, stream_kernel) takes
 * GELU's and SiLU's amax as f(x_max) when the largest input x_max is at least 0.5, without evaluating
 * f elsewhere. That is exact only while the shared arithmetic keeps two properties, checked here over
 * all 2^16 BF16 inputs with the CPU reference (CUDA computes the same bits): f is non-decreasing and
 * non-negative over the non-negative BF16 values (+0 up to +inf), and |f(x)| <= f(0.5) for every
 * negative finite x (and -0). A change of the arithmetic that breaks either fails here (with 0.25
 * in place of 0.5 the GELU check fails: |GELU| of negative inputs reaches 0.17 > GELU(0.25)). */
static void test_amax_from_extremes_holds(void **state) {
    (void)state;
    uint16_t *x = xmalloc(65536 * sizeof(uint16_t));
    for (uint32_t c = 0; c < 65536; ++c) x[c] = (uint16_t)c;
    for (int kind = 0; kind < 2; ++kind) {
        run_t f;
        run_act(cpu_device(), kind, 1, 65536, FP8AMP_DTYPE_BF16, x, 0, NULL, FP8AMP_DTYPE_F32, 0, 1.0f, 0, &f);
        const float *y = f.out;
        const float f_half = y[0x3F00]; /* f(0.5) */
        assert_true(f_half > 0.3f && f_half < 0.35f);
        for (uint32_t c = 0x0000; c < 0x7F80; ++c) { /* +0 .. the largest finite, then +inf */
            if (!(y[c] >= 0.0f && y[c] <= y[c + 1])) {
                print_error("kind %d: f not non-decreasing at BF16 0x%04x: %a > %a\n", kind, (unsigned)c, (double)y[c],
                            (double)y[c + 1]);
                fail();
            }
        }
        for (uint32_t c = 0x8000; c < 0xFF80; ++c) { /* -0 .. the most negative finite */
            if (!(fabsf(y[c]) <= f_half)) {
                print_error("kind %d: |f| of BF16 0x%04x is %a, above f(0.5) %a\n", kind, (unsigned)c, (double)fabsf(y[c]),
                            (double)f_half);
                fail();
            }
        }
        run_free(&f);
    }
    free(x);
}

static void test_cpu_cuda_identical(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const shape_t shapes[] = {{1, 1}, {3, 7}, {17, 1023}, {256, 1024}, {300, 4096}, {7, 8193}, {2048, 3072}};
    const fp8amp_dtype outs[4] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2};
    for (int kind = 0; kind < 3; ++kind)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
            for (int backward = 0; backward < 2; ++backward)
                for (int o = 0; o < 4; ++o) {
                    prob_t p;
                    prob_make(&p, kind, shapes[s].rows, shapes[s].cols, WIDE[s % 3], WIDE[(s + 1) % 3]);
                    const int64_t n = p.rows * (backward ? p.in_cols : p.cols);
                    const fp8amp_scaling_mode mode = (o + (int)s) % 2 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
                    run_t a, b;
                    const void *dy = backward ? p.dy : NULL;
                    run_act(cpu_device(), kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, dy, outs[o], mode, 5.0f, o >= 2, &a);
                    run_act(cuda_device(0), kind, p.rows, p.cols, p.x_dt, p.x, p.dy_dt, dy, outs[o], mode, 5.0f, o >= 2, &b);
                    assert_memory_equal(a.out, b.out, (size_t)n * fp8amp_dtype_size(outs[o]));
                    if (o >= 2) {
                        assert_memory_equal(a.out_t, b.out_t, (size_t)n);
                        assert_memory_equal(&a.stats, &b.stats, sizeof a.stats);
                        assert_true(f32_bits(a.amax) == f32_bits(b.amax) && f32_bits(a.scale) == f32_bits(b.scale));
                    }
                    run_free(&a);
                    run_free(&b);
                    prob_free(&p);
                }
}

/* Every BF16 input (2^16, NaN and inf included) through the CUDA forwards -- which read f of most of
 * them from a table (kernels/activation.hpp, act::table) and compute the rest -- the same bytes as the
 * CPU's, into F32 (f itself), BF16 and E4M3 (delayed and current scaling); SwiGLU's b random. */
static void test_cpu_cuda_identical_every_bf16(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const int64_t rows = 64, cols = 1024; /* rows * cols = 2^16: the stream kernel's vector path */
    const fp8amp_dtype outs[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3};
    for (int kind = 0; kind < 3; ++kind) {
        const int64_t in_cols = kind == SWIGLU ? 2 * cols : cols;
        uint16_t *x = xmalloc((size_t)(rows * in_cols) * sizeof(uint16_t));
        gen_x(FP8AMP_DTYPE_BF16, x, (size_t)(rows * in_cols));
        for (int64_t c = 0; c < rows * cols; ++c) /* a (GELU/SiLU: x) = every code, row-major */
            x[(c / cols) * in_cols + c % cols] = (uint16_t)c;
        for (int o = 0; o < 4; ++o) {
            const fp8amp_dtype out = outs[o < 3 ? o : 2];
            const fp8amp_scaling_mode mode = o == 3 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
            run_t a, b;
            run_act(cpu_device(), kind, rows, cols, FP8AMP_DTYPE_BF16, x, 0, NULL, out, mode, 3.0f, 0, &a);
            run_act(cuda_device(0), kind, rows, cols, FP8AMP_DTYPE_BF16, x, 0, NULL, out, mode, 3.0f, 0, &b);
            const size_t n = (size_t)(rows * cols);
            const size_t esize = fp8amp_dtype_size(out);
            for (size_t i = 0; i < n; ++i)
                if (memcmp((const char *)a.out + i * esize, (const char *)b.out + i * esize, esize) != 0) {
                    print_error("%s, out dtype %d, scaling %d: BF16 input 0x%04x gives different bytes on CPU and CUDA\n",
                                kNames[kind], (int)out, (int)mode, (unsigned)i);
                    fail();
                }
            if (out == FP8AMP_DTYPE_E4M3) {
                assert_memory_equal(&a.stats, &b.stats, sizeof a.stats);
                assert_true(f32_bits(a.amax) == f32_bits(b.amax) && f32_bits(a.scale) == f32_bits(b.scale));
            }
            run_free(&a);
            run_free(&b);
        }
        free(x);
    }
}

static void test_bad_input(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx, other = NULL;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int have_other = device.type == FP8AMP_DEVICE_CUDA || have_cuda();
    if (have_other) EXPECT_OK(fp8amp_context_create(device.type == FP8AMP_DEVICE_CUDA ? cpu_device() : cuda_device(0), &other));
    const int64_t s36[2] = {3, 6}, s33[2] = {3, 3}, s37[2] = {3, 7}, t63[2] = {6, 3}, t33[2] = {3, 3};
    float xs[21];
    for (int i = 0; i < 21; ++i) xs[i] = (float)test_rng_uniform(-3, 3);
    fp8amp_tensor x = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s36, xs), x7 = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s37, xs);
    fp8amp_tensor y = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, s36, NULL), yt = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, t63, NULL);
    fp8amp_tensor yh = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s33, NULL), y32 = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s36, NULL);
    fp8amp_tensor y_unbound = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, s36, NULL);
    fp8amp_tensor yt_bad = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, t33, NULL), yt5 = tensor_from_host(ctx, FP8AMP_DTYPE_E5M2, 2, t63, NULL);
    fp8amp_tensor x8 = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, s36, NULL), dy = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s36, xs);
    fp8amp_tensor dyh = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s33, xs), dx = tensor_from_host(ctx, FP8AMP_DTYPE_F32, 2, s36, NULL);
    fp8amp_tensor scalar;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 0, NULL, &scalar));
    fp8amp_scaling m = counting_meta(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 2.0f);
    fp8amp_scaling m2 = counting_meta(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 2.0f);
    fp8amp_scaling m5 = counting_meta(ctx, FP8AMP_DTYPE_E5M2, FP8AMP_SCALING_DELAYED, 2.0f);
    fp8amp_tensor yt_other = tensor_from_host(ctx, FP8AMP_DTYPE_E4M3, 2, t63, NULL);
    EXPECT_OK(fp8amp_tensor_set_scaling(y, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt_bad, m));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt5, m5));
    EXPECT_OK(fp8amp_tensor_set_scaling(yt_other, m2));
    fp8amp_tensor x_other = have_other ? tensor_from_host(other, FP8AMP_DTYPE_F32, 2, s36, xs) : NULL;
    const fp8amp_tensor outs[5] = {y, yt, yh, y32, dx};
    uint8_t poison[128];
    memset(poison, 0x3C, sizeof poison);
    void *before[5];
    for (int i = 0; i < 5; ++i) {
        size_t nb;
        EXPECT_OK(fp8amp_tensor_nbytes(outs[i], &nb));
        EXPECT_OK(fp8amp_tensor_copy_from_host(outs[i], poison, nb));
        before[i] = tensor_to_host(outs[i]);
    }
    float amax0, amax1;
    fp8amp_scaling_stats st0, st1;
    EXPECT_OK(fp8amp_scaling_get(m, NULL, NULL, &amax0));
    EXPECT_OK(fp8amp_scaling_get_stats(m, &st0));
    const fp8amp_status IH = FP8AMP_ERROR_INVALID_HANDLE, IA = FP8AMP_ERROR_INVALID_ARGUMENT,
                        SM = FP8AMP_ERROR_SHAPE_MISMATCH, DT = FP8AMP_ERROR_DTYPE_MISMATCH,
                        DM = FP8AMP_ERROR_DEVICE_MISMATCH;
    const fp8amp_activation G = FP8AMP_ACTIVATION_GELU_TANH, SW = FP8AMP_ACTIVATION_SWIGLU;
    EXPECT_STATUS(fp8amp_activation_forward(NULL, G, x, y, yt), IH);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, NULL, y, yt), IH);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, NULL, yt), IH);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y, (fp8amp_tensor)m), IH);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, (fp8amp_activation)3, x, y, yt), IA);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, (fp8amp_activation)-1, x, y, yt), IA);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x8, y, yt), DT);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y, yt5), DT);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y, y32), DT);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y32, yt), IA);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y_unbound, NULL), IA);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y, yt_other), IA);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, scalar, y32, NULL), SM);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, yh, NULL), SM);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, SW, x, y32, NULL), SM); /* SwiGLU: y must be [3, 3] */
    EXPECT_STATUS(fp8amp_activation_forward(ctx, SW, x7, yh, NULL), SM); /* odd last extent */
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x, y, yt_bad), SM);
    EXPECT_STATUS(fp8amp_activation_forward(ctx, G, y32, y32, NULL), IA); /* in place: overlap */
    if (have_other) EXPECT_STATUS(fp8amp_activation_forward(ctx, G, x_other, y32, NULL), DM);
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, x8, x, dx, NULL), DT);
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, dy, x, dx, yt), IA); /* dx_t with a wide dx */
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, dyh, x, dx, NULL), SM);
    EXPECT_STATUS(fp8amp_activation_backward(ctx, SW, dy, x, dx, NULL), SM); /* SwiGLU: dy is [3, 3] */
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, dy, x, yh, NULL), SM);
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, dy, x, dy, NULL), IA);
    EXPECT_STATUS(fp8amp_activation_backward(ctx, G, dy, x, NULL, NULL), IH);
    if (have_other) EXPECT_STATUS(fp8amp_activation_backward(ctx, G, x_other, x, dx, NULL), DM);
    for (int i = 0; i < 5; ++i) {
        size_t nb;
        EXPECT_OK(fp8amp_tensor_nbytes(outs[i], &nb));
        void *now = tensor_to_host(outs[i]);
        assert_memory_equal(now, before[i], nb);
        free(now);
        free(before[i]);
    }
    EXPECT_OK(fp8amp_scaling_get(m, NULL, NULL, &amax1));
    EXPECT_OK(fp8amp_scaling_get_stats(m, &st1));
    assert_true(f32_bits(amax0) == f32_bits(amax1));
    assert_memory_equal(&st0, &st1, sizeof st0);
    EXPECT_OK(fp8amp_activation_forward(ctx, G, x, y, yt));
    EXPECT_OK(fp8amp_activation_forward(ctx, SW, x, yh, NULL));
    EXPECT_OK(fp8amp_activation_backward(ctx, SW, dyh, x, dx, NULL));
    fp8amp_tensor all[] = {x, x7, y, yt, yh, y32, y_unbound, yt_bad, yt5, x8, dy, dyh, dx, scalar, yt_other, x_other};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(m));
    EXPECT_OK(fp8amp_scaling_destroy(m2));
    EXPECT_OK(fp8amp_scaling_destroy(m5));
    if (other) EXPECT_OK(fp8amp_context_destroy(other));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_vs_float64),
        DEVICE_TESTS(test_fp8_output_is_quantized_f32),
        DEVICE_TESTS(test_nan_and_inf),
        DEVICE_TESTS(test_bad_input),
        cmocka_unit_test(test_amax_from_extremes_holds),
        cmocka_unit_test(test_cpu_cuda_identical),
        cmocka_unit_test(test_cpu_cuda_identical_every_bf16),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
