#!/usr/bin/env bash
# The launcher tests/mpi/run_ranks.sh (ctest channel.launcher): its exit status in each case, that a
# failed rank stops the others at once rather than leaving them waiting, its overall timeout, the
# environment each rank gets, and that the channel directory is fresh and removed.
# test_run_ranks.sh [test_rank_channel]: with the file channel's test executable, also that a
# directory left from an earlier run is refused at once rather than read.
set -u
here=$(cd "$(dirname "$0")" && pwd)
run="$here/run_ranks.sh"
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

expect() { # expect <what> <status wanted> <max seconds> <run_ranks args...>
  local what=$1 want=$2 max=$3 t0 got took
  shift 3
  t0=$(date +%s.%N)
  "$run" "$@" >"$work/out" 2>&1
  got=$?
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  if [ "$got" != "$want" ] || awk -v t="$took" -v m="$max" 'BEGIN { exit !(t > m) }'; then
    echo "FAILED: $what: status $got (wanted $want) after $took s (at most $max); output:" >&2
    cat "$work/out" >&2
    failures=$((failures + 1))
  else
    echo "ok: $what: status $got after $took s"
  fi
}

expect "every rank passes" 0 10 3 bash -c 'exit 0'
expect "every rank skips" 77 10 2 bash -c 'exit 77'
expect "one rank fails" 1 10 3 bash -c '[ "$FP8AMP_TEST_RANK" = 1 ] && exit 3; exit 0'
expect "a rank skips, another passes" 1 10 2 bash -c 'exit $((FP8AMP_TEST_RANK == 0 ? 77 : 0))'
# The others would wait 100 s for the failed rank: they are stopped at once.
expect "one rank fails, the others hang" 1 15 3 bash -c '[ "$FP8AMP_TEST_RANK" = 2 ] && exit 5; exec sleep 100'
# Stopped even when they ignore TERM (KILL after 5 s; the failing rank waits until the other has set
# its trap).
expect "one rank fails, the others ignore TERM" 1 20 2 bash -c \
  '[ "$FP8AMP_TEST_RANK" = 0 ] && sleep 1 && exit 5; trap "" TERM; for i in $(seq 1000); do sleep 0.1; done'
FP8AMP_RUN_RANKS_TIMEOUT=2 expect "every rank hangs: the overall timeout" 124 15 2 bash -c 'exec sleep 100'
expect "a rank killed by a signal" 1 10 2 bash -c '[ "$FP8AMP_TEST_RANK" = 1 ] && kill -KILL $$; exit 0'
expect "usage" 2 5 0 true

# The environment: ranks 0..N-1 of N, one directory shared by all, empty at the start, removed after.
"$run" 4 bash -c 'echo "$FP8AMP_TEST_RANK $FP8AMP_TEST_NRANKS $FP8AMP_TEST_CHANNEL_DIR $(ls -A "$FP8AMP_TEST_CHANNEL_DIR" | wc -l)"' \
  >"$work/env" 2>&1
sort "$work/env" >"$work/env.sorted"
dirs=$(awk '{print $3}' "$work/env.sorted" | sort -u)
if [ "$(awk '{print $1, $2}' "$work/env.sorted" | tr '\n' ' ')" != "0 4 1 4 2 4 3 4 " ] || [ "$(echo "$dirs" | wc -l)" != 1 ] ||
   [ -e "$dirs" ] || [ "$(awk '{print $4}' "$work/env.sorted" | sort -u)" != 0 ]; then
  echo "FAILED: the ranks' environment, or the directory was not removed:" >&2
  cat "$work/env" >&2
  failures=$((failures + 1))
else
  echo "ok: ranks 0..3 of 4, one fresh directory, removed after"
fi

if [ $# -ge 1 ]; then
  # Three ranks run in a directory of our own; the files of its last collective stay there (see
  # rank_channel_finalize). A second run in the same directory must refuse it on its first call.
  stale="$work/stale"
  mkdir "$stale"
  for r in 0 1 2; do
    FP8AMP_TEST_RANK=$r FP8AMP_TEST_NRANKS=3 FP8AMP_TEST_CHANNEL_DIR=$stale "$1" 5 >/dev/null 2>&1 &
  done
  wait
  FP8AMP_TEST_RANK=1 FP8AMP_TEST_NRANKS=3 FP8AMP_TEST_CHANNEL_DIR=$stale FP8AMP_TEST_CHANNEL_TIMEOUT=60 \
    timeout 30 "$1" 5 >"$work/out" 2>&1
  got=$?
  if [ $got != 1 ] || ! grep -q "left from an earlier run" "$work/out" || [ "$(ls "$stale" | wc -l)" -gt 3 ]; then
    echo "FAILED: a reused channel directory: status $got, $(ls "$stale" | wc -l) files left; output:" >&2
    cat "$work/out" >&2
    failures=$((failures + 1))
  else
    echo "ok: a reused channel directory is refused: $(cat "$work/out")"
  fi
fi

[ $failures = 0 ] && echo "test_run_ranks: all passed" || echo "test_run_ranks: $failures failed" >&2
[ $failures = 0 ]
