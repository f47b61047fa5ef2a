#!/usr/bin/env bash
# Builds bench/bench_handles.c against one or more CPU builds of libfp8amp and runs them in turn,
# `rounds` times round-robin (so a change in the machine's load hits every build alike), printing one
# JSON document: per build and round the benchmark's output, plus the load average before and after.
# Compare builds of two commits, e.g. main's in /tmp/base/build and this tree's in build-nocuda:
#   bench/bench_handles.sh before=/tmp/base/build after=build-nocuda [rounds=3] [window_us] [reps] [threads]
# RT=1 runs the benchmark under SCHED_FIFO (chrt -f 10, needs root; the kernel's RT throttling still
# leaves others 5%): on a machine loaded by other work, the benchmark's threads then really do run at
# once on separate cores, for the second or so each run takes, instead of as the scheduler allows.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
builds=()
while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do builds+=("$1"); shift; done
rounds=${1:-3}; shift || true
[ ${#builds[@]} -gt 0 ] || { echo "usage: $0 label=build_dir... [rounds] [window_us] [reps] [threads]" >&2; exit 2; }
for b in "${builds[@]}"; do
  dir="$(cd "${b#*=}" && pwd)"
  cc -std=c99 -O2 -Wall -Wextra -pedantic -I "$here/../capi/include" "$here/bench_handles.c" -o "$dir/bench_handles" \
    -L "$dir" -lfp8amp -Wl,-rpath,"$dir" -pthread
done
echo "{\"rt\": \"${RT:-}\", \"commits\": \"${COMMITS:-}\", \"date\": \"$(date -u +%FT%TZ)\", \"nproc\": $(nproc), \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\","
echo " \"loadavg_before\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"runs\": ["
sep=""
for ((round = 0; round < rounds; ++round)); do
  for b in "${builds[@]}"; do
    dir="$(cd "${b#*=}" && pwd)"
    printf '%s{"build": "%s", "round": %d, "loadavg": "%s", "out": ' "$sep" "${b%%=*}" "$round" "$(cut -d' ' -f1-3 /proc/loadavg)"
    ${RT:+chrt -f 10} "$dir/bench_handles" "$@"
    printf '}\n'
    sep=","
  done
done
echo "], \"loadavg_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
