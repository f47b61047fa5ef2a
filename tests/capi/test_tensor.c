/* Tensors: create, wrap, getters, host copies, destroy; argument checking and the handle registry.
 * Device-dependent tests run on the CPU and on CUDA (the CUDA run is skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "test_util.h"

#define POISON 0xA5

static const fp8amp_dtype ALL_DTYPES[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3,
                                          FP8AMP_DTYPE_E5M2};
#define N_DTYPES (sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

/* ---- helpers --------------------------------------------------------------------------------- */

/* Fresh random contents with no zero element: F32 as values in +-[1, 1000), the narrower types as
 * random bit patterns with every byte in 1..255 (host copies move bits, not values). */
static void tensor_fill_random(fp8amp_dtype dtype, void *buf, size_t nbytes) {
    size_t i;
    if (dtype == FP8AMP_DTYPE_F32) {
        float *f = (float *)buf;
        for (i = 0; i < nbytes / sizeof(float); ++i) {
            const double x = test_rng_uniform(1.0, 1000.0);
            f[i] = (float)(test_rng_uniform(0.0, 1.0) < 0.5 ? -x : x);
        }
    } else {
        uint8_t *b = (uint8_t *)buf;
        for (i = 0; i < nbytes; ++i) b[i] = (uint8_t)test_rng_uniform(1.0, 256.0);
    }
}

/* Writes fresh random contents; returns them (the caller frees). */
static void *write_random(fp8amp_tensor t) {
    fp8amp_dtype dtype;
    const size_t n = tensor_bytes(t);
    void *buf = xmalloc(n);
    EXPECT_OK(fp8amp_tensor_dtype(t, &dtype));
    tensor_fill_random(dtype, buf, n);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, buf, n));
    return buf;
}

/* Asserts the tensor holds exactly `expect` (nbytes long). */


/* Asserts every getter describes the tensor as dtype[shape] on device. */
static void assert_describes(fp8amp_tensor t, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape,
                             fp8amp_device device) {
    fp8amp_dtype got_dtype = (fp8amp_dtype)-1;
    int32_t got_ndim = -1;
    int64_t got_shape[FP8AMP_MAX_NDIM + 2];
    int64_t numel = -1, expect_numel = 1;
    size_t nbytes = 0;
    void *data = NULL;
    fp8amp_device got_device = {(fp8amp_device_type)0, -1};
    int32_t i;

    EXPECT_OK(fp8amp_tensor_dtype(t, &got_dtype));
    assert_int_equal(got_dtype, dtype);
    EXPECT_OK(fp8amp_tensor_ndim(t, &got_ndim));
    assert_int_equal(got_ndim, ndim);
    for (i = 0; i < FP8AMP_MAX_NDIM + 2; ++i) got_shape[i] = -77;
    EXPECT_OK(fp8amp_tensor_shape(t, FP8AMP_MAX_NDIM, got_shape));
    for (i = 0; i < ndim; ++i) {
        assert_int_equal(got_shape[i], shape[i]);
        expect_numel *= shape[i];
    }
    for (i = ndim; i < FP8AMP_MAX_NDIM + 2; ++i) assert_int_equal(got_shape[i], -77); /* nothing past ndim */
    EXPECT_OK(fp8amp_tensor_numel(t, &numel));
    assert_int_equal(numel, expect_numel);
    EXPECT_OK(fp8amp_tensor_nbytes(t, &nbytes));
    assert_int_equal(nbytes, (size_t)expect_numel * fp8amp_dtype_size(dtype));
    EXPECT_OK(fp8amp_tensor_data(t, &data));
    assert_non_null(data);
    assert_int_equal((uintptr_t)data % fp8amp_dtype_size(dtype), 0);
    EXPECT_OK(fp8amp_tensor_device(t, &got_device));
    assert_device_equal(got_device, device);
}

/* ---- round trips ----------------------------------------------------------------------------- */

static void test_roundtrip_each_dtype(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[3] = {3, 7, 5};
    size_t k;
    for (k = 0; k < N_DTYPES; ++k) {
        fp8amp_tensor t = make_tensor(ctx, ALL_DTYPES[k], 3, shape);
        void *first, *second;
        assert_describes(t, ALL_DTYPES[k], 3, shape, device);
        first = write_random(t);
        expect_bytes(t, first, 105 * fp8amp_dtype_size(ALL_DTYPES[k]));
        /* A second write replaces the first (the read above was not of stale memory). */
        second = write_random(t);
        assert_memory_not_equal(first, second, 105 * fp8amp_dtype_size(ALL_DTYPES[k]));
        expect_bytes(t, second, 105 * fp8amp_dtype_size(ALL_DTYPES[k]));
        assert_describes(t, ALL_DTYPES[k], 3, shape, device);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        free(first);
        free(second);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_every_ndim(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    int32_t ndim;

    for (ndim = 0; ndim <= FP8AMP_MAX_NDIM; ++ndim) {
        int64_t shape[FP8AMP_MAX_NDIM];
        const fp8amp_dtype dtype = ALL_DTYPES[(size_t)ndim % N_DTYPES];
        size_t nbytes = fp8amp_dtype_size(dtype);
        fp8amp_tensor t;
        void *values;
        int32_t i;
        for (i = 0; i < ndim; ++i) {
            shape[i] = (int64_t)test_rng_uniform(1.0, 4.0); /* 1..3 */
            nbytes *= (size_t)shape[i];
        }
        t = make_tensor(ctx, dtype, ndim, ndim == 0 ? NULL : shape);
        assert_describes(t, dtype, ndim, shape, device);
        values = write_random(t);
        expect_bytes(t, values, nbytes);
        {
            /* capacity == ndim is enough. */
            int64_t exact[FP8AMP_MAX_NDIM + 1];
            exact[ndim] = -9;
            EXPECT_OK(fp8amp_tensor_shape(t, ndim, exact));
            if (ndim > 0) assert_memory_equal(exact, shape, (size_t)ndim * sizeof(int64_t));
            assert_int_equal(exact[ndim], -9);
        }
        EXPECT_OK(fp8amp_tensor_destroy(t));
        free(values);
    }

    {
        /* A scalar: one element, shape may be NULL (or is ignored), shape() writes nothing. */
        const int64_t ignored[1] = {-5};
        fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 0, ignored);
        float v = 0.0f, back = 0.0f;
        assert_describes(t, FP8AMP_DTYPE_F32, 0, NULL, device);
        EXPECT_OK(fp8amp_tensor_shape(t, 0, NULL));
        while (v == 0.0f) v = (float)test_rng_uniform(-1000.0, 1000.0);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, &v, sizeof v));
        EXPECT_OK(fp8amp_tensor_copy_to_host(t, &back, sizeof back));
        assert_memory_equal(&back, &v, sizeof v);
        EXPECT_OK(fp8amp_tensor_destroy(t));
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- creation: bad arguments ----------------------------------------------------------------- */

/* An allocator hook that counts its calls (alloc_counter, test_util.h): failing argument checks must
 * not allocate. */

static void test_create_bad_arguments(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_tensor witness, out;
    void *witness_values;
    alloc_counter counter = {0, 0};
    const int64_t ones[FP8AMP_MAX_NDIM + 4] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t witness_shape[2] = {6, 3};
    size_t i;

    witness = make_tensor(ctx, FP8AMP_DTYPE_BF16, 2, witness_shape);
    witness_values = write_random(witness);
    if (device.type == FP8AMP_DEVICE_CPU)
        EXPECT_OK(fp8amp_context_set_allocator(ctx, counter_alloc, counter_free, &counter));

    /* ndim outside 0..8 */
    {
        static const int32_t bad_ndim[] = {FP8AMP_MAX_NDIM + 1, FP8AMP_MAX_NDIM + 2, -1, INT32_MIN, INT32_MAX};
        for (i = 0; i < sizeof bad_ndim / sizeof bad_ndim[0]; ++i) {
            out = SENTINEL_TENSOR;
            EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, bad_ndim[i], ones, &out),
                          FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_ptr_equal(out, SENTINEL_TENSOR);
        }
    }
    /* NULL shape with ndim > 0 */
    out = SENTINEL_TENSOR;
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, NULL, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_MAX_NDIM, NULL, &out),
                  FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    /* extents < 1, first, middle or last */
    {
        static const int64_t bad_shapes[][3] = {
            {0, 4, 4}, {4, 0, 4}, {4, 4, 0}, {-1, 4, 4}, {4, 4, -3}, {INT64_MIN, 1, 1}, {2, -2, -2},
        };
        for (i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; ++i) {
            out = SENTINEL_TENSOR;
            EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F16, 3, bad_shapes[i], &out),
                          FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_ptr_equal(out, SENTINEL_TENSOR);
        }
    }
    /* element counts that overflow int64, and byte sizes that overflow size_t */
    {
        static const struct {
            fp8amp_dtype dtype;
            int32_t ndim;
            int64_t shape[3];
        } overflow[] = {
            {FP8AMP_DTYPE_E4M3, 2, {INT64_MAX / 2, 4, 0}},
            {FP8AMP_DTYPE_E4M3, 2, {INT64_MAX / 2 + 1, 2, 0}},
            {FP8AMP_DTYPE_E4M3, 2, {INT64_MAX, 2, 0}},
            {FP8AMP_DTYPE_E5M2, 2, {(int64_t)1 << 32, (int64_t)1 << 32, 0}},
            {FP8AMP_DTYPE_E5M2, 3, {(int64_t)1 << 21, (int64_t)1 << 21, (int64_t)1 << 21}},
            {FP8AMP_DTYPE_F32, 1, {INT64_MAX, 0, 0}}, /* 2^63 - 1 elements fit; their bytes do not */
            {FP8AMP_DTYPE_F16, 2, {INT64_MAX / 2, 3, 0}},
        };
        for (i = 0; i < sizeof overflow / sizeof overflow[0]; ++i) {
            out = SENTINEL_TENSOR;
            EXPECT_STATUS(fp8amp_tensor_create(ctx, overflow[i].dtype, overflow[i].ndim, overflow[i].shape, &out),
                          FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_ptr_equal(out, SENTINEL_TENSOR);
        }
    }
    /* dtypes that are not fp8amp_dtype values */
    {
        static const int bad_dtype[] = {5, 6, -1, 100, 0x7fffffff};
        for (i = 0; i < sizeof bad_dtype / sizeof bad_dtype[0]; ++i) {
            out = SENTINEL_TENSOR;
            EXPECT_STATUS(fp8amp_tensor_create(ctx, (fp8amp_dtype)bad_dtype[i], 2, witness_shape, &out),
                          FP8AMP_ERROR_INVALID_ARGUMENT);
            assert_ptr_equal(out, SENTINEL_TENSOR);
        }
    }
    /* NULL out */
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, witness_shape, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 0, NULL, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);

    /* bad contexts */
    out = SENTINEL_TENSOR;
    EXPECT_STATUS(fp8amp_tensor_create(NULL, FP8AMP_DTYPE_F32, 2, witness_shape, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_create((fp8amp_context)(void *)witness, FP8AMP_DTYPE_F32, 2, witness_shape, &out),
                  FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_create((fp8amp_context)(uintptr_t)0x1234, FP8AMP_DTYPE_F32, 2, witness_shape, &out),
                  FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    {
        fp8amp_context gone = make_context(device);
        EXPECT_OK(fp8amp_context_destroy(gone));
        EXPECT_STATUS(fp8amp_tensor_create(gone, FP8AMP_DTYPE_F32, 2, witness_shape, &out),
                      FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(out, SENTINEL_TENSOR);
    }

    /* None of that allocated anything or disturbed the witness. */
    assert_int_equal(counter.allocs, 0);
    assert_int_equal(counter.frees, 0);
    assert_describes(witness, FP8AMP_DTYPE_BF16, 2, witness_shape, device);
    expect_bytes(witness, witness_values, 36);

    /* And the context still creates tensors (through the hook, on the CPU). */
    out = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, witness_shape);
    if (device.type == FP8AMP_DEVICE_CPU) assert_int_equal(counter.allocs, 1);
    EXPECT_OK(fp8amp_tensor_destroy(out));
    if (device.type == FP8AMP_DEVICE_CPU) assert_int_equal(counter.frees, 1);

    EXPECT_OK(fp8amp_tensor_destroy(witness));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(witness_values);
}

/* Sizes that are valid but cannot be allocated: OUT_OF_MEMORY, no crash, *out unchanged. */
static void test_create_out_of_memory(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    static const struct {
        fp8amp_dtype dtype;
        int32_t ndim;
        int64_t shape[3];
    } huge[] = {
        {FP8AMP_DTYPE_F32, 3, {(int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 10}}, /* 4 PiB */
        {FP8AMP_DTYPE_E4M3, 2, {(int64_t)1 << 31, (int64_t)1 << 31, 0}},               /* 4 EiB */
        {FP8AMP_DTYPE_F32, 1, {INT64_MAX / 2, 0, 0}},                                  /* 16 EiB - 4 */
    };
    size_t i;
    for (i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        fp8amp_tensor out = SENTINEL_TENSOR;
        EXPECT_STATUS(fp8amp_tensor_create(ctx, huge[i].dtype, huge[i].ndim, huge[i].shape, &out),
                      FP8AMP_ERROR_OUT_OF_MEMORY);
        assert_ptr_equal(out, SENTINEL_TENSOR);
    }
    {
        /* The context is still fine. */
        const int64_t shape[1] = {33};
        fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, shape);
        void *values = write_random(t);
        expect_bytes(t, values, 33 * sizeof(float));
        EXPECT_OK(fp8amp_tensor_destroy(t));
        free(values);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- wrap ------------------------------------------------------------------------------------ */

static void test_wrap_host_memory(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[2] = {4, 6};
    size_t k;
    for (k = 0; k < N_DTYPES; ++k) {
        const fp8amp_dtype dtype = ALL_DTYPES[k];
        const size_t nbytes = 24 * fp8amp_dtype_size(dtype);
        void *buf = NULL, *data = NULL, *fresh, *back;
        fp8amp_tensor t = NULL;
        assert_int_equal(posix_memalign(&buf, 64, nbytes), 0);
        tensor_fill_random(dtype, buf, nbytes);

        EXPECT_OK(fp8amp_tensor_wrap(ctx, dtype, 2, shape, buf, &t));
        assert_non_null(t);
        assert_describes(t, dtype, 2, shape, cpu_device());
        EXPECT_OK(fp8amp_tensor_data(t, &data));
        assert_ptr_equal(data, buf); /* no copy */
        expect_bytes(t, buf, nbytes);

        /* The user's writes are the tensor's contents... */
        tensor_fill_random(dtype, buf, nbytes);
        expect_bytes(t, buf, nbytes);
        /* ...and the tensor's writes land in the user's memory. */
        fresh = xmalloc(nbytes);
        tensor_fill_random(dtype, fresh, nbytes);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, fresh, nbytes));
        assert_memory_equal(buf, fresh, nbytes);

        /* Destroying the tensor leaves the memory to its owner, contents intact. */
        back = xmemdup(buf, nbytes);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        assert_memory_equal(buf, back, nbytes);
        free(back);
        free(fresh);
        free(buf);
    }
    {
        /* A wrapped scalar. */
        float x = (float)test_rng_uniform(1.0, 2.0), y = 0.0f;
        fp8amp_tensor t = NULL;
        EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 0, NULL, &x, &t));
        EXPECT_OK(fp8amp_tensor_copy_to_host(t, &y, sizeof y));
        assert_memory_equal(&x, &y, sizeof x);
        EXPECT_OK(fp8amp_tensor_destroy(t));
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_wrap_bad_arguments(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[2] = {3, 5};
    const int64_t bad_extent[2] = {3, 0};
    const int64_t overflow[2] = {INT64_MAX / 2, 4};
    const size_t cap = 15 * 4 + 16;
    uint8_t *buf = NULL, *before;
    fp8amp_tensor out;
    size_t off;

    assert_int_equal(posix_memalign((void **)&buf, 64, cap), 0);
    tensor_fill_random(FP8AMP_DTYPE_E4M3, buf, cap);
    before = (uint8_t *)xmemdup(buf, cap);

    out = SENTINEL_TENSOR;
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, NULL, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_E4M3, 0, NULL, NULL, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);

    /* Misaligned for the element size. */
    for (off = 1; off < 4; ++off) {
        EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, buf + off, &out),
                      FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_ptr_equal(out, SENTINEL_TENSOR);
    }
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F16, 2, shape, buf + 1, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_BF16, 2, shape, buf + 3, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);

    /* The create checks apply too. */
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, FP8AMP_MAX_NDIM + 1, shape, buf, &out),
                  FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, -1, shape, buf, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, NULL, buf, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, bad_extent, buf, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_E4M3, 2, overflow, buf, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, (fp8amp_dtype)9, 2, shape, buf, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, buf, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_wrap(NULL, FP8AMP_DTYPE_F32, 2, shape, buf, &out), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    EXPECT_STATUS(fp8amp_tensor_wrap((fp8amp_context)(uintptr_t)0x1234, FP8AMP_DTYPE_F32, 2, shape, buf, &out),
                  FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(out, SENTINEL_TENSOR);

    /* The user's memory was never written. */
    assert_memory_equal(buf, before, cap);

    /* Byte types have no alignment requirement: an odd address is fine. */
    out = NULL;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_E4M3, 2, shape, buf + 1, &out));
    expect_bytes(out, buf + 1, 15);
    EXPECT_OK(fp8amp_tensor_destroy(out));
    /* F16 at an even address that is not 4-aligned is fine too. */
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F16, 2, shape, buf + 2, &out));
    expect_bytes(out, buf + 2, 30);
    EXPECT_OK(fp8amp_tensor_destroy(out));

    free(before);
    free(buf);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* CUDA: a host pointer is refused with DEVICE_MISMATCH; device memory (another tensor's) wraps. */
static void test_wrap_cuda(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t shape[2] = {8, 16};
    float *host = (float *)xmalloc(128 * sizeof(float));
    float *before;
    fp8amp_tensor out = SENTINEL_TENSOR, owner, view = NULL;
    void *dev = NULL, *view_data = NULL, *values, *more;

    tensor_fill_random(FP8AMP_DTYPE_F32, host, 128 * sizeof(float));
    before = (float *)xmemdup(host, 128 * sizeof(float));
    EXPECT_STATUS(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, host, &out), FP8AMP_ERROR_DEVICE_MISMATCH);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    assert_memory_equal(host, before, 128 * sizeof(float));

    owner = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    values = write_random(owner);
    EXPECT_OK(fp8amp_tensor_data(owner, &dev));
    EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 2, shape, dev, &view));
    EXPECT_OK(fp8amp_tensor_data(view, &view_data));
    assert_ptr_equal(view_data, dev);
    assert_describes(view, FP8AMP_DTYPE_F32, 2, shape, variant_device(state));
    expect_bytes(view, values, 128 * sizeof(float));
    more = write_random(view);
    expect_bytes(owner, more, 128 * sizeof(float));
    EXPECT_OK(fp8amp_tensor_destroy(view));
    expect_bytes(owner, more, 128 * sizeof(float)); /* the view did not free the owner's memory */
    EXPECT_OK(fp8amp_tensor_destroy(owner));

    free(values);
    free(more);
    free(before);
    free(host);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- host copies: bad arguments -------------------------------------------------------------- */

static void test_copy_bad_arguments(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[2] = {5, 7};
    const size_t nbytes = 35 * sizeof(float);
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    void *values = write_random(t);
    uint8_t *src = (uint8_t *)xmalloc(2 * nbytes);
    uint8_t *dst = (uint8_t *)xmalloc(2 * nbytes);
    uint8_t *dst_before;
    const size_t wrong[] = {0, 1, nbytes - 1, nbytes + 1, nbytes - 4, 2 * nbytes, 35, (size_t)-1};
    size_t i;

    tensor_fill_random(FP8AMP_DTYPE_F32, src, 2 * nbytes);
    memset(dst, POISON, 2 * nbytes);
    dst_before = (uint8_t *)xmemdup(dst, 2 * nbytes);

    for (i = 0; i < sizeof wrong / sizeof wrong[0]; ++i) {
        EXPECT_STATUS(fp8amp_tensor_copy_from_host(t, src, wrong[i]), FP8AMP_ERROR_SHAPE_MISMATCH);
        expect_bytes(t, values, nbytes);
        EXPECT_STATUS(fp8amp_tensor_copy_to_host(t, dst, wrong[i]), FP8AMP_ERROR_SHAPE_MISMATCH);
        assert_memory_equal(dst, dst_before, 2 * nbytes);
    }
    EXPECT_STATUS(fp8amp_tensor_copy_from_host(t, NULL, nbytes), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_copy_to_host(t, NULL, nbytes), FP8AMP_ERROR_INVALID_ARGUMENT);
    expect_bytes(t, values, nbytes);

    /* Bad handles: nothing read, nothing written. */
    {
        const fp8amp_tensor bad[] = {NULL, (fp8amp_tensor)(void *)ctx, (fp8amp_tensor)(uintptr_t)0x1234};
        for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
            EXPECT_STATUS(fp8amp_tensor_copy_to_host(bad[i], dst, nbytes), FP8AMP_ERROR_INVALID_HANDLE);
            assert_memory_equal(dst, dst_before, 2 * nbytes);
            EXPECT_STATUS(fp8amp_tensor_copy_from_host(bad[i], src, nbytes), FP8AMP_ERROR_INVALID_HANDLE);
        }
    }

    /* A byte count that would be right for another dtype of the same shape is still wrong. */
    {
        fp8amp_tensor q = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, shape);
        void *qvalues = write_random(q);
        EXPECT_STATUS(fp8amp_tensor_copy_from_host(q, src, nbytes), FP8AMP_ERROR_SHAPE_MISMATCH);
        EXPECT_STATUS(fp8amp_tensor_copy_to_host(q, dst, nbytes), FP8AMP_ERROR_SHAPE_MISMATCH);
        assert_memory_equal(dst, dst_before, 2 * nbytes);
        expect_bytes(q, qvalues, 35);
        EXPECT_OK(fp8amp_tensor_destroy(q));
        free(qvalues);
    }

    assert_describes(t, FP8AMP_DTYPE_F32, 2, shape, device);
    expect_bytes(t, values, nbytes);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    free(values);
    free(src);
    free(dst);
    free(dst_before);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- getters: bad arguments and bad handles -------------------------------------------------- */

static void test_getters_bad_arguments(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[4] = {2, 3, 1, 4};
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_E5M2, 4, shape);
    void *values = write_random(t);
    int64_t buf[FP8AMP_MAX_NDIM];
    int32_t cap, i;

    EXPECT_STATUS(fp8amp_tensor_dtype(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_ndim(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_numel(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_nbytes(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_data(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_device(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_tensor_shape(t, FP8AMP_MAX_NDIM, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);

    /* capacity < ndim: refused, and not one entry written. */
    for (cap = -2; cap < 4; ++cap) {
        for (i = 0; i < FP8AMP_MAX_NDIM; ++i) buf[i] = -123;
        EXPECT_STATUS(fp8amp_tensor_shape(t, cap, buf), FP8AMP_ERROR_INVALID_ARGUMENT);
        for (i = 0; i < FP8AMP_MAX_NDIM; ++i) assert_int_equal(buf[i], -123);
    }
    {
        /* A scalar with a negative capacity is refused too. */
        fp8amp_tensor s = make_tensor(ctx, FP8AMP_DTYPE_F32, 0, NULL);
        EXPECT_STATUS(fp8amp_tensor_shape(s, -1, buf), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_int_equal(buf[0], -123);
        EXPECT_OK(fp8amp_tensor_destroy(s));
    }

    assert_describes(t, FP8AMP_DTYPE_E5M2, 4, shape, device);
    expect_bytes(t, values, 24);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    free(values);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Every tensor function on a handle that is not a live tensor: INVALID_HANDLE, outputs untouched. */
static void expect_not_a_tensor(fp8amp_tensor bad) {
    fp8amp_dtype dtype = (fp8amp_dtype)42;
    int32_t ndim = 42;
    int64_t shape[FP8AMP_MAX_NDIM] = {42, 42, 42, 42, 42, 42, 42, 42};
    int64_t numel = 42;
    size_t nbytes = 42;
    void *data = (void *)&ndim;
    fp8amp_device device = {(fp8amp_device_type)42, 42};
    uint8_t host[16];
    int32_t i;

    memset(host, POISON, sizeof host);
    EXPECT_STATUS(fp8amp_tensor_dtype(bad, &dtype), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_ndim(bad, &ndim), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_shape(bad, FP8AMP_MAX_NDIM, shape), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_numel(bad, &numel), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_nbytes(bad, &nbytes), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_data(bad, &data), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_device(bad, &device), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_copy_to_host(bad, host, sizeof host), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_tensor_copy_from_host(bad, host, sizeof host), FP8AMP_ERROR_INVALID_HANDLE);
    if (bad) EXPECT_STATUS(fp8amp_tensor_destroy(bad), FP8AMP_ERROR_INVALID_HANDLE);

    assert_int_equal(dtype, 42);
    assert_int_equal(ndim, 42);
    for (i = 0; i < FP8AMP_MAX_NDIM; ++i) assert_int_equal(shape[i], 42);
    assert_int_equal(numel, 42);
    assert_int_equal(nbytes, 42);
    assert_ptr_equal(data, (void *)&ndim);
    assert_int_equal(device.type, 42);
    assert_int_equal(device.index, 42);
    for (i = 0; i < (int32_t)sizeof host; ++i) assert_int_equal(host[i], POISON);
}

static void test_bad_tensor_handles(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[2] = {4, 4};
    fp8amp_tensor live = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, shape);
    fp8amp_tensor dead = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 2, shape);
    void *values = write_random(live);
    int on_stack = 7;

    EXPECT_OK(fp8amp_tensor_destroy(NULL));
    EXPECT_OK(fp8amp_tensor_destroy(dead));
    expect_not_a_tensor(dead);                          /* destroyed */
    expect_not_a_tensor((fp8amp_tensor)(void *)ctx);    /* a context */
    expect_not_a_tensor(NULL);                          /* NULL */
    expect_not_a_tensor((fp8amp_tensor)(uintptr_t)0x1234);
    expect_not_a_tensor((fp8amp_tensor)(uintptr_t)UINTPTR_MAX);
    expect_not_a_tensor((fp8amp_tensor)(void *)&on_stack);
    assert_int_equal(on_stack, 7);

    /* The context passed as a tensor is still a working context; the live tensor is untouched. */
    {
        fp8amp_device d;
        EXPECT_OK(fp8amp_context_device(ctx, &d));
        assert_device_equal(d, device);
    }
    assert_describes(live, FP8AMP_DTYPE_E4M3, 2, shape, device);
    expect_bytes(live, values, 16);
    EXPECT_OK(fp8amp_tensor_destroy(live));
    expect_not_a_tensor(live);
    free(values);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- the registry ---------------------------------------------------------------------------- */

#define CYCLES 10000

static void test_many_create_destroy_cycles(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t wshape[1] = {17};
    fp8amp_tensor witness = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, wshape);
    void *wvalues = write_random(witness);
    fp8amp_tensor first = NULL, prev = NULL;
    int cycle;

    for (cycle = 0; cycle < CYCLES; ++cycle) {
        const int64_t shape[2] = {1 + cycle % 5, 1 + cycle % 3};
        fp8amp_tensor t = NULL;
        int64_t numel = 0;
        EXPECT_OK(fp8amp_tensor_create(ctx, ALL_DTYPES[cycle % N_DTYPES], 2, shape, &t));
        assert_non_null(t);
        assert_ptr_not_equal(t, witness);
        if (first) assert_ptr_not_equal(t, first); /* a slot's next owner gets a new handle */
        if (prev) assert_ptr_not_equal(t, prev);
        EXPECT_OK(fp8amp_tensor_numel(t, &numel));
        assert_int_equal(numel, shape[0] * shape[1]);
        if (cycle % 1000 == 0) {
            void *v = write_random(t);
            expect_bytes(t, v, (size_t)numel * fp8amp_dtype_size(ALL_DTYPES[cycle % N_DTYPES]));
            free(v);
        }
        EXPECT_OK(fp8amp_tensor_destroy(t));
        if (!first) first = t;
        prev = t;
        {
            int32_t nd = -1;
            EXPECT_STATUS(fp8amp_tensor_ndim(first, &nd), FP8AMP_ERROR_INVALID_HANDLE);
            assert_int_equal(nd, -1);
        }
    }
    /* Stale handles stay dead, whatever reused their slots. */
    expect_not_a_tensor(first);
    expect_not_a_tensor(prev);
    assert_describes(witness, FP8AMP_DTYPE_F32, 1, wshape, cpu_device());
    expect_bytes(witness, wvalues, sizeof(float) * 17);

    {
        /* Many live at once: distinct handles, each with its own contents. */
        enum { LIVE = 200 };
        fp8amp_tensor ts[LIVE];
        void *vs[LIVE];
        int i, j;
        for (i = 0; i < LIVE; ++i) {
            const int64_t shape[1] = {1 + i % 9};
            ts[i] = make_tensor(ctx, FP8AMP_DTYPE_E5M2, 1, shape);
            vs[i] = write_random(ts[i]);
            for (j = 0; j < i; ++j) assert_ptr_not_equal(ts[i], ts[j]);
        }
        for (i = 0; i < LIVE; ++i) expect_bytes(ts[i], vs[i], (size_t)(1 + i % 9));
        /* Destroy in a shuffled order; every other one must survive the others' destruction. */
        for (i = LIVE - 1; i > 0; --i) {
            const int k = (int)test_rng_uniform(0.0, (double)(i + 1));
            fp8amp_tensor tt = ts[i];
            void *vv = vs[i];
            ts[i] = ts[k];
            vs[i] = vs[k];
            ts[k] = tt;
            vs[k] = vv;
        }
        for (i = 0; i < LIVE; ++i) {
            EXPECT_OK(fp8amp_tensor_destroy(ts[i]));
            if (i + 1 < LIVE) {
                size_t n = 0;
                EXPECT_OK(fp8amp_tensor_nbytes(ts[LIVE - 1], &n));
                expect_bytes(ts[LIVE - 1], vs[LIVE - 1], n);
            }
        }
        for (i = 0; i < LIVE; ++i) {
            EXPECT_STATUS(fp8amp_tensor_destroy(ts[i]), FP8AMP_ERROR_INVALID_HANDLE);
            free(vs[i]);
        }
    }

    EXPECT_OK(fp8amp_tensor_destroy(witness));
    free(wvalues);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* Different contexts used from different threads at once (the header's threading contract). */
#define THREADS 4
#define THREAD_CYCLES 1500

typedef struct {
    uint64_t seed;
    int failures;
    fp8amp_tensor stale;
} worker_result;

static void *worker(void *arg) {
    worker_result *r = (worker_result *)arg;
    fp8amp_context ctx = NULL;
    uint64_t x = r->seed;
    int i;
    if (fp8amp_context_create(cpu_device(), &ctx) != FP8AMP_SUCCESS) {
        r->failures++;
        return NULL;
    }
    for (i = 0; i < THREAD_CYCLES; ++i) {
        const int64_t shape[1] = {1 + i % 13};
        uint8_t in[13], out[13];
        fp8amp_tensor t = NULL;
        int j;
        for (j = 0; j < 13; ++j) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            in[j] = (uint8_t)(1 + x % 255);
        }
        memset(out, 0, sizeof out);
        if (fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &t) != FP8AMP_SUCCESS ||
            fp8amp_tensor_copy_from_host(t, in, (size_t)shape[0]) != FP8AMP_SUCCESS ||
            fp8amp_tensor_copy_to_host(t, out, (size_t)shape[0]) != FP8AMP_SUCCESS ||
            memcmp(in, out, (size_t)shape[0]) != 0 || fp8amp_tensor_destroy(t) != FP8AMP_SUCCESS) {
            r->failures++;
            continue;
        }
        if (fp8amp_tensor_destroy(t) != FP8AMP_ERROR_INVALID_HANDLE) r->failures++;
        if (i == 0) {
            r->stale = t;
        } else {
            int64_t n = -1;
            if (fp8amp_tensor_numel(r->stale, &n) != FP8AMP_ERROR_INVALID_HANDLE || n != -1) r->failures++;
        }
    }
    if (fp8amp_context_destroy(ctx) != FP8AMP_SUCCESS) r->failures++;
    return NULL;
}

static void test_threads_with_own_contexts(void **state) {
    (void)state;
    pthread_t tids[THREADS];
    worker_result results[THREADS];
    int i;
    for (i = 0; i < THREADS; ++i) {
        results[i].seed = test_rng_u64() | 1;
        results[i].failures = 0;
        results[i].stale = NULL;
        assert_int_equal(pthread_create(&tids[i], NULL, worker, &results[i]), 0);
    }
    for (i = 0; i < THREADS; ++i) assert_int_equal(pthread_join(tids[i], NULL), 0);
    for (i = 0; i < THREADS; ++i) {
        assert_int_equal(results[i].failures, 0);
        assert_non_null(results[i].stale);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_roundtrip_each_dtype),
        DEVICE_TESTS(test_every_ndim),
        DEVICE_TESTS(test_create_bad_arguments),
        DEVICE_TESTS(test_create_out_of_memory),
        cmocka_unit_test(test_wrap_host_memory),
        cmocka_unit_test(test_wrap_bad_arguments),
        cmocka_unit_test_prestate(test_wrap_cuda, (void *)&VARIANT_CUDA),
        DEVICE_TESTS(test_copy_bad_arguments),
        DEVICE_TESTS(test_getters_bad_arguments),
        DEVICE_TESTS(test_bad_tensor_handles),
        cmocka_unit_test(test_many_create_destroy_cycles),
        cmocka_unit_test(test_threads_with_own_contexts),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
