"""fp8amp.torch.LayerNormLinear / LayerNormMLP with the norm (and the activation) writing the next Linear's E4M3
operand (fp8amp_linear_forward_fp8, issue 19) against the same blocks as their modules' composition
(each Linear quantizing a bf16 norm/GELU output in its own pass) and against bf16 AMP's nn modules,
in the same run, on one GPU. A step is forward + backward of one block under bf16 autocast, x
[tokens, d] bf16; CUDA events around each step (median), a sleep kernel queued first so that the
host's enqueueing is off the clock. Shapes: a GPT layer's at d = 2048 and 4096 with 8192 tokens (the
issue's presets); --cases also takes rmslinear (RMSNorm) and swiglu (RMSNorm + SwiGLU MLP, LLaMA's).

Usage: PYTHONPATH=<site with fp8amp> python3 bench/bench_fused_blocks.py [--out FILE] [--reps N]
Writes bench/results/fused_blocks-<device>-<date>.json (or --out) with device, date, commit.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

import fp8amp
import fp8amp.torch as ft

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


BACKLOG = 20_000_000  # cycles of the sleep kernel queued before each timed step (--backlog)


def bench(fn, warmup, reps):
    """(GPU ms, host ms) medians of a step: the events time the GPU's work, queued behind a sleep kernel
    long enough (BACKLOG) that the host's enqueueing of the step ends first (host ms, measured on the
    host around the enqueueing, says whether it did: it must stay below the backlog's length)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(BACKLOG)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), statistics.median(host)


def composition(m, x):
    """The block's modules one after another (each Linear quantizing its wide input itself)."""
    if isinstance(m, ft.LayerNormLinear):
        return m.linear(m.norm(x))
    return m.fc2(m.act(m.fc1(m.norm(x))))


class SwiGLURef(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return nn.functional.silu(a) * b


def nn_block(kind, d, f):
    """bf16 AMP's peer of each block: nn modules."""
    if kind == "lnlinear":
        return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, f))
    if kind == "rmslinear":
        return nn.Sequential(nn.RMSNorm(d, eps=1e-5), nn.Linear(d, f))
    if kind == "swiglu":
        return nn.Sequential(nn.RMSNorm(d, eps=1e-5), nn.Linear(d, 2 * f), SwiGLURef(), nn.Linear(f, d))
    return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, f), nn.GELU(approximate="tanh"), nn.Linear(f, d))


def fp8amp_block(kind, d, f, dev, recipe):
    """lnlinear: LayerNormLinear d -> f; rmslinear: the same with RMSNorm; lnmlp: LayerNormMLP d -> f -> d
    (GELU); swiglu: RMSNorm + SwiGLU MLP d -> 2f -> (f) -> d (LLaMA's FFN)."""
    if kind == "lnlinear":
        return ft.LayerNormLinear(d, f, device=dev, recipe=recipe)
    if kind == "rmslinear":
        return ft.LayerNormLinear(d, f, device=dev, recipe=recipe, normalization="RMSNorm")
    if kind == "swiglu":
        return ft.LayerNormMLP(d, f, device=dev, recipe=recipe, normalization="RMSNorm", activation="swiglu")
    return ft.LayerNormMLP(d, f, device=dev, recipe=recipe)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--commit", default=os.environ.get("FP8AMP_COMMIT", "unknown"))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--recipes", default="current,delayed",
                    help="the fp8amp Linears' scaling: current (the front's default) and/or delayed")
    ap.add_argument("--cases", default="lnlinear:8192x2048x6144,lnmlp:8192x2048x8192,lnlinear:8192x4096x12288,"
                                       "lnmlp:8192x4096x16384")
    ap.add_argument("--backlog", type=int, default=BACKLOG, help="sleep cycles queued before each step")
    args = ap.parse_args()
    globals()["BACKLOG"] = args.backlog
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "date": datetime.date.today().isoformat(), "commit": args.commit,
           "torch": torch.__version__, "backlog_cycles": BACKLOG,
           "what": "forward + backward of one block, bf16 autocast, median ms (GPU, events) and host ms (enqueueing)",
           "cases": {}}
    gen = torch.Generator(device=dev).manual_seed(1234)
    for recipe_name, case in ((r, c) for r in args.recipes.split(",") for c in args.cases.split(",")):
        recipe = fp8amp.Recipe(mode=fp8amp.ScalingMode.DELAYED if recipe_name == "delayed" else fp8amp.ScalingMode.CURRENT)
        kind, shape = case.split(":")
        tokens, d, f = (int(v) for v in shape.split("x"))
        x = (torch.randn(tokens, d, device=dev, generator=gen) * 2).to(torch.bfloat16).requires_grad_(True)
        out_d = f if kind.endswith("linear") else d
        dy = torch.randn(tokens, out_d, device=dev, generator=gen).to(torch.bfloat16)
        fused = fp8amp_block(kind, d, f, dev, recipe)
        ref = nn_block(kind, d, f).to(dev)
        row = {"recipe": recipe_name, "tokens": tokens, "d": d, "f": f}
        # a delayed recipe's INPUT and GRAD_OUTPUT metas are updated once a step (as the front's
        # Optimizer does), in both fp8amp modes
        metas = [mt for m in fused.modules() if isinstance(m, ft.Linear) and recipe_name == "delayed"
                 for mt in m.scaling_metas()]

        def step(run, module):
            def fn():
                module.zero_grad(set_to_none=True)
                x.grad = None
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = run(module, x)
                y.backward(dy)
                if module is fused and metas:
                    fp8amp.scaling.update_many(metas[0].context, metas)
            return fn

        kinds = {"fused": step(lambda m, v: m(v), fused), "composition": step(composition, fused),
                 "bf16_nn": step(lambda m, v: m(v), ref)}
        for r in range(3):  # alternating rounds: each mode's median, then the mean of the rounds
            for name, fn in kinds.items():
                gpu, host = bench(fn, args.warmup, args.reps)
                row.setdefault(name + "_ms_rounds", []).append(gpu)
                row.setdefault(name + "_host_ms_rounds", []).append(host)
        for name in kinds:
            row[name + "_ms"] = statistics.mean(row[name + "_ms_rounds"])
            row[name + "_host_ms"] = statistics.mean(row[name + "_host_ms_rounds"])
        lin = fused.linear if kind.endswith("linear") else fused.fc1
        row["gemm"] = str(lin.gemm_kind)
        row["fused_over_composition"] = row["fused_ms"] / row["composition_ms"]
        row["fused_over_bf16_nn"] = row["fused_ms"] / row["bf16_nn_ms"]
        res["cases"][recipe_name + ":" + case] = row
        print("%-8s %-28s fused %.3f ms  composition %.3f ms (x%.3f)  bf16 nn %.3f ms (x%.3f)  gemm %s  host ms %.2f/%.2f/%.2f" % (
            recipe_name, case, row["fused_ms"], row["composition_ms"], row["fused_over_composition"], row["bf16_nn_ms"],
            row["fused_over_bf16_nn"], row["gemm"], row["fused_host_ms"], row["composition_host_ms"],
            row["bf16_nn_host_ms"]), flush=True)
        del fused, ref, x, dy, metas, kinds
        torch.cuda.empty_cache()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "fused_blocks-%s-%s.json" % (props.name.replace(" ", "_"), res["date"]))
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
