"""Error mapping: each fp8amp_status raises its own class, carrying the status, its name and the
library's message for that call; bad input leaves objects unchanged."""
import numpy as np
import pytest

import fp8amp
from fp8amp import _lib as lib

ALL = [
    ("FP8AMP_ERROR_INVALID_ARGUMENT", fp8amp.InvalidArgumentError, ValueError),
    ("FP8AMP_ERROR_INVALID_HANDLE", fp8amp.InvalidHandleError, ValueError),
    ("FP8AMP_ERROR_SHAPE_MISMATCH", fp8amp.ShapeMismatchError, ValueError),
    ("FP8AMP_ERROR_DTYPE_MISMATCH", fp8amp.DtypeMismatchError, TypeError),
    ("FP8AMP_ERROR_DEVICE_MISMATCH", fp8amp.DeviceMismatchError, ValueError),
    ("FP8AMP_ERROR_OUT_OF_MEMORY", fp8amp.OutOfMemoryError, MemoryError),
    ("FP8AMP_ERROR_NOT_SUPPORTED", fp8amp.NotSupportedError, fp8amp.Error),
    ("FP8AMP_ERROR_CUDA", fp8amp.CudaError, RuntimeError),
    ("FP8AMP_ERROR_CUBLAS", fp8amp.CublasError, RuntimeError),
    ("FP8AMP_ERROR_NCCL", fp8amp.NcclError, RuntimeError),
    ("FP8AMP_ERROR_CORRUPT_DATA", fp8amp.CorruptDataError, ValueError),
    ("FP8AMP_ERROR_INTERNAL", fp8amp.InternalError, RuntimeError),
    ("FP8AMP_ERROR_COMM", fp8amp.CommError, RuntimeError),
]


@pytest.mark.parametrize("name,cls,builtin", ALL, ids=[a[0] for a in ALL])
def test_every_status_has_its_class(name, cls, builtin):
    status = getattr(lib, name)
    assert fp8amp.error_class(status) is cls
    e = cls(status, "m")
    assert isinstance(e, fp8amp.Error) and isinstance(e, builtin)
    assert e.status == status and e.status_name == name and str(e) == name + ": m"
    with pytest.raises(cls):
        raise e
    assert fp8amp.error_class(999) is fp8amp.Error
    fp8amp.check(lib.FP8AMP_SUCCESS)  # no exception


def raised(fn, cls, fragment):
    with pytest.raises(cls) as info:
        fn()
    e = info.value
    assert fp8amp.error_class(e.status) is cls
    assert e.message.startswith("fp8amp_") and fragment in e.message, e.message
    return e


def test_real_calls_raise_the_mapped_class(ctx):
    x = fp8amp.Tensor(ctx, (4, 8), fp8amp.F32)
    q = fp8amp.Tensor(ctx, (8, 4), fp8amp.E4M3)
    meta = fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=2), fp8amp.E4M3)
    raised(lambda: fp8amp.Tensor(ctx, (4, 0), fp8amp.F32), fp8amp.InvalidArgumentError, "extent")
    raised(lambda: fp8amp.Scaling(ctx, fp8amp.Recipe(margin=200)), fp8amp.InvalidArgumentError, "margin")
    raised(lambda: fp8amp.Scaling(ctx, None, fp8amp.BF16), fp8amp.DtypeMismatchError, "e4m3, e5m2 or f16")
    raised(lambda: fp8amp.quantize(ctx, x, q), fp8amp.InvalidArgumentError, "not bound")
    q.set_scaling(meta)
    raised(lambda: fp8amp.quantize(ctx, x, q), fp8amp.ShapeMismatchError, "f32[4, 8]")
    raised(lambda: fp8amp.quantize(ctx, q, x), fp8amp.DtypeMismatchError, "must be f32, f16 or bf16")
    raised(lambda: q.set_scaling(fp8amp.Scaling(ctx, None, fp8amp.E5M2)), fp8amp.DtypeMismatchError, "e5m2")
    raised(lambda: meta.set_scale(0.0), fp8amp.InvalidArgumentError, "scale")
    x.close()
    raised(lambda: x.numpy(), fp8amp.InvalidHandleError, "")
    raised(lambda: fp8amp.amax(ctx, x), fp8amp.InvalidHandleError, "")
    # Python-side checks use the same classes
    with pytest.raises(fp8amp.ShapeMismatchError):
        q.copy_from_numpy(np.zeros((4, 8), q.dtype.numpy()))
    with pytest.raises(fp8amp.DtypeMismatchError):
        q.copy_from_numpy(np.zeros((8, 4), np.float32))
    # nothing changed by the failures
    assert meta.get() == (1.0, 1.0, 0.0)
    for o in (q, meta):
        o.close()


def test_cuda_unavailable_or_mismatched():
    if fp8amp.device_count("cuda") == 0:
        e = raised(lambda: fp8amp.Context("cuda"), fp8amp.NotSupportedError, "")
        assert len(e.message) > len("fp8amp_context_create: ")
        return
    with fp8amp.Context("cpu") as cpu, fp8amp.Context("cuda") as gpu:
        a = fp8amp.Tensor(cpu, (4,), fp8amp.F32)
        b = fp8amp.Tensor(gpu, (4,), fp8amp.F32)
        raised(lambda: fp8amp.cast(gpu, a, b), fp8amp.DeviceMismatchError, "cpu")
        raised(lambda: fp8amp.Context("cuda:%d" % fp8amp.device_count("cuda")), fp8amp.DeviceMismatchError, "")


def test_dtype_names():
    assert fp8amp.as_dtype("float8_e4m3fn") is fp8amp.E4M3 and fp8amp.as_dtype("bf16") is fp8amp.BF16
    assert fp8amp.as_dtype(np.float16) is fp8amp.F16 and fp8amp.as_dtype(4) is fp8amp.E5M2
    with pytest.raises(TypeError):
        fp8amp.as_dtype(np.int32)
    assert [d.itemsize for d in fp8amp.DType] == [4, 2, 2, 1, 1]
