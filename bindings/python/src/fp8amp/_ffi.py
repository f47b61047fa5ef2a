"""The compiled CFFI module (built from the public header by build_ffi.py) and small helpers."""
from __future__ import annotations

try:
    from ._fp8amp_cffi import ffi, lib  # type: ignore[import-not-found]
except ImportError as e:  # pragma: no cover - only without a built extension
    raise ImportError(
        "fp8amp's extension module is missing: install the package with pip (pip install ./bindings/python), "
        "which builds it against libfp8amp found through FP8AMP_PREFIX, pkg-config or the source tree's build/"
    ) from e

NULL = ffi.NULL


def cstr(p) -> str:
    """A C string (const char *) as a Python str; '' for NULL."""
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""
