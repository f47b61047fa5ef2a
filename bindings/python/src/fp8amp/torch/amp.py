"""The PyTorch front's entry point: ``initialize`` (MS-AMP's ``msamp.initialize`` shape) with its
settings as one value, ``Config``, and the loss scaler ``GradScaler``."""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp._ffi import ffi, lib
from fp8amp.errors import check
from fp8amp.linear import _as_policy
from fp8amp.optim import as_opt_level
from fp8amp.optim import AdamConfig
from fp8amp.torch.context import _norm_device, _on_current_stream, context, to_fp8amp
from fp8amp.torch.linear import Linear, _is_fp8_grad, _replace_linears, _scale_fp8_grad
from fp8amp.torch.optim import Optimizer
from fp8amp.torch.distributed import communicator

_log = logging.getLogger("fp8amp")


@dataclasses.dataclass(frozen=True)
class Config:
    """What ``initialize`` does, as one value (torchao's Float8LinearConfig role): build it once, log
    it, pass it around, ``dataclasses.replace`` it. Every field is one of ``initialize``'s keywords
    with the same meaning and default; ``initialize(model, opt, config=cfg)`` equals
    ``initialize(model, opt, **dataclasses.asdict(cfg))``. Checked when made: ``opt_level`` becomes a
    ``fp8amp.OptLevel`` and ``policy`` a ``fp8amp.GemmPolicy``, a bad value raises here (ValueError /
    TypeError naming the field) rather than at initialize.

    - ``opt_level``: "O1" (F32 Adam state), "O2" (E4M3 m, F16 v), "O3" (O2 plus E4M3 Linear weights
      with an F16 master copy).
    - ``policy``: the Linears' GEMM policy, "auto", "fp8" or "bf16" (docs/linear.md section 4).
    - ``recipe``: the Linears' fp8amp.Recipe (None: current scaling).
    - ``weight_dtype`` / ``wgrad_dtype``: the Linear weights' and weight gradients' torch dtypes (None:
      bfloat16 / float8_e4m3fn at O1/O2 with an optimizer -- MS-AMP's 16-bit weights, no float32 copy
      --, float8_e4m3fn at O3; float32 / the weight dtype without an optimizer).
    - ``max_grad_norm``: fp8amp's global gradient clipping inside the step (0: off).
    - ``master_rounding`` / ``rounding_seed``: how the optimizer rounds the value of record -- O3's F16
      master copies, the O1/O2 16-bit weights -- "nearest" or "stochastic" (None: stochastic for 16-bit
      weights without a master, whose updates below half a BF16 ulp would be lost; nearest for O3's
      masters and float32 weights).
    - ``state_block_size``: elements per scale of the O2/O3 optimizer state (m, v, O3's master): None
      for the level's (O2: 128; O3: 0, or 128 when sharded over a process_group), a power of two up to
      fp8amp's maximum, or 0 for one scale per tensor (MS-AMP's layout: no per-block scale bytes;
      coarser scales for the state) -- docs/torch.md section 13.
    - ``save_input``: each new Linear's (None: auto; True; False): docs/torch.md section 2.
    - ``exclude``: qualified names of nn.Linear modules to keep, or a callable ``(name, module) -> bool``
      (True = keep).
    - ``module_filter_fn``: torchao's convert_to_float8_training filter, ``(module, fqn) -> bool``: called
      for each nn.Linear that could be replaced, True = replace it, False = keep it (``fqn``: its dotted
      name from the model, as ``model.named_modules()`` gives it).
    """

    opt_level: Any = "O1"
    policy: Any = "auto"
    recipe: Optional[fp8amp.Recipe] = None
    weight_dtype: Optional[torch.dtype] = None
    wgrad_dtype: Optional[torch.dtype] = None
    max_grad_norm: float = 0.0
    master_rounding: Any = None
    rounding_seed: int = 0
    state_block_size: Optional[int] = None
    save_input: Optional[bool] = None
    exclude: Any = ()
    module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None

    def __post_init__(self) -> None:
        where = "fp8amp.torch.Config"
        for f, conv in (("opt_level", as_opt_level), ("policy", _as_policy)):
            try:
                object.__setattr__(self, f, conv(getattr(self, f)))
            except TypeError as e:
                raise TypeError("%s: %s: %s" % (where, f, e)) from None
            except ValueError as e:
                raise ValueError("%s: %s: %s" % (where, f, e)) from None
        if self.recipe is not None and not isinstance(self.recipe, fp8amp.Recipe):
            raise TypeError("%s: recipe must be an fp8amp.Recipe or None, not %s" % (where, type(self.recipe).__name__))
        for f in ("weight_dtype", "wgrad_dtype"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, torch.dtype):
                raise TypeError("%s: %s must be a torch.dtype or None, not %r" % (where, f, v))
        g = self.max_grad_norm
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise ValueError("%s: max_grad_norm must be a finite number >= 0 (0: off), not %r" % (where, g))
        b = self.state_block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int)):
            raise TypeError("%s: state_block_size must be None or an int, not %r" % (where, b))
        if b is not None and b < 0:
            raise ValueError("%s: state_block_size must be 0 (one scale per tensor) or a power of two, not %r"
                             % (where, b))
        if self.save_input not in (None, True, False):
            raise TypeError("%s: save_input must be None (auto), True or False, not %r" % (where, self.save_input))
        if isinstance(self.exclude, str):
            raise TypeError("%s: exclude must be a collection of qualified names or a callable, not the string %r "
                            "(write (%r,))" % (where, self.exclude, self.exclude))
        if not callable(self.exclude):
            object.__setattr__(self, "exclude", tuple(self.exclude))
        if self.module_filter_fn is not None and not callable(self.module_filter_fn):
            raise TypeError("%s: module_filter_fn must be a callable (module, fqn) -> bool or None, not %s"
                            % (where, type(self.module_filter_fn).__name__))


class _Unset:
    """initialize's default for a keyword not given (so that a config and a keyword can be told apart)."""

    def __repr__(self) -> str:
        return "<from config>"


_UNSET: Any = _Unset()
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(Config))


def _merge_config(config: Optional[Config], given: Dict[str, Any]) -> Config:
    """The config initialize runs with: `config` (or the defaults) and the keywords given explicitly.
    A keyword that says something else than the config is an error: which one should win is not
    obvious to a reader of the call, so neither does."""
    if config is None:
        return Config(**given)
    if not isinstance(config, Config):
        raise TypeError("initialize: config must be an fp8amp.torch.Config, not %s" % type(config).__name__)
    norm = Config(**given)  # normalizes the keywords the way the config's fields were (opt_level, policy)
    clash = ["%s=%r (config.%s=%r)" % (k, given[k], k, getattr(config, k)) for k in given
             if getattr(norm, k) != getattr(config, k)]
    if clash:
        raise ValueError("initialize: keyword argument%s %s conflict%s with the config; give each setting once, in "
                         "the config or as a keyword (dataclasses.replace(config, ...) makes a changed copy)"
                         % ("s" if len(clash) > 1 else "", ", ".join(clash), "" if len(clash) > 1 else "s"))
    return config


def initialize(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, opt_level: Any = _UNSET,
               *, config: Optional[Config] = None, module_filter_fn: Any = _UNSET, policy: Any = _UNSET,
               recipe: Any = _UNSET, weight_dtype: Any = _UNSET, wgrad_dtype: Any = _UNSET,
               max_grad_norm: Any = _UNSET, exclude: Any = _UNSET, master_rounding: Any = _UNSET,
               rounding_seed: Any = _UNSET, save_input: Any = _UNSET, state_block_size: Any = _UNSET,
               process_group: Any = None) -> Any:
    """Replaces every nn.Linear of `model` by an fp8amp.torch.Linear (parameters copied) and, with
    an optimizer (torch.optim.Adam or AdamW), returns ``(model, Optimizer)`` running fp8amp's Adam at
    `opt_level` ("O1": F32 m and v; "O2": E4M3 m, F16 v; "O3": O2 plus E4M3 Linear weights with an
    F16 master copy) over all its parameters; without one, returns the model.

    The settings come from `config` (an ``fp8amp.torch.Config``; its docstring lists them) or from the
    keywords of the same names, with the same defaults: opt_level "O1", policy "auto", recipe None
    (current scaling), weight_dtype / wgrad_dtype None, max_grad_norm 0, exclude (), module_filter_fn
    None, master_rounding None, rounding_seed 0, save_input None, state_block_size None (O2: blocks of
    128; O3: 0, one scale per tensor, MS-AMP's optimizer-state layout, or 128 with a process_group). A
    keyword given together with a
    config must agree with it (ValueError otherwise). Linear weights are bfloat16 at O1/O2 with an
    optimizer (MS-AMP's layout: 16-bit weights, no float32 copy; float32 without an optimizer, or
    weight_dtype=torch.float32) and float8_e4m3fn at O3 (weight_dtype; O3 needs E4M3 weights and E4M3
    weights need O3), their gradients
    are E4M3 (wgrad_dtype, default float8_e4m3fn with an optimizer, the weight dtype without), the GEMM
    policy is `policy` ("auto", "fp8", "bf16") and the recipe current scaling unless given. Which
    nn.Linear modules are kept as they are: a Linear whose weight another module shares (tied
    embeddings); `exclude` (qualified names, e.g. ``("lm_head",)``: output layers are commonly kept in
    16 bits, or a callable ``(name, module) -> bool``); `module_filter_fn` returning False (torchao's
    ``(module, fqn) -> bool``, True = convert); with policy "fp8", in/out features not multiples of 16
    (cuBLASLt's FP8 GEMMs cannot run them). `master_rounding` ("nearest" or "stochastic"; None:
    stochastic where 16-bit weights have no master, i.e. the O1/O2 bfloat16 weights, else nearest) and
    `rounding_seed`: how the optimizer rounds the value of record, O3's F16 master copies or the O1/O2
    16-bit weights (fp8amp_adam_desc.master_rounding; docs/torch.md section 13).
    `save_input`: each new Linear's (None: keep inputs for backward only once a layer is seen used
    twice per forward; True: always, as nn.Linear; False: never). The logger "fp8amp" tells at INFO
    level which Linears were replaced and which kept, and why, and what the optimizer holds.
    `process_group` (a torch.distributed group, CUDA only): the optimizer is sharded over its ranks
    (fp8amp_optimizer_set_shard, docs/o3.md): each rank keeps the masters and Adam state of its shard
    of every parameter, and each step reduce-scatters the local gradients (do not all-reduce them
    first), updates the shard and all-gathers the parameters; every rank must start from the same
    weights. On the CPU it raises ValueError: the CPU communicator runs over MPI, not over a
    torch.distributed (gloo) group."""
    given = {k: v for k, v in (("opt_level", opt_level), ("module_filter_fn", module_filter_fn), ("policy", policy),
                               ("recipe", recipe), ("weight_dtype", weight_dtype), ("wgrad_dtype", wgrad_dtype),
                               ("max_grad_norm", max_grad_norm), ("exclude", exclude),
                               ("master_rounding", master_rounding), ("rounding_seed", rounding_seed),
                               ("save_input", save_input), ("state_block_size", state_block_size))
             if v is not _UNSET}
    cfg = _merge_config(config, given)
    opt_level, policy, recipe, weight_dtype, wgrad_dtype = (cfg.opt_level, cfg.policy, cfg.recipe, cfg.weight_dtype,
                                                            cfg.wgrad_dtype)
    max_grad_norm, exclude, master_rounding, rounding_seed, save_input = (cfg.max_grad_norm, cfg.exclude,
                                                                          cfg.master_rounding, cfg.rounding_seed,
                                                                          cfg.save_input)
    level = as_opt_level(opt_level)
    o3 = level == fp8amp.OptLevel.O3
    if weight_dtype is None:
        # MS-AMP's layout: 16-bit weights at O1/O2 (no float32 copy kept; the optimizer rounds their
        # updates stochastically, below), E4M3 at O3. Without fp8amp's optimizer float32 weights:
        # another optimizer would round a bfloat16 weight's updates to nearest.
        weight_dtype = torch.float8_e4m3fn if o3 else torch.bfloat16 if optimizer is not None else torch.float32
    if master_rounding is None:
        master_rounding = "stochastic" if weight_dtype in (torch.bfloat16, torch.float16) else "nearest"
    if o3 and weight_dtype != torch.float8_e4m3fn:
        raise ValueError("O3 keeps the Linear weights in E4M3 (weight_dtype=torch.float8_e4m3fn); use O2 for %s "
                         "weights" % weight_dtype)
    if not o3 and weight_dtype == torch.float8_e4m3fn and optimizer is not None:
        raise ValueError("E4M3 weights train only at O3, whose F16 master copy keeps the small updates that E4M3 "
                         "would round away")
    if optimizer is not None and type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        raise TypeError("initialize wraps torch.optim.Adam or AdamW, not %s" % type(optimizer).__name__)
    if optimizer is not None and optimizer.state:  # before the model changes: a refused call changes nothing
        raise ValueError("initialize needs a fresh optimizer (its state would be lost)")
    if wgrad_dtype is None:
        wgrad_dtype = torch.float8_e4m3fn if optimizer is not None else weight_dtype
    replaced = _replace_linears(model, weight_dtype=weight_dtype, wgrad_dtype=wgrad_dtype, policy=policy,
                                recipe=recipe, exclude=exclude, save_input=save_input,
                                module_filter_fn=cfg.module_filter_fn)
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
    # O3: each E4M3 weight's F16 master starts from the weight it replaced, not from its E4M3 codes
    # (3 mantissa bits; starting there cost +0.6% held-out loss on a GPT: docs/o3.md).
    master_inits: Dict[int, torch.Tensor] = {}
    for g in optimizer.param_groups:
        ng = {k: v for k, v in g.items() if k != "params"}
        params = []
        for p in g["params"]:
            if id(p) in replaced:
                m, which = replaced[id(p)]
                old, p = p, getattr(m, which)
                linears[id(p)] = (m, which)
                if o3 and which == "weight" and p.dtype == torch.float8_e4m3fn:
                    master_inits[id(p)] = old.detach()
            params.append(p)
        ng["params"] = params
        groups.append(ng)
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
                    master_rounding=master_rounding, rounding_seed=rounding_seed, comm=comm, master_inits=master_inits,
                    state_block_size=cfg.state_block_size)
    nlin = len({id(m) for m, _ in linears.values()})
    _log.info("fp8amp.initialize: %s at %s over %d param group(s): the parameters of %d fp8amp.torch.Linear layer(s) "
              "(updated from fp8amp's gradients, weight gradients %s) and %d other parameter(s) (updated from their "
              "torch .grad)", type(optimizer).__name__, level.name, len(groups), nlin,
              str(wgrad_dtype).replace("torch.", ""), len(opt._plain))
    return model, opt


class GradScaler:
    """fp8amp's dynamic loss scaler for this front: ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)`` (unscales, skips on overflow and updates the scale inside the
    fp8amp step, on the device), ``scaler.update()`` (the step updated the scale already; this only
    ends what unscale_ recorded).
    ``hysteresis`` > 1 is Megatron's: that many overflows in a row before backing off.

    ``scaler.unscale_(optimizer)`` before ``step``, as with torch's GradScaler, to clip or inspect the
    true gradients: it divides every gradient of the optimizer's param groups by the scale (an E4M3
    weight gradient through its scale_inv: exact, no requantization), then
    ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` works on them, and the next
    ``step`` does not unscale again; if unscale_ saw an inf/NaN, that step changes no parameter and the
    scale backs off (by the library's rule, hysteresis included). unscale_ reads the gradients'
    finiteness on the host (one synchronization, plus one per E4M3 gradient on CUDA); calling it twice
    before a step raises, as torch's does."""

    def __init__(self, device: Any = "cuda", init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, hysteresis: int = 1) -> None:
        d = _norm_device(device)
        self._device = d
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
        self._unscaled: Dict[int, bool] = {}  # id(optimizer) -> unscale_ found an inf/NaN (until its step)
        self._skipper: Optional[Tuple[fp8amp.Optimizer, torch.Tensor, torch.Tensor]] = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale_view.to(loss.dtype).reshape(())

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divides the gradients of `optimizer` (an fp8amp.torch.Optimizer) by the loss scale in place
        and records whether one is not finite, for the next ``step``."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError("fp8amp.torch.GradScaler.unscale_: optimizer must be an fp8amp.torch.Optimizer (made by "
                            "initialize), not %s" % type(optimizer).__name__)
        if self._scaler.closed:  # its scale's memory is gone: refuse before any gradient changes
            raise fp8amp.InvalidHandleError(int(lib.FP8AMP_ERROR_INVALID_HANDLE), "fp8amp.torch.GradScaler: the "
                                            "scaler's fp8amp_grad_scaler was closed")
        if id(optimizer) in self._unscaled:
            raise RuntimeError("fp8amp.torch.GradScaler.unscale_: already called on this optimizer since its last "
                               "step")
        _on_current_stream(self._ctx, self._device)
        # 1/scale as torch computes it (in double, then float): an exact power of two for the usual scales
        inv = self._scale_view.double().reciprocal().float().reshape(())
        flags = []
        with torch.no_grad():
            for g in optimizer.param_groups:
                for p in g["params"]:
                    grad = p.grad
                    if grad is None:
                        continue
                    if _is_fp8_grad(grad):
                        flags.append(_scale_fp8_grad(grad, inv, check=True))
                    else:  # plain gradients and float LinearGrad handles (those write through)
                        grad.mul_(inv.to(grad.device))
                        flags.append(torch.logical_not(torch.isfinite(grad).all()))
        self._unscaled[id(optimizer)] = bool(torch.stack([f.to(self._device) for f in flags]).any()) if flags \
            else False

    def _take_unscaled(self, optimizer: Any) -> Optional[bool]:
        """None when unscale_(optimizer) did not run since its last step; else whether it found an inf/NaN."""
        return self._unscaled.pop(id(optimizer), None)

    def _skipped_step(self) -> None:
        """Updates the scale for a step that unscale_ found an inf/NaN in: a skipped step of the library's
        own (a one-element optimizer whose gradient is NaN, run with this scaler: it skips and the scaler
        backs off on the device by fp8amp's rule, kernels/adam.hpp scaler_update, hysteresis included)."""
        if self._skipper is None:
            p = torch.zeros(1, dtype=torch.float32, device=self._device)
            g = torch.full((1,), float("nan"), dtype=torch.float32, device=self._device)
            o = fp8amp.Optimizer(self._ctx, AdamConfig.for_level("O1"))
            o.add_param(to_fp8amp(p, self._ctx), to_fp8amp(g, self._ctx), master=None)
            self._skipper = (o, p, g)
        _on_current_stream(self._ctx, self._device)
        self._skipper[0].step(scaler=self._scaler)

    def step(self, optimizer: Optimizer) -> None:
        optimizer.step(scaler=self)

    def update(self) -> None:
        # the scale was updated inside the step; as torch's, update() ends the unscale_ bookkeeping of
        # every optimizer (an unscale_ not followed by a step is dropped)
        self._unscaled.clear()

    def get_scale(self) -> float:
        return self._scaler.scale

    def state_dict(self) -> Dict[str, Any]:
        return self._scaler.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._scaler.load_state_dict(state)
