/* fp8amp_cast: the FP8 / F16 / BF16 / F32 codecs, checked exhaustively against references written
 * independently of the library's bit-twiddling:
 *   - decode_ref: the format definitions evaluated with ldexp in double precision;
 *   - encode_fp8_ref: brute force over all 256 codes (nearest value, ties to the even code,
 *     saturation to +-max, NaN to the canonical NaN with the input's sign);
 *   - round_ref: round-to-nearest-even by double arithmetic (for F16/BF16 destinations).
 * (fp8_reference.h holds them, shared with the scaled-cast tests.) Each test runs on the CPU and on
 * CUDA (skipped without a GPU); the CUDA run is also compared byte for byte with the CPU run. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

static uint32_t code_at(fp8amp_dtype d, const void *buf, size_t i) {
    switch (d) {
    case FP8AMP_DTYPE_F32: return ((const uint32_t *)buf)[i];
    case FP8AMP_DTYPE_F16:
    case FP8AMP_DTYPE_BF16: return ((const uint16_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

/* What converting the exact value v (from a source element) into dtype d must produce. Returns the
 * expected code and checks it against `got`; reports the first few mismatches. */
static int check_element(fp8amp_dtype d, double v, uint32_t got, uint32_t src_code, fp8amp_dtype src) {
    uint32_t want;
    const int sign = signbit(v) ? 1 : 0;
    if (d == FP8AMP_DTYPE_E4M3 || d == FP8AMP_DTYPE_E5M2) {
        want = encode_fp8_ref(format_of(d), v);
    } else if (d == FP8AMP_DTYPE_F32) {
        if (isnan(v)) want = ((uint32_t)sign << 31) | 0x7FC00000u;
        else want = f32_bits((float)v); /* every source value is exact in float32 */
    } else {
        const format_t *f = format_of(d);
        if (isnan(v)) {
            want = canonical_nan(f, sign);
        } else {
            const double r = round_ref(f, v);
            /* Find the code of r: the format's codes are ordered, so a search over magnitudes works;
             * for 16-bit formats compare decoded values instead of inverting. */
            const double got_v = decode_ref(f, got);
            const int ok = (got_v == r && signbit(got_v) == signbit(r));
            if (!ok)
                print_error("%s 0x%x (%.10g) -> %s: got 0x%x (%.10g), want %.10g\n", fp8amp_dtype_name(src), src_code,
                            v, fp8amp_dtype_name(d), got, got_v, r);
            return ok;
        }
    }
    if (got != want)
        print_error("%s 0x%x (%.10g) -> %s: got 0x%x, want 0x%x\n", fp8amp_dtype_name(src), src_code, v,
                    fp8amp_dtype_name(d), got, want);
    return got == want;
}

/* ---- running a cast on a device ------------------------------------------------------------- */

/* Casts n elements of host data `src` (dtype s) into `out` (dtype d) on `device`. */
static void run_cast(fp8amp_device device, fp8amp_dtype s, const void *src, size_t n, fp8amp_dtype d, void *out) {
    fp8amp_context ctx = NULL;
    fp8amp_tensor a = NULL, b = NULL;
    const int64_t shape[1] = {(int64_t)n};
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    EXPECT_OK(fp8amp_tensor_create(ctx, s, 1, shape, &a));
    EXPECT_OK(fp8amp_tensor_create(ctx, d, 1, shape, &b));
    EXPECT_OK(fp8amp_tensor_copy_from_host(a, src, n * fp8amp_dtype_size(s)));
    memset(out, 0xA5, n * fp8amp_dtype_size(d)); /* poison: every element must be written */
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, out, n * fp8amp_dtype_size(d)));
    EXPECT_OK(fp8amp_cast(ctx, a, b));
    EXPECT_OK(fp8amp_tensor_copy_to_host(b, out, n * fp8amp_dtype_size(d)));
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Converts src (n elements of dtype s) into every other dtype on the variant's device and checks
 * each element against the references; on CUDA also compares with the CPU bytes. */
static void check_all_destinations(void **state, fp8amp_dtype s, const void *src, size_t n) {
    static const fp8amp_dtype all[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3,
                                       FP8AMP_DTYPE_E5M2};
    const fp8amp_device device = variant_device(state);
    for (size_t k = 0; k < sizeof all / sizeof all[0]; ++k) {
        const fp8amp_dtype d = all[k];
        void *out = malloc(n * 4);
        assert_non_null(out);
        run_cast(device, s, src, n, d, out);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
            const double v = value_at(s, src, i);
            if (s == d) {
                /* same dtype: a bit copy */
                if (code_at(d, out, i) != code_at(s, src, i)) ++bad;
            } else if (!check_element(d, v, code_at(d, out, i), code_at(s, src, i), s) && ++bad > 8) {
                break;
            }
        }
        assert_int_equal(bad, 0);
        if (device.type == FP8AMP_DEVICE_CUDA) {
            void *cpu = malloc(n * 4);
            assert_non_null(cpu);
            run_cast(cpu_device(), s, src, n, d, cpu);
            assert_memory_equal(cpu, out, n * fp8amp_dtype_size(d));
            free(cpu);
        }
        free(out);
    }
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_fp8_all_codes_both_ways(void **state) {
    require_variant(state);
    const fp8amp_dtype fp8[2] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2};
    for (int k = 0; k < 2; ++k) {
        uint8_t codes[256];
        for (int c = 0; c < 256; ++c) codes[c] = (uint8_t)c;
        /* decode every code into each wider format, and encode (F32 -> FP8) each one back */
        check_all_destinations(state, fp8[k], codes, 256);
        float f32[256];
        uint8_t back[256];
        run_cast(variant_device(state), fp8[k], codes, 256, FP8AMP_DTYPE_F32, f32);
        run_cast(variant_device(state), FP8AMP_DTYPE_F32, f32, 256, fp8[k], back);
        for (int c = 0; c < 256; ++c) {
            const double v = decode_ref(format_of(fp8[k]), (uint32_t)c);
            const uint32_t want = isnan(v) ? canonical_nan(format_of(fp8[k]), c >> 7) : (uint32_t)c;
            if (isinf(v)) continue; /* E5M2 inf saturates to max on the way back: checked below */
            assert_int_equal(back[c], want);
        }
        if (fp8[k] == FP8AMP_DTYPE_E5M2) {
            assert_int_equal(back[0x7C], 0x7B);
            assert_int_equal(back[0xFC], 0xFB);
        }
    }
}

static void test_all_f16_inputs(void **state) {
    require_variant(state);
    uint16_t *src = malloc(65536 * 2);
    assert_non_null(src);
    for (uint32_t c = 0; c < 65536; ++c) src[c] = (uint16_t)c;
    check_all_destinations(state, FP8AMP_DTYPE_F16, src, 65536);
    free(src);
}

static void test_all_bf16_inputs(void **state) {
    require_variant(state);
    uint16_t *src = malloc(65536 * 2);
    assert_non_null(src);
    for (uint32_t c = 0; c < 65536; ++c) src[c] = (uint16_t)c;
    check_all_destinations(state, FP8AMP_DTYPE_BF16, src, 65536);
    free(src);
}

static void test_f32_edge_cases(void **state) {
    require_variant(state);
    float v[128];
    size_t n = 0;
    const float specials[] = {
        0.0f, -0.0f, 1.0f, -1.0f,
        bits_f32(0x00000001u), -bits_f32(0x00000001u), /* float32 subnormals */
        bits_f32(0x007FFFFFu), FLT_MIN, -FLT_MIN,
        /* E4M3: min subnormal 2^-9, half of it (tie to 0), 1.5x of it (tie to 2^-8), min normal 2^-6 */
        0x1p-9f, 0x1p-10f, 0x1.8p-9f, 0x1.4p-9f, 0x1p-6f, 0x1.cp-7f, 0x1.ep-7f,
        /* E4M3 ties between neighbours at 1: 1+1/16 -> 1 (even), 1+3/16 -> 1.25 (even) */
        1.0625f, 1.1875f, -1.0625f, -1.1875f, 1.0625001f,
        /* E4M3 max 448 and beyond: 464 is the tie to the (non-existent) 480 -> saturates */
        448.0f, -448.0f, 456.0f, 464.0f, 464.5f, 480.0f, 1e6f, -1e6f,
        /* E5M2: min subnormal 2^-16, half of it, max 57344, the tie 61440, beyond */
        0x1p-16f, 0x1p-17f, 0x1.8p-17f, 0x1p-14f, 57344.0f, 61440.0f, -61440.0f, 65536.0f,
        /* F16: max 65504, the tie 65520 (-> inf), min subnormal 2^-24 and half of it */
        65504.0f, 65519.996f, 65520.0f, -65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
        /* BF16: max, beyond, ties */
        bits_f32(0x7F7F0000u), bits_f32(0x7F7F8000u), bits_f32(0x7F7FFFFFu), bits_f32(0x3F808000u),
        bits_f32(0x3F818000u), FLT_MAX, -FLT_MAX,
        INFINITY, -INFINITY, NAN, -NAN, bits_f32(0x7F800001u), bits_f32(0xFFC12345u),
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) v[n++] = specials[i];
    assert_true(n <= 128);
    check_all_destinations(state, FP8AMP_DTYPE_F32, v, n);
}

static void test_f32_random(void **state) {
    require_variant(state);
    /* Fresh random values over the whole useful exponent range, both signs; some exactly at ties. */
    const size_t n = 200003; /* odd: exercises the vector body and the scalar tail */
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; ++i) {
        const double mant = test_rng_uniform(1.0, 2.0);
        const int e = (int)test_rng_uniform(-30, 20);
        float x = (float)ldexp(mant, e);
        if (i % 7 == 0) /* exactly halfway between two E4M3 neighbours: a tie to round to even */
            x = (float)ldexp(1.0 + ((double)(test_rng_u64() % 8) + 0.5) / 8.0, e);
        v[i] = (test_rng_u64() & 1) ? -x : x;
    }
    check_all_destinations(state, FP8AMP_DTYPE_F32, v, n);
    free(v);
}

static void test_sizes_and_alignment(void **state) {
    require_variant(state);
    /* Lengths around the vector width, and a wrapped destination that is not 16-byte aligned, so
     * that both the vectorized and the scalar paths run and agree. */
    const size_t lens[] = {1, 7, 8, 9, 15, 16, 17, 1000, 1000003};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; ++k) {
        const size_t n = lens[k];
        uint16_t *src = malloc(n * 2);
        uint8_t *out = malloc(n);
        assert_non_null(src);
        assert_non_null(out);
        for (size_t i = 0; i < n; ++i) src[i] = (uint16_t)(test_rng_u64() & 0xFFFF);
        run_cast(variant_device(state), FP8AMP_DTYPE_BF16, src, n, FP8AMP_DTYPE_E4M3, out);
        for (size_t i = 0; i < n; ++i)
            if (!check_element(FP8AMP_DTYPE_E4M3, decode_ref(&FMT_BF16, src[i]), out[i], src[i], FP8AMP_DTYPE_BF16))
                fail();
        free(src);
        free(out);
    }

    /* misaligned views: wrap element 1 of device buffers */
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    const int64_t big[1] = {1025};
    const int64_t view[1] = {1000};
    fp8amp_tensor a, b, va, vb;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, big, &a));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E5M2, 1, big, &b));
    float host[1025];
    for (int i = 0; i < 1025; ++i) host[i] = (float)test_rng_uniform(-70000.0, 70000.0);
    EXPECT_OK(fp8amp_tensor_copy_from_host(a, host, sizeof host));
    void *pa, *pb;
    EXPECT_OK(fp8amp_tensor_data(a, &pa));
    EXPECT_OK(fp8amp_tensor_data(b, &pb));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 1, view, (float *)pa + 1, &va));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_E5M2, 1, view, (uint8_t *)pb + 3, &vb));
    EXPECT_OK(fp8amp_cast(ctx, va, vb));
    uint8_t got[1000];
    EXPECT_OK(fp8amp_tensor_copy_to_host(vb, got, sizeof got));
    for (int i = 0; i < 1000; ++i)
        if (!check_element(FP8AMP_DTYPE_E5M2, host[i + 1], got[i], f32_bits(host[i + 1]), FP8AMP_DTYPE_F32)) fail();
    EXPECT_OK(fp8amp_tensor_destroy(va));
    EXPECT_OK(fp8amp_tensor_destroy(vb));
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_cast_bad_input(void **state) {
    require_variant(state);
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(variant_device(state), &ctx));
    const int64_t s4[2] = {2, 2}, s22[1] = {4}, s5[1] = {5};
    fp8amp_tensor a, b, c, d;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, s4, &a));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, s22, &b)); /* same numel, other shape */
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, s5, &c));
    const float src[4] = {1.5f, -2.25f, 3.0f, 1000.0f};
    EXPECT_OK(fp8amp_tensor_copy_from_host(a, src, sizeof src));
    const uint8_t poison[5] = {0x11, 0x22, 0x33, 0x44, 0x55};
    EXPECT_OK(fp8amp_tensor_copy_from_host(b, poison, 4));
    EXPECT_OK(fp8amp_tensor_copy_from_host(c, poison, 5));

    EXPECT_STATUS(fp8amp_cast(ctx, a, b), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_cast(ctx, a, c), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_cast(NULL, a, c), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_cast(ctx, NULL, c), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_cast(ctx, a, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_cast(ctx, (fp8amp_tensor)ctx, c), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_cast((fp8amp_context)a, a, c), FP8AMP_ERROR_INVALID_HANDLE);

    /* overlapping views of one buffer with different element sizes */
    void *pa;
    EXPECT_OK(fp8amp_tensor_data(a, &pa));
    const int64_t s8[1] = {8};
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F16, 1, s8, pa, &d));
    fp8amp_tensor flat;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 1, s22, pa, &flat));
    fp8amp_tensor half_view;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F16, 1, s22, (char *)pa + 4, &half_view));
    EXPECT_STATUS(fp8amp_cast(ctx, flat, half_view), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_cast(ctx, a, a)); /* the same tensor: a no-op */

    /* nothing changed */
    float a_now[4];
    uint8_t b_now[4], c_now[5];
    EXPECT_OK(fp8amp_tensor_copy_to_host(a, a_now, sizeof a_now));
    EXPECT_OK(fp8amp_tensor_copy_to_host(b, b_now, 4));
    EXPECT_OK(fp8amp_tensor_copy_to_host(c, c_now, 5));
    assert_memory_equal(a_now, src, sizeof src);
    assert_memory_equal(b_now, poison, 4);
    assert_memory_equal(c_now, poison, 5);

    /* a destroyed tensor */
    EXPECT_OK(fp8amp_tensor_destroy(d));
    EXPECT_STATUS(fp8amp_cast(ctx, d, b), FP8AMP_ERROR_INVALID_HANDLE);

    /* a tensor of another device: CPU tensors in a CUDA context and the other way round */
    if (have_cuda()) {
        fp8amp_context other;
        const int is_cuda = variant_device(state).type == FP8AMP_DEVICE_CUDA;
        EXPECT_OK(fp8amp_context_create(is_cuda ? cpu_device() : cuda_device(0), &other));
        fp8amp_tensor foreign;
        EXPECT_OK(fp8amp_tensor_create(other, FP8AMP_DTYPE_E4M3, 2, s4, &foreign));
        EXPECT_STATUS(fp8amp_cast(ctx, a, foreign), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_STATUS(fp8amp_cast(other, a, foreign), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_OK(fp8amp_tensor_destroy(foreign));
        EXPECT_OK(fp8amp_context_destroy(other));
    }

    EXPECT_OK(fp8amp_tensor_destroy(flat));
    EXPECT_OK(fp8amp_tensor_destroy(half_view));
    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_tensor_destroy(c));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The references themselves, on values whose answers are known by hand: a reference that is wrong
 * in the same way as the library would otherwise go unnoticed. */
static void test_references_known_values(void **state) {
    (void)state;
    assert_true(decode_ref(&FMT_E4M3, 0x7E) == 448.0);
    assert_true(isnan(decode_ref(&FMT_E4M3, 0x7F)));
    assert_true(decode_ref(&FMT_E4M3, 0x01) == ldexp(1.0, -9));
    assert_true(decode_ref(&FMT_E4M3, 0x08) == ldexp(1.0, -6));
    assert_true(decode_ref(&FMT_E5M2, 0x7B) == 57344.0);
    assert_true(isinf(decode_ref(&FMT_E5M2, 0x7C)));
    assert_true(decode_ref(&FMT_E5M2, 0x01) == ldexp(1.0, -16));
    assert_true(decode_ref(&FMT_F16, 0x7BFF) == 65504.0);
    assert_true(decode_ref(&FMT_BF16, 0x3F80) == 1.0);
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 1.0625), 0x38);   /* tie -> even (1.0) */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 1.1875), 0x3A);   /* tie -> even (1.25) */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, 500.0), 0x7E);    /* saturates */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, -INFINITY), 0xFE);
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, -NAN), 0xFF);
    assert_int_equal(encode_fp8_ref(&FMT_E5M2, NAN), 0x7E);
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, ldexp(1.0, -10)), 0x00); /* tie -> even (0) */
    assert_int_equal(encode_fp8_ref(&FMT_E4M3, -ldexp(1.0, -11)), 0x80);
    assert_true(round_ref(&FMT_F16, 65520.0) == INFINITY);
    assert_true(round_ref(&FMT_F16, 65519.0) == 65504.0);
    assert_true(round_ref(&FMT_BF16, 1.00390625) == 1.0);          /* tie -> even */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_references_known_values),
        DEVICE_TESTS(test_fp8_all_codes_both_ways),
        DEVICE_TESTS(test_all_f16_inputs),
        DEVICE_TESTS(test_all_bf16_inputs),
        DEVICE_TESTS(test_f32_edge_cases),
        DEVICE_TESTS(test_f32_random),
        DEVICE_TESTS(test_sizes_and_alignment),
        DEVICE_TESTS(test_cast_bad_input),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
