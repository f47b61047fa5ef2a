"""Lean buffers in the PyTorch front (issue 18, peak training memory; fp8amp_linear_set_lean,
docs/torch.md section 5): fp8amp.torch.Linear is lean (level 1) by default; level 1 gives the same bits
as level 0 over training steps with micro-batches (O1/O2/O3), level 2 without micro-batches; a lean
training forward keeps no FP8 weight copy and its backward gives back the saved input; writing the
weight between a training forward and its backward is refused; the Optimizer's step gives the
contexts' scratch pools back; on a GPU, giving the scratch back does not wait for the device."""
import pytest

torch = pytest.importorskip("torch")
from fp8amp import optim  # noqa: E402

pytestmark = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")


def _model(tdev, level, seed, lean):
    import fp8amp.torch as ft

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 48)).to(tdev)
    model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-2), level, policy="fp8")
    for m in _linears(model):
        assert m.fp8amp_linear.lean == 1  # the front's default
        m.fp8amp_linear.lean = lean
    return model, opt


def _linears(model):
    import fp8amp.torch as ft

    return [m for m in model.modules() if isinstance(m, ft.Linear)]


def _micro_batches(tdev, seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g).to(tdev), torch.randn(16, 48, generator=g).to(tdev)) for _ in range(n)]


def _run(tdev, level, seed, data, lean, per_step):
    model, opt = _model(tdev, level, seed, lean)
    out = []
    for step in range(len(data) // per_step):
        for x, t in data[per_step * step:per_step * (step + 1)]:
            x = x.clone().requires_grad_(True)
            loss = (model(x) - t).square().mean()
            loss.backward()
            out += [loss.detach().clone(), x.grad.clone()]
        out += [m.dequantized_weight_grad().clone() for m in _linears(model)]
        opt.step()
        opt.zero_grad()
        out += [p.detach().float().clone() for p in model.parameters()]
    return out


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_lean_1_changes_no_bit(tdev, level, rng):
    """Two micro-batches per step, three steps: losses, input gradients, weight gradients and weights
    of lean=1 are those of lean=0, bit for bit."""
    seed = int(rng.integers(2**31))
    data = _micro_batches(tdev, int(rng.integers(2**31)), 6)
    a, b = _run(tdev, level, seed, data, 0, 2), _run(tdev, level, seed, data, 1, 2)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.isfinite(u).all()
        assert torch.equal(u, v)


def test_lean_2_changes_no_bit_without_micro_batches(tdev, rng):
    seed = int(rng.integers(2**31))
    data = _micro_batches(tdev, int(rng.integers(2**31)), 4)
    a, b = _run(tdev, "O2", seed, data, 0, 1), _run(tdev, "O2", seed, data, 2, 1)
    for u, v in zip(a, b):
        assert torch.isfinite(u).all()
        assert torch.equal(u, v)


def test_lean_2_micro_batches_within_e4m3_rounding(tdev, rng):
    """lean=2 with two micro-batches: the second adds to the delivered E4M3 gradient (one rounding
    more): the step's gradient is within E4M3's rounding of lean=0's, and not equal to the first
    micro-batch's alone."""
    seed = int(rng.integers(2**31))
    data = _micro_batches(tdev, int(rng.integers(2**31)), 2)
    grads = []
    for lean in (0, 2):
        model, _ = _model(tdev, "O2", seed, lean)
        for x, t in data:
            (model(x) - t).square().mean().backward()
        grads.append([m.dequantized_weight_grad().double() for m in _linears(model)])
    for g0, g2 in zip(*grads):
        assert torch.isfinite(g2).all()
        assert float((g2 - g0).norm() / g0.norm()) < 0.07


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_lean_forward_keeps_no_weight_copy(tdev, level, rng):
    """After a training forward a lean Linear holds its fresh bytes plus the saved x8^T (and at most
    the bias's epilogue copy); a lean=0 one also the FP8 weight copies. After the backward the lean one
    gave the saved input back (the FP32 sum stays until the step)."""
    seed = int(rng.integers(2**31))
    (x, t), = _micro_batches(tdev, int(rng.integers(2**31)), 1)
    held = {}
    for lean in (0, 1):
        model, _ = _model(tdev, level, seed, lean)
        lins = _linears(model)
        fresh = [m.fp8amp_linear.memory_bytes for m in lins]
        y = model(x)
        fwd = [m.fp8amp_linear.memory_bytes - f for m, f in zip(lins, fresh)]
        (y - t).square().mean().backward()
        bwd = [m.fp8amp_linear.memory_bytes - f for m, f in zip(lins, fresh)]
        held[lean] = (fwd, bwd, lins)
    for i, m in enumerate(held[1][2]):
        saved = 16 * m.in_features + 4  # x8^T and its scale slot
        assert saved <= held[1][0][i] <= saved + 4 * m.out_features
        assert held[0][0][i] >= saved + m.weight.numel()  # the transposed FP8 weight at least
        assert 4 * m.weight.numel() <= held[1][1][i] <= 4 * m.weight.numel() + 4 * m.out_features


def test_weight_written_between_forward_and_backward_is_refused(tdev, rng):
    import fp8amp

    model, _ = _model(tdev, "O2", int(rng.integers(2**31)), 1)
    (x, t), = _micro_batches(tdev, int(rng.integers(2**31)), 1)
    lins = _linears(model)
    (model(x) - t).square().mean().backward()  # a gradient to keep (not zeros)
    assert bool((lins[1].dequantized_weight_grad() != 0).any())
    for write in ("torch", "c"):
        loss = (model(x.clone().requires_grad_(True)) - t).square().mean()
        g = lins[1].dequantized_weight_grad()
        with torch.no_grad():
            if write == "torch":
                lins[1].weight.mul_(0.5)  # (the last layer: its backward runs first)
            else:
                lins[1].fp8amp_linear.weight_changed()
        with pytest.raises(fp8amp.InvalidArgumentError, match="lean"):
            loss.backward()
        assert torch.equal(lins[1].dequantized_weight_grad(), g)  # the refused backward changed nothing
    # a new forward backs the written weight
    x1 = x.clone().requires_grad_(True)
    (model(x1) - t).square().mean().backward()
    assert torch.isfinite(x1.grad).all() and bool((x1.grad != 0).any())


def test_optimizer_step_gives_the_scratch_back(tdev, rng):
    """The fp8amp Optimizer's step and a torch optimizer's (the front's post-step hook) leave the
    contexts' scratch pools empty."""
    import fp8amp.torch as ft

    model, opt = _model(tdev, "O2", int(rng.integers(2**31)), 1)
    ctx = _linears(model)[0]._ctx
    for x, t in _micro_batches(tdev, int(rng.integers(2**31)), 2):
        (model(x) - t).square().mean().backward()
        assert ctx.scratch_bytes() > 0
        opt.step()
        opt.zero_grad()
        assert ctx.scratch_bytes() == 0
    torch.manual_seed(int(rng.integers(2**31)))
    plain = ft.initialize(torch.nn.Sequential(torch.nn.Linear(32, 48)).to(tdev), policy="fp8")
    topt = torch.optim.SGD(plain.parameters(), lr=1e-2)
    (x, t), = _micro_batches(tdev, int(rng.integers(2**31)), 1)
    (plain(x) - t).square().mean().backward()
    assert ctx.scratch_bytes() > 0
    topt.step()
    assert ctx.scratch_bytes() == 0


def test_release_scratch_does_not_wait_for_the_device(rng):
    """On a GPU: with a long kernel queued on torch's stream after the Linears' work, giving the
    scratch back returns while the kernel still runs (no host wait: the caching allocator orders the
    blocks' reuse after it), and the next step's results are unchanged."""
    from conftest import HAVE_CUDA

    if not (torch.cuda.is_available() and HAVE_CUDA):
        pytest.skip("no CUDA device for PyTorch")
    tdev = torch.device("cuda")
    model, opt = _model(tdev, "O2", int(rng.integers(2**31)), 1)
    ctx = _linears(model)[0]._ctx
    (x, t), = _micro_batches(tdev, int(rng.integers(2**31)), 1)
    (model(x) - t).square().mean().backward()
    torch.cuda.synchronize()
    pool = ctx.scratch_bytes()
    assert pool > 0
    before = torch.cuda.memory_allocated()
    torch.cuda._sleep(2_000_000_000)  # about a second of spinning on the current stream
    ctx.release_scratch()
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert busy, "release_scratch waited for the device"
    assert ctx.scratch_bytes() == 0
    # the pool and the cuBLASLt workspace went back to torch's caching allocator
    assert before - torch.cuda.memory_allocated() > pool


def test_lean_level_is_checked():
    """fp8amp.Linear.lean takes 0, 1 or 2 (InvalidArgumentError otherwise, nothing changed);
    fp8amp.torch.Linear(lean=...) refuses anything else with a TypeError."""
    import fp8amp
    import fp8amp.torch as ft

    lin = fp8amp.Linear(fp8amp.Context("cpu"), 32, 16)
    assert lin.lean == 0
    lin.lean = 2
    with pytest.raises(fp8amp.InvalidArgumentError, match="lean"):
        lin.lean = 3
    assert lin.lean == 2
    with pytest.raises(TypeError, match="lean"):
        ft.Linear(32, 16, lean=5)
    assert ft.Linear(32, 16, lean=0).fp8amp_linear.lean == 0
