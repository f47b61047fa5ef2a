#!/usr/bin/env bash
# Builds the CPU-only library and the whole C test suite with clang under
#   (a) AddressSanitizer + UndefinedBehaviorSanitizer, -fsanitize=enum included (build-asan), and
#   (b) ThreadSanitizer (build-tsan),
# through CMake's FP8AMP_SANITIZE option, and runs the ctest suite in each. Every sanitizer report
# aborts the test that made it (-fno-sanitize-recover=all, halt_on_error), so the script exits
# non-zero on any report, as on any failing test. Installs what it needs when it is missing (clang,
# its sanitizer runtimes, CMocka, CMake, Ninja, numpy and ml_dtypes for the reference check, the
# Python binding's build tools), as root or through sudo. About 5 minutes on 2 cores from scratch
# (measured 4m38s, most of it compiling; the two ctest runs take about 1 minute each).
# Usage: tests/sanitizers.sh [asan|tsan]... (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(asan tsan)

. tests/install_deps.sh clang python

# Tests that ask for impossible sizes expect OUT_OF_MEMORY, so the allocators return NULL rather
# than abort. A TSan report must fail the test (halt_on_error) like an ASan/UBSan one does.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:allocator_may_return_null=1:second_deadlock_stack=1"

jobs=$(nproc)
for config in "${configs[@]}"; do
  case "$config" in
    asan)
      sanitize="address,undefined,enum"
      # Everything runs; the Python and consumer processes get the runtime preloaded (tests/CMakeLists.txt).
      exclude="^$" ;;
    tsan)
      sanitize="thread"
      # Processes not built with TSan cannot load a TSan library: clang 14's shared TSan runtime
      # crashes at startup, so there is nothing to preload into Python (python.bindings and the
      # ml_dtypes reference) or into the plain-cc consumers of the install and old-binary checks
      # (abidiff reads the library's debug info and runs no code of it). They run under ASan+UBSan
      # above; every CMocka test, test_threads.c included, runs here.
      exclude="^(python\.bindings|reference\..*|install\.consumer|abi\.old_binaries)$" ;;
    *) echo "unknown configuration '$config' (asan or tsan)" >&2; exit 2 ;;
  esac
  dir="build-$config"
  echo "== $config: -fsanitize=$sanitize in $dir"
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP8AMP_CUDA=OFF \
    -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=OFF -DFP8AMP_SANITIZE="$sanitize" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" -E "$exclude")
done
echo "sanitizers: ${configs[*]} clean"
