"""fp8amp.torch.initialize(model, opt, "O3", process_group=group) on every visible GPU (one process
each, NCCL; issue 20): each rank keeps the masters and Adam state of its shard and a step
reduce-scatters the local gradients (FP8 wire, FP32 accumulation), updates the shard and all-gathers
the E4M3 weights. Checked: every rank ends with the same parameter bytes; the updates after STEPS
steps equal the single process's unsharded O3 on the combined batch within a tolerance that the run
on rank 0's rows alone fails.
Needs PyTorch and 2 GPUs (SKIPPED otherwise). The CPU refusal is in test_torch_o3.py."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import run_case  # noqa: E402

import fp8amp  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() and fp8amp.device_count("cuda") > 0 else 0
B, STEPS, LR = 32, 3, 1e-2


def _model(seed, dev):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.LayerNorm(256), torch.nn.GELU(),
                               torch.nn.Linear(256, 16)).to(dev)


def _data(seed, world, dev):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(world * B, 32, generator=g).to(dev), torch.randn(world * B, 16, generator=g).to(dev))
            for _ in range(STEPS)]


def _init(seed, dev, group=None):
    import fp8amp.torch as ft

    model = _model(seed, dev)
    init = [p.detach().float().clone().cpu() for p in model.parameters()]
    # the unsharded reference with the sharded default's state layout (blocks of 128; unsharded O3's
    # default is one scale per tensor)
    layout = {} if group is not None else {"state_block_size": 128}
    model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=LR, eps=0.1, weight_decay=0.01), "O3",
                               policy="fp8", master_rounding="stochastic", process_group=group, **layout)
    return model, opt, init


def _train(model, opt, data, rows):
    for x, y in data:
        (model(x[rows]) - y[rows]).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().float().clone().cpu() for p in model.parameters()]


def _case(rank, world, seed, dev, out):
    model, opt, _ = _init(seed, dev, dist.group.WORLD)
    # a sharded O3 keeps blocks of 128 by default: a tensor's scale would span ranks
    assert {o.config.state_block_size for o in opt.fp8amp_optimizers} == {128}
    params = _train(model, opt, _data(seed, world, dev), slice(rank * B, (rank + 1) * B))
    raw = [p.detach().reshape(-1).view(torch.uint8).cpu().clone() for p in model.parameters()]
    torch.save({"params": params, "raw": raw, "state_bytes": opt.state_bytes()}, os.path.join(out, "rank%d.pt" % rank))


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one process per visible GPU)")
def test_o3_process_group_equals_the_combined_batch(rng):
    seed, world = int(rng.integers(2**31)), GPUS
    with tempfile.TemporaryDirectory() as out:
        run_case(__name__, "_case", world, seed, "cuda", out)
        ranks = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(world)]
    for r in ranks[1:]:  # the all-gather gave every rank the same bytes
        for a, b in zip(r["raw"], ranks[0]["raw"]):
            assert torch.equal(a, b)
    dev = torch.device("cuda", 0)
    data = _data(seed, world, dev)
    model, opt, init = _init(seed, dev)
    ref = _train(model, opt, data, slice(0, world * B))
    full_bytes = opt.state_bytes()
    model, opt, _ = _init(seed, dev)
    solo = _train(model, opt, data, slice(0, B))
    upd = [_rel(p - i, w - i) for p, w, i in zip(ranks[0]["params"], ref, init)]
    solo_upd = [_rel(p - i, w - i) for p, w, i in zip(solo, ref, init)]
    # x and dY quantized per rank (half the batch) instead of once, the E4M3 weights' rounding, the FP8
    # wire and its requantization: 2^-2 + 2 * 2^-4 (test_torch_ddp.tolerance's fp8 policy with the hook)
    tol = 2.0 ** -2 + 2 * 2.0 ** -4
    print("update errors", upd, "solo", solo_upd)
    assert max(upd) <= tol, (upd, tol)
    assert max(solo_upd) > tol, solo_upd
    # Memory is not compared here: on a model this small the sharded optimizer's held scratch (4 x N x k
    # of the largest parameter) and the per-shard padding to the state block outweigh the halved state
    # (2 x H200: 91600 bytes a rank against 82776 unsharded); the memory model is checked bit for bit
    # against fp8amp_optimizer_state_bytes in tests/mpi/test_optimizer_shard.c (docs/o3.md, Memory).
    print("state bytes per rank", [r["state_bytes"] for r in ranks], "unsharded", full_bytes)
