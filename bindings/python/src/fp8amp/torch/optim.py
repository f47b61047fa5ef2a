"""The PyTorch front's optimizer: ``Optimizer``, a torch.optim.Optimizer running fp8amp's Adam/AdamW
(O1/O2/O3) on the device, made by ``fp8amp.torch.initialize``."""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp.optim import AdamConfig, as_opt_level
from fp8amp.torch.context import _from_fp8amp, _norm_device, _on_current_stream, context, to_fp8amp
from fp8amp.torch.linear import Linear
from fp8amp.torch.linear import release_scratch as _release_scratch

_log = logging.getLogger("fp8amp")

if TYPE_CHECKING:
    from fp8amp.torch.amp import GradScaler


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_local_tensor")


def _grad_scaler_type() -> type:
    from fp8amp.torch.amp import GradScaler  # amp imports this module: resolved at call time

    return GradScaler


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

    ``state_block_size`` (elements per scale of m, v and O3's masters): None is 128, except at O3,
    where it is 0 (one scale per tensor, MS-AMP's layout), or 128 again when sharded (``comm``).

    Works with ``torch.amp.GradScaler`` (it declares ``_step_supports_amp_scaling``: the step gets
    the scale and the found-inf flag, unscales inside fp8amp's step and skips on overflow) and with
    this module's ``GradScaler`` (``step(scaler=...)``); with either, ``scaler.unscale_(opt)`` may come
    first (then ``torch.nn.utils.clip_grad_norm_``): the step then takes the gradients as they are.
    ``state_dict()`` has torch's layout with fp8amp's compact storage as tensors (m, v, O3's masters,
    their block scales, O3 weights' scaling metas, step), for torch.save, torch.distributed.checkpoint
    and safetensors; ``load_state_dict()`` takes it, a plain torch AdamW/Adam state dict, or the blob
    format of earlier releases (``fp8amp_state_dict()``; an O3 blob state dict of fp8amp 0.4.0's
    first release, two per group, does not load); ``torch_state_dict()`` goes back to torch's
    optimizers (docs/torch.md "Checkpoints").
    """

    _step_supports_amp_scaling = True

    def __init__(self, param_groups: List[Dict[str, Any]], opt_level: Any, adamw: bool, linears: Dict[int, Tuple[Linear, str]],
                 max_grad_norm: float = 0.0, master_rounding: Any = "nearest", rounding_seed: int = 0,
                 comm: Optional[fp8amp.Communicator] = None,
                 master_inits: Optional[Dict[int, torch.Tensor]] = None,
                 state_block_size: Optional[int] = None) -> None:
        super().__init__(param_groups, {})
        self.opt_level = as_opt_level(opt_level)
        o3 = self.opt_level == fp8amp.OptLevel.O3
        if state_block_size is None and o3:
            # O3 is the level that saves memory: MS-AMP's layout, one state scale per tensor (7 bytes per
            # Linear parameter at rest, none of the 0.09 that blocks of 128 add). Sharded, a tensor's
            # scale would span ranks (the sharded optimizer refuses it): blocks of 128 there.
            state_block_size = 128 if comm is not None else 0
            _log.info("fp8amp.torch.Optimizer: O3 optimizer state with %s", "one scale per 128-element block "
                      "(sharded)" if state_block_size else "one scale per tensor (MS-AMP's layout)")
        self._linears = sorted({id(m): m for m, _ in linears.values()}.values(), key=id)
        self._opts: List[fp8amp.Optimizer] = []
        self._opt_groups: List[int] = []  # the param group of each fp8amp optimizer
        self._plain: List[Tuple[nn.Parameter, torch.Tensor]] = []  # non-Linear params and their grad buffers
        self._ctx: Optional[fp8amp.Context] = None
        self._device: Optional[torch.device] = None
        plan = []  # (group index, config, [(item, master?, flat index), ...]) of each fp8amp optimizer to make
        self._adamw = bool(adamw)
        self._sharded = comm is not None
        # torch's state_dict index of each parameter (its place in the groups' params, in order) ->
        # (fp8amp optimizer, its parameter index): the O3 split below reorders within a group.
        self._slots: Dict[int, Tuple[int, int]] = {}
        flat = 0
        for gi, g in enumerate(self.param_groups):
            if g.get("amsgrad"):
                raise NotImplementedError("amsgrad")
            beta1, beta2 = g["betas"]
            cfg = AdamConfig.for_level(self.opt_level, adamw=adamw, lr=float(g["lr"]), beta1=float(beta1),
                                       beta2=float(beta2), eps=float(g["eps"]), weight_decay=float(g["weight_decay"]),
                                       maximize=bool(g.get("maximize", False)), max_grad_norm=float(max_grad_norm))
            if master_rounding != "nearest" or rounding_seed:  # fp8amp 0.4.0: how the value of record is rounded
                cfg = dataclasses.replace(cfg, master_rounding=master_rounding, rounding_seed=rounding_seed)
            if state_block_size is not None:  # elements per state scale (0: one per tensor, MS-AMP's)
                cfg = dataclasses.replace(cfg, state_block_size=state_block_size)
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
                    if o3 and pair[0].dtype == fp8amp.E4M3:
                        init = (master_inits or {}).get(id(p))
                        low.append((pair if init is None else pair + (init,), flat))
                    else:
                        other.append((pair, flat))
                else:
                    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not p.is_contiguous():
                        raise TypeError("fp8amp's optimizer takes contiguous float32/bfloat16/float16 parameters")
                    other.append((p, flat))  # its buffer is made below, once the layout is known to be valid
                flat += 1
            if not low and not other:
                raise ValueError("an empty param group")
            # One fp8amp optimizer per group: at O3 the E4M3 weights with the config's F16 master,
            # every other parameter with none (explicitly: an F32 one cannot take an F16 master).
            plan.append((gi, cfg, [(it, True, f) for it, f in low] + [(it, not o3, f) for it, f in other]))
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
            for k, (it, default_master, f) in enumerate(items):
                self._slots[f] = (len(self._opts), k)
                init = None
                if isinstance(it, tuple):
                    pair, init = it[:2], (it[2] if len(it) > 2 else None)
                else:
                    buf = torch.zeros_like(it, memory_format=torch.contiguous_format)
                    if it.grad is not None:
                        buf.copy_(it.grad)
                    it.grad = buf
                    self._plain.append((it, buf))
                    # A DTensor (FSDP2's sharded parameter, docs/torch.md section 12): fp8amp steps this
                    # rank's shard; FSDP2 adds the reduce-scattered gradient into buf's local tensor.
                    loc = (lambda t: t._local_tensor) if _is_dtensor(it) else (lambda t: t)
                    pair = (to_fp8amp(loc(it), self._ctx), to_fp8amp(loc(buf), self._ctx))
                if init is not None:  # the full-precision value the F16 master starts from
                    _on_current_stream(self._ctx, self._device)
                    opt.add_param(*pair, master_init=to_fp8amp(init.to(self._device).contiguous(), self._ctx))
                elif default_master:
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

    # Its step releases the Linears' buffers itself (_release_buffers); the front's post-step hook for
    # other torch optimizers (fp8amp/torch/linear.py, _after_torch_step) skips it.
    _fp8amp_releases = True

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
        if scaler is not None and not isinstance(scaler, _grad_scaler_type()):
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
                self._skip()
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
        for m in self._linears:
            if m._parameters["weight"] is not m._st.weight or m._parameters["bias"] is not m._st.bias:
                raise RuntimeError(
                    "fp8amp.torch.Optimizer: the parameters of Linear %s were replaced after this optimizer was made "
                    "(FSDP2's fully_shard, an assignment): it steps the C Linear's own copy, which the module no longer "
                    "reads. With FSDP2, make the optimizer after fully_shard (docs/torch.md section 12)"
                    % (m._st.name or "#%d" % m._st.key))
        # scaler.unscale_(self) ran since the last step: the gradients are unscaled already, and an
        # inf/NaN it found skips every group (and backs the scale off)
        unscaled = scaler._take_unscaled(self) if scaler is not None else None
        if unscaled is None and scaler is not None and len(self._opts) > 1:
            # Several fp8amp optimizers each check only their own gradients: an inf in one group would
            # skip that group alone. Unscale and check them all first (unscale_), then step as after it.
            scaler.unscale_(self)
            unscaled = scaler._take_unscaled(self)
        self._rebind_grads()
        assert self._ctx is not None and self._device is not None
        _on_current_stream(self._ctx, self._device)
        if unscaled:
            scaler._skipped_step()
            self._skip()
            return loss
        c_scaler = scaler._scaler if scaler is not None and unscaled is None else None  # closed: the step raises
        groups = self.param_groups
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
        for o, gi in steps:
            o.step(lr=float(groups[gi]["lr"]), grad_scale_inv=inv, scaler=c_scaler)
        if unscaled is not None:  # unscale_ found none: a good step for the scaler (unless a step found one)
            bad = [o for o, _ in steps if o.found_inf]
            scaler._scaler.update(bad[0] if bad else self._opts[0])
        if self._metas:
            fp8amp.update_many(self._ctx, self._metas)
        self._release_buffers()
        return loss

    def _skip(self) -> None:
        """A step skipped for an inf/NaN that a scaler found (torch's found_inf, or ft.GradScaler's
        unscale_): as after a step that skipped itself, the delayed metas still fold this step's
        amaxes into their histories (else they would wait in the next step's record), and the Linears
        give their buffers back."""
        if self._metas:
            assert self._ctx is not None and self._device is not None
            _on_current_stream(self._ctx, self._device)
            fp8amp.update_many(self._ctx, self._metas)
        self._release_buffers()

    def _release_buffers(self) -> None:
        # At rest after a step each Linear holds its parameters and gradients only (issue 18 point 3):
        # its weight copies are stale now, its saved input was consumed by its backward, and the FP32
        # gradient sum is needed only while micro-batches accumulate (fp8amp_linear_release_buffers).
        for m in self._linears:
            m._release_buffers()
        # and the contexts' scratch pools and GEMM workspaces (no host wait: see release_scratch)
        _release_scratch({id(m._ctx): m._ctx for m in self._linears}.values())

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

    # ---- checkpoints (docs/torch.md "Checkpoints") ------------------------------------------------

    _PARTS = ("exp_avg", "exp_avg_scale_inv", "exp_avg_sq", "exp_avg_sq_scale_inv", "master", "master_scale_inv",
              "param_meta_history")
    _FIXED = ("betas", "eps", "weight_decay", "maximize")  # hyperparameters fixed in the fp8amp optimizers

    def _groups_out(self) -> List[Dict[str, Any]]:
        groups, start = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(d)
        return groups

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        """torch's layout: ``state`` keyed by parameter index (the groups' params in order, as
        torch.optim numbers them) holding that parameter's state in fp8amp's compact storage, copied
        out as torch tensors on the parameters' device -- ``exp_avg`` (float32 at O1, else
        float8_e4m3fn) with ``exp_avg_scale_inv`` (float32, one per block of state_block_size
        elements), ``exp_avg_sq`` (float32 or float16) with ``exp_avg_sq_scale_inv``, O3's E4M3
        weights' ``master`` (float16) with ``master_scale_inv``, and ``step`` (a float32 scalar
        tensor, as torch's Adam) --, and ``param_groups`` with ``params`` index lists. Only tensors
        and plain values: torch.save, torch.distributed.checkpoint and safetensors (of the flattened
        tensors) store it. A sharded optimizer (process_group) keeps fp8amp's per-rank checkpoints
        (``"fp8amp"``: one blob per param group)."""
        if self._sharded:
            return self.fp8amp_state_dict()
        assert self._ctx is not None and self._device is not None
        _on_current_stream(self._ctx, self._device)
        state: Dict[int, Dict[str, Any]] = {}
        for f in sorted(self._slots):
            oi, k = self._slots[f]
            views = self._opts[oi].param_state(k)
            entry: Dict[str, Any] = {"step": torch.tensor(float(views.pop("step")), dtype=torch.float32)}
            for name in self._PARTS:
                if name in views:  # a copy: the views are the optimizer's live memory
                    entry[name] = _from_fp8amp(views[name]).clone()
            if "param_meta_history" in views:  # an E4M3 weight's delayed scaling, which the steps drive
                entry["param_meta_scale"] = torch.tensor(views["param_meta_scale"], dtype=torch.float32)
                entry["param_meta_amax"] = torch.tensor(views["param_meta_amax"], dtype=torch.float32)
                entry["param_meta_updates"] = torch.tensor(views["param_meta_updates"], dtype=torch.int64)
            state[f] = entry
        return {"state": state, "param_groups": self._groups_out(),
                "fp8amp_layout": {"opt_level": int(self.opt_level), "version": 1}}

    def fp8amp_state_dict(self) -> Dict[str, Any]:
        """fp8amp's own checkpoints (docs/api.md 12.6), the state_dict of earlier releases: ``"fp8amp"``
        one blob (bytes) per fp8amp optimizer (param group), which also holds the parameters and
        their scaling metas, plus the groups. load_state_dict takes it too."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return {"fp8amp": [o.save() for o in self._opts], "fp8amp_groups": list(self._opt_groups),
                "param_groups": groups, "opt_level": int(self.opt_level)}

    def torch_state_dict(self) -> Dict[str, Any]:
        """The state as a plain torch.optim.AdamW (``adamw=True``) or Adam state dict that
        torch.optim.AdamW/Adam.load_state_dict takes: ``exp_avg`` and ``exp_avg_sq`` dequantized to
        float32 (code * its block's scale_inv: exact) in the parameter's shape, ``step`` a float32
        scalar tensor, the groups with torch's keys. O3's master copies have no place there: torch
        continues from the model's weights."""
        if self._sharded:
            raise NotImplementedError("torch_state_dict of a sharded optimizer (process_group): each rank holds a "
                                      "slice of the state")
        own = self.state_dict()
        state: Dict[int, Dict[str, Any]] = {}
        for f, e in own["state"].items():
            oi, _ = self._slots[f]
            block = self._opts[oi].config.state_block_size
            state[f] = {"step": e["step"],
                        "exp_avg": _dequantize(e["exp_avg"], e.get("exp_avg_scale_inv"), block),
                        "exp_avg_sq": _dequantize(e["exp_avg_sq"], e.get("exp_avg_sq_scale_inv"), block)}
        groups = own["param_groups"]
        for g in groups:
            g["betas"] = tuple(g["betas"])
            for key, value in (("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
                               ("differentiable", False), ("fused", None), ("decoupled_weight_decay", self._adamw)):
                g.setdefault(key, value)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:  # type: ignore[override]
        """Loads (a) a state_dict() of this layout, bit for bit (also after torch.save/torch.load,
        safetensors or torch.distributed.checkpoint); (b) a plain torch.optim.AdamW/Adam state dict
        (float32/bfloat16/float16 ``exp_avg``/``exp_avg_sq``, ``step``): the values are quantized
        into this optimizer's formats with its block scaling (exact at O1), and O3's masters start
        from the current weights (load the model first); (c) the blob format of earlier releases
        (``"fp8amp"``: bytes per param group), which also restores the parameters. The groups must
        match (count, sizes) and betas, eps, weight_decay and maximize equal this optimizer's (they
        are fixed when it is made; lr is taken from the groups at every step). Everything is
        checked, and on a failure what was written is restored: the optimizer is unchanged."""
        if not hasattr(state_dict, "get"):
            raise TypeError("load_state_dict: state_dict must be a dict, not %s" % type(state_dict).__name__)
        if isinstance(state_dict.get("fp8amp"), (list, tuple)):
            return self._load_blobs(state_dict)
        if self._sharded:
            raise NotImplementedError("a sharded optimizer (process_group) loads fp8amp's per-rank checkpoints only "
                                      "(the \"fp8amp\" blobs its state_dict() writes)")
        groups = state_dict.get("param_groups")
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            raise ValueError("load_state_dict: the state dict has %s param groups, this optimizer %d"
                             % (len(groups) if isinstance(groups, (list, tuple)) else "no", len(self.param_groups)))
        saved_index: Dict[Any, int] = {}  # the dict's parameter ids -> ours (by place, as torch)
        flat = 0
        for gi, (g, sg) in enumerate(zip(self.param_groups, groups)):
            if len(sg["params"]) != len(g["params"]):
                raise ValueError("load_state_dict: param group %d has %d parameters in the state dict, %d here"
                                 % (gi, len(sg["params"]), len(g["params"])))
            for j, pid in enumerate(sg["params"]):
                saved_index[pid] = flat + j
            flat += len(g["params"])
            if sg.get("amsgrad"):
                raise NotImplementedError("load_state_dict: param group %d uses amsgrad" % gi)
            if "decoupled_weight_decay" in sg and bool(sg["decoupled_weight_decay"]) != self._adamw:
                raise ValueError("load_state_dict: param group %d is %s's, this optimizer is %s"
                                 % (gi, "AdamW" if sg["decoupled_weight_decay"] else "Adam",
                                    "AdamW" if self._adamw else "Adam"))
            for key in self._FIXED:
                if key in sg and key in g and not _same_hyper(sg[key], g[key]):
                    raise ValueError("load_state_dict: param group %d has %s %r, this optimizer %r (fixed when it is "
                                     "made: make it with the checkpoint's values)" % (gi, key, sg[key], g[key]))
        state = {saved_index[pid]: e for pid, e in (state_dict.get("state") or {}).items() if pid in saved_index}
        unknown = [pid for pid in (state_dict.get("state") or {}) if pid not in saved_index]
        if unknown:
            raise ValueError("load_state_dict: state for parameter ids %s that no param group lists" % unknown[:5])
        # The plan: per fp8amp optimizer its step count and per parameter the tensors to write.
        assert self._ctx is not None and self._device is not None
        _on_current_stream(self._ctx, self._device)
        steps: Dict[int, int] = {}
        writes = []  # (optimizer, index, {part: fp8amp.Tensor}, keep-alive torch tensors)
        for f in sorted(self._slots):
            oi, k = self._slots[f]
            e = state.get(f)
            if e is not None and "step" in e:
                step = int(float(e["step"]))
                if steps.setdefault(oi, step) != step:
                    raise ValueError("load_state_dict: the parameters of param group %d have different step counts "
                                     "(%d, %d): fp8amp keeps one per group" % (self._opt_groups[oi], steps[oi], step))
            opt = self._opts[oi]
            param = opt.params[k][0]
            shape = tuple(param.shape)
            keep: List[torch.Tensor] = []
            parts: Dict[str, Any] = {}
            cfg = opt.config
            current = opt.param_state(k)
            has_master, has_meta = "master" in current, "param_meta_history" in current
            del current
            block = cfg.state_block_size
            nscales = (param.numel + block - 1) // block if block > 0 else 1
            stored = {"exp_avg": torch.float8_e4m3fn if cfg.exp_avg_dtype == fp8amp.E4M3 else torch.float32,
                      "exp_avg_sq": torch.float16 if cfg.exp_avg_sq_dtype == fp8amp.F16 else torch.float32,
                      "master": torch.float16}
            for name in ("exp_avg", "exp_avg_sq", "master"):
                v = None if e is None else e.get(name)
                sc = None if e is None else e.get(name + "_scale_inv")
                if name == "master":
                    if not has_master:  # (a master of an O3 checkpoint loaded at O2: the weight is the model's)
                        continue
                    if v is None:  # a torch state dict, or an O1/O2 one: the master starts from the weight
                        v, sc = self._weight_values(param), None
                elif v is None:
                    v = torch.zeros(shape, dtype=torch.float32)  # torch has no state for a parameter never stepped
                for what, t in ((name, v), (name + "_scale_inv", sc)):
                    if t is not None and not isinstance(t, torch.Tensor):
                        raise TypeError("load_state_dict: state[%r][%r] is a %s, not a tensor" % (f, what, type(t).__name__))
                v = v.detach().to(self._device)
                if tuple(v.shape) != shape and v.numel() == param.numel:
                    v = v.reshape(shape)
                if sc is not None:
                    sc = sc.detach().to(self._device)
                    if v.dtype != stored[name] or sc.numel() != nscales or name == "exp_avg" and stored[name] == torch.float32:
                        # another level's or block size's storage: its values, quantized anew below
                        v, sc = _dequantize(v, sc, _saved_block(v.numel(), sc.numel())), None
                if v.dtype == torch.float64:
                    v = v.float()
                for part, t in ((name, v), (name + "_scale_inv", sc)):
                    if t is not None:
                        t = t.contiguous()
                        keep.append(t)
                        parts[part] = to_fp8amp(t, self._ctx)
            if has_meta and e is not None and e.get("param_meta_history") is not None:
                h = e["param_meta_history"].detach().to(self._device, torch.float32).contiguous()
                keep.append(h)
                parts["param_meta_history"] = to_fp8amp(h, self._ctx)
                for key in ("param_meta_scale", "param_meta_amax", "param_meta_updates"):
                    parts[key] = e[key]
            writes.append((opt, k, parts, keep))
        # Apply, restoring what was written if a later write is refused.
        backup = [(opt, k, opt.param_state(k)) for opt, k, _, _ in writes]
        for _, _, saved in backup:  # copies of the live views
            for n, t in list(saved.items()):
                if isinstance(t, fp8amp.Tensor):
                    saved[n] = _from_fp8amp(t).clone()
        old_steps = [o.step_count for o in self._opts]
        done = 0
        try:
            for opt, k, parts, _ in writes:
                opt.set_param_state(k, parts)
                done += 1
            for oi, o in enumerate(self._opts):
                o.set_step(steps.get(oi, 0))
        except BaseException:
            for opt, k, saved in backup[:done]:
                opt.set_param_state(k, {n: to_fp8amp(t, self._ctx) if isinstance(t, torch.Tensor) else t
                                        for n, t in saved.items()})
            for o, st in zip(self._opts, old_steps):
                o.set_step(st)
            raise
        for g, sg in zip(self.param_groups, groups):
            g.update({key: v for key, v in sg.items() if key != "params"})
        # The masters now belong to the current weights (derived from them, or the checkpoint's:
        # then load the model's state first, or the next step finds the weights changed after).
        self._tokens = [m._write_token() for m in self._masters]

    def _weight_values(self, param: fp8amp.Tensor) -> torch.Tensor:
        """A parameter's values in float32 (an E4M3 weight dequantized with its scale_inv)."""
        assert self._ctx is not None
        if param.dtype == fp8amp.E4M3:
            t = torch.empty(tuple(param.shape), dtype=torch.float32, device=self._device)
            _on_current_stream(self._ctx, self._device)
            fp8amp.dequantize(self._ctx, param, to_fp8amp(t, self._ctx))
            return t
        return _from_fp8amp(param).float()

    def _load_blobs(self, state_dict: Dict[str, Any]) -> None:
        """The format of earlier releases: one fp8amp checkpoint (bytes) per param group."""
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


def _same_hyper(a: Any, b: Any) -> bool:
    """Hyperparameters equal as the fp8amp optimizer holds them (float32)."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(_same_hyper(x, y) for x, y in zip(a, b)))
    if isinstance(a, torch.Tensor):
        a = a.item()
    if isinstance(b, torch.Tensor):
        b = b.item()
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    return torch.tensor(float(a), dtype=torch.float32).item() == torch.tensor(float(b), dtype=torch.float32).item()


def _saved_block(n: int, nscales: int) -> int:
    """The state_block_size that gives n elements nscales block scales (a power of two; the whole
    tensor for one scale)."""
    if nscales <= 1:
        return max(n, 1)
    return 1 << (-(-n // nscales) - 1).bit_length()


def _dequantize(codes: torch.Tensor, scale_inv: Optional[torch.Tensor], block: int) -> torch.Tensor:
    """code * its block's scale_inv in float32 (exact: the scales are powers of two)."""
    x = codes.float()
    if scale_inv is None:
        return x
    n = x.numel()
    per = scale_inv.repeat_interleave(block if block > 0 else max(n, 1))[:n]
    return (x.reshape(-1) * per).reshape(x.shape)
