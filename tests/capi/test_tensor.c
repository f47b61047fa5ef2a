/* Tensors: create, wrap, getters, host copies, destroy; argument checking and the handle registry.
 * Device-dependent tests run on the CPU and on CUDA (skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L

#include "test_util.h"

#define SENTINEL_TENSOR ((fp8amp_tensor)(uintptr_t)0x7a7a7a7a)
#define POISON 0xA5

static const fp8amp_dtype ALL_DTYPES[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_E4M3,
                                          FP8AMP_DTYPE_E5M2};
#define N_DTYPES (sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

/* ---- helpers --------------------------------------------------------------------------------- */

/* Fresh random contents, never all zeros and no zero element: F32 as values in +-[1, 1000), the
 * narrower types as random bit patterns with every byte in 1..255 (host copies move bits). */
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

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static fp8amp_context make_context(fp8amp_device device) {
    fp8amp_context ctx = NULL;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    assert_non_null(ctx);
    return ctx;
}

static fp8amp_tensor make_tensor(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim, const int64_t *shape) {
    fp8amp_tensor t = NULL;
    EXPECT_OK(fp8amp_tensor_create(ctx, dtype, ndim, shape, &t));
    assert_non_null(t);
    return t;
}

static size_t tensor_bytes(fp8amp_tensor t) {
    size_t n = 0;
    EXPECT_OK(fp8amp_tensor_nbytes(t, &n));
    return n;
}

/* Writes fresh random contents; returns them (caller frees). */
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
static void assert_contents(fp8amp_tensor t, const void *expect, size_t nbytes) {
    void *got = xmalloc(nbytes);
    assert_int_equal(tensor_bytes(t), nbytes);
    memset(got, POISON, nbytes);
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, got, nbytes));
    assert_memory_equal(got, expect, nbytes);
    free(got);
}

/* Asserts every getter reports this description. */
static void assert_描述(void); /* (placeholder removed below) */
