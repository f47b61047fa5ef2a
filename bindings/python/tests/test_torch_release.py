"""Memory at rest after a training step of the PyTorch front (issue 18 point 3): fp8amp.torch's
Optimizer.step gives back each C Linear's weight copies, saved input and FP32 weight-gradient sum
(fp8amp_linear_release_buffers), so that a Linear then holds its parameters and gradients only; the
results (gradient accumulation over micro-batches included) are bit for bit those of a run that keeps
them; a backward that accumulates across a step (no zero_grad) still adds to the gradient."""
import pytest

torch = pytest.importorskip("torch")
from fp8amp import optim  # noqa: E402

pytestmark = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")


def _model(tdev, level, seed):
    import fp8amp.torch as ft

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 48)).to(tdev)
    return ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-2), level, policy="fp8")


def _linears(model):
    import fp8amp.torch as ft

    return [m for m in model.modules() if isinstance(m, ft.Linear)]


def _micro_batches(tdev, seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g).to(tdev), torch.randn(16, 48, generator=g).to(tdev)) for _ in range(n)]


@pytest.mark.parametrize("lean", [0, 1])
@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_linear_at_rest_after_a_step_holds_parameters_and_gradients(tdev, level, lean, rng):
    """After forward, backward, step and zero_grad each C Linear holds exactly what it held when made
    (parameters and gradients); between the backward and the step it holds more: the FP32 gradient sum,
    and without lean buffers (lean=0) also the saved x8^T and the FP8 weight copies (lean=1, the front's
    default, gives those back at the backward). Before the Optimizer released them, it kept them."""
    model, opt = _model(tdev, level, int(rng.integers(2**31)))
    for m in _linears(model):
        m.fp8amp_linear.lean = lean
    lins = [m.fp8amp_linear for m in _linears(model)]
    assert len(lins) == 2
    fresh = [lin.memory_bytes for lin in lins]
    for step, (x, t) in enumerate(_micro_batches(tdev, int(rng.integers(2**31)), 3)):
        loss = (model(x) - t).square().mean()
        loss.backward()
        held = [lin.memory_bytes for lin in lins]
        for h, f, m in zip(held, fresh, _linears(model)):
            # lean 0: at least the saved x8^T (16 rows), the FP8 weight (1 byte per weight) and the FP32
            # sum (4 bytes per weight); lean 1: the FP32 sum and at most the bias's epilogue copy
            if lean == 0:
                assert h >= f + 16 * m.in_features + 5 * m.weight.numel(), (step, h, f)
            else:
                assert f + 4 * m.weight.numel() <= h <= f + 4 * m.weight.numel() + 4 * m.out_features, (step, h, f)
        opt.step()
        assert [lin.memory_bytes for lin in lins] == fresh, step
        opt.zero_grad()
        assert [lin.memory_bytes for lin in lins] == fresh, step
        assert torch.isfinite(loss)


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_release_changes_no_bit_with_micro_batches(tdev, level, rng, monkeypatch):
    """Two micro-batches per step, four steps: the same losses, weights and gradients as a run whose
    Optimizer keeps the buffers (the behaviour before the release), bit for bit."""
    seed, data_seed = int(rng.integers(2**31)), int(rng.integers(2**31))
    data = _micro_batches(tdev, data_seed, 8)

    def run(release):
        model, opt = _model(tdev, level, seed)
        if not release:
            monkeypatch.setattr(opt, "_release_buffers", lambda: None)
        out = []
        for step in range(4):
            for x, t in data[2 * step:2 * step + 2]:
                loss = (model(x) - t).square().mean()
                loss.backward()
                out.append(loss.detach().clone())
            grads = [m.dequantized_weight_grad().clone() for m in _linears(model)]
            opt.step()
            opt.zero_grad()
            out += grads + [p.detach().float().clone() for p in model.parameters()]
        rest = [m.fp8amp_linear.memory_bytes for m in _linears(model)]
        return out, rest

    kept, kept_bytes = run(False)
    released, released_bytes = run(True)
    assert len(kept) == len(released)
    for a, b in zip(kept, released):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)
    assert all(k > r for k, r in zip(kept_bytes, released_bytes))


def test_accumulating_across_a_step_adds_to_the_gradient(tdev, rng):
    """Without zero_grad after a step, the next backward adds to the delivered gradient (the FP32 sum
    was given back at the step: the E4M3 gradient is its starting value), as torch's .grad does."""
    model, opt = _model(tdev, "O2", int(rng.integers(2**31)))
    (x0, t0), (x1, t1) = _micro_batches(tdev, int(rng.integers(2**31)), 2)
    (model(x0) - t0).square().mean().backward()
    opt.step()
    lins = _linears(model)
    g0 = [m.dequantized_weight_grad().double() for m in lins]
    (model(x1) - t1).square().mean().backward()  # accumulates: no zero_grad
    g01 = [m.dequantized_weight_grad().double() for m in lins]
    opt.zero_grad()
    (model(x1) - t1).square().mean().backward()  # the same batch alone, same weights
    g1 = [m.dequantized_weight_grad().double() for m in lins]
    for a, ab, b in zip(g0, g01, g1):
        want = a + b
        assert torch.isfinite(ab).all()
        assert float((ab - want).norm() / want.norm()) < 0.07  # E4M3 rounding of the sum
        assert float((ab - b).norm() / want.norm()) > 0.1  # the first backward is in it


def test_a_plain_torch_optimizer_step_releases_too(tdev, rng, monkeypatch):
    """ft.Linear layers stepped by a torch optimizer (initialize without one, torch.optim.AdamW over the
    model): the front's post-step hook releases them, so at rest they hold their parameters and
    gradients only; the results are bit for bit those of a run without the hook."""
    import fp8amp.torch as ft
    import fp8amp.torch.linear as ftl

    seed, data = int(rng.integers(2**31)), _micro_batches(tdev, int(rng.integers(2**31)), 6)

    def run(release):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 48)).to(tdev)
        model = ft.initialize(model, policy="fp8")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        lins = [m.fp8amp_linear for m in _linears(model)]
        fresh = [lin.memory_bytes for lin in lins]
        out = []
        with monkeypatch.context() as mp:
            if not release:
                mp.setattr(ftl, "_BY_WEIGHT", {})
            for step in range(3):
                for x, t in data[2 * step:2 * step + 2]:
                    (model(x) - t).square().mean().backward()
                held = [lin.memory_bytes for lin in lins]
                assert all(h > f for h, f in zip(held, fresh))
                opt.step()
                opt.zero_grad()
                rest = [lin.memory_bytes for lin in lins]
                assert (rest == fresh) == release, (rest, fresh)
                out += [p.detach().clone() for p in model.parameters()]
        return out

    for a, b in zip(run(False), run(True)):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)
