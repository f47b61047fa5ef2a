"""The PyTorch front of fp8amp: ``Linear`` (an nn.Module on fp8amp's FP8 Linear), ``initialize``
(MS-AMP's ``msamp.initialize`` shape: swaps nn.Linear layers, wraps Adam/AdamW), ``all_reduce_grads``
and ``GradScaler``. Importing ``fp8amp`` never imports this module; importing this module patches
nothing (no global monkeypatching): only the model and optimizer given to ``initialize`` change.

    import fp8amp.torch as ft
    model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=3e-4), opt_level="O2")
    for batch in data:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()

See bindings/python/README.md ("PyTorch front") for how memory, streams, gradients and checkpoints
are shared between the two libraries.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import NULL, ffi, lib
from fp8amp.errors import check
from fp8amp.linear import GemmPolicy, Role, _as_policy
from fp8amp.optim import AdamConfig, as_opt_level

__all__ = ["Linear", "initialize", "Optimizer", "GradScaler", "all_reduce_grads", "context", "to_fp8amp"]

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
    if ctx is None:
        ctx = fp8amp.Context(key)
        if d.type == "cuda":
            ctx.set_stream(torch.cuda.current_stream(d).cuda_stream)
            ctx.set_allocator(_torch_alloc, _torch_free)
        ctx._torch_stream = None  # type: ignore[attr-defined]  # last stream set, to skip redundant calls
        _CONTEXTS[key] = ctx
    return ctx


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # an int, without making a Stream object
except AttributeError:  # pragma: no cover
    def _raw_stream(index: int) -> int:
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
        raise TypeError("fp8amp takes float32, float16, bfloat16 or float8 tensors, not %s" % t.dtype)
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


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # pragma: no cover - older torch
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None


# ---- the module -----------------------------------------------------------------------------


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, mod):  # type: ignore[override]
        y = mod._run_forward(x, True)
        fctx.mod = mod
        fctx.fwd_id = mod._fwd_id
        fctx.x_meta = (x.shape, x.dtype)
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        mod = fctx.mod
        if fctx.fwd_id != mod._fwd_id:
            raise RuntimeError("fp8amp.torch.Linear: this backward is not of the layer's last training forward "
                               "(a layer called twice per backward is not supported: the C Linear keeps the "
                               "input of its last training forward only)")
        shape, dtype = fctx.x_meta
        dx = torch.empty(shape, dtype=dtype, device=dy.device) if fctx.needs_input_grad[0] else None
        mod._run_backward(dy, dx)
        return dx, None, None, None


class Linear(nn.Module):
    """``fp8amp.torch.Linear(in_features, out_features, bias=True, device=None, weight_dtype=torch.float32,
    wgrad_dtype=None, policy="auto", recipe=None)``: nn.Linear's interface on fp8amp's FP8 Linear.

    ``weight`` [out, in] and ``bias`` [out] (F32) are nn.Parameters sharing the fp8amp Linear's own
    memory (DLPack views): an optimizer, ``load_state_dict`` or ``copy_`` writes them in place, and the
    module tells the Linear (``weight_changed``) when torch has written them (their version counter
    moved). ``wgrad_dtype`` None means the weight's dtype: ``weight.grad`` is then a view of fp8amp's
    weight gradient. With ``wgrad_dtype=torch.float8_e4m3fn`` (O1/O2 through ``initialize``) the FP8
    gradient stays inside fp8amp for its optimizer and ``weight.grad`` stays None
    (``weight_grad_fp8()`` / ``dequantized_weight_grad()`` give it). ``bias.grad`` is always a view of
    fp8amp's F32 bias gradient.

    Gradients accumulate across backward calls (micro-batches) until the grads are reset:
    ``zero_grad()`` of this front's Optimizer or of any torch optimizer / module with
    ``set_to_none=True`` (the default). Each training forward must be followed by its backward before
    the next training forward of the same layer. Create it on its final device (``.to()`` would copy
    the parameters away from fp8amp's memory).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 weight_dtype: torch.dtype = torch.float32, wgrad_dtype: Optional[torch.dtype] = None,
                 policy: Any = "auto", recipe: Optional[fp8amp.Recipe] = None) -> None:
        super().__init__()
        dev = _norm_device(device if device is not None else "cpu")
        if weight_dtype not in (torch.float32, torch.bfloat16):
            raise NotImplementedError("fp8amp.torch.Linear holds float32 or bfloat16 weights (scaled F16 and E4M3 "
                                      "weights, O3, are not exposed to torch yet)")
        wgrad_dtype = weight_dtype if wgrad_dtype is None else wgrad_dtype
        if wgrad_dtype not in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
            raise TypeError("wgrad_dtype must be float32, bfloat16 or float8_e4m3fn")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.policy = _as_policy(policy)
        self.recipe = recipe if recipe is not None else fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT)
        self._device = dev
        self._ctx = context(dev)
        _on_current_stream(self._ctx, dev)
        self._lin = fp8amp.Linear(self._ctx, in_features, out_features, bias=bias, weight_dtype=_DT[weight_dtype],
                                  wgrad_dtype=_DT[wgrad_dtype], recipe=self.recipe, policy=self.policy)
        self._h = self._lin.handle
        self.weight = nn.Parameter(_from_fp8amp(self._lin.weight))
        self._wgrad_view = _from_fp8amp(self._lin.weight_grad)
        self._wgrad_visible = wgrad_dtype == weight_dtype
        if bias:
            self.bias = nn.Parameter(_from_fp8amp(self._lin.bias))
            self._bgrad_view = _from_fp8amp(self._lin.bias_grad)
        else:
            self.register_parameter("bias", None)
            self._bgrad_view = None
        self._seen = (self.weight._version, self.bias._version if bias else 0)
        self._accumulate = False  # True once a backward wrote the grads, until they are reset
        self._fwd_id = 0
        self._delayed = self.recipe.mode == fp8amp.ScalingMode.DELAYED
        self.reset_parameters()

    @classmethod
    def from_linear(cls, src: nn.Linear, **kw: Any) -> "Linear":
        """A copy of an nn.Linear's parameters (weights kept in float32 unless weight_dtype says)."""
        m = cls(src.in_features, src.out_features, bias=src.bias is not None, device=src.weight.device, **kw)
        with torch.no_grad():
            m.weight.copy_(src.weight)
            if src.bias is not None:
                m.bias.copy_(src.bias)
        return m

    def reset_parameters(self) -> None:
        """nn.Linear's initialization."""
        with torch.no_grad():
            w = torch.empty(self.weight.shape, dtype=torch.float32, device=self.weight.device)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            self.weight.copy_(w)
            if self.bias is not None:
                bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
                nn.init.uniform_(self.bias, -bound, bound)

    @property
    def fp8amp_linear(self) -> fp8amp.Linear:
        """The underlying fp8amp.Linear."""
        return self._lin

    @property
    def gemm_kind(self) -> fp8amp.GemmKind:
        return self._lin.gemm_kind

    def weight_grad_fp8(self) -> fp8amp.Tensor:
        """fp8amp's weight gradient tensor (E4M3 with its scale, or F32/BF16)."""
        return self._lin.weight_grad

    def dequantized_weight_grad(self) -> torch.Tensor:
        """The weight gradient as a new float32 torch tensor."""
        out = torch.empty(self.weight.shape, dtype=torch.float32, device=self._device)
        g = self._lin.weight_grad
        _on_current_stream(self._ctx, self._device)
        if g.dtype == fp8amp.E4M3:
            fp8amp.dequantize(self._ctx, g, to_fp8amp(out, self._ctx))
        else:
            out.copy_(self._wgrad_view)
        return out

    def _sync_writes(self) -> None:
        # Writes made by torch (optimizer, load_state_dict, copy_) bump the parameters' version
        # counters; the library only sees its own writes, so tell it.
        seen = (self.weight._version, self.bias._version if self.bias is not None else 0)
        if seen != self._seen:
            check(lib.fp8amp_linear_weight_changed(self._h))
            self._seen = seen

    def _run_forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        self._sync_writes()
        _on_current_stream(self._ctx, self._device)
        x = x.contiguous()
        ydt = _autocast_dtype(x.device.type) or x.dtype
        y = torch.empty(x.shape[:-1] + (self.out_features,), dtype=ydt, device=x.device)
        hx = _wrap(self._ctx.handle, x)
        try:
            hy = _wrap(self._ctx.handle, y)
            try:
                check(lib.fp8amp_linear_forward(self._h, hx, hy, 1 if training else 0))
            finally:
                lib.fp8amp_tensor_destroy(hy)
        finally:
            lib.fp8amp_tensor_destroy(hx)
        if training:
            self._fwd_id += 1
        return y

    def _run_backward(self, dy: torch.Tensor, dx: Optional[torch.Tensor]) -> None:
        _on_current_stream(self._ctx, self._device)
        dy = dy.contiguous()
        acc = self._accumulate
        # A torch optimizer or module zero_grad(set_to_none=True) drops the grads: start over.
        if self.bias is not None and self.bias.grad is None:
            acc = False
        if self._wgrad_visible and self.weight.grad is None:
            acc = False
        hdy = _wrap(self._ctx.handle, dy)
        try:
            hdx = _wrap(self._ctx.handle, dx) if dx is not None else NULL
            try:
                check(lib.fp8amp_linear_backward(self._h, hdy, hdx, 1 if acc else 0))
            finally:
                if dx is not None:
                    lib.fp8amp_tensor_destroy(hdx)
        finally:
            lib.fp8amp_tensor_destroy(hdy)
        self._accumulate = True
        if self._wgrad_visible and self.weight.grad is not self._wgrad_view:
            self.weight.grad = self._wgrad_view
        if self.bias is not None and self.bias.grad is not self._bgrad_view:
            self.bias.grad = self._bgrad_view

    def _reset_grads(self) -> None:
        """The next backward overwrites the gradients (called by the Optimizer's zero_grad)."""
        self._accumulate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if x.device != self._device:
            raise RuntimeError("fp8amp.torch.Linear on %s got an input on %s" % (self._device, x.device))
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _LinearFn.apply(x, self.weight, self.bias, self)
        return self._run_forward(x, False)

    def scaling_metas(self) -> List[fp8amp.Scaling]:
        """The INPUT and GRAD_OUTPUT metas (those a delayed recipe updates once per step)."""
        return [self._lin.scaling(Role.INPUT), self._lin.scaling(Role.GRAD_OUTPUT)]

    def extra_repr(self) -> str:
        return "in_features=%d, out_features=%d, bias=%s, policy=%s" % (
            self.in_features, self.out_features, self.bias is not None, self.policy.name)


# ---- the optimizer ------------------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs fp8amp's Adam/AdamW (O1/O2) on the device: made by
    ``initialize``. One fp8amp optimizer per param group (lr, betas, eps, weight_decay of the group;
    ``group["lr"]`` is read at every step, so LR schedulers work). Linear layers' weights and biases
    are updated with their fp8amp gradients (E4M3 at O1/O2); every other parameter with its torch
    ``.grad`` (kept in a buffer registered with fp8amp, zeroed in place by ``zero_grad``).

    Works with ``torch.amp.GradScaler`` (it declares ``_step_supports_amp_scaling``: the step gets
    the scale and the found-inf flag, unscales inside fp8amp's step and skips on overflow; do not
    call ``scaler.unscale_`` first) and with this module's ``GradScaler`` (``step(scaler=...)``).
    ``state_dict()``/``load_state_dict()`` carry fp8amp's checkpoint (parameters, m, v, scales,
    step count) as bytes plus the groups' hyperparameters.
    """

    _step_supports_amp_scaling = True

    def __init__(self, param_groups: List[Dict[str, Any]], opt_level: Any, adamw: bool, linears: Dict[int, Tuple[Linear, str]],
                 max_grad_norm: float = 0.0) -> None:
        super().__init__(param_groups, {})
        self.opt_level = as_opt_level(opt_level)
        self._linears = sorted({id(m): m for m, _ in linears.values()}.values(), key=id)
        self._opts: List[fp8amp.Optimizer] = []
        self._plain: List[Tuple[nn.Parameter, torch.Tensor]] = []  # non-Linear params and their grad buffers
        self._ctx: Optional[fp8amp.Context] = None
        self._device: Optional[torch.device] = None
        if max_grad_norm and len(self.param_groups) > 1:
            raise NotImplementedError("max_grad_norm with several param groups (each group is clipped alone)")
        for g in self.param_groups:
            if g.get("amsgrad"):
                raise NotImplementedError("amsgrad")
            beta1, beta2 = g["betas"]
            cfg = AdamConfig.for_level(self.opt_level, adamw=adamw, lr=float(g["lr"]), beta1=float(beta1),
                                       beta2=float(beta2), eps=float(g["eps"]), weight_decay=float(g["weight_decay"]),
                                       maximize=bool(g.get("maximize", False)), max_grad_norm=float(max_grad_norm))
            ctx = None
            pairs = []
            for p in g["params"]:
                dev = _norm_device(p.device)
                if self._device is None:
                    self._device, self._ctx = dev, context(dev)
                elif dev != self._device:
                    raise NotImplementedError("parameters on several devices")
                ctx = self._ctx
                if id(p) in linears:
                    m, which = linears[id(p)]
                    lin = m.fp8amp_linear
                    pairs.append((lin.weight, lin.weight_grad) if which == "weight" else (lin.bias, lin.bias_grad))
                else:
                    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not p.is_contiguous():
                        raise TypeError("fp8amp's optimizer takes contiguous float32/bfloat16/float16 parameters")
                    buf = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    if p.grad is not None:
                        buf.copy_(p.grad)
                    p.grad = buf
                    self._plain.append((p, buf))
                    pairs.append((to_fp8amp(p, ctx), to_fp8amp(buf, ctx)))
            if ctx is None:
                raise ValueError("an empty param group")
            _on_current_stream(ctx, self._device)
            self._opts.append(fp8amp.Optimizer(ctx, cfg, pairs))
        self._metas = [mt for m in self._linears if m._delayed for mt in m.scaling_metas()]

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - the buffers stay registered
        """Zeroes the gradients in place (the buffers fp8amp reads stay the same memory) and makes
        every Linear's next backward overwrite its gradients."""
        for p, buf in self._plain:
            buf.zero_()
            if p.grad is not buf:
                p.grad = buf
        for m in self._linears:
            m._reset_grads()

    def _rebind_grads(self) -> None:
        # After a torch-side zero_grad(set_to_none=True) the next backward made a new .grad tensor:
        # copy it into the registered buffer (or zero the buffer when there is none).
        for p, buf in self._plain:
            if p.grad is not buf:
                if p.grad is None:
                    buf.zero_()
                else:
                    buf.copy_(p.grad)
                p.grad = buf

    @torch.no_grad()
    def step(self, closure: Any = None, scaler: Optional["GradScaler"] = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        inv = 1.0
        gs, fi = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if gs is not None or fi is not None:  # torch.amp.GradScaler.step
            if fi is not None and float(fi) > 0:
                return loss
            if gs is not None:
                inv = 1.0 / float(gs)
        self._rebind_grads()
        assert self._ctx is not None and self._device is not None
        _on_current_stream(self._ctx, self._device)
        c_scaler = scaler._scaler if scaler is not None else None
        if c_scaler is not None and len(self._opts) > 1:
            inv /= c_scaler.scale  # several groups: one host read of the scale, then one update
            for o, g in zip(self._opts, self.param_groups):
                o.step(lr=float(g["lr"]), grad_scale_inv=inv)
            bad = [o for o in self._opts if o.found_inf]
            c_scaler.update(bad[0] if bad else self._opts[0])
        else:
            for o, g in zip(self._opts, self.param_groups):
                o.step(lr=float(g["lr"]), grad_scale_inv=inv, scaler=c_scaler)
        if self._metas:
            fp8amp.update_many(self._ctx, self._metas)
        return loss

    @property
    def fp8amp_optimizers(self) -> List[fp8amp.Optimizer]:
        return list(self._opts)

    def state_bytes(self) -> int:
        """Bytes of optimizer state fp8amp holds (m, v, scales)."""
        return sum(o.state_bytes for o in self._opts)

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return {"fp8amp": [o.save() for o in self._opts], "param_groups": groups, "opt_level": int(self.opt_level)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # type: ignore[override]
        blobs = state_dict["fp8amp"]
        if len(blobs) != len(self._opts) or int(state_dict.get("opt_level", self.opt_level)) != int(self.opt_level):
            raise ValueError("the state dict is of another fp8amp optimizer (groups or opt level differ)")
        for o, b in zip(self._opts, blobs):
            o.load(b)
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        # The loads wrote the parameters through fp8amp: the Linears notice that by themselves.


def initialize(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, opt_level: Any = "O1",
               *, policy: Any = "auto", recipe: Optional[fp8amp.Recipe] = None,
               weight_dtype: torch.dtype = torch.float32, wgrad_dtype: Optional[torch.dtype] = None,
               max_grad_norm: float = 0.0, exclude: Any = ()) -> Any:
    """Replaces every nn.Linear of `model` by an fp8amp.torch.Linear (parameters copied) and, with
    an optimizer (torch.optim.Adam or AdamW), returns ``(model, Optimizer)`` running fp8amp's Adam at
    `opt_level` ("O1": F32 m and v; "O2": E4M3 m, F16 v) over all its parameters; without one,
    returns the model. Linear weights stay float32 (weight_dtype), their gradients are E4M3
    (wgrad_dtype, default float8_e4m3fn with an optimizer, the weight dtype without), the GEMM policy
    is `policy` ("auto", "fp8", "bf16") and the recipe current scaling unless given. `exclude`: the
    qualified names of nn.Linear modules to keep as they are (e.g. ``("lm_head",)``: output layers
    are commonly kept in 16 bits), or a callable ``(name, module) -> bool``."""
    level = as_opt_level(opt_level)
    if level == fp8amp.OptLevel.O3:
        raise NotImplementedError("O3 (E4M3 weights with an F16 master) is not in the torch front yet")
    if optimizer is not None and type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        raise TypeError("initialize wraps torch.optim.Adam or AdamW, not %s" % type(optimizer).__name__)
    if wgrad_dtype is None:
        wgrad_dtype = torch.float8_e4m3fn if optimizer is not None else weight_dtype
    replaced: Dict[int, Tuple[Linear, str]] = {}  # id(old param) -> (new module, "weight"/"bias")
    # A Linear whose weight another module also holds (tied embeddings) stays an nn.Linear: its
    # replacement would untie them.
    holders: Dict[int, int] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1

    skip = exclude if callable(exclude) else (lambda name, m, names=frozenset(exclude): name in names)

    def swap(mod: nn.Module, prefix: str = "") -> None:
        for name, child in list(mod.named_children()):
            qual = prefix + name
            if type(child) is nn.Linear and holders.get(id(child.weight), 0) == 1 and not skip(qual, child):
                new = Linear.from_linear(child, weight_dtype=weight_dtype, wgrad_dtype=wgrad_dtype, policy=policy,
                                         recipe=recipe)
                new.train(child.training)
                replaced[id(child.weight)] = (new, "weight")
                if child.bias is not None:
                    replaced[id(child.bias)] = (new, "bias")
                setattr(mod, name, new)
            else:
                swap(child, qual + ".")

    if type(model) is nn.Linear:
        raise TypeError("pass a model containing nn.Linear layers, or use fp8amp.torch.Linear.from_linear")
    swap(model)
    if optimizer is None:
        return model
    groups = []
    linears: Dict[int, Tuple[Linear, str]] = {}
    for g in optimizer.param_groups:
        ng = {k: v for k, v in g.items() if k != "params"}
        params = []
        for p in g["params"]:
            if id(p) in replaced:
                m, which = replaced[id(p)]
                p = getattr(m, which)
                linears[id(p)] = (m, which)
            params.append(p)
        ng["params"] = params
        groups.append(ng)
    if optimizer.state:
        raise ValueError("initialize needs a fresh optimizer (its state would be lost)")
    opt = Optimizer(groups, level, isinstance(optimizer, torch.optim.AdamW), linears, max_grad_norm=max_grad_norm)
    return model, opt


class GradScaler:
    """fp8amp's dynamic loss scaler for this front: ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)`` (unscales, skips on overflow and updates the scale inside the
    fp8amp step, on the device), ``scaler.update()`` (nothing left to do; kept for torch's shape).
    ``hysteresis`` > 1 is Megatron's: that many overflows in a row before backing off."""

    def __init__(self, device: Any = "cuda", init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, hysteresis: int = 1) -> None:
        d = _norm_device(device)
        self._ctx = context(d)
        self._scaler = fp8amp.GradScaler(self._ctx, init_scale, growth_factor, backoff_factor, growth_interval,
                                         hysteresis)
        # The scale as a torch view of the scaler's device float: multiplying the loss needs no sync.
        h = ffi.new("fp8amp_tensor *")
        p = ffi.new("const float **")
        check(lib.fp8amp_grad_scaler_scale_device_ptr(self._scaler.handle, p))
        check(lib.fp8amp_tensor_wrap(self._ctx.handle, int(fp8amp.F32), 1, ffi.new("int64_t[]", [1]),
                                     ffi.cast("void *", p[0]), h))
        self._scale_t = fp8amp.Tensor._new(h[0], self._ctx)
        self._scale_view = torch.from_dlpack(self._scale_t)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale_view.to(loss.dtype).reshape(())

    def step(self, optimizer: Optimizer) -> None:
        optimizer.step(scaler=self)

    def update(self) -> None:
        pass

    def get_scale(self) -> float:
        return self._scaler.scale

    def state_dict(self) -> Dict[str, Any]:
        return self._scaler.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._scaler.load_state_dict(state)


def all_reduce_grads(model: nn.Module, group: Any = None) -> None:
    """Averages every gradient of `model` over torch.distributed's `group` (the default group when
    None): torch-visible grads (bf16/f32) with one all_reduce each, and each fp8amp.torch.Linear's
    E4M3 weight gradient by dequantizing it to float32, all-reducing that, and quantizing the mean
    back with the gradient's meta (current scaling). Call after backward, before step. FP8 on the
    wire waits for fp8amp's communicator."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    seen = set()
    for mod in model.modules():
        if isinstance(mod, Linear) and mod._lin.weight_grad.dtype == fp8amp.E4M3:
            g = mod.dequantized_weight_grad()
            dist.all_reduce(g, group=group)
            g.div_(world)
            _on_current_stream(mod._ctx, mod._device)
            # same stream as the reduction's consumer; g's memory is reused only after this kernel
            fp8amp.quantize(mod._ctx, to_fp8amp(g, mod._ctx), mod._lin.weight_grad)
            seen.add(id(mod.weight))
    for p in model.parameters():
        if id(p) in seen or p.grad is None:
            continue
        dist.all_reduce(p.grad, group=group)
        p.grad.div_(world)
