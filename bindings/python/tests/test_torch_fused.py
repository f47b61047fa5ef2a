"""fp8amp.torch.LayerNormLinear / LayerNormMLP (bindings/python/src/fp8amp/torch/fused.py) against
their nn compositions on the CPU, on fresh random data: the same parameter names and state_dict keys
(weights load either way), forward and backward equal within float32 error when the Linears run
their F32 GEMMs (policy "bf16" is the CPU's F32 path), and within FP8 error with the FP8 GEMMs."""
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import fp8amp  # noqa: E402
import fp8amp.torch as ft  # noqa: E402


def nn_layernorm_linear(i, o):
    return nn.Sequential(OrderedDict(norm=nn.LayerNorm(i), linear=nn.Linear(i, o)))


def nn_layernorm_mlp(h, f):
    return nn.Sequential(OrderedDict(norm=nn.LayerNorm(h), fc1=nn.Linear(h, f), act=nn.GELU(approximate="tanh"),
                                     fc2=nn.Linear(f, h)))


def randomize(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


class SwiGLURef(nn.Module):
    """silu(a) * b over the halves [a, b] of the last dimension (what ft.SwiGLU computes)."""

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b


def nn_rmsnorm_linear(i, o):
    return nn.Sequential(OrderedDict(norm=nn.RMSNorm(i, eps=1e-5), linear=nn.Linear(i, o)))


def nn_swiglu_mlp(h, f):
    return nn.Sequential(OrderedDict(norm=nn.LayerNorm(h), fc1=nn.Linear(h, 2 * f), act=SwiGLURef(),
                                     fc2=nn.Linear(f, h)))


def nn_rms_silu_mlp(h, f):
    return nn.Sequential(OrderedDict(norm=nn.RMSNorm(h, eps=1e-5), fc1=nn.Linear(h, f), act=nn.SiLU(),
                                     fc2=nn.Linear(f, h)))


def with_kw(cls, **kw):
    return lambda *a, **k: cls(*a, **kw, **k)


CASES = [("lnlinear", lambda: (ft.LayerNormLinear, (24, 40), nn_layernorm_linear)),
         ("lnmlp", lambda: (ft.LayerNormMLP, (24, 72), nn_layernorm_mlp)),
         ("rmslinear", lambda: (with_kw(ft.LayerNormLinear, normalization="RMSNorm"), (24, 40), nn_rmsnorm_linear)),
         ("swiglu_mlp", lambda: (with_kw(ft.LayerNormMLP, activation="swiglu"), (24, 36), nn_swiglu_mlp)),
         ("rms_silu_mlp", lambda: (with_kw(ft.LayerNormMLP, normalization="RMSNorm", activation="silu"), (24, 72),
                                   nn_rms_silu_mlp))]


@pytest.mark.parametrize("name,case", CASES)
def test_state_dict_keys_and_loading(name, case):
    cls, args, ref_fn = case()
    fused, ref = cls(*args, policy="bf16"), ref_fn(*args)
    assert list(fused.state_dict().keys()) == list(ref.state_dict().keys())
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in ref.named_parameters()]
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    randomize(ref, gen)
    fused.load_state_dict(ref.state_dict())
    for (n, a), (_, b) in zip(fused.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n
    randomize(ref, gen)
    ref2 = ref_fn(*args)
    fused.load_state_dict(ref.state_dict())
    ref2.load_state_dict(fused.state_dict())
    for (n, a), (_, b) in zip(ref2.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("name,case", CASES)
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 5)])
def test_matches_nn_composition(name, case, shape):
    cls, args, ref_fn = case()
    seed = int(np.random.SeedSequence().entropy % 2**31)
    gen = torch.Generator().manual_seed(seed)
    ref = ref_fn(*args)
    randomize(ref, gen)
    # F32 GEMMs: float32 error only. FP8 GEMMs (E4M3 x and W, E5M2 dY): a loose sanity bound, the
    # FP8 numerics themselves are tested in test_linear.py / tests/capi.
    for policy, tol in (("bf16", 2e-5), ("fp8", 0.35)):
        fused = cls(*args, policy=policy)
        fused.load_state_dict(ref.state_dict())
        x = (torch.randn(shape + (args[0],), generator=gen) * 2 + 0.5).requires_grad_(True)
        xr = x.detach().clone().requires_grad_(True)
        y, yr = fused(x), ref(xr)
        assert y.shape == yr.shape and torch.isfinite(y).all()
        assert rel_err(y, yr) < tol, (seed, policy, rel_err(y, yr))
        dy = torch.randn(yr.shape, generator=gen)
        y.backward(dy)
        yr.backward(dy)
        assert rel_err(x.grad, xr.grad) < tol, (seed, policy, "dx")
        grads = dict(ref.named_parameters())
        for n, p in fused.named_parameters():
            assert p.grad is not None or policy == "fp8", n  # E4M3 wgrads stay inside fp8amp (O1)
            if p.grad is not None:
                assert rel_err(p.grad, grads[n].grad) < tol, (seed, policy, n, rel_err(p.grad, grads[n].grad))
        ref.zero_grad()


def test_layernorm_alone_and_gelu():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    gen = torch.Generator().manual_seed(seed)
    ln, lnr = ft.LayerNorm(33), nn.LayerNorm(33)
    randomize(lnr, gen)
    ln.load_state_dict(lnr.state_dict())
    x = torch.randn(4, 6, 33, generator=gen) * 3
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = ln(x1), lnr(x2)
    assert rel_err(y1, y2) < 1e-5, seed
    dy = torch.randn(y2.shape, generator=gen)
    y1.backward(dy), y2.backward(dy)
    assert rel_err(x1.grad, x2.grad) < 1e-5 and rel_err(ln.weight.grad, lnr.weight.grad) < 1e-5, seed
    assert rel_err(ln.bias.grad, lnr.bias.grad) < 1e-5, seed
    g, gr = ft.GELU(), nn.GELU(approximate="tanh")
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = g(x1), gr(x2)
    assert rel_err(y1, y2) < 1e-5, seed
    y1.backward(dy), y2.backward(dy)
    assert rel_err(x1.grad, x2.grad) < 1e-5, seed
    # a NaN in the input stays in its row
    xn = x.clone()
    xn[1, 2, 5] = float("nan")
    yn = ln(xn)
    assert torch.isnan(yn[1, 2]).all() and torch.isfinite(yn[0]).all()
    with pytest.raises(RuntimeError):
        ln(torch.randn(3, 32))


def test_rmsnorm_silu_swiglu_alone():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, 34, generator=gen) * 3 + 0.5
    dy = torch.randn(x.shape, generator=gen)
    for eps in (1e-6, None):  # None: finfo(float32).eps, as nn.RMSNorm
        rn, rnr = ft.RMSNorm(34, eps=eps), nn.RMSNorm(34, eps=eps)
        randomize(rnr, gen)
        rn.load_state_dict(rnr.state_dict())
        assert list(rn.state_dict()) == list(rnr.state_dict()) == ["weight"]
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y1, y2 = rn(x1), rnr(x2)
        assert rel_err(y1, y2) < 1e-5, (seed, eps)
        y1.backward(dy), y2.backward(dy)
        assert rel_err(x1.grad, x2.grad) < 1e-5 and rel_err(rn.weight.grad, rnr.weight.grad) < 1e-5, (seed, eps)
    for mod, ref in ((ft.SiLU(), nn.SiLU()), (ft.SwiGLU(), SwiGLURef())):
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y1, y2 = mod(x1), ref(x2)
        assert y1.shape == y2.shape and rel_err(y1, y2) < 1e-5, (seed, type(mod).__name__)
        g = torch.randn(y2.shape, generator=gen)
        y1.backward(g), y2.backward(g)
        assert rel_err(x1.grad, x2.grad) < 1e-5, (seed, type(mod).__name__)
    with pytest.raises(RuntimeError):
        ft.SwiGLU()(torch.randn(3, 5))
    with pytest.raises(ValueError):
        ft.LayerNormLinear(16, 16, normalization="BatchNorm")
    with pytest.raises(ValueError):
        ft.LayerNormLinear(16, 16, normalization="RMSNorm", norm_bias=True)
    with pytest.raises(ValueError):
        ft.LayerNormMLP(16, 32, activation="relu")


def test_autocast_output_dtype():
    m = ft.LayerNormMLP(16, 32, policy="bf16")
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = m.norm(x)
        y = m(x)
    assert h.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    assert torch.isfinite(y.float()).all()


# ---- the norm / GELU writing the next Linear's E4M3 input (fp8amp_linear_forward_fp8) ----------------

def composition(m, x):
    """The block as its modules' composition: each Linear quantizes its wide input itself."""
    if isinstance(m, ft.LayerNormLinear):
        return m.linear(m.norm(x))
    return m.fc2(m.act(m.fc1(m.norm(x))))


def linear_grads(m):
    """The block's Linears' weight gradients (dequantized) and bias gradients."""
    lins = [m.linear] if isinstance(m, ft.LayerNormLinear) else [m.fc1, m.fc2]
    return [t for lin in lins for t in (lin.dequantized_weight_grad(), lin.bias.grad.detach().clone())]


@pytest.fixture
def fp8_fed_calls(monkeypatch):
    """Counts the fused forwards (fp8amp_linear_forward_fp8 through fused._fwd_fp8)."""
    import fp8amp.torch.fused as fused_mod
    calls = []
    real = fused_mod._fwd_fp8

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(fused_mod, "_fwd_fp8", spy)
    return calls


def _pair(cls, *args, **kw):
    return lambda dev: (cls(*args, policy="fp8", device=dev, **kw), cls(*args, policy="fp8", device=dev, **kw))


BLOCKS = [("lnlinear", _pair(ft.LayerNormLinear, 64, 48), 1),
          ("lnmlp", _pair(ft.LayerNormMLP, 64, 128), 2),
          ("rmslinear", _pair(ft.LayerNormLinear, 64, 48, normalization="RMSNorm"), 1),
          ("swiglu_mlp", _pair(ft.LayerNormMLP, 64, 64, activation="swiglu"), 2),
          ("rms_silu_mlp", _pair(ft.LayerNormMLP, 64, 128, normalization="RMSNorm", activation="silu"), 2)]


@pytest.mark.parametrize("name,make,per_step", BLOCKS)
def test_fp8_fed_block_is_its_composition_bit_for_bit(tdev, gen, fp8_fed_calls, name, make, per_step):
    """F32 activations, current scaling: the norm (activation) writes exactly the codes the Linear's own
    quantize of its F32 output makes, so the fused block and its composition give the same bytes,
    forward and backward, over 3 steps (gradients accumulated)."""
    fused, twin = make(tdev)
    randomize(fused, gen)
    twin.load_state_dict(fused.state_dict())
    for step in range(3):
        x = (torch.randn(2, 16, 64, generator=gen) * 2 + 0.5).to(tdev)
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        n0 = len(fp8_fed_calls)
        y1, y2 = fused(x1), composition(twin, x2)
        assert len(fp8_fed_calls) == n0 + per_step  # the fused path ran, once per Linear
        assert torch.equal(y1, y2), (name, step)
        dy = torch.randn(y2.shape, generator=gen).to(tdev)
        y1.backward(dy)
        y2.backward(dy)
        assert torch.equal(x1.grad, x2.grad), (name, step)
        for a, b in zip(linear_grads(fused), linear_grads(twin)):
            assert torch.equal(a, b), (name, step)
        assert torch.equal(fused.norm.weight.grad, twin.norm.weight.grad)
        if fused.norm.bias is not None:
            assert torch.equal(fused.norm.bias.grad, twin.norm.bias.grad)
    # inference: no grad, the fused forward with nothing saved
    with torch.no_grad():
        n0 = len(fp8_fed_calls)
        y1, y2 = fused(x), composition(twin, x)
        assert len(fp8_fed_calls) == n0 + per_step and torch.equal(y1, y2)


@pytest.mark.parametrize("name,make,per_step", BLOCKS)
def test_fp8_fed_block_used_twice_before_its_backward(tdev, gen, name, make, per_step):
    """Two forwards before one backward: the first forward's backward recomputes from its saved
    input (the C Linear keeps only its last forward) and the sums equal two separate steps'."""
    used_twice, separate = make(tdev)
    randomize(used_twice, gen)
    separate.load_state_dict(used_twice.state_dict())
    xa, xb = ((torch.randn(32, 64, generator=gen) * 2).to(tdev) for _ in range(2))
    dya = torch.randn(32, 48 if name.endswith("linear") else 64, generator=gen).to(tdev)
    dyb = torch.randn(dya.shape, generator=gen).to(tdev)
    a1, b1 = xa.clone().requires_grad_(True), xb.clone().requires_grad_(True)
    ((used_twice(a1) * dya).sum() + (used_twice(b1) * dyb).sum()).backward()
    a2, b2 = xa.clone().requires_grad_(True), xb.clone().requires_grad_(True)
    separate(a2).backward(dya)
    separate(b2).backward(dyb)
    assert torch.equal(a1.grad, a2.grad) and torch.equal(b1.grad, b2.grad), name
    for a, b in zip(linear_grads(used_twice), linear_grads(separate)):
        assert torch.equal(a, b), name
    assert torch.equal(used_twice.norm.weight.grad, separate.norm.weight.grad)


def test_fp8_fed_under_autocast_and_auto_policy(tdev, gen, fp8_fed_calls):
    """Under bf16 autocast the fused block's output is bf16 and within FP8 error of the composition
    (which rounds the norm's output to bf16 before quantizing). AUTO feeds FP8 only where the Linear
    runs an FP8 GEMM for these rows (fp8amp_linear_choose_gemm): on CUDA not at this small shape."""
    m = ft.LayerNormMLP(64, 128, policy="fp8", device=tdev)
    randomize(m, gen)
    x = (torch.randn(4, 16, 64, generator=gen) * 2).to(tdev).requires_grad_(True)
    with torch.autocast(tdev.type, dtype=torch.bfloat16):
        y = m(x)
        yc = composition(m, x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    assert rel_err(y.float(), yc.float()) < 0.05
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    auto = ft.LayerNormLinear(64, 48, device=tdev)  # policy AUTO
    n0 = len(fp8_fed_calls)
    auto(torch.randn(16, 64, generator=gen).to(tdev))
    kind = auto.linear.fp8amp_linear.choose_gemm(16)
    assert (len(fp8_fed_calls) > n0) == (kind == fp8amp.GemmKind.FP8)
    assert auto.linear.gemm_kind == kind
