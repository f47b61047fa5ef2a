"""Device copy bandwidth by size: torch copy_ of 25 .. 400 MB moved (read + written), timed as every
bench here times a case (fp8amp_bench.bench: CUDA events around one call, a sleep kernel ahead of it,
inputs rotated past L2, median of 40). It tells how much of a kernel's "fraction of copy" at a given
byte count is the size itself: bench_norm divides by one copy of its largest shape's bytes.

Usage: python3 bench/copy_sizes.py [--out FILE]  (default bench/results/copy_sizes-<device>-<date>.json)
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8amp_bench import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sizes", default="25,50,75,100,150,200,400", help="MB moved (read + written), comma-separated")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "date": datetime.date.today().isoformat(), "torch": torch.__version__, "cases": {}}
    for mb in (int(v) for v in args.sizes.split(",")):
        n = mb * 2**20 // 2  # bytes read = bytes written = n
        rot = max(2, -(-160 * 2**20 // n))
        src = [torch.empty(n, dtype=torch.uint8, device="cuda").random_() for _ in range(rot)]
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        ms = bench(lambda i: dst.copy_(src[i]), rotations=rot, warmup=5, reps=40)
        res["cases"][f"copy.{mb}MB"] = {"us": ms * 1e3, "GB_per_s": 2 * n / (ms * 1e-3) / 1e9}
        print(f"copy {mb} MB moved: {ms * 1e3:.1f} us, {2 * n / (ms * 1e-3) / 1e9:.0f} GB/s", flush=True)
        del src, dst
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"copy_sizes-{props.name.replace(' ', '_')}-{res['date']}.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
