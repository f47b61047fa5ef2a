"""fp8amp.torch.all_reduce_grads and fp8amp.torch.communicator over torch.distributed's ranks on GPUs
(issue 17): one process per rank (rank r on cuda:r), world 1 on any CUDA machine and world 2 where two
GPUs are visible (SKIPPED otherwise). Each rank trains the same model on its own batch; after
all_reduce_grads every rank must hold identical bytes in every gradient, the E4M3 weight gradients
must be within the communicator's bound of the exact mean of the ranks' own gradients, and the other
gradients equal to their mean. Also: a rank whose peer never joins fails with NcclError after the
timeout instead of hanging (world 2)."""
import os
import tempfile
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import spawn_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _worker(rank, world, store, case, seed, q):
    import faulthandler
    faulthandler.enable()
    # a hung rank shows where, then ends
    faulthandler.dump_traceback_later(float(os.environ.get("FP8AMP_TEST_HANG_S", "100")), exit=True)
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
        globals()[case](rank, world, seed)
        q.put((rank, None))
    except BaseException:  # noqa: B902 -- every failure goes back to the test
        q.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world, case, timeout=120):
    seed = int(os.environ.get("FP8AMP_TEST_SEED", time.time_ns() % (2**31)))
    print("FP8AMP_TEST_SEED=%d" % seed)
    store = tempfile.mktemp(prefix="fp8amp_torch_comm_")
    spawn_ranks(_worker, lambda r: (r, world, store, case, seed), world, timeout)


def _model(seed):
    from torch import nn
    torch.manual_seed(seed)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 48), nn.GELU(), nn.Linear(48, 16)).cuda()


def grads_case(rank, world, seed):
    import fp8amp
    import fp8amp.torch as ft

    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = ft.initialize(model, opt, opt_level="O2")
    lins = [m for m in model.modules() if isinstance(m, ft.Linear)]
    assert len(lins) == 3 and all(m._lin.weight_grad.dtype == fp8amp.E4M3 for m in lins)
    # The Linear weights' .grad is a handle on their E4M3 gradients (checked through lins below); the
    # rest are the other parameters' wide gradients.
    weights = {id(m.weight) for m in lins}
    wide = lambda: [p for p in model.parameters() if p.grad is not None and id(p) not in weights]  # noqa: E731
    g = torch.Generator(device="cuda").manual_seed(seed * 7 + rank)  # each rank its own batch
    for step in range(3):
        x = torch.randn(32, 64, device="cuda", generator=g) * (1 + rank)
        loss = model(x).square().mean() * 100
        loss.backward()
        local = [m.dequantized_weight_grad().double() for m in lins]
        other = [p.grad.detach().double().clone() for p in wide()]
        # The exact means, from every rank's own gradients.
        all_local = [None] * world
        dist.all_gather_object(all_local, [t.cpu() for t in local] + [t.cpu() for t in other])
        means = [sum(r[i] for r in all_local) / world for i in range(len(all_local[0]))]
        ft.all_reduce_grads(model)
        torch.cuda.synchronize()
        comm = ft.communicator("cuda:%d" % rank)
        assert (comm.rank, comm.size) == (rank, world)
        assert comm.saturated == 0
        got = [m.dequantized_weight_grad().double().cpu() for m in lins]
        for k, (y, m) in enumerate(zip(got, means[:len(lins)])):
            assert torch.isfinite(y).all()
            # The communicator's bound (docs/communicator.md, Numerics): the wire's rounding of each
            # rank's value (half an E4M3 quantum, 2^-4 relative, at its magnitude), one rounding of the
            # output at |mean|, and the subnormal quantum of the scale used -- for both the wire's,
            # 448 / amax of the inputs (the mean is requantized with the wire's scale).
            amax_in = max(float(r[k].abs().max()) for r in all_local)
            wire = sum(r[k].abs() for r in all_local) / world * 2.0 ** -4 + amax_in / 448 * 2.0 ** -10
            out = m.abs() * 2.0 ** -4 + amax_in / 448 * 2.0 ** -10
            err = (y - m).abs()
            assert bool((err <= wire + out + 1e-12).all()), \
                "layer %d: error %.3g above the bound (step %d)" % (k, float((err - wire - out).max()), step)
        rest = [p.grad.detach().double().cpu() for p in wide()]
        for y, m in zip(rest, means[len(lins):]):
            assert torch.allclose(y, m, rtol=1e-6, atol=1e-7)
        # Identical bytes on every rank: the FP8 codes with their scale_inv, and the rest.
        mine = [m.weight_grad_fp8().numpy().tobytes() + m.weight_grad_fp8().scale_inv().numpy().tobytes() for m in lins]
        mine += [bytes(p.grad.detach().cpu().numpy().tobytes()) for p in wide()]
        assert len(wide()) == 3  # the biases
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        assert all(e == everyone[0] for e in everyone), "the ranks' gradients differ after all_reduce_grads"
        opt.step()
        opt.zero_grad()


def timeout_case(rank, world, seed):
    """Both ranks make the communicator and reduce once; then rank 1 stops taking part: rank 0's next
    all-reduce must fail with NcclError after its timeout (its cross-rank check waits on the host),
    not hang."""
    import fp8amp
    import fp8amp.torch as ft

    comm = ft.communicator("cuda:%d" % rank)
    t = fp8amp.Tensor.from_numpy(comm.context, np.random.default_rng(seed).standard_normal(1000).astype(np.float32))
    # One call on both ranks first: NCCL connects its peers lazily, in the host call of the first
    # operation that needs them, and that call blocks until the peers take part (the timeout cannot
    # cover it); after it, the enqueued work is what waits for a peer.
    comm.all_reduce([t])
    torch.cuda.synchronize()
    if rank == 0:
        comm.set_timeout(2.0)
        t0 = time.time()
        with pytest.raises(fp8amp.NcclError, match="timed out"):
            comm.all_reduce([t])
        assert 1.5 < time.time() - t0 < 30
    dist.barrier()  # rank 1 waits here (gloo) while rank 0 times out
    # Rank 0's communicator was aborted by the timeout; rank 1's peer is gone: abort it too, so that
    # neither teardown waits for the other.
    comm.abort()
    comm.close()


def graph_case(rank, world, seed):
    """The all-reduce captured in a CUDA graph (check off, after a first call of the same sizes grew
    the scratch; docs/communicator.md): replayed on fresh inputs, its bytes equal the eager call's
    on the same inputs. Pieces of 4096 elements (FP8AMP_COMM_PIECE_ELEMENTS, the same on every rank),
    so that the pipeline's forks and joins -- the transfer stream, the amaxes and agreements of the
    later pieces on the agreement stream -- are all in the graph."""
    import fp8amp.torch as ft
    from fp8amp.torch.context import _on_current_stream, to_fp8amp

    os.environ["FP8AMP_COMM_PIECE_ELEMENTS"] = "4096"
    dev = torch.device("cuda", rank)
    comm = ft.communicator(dev)
    gen = torch.Generator(device=dev).manual_seed(seed * 7 + rank)
    shapes = [((300, 70), torch.bfloat16), ((5000,), torch.float32), ((37,), torch.bfloat16), ((96, 96), torch.float16)]

    def fresh():
        return [torch.randn(*sh, device=dev, generator=gen).mul_(float(1 + i)).to(dt) for i, (sh, dt) in enumerate(shapes)]

    def bits(t):
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])

    side = torch.cuda.Stream(dev)
    static = [t.clone() for t in fresh()]
    ts = [to_fp8amp(t, comm.context) for t in static]
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        _on_current_stream(comm.context, dev)
        comm.all_reduce(ts, ts)  # grows the scratch (and checks the arguments once)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        comm.all_reduce(ts, ts, check_args=False)
    for _ in range(3):
        xs = fresh()
        eager = [x.clone() for x in xs]
        es = [to_fp8amp(t, comm.context) for t in eager]
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            _on_current_stream(comm.context, dev)
            comm.all_reduce(es, es, check_args=False)
            for st, x in zip(static, xs):
                st.copy_(x)
            graph.replay()
        side.synchronize()
        for i, (a, b) in enumerate(zip(static, eager)):
            assert torch.equal(bits(a), bits(b)), "tensor %d: the replayed graph's bytes differ from the eager call's" % i
    del os.environ["FP8AMP_COMM_PIECE_ELEMENTS"]


@pytest.mark.skipif(GPUS < 1, reason="no CUDA device")
def test_all_reduce_captured_in_a_graph_one_rank():
    run_ranks(1, "graph_case")


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_all_reduce_captured_in_a_graph_two_ranks():
    run_ranks(2, "graph_case")


@pytest.mark.skipif(GPUS < 1, reason="no CUDA device")
def test_all_reduce_grads_one_rank():
    run_ranks(1, "grads_case")


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_all_reduce_grads_two_ranks():
    run_ranks(2, "grads_case")


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_nccl_timeout_two_ranks():
    run_ranks(2, "timeout_case")
