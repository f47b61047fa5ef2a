#!/usr/bin/env bash
# run_ranks.sh N <exe> [args...]: starts N processes of <exe> on this machine, without MPI, for the
# tests built against the file channel (tests/mpi/rank_channel.h): rank r gets FP8AMP_TEST_RANK=r,
# FP8AMP_TEST_NRANKS=N and FP8AMP_TEST_CHANNEL_DIR, a fresh directory removed at the end. This is how
# the GPU communicator test (test_comm_ranks, ctest comm.cuda.ranks.np2) runs on the GPU machines,
# which have no MPI.
#
# Exit status: 0 when every rank exited 0; 77 (SKIPPED) when every rank exited 77; otherwise
# non-zero: as soon as one rank fails (or the ranks disagree about skipping) the others are stopped
# (TERM, then KILL after 5 s), so that nothing is left waiting on a rank that is gone; 124 when
# FP8AMP_RUN_RANKS_TIMEOUT seconds (default 600) pass before every rank has exited.
set -u
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]] || ! [[ ${FP8AMP_RUN_RANKS_TIMEOUT:-600} =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N <exe> [args...]   (N >= 1 processes; FP8AMP_RUN_RANKS_TIMEOUT: whole seconds, default 600)" >&2
  exit 2
fi
n=$1
shift
limit=${FP8AMP_RUN_RANKS_TIMEOUT:-600}
dir=$(mktemp -d "${TMPDIR:-/tmp}/fp8amp_ranks.XXXXXX") || exit 2
pids=()
status=()

stop_all() { # TERM the ranks still running, KILL them 5 s later if they still are
  local p alive
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
on_signal() {
  echo "run_ranks: interrupted: stopping the ranks" >&2
  stop_all
  rm -rf "$dir"
  exit 130
}
trap on_signal INT TERM HUP

for ((r = 0; r < n; ++r)); do
  FP8AMP_TEST_RANK=$r FP8AMP_TEST_NRANKS=$n FP8AMP_TEST_CHANNEL_DIR=$dir "$@" &
  pids[r]=$!
done

# Poll rather than `wait -n`, so that the rank that ended is known (and any bash 4 works).
done_count=0
failed=""
# Microseconds (bash 5's EPOCHREALTIME; whole seconds from SECONDS on older bash).
now_us() { if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/[.,]/}"; else echo $((SECONDS * 1000000)); fi; }
start=$(now_us)
while [ $done_count -lt "$n" ]; do
  for ((r = 0; r < n; ++r)); do
    [ -n "${status[r]:-}" ] && continue
    if ! kill -0 "${pids[r]}" 2>/dev/null; then
      wait "${pids[r]}"
      status[r]=$?
      done_count=$((done_count + 1))
      if [ "${status[r]}" != 0 ] && [ "${status[r]}" != 77 ] && [ -z "$failed" ]; then
        failed="rank $r exited with status ${status[r]}"
      fi
    fi
  done
  if [ -z "$failed" ] && [ $done_count -lt "$n" ]; then
    # Skipping is all or nothing: a rank that ran on after another skipped would wait for it.
    skipped=0 passed=0
    for ((r = 0; r < n; ++r)); do
      case "${status[r]:-}" in 77) skipped=1 ;; 0) passed=1 ;; esac
    done
    [ $skipped = 1 ] && [ $passed = 1 ] && failed="some ranks skipped (77) and some passed"
  fi
  if [ -n "$failed" ] && [ $done_count -lt "$n" ]; then
    echo "run_ranks: $failed: stopping the other ranks" >&2
    stop_all
    for ((r = 0; r < n; ++r)); do
      if [ -z "${status[r]:-}" ]; then wait "${pids[r]}"; status[r]=$?; fi
    done
    break
  fi
  if [ $(($(now_us) - start)) -ge $((limit * 1000000)) ] && [ $done_count -lt "$n" ]; then
    echo "run_ranks: timed out after $limit s (FP8AMP_RUN_RANKS_TIMEOUT): stopping the ranks" >&2
    stop_all
    rm -rf "$dir"
    exit 124
  fi
  [ $done_count -lt "$n" ] && sleep 0.05
done
rm -rf "$dir"

zeros=0 skips=0
for ((r = 0; r < n; ++r)); do
  case "${status[r]}" in 0) zeros=$((zeros + 1)) ;; 77) skips=$((skips + 1)) ;; esac
done
[ $zeros = "$n" ] && exit 0
if [ $skips = "$n" ]; then
  echo "run_ranks: every rank skipped (77)"
  exit 77
fi
echo "run_ranks: ${failed:-a rank failed}; exit statuses by rank: ${status[*]}" >&2
exit 1
