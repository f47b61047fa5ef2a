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

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import NULL, ffi, lib
from fp8amp.errors import DtypeMismatchError, check
from fp8amp.linear import GemmPolicy, Role, _as_policy
from fp8amp.optim import AdamConfig, as_opt_level

__all__ = ["Linear", "initialize", "Optimizer", "GradScaler", "all_reduce_grads", "communicator", "context",
           "to_fp8amp"]

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


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # pragma: no cover - older torch
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None


# ---- the module -----------------------------------------------------------------------------
#
# The per-call path. Each ft.Linear keeps one fp8amp tensor handle per role (x, y, dy, dx) and dtype,
# made by the first call and re-pointed at every later call's memory with fp8amp_tensor_rebind
# (no wrap/destroy pair per tensor). Everything a call reads or writes lives in one __slots__ object
# (_Hot): reading a parameter through nn.Module.__getattr__ costs about 0.6 us and any attribute
# write through nn.Module.__setattr__ about 1.5 us (CPU, measured), so the hot path does neither.

_rebind = lib.fp8amp_tensor_rebind
_c_forward = lib.fp8amp_linear_forward
_c_backward = lib.fp8amp_linear_backward
_cast = ffi.cast
_grad_enabled = torch.is_grad_enabled
try:
    _ac_enabled = torch.is_autocast_enabled
    _ac_dtype = torch.get_autocast_dtype
    _ac_enabled("cpu")
except (AttributeError, TypeError):  # pragma: no cover - older torch
    def _ac_enabled(device_type: str) -> bool:
        return _autocast_dtype(device_type) is not None

    def _ac_dtype(device_type: str) -> torch.dtype:
        return _autocast_dtype(device_type)  # type: ignore[return-value]
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


class _Hot:
    """The state every call of one ft.Linear uses (see above)."""

    __slots__ = ("lin_h", "ctx", "ctx_h", "cuda", "index", "dev_type", "n", "weight", "bias", "scale", "wv", "bv",
                 "sv", "fwd_id", "accumulate", "wgrad_visible", "wgrad_view", "bgrad_view", "hx", "hy", "hdy", "hdx",
                 "keep", "float_loads")


class _View:
    """One role's handle for one dtype, and the memory and shape it points at now: a call whose tensor
    has the same address and shape as the last one (a steady training or inference loop, where the
    caching allocator hands each layer the same blocks) skips the rebind."""

    __slots__ = ("h", "ptr", "shape")


_VOIDP = ffi.typeof("void *")


def _new_view(st: _Hot, table: Dict[torch.dtype, _View], t: torch.Tensor) -> _View:
    """The view of a role (table) for t's dtype, made over t the first time (its handle is kept in
    st.keep, which destroys it with the module)."""
    dt = _DT.get(t.dtype)
    if dt is None:
        raise DtypeMismatchError(lib.FP8AMP_ERROR_DTYPE_MISMATCH, "fp8amp_tensor_wrap: fp8amp takes float32, float16, "
                                 "bfloat16 or float8 tensors, not %s" % t.dtype)  # also a TypeError
    out = ffi.new("fp8amp_tensor *")
    check(lib.fp8amp_tensor_wrap(st.ctx_h, dt, t.dim(), list(t.shape), _cast(_VOIDP, t.data_ptr()), out))
    st.keep.append(fp8amp.Tensor._new(out[0], st.ctx))
    v = _View()
    v.h, v.ptr, v.shape = out[0], t.data_ptr(), t.shape
    table[t.dtype] = v
    return v


def _sync_writes(st: _Hot) -> None:
    # Writes made by torch (optimizer, load_state_dict, copy_) bump the parameters' version
    # counters; the library only sees its own writes, so tell it.
    check(lib.fp8amp_linear_weight_changed(st.lin_h))
    st.wv = st.weight._version
    st.bv = st.bias._version if st.bias is not None else 0
    st.sv = st.scale._version if st.scale is not None else 0


def _set_stream(st: _Hot, s: int) -> None:
    check(lib.fp8amp_context_set_stream(st.ctx_h, _cast(_VOIDP, s)))
    st.ctx._torch_stream = s  # type: ignore[attr-defined]


def _fwd(st: _Hot, x: torch.Tensor, training: int) -> torch.Tensor:
    b, s = st.bias, st.scale
    if st.weight._version != st.wv or (b is not None and b._version != st.bv) or (s is not None and s._version != st.sv):
        _sync_writes(st)
    if st.cuda:
        stream = _raw_stream(st.index)
        if stream != st.ctx._torch_stream:
            _set_stream(st, stream)
    if not x.is_contiguous():
        x = x.contiguous()
    xdt = x.dtype
    ydt = _ac_dtype(st.dev_type) if _ac_enabled(st.dev_type) else xdt
    shape = x.shape
    yshape = (shape[0], st.n) if len(shape) == 2 else shape[:-1] + (st.n,)
    y = x.new_empty(yshape, dtype=ydt)
    vx = st.hx.get(xdt) or _new_view(st, st.hx, x)
    p = x.data_ptr()
    if p != vx.ptr or shape != vx.shape:
        rc = _rebind(vx.h, _cast(_VOIDP, p), len(shape), shape)
        if rc:
            check(rc)
        vx.ptr, vx.shape = p, shape
    vy = st.hy.get(ydt) or _new_view(st, st.hy, y)
    p = y.data_ptr()
    if p != vy.ptr or yshape != vy.shape:
        rc = _rebind(vy.h, _cast(_VOIDP, p), len(yshape), yshape)
        if rc:
            check(rc)
        vy.ptr, vy.shape = p, yshape
    rc = _c_forward(st.lin_h, vx.h, vy.h, training)
    if rc:
        check(rc)
    if training:
        st.fwd_id += 1
    return y


def _bwd(st: _Hot, dy: torch.Tensor, dx: Optional[torch.Tensor]) -> None:
    if st.cuda:
        stream = _raw_stream(st.index)
        if stream != st.ctx._torch_stream:
            _set_stream(st, stream)
    if not dy.is_contiguous():
        dy = dy.contiguous()
    w, b = st.weight, st.bias
    acc = st.accumulate
    # A torch optimizer or module zero_grad(set_to_none=True) drops the grads: start over.
    if acc and ((b is not None and b.grad is None) or (st.wgrad_visible and w.grad is None)):
        acc = False
    v = st.hdy.get(dy.dtype) or _new_view(st, st.hdy, dy)
    p, shape = dy.data_ptr(), dy.shape
    if p != v.ptr or shape != v.shape:
        rc = _rebind(v.h, _cast(_VOIDP, p), len(shape), shape)
        if rc:
            check(rc)
        v.ptr, v.shape = p, shape
    hdy = v.h
    if dx is not None:
        v = st.hdx.get(dx.dtype) or _new_view(st, st.hdx, dx)
        p, shape = dx.data_ptr(), dx.shape
        if p != v.ptr or shape != v.shape:
            rc = _rebind(v.h, _cast(_VOIDP, p), len(shape), shape)
            if rc:
                check(rc)
            v.ptr, v.shape = p, shape
        hdx = v.h
    else:
        hdx = NULL
    rc = _c_backward(st.lin_h, hdy, hdx, 1 if acc else 0)
    if rc:
        check(rc)
    st.accumulate = True
    if st.wgrad_visible and w.grad is not st.wgrad_view:
        w.grad = st.wgrad_view
    if b is not None and b.grad is not st.bgrad_view:
        b.grad = st.bgrad_view


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, anchor, st):  # type: ignore[override]
        # anchor: the weight (or the bias when only it trains), so that the output needs a gradient
        # when a parameter does; the gradients themselves reach the parameters as views (_bwd).
        y = _fwd(st, x, 1)
        fctx.saved = (st, st.fwd_id, x.shape, x.dtype)
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        st, fwd_id, shape, dtype = fctx.saved
        if fwd_id != st.fwd_id:
            raise RuntimeError("fp8amp.torch.Linear: this backward is not of the layer's last training forward "
                               "(a layer called twice per backward is not supported: the C Linear keeps the "
                               "input of its last training forward only)")
        dx = dy.new_empty(shape, dtype=dtype) if fctx.needs_input_grad[0] else None
        _bwd(st, dy, dx)
        return dx, None, None


# Function.apply is a Python wrapper (default-argument binding, functorch checks) around the C++
# apply; without functorch transforms active it only forwards to it, so call that directly.
try:
    _fn_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _LinearFn)
except (AttributeError, KeyError, TypeError):  # pragma: no cover - other torch versions
    _fn_apply = _LinearFn.apply


class Linear(nn.Module):
    """``fp8amp.torch.Linear(in_features, out_features, bias=True, device=None, weight_dtype=torch.float32,
    wgrad_dtype=None, policy="auto", recipe=None, graph_replay=True)``: nn.Linear's interface on fp8amp's
    FP8 Linear.

    ``weight`` [out, in] and ``bias`` [out] (F32) are nn.Parameters sharing the fp8amp Linear's own
    memory (DLPack views): an optimizer, ``load_state_dict`` or ``copy_`` writes them in place, and the
    module tells the Linear (``weight_changed``) when torch has written them (their version counter
    moved). ``weight_dtype`` float32 or bfloat16 (O1/O2), or float8_e4m3fn (O3): the weight is then
    E4M3 codes, its value ``code * weight_scale_inv`` (a float32 scalar buffer sharing the C tensor's
    scale slot; both are in the state_dict). ``wgrad_dtype`` None means the weight's dtype (E4M3 for
    E4M3 weights): with a float32/bfloat16 weight and gradient ``weight.grad`` is a view of fp8amp's
    weight gradient; with an E4M3 gradient (O1/O2/O3 through ``initialize``) the FP8 gradient stays
    inside fp8amp for its optimizer and ``weight.grad`` stays None (``weight_grad_fp8()`` /
    ``dequantized_weight_grad()`` give it). ``bias.grad`` is always a view of fp8amp's F32 bias gradient.

    Gradients accumulate across backward calls (micro-batches) until the grads are reset:
    ``zero_grad()`` of this front's Optimizer or of any torch optimizer / module with
    ``set_to_none=True`` (the default). Each training forward must be followed by its backward before
    the next training forward of the same layer. Create it on its final device (``.to()`` would copy
    the parameters away from fp8amp's memory). Like its fp8amp context, a module is used by one thread
    at a time. ``graph_replay`` (CUDA, default on) lets the C Linear replay a call whose launches repeat
    an earlier call's as one CUDA graph launch (docs/linear.md section 6.1).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 weight_dtype: torch.dtype = torch.float32, wgrad_dtype: Optional[torch.dtype] = None,
                 policy: Any = "auto", recipe: Optional[fp8amp.Recipe] = None, graph_replay: bool = True) -> None:
        super().__init__()
        dev = _norm_device(device if device is not None else "cpu")
        if weight_dtype not in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
            raise NotImplementedError("fp8amp.torch.Linear holds float32, bfloat16 or float8_e4m3fn (O3) weights "
                                      "(scaled F16 weights are not exposed to torch yet)")
        e4m3 = weight_dtype == torch.float8_e4m3fn
        wgrad_dtype = weight_dtype if wgrad_dtype is None else wgrad_dtype
        if wgrad_dtype not in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
            raise TypeError("wgrad_dtype must be float32, bfloat16 or float8_e4m3fn")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight_dtype = weight_dtype
        self.policy = _as_policy(policy)
        self.recipe = recipe if recipe is not None else fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT)
        self._device = dev
        self._ctx = context(dev)
        _on_current_stream(self._ctx, dev)
        self._lin = fp8amp.Linear(self._ctx, in_features, out_features, bias=bias, weight_dtype=_DT[weight_dtype],
                                  wgrad_dtype=_DT[wgrad_dtype], recipe=self.recipe, policy=self.policy,
                                  graph_replay=graph_replay)
        self._h = self._lin.handle
        self._e4m3 = e4m3
        self.weight = nn.Parameter(_from_fp8amp(self._lin.weight))
        if e4m3:
            # The weight's scale_inv slot as a float32 scalar view: value = code * weight_scale_inv.
            out = ffi.new("fp8amp_tensor *")
            check(lib.fp8amp_tensor_scale_inv(self._lin.weight.handle, out))
            self._scale_t = fp8amp.Tensor._new(out[0], self._ctx)
            self.register_buffer("weight_scale_inv", _from_fp8amp(self._scale_t))
        if bias:
            self.bias = nn.Parameter(_from_fp8amp(self._lin.bias))
        else:
            self.register_parameter("bias", None)
        st = _Hot()
        st.lin_h, st.ctx, st.ctx_h = self._h, self._ctx, self._ctx.handle
        st.cuda, st.index, st.dev_type = dev.type == "cuda", dev.index if dev.index is not None else 0, dev.type
        st.n = self.out_features
        st.weight, st.bias = self.weight, self.bias
        st.scale = self.weight_scale_inv if e4m3 else None
        st.wv, st.bv, st.sv = -1, -1, -1  # the first forward tells the Linear
        st.fwd_id, st.accumulate, st.float_loads = 0, False, 0
        # weight.grad is a view of fp8amp's gradient when both are the same float type (not for E4M3)
        st.wgrad_visible = wgrad_dtype == weight_dtype and not e4m3
        st.wgrad_view = _from_fp8amp(self._lin.weight_grad) if st.wgrad_visible else None
        st.bgrad_view = _from_fp8amp(self._lin.bias_grad) if bias else None
        st.hx, st.hy, st.hdy, st.hdx, st.keep = {}, {}, {}, {}, []
        self._st = st
        self._delayed = self.recipe.mode == fp8amp.ScalingMode.DELAYED
        self.reset_parameters()

    @classmethod
    def from_linear(cls, src: nn.Linear, **kw: Any) -> "Linear":
        """A copy of an nn.Linear's parameters (weights kept in float32 unless weight_dtype says;
        E4M3 weights are quantized with a scale fitted to the weight's amax)."""
        m = cls(src.in_features, src.out_features, bias=src.bias is not None, device=src.weight.device, **kw)
        m._write_weight(src.weight)
        if src.bias is not None:
            with torch.no_grad():
                m.bias.copy_(src.bias)
        return m

    def reset_parameters(self) -> None:
        """nn.Linear's initialization (then quantized, for E4M3 weights)."""
        with torch.no_grad():
            w = torch.empty(self.weight.shape, dtype=torch.float32, device=self._device)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            self._write_weight(w)
            if self.bias is not None:
                bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
                nn.init.uniform_(self.bias, -bound, bound)

    def _write_weight(self, w: torch.Tensor) -> None:
        """Writes float values into the weight: a copy for float32/bfloat16 weights; for E4M3 weights
        a quantize with the WEIGHT_STORAGE meta after fitting its scale to w's amax (quantize, update
        the delayed meta, quantize again: docs/linear.md section 1)."""
        with torch.no_grad():
            if not self._e4m3:
                self.weight.copy_(w)
                return
            src = w.detach().to(device=self._device, dtype=torch.float32).contiguous()
            _on_current_stream(self._ctx, self._device)
            f = to_fp8amp(src, self._ctx)
            meta = self._lin.scaling(Role.WEIGHT_STORAGE)
            fp8amp.quantize(self._ctx, f, self._lin.weight)
            meta.update()
            fp8amp.quantize(self._ctx, f, self._lin.weight)
            if self._device.type == "cuda":  # src is freed by torch on its stream: let fp8amp's reads finish
                self._ctx.synchronize()
            self._st.float_loads += 1

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
        kw, ks = prefix + "weight", prefix + "weight_scale_inv"
        if self._e4m3 and kw in state_dict:
            w = state_dict[kw]
            if isinstance(w, torch.Tensor) and w.dtype != torch.float8_e4m3fn and w.is_floating_point():
                # A float weight (an nn.Linear's, or an O1/O2 model's): quantize it with a fitted scale.
                if tuple(w.shape) != tuple(self.weight.shape):
                    error_msgs.append("size mismatch for %s: copying a param with shape %s, the parameter in the "
                                      "current model is %s" % (kw, tuple(w.shape), tuple(self.weight.shape)))
                    return
                self._write_weight(w)
                state_dict[kw] = self.weight.detach()
                state_dict[ks] = self.weight_scale_inv.detach()
            elif ks not in state_dict:
                error_msgs.append("%s holds float8_e4m3fn codes but the state dict has no %s (their scale)" % (kw, ks))
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @property
    def fp8amp_linear(self) -> fp8amp.Linear:
        """The underlying fp8amp.Linear."""
        return self._lin

    @property
    def gemm_kind(self) -> fp8amp.GemmKind:
        return self._lin.gemm_kind

    def dequantized_weight(self) -> torch.Tensor:
        """The weight's values as a new float32 tensor (code * scale_inv for E4M3 weights)."""
        if not self._e4m3:
            return self.weight.detach().float().clone()
        out = torch.empty(self.weight.shape, dtype=torch.float32, device=self._device)
        _on_current_stream(self._ctx, self._device)
        fp8amp.dequantize(self._ctx, self._lin.weight, to_fp8amp(out, self._ctx))
        return out

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
            out.copy_(_from_fp8amp(g))
        return out

    def _write_token(self) -> Tuple[int, int, int]:
        """Moves whenever the weight is written other than through fp8amp (torch writes to the codes or
        the scale, float loads): the O3 Optimizer's master copy is then stale."""
        st = self._st
        return (st.weight._version, st.scale._version if st.scale is not None else 0, st.float_loads)

    def _reset_grads(self) -> None:
        """The next backward overwrites the gradients (called by the Optimizer's zero_grad)."""
        self._st.accumulate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        st = self._st
        if x.is_cuda is not st.cuda:
            raise RuntimeError("fp8amp.torch.Linear on %s got an input on %s" % (self._device, x.device))
        if _grad_enabled():
            w = st.weight
            if x.requires_grad or w.requires_grad:
                return _fn_apply(x, w, st) if not _functorch_active() else _LinearFn.apply(x, w, st)
            b = st.bias
            if b is not None and b.requires_grad:
                return _fn_apply(x, b, st) if not _functorch_active() else _LinearFn.apply(x, b, st)
        return _fwd(st, x, 0)

    def scaling_metas(self) -> List[fp8amp.Scaling]:
        """The INPUT and GRAD_OUTPUT metas (those a delayed recipe updates once per step)."""
        return [self._lin.scaling(Role.INPUT), self._lin.scaling(Role.GRAD_OUTPUT)]

    def extra_repr(self) -> str:
        return "in_features=%d, out_features=%d, bias=%s, weight_dtype=%s, policy=%s" % (
            self.in_features, self.out_features, self.bias is not None, str(self.weight_dtype).replace("torch.", ""),
            self.policy.name)


# ---- the optimizer ------------------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs fp8amp's Adam/AdamW (O1/O2/O3) on the device: made by
    ``initialize``. One fp8amp optimizer per param group (lr, betas, eps, weight_decay of the group;
    ``group["lr"]`` is read at every step, so LR schedulers work); at O3 two per group: one with the
    F16 master copy for the E4M3 Linear weights, one with O2's state for every other parameter
    (fp8amp keeps master copies for low-precision parameters only). Linear layers' weights and
    biases are updated with their fp8amp gradients (E4M3 weight gradients); every other parameter
    with its torch ``.grad`` (kept in a buffer registered with fp8amp, zeroed in place by
    ``zero_grad``).

    Works with ``torch.amp.GradScaler`` (it declares ``_step_supports_amp_scaling``: the step gets
    the scale and the found-inf flag, unscales inside fp8amp's step and skips on overflow; do not
    call ``scaler.unscale_`` first) and with this module's ``GradScaler`` (``step(scaler=...)``).
    ``state_dict()``/``load_state_dict()`` carry fp8amp's checkpoints (parameters, m, v, master
    copies, scales, step count) as bytes plus the groups' hyperparameters.
    """

    _step_supports_amp_scaling = True

    def __init__(self, param_groups: List[Dict[str, Any]], opt_level: Any, adamw: bool, linears: Dict[int, Tuple[Linear, str]],
                 max_grad_norm: float = 0.0, master_rounding: Any = "nearest", rounding_seed: int = 0) -> None:
        super().__init__(param_groups, {})
        self.opt_level = as_opt_level(opt_level)
        o3 = self.opt_level == fp8amp.OptLevel.O3
        self._linears = sorted({id(m): m for m, _ in linears.values()}.values(), key=id)
        self._opts: List[fp8amp.Optimizer] = []
        self._opt_groups: List[int] = []  # the param group of each fp8amp optimizer
        self._plain: List[Tuple[nn.Parameter, torch.Tensor]] = []  # non-Linear params and their grad buffers
        self._ctx: Optional[fp8amp.Context] = None
        self._device: Optional[torch.device] = None
        plan = []  # (group index, config, [(param, grad), ...]) of each fp8amp optimizer to make
        for gi, g in enumerate(self.param_groups):
            if g.get("amsgrad"):
                raise NotImplementedError("amsgrad")
            beta1, beta2 = g["betas"]
            cfg = AdamConfig.for_level(self.opt_level, adamw=adamw, lr=float(g["lr"]), beta1=float(beta1),
                                       beta2=float(beta2), eps=float(g["eps"]), weight_decay=float(g["weight_decay"]),
                                       maximize=bool(g.get("maximize", False)), max_grad_norm=float(max_grad_norm))
            if master_rounding != "nearest" or rounding_seed:  # fp8amp 0.4.0: how O3's masters are rounded
                cfg = dataclasses.replace(cfg, master_rounding=master_rounding, rounding_seed=rounding_seed)
            low, other = [], []  # O3: E4M3 weights (with the F16 master) / everything else (no master)
            for p in g["params"]:
                dev = _norm_device(p.device)
                if self._device is None:
                    self._device, self._ctx = dev, context(dev)
                elif dev != self._device:
                    raise NotImplementedError("parameters on several devices")
                if id(p) in linears:
                    m, which = linears[id(p)]
                    lin = m.fp8amp_linear
                    pair = (lin.weight, lin.weight_grad) if which == "weight" else (lin.bias, lin.bias_grad)
                    (low if o3 and pair[0].dtype == fp8amp.E4M3 else other).append(pair)
                else:
                    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not p.is_contiguous():
                        raise TypeError("fp8amp's optimizer takes contiguous float32/bfloat16/float16 parameters")
                    other.append(p)  # its buffer is made below, once the layout is known to be valid
            if not low and not other:
                raise ValueError("an empty param group")
            if low:
                plan.append((gi, cfg, low))
            if other:
                plan.append((gi, dataclasses.replace(cfg, master_dtype=None) if o3 else cfg, other))
        if max_grad_norm and len(plan) > 1:
            raise NotImplementedError("max_grad_norm with several fp8amp optimizers (several param groups, or O3's "
                                      "E4M3 weights beside other parameters): each would be clipped by its own norm")
        assert self._ctx is not None and self._device is not None
        for gi, cfg, items in plan:
            pairs = []
            for it in items:
                if isinstance(it, tuple):
                    pairs.append(it)
                    continue
                buf = torch.zeros_like(it, memory_format=torch.contiguous_format)
                if it.grad is not None:
                    buf.copy_(it.grad)
                it.grad = buf
                self._plain.append((it, buf))
                pairs.append((to_fp8amp(it, self._ctx), to_fp8amp(buf, self._ctx)))
            _on_current_stream(self._ctx, self._device)
            self._opts.append(fp8amp.Optimizer(self._ctx, cfg, pairs))
            self._opt_groups.append(gi)
        self._metas = [mt for m in self._linears if m._delayed for mt in m.scaling_metas()]
        # O3: the F16 master copies start from the E4M3 weights now; a later write to a weight that
        # does not go through fp8amp (a model load_state_dict) would leave its master stale.
        self._masters = [m for m in self._linears if m._e4m3 and any(
            p is m.weight for g in self.param_groups for p in g["params"])] if o3 else []
        self._tokens = [m._write_token() for m in self._masters]

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
        if scaler is not None and not isinstance(scaler, GradScaler):
            raise TypeError("fp8amp.torch.Optimizer.step: scaler must be an fp8amp.torch.GradScaler or None, not %s"
                            % type(scaler).__name__)
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
        if self._masters:
            for m, t in zip(self._masters, self._tokens):
                if m._write_token() != t:
                    raise RuntimeError("an E4M3 weight of this O3 optimizer was written outside fp8amp (a model "
                                       "load_state_dict, copy_) after the optimizer was made: its F16 master copy is "
                                       "stale. Load model weights before initialize(), or load this optimizer's "
                                       "state_dict after the model's (it holds the weights and their masters).")
        self._rebind_grads()
        assert self._ctx is not None and self._device is not None
        _on_current_stream(self._ctx, self._device)
        c_scaler = scaler._scaler if scaler is not None else None  # closed: the fp8amp step raises
        groups = self.param_groups
        if c_scaler is not None and len(self._opts) > 1:
            inv /= c_scaler.scale  # several fp8amp optimizers: one host read of the scale, then one update
            for o, gi in zip(self._opts, self._opt_groups):
                o.step(lr=float(groups[gi]["lr"]), grad_scale_inv=inv)
            bad = [o for o in self._opts if o.found_inf]
            c_scaler.update(bad[0] if bad else self._opts[0])
        else:
            for o, gi in zip(self._opts, self._opt_groups):
                o.step(lr=float(groups[gi]["lr"]), grad_scale_inv=inv, scaler=c_scaler)
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
        return {"fp8amp": [o.save() for o in self._opts], "fp8amp_groups": list(self._opt_groups),
                "param_groups": groups, "opt_level": int(self.opt_level)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # type: ignore[override]
        blobs = state_dict["fp8amp"]
        if (len(blobs) != len(self._opts) or int(state_dict.get("opt_level", self.opt_level)) != int(self.opt_level)
                or list(state_dict.get("fp8amp_groups", self._opt_groups)) != self._opt_groups
                or len(state_dict["param_groups"]) != len(self.param_groups)):
            raise ValueError("the state dict is of another fp8amp optimizer (groups or opt level differ)")
        for o, b in zip(self._opts, blobs):
            o.load(b)
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        # The loads wrote the parameters (and O3's masters) through fp8amp: the Linears notice that by
        # themselves, and weights and masters agree again.
        self._tokens = [m._write_token() for m in self._masters]


def initialize(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, opt_level: Any = "O1",
               *, policy: Any = "auto", recipe: Optional[fp8amp.Recipe] = None,
               weight_dtype: Optional[torch.dtype] = None, wgrad_dtype: Optional[torch.dtype] = None,
               max_grad_norm: float = 0.0, exclude: Any = (), master_rounding: Any = "nearest",
               rounding_seed: int = 0) -> Any:
    """Replaces every nn.Linear of `model` by an fp8amp.torch.Linear (parameters copied) and, with
    an optimizer (torch.optim.Adam or AdamW), returns ``(model, Optimizer)`` running fp8amp's Adam at
    `opt_level` ("O1": F32 m and v; "O2": E4M3 m, F16 v; "O3": O2 plus E4M3 Linear weights with an
    F16 master copy) over all its parameters; without one, returns the model. Linear weights are
    float32 at O1/O2 and float8_e4m3fn at O3 (weight_dtype; O3 needs E4M3 weights and E4M3 weights
    need O3), their gradients are E4M3 (wgrad_dtype, default float8_e4m3fn with an optimizer, the
    weight dtype without), the GEMM policy is `policy` ("auto", "fp8", "bf16") and the recipe current
    scaling unless given. `exclude`: the qualified names of nn.Linear modules to keep as they are
    (e.g. ``("lm_head",)``: output layers are commonly kept in 16 bits), or a callable
    ``(name, module) -> bool``. `master_rounding` ("nearest" or "stochastic") and `rounding_seed`:
    how the O3 optimizer rounds the F16 master copies (fp8amp_adam_desc.master_rounding)."""
    level = as_opt_level(opt_level)
    o3 = level == fp8amp.OptLevel.O3
    if weight_dtype is None:
        weight_dtype = torch.float8_e4m3fn if o3 else torch.float32
    if o3 and weight_dtype != torch.float8_e4m3fn:
        raise ValueError("O3 keeps the Linear weights in E4M3 (weight_dtype=torch.float8_e4m3fn); use O2 for %s "
                         "weights" % weight_dtype)
    if not o3 and weight_dtype == torch.float8_e4m3fn and optimizer is not None:
        raise ValueError("E4M3 weights train only at O3, whose F16 master copy keeps the small updates that E4M3 "
                         "would round away")
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
    opt = Optimizer(groups, level, isinstance(optimizer, torch.optim.AdamW), linears, max_grad_norm=max_grad_norm,
                    master_rounding=master_rounding, rounding_seed=rounding_seed)
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


_COMMS: Dict[Tuple[str, int], fp8amp.Communicator] = {}


def communicator(device: Any, group: Any = None) -> fp8amp.Communicator:
    """fp8amp's communicator (FP8 on the wire, docs/communicator.md) over the ranks of torch.distributed's
    `group` (the default group when None) on a CUDA `device`: made on first use -- collectively: every
    rank of the group must ask for it the first time -- with its NCCL id broadcast through the group,
    then cached for that device and group. Rank r of the group is rank r of the communicator."""
    import torch.distributed as dist

    d = _norm_device(device)
    if d.type != "cuda":
        raise fp8amp.NotSupportedError(int(lib.FP8AMP_ERROR_NOT_SUPPORTED),
            "fp8amp.torch.communicator: %s is not a CUDA device; the CPU communicator runs over MPI "
            "(processes started by mpirun), not over torch.distributed's processes" % d)
    key = (str(d), id(group))
    comm = _COMMS.get(key)
    if comm is None or comm.closed:
        ctx = context(d)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        box = [fp8amp.Communicator.unique_id(ctx) if rank == 0 else None]
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
        comm = fp8amp.Communicator(ctx, box[0], world, rank)
        comm._group = group  # type: ignore[attr-defined]  # keeps the key's id(group) from being reused
        _COMMS[key] = comm
    return comm


def all_reduce_grads(model: nn.Module, group: Any = None, *, fp8_wire: bool = True) -> None:
    """Averages every gradient of `model` over torch.distributed's `group` (the default group when
    None). Call after backward, before step, on every rank.

    On CUDA with ``fp8_wire`` (the default), the E4M3 weight gradients of the fp8amp.torch.Linear
    layers go in one bucket through fp8amp's communicator (FP8 on the wire, FP32 accumulation in rank
    order, one agreed scale per tensor; every rank gets identical bytes; docs/communicator.md), in
    place: each keeps its codes' new scale_inv. The other gradients (biases, norms, embeddings,
    BF16/F32 weight gradients) keep their dtype and go through torch.distributed, coalesced into one
    all_reduce per dtype and device. Without ``fp8_wire``, or on the CPU, the E4M3 weight gradients are
    dequantized to float32, all-reduced through torch.distributed and quantized back."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    seen = set()
    buckets: Dict[str, List[Tuple[Linear, fp8amp.Tensor]]] = {}
    for mod in model.modules():
        if isinstance(mod, Linear) and mod._lin.weight_grad.dtype == fp8amp.E4M3:
            seen.add(id(mod.weight))
            if fp8_wire and mod._device.type == "cuda":
                buckets.setdefault(str(mod._device), []).append((mod, mod._lin.weight_grad))
                continue
            g = mod.dequantized_weight_grad()
            dist.all_reduce(g, group=group)
            g.div_(world)
            _on_current_stream(mod._ctx, mod._device)
            # same stream as the reduction's consumer; g's memory is reused only after this kernel
            fp8amp.quantize(mod._ctx, to_fp8amp(g, mod._ctx), mod._lin.weight_grad)
    for dev, items in buckets.items():
        comm = communicator(dev, group)
        _on_current_stream(comm.context, _norm_device(dev))
        grads = [g for _, g in items]
        comm.all_reduce(grads, grads)
    # The rest in its own dtype: one flat buffer per (device, dtype), so one collective each.
    rest: Dict[Tuple[str, torch.dtype], List[torch.Tensor]] = {}
    for p in model.parameters():
        if id(p) in seen or p.grad is None:
            continue
        rest.setdefault((str(p.grad.device), p.grad.dtype), []).append(p.grad)
    for grads in rest.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

from .fused import GELU, LayerNorm, LayerNormLinear, LayerNormMLP  # noqa: E402,F401  (issue 19: fused blocks, fused.py)
