#!/usr/bin/env python3
"""Host time per call of fp8amp.torch.Linear (the PyTorch front) beside torch.nn.Linear, measured as
bench_linear.py's host section does: the GPU is kept busy by a sleep kernel, so the time is what the
calling thread spends per call (Python, autograd, the C API), never waiting for the GPU. Also the
fwd+bwd GPU time at one GPT-sized shape. Writes a JSON to bench/results/.

    python3 bench/bench_torch_linear.py [--out bench/results/torch-linear-DEVICE-DATE.json]
"""
import argparse
import datetime
import json
import os
import time

import torch

import fp8amp.torch as ft


IDLE = []  # the measurements during which the GPU ran dry: the call waited for the GPU somewhere


def host_us(fn, calls=100, name=""):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(2_000_000_000)  # about 1 s at 1.98 GHz: longer than any of the loops
    done.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    if done.query():
        IDLE.append(name)
    torch.cuda.synchronize()
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "host_us": {}, "gpu_ms": {}}
    m, k, n = 16, 1024, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    shape = "%dx%d->%d" % (m, k, n)
    def measure(key, fn):
        res["host_us"][key] = host_us(fn, name=key)

    for pol in ("fp8", "bf16"):
        lin = ft.Linear(k, n, device="cuda", policy=pol)
        with torch.no_grad():
            measure("fp8amp.torch.Linear_forward_nograd_%s_%s" % (pol, shape), lambda: lin(x))
        xg = x.clone().requires_grad_()
        measure("fp8amp.torch.Linear_forward_autograd_%s_%s" % (pol, shape), lambda: lin(xg))
        gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        measure("fp8amp.torch.Linear_fwd+bwd_%s_%s" % (pol, shape), lambda: lin(xg).backward(gy))
        if pol == "fp8":  # the C call alone through cffi, tensors wrapped once: the floor under the module
            from fp8amp._ffi import lib
            from fp8amp.torch import _wrap
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            hx, hy = _wrap(lin._ctx.handle, x), _wrap(lin._ctx.handle, y)
            measure("fp8amp_linear_forward_cffi_only_fp8_%s" % shape, lambda: lib.fp8amp_linear_forward(lin._h, hx, hy, 0))
            lib.fp8amp_tensor_destroy(hx)
            lib.fp8amp_tensor_destroy(hy)
    with torch.no_grad():
        measure("torch.nn.Linear_forward_nograd_bf16_%s" % shape, lambda: ref(x))
    xg = x.clone().requires_grad_()
    measure("torch.nn.Linear_forward_autograd_bf16_%s" % shape, lambda: ref(xg))
    gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    measure("torch.nn.Linear_fwd+bwd_bf16_%s" % shape, lambda: ref(xg).backward(gy))

    # GPU time fwd+bwd at a GPT-sized MLP shape (4096 tokens, 768 -> 3072), bf16 activations.
    m, k, n = 4096, 768, 3072
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    lin = ft.Linear(k, n, device="cuda", policy="fp8")
    res["gpu_ms"]["fp8amp.torch.Linear_fwd+bwd_fp8_%dx%d->%d" % (m, k, n)] = gpu_ms(lambda: lin(x).backward(gy))
    res["gpu_ms"]["torch.nn.Linear_fwd+bwd_bf16_%dx%d->%d" % (m, k, n)] = gpu_ms(lambda: ref(x).backward(gy))
    # Breakdown of the module's host path, and which C call of a training step waits for the GPU.
    from fp8amp._ffi import lib
    from fp8amp.torch import _raw_stream, _wrap
    m, k, n = 16, 1024, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ctx_h = ft.context("cuda").handle

    def wrap_destroy():
        lib.fp8amp_tensor_destroy(_wrap(ctx_h, x))
    measure("part: fp8amp_tensor_wrap+destroy of a torch tensor", wrap_destroy)
    measure("part: torch.empty(16x1024 bf16)", lambda: torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    measure("part: current raw stream", lambda: _raw_stream(0))
    for wg in (torch.float32, torch.float8_e4m3fn):
        lin = ft.Linear(k, n, device="cuda", policy="fp8", wgrad_dtype=wg)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        hx, hy, hdy, hdx = (_wrap(ctx_h, t) for t in (x, y, dy, dx))
        lib.fp8amp_linear_forward(lin._h, hx, hy, 1)
        lib.fp8amp_linear_backward(lin._h, hdy, hdx, 0)
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)
        done = torch.cuda.Event()
        done.record()
        t0 = time.perf_counter()
        rc1 = lib.fp8amp_linear_forward(lin._h, hx, hy, 1)
        t1 = time.perf_counter()
        idle_f = done.query()
        rc2 = lib.fp8amp_linear_backward(lin._h, hdy, hdx, 1)
        t2 = time.perf_counter()
        idle_b = done.query()
        torch.cuda.synchronize()
        res["host_us"]["C forward(training) wgrad %s" % wg] = (t1 - t0) * 1e6
        res["host_us"]["C backward wgrad %s" % wg] = (t2 - t1) * 1e6
        res.setdefault("waits", {})[str(wg)] = {"forward_waited": idle_f, "backward_waited": idle_b, "rc": [rc1, rc2]}
        print("wgrad %s: C forward %.1f us (GPU idle after: %s), C backward %.1f us (GPU idle after: %s)" % (
            wg, (t1 - t0) * 1e6, idle_f, (t2 - t1) * 1e6, idle_b), flush=True)
        for h in (hx, hy, hdy, hdx):
            lib.fp8amp_tensor_destroy(h)
    res["gpu_went_idle_during"] = IDLE  # these host times include waiting for the GPU
    # Which torch calls synchronize inside one fp8amp fwd+bwd (fp8amp's own would not show here).
    torch.cuda.set_sync_debug_mode("warn")
    lin = ft.Linear(1024, 1024, device="cuda", policy="fp8")
    xs = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lin(xs).backward(torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16))
    torch.cuda.set_sync_debug_mode(0)
    print("GPU went idle (the host waited) during:", IDLE)
    for key, v in list(res["host_us"].items()) + list(res["gpu_ms"].items()):
        print("%-60s %8.2f" % (key, v))
    out = args.out or "bench/results/torch-linear-%s-%s.json" % (props.name.replace(" ", "_"), res["date"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
