"""The scaled casts and the scaling meta against float64 NumPy references (refs.py): quantize,
quantize_transpose and dequantize into/from E4M3, E5M2 and scaled F16, delayed and current scaling,
the update's scale arithmetic over a random amax sequence, and the statistics."""
import numpy as np
import pytest

import fp8amp
from refs import MAX, NP, decode, encode_satfinite, random_values, scale_for, scaled_f32

SCALED = [fp8amp.E4M3, fp8amp.E5M2, fp8amp.F16]
WIDE = [fp8amp.F32, fp8amp.F16, fp8amp.BF16]


def codes_of(t: fp8amp.Tensor) -> np.ndarray:
    a = t.numpy()
    return a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16)


def check_quantized(x, scale, dtype, q_codes, back_f32, scale_inv):
    """Codes and the dequantized float32 values of a quantize with `scale` against the references."""
    y = scaled_f32(x.astype(np.float64), scale)
    want = encode_satfinite(y, dtype)
    nan = np.isnan(y)
    assert np.array_equal(q_codes[~nan], want[~nan]), "codes differ at %s" % np.flatnonzero(q_codes != want)[:5]
    got_nan = decode(q_codes[nan], dtype)
    assert np.isnan(got_nan).all() and (np.signbit(got_nan) == np.signbit(y[nan])).all()
    back_want = scaled_f32(decode(q_codes, dtype), scale_inv)
    same = (back_f32.view(np.uint32) == back_want.view(np.uint32)) | (np.isnan(back_f32) & np.isnan(back_want))
    assert same.all()


@pytest.mark.parametrize("dtype", SCALED, ids=str)
@pytest.mark.parametrize("src_dtype", WIDE, ids=str)
@pytest.mark.parametrize("shape", [(1,), (17,), (33, 65), (4, 5, 6), (100003,)], ids=str)
def test_quantize_delayed(ctx, rng, dtype, src_dtype, shape):
    n = int(np.prod(shape))
    x = random_values(rng, n, -30, 30, src_dtype, specials=n >= 8).reshape(shape)
    scale = float(np.float32(rng.uniform(1, 2) * 2.0 ** rng.integers(-6, 7)))
    with fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=4), dtype) as meta:
        meta.set_scale(scale)
        meta.enable_stats()
        src = fp8amp.Tensor.from_numpy(ctx, x)
        q = fp8amp.Tensor(ctx, shape, dtype)
        q.set_scaling(meta)
        fp8amp.quantize(ctx, src, q)
        back = fp8amp.Tensor(ctx, shape, fp8amp.F32)
        fp8amp.dequantize(ctx, q, back)
        state = meta.get()
        assert state.scale == scale and state.scale_inv == float(np.float32(1.0 / np.float64(scale)))
        xf = x.astype(np.float64)
        assert state.amax == (np.inf if np.isnan(xf).any() else np.abs(xf).max())
        check_quantized(xf, scale, dtype, codes_of(q), back.numpy(), state.scale_inv)
        y = scaled_f32(xf, scale)
        with np.errstate(invalid="ignore"):
            saturated = int(np.sum(np.abs(y) > MAX[dtype]))
        zero = (encode_satfinite(y, dtype) & (0x7F if dtype.is_fp8 else 0x7FFF)) == 0
        underflowed = int(np.sum(zero & (xf != 0) & ~np.isnan(xf)))
        assert meta.stats() == (n, saturated, underflowed)
        for t in (src, q, back):
            t.close()


@pytest.mark.parametrize("dtype", SCALED, ids=str)
def test_current_scaling_and_transpose(ctx, rng, dtype):
    rows, cols = 67, 130
    x = random_values(rng, rows * cols, -12, 12).reshape(rows, cols)
    recipe = fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT, margin=1, power_of_two_scales=True, amax_history_len=2)
    with fp8amp.Scaling(ctx, recipe, dtype) as meta, fp8amp.Tensor.from_numpy(ctx, x) as src, \
            fp8amp.Tensor(ctx, (rows, cols), dtype) as q, fp8amp.Tensor(ctx, (cols, rows), dtype) as qt:
        q.set_scaling(meta)
        qt.set_scaling(meta)
        fp8amp.quantize_transpose(ctx, src, q, qt)
        amax = float(np.abs(x).max())
        scale = scale_for(amax, MAX[dtype], margin=1, pow2=True)
        state = meta.get()
        assert state.scale == scale and state.amax == amax
        codes = codes_of(q)
        check_quantized(x.astype(np.float64), scale, dtype, codes, scaled_f32(decode(codes, dtype), state.scale_inv),
                        state.scale_inv)
        assert np.array_equal(codes_of(qt), codes.T)
        meta.update()  # current scaling: the history records the amax, the scale stays
        assert meta.history()[0] == amax and meta.scale == scale


@pytest.mark.parametrize("dtype", SCALED, ids=str)
def test_delayed_updates_follow_float64_model(ctx, rng, dtype):
    recipe = fp8amp.Recipe(margin=2, interval=2, amax_history_len=5, amax_algo=fp8amp.AmaxAlgo.MAX)
    with fp8amp.Scaling(ctx, recipe, dtype) as meta, fp8amp.Tensor(ctx, (64,), fp8amp.F32) as src, \
            fp8amp.Tensor(ctx, (64,), dtype) as q:
        q.set_scaling(meta)
        history, scale, updates = [0.0] * 5, 1.0, 0
        for step in range(40):
            amax = float(np.float32(rng.uniform(1, 2) * 2.0 ** rng.integers(-30, 30)))
            if step % 7 == 3:
                amax = 0.0  # keeps the scale
            x = np.zeros(64, np.float32)
            x[rng.integers(64)] = amax * (-1 if step % 2 else 1)
            src.copy_from_numpy(x)
            fp8amp.quantize(ctx, src, q)
            assert meta.amax == amax
            meta.update()
            history = [amax] + history[:-1]
            updates += 1
            if updates % 2 == 0:
                scale = scale_for(max(history), MAX[dtype], margin=2, previous=scale)
            assert meta.scale == scale and list(meta.history()) == history


def test_update_many_mixed_dtypes(ctx, rng):
    metas = [fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=3), d) for d in SCALED * 3]
    src = fp8amp.Tensor(ctx, (8,), fp8amp.F32)
    amaxes = []
    for m in metas:
        a = float(np.float32(rng.uniform(0.5, 4.0)))
        amaxes.append(a)
        src.copy_from_numpy(np.full(8, a, np.float32))
        with fp8amp.Tensor(ctx, (8,), m.dtype) as q:
            q.set_scaling(m)
            fp8amp.quantize(ctx, src, q)
    fp8amp.update_many(ctx, metas)
    for m, a in zip(metas, amaxes):
        assert m.scale == scale_for(a, MAX[m.dtype]) and m.amax == 0.0
        m.close()
    src.close()


@pytest.mark.parametrize("dtype", SCALED, ids=str)
def test_amax_tensor_is_the_recorded_amax_where_it_lives(ctx, rng, dtype):
    """Scaling.amax_tensor (fp8amp_scaling_amax_tensor): a read-only F32 scalar sharing the meta's
    recorded amax -- what Scaling.amax reads, live across recordings and updates, +inf for a NaN or
    an inf, valid past the meta's close."""
    meta = fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=4), dtype)
    a = meta.amax_tensor()
    assert a.shape == () and a.dtype == fp8amp.F32 and float(a.numpy()) == 0.0
    q = fp8amp.Tensor(ctx, (37, 5), dtype)
    q.set_scaling(meta)
    seen = []
    for lo, hi in ((-3, 3), (-50, 50)):  # the second records a larger amax: it shows through
        x = random_values(rng, 37 * 5, lo, hi, fp8amp.F32, specials=False).reshape(37, 5)
        with fp8amp.Tensor.from_numpy(ctx, x) as src:
            fp8amp.quantize(ctx, src, q)
        seen.append(float(np.abs(x.astype(np.float64)).max()))
        assert float(a.numpy()) == max(seen) == meta.amax
    meta.update()
    assert float(a.numpy()) == 0.0
    for special in (np.nan, -np.inf):
        x = random_values(rng, 37 * 5, -3, 3, fp8amp.F32, specials=False).reshape(37, 5)
        x[rng.integers(37), rng.integers(5)] = special
        with fp8amp.Tensor.from_numpy(ctx, x) as src:
            fp8amp.quantize(ctx, src, q)
        assert float(a.numpy()) == np.inf
        meta.update()
    with pytest.raises(fp8amp.InvalidArgumentError):  # read-only
        a.copy_from_numpy(np.array(1.0, dtype=np.float32))
    q.close()
    meta.close()
    assert float(a.numpy()) == 0.0  # the last update's reset, still readable
    a.close()


def test_amax(ctx, rng):
    for d in fp8amp.DType:
        x = rng.standard_normal(999).astype(np.float32) * 100
        with fp8amp.Tensor.from_numpy(ctx, x.astype(NP[d]) if not d.is_fp8 else
                                      np.clip(x, -MAX[d], MAX[d]).astype(NP[d])) as t:
            assert fp8amp.amax(ctx, t) == float(np.abs(t.numpy().astype(np.float32)).max())
