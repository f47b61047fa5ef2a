"""The FP8 Linear layer: y = x W^T + b on FP8 GEMMs, with FP8 weight gradients (docs/linear.md)."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional

from ._args import as_enum, as_int, handle_of
from ._ffi import NULL, ffi, lib
from ._handle import Handle
from .context import Context
from .dtypes import DType, as_dtype
from .errors import check
from .scaling import Recipe, Scaling
from .tensor import Tensor


class GemmPolicy(enum.IntEnum):
    """Whether a Linear runs FP8 or BF16 GEMMs (docs/linear.md section 4)."""

    AUTO = lib.FP8AMP_GEMM_AUTO
    ALWAYS_FP8 = lib.FP8AMP_GEMM_ALWAYS_FP8
    NEVER_FP8 = lib.FP8AMP_GEMM_NEVER_FP8


class GemmKind(enum.IntEnum):
    """Which GEMM the last forward ran."""

    NONE = lib.FP8AMP_GEMM_KIND_NONE
    FP8 = lib.FP8AMP_GEMM_KIND_FP8
    BF16 = lib.FP8AMP_GEMM_KIND_BF16
    F32 = lib.FP8AMP_GEMM_KIND_F32


class Role(enum.IntEnum):
    """The scaling metas of a Linear."""

    INPUT = lib.FP8AMP_ROLE_INPUT
    WEIGHT = lib.FP8AMP_ROLE_WEIGHT
    GRAD_OUTPUT = lib.FP8AMP_ROLE_GRAD_OUTPUT
    WEIGHT_GRAD = lib.FP8AMP_ROLE_WEIGHT_GRAD
    WEIGHT_STORAGE = lib.FP8AMP_ROLE_WEIGHT_STORAGE


_POLICY_NAMES = {"auto": GemmPolicy.AUTO, "fp8": GemmPolicy.ALWAYS_FP8, "always_fp8": GemmPolicy.ALWAYS_FP8,
                 "bf16": GemmPolicy.NEVER_FP8, "never_fp8": GemmPolicy.NEVER_FP8}


def _as_policy(policy: Any) -> GemmPolicy:
    return as_enum(GemmPolicy, policy, "fp8amp_linear_create", "policy", _POLICY_NAMES)


class Linear(Handle):
    """``Linear(ctx, in_features, out_features, bias=True, weight_dtype=BF16, wgrad_dtype=E4M3,
    recipe=None, policy=GemmPolicy.AUTO, graph_replay=True)``: an fp8amp_linear on ctx's device.

    ``weight``, ``bias``, ``weight_grad`` and ``bias_grad`` are Tensors sharing the Linear's memory
    (export them with DLPack for zero-copy views). ``forward(x, y, training)`` and
    ``backward(dy, dx, accumulate)`` take Tensors. The weight starts as zeros: fill it through
    ``weight`` (copy_from_numpy, cast, quantize, the optimizer); memory written any other way needs
    ``weight_changed()``. The new Linear's tensors are the library's; they stay valid after close()
    for as long as their Tensor objects live. On CUDA, ``graph_replay`` replays a call whose launches
    repeat an earlier call's as one CUDA graph launch (docs/linear.md 6.1; ``graph_replays`` counts them).
    """

    _destroy = lib.fp8amp_linear_destroy

    def __init__(self, ctx: Context, in_features: int, out_features: int, bias: bool = True,
                 weight_dtype: Any = DType.BF16, wgrad_dtype: Any = DType.E4M3, recipe: Optional[Recipe] = None,
                 policy: Any = GemmPolicy.AUTO, graph_replay: bool = True) -> None:
        ctx_h = handle_of(ctx, Context, "fp8amp_linear_create", "ctx")
        in_features = as_int(in_features, "fp8amp_linear_create", "in_features")
        out_features = as_int(out_features, "fp8amp_linear_create", "out_features")
        if recipe is not None and not isinstance(recipe, Recipe):
            raise TypeError("fp8amp_linear_create: recipe must be an fp8amp.Recipe or None, not %s"
                            % type(recipe).__name__)
        d = ffi.new("fp8amp_linear_desc *")
        check(lib.fp8amp_linear_desc_init(d, ffi.sizeof("fp8amp_linear_desc")))
        d.in_features = in_features
        d.out_features = out_features
        d.has_bias = 1 if bias else 0
        d.weight_dtype = as_dtype(weight_dtype)
        d.wgrad_dtype = as_dtype(wgrad_dtype)
        self._recipe = dataclasses.replace(recipe) if recipe is not None else Recipe()
        d.recipe = self._recipe._c()[0]
        d.policy = int(_as_policy(policy))
        d.graph_replay = 1 if graph_replay else 0
        out = ffi.new("fp8amp_linear *")
        check(lib.fp8amp_linear_create(ctx_h, d, out))
        super().__init__(out[0])
        self._context = ctx
        self.in_features, self.out_features, self.has_bias = int(in_features), int(out_features), bool(bias)
        self._tensors = {}  # name -> Tensor, made once: the handles are cheap but calls are not
        # Reused out-parameter for the hot path (one fewer allocation per call).
        self._kind = ffi.new("fp8amp_gemm_kind *")

    @classmethod
    def for_level(cls, ctx: Context, level: Any, in_features: int, out_features: int, bias: bool = True,
                  recipe: Optional[Recipe] = None, policy: Any = GemmPolicy.AUTO) -> "Linear":
        """A Linear with the weight and weight-gradient dtypes of an optimization level ("O1", "O2",
        "O3"), as the C library's fp8amp_opt_level_init gives them (its Adam half is
        ``AdamConfig.for_level``)."""
        from .optim import as_opt_level  # optim imports this module
        handle_of(ctx, Context, "fp8amp_linear_create", "ctx")
        d = ffi.new("fp8amp_linear_desc *")
        check(lib.fp8amp_opt_level_init(int(as_opt_level(level)), d, ffi.sizeof("fp8amp_linear_desc"), NULL, 0))
        return cls(ctx, in_features, out_features, bias=bias, weight_dtype=DType(d.weight_dtype),
                   wgrad_dtype=DType(d.wgrad_dtype), recipe=recipe, policy=policy)

    @property
    def context(self) -> Context:
        return self._context

    @property
    def graph_replays(self) -> int:
        """How many forward and backward calls so far ran as one CUDA graph launch (0 on the CPU)."""
        out = ffi.new("uint64_t *")
        check(lib.fp8amp_linear_graph_replays(self._h, out))
        return int(out[0])

    @property
    def recipe(self) -> Recipe:
        return dataclasses.replace(self._recipe)

    def _tensor(self, name: str, getter: Any) -> Tensor:
        t = self._tensors.get(name)
        if t is None:
            out = ffi.new("fp8amp_tensor *")
            check(getter(self._h, out))
            t = Tensor._new(out[0], self._context)
            self._tensors[name] = t
        return t

    @property
    def weight(self) -> Tensor:
        """The weight [out, in] of weight_dtype."""
        return self._tensor("weight", lib.fp8amp_linear_weight)

    @property
    def bias(self) -> Optional[Tensor]:
        """The F32 bias [out], or None without one."""
        return self._tensor("bias", lib.fp8amp_linear_bias) if self.has_bias else None

    @property
    def weight_grad(self) -> Tensor:
        """The weight gradient [out, in] of wgrad_dtype (E4M3: bound to the WEIGHT_GRAD meta)."""
        return self._tensor("weight_grad", lib.fp8amp_linear_weight_grad)

    @property
    def bias_grad(self) -> Tensor:
        """The F32 bias gradient [out]."""
        return self._tensor("bias_grad", lib.fp8amp_linear_bias_grad)

    def scaling(self, role: Any) -> Scaling:
        """A Scaling object for one of the Linear's metas (a new handle sharing the meta)."""
        role = as_enum(Role, role, "fp8amp_linear_scaling", "role")
        out = ffi.new("fp8amp_scaling *")
        check(lib.fp8amp_linear_scaling(self._h, int(role), out))
        if role in (Role.INPUT, Role.WEIGHT, Role.WEIGHT_GRAD):
            dtype = DType.E4M3
        elif role == Role.GRAD_OUTPUT:
            dtype = DType.E5M2 if self._recipe.format.name == "HYBRID" else DType.E4M3
        else:
            dtype = self.weight.dtype
        return Scaling._wrap(out[0], self._context, self._recipe, dtype)

    def weight_changed(self) -> None:
        """The weight was written behind the library's back (e.g. through a DLPack view): the next
        forward re-quantizes it."""
        check(lib.fp8amp_linear_weight_changed(self._h))

    def forward(self, x: Tensor, y: Tensor, training: bool = False) -> None:
        """y = x W^T + b (x [..., in], y [..., out]; F32, F16 or BF16). With training, x is kept (in
        FP8 on the FP8 path) for the next backward."""
        x_h = handle_of(x, Tensor, "fp8amp_linear_forward", "x")
        y_h = handle_of(y, Tensor, "fp8amp_linear_forward", "y")
        check(lib.fp8amp_linear_forward(self._h, x_h, y_h, 1 if training else 0))

    def choose_gemm(self, rows: int, training: bool = True) -> "GemmKind":
        """The GEMM a forward of ``rows`` rows of a wide input would run now: the policy's choice for
        this shape and device (fp8amp_linear_choose_gemm). A fused front asks it before letting a norm
        write the input in FP8 (forward_fp8), so that AUTO keeps its wide GEMMs where FP8 does not pay."""
        out = ffi.new("fp8amp_gemm_kind *")
        rows = as_int(rows, "fp8amp_linear_choose_gemm", "rows")
        check(lib.fp8amp_linear_choose_gemm(self._h, rows, 1 if training else 0, out))
        return GemmKind(out[0])

    def forward_fp8(self, x8: Tensor, y: Tensor, training: bool = False) -> None:
        """y = x8 W^T + b from an E4M3 x8 the caller quantized -- typically a fused norm or activation
        writing into a tensor bound to ``self.scaling(Role.INPUT)`` -- read with x8's own scale_inv.
        With training the Linear keeps its own transposed copy of x8 for the next backward, so x8 may be
        overwritten after the call (fp8amp_linear_forward_fp8)."""
        x_h = handle_of(x8, Tensor, "fp8amp_linear_forward_fp8", "x8")
        y_h = handle_of(y, Tensor, "fp8amp_linear_forward_fp8", "y")
        check(lib.fp8amp_linear_forward_fp8(self._h, x_h, y_h, 1 if training else 0))

    def backward(self, dy: Tensor, dx: Optional[Tensor] = None, accumulate: bool = False) -> None:
        """The backward of the last training forward: dx (None skips it), and the weight and bias
        gradients, overwritten (accumulate False) or added to (micro-batches; the sum is FP32). A closed
        dx raises InvalidHandleError (it is not None) and changes nothing."""
        dy_h = handle_of(dy, Tensor, "fp8amp_linear_backward", "dy")
        dx_h = handle_of(dx, Tensor, "fp8amp_linear_backward", "dx", optional=True)
        check(lib.fp8amp_linear_backward(self._h, dy_h, dx_h, 1 if accumulate else 0))

    def release_buffers(self) -> None:
        """Gives back what the Linear keeps between calls beyond its parameters and gradients (the
        weight's FP8/16-bit copies, a backed forward's saved input, the FP32 weight-gradient sum), for
        a step boundary; an accumulating backward after it adds to the delivered gradient's value
        (fp8amp_linear_release_buffers)."""
        check(lib.fp8amp_linear_release_buffers(self._h))

    @property
    def lean(self) -> int:
        """Lean buffers (fp8amp_linear_set_lean): 0 (default) off; 1: a training forward's FP8 weight
        comes from the context's scratch and the backward re-makes its transpose from the weight, then
        gives back the saved input (bit-identical outputs; the backward refuses to compute dx after the
        weight was written since its forward); 2: also, a non-accumulating backward keeps no FP32
        weight-gradient sum (a later accumulating one adds to the delivered gradient, one rounding
        more). Lowers the training peak (docs/linear.md section 5)."""
        out = ffi.new("int32_t *")
        check(lib.fp8amp_linear_get_lean(self._h, out))
        return int(out[0])

    @lean.setter
    def lean(self, level: int) -> None:
        if isinstance(level, bool):
            level = int(level)
        check(lib.fp8amp_linear_set_lean(self._h, level))

    @property
    def memory_bytes(self) -> int:
        """The bytes of the context's memory the Linear's own tensors hold now: parameters, gradients
        and the buffers it keeps between calls (fp8amp_linear_memory_bytes)."""
        out = ffi.new("size_t *")
        check(lib.fp8amp_linear_memory_bytes(self._h, out))
        return int(out[0])

    @property
    def gemm_kind(self) -> GemmKind:
        """The GEMM the last forward ran (NONE before any)."""
        check(lib.fp8amp_linear_gemm_kind(self._h, self._kind))
        return GemmKind(self._kind[0])

    def __repr__(self) -> str:
        return "fp8amp.Linear(%d, %d, bias=%s%s)" % (self.in_features, self.out_features, self.has_bias,
                                                    ", closed" if self.closed else "")
