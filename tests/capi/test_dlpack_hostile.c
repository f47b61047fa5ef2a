/* DLPack imports with hostile fields that fuzz_dlpack (tests/fuzz) found mishandled: a byte_offset
 * that wraps the address space, and device types outside the few fp8amp declares. */
#define _POSIX_C_SOURCE 200809L

#include "fp8amp/dlpack.h"
#include "test_util.h"

static int g_deleter_calls;
static void count_deleter(struct DLManagedTensorVersioned *self) {
    (void)self;
    ++g_deleter_calls;
}

/* An F32 [4] tensor over buf, random contents. */
static void make_managed(struct DLManagedTensorVersioned *m, float *buf, int64_t *shape) {
    int i;
    memset(m, 0, sizeof *m);
    for (i = 0; i < 4; ++i) buf[i] = (float)test_rng_uniform(-8.0, 8.0);
    shape[0] = 4;
    m->version.major = 1;
    m->version.minor = 1;
    m->deleter = count_deleter;
    m->dl_tensor.data = buf;
    m->dl_tensor.device.device_type = kDLCPU;
    m->dl_tensor.ndim = 1;
    m->dl_tensor.dtype.code = kDLFloat;
    m->dl_tensor.dtype.bits = 32;
    m->dl_tensor.dtype.lanes = 1;
    m->dl_tensor.shape = shape;
}

/* byte_offset = 2^64 - 64: data + byte_offset wraps round to 64 bytes below data (aligned). Before
 * the fix this was accepted as a tensor over memory the producer never described. */
static void test_import_byte_offset_wrapping(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const uint64_t offsets[] = {UINT64_MAX - 63u, UINT64_MAX - 3u, UINT64_MAX};
    size_t k;
    for (k = 0; k < sizeof offsets / sizeof offsets[0]; ++k) {
        float buf[4];
        int64_t shape[1];
        struct DLManagedTensorVersioned m;
        fp8amp_tensor t = (fp8amp_tensor)(uintptr_t)0x7a7a7a7a;
        make_managed(&m, buf, shape);
        m.dl_tensor.byte_offset = offsets[k];
        g_deleter_calls = 0;
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, &m, &t), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_true(strstr(fp8amp_last_error_message(), "byte_offset") != NULL);
        assert_ptr_equal(t, (fp8amp_tensor)(uintptr_t)0x7a7a7a7a);
        assert_int_equal(g_deleter_calls, 0);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

/* DLPack's other device types (kDLHexagon 16, kDLMAIA 17, beyond fp8amp's declared enumerators) and
 * garbage ones are refused with DEVICE_MISMATCH, nothing called. (Under UBSan the load of 16 or 17
 * through the unfixed C++ enum was undefined: tests/fuzz's fuzz_dlpack reported it.) */
static void test_import_other_device_types(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    const int32_t types[] = {0, 4, 7, 14, 15, 16, 17, 1000, -1};
    size_t k;
    for (k = 0; k < sizeof types / sizeof types[0]; ++k) {
        float buf[4];
        int64_t shape[1];
        struct DLManagedTensorVersioned m;
        fp8amp_tensor t = (fp8amp_tensor)(uintptr_t)0x7a7a7a7a;
        make_managed(&m, buf, shape);
        memcpy(&m.dl_tensor.device.device_type, &types[k], sizeof types[k]);
        g_deleter_calls = 0;
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, &m, &t), FP8AMP_ERROR_DEVICE_MISMATCH);
        assert_ptr_equal(t, (fp8amp_tensor)(uintptr_t)0x7a7a7a7a);
        assert_int_equal(g_deleter_calls, 0);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_import_byte_offset_wrapping),
        cmocka_unit_test(test_import_other_device_types),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
