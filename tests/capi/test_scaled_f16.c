/* Scaled F16: a scaling meta of dtype F16 (format max 65504), F16 tensors bound to it, quantize /
 * quantize_transpose into them and dequantize from them. Checked against fp8_reference.h's
 * independent float64 references: y = x * scale rounded once to float32, then round to nearest even
 * into F16 and saturate (|y| beyond 65504, inf included, becomes +-65504; NaN the canonical 0x7E00
 * with its sign), the code assembled from the value by double arithmetic; dequantize as
 * decode(q) * scale_inv in float32, rounded into the destination. Fresh random data of many shapes
 * every run, with NaN/inf, and sources and destinations at unaligned addresses (the CUDA kernels'
 * scalar paths). Each test runs on the CPU and on CUDA (skipped without a GPU); the CUDA run is also
 * compared byte for byte with the same run on the CPU. */
#include "fp8amp/dlpack.h"
#include "fp8_reference.h"
#include "test_gen.h"
#include "test_util.h"

static const fp8amp_dtype WIDE[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16};
#define F16_MAX 65504.0


/* A tensor of shape on ctx; with misalign, a view one element into a larger tensor (*owner), so that
 * its address is not 16-byte aligned. */
static fp8amp_tensor make_placed(fp8amp_context ctx, fp8amp_dtype d, int ndim, const int64_t *shape, int misalign,
                                 fp8amp_tensor *owner) {
    *owner = NULL;
    if (!misalign) return make_tensor(ctx, d, ndim, shape);
    const int64_t big = (int64_t)numel_of(ndim, shape) + 1;
    *owner = make_tensor(ctx, d, 1, &big);
    void *p = NULL;
    EXPECT_OK(fp8amp_tensor_data(*owner, &p));
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, d, ndim, shape, (char *)p + fp8amp_dtype_size(d), &t));
    return t;
}

/* ---- one quantize on a device ------------------------------------------------------------------ */

typedef struct {
    fp8amp_scaling_mode mode;
    int margin, pow2;
    float scale;  /* set before quantizing (under current scaling: the previous scale) */
    int transpose; /* through fp8amp_quantize_transpose */
    int misalign;  /* src and dst at unaligned addresses */
} f16_run_t;

typedef struct {
    uint16_t *q, *qt;     /* dst and dst_t codes */
    float *back, *back_t; /* dequantize of each into F32 */
    float scale, scale_inv, amax;
    fp8amp_scaling_stats stats;
} f16_result_t;

static void result_alloc(f16_result_t *r, size_t n) {
    memset(r, 0, sizeof *r);
    r->q = xmalloc(n * 2);
    r->qt = xmalloc(n * 2);
    r->back = xmalloc(n * 4);
    r->back_t = xmalloc(n * 4);
}

static void result_free(f16_result_t *r) {
    free(r->q);
    free(r->qt);
    free(r->back);
    free(r->back_t);
}

static void run_f16(fp8amp_device device, fp8amp_dtype sd, const void *src, int ndim, const int64_t *shape,
                    const f16_run_t *o, f16_result_t *res) {
    const size_t n = numel_of(ndim, shape);
    fp8amp_context ctx = make_context(device);
    fp8amp_recipe r;
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = o->mode;
    r.margin = o->margin;
    r.power_of_two_scales = o->pow2;
    r.amax_history_len = 4;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &s));
    EXPECT_OK(fp8amp_scaling_set_scale(s, o->scale));
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    fp8amp_tensor x_owner, q_owner, x, q, back, qt = NULL, back_t = NULL;
    x = make_placed(ctx, sd, ndim, shape, o->misalign, &x_owner);
    q = make_placed(ctx, FP8AMP_DTYPE_F16, ndim, shape, o->misalign, &q_owner);
    back = make_tensor(ctx, FP8AMP_DTYPE_F32, ndim, shape);
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, src, n * fp8amp_dtype_size(sd)));
    memset(res->q, 0xA5, n * 2); /* poison: every element must be written */
    EXPECT_OK(fp8amp_tensor_copy_from_host(q, res->q, n * 2));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    if (o->transpose) {
        const int64_t cols = ndim ? shape[ndim - 1] : 1;
        const int64_t tshape[2] = {cols, (int64_t)n / cols};
        qt = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, tshape);
        back_t = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, tshape);
        memset(res->qt, 0x5A, n * 2);
        EXPECT_OK(fp8amp_tensor_copy_from_host(qt, res->qt, n * 2));
        EXPECT_OK(fp8amp_tensor_set_scaling(qt, s));
        EXPECT_OK(fp8amp_quantize_transpose(ctx, x, q, qt));
        EXPECT_OK(fp8amp_tensor_copy_to_host(qt, res->qt, n * 2));
        EXPECT_OK(fp8amp_dequantize(ctx, qt, back_t));
        EXPECT_OK(fp8amp_tensor_copy_to_host(back_t, res->back_t, n * 4));
        EXPECT_OK(fp8amp_tensor_destroy(qt));
        EXPECT_OK(fp8amp_tensor_destroy(back_t));
    } else {
        EXPECT_OK(fp8amp_quantize(ctx, x, q));
    }
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, res->q, n * 2));
    EXPECT_OK(fp8amp_dequantize(ctx, q, back));
    EXPECT_OK(fp8amp_tensor_copy_to_host(back, res->back, n * 4));
    EXPECT_OK(fp8amp_scaling_get(s, &res->scale, &res->scale_inv, &res->amax));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &res->stats));
    fp8amp_tensor all[5] = {x, x_owner, q, q_owner, back};
    for (int i = 0; i < 5; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The float32 bits of decode(c) * si for an F16 code c (canonical NaN, keeping the sign). */
static uint32_t dequant_f32_ref(uint32_t c, float si) {
    const double p = mul_f32_ref(decode_ref(&FMT_F16, c), si);
    if (isnan(p)) return (signbit(p) ? 0x80000000u : 0u) | 0x7FC00000u;
    return f32_bits((float)p);
}

/* Checks a run against the references; `scale` is the scale the data must have been quantized with. */
static void check_f16(fp8amp_dtype sd, const void *src, size_t n, float scale, const f16_result_t *res,
                      const char *what) {
    uint64_t sat = 0, under = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const double x = value_at(sd, src, i);
        const double y = mul_f32_ref(x, scale);
        const uint32_t want = encode_satfinite_ieee_ref(&FMT_F16, y);
        if (res->q[i] != want && ++bad <= 8)
            print_error("%s: %s %a * %a -> f16: got 0x%04x, want 0x%04x (element %zu)\n", what, fp8amp_dtype_name(sd), x,
                        (double)scale, res->q[i], want, i);
        if (!isnan(y) && fabs(y) > F16_MAX) ++sat;
        if (x != 0.0 && !isnan(x) && (want & 0x7FFFu) == 0) ++under;
        if (f32_bits(res->back[i]) != dequant_f32_ref(res->q[i], res->scale_inv) && ++bad <= 8)
            print_error("%s: dequantize of 0x%04x with scale_inv %a gave %a\n", what, res->q[i], (double)res->scale_inv,
                        (double)res->back[i]);
    }
    assert_int_equal(bad, 0);
    const float amax = (float)amax_ref(sd, src, n);
    if (f32_bits(res->amax) != f32_bits(amax))
        print_error("%s: recorded amax %a, want %a\n", what, (double)res->amax, (double)amax);
    assert_true(f32_bits(res->amax) == f32_bits(amax));
    assert_true(f32_bits(res->scale) == f32_bits(scale));
    assert_true(f32_bits(res->scale_inv) == f32_bits(reciprocal_ref(scale)));
    assert_true(res->stats.quantized == n);
    if (res->stats.saturated != sat || res->stats.underflowed != under)
        print_error("%s: saturated %llu / %llu, underflowed %llu / %llu (library / reference)\n", what,
                    (unsigned long long)res->stats.saturated, (unsigned long long)sat,
                    (unsigned long long)res->stats.underflowed, (unsigned long long)under);
    assert_true(res->stats.saturated == sat);
    assert_true(res->stats.underflowed == under);
}

/* dst_t is the exact transpose of dst, and so are their dequantized values. */
static void check_transposed(const f16_result_t *res, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
            if (res->qt[c * rows + r] != res->q[r * cols + c]) {
                print_error("[%zu, %zu] of %zux%zu: dst_t 0x%04x, dst 0x%04x\n", r, c, rows, cols, res->qt[c * rows + r],
                            res->q[r * cols + c]);
                fail();
            }
            assert_true(f32_bits(res->back_t[c * rows + r]) == f32_bits(res->back[r * cols + c]));
        }
}

/* On a CUDA variant, the same run on the CPU must give the same bytes. */
static void compare_with_cpu(fp8amp_device device, fp8amp_dtype sd, const void *src, int ndim, const int64_t *shape,
                             const f16_run_t *o, const f16_result_t *res) {
    if (device.type != FP8AMP_DEVICE_CUDA) return;
    const size_t n = numel_of(ndim, shape);
    f16_result_t cpu;
    result_alloc(&cpu, n);
    run_f16(cpu_device(), sd, src, ndim, shape, o, &cpu);
    assert_memory_equal(cpu.q, res->q, n * 2);
    assert_memory_equal(cpu.back, res->back, n * 4);
    if (o->transpose) {
        assert_memory_equal(cpu.qt, res->qt, n * 2);
        assert_memory_equal(cpu.back_t, res->back_t, n * 4);
    }
    assert_true(f32_bits(cpu.scale) == f32_bits(res->scale));
    assert_true(f32_bits(cpu.scale_inv) == f32_bits(res->scale_inv));
    assert_true(f32_bits(cpu.amax) == f32_bits(res->amax));
    assert_memory_equal(&cpu.stats, &res->stats, sizeof cpu.stats);
    result_free(&cpu);
}

/* ---- tests ------------------------------------------------------------------------------------ */

/* The reference itself, on values whose F16 codes are known by hand. */
static void test_f16_reference_known_values(void **state) {
    (void)state;
    static const struct {
        double x;
        uint32_t code;
    } known[] = {
        {1.0, 0x3C00},
        {-2.0, 0xC000},
        {65504.0, 0x7BFF},
        {65505.0, 0x7BFF},            /* rounds to 65504 */
        {65519.99, 0x7BFF},           /* just below the tie */
        {65520.0, 0x7BFF},            /* the tie rounds up to 65536: saturates */
        {1e30, 0x7BFF},
        {-1e30, 0xFBFF},
        {1.0 + 0x1p-11, 0x3C00},      /* tie to even */
        {1.0 + 3 * 0x1p-11, 0x3C02},  /* tie to even, upwards */
        {0x1p-14, 0x0400},            /* smallest normal */
        {0x1p-14 - 0x1p-25, 0x0400},  /* a subnormal that rounds up into the normals (tie, even) */
        {0x1p-24, 0x0001},            /* smallest subnormal */
        {0x1p-25, 0x0000},            /* half of it: tie to even, zero */
        {0x1.0001p-25, 0x0001},
        {-0x1p-26, 0x8000},
        {3 * 0x1p-24, 0x0003},
        {0.0, 0x0000},
        {-0.0, 0x8000},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; ++k) {
        const uint32_t got = encode_satfinite_ieee_ref(&FMT_F16, known[k].x);
        if (got != known[k].code) print_error("%a: 0x%04x, want 0x%04x\n", known[k].x, got, known[k].code);
        assert_int_equal(got, known[k].code);
    }
    assert_int_equal(encode_satfinite_ieee_ref(&FMT_F16, INFINITY), 0x7BFF);
    assert_int_equal(encode_satfinite_ieee_ref(&FMT_F16, -INFINITY), 0xFBFF);
    assert_int_equal(encode_satfinite_ieee_ref(&FMT_F16, NAN), 0x7E00);
    assert_int_equal(encode_satfinite_ieee_ref(&FMT_F16, -NAN), 0xFE00);
    assert_true(fp8_max_ref(&FMT_F16) == F16_MAX);
    /* code_of_value_ref inverts decode_ref on every finite code */
    for (uint32_t c = 0; c < 0x10000u; ++c) {
        const double v = decode_ref(&FMT_F16, c);
        if (isnan(v) || isinf(v)) continue;
        assert_int_equal(code_of_value_ref(&FMT_F16, v), c);
    }
    assert_int_equal(dequant_f32_ref(0xFE00, 2.0f), 0xFFC00000u);
    assert_int_equal(dequant_f32_ref(0x7C00, 0.5f), 0x7F800000u);
}

/* F32/F16/BF16 into scaled F16 over many shapes, delayed scaling with a random scale; every third
 * shape at unaligned addresses. */
static void test_f16_quantize_random(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    static const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {
        {1, {1}},    {1, {7}},       {1, {8}},       {1, {15}},       {1, {17}},       {1, {33}},  {1, {1000}},
        {0, {0}},    {2, {15, 17}},  {3, {3, 5, 7}}, {3, {2, 1, 33}}, {3, {4, 4, 4}}, {2, {1, 1}}, {1, {65537}},
        {1, {1000003}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
        const size_t n = numel_of(shapes[k].ndim, shapes[k].shape);
        void *src = xmalloc(n * 4);
        f16_result_t res;
        result_alloc(&res, n);
        for (int si = 0; si < 3; ++si) {
            const fp8amp_dtype sd = WIDE[si];
            const f16_run_t o = {FP8AMP_SCALING_DELAYED, 0, 0, random_scale(-8, 8), 0, k % 3 == 2};
            /* wide enough to saturate 65504 and to underflow 2^-25 after scaling (F16 sources are
             * clamped to their own range; the scale moves them out of it) */
            gen_values(sd, src, n, -40, 40, (k % 2) == 0);
            run_f16(device, sd, src, shapes[k].ndim, shapes[k].shape, &o, &res);
            check_f16(sd, src, n, o.scale, &res, "quantize");
            compare_with_cpu(device, sd, src, shapes[k].ndim, shapes[k].shape, &o, &res);
        }
        result_free(&res);
        free(src);
    }
}

/* Current scaling: the scale comes from the input's own amax, in the same call; with a margin and
 * power-of-two scales too; through quantize and quantize_transpose. */
static void test_f16_current_scaling(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int64_t shapes[3][2] = {{1, 1}, {37, 29}, {513, 1023}};
    for (int k = 0; k < 3; ++k) {
        const size_t n = numel_of(2, shapes[k]), rows = (size_t)shapes[k][0], cols = (size_t)shapes[k][1];
        void *src = xmalloc(n * 4);
        f16_result_t res;
        result_alloc(&res, n);
        for (int si = 0; si < 3; ++si)
            for (int variant = 0; variant < 2; ++variant) {
                const int lo = (int)(test_rng_u64() % 40) - 20;
                gen_values(WIDE[si], src, n, lo, lo + 12, 0);
                const int margin = variant ? 2 : 0, pow2 = variant;
                const float previous = random_scale(-2, 2);
                const float scale = scale_ref(F16_MAX, margin, pow2, amax_ref(WIDE[si], src, n), previous);
                for (int transpose = 0; transpose < 2; ++transpose) {
                    const f16_run_t o = {FP8AMP_SCALING_CURRENT, margin, pow2, previous, transpose, k == 1};
                    run_f16(device, WIDE[si], src, 2, shapes[k], &o, &res);
                    check_f16(WIDE[si], src, n, scale, &res, "current scaling");
                    if (transpose) check_transposed(&res, rows, cols);
                    compare_with_cpu(device, WIDE[si], src, 2, shapes[k], &o, &res);
                }
            }
        result_free(&res);
        free(src);
    }
}

/* quantize_transpose into scaled F16: dst is what quantize gives, dst_t its exact transpose, both
 * with the same scale_inv, statistics counted once; 2-D shapes around the 32x32 tiles, N-D, 1-D. */
static void test_f16_quantize_transpose_shapes(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    static const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {
        {2, {1, 1}},     {2, {1, 37}},     {2, {53, 1}},   {2, {17, 33}},  {2, {32, 32}},  {2, {64, 64}},
        {2, {65, 127}},  {2, {128, 256}},  {2, {1000, 24}}, {2, {3, 1000}}, {2, {31, 32}}, {2, {33, 65}},
        {2, {256, 130}}, {3, {2, 3, 5}},   {3, {7, 1, 16}}, {1, {9}},       {1, {1}},      {0, {0}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
        const int ndim = shapes[k].ndim;
        const size_t n = numel_of(ndim, shapes[k].shape);
        const size_t cols = ndim ? (size_t)shapes[k].shape[ndim - 1] : 1, rows = n / cols;
        const fp8amp_dtype sd = WIDE[k % 3];
        void *src = xmalloc(n * 4);
        gen_values(sd, src, n, -30, 24, (k % 3) == 1);
        f16_run_t o = {FP8AMP_SCALING_DELAYED, 0, 0, random_scale(-6, 6), 1, k % 4 == 3};
        f16_result_t t, plain;
        result_alloc(&t, n);
        result_alloc(&plain, n);
        run_f16(device, sd, src, ndim, shapes[k].shape, &o, &t);
        check_f16(sd, src, n, o.scale, &t, "quantize_transpose");
        check_transposed(&t, rows, cols);
        compare_with_cpu(device, sd, src, ndim, shapes[k].shape, &o, &t);
        o.transpose = 0;
        run_f16(device, sd, src, ndim, shapes[k].shape, &o, &plain);
        assert_memory_equal(t.q, plain.q, n * 2);
        assert_true(f32_bits(t.amax) == f32_bits(plain.amax));
        assert_memory_equal(&t.stats, &plain.stats, sizeof t.stats); /* counted once, not twice */
        result_free(&t);
        result_free(&plain);
        free(src);
    }
}

/* Dequantize every F16 code (and random ones) into F32/F16/BF16, with scales that overflow and
 * underflow each destination, at aligned and unaligned addresses. */
static void test_f16_dequantize_all_codes(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const size_t n = 0x10000 + 1001;
    const int64_t shape[2] = {1, (int64_t)n};
    uint16_t *codes = xmalloc(n * 2);
    uint32_t *out = xmalloc(n * 4), *cpu_out = xmalloc(n * 4);
    for (size_t i = 0; i < n; ++i) codes[i] = (uint16_t)(i < 0x10000 ? i : test_rng_u64());
    /* 2^-126: scale_inv 2^126 overflows every normal code into inf (F32 too) */
    const float scales[] = {random_scale(-10, 10), random_scale(-10, 10), 0x1p-20f, 0x1p20f, 0x1p-126f, 1.0f};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; ++k)
        for (int wi = 0; wi < 3; ++wi)
            for (int misalign = 0; misalign < 2; ++misalign) {
                const fp8amp_dtype dd = WIDE[wi];
                const format_t *df = format_of(dd);
                for (int pass = 0; pass < (device.type == FP8AMP_DEVICE_CUDA ? 2 : 1); ++pass) {
                    fp8amp_context c = make_context(pass ? cpu_device() : device);
                    fp8amp_recipe r;
                    fp8amp_scaling s;
                    fp8amp_tensor q_owner, y_owner;
                    EXPECT_OK(fp8amp_recipe_init_default(&r));
                    EXPECT_OK(fp8amp_scaling_create(c, &r, FP8AMP_DTYPE_F16, &s));
                    EXPECT_OK(fp8amp_scaling_set_scale(s, scales[k]));
                    fp8amp_tensor q = make_placed(c, FP8AMP_DTYPE_F16, 2, shape, misalign, &q_owner);
                    fp8amp_tensor y = make_placed(c, dd, 2, shape, misalign, &y_owner);
                    EXPECT_OK(fp8amp_tensor_set_scaling(q, s)); /* q's scale_inv = 1 / scales[k] */
                    EXPECT_OK(fp8amp_tensor_copy_from_host(q, codes, n * 2));
                    EXPECT_OK(fp8amp_dequantize(c, q, y));
                    EXPECT_OK(fp8amp_tensor_copy_to_host(y, pass ? cpu_out : out, n * fp8amp_dtype_size(dd)));
                    fp8amp_tensor all[4] = {q, q_owner, y, y_owner};
                    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
                    EXPECT_OK(fp8amp_scaling_destroy(s));
                    EXPECT_OK(fp8amp_context_destroy(c));
                }
                if (device.type == FP8AMP_DEVICE_CUDA) assert_memory_equal(out, cpu_out, n * fp8amp_dtype_size(dd));
                const float si = reciprocal_ref(scales[k]);
                size_t bad = 0;
                for (size_t i = 0; i < n; ++i) {
                    if (dd == FP8AMP_DTYPE_F32) {
                        const uint32_t want = dequant_f32_ref(codes[i], si);
                        if (out[i] != want && ++bad <= 8)
                            print_error("f16 0x%04x * %a -> f32: got 0x%08x, want 0x%08x\n", codes[i], (double)si,
                                        out[i], want);
                        continue;
                    }
                    const uint32_t got = ((const uint16_t *)out)[i];
                    /* rounded twice, as specified: to float32 by the multiply, then into dd (IEEE) */
                    const double p = mul_f32_ref(decode_ref(&FMT_F16, codes[i]), si);
                    if (isnan(p)) {
                        if (got != canonical_nan(df, signbit(p) ? 1 : 0) && ++bad <= 8)
                            print_error("NaN from 0x%04x -> %s: got 0x%04x\n", codes[i], fp8amp_dtype_name(dd), got);
                        continue;
                    }
                    const double want = round_ref(df, p);
                    const double got_v = decode_ref(df, got);
                    if ((got_v != want || signbit(got_v) != signbit(want)) && ++bad <= 8)
                        print_error("f16 0x%04x * %a -> %s: got 0x%04x (%a), want %a\n", codes[i], (double)si,
                                    fp8amp_dtype_name(dd), got, got_v, want);
                }
                assert_int_equal(bad, 0);
            }
    free(codes);
    free(out);
    free(cpu_out);
}

/* The edges by hand: saturation at 65504 (inf included), NaN keeping its sign, the underflow to
 * +-0, the counters, the recorded amax (NaN counts as inf) and an update that keeps the scale. */
static void test_f16_specials_and_stats(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    static const struct {
        float x;
        uint16_t code;
        int saturated, underflowed;
    } cases[] = {
        {65504.0f, 0x7BFF, 0, 0},        {65505.0f, 0x7BFF, 1, 0},          {65519.99f, 0x7BFF, 1, 0},
        {65520.0f, 0x7BFF, 1, 0},        {1e30f, 0x7BFF, 1, 0},             {-1e30f, 0xFBFF, 1, 0},
        {INFINITY, 0x7BFF, 1, 0},        {-INFINITY, 0xFBFF, 1, 0},         {NAN, 0x7E00, 0, 0},
        {-NAN, 0xFE00, 0, 0},            {0x1p-24f, 0x0001, 0, 0},          {0x1p-25f, 0x0000, 0, 1},
        {0x1.0002p-25f, 0x0001, 0, 0},   {-0x1p-26f, 0x8000, 0, 1},         {-0x1p-140f, 0x8000, 0, 1},
        {0.0f, 0x0000, 0, 0},            {-0.0f, 0x8000, 0, 0},             {1.0f, 0x3C00, 0, 0},
        {1.00048828125f, 0x3C00, 0, 0},  {1.00146484375f, 0x3C02, 0, 0},    {-3.0f, 0xC200, 0, 0},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    float x[N];
    uint16_t want[N];
    uint64_t sat = 0, under = 0;
    for (int i = 0; i < N; ++i) {
        x[i] = cases[i].x;
        want[i] = cases[i].code;
        sat += (uint64_t)cases[i].saturated;
        under += (uint64_t)cases[i].underflowed;
        assert_int_equal(encode_satfinite_ieee_ref(&FMT_F16, x[i]), want[i]); /* the reference agrees */
    }
    const int64_t shape[1] = {N};
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.amax_history_len = 2;
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &s));
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape), q = make_tensor(ctx, FP8AMP_DTYPE_F16, 1, shape);
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
    EXPECT_OK(fp8amp_quantize(ctx, src, q)); /* scale 1 */
    uint16_t got[N];
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, got, sizeof got));
    for (int i = 0; i < N; ++i) {
        if (got[i] != want[i]) print_error("%a -> 0x%04x, want 0x%04x\n", (double)x[i], got[i], want[i]);
        assert_int_equal(got[i], want[i]);
    }
    fp8amp_scaling_stats st;
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == N && st.saturated == sat && st.underflowed == under);
    float scale, scale_inv, amax;
    EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
    assert_true(isinf(amax) && amax > 0 && scale == 1.0f);
    EXPECT_OK(fp8amp_scaling_update(s)); /* amax inf: the scale stays */
    EXPECT_OK(fp8amp_scaling_get(s, &scale, &scale_inv, &amax));
    assert_true(scale == 1.0f && scale_inv == 1.0f && amax == 0.0f);

    /* a product that overflows float32 saturates too: 2^30 * 2^100 = inf -> 65504 */
    EXPECT_OK(fp8amp_scaling_set_scale(s, 0x1p100f));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_scaling_reset_stats(s));
    for (int i = 0; i < N; ++i) x[i] = (i & 1) ? -0x1p30f : 0x1p-130f; /* 2^-130 * 2^100 = 2^-30: underflows */
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
    EXPECT_OK(fp8amp_quantize(ctx, src, q));
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, got, sizeof got));
    for (int i = 0; i < N; ++i) assert_int_equal(got[i], (i & 1) ? 0xFBFF : 0x0000);
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == N && st.saturated == N / 2 && st.underflowed == N - N / 2);
    EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, &amax));
    assert_true(amax == 0x1p30f);

    EXPECT_OK(fp8amp_tensor_destroy(src));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A delayed-scaling cycle: quantize with scale 1, update (scale = 65504 / 2^margin / amax), quantize
 * again: the codes are the reference's and the round trip keeps F16's 11 bits. */
static void test_f16_delayed_cycle(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const size_t n = 4099;
    const int64_t shape[1] = {(int64_t)n};
    float *x = xmalloc(n * 4), *back = xmalloc(n * 4);
    uint16_t *q = xmalloc(n * 2);
    for (int margin = 0; margin <= 4; margin += 4) {
        fp8amp_recipe r;
        EXPECT_OK(fp8amp_recipe_init_default(&r));
        r.margin = margin;
        r.amax_history_len = 3;
        fp8amp_scaling s;
        EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &s));
        fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
        fp8amp_tensor dst = make_tensor(ctx, FP8AMP_DTYPE_F16, 1, shape);
        fp8amp_tensor out = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
        EXPECT_OK(fp8amp_tensor_set_scaling(dst, s));
        /* values far outside F16's range: 2^-60 .. 2^-40 (every one would be 0 unscaled) */
        const double spread = ldexp(1.0, -40 - (int)(test_rng_u64() % 20));
        for (size_t i = 0; i < n; ++i) x[i] = (float)(test_rng_uniform(-1, 1) * spread);
        EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, n * 4));
        EXPECT_OK(fp8amp_quantize(ctx, src, dst));
        EXPECT_OK(fp8amp_scaling_update(s));
        const double a = amax_ref(FP8AMP_DTYPE_F32, x, n);
        const float scale = scale_ref(F16_MAX, margin, 0, a, 1.0f);
        float got_scale;
        EXPECT_OK(fp8amp_scaling_get(s, &got_scale, NULL, NULL));
        assert_true(f32_bits(got_scale) == f32_bits(scale));
        EXPECT_OK(fp8amp_quantize(ctx, src, dst));
        EXPECT_OK(fp8amp_tensor_copy_to_host(dst, q, n * 2));
        EXPECT_OK(fp8amp_dequantize(ctx, dst, out));
        EXPECT_OK(fp8amp_tensor_copy_to_host(out, back, n * 4));
        for (size_t i = 0; i < n; ++i) {
            assert_int_equal(q[i], encode_satfinite_ieee_ref(&FMT_F16, mul_f32_ref(x[i], scale)));
            const double y = fabs((double)x[i] * scale);
            /* normal F16 range after scaling: relative error within half an ulp (2^-11) plus the two
             * float32 roundings */
            if (y >= 0x1p-14 && y <= F16_MAX)
                assert_true(fabs((double)back[i] - x[i]) <= fabs((double)x[i]) * (0x1p-11 + 0x1p-22));
        }
        EXPECT_OK(fp8amp_tensor_destroy(src));
        EXPECT_OK(fp8amp_tensor_destroy(dst));
        EXPECT_OK(fp8amp_tensor_destroy(out));
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    free(x);
    free(back);
    free(q);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- bad input: a specific status, and nothing changed ----------------------------------------- */

typedef struct {
    float scale, scale_inv, amax, hist[2];
    fp8amp_scaling_stats stats;
} meta_state_t;

static void meta_state(fp8amp_scaling s, meta_state_t *out) {
    memset(out, 0, sizeof *out);
    EXPECT_OK(fp8amp_scaling_get(s, &out->scale, &out->scale_inv, &out->amax));
    EXPECT_OK(fp8amp_scaling_get_history(s, 2, out->hist));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &out->stats));
}


static void test_f16_bad_input(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.amax_history_len = 2;
    fp8amp_scaling mh, mh2, m4;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &mh));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_F16, &mh2));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &m4));
    EXPECT_OK(fp8amp_scaling_enable_stats(mh, 1));

    const int64_t s48[2] = {4, 8}, s84[2] = {8, 4};
    fp8amp_tensor src = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, s48);
    fp8amp_tensor h = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, s48);         /* bound to mh */
    fp8amp_tensor h_unbound = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, s48);
    fp8amp_tensor h84 = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, s84);       /* bound to mh: a wrong dst shape */
    fp8amp_tensor h_t = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, s84);       /* bound to mh */
    fp8amp_tensor h_t_other = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, s84); /* bound to mh2 */
    fp8amp_tensor e4_t = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, s84);     /* bound to m4 */
    fp8amp_tensor bf = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, s48);
    fp8amp_tensor f32 = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, s48);
    fp8amp_tensor f32_84 = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, s84);
    fp8amp_tensor e4 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, s48);       /* bound to m4 */
    EXPECT_OK(fp8amp_tensor_set_scaling(h, mh));
    EXPECT_OK(fp8amp_tensor_set_scaling(h84, mh));
    EXPECT_OK(fp8amp_tensor_set_scaling(h_t, mh));
    EXPECT_OK(fp8amp_tensor_set_scaling(h_t_other, mh2));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4_t, m4));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4, m4));

    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = (float)test_rng_uniform(-1e6, 1e6);
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
    EXPECT_OK(fp8amp_quantize(ctx, src, h)); /* a non-trivial meta state */
    EXPECT_OK(fp8amp_scaling_update(mh));
    EXPECT_OK(fp8amp_quantize(ctx, src, h));
    uint8_t poison[128];
    for (int i = 0; i < 128; ++i) poison[i] = (uint8_t)(0x11 * (i % 7) + 3);
    fp8amp_tensor dsts[9] = {h, h_unbound, h84, h_t, h_t_other, bf, f32, f32_84, e4_t};
    for (int i = 0; i < 9; ++i) EXPECT_OK(fp8amp_tensor_copy_from_host(dsts[i], poison, tensor_bytes(dsts[i])));
    meta_state_t before_h, before_h2, before_4, now;
    meta_state(mh, &before_h);
    meta_state(mh2, &before_h2);
    meta_state(m4, &before_4);
    assert_true(before_h.amax > 0.0f && before_h.scale != 1.0f && before_h.stats.quantized == 64);

    /* binding: F16 tensors to F16 metas only, FP8 tensors to their own */
    EXPECT_STATUS(fp8amp_tensor_set_scaling(h, m4), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(h_unbound, m4), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(e4, mh), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(bf, mh), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(f32, mh), FP8AMP_ERROR_DTYPE_MISMATCH);

    /* quantize */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, h_unbound), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize(ctx, src, bf), FP8AMP_ERROR_DTYPE_MISMATCH); /* bf16 is not a scaled dtype */
    EXPECT_STATUS(fp8amp_quantize(ctx, e4, h), FP8AMP_ERROR_DTYPE_MISMATCH);   /* an FP8 source */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, h84), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize(ctx, h, h), FP8AMP_ERROR_INVALID_ARGUMENT);   /* in place: overlap */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, NULL), FP8AMP_ERROR_INVALID_HANDLE);

    /* quantize_transpose */
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, h, e4_t), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, h, h_t_other), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, h_unbound, h_t), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, h, h), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, h, f32_84), FP8AMP_ERROR_DTYPE_MISMATCH);

    /* dequantize */
    EXPECT_STATUS(fp8amp_dequantize(ctx, h_unbound, f32), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_dequantize(ctx, bf, f32), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_dequantize(ctx, h, e4), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_dequantize(ctx, h, f32_84), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_dequantize(ctx, h, h), FP8AMP_ERROR_INVALID_ARGUMENT); /* overlap */

    /* read-only destinations */
    struct DLManagedTensorVersioned *m = NULL;
    fp8amp_tensor ro_h, ro_f32;
    EXPECT_OK(fp8amp_tensor_to_dlpack(h, &m));
    m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &ro_h));
    EXPECT_OK(fp8amp_tensor_to_dlpack(f32, &m));
    m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &ro_f32));
    EXPECT_OK(fp8amp_tensor_set_scaling(ro_h, mh));
    EXPECT_STATUS(fp8amp_quantize(ctx, src, ro_h), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_dequantize(ctx, h, ro_f32), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_destroy(ro_h));
    EXPECT_OK(fp8amp_tensor_destroy(ro_f32));

    /* another device */
    if (have_cuda()) {
        fp8amp_context other = make_context(device.type == FP8AMP_DEVICE_CUDA ? cpu_device() : cuda_device(0));
        fp8amp_scaling m_other;
        EXPECT_OK(fp8amp_scaling_create(other, &r, FP8AMP_DTYPE_F16, &m_other));
        fp8amp_tensor src_other = make_tensor(other, FP8AMP_DTYPE_F32, 2, s48);
        fp8amp_tensor h_other = make_tensor(other, FP8AMP_DTYPE_F16, 2, s48);
        EXPECT_OK(fp8amp_tensor_set_scaling(h_other, m_other));
        EXPECT_STATUS(fp8amp_tensor_set_scaling(h, m_other), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(ctx, src_other, h), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(ctx, src, h_other), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_dequantize(other, h, f32), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src_other, h, h_t), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_OK(fp8amp_tensor_destroy(src_other));
        EXPECT_OK(fp8amp_tensor_destroy(h_other));
        EXPECT_OK(fp8amp_scaling_destroy(m_other));
        EXPECT_OK(fp8amp_context_destroy(other));
    }

    /* nothing changed */
    for (int i = 0; i < 9; ++i) expect_bytes(dsts[i], poison, tensor_bytes(dsts[i]));
    meta_state(mh, &now);
    assert_memory_equal(&now, &before_h, sizeof now);
    meta_state(mh2, &now);
    assert_memory_equal(&now, &before_h2, sizeof now);
    meta_state(m4, &now);
    assert_memory_equal(&now, &before_4, sizeof now);

    /* and the good calls still work */
    EXPECT_OK(fp8amp_quantize_transpose(ctx, src, h, h_t));
    EXPECT_OK(fp8amp_dequantize(ctx, h, f32));
    meta_state(mh, &now);
    assert_true(now.stats.quantized == before_h.stats.quantized + 32);

    fp8amp_tensor all[11] = {src, h, h_unbound, h84, h_t, h_t_other, e4_t, bf, f32, f32_84, e4};
    for (int i = 0; i < 11; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(mh));
    EXPECT_OK(fp8amp_scaling_destroy(mh2));
    EXPECT_OK(fp8amp_scaling_destroy(m4));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_reference_known_values),
        DEVICE_TESTS(test_f16_quantize_random),
        DEVICE_TESTS(test_f16_current_scaling),
        DEVICE_TESTS(test_f16_quantize_transpose_shapes),
        DEVICE_TESTS(test_f16_dequantize_all_codes),
        DEVICE_TESTS(test_f16_specials_and_stats),
        DEVICE_TESTS(test_f16_delayed_cycle),
        DEVICE_TESTS(test_f16_bad_input),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
