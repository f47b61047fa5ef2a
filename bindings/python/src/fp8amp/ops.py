"""Conversion and the scaled casts. Each runs on ctx's device (asynchronously on CUDA, ordered on
the context's stream); every tensor and meta must be on that device."""
from __future__ import annotations

from ._ffi import ffi, lib
from .context import Context
from .errors import check
from .tensor import Tensor


def cast(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = convert(src) with scale 1 (round to nearest even; saturating into FP8, IEEE into F16/BF16)."""
    check(lib.fp8amp_cast(ctx.handle, src.handle, dst.handle))


def quantize(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = satfinite(src * scale) in one pass, recording amax into dst's Scaling. src is F32, F16 or
    BF16; dst is E4M3, E5M2 or F16, bound to a Scaling (Tensor.set_scaling)."""
    check(lib.fp8amp_quantize(ctx.handle, src.handle, dst.handle))


def quantize_transpose(ctx: Context, src: Tensor, dst: Tensor, dst_t: Tensor) -> None:
    """quantize, also writing dst_t = transpose(dst) ([cols, rows]); dst and dst_t share one Scaling."""
    check(lib.fp8amp_quantize_transpose(ctx.handle, src.handle, dst.handle, dst_t.handle))


def dequantize(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = decode(src) * src's own scale_inv copy; src E4M3/E5M2/F16 bound to a Scaling, dst F32/F16/BF16."""
    check(lib.fp8amp_dequantize(ctx.handle, src.handle, dst.handle))


def amax(ctx: Context, t: Tensor) -> float:
    """max |t| (NaN counts as inf); synchronous."""
    out = ffi.new("float *")
    check(lib.fp8amp_amax(ctx.handle, t.handle, out))
    return float(out[0])
