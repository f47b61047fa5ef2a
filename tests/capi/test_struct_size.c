/* The option structs' size rules (docs/api.md 1.6): the sized init functions write exactly the
 * caller's size (canary bytes around every struct prove it), the FP8AMP_0 entry points write 0.1.0's
 * layout, and a struct of a newer header is accepted when its tail past this library's sizeof is
 * zero and refused with FP8AMP_ERROR_NOT_SUPPORTED otherwise -- by every function that takes an
 * option struct. */
#include "test_util.h"

/* The end of the fields this header knows: the init functions write zeros from there on. */
#define END_OF(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

/* C99 has no _Alignof. */
#define ALIGN_OF(type) offsetof(struct { char c; type t; }, t)

/* A caller's struct of up to 512 bytes (body) with 64 canary bytes on each side, 8-byte aligned. */
enum { CANARY = 64, ROOM = 512 };
typedef struct {
    uint64_t before[CANARY / 8];
    unsigned char body[ROOM];
    unsigned char after[CANARY];
} boxed;

static unsigned char g_canary[CANARY * 2 + ROOM];

/* Fills the whole box with fresh random bytes and remembers them. */
static void box_fill(boxed *b) {
    unsigned char *p = (unsigned char *)b;
    for (size_t i = 0; i < sizeof *b; ++i) p[i] = (unsigned char)(test_rng_u64() | 1u); /* never 0 */
    memcpy(g_canary, b, sizeof *b);
}

/* Asserts that nothing outside body[0, size) changed. */
static void box_check_outside(const boxed *b, size_t size) {
    const unsigned char *p = (const unsigned char *)b;
    for (size_t i = 0; i < sizeof *b; ++i) {
        const int inside = i >= CANARY && i < CANARY + size;
        if (!inside && p[i] != g_canary[i]) fail_msg("byte %d of the box (struct size %zu) was written", (int)i - CANARY, size);
    }
}

static void box_check_untouched(const boxed *b) { assert_memory_equal(b, g_canary, sizeof *b); }

typedef fp8amp_status (*sized_init_fn)(void *p, size_t size);
typedef fp8amp_status (*old_init_fn)(void *p);

/* Casts keep one table for the five structs; the functions take a pointer to their own struct. */
static fp8amp_status init_recipe(void *p, size_t n) { return fp8amp_recipe_init((fp8amp_recipe *)p, n); }
static fp8amp_status init_linear(void *p, size_t n) { return fp8amp_linear_desc_init((fp8amp_linear_desc *)p, n); }
static fp8amp_status init_adam(void *p, size_t n) { return fp8amp_adam_desc_init((fp8amp_adam_desc *)p, n); }
static fp8amp_status init_args(void *p, size_t n) { return fp8amp_adam_step_args_init((fp8amp_adam_step_args *)p, n); }
static fp8amp_status init_scaler(void *p, size_t n) { return fp8amp_grad_scaler_desc_init((fp8amp_grad_scaler_desc *)p, n); }
static fp8amp_status init_adam_o2(void *p, size_t n) {
    return fp8amp_opt_level_adam_init(FP8AMP_OPT_LEVEL_O2, (fp8amp_adam_desc *)p, n);
}
/* The FP8AMP_0 functions, named in parentheses (the plain spelling is the header's macro). */
static fp8amp_status old_recipe(void *p) { return (fp8amp_recipe_init_default)((fp8amp_recipe *)p); }
static fp8amp_status old_linear(void *p) { return (fp8amp_linear_desc_init_default)((fp8amp_linear_desc *)p); }
static fp8amp_status old_adam(void *p) { return (fp8amp_adam_desc_init_default)((fp8amp_adam_desc *)p); }
static fp8amp_status old_args(void *p) { return (fp8amp_adam_step_args_init_default)((fp8amp_adam_step_args *)p); }
static fp8amp_status old_scaler(void *p) { return (fp8amp_grad_scaler_desc_init_default)((fp8amp_grad_scaler_desc *)p); }
static fp8amp_status old_adam_o2(void *p) { return (fp8amp_opt_level_adam_config)(FP8AMP_OPT_LEVEL_O2, (fp8amp_adam_desc *)p); }

typedef struct {
    const char *name;
    sized_init_fn init;
    old_init_fn old_init;
    size_t size;        /* this header's sizeof */
    size_t end;         /* the end of its last field */
    size_t align;
    size_t released;    /* its size in 0.1.0 */
    size_t first;       /* an earlier layout's size also accepted, or 0 */
} struct_case;

static const struct_case cases[] = {
    {"fp8amp_recipe", init_recipe, old_recipe, sizeof(fp8amp_recipe), END_OF(fp8amp_recipe, power_of_two_scales),
     ALIGN_OF(fp8amp_recipe), 32, 0},
    {"fp8amp_linear_desc", init_linear, old_linear, sizeof(fp8amp_linear_desc), END_OF(fp8amp_linear_desc, graph_replay),
     ALIGN_OF(fp8amp_linear_desc), 80, offsetof(fp8amp_linear_desc, graph_replay)},
    {"fp8amp_adam_desc", init_adam, old_adam, sizeof(fp8amp_adam_desc), END_OF(fp8amp_adam_desc, rounding_seed),
     ALIGN_OF(fp8amp_adam_desc), 52, 0},
    {"fp8amp_adam_desc (O2)", init_adam_o2, old_adam_o2, sizeof(fp8amp_adam_desc), END_OF(fp8amp_adam_desc, rounding_seed),
     ALIGN_OF(fp8amp_adam_desc), 52, 0},
    {"fp8amp_adam_step_args", init_args, old_args, sizeof(fp8amp_adam_step_args), END_OF(fp8amp_adam_step_args, scaler),
     ALIGN_OF(fp8amp_adam_step_args), 32, 0},
    {"fp8amp_grad_scaler_desc", init_scaler, old_scaler, sizeof(fp8amp_grad_scaler_desc),
     END_OF(fp8amp_grad_scaler_desc, hysteresis), ALIGN_OF(fp8amp_grad_scaler_desc), 24, 0},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* The reference image: what the sized init writes for this header's size (fields compared, padding not). */
static void reference(const struct_case *c, unsigned char *out) {
    boxed b;
    box_fill(&b);
    EXPECT_OK(c->init(b.body, c->size));
    memcpy(out, b.body, c->size);
}

static uint32_t struct_size_of(const unsigned char *p) {
    uint32_t s;
    memcpy(&s, p, sizeof s);
    return s;
}

/* This header's size, an earlier layout, and sizes of newer headers: exactly `size` bytes written,
 * struct_size = size, the known fields the defaults, every byte past them zero. */
static void test_sized_init_writes_exactly_size(void **state) {
    (void)state;
    for (size_t k = 0; k < NCASES; ++k) {
        const struct_case *c = &cases[k];
        unsigned char ref[ROOM];
        reference(c, ref);
        assert_int_equal(struct_size_of(ref), c->size);
        const size_t newer[] = {c->size + c->align, c->size + 8 * c->align, ROOM};
        size_t sizes[5];
        size_t n = 0;
        sizes[n++] = c->size;
        if (c->first) sizes[n++] = c->first;
        for (size_t i = 0; i < 3; ++i) sizes[n++] = newer[i];
        for (size_t i = 0; i < n; ++i) {
            const size_t size = sizes[i];
            boxed b;
            box_fill(&b);
            EXPECT_OK(c->init(b.body, size));
            box_check_outside(&b, size);
            assert_int_equal(struct_size_of(b.body), size);
            const size_t known = size < c->end ? size : c->end;
            assert_memory_equal(b.body + 4, ref + 4, known - 4);
            for (size_t j = c->end; j < size; ++j)
                if (b.body[j] != 0) fail_msg("%s, size %zu: byte %zu past the fields is %d", c->name, size, j, b.body[j]);
        }
    }
}

static void test_sized_init_refuses_bad_sizes(void **state) {
    (void)state;
    for (size_t k = 0; k < NCASES; ++k) {
        const struct_case *c = &cases[k];
        const size_t bad[] = {0, 4, c->size - c->align, c->size + 1, 4097, 4104, (size_t)1 << 40};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
            if (bad[i] == c->first) continue;
            boxed b;
            box_fill(&b);
            const fp8amp_status st = c->init(b.body, bad[i]); /* those > ROOM are refused before any write */
            if (st != FP8AMP_ERROR_INVALID_ARGUMENT)
                fail_msg("%s, size %zu: %s, not INVALID_ARGUMENT", c->name, bad[i], fp8amp_status_name(st));
            assert_non_null(strstr(fp8amp_last_error_message(), "size"));
            box_check_untouched(&b);
        }
        assert_int_equal(c->init(NULL, c->size), FP8AMP_ERROR_INVALID_ARGUMENT);
    }
    /* the messages name the argument, the struct and the way out */
    fp8amp_recipe r;
    EXPECT_STATUS(fp8amp_recipe_init(&r, 8), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "size is 8"));
    assert_non_null(strstr(fp8amp_last_error_message(), "sizeof(fp8amp_recipe)"));
}

/* The FP8AMP_0 entry points write 0.1.0's layout -- which is what their callers have -- and nothing more. */
static void test_released_entry_points(void **state) {
    (void)state;
    for (size_t k = 0; k < NCASES; ++k) {
        const struct_case *c = &cases[k];
        unsigned char ref[ROOM];
        reference(c, ref);
        boxed b;
        box_fill(&b);
        EXPECT_OK(c->old_init(b.body));
        box_check_outside(&b, c->released);
        assert_int_equal(struct_size_of(b.body), c->released);
        /* the fields of the released layout (fp8amp_adam_desc grew past it in 0.4.0) */
        assert_memory_equal(b.body + 4, ref + 4, (c->end < c->released ? c->end : c->released) - 4);
        assert_int_equal(c->old_init(NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    }
    /* Their messages name them. */
    assert_int_equal((fp8amp_linear_desc_init_default)(NULL), FP8AMP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(fp8amp_last_error_message(), "fp8amp_linear_desc_init_default: desc is NULL"));
    /* fp8amp_opt_level_config of FP8AMP_0 too, both halves */
    boxed bl, ba;
    box_fill(&bl);
    memcpy(&ba, &bl, sizeof ba);
    EXPECT_OK((fp8amp_opt_level_config)(FP8AMP_OPT_LEVEL_O3, (fp8amp_linear_desc *)bl.body, NULL));
    box_check_outside(&bl, 80);
    box_fill(&ba);
    EXPECT_OK((fp8amp_opt_level_config)(FP8AMP_OPT_LEVEL_O3, NULL, (fp8amp_adam_desc *)ba.body));
    box_check_outside(&ba, 52);
    assert_int_equal(((fp8amp_adam_desc *)ba.body)->master_dtype, FP8AMP_DTYPE_F16);
    assert_int_equal(((fp8amp_linear_desc *)bl.body)->weight_dtype, FP8AMP_DTYPE_E4M3);
}

/* fp8amp_opt_level_init: each half exactly its size; a bad size of either writes neither. */
static void test_opt_level_init_sizes(void **state) {
    (void)state;
    boxed bl, ba;
    box_fill(&bl);
    box_fill(&ba);
    const size_t lsize = sizeof(fp8amp_linear_desc) + 16;
    unsigned char saved_l[sizeof bl];
    memcpy(saved_l, &bl, sizeof bl);
    EXPECT_OK(fp8amp_opt_level_init(FP8AMP_OPT_LEVEL_O2, (fp8amp_linear_desc *)bl.body, lsize,
                                     (fp8amp_adam_desc *)ba.body, sizeof(fp8amp_adam_desc) + 4));
    box_check_outside(&ba, sizeof(fp8amp_adam_desc) + 4);
    memcpy(g_canary, saved_l, sizeof bl);
    box_check_outside(&bl, lsize);
    assert_int_equal(((fp8amp_adam_desc *)ba.body)->exp_avg_dtype, FP8AMP_DTYPE_E4M3);
    assert_int_equal(((fp8amp_linear_desc *)bl.body)->weight_dtype, FP8AMP_DTYPE_F16);
    /* a bad Adam size: the Linear half is not written either */
    box_fill(&bl);
    memcpy(saved_l, &bl, sizeof bl);
    box_fill(&ba);
    EXPECT_STATUS(fp8amp_opt_level_init(FP8AMP_OPT_LEVEL_O1, (fp8amp_linear_desc *)bl.body, sizeof(fp8amp_linear_desc),
                                        (fp8amp_adam_desc *)ba.body, 6),
                  FP8AMP_ERROR_INVALID_ARGUMENT);
    box_check_untouched(&ba);
    assert_memory_equal(&bl, saved_l, sizeof bl);
    box_fill(&ba);
    EXPECT_STATUS(fp8amp_opt_level_init(FP8AMP_OPT_LEVEL_O1, (fp8amp_linear_desc *)bl.body, 12,
                                        (fp8amp_adam_desc *)ba.body, sizeof(fp8amp_adam_desc)),
                  FP8AMP_ERROR_INVALID_ARGUMENT);
    box_check_untouched(&ba);
    assert_memory_equal(&bl, saved_l, sizeof bl);
}

/* ---- the zero-tail rule, through every function that takes an option struct ------------------- */

typedef struct {
    fp8amp_context ctx;
    fp8amp_optimizer opt;
    fp8amp_tensor p, g;
} fixture;

static fixture make_fixture(void) {
    fixture f;
    f.ctx = make_context(cpu_device());
    fp8amp_adam_desc d;
    EXPECT_OK(fp8amp_adam_desc_init_default(&d));
    EXPECT_OK(fp8amp_optimizer_create(f.ctx, &d, &f.opt));
    const int64_t shape[1] = {37};
    f.p = make_tensor(f.ctx, FP8AMP_DTYPE_F32, 1, shape);
    f.g = make_tensor(f.ctx, FP8AMP_DTYPE_F32, 1, shape);
    float v[37];
    for (int i = 0; i < 37; ++i) v[i] = (float)test_rng_uniform(-1, 1);
    EXPECT_OK(fp8amp_tensor_copy_from_host(f.p, v, sizeof v));
    for (int i = 0; i < 37; ++i) v[i] = (float)test_rng_uniform(-1, 1);
    EXPECT_OK(fp8amp_tensor_copy_from_host(f.g, v, sizeof v));
    EXPECT_OK(fp8amp_optimizer_add_param(f.opt, f.p, f.g));
    return f;
}

static void free_fixture(fixture *f) {
    EXPECT_OK(fp8amp_optimizer_destroy(f->opt));
    EXPECT_OK(fp8amp_tensor_destroy(f->p));
    EXPECT_OK(fp8amp_tensor_destroy(f->g));
    EXPECT_OK(fp8amp_context_destroy(f->ctx));
}

/* Calls the function that takes struct k's struct (body, a caller's struct of its struct_size); on
 * success destroys what it made. Returns the status. */
static fp8amp_status use_struct(size_t k, fixture *f, void *body) {
    fp8amp_status st;
    void *made = NULL;
    switch (k) {
    case 0: st = fp8amp_scaling_create(f->ctx, body, FP8AMP_DTYPE_E4M3, (fp8amp_scaling *)&made); break;
    case 1:
        ((fp8amp_linear_desc *)body)->in_features = 16;
        ((fp8amp_linear_desc *)body)->out_features = 8;
        st = fp8amp_linear_create(f->ctx, body, (fp8amp_linear *)&made);
        break;
    case 2: case 3: st = fp8amp_optimizer_create(f->ctx, body, (fp8amp_optimizer *)&made); break;
    case 4: {
        int64_t before, after;
        EXPECT_OK(fp8amp_optimizer_get_step(f->opt, &before));
        st = fp8amp_optimizer_step(f->opt, body);
        EXPECT_OK(fp8amp_optimizer_get_step(f->opt, &after));
        assert_int_equal(after, before + (st == FP8AMP_SUCCESS ? 1 : 0));
        return st;
    }
    default: st = fp8amp_grad_scaler_create(f->ctx, body, (fp8amp_grad_scaler *)&made); break;
    }
    if (st == FP8AMP_SUCCESS) {
        assert_non_null(made);
        switch (k) {
        case 0: EXPECT_OK(fp8amp_scaling_destroy(made)); break;
        case 1: EXPECT_OK(fp8amp_linear_destroy(made)); break;
        case 2: case 3: EXPECT_OK(fp8amp_optimizer_destroy(made)); break;
        default: EXPECT_OK(fp8amp_grad_scaler_destroy(made)); break;
        }
    } else {
        assert_null(made); /* a failed call writes no handle */
    }
    return st;
}

static void test_newer_struct_zero_tail(void **state) {
    (void)state;
    fixture f = make_fixture();
    for (size_t k = 0; k < NCASES; ++k) {
        const struct_case *c = &cases[k];
        const size_t size = c->size + 8 * c->align;
        boxed b;
        box_fill(&b);
        EXPECT_OK(c->init(b.body, size)); /* what a newer caller gets from this library */
        const boxed clean = b;
        /* zero tail: accepted; this library's own tail padding (fp8amp_linear_desc's bytes 76..80) is
           padding to both sides (new fields begin at or after the old sizeof), so garbage there is too */
        for (size_t j = c->end; j < c->size; ++j) b.body[j] = (unsigned char)(test_rng_u64() | 1u);
        if (use_struct(k, &f, b.body) != FP8AMP_SUCCESS) fail_msg("%s: %s", c->name, fp8amp_last_error_message());
        /* bytes of the tail (both ends, two random ones), each with a random non-zero value */
        size_t where[4] = {c->size, size - 1, 0, 0};
        where[2] = c->size + (size_t)(test_rng_u64() % (size - c->size));
        where[3] = c->size + (size_t)(test_rng_u64() % (size - c->size));
        for (int w = 0; w < 4; ++w) {
            b = clean;
            b.body[where[w]] = (unsigned char)(test_rng_u64() % 255 + 1);
            const fp8amp_status st = use_struct(k, &f, b.body);
            if (st != FP8AMP_ERROR_NOT_SUPPORTED)
                fail_msg("%s with byte %zu of %zu set: %s, not NOT_SUPPORTED", c->name, where[w], size, fp8amp_status_name(st));
            const char *msg = fp8amp_last_error_message();
            char want[64];
            snprintf(want, sizeof want, "byte %zu is not zero", where[w]);
            if (!strstr(msg, want) || !strstr(msg, "struct_size is") || !strstr(msg, "does not support"))
                fail_msg("%s: message '%s' does not name the size and byte %zu", c->name, msg, where[w]);
        }
        /* a struct_size past any struct (an uninitialized struct) is refused, not read */
        b = clean;
        const uint32_t huge = 0x7fff0000u;
        memcpy(b.body, &huge, 4);
        assert_int_equal(use_struct(k, &f, b.body), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(fp8amp_last_error_message(), "an uninitialized struct?"));
    }
    free_fixture(&f);
}

/* fp8amp_linear_desc embeds fp8amp_recipe by value, so that copy's layout is frozen: its
 * struct_size must be sizeof(fp8amp_recipe) (a larger one would make the fields after it its tail). */
static void test_embedded_recipe_is_frozen(void **state) {
    (void)state;
    assert_int_equal(sizeof(fp8amp_recipe), 32);
    fp8amp_context ctx = make_context(cpu_device());
    fp8amp_linear_desc d;
    EXPECT_OK(fp8amp_linear_desc_init_default(&d));
    d.in_features = 8;
    d.out_features = 4;
    const uint32_t sizes[] = {0, 16, 36, 64};
    for (size_t i = 0; i < 4; ++i) {
        d.recipe.struct_size = sizes[i];
        fp8amp_linear lin = NULL;
        EXPECT_STATUS(fp8amp_linear_create(ctx, &d, &lin), FP8AMP_ERROR_INVALID_ARGUMENT);
        assert_null(lin);
        assert_non_null(strstr(fp8amp_last_error_message(), "desc->recipe.struct_size"));
    }
    d.recipe.struct_size = sizeof(fp8amp_recipe);
    fp8amp_linear lin = NULL;
    EXPECT_OK(fp8amp_linear_create(ctx, &d, &lin));
    EXPECT_OK(fp8amp_linear_destroy(lin));
    EXPECT_OK(fp8amp_context_destroy(ctx));
}

int main(void) {
    test_rng_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sized_init_writes_exactly_size),
        cmocka_unit_test(test_sized_init_refuses_bad_sizes),
        cmocka_unit_test(test_released_entry_points),
        cmocka_unit_test(test_opt_level_init_sizes),
        cmocka_unit_test(test_newer_struct_zero_tail),
        cmocka_unit_test(test_embedded_recipe_is_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
