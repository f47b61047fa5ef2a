"""Tensors: contiguous row-major arrays on a context's device, with NumPy and DLPack interop."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from . import _dlpack
from ._args import as_int, as_shape, handle_of
from ._ffi import NULL, ffi, lib
from ._handle import Handle
from .context import Context, Device
from .dtypes import DType, as_dtype
from .errors import DtypeMismatchError, ShapeMismatchError, check
from .scaling import Scaling

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


class Tensor(Handle):
    """An fp8amp tensor. ``Tensor(ctx, shape, dtype)`` allocates one (contents unspecified);
    ``Tensor.from_numpy`` copies host data in, ``numpy()`` copies it out; ``from_dlpack`` and
    ``__dlpack__`` share memory with PyTorch, CuPy, JAX or NumPy without copying.

    An E4M3, E5M2 or F16 tensor can be bound to a Scaling (``set_scaling``) for the scaled casts.
    """

    _destroy = lib.fp8amp_tensor_destroy

    def __init__(self, ctx: Context, shape: Sequence[int], dtype: Any = DType.F32) -> None:
        ctx_h = handle_of(ctx, Context, "fp8amp_tensor_create", "ctx")
        d = as_dtype(dtype)
        shape = as_shape(shape, "fp8amp_tensor_create")
        c_shape = ffi.new("int64_t[]", list(shape) or [0])
        out = ffi.new("fp8amp_tensor *")
        check(lib.fp8amp_tensor_create(ctx_h, d, len(shape), c_shape, out))
        self._adopt(out[0], ctx)

    def _adopt(self, handle: Any, ctx: Context) -> None:
        super().__init__(handle)
        self._context = ctx  # the context whose stream __dlpack__ waits for
        self._scaling: Optional[Scaling] = None
        self._owner: Any = None  # what keeps a wrapped tensor's memory alive (Tensor.wrap/rebind)
        dtype = ffi.new("fp8amp_dtype *")
        check(lib.fp8amp_tensor_dtype(handle, dtype))
        self._dtype = DType(dtype[0])
        ndim = ffi.new("int32_t *")
        check(lib.fp8amp_tensor_ndim(handle, ndim))
        shape = ffi.new("int64_t[]", max(int(ndim[0]), 1))
        check(lib.fp8amp_tensor_shape(handle, int(ndim[0]), shape))
        self._shape = tuple(int(shape[i]) for i in range(int(ndim[0])))

    @classmethod
    def _new(cls, handle: Any, ctx: Context) -> "Tensor":
        t = cls.__new__(cls)
        t._adopt(handle, ctx)
        return t

    # ---- views over memory the caller owns ------------------------------------------------------

    @classmethod
    def wrap(cls, ctx: Context, address: int, shape: Sequence[int], dtype: Any, owner: Any = None) -> "Tensor":
        """A tensor over memory the caller owns (fp8amp_tensor_wrap): `address` is the first
        element of a contiguous row-major block on ctx's device. `owner` (any object, e.g. the
        NumPy array or torch tensor holding the memory) is kept alive with the Tensor; otherwise the
        caller keeps the memory alive while the tensor refers to it."""
        ctx_h = handle_of(ctx, Context, "fp8amp_tensor_wrap", "ctx")
        d = as_dtype(dtype)
        shape = as_shape(shape, "fp8amp_tensor_wrap")
        address = as_int(address, "fp8amp_tensor_wrap", "address", "uintptr_t")
        out = ffi.new("fp8amp_tensor *")
        check(lib.fp8amp_tensor_wrap(ctx_h, d, len(shape), list(shape) or NULL, ffi.cast("void *", address), out))
        t = cls._new(out[0], ctx)
        t._owner = owner
        return t

    def rebind(self, address: int, shape: Sequence[int], owner: Any = None) -> None:
        """Points this wrapped tensor at other memory with a new shape (fp8amp_tensor_rebind; same
        dtype and context); `owner` replaces the object kept alive. Refused (InvalidArgumentError) for
        tensors that own or imported their memory, were ever bound to a Scaling, or belong to an
        Optimizer; a failed call changes nothing."""
        shape = as_shape(shape, "fp8amp_tensor_rebind")
        address = as_int(address, "fp8amp_tensor_rebind", "address", "uintptr_t")
        check(lib.fp8amp_tensor_rebind(self._h, ffi.cast("void *", address), len(shape), list(shape) or NULL))
        self._shape = shape
        self._owner = owner

    def scale_inv(self) -> "Tensor":
        """The scale_inv this tensor's data was written with, as an F32 scalar Tensor sharing the
        tensor's slot (fp8amp_tensor_scale_inv): writing it changes what the codes stand for. Needs a
        tensor that was bound to a Scaling (InvalidArgumentError otherwise)."""
        out = ffi.new("fp8amp_tensor *")
        check(lib.fp8amp_tensor_scale_inv(self._h, out))
        return Tensor._new(out[0], self._context)

    # ---- construction from host data ----------------------------------------------------------

    @classmethod
    def from_numpy(cls, ctx: Context, array: Any, dtype: Any = None) -> "Tensor":
        """A new tensor on ctx's device holding a copy of `array`. The dtype is the array's (float32,
        float16, ml_dtypes bfloat16/float8_e4m3fn/float8_e5m2), or `dtype` for a uint8 array of raw
        codes (the bytes of FP8 data, e.g. from a framework that cannot name the FP8 dtype)."""
        import numpy as np

        handle_of(ctx, Context, "fp8amp_tensor_create", "ctx")
        a = np.asarray(array)
        if dtype is None:
            d = as_dtype(a.dtype)
        else:
            d = as_dtype(dtype)
            if a.dtype != d.numpy():
                if a.dtype.itemsize != d.itemsize or a.dtype.kind not in "uiV":
                    raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH, "fp8amp_tensor_copy_from_host: a %s "
                                             "array cannot hold %s codes" % (a.dtype, d.short_name))
                a = a.view(d.numpy())
        t = cls(ctx, a.shape, d)
        try:
            t.copy_from_numpy(a)
        except BaseException:
            t.close()
            raise
        return t

    def copy_from_numpy(self, array: Any) -> None:
        """Copies a host array of the tensor's shape and dtype into the tensor (synchronous)."""
        import numpy as np

        h = handle_of(self, Tensor, "fp8amp_tensor_copy_from_host", "self")  # a closed tensor first, as in C
        a = np.asarray(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        if a.dtype != self._dtype.numpy():
            raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH, "fp8amp_tensor_copy_from_host: the array is %s, "
                                     "the tensor %s" % (a.dtype, self._dtype.short_name))
        if tuple(a.shape) != self._shape:
            raise ShapeMismatchError(lib.FP8AMP_ERROR_SHAPE_MISMATCH, "fp8amp_tensor_copy_from_host: the array is %s, "
                                     "the tensor %s" % (a.shape, self._shape))
        check(lib.fp8amp_tensor_copy_from_host(h, ffi.cast("void *", a.ctypes.data), a.nbytes))

    def numpy(self) -> "np.ndarray":
        """A host copy as a NumPy array (ml_dtypes for BF16 and FP8; ``.view(np.uint8)`` gives the
        codes). Synchronous: waits for the work already issued on the tensor's context."""
        import numpy as np

        out = np.empty(self._shape, dtype=self._dtype.numpy())
        check(lib.fp8amp_tensor_copy_to_host(self._h, ffi.cast("void *", out.ctypes.data), out.nbytes))
        return out

    # ---- properties ---------------------------------------------------------------------------

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def numel(self) -> int:
        out = ffi.new("int64_t *")
        check(lib.fp8amp_tensor_numel(self._h, out))
        return int(out[0])

    @property
    def nbytes(self) -> int:
        out = ffi.new("size_t *")
        check(lib.fp8amp_tensor_nbytes(self._h, out))
        return int(out[0])

    @property
    def data_ptr(self) -> int:
        """The address of the data (device memory for a CUDA tensor)."""
        out = ffi.new("void **")
        check(lib.fp8amp_tensor_data(self._h, out))
        return int(ffi.cast("uintptr_t", out[0]))

    @property
    def device(self) -> Device:
        out = ffi.new("fp8amp_device *")
        check(lib.fp8amp_tensor_device(self._h, out))
        return Device._from_c(out[0])

    @property
    def context(self) -> Context:
        return self._context

    @property
    def scaling(self) -> Optional[Scaling]:
        """The Scaling this tensor is bound to (through this object), or None."""
        return self._scaling

    def set_scaling(self, scaling: Optional[Scaling]) -> None:
        """Binds this E4M3/E5M2/F16 tensor to a Scaling of the same dtype and device (None unbinds);
        the tensor's own scale_inv copy becomes the meta's current scale_inv. A closed Scaling raises
        InvalidHandleError (it is not None) and leaves the binding as it was."""
        s_h = handle_of(scaling, Scaling, "fp8amp_tensor_set_scaling", "scaling", optional=True)
        check(lib.fp8amp_tensor_set_scaling(self._h, s_h))
        self._scaling = scaling

    def __repr__(self) -> str:
        if self.closed:
            return "fp8amp.Tensor(closed)"
        return "fp8amp.Tensor(%s%s on %s)" % (self._dtype.short_name, list(self._shape), self.device)

    # ---- DLPack -------------------------------------------------------------------------------

    def __dlpack_device__(self) -> Tuple[int, int]:
        d = self.device
        return (_dlpack.KDL_CPU, 0) if d.type == "cpu" else (_dlpack.KDL_CUDA, d.index)

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """Exports the tensor without copying (the array API's protocol). The memory stays valid
        until the consumer releases it, even if this tensor is closed first. For a CUDA tensor, the
        work queued on this tensor's context is waited for first (unless stream is -1), so the data
        is ready on any consumer stream; synchronize other contexts that wrote it yourself."""
        if copy:
            raise BufferError("fp8amp exports without copying (copy=True asked for)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("fp8amp cannot export to device %r" % (tuple(dl_device),))
        if self.device.type == "cuda" and stream != -1:
            self._context.synchronize()
        out = ffi.new("struct DLManagedTensorVersioned **")
        check(lib.fp8amp_tensor_to_dlpack(self._h, out))
        if max_version is not None:
            try:
                major, _ = (operator.index(v) for v in max_version)
            except (TypeError, ValueError):
                raise TypeError("__dlpack__: max_version must be a (major, minor) pair of ints, not %r"
                                % (max_version,)) from None
        legacy = max_version is None or major < 1
        return _dlpack.make_capsule(out[0], legacy)

    @classmethod
    def from_dlpack(cls, obj: Any, ctx: Context) -> "Tensor":
        """Imports an object with ``__dlpack__`` (a torch, CuPy or JAX array; a NumPy array of
        float32/float16) or a DLPack capsule without copying: fp8amp then shares its memory and keeps
        it alive. The memory must be on ctx's device, contiguous, of an fp8amp dtype. For a CUDA
        context the producer is asked to make the data ready on the context's stream."""
        ctx_h = handle_of(ctx, Context, "fp8amp_tensor_from_dlpack", "ctx")
        capsule = obj
        if hasattr(obj, "__dlpack__"):
            stream = None
            if ctx.is_cuda:
                stream = ctx.stream or 1  # 1: the legacy default stream, in DLPack's numbering
            try:
                capsule = obj.__dlpack__(stream=stream, max_version=(1, 1))
            except TypeError:  # a producer that predates max_version
                capsule = obj.__dlpack__(stream=stream)
        out = ffi.new("fp8amp_tensor *")
        check(_dlpack.consume(capsule, lambda managed: lib.fp8amp_tensor_from_dlpack(ctx_h, managed, out)))
        return cls._new(out[0], ctx)


def from_dlpack(obj: Any, ctx: Context) -> Tensor:
    """``Tensor.from_dlpack(obj, ctx)``."""
    return Tensor.from_dlpack(obj, ctx)
