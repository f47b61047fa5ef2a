"""The base of every class that owns a C handle (Context, Tensor, Scaling; later Linear, Optimizer,
GradScaler, Communicator).

A handle is destroyed exactly once: by ``close()``, by leaving a ``with`` block, or by a finalizer
when the object is garbage collected (or at interpreter exit). After ``close()`` the object holds
NULL, so any further method call reaches the C library with a NULL handle and raises
InvalidHandleError with the library's own message; ``close()`` again does nothing. Where an object
is an *argument*, its handle is taken through ``_args.handle_of``, never ``.handle``: a C function
with an optional handle reads NULL as "absent", so a closed object must be refused before the call.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from ._ffi import NULL
from .errors import check


def _destroy_quietly(destroy: Callable[[Any], int], handle: Any) -> None:
    # A finalizer cannot raise usefully; a destroy of a live handle does not fail in practice.
    destroy(handle)


class Handle:
    """Owns one C handle; subclasses set ``_destroy`` to the C destroy function."""

    _destroy: Callable[[Any], int]

    def __init__(self, handle: Any) -> None:
        self._h = handle
        self._finalizer = weakref.finalize(self, _destroy_quietly, type(self)._destroy, handle)

    @property
    def handle(self) -> Any:
        """The C handle (a cffi pointer), NULL once closed. Borrowed: do not destroy it."""
        return self._h

    @property
    def closed(self) -> bool:
        return self._h == NULL

    def close(self) -> None:
        """Destroys the C object now. Idempotent."""
        if self._finalizer.detach() is not None:
            handle, self._h = self._h, NULL
            check(type(self)._destroy(handle))

    def _no_copy(self, *args: Any) -> Any:
        # A copy would share the handle without owning it: closing either would leave the other
        # holding a destroyed handle while it reports closed == False. There is no C copy to call.
        raise TypeError("fp8amp.%s owns a C handle and cannot be copied or pickled" % type(self).__name__)

    __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _no_copy

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
