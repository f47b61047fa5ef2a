"""The Linear side of the PyTorch front (imported and re-exported by fp8amp.torch): the dtype maps,
one fp8amp context per torch device (memory from torch's caching allocator), the zero-copy tensor
helpers and the ``Linear`` module with its autograd path. See fp8amp/torch/__init__.py for the front's
overview and bindings/python/README.md ("PyTorch front") for how the two libraries share memory,
streams and gradients."""
from __future__ import annotations

import inspect
import itertools
import logging
import math
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import NULL, ffi, lib
from fp8amp.errors import DtypeMismatchError, check
from fp8amp.linear import Role, _as_policy

_log = logging.getLogger("fp8amp")

from fp8amp.torch.context import _DT, _from_fp8amp, _norm_device, _on_current_stream, _raw_stream, context, to_fp8amp


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
_c_forward_fp8 = lib.fp8amp_linear_forward_fp8
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
try:
    _compiling = torch.compiler.is_compiling  # public since torch 2.3
except AttributeError:  # pragma: no cover - torch < 2.3, which has only the private spelling
    _compiling = torch._dynamo.is_compiling
# Whether the caller runs inside a backward pass (a graph task): a training forward there is a
# recomputation (torch.utils.checkpoint), not a second use of the layer in the same forward pass.
# Private: torch has no public spelling of it (torch.autograd.graph calls it too); without it every
# second forward before a backward counts as a reuse (only costs memory: see _train_fwd).
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
# Whether saved-tensor hooks are active (torch.utils.checkpoint, CPU offloading): only then can a
# saved tensor come back as another one, so only then does the eager path save a token (below).
# Private too (torch.autograd.graph.saved_tensors_hooks pushes hooks; nothing public asks which are
# active). The public alternative, a token at every call, is the fallback below: the query costs
# 0.14 us, a token tensor 2.9-4 us per call (torch.empty(0) and an attribute; measured on this
# project's 2-core CPU machine under load), against a forward whose Python part is about 6 us
# (docs/performance.md).
try:
    _pack_hooks = torch._C._autograd._top_saved_tensors_default_hooks
    _pack_hooks(False)
except (AttributeError, TypeError):  # pragma: no cover - other torch versions
    def _pack_hooks(ignore_is_tracing: bool) -> Any:
        return True


class _Hot:
    """The state every call of one ft.Linear uses (see above)."""

    __slots__ = ("lin_h", "ctx", "ctx_h", "cuda", "index", "dev_type", "n", "weight", "bias", "scale", "wv", "bv",
                 "sv", "fwd_id", "accumulate", "wgrad_visible", "wgrad_view", "bgrad_view", "hx", "hy", "hdy", "hdx",
                 "keep", "float_loads",
                 # several forwards per backward (see _train_fwd): the forward whose backward the C
                 # Linear can run (bwd_id: the last forward whose backward ran), the last training
                 # forward's record (a weakref), save_input (None: auto) and whether a reuse was seen
                 "bwd_id", "last", "save_input", "reused", "name",
                 # the custom ops' view of the layer (torch.compile): its key in _LAYERS, the weight
                 # gradient (any dtype) and the bias gradient as torch tensors (what the backward writes)
                 "key", "wgrad_t", "bgrad_t",
                 # gradients through autograd (LinearGrad, docs/torch.md section 5): what the backward
                 # returns for the weight and the bias, what weight.grad is between backwards (the view,
                 # or the handle for E4M3 / other-dtype gradients), whether a torch-side write left the
                 # C Linear's FP32 sum behind the delivered gradient (stale), and the BF16 view's version
                 "wref", "bref", "wgrad_obj", "stale", "wver", "__weakref__")


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


def _prepare(st: _Hot) -> None:
    """What every forward does first: torch-side writes of the parameters told to the C Linear, its
    context on torch's current stream."""
    b, s = st.bias, st.scale
    if st.weight._version != st.wv or (b is not None and b._version != st.bv) or (s is not None and s._version != st.sv):
        _sync_writes(st)
    if st.cuda:
        stream = _raw_stream(st.index)
        if stream != st.ctx._torch_stream:
            _set_stream(st, stream)


def _fwd_fp8(st: _Hot, x8_h: Any, shape: Tuple[int, ...], ydt: torch.dtype, device: torch.device,
             training: int) -> torch.Tensor:
    """The forward from an E4M3 input handle a fused norm or activation just wrote (bound to this
    Linear's INPUT meta; fp8amp_linear_forward_fp8). Call _prepare(st) before that producer runs."""
    yshape = tuple(shape[:-1]) + (st.n,)
    y = torch.empty(yshape, dtype=ydt, device=device)
    vy = st.hy.get(ydt) or _new_view(st, st.hy, y)
    p = y.data_ptr()
    if p != vy.ptr or yshape != tuple(vy.shape):
        rc = _rebind(vy.h, _cast(_VOIDP, p), len(yshape), yshape)
        if rc:
            check(rc)
        vy.ptr, vy.shape = p, y.shape
    rc = _c_forward_fp8(st.lin_h, x8_h, vy.h, training)
    if rc:
        check(rc)
    if training:
        st.fwd_id += 1
    return y


def _fwd(st: _Hot, x: torch.Tensor, training: int, ydt: Optional[torch.dtype] = None) -> torch.Tensor:
    _prepare(st)
    if not x.is_contiguous():
        x = x.contiguous()
    xdt = x.dtype
    if ydt is None:
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


# ---- gradients through autograd (docs/torch.md section 5) -------------------------------------------
#
# The C Linear writes the weight and bias gradients into its own memory and adds micro-batches in its
# own FP32 sum; the E4M3 weight gradient fp8amp's optimizer reads has no float copy at all. For DDP's
# reducer, register_post_accumulate_grad_hook and friends to see them, the backward still returns a
# gradient for each parameter: a LinearGrad, a tensor subclass that is a handle to that memory (no
# copy). _bwd sets param.grad to the buffer itself (a plain view for float gradients of the
# parameter's dtype) or to the handle (E4M3 and other-dtype gradients), so AccumulateGrad always
# finds .grad defined and runs `.grad += returned`: an add of two names of one buffer, which the
# handle's __torch_dispatch__ turns into a no-op (the C Linear has already added this backward into
# its sum). Any other op reads the handle's value (the E4M3 codes dequantized to float32: a temporary)
# and any write into a handle stores back (quantized with current scaling), marking the C Linear's
# FP32 sum stale (the next accumulating backward adds onto the written value, _bwd_onto_written).

_aten = torch.ops.aten
_ZEROS = (_aten.zero_.default, _aten._foreach_zero_.default)
_ALIASES = (_aten.detach.default, _aten.alias.default)


class LinearGrad(torch.Tensor):
    """A gradient of an fp8amp.torch.Linear's parameter as a torch tensor that holds no values of its
    own: a handle to the C Linear's gradient buffer (the E4M3 codes and their scale, or a float
    buffer). Its dtype and shape are the parameter's. What autograd gets from the layer's backward,
    and what ``weight.grad`` is when the weight gradient is not a plain float view (E4M3 at O1/O2/O3
    through ``initialize``). Reading it (any torch op: ``clone``, ``float``, arithmetic, DDP's copy
    into its bucket) gives the dequantized values (float32 for E4M3); writing it (``copy_``, ``mul_``,
    ``zero_``, DDP's copy back of the averaged bucket) stores into the buffer (E4M3: quantized with
    current scaling). Adding two names of one buffer (what autograd's accumulation does) is a no-op:
    the C Linear accumulates micro-batches itself, in FP32. ``data_ptr`` and storage access raise."""

    # torch.Tensor._make_wrapper_subclass: the one way to make a tensor subclass that holds no storage of
    # its own (what torch's docs on __torch_dispatch__ subclasses and its own DTensor use); torch has no
    # public spelling of it.
    @staticmethod
    def __new__(cls, buf: torch.Tensor, fp8: Optional[fp8amp.Tensor], ctx: fp8amp.Context, dev: torch.device,
                dtype: torch.dtype, st: _Hot, sep: bool) -> "LinearGrad":
        t = torch.Tensor._make_wrapper_subclass(cls, buf.shape, dtype=dtype, device=buf.device,  # type: ignore
                                                requires_grad=False)
        t._buf, t._fp8, t._ctx, t._dev = buf, fp8, ctx, dev
        # a weak reference: the layer state holds the parameters, whose .grad may be this handle
        t._st, t._sep = weakref.ref(st), sep
        t._view = None  # the plain view that is .grad between backwards, when there is one (set by Linear)
        t._sinv = t._meta = None  # E4M3: its scale_inv slot (a float32 view) and its meta (set by Linear)
        return t

    def __repr__(self) -> str:  # type: ignore[override]
        return "LinearGrad(%s, %s of %s)" % (tuple(self.shape), str(self.dtype).replace("torch.", ""),
                                             str(self._buf.dtype).replace("torch.", ""))

    def _alias(self) -> "LinearGrad":
        t = torch.Tensor._make_wrapper_subclass(type(self), self._buf.shape, dtype=self.dtype,  # type: ignore
                                                device=self._buf.device, requires_grad=False)
        t._buf, t._fp8, t._ctx, t._dev, t._st, t._sep = self._buf, self._fp8, self._ctx, self._dev, self._st, self._sep
        t._view, t._sinv, t._meta = self._view, self._sinv, self._meta
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _aten.add_.Tensor or func is _aten.add.Tensor:
            if len(args) == 2 and not kwargs:
                a, b = args
                # the usual case first, by identity: .grad (the view or the handle) += the handle
                if a is b or a is getattr(b, "_view", 0):
                    return a
                if _same_buffer(a, b):
                    return a  # autograd's accumulation of a gradient the C Linear already summed
                if func is _aten.add.Tensor and _graph_task_id() != -1:
                    # Inside a backward pass: autograd summing this layer's gradient with a plain one
                    # for the same parameter (the weight also used outside the layer): add the plain
                    # one into the buffer, which stays the parameter's gradient.
                    g, p = (a, b) if isinstance(a, LinearGrad) else (b, a)
                    if isinstance(g, LinearGrad) and not isinstance(p, LinearGrad) and isinstance(p, torch.Tensor) \
                            and p.shape == g.shape:
                        v = _grad_value(g)
                        v.add_(p)
                        _grad_store(g, v)
                        _mark_written(g, False)
                        return g
        if func in _SCALES and not kwargs:
            r = _scale_dispatch(func, args)
            if r is not NotImplemented:
                return r
        if func in _ALIASES:
            return args[0]._alias()
        if func is _aten.copy_.default and isinstance(args[0], LinearGrad) and not isinstance(args[1], LinearGrad):
            # DDP's write-back of the averaged bucket: store it, without reading the old values first
            g, src = args[0], args[1]
            _grad_store(g, src.expand(g.shape) if src.shape != g.shape else src)
            _mark_written(g, False)
            return g
        kwargs = kwargs or {}
        # Every other op on the values: writes into a handle go to a value and are stored back.
        back: Dict[int, LinearGrad] = {}
        written: List[Tuple[LinearGrad, torch.Tensor]] = []

        def val(x: Any, write: bool) -> Any:
            if isinstance(x, LinearGrad):
                v = _grad_value(x)
                if write:
                    written.append((x, v))
                    back[id(v)] = x
                return v
            if isinstance(x, (list, tuple)):
                return type(x)(val(e, write) for e in x)
            return x

        schema = func._schema.arguments
        kw_write = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write}
        _refuse_f8_write(func, args, kwargs, schema, kw_write)
        args2 = []
        for i, a in enumerate(args):
            ai = schema[i].alias_info if i < len(schema) else None
            args2.append(val(a, ai is not None and ai.is_write))
        kwargs2 = {k: val(v, k in kw_write) for k, v in kwargs.items()}
        out = func(*args2, **kwargs2)
        zero = func in _ZEROS
        for g, v in written:
            _grad_store(g, v)
            _mark_written(g, zero)
        if not back:
            return out
        if isinstance(out, (list, tuple)):
            return type(out)(back.get(id(o), o) for o in out)
        return back.get(id(out), out)


# Multiplying an E4M3 gradient by one number (torch.amp.GradScaler's unscale_, clip_grad_norm_'s clip
# coefficient, a user's grad.mul_(c)) multiplies its scale_inv slot instead of the codes: the values
# code * scale_inv scale exactly (no second rounding into E4M3, no float32 temporary) and fp8amp's
# optimizer, dequantize and all_reduce_grads read that slot. torch.amp.GradScaler checks for inf/NaN
# with the same op that unscales: for an E4M3 gradient the check is fp8amp's own (_scale_fp8_grad).
# The aten names are the ops torch itself dispatches (underscored there; no public alias to match).
_AMP_UNSCALE = getattr(_aten, "_amp_foreach_non_finite_check_and_unscale_", None)
_SCALES = tuple(op for op in (_aten.mul_.Tensor, _aten.mul_.Scalar, getattr(_aten._foreach_mul_, "Tensor", None),
                              getattr(_aten._foreach_mul_, "Scalar", None),
                              _AMP_UNSCALE.default if _AMP_UNSCALE is not None else None) if op is not None)


def _is_fp8_grad(g: Any) -> bool:
    return isinstance(g, LinearGrad) and g._fp8 is not None and g._sinv is not None


def _is_factor(f: Any) -> bool:
    """One number: a Python number or a 0-dim plain tensor (a tensor of several values multiplies
    elementwise: the general path)."""
    if isinstance(f, LinearGrad):
        return False
    if isinstance(f, torch.Tensor):
        return f.dim() == 0
    return isinstance(f, (int, float)) and not isinstance(f, bool)


def _scale_fp8_grad(g: LinearGrad, factor: Any, check: bool = False) -> Optional[torch.Tensor]:
    """Multiplies an E4M3 gradient's values by `factor` (a number or a 0-dim tensor) through its scale_inv
    slot; with `check`, returns a 0-dim bool tensor on the slot's device: whether the gradient holds a
    value that is not finite. fp8amp's step decides that from the weight-gradient meta's recorded amax
    (an inf/NaN quantized saturates to a finite code, so the codes cannot tell) and from the unscaled
    factor (an overflow of the unscaling): the same test here, on the device -- the amax read through
    the meta's amax tensor (fp8amp_scaling_amax_tensor), so no host wait per layer."""
    s = g._sinv
    if isinstance(factor, torch.Tensor):
        factor = factor.to(device=s.device, dtype=torch.float32)
    _on_current_stream(g._ctx, g._dev)
    s.mul_(factor)
    _mark_written(g, False)
    if not check:
        return None
    return torch.logical_not(torch.isfinite(s) & torch.isfinite(_amax_view(g._meta)))


def _amax_view(meta: fp8amp.Scaling) -> torch.Tensor:
    """A torch view (0-dim float32, on the meta's device) of the amax the meta recorded since its last
    update, made once per meta and kept on it (the view keeps the meta's memory alive by itself)."""
    v = getattr(meta, "_torch_amax", None)
    if v is None:
        v = torch.from_dlpack(meta.amax_tensor())
        meta._torch_amax = v
    return v


def _scale_dispatch(func: Any, args: Tuple[Any, ...]) -> Any:
    """The scalar multiplies and torch.amp's unscale with E4M3 handles among their operands (see
    _SCALES), or NotImplemented when there are none (or the factor is not one number)."""
    if func is _aten.mul_.Tensor or func is _aten.mul_.Scalar:
        g, f = args
        if not _is_fp8_grad(g) or not _is_factor(f):
            return NotImplemented
        _scale_fp8_grad(g, f)
        return g
    grads = args[0]
    fp8 = [g for g in grads if _is_fp8_grad(g)]
    if not fp8:
        return NotImplemented
    rest = [g for g in grads if not _is_fp8_grad(g)]
    if _AMP_UNSCALE is not None and func is _AMP_UNSCALE.default:
        found, inv = args[1], args[2]
        if rest:
            func(rest, found, inv)  # the other gradients: torch's own op (float handles: the general path)
        for g in fp8:
            bad = _scale_fp8_grad(g, inv, check=True)
            found.copy_(torch.maximum(found, bad.to(device=found.device, dtype=found.dtype)))
        return None
    f = args[1]
    if not _is_factor(f):
        return NotImplemented
    if rest:
        func(rest, f)
    for g in fp8:
        _scale_fp8_grad(g, f)
    return None


_F8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
            if hasattr(torch, n))


def _refuse_f8_write(func: Any, args: Any, kwargs: Dict[str, Any], schema: Any, kw_write: Any) -> None:
    """An O3 gradient handle (dtype float8_e4m3fn, values float32) read into a plain float8 tensor:
    a cast without a scale, saturating or flushing the values. That is DDP's copy of the gradient into
    its bucket at O3 (a float8 bucket, as the parameter), which no collective could reduce anyway:
    refused by name rather than giving wrong gradients (docs/torch.md section 6)."""
    def flat(xs: Any) -> List[Any]:
        out: List[Any] = []
        for x in xs:
            out.extend(flat(x) if isinstance(x, (list, tuple)) else [x])
        return out

    written = [a for i, a in enumerate(args) if i < len(schema) and schema[i].alias_info is not None
               and schema[i].alias_info.is_write] + [v for k, v in kwargs.items() if k in kw_write]
    if not any(isinstance(t, torch.Tensor) and not isinstance(t, LinearGrad) and t.dtype in _F8
               for t in flat(written)):
        return
    if any(isinstance(t, LinearGrad) and t.dtype in _F8 for t in flat(list(args) + list(kwargs.values()))):
        raise NotImplementedError(
            "%s: an E4M3 weight's gradient (O3) written into a float8 tensor without a scale. This is "
            "DistributedDataParallel's copy into its gradient bucket at O3, which is not supported: DDP buckets "
            "a float8 parameter's gradient in float8, which its collectives do not reduce. At O3 wrap the model "
            "with fp8amp.torch.data_parallel(model, ...) (DDP with the E4M3 weights reduced by fp8amp's hooks), "
            "or reduce the gradients with fp8amp.torch.all_reduce_grads after backward. "
            "To store a gradient's values as float8, convert them explicitly (p.grad.float().to(dtype))"
            % func)


def _same_buffer(a: Any, b: Any) -> bool:
    """Whether a and b both name one LinearGrad buffer (a handle, or the plain view that is it)."""
    if isinstance(a, LinearGrad):
        if isinstance(b, LinearGrad):
            return a._buf is b._buf or (a._buf.data_ptr() == b._buf.data_ptr() and a._buf.dtype == b._buf.dtype)
        a, b = b, a
    elif not isinstance(b, LinearGrad):
        return False
    # b is the handle, a a plain tensor: the same memory, dtype and shape as b's (dense) buffer
    return (b._fp8 is None and isinstance(a, torch.Tensor) and a.dtype == b._buf.dtype
            and a.shape == b._buf.shape and a.device == b._buf.device and a.data_ptr() == b._buf.data_ptr())


def _grad_value(g: LinearGrad) -> torch.Tensor:
    """The handle's values: the E4M3 codes dequantized into a new float32 tensor; a float buffer
    itself (so writes go straight into it) or, of another dtype than the parameter's, a copy."""
    buf = g._buf
    if g._fp8 is not None:
        out = torch.empty(buf.shape, dtype=torch.float32, device=buf.device)
        _on_current_stream(g._ctx, g._dev)
        fp8amp.dequantize(g._ctx, g._fp8, to_fp8amp(out, g._ctx))
        return out
    return buf if buf.dtype == g.dtype else buf.to(g.dtype)


def _grad_store(g: LinearGrad, v: torch.Tensor) -> None:
    """Stores values into the handle's buffer (E4M3: quantized with current scaling)."""
    if v is g._buf:
        return
    if g._fp8 is not None:
        src = v.detach().to(device=g._buf.device, dtype=torch.float32).contiguous()
        _on_current_stream(g._ctx, g._dev)
        fp8amp.quantize(g._ctx, to_fp8amp(src, g._ctx), g._fp8)  # on torch's stream: src outlives the read
    else:
        with torch.no_grad():
            g._buf.copy_(v)


def _mark_written(g: LinearGrad, zero: bool) -> None:
    """After a torch-side write into a gradient with its own FP32 sum in the C Linear: a zeroing makes
    the next backward overwrite, any other write makes the sum stale."""
    st = g._st()
    if st is None or not g._sep:
        return
    if zero:
        st.accumulate = False
    else:
        st.stale = True


def _bwd(st: _Hot, dy: torch.Tensor, dx: Optional[torch.Tensor]) -> None:
    if st.cuda:
        stream = _raw_stream(st.index)
        if stream != st.ctx._torch_stream:
            _set_stream(st, stream)
    if not dy.is_contiguous():
        dy = dy.contiguous()
    w, b = st.weight, st.bias
    if w._version != st.wv:
        # torch wrote the weight since the forward: tell the C Linear, whose lean backward (the default)
        # re-makes the weight's FP8 copy from it and so refuses to back that forward (it would not)
        _sync_writes(st)
    acc = st.accumulate
    wg = st.wgrad_obj
    # A torch optimizer or module zero_grad(set_to_none=True) drops the grads: start over.
    if acc and ((b is not None and b.grad is None) or w.grad is None):
        acc = False
    if not acc:
        st.stale = False
    elif st.stale or (st.wver >= 0 and wg._version != st.wver):
        # torch wrote the delivered weight gradient (DDP's averaged bucket, a user's mul_) since the
        # last backward: the C Linear's FP32 sum no longer matches it, so add this backward to the
        # written value here instead (rare: a write between two micro-batches).
        _bwd_onto_written(st, dy, dx)
        return
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
    if w.grad is not wg:
        w.grad = wg
    if st.wver >= 0:
        st.wver = wg._version
    if b is not None and b.grad is not st.bgrad_view:
        b.grad = st.bgrad_view


def _bwd_onto_written(st: _Hot, dy: torch.Tensor, dx: Optional[torch.Tensor]) -> None:
    """A backward that adds onto a weight gradient torch has written since the last backward: the
    written values (weight and bias) are kept aside, the C Linear overwrites, and the sums are
    stored back (the E4M3 gradient quantized once more, with current scaling). The sum stays stale."""
    wr = st.wref
    prev_w = _grad_value(wr).clone()
    prev_b = st.bgrad_view.clone() if st.bias is not None else None
    st.accumulate = False
    try:
        _bwd(st, dy, dx)
    finally:
        st.accumulate = True
    _grad_store(wr, _grad_value(wr).add_(prev_w))
    if prev_b is not None:
        st.bgrad_view.add_(prev_b)
    st.stale = True


# ---- several forwards per backward -------------------------------------------------------------
#
# The C Linear keeps what its LAST training forward saved (the input as x8^T, 1 byte per element), so
# its backward backs that forward only. Each training forward gets an id (st.fwd_id counts them); a
# backward whose forward is the C Linear's last one (and not yet backed) runs directly. Any other
# backward -- a layer used twice in one forward pass, or torch.utils.checkpoint's recomputation
# having run in between -- recomputes: one training forward on the saved input, then the backward.
#
# Which inputs are kept: keeping every input (as nn.Linear does) would give up the FP8 activation
# memory, so by default (save_input=None) a forward keeps only a weak reference to its input. A
# second training forward of the layer while an earlier one still waits for its backward is a reuse:
# the earlier input is then held (when it is still alive), this one too, and the layer holds every
# later input (st.reused; logged once). Only a reuse whose earlier input was already freed (e.g. a
# temporary passed straight in) cannot be backed: that backward raises, naming save_input=True, and
# the next step works. checkpoint's recomputation runs inside the backward pass and is not counted
# as a reuse; it re-runs the forward just before the backward, so the saved token (a tensor, which
# checkpoint replaces by the recomputed one; it carries the recomputed forward's record) names the
# forward the C Linear holds and no input is needed. A recomputed forward holds its input (in case
# another backward of the layer runs in between): only until the backward, inside the backward pass.


class _Rec:
    """One training forward: its id, its input (strong or weak) and whether its backward ran."""

    __slots__ = ("fwd_id", "x", "xw", "xv", "done", "__weakref__")


def _train_fwd(st: _Hot, x: torch.Tensor, ydt: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, _Rec]:
    prev = st.last() if st.last is not None else None
    y = _fwd(st, x, 1, ydt)
    rec = _Rec()
    rec.fwd_id, rec.done, rec.xv = st.fwd_id, False, x._version
    keep = st.save_input
    if prev is not None and not prev.done and keep is not False:
        if not st.reused and _graph_task_id() == -1:
            st.reused = True
            _log.info("fp8amp.torch.Linear %s: a second training forward before the first one's backward (a layer "
                      "used twice): from now on it keeps its inputs for backward (in their dtype, as nn.Linear does)",
                      st.name or "#%d" % st.key)
        if prev.x is None and prev.xw is not None:
            prev.x = prev.xw()  # None when it was already freed: that backward raises
        keep = True
    if keep or st.reused and keep is None:
        rec.x, rec.xw = x, None
    else:
        rec.x, rec.xw = None, weakref.ref(x)
    st.last = weakref.ref(rec)
    return y, rec


def _train_bwd(st: _Hot, fwd_id: int, x: Optional[torch.Tensor], xv: int, dy: torch.Tensor,
               dx: Optional[torch.Tensor]) -> None:
    """The backward of training forward `fwd_id`; `x` its input if kept (version xv when saved)."""
    if fwd_id != st.fwd_id or st.bwd_id == fwd_id:
        if x is None:
            raise RuntimeError(
                "fp8amp.torch.Linear %s: this backward is not of the layer's last training forward (the layer ran "
                "another training forward since, e.g. it is used twice per forward pass) and that forward's input "
                "was freed before the reuse was seen. The layer keeps its inputs from now on (the next step works); "
                "create it with save_input=True to keep them from the start." % (st.name or "#%d" % st.key))
        if x._version != xv:
            raise RuntimeError("fp8amp.torch.Linear %s: the input saved for backward was modified in place after the "
                               "forward" % (st.name or "#%d" % st.key))
        _fwd(st, x, 1)  # recompute: the C Linear saves this input again (its output is not needed)
    _bwd(st, dy, dx)
    st.bwd_id = st.fwd_id


class _LinearFn(torch.autograd.Function):
    """The eager path: an autograd.Function (cheaper per call than the custom ops' dispatch)."""

    @staticmethod
    def forward(fctx, x, w, b, st):  # type: ignore[override]
        # w, b: the parameters (b may be None), inputs so that autograd runs their AccumulateGrad
        # nodes (and DDP's hooks): the backward returns their LinearGrad handles (see LinearGrad).
        y, rec = _train_fwd(st, x)
        hooked = _pack_hooks(False) is not None
        if hooked:  # checkpoint's recomputation replaces the token by its own (see above)
            token = torch.empty(0)
            token._fp8amp_rec = rec
            fctx.save_for_backward(token)
            if _graph_task_id() != -1:  # this is a recomputation
                rec.x, rec.xw = x, None
        fctx.saved = (st, rec, x.shape, x.dtype, hooked)
        return y

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        st, rec, shape, dtype, hooked = fctx.saved
        held = rec
        if hooked:
            # the recomputed forward's record under checkpoint; hooks that hand back a copy
            # (torch.autograd.graph.save_on_cpu) drop the attribute: then this forward's own
            held = getattr(fctx.saved_tensors[0], "_fp8amp_rec", rec)
        x, xv = (held.x, held.xv) if held.x is not None else (rec.x, rec.xv)
        dx = dy.new_empty(shape, dtype=dtype) if fctx.needs_input_grad[0] else None
        _train_bwd(st, held.fwd_id, x, xv, dy, dx)
        rec.done, rec.x, held.done, held.x = True, None, True, None
        need = fctx.needs_input_grad
        return dx, st.wref if need[1] else None, st.bref if need[2] else None, None


class _LinearReplacedFn(_LinearFn):
    """The autograd path of a Linear whose parameters were replaced (FSDP2, Linear._forward_replaced):
    w and b are the given parameters; the backward returns their gradients of this backward alone, as
    new tensors of their dtypes (E4M3 gradients dequantized), and the C Linear overwrites its own."""

    @staticmethod
    def backward(fctx, dy):  # type: ignore[override]
        st = fctx.saved[0]
        st.accumulate = False  # this backward's gradient only: autograd accumulates into .grad
        dx, _, _, _ = _LinearFn.backward(fctx, dy)
        need = fctx.needs_input_grad
        dw = db = None
        if need[1]:
            dw = _grad_value(st.wref)
            dw = dw.clone() if dw is st.wref._buf else dw
            dw = dw.to(fctx.w_dtype)
        if need[2]:
            db = st.bgrad_view.to(fctx.b_dtype, copy=True)
        return dx, dw, db, None

    @staticmethod
    def forward(fctx, x, w, b, st):  # type: ignore[override]
        fctx.w_dtype, fctx.b_dtype = w.dtype, b.dtype if b is not None else None
        return _LinearFn.forward(fctx, x, w, b, st)


# ---- torch.library custom ops: what torch.compile sees -------------------------------------------
#
# Dynamo cannot trace into CFFI calls, so under torch.compile the module calls two custom ops
# instead of _LinearFn: fp8amp::linear_forward and fp8amp::linear_backward, opaque to the compiler,
# with fake (meta) implementations for shapes and an autograd formula. A layer reaches them by an
# int key (custom ops take tensors and scalars, not Python objects); _LAYERS maps it to the layer's
# state through a weak reference, so the registry keeps no module alive. The backward declares what
# it writes besides dx (mutates_args): the gradient buffers (the weight gradient -- E4M3 for the
# fp8amp optimizer -- and the bias gradient, in the Linear's own memory), so compile neither drops it
# nor reorders it against other readers or writers of them. The forward must stay functional (torch
# refuses an autograd formula on an op that mutates an input); what it leaves in the C Linear is
# named by the token it returns, which the backward checks (see "several forwards per backward").
# A compiled graph is one fixed program, so the eager path's weak references are out: under compile
# the input is kept for backward unless save_input=False (then a layer must run once per forward
# pass, and its saved activations are the C Linear's FP8 copy only).

try:
    from torch.optim.optimizer import register_optimizer_step_post_hook as _register_step_post_hook
except ImportError:  # pragma: no cover - torch < 2.0
    _register_step_post_hook = None

_LAYERS: Dict[int, "weakref.ref[_Hot]"] = {}
_KEYS = itertools.count(1)


def _layer(key: int) -> _Hot:
    r = _LAYERS.get(key)
    st = r() if r is not None else None
    if st is None:
        raise RuntimeError("fp8amp.torch.Linear #%d no longer exists" % key)
    return st


def _register(st: _Hot) -> None:
    st.key = next(_KEYS)
    _LAYERS[st.key] = weakref.ref(st, lambda r, k=st.key, w=id(st.weight): _forget(r, k, w))
    _BY_WEIGHT[id(st.weight)] = _LAYERS[st.key]
    global _STEP_HOOK
    if _STEP_HOOK is None and _register_step_post_hook is not None:
        _STEP_HOOK = _register_step_post_hook(_after_torch_step)


def _forget(r: Any, key: int, wid: int) -> None:
    _LAYERS.pop(key, None)
    if _BY_WEIGHT.get(wid) is r:  # (not a newer layer's whose weight got the same id)
        del _BY_WEIGHT[wid]


# A step of any other torch optimizer (fp8amp.torch.Optimizer releases by itself) gives back what the C
# Linears whose weights it stepped keep between calls (fp8amp_linear_release_buffers: their weight
# copies are stale after the update, the saved input was consumed by its backward, the FP32 gradient
# sum is needed only while micro-batches accumulate), so that at rest they hold their parameters and
# gradients only. One global post-step hook, registered with the first Linear; per step a dict look-up
# per parameter of the optimizer. The map is by id() (a tensor's == is elementwise, so no weak-key
# dict), checked against the layer's weight (an id can be reused once its tensor is gone).
_BY_WEIGHT: Dict[int, "weakref.ref[_Hot]"] = {}
_STEP_HOOK: Any = None


def _after_torch_step(opt: Any, args: Any, kwargs: Any) -> None:
    if getattr(opt, "_fp8amp_releases", False) or not _BY_WEIGHT:
        return
    ctxs: Dict[int, fp8amp.Context] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            r = _BY_WEIGHT.get(id(p))
            st = r() if r is not None else None
            if st is not None and st.weight is p:
                rc = lib.fp8amp_linear_release_buffers(st.lin_h)
                if rc and rc != lib.FP8AMP_ERROR_INVALID_HANDLE:  # (a Linear destroyed already holds nothing)
                    check(rc)
                ctxs[id(st.ctx)] = st.ctx
    release_scratch(ctxs.values())


def release_scratch(ctxs: Any) -> None:
    """A step boundary: each context gives its scratch pool and GEMM workspace back to torch's caching
    allocator (fp8amp_context_release_scratch: in stream order, no host wait unless the context's
    stream changed since they were allocated), so that at rest the contexts hold nothing (issue 18);
    the next step's first calls take the blocks from the cache again. Skipped while torch's current
    stream is being captured into a CUDA graph (the release could wait for the device then)."""
    for ctx in ctxs:
        if ctx.closed:
            continue
        if ctx.is_cuda and torch.cuda.is_current_stream_capturing():
            continue
        check(lib.fp8amp_context_release_scratch(ctx.handle))


_HAVE_OPS = hasattr(torch.library, "custom_op")
# Both ops are tagged cudagraph_unsafe: their work is host code as much as kernels (the C Linear's
# saved-forward records, the token, its own CUDA-graph replay of the call, scratch given back at the
# step), which a replay of a graph captured around them would skip. Under torch.compile(mode=
# "reduce-overhead") inductor then captures the rest of the model and calls these ops between its
# graphs (its graph partitions, on by default in torch 2.11; without them a graph holding one of
# these ops runs uncaptured). A torch without the tag or custom_op's tags gets untagged ops.
_OP_TAGS: Dict[str, Any] = {}
if _HAVE_OPS and hasattr(torch.Tag, "cudagraph_unsafe") and \
        "tags" in inspect.signature(torch.library.custom_op).parameters:
    _OP_TAGS = {"tags": (torch.Tag.cudagraph_unsafe,)}
if _HAVE_OPS:
    @torch.library.custom_op("fp8amp::linear_forward", mutates_args=(), **_OP_TAGS)
    def _op_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], wgrad: torch.Tensor,
                    bgrad: Optional[torch.Tensor], layer: int, out_dtype: torch.dtype,
                    training: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        # weight, bias: the parameters, inputs so that the backward's gradients reach their AccumulateGrad
        # nodes (hooks, DDP's reducer); the C Linear reads its own copy. wgrad, bgrad: unused here; inputs
        # so that the graph has them for the backward to write.
        st = _layer(layer)
        if not training:
            return _fwd(st, x, 0, out_dtype), torch.zeros((), dtype=torch.int64)
        y, rec = _train_fwd(st, x, out_dtype)
        return y, torch.full((), rec.fwd_id, dtype=torch.int64)

    # The fake implementations take shapes and dtypes from the op's tensor arguments, never from the
    # layer its key names: Dynamo may make that int dynamic once it has seen two layers (automatic
    # dynamic), and then traces with the first layer's key as the hint, whose dtypes and sizes need
    # not be this layer's (seen: a float32-weight layer's gradient dtype given to a bfloat16 one).
    @_op_forward.register_fake
    def _(x, weight, bias, wgrad, bgrad, layer, out_dtype, training):
        return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],), dtype=out_dtype), torch.empty((), dtype=torch.int64)

    @torch.library.custom_op("fp8amp::linear_backward", mutates_args=("wgrad", "bgrad"), **_OP_TAGS)
    def _op_backward(dy: torch.Tensor, token: torch.Tensor, x: Optional[torch.Tensor], wgrad: torch.Tensor,
                     bgrad: Optional[torch.Tensor], layer: int, x_shape: Sequence[int], x_dtype: torch.dtype,
                     need_dx: bool, w_dtype: Optional[torch.dtype] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # (w_dtype, for the fake implementation, has a default: a graph compiled and cached by an
        # earlier fp8amp, whose call has no w_dtype, still runs)
        st = _layer(layer)
        dx = dy.new_empty(tuple(x_shape), dtype=x_dtype) if need_dx else dy.new_empty((0,))
        _train_bwd(st, int(token), x, x._version if x is not None else 0, dy, dx if need_dx else None)
        # The C Linear wrote its own gradient memory. A compiled graph may hand the op a clone of it
        # (functionalization without re-inplacing, e.g. the aot_eager backend) and copy the clone
        # back afterwards: give the clone the result, or that copy would undo the backward.
        if wgrad.data_ptr() != st.wgrad_t.data_ptr():
            wgrad.copy_(st.wgrad_t)
        if bgrad is not None and bgrad.data_ptr() != st.bgrad_t.data_ptr():
            bgrad.copy_(st.bgrad_t)
        # The parameters' gradients: their LinearGrad handles, as the eager backward returns (no copy;
        # autograd's accumulation of them is a no-op, _bwd has set .grad). An op without a bias returns
        # an empty tensor in its place (the autograd formula drops it).
        return dx, st.wref, st.bref if st.bref is not None else dy.new_empty((0,))

    @_op_backward.register_fake
    def _(dy, token, x, wgrad, bgrad, layer, x_shape, x_dtype, need_dx, w_dtype=None):
        # the weight's gradient has the weight's shape (wgrad's: its buffer, E4M3 codes or floats) and
        # dtype (w_dtype); the bias's is its buffer's (float32)
        dx = dy.new_empty(tuple(x_shape), dtype=x_dtype) if need_dx else dy.new_empty((0,))
        if w_dtype is None:  # a call traced by an earlier fp8amp: the layer's own (see above)
            w_dtype = _layer(int(layer)).wref.dtype
        dw = dy.new_empty(tuple(wgrad.shape), dtype=w_dtype)
        db = dy.new_empty(tuple(bgrad.shape), dtype=bgrad.dtype) if bgrad is not None else dy.new_empty((0,))
        return dx, dw, db

    def _setup_forward(ctx, inputs, output):  # type: ignore[no-untyped-def]
        x, weight, bias, wgrad, bgrad, layer, out_dtype, training = inputs
        st = _layer(layer)
        ctx.layer, ctx.x_shape, ctx.x_dtype, ctx.w_dtype = layer, tuple(x.shape), x.dtype, weight.dtype
        ctx.save_for_backward(output[1], x if st.save_input is not False else None)
        # Not through save_for_backward: each backward writes them (a version bump), and a layer
        # used twice would fail autograd's check that saved tensors were not modified.
        ctx.grad_bufs = (wgrad, bgrad)

    def _backward_forward(ctx, dy, dtoken):  # type: ignore[no-untyped-def]
        token, x = ctx.saved_tensors
        wgrad, bgrad = ctx.grad_bufs
        need = ctx.needs_input_grad
        need_dx = bool(need[0])
        dx, dw, db = torch.ops.fp8amp.linear_backward(dy.contiguous(), token, x, wgrad, bgrad, ctx.layer,
                                                      list(ctx.x_shape), ctx.x_dtype, need_dx, ctx.w_dtype)
        return (dx if need_dx else None), (dw if need[1] else None), (db if need[2] else None), None, None, None, \
            None, None

    _op_forward.register_autograd(_backward_forward, setup_context=_setup_forward)


class Linear(nn.Module):
    """``fp8amp.torch.Linear(in_features, out_features, bias=True, device=None, weight_dtype=torch.float32,
    wgrad_dtype=None, policy="auto", recipe=None, graph_replay=True, save_input=None)``: nn.Linear's
    interface on fp8amp's FP8 Linear.

    ``weight`` [out, in] and ``bias`` [out] (F32) are nn.Parameters sharing the fp8amp Linear's own
    memory (DLPack views): an optimizer, ``load_state_dict`` or ``copy_`` writes them in place, and the
    module tells the Linear (``weight_changed``) when torch has written them (their version counter
    moved). ``weight_dtype`` float32 or bfloat16 (O1/O2), or float8_e4m3fn (O3): the weight is then
    E4M3 codes, its value ``code * weight_scale_inv`` (a float32 scalar buffer sharing the C tensor's
    scale slot; both are in the state_dict). ``wgrad_dtype`` None means the weight's dtype (E4M3 for
    E4M3 weights): with a float32/bfloat16 weight and gradient ``weight.grad`` is a view of fp8amp's
    weight gradient; with an E4M3 gradient (O1/O2/O3 through ``initialize``) the FP8 gradient stays
    inside fp8amp for its optimizer and ``weight.grad`` is a ``LinearGrad`` handle on it (torch ops read
    it dequantized, writes quantize into it; ``weight_grad_fp8()`` / ``dequantized_weight_grad()`` give
    it too). ``bias.grad`` is always a view of fp8amp's F32 bias gradient. The gradients go through
    autograd (the backward returns ``LinearGrad`` handles, whose accumulation is a no-op), so
    post-accumulate-grad hooks and DistributedDataParallel see them (docs/torch.md sections 5, 6).

    Gradients accumulate across backward calls (micro-batches) until the grads are reset:
    ``zero_grad()`` of this front's Optimizer or of any torch optimizer / module with
    ``set_to_none=True`` (the default). A layer may run several training forwards before their
    backwards (used twice per forward pass, activation checkpointing): the C Linear keeps the last
    one's input (FP8), and the backward of an earlier one recomputes it from its input. ``save_input``
    says which inputs the module keeps for that: None (default) only once it has seen the layer
    reused (eager; under torch.compile: always), True always (as nn.Linear), False never
    (docs/torch.md section 2). Under torch.compile the module runs as the custom ops
    fp8amp::linear_forward / linear_backward, without graph breaks. Create it on its final device (``.to()`` would copy
    the parameters away from fp8amp's memory). Like its fp8amp context, a module is used by one thread
    at a time. ``graph_replay`` (CUDA, default on) lets the C Linear replay a call whose launches repeat
    an earlier call's as one CUDA graph launch (docs/linear.md section 6.1). ``lean`` (0, 1 or 2; default 1):
    the C Linear's lean buffers (fp8amp_linear_set_lean, docs/linear.md section 2): at 1 it keeps no FP8
    copy of the weight from a training forward (the backward re-makes the transpose it reads: the same
    bits; so the weight must not be written between a training forward and its backward) and gives back
    the saved input after the backward, which lowers the training peak; 2 also keeps no FP32
    weight-gradient sum past a non-accumulating backward (a second micro-batch then adds to the delivered
    gradient: one rounding more); 0 keeps everything until the step, as before.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 weight_dtype: torch.dtype = torch.float32, wgrad_dtype: Optional[torch.dtype] = None,
                 policy: Any = "auto", recipe: Optional[fp8amp.Recipe] = None, graph_replay: bool = True,
                 save_input: Optional[bool] = None, lean: int = 1) -> None:
        super().__init__()
        if save_input not in (None, True, False):
            raise TypeError("save_input must be None (auto), True or False, not %r" % (save_input,))
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
        # Lean buffers (fp8amp_linear_set_lean, level 1 by default): the C Linear keeps no FP8 copy of
        # the weight from a training forward (its backward re-makes the transpose it reads, the same
        # bits) and gives back the saved input after the backward, through torch's stream-ordered
        # caching allocator (no host wait): about 2 bytes per Linear parameter less at the training
        # peak (issue 18). Level 2 also keeps no FP32 weight-gradient sum past a non-accumulating
        # backward (a second micro-batch then adds to the delivered gradient: one rounding more).
        if lean not in (0, 1, 2) or isinstance(lean, bool):
            raise TypeError("lean must be 0, 1 or 2, not %r" % (lean,))
        self._lin.lean = lean
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
        st.bwd_id, st.last, st.save_input, st.reused, st.name = -1, None, save_input, False, ""
        st.wgrad_t = _from_fp8amp(self._lin.weight_grad)  # E4M3 codes too: what the backward op writes
        st.bgrad_t = st.bgrad_view
        # Gradients through autograd (LinearGrad): handles on the same memory. The weight gradient has
        # an FP32 sum of its own in the C Linear unless it is F32 (E4M3, BF16: `sep`).
        wg8 = self._lin.weight_grad if wgrad_dtype == torch.float8_e4m3fn else None
        sep = wgrad_dtype != torch.float32
        st.wref = LinearGrad(st.wgrad_t, wg8, self._ctx, dev, weight_dtype, st, sep)
        if wg8 is not None:  # what unscale_ and clip_grad_norm_'s multiply write (see _scale_fp8_grad)
            out = ffi.new("fp8amp_tensor *")
            check(lib.fp8amp_tensor_scale_inv(wg8.handle, out))
            st.keep.append(fp8amp.Tensor._new(out[0], self._ctx))
            st.wref._sinv, st.wref._meta = _from_fp8amp(st.keep[-1]), self._lin.scaling(Role.WEIGHT_GRAD)
        st.bref = LinearGrad(st.bgrad_view, None, self._ctx, dev, torch.float32, st, False) if bias else None
        st.wgrad_obj = st.wgrad_view if st.wgrad_visible else st.wref
        st.wref._view = st.wgrad_view
        if bias:
            st.bref._view = st.bgrad_view
        st.stale = False
        st.wver = st.wgrad_view._version if st.wgrad_visible and sep else -1
        _register(st)
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

    def _release_buffers(self) -> None:
        """A step boundary (the Optimizer's step): the C Linear gives back what it keeps between calls
        beyond the parameters and gradients (its weight copies, the saved input of a backed forward, the
        FP32 weight-gradient sum; fp8amp_linear_release_buffers), so that at rest it holds no more.
        Through torch's caching allocator: no synchronization, and the next step's blocks come from its
        cache. A backward that accumulates without a zero_grad after the step adds to the delivered
        gradient (one more rounding than within a step's micro-batches)."""
        rc = lib.fp8amp_linear_release_buffers(self._st.lin_h)
        if rc:
            check(rc)

    def _reset_grads(self) -> None:
        """The next backward overwrites the gradients (called by the Optimizer's zero_grad)."""
        self._st.accumulate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        st = self._st
        if x.is_cuda is not st.cuda:
            raise RuntimeError("fp8amp.torch.Linear on %s got an input on %s" % (self._device, x.device))
        params = self._parameters
        if params["weight"] is not st.weight or params["bias"] is not st.bias:
            return self._forward_replaced(x, params["weight"], params["bias"])
        if _compiling():
            return self._forward_op(x)
        if _grad_enabled():
            w, b = st.weight, st.bias
            if x.requires_grad or w.requires_grad or (b is not None and b.requires_grad):
                return _LinearFn.apply(x, w, b, st)
        return _fwd(st, x, 0)

    def _forward_replaced(self, x: torch.Tensor, w: Any, b: Any) -> torch.Tensor:
        """The forward when the module's parameters are no longer the C Linear's own memory: FSDP2's
        fully_shard replaces them by DTensor shards and, before each forward, by the all-gathered
        unsharded parameters (plain tensors); load_state_dict(assign=True) or an assignment replaces
        them too. The C Linear computes with its own copy of the weight, so the given values are
        copied into it (one copy of W per forward, against the GEMMs' M*N*K), and the backward returns
        each parameter's gradient of this backward as a new float tensor of its dtype (the C Linear
        overwrites its gradients at every backward here; autograd accumulates micro-batches into
        .grad, as for nn.Linear) (docs/torch.md section 12)."""
        st = self._st
        name = st.name or "#%d" % st.key
        if self._e4m3:
            raise NotImplementedError(
                "fp8amp.torch.Linear %s: its E4M3 (O3) weight was replaced (FSDP2's fully_shard or an assignment): "
                "O3 keeps the weight as E4M3 codes with a scale and an F16 master copy inside fp8amp's optimizer, "
                "bound to the C Linear's weight, which a sharded or replaced parameter bypasses. Use O1/O2 with "
                "FSDP2, or all_reduce_grads / DDP at O3" % name)
        for nm, t, own in (("weight", w, st.weight), ("bias", b, st.bias)):
            if (t is None) != (own is None) or (t is not None and (
                    type(t) not in (torch.Tensor, nn.Parameter) or t.shape != own.shape or t.device != own.device)):
                raise RuntimeError(
                    "fp8amp.torch.Linear %s: its %s was replaced by %s; the forward takes a plain tensor of shape %s on "
                    "%s (under FSDP2 the sharded DTensor is all-gathered by fully_shard's pre-forward hook: call the "
                    "module through its fully_shard-ed root)" % (name, nm, "None" if t is None else "a %s of shape %s"
                                                                 % (type(t).__name__, tuple(t.shape)),
                                                                 tuple(own.shape) if own is not None else None,
                                                                 self._device))
        if _compiling():
            raise NotImplementedError("fp8amp.torch.Linear %s: torch.compile with replaced parameters (FSDP2) is not "
                                      "supported yet; compile the model without fully_shard, or run FSDP2 eagerly"
                                      % name)
        with torch.no_grad():
            st.weight.copy_(w)  # bumps its version: _fwd tells the C Linear (weight_changed)
            if b is not None:
                st.bias.copy_(b)
        if _grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
            return _LinearReplacedFn.apply(x, w, b, st)
        return _fwd(st, x, 0)

    def _forward_op(self, x: torch.Tensor) -> torch.Tensor:
        """The forward through the fp8amp::linear_forward custom op (what torch.compile traces)."""
        if not _HAVE_OPS:  # pragma: no cover - torch < 2.4
            raise NotImplementedError("torch.compile of fp8amp.torch.Linear needs torch.library.custom_op (torch 2.4+)")
        st = self._st
        w, b = st.weight, st.bias
        training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or
                                                (b is not None and b.requires_grad))
        ydt = torch.get_autocast_dtype(st.dev_type) if torch.is_autocast_enabled(st.dev_type) else x.dtype
        return torch.ops.fp8amp.linear_forward(x, w, b, st.wgrad_t, st.bgrad_t, st.key, ydt, training)[0]

    def scaling_metas(self) -> List[fp8amp.Scaling]:
        """The INPUT and GRAD_OUTPUT metas (those a delayed recipe updates once per step)."""
        return [self._lin.scaling(Role.INPUT), self._lin.scaling(Role.GRAD_OUTPUT)]

    def extra_repr(self) -> str:
        return "in_features=%d, out_features=%d, bias=%s, weight_dtype=%s, policy=%s" % (
            self.in_features, self.out_features, self.bias is not None, str(self.weight_dtype).replace("torch.", ""),
            self.policy.name)


# ---- initialize's swap -----------------------------------------------------------------------------


def _fp8_shape_issue(lin: nn.Linear) -> str:
    """Why cuBLASLt's FP8 GEMMs cannot run this layer ("" when they can): every leading dimension must
    be a multiple of 16 bytes (docs/linear.md section 4)."""
    bad = ["%s=%d" % (k, getattr(lin, k)) for k in ("in_features", "out_features") if getattr(lin, k) % 16]
    return " and ".join(bad) + " not a multiple of 16" if bad else ""


def _replace_linears(model: nn.Module, *, weight_dtype: torch.dtype, wgrad_dtype: torch.dtype, policy: Any,
                     recipe: Optional[fp8amp.Recipe], exclude: Any, save_input: Optional[bool],
                     module_filter_fn: Any = None) -> Dict[int, Tuple[Linear, str]]:
    """Replaces every nn.Linear (exact type) of `model` by an fp8amp.torch.Linear with its parameters,
    in place; returns {id(old parameter): (new module, "weight" or "bias")}. Logs (logger "fp8amp",
    INFO) each replacement and each nn.Linear kept, with the reason; a summary line at the end.
    Kept, in this order of reasons: a weight shared with another module; `exclude`; `module_filter_fn`
    (torchao's convert_to_float8_training filter: ``(module, fqn) -> bool``, True = replace, fqn the
    dotted name from `model`) returning False; with policy "fp8", a shape cuBLASLt's FP8 GEMMs cannot
    run (in/out features not multiples of 16: the forward would raise NOT_SUPPORTED on CUDA; kept on
    every device, so that a model has the same modules on the CPU and on the GPU).
    Iterative (an explicit stack of child iterators, visiting in the recursive order: depth first,
    children in order): a recursive local function would be a reference cycle (its closure cell
    holds it), keeping every new module alive until the cycle collector runs."""
    if type(model) is nn.Linear:
        raise TypeError("pass a model containing nn.Linear layers, or use fp8amp.torch.Linear.from_linear")
    # A Linear whose weight another module also holds (tied embeddings) stays an nn.Linear: its
    # replacement would untie them.
    holders: Dict[int, int] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1
    names = None if callable(exclude) else frozenset(exclude)
    pol = _as_policy(policy)
    replaced: Dict[int, Tuple[Linear, str]] = {}
    kept = 0
    stack: List[Tuple[Any, nn.Module, str]] = [(iter(list(model.named_children())), model, "")]
    while stack:
        children, mod, prefix = stack[-1]
        nxt = next(children, None)
        if nxt is None:
            stack.pop()
            continue
        name, child = nxt
        qual = prefix + name
        if type(child) is not nn.Linear:
            if isinstance(child, nn.Linear) and not isinstance(child, Linear):
                kept += 1
                _log.info("fp8amp.initialize: kept %s (%s): a subclass of nn.Linear, whose forward may differ",
                          qual, type(child).__name__)
            stack.append((iter(list(child.named_children())), child, qual + "."))
            continue
        if holders.get(id(child.weight), 0) != 1:
            why = "its weight is shared with another module (tied weights); replacing it would untie them"
        elif exclude and (exclude(qual, child) if names is None else qual in names):
            why = "excluded by the exclude argument"
        elif module_filter_fn is not None and not module_filter_fn(child, qual):
            why = "module_filter_fn returned False"
        elif pol == fp8amp.GemmPolicy.ALWAYS_FP8 and _fp8_shape_issue(child):
            why = ("shape not FP8-able: %s (cuBLASLt's FP8 GEMMs need 16-byte leading dimensions, so policy 'fp8' "
                   "would refuse it on CUDA; policy 'auto' replaces it and runs BF16 GEMMs there)"
                   % _fp8_shape_issue(child))
        else:
            why = ""
        if why:
            kept += 1
            _log.info("fp8amp.initialize: kept %s %s: %s", qual, tuple(child.weight.shape), why)
            continue
        new = Linear.from_linear(child, weight_dtype=weight_dtype, wgrad_dtype=wgrad_dtype, policy=policy,
                                 recipe=recipe, save_input=save_input)
        new.train(child.training)
        new._st.name = qual
        replaced[id(child.weight)] = (new, "weight")
        if child.bias is not None:
            replaced[id(child.bias)] = (new, "bias")
        setattr(mod, name, new)
        note = _fp8_shape_issue(child)
        _log.info("fp8amp.initialize: replaced %s (in=%d, out=%d, bias=%s) by fp8amp.torch.Linear (weight %s, "
                  "weight gradient %s, policy %s)%s", qual, child.in_features, child.out_features,
                  child.bias is not None, str(weight_dtype).replace("torch.", ""),
                  str(wgrad_dtype).replace("torch.", ""), new.policy.name,
                  "; its GEMMs run in BF16 on CUDA: %s" % note if note and pol == fp8amp.GemmPolicy.AUTO else "")
    _log.info("fp8amp.initialize: %d nn.Linear replaced, %d kept", len({id(m) for m, _ in replaced.values()}), kept)
    return replaced
