#!/usr/bin/env bash
# Runs the C test suite on a GPU under compute-sanitizer's memcheck (with device leak checks),
# racecheck and synccheck, one test executable at a time, and prints one summary line per tool.
# A GPU-only job (CI has no GPU): run it on a GPU machine before a kernel change lands, and quote
# its summaries (docs/reliability.md). Usage: tests/run_gpu_sanitizers.sh [tool ...]
#   (default tools: memcheck racecheck synccheck)
# Env: LOGS (one log per tool and test, and summary.txt; default build-gpu/sanitizers), ONLY (a
# space-separated list of the executables to run, reference_cuda included; default: all),
# BUILD (an existing CUDA build dir with the tests;
# default: configure and build build-gpu), TIMEOUT (seconds per test and tool, default 300),
# SHARDS (see below), CMOCKA_PREFIX / WHEELS as in tests/gpu_env.sh.
# FP8AMP_TEST_SMALL=1 is set for every test: the few tests whose point is size (the optimizer's
# 9M-element bit-identity runs, the batched scaling update over thousands of metas) shrink to sizes
# that still cross the same boundaries, so that racecheck, which serializes shared-memory accesses,
# finishes in minutes (tests/capi/test_util.h test_small()).
set -uo pipefail
cd "$(dirname "$0")/.."
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck)
out=${LOGS:-build-gpu/sanitizers}
mkdir -p "$out"
. tests/gpu_env.sh
build=${BUILD:-}
if [ -z "$build" ]; then
  build=build-gpu
  cmake -S . -B "$build" -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_EXAMPLES=OFF "${prefix_args[@]}" \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -60; exit 1; }
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "compute-sanitizer not found"; exit 1; }
export FP8AMP_TEST_SMALL=1
timeout_s=${TIMEOUT:-300}
failed=0
summary="$out/summary.txt"
: >"$summary"
rm -f "$out"/*.res
jobs=${JOBS:-4}  # test executables under the sanitizer at once (each its own process and context)
run_one() {  # tool name command...: one run, one line "tool name rc errors skipped seconds" in a .res file
  local tool=$1 name=$2 log start rc errors skipped extra=()
  shift 2
  log="$out/$tool-$name.log"
  # CUDA API errors are not reported: the tests provoke some on purpose (an allocation larger than
  # the GPU, to check OUT_OF_MEMORY), and the library turns every API error into a status, which the
  # tests check. What the tools look for is in the kernels: out-of-bounds and misaligned accesses,
  # leaks of device memory at exit, shared-memory races, invalid barrier use.
  extra=(--report-api-errors no --target-processes all)
  [ "$tool" = memcheck ] && extra+=(--leak-check full)
  start=$(date +%s)
  timeout "$timeout_s" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 50 "$@" >"$log" 2>&1
  rc=$?
  # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"; a warning is not clean either.
  if [ "$tool" = racecheck ]; then
    errors=$(grep -Eo "RACECHECK SUMMARY: [0-9]+ hazard" "$log" | tail -1 | grep -Eo "[0-9]+")
  else
    errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ error" "$log" | tail -1 | grep -Eo "[0-9]+")
  fi
  # A test executable that makes no CUDA call at all (a CPU-only test) ends before the tool has
  # anything to instrument; the tool then reports an error of its own, not of the test: such a run
  # counts as clean when the test itself passed, and is listed as "no GPU work".
  if [ "$rc" != 0 ] && grep -q "Target application terminated before first instrumented API call" "$log" \
     && grep -q "^\[  PASSED  \]" "$log" && ! grep -q "^\[  FAILED  \]" "$log"; then
    rc=0 errors=nogpu
  fi
  # A GPU variant that skips (CMocka "[  SKIPPED ]", pytest "N skipped" of a CUDA test) is not a run.
  skipped=$(grep -c "^\[  SKIPPED \]" "$log")
  echo "$tool $name $rc ${errors:-?} $skipped $(($(date +%s) - start))" >"$out/$tool-$name.res"
}
lib=$(ls "$build"/libfp8amp.so.0)
# reference_cuda calls the library through the fp8amp package built against it (cached in
# $build/python-binding): build it here, once, rather than under a tool (pip and the compiler would
# run inside the sanitizer). A machine without the binding's build tools gets the script's SKIPPED.
python3 -c "import sys; sys.path.insert(0, 'bindings/python'); import binding_for; binding_for.import_fp8amp('$lib')" \
  || echo "the fp8amp binding could not be built here: reference_cuda will say why"
for tool in "${tools[@]}"; do
  # The suite: every CMocka test executable, and the ml_dtypes cross-check of the CUDA codecs.
  # (The Python binding's pytest suite calls the same entry points through CFFI and runs PyTorch's
  # own kernels besides; PYTHON=1 adds it under memcheck only, where it takes minutes.)
  items=()
  # test_fault_injection_host is not run here: it replaces malloc, which the tool's injected library
  # does not survive (the process dies before its first CUDA call), and its CUDA variants are opt-in.
  for test in "$build"/tests/capi/test_*; do
    [ -x "$test" ] && [ -f "$test" ] && [ "$(basename "$test")" != test_fault_injection_host ] && items+=("$(basename "$test")")
  done
  # ONLY="test_optimizer ...": just those executables (e.g. racecheck of test_optimizer alone, which
  # took more than 330 s on an H100 as one process). SHARDS=n splits each executable whose main uses
  # run_tests_sharded (tests/capi/test_util.h) into n processes run at once, JOBS at a time; an odd n
  # spreads the [cpu]/[cuda] pairs of DEVICE_TESTS over the shards:
  #   SHARDS=7 JOBS=7 ONLY=test_optimizer tests/run_gpu_sanitizers.sh racecheck
  items+=(reference_cuda)
  if [ -n "${ONLY:-}" ]; then
    kept=()
    for name in "${items[@]}"; do
      case " $ONLY " in *" $name "*) kept+=("$name") ;; esac
    done
    items=("${kept[@]}")
  fi
  for name in "${items[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    if [ "$name" = reference_cuda ]; then
      run_one "$tool" "$name" python3 tests/reference/codecs_vs_ml_dtypes.py "$lib" cuda &
    elif [ "${SHARDS:-1}" -gt 1 ] && grep -q run_tests_sharded "tests/capi/$name.c" 2>/dev/null; then
      # An executable whose main honours FP8AMP_TEST_SHARD runs as SHARDS processes, one shard each.
      for ((i = 0; i < SHARDS; i++)); do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
        FP8AMP_TEST_SHARD="$i/$SHARDS" run_one "$tool" "$name.shard$i" "$build/tests/capi/$name" &
      done
    else
      run_one "$tool" "$name" "$build/tests/capi/$name" &
    fi
  done
  if [ "$tool" = memcheck ] && [ "${PYTHON:-0}" = 1 ]; then
    run_one "$tool" python_bindings bash bindings/python/run_tests.sh "$build" "$PWD" &
  fi
done
wait
for tool in "${tools[@]}"; do
  n=0 clean=0 bad=() nogpu=()
  for res in "$out/$tool"-*.res; do
    read -r _ name rc errors skipped secs <"$res"
    printf "%-10s %-28s rc=%-3s errors=%-3s skipped=%-2s %5s s\n" "$tool" "$name" "$rc" "$errors" "$skipped" "$secs" | tee -a "$summary"
    n=$((n + 1))
    if [ "$rc" = 0 ] && [ "$errors" = nogpu ]; then nogpu+=("$name")
    elif [ "$rc" = 0 ] && [ "$errors" = 0 ] && [ "$skipped" = 0 ]; then clean=$((clean + 1)); else bad+=("$name"); fi
  done
  line="compute-sanitizer $tool: $clean of $((n - ${#nogpu[@]})) test executables with GPU work clean (0 errors, every test passed, none skipped)"
  [ ${#nogpu[@]} -gt 0 ] && line="$line; passed with no GPU work: ${nogpu[*]}"
  [ ${#bad[@]} -gt 0 ] && line="$line; not clean: ${bad[*]}" && failed=1
  echo "$line" | tee -a "$summary"
done
exit $failed
