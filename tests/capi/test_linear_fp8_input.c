/* fp8amp_linear_forward_fp8 (issue 19): a Linear fed an E4M3 input that the caller quantized -- a
 * fused LayerNorm writing the GEMM's operand itself, bound to the Linear's INPUT meta.
 * - Twins, on fresh random data over 3 steps (CURRENT and DELAYED recipes, a 3-D input, an odd shape):
 *   Linear A takes the wide x (fp8amp_linear_forward); Linear B, with the same weights, takes x
 *   quantized by fp8amp_quantize into a tensor bound to B's INPUT meta. y, dx, the weight gradient
 *   and the bias gradient must be byte for byte A's. Between B's forward and its backward the
 *   caller's x8 is overwritten (its bytes, and under CURRENT its scale_inv): the backward must not
 *   read it.
 * - The LayerNorm's E4M3 output (fp8amp_norm_forward into the INPUT meta) through forward_fp8
 *   against the wide route (the norm into BF16, then fp8amp_linear_forward) and against a float64
 *   LayerNorm + matmul of the unquantized values; the backward then feeds the norm's backward.
 * - Refusals (a wide or E5M2 x8, an x8 never bound to a meta, an FP8 y, shapes, the policy NEVER_FP8,
 *   a CPU x8 on a CUDA Linear, NULL handles) change nothing: the saved forward they follow still
 *   gives the twin's backward. The policy AUTO runs the FP8 GEMM for an FP8 input at any shape.
 * - fp8amp_linear_choose_gemm, which a fused front asks before letting a norm write FP8, is what the
 *   next wide forward runs, for each policy and a range of row counts.
 * Each test runs on the CPU and on CUDA (skipped without a GPU). */
#include <math.h>

#include "test_util.h"

#define F32_ FP8AMP_DTYPE_F32
#define BF16_ FP8AMP_DTYPE_BF16
#define E4M3_ FP8AMP_DTYPE_E4M3
#define E5M2_ FP8AMP_DTYPE_E5M2

static float *random_f32(size_t n, double lo, double hi) {
    float *p = xmalloc(n * 4);
    for (size_t i = 0; i < n; ++i) p[i] = (float)test_rng_uniform(lo, hi);
    return p;
}

static void write_param(fp8amp_linear lin, fp8amp_status (*get)(fp8amp_linear, fp8amp_tensor *), const float *v) {
    fp8amp_tensor t;
    EXPECT_OK(get(lin, &t));
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, v, tensor_bytes(t)));
    EXPECT_OK(fp8amp_tensor_destroy(t));
}

static void *read_param(fp8amp_linear lin, fp8amp_status (*get)(fp8amp_linear, fp8amp_tensor *)) {
    fp8amp_tensor t;
    EXPECT_OK(get(lin, &t));
    void *p = tensor_to_host(t);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    return p;
}

/* A Linear [k -> n] with F32 weights w and bias b, an E4M3 weight gradient, the HYBRID recipe in
 * `mode` (history 4), and `policy`. */
static fp8amp_linear make_linear(fp8amp_context ctx, int64_t k, int64_t n, fp8amp_scaling_mode mode,
                                 fp8amp_gemm_policy policy, const float *w, const float *b) {
    fp8amp_linear_desc desc;
    EXPECT_OK(fp8amp_linear_desc_init_default(&desc));
    desc.in_features = k;
    desc.out_features = n;
    desc.weight_dtype = F32_;
    desc.recipe.mode = mode;
    desc.recipe.amax_history_len = 4;
    desc.policy = policy;
    fp8amp_linear lin;
    EXPECT_OK(fp8amp_linear_create(ctx, &desc, &lin));
    write_param(lin, fp8amp_linear_weight, w);
    write_param(lin, fp8amp_linear_bias, b);
    return lin;
}

static fp8amp_scaling role_meta(fp8amp_linear lin, fp8amp_linear_role role) {
    fp8amp_scaling s;
    EXPECT_OK(fp8amp_linear_scaling(lin, role, &s));
    return s;
}

/* The delayed metas a step boundary updates (the WEIGHT_GRAD meta the Linear updates itself). */
static void step_boundary(fp8amp_linear lin) {
    fp8amp_scaling in = role_meta(lin, FP8AMP_ROLE_INPUT), go = role_meta(lin, FP8AMP_ROLE_GRAD_OUTPUT);
    EXPECT_OK(fp8amp_scaling_update(in));
    EXPECT_OK(fp8amp_scaling_update(go));
    EXPECT_OK(fp8amp_scaling_destroy(in));
    EXPECT_OK(fp8amp_scaling_destroy(go));
}

static void expect_same_tensor(fp8amp_tensor a, fp8amp_tensor b) {
    void *pa = tensor_to_host(a);
    expect_bytes(b, pa, tensor_bytes(a));
    free(pa);
}

static void expect_same_param(fp8amp_linear a, fp8amp_linear b, fp8amp_status (*get)(fp8amp_linear, fp8amp_tensor *)) {
    fp8amp_tensor t;
    EXPECT_OK(get(a, &t));
    const size_t n = tensor_bytes(t);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    void *pa = read_param(a, get), *pb = read_param(b, get);
    assert_memory_equal(pa, pb, n);
    free(pa), free(pb);
}

typedef struct {
    int32_t ndim;
    int64_t shape[3]; /* x's shape; its last extent is k */
    int64_t n;
} twin_shape;

static void run_twins(fp8amp_context ctx, fp8amp_scaling_mode mode, const twin_shape *sh) {
    const int64_t k = sh->shape[sh->ndim - 1], n = sh->n;
    int64_t ys[3];
    memcpy(ys, sh->shape, sizeof ys);
    ys[sh->ndim - 1] = n;
    const size_t mx = numel_of(sh->ndim, sh->shape), my = numel_of(sh->ndim, ys);
    float *w = random_f32((size_t)(n * k), -0.5, 0.5), *b = random_f32((size_t)n, -0.5, 0.5);
    fp8amp_linear a = make_linear(ctx, k, n, mode, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_linear lb = make_linear(ctx, k, n, mode, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_scaling in_b = role_meta(lb, FP8AMP_ROLE_INPUT);
    fp8amp_tensor x = make_tensor(ctx, F32_, sh->ndim, sh->shape), x8 = make_tensor(ctx, E4M3_, sh->ndim, sh->shape);
    fp8amp_tensor junk = make_tensor(ctx, F32_, sh->ndim, sh->shape);
    EXPECT_OK(fp8amp_tensor_set_scaling(x8, in_b));
    fp8amp_tensor ya = make_tensor(ctx, F32_, sh->ndim, ys), yb = make_tensor(ctx, F32_, sh->ndim, ys);
    fp8amp_tensor dy = make_tensor(ctx, F32_, sh->ndim, ys);
    fp8amp_tensor dxa = make_tensor(ctx, F32_, sh->ndim, sh->shape), dxb = make_tensor(ctx, F32_, sh->ndim, sh->shape);
    for (int step = 0; step < 3; ++step) {
        float *hx = random_f32(mx, -3.0, 3.0), *hdy = random_f32(my, -1.0, 1.0), *hj = random_f32(mx, -40.0, 40.0);
        EXPECT_OK(fp8amp_tensor_copy_from_host(x, hx, mx * 4));
        EXPECT_OK(fp8amp_tensor_copy_from_host(dy, hdy, my * 4));
        EXPECT_OK(fp8amp_tensor_copy_from_host(junk, hj, mx * 4));
        const fp8amp_status st = fp8amp_linear_forward(a, x, ya, 1);
        EXPECT_OK(fp8amp_quantize(ctx, x, x8));
        if (st == FP8AMP_ERROR_NOT_SUPPORTED) { /* CUDA: not an FP8 GEMM shape; B must say so too */
            print_message("shape [%lld x %lld] -> %lld: not an FP8 GEMM shape here\n", (long long)(mx / (size_t)k),
                          (long long)k, (long long)n);
            EXPECT_STATUS(fp8amp_linear_forward_fp8(lb, x8, yb, 1), FP8AMP_ERROR_NOT_SUPPORTED);
            free(hx), free(hdy), free(hj);
            break;
        }
        EXPECT_OK(st);
        EXPECT_OK(fp8amp_linear_forward_fp8(lb, x8, yb, 1));
        expect_same_tensor(ya, yb);
        fp8amp_gemm_kind kind = FP8AMP_GEMM_KIND_NONE;
        EXPECT_OK(fp8amp_linear_gemm_kind(lb, &kind));
        assert_int_equal(kind, FP8AMP_GEMM_KIND_FP8);
        /* The caller's x8 overwritten before the backward. Under CURRENT a quantize of other values
         * (new codes and a new scale_inv); under DELAYED raw bytes, so that B's INPUT meta records no
         * amax A's did not. */
        if (mode == FP8AMP_SCALING_CURRENT) {
            EXPECT_OK(fp8amp_quantize(ctx, junk, x8));
        } else {
            unsigned char *raw = xmalloc(mx);
            for (size_t i = 0; i < mx; ++i) raw[i] = (unsigned char)(test_rng_u64() & 0x77);
            EXPECT_OK(fp8amp_tensor_copy_from_host(x8, raw, mx));
            free(raw);
        }
        EXPECT_OK(fp8amp_linear_backward(a, dy, dxa, step > 0));
        EXPECT_OK(fp8amp_linear_backward(lb, dy, dxb, step > 0));
        expect_same_tensor(dxa, dxb);
        expect_same_param(a, lb, fp8amp_linear_weight_grad);
        expect_same_param(a, lb, fp8amp_linear_bias_grad);
        if (mode == FP8AMP_SCALING_DELAYED) {
            step_boundary(a);
            step_boundary(lb);
        }
        free(hx), free(hdy), free(hj);
    }
    fp8amp_tensor all[] = {x, x8, junk, ya, yb, dy, dxa, dxb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(in_b));
    EXPECT_OK(fp8amp_linear_destroy(a));
    EXPECT_OK(fp8amp_linear_destroy(lb));
    free(w), free(b);
}

static void test_twins_bit_identical(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const twin_shape shapes[] = {{2, {48, 64}, 32}, {3, {2, 24, 64}, 48}, {2, {37, 40}, 24}};
    const fp8amp_scaling_mode modes[] = {FP8AMP_SCALING_CURRENT, FP8AMP_SCALING_DELAYED};
    for (size_t m = 0; m < 2; ++m)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) run_twins(ctx, modes[m], &shapes[s]);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static float bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* LayerNorm (E4M3, into the Linear's INPUT meta) -> forward_fp8, against the wide route and a float64
 * reference; then the backward into the norm's backward. */
static void test_layernorm_feeds_linear(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t m = 64, k = 128, n = 64;
    const int64_t xs[2] = {m, k}, ys[2] = {m, n}, ks[1] = {k}, ms[1] = {m};
    uint16_t *hx = xmalloc((size_t)(m * k) * 2);
    test_fill_bf16(hx, (size_t)(m * k), 2.0);
    for (int64_t i = 0; i < m * k; i += 7) hx[i] = test_bf16_of(bf16_value(hx[i]) + 1.5f); /* an offset: mean != 0 */
    float *gamma = random_f32((size_t)k, 0.5, 1.5), *beta = random_f32((size_t)k, -0.3, 0.3);
    float *w = random_f32((size_t)(n * k), -0.2, 0.2), *b = random_f32((size_t)n, -0.5, 0.5);
    fp8amp_linear wide = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_linear fed = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_scaling in = role_meta(fed, FP8AMP_ROLE_INPUT);
    fp8amp_tensor x = tensor_from_host(ctx, BF16_, 2, xs, hx);
    fp8amp_tensor g = tensor_from_host(ctx, F32_, 1, ks, gamma), be = tensor_from_host(ctx, F32_, 1, ks, beta);
    fp8amp_tensor x8 = make_tensor(ctx, E4M3_, 2, xs), xw = make_tensor(ctx, BF16_, 2, xs);
    EXPECT_OK(fp8amp_tensor_set_scaling(x8, in));
    fp8amp_tensor mean = make_tensor(ctx, F32_, 1, ms), rstd = make_tensor(ctx, F32_, 1, ms);
    fp8amp_tensor y8 = make_tensor(ctx, F32_, 2, ys), yw = make_tensor(ctx, F32_, 2, ys);
    EXPECT_OK(fp8amp_norm_forward(ctx, NULL, x, g, be, x8, NULL, mean, rstd));
    EXPECT_OK(fp8amp_norm_forward(ctx, NULL, x, g, be, xw, NULL, NULL, NULL));
    const fp8amp_status st = fp8amp_linear_forward_fp8(fed, x8, y8, 1);
    if (st == FP8AMP_ERROR_NOT_SUPPORTED) {
        print_message("%s\n", fp8amp_last_error_message());
        skip();
    }
    EXPECT_OK(st);
    EXPECT_OK(fp8amp_linear_forward(wide, xw, yw, 1));
    float *h8 = tensor_to_host(y8), *hw = tensor_to_host(yw);
    double e_ref = 0, e_wide = 0, s_ref = 0;
    for (int64_t r = 0; r < m; ++r) {
        double mu = 0, var = 0, xn[128];
        for (int64_t c = 0; c < k; ++c) mu += bf16_value(hx[r * k + c]);
        mu /= (double)k;
        for (int64_t c = 0; c < k; ++c) var += pow(bf16_value(hx[r * k + c]) - mu, 2);
        var /= (double)k;
        for (int64_t c = 0; c < k; ++c)
            xn[c] = (bf16_value(hx[r * k + c]) - mu) / sqrt(var + 1e-5) * gamma[c] + beta[c];
        for (int64_t o = 0; o < n; ++o) {
            double ref = b[o];
            for (int64_t c = 0; c < k; ++c) ref += xn[c] * (double)w[o * k + c];
            const double got = h8[r * n + o];
            assert_true(isfinite(got));
            e_ref += (got - ref) * (got - ref);
            e_wide += (got - hw[r * n + o]) * (got - hw[r * n + o]);
            s_ref += ref * ref;
        }
    }
    /* E4M3 operands (3 mantissa bits, x and W): a relative RMS error of a few percent; the wide route
     * differs only where the BF16 rounding of y moved a code. */
    print_message("relative RMS error: %.4f (float64 reference), %.4f (wide route)\n", sqrt(e_ref / s_ref),
                  sqrt(e_wide / s_ref));
    assert_true(sqrt(e_ref / s_ref) < 0.06);
    assert_true(sqrt(e_wide / s_ref) < 0.03);
    /* The backward: the Linear's dx is the norm's dy. */
    float *hdy = random_f32((size_t)(m * n), -1.0, 1.0);
    fp8amp_tensor dy = tensor_from_host(ctx, F32_, 2, ys, hdy), dxl = make_tensor(ctx, BF16_, 2, xs);
    fp8amp_tensor dx = make_tensor(ctx, BF16_, 2, xs), dg = make_tensor(ctx, F32_, 1, ks), db = make_tensor(ctx, F32_, 1, ks);
    EXPECT_OK(fp8amp_linear_backward(fed, dy, dxl, 0));
    EXPECT_OK(fp8amp_norm_backward(ctx, NULL, dxl, x, g, mean, rstd, dx, dg, db));
    float *hdg = tensor_to_host(dg), *hdb = tensor_to_host(db);
    for (int64_t c = 0; c < k; ++c) assert_true(isfinite(hdg[c]) && isfinite(hdb[c]));
    free(hdg), free(hdb), free(hdy), free(h8), free(hw);
    fp8amp_tensor all[] = {x, g, be, x8, xw, mean, rstd, y8, yw, dy, dxl, dx, dg, db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(in));
    EXPECT_OK(fp8amp_linear_destroy(wide));
    EXPECT_OK(fp8amp_linear_destroy(fed));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(hx), free(gamma), free(beta), free(w), free(b);
}

/* Every refusal between a training forward_fp8 and its backward leaves that forward to the backward:
 * the result equals a twin's that saw no refused call. */
static void test_refusals_change_nothing(void **state) {
    require_variant(state);
    const fp8amp_device dev = variant_device(state);
    fp8amp_context ctx = make_context(dev);
    const int64_t m = 32, k = 64, n = 48;
    const int64_t xs[2] = {m, k}, ys[2] = {m, n}, bad_k[2] = {m, k + 16}, bad_y[2] = {m, n + 16};
    float *w = random_f32((size_t)(n * k), -0.5, 0.5), *b = random_f32((size_t)n, -0.5, 0.5);
    float *hx = random_f32((size_t)(m * k), -2.0, 2.0), *hdy = random_f32((size_t)(m * n), -1.0, 1.0);
    fp8amp_linear lin = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_linear twin = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_ALWAYS_FP8, w, b);
    fp8amp_scaling in = role_meta(lin, FP8AMP_ROLE_INPUT);
    fp8amp_tensor x = tensor_from_host(ctx, F32_, 2, xs, hx), x8 = make_tensor(ctx, E4M3_, 2, xs);
    EXPECT_OK(fp8amp_tensor_set_scaling(x8, in));
    EXPECT_OK(fp8amp_quantize(ctx, x, x8));
    fp8amp_tensor y = make_tensor(ctx, F32_, 2, ys), yt = make_tensor(ctx, F32_, 2, ys);
    fp8amp_tensor dy = tensor_from_host(ctx, F32_, 2, ys, hdy);
    fp8amp_tensor dx = make_tensor(ctx, F32_, 2, xs), dxt = make_tensor(ctx, F32_, 2, xs);
    const fp8amp_status st = fp8amp_linear_forward_fp8(lin, x8, y, 1);
    if (st == FP8AMP_ERROR_NOT_SUPPORTED) {
        print_message("%s\n", fp8amp_last_error_message());
        skip();
    }
    EXPECT_OK(st);
    EXPECT_OK(fp8amp_linear_forward_fp8(twin, x8, yt, 1));

    /* Wrong dtypes: a wide x8, an E5M2 one (bound to an E5M2 meta), an FP8 y; an x8 never bound. */
    fp8amp_tensor y_e4m3 = make_tensor(ctx, E4M3_, 2, ys);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x, y, 1), FP8AMP_ERROR_DTYPE_MISMATCH);
    fp8amp_scaling e5 = counting_meta(ctx, E5M2_, FP8AMP_SCALING_CURRENT, 1.0f);
    fp8amp_tensor x_e5 = make_tensor(ctx, E5M2_, 2, xs);
    EXPECT_OK(fp8amp_tensor_set_scaling(x_e5, e5));
    EXPECT_OK(fp8amp_quantize(ctx, x, x_e5));
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x_e5, y, 1), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x8, y_e4m3, 1), FP8AMP_ERROR_DTYPE_MISMATCH);
    fp8amp_tensor unbound = make_tensor(ctx, E4M3_, 2, xs);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, unbound, y, 1), FP8AMP_ERROR_INVALID_ARGUMENT);
    /* Shapes: x8's last extent, y's shape. */
    fp8amp_tensor x8_k = make_tensor(ctx, E4M3_, 2, bad_k), y_n = make_tensor(ctx, F32_, 2, bad_y);
    EXPECT_OK(fp8amp_tensor_set_scaling(x8_k, in));
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x8_k, y, 1), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x8, y_n, 1), FP8AMP_ERROR_SHAPE_MISMATCH);
    /* NULL and destroyed handles. */
    EXPECT_STATUS(fp8amp_linear_forward_fp8(NULL, x8, y, 1), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, NULL, y, 1), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, x8, NULL, 1), FP8AMP_ERROR_INVALID_HANDLE);
    /* A CPU x8 on a CUDA Linear. */
    if (dev.type == FP8AMP_DEVICE_CUDA) {
        fp8amp_context cpu = make_context(cpu_device());
        fp8amp_scaling cin = counting_meta(cpu, E4M3_, FP8AMP_SCALING_CURRENT, 1.0f);
        fp8amp_tensor cx = tensor_from_host(cpu, F32_, 2, xs, hx), cx8 = make_tensor(cpu, E4M3_, 2, xs);
        EXPECT_OK(fp8amp_tensor_set_scaling(cx8, cin));
        EXPECT_OK(fp8amp_quantize(cpu, cx, cx8));
        EXPECT_STATUS(fp8amp_linear_forward_fp8(lin, cx8, y, 1), FP8AMP_ERROR_DEVICE_MISMATCH);
        EXPECT_OK(fp8amp_tensor_destroy(cx));
        EXPECT_OK(fp8amp_tensor_destroy(cx8));
        EXPECT_OK(fp8amp_scaling_destroy(cin));
        EXPECT_OK(fp8amp_context_destroy(cpu));
    }
    /* The saved forward survived every refusal. */
    EXPECT_OK(fp8amp_linear_backward(lin, dy, dx, 0));
    EXPECT_OK(fp8amp_linear_backward(twin, dy, dxt, 0));
    expect_same_tensor(y, yt);
    expect_same_tensor(dx, dxt);
    expect_same_param(lin, twin, fp8amp_linear_weight_grad);
    expect_same_param(lin, twin, fp8amp_linear_bias_grad);
    /* An inference forward_fp8 leaves nothing for a backward. */
    EXPECT_OK(fp8amp_linear_forward_fp8(lin, x8, y, 0));
    EXPECT_STATUS(fp8amp_linear_backward(lin, dy, dx, 0), FP8AMP_ERROR_INVALID_ARGUMENT);

    /* The policy NEVER_FP8 runs no FP8 GEMM: refused. */
    fp8amp_linear never = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_NEVER_FP8, w, b);
    EXPECT_STATUS(fp8amp_linear_forward_fp8(never, x8, y, 1), FP8AMP_ERROR_INVALID_ARGUMENT);
    fp8amp_gemm_kind kind = FP8AMP_GEMM_KIND_FP8;
    EXPECT_OK(fp8amp_linear_gemm_kind(never, &kind));
    assert_int_equal(kind, FP8AMP_GEMM_KIND_NONE);

    fp8amp_tensor all[] = {x, x8, y, yt, dy, dx, dxt, y_e4m3, x_e5, unbound, x8_k, y_n};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(in));
    EXPECT_OK(fp8amp_scaling_destroy(e5));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_linear_destroy(twin));
    EXPECT_OK(fp8amp_linear_destroy(never));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(w), free(b), free(hx), free(hdy);
}

/* AUTO: a wide input of a small shape runs BF16 GEMMs on CUDA (FP8 does not pay there); an FP8 input
 * of the same shape runs the FP8 GEMM (it is FP8 already), on both backends. */
static void test_auto_runs_fp8_for_fp8_input(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t m = 16, k = 32, n = 16;
    const int64_t xs[2] = {m, k}, ys[2] = {m, n};
    float *w = random_f32((size_t)(n * k), -0.5, 0.5), *b = random_f32((size_t)n, -0.5, 0.5);
    float *hx = random_f32((size_t)(m * k), -2.0, 2.0);
    fp8amp_linear lin = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, FP8AMP_GEMM_AUTO, w, b);
    fp8amp_scaling in = role_meta(lin, FP8AMP_ROLE_INPUT);
    fp8amp_tensor x = tensor_from_host(ctx, F32_, 2, xs, hx), x8 = make_tensor(ctx, E4M3_, 2, xs);
    fp8amp_tensor y = make_tensor(ctx, F32_, 2, ys);
    EXPECT_OK(fp8amp_tensor_set_scaling(x8, in));
    EXPECT_OK(fp8amp_quantize(ctx, x, x8));
    const fp8amp_status st = fp8amp_linear_forward_fp8(lin, x8, y, 1);
    if (st == FP8AMP_ERROR_NOT_SUPPORTED) {
        print_message("%s\n", fp8amp_last_error_message());
        skip();
    }
    EXPECT_OK(st);
    fp8amp_gemm_kind kind = FP8AMP_GEMM_KIND_NONE;
    EXPECT_OK(fp8amp_linear_gemm_kind(lin, &kind));
    assert_int_equal(kind, FP8AMP_GEMM_KIND_FP8);
    float *hy = tensor_to_host(y);
    for (int64_t i = 0; i < m * n; ++i) assert_true(isfinite(hy[i]));
    free(hy);
    fp8amp_tensor all[] = {x, x8, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    EXPECT_OK(fp8amp_scaling_destroy(in));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(w), free(b), free(hx);
}

/* fp8amp_linear_choose_gemm answers what the next wide forward then runs (fp8amp_linear_gemm_kind),
 * for each policy over a range of row counts; bad arguments are refused. */
static void test_choose_gemm_is_what_the_forward_runs(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t k = 256, n = 256;
    const int64_t rows[] = {1, 16, 48, 256, 2048};
    const fp8amp_gemm_policy policies[] = {FP8AMP_GEMM_AUTO, FP8AMP_GEMM_ALWAYS_FP8, FP8AMP_GEMM_NEVER_FP8};
    float *w = random_f32((size_t)(n * k), -0.5, 0.5), *b = random_f32((size_t)n, -0.5, 0.5);
    for (size_t p = 0; p < 3; ++p) {
        fp8amp_linear lin = make_linear(ctx, k, n, FP8AMP_SCALING_CURRENT, policies[p], w, b);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; ++r) {
            const int64_t xs[2] = {rows[r], k}, ys[2] = {rows[r], n};
            float *hx = random_f32((size_t)(rows[r] * k), -2.0, 2.0);
            fp8amp_tensor x = tensor_from_host(ctx, F32_, 2, xs, hx), y = make_tensor(ctx, F32_, 2, ys);
            for (int training = 0; training < 2; ++training) {
                fp8amp_gemm_kind want = FP8AMP_GEMM_KIND_NONE, ran = FP8AMP_GEMM_KIND_NONE;
                const fp8amp_status st = fp8amp_linear_choose_gemm(lin, rows[r], training, &want);
                if (st == FP8AMP_ERROR_NOT_SUPPORTED) { /* ALWAYS_FP8 on a shape FP8 cannot take: so says the forward */
                    assert_int_equal(policies[p], FP8AMP_GEMM_ALWAYS_FP8);
                    EXPECT_STATUS(fp8amp_linear_forward(lin, x, y, training), FP8AMP_ERROR_NOT_SUPPORTED);
                    continue;
                }
                EXPECT_OK(st);
                EXPECT_OK(fp8amp_linear_forward(lin, x, y, training));
                EXPECT_OK(fp8amp_linear_gemm_kind(lin, &ran));
                assert_int_equal(want, ran);
                if (policies[p] == FP8AMP_GEMM_ALWAYS_FP8) assert_int_equal(want, FP8AMP_GEMM_KIND_FP8);
                if (policies[p] == FP8AMP_GEMM_NEVER_FP8) assert_int_not_equal(want, FP8AMP_GEMM_KIND_FP8);
            }
            EXPECT_OK(fp8amp_tensor_destroy(x));
            EXPECT_OK(fp8amp_tensor_destroy(y));
            free(hx);
        }
        fp8amp_gemm_kind kind = FP8AMP_GEMM_KIND_NONE;
        EXPECT_STATUS(fp8amp_linear_choose_gemm(lin, 0, 1, &kind), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_STATUS(fp8amp_linear_choose_gemm(lin, -5, 1, &kind), FP8AMP_ERROR_INVALID_ARGUMENT);
        EXPECT_STATUS(fp8amp_linear_choose_gemm(lin, 16, 1, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_int_equal(kind, FP8AMP_GEMM_KIND_NONE);
        EXPECT_OK(fp8amp_linear_destroy(lin));
    }
    fp8amp_gemm_kind kind = FP8AMP_GEMM_KIND_NONE;
    EXPECT_STATUS(fp8amp_linear_choose_gemm(NULL, 16, 1, &kind), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(w), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_twins_bit_identical),
        DEVICE_TESTS(test_layernorm_feeds_linear),
        DEVICE_TESTS(test_refusals_change_nothing),
        DEVICE_TESTS(test_auto_runs_fp8_for_fp8_input),
        DEVICE_TESTS(test_choose_gemm_is_what_the_forward_runs),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
