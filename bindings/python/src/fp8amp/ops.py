"""Conversion and the scaled casts. Each runs on ctx's device (asynchronously on CUDA, ordered on
the context's stream); every tensor and meta must be on that device."""
from __future__ import annotations

from ._args import handle_of
from ._ffi import ffi, lib
from .context import Context
from .errors import check
from .tensor import Tensor


def cast(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = convert(src) with scale 1 (round to nearest even; saturating into FP8, IEEE into F16/BF16)."""
    ctx_h = handle_of(ctx, Context, "fp8amp_cast", "ctx")
    src_h = handle_of(src, Tensor, "fp8amp_cast", "src")
    dst_h = handle_of(dst, Tensor, "fp8amp_cast", "dst")
    check(lib.fp8amp_cast(ctx_h, src_h, dst_h))


def quantize(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = satfinite(src * scale) in one pass, recording amax into dst's Scaling. src is F32, F16 or
    BF16; dst is E4M3, E5M2 or F16, bound to a Scaling (Tensor.set_scaling)."""
    ctx_h = handle_of(ctx, Context, "fp8amp_quantize", "ctx")
    src_h = handle_of(src, Tensor, "fp8amp_quantize", "src")
    dst_h = handle_of(dst, Tensor, "fp8amp_quantize", "dst")
    check(lib.fp8amp_quantize(ctx_h, src_h, dst_h))


def quantize_transpose(ctx: Context, src: Tensor, dst: Tensor, dst_t: Tensor) -> None:
    """quantize, also writing dst_t = transpose(dst) ([cols, rows]); dst and dst_t share one Scaling."""
    ctx_h = handle_of(ctx, Context, "fp8amp_quantize_transpose", "ctx")
    src_h = handle_of(src, Tensor, "fp8amp_quantize_transpose", "src")
    dst_h = handle_of(dst, Tensor, "fp8amp_quantize_transpose", "dst")
    dst_t_h = handle_of(dst_t, Tensor, "fp8amp_quantize_transpose", "dst_t")
    check(lib.fp8amp_quantize_transpose(ctx_h, src_h, dst_h, dst_t_h))


def dequantize(ctx: Context, src: Tensor, dst: Tensor) -> None:
    """dst = decode(src) * src's own scale_inv copy; src E4M3/E5M2/F16 bound to a Scaling, dst F32/F16/BF16."""
    ctx_h = handle_of(ctx, Context, "fp8amp_dequantize", "ctx")
    src_h = handle_of(src, Tensor, "fp8amp_dequantize", "src")
    dst_h = handle_of(dst, Tensor, "fp8amp_dequantize", "dst")
    check(lib.fp8amp_dequantize(ctx_h, src_h, dst_h))


def amax(ctx: Context, t: Tensor) -> float:
    """max |t| (NaN counts as inf); synchronous."""
    out = ffi.new("float *")
    ctx_h = handle_of(ctx, Context, "fp8amp_amax", "ctx")
    t_h = handle_of(t, Tensor, "fp8amp_amax", "t")
    check(lib.fp8amp_amax(ctx_h, t_h, out))
    return float(out[0])
