#!/usr/bin/env bash
# fp8amp as a subproject: configures tests/subproject (a project that adds fp8amp with
# add_subdirectory()), builds it and runs its program, then checks what the parent must not inherit:
#   - no CMocka lookup (no CMOCKA_* cache entry: fp8amp's tests default to PROJECT_IS_TOP_LEVEL), so
#     a machine without CMocka configures it;
#   - no tests registered (ctest -N lists none) and no examples built;
#   - the parent's CMAKE_BUILD_TYPE left as the parent set it (empty here), not forced to Release.
# CPU only by default (FP8AMP_CUDA=AUTO|ON in the environment builds the CUDA kernels too).
# Usage: tests/subproject/check.sh [repo root] [build dir]   (about 1 minute on 2 cores)
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
build=${2:-$root/build-subproject}
rm -rf "$build"
mkdir -p "$build"
# (cmake reads the generator from CMAKE_GENERATOR in the environment, if set)
cmake -S "$root/tests/subproject" -B "$build" -DFP8AMP_SOURCE_DIR="$root" -DFP8AMP_CUDA="${FP8AMP_CUDA:-OFF}" \
  >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  echo "subproject: configure failed" >&2
  exit 1
}
cmake --build "$build" -j "$(nproc)"
"$build/app"
fail=0
if grep -q '^CMOCKA_' "$build/CMakeCache.txt"; then
  echo "subproject: fp8amp looked for CMocka: $(grep '^CMOCKA_' "$build/CMakeCache.txt" | tr '\n' ' ')" >&2
  fail=1
fi
tests=$(cd "$build" && ctest -N | sed -n 's/^Total Tests: //p')
if [ "${tests:-0}" != 0 ]; then
  echo "subproject: fp8amp registered $tests test(s) in its parent" >&2
  fail=1
fi
if [ -e "$build/fp8amp/examples" ]; then
  echo "subproject: fp8amp's examples were configured in its parent" >&2
  fail=1
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
if [ -n "$build_type" ]; then
  echo "subproject: the parent's CMAKE_BUILD_TYPE was set to '$build_type'" >&2
  fail=1
fi
[ "$fail" = 0 ] && echo "subproject: ok (no CMocka, no tests, no examples, the parent's build type kept)"
exit "$fail"
