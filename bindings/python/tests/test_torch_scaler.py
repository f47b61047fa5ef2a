"""GradScaler.unscale_ and torch.nn.utils.clip_grad_norm_ on fp8amp's gradients (issue 18 point 7),
for fp8amp.torch.GradScaler and for torch.amp.GradScaler on the fp8amp Optimizer: after unscale_ every
gradient, the E4M3 weight gradients (whose .grad is a LinearGrad handle) included, is the unscaled
one; clip_grad_norm_(model.parameters()) takes torch's total norm over all parameters of all groups
(the E4M3 values as fp8amp decodes them) and clips them all; the next step does not unscale again; an
inf/NaN seen by unscale_ skips the step and backs the scale off. Against a float32 model with
torch.optim.AdamW and torch.amp.GradScaler. CPU; the CUDA variants skip without a GPU."""
import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp8amp  # noqa: E402
from fp8amp import optim  # noqa: E402

pytestmark = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")
SCALERS = ["torch", "fp8amp"]


def make_model(device, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16)).to(device)


def groups(model):
    """Two param groups: clipping must take the norm across both."""
    return [{"params": [p for p in model.parameters() if p.dim() == 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() != 2], "weight_decay": 0.0}]


def dataset(gen, device, n=4):
    w = (torch.randn(16, 32, generator=gen) * 0.3).to(device)
    xs = [torch.randn(64, 32, generator=gen).to(device) for _ in range(n)]
    return [(x, torch.tanh(x @ w.T)) for x in xs]


def make_scaler(kind, device, **kw):
    import fp8amp.torch as ft

    return torch.amp.GradScaler(device.type, **kw) if kind == "torch" else ft.GradScaler(device, **kw)


def fp8_model(device, kind="fp8", level="O1", seed=0, **kw):
    import fp8amp.torch as ft

    m = make_model(device, seed)
    return ft.initialize(m, torch.optim.AdamW(groups(m), lr=1e-2, eps=1e-4), level, policy=kind, **kw)


def train(model, opt, scaler, data, steps, clip=None, unscale=True):
    losses, norms = [], []
    for i in range(steps):
        x, t = data[i % len(data)]
        loss = (model(x) - t).square().mean()
        losses.append(float(loss))
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(opt)
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return losses, norms


def grad_values(model):
    """Every parameter's gradient as a plain float32 tensor (an E4M3 handle: its decoded values)."""
    return [p.grad.clone().float() for p in model.parameters()]


@pytest.mark.parametrize("kind", SCALERS)
def test_unscale_divides_every_gradient_by_the_scale(tdev, gen, kind):
    """Exactly: the scale is a power of two, and an E4M3 gradient is unscaled through its scale_inv
    (no second rounding into E4M3)."""
    import fp8amp.torch as ft

    model, opt = fp8_model(tdev)
    scaler = make_scaler(kind, tdev, init_scale=1024.0)
    x, t = dataset(gen, tdev, 1)[0]
    scaler.scale((model(x) - t).square().mean()).backward()
    assert isinstance(model[0].weight.grad, ft.LinearGrad) and model[0].weight.grad._fp8 is not None
    codes = model[0].fp8amp_linear.weight_grad.numpy().copy() if tdev.type == "cpu" else None
    before = grad_values(model)
    scaler.unscale_(opt)
    after = grad_values(model)
    for b, a in zip(before, after):
        assert bool(torch.isfinite(b).all()) and float(b.abs().max()) > 0
        assert torch.equal(a, b / 1024.0)
    if codes is not None:  # the codes did not move: only their scale_inv did
        assert np.array_equal(model[0].fp8amp_linear.weight_grad.numpy(), codes)
    if kind == "torch":
        with pytest.raises(RuntimeError, match="unscale_"):
            scaler.unscale_(opt)
    else:
        with pytest.raises(RuntimeError, match="already called"):
            scaler.unscale_(opt)
        with pytest.raises(TypeError, match="fp8amp.torch.Optimizer"):
            scaler.unscale_(torch.optim.AdamW(make_model(tdev).parameters()))


@pytest.mark.parametrize("kind", SCALERS)
def test_step_after_unscale_does_not_unscale_again(tdev, gen, kind):
    """unscale_ then step gives bit for bit the parameters of a plain step (the scale a power of two),
    and the library's norm of the step's gradients is the unscaled one (an unscale twice would be
    1/scale of it)."""
    data = dataset(gen, tdev)
    m1, o1 = fp8_model(tdev)
    m2, o2 = fp8_model(tdev)
    s1, s2 = make_scaler(kind, tdev, init_scale=4096.0), make_scaler(kind, tdev, init_scale=4096.0)
    l1, _ = train(m1, o1, s1, data, 4, unscale=False)
    l2, _ = train(m2, o2, s2, data, 4, unscale=True)
    assert l1 == l2
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    x, t = data[0]
    s2.scale((m2(x) - t).square().mean()).backward()
    s2.unscale_(o2)
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grad_values(m2)))
    s2.step(o2)
    s2.update()
    got = [o.grad_norm for o in o2.fp8amp_optimizers]
    # each group's norm; together the total
    assert math.sqrt(sum(n * n for n in got)) == pytest.approx(norm, rel=1e-5)
    assert s2.get_scale() == 4096.0 and all(o.step_count == 5 for o in o2.fp8amp_optimizers)


@pytest.mark.parametrize("kind", SCALERS)
def test_clip_grad_norm_takes_torchs_total_norm_across_groups(tdev, gen, kind):
    """clip_grad_norm_(model.parameters()) on the fp8amp model equals clip_grad_norm_ on plain copies
    of the same (unscaled) gradients: each tensor's norm bit for bit (the E4M3 values as fp8amp
    decodes them), the total norm to float32 rounding, and every gradient of both groups multiplied
    by the same coefficient."""
    data = dataset(gen, tdev)
    for foreach in (False, None):
        model, opt = fp8_model(tdev)
        scaler = make_scaler(kind, tdev, init_scale=512.0)
        x, t = data[0]
        scaler.scale((model(x) - t).square().mean()).backward()
        scaler.unscale_(opt)
        vals = grad_values(model)
        copies = [torch.nn.Parameter(v.clone()) for v in vals]
        for c, v in zip(copies, vals):
            c.grad = v.clone()
        # each tensor's norm bit for bit (fp8amp's decoded E4M3 values, as torch reads them)
        per = [torch.linalg.vector_norm(c.grad) for c in copies]
        for prm, n in zip(model.parameters(), per):
            assert torch.equal(torch.linalg.vector_norm(prm.grad), n)
        # torch takes the total as the norm of the per-tensor norms listed group by group, the groups by
        # (device, dtype): the model's BF16 weights and F32 biases are two groups where the plain
        # copies are one, so the float32 sum runs in another order; with foreach=False the total is
        # that of one order of the model's groups, bit for bit
        dts = [prm.dtype for prm in model.parameters()]
        totals = [torch.linalg.vector_norm(torch.stack([per[i] for d in order for i in range(len(per)) if dts[i] == d]))
                  for order in itertools.permutations(dict.fromkeys(dts))]
        ref_norm = torch.nn.utils.clip_grad_norm_(copies, 0.05, foreach=foreach)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=foreach)
        assert float(ref_norm) > 0.05  # so it clips
        if foreach is False:
            assert any(torch.equal(norm, t) for t in totals), (norm, totals)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
        coef = 0.05 / (float(ref_norm) + 1e-6)
        for v, c, g in zip(vals, copies, grad_values(model)):
            torch.testing.assert_close(g, c.grad, rtol=2.0 ** -21, atol=0)
            torch.testing.assert_close(g.double(), v.double() * coef, rtol=1e-6, atol=0)
        total = math.sqrt(sum(float(g.double().square().sum()) for g in grad_values(model)))
        assert total == pytest.approx(0.05, rel=1e-5)
        scaler.step(opt)
        scaler.update()
        assert all(o.step_count == 1 for o in opt.fp8amp_optimizers)


@pytest.mark.parametrize("kind", SCALERS)
@pytest.mark.parametrize("path", ["f32", "fp8"])
def test_unscale_and_clip_against_a_float32_reference(tdev, gen, kind, path):
    """The same model in float32 with torch.optim.AdamW, torch.amp.GradScaler, unscale_ and
    clip_grad_norm_, against fp8amp at O1 with either scaler. "f32": the GEMMs in float32 (CPU policy
    bf16), only the weight gradients E4M3: the trajectory within E4M3's rounding; "fp8": everything FP8."""
    if path == "f32" and tdev.type == "cuda":
        pytest.skip("the CUDA 'bf16' policy rounds operands to BF16")
    data = dataset(gen, tdev)
    ref = make_model(tdev)
    ropt = torch.optim.AdamW(groups(ref), lr=1e-2, eps=1e-4)
    rscaler = torch.amp.GradScaler(tdev.type, init_scale=2.0 ** 14)
    model, opt = fp8_model(tdev, "bf16" if path == "f32" else "fp8")
    scaler = make_scaler(kind, tdev, init_scale=2.0 ** 14)
    l_ref, n_ref = train(ref, ropt, rscaler, data, 30, clip=0.25)
    l_got, n_got = train(model, opt, scaler, data, 30, clip=0.25)
    assert sum(n > 0.25 for n in n_ref) >= 5  # the clipping acts
    assert l_got[-1] < 0.5 * l_got[0]
    tol = 0.02 if path == "f32" else 0.08
    np.testing.assert_allclose(n_got, n_ref, rtol=tol * 2)
    np.testing.assert_allclose(l_got, l_ref, rtol=tol, atol=1e-3)
    assert scaler.get_scale() == rscaler.get_scale() == 2.0 ** 14


@pytest.mark.parametrize("kind", SCALERS)
@pytest.mark.parametrize("where", ["plain", "e4m3-inf", "e4m3-nan", "loss"])
def test_inf_or_nan_seen_by_unscale_skips_the_step(tdev, gen, kind, where):
    """A non-finite gradient -- in a torch .grad (LayerNorm weight), in an E4M3 weight gradient only
    (written through its handle: the quantize saturates, only fp8amp's amax record tells), or
    everywhere (an inf loss) -- found by unscale_: the clip sees it, the step changes no parameter and
    no step count, and the scale backs off; the next steps train."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev)
    scaler = make_scaler(kind, tdev, init_scale=256.0)
    train(model, opt, scaler, data, 2)
    before = [p.detach().clone() for p in model.parameters()]
    x, t = data[0]
    loss = (model(x) - t).square().mean()
    if where == "loss":
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    if where == "plain":
        model[1].weight.grad[3] = float("inf")
    elif where.startswith("e4m3"):
        g = model[3].weight.grad.clone()
        g[1, 2] = float("inf") if where == "e4m3-inf" else float("nan")
        model[3].weight.grad.copy_(g)
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    # An inf quantized into E4M3 saturates to the largest code: the decoded values (what torch's norm
    # reads) stay finite; unscale_ and fp8amp's step see it in the quantization's amax record.
    assert math.isfinite(float(norm)) == (where == "e4m3-inf")
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    assert scaler.get_scale() == 128.0
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.detach())
    assert all(o.step_count == 2 for o in opt.fp8amp_optimizers)
    losses, _ = train(model, opt, scaler, data, 3, clip=1.0)
    assert all(o.step_count == 5 for o in opt.fp8amp_optimizers) and np.isfinite(losses).all()
    assert scaler.get_scale() == 128.0


@pytest.mark.parametrize("kind", SCALERS)
@pytest.mark.parametrize("unscale", [True, False])
def test_skipped_step_still_updates_the_delayed_metas(tdev, gen, kind, unscale):
    """With the delayed recipe, a step skipped for an inf loss folds the Linears' INPUT and GRAD_OUTPUT
    amaxes into their histories like a step taken (the same number of updates, nothing left pending),
    with either scaler, with and without unscale_ (torch's GradScaler hands the skip to the step as
    found_inf; before the fix that path returned without the update)."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev, recipe=fp8amp.Recipe(mode=fp8amp.ScalingMode.DELAYED))
    metas = opt._metas
    assert metas  # the delayed Linears' INPUT and GRAD_OUTPUT metas
    scaler = make_scaler(kind, tdev, init_scale=256.0)
    train(model, opt, scaler, data, 2, unscale=unscale)
    x, t = data[0]
    scaler.scale((model(x) - t).square().mean() * float("inf")).backward()
    # this step's amaxes are recorded, not yet folded
    assert all(m.amax > 0 for m in metas)
    newest = [float(m.history()[0]) for m in metas]
    if unscale:
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    assert scaler.get_scale() == 128.0 and all(o.step_count == 2 for o in opt.fp8amp_optimizers)
    for m, old in zip(metas, newest):
        assert m.amax == 0.0  # nothing pending
        assert float(m.history()[0]) != old or math.isinf(float(m.history()[0]))  # this step's amax folded in


def test_fp8amp_scaler_hysteresis_after_unscale(tdev, gen):
    """fp8amp's scaler backs off by its own rule for a step unscale_ skipped: with hysteresis 2 the
    first overflow keeps the scale, the second halves it; a good step in between refills nothing."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev)
    import fp8amp.torch as ft

    scaler = ft.GradScaler(tdev, init_scale=256.0, hysteresis=2)
    x, t = data[0]
    for want in (256.0, 128.0, 64.0):
        scaler.scale((model(x) - t).square().mean() * float("inf")).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        opt.zero_grad()
        assert scaler.get_scale() == want
    assert scaler.state_dict()["growth_tracker"] == 0
    train(model, opt, scaler, data, 1)
    assert scaler.state_dict()["growth_tracker"] == 1 and opt.fp8amp_optimizers[0].step_count == 1


@pytest.mark.parametrize("kind", SCALERS)
def test_o3_unscale_and_clip(tdev, gen, kind):
    """At O3 the weight and its gradient are E4M3 (the handle's dtype float8_e4m3fn): unscale_ and
    clip_grad_norm_ work the same and the model trains."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev, level="O3")
    assert model[0].weight.dtype == torch.float8_e4m3fn
    scaler = make_scaler(kind, tdev, init_scale=1024.0)
    x, t = data[0]
    scaler.scale((model(x) - t).square().mean()).backward()
    before = grad_values(model)
    scaler.unscale_(opt)
    for b, a in zip(before, grad_values(model)):
        assert torch.equal(a, b / 1024.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    losses, norms = train(model, opt, scaler, data, 25, clip=0.5)
    assert np.isfinite(norms).all() and losses[-1] < 0.6 * losses[0]


def test_grad_mul_scales_an_e4m3_gradient_exactly(tdev, gen):
    """A user's grad.mul_(c) / torch._foreach_mul_ on a handle multiplies its decoded values (through
    scale_inv: no requantization); a tensor factor of several values takes the general path."""
    model, opt = fp8_model(tdev)
    x, t = dataset(gen, tdev, 1)[0]
    (model(x) - t).square().mean().backward()
    g = model[0].weight.grad
    v = g.clone()
    g.mul_(0.25)
    assert torch.equal(g.clone(), v * 0.25)
    g.mul_(torch.tensor(2.0, device=tdev))
    assert torch.equal(g.clone(), v * 0.5)
    torch._foreach_mul_([g, model[1].weight.grad], 2.0)
    assert torch.equal(g.clone(), v)
    w = torch.rand(g.shape, generator=gen).to(tdev)
    g.mul_(w)  # elementwise: decoded, multiplied, quantized back (current scaling)
    torch.testing.assert_close(g.clone(), v * w, rtol=2.0 ** -3, atol=float((v * w).abs().max()) * 2.0 ** -9)


@pytest.mark.parametrize("kind", SCALERS)
def test_delayed_recipe_unscale_clip_and_an_overflow(tdev, gen, kind):
    """With a delayed recipe (the E4M3 gradients' scales from an amax history) unscale_ and clipping
    work the same; an overflowing step in the middle is skipped, the scale halves and training goes on."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev, level="O2", recipe=fp8amp.Recipe(mode=fp8amp.ScalingMode.DELAYED))
    scaler = make_scaler(kind, tdev, init_scale=256.0)
    losses = []
    for i in range(30):
        x, t = data[i % len(data)]
        loss = (model(x) - t).square().mean()
        losses.append(float(loss.detach()))
        scaler.scale(loss * float("inf") if i == 5 else loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 128.0 and opt.fp8amp_optimizers[0].step_count == 29
    assert np.isfinite(losses).all() and np.mean(losses[-3:]) < 0.3 * losses[0]


@pytest.mark.parametrize("kind", SCALERS)
@pytest.mark.parametrize("where", ["plain", "e4m3"])
def test_an_inf_in_one_group_skips_every_group(tdev, gen, kind, where):
    """Without unscale_ too: a step whose gradients hold an inf in one param group only changes no
    group (torch's semantics: the optimizer step is skipped). With fp8amp's scaler and several groups
    each group's fp8amp step used to check only its own gradients: the other group stepped."""
    data = dataset(gen, tdev)
    model, opt = fp8_model(tdev)
    scaler = make_scaler(kind, tdev, init_scale=256.0)
    train(model, opt, scaler, data, 2, unscale=False)
    before = [p.detach().clone() for p in model.parameters()]
    x, t = data[1]
    scaler.scale((model(x) - t).square().mean()).backward()
    if where == "plain":  # group 1 (LayerNorm, biases) only
        model[1].weight.grad[0] = float("inf")
    else:  # group 0 (the weights) only, in an E4M3 gradient
        g = model[3].weight.grad.clone()
        g[0, 0] = float("inf")
        model[3].weight.grad.copy_(g)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    assert scaler.get_scale() == 128.0
    assert [o.step_count for o in opt.fp8amp_optimizers] == [2, 2]
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.detach())
    losses, _ = train(model, opt, scaler, data, 3, unscale=False)
    assert [o.step_count for o in opt.fp8amp_optimizers] == [5, 5] and np.isfinite(losses).all()
