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

__all__ = ["Linear", "LinearGrad", "initialize", "Optimizer", "GradScaler", "all_reduce_grads", "communicator",
           "fp8_comm_hook", "context",
           "to_fp8amp"]

# The Linear side (dtype maps, contexts, tensor helpers, the Linear module) lives in linear.py; its
# names are re-exported here, so fp8amp.torch.X keeps working for each of them.
from fp8amp.torch.linear import (_CONTEXTS, _DT, _TORCH_DT, Linear, LinearGrad, _autocast_dtype, _from_fp8amp,  # noqa: F401
                                 _norm_device, _on_current_stream, _raw_stream, _replace_linears, _torch_alloc,
                                 _torch_free, _wrap, context, to_fp8amp)


# ---- the optimizer ------------------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs fp8amp's Adam/AdamW (O1/O2/O3) on the device: made by
    ``initialize``. One fp8amp optimizer per param group (lr, betas, eps, weight_decay of the group;
    ``group["lr"]`` is read at every step, so LR schedulers work); at O3 it holds the E4M3 Linear
    weights with an F16 master copy beside every other parameter without one (fp8amp keeps master
    copies for low-precision parameters only: add_param_ex's per-parameter master).
    ``max_grad_norm`` clips by the global norm of all gradients: inside fp8amp's step with one param
    group; with several, the norm of every group's unscaled gradients is computed here (float64, as
    torch.nn.utils.clip_grad_norm_) and the clip coefficient multiplies each step's gradient factor; a
    step with a non-finite gradient in any group then changes no group. Linear layers' weights and
    biases are updated with their fp8amp gradients (E4M3 weight gradients); every other parameter
    with its torch ``.grad`` (kept in a buffer registered with fp8amp, zeroed in place by
    ``zero_grad``).

    Works with ``torch.amp.GradScaler`` (it declares ``_step_supports_amp_scaling``: the step gets
    the scale and the found-inf flag, unscales inside fp8amp's step and skips on overflow; do not
    call ``scaler.unscale_`` first) and with this module's ``GradScaler`` (``step(scaler=...)``).
    ``state_dict()``/``load_state_dict()`` carry fp8amp's checkpoints (parameters, m, v, master
    copies, scales, step count) as bytes plus the groups' hyperparameters (one per param group; an O3
    state dict of fp8amp 0.4.0's first release, two per group, does not load).
    """

    _step_supports_amp_scaling = True

    def __init__(self, param_groups: List[Dict[str, Any]], opt_level: Any, adamw: bool, linears: Dict[int, Tuple[Linear, str]],
                 max_grad_norm: float = 0.0, master_rounding: Any = "nearest", rounding_seed: int = 0,
                 comm: Optional[fp8amp.Communicator] = None) -> None:
        super().__init__(param_groups, {})
        self.opt_level = as_opt_level(opt_level)
        o3 = self.opt_level == fp8amp.OptLevel.O3
        self._linears = sorted({id(m): m for m, _ in linears.values()}.values(), key=id)
        self._opts: List[fp8amp.Optimizer] = []
        self._opt_groups: List[int] = []  # the param group of each fp8amp optimizer
        self._plain: List[Tuple[nn.Parameter, torch.Tensor]] = []  # non-Linear params and their grad buffers
        self._ctx: Optional[fp8amp.Context] = None
        self._device: Optional[torch.device] = None
        plan = []  # (group index, config, [(item, master?), ...]) of each fp8amp optimizer to make
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
            # One fp8amp optimizer per group: at O3 the E4M3 weights with the config's F16 master,
            # every other parameter with none (explicitly: an F32 one cannot take an F16 master).
            plan.append((gi, cfg, [(it, True) for it in low] + [(it, not o3) for it in other]))
        # Several fp8amp optimizers would each clip by their own norm: the global norm is taken here
        # instead (step), and fp8amp's own clipping is off.
        self._clip = float(max_grad_norm) if max_grad_norm and len(plan) > 1 else 0.0
        if comm is not None and self._clip:
            raise NotImplementedError("max_grad_norm with several param groups and a process_group: the global norm "
                                      "is of the reduced gradients, which only the sharded steps see")
        self._opt_grads: List[List[fp8amp.Tensor]] = []  # each fp8amp optimizer's gradients (the global norm)
        assert self._ctx is not None and self._device is not None
        for gi, cfg, items in plan:
            if self._clip:
                cfg = dataclasses.replace(cfg, max_grad_norm=0.0)
            _on_current_stream(self._ctx, self._device)
            opt = fp8amp.Optimizer(self._ctx, cfg)
            if comm is not None:  # ZeRO-style: this rank keeps the state of its shards (docs/o3.md)
                opt.set_shard(comm)
            grads = []
            for it, default_master in items:
                if isinstance(it, tuple):
                    pair = it
                else:
                    buf = torch.zeros_like(it, memory_format=torch.contiguous_format)
                    if it.grad is not None:
                        buf.copy_(it.grad)
                    it.grad = buf
                    self._plain.append((it, buf))
                    pair = (to_fp8amp(it, self._ctx), to_fp8amp(buf, self._ctx))
                if default_master:
                    opt.add_param(*pair)
                else:
                    opt.add_param(*pair, master=None)
                grads.append(pair[1])
            self._opts.append(opt)
            self._opt_groups.append(gi)
            self._opt_grads.append(grads)
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
        multi = c_scaler is not None and len(self._opts) > 1
        if multi:
            inv /= c_scaler.scale  # several fp8amp optimizers: one host read of the scale, then one update
        steps = list(zip(self._opts, self._opt_groups))
        if self._clip:
            # torch.nn.utils.clip_grad_norm_ over every group's unscaled gradients (float64 sums).
            sums = [self._grad_sumsq(grads) for grads in self._opt_grads]
            total = math.fsum(sums)
            if math.isfinite(total):
                norm = math.sqrt(total) * inv
                inv *= min(1.0, self._clip / (norm + 1e-6))
            else:  # only the optimizers that see the non-finite gradient step (and skip): none changes
                steps = [st for st, t in zip(steps, sums) if not math.isfinite(t)]
        if multi:
            for o, gi in steps:
                o.step(lr=float(groups[gi]["lr"]), grad_scale_inv=inv)
            bad = [o for o, _ in steps if o.found_inf]
            c_scaler.update(bad[0] if bad else self._opts[0])
        else:
            for o, gi in steps:
                o.step(lr=float(groups[gi]["lr"]), grad_scale_inv=inv, scaler=c_scaler)
        if self._metas:
            fp8amp.update_many(self._ctx, self._metas)
        return loss

    def _grad_sumsq(self, grads: List[fp8amp.Tensor]) -> float:
        """The sum of squares of the stored gradients' values (FP8: code * scale_inv), in float64."""
        assert self._ctx is not None
        total = 0.0
        for g in grads:
            if g.dtype in (fp8amp.E4M3, fp8amp.E5M2):
                t = torch.empty(tuple(g.shape), dtype=torch.float32, device=self._device)
                _on_current_stream(self._ctx, self._device)
                fp8amp.dequantize(self._ctx, g, to_fp8amp(t, self._ctx))
            else:
                t = _from_fp8amp(g)
            total += float(t.double().square().sum())
        return total

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
               rounding_seed: int = 0, save_input: Optional[bool] = None, process_group: Any = None) -> Any:
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
    how the O3 optimizer rounds the F16 master copies (fp8amp_adam_desc.master_rounding).
    `save_input`: each new Linear's (None: keep inputs for backward only once a layer is seen used
    twice per forward; True: always, as nn.Linear; False: never). The logger "fp8amp" tells at INFO
    level which Linears were replaced and which kept, and why.
    `process_group` (a torch.distributed group, CUDA only): the optimizer is sharded over its ranks
    (fp8amp_optimizer_set_shard, docs/o3.md): each rank keeps the masters and Adam state of its shard
    of every parameter, and each step reduce-scatters the local gradients (do not all-reduce them
    first), updates the shard and all-gathers the parameters; every rank must start from the same
    weights. On the CPU it raises ValueError: the CPU communicator runs over MPI, not over a
    torch.distributed (gloo) group."""
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
    replaced = _replace_linears(model, weight_dtype=weight_dtype, wgrad_dtype=wgrad_dtype, policy=policy,
                                recipe=recipe, exclude=exclude, save_input=save_input)
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
    comm = None
    if process_group is not None:
        devices = {_norm_device(p.device) for g in groups for p in g["params"]}
        if any(d.type != "cuda" for d in devices):
            raise ValueError("process_group: a sharded optimizer needs CUDA parameters; the CPU communicator runs over "
                             "MPI, not over a torch.distributed group (use the C API's fp8amp_optimizer_set_shard "
                             "with an MPI communicator)")
        if len(devices) != 1:
            raise NotImplementedError("parameters on several devices")
        comm = communicator(next(iter(devices)), process_group)
    opt = Optimizer(groups, level, isinstance(optimizer, torch.optim.AdamW), linears, max_grad_norm=max_grad_norm,
                    master_rounding=master_rounding, rounding_seed=rounding_seed, comm=comm)
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


# Unannotated on purpose: DDP checks a hook's annotations against dist.GradBucket and
# torch.futures.Future[torch.Tensor], and this module's annotations are strings (from __future__).
def fp8_comm_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A communication hook for ``torch.nn.parallel.DistributedDataParallel`` that averages each
    gradient bucket through fp8amp's communicator: FP8 (E4M3) on the wire, float32 accumulation in a
    fixed rank order, one agreed scale per parameter, identical bytes on every rank
    (docs/communicator.md, docs/torch.md section 6)::

        ddp = DistributedDataParallel(model, device_ids=[rank])
        ddp.register_comm_hook(None, fp8amp.torch.fp8_comm_hook)   # state: the group, None = default

    `state` is the torch.distributed process group to reduce over (None: the default group). The
    bucket (float32, or bfloat16/float16 for such parameters) is reduced in place; each parameter's
    slice of it gets its own scale. CUDA only (the communicator's GPU backend is NCCL, made on first
    use over the group: every rank's first bucket makes it). On CPU buckets it raises
    NotSupportedError: fp8amp's CPU communicator runs over MPI (processes started by mpirun), not over
    torch.distributed's gloo processes; use DDP's default all-reduce there."""
    import torch.distributed as dist

    buf = bucket.buffer()
    if buf.device.type != "cuda":
        raise fp8amp.NotSupportedError(int(lib.FP8AMP_ERROR_NOT_SUPPORTED),
            "fp8amp.torch.fp8_comm_hook: the gradient bucket is on %s; fp8amp's communicator runs on CUDA "
            "devices (NCCL) or, on the CPU, over MPI in processes started by mpirun, not over torch.distributed's "
            "gloo processes: use DDP's default all-reduce for CPU models" % buf.device)
    if state is not None and not isinstance(state, dist.ProcessGroup):
        raise TypeError("fp8amp.torch.fp8_comm_hook: state must be a torch.distributed ProcessGroup or None (the "
                        "default group), not %s" % type(state).__name__)
    dev = _norm_device(buf.device)
    comm = communicator(dev, state)
    _on_current_stream(comm.context, dev)
    # The bucket holds its parameters' gradients end to end (dense DDP buckets): one slice (and so one
    # scale) per parameter; should the layout ever differ, the whole bucket with one scale.
    views, off = [], 0
    for p in bucket.parameters():
        views.append(buf[off:off + p.numel()])
        off += p.numel()
    if off != buf.numel():
        views = [buf]
    ts = [to_fp8amp(v, comm.context) for v in views]
    comm.all_reduce(ts, ts)
    fut = torch.futures.Future(devices=[dev])
    fut.set_result(buf)
    return fut


from .fused import GELU, LayerNorm, LayerNormLinear, LayerNormMLP  # noqa: E402,F401  (issue 19: fused blocks, fused.py)
