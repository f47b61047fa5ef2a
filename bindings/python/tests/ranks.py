"""Runs one test case in several spawned processes (one a rank) and fails the test with every failed
rank's traceback. Shared by the multi-process PyTorch tests (test_torch_comm.py, test_torch_ddp.py).
Each process's target puts (rank, None) or (rank, traceback text) on the queue it is given last."""
import time


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
