/* A program of fp8amp's users, compiled by check.sh three times against three headers and run
 * against the library just built:
 *   - tests/abi/0.1.0/fp8amp/fp8amp.h (the last release): an old binary on the new library;
 *   - the current header: the reference run;
 *   - a "newer" header (-DABI_NEWER; newer_header.sh appends a field to every growable option
 *     struct): a binary of a later release on this, older, library.
 * Every option struct lives between canary bytes and is initialized and used: a recipe and a scaling
 * meta, the O2 preset, a Linear (forward and backward), an Adam optimizer and a step with its args,
 * a grad scaler. The program fails when any canary byte changed, and prints a digest of the results
 * (bit patterns), which check.sh compares between the three builds: the same library must compute
 * the same thing for all of them. The newer build also checks the zero-tail rule: its new fields are
 * zero after init and accepted, and a non-zero one is refused with FP8AMP_ERROR_NOT_SUPPORTED.
 * Usage: consumer SEED. C99. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8amp/fp8amp.h"

static int g_failed = 0;

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        fp8amp_status st_ = (call);                                                                  \
        if (st_ != FP8AMP_SUCCESS) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, fp8amp_status_name(st_), \
                    fp8amp_last_error_message());                                                    \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define EXPECT(cond)                                                                                 \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                      \
            g_failed = 1;                                                                            \
        }                                                                                            \
    } while (0)

/* xorshift64*: the data, from the seed check.sh draws per run (the same for the three builds). */
static uint64_t g_rng;
static uint64_t rng_u64(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) / 16777216.0 * 2.0 - 1.0); }

/* A descriptor with 32 canary bytes on each side (no padding: 32 is a multiple of every alignment). */
#define BOXED(T)                                                                                     \
    struct {                                                                                         \
        unsigned char pre[32];                                                                       \
        T d;                                                                                         \
        unsigned char post[32];                                                                      \
    }

/* Canary and garbage: the struct itself gets random bytes too, so init must set every field. */
static void box_fill(void *box, size_t n) {
    unsigned char *p = box;
    for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(0xA0 ^ i);
    /* its own stream: the three builds' structs differ in size, their data must not */
    static uint64_t junk = 0x9E3779B97F4A7C15ull;
    for (size_t i = 32; i < n - 32; ++i) {
        junk = junk * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (unsigned char)(junk >> 56);
    }
}
static void box_check(const void *box, size_t n, const char *what) {
    const unsigned char *p = box;
    for (size_t i = 0; i < n; ++i) {
        if ((i < 32 || i >= n - 32) && p[i] != (unsigned char)(0xA0 ^ i)) {
            fprintf(stderr, "%s: canary byte %d (relative to the struct) was written\n", what, (int)i - 32);
            g_failed = 1;
            return;
        }
    }
}
#define FILL(box) box_fill(&(box), sizeof(box))
#define CANARIES(box, what) box_check(&(box), sizeof(box), what)

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* FNV-1a over the results' bit patterns. */
static uint64_t g_digest = 1469598103934665603ull;
static void digest(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) g_digest = (g_digest ^ b[i]) * 1099511628211ull;
}

static fp8amp_tensor tensor2(fp8amp_context ctx, int64_t r, int64_t c) {
    const int64_t shape[2] = {r, c};
    fp8amp_tensor t;
    CHECK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, 2, shape, &t));
    return t;
}
static void fill_random(fp8amp_tensor t, float *host, size_t n) {
    for (size_t i = 0; i < n; ++i) host[i] = rng_uniform();
    CHECK(fp8amp_tensor_copy_from_host(t, host, n * sizeof(float)));
}

#ifdef ABI_NEWER
/* The newer header's struct must be accepted while its new field is 0 and refused once it is set:
 * `call` is the function taking it, `field` the new field (set to 1, then back to 0). */
#define NEWER_FIELD_REFUSED(field, call)                                                             \
    do {                                                                                             \
        EXPECT((field) == 0);                                                                        \
        (field) = 1;                                                                                 \
        fp8amp_status st_ = (call);                                                                  \
        EXPECT(st_ == FP8AMP_ERROR_NOT_SUPPORTED);                                                   \
        EXPECT(strstr(fp8amp_last_error_message(), "does not support") != NULL);                     \
        (field) = 0;                                                                                 \
    } while (0)
#endif

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: consumer SEED\n");
        return 2;
    }
    g_rng = strtoull(argv[1], NULL, 10) | 1u;
    /* A binary needs a library of its major and (unless it can live without its newer features) at
       least its minor: the newer build's header claims minor 99, so its library is older. */
#ifdef ABI_NEWER
    EXPECT(fp8amp_version() / 10000 == FP8AMP_VERSION_MAJOR && fp8amp_version() < FP8AMP_VERSION);
#else
    EXPECT(fp8amp_version() / 10000 == FP8AMP_VERSION_MAJOR && fp8amp_version() >= FP8AMP_VERSION);
#endif

    fp8amp_context ctx;
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    CHECK(fp8amp_context_create(cpu, &ctx));

    /* The recipe, and a scaling meta made from it. */
    BOXED(fp8amp_recipe) recipe;
    FILL(recipe);
    CHECK(fp8amp_recipe_init_default(&recipe.d));
    CANARIES(recipe, "fp8amp_recipe_init_default");
    EXPECT(recipe.d.struct_size == sizeof recipe.d && recipe.d.amax_history_len == 1024 && recipe.d.margin == 0);
    recipe.d.amax_history_len = 16;
    fp8amp_scaling meta;
    CHECK(fp8amp_scaling_create(ctx, &recipe.d, FP8AMP_DTYPE_E4M3, &meta));
    CANARIES(recipe, "fp8amp_scaling_create");

    /* The O2 preset, both halves. */
    BOXED(fp8amp_linear_desc) preset_l;
    BOXED(fp8amp_adam_desc) preset_a;
    FILL(preset_l);
    FILL(preset_a);
    CHECK(fp8amp_opt_level_config(FP8AMP_OPT_LEVEL_O2, &preset_l.d, &preset_a.d));
    CANARIES(preset_l, "fp8amp_opt_level_config (linear_desc)");
    CANARIES(preset_a, "fp8amp_opt_level_config (adam_desc)");
    EXPECT(preset_l.d.weight_dtype == FP8AMP_DTYPE_F16 && preset_a.d.exp_avg_dtype == FP8AMP_DTYPE_E4M3);
    BOXED(fp8amp_adam_desc) preset_a2;
    FILL(preset_a2);
    CHECK(fp8amp_opt_level_adam_config(FP8AMP_OPT_LEVEL_O3, &preset_a2.d));
    CANARIES(preset_a2, "fp8amp_opt_level_adam_config");
    EXPECT(preset_a2.d.master_dtype == FP8AMP_DTYPE_F16);

    /* A Linear of the default descriptor with the recipe above and F32 weights (so the weight the
       optimizer updates is exactly what the test writes). */
    enum { K = 32, N = 16, M = 8 };
    BOXED(fp8amp_linear_desc) ld;
    FILL(ld);
    CHECK(fp8amp_linear_desc_init_default(&ld.d));
    CANARIES(ld, "fp8amp_linear_desc_init_default");
    EXPECT(ld.d.struct_size == sizeof ld.d && ld.d.has_bias == 1 && ld.d.graph_replay == 1);
    ld.d.in_features = K;
    ld.d.out_features = N;
    ld.d.weight_dtype = FP8AMP_DTYPE_F32;
    ld.d.recipe = recipe.d;
    fp8amp_linear lin;
#ifdef ABI_NEWER
    NEWER_FIELD_REFUSED(ld.d.abi_newer_field, fp8amp_linear_create(ctx, &ld.d, &lin));
#endif
    CHECK(fp8amp_linear_create(ctx, &ld.d, &lin));
    CANARIES(ld, "fp8amp_linear_create");
    fp8amp_tensor w, b, gw, gb;
    CHECK(fp8amp_linear_weight(lin, &w));
    CHECK(fp8amp_linear_bias(lin, &b));
    CHECK(fp8amp_linear_weight_grad(lin, &gw));
    CHECK(fp8amp_linear_bias_grad(lin, &gb));
    static float host_w[N * K], host_b[N], host_x[M * K], host_dy[M * N], host_y[M * N], host_dx[M * K];
    fill_random(w, host_w, N * K);
    fill_random(b, host_b, N);
    fp8amp_tensor x = tensor2(ctx, M, K), y = tensor2(ctx, M, N), dy = tensor2(ctx, M, N), dx = tensor2(ctx, M, K);
    fill_random(x, host_x, M * K);
    fill_random(dy, host_dy, M * N);
    CHECK(fp8amp_linear_forward(lin, x, y, 1));
    CHECK(fp8amp_linear_backward(lin, dy, dx, 0));
    CHECK(fp8amp_tensor_copy_to_host(y, host_y, sizeof host_y));
    CHECK(fp8amp_tensor_copy_to_host(dx, host_dx, sizeof host_dx));
    for (int i = 0; i < M * N; ++i) EXPECT(isfinite(host_y[i]));
    digest(host_y, sizeof host_y);
    digest(host_dx, sizeof host_dx);

    /* The loss scaler. */
    BOXED(fp8amp_grad_scaler_desc) sd;
    FILL(sd);
    CHECK(fp8amp_grad_scaler_desc_init_default(&sd.d));
    CANARIES(sd, "fp8amp_grad_scaler_desc_init_default");
    EXPECT(sd.d.struct_size == sizeof sd.d && sd.d.init_scale == 65536.0f && sd.d.hysteresis == 1);
    sd.d.init_scale = 1.0f; /* the gradients above are not scaled */
    fp8amp_grad_scaler scaler;
#ifdef ABI_NEWER
    NEWER_FIELD_REFUSED(sd.d.abi_newer_field, fp8amp_grad_scaler_create(ctx, &sd.d, &scaler));
#endif
    CHECK(fp8amp_grad_scaler_create(ctx, &sd.d, &scaler));
    CANARIES(sd, "fp8amp_grad_scaler_create");

    /* Adam over the Linear's weight and bias, one step with the scaler. */
    BOXED(fp8amp_adam_desc) ad;
    FILL(ad);
    CHECK(fp8amp_adam_desc_init_default(&ad.d));
    CANARIES(ad, "fp8amp_adam_desc_init_default");
    EXPECT(ad.d.struct_size == sizeof ad.d && ad.d.adamw == 1 && ad.d.state_block_size == 128);
    ad.d.lr = 1e-2f;
    fp8amp_optimizer opt;
#ifdef ABI_NEWER
    NEWER_FIELD_REFUSED(ad.d.abi_newer_field, fp8amp_optimizer_create(ctx, &ad.d, &opt));
#endif
    CHECK(fp8amp_optimizer_create(ctx, &ad.d, &opt));
    CANARIES(ad, "fp8amp_optimizer_create");
    CHECK(fp8amp_optimizer_add_param(opt, w, gw));
    CHECK(fp8amp_optimizer_add_param(opt, b, gb));

    BOXED(fp8amp_adam_step_args) args;
    FILL(args);
    CHECK(fp8amp_adam_step_args_init_default(&args.d));
    CANARIES(args, "fp8amp_adam_step_args_init_default");
    EXPECT(args.d.struct_size == sizeof args.d && args.d.lr < 0 && args.d.grad_scale_inv == 1.0f &&
           args.d.scaler == NULL && args.d.lr_device == NULL);
    args.d.scaler = scaler;
    int64_t steps = -1;
#ifdef ABI_NEWER
    NEWER_FIELD_REFUSED(args.d.abi_newer_field, fp8amp_optimizer_step(opt, &args.d));
    CHECK(fp8amp_optimizer_get_step(opt, &steps));
    EXPECT(steps == 0); /* the refused step did nothing */
#endif
    CHECK(fp8amp_optimizer_step(opt, &args.d));
    CANARIES(args, "fp8amp_optimizer_step");
    int32_t found_inf = -1;
    float norm = 0, scale = 0;
    CHECK(fp8amp_optimizer_get_found_inf(opt, &found_inf));
    CHECK(fp8amp_optimizer_get_step(opt, &steps));
    CHECK(fp8amp_optimizer_get_grad_norm(opt, &norm));
    CHECK(fp8amp_grad_scaler_get_scale(scaler, &scale));
    EXPECT(found_inf == 0 && steps == 1 && isfinite(norm) && norm > 0 && scale == 1.0f);
    static float host_w2[N * K];
    CHECK(fp8amp_tensor_copy_to_host(w, host_w2, sizeof host_w2));
    int moved = 0;
    for (int i = 0; i < N * K; ++i) moved += host_w2[i] != host_w[i];
    EXPECT(moved > N * K / 2); /* Adam moves (almost) every weight by about lr */
    const uint32_t norm_bits = bits(norm);
    digest(&norm_bits, 4);
    digest(host_w2, sizeof host_w2);

    /* The metas made from the recipe: the Linear's INPUT meta (delayed scaling, history of 16) turns
       the amax its forward recorded into a scale; the standalone one takes a set scale. */
    fp8amp_scaling input_meta;
    CHECK(fp8amp_linear_scaling(lin, FP8AMP_ROLE_INPUT, &input_meta));
    CHECK(fp8amp_scaling_update(input_meta));
    float sc[3];
    CHECK(fp8amp_scaling_get(input_meta, &sc[0], &sc[1], &sc[2]));
    EXPECT(sc[0] > 1.0f && isfinite(sc[0])); /* 448 / amax of |x| <= 1 */
    float hist[16];
    CHECK(fp8amp_scaling_get_history(input_meta, 16, hist));
    digest(sc, sizeof sc);
    digest(hist, sizeof hist);
    CHECK(fp8amp_scaling_destroy(input_meta));
    CHECK(fp8amp_scaling_set_scale(meta, 4.0f));
    CHECK(fp8amp_scaling_get(meta, &sc[0], &sc[1], &sc[2]));
    EXPECT(sc[0] == 4.0f && sc[1] == 0.25f);

    /* The updated Linear again (its weight changed through the optimizer). */
    CHECK(fp8amp_linear_forward(lin, x, y, 1));
    CHECK(fp8amp_tensor_copy_to_host(y, host_y, sizeof host_y));
    digest(host_y, sizeof host_y);

    CHECK(fp8amp_optimizer_destroy(opt));
    CHECK(fp8amp_grad_scaler_destroy(scaler));
    CHECK(fp8amp_scaling_destroy(meta));
    const fp8amp_tensor ts[8] = {w, b, gw, gb, x, y, dy, dx};
    for (int i = 0; i < 8; ++i) CHECK(fp8amp_tensor_destroy(ts[i]));
    CHECK(fp8amp_linear_destroy(lin));
    CHECK(fp8amp_context_destroy(ctx));
    printf("digest %016llx\n", (unsigned long long)g_digest);
    if (g_failed) fprintf(stderr, "consumer: FAILED\n");
    return g_failed;
}
