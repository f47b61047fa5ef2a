"""Builds fp8amp's CFFI extension module (API mode, out of line) from the public C header.

The cdef is generated from the header itself (``cdef_from_header``), never copied by hand, so the
binding cannot drift from the C API: the header's comments, include guard, ``extern "C"`` block
and the ``FP8AMP_API`` visibility macro are stripped, and every ``#define NAME value`` becomes
``#define NAME ...`` (in API mode cffi then takes the value from the real header when it compiles
the module). Function-like macros (``#define fp8amp_recipe_init_default(recipe) ...``, C source's
spelling of a sized init, docs/api.md 1.6) are dropped: the binding calls the functions they name,
with ``ffi.sizeof`` of the struct. A conditional block that holds anything but those known lines
stops the build, so a header change that this script does not understand fails loudly instead of losing declarations.

``#include "fp8amp/NAME.h"`` lines of the header (the version macros of
``fp8amp/version.h``) are followed and their declarations added. The DLPack structs come from DLPack's
own header, ``fp8amp/dlpack.h`` (v1.1, installed with fp8amp.h), through ``cdef_from_dlpack``: the
preprocessor conditionals it uses are evaluated for C on a non-Windows host, its empty export macros
removed, and its ``#define``s become ``...`` as above; nothing of DLPack is copied here.

Where the library is found, first match wins:
  1. FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR (explicit paths; FP8AMP_INCLUDE_DIR may list several
     folders separated by os.pathsep, e.g. capi/include), or
     FP8AMP_PREFIX (an install prefix);
  2. pkg-config (``fp8amp.pc``; set PKG_CONFIG_PATH for a non-system prefix);
  3. this source tree: ``capi/include``, and the CMake build folder ``build/`` (or FP8AMP_BUILD_DIR)
     for the library.
The module links ``-lfp8amp`` with an rpath to the library's folder, so ``import fp8amp`` needs no
LD_LIBRARY_PATH.

Run as a script to print the generated cdef: ``python3 build_ffi.py [INCLUDE_DIR ...]`` (default: the
source tree's, as in 3.); ``python3 build_ffi.py --emit-c OUT.c [INCLUDE_DIR ...]`` writes the module's C
source instead (the wheel's CMake build compiles it: bindings/python/CMakeLists.txt).
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


_FP8AMP_INCLUDE = re.compile(r'#\s*include\s*[<"](fp8amp/\w+\.h)[>"]$')


def cdef_from_header(text: str, resolve=None) -> str:
    """The cdef for cffi, generated from the text of fp8amp.h. ``resolve(name)`` returns the text of
    an included ``fp8amp/...`` header (e.g. "fp8amp/version.h"), whose declarations are added in
    place; an fp8amp include that cannot be resolved stops the build."""
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
        inc = _FP8AMP_INCLUDE.match(ln)
        if inc:
            if resolve is None:
                raise RuntimeError("fp8amp.h includes %s, which the cdef generator was given no way to read"
                                   % inc.group(1))
            out.append(cdef_from_header(resolve(inc.group(1)), resolve).rstrip("\n"))
            continue
        if re.match(r"#\s*include\s*<\w+\.h>$", ln):
            continue  # a standard header (stddef.h, stdint.h): cffi knows its types
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


def cdef_from_dlpack(text: str) -> str:
    """The cdef of DLPack's structs, enums and flag macros, generated from the text of DLPack's own
    dlpack.h (fp8amp/dlpack.h). Its conditionals are evaluated for C (``__cplusplus``, ``_WIN32`` and
    ``DLPACK_EXPORTS`` undefined); a macro defined empty (DLPACK_EXTERN_C, DLPACK_DLL) is removed where
    it is used; an object-like ``#define`` with a value becomes ``#define NAME ...``. A directive it
    does not know (``#if`` with an expression, ``#pragma``, a function-like macro) stops the build."""
    text = re.sub(r"\\\n", " ", _strip_comments(text))
    defined, empty, out = set(), set(), []
    active = [True]  # one entry per open conditional: whether its current branch is compiled
    for ln in (ln.strip() for ln in text.splitlines()):
        if not ln:
            continue
        m = re.match(r"#\s*(ifdef|ifndef)\s+(\w+)$", ln)
        if m:
            active.append(active[-1] and ((m.group(2) in defined) == (m.group(1) == "ifdef")))
            continue
        if re.match(r"#\s*else$", ln):
            if len(active) < 2:
                raise RuntimeError("dlpack.h: #else without #if")
            active[-1] = active[-2] and not active[-1]
            continue
        if re.match(r"#\s*endif$", ln):
            if len(active) < 2:
                raise RuntimeError("dlpack.h: #endif without #if")
            active.pop()
            continue
        if not active[-1]:
            continue
        if re.match(r"#\s*include\s*<\w+\.h>$", ln):
            continue
        m = re.match(r"#\s*define\s+(\w+)(\s+(.*))?$", ln)
        if m and not re.match(r"#\s*define\s+\w+\(", ln):
            defined.add(m.group(1))
            if m.group(3):
                out.append("#define %s ..." % m.group(1))
            else:
                empty.add(m.group(1))
            continue
        if ln.startswith("#"):
            raise RuntimeError("dlpack.h: a preprocessor line the cdef generator does not know: " + ln)
        out.append(ln)
    if len(active) != 1:
        raise RuntimeError("dlpack.h: unbalanced conditionals")
    cdef = "\n".join(out)
    for name in empty:
        cdef = re.sub(r"\b%s\b\s*" % name, "", cdef)
    return cdef + "\n"


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
#include "fp8amp/dlpack.h"

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
    """(include_dirs, lib_dir, how) of the fp8amp to build against: include_dirs is a list."""
    inc, lib = os.environ.get("FP8AMP_INCLUDE_DIR"), os.environ.get("FP8AMP_LIB_DIR")
    if inc or lib:
        if not (inc and lib):
            raise RuntimeError("set both FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR (or FP8AMP_PREFIX)")
        return [d for d in inc.split(os.pathsep) if d], lib, "FP8AMP_INCLUDE_DIR/FP8AMP_LIB_DIR"
    prefix = os.environ.get("FP8AMP_PREFIX")
    if prefix:
        for sub in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            if _lib_has(os.path.join(prefix, sub)):
                return [os.path.join(prefix, "include")], os.path.join(prefix, sub), "FP8AMP_PREFIX"
        raise RuntimeError("FP8AMP_PREFIX=%s holds no libfp8amp under lib/, lib64/ or lib/<triplet>/" % prefix)
    if shutil.which("pkg-config"):
        try:
            inc = subprocess.check_output(["pkg-config", "--variable=includedir", "fp8amp"], text=True,
                                          stderr=subprocess.DEVNULL).strip()
            lib = subprocess.check_output(["pkg-config", "--variable=libdir", "fp8amp"], text=True,
                                          stderr=subprocess.DEVNULL).strip()
            if inc and lib:
                return [os.path.realpath(inc)], os.path.realpath(lib), "pkg-config"
        except subprocess.CalledProcessError:
            pass
    build = os.environ.get("FP8AMP_BUILD_DIR", os.path.join(REPO, "build"))
    inc = os.path.join(REPO, "capi", "include")
    if os.path.exists(os.path.join(inc, "fp8amp", "fp8amp.h")) and _lib_has(build):
        return [inc, os.path.join(build, "include")], build, "source tree"
    raise RuntimeError(
        "libfp8amp not found: set FP8AMP_PREFIX (an install prefix), FP8AMP_INCLUDE_DIR and FP8AMP_LIB_DIR, "
        "or PKG_CONFIG_PATH so that `pkg-config fp8amp` works; or build the library in the source tree's "
        "build/ folder (cmake -S . -B build && cmake --build build)")


def find_header(include_dirs, name: str) -> str:
    """The path of `name` ("fp8amp/version.h") in the first of include_dirs that has it."""
    for d in include_dirs:
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    raise RuntimeError("%s is in none of %s (the public headers are in the source tree's capi/include, "
                       "and in an install prefix's include/)" % (name, os.pathsep.join(include_dirs)))


def read_header(include_dirs, name: str) -> str:
    with open(find_header(include_dirs, name), encoding="utf-8") as f:
        return f.read()


def header_cdef(include_dirs) -> str:
    """The whole cdef of the public headers: fp8amp.h (with what it includes) and DLPack's dlpack.h."""
    return (cdef_from_header(read_header(include_dirs, "fp8amp/fp8amp.h"), lambda n: read_header(include_dirs, n))
            + cdef_from_dlpack(read_header(include_dirs, "fp8amp/dlpack.h")))


def version(include_dirs) -> str:
    """"MAJOR.MINOR.PATCH" of the header (fp8amp/version.h, the project's one source of its version):
    the package's version (setup.py), so that it has one source."""
    text = read_header(include_dirs, "fp8amp/version.h")
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#\s*define\s+FP8AMP_VERSION_%s\s+(\d+)\s*$" % part, text, flags=re.M)
        if not m:
            raise RuntimeError("fp8amp/version.h defines no FP8AMP_VERSION_%s" % part)
        parts.append(m.group(1))
    return ".".join(parts)


def _ffibuilder(include_dirs, **link):
    from cffi import FFI

    builder = FFI()
    builder.cdef(header_cdef(include_dirs))
    builder.cdef(HELPERS_CDEF)
    builder.set_source("fp8amp._fp8amp_cffi", HELPERS_SOURCE, include_dirs=include_dirs, **link)
    return builder


def make_ffibuilder():
    incs, lib, how = locate()
    header = find_header(incs, "fp8amp/fp8amp.h")
    print("fp8amp: building the CFFI module against %s (%s), library in %s" % (header, how, lib), file=sys.stderr)
    return _ffibuilder(incs, library_dirs=[lib], libraries=["fp8amp"], runtime_library_dirs=[lib])


def emit_c(include_dirs, path: str) -> None:
    """Writes the extension module's C source (cffi's API mode) to path, for a build that compiles
    and links it itself: the wheel's CMake build (bindings/python/CMakeLists.txt), which links it to
    the libfp8amp it builds and bundles."""
    _ffibuilder(include_dirs).emit_c_code(path)


if __name__ == "__main__":
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--emit-c"]:
        if len(args) < 2:
            sys.exit("usage: build_ffi.py --emit-c OUT.c [INCLUDE_DIR ...]")
        out, args = args[1], args[2:]
    dirs = args or [os.path.join(REPO, "capi", "include"),
                    os.path.join(os.environ.get("FP8AMP_BUILD_DIR", os.path.join(REPO, "build")), "include")]
    if out:
        emit_c(dirs, out)
    else:
        sys.stdout.write(header_cdef(dirs))
elif __name__ == "__cffi__":  # executed by cffi's setuptools integration (setup.py: cffi_modules)
    ffibuilder = make_ffibuilder()
