#!/usr/bin/env bash
# Builds the CPU-only library and the whole C test suite with clang under
#   (a) AddressSanitizer + UndefinedBehaviorSanitizer, -fsanitize=enum included (build-asan), and
#   (b) ThreadSanitizer (build-tsan),
# through CMake's FP8AMP_SANITIZE option, and runs the ctest suite in each. Every sanitizer report
# aborts the test that made it (-fno-sanitize-recover=all, halt_on_error), so the script exits
# non-zero on any report, as on any failing test. Installs what it needs when it is missing (clang,
# its sanitizer runtimes, CMocka, CMake, Ninja, numpy and ml_dtypes for the reference check), as
# root or through sudo. About 4 minutes on 2 cores from scratch (measured: 4m07s), mostly compiling.
# Usage: tests/sanitizers.sh [asan|tsan]... (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(asan tsan)

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v clang >/dev/null || need+=(clang)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev)
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi
# The runtimes come in a package named after clang's major version (Debian: libclang-rt-14-dev).
runtime_dir=$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")
if [ ! -f "$runtime_dir/libclang_rt.asan-x86_64.so" ] || [ ! -f "$runtime_dir/libclang_rt.tsan-x86_64.a" ]; then
  major=$(clang -dumpversion | cut -d. -f1)
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "libclang-rt-$major-dev"
fi
if ! python3 -c "import numpy, ml_dtypes" 2>/dev/null; then
  python3 -m pip install -q numpy ml_dtypes 2>/dev/null \
    || { $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-numpy python3-ml-dtypes; }
fi

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
      # python.bindings: the binding's pytest suite compiles a CFFI extension and runs ~200 tests in an
      # uninstrumented interpreter (minutes on its own; with the preloaded runtime far beyond this
      # script's budget), through the same C API calls the CMocka suite makes here. The ml_dtypes
      # reference and the install check do run, with the runtime preloaded (tests/CMakeLists.txt).
      exclude="^python\.bindings$" ;;
    tsan)
      sanitize="thread"
      # Processes not built with TSan cannot load a TSan library: clang 14's shared TSan runtime
      # crashes at startup, so there is nothing to preload into Python (python.bindings and the
      # ml_dtypes reference) or into the install check's plain-cc consumer. Those test no threads of
      # the library (the reference is single-threaded codec checks; the install check is ABI and
      # packaging) and run under ASan+UBSan above; every CMocka test runs here.
      exclude="^(python\.bindings|reference\..*|install\.consumer)$" ;;
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
