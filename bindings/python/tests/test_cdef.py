"""The cdef is generated from the header: every function and enum value the header declares is in
the compiled module, and the generator refuses a header it does not understand."""
import os
import re
import sys

import pytest

from fp8amp import _lib as lib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import build_ffi  # noqa: E402  (no ffibuilder is made on import)

HEADER = os.environ.get("FP8AMP_HEADER", os.path.join(HERE, "..", "..", "..", "capi", "include", "fp8amp", "fp8amp.h"))


@pytest.mark.skipif(not os.path.exists(HEADER), reason="the public header is not beside the package")
def test_every_declaration_is_bound():
    text = open(HEADER, encoding="utf-8").read()
    functions = set(re.findall(r"FP8AMP_API\s+[\w\s\*]+?\b(fp8amp_\w+)\s*\(", text))
    assert len(functions) > 40
    missing = [f for f in functions if not hasattr(lib, f)]
    assert not missing
    for name in re.findall(r"\b(FP8AMP_[A-Z0-9_]+)\s*=\s*\d+", text):
        assert hasattr(lib, name), name
    assert lib.FP8AMP_MAX_NDIM == 8 and lib.FP8AMP_MAX_AMAX_HISTORY == 65536


def test_generator_rejects_what_it_does_not_know():
    good = "#ifndef G\n#define G\nint fp8amp_x(void);\n#endif\n"
    assert "int fp8amp_x(void);" in build_ffi.cdef_from_header(good)
    with pytest.raises(RuntimeError):
        build_ffi.cdef_from_header("int f(void);\n")  # no include guard
    with pytest.raises(RuntimeError):  # a declaration inside a conditional would be lost
        build_ffi.cdef_from_header("#ifndef G\n#define G\n#ifdef X\nint fp8amp_y(void);\n#endif\n#endif\n")
    with pytest.raises(RuntimeError):
        build_ffi.cdef_from_header("#ifndef G\n#define G\n#pragma once\n#endif\n")


def test_import_needs_no_torch():
    import subprocess

    code = "import sys, fp8amp; sys.exit(1 if 'torch' in sys.modules else 0)"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def test_function_like_macros_are_dropped_and_their_functions_bound():
    # The header spells each old init as a macro over the sized one (docs/api.md 1.6); the cdef keeps
    # the functions (the FP8AMP_0 one is declared with its name in parentheses) and drops the macro,
    # continued lines included.
    text = ("#ifndef G\n#define G\nint fp8amp_x_init(int *p, size_t size);\nint (fp8amp_x_init_default)(int *p);\n"
            "#define fp8amp_x_init_default(p) \\\n    fp8amp_x_init((p), sizeof(int))\n#define FP8AMP_N 3\n#endif\n")
    cdef = build_ffi.cdef_from_header(text)
    assert "int fp8amp_x_init(int *p, size_t size);" in cdef
    assert "int (fp8amp_x_init_default)(int *p);" in cdef
    assert "sizeof" not in cdef and "#define FP8AMP_N ..." in cdef
    for name in ("recipe", "linear_desc", "adam_desc", "adam_step_args", "grad_scaler_desc"):
        assert hasattr(lib, "fp8amp_%s_init" % name) and hasattr(lib, "fp8amp_%s_init_default" % name)
    assert hasattr(lib, "fp8amp_opt_level_init") and hasattr(lib, "fp8amp_opt_level_adam_init")


def test_sized_init_through_the_binding():
    from fp8amp import _ffi as ffi
    r = ffi.new("fp8amp_recipe *")
    assert lib.fp8amp_recipe_init(r, ffi.sizeof("fp8amp_recipe")) == lib.FP8AMP_SUCCESS
    assert r.struct_size == ffi.sizeof("fp8amp_recipe") and r.amax_history_len == 1024
    # a size that is no fp8amp_recipe's: refused, nothing written
    r.margin = 7
    assert lib.fp8amp_recipe_init(r, 8) == lib.FP8AMP_ERROR_INVALID_ARGUMENT
    assert r.margin == 7
