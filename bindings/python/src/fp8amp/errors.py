"""The exceptions fp8amp raises: one class per fp8amp_status, all derived from fp8amp.Error.

Each carries the status (an int, the C enum value), its name (``"FP8AMP_ERROR_SHAPE_MISMATCH"``) and
the library's message for the failed call (``"fp8amp_quantize: src is f32[4, 8] on cpu but dst is
e4m3[8, 4] on cpu"``). Where a built-in exception means the same, the class derives from it too, so
``except ValueError`` catches a shape mismatch.
"""
from __future__ import annotations

import operator
from typing import Dict, Type

from ._ffi import cstr, lib


class Error(Exception):
    """A failed fp8amp call. ``status`` is the fp8amp_status value, ``message`` the library's text."""

    status: int = -1

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def status_name(self) -> str:
        return cstr(lib.fp8amp_status_name(self.status))

    def __str__(self) -> str:
        return "%s: %s" % (self.status_name, self.message)


class InvalidArgumentError(Error, ValueError):
    """FP8AMP_ERROR_INVALID_ARGUMENT: a NULL pointer, bad enum or size, read-only target, overlap..."""


class InvalidHandleError(Error, ValueError):
    """FP8AMP_ERROR_INVALID_HANDLE: a closed, destroyed or wrong-kind handle."""


class ShapeMismatchError(Error, ValueError):
    """FP8AMP_ERROR_SHAPE_MISMATCH."""


class DtypeMismatchError(Error, TypeError):
    """FP8AMP_ERROR_DTYPE_MISMATCH."""


class DeviceMismatchError(Error, ValueError):
    """FP8AMP_ERROR_DEVICE_MISMATCH: objects of different devices in one call, or a bad ordinal."""


class OutOfMemoryError(Error, MemoryError):
    """FP8AMP_ERROR_OUT_OF_MEMORY."""


class NotSupportedError(Error):
    """FP8AMP_ERROR_NOT_SUPPORTED: this build or this machine cannot do it (the message says why)."""


class CudaError(Error, RuntimeError):
    """FP8AMP_ERROR_CUDA."""


class CublasError(Error, RuntimeError):
    """FP8AMP_ERROR_CUBLAS."""


class NcclError(Error, RuntimeError):
    """FP8AMP_ERROR_NCCL."""


class CorruptDataError(Error, ValueError):
    """FP8AMP_ERROR_CORRUPT_DATA."""


class InternalError(Error, RuntimeError):
    """FP8AMP_ERROR_INTERNAL: a bug in fp8amp."""


class CommError(Error, RuntimeError):
    """FP8AMP_ERROR_COMM: a communicator's MPI operation failed or timed out (docs/communicator.md)."""


_BY_STATUS: Dict[int, Type[Error]] = {
    lib.FP8AMP_ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    lib.FP8AMP_ERROR_INVALID_HANDLE: InvalidHandleError,
    lib.FP8AMP_ERROR_SHAPE_MISMATCH: ShapeMismatchError,
    lib.FP8AMP_ERROR_DTYPE_MISMATCH: DtypeMismatchError,
    lib.FP8AMP_ERROR_DEVICE_MISMATCH: DeviceMismatchError,
    lib.FP8AMP_ERROR_OUT_OF_MEMORY: OutOfMemoryError,
    lib.FP8AMP_ERROR_NOT_SUPPORTED: NotSupportedError,
    lib.FP8AMP_ERROR_CUDA: CudaError,
    lib.FP8AMP_ERROR_CUBLAS: CublasError,
    lib.FP8AMP_ERROR_NCCL: NcclError,
    lib.FP8AMP_ERROR_CORRUPT_DATA: CorruptDataError,
    lib.FP8AMP_ERROR_INTERNAL: InternalError,
    lib.FP8AMP_ERROR_COMM: CommError,
}


def error_class(status: int) -> Type[Error]:
    """The exception class of a status (Error itself for a status this binding does not know)."""
    return _BY_STATUS.get(operator.index(status), Error)  # a status is an int: TypeError otherwise


def check(status: int) -> None:
    """Raises the exception of a failed call's status, with the thread's last error message."""
    status = operator.index(status)
    if status != lib.FP8AMP_SUCCESS:
        raise error_class(status)(int(status), cstr(lib.fp8amp_last_error_message()))
