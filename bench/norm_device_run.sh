#!/usr/bin/env bash
# One short device run for the fused norms (docs/performance.md, "Fused normalization"): builds the
# library and test_norm only (sm_90), runs test_norm (CPU <-> CUDA bit identity on every kernel path)
# and bench_norm.py on the norm cases only, without the PyTorch peers unless PEERS=1. About 2 minutes
# on an H100 host. Logs and norm.json under $OUT.
# Usage (repository root): OUT=dir CMOCKA_PREFIX=... WHEELS=dir bash bench/norm_device_run.sh
# SHAPES: bench_norm.py's --shapes (default: its four shapes).
set -uo pipefail
out=${OUT:-build-norm-run}
mkdir -p "$out"
. tests/gpu_env.sh  # CMOCKA_PREFIX, WHEELS
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B build-norm -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90-real "${prefix_args[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-norm -j "$(nproc)" --target fp8amp test_norm >"$out/build.log" 2>&1 \
  || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "built at ${SECONDS} s"
build-norm/tests/capi/test_norm >"$out/test_norm.log" 2>&1
echo "test_norm rc=$?"; grep -E "PASSED|FAILED|SKIPPED|\[  ERROR|Assert|Failure" "$out/test_norm.log" | head -20
peers=(--fp8amp-only)
[ "${PEERS:-0}" = 1 ] && peers=()
python3 bench/bench_norm.py --lib build-norm/libfp8amp.so --norm-only "${peers[@]}" ${SHAPES:+--shapes "$SHAPES"} \
  --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" --out "$out/norm.json" 2>&1 | tee "$out/bench.log"
echo "done at ${SECONDS} s"
