"""FP8 Linear on cuBLASLt: fp8amp vs PyTorch, in the same run, on one GPU.

Measures, with CUDA events after warm-up (median of many runs):
  - GEMM alone: the cuBLASLt kernels inside fp8amp_linear_forward (read from the CUDA profiler, so
    the input quantization is excluded) vs torch._scaled_mm with the same E4M3 operands and fast
    accumulation, at 8192^3 and at LLM shapes (8192 tokens x 4096->4096, 4096->16384, 16384->4096);
    the bf16 torch.matmul beside them, and TFLOP/s as fractions of the measured peaks;
  - a whole Linear forward + backward (quantization, GEMMs, bias gradient and weight-gradient
    delivery included) vs PyTorch's bf16 nn.Linear forward + backward (autograd), per shape;
  - FP8 vs BF16 inside fp8amp (ALWAYS_FP8 vs NEVER_FP8) over square and token shapes: the crossover
    that the AUTO policy encodes;
  - host time per fp8amp_linear_forward call (the GPU kept busy, so only the host path is timed).
Writes bench/results/linear-<device>-<date>.json (or --out) and prints tables.

Usage: python3 bench/bench_linear.py --lib build/libfp8amp.so [--out FILE] [--commit SHA] [--quick]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

from fp8amp_bench import C, Lib
from fp8amp_bench import bench as _bench


class LinearLib(Lib):
    def __init__(self, path):
        super().__init__(path)
        self.forward = self.lib.fp8amp_linear_forward
        self.backward = self.lib.fp8amp_linear_backward

    def linear(self, ctx, k, n, policy, weight, bias, wgrad_dtype=None, graph_replay=1):
        d = self.init("fp8amp_linear_desc")
        d.in_features, d.out_features, d.policy = k, n, policy
        d.wgrad_dtype = C.E4M3 if wgrad_dtype is None else wgrad_dtype
        d.graph_replay = graph_replay
        lin = self.new("fp8amp_linear *")
        self("fp8amp_linear_create", ctx, d, lin)
        for getter, src, dtype in (("fp8amp_linear_weight", weight, C.BF16), ("fp8amp_linear_bias", bias, C.F32)):
            h = self.new("fp8amp_tensor *")
            self(getter, lin[0], h)
            self("fp8amp_cast", ctx, self.wrap(ctx, src, dtype), h[0])
        return lin[0]

    def kind(self, lin):
        k = self.new("fp8amp_gemm_kind *")
        self("fp8amp_linear_gemm_kind", lin, k)
        return C.KIND_NAMES[k[0]]


def bench(fn):
    """Median ms of fn() over 20 runs behind a longer backlog (the GEMMs are long) -- fp8amp_bench.bench."""
    return _bench(fn, warmup=3, reps=20, backlog_cycles=2_000_000)


OUR_KERNELS = ("quantize", "transpose", "column_", "cast_", "amax", "update_scaling", "dequantize")


def gemm_kernel_ms(fn, reps=10):
    """Median per-call GPU time of the GEMM kernels fn launches (kernels not of fp8amp's own names)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    durations = [e.device_time for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA and not any(k in e.name for k in OUR_KERNELS)]
    per_call = len(durations) // reps
    if per_call == 0:
        raise RuntimeError("no GEMM kernel seen by the profiler")
    calls = [sum(durations[i * per_call:(i + 1) * per_call]) for i in range(reps)]
    return statistics.median(calls) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out")
    ap.add_argument("--commit", default=os.environ.get("FP8AMP_COMMIT", "unknown"))
    ap.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    ap.add_argument("--sections", default="gemm,crossover,host", help="comma-separated: gemm, crossover, host")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    lib = LinearLib(args.lib)
    torch.manual_seed(0)
    stream = torch.cuda.current_stream()
    ctx = lib.context(stream)
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "date": datetime.date.today().isoformat(), "commit": args.commit,
           "torch": torch.__version__, "gemm": {}, "linear": {}, "crossover": {}, "host": {}}
    fp8 = torch.float8_e4m3fn

    # ---- peaks: the measured ceilings at 8192^3 -------------------------------------------------
    s = 8192
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    flops = 2 * s ** 3
    bf16_peak = flops / (bench(lambda: a @ b.t()) * 1e-3) / 1e12
    a8, b8 = a.to(fp8), b.to(fp8)
    one = torch.ones((), device="cuda")
    fp8_peak = flops / (bench(lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16,
                                                       use_fast_accum=True)) * 1e-3) / 1e12
    res["peaks_TFLOPs"] = {"bf16_matmul_8192": bf16_peak, "torch_scaled_mm_8192": fp8_peak}
    del a, b, a8, b8

    shapes = [(8192, 8192, 8192), (8192, 4096, 4096), (8192, 4096, 16384), (8192, 16384, 4096)]
    if args.quick:
        shapes = shapes[:2]
    if "gemm" not in sections:
        shapes = []
    for (m, k, n) in shapes:
        name = f"{m}x{k}->{n}"
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float32) * 0.1
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        hx, hy, hdy, hdx = (lib.wrap(ctx, t, C.BF16) for t in (x, y, dy, dx))
        flops = 2 * m * n * k

        # GEMM alone: fp8amp's cuBLASLt kernel inside the forward vs torch._scaled_mm on the same bytes.
        lin = lib.linear(ctx, k, n, C.ALWAYS_FP8, w, bias)
        lib("fp8amp_linear_forward", lin, hx, hy, 0)  # status checked once; the timed calls are raw
        ours_ms = gemm_kernel_ms(lambda: lib.forward(lin, hx, hy, 0))
        x8, w8 = (x * 0.5).to(fp8), (w * 16).to(fp8)
        sa, sb = torch.tensor(2.0, device="cuda"), torch.tensor(1 / 16, device="cuda")
        bias16 = bias.to(torch.bfloat16)
        torch_ms = bench(lambda: torch._scaled_mm(x8, w8.t(), sa, sb, bias=bias16, out_dtype=torch.bfloat16,
                                                  use_fast_accum=True))
        bf16_ms = bench(lambda: torch.nn.functional.linear(x, w, bias16))
        res["gemm"][name] = {
            "fp8amp_us": ours_ms * 1e3, "fp8amp_TFLOPs": flops / (ours_ms * 1e-3) / 1e12,
            "torch_scaled_mm_us": torch_ms * 1e3, "torch_scaled_mm_TFLOPs": flops / (torch_ms * 1e-3) / 1e12,
            "torch_bf16_us": bf16_ms * 1e3, "torch_bf16_TFLOPs": flops / (bf16_ms * 1e-3) / 1e12,
            "ratio_vs_scaled_mm": torch_ms / ours_ms, "fraction_of_fp8_peak": flops / (ours_ms * 1e-3) / 1e12 / fp8_peak}

        # Whole layer, forward + backward: fp8amp (E4M3 and F32 weight gradients) vs bf16 nn.Linear.
        entry = {}
        for wg_name, wg in (("e4m3_wgrad", C.E4M3), ("f32_wgrad", C.F32)):
            lin_w = lib.linear(ctx, k, n, C.ALWAYS_FP8, w, bias, wg)

            def step():
                lib.forward(lin_w, hx, hy, 1)
                lib.backward(lin_w, hdy, hdx, 0)

            lib("fp8amp_linear_forward", lin_w, hx, hy, 1)  # one status-checked step before the raw ones
            lib("fp8amp_linear_backward", lin_w, hdy, hdx, 0)
            entry[f"fp8amp_{wg_name}_us"] = bench(step) * 1e3
            lib("fp8amp_linear_destroy", lin_w)
        tl = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        xr = x.clone().requires_grad_(True)

        def torch_step():
            out = tl(xr)
            out.backward(dy)

        entry["torch_bf16_us"] = bench(torch_step) * 1e3
        tl.zero_grad(set_to_none=True)
        xr.grad = None
        entry["speedup_e4m3_wgrad"] = entry["torch_bf16_us"] / entry["fp8amp_e4m3_wgrad_us"]
        entry["speedup_f32_wgrad"] = entry["torch_bf16_us"] / entry["fp8amp_f32_wgrad_us"]
        entry["fp8amp_e4m3_wgrad_TFLOPs"] = 3 * flops / (entry["fp8amp_e4m3_wgrad_us"] * 1e-6) / 1e12
        res["linear"][name] = entry
        lib("fp8amp_linear_destroy", lin)
        del x, w, y, dy, dx, x8, w8, tl, xr
        torch.cuda.empty_cache()

    # ---- FP8 vs BF16 inside fp8amp: where FP8 starts to pay --------------------------------------
    cross = [(s, s, s) for s in (256, 512, 1024, 1536, 2048, 3072, 4096)]
    cross += [(t, 4096, 4096) for t in (128, 512, 1024, 2048)] + [(2048, 1024, 1024), (512, 8192, 8192)]
    if args.quick:
        cross = cross[:4]
    if "crossover" not in sections:
        cross = []
    for (m, k, n) in cross:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        bias = torch.zeros(n, device="cuda")
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        hx, hy, hdy, hdx = (lib.wrap(ctx, t, C.BF16) for t in (x, y, dy, dx))
        entry = {"macs": m * n * k}
        for pname, policy in (("fp8", C.ALWAYS_FP8), ("bf16", C.NEVER_FP8), ("auto", C.AUTO)):
            lin = lib.linear(ctx, k, n, policy, w, bias)
            entry[f"{pname}_forward_us"] = bench(lambda: lib.forward(lin, hx, hy, 0)) * 1e3

            def step():
                lib.forward(lin, hx, hy, 1)
                lib.backward(lin, hdy, hdx, 0)

            lib("fp8amp_linear_forward", lin, hx, hy, 1)  # one status-checked step before the raw ones
            lib("fp8amp_linear_backward", lin, hdy, hdx, 0)
            entry[f"{pname}_train_us"] = bench(step) * 1e3
            if pname == "auto":
                entry["auto_chose"] = lib.kind(lin)
            lib("fp8amp_linear_destroy", lin)
        entry["fp8_pays_train"] = entry["fp8_train_us"] < entry["bf16_train_us"]
        res["crossover"][f"{m}x{k}->{n}"] = entry

    # ---- host time per call ---------------------------------------------------------------------
    # The GPU is kept busy (a sleep kernel of ~50 ms) so that the calls never wait for it, and the
    # calls are few enough (200, a handful of launches each) that the launch queue never fills: then
    # the wall time is the host path alone. The sleep must outlast the loop (checked). PyTorch's own
    # calls are timed the same way, as the peer baseline of a launch's host cost.
    def host_us(fn, calls=200, busy=True):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        done = torch.cuda.Event()
        if busy:
            torch.cuda._sleep(100_000_000)
        done.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        us = (time.perf_counter() - t0) / calls * 1e6
        if busy and done.query():
            raise RuntimeError(f"the GPU went idle during the host timing ({calls} calls, {us:.1f} us each): "
                               "lengthen the sleep")
        torch.cuda.synchronize()
        return us

    if "host" in sections:
        m, k, n = 16, 1024, 1024
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        hx, hy = lib.wrap(ctx, x, C.BF16), lib.wrap(ctx, y, C.BF16)
        shape = f"{m}x{k}->{n}"
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        hdy, hdx = lib.wrap(ctx, dy, C.BF16), lib.wrap(ctx, dx, C.BF16)

        def train_step(lin):
            lib.forward(lin, hx, hy, 1)
            lib.backward(lin, hdy, hdx, 1)

        # graph_replay = 1 (the default) replays a repeated call's launches as one CUDA graph launch;
        # graph_replay = 0 launches every kernel each call (how the Linear ran before replay).
        for replay, suffix in ((1, ""), (0, "_no_replay")):
            for pname, policy in (("fp8", C.ALWAYS_FP8), ("bf16", C.NEVER_FP8)):
                lin = lib.linear(ctx, k, n, policy, w, torch.zeros(n, device="cuda"), graph_replay=replay)
                key = f"fp8amp_linear_forward_{pname}_{shape}{suffix}"
                res["host"][key] = host_us(lambda: lib.forward(lin, hx, hy, 0))
                # The same with an idle GPU: the calls never synchronize, and each one's GPU work (a few
                # microseconds) is shorter than its host time, so the launch queue never fills either.
                res["host"][key + "_idle_gpu"] = host_us(lambda: lib.forward(lin, hx, hy, 0), busy=False)
                res["host"][f"fp8amp_linear_forward_backward_{pname}_{shape}{suffix}"] = host_us(
                    lambda: train_step(lin), calls=100)
                replays = lib.new("uint64_t *")
                lib("fp8amp_linear_graph_replays", lin, replays)
                res["host"][f"graph_replays_{pname}{suffix}"] = replays[0]
                lib("fp8amp_linear_destroy", lin)
        q = torch.empty(m, k, device="cuda", dtype=torch.uint8)
        hq = lib.wrap(ctx, q, C.E4M3)
        meta = lib.scaling(ctx)
        lib("fp8amp_tensor_set_scaling", hq, meta)
        quantize = lib.lib.fp8amp_quantize
        res["host"][f"fp8amp_quantize_{m}x{k}"] = host_us(lambda: quantize(ctx, hx, hq))
        # The cost of one call into the library from Python, now through CFFI (the key keeps its name
        # from when the benchmarks used ctypes, so that results stay comparable by name).
        res["host"]["ctypes_call"] = host_us(lambda: lib.lib.fp8amp_version())
        bias16 = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        x8, w8 = x.to(fp8), w.to(fp8)
        res["host"][f"torch_linear_bf16_{shape}"] = host_us(lambda: torch.nn.functional.linear(x, w, bias16))
        xg = x.detach().clone().requires_grad_(True)
        wg = w.detach().clone().requires_grad_(True)
        bg = bias16.detach().clone().requires_grad_(True)
        res["host"][f"torch_linear_forward_backward_bf16_{shape}"] = host_us(
            lambda: torch.nn.functional.linear(xg, wg, bg).backward(dy), calls=100)
        res["host"][f"torch_linear_bf16_{shape}_idle_gpu"] = host_us(
            lambda: torch.nn.functional.linear(x, w, bias16), busy=False)
        res["host"][f"torch_scaled_mm_{shape}"] = host_us(
            lambda: torch._scaled_mm(x8, w8.t(), one, one, bias=bias16, out_dtype=torch.bfloat16, use_fast_accum=True))
        res["host"][f"torch_cast_to_fp8_{m}x{k}"] = host_us(lambda: x.to(fp8))

    out_path = args.out or os.path.join(os.path.dirname(__file__), "results",
                                        f"linear-{props.name.replace(' ', '_')}-{res['date']}.json")
    with open(out_path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"peaks: bf16 {bf16_peak:.0f} TFLOP/s, torch._scaled_mm {fp8_peak:.0f} TFLOP/s (8192^3)")
    print(f"{'GEMM':22s} {'fp8amp us':>10s} {'TFLOP/s':>8s} {'scaled_mm us':>12s} {'ratio':>6s} {'bf16 us':>8s}")
    for name, e in res["gemm"].items():
        print(f"{name:22s} {e['fp8amp_us']:10.1f} {e['fp8amp_TFLOPs']:8.0f} {e['torch_scaled_mm_us']:12.1f} "
              f"{e['ratio_vs_scaled_mm']:6.3f} {e['torch_bf16_us']:8.1f}")
    print(f"{'Linear fwd+bwd':22s} {'e4m3 wg us':>10s} {'f32 wg us':>10s} {'torch bf16':>10s} {'speedup':>8s}")
    for name, e in res["linear"].items():
        print(f"{name:22s} {e['fp8amp_e4m3_wgrad_us']:10.1f} {e['fp8amp_f32_wgrad_us']:10.1f} "
              f"{e['torch_bf16_us']:10.1f} {e['speedup_e4m3_wgrad']:8.2f}")
    print(f"{'crossover':22s} {'fp8 fwd':>8s} {'bf16 fwd':>8s} {'fp8 train':>9s} {'bf16 train':>10s} {'auto':>5s}")
    for name, e in res["crossover"].items():
        print(f"{name:22s} {e['fp8_forward_us']:8.1f} {e['bf16_forward_us']:8.1f} {e['fp8_train_us']:9.1f} "
              f"{e['bf16_train_us']:10.1f} {e['auto_chose']:>5s}")
    for name, us in res["host"].items():
        print(f"host time per call, {name}: {us:.2f} us" if not name.startswith("graph_replays")
              else f"{name}: {us}")
    print("wrote", out_path)


if __name__ == "__main__":
    sys.exit(main())
