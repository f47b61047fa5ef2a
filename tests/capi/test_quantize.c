/* Casting with scales: fp8amp_quantize, fp8amp_quantize_transpose, fp8amp_dequantize, fp8amp_amax,
 * fp8amp_tensor_set_scaling, and the statistics of a meta, checked against references computed in
 * the test (fp8_reference.h): the input scaled in float32 (x * scale, one rounding), then the nearest
 * FP8 code by brute force over the 256 codes, saturating; amax exact; dequantize as decode(q) *
 * scale_inv in float32, rounded into the destination. Fresh random data of many shapes every run.
 * Each test runs on the CPU and on CUDA (skipped without a GPU); the CUDA run is also compared byte
 * for byte with the same run on the CPU. */
#include "fp8amp/dlpack.h"
#include "fp8_reference.h"
#include "test_gen.h"
#include "test_util.h"

static const fp8amp_dtype WIDE[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16};
static const fp8amp_dtype FP8[2] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2};


/* ---- one quantize on a device ------------------------------------------------------------------ */

typedef struct {
    uint8_t *q;  /* dst codes */
    uint8_t *qt; /* dst_t codes (quantize_transpose) */
    float *back; /* dequantize(dst) into F32 */
    float *back_t; /* dequantize(dst_t) into F32 */
    float scale, scale_inv, amax;
    fp8amp_scaling_stats stats;
} qresult_t;

static void qresult_alloc(qresult_t *r, size_t n) {
    memset(r, 0, sizeof *r);
    r->q = malloc(n);
    r->qt = malloc(n);
    r->back = malloc(n * sizeof(float));
    r->back_t = malloc(n * sizeof(float));
    assert_true(r->q && r->qt && r->back && r->back_t);
}

static void qresult_free(qresult_t *r) {
    free(r->q);
    free(r->qt);
    free(r->back);
    free(r->back_t);
}

/* Quantizes src (host data of dtype sd and shape) into dd on `device` with a fresh meta of `mode`
 * whose scale is set to `scale` first (under current scaling it is only the previous scale), with
 * statistics on; transpose: through fp8amp_quantize_transpose. Reads back everything. */
static void run_quantize(fp8amp_device device, fp8amp_dtype sd, const void *src, int ndim, const int64_t *shape,
                         fp8amp_dtype dd, fp8amp_scaling_mode mode, float scale, int transpose, qresult_t *res) {
    const size_t n = numel_of(ndim, shape);
    fp8amp_context ctx;
    fp8amp_recipe r;
    fp8amp_scaling s;
    fp8amp_tensor x, q, back, qt = NULL, back_t = NULL;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.mode = mode;
    r.amax_history_len = 4;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, dd, &s));
    EXPECT_OK(fp8amp_scaling_set_scale(s, scale));
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    EXPECT_OK(fp8amp_tensor_create(ctx, sd, ndim, shape, &x));
    EXPECT_OK(fp8amp_tensor_create(ctx, dd, ndim, shape, &q));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, ndim, shape, &back));
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, src, n * fp8amp_dtype_size(sd)));
    memset(res->q, 0xA5, n); /* poison: every element must be written */
    EXPECT_OK(fp8amp_tensor_copy_from_host(q, res->q, n));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    if (transpose) {
        const int64_t cols = ndim ? shape[ndim - 1] : 1;
        const int64_t tshape[2] = {cols, (int64_t)n / cols};
        EXPECT_OK(fp8amp_tensor_create(ctx, dd, 2, tshape, &qt));
        EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, tshape, &back_t));
        memset(res->qt, 0x5A, n);
        EXPECT_OK(fp8amp_tensor_copy_from_host(qt, res->qt, n));
        EXPECT_OK(fp8amp_tensor_set_scaling(qt, s));
        EXPECT_OK(fp8amp_quantize_transpose(ctx, x, q, qt));
        EXPECT_OK(fp8amp_tensor_copy_to_host(qt, res->qt, n));
        EXPECT_OK(fp8amp_dequantize(ctx, qt, back_t));
        EXPECT_OK(fp8amp_tensor_copy_to_host(back_t, res->back_t, n * sizeof(float)));
        EXPECT_OK(fp8amp_tensor_destroy(qt));
        EXPECT_OK(fp8amp_tensor_destroy(back_t));
    } else {
        EXPECT_OK(fp8amp_quantize(ctx, x, q));
    }
    EXPECT_OK(fp8amp_tensor_copy_to_host(q, res->q, n));
    EXPECT_OK(fp8amp_dequantize(ctx, q, back));
    EXPECT_OK(fp8amp_tensor_copy_to_host(back, res->back, n * sizeof(float)));
    EXPECT_OK(fp8amp_scaling_get(s, &res->scale, &res->scale_inv, &res->amax));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &res->stats));
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_tensor_destroy(back));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The float32 dequantize reference of code c with scale_inv si: canonical NaN keeping the sign. */
static uint32_t dequant_f32_ref(const format_t *f, uint32_t c, float si) {
    const double p = mul_f32_ref(decode_ref(f, c), si);
    if (isnan(p)) return (signbit(p) ? 0x80000000u : 0u) | 0x7FC00000u;
    return f32_bits((float)p);
}

/* Whether `got` (the bits of a dd value) is the dequantize of code c from sd with scale_inv si: for
 * F32 the float32 product; otherwise that product rounded again into dd (rounded twice, as
 * specified), NaN as dd's canonical NaN with the product's sign. */
static int dequant_matches(fp8amp_dtype sd, fp8amp_dtype dd, uint8_t c, float si, uint32_t got) {
    const format_t *sf = format_of(sd), *df = format_of(dd);
    if (dd == FP8AMP_DTYPE_F32) return got == dequant_f32_ref(sf, c, si);
    const double p = mul_f32_ref(decode_ref(sf, c), si);
    if (isnan(p)) return got == canonical_nan(df, signbit(p) ? 1 : 0);
    const double want = round_ref(df, p), got_v = decode_ref(df, got);
    return got_v == want && signbit(got_v) == signbit(want);
}

/* Checks a run against the references: codes, amax, scale and scale_inv, dequantized values and
 * statistics. `scale` is the scale the data must have been quantized with. */
static void check_run(fp8amp_dtype sd, const void *src, size_t n, fp8amp_dtype dd, float scale, const qresult_t *res,
                      const char *what) {
    const format_t *f = format_of(dd);
    const double fp8_max = fp8_max_ref(f);
    uint64_t sat = 0, under = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const double x = value_at(sd, src, i);
        const double y = mul_f32_ref(x, scale);
        const uint32_t want = encode_fp8_ref(f, y);
        if (res->q[i] != want && ++bad <= 8)
            print_error("%s: %s %a * %a -> %s: got 0x%02x, want 0x%02x (element %zu)\n", what, fp8amp_dtype_name(sd), x,
                        (double)scale, fp8amp_dtype_name(dd), res->q[i], want, i);
        if (!isnan(y) && fabs(y) > fp8_max) ++sat;
        if (x != 0.0 && !isnan(x) && (want & 0x7Fu) == 0) ++under;
        if (f32_bits(res->back[i]) != dequant_f32_ref(f, res->q[i], res->scale_inv) && ++bad <= 8)
            print_error("%s: dequantize of 0x%02x with scale_inv %a gave %a\n", what, res->q[i],
                        (double)res->scale_inv, (double)res->back[i]);
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

/* On a CUDA variant, the same run on the CPU must give the same bytes. */
static void compare_with_cpu(fp8amp_device device, fp8amp_dtype sd, const void *src, int ndim, const int64_t *shape,
                             fp8amp_dtype dd, fp8amp_scaling_mode mode, float scale, int transpose,
                             const qresult_t *res) {
    if (device.type != FP8AMP_DEVICE_CUDA) return;
    const size_t n = numel_of(ndim, shape);
    qresult_t cpu;
    qresult_alloc(&cpu, n);
    run_quantize(cpu_device(), sd, src, ndim, shape, dd, mode, scale, transpose, &cpu);
    assert_memory_equal(cpu.q, res->q, n);
    assert_memory_equal(cpu.back, res->back, n * sizeof(float));
    if (transpose) {
        assert_memory_equal(cpu.qt, res->qt, n);
        assert_memory_equal(cpu.back_t, res->back_t, n * sizeof(float));
    }
    assert_true(f32_bits(cpu.scale) == f32_bits(res->scale));
    assert_true(f32_bits(cpu.scale_inv) == f32_bits(res->scale_inv));
    assert_true(f32_bits(cpu.amax) == f32_bits(res->amax));
    assert_memory_equal(&cpu.stats, &res->stats, sizeof cpu.stats);
    qresult_free(&cpu);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_references_known_values(void **state) {
    (void)state;
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 1.0625), 0x38); /* tie -> even (1.0) */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 10.5), 0x52);   /* tie -> even (10) */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 500.0), 0x7E);
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, -INFINITY), 0xFE);
    assert_int_equal(encode_fp8_ref(&FMT_E5M2, INFINITY), 0x7B);
    assert_int_equal(encode_fp8_ref(&FMT_E5M2, -NAN), 0xFE);
    assert_true(decode_ref(&FMT_F32, 0x3F800000u) == 1.0);
    assert_true(decode_ref(&FMT_F32, 0x00000001u) == ldexp(1.0, -149));
    assert_true(mul_f32_ref(3.0, 1.0f / 3.0f) == 1.0);
    assert_true(mul_f32_ref(0x1.000002p0, 0x1.000002p0f) == (double)0x1.000004p0f); /* rounded once */
    assert_true(mul_f32_ref(ldexp(1.0, 100), 0x1p28f) == INFINITY);
    assert_true(mul_f32_ref(-0.0, 2.0f) == 0.0 && signbit(mul_f32_ref(-0.0, 2.0f)));
    assert_int_equal(dequant_f32_ref(&FMT_E4M3, 0xFF, 2.0f), 0xFFC00000u);
    assert_int_equal(dequant_f32_ref(&FMT_E4M3, 0x7F, 2.0f), 0x7FC00000u);
    assert_int_equal(dequant_f32_ref(&FMT_E5M2, 0x7C, 0.5f), 0x7F800000u);
    assert_true(amax_ref(FP8AMP_DTYPE_E4M3, "\x7f", 1) == INFINITY);
}

/* F32/F16/BF16 into E4M3/E5M2 over many shapes, delayed scaling with a random scale. */
static void test_quantize_random(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    static const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {
        {1, {1}},       {1, {7}},     {1, {15}},       {1, {17}},      {1, {33}},
        {1, {1000}},    {0, {0}},     {2, {15, 17}},   {3, {3, 5, 7}}, {3, {2, 1, 33}},
        {3, {4, 4, 4}}, {2, {1, 1}},  {1, {1000003}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
        const size_t n = numel_of(shapes[k].ndim, shapes[k].shape);
        void *src = malloc(n * 4);
        assert_non_null(src);
        qresult_t res;
        qresult_alloc(&res, n);
        for (int si = 0; si < 3; ++si)
            for (int di = 0; di < 2; ++di) {
                const fp8amp_dtype sd = WIDE[si], dd = FP8[di];
                const float scale = random_scale(-6, 6);
                /* exponents wide enough to underflow and to saturate both formats */
                gen_values(sd, src, n, -24, 18, (k % 2) == 0);
                run_quantize(device, sd, src, shapes[k].ndim, shapes[k].shape, dd, FP8AMP_SCALING_DELAYED, scale, 0,
                             &res);
                check_run(sd, src, n, dd, scale, &res, "quantize");
                compare_with_cpu(device, sd, src, shapes[k].ndim, shapes[k].shape, dd, FP8AMP_SCALING_DELAYED, scale,
                                 0, &res);
            }
        qresult_free(&res);
        free(src);
    }
}

/* Current scaling: the scale comes from the input's own amax, in the same call. */
static void test_quantize_current_scaling(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int64_t shapes[3][2] = {{1, 1}, {37, 29}, {513, 1023}};
    for (int k = 0; k < 3; ++k) {
        const size_t n = numel_of(2, shapes[k]);
        void *src = malloc(n * 4);
        assert_non_null(src);
        qresult_t res;
        qresult_alloc(&res, n);
        for (int si = 0; si < 3; ++si)
            for (int di = 0; di < 2; ++di) {
                const int lo = (int)(test_rng_u64() % 40) - 20;
                gen_values(WIDE[si], src, n, lo, lo + 8, 0);
                const float previous = random_scale(-2, 2);
                const float scale =
                    scale_ref(fp8_max_ref(format_of(FP8[di])), 0, 0, amax_ref(WIDE[si], src, n), previous);
                for (int transpose = 0; transpose < 2; ++transpose) {
                    run_quantize(device, WIDE[si], src, 2, shapes[k], FP8[di], FP8AMP_SCALING_CURRENT, previous,
                                 transpose, &res);
                    check_run(WIDE[si], src, n, FP8[di], scale, &res, "current scaling");
                    if (transpose) { /* dst_t got the same scale_inv: its dequantized values are the transpose */
                        const size_t rows = (size_t)shapes[k][0], cols = (size_t)shapes[k][1];
                        for (size_t i = 0; i < rows; ++i)
                            for (size_t j = 0; j < cols; ++j) {
                                assert_int_equal(res.qt[j * rows + i], res.q[i * cols + j]);
                                assert_true(f32_bits(res.back_t[j * rows + i]) == f32_bits(res.back[i * cols + j]));
                            }
                    }
                    compare_with_cpu(device, WIDE[si], src, 2, shapes[k], FP8[di], FP8AMP_SCALING_CURRENT, previous,
                                     transpose, &res);
                }
            }
        qresult_free(&res);
        free(src);
    }
}

/* quantize_transpose: dst is what quantize gives, dst_t its exact transpose, both with the same
 * scale_inv; over 2-D shapes of every kind, plus N-D and 1-D sources. */
static void test_quantize_transpose_shapes(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    static const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {
        {2, {1, 1}},    {2, {1, 37}},    {2, {53, 1}},    {2, {17, 33}},   {2, {64, 64}},  {2, {65, 127}},
        {2, {128, 256}}, {2, {1000, 24}}, {2, {3, 1000}}, {2, {31, 32}},   {2, {33, 65}},  {2, {256, 130}},
        {3, {2, 3, 5}},  {3, {7, 1, 16}}, {1, {9}},       {1, {1}},        {0, {0}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
        const int ndim = shapes[k].ndim;
        const size_t n = numel_of(ndim, shapes[k].shape);
        const size_t cols = ndim ? (size_t)shapes[k].shape[ndim - 1] : 1, rows = n / cols;
        const fp8amp_dtype sd = WIDE[k % 3], dd = FP8[k % 2];
        void *src = malloc(n * 4);
        assert_non_null(src);
        gen_values(sd, src, n, -20, 16, (k % 3) == 1);
        const float scale = random_scale(-4, 4);
        qresult_t t, plain;
        qresult_alloc(&t, n);
        qresult_alloc(&plain, n);
        run_quantize(device, sd, src, ndim, shapes[k].shape, dd, FP8AMP_SCALING_DELAYED, scale, 1, &t);
        run_quantize(device, sd, src, ndim, shapes[k].shape, dd, FP8AMP_SCALING_DELAYED, scale, 0, &plain);
        check_run(sd, src, n, dd, scale, &t, "quantize_transpose");
        assert_memory_equal(t.q, plain.q, n);
        assert_true(f32_bits(t.amax) == f32_bits(plain.amax));
        assert_memory_equal(&t.stats, &plain.stats, sizeof t.stats); /* counted once, not twice */
        for (size_t r = 0; r < rows; ++r)
            for (size_t c = 0; c < cols; ++c) {
                if (t.qt[c * rows + r] != t.q[r * cols + c]) {
                    print_error("[%zu, %zu] of %zux%zu: dst_t 0x%02x, dst 0x%02x\n", r, c, rows, cols,
                                t.qt[c * rows + r], t.q[r * cols + c]);
                    fail();
                }
                assert_true(f32_bits(t.back_t[c * rows + r]) == f32_bits(t.back[r * cols + c]));
            }
        compare_with_cpu(device, sd, src, ndim, shapes[k].shape, dd, FP8AMP_SCALING_DELAYED, scale, 1, &t);
        qresult_free(&t);
        qresult_free(&plain);
        free(src);
    }
}

/* Dequantize from every FP8 code into F32/F16/BF16, with scales that make F16 overflow and every
 * destination underflow; the tensor's own scale_inv copy is what is used. */
static void test_dequantize_random(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const size_t n = 3 * 256 + 1001;
    const int64_t shape[2] = {1, (int64_t)n};
    uint8_t *codes = malloc(n);
    uint32_t *out = malloc(n * 4), *cpu_out = malloc(n * 4);
    assert_true(codes && out && cpu_out);
    for (size_t i = 0; i < n; ++i) codes[i] = (uint8_t)(i < 768 ? i : test_rng_u64());
    const float scales[] = {random_scale(-10, 10), random_scale(-10, 10), 0x1p-20f, 0x1p20f, 0x1p-126f, 1.0f}; /* FLT_MIN: scale_inv 2^126 overflows */
    for (int di = 0; di < 2; ++di)
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; ++k)
            for (int wi = 0; wi < 3; ++wi) {
                const fp8amp_dtype sd = FP8[di], dd = WIDE[wi];
                for (int pass = 0; pass < (device.type == FP8AMP_DEVICE_CUDA ? 2 : 1); ++pass) {
                    fp8amp_context c = ctx;
                    if (pass == 1) EXPECT_OK(fp8amp_context_create(cpu_device(), &c));
                    fp8amp_recipe r;
                    fp8amp_scaling s;
                    fp8amp_tensor q, y;
                    EXPECT_OK(fp8amp_recipe_init_default(&r));
                    EXPECT_OK(fp8amp_scaling_create(c, &r, sd, &s));
                    EXPECT_OK(fp8amp_scaling_set_scale(s, scales[k]));
                    EXPECT_OK(fp8amp_tensor_create(c, sd, 2, shape, &q));
                    EXPECT_OK(fp8amp_tensor_create(c, dd, 2, shape, &y));
                    EXPECT_OK(fp8amp_tensor_set_scaling(q, s)); /* q's scale_inv = 1 / scales[k] */
                    EXPECT_OK(fp8amp_tensor_copy_from_host(q, codes, n));
                    EXPECT_OK(fp8amp_dequantize(c, q, y));
                    EXPECT_OK(fp8amp_tensor_copy_to_host(y, pass ? cpu_out : out, n * fp8amp_dtype_size(dd)));
                    EXPECT_OK(fp8amp_tensor_destroy(q));
                    EXPECT_OK(fp8amp_tensor_destroy(y));
                    EXPECT_OK(fp8amp_scaling_destroy(s));
                    if (pass == 1) EXPECT_OK(fp8amp_context_destroy(c));
                }
                if (device.type == FP8AMP_DEVICE_CUDA) assert_memory_equal(out, cpu_out, n * fp8amp_dtype_size(dd));
                const float si = reciprocal_ref(scales[k]);
                size_t bad = 0;
                for (size_t i = 0; i < n; ++i) {
                    const uint32_t got = dd == FP8AMP_DTYPE_F32 ? out[i] : ((const uint16_t *)out)[i];
                    if (!dequant_matches(sd, dd, codes[i], si, got) && ++bad <= 8)
                        print_error("%s 0x%02x * %a -> %s: got 0x%08x\n", fp8amp_dtype_name(sd), codes[i], (double)si,
                                    fp8amp_dtype_name(dd), got);
                }
                assert_int_equal(bad, 0);
            }
    free(codes);
    free(out);
    free(cpu_out);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Dequantize of one view: `len` codes at byte `src_off` of q_all into `len` dd values at element
 * `dst_off` of y_all (both on ctx's device); reads the result back into out. */
static void dequantize_view(fp8amp_context ctx, fp8amp_scaling s, fp8amp_tensor q_all, fp8amp_tensor y_all,
                            fp8amp_dtype sd, fp8amp_dtype dd, size_t src_off, size_t dst_off, size_t len, void *out) {
    void *pq, *py;
    fp8amp_tensor q, y;
    const int64_t shape[1] = {(int64_t)len};
    EXPECT_OK(fp8amp_tensor_data(q_all, &pq));
    EXPECT_OK(fp8amp_tensor_data(y_all, &py));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, sd, 1, shape, (uint8_t *)pq + src_off, &q));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, dd, 1, shape, (char *)py + dst_off * fp8amp_dtype_size(dd), &y));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_dequantize(ctx, q, y));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, out, len * fp8amp_dtype_size(dd)));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_tensor_destroy(y));
}

/* Dequantize of a large tensor (the GPU kernel's grid-stride loop goes round several times and ends
 * in a partial round and a scalar tail) and of views at every alignment of source and destination
 * (the GPU's scalar path): random codes, NaN and inf included, every FP8 -> F32/F16/BF16 pair, against
 * the reference and, on CUDA, byte for byte against the CPU. */
static void test_dequantize_large_and_views(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int cuda = device.type == FP8AMP_DEVICE_CUDA;
    const size_t n = ((size_t)9 << 20) + 13, small = 100003;
    const size_t cases[][3] = {/* src byte offset, dst element offset, length */
                               {0, 0, n}, {1, 0, small}, {8, 0, small}, {0, 1, small}, {3, 5, small}, {16, 8, small}};
    uint8_t *codes = malloc(n + 32);
    uint32_t *out = malloc(n * 4), *cpu_out = malloc(n * 4);
    assert_true(codes && out && cpu_out);
    for (size_t i = 0; i < n + 32; ++i) codes[i] = (uint8_t)test_rng_u64();
    fp8amp_context ctx[2];
    EXPECT_OK(fp8amp_context_create(device, &ctx[0]));
    EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx[1]));
    const int64_t all_shape[1] = {(int64_t)(n + 32)};
    for (int di = 0; di < 2; ++di)
        for (int wi = 0; wi < 3; ++wi) {
            const fp8amp_dtype sd = FP8[di], dd = WIDE[wi];
            const float scale = random_scale(-10, 10), si = reciprocal_ref(scale);
            fp8amp_scaling s[2];
            fp8amp_tensor q_all[2], y_all[2];
            for (int c = 0; c < 1 + cuda; ++c) {
                fp8amp_recipe r;
                EXPECT_OK(fp8amp_recipe_init_default(&r));
                EXPECT_OK(fp8amp_scaling_create(ctx[c], &r, sd, &s[c]));
                EXPECT_OK(fp8amp_scaling_set_scale(s[c], scale));
                EXPECT_OK(fp8amp_tensor_create(ctx[c], sd, 1, all_shape, &q_all[c]));
                EXPECT_OK(fp8amp_tensor_create(ctx[c], dd, 1, all_shape, &y_all[c]));
                EXPECT_OK(fp8amp_tensor_copy_from_host(q_all[c], codes, n + 32));
            }
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
                const size_t so = cases[k][0], dof = cases[k][1], len = cases[k][2];
                dequantize_view(ctx[0], s[0], q_all[0], y_all[0], sd, dd, so, dof, len, out);
                if (cuda) {
                    dequantize_view(ctx[1], s[1], q_all[1], y_all[1], sd, dd, so, dof, len, cpu_out);
                    assert_memory_equal(out, cpu_out, len * fp8amp_dtype_size(dd));
                }
                size_t bad = 0;
                for (size_t i = 0; i < len; ++i) {
                    const uint32_t got = dd == FP8AMP_DTYPE_F32 ? out[i] : ((const uint16_t *)out)[i];
                    if (!dequant_matches(sd, dd, codes[so + i], si, got) && ++bad <= 8)
                        print_error("%s -> %s, offsets %zu/%zu, element %zu (0x%02x): got 0x%08x\n",
                                    fp8amp_dtype_name(sd), fp8amp_dtype_name(dd), so, dof, i, codes[so + i], got);
                }
                assert_int_equal(bad, 0);
            }
            for (int c = 0; c < 1 + cuda; ++c) {
                EXPECT_OK(fp8amp_tensor_destroy(q_all[c]));
                EXPECT_OK(fp8amp_tensor_destroy(y_all[c]));
                EXPECT_OK(fp8amp_scaling_destroy(s[c]));
            }
        }
    EXPECT_OK(fp8amp_context_destroy(ctx[0]));
    EXPECT_OK(fp8amp_context_destroy(ctx[1]));
    free(codes);
    free(out);
    free(cpu_out);
}

/* The scale_inv a tensor dequantizes with is its own copy: set when it is bound and when it is
 * quantized into, not when the meta's scale changes. */
static void test_scale_inv_copy(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s));
    const int64_t shape[1] = {2};
    fp8amp_tensor x, q, y;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &x));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &q));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &y));
    const uint8_t two[2] = {0x40, 0xC0}; /* +2, -2 */
    float got[2];
    EXPECT_OK(fp8amp_scaling_set_scale(s, 4.0f));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s)); /* copy: 0.25 */
    EXPECT_OK(fp8amp_tensor_copy_from_host(q, two, 2));
    EXPECT_OK(fp8amp_scaling_set_scale(s, 8.0f)); /* the copy stays 0.25 */
    EXPECT_OK(fp8amp_dequantize(ctx, q, y));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, got, sizeof got));
    assert_true(got[0] == 0.5f && got[1] == -0.5f);
    const float v[2] = {1.0f, -3.0f};
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, v, sizeof v));
    EXPECT_OK(fp8amp_quantize(ctx, x, q)); /* quantized with 8: 8, -24; copy 0.125 */
    EXPECT_OK(fp8amp_dequantize(ctx, q, y));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, got, sizeof got));
    assert_true(got[0] == 1.0f && got[1] == -3.0f);
    /* rebinding refreshes the copy */
    EXPECT_OK(fp8amp_scaling_set_scale(s, 0.5f));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_dequantize(ctx, q, y));
    EXPECT_OK(fp8amp_tensor_copy_to_host(y, got, sizeof got));
    assert_true(got[0] == 16.0f && got[1] == -48.0f);
    /* unbinding: the tensor can be neither quantized into nor dequantized */
    EXPECT_OK(fp8amp_tensor_set_scaling(q, NULL));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, NULL));
    EXPECT_STATUS(fp8amp_dequantize(ctx, q, y), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize(ctx, x, q), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_set_scaling(x, NULL)); /* unbinding a tensor that was never bound */
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_tensor_destroy(y));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* NaN stays NaN (with its sign), inf saturates to +-max, the recorded amax becomes inf and the next
 * update keeps the previous scale. */
static void test_nan_and_inf(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    for (int di = 0; di < 2; ++di)
        for (int si = 0; si < 3; ++si) {
            const fp8amp_dtype dd = FP8[di], sd = WIDE[si];
            const format_t *sf = format_of(sd), *df = format_of(dd);
            const uint32_t inf = ((1u << sf->exp_bits) - 1) << sf->man_bits;
            const uint32_t sign = 1u << (sf->exp_bits + sf->man_bits);
            const uint32_t qnan = inf | (1u << (sf->man_bits - 1));
            const uint32_t in[6] = {qnan, sign | qnan, inf, sign | inf, make_code(sf, 0, 0, 0), sign | inf | 1u};
            uint8_t src[6 * 4];
            for (int i = 0; i < 6; ++i) set_code(sd, src, (size_t)i, in[i]);
            const int64_t shape[1] = {6};
            fp8amp_recipe r;
            fp8amp_scaling s;
            fp8amp_tensor x, q, y;
            EXPECT_OK(fp8amp_recipe_init_default(&r));
            r.amax_history_len = 2;
            EXPECT_OK(fp8amp_scaling_create(ctx, &r, dd, &s));
            EXPECT_OK(fp8amp_scaling_set_scale(s, 3.0f));
            EXPECT_OK(fp8amp_tensor_create(ctx, sd, 1, shape, &x));
            EXPECT_OK(fp8amp_tensor_create(ctx, dd, 1, shape, &q));
            EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &y));
            EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
            EXPECT_OK(fp8amp_tensor_copy_from_host(x, src, 6 * fp8amp_dtype_size(sd)));
            EXPECT_OK(fp8amp_quantize(ctx, x, q));
            uint8_t got[6];
            EXPECT_OK(fp8amp_tensor_copy_to_host(q, got, 6));
            const uint32_t max = max_finite_code(df), top = 1u << 7;
            assert_int_equal(got[0], canonical_nan(df, 0));
            assert_int_equal(got[1], canonical_nan(df, 1));
            assert_int_equal(got[2], max);
            assert_int_equal(got[3], top | max);
            assert_int_equal(got[4], encode_fp8_ref(df, 3.0));
            assert_int_equal(got[5], canonical_nan(df, 1));
            float back[6];
            EXPECT_OK(fp8amp_dequantize(ctx, q, y));
            EXPECT_OK(fp8amp_tensor_copy_to_host(y, back, sizeof back));
            assert_int_equal(f32_bits(back[0]), 0x7FC00000u);
            assert_int_equal(f32_bits(back[1]), 0xFFC00000u);
            assert_true(back[2] == (float)mul_f32_ref(fp8_max_ref(df), 1.0f / 3.0f));
            float amax, scale;
            EXPECT_OK(fp8amp_scaling_get(s, NULL, NULL, &amax));
            assert_true(isinf(amax) && amax > 0);
            EXPECT_OK(fp8amp_amax(ctx, x, &amax));
            assert_true(isinf(amax) && amax > 0);
            EXPECT_OK(fp8amp_scaling_update(s));
            EXPECT_OK(fp8amp_scaling_get(s, &scale, NULL, &amax));
            assert_true(scale == 3.0f && amax == 0.0f);
            float h[2];
            EXPECT_OK(fp8amp_scaling_get_history(s, 2, h));
            assert_true(isinf(h[0]) && h[0] > 0 && h[1] == 0.0f);
            EXPECT_OK(fp8amp_tensor_destroy(x));
            EXPECT_OK(fp8amp_tensor_destroy(q));
            EXPECT_OK(fp8amp_tensor_destroy(y));
            EXPECT_OK(fp8amp_scaling_destroy(s));
        }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Statistics: exact counts on inputs built with known answers, accumulation, reset, off by default. */
static void test_statistics(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    /* E4M3 (max 448, smallest subnormal 2^-9) at scale 1 and then 2 */
    const float v4[16] = {500.0f,  -1e6f,   INFINITY, -INFINITY, 448.0f,   449.0f,    NAN,  0.0f,
                          -0.0f,   0x1p-11f, -0x1p-12f, 0x1p-10f, 0x1.8p-10f, 0x1p-9f, 1.0f, FLT_MIN};
    /* scale 1: saturated 500, -1e6, inf, -inf, 449; underflowed 2^-11, -2^-12, 2^-10 (tie to 0), FLT_MIN
     * scale 2: saturated also 448 (896); underflowed 2^-10, -2^-11, FLT_MIN (2^-10 * 2 = 2^-9 survives) */
    const int64_t shape[1] = {16};
    fp8amp_recipe r;
    fp8amp_scaling s;
    fp8amp_tensor x, q;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &x));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &q));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_tensor_copy_from_host(x, v4, sizeof v4));
    fp8amp_scaling_stats st;

    /* off by default: nothing is counted */
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 0 && st.saturated == 0 && st.underflowed == 0);

    EXPECT_OK(fp8amp_scaling_enable_stats(s, 7)); /* any nonzero value turns it on */
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 16 && st.saturated == 5 && st.underflowed == 4);
    EXPECT_OK(fp8amp_scaling_set_scale(s, 2.0f));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 32 && st.saturated == 11 && st.underflowed == 7);
    /* off again: the counters stay where they are */
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 0));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 32 && st.saturated == 11 && st.underflowed == 7);
    EXPECT_OK(fp8amp_scaling_reset_stats(s));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 0 && st.saturated == 0 && st.underflowed == 0);
    /* an update leaves the counters alone */
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    EXPECT_OK(fp8amp_quantize(ctx, x, q));
    EXPECT_OK(fp8amp_scaling_update(s));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 16);
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(s));

    /* E5M2 (max 57344, smallest subnormal 2^-16) at scale 1 */
    const float v5[10] = {60000.0f, 57344.0f, -61440.0f, 0x1p-18f, 0x1p-17f, 0x1.8p-17f, -0x1p-17f, NAN, INFINITY, 0.0f};
    /* saturated: 60000, -61440, inf; underflowed: 2^-18, 2^-17 (tie to 0), -2^-17 */
    const int64_t shape5[1] = {10};
    fp8amp_tensor x5;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E5M2, &s));
    EXPECT_OK(fp8amp_scaling_enable_stats(s, 1));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape5, &x5));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E5M2, 1, shape5, &q));
    EXPECT_OK(fp8amp_tensor_set_scaling(q, s));
    EXPECT_OK(fp8amp_tensor_copy_from_host(x5, v5, sizeof v5));
    EXPECT_OK(fp8amp_quantize(ctx, x5, q));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &st));
    assert_true(st.quantized == 10 && st.saturated == 3 && st.underflowed == 3);
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_tensor_destroy(x5));
    EXPECT_OK(fp8amp_scaling_destroy(s));
    EXPECT_OK(fp8amp_tensor_destroy(x));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    /* random inputs: counted against the reference in check_run (test_quantize_random) */
}

/* fp8amp_amax over every dtype, FP8 codes included (decoded without a scale). */
static void test_amax(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const size_t sizes[] = {1, 2, 17, 4096, 1000003};
    const fp8amp_dtype all[5] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3,
                                 FP8AMP_DTYPE_E5M2};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; ++k) {
        const size_t n = sizes[k];
        void *buf = malloc(n * 4);
        assert_non_null(buf);
        for (int d = 0; d < 5; ++d)
            for (int specials = 0; specials < 2; ++specials) {
                if (all[d] == FP8AMP_DTYPE_E4M3 || all[d] == FP8AMP_DTYPE_E5M2) {
                    for (size_t i = 0; i < n; ++i) {
                        uint8_t c = (uint8_t)test_rng_u64();
                        if (!specials) /* finite codes only */
                            while (isnan(decode_ref(format_of(all[d]), c)) || isinf(decode_ref(format_of(all[d]), c)))
                                c = (uint8_t)test_rng_u64();
                        ((uint8_t *)buf)[i] = c;
                    }
                } else {
                    gen_values(all[d], buf, n, -40, 40, specials);
                }
                const int64_t shape[1] = {(int64_t)n};
                fp8amp_tensor t;
                EXPECT_OK(fp8amp_tensor_create(ctx, all[d], 1, shape, &t));
                EXPECT_OK(fp8amp_tensor_copy_from_host(t, buf, n * fp8amp_dtype_size(all[d])));
                float got = -1.0f;
                EXPECT_OK(fp8amp_amax(ctx, t, &got));
                const float want = (float)amax_ref(all[d], buf, n);
                if (f32_bits(got) != f32_bits(want))
                    print_error("amax of %zu %s: got %a, want %a\n", n, fp8amp_dtype_name(all[d]), (double)got,
                                (double)want);
                assert_true(f32_bits(got) == f32_bits(want));
                EXPECT_OK(fp8amp_tensor_destroy(t));
            }
        free(buf);
    }
    /* zeros of both signs give +0 */
    const int64_t two[1] = {2};
    const float zeros[2] = {-0.0f, 0.0f};
    fp8amp_tensor t;
    float got = -1.0f;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, two, &t));
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, zeros, sizeof zeros));
    EXPECT_OK(fp8amp_amax(ctx, t, &got));
    assert_int_equal(f32_bits(got), 0);
    /* bad input: *amax untouched */
    got = -1.0f;
    EXPECT_STATUS(fp8amp_amax(ctx, t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_amax(NULL, t, &got), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_amax(ctx, NULL, &got), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_amax(ctx, (fp8amp_tensor)ctx, &got), FP8AMP_ERROR_INVALID_HANDLE);
    if (have_cuda()) {
        fp8amp_context other;
        EXPECT_OK(fp8amp_context_create(device.type == FP8AMP_DEVICE_CUDA ? cpu_device() : cuda_device(0), &other));
        EXPECT_STATUS(fp8amp_amax(other, t, &got), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_OK(fp8amp_context_destroy(other));
    }
    assert_true(got == -1.0f);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- bad input: a specific status, and nothing changed ----------------------------------------- */

#define HIST 4

typedef struct {
    float scale, scale_inv, amax, hist[HIST];
    fp8amp_scaling_stats stats;
} meta_state_t;

static void meta_state(fp8amp_scaling s, meta_state_t *out) {
    memset(out, 0, sizeof *out);
    EXPECT_OK(fp8amp_scaling_get(s, &out->scale, &out->scale_inv, &out->amax));
    EXPECT_OK(fp8amp_scaling_get_history(s, HIST, out->hist));
    EXPECT_OK(fp8amp_scaling_get_stats(s, &out->stats));
}


static void test_bad_input(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    fp8amp_recipe r;
    EXPECT_OK(fp8amp_recipe_init_default(&r));
    r.amax_history_len = HIST;
    fp8amp_scaling m4, m4b, m5;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &m4));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &m4b));
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E5M2, &m5));
    EXPECT_OK(fp8amp_scaling_enable_stats(m4, 1));

    const int64_t s48[2] = {4, 8}, s84[2] = {8, 4}, s44[2] = {4, 4};
    fp8amp_tensor src, src16, e4, e4_unbound, e4_84, e4_t, e4_t_wrong, e4_t_other, e5, f32, f32_84, f16, sq_src, sq;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, s48, &src));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F16, 2, s48, &src16));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s48, &e4));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s48, &e4_unbound));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s84, &e4_84));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s84, &e4_t));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s48, &e4_t_wrong));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s84, &e4_t_other));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E5M2, 2, s84, &e5));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, s48, &f32));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, s84, &f32_84));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F16, 2, s84, &f16));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, s44, &sq_src));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 2, s44, &sq));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4, m4));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4_84, m4));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4_t, m4));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4_t_wrong, m4));
    EXPECT_OK(fp8amp_tensor_set_scaling(e4_t_other, m4b));
    EXPECT_OK(fp8amp_tensor_set_scaling(e5, m5));
    EXPECT_OK(fp8amp_tensor_set_scaling(sq, m4));

    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = (float)test_rng_uniform(-600.0, 600.0);
    EXPECT_OK(fp8amp_tensor_copy_from_host(src, x, sizeof x));
    EXPECT_OK(fp8amp_tensor_copy_from_host(sq_src, x, 16 * sizeof(float)));
    EXPECT_OK(fp8amp_quantize(ctx, src, e4)); /* a non-trivial meta state */
    EXPECT_OK(fp8amp_scaling_update(m4));
    EXPECT_OK(fp8amp_quantize(ctx, src, e4));
    /* poison every destination */
    uint8_t poison[128];
    for (int i = 0; i < 128; ++i) poison[i] = (uint8_t)(0x11 * (i % 7) + 3);
    fp8amp_tensor fp8_dsts[7] = {e4, e4_unbound, e4_84, e4_t, e4_t_wrong, e4_t_other, e5};
    for (int i = 0; i < 7; ++i) EXPECT_OK(fp8amp_tensor_copy_from_host(fp8_dsts[i], poison, 32));
    EXPECT_OK(fp8amp_tensor_copy_from_host(sq, poison, 16));
    EXPECT_OK(fp8amp_tensor_copy_from_host(f32, poison, 128));
    EXPECT_OK(fp8amp_tensor_copy_from_host(f32_84, poison, 128));
    EXPECT_OK(fp8amp_tensor_copy_from_host(f16, poison, 64));
    meta_state_t before4, before4b, before5, now;
    meta_state(m4, &before4);
    meta_state(m4b, &before4b);
    meta_state(m5, &before5);
    assert_true(before4.amax > 0.0f && before4.scale != 1.0f && before4.stats.quantized == 64);

    /* quantize */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, e4_84), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize(ctx, src, f32), FP8AMP_ERROR_DTYPE_MISMATCH);      /* dst not FP8 */
    EXPECT_STATUS(fp8amp_quantize(ctx, e4, e4_84), FP8AMP_ERROR_DTYPE_MISMATCH);     /* src FP8 */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, e4_unbound), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize(ctx, src, f16), FP8AMP_ERROR_INVALID_ARGUMENT);    /* a scaled f16 dst needs a meta; meta before shape */
    EXPECT_STATUS(fp8amp_quantize(ctx, src16, e5), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize(NULL, src, e4), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_quantize(ctx, NULL, e4), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_quantize(ctx, src, (fp8amp_tensor)m4), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_quantize((fp8amp_context)src, src, e4), FP8AMP_ERROR_INVALID_HANDLE);

    /* dequantize */
    EXPECT_STATUS(fp8amp_dequantize(ctx, src, f32), FP8AMP_ERROR_DTYPE_MISMATCH);    /* src not FP8 */
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4, e4_t_wrong), FP8AMP_ERROR_DTYPE_MISMATCH); /* dst FP8 */
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4_unbound, f32), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4, f32_84), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4_unbound, f32_84), FP8AMP_ERROR_INVALID_ARGUMENT); /* meta before shape */
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4, NULL), FP8AMP_ERROR_INVALID_HANDLE);

    /* quantize_transpose */
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, e4_t_wrong), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, e4_t_other), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4_unbound, e4_t), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, e5), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, f32_84), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4_84, e4_t), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, e4_t_wrong), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, sq_src, sq, sq), FP8AMP_ERROR_INVALID_ARGUMENT); /* overlap */
    EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src, e4, NULL), FP8AMP_ERROR_INVALID_HANDLE);

    /* binding */
    EXPECT_STATUS(fp8amp_tensor_set_scaling(e4, m5), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(e4_unbound, m5), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(src, m4), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(f16, m5), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(NULL, m4), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_set_scaling(e4, (fp8amp_scaling)src), FP8AMP_ERROR_INVALID_HANDLE);
    fp8amp_scaling dead;
    EXPECT_OK(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &dead));
    EXPECT_OK(fp8amp_scaling_destroy(dead));
    EXPECT_STATUS(fp8amp_tensor_set_scaling(e4, dead), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_quantize(ctx, src, e4_unbound), FP8AMP_ERROR_INVALID_ARGUMENT); /* still unbound */

    /* history lengths out of range */
    fp8amp_scaling none = NULL;
    r.amax_history_len = 0;
    EXPECT_STATUS(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &none), FP8AMP_ERROR_INVALID_ARGUMENT);
    r.amax_history_len = 100000;
    EXPECT_STATUS(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &none), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(none);
    r.amax_history_len = HIST;

    /* overlap of source and destination */
    void *p;
    fp8amp_tensor alias;
    EXPECT_OK(fp8amp_tensor_data(src, &p));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_E4M3, 2, s48, (char *)p + 8, &alias));
    EXPECT_OK(fp8amp_tensor_set_scaling(alias, m4));
    EXPECT_STATUS(fp8amp_quantize(ctx, src, alias), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_destroy(alias));

    /* read-only destinations (imported through DLPack with the read-only flag) */
    struct DLManagedTensorVersioned *m = NULL;
    fp8amp_tensor ro_e4, ro_f32;
    EXPECT_OK(fp8amp_tensor_to_dlpack(e4, &m));
    m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &ro_e4));
    EXPECT_OK(fp8amp_tensor_to_dlpack(f32, &m));
    m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &ro_f32));
    EXPECT_OK(fp8amp_tensor_set_scaling(ro_e4, m4)); /* binding writes no data */
    EXPECT_STATUS(fp8amp_quantize(ctx, src, ro_e4), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_dequantize(ctx, e4, ro_f32), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_dequantize(ctx, ro_e4, f32));             /* a read-only source is fine */
    EXPECT_OK(fp8amp_tensor_copy_from_host(f32, poison, 128)); /* undo that write */
    EXPECT_OK(fp8amp_tensor_destroy(ro_e4));
    EXPECT_OK(fp8amp_tensor_destroy(ro_f32));

    /* another device */
    if (have_cuda()) {
        fp8amp_context other;
        EXPECT_OK(fp8amp_context_create(device.type == FP8AMP_DEVICE_CUDA ? cpu_device() : cuda_device(0), &other));
        fp8amp_scaling m_other;
        fp8amp_tensor src_other, e4_other;
        EXPECT_OK(fp8amp_scaling_create(other, &r, FP8AMP_DTYPE_E4M3, &m_other));
        EXPECT_OK(fp8amp_tensor_create(other, FP8AMP_DTYPE_F32, 2, s48, &src_other));
        EXPECT_OK(fp8amp_tensor_create(other, FP8AMP_DTYPE_E4M3, 2, s48, &e4_other));
        EXPECT_OK(fp8amp_tensor_set_scaling(e4_other, m_other));
        EXPECT_STATUS(fp8amp_tensor_set_scaling(e4, m_other), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_tensor_set_scaling(e4_other, m4), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(ctx, src_other, e4), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(ctx, src, e4_other), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(other, src, e4), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize_transpose(ctx, src_other, e4, e4_t), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_amax(ctx, src_other, &x[0]), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_dequantize(other, e4, f32), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_quantize(ctx, src, e4_unbound), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_OK(fp8amp_tensor_destroy(src_other));
        EXPECT_OK(fp8amp_tensor_destroy(e4_other));
        EXPECT_OK(fp8amp_scaling_destroy(m_other));
        EXPECT_OK(fp8amp_context_destroy(other));
    }

    /* nothing changed */
    for (int i = 0; i < 7; ++i) expect_bytes(fp8_dsts[i], poison, 32);
    expect_bytes(sq, poison, 16);
    expect_bytes(f32, poison, 128);
    expect_bytes(f32_84, poison, 128);
    expect_bytes(f16, poison, 64);
    meta_state(m4, &now);
    assert_memory_equal(&now, &before4, sizeof now);
    meta_state(m4b, &now);
    assert_memory_equal(&now, &before4b, sizeof now);
    meta_state(m5, &now);
    assert_memory_equal(&now, &before5, sizeof now);

    /* and the good calls still work: e4 is still bound to m4 */
    EXPECT_OK(fp8amp_quantize_transpose(ctx, src, e4, e4_t));
    EXPECT_OK(fp8amp_dequantize(ctx, e4, f32));
    meta_state(m4, &now);
    assert_true(now.stats.quantized == before4.stats.quantized + 32);

    fp8amp_tensor all[] = {src, src16, e4, e4_unbound, e4_84, e4_t, e4_t_wrong, e4_t_other, e5, f32, f32_84, f16,
                           sq_src, sq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(m4));
    EXPECT_OK(fp8amp_scaling_destroy(m4b));
    EXPECT_OK(fp8amp_scaling_destroy(m5));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_references_known_values),
        DEVICE_TESTS(test_quantize_random),
        DEVICE_TESTS(test_quantize_current_scaling),
        DEVICE_TESTS(test_quantize_transpose_shapes),
        DEVICE_TESTS(test_dequantize_random),
        DEVICE_TESTS(test_dequantize_large_and_views),
        DEVICE_TESTS(test_scale_inv_copy),
        DEVICE_TESTS(test_nan_and_inf),
        DEVICE_TESTS(test_statistics),
        DEVICE_TESTS(test_amax),
        DEVICE_TESTS(test_bad_input),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
