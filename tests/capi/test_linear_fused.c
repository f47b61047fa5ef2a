/* The Linear backward's fused passes (issue 19):
 * - the bias gradient summed inside dY's quantize-transpose (no separate column-sum pass over dY):
 *   on fresh random data of odd shapes the bias gradient is, bit for bit, the F32 sum in the fixed
 *   order of kernels/kernels.hpp (128-row blocks of 16 lanes), overwritten and accumulated, for
 *   F32/BF16/F16 dy; a NaN in dy makes its column's gradient NaN and no other; CPU and CUDA agree
 *   byte for byte (the CUDA variants are skipped without a GPU);
 * - the E4M3 weight gradient under a DELAYED recipe without an amax pass of its own: byte for byte
 *   against an F32-gradient twin (first backward fitted, later ones with the history's scale, an
 *   overflow saturated and counted), a CURRENT recipe keeping current scaling, CPU = CUDA (skipped
 *   without a GPU).
 * The reference sums are written here from the documented order, not taken from the library. */
#include <float.h>
#include <math.h>

#include "fp8_reference.h"
#include "test_gen.h"
#include "test_util.h"

#define F32_ FP8AMP_DTYPE_F32
#define BF16_ FP8AMP_DTYPE_BF16
#define F16_ FP8AMP_DTYPE_F16
#define E4M3_ FP8AMP_DTYPE_E4M3

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static size_t dsize(fp8amp_dtype d) { return d == F32_ ? 4 : 2; }

/* element i of a wide host buffer as float (exact) */
static float elem(fp8amp_dtype d, const void *buf, size_t i) {
    if (d == F32_) return ((const float *)buf)[i];
    return (float)value_at(d, buf, i);
}

/* rows x cols random values in [-1, 1) of dtype d, of a random spread per column */
static void *gen_matrix(fp8amp_dtype d, size_t rows, size_t cols) {
    void *buf = xmalloc(rows * cols * dsize(d));
    gen_values(d, buf, rows * cols, -6, 2, 0);
    return buf;
}

/* The documented order: lanes of rows g, g + 16, ... inside 128-row blocks, lanes in order, blocks in
 * order, each sum starting from +0; then dst = prev + total (accumulate) or total. */
static void fixed_order_sums(fp8amp_dtype d, const void *dy, size_t rows, size_t cols, const float *prev,
                             float *out) {
    for (size_t c = 0; c < cols; ++c) {
        volatile float total = 0.0f; /* volatile: no reassociation, no wider precision */
        for (size_t r0 = 0; r0 < rows; r0 += 128) {
            volatile float block = 0.0f;
            for (size_t g = 0; g < 16; ++g) {
                volatile float lane = 0.0f;
                for (size_t r = r0 + g; r < r0 + 128 && r < rows; r += 16) lane = lane + elem(d, dy, r * cols + c);
                block = block + lane;
            }
            total = total + block;
        }
        out[c] = prev ? prev[c] + total : total;
    }
}

typedef fp8amp_status (*lin_tensor_fn)(fp8amp_linear, fp8amp_tensor *);

static void *read_lin(fp8amp_linear lin, lin_tensor_fn fn) {
    fp8amp_tensor t;
    EXPECT_OK(fn(lin, &t));
    void *p = tensor_to_host(t);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    return p;
}

static void write_lin(fp8amp_linear lin, lin_tensor_fn fn, const void *host) {
    fp8amp_tensor t;
    EXPECT_OK(fn(lin, &t));
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, host, tensor_bytes(t)));
    EXPECT_OK(fp8amp_tensor_destroy(t));
}

static fp8amp_linear make_lin(fp8amp_context ctx, int64_t k, int64_t n, fp8amp_dtype wgrad, fp8amp_format format,
                              fp8amp_scaling_mode mode) {
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = k;
    desc.out_features = n;
    desc.weight_dtype = F32_;
    desc.wgrad_dtype = wgrad;
    desc.recipe.format = format;
    desc.recipe.mode = mode;
    desc.policy = FP8AMP_GEMM_ALWAYS_FP8;
    fp8amp_linear lin;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &lin));
    float *w = xmalloc((size_t)(n * k) * 4), *b = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n * k; ++i) w[i] = (float)test_rng_uniform(-0.5, 0.5);
    for (int64_t i = 0; i < n; ++i) b[i] = (float)test_rng_uniform(-0.5, 0.5);
    write_lin(lin, fp8amp_linear_weight, w);
    write_lin(lin, fp8amp_linear_bias, b);
    free(w), free(b);
    return lin;
}

/* One forward + backward of lin on x [m, k] F32 and dy [m, n] of dy_dtype. NOT_SUPPORTED (a shape
 * the device's FP8 GEMMs cannot take) is returned, anything else must succeed. */
static fp8amp_status step(fp8amp_context ctx, fp8amp_linear lin, size_t m, size_t k, size_t n, const float *x,
                          fp8amp_dtype dy_dtype, const void *dy, int accumulate) {
    const int64_t xs[2] = {(int64_t)m, (int64_t)k}, ys[2] = {(int64_t)m, (int64_t)n};
    fp8amp_tensor tx = tensor_from_host(ctx, F32_, 2, xs, x), ty = make_tensor(ctx, F32_, 2, ys);
    fp8amp_tensor tdy = tensor_from_host(ctx, dy_dtype, 2, ys, dy), tdx = make_tensor(ctx, F32_, 2, xs);
    fp8amp_status st = fp8amp_linear_forward(lin, tx, ty, 1);
    if (st == FP8AMP_SUCCESS) {
        EXPECT_OK(fp8amp_linear_backward(lin, tdy, tdx, accumulate));
    } else {
        assert_int_equal(st, FP8AMP_ERROR_NOT_SUPPORTED);
    }
    fp8amp_tensor all[4] = {tx, ty, tdy, tdx};
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    return st;
}

static float *random_x(size_t m, size_t k) {
    float *x = xmalloc(m * k * 4);
    for (size_t i = 0; i < m * k; ++i) x[i] = (float)test_rng_uniform(-2.0, 2.0);
    return x;
}

static const size_t kShapes[][3] = {{1, 5, 3},     {15, 7, 129},  {127, 9, 17},  {128, 16, 128},
                                    {129, 24, 33}, {300, 8, 130}, {1000, 16, 48}, {2048, 32, 256}};

/* ---- the bias gradient ------------------------------------------------------------------------ */

static void test_bias_grad_fixed_order(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const fp8amp_dtype dts[3] = {F32_, BF16_, F16_};
    int ran = 0;
    for (size_t s = 0; s < sizeof kShapes / sizeof kShapes[0]; ++s) {
        const size_t m = kShapes[s][0], k = kShapes[s][1], n = kShapes[s][2];
        const fp8amp_dtype dt = dts[test_rng_u64() % 3];
        const fp8amp_format format = (test_rng_u64() & 1) ? FP8AMP_FORMAT_HYBRID : FP8AMP_FORMAT_E4M3;
        fp8amp_linear lin = make_lin(ctx, (int64_t)k, (int64_t)n, F32_, format, FP8AMP_SCALING_CURRENT);
        float *x = random_x(m, k), *want = xmalloc(n * 4);
        void *dy = gen_matrix(dt, m, n), *dy2 = gen_matrix(dt, m, n);
        if (step(ctx, lin, m, k, n, x, dt, dy, 0) != FP8AMP_SUCCESS) { /* CUDA: a shape FP8 GEMMs cannot take */
            print_message("shape %zu x %zu x %zu: not an FP8 GEMM shape here, skipped\n", m, k, n);
        } else {
            ++ran;
            float *db = read_lin(lin, fp8amp_linear_bias_grad);
            fixed_order_sums(dt, dy, m, n, NULL, want);
            for (size_t c = 0; c < n; ++c)
                if (bits_of(db[c]) != bits_of(want[c]))
                    fail_msg("m=%zu n=%zu dy %d: bias grad[%zu] = %a, the fixed order gives %a", m, n, (int)dt, c,
                             (double)db[c], (double)want[c]);
            /* accumulate: prev + the new total */
            assert_int_equal(step(ctx, lin, m, k, n, x, dt, dy2, 1), FP8AMP_SUCCESS);
            float *db2 = read_lin(lin, fp8amp_linear_bias_grad);
            fixed_order_sums(dt, dy2, m, n, db, want);
            for (size_t c = 0; c < n; ++c)
                if (bits_of(db2[c]) != bits_of(want[c]))
                    fail_msg("m=%zu n=%zu: accumulated bias grad[%zu] = %a, want %a", m, n, c, (double)db2[c],
                             (double)want[c]);
            free(db), free(db2);
        }
        free(x), free(want), free(dy), free(dy2);
        EXPECT_OK(fp8amp_linear_destroy(lin));
    }
    assert_true(ran > 0);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_bias_grad_nan(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const size_t m = 272, k = 16, n = 144;
    fp8amp_linear lin = make_lin(ctx, (int64_t)k, (int64_t)n, F32_, FP8AMP_FORMAT_HYBRID, FP8AMP_SCALING_CURRENT);
    float *x = random_x(m, k), *dy = gen_matrix(F32_, m, n), *want = xmalloc(n * 4);
    const size_t col = (size_t)(test_rng_u64() % n), row = (size_t)(test_rng_u64() % m);
    dy[row * n + col] = NAN;
    if (step(ctx, lin, m, k, n, x, F32_, dy, 0) == FP8AMP_SUCCESS) {
        float *db = read_lin(lin, fp8amp_linear_bias_grad);
        fixed_order_sums(F32_, dy, m, n, NULL, want);
        for (size_t c = 0; c < n; ++c) {
            if (c == col)
                assert_true(isnan(db[c]));
            else
                assert_true(bits_of(db[c]) == bits_of(want[c]));
        }
        free(db);
    }
    free(x), free(dy), free(want);
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The same layer, data and calls on both backends give the same bias gradient bytes. */
static void test_bias_grad_cpu_cuda_identical(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    fp8amp_context ctx[2] = {make_context(cpu_device()), make_context(cuda_device(0))};
    const size_t shapes[][3] = {{144, 16, 48}, {400, 32, 272}, {1024, 64, 2048}, {336, 48, 1040}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        const size_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        const fp8amp_dtype dt = (s & 1) ? BF16_ : F32_;
        float *x = random_x(m, k);
        void *dy = gen_matrix(dt, m, n);
        float *db[2];
        uint64_t seed = test_rng_u64();
        for (int d = 0; d < 2; ++d) {
            test_rng_state = seed; /* the same weights on both */
            fp8amp_linear lin = make_lin(ctx[d], (int64_t)k, (int64_t)n, F32_, FP8AMP_FORMAT_HYBRID,
                                         FP8AMP_SCALING_CURRENT);
            assert_int_equal(step(ctx[d], lin, m, k, n, x, dt, dy, 0), FP8AMP_SUCCESS);
            db[d] = read_lin(lin, fp8amp_linear_bias_grad);
            EXPECT_OK(fp8amp_linear_destroy(lin));
        }
        assert_memory_equal(db[0], db[1], n * 4);
        free(db[0]), free(db[1]), free(x), free(dy);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx[0]));
    EXPECT_OK(fp8amp_context_destroy(ctx[1]));
}

/* ---- the E4M3 weight gradient under delayed scaling -------------------------------------------- */

static fp8amp_scaling_stats wgrad_stats(fp8amp_linear lin, float *scale) {
    fp8amp_scaling sc;
    fp8amp_scaling_stats st;
    EXPECT_OK(fp8amp_linear_scaling(lin, FP8AMP_ROLE_WEIGHT_GRAD, &sc));
    EXPECT_OK(fp8amp_scaling_get_stats(sc, &st));
    if (scale) EXPECT_OK(fp8amp_scaling_get(sc, scale, NULL, NULL));
    EXPECT_OK(fp8amp_scaling_destroy(sc));
    return st;
}

/* The first backward fits the scale to its own FP32 sum (no history yet); every later one quantizes
 * with the scale the history gave (the max of the earlier sums' amaxes: the default recipe), records
 * its own amax in that pass, and updates the meta. A sum that outgrew the history saturates at 448,
 * and every saturated element is counted in the meta's statistics (on by default for this meta); the
 * next backward's scale fits the new amax. Checked byte for byte against an F32-gradient twin. */
static void test_wgrad_delayed(void **state) {
    require_variant(state);
    /* a delayed recipe: x and dY use the metas' (never updated) initial scale 1 on both layers alike */
    fp8amp_context ctx = make_context(variant_device(state));
    const size_t m = 256, k = 32, n = 48;
    const double factors[5] = {1.0, 0.5, 300.0, 1.0, 1.0};
    const uint64_t seed = test_rng_u64();
    test_rng_state = seed;
    fp8amp_linear lin = make_lin(ctx, (int64_t)k, (int64_t)n, E4M3_, FP8AMP_FORMAT_HYBRID, FP8AMP_SCALING_DELAYED);
    test_rng_state = seed; /* the same weights */
    fp8amp_linear twin = make_lin(ctx, (int64_t)k, (int64_t)n, F32_, FP8AMP_FORMAT_HYBRID, FP8AMP_SCALING_DELAYED);
    double hist = 0.0;
    float used = 1.0f;
    fp8amp_scaling_stats before = wgrad_stats(lin, NULL);
    assert_int_equal(before.quantized, 0);
    for (int s = 0; s < 5; ++s) {
        float *x = random_x(m, k), *dy = gen_matrix(F32_, m, n);
        for (size_t i = 0; i < m * n; ++i) dy[i] = (float)(dy[i] * factors[s]);
        if (step(ctx, lin, m, k, n, x, F32_, dy, 0) != FP8AMP_SUCCESS) fail_msg("FP8 GEMMs refused %zu x %zu", m, n);
        assert_int_equal(step(ctx, twin, m, k, n, x, F32_, dy, 0), FP8AMP_SUCCESS);
        float *sum = read_lin(twin, fp8amp_linear_weight_grad);
        uint8_t *got = read_lin(lin, fp8amp_linear_weight_grad);
        double amax = 0.0;
        for (size_t i = 0; i < n * k; ++i) amax = fmax(amax, fabs((double)sum[i]));
        const float scale = s == 0 ? scale_ref(448.0, 0, 0, amax, 1.0f) : scale_ref(448.0, 0, 0, hist, used);
        uint64_t sat = 0, beyond = 0; /* beyond: not just amax * scale rounded a hair above 448 */
        for (size_t i = 0; i < n * k; ++i) {
            const float y = mul_f32_ref(sum[i], scale);
            sat += fabs((double)y) > 448.0;
            beyond += fabs((double)y) > 448.0 * (1.0 + ldexp(1.0, -20));
            const uint32_t want = encode_fp8_ref(&FMT_E4M3, y);
            if (got[i] != want) fail_msg("step %d: E4M3 dW[%zu] = 0x%02x, want 0x%02x (sum %a, scale %a)", s, i, got[i],
                                         want, (double)sum[i], (double)scale);
        }
        hist = fmax(hist, amax);
        used = scale;
        float next;
        const fp8amp_scaling_stats after = wgrad_stats(lin, &next);
        assert_true(bits_of(next) == bits_of(scale_ref(448.0, 0, 0, hist, scale)));
        assert_int_equal(after.quantized - before.quantized, n * k);
        assert_int_equal(after.saturated - before.saturated, sat);
        if (s == 0 || s == 3) assert_int_equal(beyond, 0); /* fitted / adapted after the overflow */
        if (s == 2) assert_true(beyond > 0);                /* the overflow happened, and was counted */
        before = after;
        free(x), free(dy), free(sum), free(got);
    }
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_linear_destroy(twin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Under a current recipe the WEIGHT_GRAD meta stays current scaling: every backward's scale fits its
 * own sum (deterministic, resumable: a checkpoint holds no meta history), statistics off. */
static void test_wgrad_current_recipe(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const size_t m = 128, k = 16, n = 32;
    const uint64_t seed = test_rng_u64();
    test_rng_state = seed;
    fp8amp_linear lin = make_lin(ctx, (int64_t)k, (int64_t)n, E4M3_, FP8AMP_FORMAT_E4M3, FP8AMP_SCALING_CURRENT);
    test_rng_state = seed;
    fp8amp_linear twin = make_lin(ctx, (int64_t)k, (int64_t)n, F32_, FP8AMP_FORMAT_E4M3, FP8AMP_SCALING_CURRENT);
    const double factors[3] = {1.0, 100.0, 0.01};
    for (int s = 0; s < 3; ++s) {
        float *x = random_x(m, k), *dy = gen_matrix(F32_, m, n);
        for (size_t i = 0; i < m * n; ++i) dy[i] = (float)(dy[i] * factors[s]);
        if (step(ctx, lin, m, k, n, x, F32_, dy, 0) != FP8AMP_SUCCESS) fail_msg("FP8 GEMMs refused");
        assert_int_equal(step(ctx, twin, m, k, n, x, F32_, dy, 0), FP8AMP_SUCCESS);
        float *sum = read_lin(twin, fp8amp_linear_weight_grad);
        uint8_t *got = read_lin(lin, fp8amp_linear_weight_grad);
        double amax = 0.0;
        for (size_t i = 0; i < n * k; ++i) amax = fmax(amax, fabs((double)sum[i]));
        const float scale = scale_ref(448.0, 0, 0, amax, 1.0f);
        for (size_t i = 0; i < n * k; ++i)
            if (got[i] != encode_fp8_ref(&FMT_E4M3, mul_f32_ref(sum[i], scale)))
                fail_msg("step %d: E4M3 dW[%zu] = 0x%02x (sum %a, scale %a)", s, i, got[i], (double)sum[i], (double)scale);
        float ms;
        const fp8amp_scaling_stats st = wgrad_stats(lin, &ms);
        assert_true(bits_of(ms) == bits_of(scale));
        assert_int_equal(st.quantized, 0);
        free(x), free(dy), free(sum), free(got);
    }
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_linear_destroy(twin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* The delayed E4M3 weight gradient, its meta's scale and statistics: the same bytes on both backends
 * over several backwards (the first fitted, an overflow, accumulation). */
/* The delayed weight gradient on both devices. The FP32 sums come from different GEMMs (the CPU's
 * reference, cuBLASLt's FP8 GEMM), whose accumulations differ (measured on an H100: amaxes, and so
 * scales, up to 2e-4 apart), so the two are not the same bytes: what must agree is everything the delayed scaling
 * decides -- each step's scale within 2^-6 of the other's (both from the same history of slightly
 * different amaxes), the gradient's
 * values (see below), and the saturation count (the 200x step overflows the history's scale on
 * both) within 1% of the elements. */
static void test_wgrad_delayed_cpu_cuda_agree(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    fp8amp_context ctx[2] = {make_context(cpu_device()), make_context(cuda_device(0))};
    const size_t m = 512, k = 64, n = 96;
    const double factors[4] = {1.0, 0.25, 200.0, 1.0};
    const int acc[4] = {0, 1, 0, 0};
    const uint64_t seed = test_rng_u64();
    fp8amp_linear lin[2];
    for (int d = 0; d < 2; ++d) {
        test_rng_state = seed;
        lin[d] = make_lin(ctx[d], (int64_t)k, (int64_t)n, E4M3_, FP8AMP_FORMAT_HYBRID, FP8AMP_SCALING_DELAYED);
    }
    for (int s = 0; s < 4; ++s) {
        float *x = random_x(m, k), *dy = gen_matrix(F32_, m, n);
        for (size_t i = 0; i < m * n; ++i) dy[i] = (float)(dy[i] * factors[s]);
        uint8_t *got[2];
        float scale[2];
        fp8amp_scaling_stats st[2];
        for (int d = 0; d < 2; ++d) {
            assert_int_equal(step(ctx[d], lin[d], m, k, n, x, F32_, dy, acc[s]), FP8AMP_SUCCESS);
            got[d] = read_lin(lin[d], fp8amp_linear_weight_grad);
            st[d] = wgrad_stats(lin[d], &scale[d]);
        }
        print_message("step %d: scales %.9g (CPU) %.9g (CUDA)\n", s, scale[0], scale[1]);
        assert_true(scale[0] > 0.0f && fabs((double)scale[0] - scale[1]) <= 0x1p-6 * scale[0]);
        /* The codes as values (in the scaled domain; the scales agree to 2^-6): within two E4M3 steps
         * (2^-2 relative: the sums and the scales both differ a little) of each other, plus 2^-5 of
         * the largest for sums that cancel (their error, relative to the terms, can move a small
         * result by several steps or across zero). Measured: at most 0.0714 of the largest value. */
        double amax = 0.0, worst = 0.0;
        for (size_t i = 0; i < n * k; ++i) {
            const double va = value_at(FP8AMP_DTYPE_E4M3, got[0], i), vb = value_at(FP8AMP_DTYPE_E4M3, got[1], i);
            assert_true(va == va && vb == vb);  /* no NaN */
            amax = fmax(amax, fmax(fabs(va), fabs(vb)));
        }
        assert_true(amax > 0.0);
        for (size_t i = 0; i < n * k; ++i) {
            const double va = value_at(FP8AMP_DTYPE_E4M3, got[0], i), vb = value_at(FP8AMP_DTYPE_E4M3, got[1], i);
            const double excess = fabs(va - vb) - (0.25 * fmax(fabs(va), fabs(vb)) + amax / 32.0);
            assert_true(excess <= 0.0);
            worst = fmax(worst, fabs(va - vb) / amax);
        }
        print_message("step %d: largest CPU/CUDA difference %.3g of the largest value\n", s, worst);
        assert_true(st[0].quantized == st[1].quantized);
        const double sat_diff = fabs((double)st[0].saturated - (double)st[1].saturated);
        assert_true(sat_diff <= 0.01 * (double)(n * k));
        if (factors[s] > 100.0) assert_true(st[0].saturated > 0 && st[1].saturated > 0);
        free(got[0]), free(got[1]), free(x), free(dy);
    }
    for (int d = 0; d < 2; ++d) EXPECT_OK(fp8amp_linear_destroy(lin[d]));
    EXPECT_OK(fp8amp_context_destroy(ctx[0]));
    EXPECT_OK(fp8amp_context_destroy(ctx[1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_bias_grad_fixed_order),
        DEVICE_TESTS(test_bias_grad_nan),
        cmocka_unit_test(test_bias_grad_cpu_cuda_identical),
        DEVICE_TESTS(test_wgrad_delayed),
        DEVICE_TESTS(test_wgrad_current_recipe),
        cmocka_unit_test(test_wgrad_delayed_cpu_cuda_agree),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
