"""Builds fp8amp's CFFI extension module (API mode, out of line) from the public C header.

The cdef is generated from the header itself (``cdef_from_header``), never copied by hand, so the
binding cannot drift from the C API: the header's comments, include guard, ``extern "C"`` block
and the ``FP8AMP_API`` visibility macro are stripped, and every ``#define NAME value`` becomes
``#define NAME ...`` (in API mode cffi then takes the value from the real header when it compiles
the module). Function-like macros (``#define fp8amp_recipe_init_default(recipe) ...``, C source's
spelling of a sized init, docs/api.md 1.6) are dropped: the binding calls the functions they name,
with ``ffi.sizeof`` of the struct. A conditional block that holds anything but those known lines
stops the build, so a header change that this script does not understand fails loudly instead of losing declarations.

Where the library is found, first match wins:
  1. FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR (explicit paths), or FP8AMP_PREFIX (an install prefix);
  2. pkg-config (``fp8amp.pc``; set PKG_CONFIG_PATH for a non-system prefix);
  3. this source tree: ``capi/include`` and the CMake build folder ``build/`` (or FP8AMP_BUILD_DIR).
The module links ``-lfp8amp`` with an rpath to the library's folder, so ``import fp8amp`` needs no
LD_LIBRARY_PATH.

Run as a script to print the generated cdef: ``python3 build_ffi.py [path/to/fp8amp.h]``.
"""
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# Lines allowed inside the header's conditional blocks, which the cdef drops.
_DROPPABLE = re.compile(
    r'^(#\s*define\s+FP8AMP_API\b.*|extern\s+"C"\s*\{|\}|#\s*(if|ifdef|ifndef|else|elif|endif)\b.*)$')


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def cdef_from_header(text: str) -> str:
    """The cdef for cffi, generated from the text of fp8amp.h."""
    # A preprocessor line continued with a backslash is one line.
    text = re.sub(r"\\\n", " ", _strip_comments(text))
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    # The include guard: the first #ifndef X immediately followed by #define X, and the last #endif.
    guard = re.match(r"#\s*ifndef\s+(\w+)$", lines[0])
    if not (guard and re.match(r"#\s*define\s+%s$" % guard.group(1), lines[1]) and
            re.match(r"#\s*endif\b", lines[-1])):
        raise RuntimeError("fp8amp.h: expected an include guard around the whole header")
    lines = lines[2:-1]
    out, depth, dropped = [], 0, []
    for ln in lines:
        if re.match(r"#\s*(if|ifdef|ifndef)\b", ln):
            depth += 1
            dropped.append(ln)
            continue
        if re.match(r"#\s*endif\b", ln):
            depth -= 1
            dropped.append(ln)
            continue
        if depth > 0:
            dropped.append(ln)
            continue
        if re.match(r"#\s*include\b", ln):
            continue
        if re.match(r"#\s*define\s+\w+\(", ln):
            continue  # a function-like macro: its function is declared too
        m = re.match(r"#\s*define\s+(\w+)\s+(.+)$", ln)
        if m:
            out.append("#define %s ..." % m.group(1))
            continue
        if ln.startswith("#"):
            raise RuntimeError("fp8amp.h: a preprocessor line the cdef generator does not know: " + ln)
        out.append(ln)
    if depth != 0:
        raise RuntimeError("fp8amp.h: unbalanced conditionals")
    for ln in dropped:
        if not _DROPPABLE.match(ln):
            raise RuntimeError("fp8amp.h: a conditional block holds a line the binding would lose: " + ln)
    cdef = "\n".join(out)
    cdef = re.sub(r"\bFP8AMP_API\b\s*", "", cdef)
    return cdef + "\n"


# DLPack 1.1 (the specification's dlpack.h): the header only declares struct DLManagedTensorVersioned,
# the binding needs its layout (and the legacy DLManagedTensor, for consumers that ask for it).
DLPACK_DECLS = """
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
struct DLManagedTensorVersioned {
    DLPackVersion version; void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self); uint64_t flags; DLTensor dl_tensor;
};
"""

# Helpers: the allocator hooks, implemented in Python (context.py, Context.set_allocator); in C, the
# PyCapsule destructor (it runs when a capsule is dropped without being consumed) and converters
# between the versioned and the legacy DLPack structs.
HELPERS_CDEF = """
extern "Python" void *fp8amp_py_alloc(void *user_data, size_t nbytes, fp8amp_device device, void *stream);
extern "Python" void fp8amp_py_free(void *user_data, void *ptr, size_t nbytes, fp8amp_device device, void *stream);
void fp8amp_py_capsule_destructor(void *capsule);
DLManagedTensor *fp8amp_py_legacy_from_versioned(struct DLManagedTensorVersioned *v);
struct DLManagedTensorVersioned *fp8amp_py_versioned_from_legacy(DLManagedTensor *m);
void fp8amp_py_free_versioned_wrapper(struct DLManagedTensorVersioned *w);
"""

HELPERS_SOURCE = r"""
#include <stdlib.h>
#include "fp8amp/fp8amp.h"
""" + DLPACK_DECLS + r"""
/* The destructor of every capsule the binding makes: a capsule still named "dltensor_versioned" or
 * "dltensor" was never consumed, so its tensor is released here. A consumer renames it to
 * "used_dltensor..." when it takes ownership, and then nothing happens. */
void fp8amp_py_capsule_destructor(void *capsule_raw) {
    PyObject *capsule = (PyObject *)capsule_raw;
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        struct DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (m && m->deleter) m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
        if (m && m->deleter) m->deleter(m);
    }
}

static void legacy_deleter(DLManagedTensor *self) {
    struct DLManagedTensorVersioned *v = self->manager_ctx;
    if (v && v->deleter) v->deleter(v);
    free(self);
}

/* A legacy (unversioned) view of a versioned tensor that owns it: deleting it deletes both. */
DLManagedTensor *fp8amp_py_legacy_from_versioned(struct DLManagedTensorVersioned *v) {
    DLManagedTensor *m = malloc(sizeof *m);
    if (!m) return NULL;
    m->dl_tensor = v->dl_tensor;
    m->manager_ctx = v;
    m->deleter = legacy_deleter;
    return m;
}

static void versioned_deleter(struct DLManagedTensorVersioned *self) {
    DLManagedTensor *m = self->manager_ctx;
    if (m && m->deleter) m->deleter(m);
    free(self);
}

/* A versioned (1.0) wrapper of a legacy tensor that owns it. */
struct DLManagedTensorVersioned *fp8amp_py_versioned_from_legacy(DLManagedTensor *m) {
    struct DLManagedTensorVersioned *v = malloc(sizeof *v);
    if (!v) return NULL;
    v->version.major = 1;
    v->version.minor = 0;
    v->manager_ctx = m;
    v->deleter = versioned_deleter;
    v->flags = 0;
    v->dl_tensor = m->dl_tensor;
    return v;
}

/* Frees a wrapper made above without releasing the legacy tensor (the import failed, so the
 * capsule still owns it). */
void fp8amp_py_free_versioned_wrapper(struct DLManagedTensorVersioned *w) { free(w); }
"""


def _lib_has(libdir: str) -> bool:
    return any(os.path.exists(os.path.join(libdir, n)) for n in ("libfp8amp.so", "libfp8amp.so.0", "libfp8amp.dylib"))


def locate():
    """(include_dir, lib_dir, how) of the fp8amp to build against."""
    inc, lib = os.environ.get("FP8AMP_INCLUDE_DIR"), os.environ.get("FP8AMP_LIB_DIR")
    if inc or lib:
        if not (inc and lib):
            raise RuntimeError("set both FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR (or FP8AMP_PREFIX)")
        return inc, lib, "FP8AMP_INCLUDE_DIR/FP8AMP_LIB_DIR"
    prefix = os.environ.get("FP8AMP_PREFIX")
    if prefix:
        for sub in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            if _lib_has(os.path.join(prefix, sub)):
                return os.path.join(prefix, "include"), os.path.join(prefix, sub), "FP8AMP_PREFIX"
        raise RuntimeError("FP8AMP_PREFIX=%s holds no libfp8amp under lib/, lib64/ or lib/<triplet>/" % prefix)
    if shutil.which("pkg-config"):
        try:
            inc = subprocess.check_output(["pkg-config", "--variable=includedir", "fp8amp"], text=True,
                                          stderr=subprocess.DEVNULL).strip()
            lib = subprocess.check_output(["pkg-config", "--variable=libdir", "fp8amp"], text=True,
                                          stderr=subprocess.DEVNULL).strip()
            if inc and lib:
                return os.path.realpath(inc), os.path.realpath(lib), "pkg-config"
        except subprocess.CalledProcessError:
            pass
    build = os.environ.get("FP8AMP_BUILD_DIR", os.path.join(REPO, "build"))
    inc = os.path.join(REPO, "capi", "include")
    if os.path.exists(os.path.join(inc, "fp8amp", "fp8amp.h")) and _lib_has(build):
        return inc, build, "source tree"
    raise RuntimeError(
        "libfp8amp not found: set FP8AMP_PREFIX (an install prefix), FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR, "
        "or PKG_CONFIG_PATH so that `pkg-config fp8amp` works; or build the library in the source tree's "
        "build/ folder (cmake -S . -B build && cmake --build build)")


def make_ffibuilder():
    from cffi import FFI

    inc, lib, how = locate()
    header = os.path.join(inc, "fp8amp", "fp8amp.h")
    with open(header, encoding="utf-8") as f:
        cdef = cdef_from_header(f.read())
    print("fp8amp: building the CFFI module against %s (%s), library in %s" % (header, how, lib), file=sys.stderr)
    builder = FFI()
    builder.cdef(cdef)
    builder.cdef(DLPACK_DECLS + HELPERS_CDEF)
    builder.set_source("fp8amp._fp8amp_cffi", HELPERS_SOURCE, include_dirs=[inc], library_dirs=[lib],
                       libraries=["fp8amp"], runtime_library_dirs=[lib])
    return builder


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "capi", "include", "fp8amp", "fp8amp.h")
    with open(path, encoding="utf-8") as f:
        sys.stdout.write(cdef_from_header(f.read()))
elif __name__ == "__cffi__":  # executed by cffi's setuptools integration (setup.py: cffi_modules)
    ffibuilder = make_ffibuilder()
