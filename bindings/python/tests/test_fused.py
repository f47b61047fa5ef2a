"""fp8amp.norm_forward / norm_backward / activation_forward / activation_backward (the fused C functions
of docs/api.md 14-15) through the package: against float64 references on fresh random data, the FP8
output equal to quantizing the wide output with the same scale (the fusion changes no byte), CPU and
CUDA bytes equal where a GPU is present, and bad arguments refused."""
import math

import numpy as np
import pytest

import fp8amp
from conftest import HAVE_CUDA


def f32(ctx, a):
    return fp8amp.Tensor.from_numpy(ctx, np.ascontiguousarray(a, dtype=np.float32))


def current_meta(ctx):
    return fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), fp8amp.E4M3)


def layernorm64(x, g, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 96)])
def test_layernorm_forward_backward(ctx, rng, shape):
    rows, d = shape
    x = rng.standard_normal(shape).astype(np.float32) * 3 + 0.5
    g = rng.standard_normal(d).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    tx, tg, tb = f32(ctx, x), f32(ctx, g), f32(ctx, b)
    y = fp8amp.Tensor(ctx, shape, fp8amp.F32)
    mean, rstd = fp8amp.Tensor(ctx, (rows,), fp8amp.F32), fp8amp.Tensor(ctx, (rows,), fp8amp.F32)
    fp8amp.norm_forward(ctx, tx, tg, y, rstd, beta=tb, mean=mean)
    ref = layernorm64(x, g, b, 1e-5)
    got = y.numpy()
    assert np.all(np.isfinite(got))
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5 * (1 + np.abs(ref).max()))
    # The FP8 output is quantize(the F32 output) with the same scale, byte for byte.
    meta_a, meta_b = current_meta(ctx), current_meta(ctx)
    q = fp8amp.Tensor(ctx, shape, fp8amp.E4M3)
    q.set_scaling(meta_a)
    fp8amp.norm_forward(ctx, tx, tg, q, rstd, beta=tb, mean=mean)
    q2 = fp8amp.Tensor(ctx, shape, fp8amp.E4M3)
    q2.set_scaling(meta_b)
    fp8amp.quantize(ctx, y, q2)
    assert np.array_equal(q.numpy().view(np.uint8), q2.numpy().view(np.uint8))
    # Backward against float64 (dx by the LayerNorm formula, dgamma, dbeta).
    dy = rng.standard_normal(shape).astype(np.float32)
    dx, dg, db = fp8amp.Tensor(ctx, shape, fp8amp.F32), fp8amp.Tensor(ctx, (d,), fp8amp.F32), fp8amp.Tensor(ctx, (d,), fp8amp.F32)
    fp8amp.norm_backward(ctx, f32(ctx, dy), tx, tg, rstd, dx, dg, mean=mean, dbeta=db)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    rs = 1 / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xh = (x64 - mu) * rs
    gg = dy64 * g
    dx_ref = (gg - gg.mean(-1, keepdims=True) - xh * (gg * xh).mean(-1, keepdims=True)) * rs
    scale = 1 + np.abs(dx_ref).max()
    assert np.allclose(dx.numpy(), dx_ref, rtol=1e-4, atol=1e-5 * scale)
    assert np.allclose(dg.numpy(), (dy64 * xh).sum(0), rtol=1e-4, atol=1e-5 * rows)
    assert np.allclose(db.numpy(), dy64.sum(0), rtol=1e-5, atol=1e-5 * rows)


@pytest.mark.parametrize("kind", ["gelu_tanh", "silu", "swiglu"])
def test_activation_forward_backward(ctx, rng, kind):
    rows, d = 5, 34
    x = rng.standard_normal((rows, d)).astype(np.float32) * 2
    cols = d // 2 if kind == "swiglu" else d
    x64 = x.astype(np.float64)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    if kind == "gelu_tanh":
        ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    elif kind == "silu":
        ref = x64 * sig(x64)
    else:
        a, b = x64[:, :cols], x64[:, cols:]
        ref = a * sig(a) * b
    tx = f32(ctx, x)
    y = fp8amp.Tensor(ctx, (rows, cols), fp8amp.F32)
    fp8amp.activation_forward(ctx, tx, y, kind=kind)
    assert np.allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6)
    meta = current_meta(ctx)
    q = fp8amp.Tensor(ctx, (rows, cols), fp8amp.E4M3)
    q.set_scaling(meta)
    fp8amp.activation_forward(ctx, tx, q, kind=kind)
    q2 = fp8amp.Tensor(ctx, (rows, cols), fp8amp.E4M3)
    q2.set_scaling(current_meta(ctx))
    fp8amp.quantize(ctx, y, q2)
    assert np.array_equal(q.numpy().view(np.uint8), q2.numpy().view(np.uint8))
    # Backward against a float64 central difference of the float64 reference's sum(dy * f(x)).
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    dx = fp8amp.Tensor(ctx, (rows, d), fp8amp.F32)
    fp8amp.activation_backward(ctx, f32(ctx, dy), tx, dx, kind=kind)
    h = 1e-6

    def f(v):
        if kind == "gelu_tanh":
            return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        if kind == "silu":
            return v * sig(v)
        return v[:, :cols] * sig(v[:, :cols]) * v[:, cols:]
    num = np.zeros_like(x64)
    for j in range(d):
        e = np.zeros_like(x64)
        e[:, j] = h
        num[:, j] = ((f(x64 + e) - f(x64 - e)) * dy).sum(-1) / (2 * h)
    assert np.allclose(dx.numpy(), num, rtol=1e-4, atol=1e-4)


def test_fused_bad_arguments(ctx, rng):
    x = f32(ctx, rng.standard_normal((4, 8)))
    g = f32(ctx, rng.standard_normal(8))
    y = fp8amp.Tensor(ctx, (4, 8), fp8amp.F32)
    rstd = fp8amp.Tensor(ctx, (4,), fp8amp.F32)
    with pytest.raises(ValueError, match="kind"):
        fp8amp.norm_forward(ctx, x, g, y, rstd, kind="batchnorm")
    with pytest.raises(fp8amp.ShapeMismatchError):
        fp8amp.norm_forward(ctx, x, f32(ctx, rng.standard_normal(7)), y, rstd, kind="rmsnorm")
    before = y.numpy().copy()
    with pytest.raises(fp8amp.Error):  # an FP8 output with no Scaling bound
        fp8amp.activation_forward(ctx, x, fp8amp.Tensor(ctx, (4, 8), fp8amp.E4M3), kind="silu")
    with pytest.raises(fp8amp.ShapeMismatchError):  # SwiGLU halves the last extent
        fp8amp.activation_forward(ctx, x, y, kind="swiglu")
    # Bytes, not values: y was never written, so it may hold NaN patterns, which compare unequal to
    # themselves (np.array_equal failed on such garbage though nothing had changed).
    assert y.numpy().tobytes() == before.tobytes()


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
def test_fused_cpu_cuda_identical(rng):
    x = rng.standard_normal((33, 257)).astype(np.float32)
    g = rng.standard_normal(257).astype(np.float32)
    out = {}
    for dev in ("cpu", "cuda"):
        with fp8amp.Context(dev) as ctx:
            q = fp8amp.Tensor(ctx, x.shape, fp8amp.E4M3)
            q.set_scaling(current_meta(ctx))
            rstd = fp8amp.Tensor(ctx, (33,), fp8amp.F32)
            fp8amp.norm_forward(ctx, f32(ctx, x), f32(ctx, g), q, rstd, kind="rmsnorm")
            a = fp8amp.Tensor(ctx, x.shape, fp8amp.BF16)
            fp8amp.activation_forward(ctx, f32(ctx, x), a, kind="gelu_tanh")
            out[dev] = (q.numpy().view(np.uint8).copy(), rstd.numpy().copy(), a.numpy().view(np.uint16).copy())
    for c, g_ in zip(out["cpu"], out["cuda"]):
        assert np.array_equal(c.view(np.uint8), g_.view(np.uint8))
