"""Communicators (docs/communicator.md): FP8 gradient all-reduce of a bucket, reduce-scatter and
all-gather, over MPI (CPU contexts) or NCCL (CUDA contexts); one rank needs neither.

The unique id is 128 bytes made on one rank and given to every rank by the caller's own channel
(torch.distributed.broadcast_object_list, mpi4py's bcast, a file)::

    uid = fp8amp.Communicator.unique_id(ctx) if rank == 0 else None
    uid = comm_world.bcast(uid, root=0)                      # mpi4py, for example
    with fp8amp.Communicator(ctx, uid, nranks, rank) as comm:
        comm.all_reduce([g1, g2], [g1, g2])                  # in place, mean over ranks
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ._args import as_float, as_int, handle_of
from ._ffi import NULL, ffi, lib
from ._handle import Handle
from .context import Context
from .dtypes import DType, as_dtype
from .errors import check
from .tensor import Tensor

UNIQUE_ID_BYTES = 128


def _desc(where: str, wire_dtype: Any = DType.E4M3, average: bool = True, check_args: bool = True) -> Any:
    d = ffi.new("fp8amp_comm_reduce_desc *")
    check(lib.fp8amp_comm_reduce_desc_init(d, ffi.sizeof("fp8amp_comm_reduce_desc")))
    d.wire_dtype = as_dtype(wire_dtype)
    for name, value in (("average", average), ("check", check_args)):
        if not isinstance(value, bool):
            raise TypeError("%s: %s must be a bool, not %s" % (where, name, type(value).__name__))
    d.average = int(average)
    d.check = int(check_args)
    return d


class Communicator(Handle):
    """This process's rank of an nranks communicator on ctx's device (fp8amp_comm_create), or an
    adopted one (``Communicator.adopt``)."""

    _destroy = lib.fp8amp_comm_destroy

    @staticmethod
    def unique_id(ctx: Context) -> bytes:
        """A new id (fp8amp_comm_unique_id_create) for a communicator on ctx's device type."""
        ctx_h = handle_of(ctx, Context, "Communicator.unique_id", "ctx")
        out = ffi.new("fp8amp_comm_unique_id *")
        check(lib.fp8amp_comm_unique_id_create(ctx_h, out))
        return bytes(ffi.buffer(out))

    def __init__(self, ctx: Context, unique_id: bytes, nranks: int, rank: int) -> None:
        ctx_h = handle_of(ctx, Context, "fp8amp_comm_create", "ctx")
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != UNIQUE_ID_BYTES:
            raise TypeError("fp8amp_comm_create: unique_id must be the %d bytes of Communicator.unique_id"
                            % UNIQUE_ID_BYTES)
        uid = ffi.new("fp8amp_comm_unique_id *")
        ffi.memmove(uid, bytes(unique_id), UNIQUE_ID_BYTES)
        out = ffi.new("fp8amp_comm *")
        check(lib.fp8amp_comm_create(ctx_h, uid, as_int(nranks, "fp8amp_comm_create", "nranks", "int32_t"),
                                     as_int(rank, "fp8amp_comm_create", "rank", "int32_t"), out))
        super().__init__(out[0])
        self._context = ctx

    @classmethod
    def adopt(cls, ctx: Context, native_address: int) -> "Communicator":
        """Adopts an ncclComm_t (its value, for a CUDA context) or an MPI_Comm (the address of one, for
        a CPU context), as fp8amp_comm_adopt."""
        ctx_h = handle_of(ctx, Context, "fp8amp_comm_adopt", "ctx")
        out = ffi.new("fp8amp_comm *")
        check(lib.fp8amp_comm_adopt(ctx_h, ffi.cast("void *", as_int(native_address, "fp8amp_comm_adopt", "native",
                                                                      "uintptr_t")), out))
        c = cls.__new__(cls)
        Handle.__init__(c, out[0])
        c._context = ctx
        return c

    @property
    def context(self) -> Context:
        return self._context

    @property
    def rank(self) -> int:
        out = ffi.new("int32_t *")
        check(lib.fp8amp_comm_rank(self._h, out))
        return int(out[0])

    @property
    def size(self) -> int:
        out = ffi.new("int32_t *")
        check(lib.fp8amp_comm_size(self._h, out))
        return int(out[0])

    @property
    def saturated(self) -> int:
        """Elements saturated by this communicator's quantizations so far (synchronizes)."""
        out = ffi.new("uint64_t *")
        check(lib.fp8amp_comm_get_saturated(self._h, out))
        return int(out[0])

    def set_timeout(self, seconds: float) -> None:
        check(lib.fp8amp_comm_set_timeout(self._h, as_float(seconds, "Communicator.set_timeout", "seconds")))

    def abort(self) -> None:
        check(lib.fp8amp_comm_abort(self._h))

    def all_reduce(self, inputs: Sequence[Tensor], outputs: Optional[Sequence[Tensor]] = None, *,
                   wire_dtype: Any = DType.E4M3, average: bool = True, check_args: bool = True) -> None:
        """outputs[i] = mean (or sum) over ranks of inputs[i], FP8 on the wire (outputs default to the
        inputs: in place)."""
        where = "Communicator.all_reduce"
        inputs = list(inputs)
        outputs = inputs if outputs is None else list(outputs)
        if len(outputs) != len(inputs):
            raise ValueError("%s: %d inputs but %d outputs" % (where, len(inputs), len(outputs)))
        ins = ffi.new("fp8amp_tensor[]", [handle_of(t, Tensor, where, "inputs[%d]" % i) for i, t in enumerate(inputs)])
        outs = ffi.new("fp8amp_tensor[]",
                       [handle_of(t, Tensor, where, "outputs[%d]" % i) for i, t in enumerate(outputs)])
        check(lib.fp8amp_comm_all_reduce(self._h, len(inputs), ins if inputs else NULL, outs if outputs else NULL,
                                         _desc(where, wire_dtype, average, check_args)))

    def reduce_scatter(self, input: Tensor, output: Tensor, *, wire_dtype: Any = DType.E4M3, average: bool = True,
                       check_args: bool = True) -> None:
        where = "Communicator.reduce_scatter"
        check(lib.fp8amp_comm_reduce_scatter(self._h, handle_of(input, Tensor, where, "input"),
                                             handle_of(output, Tensor, where, "output"),
                                             _desc(where, wire_dtype, average, check_args)))

    def all_gather(self, input: Tensor, output: Tensor, output_scale_inv: Optional[Tensor] = None, *,
                   check_args: bool = True) -> None:
        where = "Communicator.all_gather"
        check(lib.fp8amp_comm_all_gather(self._h, handle_of(input, Tensor, where, "input"),
                                         handle_of(output, Tensor, where, "output"),
                                         handle_of(output_scale_inv, Tensor, where, "output_scale_inv", optional=True),
                                         _desc(where, check_args=check_args)))

    def __repr__(self) -> str:
        if self.closed:
            return "fp8amp.Communicator(closed)"
        return "fp8amp.Communicator(rank=%d, size=%d)" % (self.rank, self.size)
