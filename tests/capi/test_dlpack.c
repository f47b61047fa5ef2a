/* DLPack 1.1: export (fp8amp_tensor_to_dlpack), import (fp8amp_tensor_from_dlpack), ownership and
 * deleters, read-only imports, and round trips. The tests play the other side of the exchange with
 * the specification's structs (dlpack.h). */
#define _POSIX_C_SOURCE 200809L

#include "fp8amp/dlpack.h"
#include "test_util.h"

#define SENTINEL_MANAGED ((struct DLManagedTensorVersioned *)(uintptr_t)0x3c3c3c3c)
#define POISON 0xA5

static const struct {
    fp8amp_dtype dtype;
    uint8_t code, bits;
} DTYPE_CODES[] = {
    {FP8AMP_DTYPE_F32, 2, 32},  /* kDLFloat */
    {FP8AMP_DTYPE_F16, 2, 16},  /* kDLFloat */
    {FP8AMP_DTYPE_BF16, 4, 16}, /* kDLBfloat */
    {FP8AMP_DTYPE_E4M3, 10, 8}, /* kDLFloat8_e4m3fn */
    {FP8AMP_DTYPE_E5M2, 12, 8}, /* kDLFloat8_e5m2 */
};
#define N_DTYPES (sizeof DTYPE_CODES / sizeof DTYPE_CODES[0])

/* ---- helpers --------------------------------------------------------------------------------- */

/* Random contents with no zero byte (moved as bits, so any pattern will do). */
static void dl_fill_random(void *buf, size_t nbytes) {
    uint8_t *b = (uint8_t *)buf;
    size_t i;
    for (i = 0; i < nbytes; ++i) b[i] = (uint8_t)test_rng_uniform(1.0, 256.0);
}

static void *write_random(fp8amp_tensor t) {
    const size_t n = tensor_bytes(t);
    void *buf = xmalloc(n);
    dl_fill_random(buf, n);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, buf, n));
    return buf;
}


static void *tensor_data(fp8amp_tensor t) {
    void *p = NULL;
    EXPECT_OK(fp8amp_tensor_data(t, &p));
    return p;
}

/* ---- a DLPack producer ----------------------------------------------------------------------- */

/* A producer-made managed tensor over host memory the test owns. Its deleter only counts: the test
 * frees the memory itself, after checking how often the deleter ran. */
typedef struct {
    struct DLManagedTensorVersioned managed;
    int64_t shape[FP8AMP_MAX_NDIM + 2];
    int64_t strides[FP8AMP_MAX_NDIM + 2];
    void *buffer;
    size_t buffer_bytes;
    int deleter_calls;
    struct DLManagedTensorVersioned *deleted_with; /* the argument the deleter got */
} producer;

static void producer_deleter(struct DLManagedTensorVersioned *self) {
    producer *p = (producer *)self->manager_ctx;
    p->deleter_calls++;
    p->deleted_with = self;
}

/* A compact row-major host tensor of `code`/`bits`, shape given, over fresh random bytes, with
 * `offset` bytes before the data (byte_offset). strides NULL. */
static void producer_init(producer *p, uint8_t code, uint8_t bits, int32_t ndim, const int64_t *shape,
                          uint64_t offset) {
    size_t nbytes = bits / 8, i;
    memset(p, 0, sizeof *p);
    for (i = 0; i < (size_t)ndim; ++i) {
        p->shape[i] = shape[i];
        nbytes *= (size_t)(shape[i] > 0 ? shape[i] : 1);
    }
    p->buffer_bytes = (size_t)offset + nbytes;
    assert_int_equal(posix_memalign(&p->buffer, 256, p->buffer_bytes), 0);
    dl_fill_random(p->buffer, p->buffer_bytes);
    p->managed.version.major = 1;
    p->managed.version.minor = 1;
    p->managed.manager_ctx = p;
    p->managed.deleter = producer_deleter;
    p->managed.flags = 0;
    p->managed.dl_tensor.data = p->buffer;
    p->managed.dl_tensor.device.device_type = kDLCPU;
    p->managed.dl_tensor.device.device_id = 0;
    p->managed.dl_tensor.ndim = ndim;
    p->managed.dl_tensor.dtype.code = code;
    p->managed.dl_tensor.dtype.bits = bits;
    p->managed.dl_tensor.dtype.lanes = 1;
    p->managed.dl_tensor.shape = p->shape;
    p->managed.dl_tensor.strides = NULL;
    p->managed.dl_tensor.byte_offset = offset;
}

static void producer_set_compact_strides(producer *p) {
    int64_t s = 1;
    int32_t i;
    for (i = p->managed.dl_tensor.ndim - 1; i >= 0; --i) {
        p->strides[i] = s;
        s *= p->shape[i];
    }
    p->managed.dl_tensor.strides = p->strides;
}

static void producer_free(producer *p) { free(p->buffer); }

/* Imports expecting `status`; on failure asserts the producer is untouched: its struct, its
 * memory, its deleter not called, *out not written. */
static void expect_import_fails(fp8amp_context ctx, producer *p, fp8amp_status status) {
    struct DLManagedTensorVersioned copy = p->managed;
    void *bytes = xmemdup(p->buffer, p->buffer_bytes);
    int64_t shape_copy[FP8AMP_MAX_NDIM + 2], strides_copy[FP8AMP_MAX_NDIM + 2];
    fp8amp_tensor out = SENTINEL_TENSOR;
    memcpy(shape_copy, p->shape, sizeof shape_copy);
    memcpy(strides_copy, p->strides, sizeof strides_copy);

    EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, &p->managed, &out), status);
    assert_ptr_equal(out, SENTINEL_TENSOR);
    assert_int_equal(p->deleter_calls, 0);
    assert_memory_equal(&copy, &p->managed, sizeof copy);
    assert_memory_equal(shape_copy, p->shape, sizeof shape_copy);
    assert_memory_equal(strides_copy, p->strides, sizeof strides_copy);
    assert_memory_equal(bytes, p->buffer, p->buffer_bytes);
    free(bytes);
}

static fp8amp_tensor import_ok(fp8amp_context ctx, producer *p) {
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, &p->managed, &t));
    assert_non_null(t);
    assert_int_equal(p->deleter_calls, 0); /* not before the tensor goes */
    return t;
}

/* ---- export ---------------------------------------------------------------------------------- */

static void check_export(struct DLManagedTensorVersioned *m, fp8amp_tensor t, fp8amp_device device, uint8_t code,
                         uint8_t bits, int32_t ndim, const int64_t *shape) {
    int64_t stride = 1;
    int32_t i;
    assert_non_null(m);
    assert_int_equal(m->version.major, 1);
    assert_int_equal(m->version.minor, 1);
    assert_non_null(m->deleter);
    assert_int_equal(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
    assert_ptr_equal(m->dl_tensor.data, tensor_data(t));
    assert_int_equal(m->dl_tensor.byte_offset, 0);
    assert_int_equal(m->dl_tensor.device.device_type, device.type == FP8AMP_DEVICE_CUDA ? 2 : 1);
    assert_int_equal(m->dl_tensor.device.device_id, device.index);
    assert_int_equal(m->dl_tensor.ndim, ndim);
    assert_int_equal(m->dl_tensor.dtype.code, code);
    assert_int_equal(m->dl_tensor.dtype.bits, bits);
    assert_int_equal(m->dl_tensor.dtype.lanes, 1);
    if (ndim > 0) assert_non_null(m->dl_tensor.shape);
    for (i = 0; i < ndim; ++i) assert_int_equal(m->dl_tensor.shape[i], shape[i]);
    /* Strides, when given, are the compact row-major ones (in elements). */
    if (m->dl_tensor.strides) {
        for (i = ndim - 1; i >= 0; --i) {
            assert_int_equal(m->dl_tensor.strides[i], stride);
            stride *= shape[i];
        }
    }
}

static void test_export(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    const int64_t shape[3] = {2, 3, 4};
    size_t k;

    for (k = 0; k < N_DTYPES; ++k) {
        fp8amp_tensor t = make_tensor(ctx, DTYPE_CODES[k].dtype, 3, shape);
        const size_t nbytes = tensor_bytes(t);
        void *values = write_random(t);
        struct DLManagedTensorVersioned *m = NULL;

        EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m));
        check_export(m, t, device, DTYPE_CODES[k].code, DTYPE_CODES[k].bits, 3, shape);
        assert_non_null(m->dl_tensor.strides); /* fp8amp always states its strides */
        if (device.type == FP8AMP_DEVICE_CPU) assert_memory_equal(m->dl_tensor.data, values, nbytes);

        /* The memory outlives the fp8amp tensor until the deleter runs. */
        EXPECT_OK(fp8amp_tensor_destroy(t));
        if (device.type == FP8AMP_DEVICE_CPU) {
            assert_memory_equal(m->dl_tensor.data, values, nbytes);
        } else {
            /* Read the device memory back through a borrowed fp8amp view of it. */
            fp8amp_tensor view = NULL;
            EXPECT_OK(fp8amp_tensor_wrap(ctx, DTYPE_CODES[k].dtype, 3, shape, m->dl_tensor.data, &view));
            expect_bytes(view, values, nbytes);
            EXPECT_OK(fp8amp_tensor_destroy(view));
        }
        m->deleter(m);
        free(values);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_export_scalar_and_max_ndim(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_tensor s = make_tensor(ctx, FP8AMP_DTYPE_F32, 0, NULL);
    const int64_t shape8[FP8AMP_MAX_NDIM] = {2, 1, 3, 1, 2, 2, 1, 3};
    fp8amp_tensor t8 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, FP8AMP_MAX_NDIM, shape8);
    struct DLManagedTensorVersioned *ms = NULL, *m8 = NULL;

    EXPECT_OK(fp8amp_tensor_to_dlpack(s, &ms));
    check_export(ms, s, device, 2, 32, 0, NULL);
    EXPECT_OK(fp8amp_tensor_to_dlpack(t8, &m8));
    check_export(m8, t8, device, 10, 8, FP8AMP_MAX_NDIM, shape8);
    assert_ptr_not_equal(ms, m8);

    /* Two exports of one tensor are independent: each has its own deleter call. */
    {
        struct DLManagedTensorVersioned *again = NULL;
        EXPECT_OK(fp8amp_tensor_to_dlpack(t8, &again));
        assert_ptr_not_equal(again, m8);
        assert_ptr_equal(again->dl_tensor.data, m8->dl_tensor.data);
        again->deleter(again);
        check_export(m8, t8, device, 10, 8, FP8AMP_MAX_NDIM, shape8);
    }
    ms->deleter(ms); /* deleter before destroy works too */
    m8->deleter(m8);
    EXPECT_OK(fp8amp_tensor_destroy(s));
    EXPECT_OK(fp8amp_tensor_destroy(t8));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* With allocator hooks (alloc_counter, test_util.h), the export provably holds the memory: the free
 * hook runs at the deleter. */

static void test_export_keeps_memory_until_deleter(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    alloc_counter counter = {0, 0};
    const int64_t shape[2] = {16, 16};
    fp8amp_tensor t;
    struct DLManagedTensorVersioned *m1 = NULL, *m2 = NULL;
    void *values;

    EXPECT_OK(fp8amp_context_set_allocator(ctx, counter_alloc, counter_free, &counter));
    t = make_tensor(ctx, FP8AMP_DTYPE_F16, 2, shape);
    values = write_random(t);
    EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m1));
    EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m2));
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(counter.frees, 0);
    assert_memory_equal(m1->dl_tensor.data, values, 512);
    m1->deleter(m1);
    assert_int_equal(counter.frees, 0); /* m2 still holds it */
    assert_memory_equal(m2->dl_tensor.data, values, 512);
    m2->deleter(m2);
    assert_int_equal(counter.allocs, 1);
    assert_int_equal(counter.frees, 1);
    free(values);
}

static void test_export_bad_arguments(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    const int64_t shape[1] = {10};
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, shape);
    fp8amp_tensor dead = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, shape);
    void *values = write_random(t);
    struct DLManagedTensorVersioned *m = SENTINEL_MANAGED;

    EXPECT_STATUS(fp8amp_tensor_to_dlpack(t, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_destroy(dead));
    EXPECT_STATUS(fp8amp_tensor_to_dlpack(dead, &m), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(m, SENTINEL_MANAGED);
    EXPECT_STATUS(fp8amp_tensor_to_dlpack(NULL, &m), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(m, SENTINEL_MANAGED);
    EXPECT_STATUS(fp8amp_tensor_to_dlpack((fp8amp_tensor)(void *)ctx, &m), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(m, SENTINEL_MANAGED);
    EXPECT_STATUS(fp8amp_tensor_to_dlpack((fp8amp_tensor)(uintptr_t)0x1234, &m), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(m, SENTINEL_MANAGED);
    expect_bytes(t, values, 20);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    free(values);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- import ---------------------------------------------------------------------------------- */

static void test_import_zero_copy(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    size_t k;
    for (k = 0; k < N_DTYPES; ++k) {
        const int64_t shape[2] = {4, 5};
        const size_t nbytes = 20 * (DTYPE_CODES[k].bits / 8);
        producer p;
        fp8amp_tensor t;
        fp8amp_dtype dtype;
        int32_t ndim = 0;
        int64_t got_shape[2] = {0, 0};
        fp8amp_device d;
        void *fresh;

        producer_init(&p, DTYPE_CODES[k].code, DTYPE_CODES[k].bits, 2, shape, 0);
        t = import_ok(ctx, &p);
        assert_ptr_equal(tensor_data(t), p.buffer);
        EXPECT_OK(fp8amp_tensor_dtype(t, &dtype));
        assert_int_equal(dtype, DTYPE_CODES[k].dtype);
        EXPECT_OK(fp8amp_tensor_ndim(t, &ndim));
        assert_int_equal(ndim, 2);
        EXPECT_OK(fp8amp_tensor_shape(t, 2, got_shape));
        assert_memory_equal(got_shape, shape, sizeof shape);
        EXPECT_OK(fp8amp_tensor_device(t, &d));
        assert_int_equal(d.type, FP8AMP_DEVICE_CPU);
        assert_int_equal(d.index, 0);
        assert_int_equal(tensor_bytes(t), nbytes);
        expect_bytes(t, p.buffer, nbytes);

        /* Shared memory both ways. */
        dl_fill_random(p.buffer, nbytes);
        expect_bytes(t, p.buffer, nbytes);
        fresh = xmalloc(nbytes);
        dl_fill_random(fresh, nbytes);
        EXPECT_OK(fp8amp_tensor_copy_from_host(t, fresh, nbytes));
        assert_memory_equal(p.buffer, fresh, nbytes);

        /* The deleter runs exactly once, with the managed tensor, when the tensor goes. */
        assert_int_equal(p.deleter_calls, 0);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        assert_int_equal(p.deleter_calls, 1);
        assert_ptr_equal(p.deleted_with, &p.managed);
        EXPECT_STATUS(fp8amp_tensor_destroy(t), FP8AMP_ERROR_INVALID_HANDLE);
        assert_int_equal(p.deleter_calls, 1);
        free(fresh);
        producer_free(&p);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_import_byte_offset_and_strides(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[3] = {3, 4, 5};
    producer p;
    fp8amp_tensor t;

    /* byte_offset: the data starts that many bytes in. */
    producer_init(&p, 2, 32, 3, shape, 64);
    t = import_ok(ctx, &p);
    assert_ptr_equal(tensor_data(t), (uint8_t *)p.buffer + 64);
    expect_bytes(t, (uint8_t *)p.buffer + 64, 240);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    /* A small offset that keeps the element alignment (F16 at +2). */
    producer_init(&p, 2, 16, 3, shape, 2);
    t = import_ok(ctx, &p);
    assert_ptr_equal(tensor_data(t), (uint8_t *)p.buffer + 2);
    expect_bytes(t, (uint8_t *)p.buffer + 2, 120);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    /* Explicit compact strides are as good as NULL. */
    producer_init(&p, 4, 16, 3, shape, 0);
    producer_set_compact_strides(&p);
    assert_int_equal(p.strides[0], 20);
    assert_int_equal(p.strides[1], 5);
    assert_int_equal(p.strides[2], 1);
    t = import_ok(ctx, &p);
    expect_bytes(t, p.buffer, 120);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    /* Extents of 1 may carry any stride (PyTorch exports such): the memory is still compact. */
    {
        const int64_t shape1[3] = {4, 1, 6};
        producer_init(&p, 2, 32, 3, shape1, 0);
        p.strides[0] = 6;
        p.strides[1] = 1; /* 6 if computed, but a dimension of extent 1 is never stepped through */
        p.strides[2] = 1;
        p.managed.dl_tensor.strides = p.strides;
        t = import_ok(ctx, &p);
        expect_bytes(t, p.buffer, 96);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        assert_int_equal(p.deleter_calls, 1);
        producer_free(&p);
    }

    /* A scalar (ndim 0, no shape). */
    producer_init(&p, 12, 8, 0, NULL, 0);
    p.managed.dl_tensor.shape = NULL;
    t = import_ok(ctx, &p);
    assert_int_equal(tensor_bytes(t), 1);
    expect_bytes(t, p.buffer, 1);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_import_versions_and_devices_accepted(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[1] = {7};
    static const uint32_t minors[] = {0, 1, 2, 9};
    producer p;
    fp8amp_tensor t;
    size_t i;

    /* Any 1.x is read. */
    for (i = 0; i < sizeof minors / sizeof minors[0]; ++i) {
        producer_init(&p, 2, 32, 1, shape, 0);
        p.managed.version.minor = minors[i];
        t = import_ok(ctx, &p);
        expect_bytes(t, p.buffer, 28);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        assert_int_equal(p.deleter_calls, 1);
        producer_free(&p);
    }
    /* Pinned host memory (kDLCUDAHost) is host memory for a CPU context. */
    producer_init(&p, 2, 32, 1, shape, 0);
    p.managed.dl_tensor.device.device_type = kDLCUDAHost;
    t = import_ok(ctx, &p);
    expect_bytes(t, p.buffer, 28);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    /* A producer without a deleter (allowed by the specification). */
    producer_init(&p, 2, 32, 1, shape, 0);
    p.managed.deleter = NULL;
    t = import_ok(ctx, &p);
    expect_bytes(t, p.buffer, 28);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 0);
    producer_free(&p);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_import_refused(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[2] = {4, 6};
    producer p;

    /* Non-compact strides: column-major, padded rows, zero (broadcast) strides, reversed. */
    {
        static const int64_t bad_strides[][2] = {{1, 4}, {8, 1}, {0, 1}, {6, 0}, {6, 2}, {-6, 1}};
        size_t i;
        for (i = 0; i < sizeof bad_strides / sizeof bad_strides[0]; ++i) {
            producer_init(&p, 2, 32, 2, shape, 0);
            p.strides[0] = bad_strides[i][0];
            p.strides[1] = bad_strides[i][1];
            p.managed.dl_tensor.strides = p.strides;
            expect_import_fails(ctx, &p, FP8AMP_ERROR_NOT_SUPPORTED);
            producer_free(&p);
        }
    }
    /* Major versions other than 1. */
    {
        static const uint32_t majors[] = {0, 2, 3, 0xffffffffu};
        size_t i;
        for (i = 0; i < sizeof majors / sizeof majors[0]; ++i) {
            producer_init(&p, 2, 32, 2, shape, 0);
            p.managed.version.major = majors[i];
            expect_import_fails(ctx, &p, FP8AMP_ERROR_NOT_SUPPORTED);
            producer_free(&p);
        }
    }
    /* dtypes fp8amp does not have. */
    {
        static const struct {
            uint8_t code, bits;
            uint16_t lanes;
        } bad_types[] = {
            {0, 32, 1},  /* int32 */
            {1, 8, 1},   /* uint8 */
            {2, 64, 1},  /* float64 */
            {2, 32, 2},  /* float32 x2 */
            {2, 16, 4},  /* float16 x4 */
            {4, 32, 1},  /* bfloat of 32 bits */
            {10, 16, 1}, /* e4m3 code with the wrong width */
            {8, 8, 1},   /* float8_e4m3 (IEEE-like, with infinities) */
            {11, 8, 1},  /* float8_e4m3fnuz */
            {13, 8, 1},  /* float8_e5m2fnuz */
            {5, 64, 1},  /* complex */
        };
        size_t i;
        for (i = 0; i < sizeof bad_types / sizeof bad_types[0]; ++i) {
            producer_init(&p, bad_types[i].code, bad_types[i].bits, 2, shape, 0);
            p.managed.dl_tensor.dtype.lanes = bad_types[i].lanes;
            expect_import_fails(ctx, &p, FP8AMP_ERROR_NOT_SUPPORTED);
            producer_free(&p);
        }
    }
    /* More dimensions than fp8amp has (FP8AMP_MAX_NDIM): a valid DLPack tensor fp8amp cannot hold. */
    {
        static const int64_t nine[FP8AMP_MAX_NDIM + 1] = {1, 2, 1, 2, 1, 2, 1, 2, 1};
        producer_init(&p, 2, 32, FP8AMP_MAX_NDIM + 1, nine, 0);
        expect_import_fails(ctx, &p, FP8AMP_ERROR_NOT_SUPPORTED);
        producer_free(&p);
    }
    /* A GPU tensor into a CPU context. */
    producer_init(&p, 2, 32, 2, shape, 0);
    p.managed.dl_tensor.device.device_type = kDLCUDA;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_DEVICE_MISMATCH);
    p.managed.dl_tensor.device.device_type = kDLCUDAManaged;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_DEVICE_MISMATCH);
    producer_free(&p);

    /* Empty or malformed tensors. */
    {
        static const int64_t bad_shapes[][2] = {{0, 6}, {4, 0}, {-1, 6}, {4, -6}};
        size_t i;
        for (i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; ++i) {
            producer_init(&p, 2, 32, 2, shape, 0);
            p.shape[0] = bad_shapes[i][0];
            p.shape[1] = bad_shapes[i][1];
            expect_import_fails(ctx, &p, FP8AMP_ERROR_INVALID_ARGUMENT);
            producer_free(&p);
        }
    }
    producer_init(&p, 2, 32, 2, shape, 0);
    p.managed.dl_tensor.shape = NULL;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_INVALID_ARGUMENT);
    producer_free(&p);
    producer_init(&p, 2, 32, 2, shape, 0);
    p.managed.dl_tensor.ndim = -1;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_INVALID_ARGUMENT);
    producer_free(&p);
    producer_init(&p, 2, 32, 2, shape, 0);
    p.managed.dl_tensor.data = NULL;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_INVALID_ARGUMENT);
    producer_free(&p);
    producer_init(&p, 2, 32, 2, shape, 2); /* float32 at a 2-byte offset: misaligned */
    expect_import_fails(ctx, &p, FP8AMP_ERROR_INVALID_ARGUMENT);
    producer_free(&p);

    /* NULL managed, NULL out, bad contexts. */
    {
        fp8amp_tensor out = SENTINEL_TENSOR;
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, NULL, &out), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_ptr_equal(out, SENTINEL_TENSOR);
        producer_init(&p, 2, 32, 2, shape, 0);
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, &p.managed, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_int_equal(p.deleter_calls, 0);
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(NULL, &p.managed, &out), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(out, SENTINEL_TENSOR);
        EXPECT_STATUS(fp8amp_tensor_from_dlpack((fp8amp_context)(uintptr_t)0x1234, &p.managed, &out),
                      FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(out, SENTINEL_TENSOR);
        assert_int_equal(p.deleter_calls, 0);

        /* Ownership stayed with the caller through all of that: a later import still works, once. */
        out = import_ok(ctx, &p);
        expect_bytes(out, p.buffer, 96);
        EXPECT_OK(fp8amp_tensor_destroy(out));
        assert_int_equal(p.deleter_calls, 1);
        producer_free(&p);
    }

    /* After a strides refusal, the same producer, fixed, imports fine. */
    producer_init(&p, 10, 8, 2, shape, 0);
    p.strides[0] = 1;
    p.strides[1] = 4;
    p.managed.dl_tensor.strides = p.strides;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_NOT_SUPPORTED);
    producer_set_compact_strides(&p);
    {
        fp8amp_tensor t = import_ok(ctx, &p);
        expect_bytes(t, p.buffer, 24);
        EXPECT_OK(fp8amp_tensor_destroy(t));
    }
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);

    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_import_read_only(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[2] = {3, 8};
    producer p;
    fp8amp_tensor t, dst;
    void *before, *src, *out;

    producer_init(&p, 2, 32, 2, shape, 0);
    p.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    t = import_ok(ctx, &p);
    before = xmemdup(p.buffer, 96);
    src = xmalloc(96);
    dl_fill_random(src, 96);

    /* Not a destination. */
    EXPECT_STATUS(fp8amp_tensor_copy_from_host(t, src, 96), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_memory_equal(p.buffer, before, 96);
    {
        fp8amp_tensor other = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
        EXPECT_OK(fp8amp_tensor_copy_from_host(other, src, 96));
        EXPECT_STATUS(fp8amp_cast(ctx, other, t), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_memory_equal(p.buffer, before, 96);
        EXPECT_OK(fp8amp_tensor_destroy(other));
    }
    /* Still a source. */
    expect_bytes(t, before, 96);
    dst = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    EXPECT_OK(fp8amp_cast(ctx, t, dst));
    expect_bytes(dst, before, 96);
    EXPECT_OK(fp8amp_tensor_destroy(dst));

    /* Re-exported, it stays read-only. */
    {
        struct DLManagedTensorVersioned *m = NULL;
        EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m));
        assert_int_equal(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_READ_ONLY);
        assert_ptr_equal(m->dl_tensor.data, p.buffer);
        m->deleter(m);
    }
    assert_int_equal(p.deleter_calls, 0);
    out = xmalloc(96);
    memset(out, POISON, 96);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, out, 96));
    assert_memory_equal(out, before, 96);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 1);
    assert_memory_equal(p.buffer, before, 96);
    free(out);
    free(src);
    free(before);
    producer_free(&p);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* An imported tensor re-exported: the producer's deleter waits for both the fp8amp tensor and the
 * consumer of the export, and runs once. */
static void test_import_then_export(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int64_t shape[2] = {5, 5};
    producer p;
    fp8amp_tensor t;
    struct DLManagedTensorVersioned *m = NULL;

    producer_init(&p, 10, 8, 2, shape, 0);
    t = import_ok(ctx, &p);
    EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m));
    assert_ptr_equal(m->dl_tensor.data, p.buffer);
    assert_int_equal(m->dl_tensor.dtype.code, 10);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(p.deleter_calls, 0);
    m->deleter(m);
    assert_int_equal(p.deleter_calls, 1);
    producer_free(&p);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* export -> import: zero copy both ways, fp8amp consumes its own export. */
static void test_round_trip(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    size_t k;
    for (k = 0; k < N_DTYPES; ++k) {
        const int64_t shape[3] = {3, 1, 9};
        fp8amp_tensor t = make_tensor(ctx, DTYPE_CODES[k].dtype, 3, shape), back = NULL;
        const size_t nbytes = tensor_bytes(t);
        void *values = write_random(t), *more;
        struct DLManagedTensorVersioned *m = NULL;
        fp8amp_dtype dtype;
        int64_t got_shape[3];
        fp8amp_device d;

        EXPECT_OK(fp8amp_tensor_to_dlpack(t, &m));
        EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &back));
        assert_ptr_equal(tensor_data(back), tensor_data(t));
        EXPECT_OK(fp8amp_tensor_dtype(back, &dtype));
        assert_int_equal(dtype, DTYPE_CODES[k].dtype);
        EXPECT_OK(fp8amp_tensor_shape(back, 3, got_shape));
        assert_memory_equal(got_shape, shape, sizeof shape);
        EXPECT_OK(fp8amp_tensor_device(back, &d));
        assert_int_equal(d.type, device.type);
        assert_int_equal(d.index, device.index);
        expect_bytes(back, values, nbytes);

        /* Writes through one are seen through the other; the original can go first. */
        more = write_random(back);
        expect_bytes(t, more, nbytes);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        expect_bytes(back, more, nbytes);
        EXPECT_OK(fp8amp_tensor_destroy(back)); /* runs the export's deleter: nothing leaks */
        free(values);
        free(more);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* CUDA: device checks of an import into a CUDA context. */
static void test_import_cuda_devices(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_context cpu = make_context(cpu_device());
    const int64_t shape[2] = {4, 4};
    producer p;
    fp8amp_tensor gpu = make_tensor(ctx, FP8AMP_DTYPE_F32, 2, shape);
    void *values = write_random(gpu);
    struct DLManagedTensorVersioned *m = NULL;

    /* Host memory into a CUDA context. */
    producer_init(&p, 2, 32, 2, shape, 0);
    expect_import_fails(ctx, &p, FP8AMP_ERROR_DEVICE_MISMATCH);
    /* Another ordinal's memory. */
    p.managed.dl_tensor.device.device_type = kDLCUDA;
    p.managed.dl_tensor.device.device_id = device.index + 1;
    expect_import_fails(ctx, &p, FP8AMP_ERROR_DEVICE_MISMATCH);
    producer_free(&p);

    /* A CUDA export into a CPU context. */
    EXPECT_OK(fp8amp_tensor_to_dlpack(gpu, &m));
    {
        struct DLManagedTensorVersioned copy = *m;
        fp8amp_tensor out = SENTINEL_TENSOR;
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(cpu, m, &out), FP8AMP_ERROR_DEVICE_MISMATCH);
        assert_ptr_equal(out, SENTINEL_TENSOR);
        assert_memory_equal(&copy, m, sizeof copy);
    }
    /* ...and into its own context, where it belongs. */
    {
        fp8amp_tensor back = NULL;
        EXPECT_OK(fp8amp_tensor_from_dlpack(ctx, m, &back));
        EXPECT_OK(fp8amp_tensor_destroy(gpu));
        expect_bytes(back, values, 64);
        EXPECT_OK(fp8amp_tensor_destroy(back));
    }
    free(values);
    EXPECT_OK(fp8amp_context_destroy(cpu));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_export),
        DEVICE_TESTS(test_export_scalar_and_max_ndim),
        cmocka_unit_test(test_export_keeps_memory_until_deleter),
        DEVICE_TESTS(test_export_bad_arguments),
        cmocka_unit_test(test_import_zero_copy),
        cmocka_unit_test(test_import_byte_offset_and_strides),
        cmocka_unit_test(test_import_versions_and_devices_accepted),
        cmocka_unit_test(test_import_refused),
        cmocka_unit_test(test_import_read_only),
        cmocka_unit_test(test_import_then_export),
        DEVICE_TESTS(test_round_trip),
        cmocka_unit_test_prestate(test_import_cuda_devices, (void *)&VARIANT_CUDA),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
