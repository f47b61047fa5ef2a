"""fp8amp: FP8 mixed-precision training engine, Python binding.

A CFFI module generated from the public C header (``fp8amp.h``) and a Pythonic layer over it:
``Context``, ``Tensor`` (NumPy via ml_dtypes, DLPack zero copy with PyTorch, CuPy, JAX), ``Recipe``
and ``Scaling``, the casts (``cast``, ``quantize``, ``quantize_transpose``, ``dequantize``,
``amax``), the FP8 ``Linear``, the ``Optimizer`` (Adam/AdamW at O1/O2/O3) and ``GradScaler``, and
the ``Error`` hierarchy. The PyTorch front is ``fp8amp.torch`` (imported only when asked for). Needs no PyTorch.

    import numpy as np, fp8amp
    with fp8amp.Context("cpu") as ctx:
        x = fp8amp.Tensor.from_numpy(ctx, np.linspace(-3, 3, 8, dtype=np.float32))
        meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), fp8amp.E4M3)
        q = fp8amp.Tensor(ctx, x.shape, fp8amp.E4M3)
        q.set_scaling(meta)
        fp8amp.quantize(ctx, x, q)
        print(q.numpy(), meta.get())
"""
from ._ffi import ffi as _ffi
from ._ffi import lib as _lib
from .context import Context, Device, device_count
from .dtypes import BF16, E4M3, E5M2, F16, F32, DType, as_dtype
from .errors import (CorruptDataError, CublasError, CudaError, DeviceMismatchError, DtypeMismatchError, Error,
                     InternalError, InvalidArgumentError, InvalidHandleError, NcclError, NotSupportedError,
                     OutOfMemoryError, ShapeMismatchError, check, error_class)
from .ops import (activation_backward, activation_forward, amax, cast, dequantize, norm_backward, norm_forward,
                  quantize, quantize_transpose)
from .scaling import AmaxAlgo, Format, Recipe, ScaleState, Scaling, ScalingMode, Stats, update_many
from .tensor import Tensor, from_dlpack
from .linear import GemmKind, GemmPolicy, Linear, Role
from .optim import AdamConfig, GradScaler, MasterRounding, OptLevel, Optimizer
from .comm import Communicator
from .errors import CommError

#: The version of the header the module was compiled against (major * 10000 + minor * 100 + patch).
HEADER_VERSION: int = int(_lib.FP8AMP_VERSION)


def library_version() -> int:
    """The loaded libfp8amp's version, encoded like HEADER_VERSION."""
    return int(_lib.fp8amp_version())


def _check_abi() -> None:
    lib_v, hdr_v = library_version(), HEADER_VERSION
    if lib_v // 10000 != hdr_v // 10000 or lib_v // 100 % 100 < hdr_v // 100 % 100:
        raise ImportError("libfp8amp %d is not compatible with the header %d this module was built against"
                          % (lib_v, hdr_v))


_check_abi()
__version__ = "%d.%d.%d" % (HEADER_VERSION // 10000, HEADER_VERSION // 100 % 100, HEADER_VERSION % 100)

__all__ = [
    "Context", "Device", "device_count", "DType", "F32", "F16", "BF16", "E4M3", "E5M2", "as_dtype", "Tensor",
    "from_dlpack", "Recipe", "Format", "ScalingMode", "AmaxAlgo", "Scaling", "ScaleState", "Stats", "update_many",
    "cast", "quantize", "quantize_transpose", "dequantize", "amax", "norm_forward", "norm_backward",
    "activation_forward", "activation_backward", "Error", "InvalidArgumentError",
    "InvalidHandleError", "ShapeMismatchError", "DtypeMismatchError", "DeviceMismatchError", "OutOfMemoryError",
    "NotSupportedError", "CudaError", "CublasError", "NcclError", "CorruptDataError", "InternalError", "check",
    "error_class", "HEADER_VERSION", "library_version", "Linear", "GemmPolicy", "GemmKind", "Role", "Optimizer",
    "GradScaler", "AdamConfig", "MasterRounding", "OptLevel", "Communicator", "CommError",
]
