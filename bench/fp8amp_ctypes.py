"""What the benchmarks share: the C API's structs over ctypes, a thin library wrapper that raises on
a failed status, and CUDA-event timing. Each bench_*.py adds only its own calls.

The struct layouts mirror capi/include/fp8amp/fp8amp.h; a benchmark that uses one the header has
changed fails its first call with INVALID_ARGUMENT (struct_size) rather than reading garbage.
"""
import ctypes
import statistics

import torch

F32, F16, BF16, E4M3, E5M2 = 0, 1, 2, 3, 4
CUDA = 2
NO_MASTER = -1
AUTO, ALWAYS_FP8, NEVER_FP8 = 0, 1, 2
KIND_NAMES = {0: "none", 1: "fp8", 2: "bf16", 3: "f32"}


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int32)]


class Recipe(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("format", ctypes.c_int), ("mode", ctypes.c_int),
                ("margin", ctypes.c_int32), ("interval", ctypes.c_int32), ("amax_history_len", ctypes.c_int32),
                ("amax_algo", ctypes.c_int), ("power_of_two_scales", ctypes.c_int32)]


class LinearDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64),
                ("has_bias", ctypes.c_int32), ("weight_dtype", ctypes.c_int), ("wgrad_dtype", ctypes.c_int),
                ("recipe", Recipe), ("policy", ctypes.c_int), ("graph_replay", ctypes.c_int32)]


class AdamDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("adamw", ctypes.c_int32), ("lr", ctypes.c_float),
                ("beta1", ctypes.c_float), ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("weight_decay", ctypes.c_float), ("maximize", ctypes.c_int32), ("exp_avg_dtype", ctypes.c_int),
                ("exp_avg_sq_dtype", ctypes.c_int), ("master_dtype", ctypes.c_int32),
                ("state_block_size", ctypes.c_int32), ("max_grad_norm", ctypes.c_float)]


class StepArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("lr", ctypes.c_float), ("lr_device", ctypes.c_void_p),
                ("grad_scale_inv", ctypes.c_float), ("scaler", ctypes.c_void_p)]


class Lib:
    """The library over ctypes: lib("fp8amp_name", args...) raises RuntimeError with the library's
    message on any status but FP8AMP_SUCCESS; lib.lib is the raw CDLL for hot loops."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.fp8amp_last_error_message.restype = ctypes.c_char_p
        self.lib.fp8amp_context_create.argtypes = [Device, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.fp8amp_scaling_set_scale.argtypes = [ctypes.c_void_p, ctypes.c_float]

    def __call__(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name}: status {status}: {self.lib.fp8amp_last_error_message().decode()}")

    def context(self, stream):
        """A context on the current CUDA device, issuing on `stream` (a torch stream)."""
        ctx = ctypes.c_void_p()
        self("fp8amp_context_create", Device(CUDA, torch.cuda.current_device()), ctypes.byref(ctx))
        self.set_stream(ctx, stream)
        return ctx

    def set_stream(self, ctx, stream):
        self("fp8amp_context_set_stream", ctx, ctypes.c_void_p(stream.cuda_stream))

    def wrap(self, ctx, t, dtype):
        """A tensor handle over a torch tensor's memory (zero copy)."""
        shape = (ctypes.c_int64 * t.dim())(*t.shape)
        h = ctypes.c_void_p()
        self("fp8amp_tensor_wrap", ctx, dtype, t.dim(), shape, ctypes.c_void_p(t.data_ptr()), ctypes.byref(h))
        return h

    def scaling(self, ctx, mode=0, history=1024, dtype=E4M3, scale=None):
        """A scaling meta with the default recipe but for mode and history length; optionally a scale."""
        r = Recipe()
        self("fp8amp_recipe_init_default", ctypes.byref(r))
        r.mode = mode
        r.amax_history_len = history
        s = ctypes.c_void_p()
        self("fp8amp_scaling_create", ctx, ctypes.byref(r), dtype, ctypes.byref(s))
        if scale is not None:
            self("fp8amp_scaling_set_scale", s, ctypes.c_float(scale))
        return s


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
