"""Per-parameter masters (Optimizer.add_param(master=...)) and the master's rounding
(AdamConfig.master_rounding, rounding_seed): one optimizer mixing parameters with and without a
master equals two optimizers bit for bit; stochastic rounding repeats with its seed; bad choices
are refused with their status and change nothing."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp
from fp8amp import optim

pytestmark = pytest.mark.skipif(not hasattr(optim.lib, "fp8amp_optimizer_add_param_ex"),
                                reason="libfp8amp before 0.4.0")


def _bf16(ctx, v):
    return fp8amp.Tensor.from_numpy(ctx, v.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_mixed_masters_equal_two_optimizers(ctx, rng, rounding):
    a0 = (rng.standard_normal(300) * 0.02).astype(np.float32)
    b0 = (rng.standard_normal(200) * 0.02).astype(np.float32)
    cfg2 = fp8amp.AdamConfig.for_level("O2", master_rounding=rounding, rounding_seed=int(rng.integers(2**32)))
    cfg3 = fp8amp.AdamConfig.for_level("O3", master_rounding=rounding, rounding_seed=cfg2.rounding_seed)
    assert cfg3.master_dtype == fp8amp.F16
    mixed = fp8amp.Optimizer(ctx, cfg2)
    pa, pb = _bf16(ctx, a0), fp8amp.Tensor.from_numpy(ctx, b0)
    ga, gb = fp8amp.Tensor(ctx, (300,), fp8amp.F32), fp8amp.Tensor(ctx, (200,), fp8amp.F32)
    mixed.add_param(pa, ga, master=fp8amp.F16)
    mixed.add_param(pb, gb, master=None)
    o3, o2 = fp8amp.Optimizer(ctx, cfg3), fp8amp.Optimizer(ctx, cfg2)
    qa, qb = _bf16(ctx, a0), fp8amp.Tensor.from_numpy(ctx, b0)
    ha, hb = fp8amp.Tensor(ctx, (300,), fp8amp.F32), fp8amp.Tensor(ctx, (200,), fp8amp.F32)
    o3.add_param(qa, ha)
    o2.add_param(qb, hb)
    for _ in range(5):
        va, vb = rng.standard_normal(300).astype(np.float32), rng.standard_normal(200).astype(np.float32)
        for t, v in ((ga, va), (ha, va), (gb, vb), (hb, vb)):
            t.copy_from_numpy(v)
        for o in (mixed, o3, o2):
            o.step()
        assert pa.numpy().tobytes() == qa.numpy().tobytes()
        assert pb.numpy().tobytes() == qb.numpy().tobytes()
    ck = mixed.save()
    assert int.from_bytes(ck[8:12], "little") == 2


def test_bad_master_choices(ctx, rng):
    opt = fp8amp.Optimizer(ctx, "O2")
    p = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal(64).astype(np.float32))
    g = fp8amp.Tensor(ctx, (64,), fp8amp.F32)
    with pytest.raises(fp8amp.DtypeMismatchError):
        opt.add_param(p, g, master=fp8amp.F16)  # an F32 parameter takes no F16 master
    with pytest.raises(fp8amp.InvalidArgumentError):
        opt.add_param(p, g, master=fp8amp.BF16)
    assert opt.num_params == 0
    opt.add_param(p, g, master=None)
    assert opt.num_params == 1
    with pytest.raises(fp8amp.InvalidArgumentError):
        fp8amp.Optimizer(ctx, fp8amp.AdamConfig.for_level("O3", master_rounding="up"))
