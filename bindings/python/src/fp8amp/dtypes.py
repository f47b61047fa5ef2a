"""fp8amp's element types and their NumPy (ml_dtypes) counterparts."""
from __future__ import annotations

import enum
from typing import Any

from ._ffi import cstr, lib
from .errors import DtypeMismatchError, InvalidArgumentError


class DType(enum.IntEnum):
    """fp8amp_dtype. E4M3 is float8_e4m3fn (max 448, no inf); E5M2 is IEEE-like (max 57344)."""

    F32 = lib.FP8AMP_DTYPE_F32
    F16 = lib.FP8AMP_DTYPE_F16
    BF16 = lib.FP8AMP_DTYPE_BF16
    E4M3 = lib.FP8AMP_DTYPE_E4M3
    E5M2 = lib.FP8AMP_DTYPE_E5M2

    def __str__(self) -> str:
        return self.short_name

    @property
    def itemsize(self) -> int:
        return int(lib.fp8amp_dtype_size(self))

    @property
    def short_name(self) -> str:
        """The library's name: "f32", "f16", "bf16", "e4m3", "e5m2"."""
        return cstr(lib.fp8amp_dtype_name(self))

    @property
    def is_fp8(self) -> bool:
        return self in (DType.E4M3, DType.E5M2)

    def numpy(self) -> Any:
        """The NumPy dtype: float32, float16, or ml_dtypes' bfloat16, float8_e4m3fn, float8_e5m2."""
        import numpy as np

        if self is DType.F32:
            return np.dtype(np.float32)
        if self is DType.F16:
            return np.dtype(np.float16)
        import ml_dtypes

        return np.dtype({DType.BF16: ml_dtypes.bfloat16, DType.E4M3: ml_dtypes.float8_e4m3fn,
                         DType.E5M2: ml_dtypes.float8_e5m2}[self])


F32, F16, BF16, E4M3, E5M2 = DType.F32, DType.F16, DType.BF16, DType.E4M3, DType.E5M2

_NAMES = {"f32": F32, "float32": F32, "f16": F16, "float16": F16, "half": F16, "bf16": BF16, "bfloat16": BF16,
          "e4m3": E4M3, "float8_e4m3fn": E4M3, "e5m2": E5M2, "float8_e5m2": E5M2}


def as_dtype(d: Any) -> DType:
    """A DType from a DType, its int value, a name ("e4m3", "float8_e4m3fn", "bfloat16"...), a NumPy
    dtype (ml_dtypes included) or a torch dtype. An int that is no fp8amp_dtype value raises
    InvalidArgumentError (as the library does for a bad enum); a name or dtype with no fp8amp
    counterpart DtypeMismatchError (a TypeError too)."""
    if isinstance(d, DType):
        return d
    if d is None or isinstance(d, bool):  # not a dtype at all (np.dtype(None) would be float64)
        raise TypeError("fp8amp_dtype: a dtype must be a DType, its value, a name or a NumPy/torch dtype, not %s"
                        % type(d).__name__)
    if isinstance(d, int):
        try:
            return DType(d)
        except ValueError:
            raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT, "fp8amp_dtype: %d is not an fp8amp_dtype (%s)"
                                       % (d, ", ".join("%s=%d" % (m.short_name, m.value) for m in DType))) from None
    if isinstance(d, str):
        try:
            return _NAMES[d.lower()]
        except KeyError:
            raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH,
                                     "fp8amp_dtype: %r names no fp8amp dtype (f32, f16, bf16, e4m3 and e5m2 exist)"
                                     % d) from None
    name = str(d)
    if name.startswith("torch."):
        name = name[len("torch."):]
    else:
        try:
            import numpy as np

            name = np.dtype(d).name
        except TypeError:
            pass
    try:
        return _NAMES[name]
    except KeyError:
        raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH,
                                 "fp8amp_dtype: %r has no fp8amp counterpart (f32, f16, bf16, e4m3 and e5m2 exist)"
                                 % (d,)) from None
