"""fp8amp.Communicator with one rank (no MPI, no NCCL needed on the CPU): the all-reduce of a bucket
in place is within two E4M3 roundings of the input (the wire's and the output's), the CPU and GPU
give the same bytes, reduce-scatter/all-gather round trips, and errors map to their classes. The
multi-rank tests are the C ones under mpirun (tests/mpi)."""
import numpy as np
import pytest

import fp8amp
from conftest import HAVE_CUDA


def one_rank(ctx):
    return fp8amp.Communicator(ctx, fp8amp.Communicator.unique_id(ctx), 1, 0)


def bucket(rng):
    return [rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** rng.integers(-8, 8)) for n in (1, 77, 1000)]


def reduce_on(device, arrays):
    with fp8amp.Context(device) as ctx, one_rank(ctx) as comm:
        ts = [fp8amp.Tensor.from_numpy(ctx, a) for a in arrays]
        comm.all_reduce(ts)
        assert comm.saturated == 0
        return [t.numpy() for t in ts]


def test_all_reduce_one_rank(ctx, rng):
    arrays = bucket(rng)
    with one_rank(ctx) as comm:
        assert (comm.rank, comm.size) == (0, 1)
        ts = [fp8amp.Tensor.from_numpy(ctx, a) for a in arrays]
        comm.all_reduce(ts)
        for a, t in zip(arrays, ts):
            got = t.numpy()
            amax = np.abs(a).max()
            # Two roundings of E4M3 (3 mantissa bits: half a quantum is 2^-4 relative), plus the
            # subnormal quantum at the scale of amax.
            bound = np.abs(a) * 2 * 2.0 ** -4 + 2 * amax / 448 * 2.0 ** -9
            assert np.all(np.abs(got - a) <= bound)
    if HAVE_CUDA and ctx.device.type == "cuda":
        cpu = reduce_on("cpu", arrays)
        for g, c in zip([t.numpy() for t in ts], cpu):
            assert np.array_equal(g.view(np.uint32), c.view(np.uint32))


def test_reduce_scatter_all_gather_one_rank(ctx, rng):
    a = rng.standard_normal(300).astype(np.float32)
    with one_rank(ctx) as comm:
        x = fp8amp.Tensor.from_numpy(ctx, a)
        shard = fp8amp.Tensor(ctx, (300,), fp8amp.F32)
        comm.reduce_scatter(x, shard, wire_dtype=fp8amp.E5M2)
        full = fp8amp.Tensor(ctx, (300,), fp8amp.F32)
        comm.all_gather(shard, full)
        assert np.array_equal(full.numpy(), shard.numpy())
        assert np.all(np.abs(shard.numpy() - a) <= np.abs(a) * 2.0 ** -3 + np.abs(a).max() / 57344 * 2.0 ** -16)


def test_errors(ctx):
    with one_rank(ctx) as comm:
        a = fp8amp.Tensor(ctx, (4,), fp8amp.F32)
        b = fp8amp.Tensor(ctx, (5,), fp8amp.F32)
        with pytest.raises(fp8amp.ShapeMismatchError):
            comm.all_reduce([a], [b])
        with pytest.raises(fp8amp.DtypeMismatchError):
            comm.all_reduce([a], wire_dtype=fp8amp.BF16)
        with pytest.raises(TypeError):
            comm.all_reduce([a], average=1)
        with pytest.raises(fp8amp.InvalidArgumentError):
            comm.set_timeout(0.0)
        comm.abort()
        with pytest.raises(fp8amp.CommError):
            comm.all_reduce([a])
    with pytest.raises(TypeError):
        fp8amp.Communicator(ctx, b"short", 1, 0)
    if ctx.device.type != "cpu":
        # A CUDA id is NCCL's own ncclUniqueId, passed to ncclCommInitRank unchecked (no tag fits
        # in it): all zeros fails inside NCCL's bootstrap (status NCCL, not INVALID_ARGUMENT). And 2
        # ranks in one process would wait in ncclCommInitRank for the other rank forever, as NCCL
        # does, so that case is the CPU's alone (MPI's world size is checked first).
        with pytest.raises(fp8amp.NcclError):
            fp8amp.Communicator(ctx, bytes(128), 1, 0)
        return
    with pytest.raises(fp8amp.InvalidArgumentError):
        fp8amp.Communicator(ctx, bytes(128), 1, 0)  # not an id of this library
    with pytest.raises(fp8amp.NotSupportedError):
        fp8amp.Communicator(ctx, fp8amp.Communicator.unique_id(ctx), 2, 0)  # no MPI world of 2 here
