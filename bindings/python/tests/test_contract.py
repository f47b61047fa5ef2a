"""Each fact of the public contract has one source: the version is capi/include/fp8amp/version.h's
(CMake's project version is read from it; the package's metadata, fp8amp.__version__ and the library
agree), and
the DLPack structs and constants come from DLPack's own header (fp8amp/dlpack.h) through the
generated cdef, with no copy in the binding."""
import importlib.metadata
import os
import sys

import pytest

import fp8amp
from fp8amp import _dlpack
from fp8amp import _ffi as ffi
from fp8amp import _lib as lib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import build_ffi  # noqa: E402  (no ffibuilder is made on import)

REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def test_package_version_is_the_header_and_library_version():
    v = fp8amp.HEADER_VERSION
    dotted = "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)
    assert fp8amp.__version__ == dotted
    assert importlib.metadata.version("fp8amp") == dotted  # setup.py read it from fp8amp/version.h
    assert fp8amp.library_version() == v


@pytest.mark.skipif(not os.environ.get("FP8AMP_GENERATED_INCLUDE"), reason="FP8AMP_GENERATED_INCLUDE not set")
def test_build_folders_version_h_is_the_source():
    # CMake reads the version from capi/include/fp8amp/version.h and copies that file into the build
    # folder's include/ (where tools recognize a build folder): both, and the package, say the same.
    source = build_ffi.version([os.path.join(REPO, "capi", "include")])
    assert build_ffi.version([os.environ["FP8AMP_GENERATED_INCLUDE"]]) == source == fp8amp.__version__


def test_dlpack_values_come_from_dlpacks_header():
    assert (lib.DLPACK_MAJOR_VERSION, lib.DLPACK_MINOR_VERSION) == (1, 1)
    assert (lib.kDLCPU, lib.kDLCUDA, lib.kDLFloat8_e4m3fn, lib.kDLFloat8_e5m2) == (1, 2, 10, 12)
    assert (_dlpack.KDL_CPU, _dlpack.KDL_CUDA) == (lib.kDLCPU, lib.kDLCUDA)
    assert _dlpack.FLAG_READ_ONLY == lib.DLPACK_FLAG_BITMASK_READ_ONLY == 1
    # API mode: cffi checked these layouts against the real header when it compiled the module.
    assert ffi.sizeof("struct DLManagedTensorVersioned") == ffi.sizeof("DLPackVersion") + 3 * 8 + ffi.sizeof("DLTensor")
    assert ffi.offsetof("struct DLManagedTensorVersioned", "dl_tensor") == 32


def test_dlpack_generator_evaluates_conditionals_and_refuses_the_unknown():
    text = ("#ifndef G_\n#define G_\n#ifdef __cplusplus\n#define EXT extern \"C\"\n#else\n#define EXT\n#endif\n"
            "#define V 3\n#ifdef __cplusplus\ntypedef enum : int32_t {\n#else\ntypedef enum {\n#endif\n"
            "  a = 1,\n} E;\nEXT int f(void);\n#endif\n")
    cdef = build_ffi.cdef_from_dlpack(text)
    assert "typedef enum {" in cdef and "int32_t" not in cdef and "#define V ..." in cdef
    assert "int f(void);" in cdef and "EXT" not in cdef and "extern" not in cdef
    with pytest.raises(RuntimeError):
        build_ffi.cdef_from_dlpack("#if defined(X)\nint f(void);\n#endif\n")
    with pytest.raises(RuntimeError):
        build_ffi.cdef_from_dlpack("#ifdef X\nint f(void);\n")  # unbalanced


def test_header_generator_follows_fp8amp_includes_only_when_it_can():
    text = '#ifndef G\n#define G\n#include "fp8amp/v.h"\nint fp8amp_x(void);\n#endif\n'
    cdef = build_ffi.cdef_from_header(text, lambda name: "#ifndef V\n#define V\n#define FP8AMP_Q 1\n#endif\n")
    assert "#define FP8AMP_Q ..." in cdef and "int fp8amp_x(void);" in cdef
    with pytest.raises(RuntimeError):  # an fp8amp header the generator cannot read would lose declarations
        build_ffi.cdef_from_header(text)
