"""The PyTorch front's contexts and tensor helpers: the dtype maps between torch and fp8amp, one
fp8amp context per torch device (its memory from torch's caching allocator, its stream torch's
current one) and the zero-copy conversions between torch tensors and fp8amp tensors."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

import fp8amp
from fp8amp._ffi import ffi, lib
from fp8amp.errors import DtypeMismatchError, check

_DT = {torch.float32: int(fp8amp.F32), torch.float16: int(fp8amp.F16), torch.bfloat16: int(fp8amp.BF16),
       torch.float8_e4m3fn: int(fp8amp.E4M3), torch.float8_e5m2: int(fp8amp.E5M2)}
_TORCH_DT = {fp8amp.F32: torch.float32, fp8amp.BF16: torch.bfloat16, fp8amp.F16: torch.float16,
             fp8amp.E4M3: torch.float8_e4m3fn, fp8amp.E5M2: torch.float8_e5m2}

# ---- contexts: one per torch device, its memory from torch's caching allocator -----------------

_CONTEXTS: Dict[str, fp8amp.Context] = {}


def _torch_alloc(nbytes: int, device: Any, stream: int) -> int:
    return torch.cuda.caching_allocator_alloc(nbytes, device.index, stream)


def _torch_free(ptr: int, nbytes: int, device: Any, stream: int) -> None:
    torch.cuda.caching_allocator_delete(ptr)


def _norm_device(device: Any) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def context(device: Any) -> fp8amp.Context:
    """The fp8amp context of a torch device, shared by every module and optimizer of this front.
    On CUDA its allocations go through PyTorch's caching allocator (so torch.cuda.memory_allocated
    and max_memory_allocated count them) and each call runs on torch's current stream."""
    d = _norm_device(device)
    key = str(d)
    ctx = _CONTEXTS.get(key)
    if ctx is None or ctx.closed:  # one closed by user code is replaced, not handed out forever
        ctx = fp8amp.Context(key)
        if d.type == "cuda":
            ctx.set_stream(torch.cuda.current_stream(d).cuda_stream)
            ctx.set_allocator(_torch_alloc, _torch_free)
        ctx._torch_stream = None  # type: ignore[attr-defined]  # last stream set, to skip redundant calls
        _CONTEXTS[key] = ctx
    return ctx


def _raw_stream(index: int) -> int:
    """torch's current CUDA stream of device `index`, as an int. The public API: it makes a Stream
    object per call, about a microsecond more than torch's private raw-stream getter, which this
    front no longer uses."""
    return torch.cuda.current_stream(index).cuda_stream


def _on_current_stream(ctx: fp8amp.Context, device: torch.device) -> None:
    if device.type != "cuda":
        return
    s = _raw_stream(device.index)
    if s != ctx._torch_stream:  # type: ignore[attr-defined]
        check(lib.fp8amp_context_set_stream(ctx.handle, ffi.cast("void *", s)))
        ctx._torch_stream = s  # type: ignore[attr-defined]


def _wrap(ctx_h: Any, t: torch.Tensor) -> Any:
    """A borrowed fp8amp tensor handle over a contiguous torch tensor (destroy it after the call)."""
    out = ffi.new("fp8amp_tensor *")
    dt = _DT.get(t.dtype)
    if dt is None:
        raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH, "fp8amp_tensor_wrap: fp8amp takes float32, float16, "
                                 "bfloat16 or float8 tensors, not %s" % t.dtype)  # also a TypeError
    check(lib.fp8amp_tensor_wrap(ctx_h, dt, t.dim(), ffi.new("int64_t[]", t.shape), ffi.cast("void *", t.data_ptr()),
                                 out))
    return out[0]


def to_fp8amp(t: torch.Tensor, ctx: Optional[fp8amp.Context] = None) -> fp8amp.Tensor:
    """A zero-copy fp8amp.Tensor sharing a (contiguous) torch tensor's memory, kept alive by it."""
    if ctx is None:
        ctx = context(t.device)
    return fp8amp.from_dlpack(t.detach(), ctx)


def _from_fp8amp(t: fp8amp.Tensor) -> torch.Tensor:
    return torch.from_dlpack(t)
