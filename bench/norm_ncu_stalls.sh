#!/usr/bin/env bash
# Nsight Compute's view of the fused norm (or activation) kernels (issue 19's per-kernel target): for
# each kernel launch of bench/bench_norm.py (--only norm|activation --fp8amp-only, one warm-up call and
# one call a case), its
# time, the share of cycles issuing, the share of warp slots active, DRAM throughput, registers,
# instructions, DRAM bytes and the largest warp-stall reasons. Clocks as in the timed runs
# (--clock-control none); ncu flushes the caches before each kernel, so its durations run a little
# under bench_norm's (which rotates inputs past the L2 instead).
# Usage: OUT=dir bash bench/norm_ncu_stalls.sh build/libfp8amp.so [SHAPES="16384x1024 2048x12288"]
#        [ONLY=activation: the activation cases, KERNELS default stream_kernel|tile_kernel]
#        [KERNELS=regex, default norm_forward|norm_backward]
set -uo pipefail
lib=${1:?usage: norm_ncu_stalls.sh path/to/libfp8amp.so}
out=${OUT:-build-norm-ncu}
only=${ONLY:-norm}
if [ "$only" = activation ]; then kernels=${KERNELS:-stream_kernel|tile_kernel}; else kernels=${KERNELS:-norm_forward|norm_backward}; fi
mkdir -p "$out"
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null) || { echo "no ncu"; exit 0; }
here=$(cd "$(dirname "$0")" && pwd)
metrics='regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed'
for s in ${SHAPES:-16384x1024 8192x4096 2048x12288}; do
  timeout 300 "$ncu_bin" --clock-control none --kernel-name "regex:$kernels" \
    --metrics "$metrics" python3 "$here/bench_norm.py" --lib "$lib" --only "$only" --fp8amp-only --shapes "$s" \
    --warmup 1 --reps 1 --out "$out/ncu-$s.json" > "$out/ncu-$s.txt" 2>&1
  echo "== $s (ncu rc=$?): launch, kernel, time, issue active, warps active, DRAM, registers, instructions, bytes read/written; stalls"
  python3 - "$out/ncu-$s.txt" <<'EOF'
import re
import sys

text = open(sys.argv[1]).read()
# one block per launch: a header line "  <kernel>(args) (grid)x(block), Context ..., Stream ..." and its metrics
for k, block in enumerate(re.split(r"\n  (?=\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)[1:], 1):
    head = block.split("\n")[0]
    name = re.search(r"(\w+_kernel)(<[^>]*>)?", head)
    vals = {}
    for line in block.split("\n")[1:]:
        f = line.split()
        if len(f) >= 2 and "__" in f[0]:  # "metric [unit] value"
            vals[f[0]] = (f[-1].replace(",", ""), f[1] if len(f) == 3 else "")
    get = lambda m: " ".join(vals.get(m, ("?", ""))).strip().replace(" %", "").replace(" inst", "").replace(
        " register/thread", " registers")
    print(f"{k:3d} {name.group(0) if name else head[:60]}")
    print("      %s, issue %s%%, warps %s%%, DRAM %s%%, %s, %s warp instructions, %s / %s read / written"
          % tuple(get(m) for m in ("gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                                    "sm__warps_active.avg.pct_of_peak_sustained_active",
                                    "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread",
                                    "smsp__inst_executed.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")))
    stalls = sorted(((float(v), m.replace("smsp__warp_issue_stalled_", "").replace("_per_warp_active.pct", ""))
                     for m, (v, _) in vals.items() if "stalled" in m and v.replace(".", "", 1).isdigit()), reverse=True)
    print("      stalls (% of warp cycles): " + ", ".join("%s %.0f" % (n, v) for v, n in stalls[:6]))
EOF
done
