"""DLPack capsules: making them for export (``Tensor.__dlpack__``) and consuming them on import
(``from_dlpack``). Capsule calls go through the CPython C API (ctypes.pythonapi); the capsule
destructor and the versioned/legacy converters are C functions of the CFFI module (build_ffi.py).

Protocol (DLPack 1.x, the Python array API's ``__dlpack__``): a capsule named "dltensor_versioned"
holds a DLManagedTensorVersioned, "dltensor" a legacy DLManagedTensor. The consumer renames it to
"used_..." when it takes ownership; a capsule dropped unconsumed releases its tensor in the destructor.
"""
from __future__ import annotations

import ctypes
from typing import Any

from ._ffi import NULL, ffi, lib

VERSIONED = b"dltensor_versioned"
LEGACY = b"dltensor"
USED_VERSIONED = b"used_dltensor_versioned"
USED_LEGACY = b"used_dltensor"
# DLPack's own values, from its header (fp8amp/dlpack.h, compiled into the CFFI module).
FLAG_READ_ONLY = int(lib.DLPACK_FLAG_BITMASK_READ_ONLY)
KDL_CPU, KDL_CUDA = int(lib.kDLCPU), int(lib.kDLCUDA)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DESTRUCTOR = int(ffi.cast("uintptr_t", ffi.addressof(lib, "fp8amp_py_capsule_destructor")))


def _address(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def make_capsule(managed: Any, legacy: bool) -> Any:
    """A capsule owning `managed` (a DLManagedTensorVersioned *); as a legacy DLManagedTensor when
    the consumer asked for a pre-1.0 version. On failure the tensor is released."""
    if not legacy:
        return _api.PyCapsule_New(_address(managed), VERSIONED, _DESTRUCTOR)
    if managed.flags & FLAG_READ_ONLY:
        managed.deleter(managed)
        raise BufferError("a read-only tensor cannot be exported as a legacy DLPack tensor (no read-only flag)")
    old = lib.fp8amp_py_legacy_from_versioned(managed)
    if old == NULL:
        managed.deleter(managed)
        raise MemoryError("legacy DLPack wrapper")
    return _api.PyCapsule_New(_address(old), LEGACY, _DESTRUCTOR)


def consume(capsule: Any, adopt) -> Any:
    """Hands the tensor in `capsule` to ``adopt(DLManagedTensorVersioned *) -> status`` (which takes
    ownership on success) and marks the capsule used; on failure the capsule keeps ownership and the
    status is returned for the caller to raise. Returns the status."""
    if _api.PyCapsule_IsValid(capsule, VERSIONED):
        managed = ffi.cast("struct DLManagedTensorVersioned *", _api.PyCapsule_GetPointer(capsule, VERSIONED))
        status = adopt(managed)
        if status == lib.FP8AMP_SUCCESS:
            _api.PyCapsule_SetName(capsule, USED_VERSIONED)
        return status
    if _api.PyCapsule_IsValid(capsule, LEGACY):
        old = ffi.cast("DLManagedTensor *", _api.PyCapsule_GetPointer(capsule, LEGACY))
        wrapper = lib.fp8amp_py_versioned_from_legacy(old)
        if wrapper == NULL:
            raise MemoryError("DLPack wrapper")
        status = adopt(wrapper)
        if status == lib.FP8AMP_SUCCESS:
            _api.PyCapsule_SetName(capsule, USED_LEGACY)
        else:
            lib.fp8amp_py_free_versioned_wrapper(wrapper)
        return status
    raise TypeError("not an unconsumed DLPack capsule (expected 'dltensor_versioned' or 'dltensor')")
