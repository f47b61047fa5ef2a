"""Fused blocks on fp8amp's kernels (issue 19): ``LayerNormLinear`` (LayerNorm -> Linear) and
``LayerNormMLP`` (LayerNorm -> Linear -> GELU(tanh) -> Linear), with the parameters and state_dict
keys of their nn compositions::

    LayerNormLinear(i, o)  ~ nn.Sequential(OrderedDict(norm=nn.LayerNorm(i), linear=nn.Linear(i, o)))
    LayerNormMLP(h, f)     ~ nn.Sequential(OrderedDict(norm=nn.LayerNorm(h), fc1=nn.Linear(h, f),
                                                       act=nn.GELU(approximate="tanh"), fc2=nn.Linear(f, h)))

so ``load_state_dict`` moves weights between the two either way (keys ``norm.weight``,
``norm.bias``, ``linear.weight`` ... / ``fc1.weight`` ...; an E4M3 (O3) Linear adds its
``weight_scale_inv`` buffer, as fp8amp.torch.Linear does). ``normalization="RMSNorm"`` puts an RMSNorm
(nn.RMSNorm's ``norm.weight``, no bias) in place of the LayerNorm; ``LayerNormMLP(activation=...)``
takes "gelu" (tanh), "silu" or "swiglu" (fc1 then has 2f outputs [gate, up], act = silu(gate) * up).
The modules ``LayerNorm``, ``RMSNorm``, ``GELU``, ``SiLU`` and ``SwiGLU`` are usable on their own.

The norms run ``fp8amp_norm_forward`` / ``fp8amp_norm_backward`` (one pass each; mean and rstd kept
for the backward, dgamma/dbeta summed in a fixed order), the activations ``fp8amp_activation_forward``
/ ``_backward``, the Linears are fp8amp.torch.Linear (FP8 GEMMs). The norm's and the activation's
outputs are written in the autocast dtype (bf16 under ``torch.autocast``; the input's dtype
otherwise). Where the next Linear runs an FP8 GEMM for the input's rows (``fp8amp_linear_choose_gemm``;
the eager path, parameters not replaced), the norm (and in ``LayerNormMLP`` also the activation) kernel
writes that GEMM's E4M3 operand itself, bound to the Linear's INPUT meta, and the Linear takes it
(``fp8amp_linear_forward_fp8``): the norm's output is never written in a wide dtype and read again to
be quantized. Elsewhere (torch.compile, FSDP2's replaced parameters, AUTO choosing a BF16 GEMM) each
block runs as the composition, the Linear quantizing its input in its own pass.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

import fp8amp

from fp8amp._ffi import lib
from fp8amp.errors import NotSupportedError, check
from fp8amp.linear import Role

from .context import _wrap
from .linear import (Linear, _ac_dtype, _ac_enabled, _bwd, _compiling, _fwd_fp8, _grad_enabled, _norm_device,
                     _on_current_stream, _prepare, context, to_fp8amp)

__all__ = ["LayerNorm", "RMSNorm", "GELU", "SiLU", "SwiGLU", "LayerNormLinear", "LayerNormMLP"]


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return _ac_dtype(dev) if _ac_enabled(dev) else x.dtype


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    return t.reshape(t.numel() // d, d)


def _eps(norm: Any, x: torch.Tensor) -> float:
    """The norm's eps; RMSNorm's None is torch.finfo(x.dtype).eps, as nn.RMSNorm reads it."""
    return norm.eps if norm.eps is not None else float(torch.finfo(x.dtype).eps)


def _norm_forward(norm: Any, x: torch.Tensor, y: Any):
    """fp8amp_norm_forward of x ([..., d], contiguous) into y (an fp8amp tensor of [rows, d]): returns
    (mean, rstd) as [rows] F32 tensors (mean None for RMSNorm)."""
    ctx = norm._ctx
    d = x.shape[-1]
    rows = x.numel() // d
    rms = norm._kind == "rmsnorm"
    mean = None if rms else torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    fp8amp.norm_forward(ctx, to_fp8amp(_rows(x, d), ctx), to_fp8amp(norm.weight.detach(), ctx), y,
                        to_fp8amp(rstd, ctx),
                        beta=to_fp8amp(norm.bias.detach(), ctx) if norm.bias is not None else None,
                        mean=to_fp8amp(mean, ctx) if mean is not None else None, kind=norm._kind, eps=_eps(norm, x))
    return mean, rstd


def _norm_backward(norm: Any, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: Any,
                   rstd: torch.Tensor, has_bias: bool):
    ctx = norm._ctx
    _on_current_stream(ctx, x.device)
    if dy.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        dy = dy.float()
    dy = dy.contiguous()
    d = x.shape[-1]
    dx = torch.empty_like(x)
    dg = torch.empty(d, dtype=torch.float32, device=x.device)
    db = torch.empty(d, dtype=torch.float32, device=x.device) if has_bias else None
    fp8amp.norm_backward(ctx, to_fp8amp(_rows(dy, d), ctx), to_fp8amp(_rows(x, d), ctx),
                         to_fp8amp(weight.detach(), ctx), to_fp8amp(rstd, ctx), to_fp8amp(_rows(dx, d), ctx),
                         to_fp8amp(dg, ctx), mean=to_fp8amp(mean, ctx) if mean is not None else None,
                         dbeta=to_fp8amp(db, ctx) if db is not None else None, kind=norm._kind, eps=_eps(norm, x))
    return dx, dg.to(weight.dtype), (db.to(weight.dtype) if db is not None else None)


class _NormFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, mod):  # type: ignore[override]
        _on_current_stream(mod._ctx, x.device)
        x = x.contiguous()
        d = x.shape[-1]
        y = torch.empty(x.shape, dtype=_out_dtype(x), device=x.device)
        mean, rstd = _norm_forward(mod, x, to_fp8amp(_rows(y, d), mod._ctx))
        fctx.save_for_backward(x, weight, mean, rstd)
        fctx.mod, fctx.has_bias = mod, bias is not None
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        x, weight, mean, rstd = fctx.saved_tensors
        dx, dg, db = _norm_backward(fctx.mod, dy, x, weight, mean, rstd, fctx.has_bias)
        return dx, dg, db, None


class LayerNorm(nn.Module):
    """nn.LayerNorm over the last dimension (``weight``, ``bias`` F32 parameters of its names) on
    fp8amp's fused LayerNorm kernels; the output is in the autocast dtype (see the module doc)."""

    _kind = "layernorm"

    def __init__(self, normalized_shape: int, eps: float = 1e-5, bias: bool = True, device: Any = None) -> None:
        super().__init__()
        dev = _norm_device(device if device is not None else "cpu")
        self.normalized_shape = (int(normalized_shape),)
        self.eps = float(eps)
        self._ctx = context(dev)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, dtype=torch.float32, device=dev))
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape, dtype=torch.float32, device=dev))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if x.shape[-1] != self.normalized_shape[0]:
            raise RuntimeError("fp8amp %s(%d) got an input of shape %s" % (type(self).__name__,
                                                                          self.normalized_shape[0], tuple(x.shape)))
        return _NormFn.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        return "%s, eps=%g, bias=%s" % (self.normalized_shape, self.eps, self.bias is not None)


class RMSNorm(LayerNorm):
    """nn.RMSNorm over the last dimension (an F32 ``weight``; eps None: torch.finfo of the input's
    dtype, as nn.RMSNorm) on fp8amp's fused RMSNorm kernels; the output is in the autocast dtype."""

    _kind = "rmsnorm"

    def __init__(self, normalized_shape: int, eps: Any = None, device: Any = None) -> None:
        super().__init__(normalized_shape, bias=False, device=device)
        self.eps = None if eps is None else float(eps)

    def extra_repr(self) -> str:
        return "%s, eps=%s" % (self.normalized_shape, self.eps)


def _act_out_shape(kind: str, shape: Any) -> Any:
    """The activation's output shape: SwiGLU halves the last dimension."""
    return tuple(shape[:-1]) + (shape[-1] // 2,) if kind == "swiglu" else tuple(shape)


class _ActFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, mod):  # type: ignore[override]
        ctx, kind = mod._ctx, mod._kind
        _on_current_stream(ctx, x.device)
        x = x.contiguous()
        y = torch.empty(_act_out_shape(kind, x.shape), dtype=_out_dtype(x), device=x.device)
        fp8amp.activation_forward(ctx, to_fp8amp(_rows(x, x.shape[-1]), ctx), to_fp8amp(_rows(y, y.shape[-1]), ctx),
                                  kind=kind)
        fctx.save_for_backward(x)
        fctx.mod = mod
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        (x,) = fctx.saved_tensors
        return _act_backward(fctx.mod, dy, x), None


def _act_backward(mod: Any, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ctx = mod._ctx
    _on_current_stream(ctx, x.device)
    dy = dy.contiguous()
    dx = torch.empty(x.shape, dtype=dy.dtype, device=x.device)
    fp8amp.activation_backward(ctx, to_fp8amp(_rows(dy, dy.shape[-1]), ctx), to_fp8amp(_rows(x, x.shape[-1]), ctx),
                               to_fp8amp(_rows(dx, x.shape[-1]), ctx), kind=mod._kind)
    return dx


class _Activation(nn.Module):
    _kind = ""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self._ctx = context(_norm_device(device if device is not None else "cpu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._kind == "swiglu" and x.shape[-1] % 2:
            raise RuntimeError("fp8amp SwiGLU takes an even last dimension (two halves), got %s" % (tuple(x.shape),))
        return _ActFn.apply(x, self)


class GELU(_Activation):
    """nn.GELU(approximate="tanh") on fp8amp's fused activation kernels (no parameters)."""

    _kind = "gelu_tanh"


class SiLU(_Activation):
    """nn.SiLU on fp8amp's fused activation kernels (no parameters)."""

    _kind = "silu"


class SwiGLU(_Activation):
    """silu(a) * b over the two halves of the last dimension, x = [a, b] ([..., 2f] -> [..., f]), on
    fp8amp's fused activation kernels (no parameters): the gated MLP's activation (LLaMA's FFN with
    the gate and up projections as one Linear of 2f outputs)."""

    _kind = "swiglu"


# ---- the norm or activation writing the next Linear's FP8 input -----------------------------------
#
# Where the Linear runs an FP8 GEMM for this many rows (fp8amp_linear_choose_gemm: AUTO keeps its wide
# GEMMs where FP8 does not pay), the LayerNorm (or GELU) kernel writes the GEMM's E4M3 operand itself,
# into a handle bound to the Linear's INPUT meta, and the Linear takes it (fp8amp_linear_forward_fp8):
# no wide copy of the norm's output is written and read again to be quantized. The backward is the
# Linear's (dx in the wide dtype the composition's norm output would have), then the norm's. The
# composition runs instead under torch.compile, with replaced parameters (FSDP2), or where the Linear
# would run a wide GEMM.


class _Fp8Input:
    """The E4M3 operand a producer writes for one Linear: a handle over each call's torch buffer,
    bound to that Linear's INPUT meta (its own scale_inv slot is what the norm writes and the GEMM
    reads). A bound handle cannot be re-pointed at other memory (its scale_inv belongs to the data),
    so each call makes one (dropped after the call) and only the meta's handle is kept."""

    def __init__(self, lin: Linear) -> None:
        self.lin = lin
        self.meta: Any = None

    def bind(self, x8: torch.Tensor) -> Any:
        st = self.lin._st
        if self.meta is None:
            self.meta = self.lin.fp8amp_linear.scaling(Role.INPUT)
        t = fp8amp.Tensor._new(_wrap(st.ctx_h, x8), st.ctx)
        check(lib.fp8amp_tensor_set_scaling(t.handle, self.meta.handle))
        return t


def _fp8_fed(lin: Linear, x: torch.Tensor, training: bool) -> bool:
    """Whether a producer may write lin's input in FP8 for x: the eager path of a Linear whose
    parameters are its own, on x's device, running an FP8 GEMM for x's rows."""
    st = lin._st
    params = lin._parameters
    if params["weight"] is not st.weight or params["bias"] is not st.bias or x.is_cuda is not st.cuda:
        return False
    if _compiling():
        return False
    try:
        return lin.fp8amp_linear.choose_gemm(x.numel() // x.shape[-1], training) == fp8amp.GemmKind.FP8
    except NotSupportedError:  # ALWAYS_FP8 on a shape FP8 cannot take: the composition says so
        return False


def _needs_grad(*ts: Any) -> bool:
    return _grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _norm_into(mod: Any, x: torch.Tensor, training: bool):
    """The fused forward: the block's norm into its first Linear's E4M3 input, then that Linear.
    Returns y, mean, rstd."""
    norm, lin = mod.norm, mod._fp8_in.lin
    st = lin._st
    _prepare(st)
    _on_current_stream(norm._ctx, x.device)
    d = x.shape[-1]
    x8 = torch.empty((x.numel() // d, d), dtype=torch.float8_e4m3fn, device=x.device)  # the Linear sees [rows, d]
    h8 = mod._fp8_in.bind(x8)
    mean, rstd = _norm_forward(norm, x, h8)
    y = _fwd_fp8(st, h8.handle, tuple(x8.shape), _out_dtype(x), x.device, 1 if training else 0)
    return y.view(tuple(x.shape[:-1]) + (st.n,)), mean, rstd


class _NormLinearFn(torch.autograd.Function):
    """norm -> Linear, the norm writing the Linear's E4M3 input (see above)."""

    @staticmethod
    def forward(fctx, x, nw, nb, w, b, mod):  # type: ignore[override]
        # nw, nb, w, b: the parameters, inputs so that autograd runs their AccumulateGrad nodes
        x = x.contiguous()
        y, mean, rstd = _norm_into(mod, x, True)
        fctx.save_for_backward(x, nw, mean, rstd)
        fctx.mod, fctx.fwd_id, fctx.ldt, fctx.has_nb = mod, mod._fp8_in.lin._st.fwd_id, y.dtype, nb is not None
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        x, nw, mean, rstd = fctx.saved_tensors
        mod = fctx.mod
        st = mod._fp8_in.lin._st
        if fctx.fwd_id != st.fwd_id or st.bwd_id == fctx.fwd_id:
            # not the C Linear's last training forward (the Linear ran another since): recompute it
            # from the saved x, as fp8amp.torch.Linear's backward does from its input
            _norm_into(mod, x, True)
        d = x.shape[-1]
        dxl = torch.empty((x.numel() // d, d), dtype=fctx.ldt, device=x.device)  # the norm output's gradient
        _bwd(st, dy.reshape(dxl.shape[0], st.n), dxl)  # the C Linear saw [rows, d] -> [rows, n]
        st.bwd_id = st.fwd_id
        dx, dg, db = _norm_backward(mod.norm, dxl, x, nw, mean, rstd, fctx.has_nb)
        need = fctx.needs_input_grad
        return (dx if need[0] else None, dg if need[1] else None, db if need[2] else None,
                st.wref if need[3] else None, st.bref if need[4] else None, None)


def _act_into(mod: "LayerNormMLP", h: torch.Tensor, training: bool) -> torch.Tensor:
    """The fused forward: the activation into fc2's E4M3 input, then fc2."""
    st = mod.fc2._st
    act = mod.act
    _prepare(st)
    _on_current_stream(act._ctx, h.device)
    f_in = h.shape[-1]
    rows = h.numel() // f_in
    f = _act_out_shape(act._kind, h.shape)[-1]
    x8 = torch.empty((rows, f), dtype=torch.float8_e4m3fn, device=h.device)  # the Linear sees [rows, f]
    h8 = mod._fp8_in2.bind(x8)
    fp8amp.activation_forward(act._ctx, to_fp8amp(_rows(h, f_in), act._ctx), h8, kind=act._kind)
    y = _fwd_fp8(st, h8.handle, (rows, f), _out_dtype(h), h.device, 1 if training else 0)
    return y.view(tuple(h.shape[:-1]) + (st.n,))


class _ActLinearFn(torch.autograd.Function):
    """activation -> Linear, the activation writing the Linear's E4M3 input (see above)."""

    @staticmethod
    def forward(fctx, h, w, b, mod):  # type: ignore[override]
        h = h.contiguous()
        y = _act_into(mod, h, True)
        fctx.save_for_backward(h)
        fctx.mod, fctx.fwd_id, fctx.ldt = mod, mod.fc2._st.fwd_id, y.dtype
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        (h,) = fctx.saved_tensors
        mod = fctx.mod
        st = mod.fc2._st
        if fctx.fwd_id != st.fwd_id or st.bwd_id == fctx.fwd_id:
            _act_into(mod, h, True)  # recompute (see _NormLinearFn)
        f = _act_out_shape(mod.act._kind, h.shape)[-1]
        da = torch.empty((h.numel() // h.shape[-1], f), dtype=fctx.ldt, device=h.device)  # the activation output's gradient
        _bwd(st, dy.reshape(da.shape[0], st.n), da)  # the C Linear saw [rows, f] -> [rows, n]
        st.bwd_id = st.fwd_id
        need = fctx.needs_input_grad
        dh = _act_backward(mod.act, da, h) if need[0] else None
        return dh, st.wref if need[1] else None, st.bref if need[2] else None, None


_NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
_ACTS = {"gelu": GELU, "silu": SiLU, "swiglu": SwiGLU}


def _make_norm(where: str, normalization: str, features: int, eps: float, norm_bias: Any, device: Any) -> nn.Module:
    """The block's norm: LayerNorm (norm_bias None: with a bias) or RMSNorm (no bias)."""
    key = str(normalization).lower()
    if key not in _NORMS:
        raise ValueError("%s: normalization must be 'LayerNorm' or 'RMSNorm', not %r" % (where, normalization))
    if key == "rmsnorm":
        if norm_bias:
            raise ValueError("%s: RMSNorm has no bias (norm_bias must be None or False)" % where)
        return RMSNorm(features, eps=eps, device=device)
    return LayerNorm(features, eps=eps, bias=norm_bias is None or bool(norm_bias), device=device)


class LayerNormLinear(nn.Module):
    """LayerNorm(in_features) (or RMSNorm: ``normalization="RMSNorm"``) -> fp8amp.torch.Linear(in_features,
    out_features). Submodules ``norm`` and ``linear``: the parameters and state_dict keys of
    ``nn.Sequential(OrderedDict(norm=nn.LayerNorm(in_features), linear=nn.Linear(in_features, out_features)))``
    (nn.RMSNorm's with RMSNorm). Keyword arguments beyond ``eps`` go to fp8amp.torch.Linear (weight_dtype,
    wgrad_dtype, policy, recipe, graph_replay). ``norm_bias``: the LayerNorm's bias (None: yes; RMSNorm
    has none)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 device: Any = None, norm_bias: Any = None, normalization: str = "LayerNorm",
                 **linear_kw: Any) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.norm = _make_norm("fp8amp LayerNormLinear", normalization, in_features, eps, norm_bias, device)
        self.linear = Linear(in_features, out_features, bias=bias, device=device, **linear_kw)
        self._fp8_in = _Fp8Input(self.linear)  # the block's first Linear (what _norm_into feeds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        norm, lin = self.norm, self.linear
        if x.shape[-1] != self.in_features:
            raise RuntimeError("fp8amp LayerNormLinear(%d, ...) got an input of shape %s" % (self.in_features,
                                                                                          tuple(x.shape)))
        nw, nb, w, b = norm.weight, norm.bias, lin._st.weight, lin._st.bias
        training = _needs_grad(x, nw, nb, w, b)
        if not _fp8_fed(lin, x, training):
            return lin(norm(x))
        if training:
            return _NormLinearFn.apply(x, nw, nb, w, b, self)
        return _norm_into(self, x.contiguous(), False)[0]


class LayerNormMLP(nn.Module):
    """LayerNorm(hidden) -> Linear(hidden, ffn_hidden) -> GELU(tanh) -> Linear(ffn_hidden, hidden), the
    transformer MLP. Submodules ``norm``, ``fc1``, ``act``, ``fc2``: the parameters and state_dict keys
    of ``nn.Sequential(OrderedDict(norm=nn.LayerNorm(h), fc1=nn.Linear(h, f), act=nn.GELU("tanh"),
    fc2=nn.Linear(f, h)))``. ``normalization="RMSNorm"`` (nn.RMSNorm's keys); ``activation`` "gelu"
    (tanh), "silu" or "swiglu" (fc1 then has 2f outputs, [gate, up], and the activation is
    silu(gate) * up: LLaMA's FFN). Keyword arguments beyond ``eps`` go to both fp8amp.torch.Linear."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = True, eps: float = 1e-5, device: Any = None,
                 norm_bias: Any = None, normalization: str = "LayerNorm", activation: str = "gelu",
                 **linear_kw: Any) -> None:
        super().__init__()
        if str(activation).lower() not in _ACTS:
            raise ValueError("fp8amp LayerNormMLP: activation must be 'gelu', 'silu' or 'swiglu', not %r" % (activation,))
        act_cls = _ACTS[str(activation).lower()]
        self.hidden, self.ffn_hidden = int(hidden), int(ffn_hidden)
        self.norm = _make_norm("fp8amp LayerNormMLP", normalization, hidden, eps, norm_bias, device)
        self.fc1 = Linear(hidden, ffn_hidden * (2 if act_cls is SwiGLU else 1), bias=bias, device=device, **linear_kw)
        self.act = act_cls(device=device)
        self.fc2 = Linear(ffn_hidden, hidden, bias=bias, device=device, **linear_kw)
        self._fp8_in = _Fp8Input(self.fc1)  # the block's first Linear (what _norm_into feeds)
        self._fp8_in2 = _Fp8Input(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        norm, fc1, fc2 = self.norm, self.fc1, self.fc2
        if x.shape[-1] != self.hidden:
            raise RuntimeError("fp8amp LayerNormMLP(%d, ...) got an input of shape %s" % (self.hidden, tuple(x.shape)))
        nw, nb, w1, b1 = norm.weight, norm.bias, fc1._st.weight, fc1._st.bias
        training = _needs_grad(x, nw, nb, w1, b1)
        if not _fp8_fed(fc1, x, training):
            h = fc1(norm(x))
        elif training:
            h = _NormLinearFn.apply(x, nw, nb, w1, b1, self)
        else:
            h = _norm_into(self, x.contiguous(), False)[0]
        w2, b2 = fc2._st.weight, fc2._st.bias
        training = _needs_grad(h, w2, b2)
        if not _fp8_fed(fc2, h, training):
            return fc2(self.act(h))
        if training:
            return _ActLinearFn.apply(h, w2, b2, self)
        return _act_into(self, h.contiguous(), False)
