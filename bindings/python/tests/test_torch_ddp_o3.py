"""DistributedDataParallel at O3 (E4M3 Linear weights with F16 masters) is refused, never a silent
wrong result (issue 18 point 2; docs/torch.md section 6): DDP buckets a parameter's gradient in the
parameter's dtype, float8 at O3, which no collective reduces. Over gloo DDP's constructor fails itself
(gloo cannot broadcast float8 tensors); over NCCL the constructor passes and the first backward's copy
of an E4M3 weight gradient into its float8 bucket raises fp8amp's NotImplementedError, which names
all_reduce_grads. One process: that copy (and DDP's mul_out) raise; reading the gradient still works.
fp8amp.torch.data_parallel(model) is DDP at O3: the E4M3 weights left out of DDP and reduced by
fp8amp's hooks; 2 gloo processes against the single process on the combined batch."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
from ranks import run_case  # noqa: E402
from test_torch_ddp import B, GPUS, _data, _init, _model, _rel, _train  # noqa: E402
from torch import nn  # noqa: E402

E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("dev_type", ["cpu", "cuda"])
def test_o3_gradient_into_a_float8_tensor_is_refused(rng, dev_type):
    """DDP's bucket copy at O3, in one process: copy_ and mul(out=) of an O3 weight's gradient handle
    into a plain float8 tensor raise NotImplementedError naming DDP and all_reduce_grads (before this
    change they cast the float32 values to E4M3 without a scale: saturated); reading the values
    (float(), clip_grad_norm_) and writes into the handle still work."""
    import fp8amp.torch as ft

    if dev_type == "cuda" and not GPUS:
        pytest.skip("no CUDA device for PyTorch")
    dev = torch.device(dev_type)
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    lin = ft.Linear(32, 48, device=dev, weight_dtype=E4M3)
    lin(torch.randn(16, 32, generator=g).to(dev)).square().sum().backward()
    grad = lin.weight.grad
    assert isinstance(grad, ft.LinearGrad) and grad.dtype == E4M3
    bucket = torch.empty(48, 32, dtype=E4M3, device=dev)
    with pytest.raises(NotImplementedError, match="all_reduce_grads"):
        bucket.copy_(grad)
    with pytest.raises(NotImplementedError, match="DistributedDataParallel"):
        torch.mul(grad, 0.5, out=bucket)
    want = lin.dequantized_weight_grad()
    assert torch.equal(grad.float(), want)
    norm = torch.nn.utils.clip_grad_norm_([lin.weight], float(want.norm()) / 2)
    torch.testing.assert_close(norm, want.norm(), rtol=1e-5, atol=0)
    got = lin.dequantized_weight_grad()
    assert float((got - want / 2).abs().max()) <= float(want.abs().max()) * 2.0 ** -4


def o3_case(rank, world, seed, dev, out):
    import fp8amp.torch as ft

    model = _model(seed, dev)
    model, _ = ft.initialize(model, torch.optim.Adam(model.parameters()), "O3")
    x, y = _data(seed, world, dev)[0]
    if dev.type == "cpu":
        with pytest.raises(RuntimeError, match="Invalid scalar type"):  # gloo: no float8 broadcast
            nn.parallel.DistributedDataParallel(model)
        return
    try:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    except RuntimeError as e:  # an NCCL build that broadcasts no float8: refused before any training
        print("rank %d: DDP's constructor refused the float8 parameters: %s" % (rank, e))
        return
    with pytest.raises(Exception, match="all_reduce_grads"):  # the reducer may re-raise as its own type
        (ddp(x[rank * B:(rank + 1) * B]) - y[rank * B:(rank + 1) * B]).square().mean().backward()


def data_parallel_case(rank, world, seed, dev, out, policy, micro):
    import fp8amp.torch as ft

    model, opt, _ = _init("O3", None, policy, seed, dev)
    ddp = ft.data_parallel(model, device_ids=[rank] if dev.type == "cuda" else None)
    grads0, _ = _train(ddp, opt, _data(seed, world, dev), slice(rank * B, (rank + 1) * B), micro)
    torch.save({"grads0": grads0, "params": _values(model)}, os.path.join(out, "rank%d.pt" % rank))


def _values(model):
    """The Linears' weights (E4M3: the codes times their scale) and biases, as float32 on the CPU."""
    import fp8amp.torch as ft

    out = []
    for m in model.modules():
        if isinstance(m, ft.Linear):
            out += [m.dequantized_weight().cpu(), m.bias.detach().float().clone().cpu()]
    return out


def _run(world, dev_type, rng):
    seed = int(rng.integers(2**31))
    with tempfile.TemporaryDirectory() as out:
        run_case(__name__, "o3_case", world, seed, dev_type, out, timeout=200)


def check_data_parallel(dev_type, world, policy, micro, rng):
    seed = int(rng.integers(2**31))
    dev = torch.device(dev_type, 0) if dev_type == "cuda" else torch.device("cpu")
    with tempfile.TemporaryDirectory() as out:
        run_case(__name__, "data_parallel_case", world, seed, dev_type, out, (policy, micro))
        ranks = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(world)]
    for r in ranks[1:]:  # every rank took the same steps
        for a, b in zip(r["params"], ranks[0]["params"]):
            assert torch.equal(a, b)
    data = _data(seed, world, dev)
    model, opt, _ = _init("O3", None, policy, seed, dev)
    init = _values(model)  # the E4M3 weights every run starts from
    ref_g, _ = _train(model, opt, data, slice(0, world * B))
    ref_p = _values(model)
    model, opt, _ = _init("O3", None, policy, seed, dev)
    solo_g, _ = _train(model, opt, data, slice(0, B))
    solo_p = _values(model)
    tol_g, tol_u = tolerance_o3(dev_type, policy)
    errs = [_rel(g, w) for g, w in zip(ranks[0]["grads0"], ref_g)]
    solo = [_rel(g, w) for g, w in zip(solo_g, ref_g)]
    upd = [_rel(p - i, w - i) for p, w, i in zip(ranks[0]["params"], ref_p, init)]
    solo_upd = [_rel(p - i, w - i) for p, w, i in zip(solo_p, ref_p, init)]
    # The E4M3 weights (even indices): their updates over 3 steps are about 1% of their values, below
    # an E4M3 step (2^-3 of the value), so whether two nearly equal F16 masters round to the same code
    # is a matter of where they sit: those weights are checked elementwise to be the reference's within
    # one E4M3 step (2^-3 of the value, plus the subnormal floor of their scale) plus the update
    # tolerance of the element's own reference update (tol_u |w - init|: a weight whose 3 updates
    # carried it near zero -- seed 1795684202324054012: init 4.5e-3, reference update -3.98e-3, data
    # parallel -4.47e-3 -- differs from the reference by far more than a step of its final value);
    # the gradients (above) and the F32 biases' updates carry the comparison.
    for k, (p, w) in enumerate(zip(ranks[0]["params"], ref_p)):
        if k % 2 == 0:
            floor = float(w.abs().max()) * 2.0 ** -9
            bound = w.abs() * 2.0 ** -3 + floor + tol_u * (w - init[k]).abs()
            assert bool(((p - w).abs() <= bound).all()), (k, float(((p - w).abs() - bound).max()))
    diff = [float((p != w).float().mean()) for p, w in zip(ranks[0]["params"][::2], ref_p[::2])]
    print("fraction of E4M3 weight values that differ from the reference (a scale apart counts)", diff)
    bias_upd = upd[1::2]
    print("tolerances", tol_g, tol_u, "grad errors", errs, "solo", solo, "update errors", upd, "solo", solo_upd)
    assert max(errs) <= tol_g and max(bias_upd) <= tol_u, (errs, bias_upd, tol_g, tol_u)
    assert max(solo) > tol_g and max(solo_upd[1::2]) > tol_u, (solo, solo_upd)


def tolerance_o3(dev_type, policy):
    """As test_torch_ddp.tolerance at O2 (the E4M3 weight gradient: each rank's quantization, the
    average written back into the codes, against one: 3 * 2^-4; Adam's E4M3 m: updates 2^-2), plus
    2^-3 for the F16 masters' own difference. The weights being E4M3 here, the E4M3 weights' values
    (against which the updates are measured) may moreover round one E4M3 step apart, at most 2^-3 of
    the weight's value, wherever two nearly equal masters (or their scales) straddle a rounding
    boundary: check_data_parallel adds 2^-3 ||w|| to those weights' bound. Policy fp8 adds 2^-2
    (per-rank current scales, test_torch_ddp.tolerance)."""
    g = (1e-5 if dev_type == "cpu" else 1e-4) + 3 * 2.0 ** -4
    u = 2.0 ** -2 + 2.0 ** -3
    if policy == "fp8":
        g, u = g + 2.0 ** -2, u + 2.0 ** -2
    return g, u


@pytest.mark.parametrize("micro", [False, True])
def test_data_parallel_at_o3_gloo_equals_the_combined_batch(rng, micro):
    """fp8amp.torch.data_parallel at O3 over gloo, 2 CPU processes, policy bf16: every rank ends with the
    same E4M3 weights, and the first step's gradients and the updates after 3 steps of fp8amp's O3 Adam
    equal the single process on the combined batch within `tolerance_o3` (which rank 0's rows alone
    fail); with micro-batches under no_sync() too."""
    check_data_parallel("cpu", 2, "bf16", micro, rng)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one process per visible GPU)")
@pytest.mark.parametrize("policy", ["bf16", "fp8"])
def test_data_parallel_at_o3_nccl_equals_the_combined_batch(rng, policy):
    """As the gloo test on every visible GPU (one process each, NCCL)."""
    check_data_parallel("cuda", GPUS, policy, False, rng)


def test_ddp_at_o3_is_refused_over_gloo(rng):
    """2 CPU processes: DDP's constructor fails (gloo broadcasts no float8 tensor): no training runs."""
    _run(2, "cpu", rng)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one process per visible GPU)")
def test_ddp_at_o3_is_refused_over_nccl(rng):
    """Every visible GPU: the first backward raises fp8amp's NotImplementedError naming
    all_reduce_grads, from DDP's copy of an E4M3 weight gradient into its float8 bucket."""
    _run(GPUS, "cuda", rng)
