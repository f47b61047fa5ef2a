/* The fused activations' vectorized CUDA paths, byte for byte against the CPU reference:
 * - the fused transpose: fp8amp_activation_forward / _backward with an out_t write the transposed
 *   FP8 copy from the same kernel (64 x 64 tiles); the CPU computes y, then transposes it;
 * - BF16 inputs (x and dy), which take the 8-wide vector kernels, with and without out_t, into
 *   E4M3, E5M2 and the wide dtypes, delayed and current scaling;
 * - odd shapes (rows and columns not multiples of 4, 8, 16 or 64: edge tiles, the n % 8 tail) and
 *   unaligned buffers (views at odd byte offsets: the per-element paths).
 * Fresh random data with NaN, +-inf, tiny and large values. GPU tests: SKIPPED without a GPU. */
#include <math.h>

#include "fp8_reference.h"
#include "test_util.h"

enum { GELU = FP8AMP_ACTIVATION_GELU_TANH, SILU = FP8AMP_ACTIVATION_SILU, SWIGLU = FP8AMP_ACTIVATION_SWIGLU };

static void put_value(fp8amp_dtype d, void *buf, size_t i, double v) {
    if (d == FP8AMP_DTYPE_F32) {
        ((float *)buf)[i] = (float)v;
        return;
    }
    const format_t *f = format_of(d);
    set_code(d, buf, i, code_of_value_ref(f, round_ref(f, v)));
}

/* Mostly [-8, 8]; some tiny, large, zero, and (rarely) NaN and +-inf. */
static void gen(fp8amp_dtype dt, void *buf, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = test_rng_u64() % 200;
        double v = test_rng_uniform(lo, hi);
        if (r < 8) v = ldexp(test_rng_uniform(-1.0, 1.0), -(int)(test_rng_u64() % 30));
        else if (r < 14) v = test_rng_uniform(-120.0, 120.0);
        else if (r < 16) v = 0.0;
        else if (r == 16) v = NAN;
        else if (r == 17) v = (test_rng_u64() & 1) ? INFINITY : -INFINITY;
        put_value(dt, buf, i, v);
    }
}

typedef struct {
    void *out, *out_t;
    float scale, scale_inv, amax, slot, slot_t;
    fp8amp_scaling_stats stats;
} run_t;

static void run_free(run_t *r) {
    free(r->out);
    free(r->out_t);
}

/* A device tensor of `shape` whose data starts `offset` bytes into a bigger buffer (offset 0: a
 * plain tensor). *owner gets the buffer's tensor (NULL when offset is 0). */
static fp8amp_tensor tensor_at(fp8amp_context ctx, fp8amp_dtype dt, const int64_t shape[2], size_t offset,
                               const void *host, fp8amp_tensor *owner) {
    *owner = NULL;
    if (offset == 0) return tensor_from_host(ctx, dt, 2, shape, host);
    const size_t bytes = (size_t)(shape[0] * shape[1]) * fp8amp_dtype_size(dt);
    const int64_t big[1] = {(int64_t)(bytes + offset + 64)};
    EXPECT_OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, big, owner));
    void *base;
    EXPECT_OK(fp8amp_tensor_data(*owner, &base));
    fp8amp_tensor t;
    EXPECT_OK(fp8amp_tensor_wrap(ctx, dt, 2, shape, (char *)base + offset, &t));
    if (host) EXPECT_OK(fp8amp_tensor_copy_from_host(t, host, bytes));
    return t;
}

/* Byte offsets of x, dy, out and out_t inside bigger buffers (multiples of the element size). */
typedef struct {
    size_t x, dy, out, out_t;
} offsets_t;

/* Set: the FP8 runs' metas count no statistics (the kernels' production path), else they do. */
static int g_stats_off = 0;
/* Set: check_problem's x lies in [-8, 0.49] (and tiny values), no NaN or inf. */
static int g_x_below_half = 0;

/* One forward (dy NULL) or backward on `device`; FP8 out with a fresh meta (mode, scale) and,
 * with_t, its transpose. */
static void run_act(fp8amp_device device, int kind, int64_t rows, int64_t cols, fp8amp_dtype x_dt, const void *x,
                    fp8amp_dtype dy_dt, const void *dy, fp8amp_dtype out_dt, fp8amp_scaling_mode mode, float scale,
                    int with_t, offsets_t off, run_t *res) {
    memset(res, 0, sizeof *res);
    const int64_t in_cols = kind == SWIGLU ? 2 * cols : cols, out_cols = dy ? in_cols : cols;
    fp8amp_context ctx;
    EXPECT_OK(fp8amp_context_create(device, &ctx));
    const int64_t xs[2] = {rows, in_cols}, ys[2] = {rows, cols}, os[2] = {rows, out_cols}, ts[2] = {out_cols, rows};
    fp8amp_tensor owners[4];
    fp8amp_tensor tx = tensor_at(ctx, x_dt, xs, off.x, x, &owners[0]);
    fp8amp_tensor tdy = dy ? tensor_at(ctx, dy_dt, ys, off.dy, dy, &owners[1]) : NULL;
    if (!dy) owners[1] = NULL;
    const size_t nbytes = (size_t)(rows * out_cols) * fp8amp_dtype_size(out_dt);
    void *poison = xmalloc(nbytes);
    memset(poison, 0xA5, nbytes);
    fp8amp_tensor out = tensor_at(ctx, out_dt, os, off.out, poison, &owners[2]), out_t = NULL;
    owners[3] = NULL;
    const int fp8 = out_dt == FP8AMP_DTYPE_E4M3 || out_dt == FP8AMP_DTYPE_E5M2;
    fp8amp_scaling s = NULL;
    if (fp8) {
        s = counting_meta(ctx, out_dt, mode, scale);
        if (g_stats_off) EXPECT_OK(fp8amp_scaling_enable_stats(s, 0));
        EXPECT_OK(fp8amp_tensor_set_scaling(out, s));
        if (with_t) {
            out_t = tensor_at(ctx, out_dt, ts, off.out_t, poison, &owners[3]);
            EXPECT_OK(fp8amp_tensor_set_scaling(out_t, s));
        }
    }
    free(poison);
    if (dy)
        EXPECT_OK(fp8amp_activation_backward(ctx, (fp8amp_activation)kind, tdy, tx, out, out_t));
    else
        EXPECT_OK(fp8amp_activation_forward(ctx, (fp8amp_activation)kind, tx, out, out_t));
    res->out = tensor_to_host(out);
    if (out_t) res->out_t = tensor_to_host(out_t);
    if (s) {
        EXPECT_OK(fp8amp_scaling_get(s, &res->scale, &res->scale_inv, &res->amax));
        EXPECT_OK(fp8amp_scaling_get_stats(s, &res->stats));
        fp8amp_tensor si;
        EXPECT_OK(fp8amp_tensor_scale_inv(out, &si));
        EXPECT_OK(fp8amp_tensor_copy_to_host(si, &res->slot, 4));
        EXPECT_OK(fp8amp_tensor_destroy(si));
        if (out_t) {
            EXPECT_OK(fp8amp_tensor_scale_inv(out_t, &si));
            EXPECT_OK(fp8amp_tensor_copy_to_host(si, &res->slot_t, 4));
            EXPECT_OK(fp8amp_tensor_destroy(si));
        }
        EXPECT_OK(fp8amp_scaling_destroy(s));
    }
    fp8amp_tensor all[4] = {tx, tdy, out, out_t};
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(all[i]));
    for (int i = 0; i < 4; ++i) EXPECT_OK(fp8amp_tensor_destroy(owners[i]));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

typedef struct {
    int64_t rows, cols;
} shape_t;

/* Full 64 x 64 tiles and edges of every kind: rows % 4 != 0 or cols % 8 != 0 (no fast tile: 257 x 136,
 * 132 x 60, 64 x 4100), partial row and column tiles next to fast ones (100 x 96, 68 x 200, 256 x 136,
 * 128 x 520), SwiGLU halves that are not multiples of 64 (cols % 8 == 0 for its vector path, or not),
 * the GELU/SiLU n % 8 tail of the streaming kernel, single rows and columns. */
static const shape_t kShapes[] = {{64, 64},  {128, 192}, {100, 96}, {68, 200}, {17, 1023}, {3, 8},    {1, 8},
                                  {4, 8},    {257, 136}, {256, 136}, {8, 4104}, {192, 72}, {5, 13},    {132, 60},
                                  {1, 1},    {64, 4100}, {128, 520}};
#define NSHAPES (sizeof kShapes / sizeof kShapes[0])

static void compare(const run_t *a, const run_t *b, size_t n, size_t elem, int fp8, int with_t, const char *what) {
    if (memcmp(a->out, b->out, n * elem) != 0 || (with_t && memcmp(a->out_t, b->out_t, n) != 0)) {
        print_error("%s: CPU and CUDA differ\n", what);
        fail();
    }
    if (fp8) {
        assert_true(f32_bits(a->amax) == f32_bits(b->amax));
        assert_true(f32_bits(a->scale) == f32_bits(b->scale));
        assert_true(f32_bits(a->scale_inv) == f32_bits(b->scale_inv));
        assert_true(f32_bits(a->slot) == f32_bits(b->slot));
        if (with_t) assert_true(f32_bits(a->slot_t) == f32_bits(b->slot_t) && f32_bits(b->slot_t) == f32_bits(b->slot));
        assert_memory_equal(&a->stats, &b->stats, sizeof a->stats);
    }
}

/* One problem on both devices (CUDA with the given offsets), compared byte for byte; the CPU's
 * transpose is also checked against its own out. */
static void check_problem(int kind, int64_t rows, int64_t cols, fp8amp_dtype x_dt, fp8amp_dtype dy_dt, int backward,
                          fp8amp_dtype out_dt, fp8amp_scaling_mode mode, int with_t, offsets_t off) {
    const int64_t in_cols = kind == SWIGLU ? 2 * cols : cols, out_cols = backward ? in_cols : cols;
    const size_t n = (size_t)(rows * out_cols);
    void *x = xmalloc((size_t)(rows * in_cols) * 4), *dy = xmalloc((size_t)(rows * cols) * 4);
    if (g_x_below_half) {
        for (size_t i = 0; i < (size_t)(rows * in_cols); ++i) /* no NaN, no inf: the amax is a value */
            put_value(x_dt, x, i,
                      test_rng_u64() % 16 ? test_rng_uniform(-8.0, 0.49)
                                          : ldexp(test_rng_uniform(-1.0, 1.0), -(int)(test_rng_u64() % 30)));
    } else {
        gen(x_dt, x, (size_t)(rows * in_cols), -8.0, 8.0);
    }
    gen(dy_dt, dy, (size_t)(rows * cols), -2.0, 2.0);
    const float scale = (float)ldexp(test_rng_uniform(1.0, 2.0), (int)(test_rng_u64() % 10) - 2);
    const int fp8 = out_dt == FP8AMP_DTYPE_E4M3 || out_dt == FP8AMP_DTYPE_E5M2;
    const offsets_t none = {0, 0, 0, 0};
    run_t a, b;
    run_act(cpu_device(), kind, rows, cols, x_dt, x, dy_dt, backward ? dy : NULL, out_dt, mode, scale, with_t, none, &a);
    run_act(cuda_device(0), kind, rows, cols, x_dt, x, dy_dt, backward ? dy : NULL, out_dt, mode, scale, with_t, off, &b);
    char what[160];
    snprintf(what, sizeof what, "kind %d %s %lldx%lld x dtype %d out dtype %d mode %d with_t %d offsets %zu/%zu/%zu/%zu",
             kind, backward ? "backward" : "forward", (long long)rows, (long long)cols, (int)x_dt, (int)out_dt, (int)mode,
             with_t, off.x, off.dy, off.out, off.out_t);
    compare(&a, &b, n, fp8amp_dtype_size(out_dt), fp8, with_t, what);
    if (with_t) /* the CPU reference's transpose is the transpose of its y */
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < out_cols; ++c)
                assert_int_equal(((uint8_t *)a.out_t)[c * rows + r], ((uint8_t *)a.out)[r * out_cols + c]);
    run_free(&a);
    run_free(&b);
    free(x);
    free(dy);
}

/* BF16 inputs: the vector kernels, the fused transpose on every shape. */
static void test_bf16_fused_transpose_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    for (int kind = 0; kind < 3; ++kind)
        for (size_t s = 0; s < NSHAPES; ++s)
            for (int backward = 0; backward < 2; ++backward) {
                const fp8amp_dtype dt = ((s + (size_t)kind + (size_t)backward) & 1) ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3;
                const fp8amp_scaling_mode mode = (s + (size_t)backward) % 3 == 0 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
                check_problem(kind, kShapes[s].rows, kShapes[s].cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward, dt,
                              mode, 1, none);
            }
}

/* BF16 inputs with the fused transpose, large enough that a block of the persistent grid (4-5 blocks
 * an SM on an H100/H200) takes several 64 x 64 tiles one after another: the forwards' input ring
 * (the next tile's cp.async copies issued before this tile's math) wraps, fast tiles follow edge
 * tiles and the other way round (4100 x 2056: a last row of 4-row tiles and a last column of
 * 8-column tiles; 2048 x 4096: fast tiles only), and under current scaling the tiles are taken last
 * to first. */
static void test_bf16_fused_transpose_large_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    const shape_t shapes[2] = {{4100, 2056}, {2048, 4096}};
    for (int kind = 0; kind < 3; ++kind)
        for (int backward = 0; backward < 2; ++backward)
            for (int s = 0; s < 2; ++s) {
                const int current = (kind + backward + s) % 2;
                g_stats_off = !current;
                check_problem(kind, shapes[s].rows, shapes[s].cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                              backward ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3,
                              current ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED, 1, none);
                g_stats_off = 0;
            }
}

/* BF16 inputs without a transpose: the streaming kernel, into FP8 and the wide dtypes. */
static void test_bf16_stream_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    const fp8amp_dtype outs[5] = {FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_E5M2, FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F16};
    for (int kind = 0; kind < 3; ++kind)
        for (size_t s = 0; s < NSHAPES; ++s)
            for (int backward = 0; backward < 2; ++backward)
                for (int o = 0; o < 5; ++o) {
                    const fp8amp_scaling_mode mode = (o + (int)s) % 2 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED;
                    check_problem(kind, kShapes[s].rows, kShapes[s].cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                                  outs[o], mode, 0, none);
                }
}

/* BF16 inputs large enough that the streaming kernel's threads take whole packs of groups (4 groups
 * of 8 elements per step in the forwards, 2 in the backwards: the persistent grid of an H100/H200
 * runs at most ~2^18 threads, so with 2^20 groups most threads take whole packs) as well as single
 * groups and the n % 8 tail (GELU/SiLU forwards 4096 x 2055). An input NaN or -inf (1 element in 100)
 * makes a NaN output, so about a quarter of the 32-element packs take the pack's NaN fix-up and the
 * others the fast path. FP8 out under delayed scaling without statistics (the production path),
 * under current scaling (the amax-only pass) with statistics, and a wide out. */
static void test_bf16_stream_large_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    for (int kind = 0; kind < 3; ++kind)
        for (int backward = 0; backward < 2; ++backward) {
            const int64_t cols = kind == SWIGLU || backward ? 2056 : 2055;
            g_stats_off = 1;
            check_problem(kind, 4096, cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward, FP8AMP_DTYPE_E4M3,
                          FP8AMP_SCALING_DELAYED, 0, none);
            g_stats_off = 0;
            check_problem(kind, 4096, cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward, FP8AMP_DTYPE_E5M2,
                          FP8AMP_SCALING_CURRENT, 0, none);
            check_problem(kind, 4096, cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward, FP8AMP_DTYPE_BF16,
                          FP8AMP_SCALING_DELAYED, 0, none);
        }
}

/* BF16 inputs large enough that the streaming kernel's threads take many groups, in packs and a
 * last partial round: the persistent grid of an H100/H200 runs ~1.7-2.6 x 10^5 threads, so these
 * 1.0-3.1 x 10^6 groups of 8 give a thread 4 to 18 groups, and a launch's threads two neighbouring
 * counts (the four sizes a kind runs: different remainders). Built with the optional input ring
 * (kernels/cuda/activation.cu, FP8AMP_ACTIVATION_PIPELINE=1: cp.async copies of a thread's next
 * steps issued before this step's math) that ring wraps several times and ends with partial steps
 * (missing groups zero-filled, computed, never stored nor counted). The n % 8 tail too (GELU/SiLU
 * forwards of odd rows and columns). FP8 under delayed scaling without statistics (the production
 * path) on every size; under current scaling with statistics on one (the amax-only pass first, then
 * the writing pass walking the groups last to first); a wide out on one. */
static void test_bf16_stream_pipeline_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    /* rows x cols: out elements / 8 = 1.05, 1.57, 2.10 and 3.07 x 10^6 groups (GELU/SiLU forwards:
     * odd rows and cols, an n % 8 tail; the others cols % 8 == 0, SwiGLU's vector condition). */
    const shape_t odd[4] = {{2047, 4099}, {3071, 4095}, {4095, 4097}, {3001, 8191}}; /* n % 8: 5, 1, 7, 7 */
    const shape_t even[4] = {{2048, 4096}, {3072, 4088}, {4096, 4104}, {3000, 8192}};
    for (int kind = 0; kind < 3; ++kind)
        for (int backward = 0; backward < 2; ++backward)
            for (int s = 0; s < 4; ++s) {
                /* the largest size for the GELU forward only: it keeps the CPU reference's time down */
                if ((backward || kind != GELU) && s == 3) continue;
                const shape_t sh = kind != SWIGLU && !backward ? odd[s] : even[s];
                g_stats_off = 1;
                check_problem(kind, sh.rows, sh.cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                              s % 2 ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_DELAYED, 0, none);
                g_stats_off = 0;
                if (s == 1)
                    check_problem(kind, sh.rows, sh.cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                                  FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_CURRENT, 0, none);
                if (s == 0 && kind == (backward ? SILU : GELU))
                    check_problem(kind, sh.rows, sh.cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                                  FP8AMP_DTYPE_BF16, FP8AMP_SCALING_DELAYED, 0, none);
            }
}

/* The current-scaling amax pass of the GELU/SiLU forwards with BF16 x (stream_kernel) takes a
 * thread's amax from its largest input when that is at least 0.5 (test_activation.c,
 * test_amax_from_extremes_holds, checks why that is exact); with inputs all below 0.5 every thread
 * evaluates f of each element instead. That path, byte for byte against the CPU (amax, scale, codes),
 * small shapes and whole packs; the other tests cover the first (and an input NaN or -inf). */
static void test_bf16_current_amax_inputs_below_half(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t none = {0, 0, 0, 0};
    const shape_t shapes[4] = {{17, 1023}, {64, 64}, {5, 13}, {4096, 2055}};
    g_x_below_half = 1;
    for (int kind = 0; kind < 2; ++kind)
        for (int s = 0; s < 4; ++s)
            check_problem(kind, shapes[s].rows, shapes[s].cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, 0,
                          s % 2 ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3, FP8AMP_SCALING_CURRENT, 0, none);
    g_x_below_half = 0;
}

/* Unaligned buffers (the per-element paths of the tile kernel, the generic kernel) and inputs of
 * other dtypes (F32, F16, BF16 x with F32 dy: the generic kernel and the separate transpose). */
static void test_unaligned_and_other_dtypes_match_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_CUDA();
    const offsets_t offs[5] = {{0, 0, 1, 0}, {0, 0, 0, 1}, {0, 0, 0, 2}, {2, 0, 0, 0}, {0, 2, 3, 1}};
    const shape_t shapes[3] = {{128, 192}, {68, 200}, {64, 64}};
    for (int kind = 0; kind < 3; ++kind)
        for (int backward = 0; backward < 2; ++backward) {
            for (int i = 0; i < 5; ++i)
                for (int s = 0; s < 3; ++s) {
                    offsets_t off = offs[i];
                    if (!backward) off.dy = 0;
                    check_problem(kind, shapes[s].rows, shapes[s].cols, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, backward,
                                  (i & 1) ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3,
                                  i % 2 ? FP8AMP_SCALING_CURRENT : FP8AMP_SCALING_DELAYED, 1, off);
                }
            const offsets_t none = {0, 0, 0, 0};
            const fp8amp_dtype xs[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16};
            const fp8amp_dtype dys[3] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_F32};
            for (int d = 0; d < 3; ++d)
                for (int s = 0; s < 3; ++s)
                    check_problem(kind, shapes[s].rows, shapes[s].cols, xs[d], dys[d], backward, FP8AMP_DTYPE_E4M3,
                                  FP8AMP_SCALING_DELAYED, 1, none);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_fused_transpose_matches_cpu),
        cmocka_unit_test(test_bf16_fused_transpose_large_matches_cpu),
        cmocka_unit_test(test_bf16_stream_matches_cpu),
        cmocka_unit_test(test_bf16_stream_large_matches_cpu),
        cmocka_unit_test(test_bf16_stream_pipeline_matches_cpu),
        cmocka_unit_test(test_bf16_current_amax_inputs_below_half),
        cmocka_unit_test(test_unaligned_and_other_dtypes_match_cpu),
    };
    return run_tests_sharded(tests, sizeof tests / sizeof tests[0], test_setup_rng, NULL);
}
