/* Out-of-range enum values from C (issue 22, defect 7). C lets a caller put any int into an enum
 * argument or field; in C++ a value outside the enum's range is no value of the type, and loading it
 * as the enum (a switch, a comparison, passing it on) is undefined behaviour. The library must read
 * each such argument and field as an integer, refuse values that are not one of the enum's with
 * INVALID_ARGUMENT and a message naming the argument, and change nothing. Every enum argument and
 * every enum field of every public function and struct is tried with values well outside any enum's
 * range (which UBSan's -fsanitize=enum reports when they are loaded as the enum: see
 * tests/sanitizers.sh) and with the first value past the last enumerator. */
#include "test_util.h"

#include "fp8amp/dlpack.h"

/* Values no fp8amp enum has. The first few lie outside every enum's C++ range (UBSan reports loads of
 * them); `past` adds, per enum, the first integer beyond its last enumerator. */
static const int32_t kBad[] = {999, -1, INT32_MIN, INT32_MAX, 64, -7};
#define N_BAD ((int)(sizeof kBad / sizeof kBad[0]))

/* EXPECT_STATUS plus: the message names `name` (the argument or field). */
#define EXPECT_INVALID_NAMING(call, name)                                                          \
    do {                                                                                           \
        EXPECT_STATUS(call, FP8AMP_ERROR_INVALID_ARGUMENT);                                        \
        if (!strstr(fp8amp_last_error_message(), name))                                            \
            fail_msg("message '%s' does not name %s", fp8amp_last_error_message(), name);          \
    } while (0)

static fp8amp_context cpu_context(void) {
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(cpu_device(), &ctx));
    return ctx;
}

/* The getters of constants: no status, but a defined answer for any value. */
static void test_constant_getters(void **state) {
    (void)state;
    for (int i = 0; i < N_BAD; ++i) {
        assert_string_equal(fp8amp_status_name((fp8amp_status)kBad[i]), "FP8AMP_UNKNOWN_STATUS");
        assert_int_equal(fp8amp_dtype_size((fp8amp_dtype)kBad[i]), 0);
        assert_string_equal(fp8amp_dtype_name((fp8amp_dtype)kBad[i]), "unknown");
    }
    assert_string_equal(fp8amp_status_name((fp8amp_status)14), "FP8AMP_UNKNOWN_STATUS"); /* 13: FP8AMP_ERROR_COMM */
    assert_int_equal(fp8amp_dtype_size((fp8amp_dtype)5), 0);
    assert_string_equal(fp8amp_dtype_name((fp8amp_dtype)5), "unknown");
}

static void test_device_type(void **state) {
    (void)state;
    for (int i = -1; i < N_BAD; ++i) {
        const int32_t v = i < 0 ? 3 : kBad[i];
        int32_t count = 0x5A5A;
        EXPECT_INVALID_NAMING(fp8amp_device_count((fp8amp_device_type)v, &count), "device type");
        assert_int_equal(count, 0x5A5A);
        fp8amp_device d = {(fp8amp_device_type)v, 0};
        fp8amp_context ctx = (fp8amp_context)(uintptr_t)0x1234;
        EXPECT_INVALID_NAMING(fp8amp_context_create(d, &ctx), "device.type");
        assert_true(ctx == (fp8amp_context)(uintptr_t)0x1234);
    }
}

static void test_tensor_dtype(void **state) {
    (void)state;
    fp8amp_context ctx = cpu_context();
    const int64_t shape[2] = {3, 5};
    float buf[15];
    for (int i = 0; i < 15; ++i) buf[i] = (float)test_rng_uniform(-4.0, 4.0);
    for (int i = -1; i < N_BAD; ++i) {
        const fp8amp_dtype v = (fp8amp_dtype)(i < 0 ? 5 : kBad[i]);
        fp8amp_tensor t = (fp8amp_tensor)(uintptr_t)0x1234;
        EXPECT_INVALID_NAMING(fp8amp_tensor_create(ctx, v, 2, shape, &t), "dtype");
        assert_true(t == (fp8amp_tensor)(uintptr_t)0x1234);
        EXPECT_INVALID_NAMING(fp8amp_tensor_wrap(ctx, v, 2, shape, buf, &t), "dtype");
        assert_true(t == (fp8amp_tensor)(uintptr_t)0x1234);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_scaling_create(void **state) {
    (void)state;
    fp8amp_context ctx = cpu_context();
    fp8amp_recipe good, r;
    EXPECT_OK(fp8amp_recipe_init_default(&good));
    fp8amp_scaling const sentinel = (fp8amp_scaling)(uintptr_t)0x1234;
    fp8amp_scaling s = sentinel;
    for (int i = -1; i < N_BAD; ++i) {
        const int32_t v = i < 0 ? 5 : kBad[i];
        EXPECT_INVALID_NAMING(fp8amp_scaling_create(ctx, &good, (fp8amp_dtype)v, &s), "fp8_dtype");
        assert_true(s == sentinel);
        const int32_t past = i < 0 ? 2 : v;
        r = good;
        r.format = (fp8amp_format)past;
        EXPECT_INVALID_NAMING(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s), "recipe->format");
        r = good;
        r.mode = (fp8amp_scaling_mode)past;
        EXPECT_INVALID_NAMING(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s), "recipe->mode");
        r = good;
        r.amax_algo = (fp8amp_amax_algo)past;
        EXPECT_INVALID_NAMING(fp8amp_scaling_create(ctx, &r, FP8AMP_DTYPE_E4M3, &s), "recipe->amax_algo");
        assert_true(s == sentinel);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_linear_desc(void **state) {
    (void)state;
    fp8amp_context ctx = cpu_context();
    fp8amp_linear_desc good, d;
    EXPECT_OK(fp8amp_linear_desc_init_default(&good));
    good.in_features = 16 + (int64_t)(test_rng_u64() % 16);
    good.out_features = 16 + (int64_t)(test_rng_u64() % 16);
    fp8amp_linear const sentinel = (fp8amp_linear)(uintptr_t)0x5A5A;
    fp8amp_linear lin = sentinel;
#define BAD_FIELD(field, type, value, name)                                                        \
    do {                                                                                           \
        d = good;                                                                                  \
        d.field = (type)(value);                                                                   \
        EXPECT_INVALID_NAMING(fp8amp_linear_create(ctx, &d, &lin), name);                          \
        assert_true(lin == sentinel);                                                              \
    } while (0)
    for (int i = -1; i < N_BAD; ++i) {
        const int32_t v = i < 0 ? 5 : kBad[i];
        BAD_FIELD(weight_dtype, fp8amp_dtype, v, "desc->weight_dtype");
        BAD_FIELD(wgrad_dtype, fp8amp_dtype, v, "desc->wgrad_dtype");
        BAD_FIELD(policy, fp8amp_gemm_policy, i < 0 ? 3 : v, "desc->policy");
        BAD_FIELD(recipe.format, fp8amp_format, i < 0 ? 2 : v, "recipe->format");
        BAD_FIELD(recipe.mode, fp8amp_scaling_mode, i < 0 ? 2 : v, "recipe->mode");
        BAD_FIELD(recipe.amax_algo, fp8amp_amax_algo, i < 0 ? 2 : v, "recipe->amax_algo");
    }
#undef BAD_FIELD

    /* fp8amp_linear_scaling's role */
    EXPECT_OK(fp8amp_linear_create(ctx, &good, &lin));
    for (int i = -1; i < N_BAD; ++i) {
        fp8amp_scaling s = (fp8amp_scaling)(uintptr_t)0x1234;
        EXPECT_INVALID_NAMING(fp8amp_linear_scaling(lin, (fp8amp_linear_role)(i < 0 ? 5 : kBad[i]), &s), "role");
        assert_true(s == (fp8amp_scaling)(uintptr_t)0x1234);
    }
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_adam_desc(void **state) {
    (void)state;
    fp8amp_context ctx = cpu_context();
    fp8amp_adam_desc good, d;
    EXPECT_OK(fp8amp_adam_desc_init_default(&good));
    good.lr = (float)test_rng_uniform(1e-4, 1e-2);
    fp8amp_optimizer const sentinel = (fp8amp_optimizer)(uintptr_t)0x5A5A;
    fp8amp_optimizer opt = sentinel;
    for (int i = -1; i < N_BAD; ++i) {
        const int32_t v = i < 0 ? 5 : kBad[i];
        d = good;
        d.exp_avg_dtype = (fp8amp_dtype)v;
        EXPECT_INVALID_NAMING(fp8amp_optimizer_create(ctx, &d, &opt), "desc->exp_avg_dtype");
        d = good;
        d.exp_avg_sq_dtype = (fp8amp_dtype)v;
        EXPECT_INVALID_NAMING(fp8amp_optimizer_create(ctx, &d, &opt), "desc->exp_avg_sq_dtype");
        d = good;
        d.master_dtype = v == FP8AMP_NO_MASTER ? FP8AMP_DTYPE_E5M2 : v; /* an int32_t: F16 or NO_MASTER */
        EXPECT_INVALID_NAMING(fp8amp_optimizer_create(ctx, &d, &opt), "desc->master_dtype");
        assert_true(opt == sentinel);
    }
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_opt_level(void **state) {
    (void)state;
    for (int i = -2; i < N_BAD; ++i) {
        const fp8amp_opt_level v = (fp8amp_opt_level)(i == -2 ? 0 : i == -1 ? 4 : kBad[i]);
        fp8amp_adam_desc ad, ad_before;
        fp8amp_linear_desc ld, ld_before;
        memset(&ad, 0xA5, sizeof ad);
        memset(&ld, 0x5A, sizeof ld);
        ad_before = ad;
        ld_before = ld;
        EXPECT_INVALID_NAMING(fp8amp_opt_level_adam_config(v, &ad), "level");
        EXPECT_INVALID_NAMING(fp8amp_opt_level_config(v, &ld, &ad), "level");
        EXPECT_INVALID_NAMING(fp8amp_opt_level_config(v, NULL, &ad), "level");
        EXPECT_INVALID_NAMING(fp8amp_opt_level_config(v, &ld, NULL), "level");
        assert_memory_equal(&ad, &ad_before, sizeof ad);
        assert_memory_equal(&ld, &ld_before, sizeof ld);
    }
}

/* DLPack's device_type is an enum of the DLPack header: a value fp8amp does not know (or no DLPack
 * value at all) is a device this CPU context cannot use, DEVICE_MISMATCH as documented, and must be
 * read without undefined behaviour too. The deleter is never called on failure. */
static int dlpack_deleter_calls;
static void count_deleter(struct DLManagedTensorVersioned *self) {
    (void)self;
    ++dlpack_deleter_calls;
}

static void test_dlpack_device_type(void **state) {
    (void)state;
    fp8amp_context ctx = cpu_context();
    float data[6];
    for (int i = 0; i < 6; ++i) data[i] = (float)test_rng_uniform(-1.0, 1.0);
    int64_t shape[2] = {2, 3};
    for (int i = 0; i < N_BAD; ++i) {
        struct DLManagedTensorVersioned m;
        memset(&m, 0, sizeof m);
        m.version.major = 1;
        m.version.minor = 1;
        m.deleter = count_deleter;
        m.dl_tensor.data = data;
        m.dl_tensor.device.device_type = (DLDeviceType)kBad[i];
        m.dl_tensor.ndim = 2;
        m.dl_tensor.dtype.code = kDLFloat;
        m.dl_tensor.dtype.bits = 32;
        m.dl_tensor.dtype.lanes = 1;
        m.dl_tensor.shape = shape;
        fp8amp_tensor t = (fp8amp_tensor)(uintptr_t)0x1234;
        EXPECT_STATUS(fp8amp_tensor_from_dlpack(ctx, &m, &t), FP8AMP_ERROR_DEVICE_MISMATCH);
        assert_true(t == (fp8amp_tensor)(uintptr_t)0x1234);
    }
    assert_int_equal(dlpack_deleter_calls, 0);
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant_getters), cmocka_unit_test(test_device_type),
        cmocka_unit_test(test_tensor_dtype),     cmocka_unit_test(test_scaling_create),
        cmocka_unit_test(test_linear_desc),      cmocka_unit_test(test_adam_desc),
        cmocka_unit_test(test_opt_level),        cmocka_unit_test(test_dlpack_device_type),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
