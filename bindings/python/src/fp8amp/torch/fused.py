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
otherwise), and each Linear quantizes its input in its own pass. What is not fused yet: the C Linear
takes a wide input only, so the norm/activation kernel cannot write the GEMM's E4M3 operand itself
(that needs a Linear entry point taking a pre-quantized input bound to its INPUT meta; see
docs/performance.md, "Fused blocks").
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

import fp8amp

from .linear import Linear, _ac_dtype, _ac_enabled, _norm_device, _on_current_stream, context, to_fp8amp

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.linear(self.norm(x))


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.fc2(self.act(self.fc1(self.norm(x))))
