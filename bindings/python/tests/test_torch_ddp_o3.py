"""DistributedDataParallel at O3 (E4M3 Linear weights with F16 masters) is refused, never a silent
wrong result (issue 18 point 2; docs/torch.md section 6): DDP buckets a parameter's gradient in the
parameter's dtype, float8 at O3, which no collective reduces. Over gloo DDP's constructor fails itself
(gloo cannot broadcast float8 tensors); over NCCL the constructor passes and the first backward's copy
of an E4M3 weight gradient into its float8 bucket raises fp8amp's NotImplementedError, which names
all_reduce_grads. One process: that copy (and DDP's mul_out) raise; reading the gradient still works."""
import os
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import spawn_ranks  # noqa: E402
from test_torch_ddp import B, GPUS, _data, _free_port, _model  # noqa: E402
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
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    with pytest.raises(Exception, match="all_reduce_grads"):  # the reducer may re-raise as its own type
        (ddp(x[rank * B:(rank + 1) * B]) - y[rank * B:(rank + 1) * B]).square().mean().backward()


def _worker(rank, world, port, case, seed, dev_type, out, q):
    import faulthandler
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("FP8AMP_TEST_HANG_S", "200")), exit=True)
    try:
        dev = torch.device(dev_type, rank) if dev_type == "cuda" else torch.device("cpu")
        if dev_type == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if dev_type == "cuda" else "gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=rank, world_size=world)
        globals()[case](rank, world, seed, dev, out)
        q.put((rank, None))
    except BaseException:  # noqa: B902 -- every failure goes back to the test
        q.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(world, dev_type, rng):
    port, seed = _free_port(), int(rng.integers(2**31))
    with tempfile.TemporaryDirectory() as out:
        spawn_ranks(_worker, lambda r: (r, world, port, "o3_case", seed, dev_type, out), world, 200, join_timeout=20.0)


def test_ddp_at_o3_is_refused_over_gloo(rng):
    """2 CPU processes: DDP's constructor fails (gloo broadcasts no float8 tensor): no training runs."""
    _run(2, "cpu", rng)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one process per visible GPU)")
def test_ddp_at_o3_is_refused_over_nccl(rng):
    """Every visible GPU: the first backward raises fp8amp's NotImplementedError naming
    all_reduce_grads, from DDP's copy of an E4M3 weight gradient into its float8 bucket."""
    _run(GPUS, "cuda", rng)
