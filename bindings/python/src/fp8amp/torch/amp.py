"""The PyTorch front's entry point: ``initialize`` (MS-AMP's ``msamp.initialize`` shape) and the loss
scaler ``GradScaler``."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import ffi, lib
from fp8amp.errors import check
from fp8amp.optim import as_opt_level
from fp8amp.torch.context import _norm_device, context
from fp8amp.torch.linear import Linear, _replace_linears
from fp8amp.torch.optim import Optimizer
from fp8amp.torch.distributed import communicator


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
    # fp8amp.torch.Linears already in the model (an earlier initialize, e.g. before FSDP2's fully_shard)
    # whose parameters are still their own: fp8amp's optimizer steps them through the C Linear too.
    for m in model.modules():
        if isinstance(m, Linear) and m._parameters["weight"] is m._st.weight:
            replaced.setdefault(id(m.weight), (m, "weight"))
            if m.bias is not None and m._parameters["bias"] is m._st.bias:
                replaced.setdefault(id(m.bias), (m, "bias"))
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
