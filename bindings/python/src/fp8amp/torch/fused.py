"""Fused blocks on fp8amp's kernels (issue 19): ``LayerNormLinear`` (LayerNorm -> Linear) and
``LayerNormMLP`` (LayerNorm -> Linear -> GELU(tanh) -> Linear), with the parameters and state_dict
keys of their nn compositions::

    LayerNormLinear(i, o)  ~ nn.Sequential(OrderedDict(norm=nn.LayerNorm(i), linear=nn.Linear(i, o)))
    LayerNormMLP(h, f)     ~ nn.Sequential(OrderedDict(norm=nn.LayerNorm(h), fc1=nn.Linear(h, f),
                                                       act=nn.GELU(approximate="tanh"), fc2=nn.Linear(f, h)))

so ``load_state_dict`` moves weights between the two either way (keys ``norm.weight``,
``norm.bias``, ``linear.weight`` ... / ``fc1.weight`` ...; an E4M3 (O3) Linear adds its
``weight_scale_inv`` buffer, as fp8amp.torch.Linear does).

The LayerNorm runs ``fp8amp_norm_forward`` / ``fp8amp_norm_backward`` (one pass each; mean and rstd
kept for the backward, dgamma/dbeta summed in a fixed order), the GELU ``fp8amp_activation_forward``
/ ``_backward``, the Linears are fp8amp.torch.Linear (FP8 GEMMs). The norm's and the activation's
outputs are written in the autocast dtype (bf16 under ``torch.autocast``; the input's dtype
otherwise). Where the next Linear runs an FP8 GEMM for the input's rows (``fp8amp_linear_choose_gemm``;
the eager path, parameters not replaced), the LayerNorm (and in ``LayerNormMLP`` also the GELU) kernel
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

__all__ = ["LayerNorm", "GELU", "LayerNormLinear", "LayerNormMLP"]


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return _ac_dtype(dev) if _ac_enabled(dev) else x.dtype


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    return t.reshape(t.numel() // d, d)


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, mod):  # type: ignore[override]
        ctx = mod._ctx
        _on_current_stream(ctx, x.device)
        x = x.contiguous()
        d = x.shape[-1]
        rows = x.numel() // d
        y = torch.empty(x.shape, dtype=_out_dtype(x), device=x.device)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        fp8amp.norm_forward(ctx, to_fp8amp(_rows(x, d), ctx), to_fp8amp(weight.detach(), ctx),
                            to_fp8amp(_rows(y, d), ctx), to_fp8amp(rstd, ctx),
                            beta=to_fp8amp(bias.detach(), ctx) if bias is not None else None,
                            mean=to_fp8amp(mean, ctx), eps=mod.eps)
        fctx.save_for_backward(x, weight, mean, rstd)
        fctx.mod, fctx.has_bias = mod, bias is not None
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        x, weight, mean, rstd = fctx.saved_tensors
        mod = fctx.mod
        ctx = mod._ctx
        _on_current_stream(ctx, x.device)
        if dy.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            dy = dy.float()
        dy = dy.contiguous()
        d = x.shape[-1]
        dx = torch.empty_like(x)
        dg = torch.empty(d, dtype=torch.float32, device=x.device)
        db = torch.empty(d, dtype=torch.float32, device=x.device) if fctx.has_bias else None
        fp8amp.norm_backward(ctx, to_fp8amp(_rows(dy, d), ctx), to_fp8amp(_rows(x, d), ctx),
                             to_fp8amp(weight.detach(), ctx), to_fp8amp(rstd, ctx), to_fp8amp(_rows(dx, d), ctx),
                             to_fp8amp(dg, ctx), mean=to_fp8amp(mean, ctx),
                             dbeta=to_fp8amp(db, ctx) if db is not None else None, eps=mod.eps)
        return dx, dg.to(weight.dtype), (db.to(weight.dtype) if db is not None else None), None


class LayerNorm(nn.Module):
    """nn.LayerNorm over the last dimension (``weight``, ``bias`` F32 parameters of its names) on
    fp8amp's fused LayerNorm kernels; the output is in the autocast dtype (see the module doc)."""

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
            raise RuntimeError("fp8amp LayerNorm(%d) got an input of shape %s" % (self.normalized_shape[0],
                                                                                 tuple(x.shape)))
        return _LayerNormFn.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        return "%s, eps=%g, bias=%s" % (self.normalized_shape, self.eps, self.bias is not None)


class _GeluFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, ctx):  # type: ignore[override]
        _on_current_stream(ctx, x.device)
        x = x.contiguous()
        y = torch.empty(x.shape, dtype=_out_dtype(x), device=x.device)
        fp8amp.activation_forward(ctx, to_fp8amp(x, ctx), to_fp8amp(y, ctx), kind="gelu_tanh")
        fctx.save_for_backward(x)
        fctx.ctx = ctx
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        (x,) = fctx.saved_tensors
        _on_current_stream(fctx.ctx, x.device)
        dy = dy.contiguous()
        dx = torch.empty(x.shape, dtype=dy.dtype, device=x.device)
        fp8amp.activation_backward(fctx.ctx, to_fp8amp(dy, fctx.ctx), to_fp8amp(x, fctx.ctx), to_fp8amp(dx, fctx.ctx),
                                   kind="gelu_tanh")
        return dx, None


class GELU(nn.Module):
    """nn.GELU(approximate="tanh") on fp8amp's fused activation kernels (no parameters)."""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self._ctx = context(_norm_device(device if device is not None else "cpu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _GeluFn.apply(x, self._ctx)


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


def _norm_into(mod: "LayerNormLinear", x: torch.Tensor, training: bool):
    """The fused forward: the LayerNorm into the Linear's E4M3 input, then the Linear. Returns y, mean, rstd."""
    norm, lin = mod.norm, mod.linear
    st = lin._st
    ctx = norm._ctx
    _prepare(st)
    _on_current_stream(ctx, x.device)
    d = x.shape[-1]
    rows = x.numel() // d
    x8 = torch.empty((rows, d), dtype=torch.float8_e4m3fn, device=x.device)  # the Linear sees [rows, d]
    h8 = mod._fp8_in.bind(x8)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    fp8amp.norm_forward(ctx, to_fp8amp(_rows(x, d), ctx), to_fp8amp(norm.weight.detach(), ctx), h8,
                        to_fp8amp(rstd, ctx),
                        beta=to_fp8amp(norm.bias.detach(), ctx) if norm.bias is not None else None,
                        mean=to_fp8amp(mean, ctx), eps=norm.eps)
    y = _fwd_fp8(st, h8.handle, (rows, d), _out_dtype(x), x.device, 1 if training else 0)
    return y.view(tuple(x.shape[:-1]) + (st.n,)), mean, rstd


def _norm_backward(norm: "LayerNorm", dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
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
                         to_fp8amp(dg, ctx), mean=to_fp8amp(mean, ctx),
                         dbeta=to_fp8amp(db, ctx) if db is not None else None, eps=norm.eps)
    return dx, dg.to(weight.dtype), (db.to(weight.dtype) if db is not None else None)


class _NormLinearFn(torch.autograd.Function):
    """LayerNorm -> Linear, the norm writing the Linear's E4M3 input (see above)."""

    @staticmethod
    def forward(fctx, x, nw, nb, w, b, mod):  # type: ignore[override]
        # nw, nb, w, b: the parameters, inputs so that autograd runs their AccumulateGrad nodes
        x = x.contiguous()
        y, mean, rstd = _norm_into(mod, x, True)
        fctx.save_for_backward(x, nw, mean, rstd)
        fctx.mod, fctx.fwd_id, fctx.ldt, fctx.has_nb = mod, mod.linear._st.fwd_id, y.dtype, nb is not None
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        x, nw, mean, rstd = fctx.saved_tensors
        mod = fctx.mod
        st = mod.linear._st
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


def _gelu_into(mod: "LayerNormMLP", h: torch.Tensor, training: bool) -> torch.Tensor:
    """The fused forward: GELU(tanh) into fc2's E4M3 input, then fc2."""
    st = mod.fc2._st
    ctx = mod.act._ctx
    _prepare(st)
    _on_current_stream(ctx, h.device)
    f = h.shape[-1]
    rows = h.numel() // f
    x8 = torch.empty((rows, f), dtype=torch.float8_e4m3fn, device=h.device)  # the Linear sees [rows, f]
    h8 = mod._fp8_in2.bind(x8)
    fp8amp.activation_forward(ctx, to_fp8amp(_rows(h, f), ctx), h8, kind="gelu_tanh")
    y = _fwd_fp8(st, h8.handle, (rows, f), _out_dtype(h), h.device, 1 if training else 0)
    return y.view(tuple(h.shape[:-1]) + (st.n,))


class _GeluLinearFn(torch.autograd.Function):
    """GELU(tanh) -> Linear, the activation writing the Linear's E4M3 input (see above)."""

    @staticmethod
    def forward(fctx, h, w, b, mod):  # type: ignore[override]
        h = h.contiguous()
        y = _gelu_into(mod, h, True)
        fctx.save_for_backward(h)
        fctx.mod, fctx.fwd_id, fctx.ldt = mod, mod.fc2._st.fwd_id, y.dtype
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        (h,) = fctx.saved_tensors
        mod = fctx.mod
        st = mod.fc2._st
        if fctx.fwd_id != st.fwd_id or st.bwd_id == fctx.fwd_id:
            _gelu_into(mod, h, True)  # recompute (see _NormLinearFn)
        f = h.shape[-1]
        da = torch.empty((h.numel() // f, f), dtype=fctx.ldt, device=h.device)  # the activation output's gradient
        _bwd(st, dy.reshape(da.shape[0], st.n), da)  # the C Linear saw [rows, f] -> [rows, n]
        st.bwd_id = st.fwd_id
        need = fctx.needs_input_grad
        dh = None
        if need[0]:
            ctx = mod.act._ctx
            _on_current_stream(ctx, h.device)
            dh = torch.empty(h.shape, dtype=da.dtype, device=h.device)
            fp8amp.activation_backward(ctx, to_fp8amp(da, ctx), to_fp8amp(_rows(h, f), ctx),
                                       to_fp8amp(_rows(dh, f), ctx), kind="gelu_tanh")
        return dh, st.wref if need[1] else None, st.bref if need[2] else None, None


class LayerNormLinear(nn.Module):
    """LayerNorm(in_features) -> fp8amp.torch.Linear(in_features, out_features). Submodules ``norm``
    and ``linear``: the parameters and state_dict keys of
    ``nn.Sequential(OrderedDict(norm=nn.LayerNorm(in_features), linear=nn.Linear(in_features, out_features)))``.
    Keyword arguments beyond ``eps`` go to fp8amp.torch.Linear (weight_dtype, wgrad_dtype, policy,
    recipe, graph_replay)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 device: Any = None, norm_bias: bool = True, **linear_kw: Any) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.norm = LayerNorm(in_features, eps=eps, bias=norm_bias, device=device)
        self.linear = Linear(in_features, out_features, bias=bias, device=device, **linear_kw)
        self._fp8_in = _Fp8Input(self.linear)

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
    fc2=nn.Linear(f, h)))``. Keyword arguments beyond ``eps`` go to both fp8amp.torch.Linear."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = True, eps: float = 1e-5, device: Any = None,
                 norm_bias: bool = True, **linear_kw: Any) -> None:
        super().__init__()
        self.hidden, self.ffn_hidden = int(hidden), int(ffn_hidden)
        self.norm = LayerNorm(hidden, eps=eps, bias=norm_bias, device=device)
        self.fc1 = Linear(hidden, ffn_hidden, bias=bias, device=device, **linear_kw)
        self.act = GELU(device=device)
        self.fc2 = Linear(ffn_hidden, hidden, bias=bias, device=device, **linear_kw)
        self._fp8_in = _Fp8Input(self.fc1)
        self._fp8_in2 = _Fp8Input(self.fc2)

    # _norm_into reads .norm, .linear and ._fp8_in: fc1 is this block's first Linear
    @property
    def linear(self) -> Linear:
        return self.fc1

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
            return _GeluLinearFn.apply(h, w2, b2, self)
        return _gelu_into(self, h.contiguous(), False)
