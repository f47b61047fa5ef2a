/* fp8amp_tensor_rebind: a wrapped tensor pointed at other memory with a new shape. Checked: the
 * getters, the contents and every write follow the new memory (and leave the old alone); operations
 * (a cast, a Linear's forward and backward) through rebound handles give exactly what freshly wrapped
 * handles give; every refusal -- bad arguments, tensors that are not wrapped, a tensor ever bound to a
 * meta, an optimizer's parameter or gradient, host memory for a CUDA context -- leaves the tensor
 * unchanged. Device-dependent tests run on the CPU and on CUDA (skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>

#include "test_util.h"

#define POISON 0xA5

static const fp8amp_dtype ALL_DTYPES[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3,
                                          FP8AMP_DTYPE_E5M2};
#define N_DTYPES (sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

/* ---- helpers --------------------------------------------------------------------------------- */

/* Random bytes, none of them zero (host copies move bits, not values). */
static void fill_bytes(void *buf, size_t nbytes) {
    uint8_t *b = (uint8_t *)buf;
    size_t i;
    for (i = 0; i < nbytes; ++i) b[i] = (uint8_t)test_rng_uniform(1.0, 256.0);
}

/* Random float32 values in +-[0.25, 2), never zero. */
static void fill_f32(float *f, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        const double x = test_rng_uniform(0.25, 2.0);
        f[i] = (float)(test_rng_uniform(0.0, 1.0) < 0.5 ? -x : x);
    }
}

static void *read_all(fp8amp_tensor t, size_t nbytes) {
    void *got = xmalloc(nbytes);
    assert_int_equal(tensor_bytes(t), nbytes);
    memset(got, POISON, nbytes);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, got, nbytes));
    return got;
}

static void assert_contents(fp8amp_tensor t, const void *expect, size_t nbytes) {
    void *got = read_all(t, nbytes);
    assert_memory_equal(got, expect, nbytes);
    free(got);
}

static void *data_of(fp8amp_tensor t) {
    void *p = NULL;
    EXPECT_OK(fp8amp_tensor_data(t, &p));
    return p;
}

/* Asserts the tensor is dtype[shape] over `data` on `device`. */
static void assert_is(fp8amp_tensor t, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape, const void *data,
                      fp8amp_device device) {
    fp8amp_dtype got_dtype = (fp8amp_dtype)-1;
    int32_t got_ndim = -1, i;
    int64_t got_shape[FP8AMP_MAX_NDIM], numel = 0, expect_numel = 1;
    size_t nbytes = 0;
    fp8amp_device got_device = {(fp8amp_device_type)0, -1};
    EXPECT_OK(fp8amp_tensor_dtype(t, &got_dtype));
    assert_int_equal(got_dtype, dtype);
    EXPECT_OK(fp8amp_tensor_ndim(t, &got_ndim));
    assert_int_equal(got_ndim, ndim);
    for (i = 0; i < FP8AMP_MAX_NDIM; ++i) got_shape[i] = -77;
    EXPECT_OK(fp8amp_tensor_shape(t, FP8AMP_MAX_NDIM, got_shape));
    for (i = 0; i < ndim; ++i) {
        assert_int_equal(got_shape[i], shape[i]);
        expect_numel *= shape[i];
    }
    EXPECT_OK(fp8amp_tensor_numel(t, &numel));
    assert_int_equal(numel, expect_numel);
    EXPECT_OK(fp8amp_tensor_nbytes(t, &nbytes));
    assert_int_equal(nbytes, (size_t)expect_numel * fp8amp_dtype_size(dtype));
    assert_ptr_equal(data_of(t), data);
    EXPECT_OK(fp8amp_tensor_device(t, &got_device));
    assert_int_equal(got_device.type, device.type);
    assert_int_equal(got_device.index, device.index);
}

static fp8amp_tensor wrap(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape, void *data) {
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, dtype, ndim, shape, data, &t));
    assert_non_null(t);
    return t;
}

/* An owning tensor with random contents; *host receives them (the caller frees). */
static fp8amp_tensor random_owner(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape,
                                  void **host) {
    fp8amp_tensor t = make_tensor(ctx, dtype, ndim, shape);
    const size_t n = tensor_bytes(t);
    *host = xmalloc(n);
    fill_bytes(*host, n);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, *host, n));
    return t;
}

/* An owning F32 tensor of fresh random finite values in [-1, 1) (random bytes would hold NaN and
 * inf now and then, and an optimizer step skips on those). */
static fp8amp_tensor random_finite_f32(fp8amp_context ctx, int32_t ndim, const int64_t *shape, void **host) {
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, ndim, shape);
    const size_t n = tensor_bytes(t) / 4;
    float *v = (float *)xmalloc(n * 4);
    for (size_t i = 0; i < n; ++i) v[i] = (float)test_rng_uniform(-1.0, 1.0);
    *host = v;
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, v, n * 4));
    return t;
}

/* ---- the view follows the new memory --------------------------------------------------------- */

static void test_rebind_follows_new_memory(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape_a[2] = {4, 6}, shape_b[3] = {3, 2, 5}, flat_b[1] = {30};
    size_t k;
    for (k = 0; k < N_DTYPES; ++k) {
        const fp8amp_dtype dtype = ALL_DTYPES[k];
        const size_t es = fp8amp_dtype_size(dtype);
        void *host_a, *host_b, *host_c, *fresh, *got;
        fp8amp_tensor a = random_owner(ctx, dtype, 2, shape_a, &host_a);
        fp8amp_tensor b = random_owner(ctx, dtype, 1, flat_b, &host_b);
        fp8amp_tensor c = random_owner(ctx, dtype, 1, flat_b, &host_c);
        void *da = data_of(a), *db = data_of(b), *dc = data_of(c);
        fp8amp_tensor view = wrap(ctx, dtype, 2, shape_a, da);
        fp8amp_tensor out = wrap(ctx, dtype, 2, shape_a, da);

        assert_contents(view, host_a, 24 * es);
        EXPECT_OK(fp8amp_tensor_rebind(view, db, 3, shape_b));
        assert_is(view, dtype, 3, shape_b, db, device);
        assert_contents(view, host_b, 30 * es);

        /* Writes through the view land in the new memory and leave the old alone. */
        fresh = xmalloc(30 * es);
        fill_bytes(fresh, 30 * es);
        assert_memory_not_equal(fresh, host_b, 30 * es);
        EXPECT_OK(fp8amp_tensor_copy_from_host(view, fresh, 30 * es));
        assert_contents(b, fresh, 30 * es);
        assert_contents(a, host_a, 24 * es);

        /* An operation reads the rebound source and writes the rebound destination. */
        EXPECT_OK(fp8amp_tensor_rebind(out, dc, 3, shape_b));
        assert_contents(c, host_c, 30 * es);
        EXPECT_OK(fp8amp_cast(ctx, view, out)); /* same dtype: an exact copy */
        assert_contents(c, fresh, 30 * es);
        assert_contents(a, host_a, 24 * es);

        /* A scalar view of the first element of a, then back to all of a. */
        EXPECT_OK(fp8amp_tensor_rebind(view, da, 0, NULL));
        assert_is(view, dtype, 0, NULL, da, device);
        assert_contents(view, host_a, es);
        EXPECT_OK(fp8amp_tensor_rebind(view, da, 2, shape_a));
        assert_contents(view, host_a, 24 * es);

        /* Destroying the views leaves the owners' memory intact. */
        EXPECT_OK(fp8amp_tensor_destroy(view));
        EXPECT_OK(fp8amp_tensor_destroy(out));
        assert_contents(a, host_a, 24 * es);
        got = read_all(b, 30 * es);
        assert_memory_equal(got, fresh, 30 * es);
        free(got);
        EXPECT_OK(fp8amp_tensor_destroy(a));
        EXPECT_OK(fp8amp_tensor_destroy(b));
        EXPECT_OK(fp8amp_tensor_destroy(c));
        free(host_a);
        free(host_b);
        free(host_c);
        free(fresh);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A Linear driven through four handles rebound at every call (what a framework binding does) gives
 * bit for bit what freshly wrapped handles over the same memory give, for several batch shapes; and
 * y is near the float64 product (a check that both read the right memory). */
static void test_rebind_linear_matches_fresh_wraps(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    enum { K = 32, N = 48, MAXM = 48 };
    const int64_t rows[3] = {16, 48, 32};
    fp8amp_linear_desc d;
    fp8amp_linear lin = NULL;
    fp8amp_tensor w = NULL, bias = NULL, wgrad = NULL;
    fp8amp_tensor hx = NULL, hy = NULL, hdy = NULL, hdx = NULL;
    float *wv = (float *)xmalloc(sizeof(float) * N * K), *bv = (float *)xmalloc(sizeof(float) * N);
    const int64_t big_x[1] = {MAXM * K}, big_y[1] = {MAXM * N};
    fp8amp_tensor x_own, dy_own, y_fresh_own, y_reb_own, dx_fresh_own, dx_reb_own;
    int r;

    EXPECT_OK(fp8amp_linear_desc_init_default(&d));
    d.in_features = K;
    d.out_features = N;
    d.recipe.mode = FP8AMP_SCALING_CURRENT;
    d.weight_dtype = FP8AMP_DTYPE_F32;
    d.wgrad_dtype = FP8AMP_DTYPE_F32;
    d.policy = device.type == FP8AMP_DEVICE_CUDA ? FP8AMP_GEMM_NEVER_FP8 : FP8AMP_GEMM_ALWAYS_FP8;
    EXPECT_OK(fp8amp_linear_create(ctx, &d, &lin));
    EXPECT_OK(fp8amp_linear_weight(lin, &w));
    EXPECT_OK(fp8amp_linear_bias(lin, &bias));
    EXPECT_OK(fp8amp_linear_weight_grad(lin, &wgrad));
    fill_f32(wv, (size_t)N * K);
    fill_f32(bv, N);
    EXPECT_OK(fp8amp_tensor_copy_from_host(w, wv, sizeof(float) * N * K));
    EXPECT_OK(fp8amp_tensor_copy_from_host(bias, bv, sizeof(float) * N));

    /* Device memory for the activations, from owning tensors. */
    x_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_x);
    dy_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_y);
    y_fresh_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_y);
    y_reb_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_y);
    dx_fresh_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_x);
    dx_reb_own = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, big_x);

    for (r = 0; r < 3; ++r) {
        const int64_t m = rows[r];
        const int64_t xs[2] = {m, K}, ys[2] = {m, N}, x3[3] = {m / 16, 16, K}, y3[3] = {m / 16, 16, N};
        float *xv = (float *)xmalloc(sizeof(float) * (size_t)(m * K));
        float *dyv = (float *)xmalloc(sizeof(float) * (size_t)(m * N));
        float *y1, *y2, *dx1, *dx2, *g1, *g2;
        fp8amp_tensor fx, fy, fdy, fdx, xin, dyin;
        double err2 = 0.0, ref2 = 0.0;
        int64_t i, j, kk;
        fill_f32(xv, (size_t)(m * K));
        fill_f32(dyv, (size_t)(m * N));
        /* x and dy live at the start of their buffers; upload through exact-size views. */
        xin = wrap(ctx, FP8AMP_DTYPE_F32, 2, xs, data_of(x_own));
        dyin = wrap(ctx, FP8AMP_DTYPE_F32, 2, ys, data_of(dy_own));
        EXPECT_OK(fp8amp_tensor_copy_from_host(xin, xv, sizeof(float) * (size_t)(m * K)));
        EXPECT_OK(fp8amp_tensor_copy_from_host(dyin, dyv, sizeof(float) * (size_t)(m * N)));
        EXPECT_OK(fp8amp_tensor_destroy(xin));
        EXPECT_OK(fp8amp_tensor_destroy(dyin));

        /* Fresh wraps (2-D), forward + backward. */
        fx = wrap(ctx, FP8AMP_DTYPE_F32, 2, xs, data_of(x_own));
        fy = wrap(ctx, FP8AMP_DTYPE_F32, 2, ys, data_of(y_fresh_own));
        fdy = wrap(ctx, FP8AMP_DTYPE_F32, 2, ys, data_of(dy_own));
        fdx = wrap(ctx, FP8AMP_DTYPE_F32, 2, xs, data_of(dx_fresh_own));
        EXPECT_OK(fp8amp_linear_forward(lin, fx, fy, 1));
        EXPECT_OK(fp8amp_linear_backward(lin, fdy, fdx, 0));
        y1 = (float *)read_all(fy, sizeof(float) * (size_t)(m * N));
        dx1 = (float *)read_all(fdx, sizeof(float) * (size_t)(m * K));
        g1 = (float *)read_all(wgrad, sizeof(float) * N * K);
        EXPECT_OK(fp8amp_tensor_destroy(fx));
        EXPECT_OK(fp8amp_tensor_destroy(fy));
        EXPECT_OK(fp8amp_tensor_destroy(fdy));
        EXPECT_OK(fp8amp_tensor_destroy(fdx));

        /* The same through handles made once and rebound (3-D on the odd calls: leading dims). */
        if (!hx) {
            hx = wrap(ctx, FP8AMP_DTYPE_F32, 1, big_x, data_of(dx_reb_own)); /* anywhere at first */
            hy = wrap(ctx, FP8AMP_DTYPE_F32, 1, big_x, data_of(dx_reb_own));
            hdy = wrap(ctx, FP8AMP_DTYPE_F32, 1, big_x, data_of(dx_reb_own));
            hdx = wrap(ctx, FP8AMP_DTYPE_F32, 1, big_x, data_of(dx_reb_own));
        }
        EXPECT_OK(fp8amp_tensor_rebind(hx, data_of(x_own), r % 2 ? 3 : 2, r % 2 ? x3 : xs));
        EXPECT_OK(fp8amp_tensor_rebind(hy, data_of(y_reb_own), r % 2 ? 3 : 2, r % 2 ? y3 : ys));
        EXPECT_OK(fp8amp_tensor_rebind(hdy, data_of(dy_own), r % 2 ? 3 : 2, r % 2 ? y3 : ys));
        EXPECT_OK(fp8amp_tensor_rebind(hdx, data_of(dx_reb_own), r % 2 ? 3 : 2, r % 2 ? x3 : xs));
        EXPECT_OK(fp8amp_linear_forward(lin, hx, hy, 1));
        EXPECT_OK(fp8amp_linear_backward(lin, hdy, hdx, 0));
        y2 = (float *)read_all(hy, sizeof(float) * (size_t)(m * N));
        dx2 = (float *)read_all(hdx, sizeof(float) * (size_t)(m * K));
        g2 = (float *)read_all(wgrad, sizeof(float) * N * K);
        assert_memory_equal(y1, y2, sizeof(float) * (size_t)(m * N));
        assert_memory_equal(dx1, dx2, sizeof(float) * (size_t)(m * K));
        assert_memory_equal(g1, g2, sizeof(float) * N * K);

        /* y against float64 x W^T + b: FP8 (CPU) or BF16 (CUDA) operands, normwise. */
        for (i = 0; i < m; ++i)
            for (j = 0; j < N; ++j) {
                double ref = bv[j];
                for (kk = 0; kk < K; ++kk) ref += (double)xv[i * K + kk] * (double)wv[j * K + kk];
                err2 += (y2[i * N + j] - ref) * (y2[i * N + j] - ref);
                ref2 += ref * ref;
            }
        assert_true(ref2 > 0.0);
        assert_true(sqrt(err2 / ref2) < 0.1);

        free(xv);
        free(dyv);
        free(y1);
        free(y2);
        free(dx1);
        free(dx2);
        free(g1);
        free(g2);
    }
    EXPECT_OK(fp8amp_tensor_destroy(hx));
    EXPECT_OK(fp8amp_tensor_destroy(hy));
    EXPECT_OK(fp8amp_tensor_destroy(hdy));
    EXPECT_OK(fp8amp_tensor_destroy(hdx));
    EXPECT_OK(fp8amp_tensor_destroy(x_own));
    EXPECT_OK(fp8amp_tensor_destroy(dy_own));
    EXPECT_OK(fp8amp_tensor_destroy(y_fresh_own));
    EXPECT_OK(fp8amp_tensor_destroy(y_reb_own));
    EXPECT_OK(fp8amp_tensor_destroy(dx_fresh_own));
    EXPECT_OK(fp8amp_tensor_destroy(dx_reb_own));
    EXPECT_OK(fp8amp_tensor_destroy(w));
    EXPECT_OK(fp8amp_tensor_destroy(bias));
    EXPECT_OK(fp8amp_tensor_destroy(wgrad));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    free(wv);
    free(bv);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- refusals leave the tensor unchanged ----------------------------------------------------- */

static void test_rebind_bad_arguments(void **state) {
    (void)state;
    const fp8amp_device cpu = cpu_device();
    fp8amp_context ctx = make_context(cpu);
    const int64_t shape[2] = {3, 5}, other[2] = {5, 3};
    const int64_t bad_extent[2] = {3, 0}, negative[2] = {-2, 4};
    const int64_t overflow[2] = {INT64_MAX / 2, 4};
    const size_t cap = 15 * 4 + 16;
    uint8_t *buf = NULL, *buf2 = NULL, *before;
    fp8amp_tensor t, dead, scratch;
    size_t off;

    assert_int_equal(posix_memalign((void **)&buf, 64, cap), 0);
    assert_int_equal(posix_memalign((void **)&buf2, 64, cap), 0);
    fill_bytes(buf, cap);
    fill_bytes(buf2, cap);
    before = (uint8_t *)xmemdup(buf, cap);
    t = wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, buf);

#define STILL_THE_SAME() assert_is(t, FP8AMP_DTYPE_F32, 2, shape, buf, cpu)
    EXPECT_STATUS(fp8amp_tensor_rebind(t, NULL, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    for (off = 1; off < 4; ++off) {
        EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2 + off, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
        STILL_THE_SAME();
    }
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, FP8AMP_MAX_NDIM + 1, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, -1, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, 2, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, 2, bad_extent), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, 2, negative), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();
    EXPECT_STATUS(fp8amp_tensor_rebind(t, buf2, 2, overflow), FP8AMP_ERROR_INVALID_ARGUMENT);
    STILL_THE_SAME();

    /* Handles: NULL, destroyed, of another kind. */
    EXPECT_STATUS(fp8amp_tensor_rebind(NULL, buf2, 2, other), FP8AMP_ERROR_INVALID_HANDLE);
    dead = wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, buf2);
    EXPECT_OK(fp8amp_tensor_destroy(dead));
    EXPECT_STATUS(fp8amp_tensor_rebind(dead, buf2, 2, other), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_rebind((fp8amp_tensor)(void *)ctx, buf2, 2, other), FP8AMP_ERROR_INVALID_HANDLE);
    STILL_THE_SAME();
    assert_contents(t, before, 15 * 4);
    assert_memory_equal(buf, before, cap); /* nothing was written */

    /* The dtype is kept: a byte type at an odd address is fine, F16 at an even one. */
    scratch = wrap(ctx, FP8AMP_DTYPE_E4M3, 2, shape, buf);
    EXPECT_OK(fp8amp_tensor_rebind(scratch, buf2 + 1, 2, other));
    assert_is(scratch, FP8AMP_DTYPE_E4M3, 2, other, buf2 + 1, cpu);
    assert_contents(scratch, buf2 + 1, 15);
    EXPECT_OK(fp8amp_tensor_destroy(scratch));
    scratch = wrap(ctx, FP8AMP_DTYPE_F16, 2, shape, buf);
    EXPECT_OK(fp8amp_tensor_rebind(scratch, buf2 + 2, 2, other));
    assert_contents(scratch, buf2 + 2, 30);
    EXPECT_STATUS(fp8amp_tensor_rebind(scratch, buf2 + 3, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(scratch, FP8AMP_DTYPE_F16, 2, other, buf2 + 2, cpu);
    EXPECT_OK(fp8amp_tensor_destroy(scratch));
#undef STILL_THE_SAME

    EXPECT_OK(fp8amp_tensor_destroy(t));
    free(before);
    free(buf);
    free(buf2);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Tensors that are not plain wrapped views are refused, unchanged: owning tensors, DLPack imports,
 * a Linear's weight, a tensor that was ever bound to a meta, an optimizer's parameter and gradient
 * (until the optimizer is destroyed). */
static void test_rebind_refuses_non_views(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[2] = {4, 8}, other[2] = {8, 4};
    void *host_own, *host_spare, *host_p, *host_g;
    fp8amp_tensor own = random_owner(ctx, FP8AMP_DTYPE_F32, 2, shape, &host_own);
    fp8amp_tensor spare = random_owner(ctx, FP8AMP_DTYPE_F32, 2, shape, &host_spare);
    fp8amp_tensor p_own = random_finite_f32(ctx, 2, shape, &host_p);
    fp8amp_tensor g_own = random_finite_f32(ctx, 2, shape, &host_g);
    void *d_own = data_of(own), *d_spare = data_of(spare);
    struct DLManagedTensorVersioned *managed = NULL;
    fp8amp_tensor imported = NULL, weight = NULL, q, p, g;
    fp8amp_linear_desc ld;
    fp8amp_linear lin = NULL;
    fp8amp_recipe recipe;
    fp8amp_scaling meta = NULL;
    fp8amp_adam_desc ad;
    fp8amp_optimizer opt = NULL;
    int64_t wshape[2] = {16, 32};
    void *dw;

    /* An owning tensor. */
    EXPECT_STATUS(fp8amp_tensor_rebind(own, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(own, FP8AMP_DTYPE_F32, 2, shape, d_own, device);
    assert_contents(own, host_own, 32 * 4);

    /* A DLPack import (of the owner's export). */
    EXPECT_OK(fp8amp_tensor_to_dlpack(own, &managed));
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, managed, &imported));
    EXPECT_STATUS(fp8amp_tensor_rebind(imported, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(imported, FP8AMP_DTYPE_F32, 2, shape, d_own, device);
    EXPECT_OK(fp8amp_tensor_destroy(imported));

    /* A Linear's weight. */
    EXPECT_OK(fp8amp_linear_desc_init_default(&ld));
    ld.in_features = 32;
    ld.out_features = 16;
    EXPECT_OK(fp8amp_linear_create(ctx, &ld, &lin));
    EXPECT_OK(fp8amp_linear_weight(lin, &weight));
    dw = data_of(weight);
    EXPECT_STATUS(fp8amp_tensor_rebind(weight, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(weight, FP8AMP_DTYPE_BF16, 2, wshape, dw, device);
    EXPECT_OK(fp8amp_tensor_destroy(weight));
    EXPECT_OK(fp8amp_linear_destroy(lin));

    /* A wrapped E4M3 tensor bound to a meta, and still after unbinding it. */
    EXPECT_OK(fp8amp_recipe_init_default(&recipe));
    EXPECT_OK(fp8amp_scaling_create(ctx, &recipe, FP8AMP_DTYPE_E4M3, &meta));
    q = wrap(ctx, FP8AMP_DTYPE_E4M3, 2, shape, d_own);
    EXPECT_OK(fp8amp_tensor_set_scaling(q, meta));
    EXPECT_STATUS(fp8amp_tensor_rebind(q, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(q, FP8AMP_DTYPE_E4M3, 2, shape, d_own, device);
    EXPECT_OK(fp8amp_tensor_set_scaling(q, NULL));
    EXPECT_STATUS(fp8amp_tensor_rebind(q, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(q, FP8AMP_DTYPE_E4M3, 2, shape, d_own, device);
    EXPECT_OK(fp8amp_tensor_destroy(q));
    EXPECT_OK(fp8amp_scaling_destroy(meta));

    /* An optimizer's parameter and gradient, wrapped: pinned while the optimizer lives. */
    p = wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, data_of(p_own));
    g = wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, data_of(g_own));
    EXPECT_OK(fp8amp_adam_desc_init_default(&ad));
    EXPECT_OK(fp8amp_optimizer_create(ctx, &ad, &opt));
    EXPECT_OK(fp8amp_optimizer_add_param(opt, p, g));
    EXPECT_STATUS(fp8amp_tensor_rebind(p, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_rebind(g, d_spare, 2, other), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_is(p, FP8AMP_DTYPE_F32, 2, shape, data_of(p_own), device);
    assert_is(g, FP8AMP_DTYPE_F32, 2, shape, data_of(g_own), device);
    /* The optimizer still steps the memory it was given (the refused calls moved nothing). */
    EXPECT_OK(fp8amp_optimizer_step(opt, NULL));
    {
        float *after = (float *)read_all(p_own, 32 * 4);
        assert_memory_not_equal(after, host_p, 32 * 4);
        assert_contents(spare, host_spare, 32 * 4);
        free(after);
    }
    EXPECT_OK(fp8amp_optimizer_destroy(opt));
    EXPECT_OK(fp8amp_tensor_rebind(p, d_spare, 2, other));
    assert_is(p, FP8AMP_DTYPE_F32, 2, other, d_spare, device);
    assert_contents(p, host_spare, 32 * 4);
    EXPECT_OK(fp8amp_tensor_destroy(p));
    EXPECT_OK(fp8amp_tensor_destroy(g));

    EXPECT_OK(fp8amp_tensor_destroy(own));
    EXPECT_OK(fp8amp_tensor_destroy(spare));
    EXPECT_OK(fp8amp_tensor_destroy(p_own));
    EXPECT_OK(fp8amp_tensor_destroy(g_own));
    free(host_own);
    free(host_spare);
    free(host_p);
    free(host_g);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* CUDA: host memory is refused with DEVICE_MISMATCH, the tensor unchanged. */
static void test_rebind_cuda_host_pointer(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[2] = {8, 16}, other[2] = {16, 8};
    float *host = (float *)xmalloc(128 * sizeof(float));
    void *values;
    fp8amp_tensor owner = random_owner(ctx, FP8AMP_DTYPE_F32, 2, shape, &values);
    fp8amp_tensor view = wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, data_of(owner));
    fill_f32(host, 128);
    EXPECT_STATUS(fp8amp_tensor_rebind(view, host, 2, other), FP8AMP_ERROR_DEVICE_MISMATCH);
    assert_is(view, FP8AMP_DTYPE_F32, 2, shape, data_of(owner), device);
    assert_contents(view, values, 128 * sizeof(float));
    EXPECT_OK(fp8amp_tensor_destroy(view));
    EXPECT_OK(fp8amp_tensor_destroy(owner));
    free(values);
    free(host);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_rebind_follows_new_memory),
        DEVICE_TESTS(test_rebind_linear_matches_fresh_wraps),
        cmocka_unit_test(test_rebind_bad_arguments),
        DEVICE_TESTS(test_rebind_refuses_non_views),
        cmocka_unit_test_prestate(test_rebind_cuda_host_pointer, (void *)&VARIANT_CUDA),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
