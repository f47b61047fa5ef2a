"""The PyTorch front's optimizer: ``Optimizer``, a torch.optim.Optimizer running fp8amp's Adam/AdamW
(O1/O2/O3) on the device, made by ``fp8amp.torch.initialize``."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from torch import nn

import fp8amp
from fp8amp.optim import AdamConfig, as_opt_level
from fp8amp.torch.context import _from_fp8amp, _norm_device, _on_current_stream, context, to_fp8amp
from fp8amp.torch.linear import Linear

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
                    # A DTensor (FSDP2's sharded parameter, docs/torch.md section 7): fp8amp steps this
                    # rank's shard; FSDP2 adds the reduce-scattered gradient into buf's local tensor.
                    loc = (lambda t: t._local_tensor) if _is_dtensor(it) else (lambda t: t)
                    pair = (to_fp8amp(loc(it), self._ctx), to_fp8amp(loc(buf), self._ctx))
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
                    "reads. With FSDP2, make the optimizer after fully_shard (docs/torch.md section 7)"
                    % (m._st.name or "#%d" % m._st.key))
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
