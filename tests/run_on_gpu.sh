#!/usr/bin/env bash
# Builds fp8amp and runs the whole test suite on a GPU machine (used for the device runs that gate
# kernel changes; CI itself has no GPU). Usage: tests/run_on_gpu.sh [extra cmake args]
# CMOCKA_PREFIX, WHEELS: see tests/gpu_env.sh.
# OUT: where logs go (default: build-gpu/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu}
mkdir -p "$out"
. tests/gpu_env.sh  # CMOCKA_PREFIX, WHEELS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DFP8AMP_CUDA=ON "${prefix_args[@]}" "$@" >"$out/configure.log" 2>&1 \
  || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -60; exit 1; }
# The Python suite is most of the time serially (over 5 minutes on an H100); with pytest-xdist
# there (the GPU image has it) its tests run in 8 processes (they are independent; every one passed
# so, 2026-11-26). PYTEST_ADDOPTS set by the caller wins.
if [ -z "${PYTEST_ADDOPTS+x}" ] && python3 -c "import xdist" 2>/dev/null; then export PYTEST_ADDOPTS="-n 8"; fi
cd build-gpu && ctest --output-on-failure -j 4 2>&1 | tee "$out/ctest.log" | tail -40
