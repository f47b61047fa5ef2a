"""Argument checks shared by every class and function of the binding, so that one rule holds
everywhere (README.md, "Errors"):

- a wrong Python type (None where None is not allowed, an object of another class, a float where an
  integer goes, a str where a number goes) raises a plain TypeError: the call never reaches C;
- a value the C contract covers (a closed object, an integer the C field cannot hold, an enum value
  out of range) raises the fp8amp.Error subclass of the status the library gives for it.

`where` names the Python entry point ("Optimizer.step") and `name` the argument ("scaler"), so that
each message says which argument is wrong and why.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Optional, Type, TypeVar

from ._ffi import NULL, lib
from .errors import InvalidArgumentError, InvalidHandleError

_INT_RANGES = {
    "int32_t": (-2**31, 2**31 - 1),
    "uint32_t": (0, 2**32 - 1),
    "int64_t": (-2**63, 2**63 - 1),
    "uint64_t": (0, 2**64 - 1),
    "uintptr_t": (0, 2**64 - 1),
}


def _kind(cls: type) -> str:
    return "fp8amp.%s" % cls.__name__


def handle_of(obj: Any, cls: type, where: str, name: str, optional: bool = False) -> Any:
    """The C handle of argument `name`, which must be an open `cls` (or None, giving NULL, when
    `optional`). The C functions with optional handles read NULL as "absent", and a closed object
    holds NULL: without this check a closed Scaling would unbind a tensor, a closed GradScaler skip
    the unscaling, a closed dx skip dX. So a closed object raises InvalidHandleError everywhere."""
    if obj is None:
        if optional:
            return NULL
        raise TypeError("%s: %s must be an %s, not None" % (where, name, _kind(cls)))
    if not isinstance(obj, cls):
        raise TypeError("%s: %s must be an %s%s, not %s" % (where, name, _kind(cls), " or None" if optional else "",
                                                            type(obj).__name__))
    h = obj._h
    if h == NULL:
        raise InvalidHandleError(lib.FP8AMP_ERROR_INVALID_HANDLE,
                                 "%s: %s is a closed %s (closed objects cannot be used)" % (where, name, _kind(cls)))
    return h


def as_int(value: Any, where: str, name: str, ctype: str = "int64_t") -> int:
    """An integer argument for a C field of type `ctype`: TypeError for a non-integer (a float is
    not silently truncated), InvalidArgumentError for one the field cannot hold (the library checks
    the field's own range)."""
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError("%s: %s must be an integer, not %s" % (where, name, type(value).__name__)) from None
    lo, hi = _INT_RANGES[ctype]
    if not lo <= i <= hi:
        raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                   "%s: %s %d does not fit the library's %s" % (where, name, i, ctype))
    return i


def as_shape(shape: Any, where: str, name: str = "shape") -> tuple:
    """A tuple of int64 extents (the library checks their values)."""
    try:
        items = list(shape)
    except TypeError:
        raise TypeError("%s: %s must be a sequence of integers, not %s" % (where, name, type(shape).__name__)) from None
    return tuple(as_int(s, where, "%s[%d]" % (name, i)) for i, s in enumerate(items))


def as_float(value: Any, where: str, name: str) -> float:
    """A real-number argument: TypeError for anything that is not a number (a str is not parsed);
    NaN and inf pass through for the library to judge, as its contract says."""
    if isinstance(value, (str, bytes, bytearray)) or value is None:
        raise TypeError("%s: %s must be a real number, not %s" % (where, name, type(value).__name__))
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                   "%s: %s %r does not fit a float" % (where, name, value)) from None
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a real number, not %s" % (where, name, type(value).__name__)) from None


E = TypeVar("E")


def as_enum(enum_cls: Type[E], value: Any, where: str, name: str, names: Optional[dict] = None) -> E:
    """A member of an IntEnum from a member, its int value, or (with `names`) one of its names:
    TypeError for another type, InvalidArgumentError for a value or name the enum does not have."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str) and names is not None:
        try:
            return names[value.lower()]
        except KeyError:
            raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT, "%s: %s %r is not one of %s" % (
                where, name, value, ", ".join(sorted(names)))) from None
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError("%s: %s must be an %s%s, not %s" % (where, name, enum_cls.__name__,
                                                              " or its name" if names else "",
                                                              type(value).__name__)) from None
    try:
        return enum_cls(i)  # type: ignore[call-arg]
    except ValueError:
        raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT, "%s: %s %d is not an %s (%s)" % (
            where, name, i, enum_cls.__name__, ", ".join("%s=%d" % (m.name, m.value) for m in enum_cls))) from None


def finite_nonnegative(value: float, where: str, name: str) -> float:
    """A value that must be finite and >= 0 (where the C API reads a negative one as "the default",
    which from Python is None)."""
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                   "%s: %s %r is not a finite value >= 0 (None: the default)" % (where, name, value))
    return value
