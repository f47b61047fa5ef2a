/* NaN through the one-rank all-reduce (issue 17, docs/communicator.md "Algorithm" step 4 and
 * "Numerics"): a NaN input stays NaN with its sign, through the wire (E4M3 or E5M2), the float32
 * accumulation, the requantization and the output (F32: the canonical NaN with its sign; E4M3: code
 * 0x7F with its sign bit), its tensor's amax is inf so the scale stays 1 and the finite values keep
 * their codes, nothing but inf saturates; and the GPU gives the CPU's bytes (SKIPPED without a
 * GPU). The sum's NaN rule is comm_add (kernels/comm.hpp): without it CUDA's addition turns every
 * NaN into the positive 0x7FFFFFFF where x86 keeps the operand's sign, so the GPU's output lost the
 * sign that the CPU's kept. */
#include "test_util.h"

#include "comm_reference.h"

enum { kN = 1000 };

/* F32 input with NaNs of both signs among random finite values below 448 in magnitude, reduced
 * into an F32 output and an E4M3 output (one bucket); returns the bytes of both outputs and the
 * E4M3 output's scale_inv, and the saturation count. */
static unsigned char *reduce_with_nans(fp8amp_device device, const float *x, fp8amp_dtype wire, uint64_t *saturated) {
    fp8amp_context ctx = make_context(device);
    fp8amp_comm_unique_id id;
    fp8amp_comm comm = NULL;
    fp8amp_comm_reduce_desc desc;
    fp8amp_recipe recipe;
    fp8amp_scaling meta;
    fp8amp_tensor in[2], out[2], si;
    const int64_t n = kN;
    unsigned char *bytes = xmalloc(4 * kN + kN + 4);
    EXPECT_OK(fp8amp_comm_unique_id_create(ctx, &id));
    EXPECT_OK(fp8amp_comm_create(ctx, &id, 1, 0, &comm));
    in[0] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    in[1] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    EXPECT_OK(fp8amp_tensor_copy_from_host(in[0], x, 4 * kN));
    EXPECT_OK(fp8amp_tensor_copy_from_host(in[1], x, 4 * kN));
    out[0] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    EXPECT_OK(fp8amp_recipe_init_default(&recipe));
    EXPECT_OK(fp8amp_scaling_create(ctx, &recipe, FP8AMP_DTYPE_E4M3, &meta));
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, &n, &out[1]));
    EXPECT_OK(fp8amp_tensor_set_scaling(out[1], meta));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    EXPECT_OK(fp8amp_comm_reduce_desc_init_default(&desc));
    desc.wire_dtype = wire;
    EXPECT_OK(fp8amp_comm_all_reduce(comm, 2, in, out, &desc));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out[0], bytes, 4 * kN));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out[1], bytes + 4 * kN, kN));
    EXPECT_OK(fp8amp_tensor_scale_inv(out[1], &si));
    EXPECT_OK(fp8amp_tensor_copy_to_host(si, bytes + 5 * kN, 4));
    EXPECT_OK(fp8amp_comm_get_saturated(comm, saturated));
    EXPECT_OK(fp8amp_tensor_destroy(si));
    EXPECT_OK(fp8amp_tensor_destroy(in[0]));
    EXPECT_OK(fp8amp_tensor_destroy(in[1]));
    EXPECT_OK(fp8amp_tensor_destroy(out[0]));
    EXPECT_OK(fp8amp_tensor_destroy(out[1]));
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    return bytes;
}

static void test_nan_kept_with_sign(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const fp8amp_dtype wires[2] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2};
    float *x = xmalloc(4 * kN);
    uint64_t s = test_rng_u64();
    int w, k, nans = 0;
    for (k = 0; k < kN; ++k) {
        x[k] = random_value(&s, -8, 8);
        if (test_rng_u64() % 7 == 0) {
            /* A NaN with a random payload and sign. */
            const uint32_t bits = 0x7F800001u | (uint32_t)(test_rng_u64() & 0x807FFFFFu);
            memcpy(&x[k], &bits, 4);
            ++nans;
        }
    }
    assert_true(nans > 0);
    for (w = 0; w < 2; ++w) {
        uint64_t sat = 1;
        unsigned char *got = reduce_with_nans(device, x, wires[w], &sat);
        float si;
        memcpy(&si, got + 5 * kN, 4);
        assert_int_equal(sat, 0);  /* the amax is inf: scale 1, and every finite |x| < 448 fits */
        /* The E4M3 output is requantized with the wire's scale (1), mapped from the wire's range onto
         * E4M3's: scale_inv 1 from an E4M3 wire, 57344 / 448 = 2^7 from an E5M2 wire. */
        assert_true(si == (wires[w] == FP8AMP_DTYPE_E5M2 ? 128.0f : 1.0f));
        for (k = 0; k < kN; ++k) {
            float y;
            uint32_t xb, yb;
            const uint8_t code = got[4 * kN + k];
            memcpy(&y, got + 4 * k, 4);
            memcpy(&xb, &x[k], 4);
            memcpy(&yb, &y, 4);
            if (isnan(x[k])) {
                assert_true(yb == ((xb & 0x80000000u) | 0x7FC00000u)); /* canonical, sign kept */
                assert_int_equal(code, ((xb >> 24) & 0x80u) | 0x7Fu);
            } else {
                assert_false(isnan(y));
                /* Scale 1: one rounding into the wire format (E4M3's subnormal quantum is 2^-9). */
                assert_true(fabs((double)y - x[k]) <= fabs((double)x[k]) * 0.125 + ldexp(1.0, -9));
                assert_false((code & 0x7Fu) == 0x7Fu);
            }
        }
        if (device.type == FP8AMP_DEVICE_CUDA) {
            uint64_t cpu_sat = 1;
            unsigned char *cpu = reduce_with_nans(cpu_device(), x, wires[w], &cpu_sat);
            assert_memory_equal(cpu, got, 5 * kN + 4);
            assert_int_equal(cpu_sat, sat);
            free(cpu);
        }
        free(got);
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_nan_kept_with_sign),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
