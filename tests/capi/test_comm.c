/* One-rank communicators (issue 17), without mpirun: the all-reduce, reduce-scatter and all-gather
 * of a one-rank communicator against the model of comm_reference.h (bit for bit) on the CPU (a
 * local transport: no MPI needed) and on CUDA (NCCL with one rank; SKIPPED without a GPU), the same
 * bytes on both devices, argument errors with specific statuses and no change, and saturation
 * counted. The multi-rank tests run under mpirun: tests/mpi/test_comm_mpi.c. */
#include "test_util.h"

#include "comm_reference.h"

static fp8amp_comm make_comm(fp8amp_context ctx) {
    fp8amp_comm_unique_id id;
    fp8amp_comm comm = NULL;
    EXPECT_OK(fp8amp_comm_unique_id_create(ctx, &id));
    EXPECT_OK(fp8amp_comm_create(ctx, &id, 1, 0, &comm));
    return comm;
}

/* An FP8 tensor with a scale_inv slot (bound to a meta once), holding codes (or not) and scale_inv. */
static fp8amp_tensor make_fp8(fp8amp_context ctx, fp8amp_dtype d, int64_t numel, const uint8_t *codes, float scale_inv) {
    fp8amp_recipe recipe;
    fp8amp_scaling meta;
    fp8amp_tensor t, si;
    EXPECT_OK(fp8amp_recipe_init_default(&recipe));
    EXPECT_OK(fp8amp_scaling_create(ctx, &recipe, d, &meta));
    EXPECT_OK(fp8amp_tensor_create(ctx, d, 1, &numel, &t));
    EXPECT_OK(fp8amp_tensor_set_scaling(t, meta));
    EXPECT_OK(fp8amp_scaling_destroy(meta));
    if (codes) EXPECT_OK(fp8amp_tensor_copy_from_host(t, codes, (size_t)numel));
    EXPECT_OK(fp8amp_tensor_scale_inv(t, &si));
    EXPECT_OK(fp8amp_tensor_copy_from_host(si, &scale_inv, 4));
    EXPECT_OK(fp8amp_tensor_destroy(si));
    return t;
}

static float read_scale_inv(fp8amp_tensor t) {
    fp8amp_tensor si;
    float v = 0;
    EXPECT_OK(fp8amp_tensor_scale_inv(t, &si));
    EXPECT_OK(fp8amp_tensor_copy_to_host(si, &v, 4));
    EXPECT_OK(fp8amp_tensor_destroy(si));
    return v;
}

/* A bucket of three tensors: F32 -> E4M3, BF16 -> F32, E4M3 (scale_inv 2^-9) -> BF16; returns the
 * output bytes (concatenated) for the cross-device comparison. */
static unsigned char *all_reduce_bucket(fp8amp_device device, const float *x0, const uint16_t *x1, const uint8_t *x2,
                                        const int64_t *numel, size_t *nbytes) {
    fp8amp_context ctx = make_context(device);
    fp8amp_comm comm = make_comm(ctx);
    fp8amp_tensor in[3], out[3];
    const float si_in = ldexpf(1.0f, -9);
    size_t total = (size_t)numel[0] + 4 * (size_t)numel[1] + 2 * (size_t)numel[2] + 8;
    unsigned char *bytes = xmalloc(total), *p = bytes;
    int i;
    in[0] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &numel[0]);
    EXPECT_OK(fp8amp_tensor_copy_from_host(in[0], x0, 4 * (size_t)numel[0]));
    in[1] = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, &numel[1]);
    EXPECT_OK(fp8amp_tensor_copy_from_host(in[1], x1, 2 * (size_t)numel[1]));
    in[2] = make_fp8(ctx, FP8AMP_DTYPE_E4M3, numel[2], x2, si_in);
    out[0] = make_fp8(ctx, FP8AMP_DTYPE_E4M3, numel[0], NULL, 1.0f);
    out[1] = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &numel[1]);
    out[2] = make_tensor(ctx, FP8AMP_DTYPE_BF16, 1, &numel[2]);
    EXPECT_OK(fp8amp_comm_all_reduce(comm, 3, in, out, NULL));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out[0], p, (size_t)numel[0]));
    p += numel[0];
    EXPECT_OK(fp8amp_tensor_copy_to_host(out[1], p, 4 * (size_t)numel[1]));
    p += 4 * numel[1];
    EXPECT_OK(fp8amp_tensor_copy_to_host(out[2], p, 2 * (size_t)numel[2]));
    p += 2 * numel[2];
    {
        const float si = read_scale_inv(out[0]);
        memcpy(p, &si, 4);
    }
    {
        uint64_t sat = 1;
        EXPECT_OK(fp8amp_comm_get_saturated(comm, &sat));
        assert_int_equal(sat, 0);
    }
    for (i = 0; i < 3; ++i) {
        EXPECT_OK(fp8amp_tensor_destroy(in[i]));
        EXPECT_OK(fp8amp_tensor_destroy(out[i]));
    }
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    *nbytes = (size_t)(p - bytes) + 4;
    return bytes;
}

static void test_all_reduce_one_rank(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int64_t numel[3] = {1 + (int64_t)(test_rng_u64() % 3000), 1 + (int64_t)(test_rng_u64() % 100), 257};
    float *x0 = xmalloc(4 * (size_t)numel[0]);
    uint16_t *x1 = xmalloc(2 * (size_t)numel[1]);
    uint8_t *x2 = xmalloc((size_t)numel[2]);
    uint64_t s = test_rng_u64();
    const float si_in = ldexpf(1.0f, -9);
    int64_t k;
    size_t nbytes;
    for (k = 0; k < numel[0]; ++k) x0[k] = random_value(&s, -10, 3);
    for (k = 0; k < numel[1]; ++k) x1[k] = (uint16_t)code_of_value_ref(&FMT_BF16, round_ref(&FMT_BF16, random_value(&s, 0, 6)));
    for (k = 0; k < numel[2]; ++k) x2[k] = (uint8_t)encode_fp8_ref(&FMT_E4M3, random_value(&s, -6, 8));
    unsigned char *got = all_reduce_bucket(device, x0, x1, x2, numel, &nbytes), *p = got;
    {
        /* The model, tensor by tensor (one rank: the mean is the value itself); the wide outputs
         * (tensors 1 and 2) have one scale per region of the bucket they have elements in. */
        double *x = xmalloc(sizeof(double) * 3000), *wm = xmalloc(sizeof(double) * 3000);
        float *v = xmalloc(sizeof(float) * 3000), si2, *si2s = xmalloc(sizeof(float) * 3000),
              *wsis = xmalloc(sizeof(float) * 3000);
        int *seg = xmalloc(sizeof(int) * 3000);
        uint8_t *codes = xmalloc(3000);
        double *xs[1] = {x};
        int64_t offsets[4];
        const int64_t C = comm_chunk_ref(comm_offsets_ref(numel, 3, offsets), 1);
        for (k = 0; k < numel[0]; ++k) x[k] = x0[k];
        comm_all_reduce_ref(&FMT_E4M3, &FMT_E4M3, 1, (size_t)numel[0], xs, 1, v, codes, &si2, wm);
        assert_memory_equal(p, codes, (size_t)numel[0]);
        {
            float got_si;
            memcpy(&got_si, got + nbytes - 4, 4);
            assert_true(got_si == si2);
        }
        for (k = 0; k < numel[0]; ++k) {
            /* One rank: the error against the input is the wire's rounding plus the output's. */
            const double y = mul_f32_ref(decode_ref(&FMT_E4M3, p[k]), si2);
            assert_false(isnan(y));
            assert_true(fabs(y - x0[k]) <= quantum_ref(&FMT_E4M3, fabs(x0[k]) / si2) * si2 * 1.0001);
        }
        p += numel[0];
        for (k = 0; k < numel[1]; ++k) x[k] = decode_ref(&FMT_BF16, x1[k]);
        comm_segments_ref(offsets[1], (size_t)numel[1], C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, &FMT_E4M3, 1, (size_t)numel[1], xs, 1, seg, v, codes, si2s, wsis, wm);
        for (k = 0; k < numel[1]; ++k) {
            float y;
            memcpy(&y, p + 4 * k, 4);
            assert_true((double)y == comm_wide_ref(FP8AMP_DTYPE_F32, &FMT_E4M3, codes[k], si2s[k]));
        }
        p += 4 * numel[1];
        for (k = 0; k < numel[2]; ++k) x[k] = mul_f32_ref(decode_ref(&FMT_E4M3, x2[k]), si_in);
        comm_segments_ref(offsets[2], (size_t)numel[2], C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, &FMT_E4M3, 1, (size_t)numel[2], xs, 1, seg, v, codes, si2s, wsis, wm);
        for (k = 0; k < numel[2]; ++k) {
            uint16_t y;
            memcpy(&y, p + 2 * k, 2);
            assert_true(decode_ref(&FMT_BF16, y) == comm_wide_ref(FP8AMP_DTYPE_BF16, &FMT_E4M3, codes[k], si2s[k]));
        }
        free(si2s);
        free(wsis);
        free(seg);
        free(x);
        free(wm);
        free(v);
        free(codes);
    }
    if (device.type == FP8AMP_DEVICE_CUDA) {
        /* The CPU result is the bit-exact reference of the GPU's. */
        size_t cpu_bytes;
        unsigned char *cpu = all_reduce_bucket(cpu_device(), x0, x1, x2, numel, &cpu_bytes);
        assert_int_equal(cpu_bytes, nbytes);
        assert_memory_equal(cpu, got, nbytes);
        free(cpu);
    }
    free(got);
    free(x0);
    free(x1);
    free(x2);
}

/* Per-region scales (docs/communicator.md, "Algorithm", step 1): a bucket whose magnitudes fall by
 * 2^7 from one scale region to the next (4 regions: 2^21 in all, beyond E4M3's range at one scale),
 * with a wide-output tensor spanning every region and others across region boundaries, and an FP8
 * output (one scale for its tensor). One rank: the output is the wire's rounding of the input.
 * Bytes equal the model; every element of a wide output is within one E4M3 rounding of its value
 * at its region's scale -- a relative 2^-4, which one scale for the whole tensor would miss by far in
 * the lowest regions (flushed to zero there) -- plus the output's own rounding; the FP8 output within
 * one rounding at its tensor's scale. Fresh random data every run (seeded by FP8AMP_TEST_SEED). */
enum { RT = 4 };
static const fp8amp_dtype k_rin[RT] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32};
static const fp8amp_dtype k_rout[RT] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_E4M3};

/* The outputs' bytes concatenated, then the FP8 output's scale_inv. in[i]: host bytes of k_rin[i]. */
static unsigned char *all_reduce_regions_bucket(fp8amp_device device, void *const *in_bytes, const int64_t *numel,
                                                size_t *nbytes) {
    fp8amp_context ctx = make_context(device);
    fp8amp_comm comm = make_comm(ctx);
    fp8amp_tensor in[RT], out[RT];
    size_t total = 4, off = 0;
    unsigned char *bytes;
    int i;
    for (i = 0; i < RT; ++i) total += (size_t)numel[i] * fp8amp_dtype_size(k_rout[i]);
    bytes = xmalloc(total);
    for (i = 0; i < RT; ++i) {
        in[i] = make_tensor(ctx, k_rin[i], 1, &numel[i]);
        EXPECT_OK(fp8amp_tensor_copy_from_host(in[i], in_bytes[i], (size_t)numel[i] * fp8amp_dtype_size(k_rin[i])));
        out[i] = k_rout[i] == FP8AMP_DTYPE_E4M3 ? make_fp8(ctx, FP8AMP_DTYPE_E4M3, numel[i], NULL, 1.0f)
                                                : make_tensor(ctx, k_rout[i], 1, &numel[i]);
    }
    EXPECT_OK(fp8amp_comm_all_reduce(comm, RT, in, out, NULL));
    for (i = 0; i < RT; ++i) {
        const size_t b = (size_t)numel[i] * fp8amp_dtype_size(k_rout[i]);
        EXPECT_OK(fp8amp_tensor_copy_to_host(out[i], bytes + off, b));
        off += b;
    }
    {
        const float si = read_scale_inv(out[RT - 1]);
        memcpy(bytes + off, &si, 4);
    }
    {
        uint64_t sat = 1;
        EXPECT_OK(fp8amp_comm_get_saturated(comm, &sat));
        assert_int_equal(sat, 0);
    }
    for (i = 0; i < RT; ++i) {
        EXPECT_OK(fp8amp_tensor_destroy(in[i]));
        EXPECT_OK(fp8amp_tensor_destroy(out[i]));
    }
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    *nbytes = total;
    return bytes;
}

static void test_all_reduce_regions(void **state) {
    require_variant(state);
    const fp8amp_device device = variant_device(state);
    const int64_t numel[RT] = {1 + (int64_t)(test_rng_u64() % 200), 6000 + (int64_t)(test_rng_u64() % 2000),
                               100 + (int64_t)(test_rng_u64() % 500), 300 + (int64_t)(test_rng_u64() % 700)};
    int64_t offsets[RT + 1], C, R, k;
    void *in_bytes[RT];
    double *real[RT];
    uint64_t s = test_rng_u64();
    size_t nbytes, off = 0;
    int i, regions_seen = 0, last_region = -1;
    unsigned char *got;
    C = comm_chunk_ref(comm_offsets_ref(numel, RT, offsets), 1);
    R = comm_region_ref(C);
    for (i = 0; i < RT; ++i) {
        in_bytes[i] = xmalloc((size_t)numel[i] * 4);
        real[i] = xmalloc(sizeof(double) * (size_t)numel[i]);
        for (k = 0; k < numel[i]; ++k) {
            const int q = (int)((offsets[i] + k) / R); /* the region, 0..3 */
            const float v = random_value(&s, -2 - 7 * q, 1 - 7 * q);
            if (k_rin[i] == FP8AMP_DTYPE_BF16) {
                const uint16_t c = (uint16_t)code_of_value_ref(&FMT_BF16, round_ref(&FMT_BF16, v));
                ((uint16_t *)in_bytes[i])[k] = c;
                real[i][k] = decode_ref(&FMT_BF16, c);
            } else {
                ((float *)in_bytes[i])[k] = v;
                real[i][k] = v;
            }
        }
    }
    /* The big tensor spans all four regions (the test's premise). */
    for (k = 0; k < numel[1]; ++k) {
        const int q = (int)((offsets[1] + k) / R);
        if (q != last_region) ++regions_seen, last_region = q;
    }
    assert_int_equal(regions_seen, 4);
    got = all_reduce_regions_bucket(device, in_bytes, numel, &nbytes);
    for (i = 0; i < RT; ++i) {
        const size_t n = (size_t)numel[i];
        double *xs[1] = {real[i]}, *wm = xmalloc(sizeof(double) * n);
        float *y = xmalloc(sizeof(float) * n), *si2 = xmalloc(sizeof(float) * n), *wsi = xmalloc(sizeof(float) * n);
        int *seg = xmalloc(sizeof(int) * n);
        uint8_t *codes = xmalloc(n);
        const int fp8_out = k_rout[i] == FP8AMP_DTYPE_E4M3;
        comm_segments_ref(offsets[i], n, C, seg);
        comm_all_reduce_segments_ref(&FMT_E4M3, &FMT_E4M3, 1, n, xs, 1, fp8_out ? NULL : seg, y, codes, si2, wsi, wm);
        for (k = 0; k < numel[i]; ++k) {
            const double x = real[i][k];
            double v;
            if (fp8_out) {
                float got_si;
                memcpy(&got_si, got + nbytes - 4, 4);
                assert_int_equal(got[off + (size_t)k], codes[k]);
                assert_true(got_si == si2[k]);
                v = mul_f32_ref(decode_ref(&FMT_E4M3, got[off + (size_t)k]), si2[k]);
                assert_true(fabs(v - x) <= 0.5 * quantum_ref(&FMT_E4M3, fabs(x) / si2[k]) * si2[k] * 1.0001);
            } else {
                v = value_at(k_rout[i], got + off, (size_t)k);
                assert_true(v == comm_wide_ref(k_rout[i], &FMT_E4M3, codes[k], si2[k]));
                /* One E4M3 rounding at the region's scale: relative 2^-4 (every value of a region lies
                 * within 2^3 of its amax, far above E4M3's subnormals), then the output's rounding. */
                assert_true(fabs(v - x) <= fabs(x) * (ldexp(1.0, -4) + (k_rout[i] == FP8AMP_DTYPE_BF16 ? ldexp(1.0, -8) : 0)));
            }
        }
        off += n * fp8amp_dtype_size(k_rout[i]);
        free(wm);
        free(y);
        free(si2);
        free(wsi);
        free(seg);
        free(codes);
    }
    if (device.type == FP8AMP_DEVICE_CUDA) {
        /* The CPU result is the bit-exact reference of the GPU's. */
        size_t cpu_bytes;
        unsigned char *cpu = all_reduce_regions_bucket(cpu_device(), in_bytes, numel, &cpu_bytes);
        assert_int_equal(cpu_bytes, nbytes);
        assert_memory_equal(cpu, got, nbytes);
        free(cpu);
    }
    free(got);
    for (i = 0; i < RT; ++i) {
        free(in_bytes[i]);
        free(real[i]);
    }
}

static void test_reduce_scatter_all_gather_one_rank(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_comm comm = make_comm(ctx);
    const int64_t k = 1 + (int64_t)(test_rng_u64() % 2000), one = 1;
    float *x = xmalloc(4 * (size_t)k), *got = xmalloc(4 * (size_t)k), *v = xmalloc(4 * (size_t)k), si2, si_got;
    double *xd = xmalloc(8 * (size_t)k), *wm = xmalloc(8 * (size_t)k);
    uint8_t *codes = xmalloc((size_t)k), *got8 = xmalloc((size_t)k), *gathered = xmalloc((size_t)k);
    double *xs[1] = {xd};
    uint64_t s = test_rng_u64();
    int64_t e;
    fp8amp_tensor in, out32, out8, all8, scales;
    for (e = 0; e < k; ++e) xd[e] = x[e] = random_value(&s, -4, 4);
    in = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &k);
    EXPECT_OK(fp8amp_tensor_copy_from_host(in, x, 4 * (size_t)k));
    out32 = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &k);
    out8 = make_fp8(ctx, FP8AMP_DTYPE_E5M2, k, NULL, 1.0f);
    EXPECT_OK(fp8amp_comm_reduce_scatter(comm, in, out32, NULL));
    EXPECT_OK(fp8amp_comm_reduce_scatter(comm, in, out8, NULL));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out32, got, 4 * (size_t)k));
    EXPECT_OK(fp8amp_tensor_copy_to_host(out8, got8, (size_t)k));
    comm_reduce_ref(&FMT_E4M3, &FMT_E5M2, 1, (size_t)k, xs, 1, v, codes, &si2, wm);
    assert_memory_equal(got, v, 4 * (size_t)k);     /* the F32 shard: the reduced value */
    assert_memory_equal(got8, codes, (size_t)k);    /* the E5M2 shard: requantized with its amax */
    assert_true(read_scale_inv(out8) == si2);
    /* All-gather of the E5M2 shard with its scale_inv. */
    all8 = make_tensor(ctx, FP8AMP_DTYPE_E5M2, 1, &k);
    scales = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &one);
    EXPECT_OK(fp8amp_comm_all_gather(comm, out8, all8, scales, NULL));
    EXPECT_OK(fp8amp_tensor_copy_to_host(all8, gathered, (size_t)k));
    EXPECT_OK(fp8amp_tensor_copy_to_host(scales, &si_got, 4));
    assert_memory_equal(gathered, codes, (size_t)k);
    assert_true(si_got == si2);
    EXPECT_STATUS(fp8amp_comm_all_gather(comm, out8, all8, NULL, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_all_gather(comm, in, all8, NULL, NULL), FP8AMP_ERROR_DTYPE_MISMATCH);
    EXPECT_STATUS(fp8amp_comm_all_gather(comm, out32, out32, NULL, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_tensor_destroy(in));
    EXPECT_OK(fp8amp_tensor_destroy(out32));
    EXPECT_OK(fp8amp_tensor_destroy(out8));
    EXPECT_OK(fp8amp_tensor_destroy(all8));
    EXPECT_OK(fp8amp_tensor_destroy(scales));
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
    free(x);
    free(got);
    free(v);
    free(xd);
    free(wm);
    free(codes);
    free(got8);
    free(gathered);
}

/* An inf input saturates on the wire (its amax is inf, so the scale stays 1) and is counted. */
static void test_saturation_counted(void **state) {
    require_variant(state);
    fp8amp_context ctx = make_context(variant_device(state));
    fp8amp_comm comm = make_comm(ctx);
    const int64_t n = 4;
    const float x[4] = {INFINITY, 1.0f, -1000.0f, 2.0f};
    fp8amp_tensor t = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    uint64_t sat = 0;
    float y[4];
    EXPECT_OK(fp8amp_tensor_copy_from_host(t, x, sizeof x));
    EXPECT_OK(fp8amp_comm_all_reduce(comm, 1, &t, &t, NULL));
    EXPECT_OK(fp8amp_comm_get_saturated(comm, &sat));
    assert_int_equal(sat, 2); /* inf and -1000 beyond 448 at scale 1 */
    EXPECT_OK(fp8amp_tensor_copy_to_host(t, y, sizeof y));
    assert_true(y[0] == 448.0f && y[2] == -448.0f);
    EXPECT_OK(fp8amp_tensor_destroy(t));
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

static void test_bad_arguments(void **state) {
    (void)state;
    fp8amp_context ctx = make_context(cpu_device());
    fp8amp_comm comm = make_comm(ctx), c2 = NULL;
    fp8amp_comm_unique_id id;
    const int64_t n = 16, m = 17;
    fp8amp_tensor a = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), b = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &m);
    fp8amp_tensor out = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n), raw8 = make_tensor(ctx, FP8AMP_DTYPE_E4M3, 1, &n);
    fp8amp_tensor dead = make_tensor(ctx, FP8AMP_DTYPE_F32, 1, &n);
    fp8amp_comm_reduce_desc desc;
    float before[16], after[16];
    int i;
    int32_t r;
    for (i = 0; i < 16; ++i) before[i] = (float)test_rng_uniform(-4, 4);
    EXPECT_OK(fp8amp_tensor_copy_from_host(a, before, sizeof before));
    EXPECT_OK(fp8amp_tensor_copy_from_host(out, before, sizeof before));
    EXPECT_OK(fp8amp_tensor_destroy(dead));

    /* Creation. */
    EXPECT_OK(fp8amp_comm_unique_id_create(ctx, &id));
    EXPECT_STATUS(fp8amp_comm_unique_id_create(ctx, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create(ctx, &id, 0, 0, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create(ctx, &id, 1, 1, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create(ctx, &id, 1, -1, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create(ctx, NULL, 1, 0, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create(ctx, &id, 1, 0, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_create((fp8amp_context)comm, &id, 1, 0, &c2), FP8AMP_ERROR_INVALID_HANDLE);
    {
        fp8amp_comm_unique_id junk;
        for (i = 0; i < FP8AMP_COMM_UNIQUE_ID_BYTES; ++i) junk.internal[i] = (char)test_rng_u64();
        EXPECT_STATUS(fp8amp_comm_create(ctx, &junk, 1, 0, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    }
    EXPECT_STATUS(fp8amp_comm_adopt(ctx, NULL, &c2), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_null(c2);

    /* Getters and setters. */
    EXPECT_OK(fp8amp_comm_rank(comm, &r));
    assert_int_equal(r, 0);
    EXPECT_OK(fp8amp_comm_size(comm, &r));
    assert_int_equal(r, 1);
    EXPECT_STATUS(fp8amp_comm_rank(comm, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_size((fp8amp_comm)a, &r), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_comm_set_timeout(comm, 0.0), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_set_timeout(comm, -1.0), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_set_timeout(comm, NAN), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_set_timeout(comm, INFINITY), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_comm_set_timeout(comm, 10.0));
    EXPECT_STATUS(fp8amp_comm_get_saturated(comm, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);

    /* The operations: each refusal leaves out as it was. */
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 0, &a, &out, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, NULL, &out, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, NULL, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &dead, &out, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_comm_all_reduce((fp8amp_comm)a, 1, &a, &out, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &b, &out, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &raw8, NULL), FP8AMP_ERROR_INVALID_ARGUMENT); /* no slot */
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &raw8, &out, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    {
        fp8amp_tensor ins[2] = {a, a}, outs[2] = {out, out};
        EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 2, ins, outs, NULL), FP8AMP_ERROR_INVALID_ARGUMENT); /* overlap */
    }
    {
        fp8amp_tensor ins[2] = {a, out}, outs[2] = {out, a}; /* each output is the other's input */
        EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 2, ins, outs, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    }
    EXPECT_OK(fp8amp_comm_reduce_desc_init_default(&desc));
    assert_int_equal(desc.struct_size, sizeof desc);
    assert_int_equal(desc.wire_dtype, FP8AMP_DTYPE_E4M3);
    assert_int_equal(desc.average, 1);
    assert_int_equal(desc.check, 1);
    desc.wire_dtype = FP8AMP_DTYPE_BF16;
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &out, &desc), FP8AMP_ERROR_DTYPE_MISMATCH);
    desc.wire_dtype = (fp8amp_dtype)77;
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &out, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_comm_reduce_desc_init_default(&desc));
    desc.average = 2;
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &out, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_OK(fp8amp_comm_reduce_desc_init_default(&desc));
    desc.struct_size = 3;
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &out, &desc), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_reduce_desc_init(&desc, 3), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_reduce_desc_init(NULL, sizeof desc), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_reduce_scatter(comm, b, out, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_STATUS(fp8amp_comm_reduce_scatter(comm, a, a, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_reduce_scatter(comm, a, raw8, NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    EXPECT_STATUS(fp8amp_comm_reduce_scatter(comm, dead, out, NULL), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_STATUS(fp8amp_comm_all_gather(comm, b, out, NULL, NULL), FP8AMP_ERROR_SHAPE_MISMATCH);
    EXPECT_OK(fp8amp_tensor_copy_to_host(out, after, sizeof after));
    assert_memory_equal(before, after, sizeof after);

    /* An aborted communicator fails with COMM from then on; destroy works, twice is a bad handle. */
    EXPECT_OK(fp8amp_comm_abort(comm));
    EXPECT_STATUS(fp8amp_comm_all_reduce(comm, 1, &a, &out, NULL), FP8AMP_ERROR_COMM);
    EXPECT_OK(fp8amp_tensor_copy_to_host(out, after, sizeof after));
    assert_memory_equal(before, after, sizeof after);
    EXPECT_OK(fp8amp_comm_destroy(comm));
    EXPECT_STATUS(fp8amp_comm_destroy(comm), FP8AMP_ERROR_INVALID_HANDLE);
    EXPECT_OK(fp8amp_comm_destroy(NULL));
    EXPECT_STATUS(fp8amp_comm_abort(comm), FP8AMP_ERROR_INVALID_HANDLE);

    /* (More ranks than the MPI world: tests/mpi/test_comm_mpi.c. Not here, where it would initialize
     * MPI, whose memory kept until exit LeakSanitizer reports.) */

    EXPECT_OK(fp8amp_tensor_destroy(a));
    EXPECT_OK(fp8amp_tensor_destroy(b));
    EXPECT_OK(fp8amp_tensor_destroy(out));
    EXPECT_OK(fp8amp_tensor_destroy(raw8));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_all_reduce_one_rank),
        DEVICE_TESTS(test_all_reduce_regions),
        DEVICE_TESTS(test_reduce_scatter_all_gather_one_rank),
        DEVICE_TESTS(test_saturation_counted),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
