"""fp8amp.Optimizer.param_state / set_param_state / set_step (fp8amp_optimizer_param_state, docs/api.md
12.10), without torch: the views' layout, a bit-exact round trip into a fresh optimizer that then steps
to the same bytes, values quantized with the block scaling (checked against ml_dtypes), and refusals
that change nothing."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp
from fp8amp import optim

pytestmark = pytest.mark.skipif(not hasattr(optim.lib, "fp8amp_optimizer_param_state"),
                                reason="libfp8amp without fp8amp_optimizer_param_state")

SHAPES = [(300,), (5, 61)]


def _bf16(ctx, v):
    return fp8amp.Tensor.from_numpy(ctx, v.astype(ml_dtypes.bfloat16))


def _make(ctx, level, values, block=128):
    """An optimizer over a F32 parameter (no master) and a BF16 one (the level's master)."""
    opt = fp8amp.Optimizer(ctx, fp8amp.AdamConfig.for_level(level, lr=1e-2, state_block_size=block))
    params, grads = [], []
    for i, (shape, v) in enumerate(zip(SHAPES, values)):
        p = fp8amp.Tensor.from_numpy(ctx, v) if i == 0 else _bf16(ctx, v)
        g = fp8amp.Tensor(ctx, shape, fp8amp.F32)
        opt.add_param(p, g, master=None) if i == 0 else opt.add_param(p, g)
        params.append(p)
        grads.append(g)
    return opt, params, grads


def _bytes(state):
    return {k: (v if isinstance(v, (int, float)) else v.numpy().tobytes()) for k, v in state.items()}


def _step(opt, grads, gvals):
    for g, v in zip(grads, gvals):
        g.copy_from_numpy(v)
    opt.step()


@pytest.mark.parametrize("level,block", [("O1", 128), ("O2", 128), ("O3", 128), ("O3", 0), ("O2", 256)])
def test_round_trip_bit_exact_and_continues(ctx, rng, level, block):
    values = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in SHAPES]
    a, pa, ga = _make(ctx, level, values, block)
    steps = int(rng.integers(2, 5))
    for _ in range(steps):
        _step(a, ga, [rng.standard_normal(s).astype(np.float32) for s in SHAPES])
    b, pb, gb = _make(ctx, level, [p.numpy().astype(np.float32) for p in pa], block)
    for p, q in zip(pa, pb):
        q.copy_from_numpy(p.numpy())
    for i, shape in enumerate(SHAPES):
        s = a.param_state(i)
        assert s["step"] == steps
        m8 = level != "O1"
        assert s["exp_avg"].dtype == (fp8amp.E4M3 if m8 else fp8amp.F32) and s["exp_avg"].shape == shape
        assert s["exp_avg_sq"].dtype == (fp8amp.F16 if m8 else fp8amp.F32)
        assert ("exp_avg_scale_inv" in s) == m8 and ("exp_avg_sq_scale_inv" in s) == m8
        assert ("master" in s) == (level == "O3" and i == 1)
        if m8:
            n = int(np.prod(shape))
            assert s["exp_avg_scale_inv"].shape == (-(-n // block) if block else 1,)
        b.set_param_state(i, s)
    b.set_step(steps)
    for i in range(len(SHAPES)):
        assert _bytes(b.param_state(i)) == _bytes(a.param_state(i))
    gvals = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    _step(a, ga, gvals)
    _step(b, gb, gvals)
    for p, q in zip(pa, pb):
        assert p.numpy().tobytes() == q.numpy().tobytes()
    for i in range(len(SHAPES)):
        assert _bytes(b.param_state(i)) == _bytes(a.param_state(i))


def _quantize_ref(x, block, dtype, fmax):
    """Per block the largest power-of-two scale with amax * scale <= fmax; codes rounded to nearest."""
    n = x.size
    bs = block or n
    codes = np.empty(n, dtype=dtype)
    inv = []
    for lo in range(0, n, bs):
        blk = x.reshape(-1)[lo:lo + bs]
        amax = float(np.abs(blk).max())
        k = 0
        if amax > 0:
            k = int(np.floor(np.log2(fmax / amax)))
            while amax * 2.0 ** (k + 1) <= fmax:
                k += 1
            while amax * 2.0 ** k > fmax:
                k -= 1
            k = max(-126, min(126, k))
        inv.append(np.float32(2.0 ** -k))
        codes[lo:lo + bs] = (blk.astype(np.float64) * 2.0 ** k).astype(np.float32).astype(dtype)
    return codes, np.array(inv, dtype=np.float32)


def test_values_are_quantized_with_the_block_scaling(ctx, rng):
    block = int(rng.choice([128, 256, 0]))
    values = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in SHAPES]
    opt, _, _ = _make(ctx, "O3", values, block)
    shape = SHAPES[1]
    m = (rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 10, shape)).astype(np.float32)
    v = (rng.uniform(0, 1, shape) * 2.0 ** rng.integers(-30, 10, shape)).astype(np.float32)
    w = rng.uniform(-3, 3, shape).astype(np.float32)
    opt.set_param_state(1, {"exp_avg": fp8amp.Tensor.from_numpy(ctx, m), "exp_avg_sq": _bf16(ctx, v),
                            "master": fp8amp.Tensor.from_numpy(ctx, w)})
    s = opt.param_state(1)
    v_bf16 = v.astype(ml_dtypes.bfloat16).astype(np.float32)  # the BF16 tensor's values
    for name, x, dt, fmax in (("exp_avg", m, ml_dtypes.float8_e4m3fn, 448.0), ("exp_avg_sq", v_bf16, np.float16, 65504.0),
                              ("master", w, np.float16, 65504.0)):
        codes, inv = _quantize_ref(x, block, dt, fmax)
        assert s[name + "_scale_inv"].numpy().tobytes() == inv.tobytes(), name
        assert s[name].numpy().reshape(-1).tobytes() == codes.tobytes(), name


def test_refusals_change_nothing(ctx, rng):
    values = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in SHAPES]
    opt, _, grads = _make(ctx, "O3", values)
    _step(opt, grads, [rng.standard_normal(s).astype(np.float32) for s in SHAPES])
    before = [_bytes(opt.param_state(i)) for i in range(2)]
    good = opt.param_state(1)
    nan = rng.standard_normal(SHAPES[1]).astype(np.float32)
    nan.reshape(-1)[int(rng.integers(nan.size))] = np.nan
    cases = [
        (fp8amp.ShapeMismatchError, 0, dict(good, master=None, master_scale_inv=None)),  # 1's state for 0
        (fp8amp.InvalidArgumentError, 0, good),  # ... with its master: parameter 0 has none
        (fp8amp.InvalidArgumentError, 1, dict(good, master=None, master_scale_inv=None)),  # master missing
        (fp8amp.InvalidArgumentError, 0, dict(opt.param_state(0), master=good["master"])),  # no master there
        (fp8amp.DtypeMismatchError, 1, dict(good, exp_avg_scale_inv=None)),  # E4M3 codes without scales
        (fp8amp.InvalidArgumentError, 1, dict(good, exp_avg=fp8amp.Tensor.from_numpy(ctx, nan), exp_avg_scale_inv=None)),
        (fp8amp.InvalidArgumentError, 1, dict(good, exp_avg_sq=fp8amp.Tensor.from_numpy(ctx, -np.abs(nan) - 1),
                                              exp_avg_sq_scale_inv=None)),
        (fp8amp.InvalidArgumentError, 5, good),  # index
        (fp8amp.ShapeMismatchError, 1, dict(good, exp_avg_scale_inv=fp8amp.Tensor.from_numpy(
            ctx, np.ones(7, np.float32)))),
    ]
    for error, index, state in cases:
        with pytest.raises(error):
            opt.set_param_state(index, state)
        assert [_bytes(opt.param_state(i)) for i in range(2)] == before
    with pytest.raises(TypeError):
        opt.set_param_state(1, dict(good, exp_avg=np.zeros(3)))
    with pytest.raises(TypeError):
        opt.set_param_state(1, [1, 2])
    with pytest.raises(fp8amp.InvalidArgumentError):
        opt.param_state(-1)
    with pytest.raises(fp8amp.InvalidArgumentError):
        opt.set_step(-1)
    assert [_bytes(opt.param_state(i)) for i in range(2)] == before
    opt.set_step(7)
    assert opt.step_count == 7 and opt.param_state(0)["step"] == 7


def test_views_are_read_only_and_live(ctx, rng):
    values = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in SHAPES]
    opt, _, grads = _make(ctx, "O2", values)
    _step(opt, grads, [rng.standard_normal(s).astype(np.float32) for s in SHAPES])
    s = opt.param_state(0)
    first = s["exp_avg_sq"].numpy().tobytes()
    with pytest.raises(fp8amp.InvalidArgumentError):
        s["exp_avg_sq"].copy_from_numpy(np.zeros(SHAPES[0], np.float16))
    assert s["exp_avg_sq"].numpy().tobytes() == first
    _step(opt, grads, [rng.standard_normal(sh).astype(np.float32) for sh in SHAPES])
    assert s["exp_avg_sq"].numpy().tobytes() != first
    live = s["exp_avg_sq"].numpy().tobytes()
    opt.close()
    assert s["exp_avg_sq"].numpy().tobytes() == live  # the view keeps the memory
