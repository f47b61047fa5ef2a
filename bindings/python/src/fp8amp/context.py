"""Devices and contexts."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

from ._ffi import ffi, lib
from ._handle import Handle
from .errors import check


class Device(NamedTuple):
    """A device: type "cpu" or "cuda", and the CUDA ordinal (0 for the CPU)."""

    type: str
    index: int = 0

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
    """A Device from a Device, "cpu", "cuda", "cuda:1", or a torch.device."""
    if isinstance(d, Device):
        return d
    text = str(d)
    if text == "cpu":
        return Device("cpu", 0)
    if text == "cuda":
        return Device("cuda", 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return Device("cuda", int(text[5:]))
    raise ValueError("not a device: %r (use 'cpu', 'cuda' or 'cuda:N')" % (d,))


def device_count(device_type: str = "cuda") -> int:
    """How many devices of a type this process can use (0 GPUs without a GPU, driver or CUDA build)."""
    n = ffi.new("int32_t *")
    t = lib.FP8AMP_DEVICE_CPU if device_type == "cpu" else lib.FP8AMP_DEVICE_CUDA
    check(lib.fp8amp_device_count(t, n))
    return int(n[0])


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
        elif isinstance(stream, int):
            raw = stream
        elif hasattr(stream, "cuda_stream"):
            raw = int(stream.cuda_stream)
        elif hasattr(stream, "ptr"):
            raw = int(stream.ptr)
        else:
            raise TypeError("not a CUDA stream: %r" % (stream,))
        check(lib.fp8amp_context_set_stream(self._h, ffi.cast("void *", raw)))

    def synchronize(self) -> None:
        """Waits for all work issued through the context."""
        check(lib.fp8amp_context_synchronize(self._h))

    def __repr__(self) -> str:
        return "fp8amp.Context(%r%s)" % (str(self._device), ", closed" if self.closed else "")
