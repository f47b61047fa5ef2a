"""Devices and contexts."""
from __future__ import annotations

import dataclasses
import operator
import sys
import threading
from typing import Any, Callable, Dict, Optional, Union

from ._ffi import NULL, ffi, lib
from ._args import as_int
from ._handle import Handle
from .errors import InvalidArgumentError, check


@dataclasses.dataclass(frozen=True)
class Device:
    """A device: type "cpu" or "cuda", and the CUDA ordinal (0 for the CPU)."""

    type: str
    index: int = 0

    def __post_init__(self) -> None:
        # Checked here, not only by the library: _c() maps the type to the C enum, and an unknown
        # type must not become CUDA silently.
        if not isinstance(self.type, str):
            raise TypeError("fp8amp_device: type must be a str ('cpu' or 'cuda'), not %s" % type(self.type).__name__)
        if self.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                       "fp8amp_device: type %r is not a device type ('cpu' or 'cuda')" % (self.type,))
        index = as_int(self.index, "fp8amp_device", "index", "int32_t")
        if index < 0:
            raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                       "fp8amp_device: index %d is negative" % index)
        object.__setattr__(self, "index", index)

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else "cuda:%d" % self.index

    def _c(self) -> Any:
        d = ffi.new("fp8amp_device *")
        d.type = lib.FP8AMP_DEVICE_CPU if self.type == "cpu" else lib.FP8AMP_DEVICE_CUDA
        d.index = self.index
        return d[0]

    @staticmethod
    def _from_c(d: Any) -> "Device":
        return Device("cpu" if d.type == lib.FP8AMP_DEVICE_CPU else "cuda", int(d.index))


DeviceLike = Union[Device, str, Any]


def as_device(d: DeviceLike) -> Device:
    """A Device from a Device, "cpu", "cuda", "cuda:1", or a torch.device (anything else: TypeError;
    a string that names no device: InvalidArgumentError)."""
    if isinstance(d, Device):
        return d
    if not isinstance(d, str) and type(d).__name__ != "device":  # torch.device, without importing torch
        raise TypeError("fp8amp_context_create: device must be a Device, a str ('cpu', 'cuda', 'cuda:N') or a "
                        "torch.device, not %s" % type(d).__name__)
    text = str(d)
    if text == "cpu":
        return Device("cpu", 0)
    if text == "cuda":
        return Device("cuda", 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return Device("cuda", int(text[5:]))
    raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                               "fp8amp_context_create: device %r is not a device (use 'cpu', 'cuda' or 'cuda:N')"
                               % (text,))


def device_count(device_type: str = "cuda") -> int:
    """How many devices of a type this process can use (0 GPUs without a GPU, driver or CUDA build)."""
    n = ffi.new("int32_t *")
    if device_type not in ("cpu", "cuda"):
        if not isinstance(device_type, str):
            raise TypeError("fp8amp_device_count: device_type must be a str, not %s" % type(device_type).__name__)
        raise InvalidArgumentError(lib.FP8AMP_ERROR_INVALID_ARGUMENT,
                                   "fp8amp_device_count: device_type %r is not 'cpu' or 'cuda'" % (device_type,))
    t = lib.FP8AMP_DEVICE_CPU if device_type == "cpu" else lib.FP8AMP_DEVICE_CUDA
    check(lib.fp8amp_device_count(t, n))
    return int(n[0])


AllocFn = Callable[[int, "Device", int], int]
FreeFn = Callable[[int, int, "Device", int], None]


class _Allocator:
    """A pair of Python allocation hooks and the cffi handle the C hooks get as user_data. It stays
    alive while a Context uses it or any block it allocated is still live (the C library frees each
    block through the hooks that allocated it, possibly after the context is gone)."""

    def __init__(self, alloc: AllocFn, free: FreeFn) -> None:
        self.alloc, self.free = alloc, free
        self.live = 0
        self.handle = ffi.new_handle(self)


_LIVE: Dict[int, _Allocator] = {}  # allocators with blocks outstanding, by id
_LIVE_LOCK = threading.Lock()


def _alloc_failed(exc_type, exc, tb) -> None:
    # An exception in the hook: report it and answer NULL, which the library turns into
    # OUT_OF_MEMORY for the call that wanted memory.
    sys.stderr.write("fp8amp: the allocation hook raised %s: %s\n" % (exc_type.__name__, exc))
    return None


@ffi.def_extern(onerror=_alloc_failed)
def fp8amp_py_alloc(user_data, nbytes, device, stream):
    a: _Allocator = ffi.from_handle(user_data)
    ptr = a.alloc(int(nbytes), Device._from_c(device), int(ffi.cast("uintptr_t", stream)))
    if ptr is None or ptr == 0:
        return NULL
    # Only an int address reaches the library: int(1.5) would be 1, and a negative int cast to a
    # pointer is an address near 2**64 that the library would write to. Raising here answers NULL
    # (onerror), so the call raises OutOfMemoryError; what the hook returned is not freed (it is
    # no block this binding can name).
    address = operator.index(ptr)
    if not 0 < address < 2**64:
        raise ValueError("it returned %d, which is not an address" % address)
    with _LIVE_LOCK:
        a.live += 1
        _LIVE[id(a)] = a
    return ffi.cast("void *", address)


@ffi.def_extern()
def fp8amp_py_free(user_data, ptr, nbytes, device, stream):
    a: _Allocator = ffi.from_handle(user_data)
    try:
        a.free(int(ffi.cast("uintptr_t", ptr)), int(nbytes), Device._from_c(device), int(ffi.cast("uintptr_t", stream)))
    finally:
        with _LIVE_LOCK:
            a.live -= 1
            if a.live == 0:
                _LIVE.pop(id(a), None)


class Context(Handle):
    """A device, a stream and an allocator: every operation runs through one.

    ``Context("cpu")``, ``Context("cuda")``, ``Context("cuda:1")``. A context is used by one thread at
    a time; tensors and metas keep what they need of it alive, so closing it first is safe.
    """

    _destroy = lib.fp8amp_context_destroy

    def __init__(self, device: DeviceLike = "cpu") -> None:
        dev = as_device(device)
        out = ffi.new("fp8amp_context *")
        check(lib.fp8amp_context_create(dev._c(), out))
        super().__init__(out[0])
        self._device = dev

    @property
    def device(self) -> Device:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def stream(self) -> int:
        """The borrowed cudaStream_t as an int (0: the default stream, and always on the CPU)."""
        out = ffi.new("void **")
        check(lib.fp8amp_context_get_stream(self._h, out))
        return int(ffi.cast("uintptr_t", out[0]))

    def set_stream(self, stream: Optional[Any]) -> None:
        """Runs later operations on a borrowed CUDA stream: an int handle, None (default stream), or
        an object with ``cuda_stream`` (torch.cuda.Stream, cupy's Stream) or ``ptr``. The caller keeps
        the stream alive while the context uses it."""
        if stream is None:
            raw = 0
        elif hasattr(stream, "cuda_stream"):
            raw = as_int(stream.cuda_stream, "fp8amp_context_set_stream", "stream.cuda_stream", "uintptr_t")
        elif hasattr(stream, "ptr"):
            raw = as_int(stream.ptr, "fp8amp_context_set_stream", "stream.ptr", "uintptr_t")
        else:
            try:
                raw = as_int(stream, "fp8amp_context_set_stream", "stream", "uintptr_t")
            except TypeError:
                raise TypeError("fp8amp_context_set_stream: stream must be None, an int handle or a stream object "
                                "(cuda_stream or ptr), not %s" % type(stream).__name__) from None
        check(lib.fp8amp_context_set_stream(self._h, ffi.cast("void *", raw)))

    def set_allocator(self, alloc: Optional[AllocFn], free: Optional[FreeFn]) -> None:
        """Routes every later allocation of this context (tensors, metas, workspaces) through Python
        hooks, e.g. a framework's caching allocator; (None, None) restores the built-in allocator.

        ``alloc(nbytes, device, stream) -> address`` returns memory on `device` aligned to 256
        bytes, usable on `stream` (an int cudaStream_t), or 0 when it cannot (the call that wanted
        memory then raises OutOfMemoryError; so does an exception in the hook).
        ``free(address, nbytes, device, stream)`` releases a block. Each block is freed through the
        hooks that allocated it, also after they were replaced or the context was closed. The hooks
        must not call fp8amp. A hook that is not callable raises TypeError here, not at the first
        allocation."""
        for name, fn in (("alloc", alloc), ("free", free)):
            if fn is not None and not callable(fn):
                raise TypeError("fp8amp_context_set_allocator: %s must be callable or None, not %s"
                                % (name, type(fn).__name__))
        if (alloc is None) != (free is None):
            check(lib.fp8amp_context_set_allocator(self._h, lib.fp8amp_py_alloc if alloc else NULL,
                                                   lib.fp8amp_py_free if free else NULL, NULL))
        if alloc is None:
            check(lib.fp8amp_context_set_allocator(self._h, NULL, NULL, NULL))
            self._allocator = None
            return
        a = _Allocator(alloc, free)  # type: ignore[arg-type]
        check(lib.fp8amp_context_set_allocator(self._h, lib.fp8amp_py_alloc, lib.fp8amp_py_free, a.handle))
        self._allocator = a  # blocks already allocated keep their own allocator alive through _LIVE

    def synchronize(self) -> None:
        """Waits for all work issued through the context."""
        check(lib.fp8amp_context_synchronize(self._h))

    def scratch_bytes(self) -> int:
        """The bytes of the scratch pool its Linears share (fp8amp_context_scratch_bytes)."""
        out = ffi.new("size_t *")
        check(lib.fp8amp_context_scratch_bytes(self._h, out))
        return int(out[0])

    def release_scratch(self) -> None:
        """Gives the scratch pool and the GEMM workspace back to the allocator, in the order of the
        stream they were allocated on: no host wait unless the context's stream changed since
        (fp8amp_context_release_scratch); the next call that needs them allocates them again."""
        check(lib.fp8amp_context_release_scratch(self._h))

    def __repr__(self) -> str:
        return "fp8amp.Context(%r%s)" % (str(self._device), ", closed" if self.closed else "")
