"""MS-AMP's 16-bit weights at O1/O2 (issue 18 point 3, docs/torch.md section 13): `initialize` with an
optimizer keeps the replaced Linears' weights in bfloat16 (no float32 copy) and has fp8amp's step round
their updates stochastically (master_rounding None -> "stochastic" for 16-bit weights without a master);
without an optimizer, or with weight_dtype=float32, the weights stay float32 and round to nearest; O3
keeps E4M3 weights with nearest-rounded F16 masters. Through the front, an update 16 times below half
a BF16 ulp leaves every nearest-rounded weight as it was, and moves the stochastically rounded ones by
one ulp with the probability that makes the mean move the exact update (within 6 sigma). CPU; the
CUDA variants (the fast Adam kernel's stochastic BF16 path) skip without a GPU."""
import math

import pytest

torch = pytest.importorskip("torch")
import fp8amp  # noqa: E402
from fp8amp import optim  # noqa: E402

need_opt = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")


def mlp(dev, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).to(dev)


def linears(model):
    import fp8amp.torch as ft

    return [m for m in model.modules() if isinstance(m, ft.Linear)]


def roundings(opt):
    """The rounding each fp8amp optimizer was made with (its config keeps the value it was given: a
    MasterRounding, an int or its name)."""
    def norm(v):
        return fp8amp.MasterRounding[v.upper()] if isinstance(v, str) else fp8amp.MasterRounding(v)

    return {norm(o.config.master_rounding) for o in opt.fp8amp_optimizers}


@need_opt
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_o1_o2_weights_are_bfloat16_rounded_stochastically(tdev, level):
    import fp8amp.torch as ft

    model, opt = ft.initialize(mlp(tdev), torch.optim.AdamW(mlp(tdev).parameters()), level)
    assert [m.weight.dtype for m in linears(model)] == [torch.bfloat16] * 2
    assert [m.bias.dtype for m in linears(model)] == [torch.float32] * 2  # biases stay float32
    assert roundings(opt) == {fp8amp.MasterRounding.STOCHASTIC}
    # the weights hold the float32 model's values rounded to bfloat16
    ref = mlp(tdev)
    assert torch.equal(linears(model)[0].weight, ref[0].weight.to(torch.bfloat16))
    # float32 weights on request, and without an optimizer (another optimizer would round to nearest)
    model, opt = ft.initialize(mlp(tdev), torch.optim.AdamW(mlp(tdev).parameters()), level, weight_dtype=torch.float32)
    assert [m.weight.dtype for m in linears(model)] == [torch.float32] * 2
    assert roundings(opt) == {fp8amp.MasterRounding.NEAREST}
    model = ft.initialize(mlp(tdev), None, level)
    assert [m.weight.dtype for m in linears(model)] == [torch.float32] * 2
    # nearest rounding of bfloat16 weights, asked for explicitly
    model, opt = ft.initialize(mlp(tdev), torch.optim.AdamW(mlp(tdev).parameters()), level,
                               master_rounding="nearest")
    assert [m.weight.dtype for m in linears(model)] == [torch.bfloat16] * 2
    assert roundings(opt) == {fp8amp.MasterRounding.NEAREST}
    # the same in a Config
    cfg = ft.Config(opt_level=level)
    assert cfg.master_rounding is None and cfg.weight_dtype is None
    model, opt = ft.initialize(mlp(tdev), torch.optim.AdamW(mlp(tdev).parameters()), config=cfg)
    assert roundings(opt) == {fp8amp.MasterRounding.STOCHASTIC}


@need_opt
def test_o3_keeps_e4m3_weights_with_nearest_masters(tdev):
    import fp8amp.torch as ft

    model, opt = ft.initialize(mlp(tdev), torch.optim.AdamW(mlp(tdev).parameters()), "O3")
    assert [m.weight.dtype for m in linears(model)] == [torch.float8_e4m3fn] * 2
    assert roundings(opt) == {fp8amp.MasterRounding.NEAREST}


@need_opt
@pytest.mark.parametrize("rounding", ["nearest", None])
def test_tiny_updates_survive_stochastic_rounding(tdev, gen, rounding):
    """One bias-free Linear at O1, its weights in [0.51, 0.99) (one binade: a BF16 ulp of 2^-8) and
    positive gradients (a positive input and loss = sum of the outputs), so Adam's first step moves
    every weight down by lr = 2^-13, 1/16 of half an ulp."""
    import fp8amp.torch as ft

    n_out, n_in = 128, 64
    lin = torch.nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.rand(n_out, n_in, generator=gen) * 0.48 + 0.51)
    model = torch.nn.Sequential(lin).to(tdev)
    lr = 2.0 ** -13
    # a fresh rounding seed: the bits that decide each element's rounding (with the step and indices)
    model, opt = ft.initialize(model, torch.optim.Adam(model.parameters(), lr=lr), "O1", policy="bf16",
                               master_rounding=rounding,
                               rounding_seed=int(torch.randint(2**31, (1,), generator=gen)))
    w = linears(model)[0].weight
    assert w.dtype == torch.bfloat16
    before = w.detach().double().clone()
    x = (torch.rand(8, n_in, generator=gen) + 0.5).to(tdev)
    model(x).sum().backward()
    opt.step()
    d = (w.detach().double() - before).flatten().cpu()
    ulp = 2.0 ** -8
    if rounding == "nearest":
        assert torch.count_nonzero(d) == 0, d
        return
    assert bool(((d == 0) | (d == -ulp)).all()), d[(d != 0) & (d != -ulp)]
    moved = int(torch.count_nonzero(d))
    mean, sigma = float(d.mean()), math.sqrt(d.numel() * ulp * lr) / d.numel()
    print("moved %d of %d, mean %.3g (exact %.3g, sigma %.2g)" % (moved, d.numel(), mean, -lr, sigma))
    assert moved > 0 and abs(mean + lr) <= 6 * sigma


@need_opt
def test_state_block_size_zero_is_one_scale_per_tensor(tdev, gen):
    """state_block_size=0 (MS-AMP's optimizer-state layout): one scale per state tensor, fewer bytes
    than blocks of 128, the state_dict's scale tensors of one element, a save and load that continues
    bit for bit; bad values refused when the Config is made or by the library."""
    import fp8amp.torch as ft

    def make(block):
        m = mlp(tdev)
        return ft.initialize(m, torch.optim.AdamW(m.parameters(), lr=1e-3), "O2", state_block_size=block,
                             rounding_seed=7)

    data = [(torch.randn(16, 32, generator=gen).to(tdev), torch.randn(16, 16, generator=gen).to(tdev))
            for _ in range(4)]

    def train(model, opt, batches):
        for x, y in batches:
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad()

    model, opt = make(0)
    assert {o.config.state_block_size for o in opt.fp8amp_optimizers} == {0}
    _, opt128 = make(None)
    assert {o.config.state_block_size for o in opt128.fp8amp_optimizers} == {128}
    train(model, opt, data[:3])
    assert opt.state_bytes() < opt128.state_bytes()
    sd = opt.state_dict()
    w0 = 0  # the first Linear's weight: 64 x 32 elements, one scale each for m and v
    assert tuple(sd["state"][w0]["exp_avg_scale_inv"].shape) == (1,)
    assert tuple(sd["state"][w0]["exp_avg_sq_scale_inv"].shape) == (1,)
    # a second model and optimizer loaded from both state dicts continue bit for bit
    model2, opt2 = make(0)
    model2.load_state_dict(model.state_dict())
    opt2.load_state_dict(sd)
    train(model, opt, data[3:])
    train(model2, opt2, data[3:])
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="state_block_size"):
        ft.Config(state_block_size=-1)
    with pytest.raises(TypeError, match="state_block_size"):
        ft.Config(state_block_size=True)
    with pytest.raises(Exception, match="state_block_size"):  # not a power of two: the library refuses
        make(100)
