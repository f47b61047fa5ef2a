/* Using libfp8amp without linking it: how a framework that cannot link at build time (a plugin
 * loaded into a host program, a language runtime with its own loader) reaches the library.
 *
 *   cc -std=c99 -I<prefix>/include fp8amp_dlopen.c -ldl -o fp8amp_dlopen     (no -lfp8amp)
 *   ./fp8amp_dlopen [LIBRARY]        LIBRARY defaults to "libfp8amp.so.0", found by the loader
 *
 * It dlopens the library by its SONAME (or the path given), checks that fp8amp_version()'s major
 * equals the major of the header it was compiled with (FP8AMP_VERSION_MAJOR: a new major is a new
 * ABI) and that the library's minor is not older than the header's, fills a table of the functions it
 * uses with dlsym -- refusing, by name, a symbol that is missing -- and runs a small quantize /
 * dequantize round trip on the CPU. The header is used for its types and constants only; every call
 * goes through the table. Exits 0 on success, 1 with a message on stderr otherwise.
 * Test: ctest example.dlopen (and example.dlopen_missing for the failing path). */
#include <fp8amp/fp8amp.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The functions this program calls, as pointers of the header's own prototypes: a prototype that
 * changed in the header would not compile here. */
struct fp8amp_api {
    uint32_t (*version)(void);
    const char *(*status_name)(fp8amp_status);
    const char *(*last_error_message)(void);
    fp8amp_status (*context_create)(fp8amp_device, fp8amp_context *);
    fp8amp_status (*context_destroy)(fp8amp_context);
    fp8amp_status (*tensor_create)(fp8amp_context, fp8amp_dtype, int32_t, const int64_t *, fp8amp_tensor *);
    fp8amp_status (*tensor_destroy)(fp8amp_tensor);
    fp8amp_status (*tensor_copy_from_host)(fp8amp_tensor, const void *, size_t);
    fp8amp_status (*tensor_copy_to_host)(fp8amp_tensor, void *, size_t);
    fp8amp_status (*tensor_set_scaling)(fp8amp_tensor, fp8amp_scaling);
    fp8amp_status (*recipe_init)(fp8amp_recipe *, size_t);
    fp8amp_status (*scaling_create)(fp8amp_context, const fp8amp_recipe *, fp8amp_dtype, fp8amp_scaling *);
    fp8amp_status (*scaling_destroy)(fp8amp_scaling);
    fp8amp_status (*scaling_get)(fp8amp_scaling, float *, float *, float *);
    fp8amp_status (*quantize)(fp8amp_context, fp8amp_tensor, fp8amp_tensor);
    fp8amp_status (*dequantize)(fp8amp_context, fp8amp_tensor, fp8amp_tensor);
};

/* Name and slot of every entry: the loader fills them all or refuses. */
#define ENTRY(name) {"fp8amp_" #name, offsetof(struct fp8amp_api, name)}
static const struct {
    const char *symbol;
    size_t offset;
} entries[] = {
    ENTRY(version),        ENTRY(status_name),    ENTRY(last_error_message), ENTRY(context_create),
    ENTRY(context_destroy), ENTRY(tensor_create), ENTRY(tensor_destroy),     ENTRY(tensor_copy_from_host),
    ENTRY(tensor_copy_to_host), ENTRY(tensor_set_scaling), ENTRY(recipe_init), ENTRY(scaling_create),
    ENTRY(scaling_destroy), ENTRY(scaling_get),   ENTRY(quantize),           ENTRY(dequantize),
};

/* The major this program requires: its header's. (The test suite builds a second copy that expects
 * another major, to see the refusal.) */
#ifndef FP8AMP_DLOPEN_EXPECT_MAJOR
#define FP8AMP_DLOPEN_EXPECT_MAJOR FP8AMP_VERSION_MAJOR
#endif

/* Opens the library and fills api; 0 on success, else -1 after printing why. The version is
 * checked first, through fp8amp_version alone (present in every release), so that a library of
 * another major is refused for its version rather than for whichever symbol it lacks. */
static int load_fp8amp(const char *path, void **handle, struct fp8amp_api *api) {
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) {
        fprintf(stderr, "fp8amp_dlopen: cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    dlerror();
    void *version_sym = dlsym(*handle, "fp8amp_version");
    if (!version_sym) {
        fprintf(stderr, "fp8amp_dlopen: %s has no fp8amp_version: it is not libfp8amp\n", path);
        dlclose(*handle);
        return -1;
    }
    uint32_t (*version)(void);
    memcpy(&version, &version_sym, sizeof version);
    const uint32_t v = version();
    if (v / 10000 != FP8AMP_DLOPEN_EXPECT_MAJOR || (v / 100) % 100 < FP8AMP_VERSION_MINOR) {
        fprintf(stderr, "fp8amp_dlopen: %s is version %u.%u.%u; this program needs major %d, minor %d or newer "
                        "(its header is %d.%d.%d)\n",
                path, v / 10000, (v / 100) % 100, v % 100, FP8AMP_DLOPEN_EXPECT_MAJOR, FP8AMP_VERSION_MINOR,
                FP8AMP_VERSION_MAJOR, FP8AMP_VERSION_MINOR, FP8AMP_VERSION_PATCH);
        dlclose(*handle);
        return -1;
    }
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        dlerror();
        void *sym = dlsym(*handle, entries[i].symbol);
        const char *err = dlerror();
        if (!sym || err) {
            fprintf(stderr, "fp8amp_dlopen: %s has no symbol %s (%s), which this program's header %d.%d.%d declares\n",
                    path, entries[i].symbol, err ? err : "NULL", FP8AMP_VERSION_MAJOR, FP8AMP_VERSION_MINOR,
                    FP8AMP_VERSION_PATCH);
            dlclose(*handle);
            return -1;
        }
        /* POSIX guarantees that a data pointer from dlsym converts to a function pointer; the
         * memcpy says so without the cast ISO C leaves undefined. */
        memcpy((char *)api + entries[i].offset, &sym, sizeof sym);
    }
    return 0;
}

static struct fp8amp_api fp;

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        fp8amp_status st_ = (call);                                                                   \
        if (st_ != FP8AMP_SUCCESS) {                                                                  \
            fprintf(stderr, "fp8amp_dlopen: %s: %s: %s\n", #call, fp.status_name(st_), fp.last_error_message()); \
            return 1;                                                                                 \
        }                                                                                             \
    } while (0)

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "libfp8amp.so.0";
    void *handle;
    if (load_fp8amp(path, &handle, &fp) != 0) return 1;
    const uint32_t v = fp.version();
    printf("loaded %s: version %u.%u.%u, header %d.%d.%d, %zu functions resolved\n", path, v / 10000,
           (v / 100) % 100, v % 100, FP8AMP_VERSION_MAJOR, FP8AMP_VERSION_MINOR, FP8AMP_VERSION_PATCH,
           sizeof entries / sizeof entries[0]);

    /* A round trip: x -> E4M3 with current scaling -> F32. */
    enum { n = 64 };
    float x[n], back[n];
    for (int i = 0; i < n; i++) x[i] = (float)((i * 37) % 61 - 30) / 7.0f;
    fp8amp_context ctx;
    fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    CHECK(fp.context_create(cpu, &ctx));
    fp8amp_recipe recipe;
    CHECK(fp.recipe_init(&recipe, sizeof recipe));
    recipe.mode = FP8AMP_SCALING_CURRENT;
    fp8amp_scaling meta;
    CHECK(fp.scaling_create(ctx, &recipe, FP8AMP_DTYPE_E4M3, &meta));
    const int64_t shape[1] = {n};
    fp8amp_tensor tx, tq, tb;
    CHECK(fp.tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &tx));
    CHECK(fp.tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &tq));
    CHECK(fp.tensor_create(ctx, FP8AMP_DTYPE_F32, 1, shape, &tb));
    CHECK(fp.tensor_set_scaling(tq, meta));
    CHECK(fp.tensor_copy_from_host(tx, x, sizeof x));
    CHECK(fp.quantize(ctx, tx, tq));
    CHECK(fp.dequantize(ctx, tq, tb));
    CHECK(fp.tensor_copy_to_host(tb, back, sizeof back));
    float scale, scale_inv, amax;
    CHECK(fp.scaling_get(meta, &scale, &scale_inv, &amax));

    /* E4M3 keeps 3 mantissa bits: each value within 2^-4 relative, or half the smallest subnormal
     * step (2^-10 / scale) near zero. */
    float worst = 0.0f;
    for (int i = 0; i < n; i++) {
        const float err = fabsf(back[i] - x[i]);
        const float tol = fmaxf(fabsf(x[i]) * 0.0625f, 0.0009765625f * scale_inv);
        if (!(err <= tol)) {
            fprintf(stderr, "fp8amp_dlopen: element %d: %g came back as %g (tolerance %g)\n", i, x[i], back[i], tol);
            return 1;
        }
        if (err > worst) worst = err;
    }
    printf("quantize/dequantize round trip of %d values: amax %g, scale %g, largest error %g\n", n, amax, scale, worst);

    CHECK(fp.tensor_destroy(tx));
    CHECK(fp.tensor_destroy(tq));
    CHECK(fp.tensor_destroy(tb));
    CHECK(fp.scaling_destroy(meta));
    CHECK(fp.context_destroy(ctx));
    /* No dlclose: once used, libfp8amp stays loaded for the life of the process. Its handle registry
     * is process-wide and deliberately never destroyed (objects alive at exit must not be torn down
     * after the CUDA runtime; core/handles.cpp), so unloading the library would leak it -- LeakSanitizer
     * reports it. A framework's plugin loader keeps it loaded likewise. (The refusals above dlclose:
     * nothing of the library has run there but fp8amp_version.) */
    (void)handle;
    return 0;
}
