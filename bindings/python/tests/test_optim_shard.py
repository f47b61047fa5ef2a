"""Optimizer.set_shard / shard_range (fp8amp_optimizer_set_shard, docs/o3.md) with a one-rank
communicator (no MPI needed): the sharded step equals, bit for bit, the unsharded step given the
reduce-scattered gradient (one rank still puts the gradient through the E4M3 wire); bad calls are
refused. The 2- and 3-rank checks are tests/mpi/test_optimizer_shard.c."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp
from fp8amp import optim

pytestmark = pytest.mark.skipif(not hasattr(optim.lib, "fp8amp_optimizer_set_shard"), reason="libfp8amp before 0.4.0")


def one_rank(ctx):
    return fp8amp.Communicator(ctx, fp8amp.Communicator.unique_id(ctx), 1, 0)


def _bf16(ctx, v):
    return fp8amp.Tensor.from_numpy(ctx, v.astype(ml_dtypes.bfloat16))


def reduced(ctx, comm, v):
    """The gradient the sharded step works with: v padded to a multiple of 128, through the wire."""
    k = -(-v.size // 128) * 128
    pad = np.zeros(k, np.float32)
    pad[: v.size] = v
    out = fp8amp.Tensor(ctx, (k,), fp8amp.F32)
    comm.reduce_scatter(fp8amp.Tensor.from_numpy(ctx, pad), out)
    return out.numpy()[: v.size].copy()


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_one_rank_shard_equals_unsharded(ctx, rng, clip):
    comm = one_rank(ctx)
    a0 = (rng.standard_normal(300) * 0.02).astype(np.float32)
    b0 = (rng.standard_normal(200) * 0.02).astype(np.float32)
    cfg = fp8amp.AdamConfig.for_level("O3", max_grad_norm=clip, master_rounding="stochastic",
                                      rounding_seed=int(rng.integers(2**32)))
    sh, ref = fp8amp.Optimizer(ctx, cfg), fp8amp.Optimizer(ctx, cfg)
    sh.set_shard(comm)
    pa, pb = _bf16(ctx, a0), fp8amp.Tensor.from_numpy(ctx, b0)
    ga, gb = fp8amp.Tensor(ctx, (300,), fp8amp.F32), fp8amp.Tensor(ctx, (200,), fp8amp.F32)
    qa, qb = _bf16(ctx, a0), fp8amp.Tensor.from_numpy(ctx, b0)
    ha, hb = fp8amp.Tensor(ctx, (300,), fp8amp.F32), fp8amp.Tensor(ctx, (200,), fp8amp.F32)
    for o, (x, gx), (y, gy) in ((sh, (pa, ga), (pb, gb)), (ref, (qa, ha), (qb, hb))):
        o.add_param(x, gx)              # bf16 with the O3 config's F16 master
        o.add_param(y, gy, master=None)  # f32, no master
    assert sh.shard_range(0) == (0, 300) and sh.shard_range(1) == (0, 200)
    assert ref.shard_range(1) == (0, 200)
    for _ in range(4):
        va, vb = rng.standard_normal(300).astype(np.float32), rng.standard_normal(200).astype(np.float32)
        ga.copy_from_numpy(va)
        gb.copy_from_numpy(vb)
        ha.copy_from_numpy(reduced(ctx, comm, va))
        hb.copy_from_numpy(reduced(ctx, comm, vb))
        sh.step(lr=1e-2)
        ref.step(lr=1e-2)
        assert not sh.found_inf
        assert pa.numpy().tobytes() == qa.numpy().tobytes()
        assert pb.numpy().tobytes() == qb.numpy().tobytes()
        assert sh.step_count == ref.step_count
        assert np.float32(sh.grad_norm).tobytes() == np.float32(ref.grad_norm).tobytes()
    if clip:
        assert sh.grad_norm > clip  # the clipping was exercised
    # a NaN anywhere: skipped, nothing changed
    before = (pa.numpy().tobytes(), pb.numpy().tobytes(), sh.step_count)
    vb[7] = np.nan
    gb.copy_from_numpy(vb)
    sh.step(lr=1e-2)
    assert sh.found_inf
    assert (pa.numpy().tobytes(), pb.numpy().tobytes(), sh.step_count) == before


def test_set_shard_bad_calls(ctx, rng):
    comm = one_rank(ctx)
    opt = fp8amp.Optimizer(ctx, "O2")
    p = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal(64).astype(np.float32))
    opt.add_param(p, fp8amp.Tensor(ctx, (64,), fp8amp.F32))
    with pytest.raises(fp8amp.InvalidArgumentError):
        opt.set_shard(comm)  # after add_param
    with pytest.raises(fp8amp.InvalidArgumentError):
        opt.shard_range(1)
    with pytest.raises(TypeError):
        fp8amp.Optimizer(ctx, "O2").set_shard(object())
    per_tensor = fp8amp.Optimizer(ctx, fp8amp.AdamConfig.for_level("O2", state_block_size=0))
    with pytest.raises(fp8amp.NotSupportedError):
        per_tensor.set_shard(comm)
    fresh = fp8amp.Optimizer(ctx, "O2")
    fresh.set_shard(comm)
    with pytest.raises(fp8amp.InvalidArgumentError):
        fresh.set_shard(comm)  # twice
