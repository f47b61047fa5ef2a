"""Runs one test case in several spawned processes (one a rank) and fails the test with every failed
rank's traceback. Shared by the multi-process PyTorch tests (test_torch_comm.py, test_torch_ddp*.py,
test_torch_fsdp.py, test_torch_o3_shard.py). Each process's target puts (rank, None) or (rank,
traceback text) on the queue it is given last. ``run_case`` is the usual target: it joins a
torch.distributed process group (NCCL on CUDA, gloo on the CPU) and calls a named function of a test
module on every rank."""
import importlib
import os
import socket
import time
import traceback


def spawn_ranks(target, args_of_rank, world, timeout, join_timeout=10.0):
    """Starts target(*args_of_rank(rank), queue) for every rank under the "spawn" start method and
    waits up to `timeout` seconds for all of them to report; a process that died without reporting
    ends the wait early. Asserts that every rank reported and none failed."""
    import torch.multiprocessing as mp

    mpc = mp.get_context("spawn")
    q = mpc.Queue()
    procs = [mpc.Process(target=target, args=tuple(args_of_rank(r)) + (q,)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + timeout
    try:
        while len(results) < world and time.time() < deadline:
            try:
                r, err = q.get(timeout=1.0)
                results[r] = err
            except Exception:  # queue.Empty
                if any(p.exitcode not in (None, 0) for p in procs) and q.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=join_timeout)
            if p.is_alive():
                p.kill()
    assert len(results) == world, "ranks reported: %s; exit codes %s" % (sorted(results), [p.exitcode for p in procs])
    failures = {r: e for r, e in results.items() if e}
    assert not failures, "\n".join("rank %d:\n%s" % (r, e) for r, e in sorted(failures.items()))


def free_port():
    """A TCP port free on the loopback interface now (the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_worker(module, case, rank, world, port, seed, dev_type, out, args, hang_s, q):
    """One rank: dumps every thread's stack and exits after hang_s seconds (FP8AMP_TEST_HANG_S
    overrides), joins the process group, runs module.case(rank, world, seed, device, out, *args) and
    reports on q; the group is destroyed whatever happened."""
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("FP8AMP_TEST_HANG_S", str(hang_s))), exit=True)
    try:
        dev = torch.device(dev_type, rank) if dev_type == "cuda" else torch.device("cpu")
        if dev_type == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if dev_type == "cuda" else "gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=rank, world_size=world)
        getattr(importlib.import_module(module), case)(rank, world, seed, dev, out, *args)
        q.put((rank, None))
    except BaseException:  # noqa: B902 -- every failure goes back to the test
        q.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_case(module, case, world, seed, dev_type, out, args=(), timeout=300, hang_s=200):
    """Runs module.case on `world` spawned ranks (rank r on cuda:r, or the CPU with gloo) and fails
    with every failed rank's traceback (spawn_ranks)."""
    port = free_port()
    spawn_ranks(rank_worker, lambda r: (module, case, r, world, port, seed, dev_type, out, tuple(args), hang_s),
                world, timeout, join_timeout=20.0)
