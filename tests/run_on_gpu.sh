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
cd build-gpu && ctest --output-on-failure -j 4 2>&1 | tee "$out/ctest.log" | tail -40
