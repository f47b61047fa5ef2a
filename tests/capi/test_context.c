/* Contexts: creation and destruction, handle checking, streams, allocator hooks, synchronization,
 * and the lifetime of tensors that outlive their context. */
#define _POSIX_C_SOURCE 200809L

#include "test_util.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* A value no library call should ever write: a failing call must leave outputs holding it. */
#define SENTINEL_CTX ((fp8amp_context)(uintptr_t)0x5e5e5e5e)

/* Random floats, never 0: magnitudes in [1, 1000), random sign. */
static void ctx_fill_random(float *v, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        const double x = test_rng_uniform(1.0, 1000.0);
        v[i] = (float)(test_rng_uniform(0.0, 1.0) < 0.5 ? -x : x);
    }
}

static fp8amp_tensor make_f32(fp8amp_context ctx, int64_t rows, int64_t cols) {
    const int64_t shape[2] = {rows, cols};
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t));
    assert_non_null(t);
    return t;
}

/* Fills t (F32, n elements) with fresh random values, also returned in `values`. */
static void write_random(fp8amp_tensor t, float *values, size_t n) {
    ctx_fill_random(values, n);
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, values, n * sizeof(float)));
}

/* Asserts that t (F32, n elements) holds exactly `expect`. */
static void assert_contents(fp8amp_tensor t, const float *expect, size_t n) {
    float *got = (float *)malloc(n * sizeof(float));
    assert_non_null(got);
    memset(got, 0xA5, n * sizeof(float));
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, got, n * sizeof(float)));
    assert_memory_equal(got, expect, n * sizeof(float));
    free(got);
}


/* ---- counting allocator ---------------------------------------------------------------------- */

#define MAX_BLOCKS 16

typedef struct {
    int allocs;        /* calls of the alloc hook (including refused ones) */
    int frees;         /* calls of the free hook */
    int refuse;        /* when set, the alloc hook returns NULL */
    int bad_frees;     /* frees of a pointer this allocator does not own, or with the wrong size */
    int bad_args;      /* alloc/free called with a device or stream other than the expected ones */
    size_t bytes_live; /* bytes handed out and not yet freed */
    void *last_alloc;
    size_t last_alloc_nbytes;
    void *last_free;
    size_t last_free_nbytes;
    fp8amp_device expect_device;
    void *expect_stream;
    void *blocks[MAX_BLOCKS];
    size_t sizes[MAX_BLOCKS];
} counting_alloc;

static void counting_init(counting_alloc *a) {
    memset(a, 0, sizeof *a);
    a->expect_device = cpu_device();
    a->expect_stream = NULL;
}

static void *counting_alloc_fn(void *user_data, size_t nbytes, fp8amp_device device, void *stream) {
    counting_alloc *a = (counting_alloc *)user_data;
    void *p = NULL;
    int i;
    a->allocs++;
    if (device.type != a->expect_device.type || device.index != a->expect_device.index ||
        stream != a->expect_stream)
        a->bad_args++;
    if (a->refuse) return NULL;
    if (posix_memalign(&p, 256, nbytes ? nbytes : 1) != 0) return NULL;
    for (i = 0; i < MAX_BLOCKS; ++i) {
        if (!a->blocks[i]) {
            a->blocks[i] = p;
            a->sizes[i] = nbytes;
            break;
        }
    }
    if (i == MAX_BLOCKS) { /* the tests never hold this many */
        free(p);
        return NULL;
    }
    a->bytes_live += nbytes;
    a->last_alloc = p;
    a->last_alloc_nbytes = nbytes;
    return p;
}

static void counting_free_fn(void *user_data, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    counting_alloc *a = (counting_alloc *)user_data;
    int i;
    a->frees++;
    a->last_free = ptr;
    a->last_free_nbytes = nbytes;
    if (device.type != a->expect_device.type || device.index != a->expect_device.index ||
        stream != a->expect_stream)
        a->bad_args++;
    for (i = 0; i < MAX_BLOCKS; ++i) {
        if (a->blocks[i] == ptr && ptr) {
            if (a->sizes[i] != nbytes) a->bad_frees++;
            a->bytes_live -= a->sizes[i];
            a->blocks[i] = NULL;
            free(ptr);
            return;
        }
    }
    a->bad_frees++; /* not ours: leak it rather than crash */
}

/* ---- creation -------------------------------------------------------------------------------- */

static void test_create_destroy(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_device got = {(fp8amp_device_type)0, -5};
    void *stream = (void *)&got;

    EXPECT_OK(fp8amp_context_device(ctx, &got));
    assert_device_equal(got, device);
    EXPECT_OK(fp8amp_context_get_stream(ctx, &stream));
    assert_null(stream); /* starts on the default stream */
    EXPECT_OK(fp8amp_context_synchronize(ctx));

    {
        /* A second context is a different, independent handle. */
        fp8amp_context other = make_context(device);
        assert_ptr_not_equal(other, ctx);
        EXPECT_OK(fp8amp_context_destroy(other));
        EXPECT_STATUS(fp8amp_context_device(other, &got), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_OK(fp8amp_context_device(ctx, &got));
        assert_device_equal(got, device);
    }

    EXPECT_OK(fp8amp_context_destroy(ctx));
    got.type = (fp8amp_device_type)77;
    got.index = 77;
    EXPECT_STATUS(fp8amp_context_device(ctx, &got), FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(got.type, 77);
    assert_int_equal(got.index, 77);
    EXPECT_STATUS(fp8amp_context_destroy(ctx), FP8AMP_ERROR_INVALID_HANDLE);
}

static void test_create_null_out(void **state) {
    (void)state;
    EXPECT_STATUS(fp8amp_context_create(cpu_device(), NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_context_create(cuda_device(0), NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
}

/* Without a GPU, a CUDA context is NOT_SUPPORTED (with the reason); with one, an ordinal past the
 * last GPU is DEVICE_MISMATCH. One of the two branches always runs and can fail. */
static void test_cuda_unavailable_or_out_of_range(void **state) {
    (void)state;
    fp8amp_context ctx = SENTINEL_CTX;
    int32_t n = -1;
    EXPECT_OK(fp8amp_device_count(FP8AMP_DEVICE_CUDA, &n));
    if (!have_cuda()) {
        assert_int_equal(n, 0);
        EXPECT_STATUS(fp8amp_context_create(cuda_device(0), &ctx), FP8AMP_ERROR_NOT_SUPPORTED);
        assert_ptr_equal(ctx, SENTINEL_CTX);
        print_message("no GPU: %s\n", fp8amp_last_error_message());
        EXPECT_STATUS(fp8amp_context_create(cuda_device(3), &ctx), FP8AMP_ERROR_NOT_SUPPORTED);
        assert_ptr_equal(ctx, SENTINEL_CTX);
    } else {
        assert_true(n > 0);
        EXPECT_STATUS(fp8amp_context_create(cuda_device(n), &ctx), FP8AMP_ERROR_DEVICE_MISMATCH);
        assert_ptr_equal(ctx, SENTINEL_CTX);
        EXPECT_STATUS(fp8amp_context_create(cuda_device(n + 100), &ctx), FP8AMP_ERROR_DEVICE_MISMATCH);
        assert_ptr_equal(ctx, SENTINEL_CTX);
        /* The last valid ordinal works. */
        ctx = NULL;
        EXPECT_OK(fp8amp_context_create(cuda_device(n - 1), &ctx));
        EXPECT_OK(fp8amp_context_destroy(ctx));
    }
    /* The CPU is unaffected either way. */
    ctx = make_context(cpu_device());
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_create_bad_device(void **state) {
    (void)state;
    static const struct {
        int type;
        int32_t index;
    } bad[] = {
        {0, 0}, {3, 0}, {13, 0}, {-1, 0}, {99, 0},        /* unknown device types */
        {FP8AMP_DEVICE_CUDA, -1}, {FP8AMP_DEVICE_CUDA, INT32_MIN}, /* negative CUDA ordinal */
        {FP8AMP_DEVICE_CPU, 1}, {FP8AMP_DEVICE_CPU, -1}, {FP8AMP_DEVICE_CPU, 7},
    };
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        fp8amp_device d;
        fp8amp_context ctx = SENTINEL_CTX;
        d.type = (fp8amp_device_type)bad[i].type;
        d.index = bad[i].index;
        EXPECT_STATUS(fp8amp_context_create(d, &ctx), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_ptr_equal(ctx, SENTINEL_CTX);
    }
}

/* ---- handle checking ------------------------------------------------------------------------- */

static void test_destroy_null_and_twice(void **state) {
    (void)state;
    EXPECT_OK(fp8amp_context_destroy(NULL));
    fp8amp_context ctx = make_context(cpu_device());
    fp8amp_context keep = make_context(cpu_device());
    EXPECT_OK(fp8amp_context_destroy(ctx));
    EXPECT_STATUS(fp8amp_context_destroy(ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_destroy(ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_synchronize(ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_set_stream(ctx, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    {
        void *s = (void *)&keep;
        EXPECT_STATUS(fp8amp_context_get_stream(ctx, &s), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(s, (void *)&keep);
    }
    {
        counting_alloc a;
        counting_init(&a);
        EXPECT_STATUS(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a),
                      FP8AMP_ERROR_INVALID_HANDLE);
    }
    {
        fp8amp_tensor t = SENTINEL_TENSOR;
        const int64_t shape[1] = {4};
        EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &t), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(t, SENTINEL_TENSOR);
    }
    /* The failed double destroy did not disturb the other context. */
    {
        fp8amp_device d;
        EXPECT_OK(fp8amp_context_device(keep, &d));
        assert_device_equal(d, cpu_device());
    }
    EXPECT_OK(fp8amp_context_destroy(keep));
}

static void test_tensor_handle_as_context(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_tensor t = make_f32(ctx, 3, 4);
    float values[12];
    fp8amp_context as_ctx = (fp8amp_context)(void *)t;
    fp8amp_device d = {(fp8amp_device_type)55, 55};
    void *s = (void *)values;

    write_random(t, values, 12);
    EXPECT_STATUS(fp8amp_context_destroy(as_ctx), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_device(as_ctx, &d), FP8AMP_ERROR_INVALID_HANDLE);
    assert_int_equal(d.type, 55);
    assert_int_equal(d.index, 55);
    EXPECT_STATUS(fp8amp_context_get_stream(as_ctx, &s), FP8AMP_ERROR_INVALID_HANDLE);
    assert_ptr_equal(s, (void *)values);
    EXPECT_STATUS(fp8amp_context_set_stream(as_ctx, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_context_synchronize(as_ctx), FP8AMP_ERROR_INVALID_HANDLE);
    {
        fp8amp_tensor t2 = SENTINEL_TENSOR;
        const int64_t shape[1] = {2};
        EXPECT_STATUS(fp8amp_tensor_create(as_ctx, FP8AMP_DTYPE_F32, 1, shape, &t2), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(t2, SENTINEL_TENSOR);
    }
    /* The tensor survived every one of those calls, contents intact. */
    assert_contents(t, values, 12);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_garbage_handles(void **state) {
    (void)state;
    int on_stack = 0;
    void *on_heap = malloc(64);
    const fp8amp_context garbage[] = {
        (fp8amp_context)(uintptr_t)0x1234,
        (fp8amp_context)(uintptr_t)0x1,
        (fp8amp_context)(uintptr_t)UINTPTR_MAX,
        (fp8amp_context)(uintptr_t)0xdeadbeefcafef00dull,
        (fp8amp_context)(void *)&on_stack,
        (fp8amp_context)on_heap,
    };
    fp8amp_context live = make_context(cpu_device());
    size_t i;
    assert_non_null(on_heap);
    for (i = 0; i < sizeof garbage / sizeof garbage[0]; ++i) {
        fp8amp_device d = {(fp8amp_device_type)9, 9};
        void *s = (void *)&on_stack;
        fp8amp_tensor t = SENTINEL_TENSOR;
        const int64_t shape[1] = {8};
        EXPECT_STATUS(fp8amp_context_destroy(garbage[i]), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_STATUS(fp8amp_context_device(garbage[i], &d), FP8AMP_ERROR_INVALID_HANDLE);
        assert_int_equal(d.type, 9);
        EXPECT_STATUS(fp8amp_context_get_stream(garbage[i], &s), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(s, (void *)&on_stack);
        EXPECT_STATUS(fp8amp_context_set_stream(garbage[i], NULL), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_STATUS(fp8amp_context_synchronize(garbage[i]), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_STATUS(fp8amp_context_set_allocator(garbage[i], NULL, NULL, NULL), FP8AMP_ERROR_INVALID_HANDLE);
        EXPECT_STATUS(fp8amp_tensor_create(garbage[i], FP8AMP_DTYPE_F32, 1, shape, &t), FP8AMP_ERROR_INVALID_HANDLE);
        assert_ptr_equal(t, SENTINEL_TENSOR);
    }
    /* The memory behind pointer-valued garbage was not touched, and real handles still work. */
    assert_int_equal(on_stack, 0);
    {
        fp8amp_device d;
        EXPECT_OK(fp8amp_context_device(live, &d));
        assert_device_equal(d, cpu_device());
    }
    EXPECT_OK(fp8amp_context_destroy(live));
    free(on_heap);
}

static void test_device_null_out(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_device d;
    EXPECT_STATUS(fp8amp_context_device(ctx, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_context_get_stream(ctx, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_context_device(ctx, &d));
    assert_device_equal(d, variant_device(state));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- streams --------------------------------------------------------------------------------- */

static void test_stream(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    void *s = (void *)&s;

    EXPECT_OK(fp8amp_context_set_stream(ctx, NULL));
    EXPECT_OK(fp8amp_context_get_stream(ctx, &s));
    assert_null(s);

    if (device.type == FP8AMP_DEVICE_CPU) {
        /* A CPU context has no CUDA stream: refused, and the stream stays what it was. */
        EXPECT_STATUS(fp8amp_context_set_stream(ctx, (void *)(uintptr_t)0x2), FP8AMP_ERROR_INVALID_ARGUMENT);
        s = (void *)&s;
        EXPECT_OK(fp8amp_context_get_stream(ctx, &s));
        assert_null(s);
        EXPECT_STATUS(fp8amp_context_set_stream(ctx, (void *)&ctx), FP8AMP_ERROR_INVALID_ARGUMENT);
        s = (void *)&s;
        EXPECT_OK(fp8amp_context_get_stream(ctx, &s));
        assert_null(s);
    } else {
        /* cudaStreamPerThread is the special handle 0x2: a real stream without linking CUDA here. */
        void *const per_thread = (void *)(uintptr_t)0x2;
        fp8amp_tensor t;
        float values[64];
        EXPECT_OK(fp8amp_context_set_stream(ctx, per_thread));
        EXPECT_OK(fp8amp_context_get_stream(ctx, &s));
        assert_ptr_equal(s, per_thread);
        t = make_f32(ctx, 8, 8);
        write_random(t, values, 64);
        EXPECT_OK(fp8amp_context_synchronize(ctx));
        assert_contents(t, values, 64);
        EXPECT_OK(fp8amp_tensor_destroy(t));
        EXPECT_OK(fp8amp_context_set_stream(ctx, NULL));
        EXPECT_OK(fp8amp_context_get_stream(ctx, &s));
        assert_null(s);
    }
    EXPECT_OK(fp8amp_context_synchronize(ctx));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- allocator hooks (CPU: the hooks here can only serve host memory) ------------------------- */

static void test_allocator_hooks_serve_tensors(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a;
    fp8amp_tensor t;
    void *data = NULL;
    float values[15];
    counting_init(&a);

    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    assert_int_equal(a.allocs, 0); /* setting the hooks allocates nothing */

    t = make_f32(ctx, 3, 5);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(a.frees, 0);
    assert_int_equal(a.last_alloc_nbytes, 15 * sizeof(float));
    assert_int_equal(a.bytes_live, 15 * sizeof(float));
    EXPECT_OK(fp8amp_tensor_data(t, &data));
    assert_ptr_equal(data, a.last_alloc); /* the tensor lives in the hook's memory */

    write_random(t, values, 15);
    assert_memory_equal(a.last_alloc, values, sizeof values);
    assert_contents(t, values, 15);
    assert_int_equal(a.allocs, 1); /* host copies allocate nothing */

    {
        /* Wrapping user memory does not go through the allocator. */
        float user[6];
        const int64_t shape[1] = {6};
        fp8amp_tensor w = NULL;
        EXPECT_OK(fp8amp_tensor_wrap(ctx, FP8AMP_DTYPE_F32, 1, shape, user, &w));
        EXPECT_OK(fp8amp_tensor_destroy(w));
        assert_int_equal(a.allocs, 1);
        assert_int_equal(a.frees, 0);
    }

    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(a.frees, 1);
    assert_ptr_equal(a.last_free, data);
    assert_int_equal(a.last_free_nbytes, 15 * sizeof(float));
    assert_int_equal(a.bytes_live, 0);
    assert_int_equal(a.bad_frees, 0);
    assert_int_equal(a.bad_args, 0);

    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(a.allocs, 1);
    assert_int_equal(a.frees, 1);
}

static void test_allocator_refusal_is_out_of_memory(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a;
    fp8amp_tensor t = SENTINEL_TENSOR;
    const int64_t shape[2] = {4, 4};
    counting_init(&a);
    a.refuse = 1;

    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t), FP8AMP_ERROR_OUT_OF_MEMORY);
    assert_ptr_equal(t, SENTINEL_TENSOR);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(a.frees, 0); /* nothing to free: NULL is never passed back */

    /* Once the hook serves again, creation works on the same context. */
    a.refuse = 0;
    t = NULL;
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t));
    assert_int_equal(a.allocs, 2);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(a.frees, 1);
    assert_int_equal(a.bytes_live, 0);
    assert_int_equal(a.bad_frees, 0);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* A size past PTRDIFF_MAX (a 1-D F16 tensor of INT64_MAX elements: 2^64 - 2 bytes, which fits size_t)
 * is no object any allocator can give: it fails OUT_OF_MEMORY before the hook sees it, so a hook that
 * rounds sizes up cannot wrap it to a small block. */
static void test_allocator_never_sees_sizes_past_ptrdiff_max(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a;
    static const fp8amp_dtype dtypes[] = {FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3};
    const int64_t shape[1] = {INT64_MAX};
    size_t i;
    counting_init(&a);
    a.refuse = 1; /* the E4M3 request reaches the hook; a sanitizer's malloc would abort on it */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    for (i = 0; i < sizeof dtypes / sizeof dtypes[0]; ++i) {
        fp8amp_tensor t = SENTINEL_TENSOR;
        EXPECT_STATUS(fp8amp_tensor_create(ctx, dtypes[i], 1, shape, &t), FP8AMP_ERROR_OUT_OF_MEMORY);
        assert_ptr_equal(t, SENTINEL_TENSOR);
        /* INT64_MAX bytes is PTRDIFF_MAX itself: that one is the hook's to refuse */
        assert_non_null(strstr(fp8amp_last_error_message(),
                               dtypes[i] == FP8AMP_DTYPE_E4M3 ? "hook returned NULL" : "PTRDIFF_MAX"));
    }
    assert_int_equal(a.allocs, 1); /* only the E4M3 request (exactly PTRDIFF_MAX bytes) reached the hook */
    assert_int_equal(a.frees, 0);
    /* The built-in allocator refuses them the same way. */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, NULL, NULL, NULL));
    {
        fp8amp_tensor t = SENTINEL_TENSOR;
        EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F16, 1, shape, &t), FP8AMP_ERROR_OUT_OF_MEMORY);
        assert_ptr_equal(t, SENTINEL_TENSOR);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_allocator_one_null_hook(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a, b;
    fp8amp_tensor t;
    counting_init(&a);
    counting_init(&b);

    /* With the built-in allocator in force: refused, and the built-in one stays. */
    EXPECT_STATUS(fp8amp_context_set_allocator(ctx, counting_alloc_fn, NULL, &b), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_context_set_allocator(ctx, NULL, counting_free_fn, &b), FP8AMP_ERROR_INVALID_ARGUMENT);
    t = make_f32(ctx, 2, 2);
    assert_int_equal(b.allocs, 0);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(b.frees, 0);

    /* With hooks in force: refused, and the hooks (and their user_data) stay. */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    EXPECT_STATUS(fp8amp_context_set_allocator(ctx, counting_alloc_fn, NULL, &b), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_context_set_allocator(ctx, NULL, counting_free_fn, &b), FP8AMP_ERROR_INVALID_ARGUMENT);
    t = make_f32(ctx, 2, 3);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(b.allocs, 0);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(a.frees, 1);
    assert_int_equal(b.frees, 0);
    assert_int_equal(a.bad_frees, 0);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_allocator_switch_while_tensors_live(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a, b;
    fp8amp_tensor ta, tb, tbuiltin;
    float va[6], vb[10], vc[4];
    void *pa = NULL;
    counting_init(&a);
    counting_init(&b);

    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    ta = make_f32(ctx, 2, 3);
    write_random(ta, va, 6);
    EXPECT_OK(fp8amp_tensor_data(ta, &pa));

    /* Switch to other hooks: new tensors use them, ta stays with a. */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &b));
    tb = make_f32(ctx, 2, 5);
    write_random(tb, vb, 10);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(b.allocs, 1);

    /* Back to the built-in allocator while hooked tensors live. */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, NULL, NULL, NULL));
    tbuiltin = make_f32(ctx, 1, 4);
    write_random(tbuiltin, vc, 4);
    assert_int_equal(a.allocs, 1);
    assert_int_equal(b.allocs, 1);

    assert_contents(ta, va, 6);
    assert_contents(tb, vb, 10);
    assert_contents(tbuiltin, vc, 4);

    EXPECT_OK(fp8amp_tensor_destroy(ta));
    assert_int_equal(a.frees, 1); /* freed through the hook that allocated it */
    assert_ptr_equal(a.last_free, pa);
    assert_int_equal(b.frees, 0);
    EXPECT_OK(fp8amp_tensor_destroy(tbuiltin));
    assert_int_equal(a.frees, 1);
    assert_int_equal(b.frees, 0);
    EXPECT_OK(fp8amp_tensor_destroy(tb));
    assert_int_equal(a.frees, 1);
    assert_int_equal(b.frees, 1);
    assert_int_equal(a.bytes_live, 0);
    assert_int_equal(b.bytes_live, 0);
    assert_int_equal(a.bad_frees + b.bad_frees, 0);
    assert_int_equal(a.bad_args + b.bad_args, 0);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_allocator_outlives_context(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    counting_alloc a;
    fp8amp_tensor t;
    float values[8];
    counting_init(&a);

    EXPECT_OK(fp8amp_context_set_allocator(ctx, counting_alloc_fn, counting_free_fn, &a));
    t = make_f32(ctx, 2, 4);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    assert_int_equal(a.frees, 0); /* the tensor still owns its memory */
    write_random(t, values, 8);
    assert_contents(t, values, 8);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    assert_int_equal(a.frees, 1);
    assert_int_equal(a.bytes_live, 0);
    assert_int_equal(a.bad_frees, 0);
}

/* Hooks on any device: a bump allocator over a pool that is itself an fp8amp tensor of another
 * context (made before the hooks are set, so the hooks never call into fp8amp). On CUDA this shows
 * the hooks get the CUDA device and the context's stream, and that the library really uses their
 * device memory. */
typedef struct {
    uint8_t *base;
    size_t size, used;
    int allocs, frees, bad_args;
    void *last_free;
    size_t last_free_nbytes;
    fp8amp_device expect_device;
    void *expect_stream;
} pool_alloc;

static void *pool_alloc_fn(void *user_data, size_t nbytes, fp8amp_device device, void *stream) {
    pool_alloc *a = (pool_alloc *)user_data;
    const size_t start = (a->used + 255) / 256 * 256;
    a->allocs++;
    if (device.type != a->expect_device.type || device.index != a->expect_device.index ||
        stream != a->expect_stream)
        a->bad_args++;
    if (start > a->size || nbytes > a->size - start) return NULL;
    a->used = start + nbytes;
    return a->base + start;
}

static void pool_free_fn(void *user_data, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    pool_alloc *a = (pool_alloc *)user_data;
    a->frees++;
    a->last_free = ptr;
    a->last_free_nbytes = nbytes;
    if (device.type != a->expect_device.type || device.index != a->expect_device.index ||
        stream != a->expect_stream)
        a->bad_args++;
}

static void test_allocator_hooks_on_device(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_context pool_ctx = make_context(device);
    const int64_t pool_shape[1] = {1 << 16};
    fp8amp_tensor pool = NULL, t1, t2, t3;
    void *pool_data = NULL, *d1 = NULL, *d2 = NULL;
    float v1[64], v2[9];
    pool_alloc a;

    EXPECT_OK(fp8amp_tensor_create(pool_ctx, FP8AMP_DTYPE_E4M3, 1, pool_shape, &pool));
    EXPECT_OK(fp8amp_tensor_data(pool, &pool_data));
    memset(&a, 0, sizeof a);
    a.base = (uint8_t *)pool_data;
    a.size = (size_t)1 << 16;
    a.expect_device = device;
    if (device.type == FP8AMP_DEVICE_CUDA) {
        a.expect_stream = (void *)(uintptr_t)0x2; /* cudaStreamPerThread */
        EXPECT_OK(fp8amp_context_set_stream(ctx, a.expect_stream));
    }
    EXPECT_OK(fp8amp_context_set_allocator(ctx, pool_alloc_fn, pool_free_fn, &a));

    t1 = make_f32(ctx, 8, 8);
    t2 = make_f32(ctx, 3, 3);
    assert_int_equal(a.allocs, 2);
    EXPECT_OK(fp8amp_tensor_data(t1, &d1));
    EXPECT_OK(fp8amp_tensor_data(t2, &d2));
    assert_ptr_equal(d1, a.base);
    assert_ptr_equal(d2, a.base + 256);
    write_random(t1, v1, 64);
    write_random(t2, v2, 9);
    assert_contents(t1, v1, 64);
    assert_contents(t2, v2, 9);

    /* A request past the pool's end: the hook says NULL, the library says OUT_OF_MEMORY. */
    {
        fp8amp_tensor big = SENTINEL_TENSOR;
        const int64_t big_shape[1] = {1 << 16};
        EXPECT_STATUS(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 1, big_shape, &big), FP8AMP_ERROR_OUT_OF_MEMORY);
        assert_ptr_equal(big, SENTINEL_TENSOR);
        assert_int_equal(a.allocs, 3);
    }

    EXPECT_OK(fp8amp_tensor_destroy(t1));
    assert_int_equal(a.frees, 1);
    assert_ptr_equal(a.last_free, d1);
    assert_int_equal(a.last_free_nbytes, 64 * sizeof(float));
    assert_contents(t2, v2, 9);
    EXPECT_OK(fp8amp_tensor_destroy(t2));
    assert_int_equal(a.frees, 2);
    assert_ptr_equal(a.last_free, d2);
    assert_int_equal(a.last_free_nbytes, 9 * sizeof(float));

    /* Built-in again: a new tensor is not in the pool. */
    EXPECT_OK(fp8amp_context_set_allocator(ctx, NULL, NULL, NULL));
    t3 = make_f32(ctx, 2, 2);
    {
        void *d3 = NULL;
        EXPECT_OK(fp8amp_tensor_data(t3, &d3));
        assert_true((uint8_t *)d3 < a.base || (uint8_t *)d3 >= a.base + a.size);
    }
    EXPECT_OK(fp8amp_tensor_destroy(t3));
    assert_int_equal(a.allocs, 3);
    assert_int_equal(a.frees, 2);
    assert_int_equal(a.bad_args, 0);

    EXPECT_OK(fp8amp_context_synchronize(ctx));
    EXPECT_OK(fp8amp_tensor_destroy(pool));
    EXPECT_OK(fp8amp_context_destroy(pool_ctx));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* ---- synchronize and lifetimes --------------------------------------------------------------- */

static void test_synchronize(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_tensor t = make_f32(ctx, 16, 16);
    float values[256];
    write_random(t, values, 256);
    EXPECT_OK(fp8amp_context_synchronize(ctx));
    EXPECT_OK(fp8amp_context_synchronize(ctx));
    assert_contents(t, values, 256);
    EXPECT_STATUS(fp8amp_context_synchronize(NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    EXPECT_STATUS(fp8amp_context_synchronize(ctx), FP8AMP_ERROR_INVALID_HANDLE);
}

static void test_context_destroyed_before_tensors(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    fp8amp_context ctx = make_context(device);
    fp8amp_tensor t1 = make_f32(ctx, 4, 8);
    fp8amp_tensor t2 = make_f32(ctx, 1, 3);
    float v1[32], v2[3];
    fp8amp_device d;

    write_random(t1, v1, 32);
    EXPECT_OK(fp8amp_context_destroy(ctx));
    EXPECT_STATUS(fp8amp_context_device(ctx, &d), FP8AMP_ERROR_INVALID_HANDLE);

    /* The tensors keep working: reads, writes, getters. */
    assert_contents(t1, v1, 32);
    write_random(t2, v2, 3);
    assert_contents(t2, v2, 3);
    write_random(t1, v1, 32);
    assert_contents(t1, v1, 32);
    EXPECT_OK(fp8amp_tensor_device(t1, &d));
    assert_device_equal(d, device);

    EXPECT_OK(fp8amp_tensor_destroy(t1));
    assert_contents(t2, v2, 3);
    EXPECT_OK(fp8amp_tensor_destroy(t2));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_create_destroy),
        cmocka_unit_test(test_create_null_out),
        cmocka_unit_test(test_cuda_unavailable_or_out_of_range),
        cmocka_unit_test(test_create_bad_device),
        cmocka_unit_test(test_destroy_null_and_twice),
        DEVICE_TESTS(test_tensor_handle_as_context),
        cmocka_unit_test(test_garbage_handles),
        DEVICE_TESTS(test_device_null_out),
        DEVICE_TESTS(test_stream),
        cmocka_unit_test(test_allocator_hooks_serve_tensors),
        cmocka_unit_test(test_allocator_refusal_is_out_of_memory),
        cmocka_unit_test(test_allocator_never_sees_sizes_past_ptrdiff_max),
        cmocka_unit_test(test_allocator_one_null_hook),
        cmocka_unit_test(test_allocator_switch_while_tensors_live),
        cmocka_unit_test(test_allocator_outlives_context),
        DEVICE_TESTS(test_allocator_hooks_on_device),
        DEVICE_TESTS(test_synchronize),
        DEVICE_TESTS(test_context_destroyed_before_tensors),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
