"""Adam/AdamW with low-precision state (O1/O2/O3) and the dynamic loss scaler (guide: docs/api.md section 12; numerics: docs/numerics.md section 6).

The C functions are looked up when an object is made, so this module imports against a library
that predates them (the classes then raise NotSupportedError).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ._args import as_enum, as_float, as_int, finite_nonnegative, handle_of
from ._ffi import NULL, ffi, lib
from ._handle import Handle
from .context import Context
from .dtypes import DType, as_dtype
from .errors import InvalidArgumentError, NotSupportedError, check
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


_LEVEL_NAMES = {"o1": OptLevel.O1, "o2": OptLevel.O2, "o3": OptLevel.O3}


class MasterRounding(enum.IntEnum):
    """fp8amp_master_rounding: how a step rounds the value of record -- the F16 master copies, and BF16
    or F16 parameters without one (docs/numerics.md 6.3). NEAREST loses updates below half an ulp;
    STOCHASTIC keeps them in expectation (seeded, identical bytes on CPU and CUDA)."""

    NEAREST = 0
    STOCHASTIC = 1


_ROUNDING_NAMES = {"nearest": MasterRounding.NEAREST, "stochastic": MasterRounding.STOCHASTIC}
_DEFAULT = object()  # add_param's master: the config's master_dtype


def as_opt_level(level: Any) -> OptLevel:
    """An OptLevel from a member, 1..3 or "O1".."O3" (another value: InvalidArgumentError, a
    ValueError; another type: TypeError)."""
    return as_enum(OptLevel, level, "fp8amp_opt_level_config", "level", _LEVEL_NAMES)


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
    master_rounding: Any = MasterRounding.NEAREST  # a MasterRounding, 0/1 or "nearest"/"stochastic"
    rounding_seed: int = 0

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
        if hasattr(d, "master_rounding"):  # a header of 0.4.0 or later
            c.master_rounding = MasterRounding(d.master_rounding)
            c.rounding_seed = int(d.rounding_seed)
        return dataclasses.replace(c, **overrides)

    def _c(self) -> Any:
        d = ffi.new("fp8amp_adam_desc *")
        check(lib.fp8amp_adam_desc_init(d, ffi.sizeof("fp8amp_adam_desc")))
        d.adamw = 1 if self.adamw else 0
        # NaN, inf and out-of-range values go to the library, which refuses them naming the field;
        # wrong types and integers a field cannot hold are refused here (never truncated).
        for field in ("lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm"):
            setattr(d, field, as_float(getattr(self, field), "fp8amp_optimizer_create", field))
        d.maximize = 1 if self.maximize else 0
        d.exp_avg_dtype = as_dtype(self.exp_avg_dtype)
        d.exp_avg_sq_dtype = as_dtype(self.exp_avg_sq_dtype)
        d.master_dtype = lib.FP8AMP_NO_MASTER if self.master_dtype is None else as_dtype(self.master_dtype)
        d.state_block_size = as_int(self.state_block_size, "fp8amp_optimizer_create", "state_block_size", "int32_t")
        rounding = as_enum(MasterRounding, self.master_rounding, "fp8amp_optimizer_create", "master_rounding",
                           _ROUNDING_NAMES)
        seed = as_int(self.rounding_seed, "fp8amp_optimizer_create", "rounding_seed", "uint32_t")
        if hasattr(d, "master_rounding"):
            d.master_rounding = int(rounding)
            d.rounding_seed = seed
        elif rounding != MasterRounding.NEAREST:
            raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED,
                                    "fp8amp_optimizer_create: master_rounding needs libfp8amp 0.4.0 or later")
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
        ctx_h = handle_of(ctx, Context, "fp8amp_grad_scaler_create", "ctx")
        d = ffi.new("fp8amp_grad_scaler_desc *")
        check(lib.fp8amp_grad_scaler_desc_init(d, ffi.sizeof("fp8amp_grad_scaler_desc")))
        d.init_scale = as_float(init_scale, "fp8amp_grad_scaler_create", "init_scale")
        d.growth_factor = as_float(growth_factor, "fp8amp_grad_scaler_create", "growth_factor")
        d.backoff_factor = as_float(backoff_factor, "fp8amp_grad_scaler_create", "backoff_factor")
        d.growth_interval = as_int(growth_interval, "fp8amp_grad_scaler_create", "growth_interval", "int32_t")
        d.hysteresis = as_int(hysteresis, "fp8amp_grad_scaler_create", "hysteresis", "int32_t")
        out = ffi.new("fp8amp_grad_scaler *")
        check(lib.fp8amp_grad_scaler_create(ctx_h, d, out))
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
        """Restores a state_dict() (validated by the library: a failure changes nothing)."""
        where = "fp8amp_grad_scaler_set_state"
        if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
            raise TypeError("%s: state must be a dict (scale, growth_tracker, hysteresis_left), not %s"
                            % (where, type(state).__name__))
        missing = [k for k in ("scale", "growth_tracker", "hysteresis_left") if k not in state]
        if missing:
            raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT, "%s: state has no %s"
                                       % (where, ", ".join(missing)))
        s = ffi.new("fp8amp_grad_scaler_state *")
        s.scale = as_float(state["scale"], where, "scale")
        s.growth_tracker = as_int(state["growth_tracker"], where, "growth_tracker", "int32_t")
        s.hysteresis_left = as_int(state["hysteresis_left"], where, "hysteresis_left", "int32_t")
        check(lib.fp8amp_grad_scaler_set_state(self._h, s))

    def update(self, optimizer: "Optimizer") -> None:
        """Updates the scale from the found_inf of the optimizer's last step, for steps not given
        this scaler (a step given it already did)."""
        opt_h = handle_of(optimizer, Optimizer, "fp8amp_grad_scaler_update", "optimizer")
        check(lib.fp8amp_grad_scaler_update(self._h, opt_h))


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
        ctx_h = handle_of(ctx, Context, "fp8amp_optimizer_create", "ctx")
        if not isinstance(config, AdamConfig):
            config = AdamConfig.for_level(config)
        self._config = dataclasses.replace(config)
        out = ffi.new("fp8amp_optimizer *")
        check(lib.fp8amp_optimizer_create(ctx_h, self._config._c(), out))
        super().__init__(out[0])
        self._context = ctx
        self._params: List[Tuple[Tensor, Tensor]] = []  # keeps the Python objects alive with the C ones
        self._args = ffi.new("fp8amp_adam_step_args *")
        check(lib.fp8amp_adam_step_args_init(self._args, ffi.sizeof("fp8amp_adam_step_args")))
        try:
            pairs = [tuple(pg) for pg in params]
        except TypeError:
            raise TypeError("fp8amp_optimizer_add_param: params must be an iterable of (param, grad) pairs, not %s"
                            % type(params).__name__) from None
        for i, pg in enumerate(pairs):
            if len(pg) != 2:
                raise TypeError("fp8amp_optimizer_add_param: params[%d] must be a (param, grad) pair, not %d items"
                                % (i, len(pg)))
            self.add_param(*pg)

    @property
    def context(self) -> Context:
        return self._context

    @property
    def config(self) -> AdamConfig:
        return dataclasses.replace(self._config)

    def add_param(self, param: Tensor, grad: Tensor, master: Any = _DEFAULT, master_init: Optional[Tensor] = None) -> None:
        """Registers (param, grad). master: left out, the config's master_dtype; None, no master copy;
        DType.F16 (or "f16"), an F16 master copy (fp8amp_optimizer_add_param_ex: one optimizer may mix
        parameters with and without one). master_init: the F32/BF16/F16 tensor (the parameter's shape)
        the master copy starts from instead of the parameter's value -- the full-precision weights an
        E4M3 parameter was quantized from (fp8amp_param_desc.master_init); read during the call only."""
        if master is _DEFAULT and master_init is None:
            p_h = handle_of(param, Tensor, "fp8amp_optimizer_add_param", "param")
            g_h = handle_of(grad, Tensor, "fp8amp_optimizer_add_param", "grad")
            check(lib.fp8amp_optimizer_add_param(self._h, p_h, g_h))
        else:
            where = "fp8amp_optimizer_add_param_ex"
            if not hasattr(lib, where):
                raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED,
                                        "%s: a per-parameter master needs libfp8amp 0.4.0 or later" % where)
            p_h = handle_of(param, Tensor, where, "param")
            g_h = handle_of(grad, Tensor, where, "grad")
            d = ffi.new("fp8amp_param_desc *")
            check(lib.fp8amp_param_desc_init(d, ffi.sizeof("fp8amp_param_desc")))
            if master is not _DEFAULT:
                d.master_dtype = lib.FP8AMP_NO_MASTER if master is None else int(as_dtype(master))
            if master_init is not None:
                d.master_init = handle_of(master_init, Tensor, where, "master_init")
            check(lib.fp8amp_optimizer_add_param_ex(self._h, p_h, g_h, d))
        self._params.append((param, grad))

    @property
    def params(self) -> List[Tuple[Tensor, Tensor]]:
        return list(self._params)

    def set_shard(self, comm: Any) -> None:
        """fp8amp_optimizer_set_shard: makes this fresh optimizer this rank's part of an optimizer
        sharded over comm's ranks (docs/o3.md): call it before add_param, on every rank; the steps
        are then collective. comm: an fp8amp.Communicator (kept alive with the optimizer)."""
        from .comm import Communicator  # not at import: comm.py is optional for the optimizer

        where = "fp8amp_optimizer_set_shard"
        if not hasattr(lib, where):
            raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED, "%s needs libfp8amp 0.4.0 or later" % where)
        check(lib.fp8amp_optimizer_set_shard(self._h, handle_of(comm, Communicator, where, "comm")))
        self._comm = comm

    def shard_range(self, index: int) -> Tuple[int, int]:
        """fp8amp_optimizer_shard_range: (begin, count) of parameter `index` held by this rank."""
        b, c = ffi.new("int64_t *"), ffi.new("int64_t *")
        check(lib.fp8amp_optimizer_shard_range(self._h, int(index), b, c))
        return int(b[0]), int(c[0])

    def step(self, lr: Optional[float] = None, grad_scale_inv: float = 1.0, scaler: Optional[GradScaler] = None) -> None:
        """One update. lr None takes the config's (the C API's negative lr; from Python a negative or
        non-finite lr is refused rather than read as "the default"). A closed scaler raises
        InvalidHandleError (it is not None: the step would skip the unscaling)."""
        where = "fp8amp_optimizer_step"
        lr_c = -1.0 if lr is None else finite_nonnegative(as_float(lr, where, "lr"), where, "lr")
        gsi = as_float(grad_scale_inv, where, "grad_scale_inv")
        s_h = handle_of(scaler, GradScaler, where, "scaler", optional=True)
        a = self._args
        a.lr, a.grad_scale_inv, a.scaler = lr_c, gsi, s_h
        try:
            check(lib.fp8amp_optimizer_step(self._h, a))
        finally:
            a.scaler = NULL  # no handle kept in the reused args between steps

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
        # bytes(5) would be five zero bytes: only a bytes-like object is a checkpoint.
        try:
            data = memoryview(data).tobytes()
        except TypeError:
            raise TypeError("fp8amp_optimizer_load: data must be a bytes-like object, not %s"
                            % type(data).__name__) from None
        check(lib.fp8amp_optimizer_load(self._h, ffi.from_buffer(data), len(data)))

    # ---- one parameter's state as tensors (docs/api.md 12.10) ------------------------------------

    _STATE_PARTS = ("exp_avg", "exp_avg_scale_inv", "exp_avg_sq", "exp_avg_sq_scale_inv", "master", "master_scale_inv",
                    "param_meta_history")

    def param_state(self, index: int) -> Dict[str, Any]:
        """fp8amp_optimizer_param_state: parameter ``index``'s state (add_param order) as a dict of
        read-only Tensor views of the optimizer's own memory, in the stored dtypes (no copy; a later
        step shows through them; they keep that memory alive): ``exp_avg`` (F32 at O1, else E4M3)
        with ``exp_avg_scale_inv`` (F32 [blocks]; absent at O1), ``exp_avg_sq`` (F32 or F16) with
        ``exp_avg_sq_scale_inv``, and for a parameter with an F16 master copy ``master`` with
        ``master_scale_inv``; plus ``step``, the optimizer's step count (an int). Each value is code *
        its block's scale_inv. For a parameter bound to a Scaling (O3's E4M3 weights), whose delayed
        scale the steps drive, also its meta's state: ``param_meta_history`` (a copy of the amax
        history, F32, newest first), ``param_meta_scale``, ``param_meta_amax`` (floats) and
        ``param_meta_updates`` (an int). A sharded optimizer raises NotSupportedError."""
        where = "fp8amp_optimizer_param_state"
        if not hasattr(lib, where):
            raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED, "%s needs libfp8amp 0.4.0 or later" % where)
        out = ffi.new("fp8amp_param_state *")
        check(lib.fp8amp_param_state_init(out, ffi.sizeof("fp8amp_param_state")))
        check(lib.fp8amp_optimizer_param_state(self._h, as_int(index, where, "index", "int32_t"), out))
        state: Dict[str, Any] = {}
        for name in self._STATE_PARTS:  # each handle becomes a Tensor at once: none can leak
            h = getattr(out, name)
            if h != NULL:
                state[name] = Tensor._new(h, self._context)
        state["step"] = int(out.step)
        if "param_meta_history" in state:
            state["param_meta_scale"] = float(out.param_meta_scale)
            state["param_meta_amax"] = float(out.param_meta_amax)
            state["param_meta_updates"] = int(out.param_meta_updates)
        return state

    def set_param_state(self, index: int, state: Mapping[str, Any]) -> None:
        """fp8amp_optimizer_set_param_state: writes parameter ``index``'s m, v and master copy from a
        mapping with param_state()'s keys (``step`` and unknown keys are ignored; set_step sets the
        step count; ``param_meta_history`` with ``param_meta_scale``, ``param_meta_amax`` and
        ``param_meta_updates`` restores a scaled parameter's meta). Each part is either exact -- the stored dtype with its ``*_scale_inv`` Tensor,
        copied bit for bit (param_state() of this or another optimizer round-trips) -- or values: an
        F32/BF16/F16 Tensor without scales, quantized with the optimizer's block scaling. Tensors are
        on the optimizer's device with the parameter's shape. Everything is validated first: a
        failure (ShapeMismatchError, DTypeMismatchError, InvalidArgumentError, ...) changes nothing."""
        where = "fp8amp_optimizer_set_param_state"
        if not hasattr(lib, where):
            raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED, "%s needs libfp8amp 0.4.0 or later" % where)
        if not hasattr(state, "get"):
            raise TypeError("%s: state must be a mapping (param_state()'s keys), not %s" % (where, type(state).__name__))
        s = ffi.new("fp8amp_param_state *")
        check(lib.fp8amp_param_state_init(s, ffi.sizeof("fp8amp_param_state")))
        for name in self._STATE_PARTS:
            setattr(s, name, handle_of(state.get(name), Tensor, where, "state[%r]" % name, optional=True))
        if state.get("param_meta_history") is not None:  # the meta's state goes with its history
            s.param_meta_scale = as_float(state.get("param_meta_scale"), where, "state['param_meta_scale']")
            s.param_meta_amax = as_float(state.get("param_meta_amax"), where, "state['param_meta_amax']")
            s.param_meta_updates = as_int(state.get("param_meta_updates"), where, "state['param_meta_updates']")
        check(lib.fp8amp_optimizer_set_param_state(self._h, as_int(index, where, "index", "int32_t"), s))

    def set_step(self, step: int) -> None:
        """fp8amp_optimizer_set_step: sets the step count (0..2^62; the next step's bias corrections
        use step + 1)."""
        where = "fp8amp_optimizer_set_step"
        if not hasattr(lib, where):
            raise NotSupportedError(lib.FP8AMP_ERROR_NOT_SUPPORTED, "%s needs libfp8amp 0.4.0 or later" % where)
        check(lib.fp8amp_optimizer_set_step(self._h, as_int(step, where, "step", "int64_t")))

    def __repr__(self) -> str:
        return "fp8amp.Optimizer(%s, %d params%s)" % ("AdamW" if self._config.adamw else "Adam", len(self._params),
                                                      ", closed" if self.closed else "")
