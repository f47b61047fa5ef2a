"""fp8amp.Linear against float64 NumPy references (docs/linear.md section 3): forward and backward
from the same quantized operands (tight), and from the unquantized ones (at FP8 precision);
micro-batch accumulation; the weight cache and weight_changed; the BF16/F32 path; bad inputs."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp
from fp8amp import Role
from refs import decode, encode_satfinite, scale_for, scaled_f32

CURRENT = fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT)


def q(x, scale, dtype):
    """Quantized values (float64, unscaled codes) of float32 x with a scale."""
    return decode(encode_satfinite(scaled_f32(x, scale), dtype), dtype)


def make(ctx, rng, k=64, n=48, wdtype=fp8amp.F32, wgrad=fp8amp.F32, policy="fp8", bias=True):
    lin = fp8amp.Linear(ctx, k, n, bias=bias, weight_dtype=wdtype, wgrad_dtype=wgrad, recipe=CURRENT, policy=policy)
    w = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)
    lin.weight.copy_from_numpy(w.astype(lin.weight.dtype.numpy()))
    b = (rng.standard_normal(n) * 0.5).astype(np.float32)
    if bias:
        lin.bias.copy_from_numpy(b)
    return lin, w.astype(lin.weight.dtype.numpy()).astype(np.float32), b


def gemm_tol(ctx, a, b):
    """Bound on |computed - exact| for sum_k a*b in FP32: CPU sums in FP32, CUDA's forward uses
    fast (tensor-core) accumulation, error of order 2^-10 of sum |a*b| (docs/linear.md 3.1)."""
    mag = np.abs(a) @ np.abs(b)
    return mag * (2.0 ** -9 if ctx.is_cuda else 2.0 ** -18) + 1e-30


def test_forward_backward_match_quantized_reference(ctx, rng):
    m, k, n = 32, 64, 48
    lin, w, b = make(ctx, rng, k, n)
    x = rng.standard_normal((2, m // 2, k)).astype(np.float32) * 3
    xt = fp8amp.Tensor.from_numpy(ctx, x)
    y = fp8amp.Tensor(ctx, (2, m // 2, n), fp8amp.F32)
    lin.forward(xt, y, training=True)
    assert lin.gemm_kind == fp8amp.GemmKind.FP8
    s_x = scale_for(float(np.abs(x).max()), 448.0)
    s_w = scale_for(float(np.abs(w).max()), 448.0)
    assert lin.scaling(Role.INPUT).scale == s_x and lin.scaling(Role.WEIGHT).scale == s_w
    x2 = x.reshape(m, k)
    x8, w8 = q(x2, s_x, fp8amp.E4M3), q(w, s_w, fp8amp.E4M3)
    inv = np.float64(np.float32(1 / s_x)) * np.float64(np.float32(1 / s_w))
    b_r = b.astype(ml_dtypes.bfloat16).astype(np.float64)
    ref = (x8 @ w8.T) * inv + b_r
    got = y.numpy().reshape(m, n)
    np.testing.assert_array_less(np.abs(got - ref), gemm_tol(ctx, x8, w8.T) * inv * 4 + np.abs(ref) * 2e-7)
    # Against the unquantized math: E4M3 precision (relative 2^-4 per operand), normwise.
    exact = x2.astype(np.float64) @ w.T.astype(np.float64) + b
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 0.08

    dy = rng.standard_normal((2, m // 2, n)).astype(np.float32) * 1e-3
    dyt = fp8amp.Tensor.from_numpy(ctx, dy)
    dx = fp8amp.Tensor(ctx, x.shape, fp8amp.F32)
    lin.backward(dyt, dx)
    dy2 = dy.reshape(m, n)
    s_g = scale_for(float(np.abs(dy).max()), 57344.0)  # HYBRID: E5M2 output gradients
    assert lin.scaling(Role.GRAD_OUTPUT).scale == s_g
    g8 = q(dy2, s_g, fp8amp.E5M2)
    inv_g = np.float64(np.float32(1 / s_g))
    dx_ref = (g8 @ w8) * inv_g * np.float64(np.float32(1 / s_w))
    # CPU: FP32 sums (2^-18 covers them); CUDA: FP8 tensor-core partial sums promoted to FP32 at
    # intervals ("split" accumulation), measured within 2^-14 of sum |a*b|
    acc = 2.0 ** -11 if ctx.is_cuda else 2.0 ** -18
    tight = (np.abs(g8) @ np.abs(w8)) * inv_g * np.float64(np.float32(1 / s_w)) * acc
    np.testing.assert_array_less(np.abs(dx.numpy().reshape(m, k) - dx_ref), tight + 1e-30)
    dw_ref = (g8.T @ x8) * inv_g * np.float64(np.float32(1 / s_x))
    tight = (np.abs(g8.T) @ np.abs(x8)) * inv_g * np.float64(np.float32(1 / s_x)) * acc
    np.testing.assert_array_less(np.abs(lin.weight_grad.numpy() - dw_ref), tight + 1e-30)
    db = lin.bias_grad.numpy()
    # FP32 sums of m terms in any order: within (m - 1) * 2^-24 * sum |dy| of the exact sum (a bound
    # relative to the result itself fails where a column's terms cancel)
    acc_bound = (m - 1) * 2.0 ** -24 * np.abs(dy2).astype(np.float64).sum(0)
    np.testing.assert_array_less(np.abs(db - dy2.astype(np.float64).sum(0)), acc_bound + 1e-30)
    # And the float64 gradients of the unquantized layer, at FP8 precision.
    dw_exact = dy2.astype(np.float64).T @ x2
    assert np.linalg.norm(lin.weight_grad.numpy() - dw_exact) / np.linalg.norm(dw_exact) < 0.15


def test_forward_fp8_takes_the_norms_e4m3_output(ctx, rng):
    """fp8amp_linear_forward_fp8: a LayerNorm writes the GEMM's E4M3 operand into the Linear's INPUT
    meta; y is the quantized reference computed here from those codes and scales, and the twin that
    quantizes the same x itself gives the same bytes (forward and backward)."""
    m, k, n = 32, 64, 48
    lin, w, b = make(ctx, rng, k, n)
    twin, _, _ = make(ctx, rng, k, n)
    twin.weight.copy_from_numpy(w)
    twin.bias.copy_from_numpy(b)
    x = (rng.standard_normal((m, k)) * 2 + 0.5).astype(np.float32)
    gamma = (1 + 0.2 * rng.standard_normal(k)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(k)).astype(np.float32)
    xt, gt, bt = (fp8amp.Tensor.from_numpy(ctx, a) for a in (x, gamma, beta))
    x8 = fp8amp.Tensor(ctx, (m, k), fp8amp.E4M3)
    x8.set_scaling(lin.scaling(Role.INPUT))
    mean, rstd = fp8amp.Tensor(ctx, (m,), fp8amp.F32), fp8amp.Tensor(ctx, (m,), fp8amp.F32)
    fp8amp.norm_forward(ctx, xt, gt, x8, rstd, beta=bt, mean=mean)
    y = fp8amp.Tensor(ctx, (m, n), fp8amp.F32)
    assert lin.choose_gemm(m) == fp8amp.GemmKind.FP8  # policy "fp8" (make's default)
    with pytest.raises(fp8amp.InvalidArgumentError):
        lin.choose_gemm(0)
    lin.forward_fp8(x8, y, training=True)
    assert lin.gemm_kind == fp8amp.GemmKind.FP8
    xq = x8.numpy().astype(np.float64)  # the norm's codes, decoded by ml_dtypes
    s_x = lin.scaling(Role.INPUT).scale
    s_w = scale_for(float(np.abs(w).max()), 448.0)
    w8 = q(w, s_w, fp8amp.E4M3)
    inv = np.float64(np.float32(1 / s_x)) * np.float64(np.float32(1 / s_w))
    ref = (xq @ w8.T) * inv + b.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_less(np.abs(y.numpy() - ref), gemm_tol(ctx, xq, w8.T) * inv * 4 + np.abs(ref) * 2e-7)
    # against float64 LayerNorm + matmul of the unquantized values: E4M3 precision, normwise
    xn = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * gamma + beta
    exact = xn.astype(np.float64) @ w.T.astype(np.float64) + b
    assert np.linalg.norm(y.numpy() - exact) / np.linalg.norm(exact) < 0.08
    # the twin quantizes the norm's F32 output itself: the same codes, so the same bytes
    xw = fp8amp.Tensor(ctx, (m, k), fp8amp.F32)
    fp8amp.norm_forward(ctx, xt, gt, xw, fp8amp.Tensor(ctx, (m,), fp8amp.F32), beta=bt)
    yt = fp8amp.Tensor(ctx, (m, n), fp8amp.F32)
    twin.forward(xw, yt, training=True)
    np.testing.assert_array_equal(yt.numpy(), y.numpy())
    dy = fp8amp.Tensor.from_numpy(ctx, (rng.standard_normal((m, n)) * 1e-2).astype(np.float32))
    dx, dxt = fp8amp.Tensor(ctx, (m, k), fp8amp.F32), fp8amp.Tensor(ctx, (m, k), fp8amp.F32)
    lin.backward(dy, dx)
    twin.backward(dy, dxt)
    np.testing.assert_array_equal(dx.numpy(), dxt.numpy())
    np.testing.assert_array_equal(lin.weight_grad.numpy(), twin.weight_grad.numpy())
    np.testing.assert_array_equal(lin.bias_grad.numpy(), twin.bias_grad.numpy())
    with pytest.raises(fp8amp.DtypeMismatchError):
        lin.forward_fp8(xw, y)



@pytest.mark.parametrize("wgrad", [fp8amp.F32, fp8amp.BF16, fp8amp.E4M3])
def test_microbatch_accumulation_is_one_rounding_of_the_fp32_sum(ctx, rng, wgrad):
    m, k, n = 16, 32, 32
    lin, w, _ = make(ctx, rng, k, n, wgrad=wgrad)
    ref_lin, _, _ = make(ctx, np.random.default_rng(0), k, n, wgrad=fp8amp.F32)
    ref_lin.weight.copy_from_numpy(w)
    total_b = np.zeros(n)
    for i in range(3):
        x = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((m, k)).astype(np.float32))
        dyv = rng.standard_normal((m, n)).astype(np.float32)
        dy = fp8amp.Tensor.from_numpy(ctx, dyv)
        for layer in (lin, ref_lin):
            layer.forward(x, fp8amp.Tensor(ctx, (m, n), fp8amp.F32), training=True)
            layer.backward(dy, None, accumulate=i > 0)
        total_b += dyv.sum(0)
    s32 = ref_lin.weight_grad.numpy()  # the FP32 sum of three backwards
    got = lin.weight_grad
    if wgrad == fp8amp.F32:
        np.testing.assert_array_equal(got.numpy(), s32)
    elif wgrad == fp8amp.BF16:
        np.testing.assert_array_equal(got.numpy(), s32.astype(ml_dtypes.bfloat16))
    else:
        s = scale_for(float(np.abs(s32).max()), 448.0)
        np.testing.assert_array_equal(got.numpy().view(np.uint8), encode_satfinite(scaled_f32(s32, s), fp8amp.E4M3))
        deq = fp8amp.Tensor(ctx, got.shape, fp8amp.F32)
        fp8amp.dequantize(ctx, got, deq)
        np.testing.assert_allclose(deq.numpy(), s32, rtol=2.0 ** -4, atol=float(np.abs(s32).max()) * 2.0 ** -9)
    np.testing.assert_allclose(lin.bias_grad.numpy(), total_b, rtol=1e-5, atol=1e-4)


def test_weight_cache_and_weight_changed(ctx, rng):
    if ctx.is_cuda:
        pytest.skip("NumPy views host memory only")
    m, k, n = 16, 32, 16
    lin, w, b = make(ctx, rng, k, n)
    x = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((m, k)).astype(np.float32))
    y1, y2, y3 = (fp8amp.Tensor(ctx, (m, n), fp8amp.F32) for _ in range(3))
    lin.forward(x, y1)
    view = np.from_dlpack(lin.weight)  # zero copy: writes bypass the library
    view *= 2.0
    lin.forward(x, y2)
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())  # the cached FP8 copy is still the old W
    lin.weight_changed()
    lin.forward(x, y3)
    b_r = b.astype(ml_dtypes.bfloat16).astype(np.float32)
    # Doubling W doubles its scale_inv and leaves its codes: y - b doubles exactly.
    np.testing.assert_allclose(y3.numpy() - b_r, 2 * (y1.numpy() - b_r), rtol=1e-6, atol=1e-6)
    # A write through the library is noticed without weight_changed.
    lin.weight.copy_from_numpy(w)
    lin.forward(x, y2)
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())


def test_never_fp8_path(ctx, rng):
    m, k, n = 5, 24, 12  # not multiples of 16: fine for the BF16/F32 path
    lin, w, b = make(ctx, rng, k, n, policy="bf16")
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = fp8amp.Tensor(ctx, (m, n), fp8amp.F32)
    lin.forward(fp8amp.Tensor.from_numpy(ctx, x), y, training=True)
    if ctx.is_cuda:
        assert lin.gemm_kind == fp8amp.GemmKind.BF16
        xr = x.astype(ml_dtypes.bfloat16).astype(np.float64)
        wr = w.astype(ml_dtypes.bfloat16).astype(np.float64)
        ref = xr @ wr.T + b
        # the BF16 epilogue may round the bias to BF16 (2^-9 relative)
        np.testing.assert_array_less(np.abs(y.numpy() - ref), np.abs(b) * 2.0 ** -8 + np.abs(ref) * 1e-5 + 1e-5)
    else:
        assert lin.gemm_kind == fp8amp.GemmKind.F32
        ref = x.astype(np.float64) @ w.T.astype(np.float64) + b  # the F32 path adds the F32 bias
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise_and_change_nothing(ctx, rng):
    lin, w, _ = make(ctx, rng, 32, 16)
    x = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((16, 32)).astype(np.float32))
    with pytest.raises(fp8amp.ShapeMismatchError, match="fp8amp_linear_forward"):
        lin.forward(x, fp8amp.Tensor(ctx, (16, 17), fp8amp.F32))
    with pytest.raises(fp8amp.DtypeMismatchError):
        lin.forward(x, fp8amp.Tensor(ctx, (16, 16), fp8amp.E4M3))
    with pytest.raises(fp8amp.InvalidArgumentError, match="fp8amp_linear_backward"):
        lin.backward(fp8amp.Tensor(ctx, (16, 16), fp8amp.F32))  # no training forward yet
    with pytest.raises(fp8amp.InvalidArgumentError):
        fp8amp.Linear(ctx, 0, 16)
    with pytest.raises(fp8amp.DtypeMismatchError):
        fp8amp.Linear(ctx, 16, 16, weight_dtype=fp8amp.E5M2)
    with pytest.raises(ValueError):
        fp8amp.Linear(ctx, 16, 16, policy="sometimes")
    with pytest.raises(fp8amp.InvalidArgumentError):
        fp8amp.Linear(ctx, 16, 16, bias=False).scaling(Role.WEIGHT_STORAGE)
    assert fp8amp.Linear(ctx, 16, 16, bias=False).bias is None
    np.testing.assert_array_equal(lin.weight.numpy(), w)


def test_linear_lifetime(ctx, rng):
    lin, w, _ = make(ctx, rng, 16, 16)
    wt = lin.weight
    meta = lin.scaling(Role.INPUT)
    lin.close()
    lin.close()
    np.testing.assert_array_equal(wt.numpy(), w)  # the tensor outlives the Linear
    assert meta.scale == 1.0
    with pytest.raises(fp8amp.InvalidHandleError):
        lin.weight_changed()
    with fp8amp.Linear(ctx, 16, 16) as l2:
        assert not l2.closed
    assert l2.closed


@pytest.mark.parametrize("level,weight", [("O1", fp8amp.F16), ("O2", fp8amp.F16), ("O3", fp8amp.E4M3)])
def test_for_level_takes_the_presets(ctx, level, weight):
    with fp8amp.Linear.for_level(ctx, level, 32, 16) as lin:
        assert lin.weight.dtype == weight
        assert lin.weight_grad.dtype == fp8amp.E4M3
        # a scaled weight is bound to the WEIGHT_STORAGE meta
        lin.scaling(fp8amp.Role.WEIGHT_STORAGE).close()
    with pytest.raises(ValueError):
        fp8amp.Linear.for_level(ctx, "O4", 32, 16)


@pytest.mark.parametrize("policy", ["fp8", "bf16"])
def test_graph_replay_matches_launching_every_kernel(ctx, rng, policy):
    """graph_replay (docs/linear.md 6.1): the same training steps on the same memory, fresh data each
    step, give the same bytes as a Linear that launches every kernel; on CUDA it really replayed."""
    m, k, n = 32, 64, 48
    lins = []
    for replay in (True, False):
        lin = fp8amp.Linear(ctx, k, n, weight_dtype=fp8amp.F32, wgrad_dtype=fp8amp.E4M3, policy=policy,
                            graph_replay=replay)
        lins.append(lin)
    w = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)
    x, dy = fp8amp.Tensor(ctx, (m, k), fp8amp.BF16), fp8amp.Tensor(ctx, (m, n), fp8amp.BF16)
    outs = [(fp8amp.Tensor(ctx, (m, n), fp8amp.F32), fp8amp.Tensor(ctx, (m, k), fp8amp.BF16)) for _ in lins]
    for step in range(6):
        if step in (0, 3):  # a new weight midway
            w = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)
            for lin in lins:
                lin.weight.copy_from_numpy(w)
        x.copy_from_numpy(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16))
        dy.copy_from_numpy(rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16))
        for lin, (y, dx) in zip(lins, outs):
            lin.forward(x, y, training=True)
            lin.backward(dy, dx, accumulate=step % 2 == 1)
        a, b = lins
        for ta, tb in ((outs[0][0], outs[1][0]), (outs[0][1], outs[1][1]), (a.weight_grad, b.weight_grad),
                       (a.bias_grad, b.bias_grad)):
            got, want = ta.numpy(), tb.numpy()
            assert np.isfinite(want.astype(np.float32)).all()
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert lins[1].graph_replays == 0
    if ctx.is_cuda:
        assert lins[0].graph_replays >= 4
    else:
        assert lins[0].graph_replays == 0
