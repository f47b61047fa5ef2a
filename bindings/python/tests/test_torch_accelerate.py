"""Hugging Face Accelerate's prepare() after fp8amp.torch.initialize (issue 18 point 8): the prepared
model and AcceleratedOptimizer train with the same losses as the plain loop -- also with
accelerator.clip_grad_norm_, gradient accumulation (accelerator.accumulate) and bf16 autocast
(mixed_precision="bf16") -- and, on CUDA, with fp16's GradScaler (unscale_ before the clip). Skipped
when accelerate (or torch) is not importable. One process, CPU; the CUDA variant skips without a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")
import fp8amp  # noqa: E402
from fp8amp import optim  # noqa: E402

pytestmark = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")


@pytest.fixture
def fresh_state():
    """Accelerate keeps its state in process-wide singletons: a test's Accelerator must not inherit
    the last one's settings (what accelerate's own AccelerateTestCase resets)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def make(device, level="O1"):
    import fp8amp.torch as ft

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                            torch.nn.Linear(64, 16)).to(device)
    return ft.initialize(m, torch.optim.AdamW(m.parameters(), lr=1e-2), level, policy="fp8")


def dataset(gen, device, n=4):
    w = (torch.randn(16, 32, generator=gen) * 0.3).to(device)
    xs = [torch.randn(64, 32, generator=gen).to(device) for _ in range(n)]
    return [(x, torch.tanh(x @ w.T)) for x in xs]


def plain_loop(model, opt, data, steps, clip=None, accum=1, autocast=None):
    losses = []
    for i in range(steps):
        x, t = data[i % len(data)]
        if autocast is not None:
            with torch.autocast(x.device.type, autocast):
                y = model(x)
            y = y.float()
        else:
            y = model(x)
        loss = (y - t).square().mean()
        losses.append(float(loss.detach()))
        (loss / accum).backward()
        if (i + 1) % accum == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return losses


def accelerate_loop(acc, model, opt, data, steps, clip=None):
    losses = []
    for i in range(steps):
        x, t = data[i % len(data)]
        with acc.accumulate(model):
            loss = (model(x).float() - t).square().mean()
            losses.append(float(loss.detach()))
            acc.backward(loss)
            if clip is not None and acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return losses


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("clip", [None, 0.3])
def test_prepare_trains_as_the_plain_loop(gen, fresh_state, level, clip):
    import fp8amp.torch as ft
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    data = dataset(gen, "cpu")
    m1, o1 = make("cpu", level)
    ref = plain_loop(m1, o1, data, 10, clip=clip)
    m2, o2 = make("cpu", level)
    acc = Accelerator(cpu=True)
    pm, po = acc.prepare(m2, o2)
    assert isinstance(po, AcceleratedOptimizer) and po.optimizer is o2
    assert acc.unwrap_model(pm) is m2 and isinstance(m2[0], ft.Linear)
    got = accelerate_loop(acc, pm, po, data, 10, clip=clip)
    assert got == ref  # the same program: bit for bit
    assert got[-1] < 0.7 * got[0] and np.isfinite(got).all()
    assert all(o.step_count == 10 for o in o2.fp8amp_optimizers)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def test_prepare_with_gradient_accumulation(gen, fresh_state):
    """accelerator.accumulate: the micro-batches' gradients add up in the Linears' FP32 sums (the
    AcceleratedOptimizer skips step and zero_grad between), as a plain loop dividing the loss."""
    from accelerate import Accelerator

    data = dataset(gen, "cpu")
    m1, o1 = make("cpu")
    ref = plain_loop(m1, o1, data, 12, clip=0.3, accum=3)
    m2, o2 = make("cpu")
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    pm, po = acc.prepare(m2, o2)
    got = accelerate_loop(acc, pm, po, data, 12, clip=0.3)
    assert o2.fp8amp_optimizers[0].step_count == 4
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_prepare_with_bf16_autocast(gen, fresh_state):
    """mixed_precision="bf16": Accelerate runs the forward under torch.autocast("cpu", bfloat16) and
    gives the output back in float32; fp8amp's Linears follow autocast. The same as the plain loop
    under autocast."""
    from accelerate import Accelerator

    data = dataset(gen, "cpu")
    m1, o1 = make("cpu")
    ref = plain_loop(m1, o1, data, 10, clip=0.3, autocast=torch.bfloat16)
    m2, o2 = make("cpu")
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    pm, po = acc.prepare(m2, o2)
    x = data[0][0]
    with torch.autocast("cpu", torch.bfloat16):
        assert m2[0](x).dtype == torch.bfloat16
    got = accelerate_loop(acc, pm, po, data, 10, clip=0.3)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert got[-1] < 0.8 * got[0]


def test_prepare_with_fp16_grad_scaler_cuda(gen, fresh_state):
    """mixed_precision="fp16" on CUDA: Accelerate's torch.amp.GradScaler scales the loss, its
    clip_grad_norm_ unscales first (scaler.unscale_ on the fp8amp Optimizer, E4M3 gradients
    included) and the step does not unscale again."""
    if not (torch.cuda.is_available() and fp8amp.device_count("cuda") > 0):
        pytest.skip("no CUDA device for PyTorch")
    from accelerate import Accelerator

    data = dataset(gen, "cuda")
    m1, o1 = make("cuda")
    ref = plain_loop(m1, o1, data, 10, clip=0.3, autocast=torch.float16)
    m2, o2 = make("cuda")
    acc = Accelerator(mixed_precision="fp16")
    pm, po = acc.prepare(m2, o2)
    assert acc.scaler is not None
    got = accelerate_loop(acc, pm, po, data, 10, clip=0.3)
    assert got[-1] < 0.8 * got[0]
    np.testing.assert_allclose(got, ref, rtol=0.05)
