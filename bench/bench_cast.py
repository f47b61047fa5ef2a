"""Casting kernels at memory speed: fp8amp vs PyTorch, in the same run, on one GPU.

Measures, with CUDA events after warm-up (median of many runs; inputs rotated among buffers larger
than L2):
  - the device copy bandwidth (torch copy_, bytes read + written): the hardware ceiling;
  - fp8amp_quantize BF16 -> E4M3, delayed scaling (3 B/elem), with statistics off and on;
  - fp8amp_quantize with current scaling (amax pass + cast pass: 5 B/elem);
  - fp8amp_quantize_transpose BF16 -> E4M3 + transposed E4M3 (4 B/elem);
  - fp8amp_dequantize E4M3 -> BF16 (3 B/elem);
  - fp8amp_scaling_update_many over 1000 metas (history 1024): time per call;
  - PyTorch baselines: unfused amax + scale + cast (delayed and current flavours), the same under
    torch.compile, and a transpose + cast.
Writes bench/results/cast-<device>-<date>.json (or --out) and prints a table.

Usage: python3 bench/bench_cast.py --lib build/libfp8amp.so [--elements 67108864] [--out FILE]
"""
import argparse
import datetime
import json
import os
import sys

import torch

from fp8amp_bench import C, Lib
from fp8amp_bench import bench as _bench


def bench(fn, rotations=1):
    """Median ms of fn(i) over 40 runs after 5 warm-ups; i rotates the inputs (fp8amp_bench.bench)."""
    return _bench(fn, rotations=rotations, warmup=5, reps=40)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--elements", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--out")
    ap.add_argument("--commit", default=os.environ.get("FP8AMP_COMMIT", "unknown"))
    ap.add_argument("--fp8amp-only", action="store_true", help="skip the PyTorch baselines (for tuning runs)")
    args = ap.parse_args()
    n = args.elements
    lib = Lib(args.lib)
    stream = torch.cuda.current_stream()
    ctx = lib.context(stream)
    props = torch.cuda.get_device_properties(0)
    rot = 3  # 3 x 128 MB of BF16 inputs: far past the 50-60 MB L2
    results = {"device": props.name, "date": datetime.date.today().isoformat(), "commit": args.commit,
               "torch": torch.__version__, "elements": n, "cases": {}}

    def record(name, ms, bytes_moved=None, note=""):
        entry = {"ms": ms, "us": ms * 1e3}
        if bytes_moved is not None:
            entry["GB_per_s"] = bytes_moved / (ms * 1e-3) / 1e9
        if note:
            entry["note"] = note
        results["cases"][name] = entry

    # ---- the ceiling: device copy
    big = [torch.empty(n * 2, dtype=torch.uint8, device="cuda").random_() for _ in range(rot)]
    copy_dst = torch.empty_like(big[0])
    record("copy", bench(lambda i: copy_dst.copy_(big[i]), rot), 2 * 2 * n, "torch copy_, read + write")
    copy_bw = results["cases"]["copy"]["GB_per_s"]
    # The same traffic mixes as dequantize (read 1 B, write 2 B) and quantize (read 2, write 1), as
    # PyTorch's own conversion kernels move them: what this GPU gives a plain elementwise kernel.
    u8 = [b[:n] for b in big]
    i16 = torch.empty(n, dtype=torch.int16, device="cuda")
    record("copy.read1_write2", bench(lambda i: i16.copy_(u8[i]), rot), 3 * n, "torch uint8 -> int16 conversion")
    record("write_only", bench(lambda i: i16.fill_(i + 1), rot), 2 * n, "torch fill_ of int16")
    i16s = [b.view(torch.int16)[:n] for b in big]
    u8_out = torch.empty(n, dtype=torch.uint8, device="cuda")
    record("copy.read2_write1", bench(lambda i: u8_out.copy_(i16s[i]), rot), 3 * n, "torch int16 -> uint8 conversion")

    # ---- inputs: fresh random BF16, never zeros
    xs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(rot)]
    q = torch.empty(n, device="cuda", dtype=torch.uint8)
    meta = lib.scaling(ctx)
    hx = [lib.wrap(ctx, x, C.BF16) for x in xs]
    hq = lib.wrap(ctx, q, C.E4M3)
    lib("fp8amp_tensor_set_scaling", hq, meta)
    lib("fp8amp_scaling_set_scale", meta, 448.0 / 16.0)

    record("fp8amp.quantize.delayed", bench(lambda i: lib("fp8amp_quantize", ctx, hx[i], hq), rot), 3 * n)
    lib("fp8amp_scaling_enable_stats", meta, 1)
    record("fp8amp.quantize.delayed.stats_on", bench(lambda i: lib("fp8amp_quantize", ctx, hx[i], hq), rot), 3 * n)
    lib("fp8amp_scaling_enable_stats", meta, 0)

    meta_cur = lib.scaling(ctx, mode=1)
    hq_cur = lib.wrap(ctx, q, C.E4M3)
    lib("fp8amp_tensor_set_scaling", hq_cur, meta_cur)
    record("fp8amp.quantize.current", bench(lambda i: lib("fp8amp_quantize", ctx, hx[i], hq_cur), rot), 5 * n)

    side = int(n ** 0.5)
    x2 = [x[: side * side].view(side, side) for x in xs]
    hx2 = [lib.wrap(ctx, x, C.BF16) for x in x2]
    q2 = torch.empty(side, side, device="cuda", dtype=torch.uint8)
    q2t = torch.empty(side, side, device="cuda", dtype=torch.uint8)
    hq2, hq2t = lib.wrap(ctx, q2, C.E4M3), lib.wrap(ctx, q2t, C.E4M3)
    for h in (hq2, hq2t):
        lib("fp8amp_tensor_set_scaling", h, meta)
    record("fp8amp.quantize_transpose", bench(lambda i: lib("fp8amp_quantize_transpose", ctx, hx2[i], hq2, hq2t), rot),
           4 * side * side, f"{side}x{side}")

    qs = [torch.randint(0, 256, (n,), device="cuda", dtype=torch.uint8) & 0x7E | 0x01 for _ in range(rot)]
    hqs = [lib.wrap(ctx, t, C.E4M3) for t in qs]
    for h in hqs:
        lib("fp8amp_tensor_set_scaling", h, meta)
    out = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    hout = lib.wrap(ctx, out, C.BF16)
    record("fp8amp.dequantize", bench(lambda i: lib("fp8amp_dequantize", ctx, hqs[i], hout), rot), 3 * n)

    metas = lib.new("fp8amp_scaling[]", [lib.scaling(ctx) for _ in range(1000)])
    record("fp8amp.scaling_update_many.1000", bench(lambda i: lib("fp8amp_scaling_update_many", ctx, 1000, metas)),
           None, "GPU time of one call (one launch), history 1024")

    # ---- PyTorch baselines (skipped by --fp8amp-only, for tuning runs)
    if not args.fp8amp_only:
        fp8 = torch.float8_e4m3fn

        def torch_delayed(x, scale):
            amax = x.abs().max()
            y = (x.float() * scale).clamp(-448.0, 448.0).to(fp8)
            return y, amax

        def torch_current(x):
            amax = x.abs().max().float()
            scale = 448.0 / amax
            return (x.float() * scale).clamp(-448.0, 448.0).to(fp8), scale

        def torch_transpose(x, scale):
            y = (x.float() * scale).clamp(-448.0, 448.0).to(fp8)
            return y, y.t().contiguous(), x.abs().max()

        scale = torch.tensor(448.0 / 16.0, device="cuda")
        record("torch.quantize.delayed", bench(lambda i: torch_delayed(xs[i], scale), rot), 3 * n, "unfused eager")
        record("torch.quantize.current", bench(lambda i: torch_current(xs[i]), rot), 5 * n, "unfused eager")
        record("torch.quantize_transpose", bench(lambda i: torch_transpose(x2[i], scale), rot), 4 * side * side, "eager")
        record("torch.dequantize", bench(lambda i: qs[i].view(fp8).to(torch.bfloat16) * scale, rot), 3 * n, "eager")
        try:
            cd, cc, ct = torch.compile(torch_delayed), torch.compile(torch_current), torch.compile(torch_transpose)
            record("torch.compile.quantize.delayed", bench(lambda i: cd(xs[i], scale), rot), 3 * n)
            record("torch.compile.quantize.current", bench(lambda i: cc(xs[i]), rot), 5 * n)
            record("torch.compile.quantize_transpose", bench(lambda i: ct(x2[i], scale), rot), 4 * side * side)
        except Exception as e:  # keep the fp8amp numbers if the compiler is unavailable
            results["torch_compile_error"] = str(e)[:300]

    for entry in results["cases"].values():
        if "GB_per_s" in entry:
            entry["fraction_of_copy"] = entry["GB_per_s"] / copy_bw
    results["copy_GB_per_s"] = copy_bw

    out_path = args.out or os.path.join(os.path.dirname(__file__), "results",
                                        f"cast-{props.name.replace(' ', '_')}-{results['date']}.json")
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"{'case':40s} {'us':>10s} {'GB/s':>9s} {'of copy':>8s}")
    for name, e in results["cases"].items():
        gbs = f"{e['GB_per_s']:9.0f}" if "GB_per_s" in e else " " * 9
        frac = f"{100 * e['fraction_of_copy']:7.1f}%" if "fraction_of_copy" in e else ""
        print(f"{name:40s} {e['us']:10.1f} {gbs} {frac}")
    print("wrote", out_path)


if __name__ == "__main__":
    sys.exit(main())
