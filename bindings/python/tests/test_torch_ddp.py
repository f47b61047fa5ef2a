"""Gradients through autograd and stock DistributedDataParallel (issue 18 item 2; docs/torch.md
sections 5 and 6): the fp8amp.torch.Linear backward hands each parameter's gradient to autograd as a
LinearGrad (a handle to the C Linear's gradient memory), so register_post_accumulate_grad_hook and
DDP's reducer fire; writes into an E4M3 gradient (DDP's averaged bucket, clipping, zero_grad) reach
the codes and later micro-batches add onto them. DDP: 2 processes over gloo on the CPU (O1 with F32
weight gradients, O2 with E4M3 ones) against the single-process run on the combined batch; the same
on 2+ GPUs over NCCL, with fp8amp.torch.fp8_comm_hook too (SKIPPED without 2 GPUs: one process per
GPU, as many as are visible). Every test draws fresh random data (seed printed)."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
from ranks import run_case  # noqa: E402
from torch import nn  # noqa: E402

import fp8amp  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() and fp8amp.device_count("cuda") > 0 else 0
E4M3 = torch.float8_e4m3fn


def randn(gen, *shape, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(device)


def twin(lin, tdev):
    """An F32-gradient ft.Linear with lin's parameters (the same FP8 forward and backward GEMMs)."""
    import fp8amp.torch as ft

    t = ft.Linear(lin.in_features, lin.out_features, device=tdev, policy=lin.policy, wgrad_dtype=torch.float32)
    with torch.no_grad():
        t.weight.copy_(lin.weight)
        t.bias.copy_(lin.bias)
    return t


def e4m3_bound(want, *parts):
    """Elementwise bound for an E4M3 gradient against float `want`: half an E4M3 step (2^-4 relative)
    for each quantization a part went through, at that part's magnitude, plus the subnormal floor of
    a current scale (amax / 448 * 2^-10 per quantization; 2^-8 of the amax covers several)."""
    b = want.abs() * 2.0 ** -4
    for p in parts:
        b = b + p.abs() * 2.0 ** -4
    amax = max([float(want.abs().max())] + [float(p.abs().max()) for p in parts])
    return b + amax * 2.0 ** -8


# ---- hooks and accumulation (one process) ----------------------------------------------------------


@pytest.mark.parametrize("wgrad", [torch.float32, E4M3])
def test_post_accumulate_grad_hooks_fire_once_per_backward(tdev, gen, wgrad):
    """register_post_accumulate_grad_hook on the weight and the bias fires once per backward (three
    micro-batches; in the third the layer runs twice, autograd's sum of the two handles is one
    gradient); inside the hook .grad already holds the accumulated gradient (the F32 view itself, or a
    LinearGrad whose values are the dequantized codes); the accumulation is unchanged: the F32 sum of
    the micro-batches."""
    import fp8amp.torch as ft

    lin = ft.Linear(32, 48, device=tdev, policy="fp8", wgrad_dtype=wgrad)
    ref = twin(lin, tdev)
    seen = {"w": [], "b": []}
    lin.weight.register_post_accumulate_grad_hook(lambda p: seen["w"].append(p.grad.float().clone()))
    lin.bias.register_post_accumulate_grad_hook(lambda p: seen["b"].append(p.grad.float().clone()))
    total_w = torch.zeros(48, 32, device=tdev)
    total_b = torch.zeros(48, device=tdev)
    for i in range(3):
        x = randn(gen, 16, 32, device=tdev)
        if i < 2:
            lin(x).square().sum().backward()
            ref.zero_grad()
            ref(x).square().sum().backward()
        else:
            x2 = randn(gen, 16, 32, device=tdev)
            (lin(x).square().sum() + lin(x2).sin().sum()).backward()
            ref.zero_grad()
            (ref(x).square().sum() + ref(x2).sin().sum()).backward()
        total_w += ref.weight.grad
        total_b += ref.bias.grad
        assert len(seen["w"]) == i + 1 and len(seen["b"]) == i + 1, (i, len(seen["w"]), len(seen["b"]))
        torch.testing.assert_close(seen["b"][-1], total_b, rtol=1e-5, atol=1e-5)
        if wgrad == torch.float32:
            assert lin.weight.grad.data_ptr() == lin.fp8amp_linear.weight_grad.data_ptr  # still the view
            torch.testing.assert_close(seen["w"][-1], total_w, rtol=1e-5, atol=1e-5)
        else:
            assert isinstance(lin.weight.grad, ft.LinearGrad)
            assert torch.equal(seen["w"][-1], lin.dequantized_weight_grad())
            assert bool(((seen["w"][-1] - total_w).abs() <= e4m3_bound(total_w)).all())


@pytest.mark.parametrize("wgrad", [torch.float32, E4M3])
def test_weight_also_used_outside_the_layer(tdev, gen, wgrad):
    """A penalty on the weight besides the layer: autograd sums the layer's gradient handle with the
    penalty's plain gradient; the parameter's gradient is their sum."""
    import fp8amp.torch as ft

    lin = ft.Linear(32, 48, device=tdev, policy="fp8", wgrad_dtype=wgrad)
    ref = twin(lin, tdev)
    x = randn(gen, 16, 32, device=tdev)
    c = float(torch.rand((), generator=gen)) + 0.5
    calls = []
    lin.weight.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    (lin(x).square().sum() + c * lin.weight.square().sum()).backward()
    ref(x).square().sum().backward()
    want = ref.weight.grad + 2 * c * ref.weight.detach()
    assert len(calls) == 1
    got = lin.weight.grad.float()
    if wgrad == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # the layer's E4M3 gradient, dequantized, plus the penalty, quantized again
        assert bool(((got - want).abs() <= e4m3_bound(want, ref.weight.grad)).all())


def test_writes_into_an_e4m3_gradient_then_more_micro_batches(tdev, gen):
    """weight.grad.mul_ between micro-batches (what DDP's copy of the averaged bucket is to the codes):
    the next backward adds onto the written value, not onto the C Linear's older FP32 sum; a torch
    zero_grad(set_to_none=False) (zero_) makes the next backward start over."""
    import fp8amp.torch as ft

    lin = ft.Linear(32, 48, device=tdev, policy="fp8", wgrad_dtype=E4M3)
    ref = twin(lin, tdev)
    xs = [randn(gen, 16, 32, device=tdev) for _ in range(4)]
    ts = []
    for x in xs:
        ref.zero_grad()
        ref(x).square().sum().backward()
        ts.append(ref.weight.grad.clone())
    lin(xs[0]).square().sum().backward()
    g1 = lin.dequantized_weight_grad()
    codes = torch.from_dlpack(lin.weight_grad_fp8()).clone()
    lin.weight.grad.mul_(0.5)  # current scaling: halving keeps the codes, halves the scale
    assert torch.equal(torch.from_dlpack(lin.weight_grad_fp8()).view(torch.uint8), codes.view(torch.uint8))
    # the new scale is 448 / the halved dequantized amax, rounded: equal to half the old one within
    # float32 rounding, not bit for bit
    torch.testing.assert_close(lin.dequantized_weight_grad(), g1 * 0.5, rtol=2.0 ** -20, atol=0)
    lin(xs[1]).square().sum().backward()
    want = 0.5 * ts[0] + ts[1]
    got = lin.dequantized_weight_grad()
    assert bool(((got - want).abs() <= e4m3_bound(want, 0.5 * ts[0], ts[1])).all())
    lin(xs[2]).square().sum().backward()  # still adding onto the written value
    want = want + ts[2]
    got = lin.dequantized_weight_grad()
    assert bool(((got - want).abs() <= e4m3_bound(want, 0.5 * ts[0], ts[1], ts[2], want - ts[2])).all())
    torch.optim.SGD(lin.parameters(), lr=0.1).zero_grad(set_to_none=False)
    assert torch.equal(lin.dequantized_weight_grad(), torch.zeros_like(g1))
    lin(xs[3]).square().sum().backward()
    got = lin.dequantized_weight_grad()
    assert bool(((got - ts[3]).abs() <= e4m3_bound(ts[3])).all())


def test_writes_into_a_bf16_gradient_view_then_more_micro_batches(tdev, gen):
    """O1 with BF16 weights and gradients: weight.grad is the plain BF16 view, the C Linear sums in
    FP32 behind it; a torch write into the view (its version moves) between micro-batches is kept:
    the next backward adds onto it."""
    import fp8amp.torch as ft

    lin = ft.Linear(32, 48, device=tdev, policy="fp8", weight_dtype=torch.bfloat16)
    ref = twin(lin, tdev)
    xs = [randn(gen, 16, 32, device=tdev) for _ in range(2)]
    ts = []
    for x in xs:
        ref.zero_grad()
        ref(x).square().sum().backward()
        ts.append(ref.weight.grad.clone())
    lin(xs[0]).square().sum().backward()
    assert lin.weight.grad.dtype == torch.bfloat16 and lin.weight.grad.data_ptr() == lin.fp8amp_linear.weight_grad.data_ptr
    lin.weight.grad.mul_(0.5)
    lin(xs[1]).square().sum().backward()
    want = 0.5 * ts[0] + ts[1]
    got = lin.weight.grad.float()
    bound = (want.abs() + 0.5 * ts[0].abs() + ts[1].abs()) * 2.0 ** -8 + float(want.abs().max()) * 2.0 ** -20
    assert bool(((got - want).abs() <= bound).all())


def test_clip_grad_norm_sees_the_e4m3_weight_gradients(tdev, gen):
    """torch.nn.utils.clip_grad_norm_ over a model with E4M3 weight gradients: the norm counts them
    (their dequantized values) and the clipping scales their codes' values."""
    import fp8amp.torch as ft

    model = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16)).to(tdev)
    model, opt = ft.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-3), "O2", policy="fp8")
    model(randn(gen, 16, 32, device=tdev)).square().mean().backward()
    before = [p.grad.float().clone() for p in model.parameters()]
    assert isinstance(model[0].weight.grad, ft.LinearGrad) and torch.equal(before[0],
                                                                            model[0].dequantized_weight_grad())
    norm = torch.stack([b.double().norm() for b in before]).norm()
    got = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float(norm) / 4)
    torch.testing.assert_close(got.double(), norm, rtol=1e-5, atol=0)
    coef = float(norm) / 4 / (float(norm) + 1e-6)
    for p, b in zip(model.parameters(), before):
        want = b * coef
        assert bool(((p.grad.float() - want).abs() <= e4m3_bound(want) + want.abs() * 1e-6).all())
    opt.step()  # fp8amp's Adam reads the clipped codes


# ---- DistributedDataParallel ---------------------------------------------------------------------

# rows per rank (a multiple of 16: CUDA's FP8 GEMMs take no other M); Adam's eps large: an update
# near-linear in the gradient
B, STEPS, LR, EPS = 16, 3, 1e-2, 0.1


def _model(seed, dev):
    torch.manual_seed(seed)  # the same initial weights in every process
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16)).to(dev)


def _data(seed, world, dev):
    g = torch.Generator().manual_seed(seed + 1)
    return [(randn(g, world * B, 32, device=dev), randn(g, world * B, 16, device=dev)) for _ in range(STEPS)]


def _train(model, opt, data, rows, micro=False):
    """STEPS steps of Adam on `rows` of each batch; the first step's gradients (float32) and the
    final parameters. `micro`: the rows in two micro-batches, the first under DDP's no_sync()."""
    grads0 = None
    for step, (x, y) in enumerate(data):
        if micro:
            h = (rows.stop - rows.start) // 2
            first, second = slice(rows.start, rows.start + h), slice(rows.start + h, rows.stop)
            with model.no_sync():
                ((model(x[first]) - y[first]).square().mean() / 2).backward()
            ((model(x[second]) - y[second]).square().mean() / 2).backward()
        else:
            loss = (model(x[rows]) - y[rows]).square().mean()
            loss.backward()
        if step == 0:
            grads0 = [p.grad.float().clone().cpu() for p in opt.param_groups[0]["params"]]
        opt.step()
        opt.zero_grad()
    return grads0, [p.detach().float().clone().cpu() for p in opt.param_groups[0]["params"]]


def _init(level, wgrad, policy, seed, dev):
    import fp8amp.torch as ft

    model = _model(seed, dev)
    init = [p.detach().float().clone().cpu() for p in model.parameters()]
    # F32 weight gradients: the float32 path throughout (weights too), whose runs differ only in the
    # order of float32 sums (tolerance()); otherwise the level's default bfloat16 weights (O1/O2),
    # whose stochastic rounding the O2 tolerances cover (one BF16 rounding, 2^-8, of an update).
    wdt = {"weight_dtype": torch.float32} if wgrad == torch.float32 else {}
    model, opt = ft.initialize(model, torch.optim.Adam(model.parameters(), lr=LR, eps=EPS), level, policy=policy,
                               wgrad_dtype=wgrad, **wdt)
    return model, opt, init


def ddp_case(rank, world, seed, dev, out, level, wgrad, policy, hook, micro=False):
    import fp8amp.torch as ft

    model, opt, _ = _init(level, wgrad, policy, seed, dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if dev.type == "cuda" else None)
    checks = []
    if hook:
        ddp.register_comm_hook(None, ft.fp8_comm_hook)
        # The hook's communicator (collective: every rank makes it here, as the hook would on its
        # first bucket), its all-reduce watched for the check flag the hook passes.
        comm = ft.communicator(dev)
        real = comm.all_reduce

        def watched(inputs, outputs, *args, check_args=True, **kwargs):
            checks.append(check_args)
            return real(inputs, outputs, *args, check_args=check_args, **kwargs)

        comm.all_reduce = watched
    grads0, params = _train(ddp, opt, _data(seed, world, dev), slice(rank * B, (rank + 1) * B), micro)
    if hook:
        del comm.all_reduce
        # Each bucket layout checked once, its first time; the repeats (every step after DDP's bucket
        # rebuild) unchecked, so that the hook never waits on the host there.
        layouts = comm._checked_bucket_layouts
        assert checks and checks[0] is True and checks.count(True) == len(layouts) and False in checks, (checks, layouts)
    torch.save({"grads0": grads0, "params": params}, os.path.join(out, "rank%d.pt" % rank))


def cpu_hook_case(rank, world, seed, dev, out, level, wgrad, policy, hook):
    import fp8amp.torch as ft

    model, _, _ = _init(level, wgrad, policy, seed, dev)
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, ft.fp8_comm_hook)
    x, y = _data(seed, world, dev)[0]
    try:
        (ddp(x[:B]) - y[:B]).square().mean().backward()
    except Exception as e:  # noqa: BLE001 -- the reducer re-raises the hook's error as its own type
        assert "fp8_comm_hook" in str(e) and "MPI" in str(e) and "gloo" in str(e), str(e)
    else:
        raise AssertionError("fp8_comm_hook accepted a CPU bucket")


def run_ranks(world, case, seed, dev_type, out, args, timeout=300):
    run_case(__name__, case, world, seed, dev_type, out, args, timeout=timeout)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def check_ddp(dev_type, world, level, wgrad, policy, hook, rng, micro=False):
    seed = int(rng.integers(2**31))
    dev = torch.device(dev_type, 0) if dev_type == "cuda" else torch.device("cpu")
    with tempfile.TemporaryDirectory() as out:
        run_ranks(world, "ddp_case", seed, dev_type, out, (level, wgrad, policy, hook, micro))
        ranks = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(world)]
    # every rank took the same steps: DDP gave each the same averaged gradients
    for r in ranks[1:]:
        for a, b in zip(r["params"], ranks[0]["params"]):
            assert torch.equal(a, b)
    # the single process on the combined batch, and (to show the tolerance tells) on rank 0's rows only
    data = _data(seed, world, dev)
    model, opt, init = _init(level, wgrad, policy, seed, dev)
    ref_g, ref_p = _train(model, opt, data, slice(0, world * B))
    model, opt, _ = _init(level, wgrad, policy, seed, dev)
    solo_g, solo_p = _train(model, opt, data, slice(0, B))
    tol_g, tol_u = tolerance(dev_type, level, policy, hook)
    errs = [_rel(g, w) for g, w in zip(ranks[0]["grads0"], ref_g)]
    solo = [_rel(g, w) for g, w in zip(solo_g, ref_g)]
    upd = [_rel(p - i, w - i) for p, w, i in zip(ranks[0]["params"], ref_p, init)]
    solo_upd = [_rel(p - i, w - i) for p, w, i in zip(solo_p, ref_p, init)]
    print("tolerances", tol_g, tol_u, "grad errors", errs, "solo", solo, "update errors", upd, "solo", solo_upd)
    assert max(errs) <= tol_g and max(upd) <= tol_u, (errs, upd, tol_g, tol_u)
    # without the averaging (rank 0's rows alone) the same checks (max <= tol) fail: the tolerances tell
    assert max(solo) > tol_g and max(solo_upd) > tol_u, (solo, solo_upd)


def tolerance(dev_type, level, policy, hook):
    """Normwise relative tolerances of the first step's gradients and of the parameters' updates after
    STEPS Adam steps (eps = 0.1: an update near-linear in the gradient), DDP against the combined batch.

    - policy "bf16": the GEMMs are F32 on the CPU and round x, W, dY to BF16 element by element on
      CUDA (no scale: every element rounds the same in both runs), so the runs differ only in the
      order of float32 sums: 1e-5 (CPU), 1e-4 (CUDA). O2 quantizes the weight gradient to E4M3 three
      times more in DDP than alone (each rank's own, then the average written back into the codes)
      against once: at most 2^-4 relative each, 3 * 2^-4 in all, worst case; and O2's Adam keeps m in
      E4M3, whose rounding of nearly equal inputs may differ by one step (2^-3 relative) at a few
      elements: updates get 2^-2 (the measured update errors are a few percent).
    - policy "fp8": x and dY are quantized with one current scale per tensor, i.e. per rank (half
      batch) in DDP against the whole batch alone, so every product of a GEMM takes another rounding
      of its two E4M3 factors (2^-4 relative each), and the first layer's gradient goes through two
      such GEMMs (dX of the second layer, then dW): 2 * 2 * 2^-4 = 2^-2 worst case (measured: ~0.1);
      O2 adds its gradient quantizations (3 * 2^-4) to that.
    - fp8_comm_hook: its FP8 wire and its E4M3 result rounding (2 * 2^-4, docs/communicator.md)."""
    if policy == "bf16":
        g = 1e-5 if dev_type == "cpu" else 1e-4
        u = g
        if level == "O2":
            g, u = g + 3 * 2.0 ** -4, 2.0 ** -2
    else:
        g = 2.0 ** -2 + (3 * 2.0 ** -4 if level == "O2" else 0.0)
        u = g
    if hook:
        g, u = g + 2 * 2.0 ** -4, u + 2 * 2.0 ** -4
    return g, u


@pytest.mark.parametrize("level,wgrad,policy", [("O1", torch.float32, "bf16"), ("O2", None, "bf16"),
                                                ("O2", None, "fp8")])
def test_ddp_gloo_two_processes_equal_the_combined_batch(rng, level, wgrad, policy):
    """Stock DDP over gloo, 2 processes on the CPU, after ft.initialize: every rank ends with the same
    parameters, and the first step's gradients and the parameters' updates after 3 steps of fp8amp's
    Adam equal the single-process run on the combined batch within `tolerance` (which the run on one
    rank's rows alone fails)."""
    check_ddp("cpu", 2, level, wgrad, policy, False, rng)


def test_ddp_gloo_micro_batches_under_no_sync(rng):
    """O2 with each rank's rows in two micro-batches, the first under ddp.no_sync(): the C Linear
    adds them in FP32 and the second backward's reduction averages the sum; same tolerances as one
    batch (the E4M3 gradient is still quantized once per rank from the FP32 sum)."""
    check_ddp("cpu", 2, "O2", None, "bf16", False, rng, micro=True)


def test_fp8_comm_hook_refuses_cpu_buckets(rng):
    """fp8amp's CPU communicator runs over MPI (mpirun's processes); DDP's gloo processes are not MPI
    ranks: the hook raises NotSupportedError, named and explained, from the backward."""
    with tempfile.TemporaryDirectory() as out:
        run_ranks(2, "cpu_hook_case", int(rng.integers(2**31)), "cpu", out, ("O2", None, "bf16", True))


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one process per visible GPU)")
@pytest.mark.parametrize("level,wgrad,policy", [("O1", torch.float32, "bf16"), ("O2", None, "bf16"),
                                                ("O2", None, "fp8")])
@pytest.mark.parametrize("hook", [False, True])
def test_ddp_nccl_gpus_equal_the_combined_batch(rng, level, wgrad, policy, hook):
    """As the gloo test, on every visible GPU (one process each, NCCL), with DDP's own all-reduce and
    with fp8amp.torch.fp8_comm_hook (FP8 on the wire)."""
    check_ddp("cuda", GPUS, level, wgrad, policy, hook, rng)
