"""Recipes and scaling metas (delayed scaling with an amax history, current scaling)."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple, Optional, Sequence

from ._args import as_enum, as_float, as_int, handle_of
from ._ffi import ffi, lib
from ._handle import Handle
from .context import Context
from .dtypes import DType, as_dtype
from .errors import check


class Format(enum.IntEnum):
    """Which FP8 dtype each role of an FP8 Linear gets (a scaling meta has one dtype of its own)."""

    E4M3 = lib.FP8AMP_FORMAT_E4M3
    HYBRID = lib.FP8AMP_FORMAT_HYBRID


class ScalingMode(enum.IntEnum):
    DELAYED = lib.FP8AMP_SCALING_DELAYED
    CURRENT = lib.FP8AMP_SCALING_CURRENT


class AmaxAlgo(enum.IntEnum):
    MAX = lib.FP8AMP_AMAX_MAX
    MOST_RECENT = lib.FP8AMP_AMAX_MOST_RECENT


def _c_defaults() -> Any:
    r = ffi.new("fp8amp_recipe *")
    check(lib.fp8amp_recipe_init(r, ffi.sizeof("fp8amp_recipe")))
    return r


_DEFAULT = _c_defaults()  # the library's defaults (fp8amp_recipe_init), not copies of them


@dataclasses.dataclass
class Recipe:
    """How scales are chosen: scale = format_max / 2**margin / amax, amax from the history by
    amax_algo; see fp8amp_recipe. Defaults are the library's. Validated when a Scaling is made."""

    format: Format = Format(_DEFAULT.format)
    mode: ScalingMode = ScalingMode(_DEFAULT.mode)
    margin: int = int(_DEFAULT.margin)
    interval: int = int(_DEFAULT.interval)
    amax_history_len: int = int(_DEFAULT.amax_history_len)
    amax_algo: AmaxAlgo = AmaxAlgo(_DEFAULT.amax_algo)
    power_of_two_scales: bool = bool(_DEFAULT.power_of_two_scales)

    def _c(self) -> Any:
        r = ffi.new("fp8amp_recipe *")
        # struct_size, and any field this class does not know, from the library's defaults
        check(lib.fp8amp_recipe_init(r, ffi.sizeof("fp8amp_recipe")))
        # Integers as they are (the library checks the enums' and fields' ranges); a value the C field
        # cannot hold is refused here rather than truncated, a non-integer is a TypeError.
        r.format = as_enum(Format, self.format, "fp8amp_recipe", "format")
        r.mode = as_enum(ScalingMode, self.mode, "fp8amp_recipe", "mode")
        r.amax_algo = as_enum(AmaxAlgo, self.amax_algo, "fp8amp_recipe", "amax_algo")
        for field in ("margin", "interval", "amax_history_len"):
            setattr(r, field, as_int(getattr(self, field), "fp8amp_recipe", field, "int32_t"))
        r.power_of_two_scales = 1 if self.power_of_two_scales else 0
        return r


class ScaleState(NamedTuple):
    scale: float
    scale_inv: float
    amax: float  # recorded since the last update


class Stats(NamedTuple):
    quantized: int
    saturated: int
    underflowed: int


class Scaling(Handle):
    """A scaling meta for tensors of one scaled dtype (E4M3, E5M2, or F16: a scaled 16-bit format
    saturating at 65504) on ctx's device: scale, scale_inv, recorded amax, amax history, counters."""

    _destroy = lib.fp8amp_scaling_destroy

    def __init__(self, ctx: Context, recipe: Optional[Recipe] = None, dtype: Any = DType.E4M3) -> None:
        ctx_h = handle_of(ctx, Context, "fp8amp_scaling_create", "ctx")
        if recipe is not None and not isinstance(recipe, Recipe):
            raise TypeError("fp8amp_scaling_create: recipe must be an fp8amp.Recipe or None, not %s"
                            % type(recipe).__name__)
        self._recipe = dataclasses.replace(recipe) if recipe is not None else Recipe()
        self._dtype = as_dtype(dtype)
        out = ffi.new("fp8amp_scaling *")
        check(lib.fp8amp_scaling_create(ctx_h, self._recipe._c(), self._dtype, out))
        super().__init__(out[0])
        self._context = ctx

    @classmethod
    def _wrap(cls, handle: Any, ctx: Context, recipe: Recipe, dtype: DType) -> "Scaling":
        """Owns a meta handle the library made (e.g. fp8amp_linear_scaling's), described by
        `recipe` and `dtype` (the library has no getter for them)."""
        s = cls.__new__(cls)
        s._recipe = dataclasses.replace(recipe)
        s._dtype = dtype
        Handle.__init__(s, handle)
        s._context = ctx
        return s

    @property
    def recipe(self) -> Recipe:
        return dataclasses.replace(self._recipe)

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def context(self) -> Context:
        return self._context

    def update(self) -> None:
        """Folds the recorded amax into the history and (every interval-th time) computes the scale."""
        check(lib.fp8amp_scaling_update(self._h))

    def get(self) -> ScaleState:
        """scale, scale_inv and the amax recorded since the last update (synchronizes)."""
        v = ffi.new("float[3]")
        check(lib.fp8amp_scaling_get(self._h, v, v + 1, v + 2))
        return ScaleState(float(v[0]), float(v[1]), float(v[2]))

    @property
    def scale(self) -> float:
        return self.get().scale

    @property
    def scale_inv(self) -> float:
        return self.get().scale_inv

    @property
    def amax(self) -> float:
        return self.get().amax

    def amax_tensor(self) -> Any:
        """The amax recorded since the last update where it lives (fp8amp_scaling_amax_tensor): a
        read-only F32 scalar Tensor sharing the meta's memory, live (later recordings and updates show
        through it) and valid past this meta's close. A NaN or an inf recorded reads as +inf. Read it on
        the device (through DLPack) where ``amax`` would wait for the device."""
        from .tensor import Tensor  # tensor.py imports this module

        out = ffi.new("fp8amp_tensor *")
        check(lib.fp8amp_scaling_amax_tensor(self._h, out))
        return Tensor._new(out[0], self._context)

    def history(self) -> Any:
        """The amax history, newest first, as a float32 NumPy array."""
        import numpy as np

        out = np.empty(self._recipe.amax_history_len, dtype=np.float32)
        check(lib.fp8amp_scaling_get_history(self._h, out.size, ffi.cast("float *", out.ctypes.data)))
        return out

    def set_scale(self, scale: float) -> None:
        """Sets scale (and scale_inv = 1/scale); scale must be a normal float > 0."""
        check(lib.fp8amp_scaling_set_scale(self._h, as_float(scale, "fp8amp_scaling_set_scale", "scale")))

    def enable_stats(self, enable: bool = True) -> None:
        check(lib.fp8amp_scaling_enable_stats(self._h, 1 if enable else 0))

    def stats(self) -> Stats:
        s = ffi.new("fp8amp_scaling_stats *")
        check(lib.fp8amp_scaling_get_stats(self._h, s))
        return Stats(int(s.quantized), int(s.saturated), int(s.underflowed))

    def reset_stats(self) -> None:
        check(lib.fp8amp_scaling_reset_stats(self._h))

    def __repr__(self) -> str:
        return "fp8amp.Scaling(%s, %s%s)" % (self._dtype.short_name, self._recipe.mode.name,
                                             ", closed" if self.closed else "")


def update_many(ctx: Context, metas: Sequence[Scaling]) -> None:
    """fp8amp_scaling_update of every meta in one launch (per 1024 metas) on ctx's stream."""
    ctx_h = handle_of(ctx, Context, "fp8amp_scaling_update_many", "ctx")
    try:
        metas = list(metas)
    except TypeError:
        raise TypeError("fp8amp_scaling_update_many: metas must be a sequence of fp8amp.Scaling, not %s"
                        % type(metas).__name__) from None
    handles = ffi.new("fp8amp_scaling[]", [handle_of(m, Scaling, "fp8amp_scaling_update_many", "metas[%d]" % i)
                                           for i, m in enumerate(metas)] or [ffi.NULL])
    check(lib.fp8amp_scaling_update_many(ctx_h, len(metas), handles))
