"""Adam/AdamW with low-precision state (O1/O2/O3) and the dynamic loss scaler (DESIGN.md section 3).

The C functions are looked up when an object is made, so this module imports against a library
that predates them (the classes then raise NotSupportedError).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Iterable, List, Optional, Tuple

from ._ffi import NULL, ffi, lib
from ._handle import Handle
from .context import Context
from .dtypes import DType
from .errors import NotSupportedError, check
from .tensor import Tensor


def _available() -> bool:
    return hasattr(lib, "fp8amp_optimizer_create")


def _require() -> None:
    if not _available():
        raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED,
                                "this libfp8amp build has no optimizer (fp8amp_optimizer_*)")


class OptLevel(enum.IntEnum):
    """MS-AMP's levels: O1 F32 m and v; O2 E4M3 m and F16 v; O3 O2 plus an F16 master copy of E4M3
    weights."""

    O1 = 1
    O2 = 2
    O3 = 3


def as_opt_level(level: Any) -> OptLevel:
    if isinstance(level, str):
        try:
            return OptLevel[level.upper()]
        except KeyError:
            raise ValueError("unknown opt level %r (O1, O2, O3)" % (level,)) from None
    return OptLevel(level)


@dataclasses.dataclass
class AdamConfig:
    """fp8amp_adam_desc. ``AdamConfig.for_level("O2")`` takes the library's state dtypes for a level."""

    adamw: bool = True
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    maximize: bool = False
    exp_avg_dtype: DType = DType.F32
    exp_avg_sq_dtype: DType = DType.F32
    master_dtype: Optional[DType] = None
    state_block_size: int = 128
    max_grad_norm: float = 0.0

    @classmethod
    def for_level(cls, level: Any = "O1", **overrides: Any) -> "AdamConfig":
        _require()
        d = ffi.new("fp8amp_adam_desc *")
        check(lib.fp8amp_opt_level_adam_init(int(as_opt_level(level)), d, ffi.sizeof("fp8amp_adam_desc")))
        c = cls(adamw=bool(d.adamw), lr=float(d.lr), beta1=float(d.beta1), beta2=float(d.beta2), eps=float(d.eps),
                weight_decay=float(d.weight_decay), maximize=bool(d.maximize), exp_avg_dtype=DType(d.exp_avg_dtype),
                exp_avg_sq_dtype=DType(d.exp_avg_sq_dtype),
                master_dtype=None if d.master_dtype == lib.FP8AMP_NO_MASTER else DType(d.master_dtype),
                state_block_size=int(d.state_block_size), max_grad_norm=float(d.max_grad_norm))
        return dataclasses.replace(c, **overrides)

    def _c(self) -> Any:
        d = ffi.new("fp8amp_adam_desc *")
        check(lib.fp8amp_adam_desc_init(d, ffi.sizeof("fp8amp_adam_desc")))
        d.adamw = 1 if self.adamw else 0
        d.lr, d.beta1, d.beta2, d.eps = float(self.lr), float(self.beta1), float(self.beta2), float(self.eps)
        d.weight_decay = float(self.weight_decay)
        d.maximize = 1 if self.maximize else 0
        d.exp_avg_dtype = int(self.exp_avg_dtype)
        d.exp_avg_sq_dtype = int(self.exp_avg_sq_dtype)
        d.master_dtype = lib.FP8AMP_NO_MASTER if self.master_dtype is None else int(self.master_dtype)
        d.state_block_size = int(self.state_block_size)
        d.max_grad_norm = float(self.max_grad_norm)
        return d


class GradScaler(Handle):
    """Dynamic loss scaling on the device: torch.cuda.amp.GradScaler's growth/backoff/interval, plus
    Megatron's hysteresis (1 = exactly torch's). Give it to ``Optimizer.step(scaler=...)``: the step
    unscales the gradients by the scale, skips itself on inf/NaN and updates the scaler, all on the
    device."""

    _destroy = None  # set on first use (the symbol may be missing)

    def __init__(self, ctx: Context, init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, hysteresis: int = 1) -> None:
        _require()
        type(self)._destroy = lib.fp8amp_grad_scaler_destroy
        d = ffi.new("fp8amp_grad_scaler_desc *")
        check(lib.fp8amp_grad_scaler_desc_init(d, ffi.sizeof("fp8amp_grad_scaler_desc")))
        d.init_scale, d.growth_factor, d.backoff_factor = float(init_scale), float(growth_factor), float(backoff_factor)
        d.growth_interval, d.hysteresis = int(growth_interval), int(hysteresis)
        out = ffi.new("fp8amp_grad_scaler *")
        check(lib.fp8amp_grad_scaler_create(ctx.handle, d, out))
        super().__init__(out[0])
        self._context = ctx

    @property
    def context(self) -> Context:
        return self._context

    @property
    def scale(self) -> float:
        """The current loss scale (synchronizes)."""
        v = ffi.new("float *")
        check(lib.fp8amp_grad_scaler_get_scale(self._h, v))
        return float(v[0])

    def scale_device_ptr(self) -> int:
        """The address of the scale (a float in device memory) while the scaler lives."""
        p = ffi.new("const float **")
        check(lib.fp8amp_grad_scaler_scale_device_ptr(self._h, p))
        return int(ffi.cast("uintptr_t", p[0]))

    def state_dict(self) -> dict:
        s = ffi.new("fp8amp_grad_scaler_state *")
        check(lib.fp8amp_grad_scaler_get_state(self._h, s))
        return {"scale": float(s.scale), "growth_tracker": int(s.growth_tracker),
                "hysteresis_left": int(s.hysteresis_left)}

    def load_state_dict(self, state: dict) -> None:
        s = ffi.new("fp8amp_grad_scaler_state *")
        s.scale, s.growth_tracker = float(state["scale"]), int(state["growth_tracker"])
        s.hysteresis_left = int(state["hysteresis_left"])
        check(lib.fp8amp_grad_scaler_set_state(self._h, s))

    def update(self, optimizer: "Optimizer") -> None:
        """Updates the scale from the found_inf of the optimizer's last step, for steps not given
        this scaler (a step given it already did)."""
        check(lib.fp8amp_grad_scaler_update(self._h, optimizer.handle))


class Optimizer(Handle):
    """``Optimizer(ctx, config_or_level, params=())``: Adam/AdamW over (param, grad) Tensor pairs.

    ``add_param(param, grad)`` registers pairs (all before the first step); ``step(lr=None,
    grad_scale_inv=1.0, scaler=None)`` runs one update on the device with no host synchronization,
    skipping itself (changing nothing) when a gradient is not finite. ``found_inf``, ``step_count``
    and ``grad_norm`` read the last step's results (synchronizing). ``state_dict()`` / bytes and
    ``load_state_dict`` use the library's checkpoint format.
    """

    _destroy = None

    def __init__(self, ctx: Context, config: Any = "O1", params: Iterable[Tuple[Tensor, Tensor]] = ()) -> None:
        _require()
        type(self)._destroy = lib.fp8amp_optimizer_destroy
        if not isinstance(config, AdamConfig):
            config = AdamConfig.for_level(config)
        self._config = dataclasses.replace(config)
        out = ffi.new("fp8amp_optimizer *")
        check(lib.fp8amp_optimizer_create(ctx.handle, self._config._c(), out))
        super().__init__(out[0])
        self._context = ctx
        self._params: List[Tuple[Tensor, Tensor]] = []  # keeps the Python objects alive with the C ones
        self._args = ffi.new("fp8amp_adam_step_args *")
        check(lib.fp8amp_adam_step_args_init(self._args, ffi.sizeof("fp8amp_adam_step_args")))
        for p, g in params:
            self.add_param(p, g)

    @property
    def context(self) -> Context:
        return self._context

    @property
    def config(self) -> AdamConfig:
        return dataclasses.replace(self._config)

    def add_param(self, param: Tensor, grad: Tensor) -> None:
        check(lib.fp8amp_optimizer_add_param(self._h, param.handle, grad.handle))
        self._params.append((param, grad))

    @property
    def params(self) -> List[Tuple[Tensor, Tensor]]:
        return list(self._params)

    def step(self, lr: Optional[float] = None, grad_scale_inv: float = 1.0, scaler: Optional[GradScaler] = None) -> None:
        a = self._args
        a.lr = -1.0 if lr is None else float(lr)
        a.grad_scale_inv = float(grad_scale_inv)
        a.scaler = scaler.handle if scaler is not None else NULL
        check(lib.fp8amp_optimizer_step(self._h, a))

    @property
    def found_inf(self) -> bool:
        v = ffi.new("int32_t *")
        check(lib.fp8amp_optimizer_get_found_inf(self._h, v))
        return bool(v[0])

    @property
    def step_count(self) -> int:
        v = ffi.new("int64_t *")
        check(lib.fp8amp_optimizer_get_step(self._h, v))
        return int(v[0])

    @property
    def grad_norm(self) -> float:
        v = ffi.new("float *")
        check(lib.fp8amp_optimizer_get_grad_norm(self._h, v))
        return float(v[0])

    @property
    def num_params(self) -> int:
        v = ffi.new("int32_t *")
        check(lib.fp8amp_optimizer_num_params(self._h, v))
        return int(v[0])

    @property
    def state_bytes(self) -> int:
        v = ffi.new("size_t *")
        check(lib.fp8amp_optimizer_state_bytes(self._h, v))
        return int(v[0])

    def save(self) -> bytes:
        """The checkpoint (docs/api.md section 12.6) as bytes (synchronizes)."""
        n = ffi.new("size_t *")
        check(lib.fp8amp_optimizer_save(self._h, NULL, 0, n))
        buf = ffi.new("char[]", max(int(n[0]), 1))
        check(lib.fp8amp_optimizer_save(self._h, buf, int(n[0]), n))
        return ffi.unpack(buf, int(n[0]))

    def load(self, data: bytes) -> None:
        """Restores a checkpoint made by save() (validated first: a failure changes nothing)."""
        data = bytes(data)
        check(lib.fp8amp_optimizer_load(self._h, ffi.from_buffer(data), len(data)))

    def __repr__(self) -> str:
        return "fp8amp.Optimizer(%s, %d params%s)" % ("AdamW" if self._config.adamw else "Adam", len(self._params),
                                                      ", closed" if self.closed else "")
