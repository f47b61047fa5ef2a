"""Conversion and the scaled casts. Each runs on ctx's device (asynchronously on CUDA, ordered on
the context's stream); every tensor and meta must be on that device."""
from __future__ import annotations

from typing import Optional

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


# ---- fused normalization and activation (docs/api.md 14-15): the next GEMM's input written directly ----

_NORM_KINDS = {"layernorm": "FP8AMP_NORM_LAYERNORM", "rmsnorm": "FP8AMP_NORM_RMSNORM"}
_ACTIVATIONS = {"gelu_tanh": "FP8AMP_ACTIVATION_GELU_TANH", "silu": "FP8AMP_ACTIVATION_SILU",
                "swiglu": "FP8AMP_ACTIVATION_SWIGLU"}


def _enum(table: dict, name: str, where: str, what: str) -> int:
    if name not in table:
        raise ValueError("%s: %s must be one of %s, not %r" % (where, what, ", ".join(sorted(table)), name))
    return int(getattr(lib, table[name]))


def _norm_desc(where: str, kind: str, eps: float, zero_centered_gamma: bool):
    d = ffi.new("fp8amp_norm_desc *")
    check(lib.fp8amp_norm_desc_init(d, ffi.sizeof("fp8amp_norm_desc")))
    d.kind = _enum(_NORM_KINDS, kind, where, "kind")
    d.eps = float(eps)
    d.zero_centered_gamma = 1 if zero_centered_gamma else 0
    return d


def norm_forward(ctx: Context, x: Tensor, gamma: Tensor, y: Tensor, rstd: Tensor, *, beta: Optional[Tensor] = None,
                 y_t: Optional[Tensor] = None, mean: Optional[Tensor] = None, kind: str = "layernorm",
                 eps: float = 1e-5, zero_centered_gamma: bool = False) -> None:
    """fp8amp_norm_forward: LayerNorm ("layernorm", with beta and mean) or RMSNorm ("rmsnorm") over x's
    last dimension, into y -- wide, or E4M3/E5M2 bound to a Scaling (amax and scale fused, as quantize
    writes it) with y_t its [d, rows] transpose -- and the per-row mean / rstd (F32) the backward needs."""
    where = "fp8amp_norm_forward"
    check(lib.fp8amp_norm_forward(
        handle_of(ctx, Context, where, "ctx"), _norm_desc(where, kind, eps, zero_centered_gamma),
        handle_of(x, Tensor, where, "x"), handle_of(gamma, Tensor, where, "gamma"),
        handle_of(beta, Tensor, where, "beta", optional=True), handle_of(y, Tensor, where, "y"),
        handle_of(y_t, Tensor, where, "y_t", optional=True), handle_of(mean, Tensor, where, "mean", optional=True),
        handle_of(rstd, Tensor, where, "rstd")))


def norm_backward(ctx: Context, dy: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor, dx: Tensor, dgamma: Tensor, *,
                  mean: Optional[Tensor] = None, dbeta: Optional[Tensor] = None, kind: str = "layernorm",
                  eps: float = 1e-5, zero_centered_gamma: bool = False) -> None:
    """fp8amp_norm_backward: from dy (the next GEMM's dX) and the forward's x, gamma, mean, rstd, writes
    dx, dgamma and (LayerNorm) dbeta."""
    where = "fp8amp_norm_backward"
    check(lib.fp8amp_norm_backward(
        handle_of(ctx, Context, where, "ctx"), _norm_desc(where, kind, eps, zero_centered_gamma),
        handle_of(dy, Tensor, where, "dy"), handle_of(x, Tensor, where, "x"), handle_of(gamma, Tensor, where, "gamma"),
        handle_of(mean, Tensor, where, "mean", optional=True), handle_of(rstd, Tensor, where, "rstd"),
        handle_of(dx, Tensor, where, "dx"), handle_of(dgamma, Tensor, where, "dgamma"),
        handle_of(dbeta, Tensor, where, "dbeta", optional=True)))


def activation_forward(ctx: Context, x: Tensor, y: Tensor, *, kind: str = "gelu_tanh",
                       y_t: Optional[Tensor] = None) -> None:
    """fp8amp_activation_forward: y = kind(x) ("gelu_tanh", "silu", or "swiglu" over x's two halves),
    wide or E4M3/E5M2 bound to a Scaling (amax and scale fused), with y_t its transpose."""
    where = "fp8amp_activation_forward"
    check(lib.fp8amp_activation_forward(
        handle_of(ctx, Context, where, "ctx"), _enum(_ACTIVATIONS, kind, where, "kind"),
        handle_of(x, Tensor, where, "x"), handle_of(y, Tensor, where, "y"),
        handle_of(y_t, Tensor, where, "y_t", optional=True)))


def activation_backward(ctx: Context, dy: Tensor, x: Tensor, dx: Tensor, *, kind: str = "gelu_tanh",
                        dx_t: Optional[Tensor] = None) -> None:
    """fp8amp_activation_backward: dx = dy * kind'(x), wide or E4M3/E5M2 bound to a Scaling (the previous
    GEMM's dY, quantized in the same pass), with dx_t its transpose."""
    where = "fp8amp_activation_backward"
    check(lib.fp8amp_activation_backward(
        handle_of(ctx, Context, where, "ctx"), _enum(_ACTIVATIONS, kind, where, "kind"),
        handle_of(dy, Tensor, where, "dy"), handle_of(x, Tensor, where, "x"), handle_of(dx, Tensor, where, "dx"),
        handle_of(dx_t, Tensor, where, "dx_t", optional=True)))
