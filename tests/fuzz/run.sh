#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) in build-fuzz and runs each for a while over a scratch
# copy of its committed seed corpus; exits non-zero when any target finds a crash, a sanitizer
# report, a leak or a failed oracle check (the reproducer is left in build-fuzz/fuzz-artifacts/).
#   tests/fuzz/run.sh [seconds-per-target] [target...]
# Default: 60 s for each of fuzz_capi, fuzz_checkpoint, fuzz_dlpack. Longer runs, reproducing a
# crash, adding a seed: docs/fuzzing.md. For a local run past a known finding (never in CI), the
# environment may set FP8AMP_FUZZ_EXTRA_FLAGS (compiler flags, e.g. -fno-sanitize=enum) and
# FP8AMP_FUZZ_SKIP (generators/checks the targets leave out).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_capi fuzz_checkpoint fuzz_dlpack)

. tests/install_deps.sh clang

jobs=$(nproc)
[ "$jobs" -le 2 ] || jobs=$((jobs - 1))
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFP8AMP_CUDA=OFF \
  -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=OFF -DFP8AMP_BUILD_FUZZERS=ON \
  "-DFP8AMP_FUZZ_EXTRA_FLAGS=${FP8AMP_FUZZ_EXTRA_FLAGS:-}" >/dev/null
cmake --build build-fuzz -j "$jobs" --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  work=build-fuzz/fuzz-work/$t
  artifacts=build-fuzz/fuzz-artifacts/$t
  rm -rf "$work"
  mkdir -p "$work" "$artifacts"
  # A scratch copy: the committed corpus changes only by hand (docs/fuzzing.md).
  cp -r tests/fuzz/corpus/$t/. "$work"/ 2>/dev/null || true
  dict=()
  [ -f tests/fuzz/$t.dict ] && dict=(-dict=tests/fuzz/$t.dict)
  extra=()
  [ "$t" = fuzz_checkpoint ] && extra=(-max_len=16384)  # a whole checkpoint
  [ "$t" = fuzz_dlpack ] && extra=(-max_len=128)  # the decoder reads fewer bytes
  echo "== $t: ${seconds} s"
  if ! build-fuzz/tests/fuzz/$t -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "${dict[@]}" "${extra[@]}" "$work" >"build-fuzz/fuzz-$t.log" 2>&1; then
    echo "!! $t FAILED: log build-fuzz/fuzz-$t.log, reproducer(s):"
    ls "$artifacts"
    grep -m1 -E 'fuzz check failed|ERROR: (Address|Leak)Sanitizer|runtime error|deadly signal|timeout' -A3 "build-fuzz/fuzz-$t.log" || true
    status=1
  else
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "build-fuzz/fuzz-$t.log" | tr '\n' ' '
    echo
  fi
done
exit $status
