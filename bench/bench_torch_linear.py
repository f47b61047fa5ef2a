#!/usr/bin/env python3
"""Host time per call of fp8amp.torch.Linear (the PyTorch front) beside torch.nn.Linear, measured as
bench_linear.py's host section does: the GPU is kept busy by a sleep kernel, so the time is what the
calling thread spends per call (Python, autograd, the C API), never waiting for the GPU. Also: the
parts of the module's per-call path; why a long forward + backward loop can make the host wait (the
CUDA launch queue: its depth, the kernels per call, the loop length at which waiting starts); the
fwd+bwd GPU time at one GPT-sized shape; and the memory per parameter of a model at O1/O2/O3 beside
torch's F32 AdamW. Writes a JSON to bench/results/.

    python3 bench/bench_torch_linear.py [--out bench/results/torch-linear-DEVICE-DATE.json] [--commit SHA]
"""
import argparse
import datetime
import gc
import itertools
import json
import os
import time
import traceback

import torch

import fp8amp.torch as ft

IDLE = []  # the measurements during which the GPU ran dry: the call waited for the GPU somewhere
SLEEP_CYCLES = 2_000_000_000  # about 1 s at 1.98 GHz: longer than any of the loops


def behind_busy_gpu(fn, calls, warmup):
    """Host microseconds per fn() over `calls` calls made while a sleep kernel keeps the GPU busy,
    and whether the GPU ran dry meanwhile (the calls waited for it somewhere)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(SLEEP_CYCLES)
    done.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    waited = bool(done.query())
    torch.cuda.synchronize()
    return us, waited


def host_us(fn, calls=100, name=""):
    us, waited = behind_busy_gpu(fn, calls, warmup=20)
    if waited:
        IDLE.append(name)
    return us


def gpu_ms(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def launch_queue_depth():
    """How many kernel launches the host can queue behind a busy GPU before cudaLaunchKernel blocks:
    after a long sleep kernel, n launches of a 1-element add take microseconds each while the queue
    has room; once it is full each launch waits for the GPU. Returns {n: ms for the n launches}."""
    t = torch.zeros(1, device="cuda")
    out = {}
    for n in (256, 512, 768, 896, 1024, 1152, 1280, 1536, 2048, 4096):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # about 0.1 s
        t0 = time.perf_counter()
        for _ in range(n):
            t.add_(1.0)
        out[n] = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
    return out


def kernels_per_call(fn, calls=10):
    """GPU kernels (and memsets/copies) per call of fn, counted by the profiler (CUPTI sees the ones
    that fp8amp and cuBLASLt launch too)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    names = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] = names.get(e.name, 0) + 1
    return sum(names.values()) / calls, {k: v / calls for k, v in sorted(names.items())}


def waits_by_loop_length(fn, lengths=(10, 20, 40, 60, 80, 100, 150)):
    """For loops of each length behind a busy GPU: did the host wait (the GPU went idle) and the host
    time per call."""
    out = {}
    for n in lengths:
        us, waited = behind_busy_gpu(fn, n, warmup=5)
        out[n] = {"waited": waited, "host_us_per_call": us}
    return out


def memory_per_param(levels=("torch", "O1", "O2", "O3"), width=2048, layers=4, rows=16):
    """torch.cuda.memory_allocated held by a model of `layers` bias-free Linear(width, width) and its
    optimizer after one training step (weights, gradients, FP8 copies, the FP32 weight-gradient sums,
    optimizer state; activations are negligible at `rows` rows), per parameter. fp8amp's allocations
    come from torch's caching allocator, so they are counted."""
    res = {}
    for level in ("warmup",) + tuple(levels):  # the first builds the context's cuBLASLt workspace
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()
        nparams = sum(p.numel() for p in model.parameters())
        if level == "torch":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        else:
            model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                                       "O2" if level == "warmup" else level, policy="fp8")
        x = torch.randn(rows, width, device="cuda")
        model(x).float().square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        if level != "warmup":
            res[level] = {"bytes": held, "bytes_per_param": held / nparams, "params": nparams,
                          "optimizer_state_bytes": opt.state_bytes() if level != "torch" else None}
        del model, opt, x
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=os.environ.get("FP8AMP_COMMIT", ""))
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "date": datetime.date.today().isoformat(), "commit": args.commit,
           "torch": torch.__version__, "host_us": {}, "calls": {}, "gpu_ms": {}}

    def section(name, fn):
        try:
            fn()
        except Exception:  # record and go on: one broken section must not lose the others
            res.setdefault("errors", {})[name] = traceback.format_exc()
            print("section %s failed:\n%s" % (name, res["errors"][name]), flush=True)

    def measure(key, fn, calls=100):
        res["host_us"][key] = host_us(fn, calls=calls, name=key)
        res["calls"][key] = calls

    m, k, n = 16, 1024, 1024
    shape = "%dx%d->%d" % (m, k, n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    # Why a forward + backward loop can make the host wait: the launch queue.
    def queue():
        res["launch_queue_ms"] = launch_queue_depth()
        lin = ft.Linear(k, n, device="cuda", policy="fp8")
        xg = x.clone().requires_grad_()
        kpc, names = kernels_per_call(lambda: lin(xg).backward(gy))
        res["kernels_per_fwd_bwd_fp8"] = kpc
        res["kernel_names_fwd_bwd_fp8"] = names
        lin_bf16 = ft.Linear(k, n, device="cuda", policy="bf16")
        res["kernels_per_fwd_bwd_bf16"] = kernels_per_call(lambda: lin_bf16(xg).backward(gy))[0]
        res["kernels_per_forward_nograd_fp8"] = kernels_per_call(lambda: lin(x))[0]
        res["fwd_bwd_fp8_waits_by_loop_length"] = waits_by_loop_length(lambda: lin(xg).backward(gy))
        print("launch queue (launches: ms):", res["launch_queue_ms"], flush=True)
        print("kernels per fwd+bwd: fp8 %.1f, bf16 %.1f" % (kpc, res["kernels_per_fwd_bwd_bf16"]), flush=True)
        print("fwd+bwd fp8 waits by loop length:", res["fwd_bwd_fp8_waits_by_loop_length"], flush=True)
    section("queue", queue)
    # A fwd+bwd loop stays well inside the launch queue with this many calls (see "queue").
    fb_calls = 40

    def module_rows():
        for pol in ("fp8", "bf16"):
            lin = ft.Linear(k, n, device="cuda", policy=pol)
            cyc = itertools.cycle([x, x2])
            with torch.no_grad():
                measure("fp8amp.torch.Linear_forward_nograd_%s_%s" % (pol, shape), lambda: lin(x))
                # alternating inputs: x and y re-pointed at every call (no same-address skip)
                measure("fp8amp.torch.Linear_forward_nograd_%s_%s_alternating_inputs" % (pol, shape),
                        lambda: lin(next(cyc)))
            xg = x.clone().requires_grad_()
            measure("fp8amp.torch.Linear_forward_autograd_%s_%s" % (pol, shape), lambda: lin(xg))
            measure("fp8amp.torch.Linear_fwd+bwd_%s_%s" % (pol, shape), lambda: lin(xg).backward(gy), calls=fb_calls)
            if pol == "fp8":  # the C call alone through cffi, tensors wrapped once: the floor under the module
                from fp8amp._ffi import lib
                from fp8amp.torch import _wrap
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                hx, hy = _wrap(lin._ctx.handle, x), _wrap(lin._ctx.handle, y)
                measure("fp8amp_linear_forward_cffi_only_fp8_%s" % shape,
                        lambda: lib.fp8amp_linear_forward(lin._h, hx, hy, 0))
                lib.fp8amp_tensor_destroy(hx)
                lib.fp8amp_tensor_destroy(hy)
        o3 = ft.Linear(k, n, device="cuda", policy="fp8", weight_dtype=torch.float8_e4m3fn)
        with torch.no_grad():
            measure("fp8amp.torch.Linear_forward_nograd_fp8_e4m3_weight_%s" % shape, lambda: o3(x))
        ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            measure("torch.nn.Linear_forward_nograd_bf16_%s" % shape, lambda: ref(x))
        xg = x.clone().requires_grad_()
        measure("torch.nn.Linear_forward_autograd_bf16_%s" % shape, lambda: ref(xg))
        measure("torch.nn.Linear_fwd+bwd_bf16_%s" % shape, lambda: ref(xg).backward(gy), calls=fb_calls)
    section("module", module_rows)

    def parts():
        from fp8amp._ffi import ffi, lib
        from fp8amp.torch import _raw_stream, _wrap
        ctx_h = ft.context("cuda").handle

        def wrap_destroy():
            lib.fp8amp_tensor_destroy(_wrap(ctx_h, x))
        measure("part: fp8amp_tensor_wrap+destroy of a torch tensor", wrap_destroy)
        h = _wrap(ctx_h, x)
        vp = ffi.typeof("void *")
        cyc = itertools.cycle([x, x2])

        def rebind():
            t = next(cyc)
            s = t.shape
            lib.fp8amp_tensor_rebind(h, ffi.cast(vp, t.data_ptr()), len(s), s)
        measure("part: fp8amp_tensor_rebind of a torch tensor (pointer cast included)", rebind)
        lib.fp8amp_tensor_destroy(h)
        measure("part: torch.empty(16x1024 bf16)", lambda: torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
        measure("part: x.new_empty(16x1024 bf16)", lambda: x.new_empty((m, n), dtype=torch.bfloat16))
        measure("part: current raw stream", lambda: _raw_stream(0))
    section("parts", parts)

    def gpu():
        # GPU time fwd+bwd at a GPT-sized MLP shape (4096 tokens, 768 -> 3072), bf16 activations.
        mm, kk, nn = 4096, 768, 3072
        xb = torch.randn(mm, kk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gyb = torch.randn(mm, nn, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.Linear(kk, nn, device="cuda", dtype=torch.bfloat16)
        for wd in (torch.float32, torch.float8_e4m3fn):
            lin = ft.Linear(kk, nn, device="cuda", policy="fp8", weight_dtype=wd)
            res["gpu_ms"]["fp8amp.torch.Linear_fwd+bwd_fp8_%s_weight_%dx%d->%d" % (str(wd)[6:], mm, kk, nn)] = \
                gpu_ms(lambda: lin(xb).backward(gyb))
        res["gpu_ms"]["torch.nn.Linear_fwd+bwd_bf16_%dx%d->%d" % (mm, kk, nn)] = gpu_ms(lambda: ref(xb).backward(gyb))
    section("gpu", gpu)

    def memory():
        res["memory_per_param"] = memory_per_param()
        for lv, r in res["memory_per_param"].items():
            print("memory %-5s %.2f bytes/param" % (lv, r["bytes_per_param"]), flush=True)
    section("memory", memory)

    res["gpu_went_idle_during"] = IDLE  # these host times include waiting for the GPU
    print("GPU went idle (the host waited) during:", IDLE)
    for key, v in list(res["host_us"].items()) + list(res["gpu_ms"].items()):
        print("%-80s %8.2f" % (key, v))
    out = args.out or "bench/results/torch-linear-%s-%s.json" % (props.name.replace(" ", "_"), res["date"])
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
