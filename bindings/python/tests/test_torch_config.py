"""initialize's drop-in surface (issue 18 point 7): fp8amp.torch.Config (the settings as one value,
checked when made), config and keywords together (agreeing keywords pass, a conflicting one is a
ValueError naming it), torchao's module_filter_fn (module, fqn) -> bool beside exclude, the shape rule
for policy "fp8", and the "fp8amp" logger's account of what was replaced, what kept and why. CPU;
the CUDA variants skip without a GPU."""
import dataclasses
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp8amp  # noqa: E402
from fp8amp import optim  # noqa: E402

need_opt = pytest.mark.skipif(not optim._available(), reason="libfp8amp has no optimizer")


def make_model(device, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU()),
                               torch.nn.Linear(48, 16)).to(device)


def data(gen, device, n=3):
    w = (torch.randn(16, 32, generator=gen) * 0.3).to(device)
    xs = [torch.randn(64, 32, generator=gen).to(device) for _ in range(n)]
    return [(x, torch.tanh(x @ w.T)) for x in xs]


def train(model, opt, batches, steps):
    losses = []
    for i in range(steps):
        x, t = batches[i % len(batches)]
        loss = (model(x) - t).square().mean()
        losses.append(float(loss))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def kinds(model):
    import fp8amp.torch as ft

    return {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, ft.Linear))}


def test_config_checks_its_fields_when_made():
    import fp8amp.torch as ft

    c = ft.Config()
    assert c.opt_level == fp8amp.OptLevel.O1 and c.policy == fp8amp.GemmPolicy.AUTO and c.module_filter_fn is None
    c2 = ft.Config(opt_level="o3", policy="fp8", exclude=["lm_head"])
    assert c2.opt_level == fp8amp.OptLevel.O3 and c2.policy == fp8amp.GemmPolicy.ALWAYS_FP8
    assert c2.exclude == ("lm_head",)  # a list becomes a tuple: the config is a hashable value
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.opt_level = "O2"
    assert dataclasses.replace(c, opt_level="O2").opt_level == fp8amp.OptLevel.O2
    bad = [(dict(opt_level="O4"), ValueError, "opt_level"), (dict(opt_level=2.5), TypeError, "opt_level"),
           (dict(policy="fp16"), ValueError, "policy"), (dict(max_grad_norm=-1.0), ValueError, "max_grad_norm"),
           (dict(max_grad_norm=float("nan")), ValueError, "max_grad_norm"),
           (dict(max_grad_norm="1"), ValueError, "max_grad_norm"), (dict(save_input=2), TypeError, "save_input"),
           (dict(exclude="lm_head"), TypeError, "exclude"), (dict(module_filter_fn=3), TypeError, "module_filter_fn"),
           (dict(weight_dtype="float32"), TypeError, "weight_dtype"), (dict(recipe="current"), TypeError, "recipe")]
    for kw, exc, field in bad:
        with pytest.raises(exc, match=field):
            ft.Config(**kw)


@need_opt
def test_config_and_keywords_train_identically(tdev, gen):
    """initialize(config=cfg) is initialize(**asdict(cfg)): the same modules, the same optimizer
    state dtypes and bit-identical losses and weights over a few steps."""
    import fp8amp.torch as ft

    batches = data(gen, tdev)
    cfg = ft.Config(opt_level="O2", policy="fp8", max_grad_norm=0.5, exclude=("4",))
    m1 = make_model(tdev, 3)
    m1, o1 = ft.initialize(m1, torch.optim.AdamW(m1.parameters(), lr=3e-3), config=cfg)
    m2 = make_model(tdev, 3)
    kw = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    m2, o2 = ft.initialize(m2, torch.optim.AdamW(m2.parameters(), lr=3e-3), **kw)
    m3 = make_model(tdev, 3)  # the user's spelling: strings, positional opt_level
    m3, o3 = ft.initialize(m3, torch.optim.AdamW(m3.parameters(), lr=3e-3), "O2", policy="fp8", max_grad_norm=0.5,
                           exclude=["4"])
    assert kinds(m1) == kinds(m2) == kinds(m3) == {"0": "Linear", "3.0": "Linear", "4": "Linear"}
    assert isinstance(m1[0], ft.Linear) and type(m1[4]) is torch.nn.Linear
    l1, l2, l3 = (train(m, o, batches, 6) for m, o in ((m1, o1), (m2, o2), (m3, o3)))
    assert l1 == l2 == l3 and l1[-1] < l1[0]
    for a, b, c in zip(m1.parameters(), m2.parameters(), m3.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert [o.config.exp_avg_dtype for o in o1.fp8amp_optimizers] == [fp8amp.E4M3]
    assert o1.fp8amp_optimizers[0].config.max_grad_norm == pytest.approx(0.5)


@need_opt
def test_config_with_a_conflicting_keyword_is_refused(tdev):
    import fp8amp.torch as ft

    cfg = ft.Config(opt_level="O2", policy="fp8")
    m = make_model(tdev, 0)
    before = kinds(m)
    for kw in (dict(opt_level="O1"), dict(policy="bf16"), dict(max_grad_norm=1.0), dict(exclude=("0",)),
               dict(save_input=True), dict(module_filter_fn=lambda mod, fqn: True)):
        with pytest.raises(ValueError, match="conflicts with the config") as e:
            ft.initialize(m, torch.optim.AdamW(m.parameters()), config=cfg, **kw)
        assert next(iter(kw)) in str(e.value)
        assert kinds(m) == before  # refused before the model changed
    with pytest.raises(ValueError, match="opt_level='O1'.*policy='bf16'"):  # every conflict is named
        ft.initialize(m, None, "O1", config=cfg, policy="bf16")
    with pytest.raises(TypeError, match="fp8amp.torch.Config"):
        ft.initialize(m, None, config={"opt_level": "O2"})
    # The same setting in both places is no conflict, in any spelling.
    m, opt = ft.initialize(m, torch.optim.AdamW(m.parameters()), fp8amp.OptLevel.O2, config=cfg, policy="FP8")
    assert opt.opt_level == fp8amp.OptLevel.O2 and m[0].policy == fp8amp.GemmPolicy.ALWAYS_FP8


@need_opt
def test_a_refused_initialize_changes_nothing(tdev, gen):
    import fp8amp.torch as ft

    m = make_model(tdev, 1)
    used = torch.optim.AdamW(m.parameters())
    x, t = data(gen, tdev, 1)[0]
    (m(x) - t).square().mean().backward()
    used.step()
    before = kinds(m)
    with pytest.raises(ValueError, match="fresh optimizer"):
        ft.initialize(m, used, "O1")
    assert kinds(m) == before and all(type(v) is torch.nn.Linear for v in [m[0], m[3][0], m[4]])


def test_module_filter_fn_has_torchaos_signature_and_meaning(tdev, caplog):
    """torchao's convert_to_float8_training(module, module_filter_fn=fn): fn(module, fqn) for each
    nn.Linear that could be converted, True = convert. fqn is the dotted name model.named_modules()
    gives. exclude still works beside it; a Linear with a tied weight is kept before either is asked."""
    import fp8amp.torch as ft

    m = make_model(tdev, 2)
    emb = torch.nn.Embedding(16, 48).to(tdev)
    m.add_module("emb", emb)
    m[4].weight = torch.nn.Parameter(emb.weight.detach().T.contiguous())  # 4: a plain Linear
    head = torch.nn.Linear(48, 16, bias=False).to(tdev)
    head.weight = emb.weight  # tied: [16, 48] is the embedding's shape
    m.add_module("head", head)
    names = {id(mod): n for n, mod in m.named_modules()}
    seen = []

    def keep_small(mod, fqn):
        seen.append((fqn, mod))
        return mod.out_features >= 48

    with caplog.at_level(logging.INFO, logger="fp8amp"):
        out = ft.initialize(m, module_filter_fn=keep_small, exclude=("3.0",))
    assert out is m
    # asked once per candidate, with the original nn.Linear and its named_modules() name
    assert [f for f, _ in seen] == ["0", "4"]
    assert all(names[id(mod)] == f and type(mod) is torch.nn.Linear for f, mod in seen)
    assert isinstance(m[0], ft.Linear)  # 64 outputs: replaced
    assert type(m[4]) is torch.nn.Linear  # 16 outputs: the filter said no
    assert type(m[3][0]) is torch.nn.Linear  # excluded (the filter was not asked)
    assert type(m.head) is torch.nn.Linear and m.head.weight is emb.weight  # tied
    text = [r.getMessage() for r in caplog.records if r.name == "fp8amp"]
    assert any("kept 4" in t and "module_filter_fn returned False" in t for t in text), text
    assert any("kept 3.0" in t and "exclude" in t for t in text), text
    assert any("kept head" in t and "shared with another module" in t for t in text), text
    assert any("replaced 0 " in t for t in text), text
    assert text[-1].endswith("1 nn.Linear replaced, 3 kept"), text
    # A filter that raises: the error comes through (a user bug is not a reason to keep a layer).
    m2 = make_model(tdev, 2)
    with pytest.raises(ZeroDivisionError):
        ft.initialize(m2, module_filter_fn=lambda mod, fqn: 1 // 0)


@need_opt
def test_shapes_fp8_gemms_cannot_run(tdev, caplog):
    """With policy "fp8" a Linear whose in/out features are not multiples of 16 is kept (cuBLASLt's FP8
    GEMMs cannot run it: CUDA would refuse every forward), on every device alike; with "auto" it is
    replaced and the log says its GEMMs run in BF16 on CUDA. The optimizer holds both kinds."""
    import fp8amp.torch as ft

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 10),
                                   torch.nn.GELU(), torch.nn.Linear(10, 16)).to(tdev)

    with caplog.at_level(logging.INFO, logger="fp8amp"):
        m = ft.initialize(model(), policy="fp8")
    text = [r.getMessage() for r in caplog.records if r.name == "fp8amp"]
    assert isinstance(m[0], ft.Linear) and type(m[2]) is torch.nn.Linear and type(m[4]) is torch.nn.Linear
    assert any("kept 2" in t and "out_features=10 not a multiple of 16" in t and "policy 'fp8'" in t for t in text)
    assert any("kept 4" in t and "in_features=10 not a multiple of 16" in t for t in text)
    caplog.clear()
    m = model()
    with caplog.at_level(logging.INFO, logger="fp8amp"):
        m, opt = ft.initialize(m, torch.optim.AdamW(m.parameters(), lr=1e-2), "O1", policy="auto")
    text = [r.getMessage() for r in caplog.records if r.name == "fp8amp"]
    assert all(isinstance(m[i], ft.Linear) for i in (0, 2, 4))
    assert any("replaced 2 " in t and "BF16 on CUDA: out_features=10" in t for t in text), text
    assert not any("replaced 0 " in t and "BF16" in t for t in text), text
    assert any("AdamW at O1 over 1 param group(s): the parameters of 3 fp8amp.torch.Linear layer(s)" in t
               and "0 other parameter(s)" in t for t in text), text
    # and it trains (on the CPU FP8 runs any shape; on CUDA AUTO runs these in BF16)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 32, generator=gen).to(tdev)
    t = torch.tanh(torch.randn(64, 16, generator=gen)).to(tdev)
    losses = []
    for _ in range(20):
        loss = (m(x) - t).square().mean()
        losses.append(float(loss))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
