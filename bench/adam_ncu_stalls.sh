#!/usr/bin/env bash
# Nsight Compute's warp-stall breakdown, DRAM bytes and instruction count of one O2 step (BF16
# params, E4M3 grads, 64M parameters) for each library given: where the fast kernel's warps wait.
# Clocks as in the timed runs (--clock-control none). Usage: OUT=dir bash bench/adam_ncu_stalls.sh lib.so...
# SOURCE=1: also the per-instruction stall samples (SourceCounters) from the saved report, as CSV of
# the SASS (sass-TAG.csv): which loads the long-scoreboard stalls wait on (not yet run).
set -uo pipefail
out=${OUT:-build-adam-run}
mkdir -p "$out"
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null) || { echo "no ncu"; exit 0; }
for lib in "$@"; do
  tag=$(basename "$(dirname "$lib")")
  src=()
  if [ "${SOURCE:-0}" = 1 ]; then src=(--section SourceCounters --import-source no -o "/tmp/ncu-$tag" -f); fi
  timeout 120 "$ncu_bin" --clock-control none --kernel-name regex:adam_fast --launch-count 1 "${src[@]}" \
    --metrics 'regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active' \
    python3 bench/bench_adam.py --lib "$lib" --params 67108864 --only fp8amp.O2.bf16_p.e4m3_g \
    --out "$out/ncu-$tag.json" >"$out/ncu-$tag.txt" 2>&1
  if [ "${SOURCE:-0}" = 1 ]; then  # with -o the results went to the report: print them from it
    "$ncu_bin" --import "/tmp/ncu-$tag.ncu-rep" >"$out/ncu-$tag.txt" 2>&1
    "$ncu_bin" --import "/tmp/ncu-$tag.ncu-rep" --page source --print-source sass --csv >"$out/sass-$tag.csv" 2>&1
    echo "sass-$tag.csv: $(wc -l <"$out/sass-$tag.csv") lines"
  fi
  echo "== ncu $tag"
  grep -E "stalled|dram__bytes|inst_executed|duration|warps_active|registers|issue_active" "$out/ncu-$tag.txt" |
    awk '{v=$NF; if ($1 ~ /stalled/ && v+0 < 2) next; sub(/smsp__warp_issue_stalled_/,"",$1); print "  " $1, $(NF-1), v}'
done
