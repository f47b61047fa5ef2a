"""What the benchmarks share: the C API through the fp8amp package's CFFI module built against the
library given with --lib (bindings/python/binding_for.py), a thin wrapper that raises on a failed
status, and CUDA-event timing. Each bench_*.py adds only its own calls.

Structs are made with ffi.new from the public header's own declarations and constants come from the
header through the module (C.BF16, C.ALWAYS_FP8, ...: filled when Lib is made), so nothing here
mirrors the header by hand.
"""
import os
import statistics
import sys
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
from binding_for import import_fp8amp  # noqa: E402

#: The header's constants the benchmarks use, set by Lib(): F32, F16, BF16, E4M3, E5M2, CUDA,
#: NO_MASTER, AUTO, ALWAYS_FP8, NEVER_FP8, KIND_NAMES (fp8amp_gemm_kind -> "fp8", "bf16", ...).
C = types.SimpleNamespace()


class Lib:
    """The library through CFFI: lib("fp8amp_name", args...) raises RuntimeError with the library's
    message on any status but FP8AMP_SUCCESS; lib.lib is the raw CFFI lib for hot loops, lib.ffi its
    FFI (lib.new("fp8amp_linear_desc *") etc.)."""

    def __init__(self, path):
        self.fp8amp = import_fp8amp(path)
        self.ffi, self.lib = self.fp8amp._ffi, self.fp8amp._lib
        L = self.lib
        C.F32, C.F16, C.BF16 = L.FP8AMP_DTYPE_F32, L.FP8AMP_DTYPE_F16, L.FP8AMP_DTYPE_BF16
        C.E4M3, C.E5M2 = L.FP8AMP_DTYPE_E4M3, L.FP8AMP_DTYPE_E5M2
        C.CUDA, C.NO_MASTER = L.FP8AMP_DEVICE_CUDA, L.FP8AMP_NO_MASTER
        C.AUTO, C.ALWAYS_FP8, C.NEVER_FP8 = L.FP8AMP_GEMM_AUTO, L.FP8AMP_GEMM_ALWAYS_FP8, L.FP8AMP_GEMM_NEVER_FP8
        C.KIND_NAMES = {L.FP8AMP_GEMM_KIND_NONE: "none", L.FP8AMP_GEMM_KIND_FP8: "fp8",
                        L.FP8AMP_GEMM_KIND_BF16: "bf16", L.FP8AMP_GEMM_KIND_F32: "f32"}

    def __call__(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != self.lib.FP8AMP_SUCCESS:
            msg = self.ffi.string(self.lib.fp8amp_last_error_message()).decode()
            raise RuntimeError(f"{name}: status {status}: {msg}")

    def new(self, ctype, init=None):
        return self.ffi.new(ctype, init)

    def init(self, struct):
        """A struct of the header's type `struct` (e.g. "fp8amp_adam_desc"), filled by its sized init
        function (fp8amp_<name>_init, the function the header's ..._init_default macro calls)."""
        p = self.ffi.new(struct + " *")
        name = {"fp8amp_adam_step_args": "fp8amp_adam_step_args_init"}.get(struct, struct + "_init")
        self(name, p, self.ffi.sizeof(struct))
        return p

    def context(self, stream):
        """A context on the current CUDA device, issuing on `stream` (a torch stream)."""
        ctx = self.ffi.new("fp8amp_context *")
        self("fp8amp_context_create", {"type": C.CUDA, "index": torch.cuda.current_device()}, ctx)
        self.set_stream(ctx[0], stream)
        return ctx[0]

    def set_stream(self, ctx, stream):
        self("fp8amp_context_set_stream", ctx, self.ffi.cast("void *", stream.cuda_stream))

    def wrap(self, ctx, t, dtype):
        """A tensor handle over a torch tensor's memory (zero copy)."""
        h = self.ffi.new("fp8amp_tensor *")
        self("fp8amp_tensor_wrap", ctx, dtype, t.dim(), self.ffi.new("int64_t[]", list(t.shape)),
             self.ffi.cast("void *", t.data_ptr()), h)
        return h[0]

    def scaling(self, ctx, mode=0, history=1024, dtype=None, scale=None):
        """A scaling meta (E4M3 unless dtype) with the default recipe but for mode and history length;
        optionally a scale."""
        r = self.init("fp8amp_recipe")
        r.mode = mode
        r.amax_history_len = history
        s = self.ffi.new("fp8amp_scaling *")
        self("fp8amp_scaling_create", ctx, r, C.E4M3 if dtype is None else dtype, s)
        if scale is not None:
            self("fp8amp_scaling_set_scale", s[0], scale)
        return s[0]


def bench(fn, rotations=None, warmup=3, reps=20, backlog_cycles=1_000_000, prep=None):
    """Median milliseconds of fn() -- or of fn(i) with i cycling over `rotations` input buffers --
    timed with CUDA events. A sleep kernel queued before each timed region keeps the host enqueueing
    off the clock, so the events time the GPU work. prep(i), if given, runs before every call
    (warm-up and timed), off the clock: new inputs for call i."""
    call = fn if rotations is None else None
    for i in range(warmup):
        if prep:
            prep(i)
        fn() if call else fn(i % rotations)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if prep:
            prep(warmup + i)
        torch.cuda._sleep(backlog_cycles)
        start.record()
        fn() if call else fn(i % rotations)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
