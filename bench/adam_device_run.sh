#!/usr/bin/env bash
# One device run for the Adam kernel work (docs/performance.md, "Adam / AdamW step"): builds the
# library and test_optimizer, runs the optimizer tests, the div_const check, bench_adam (the default
# build and optional variants given as "name:cmake-flags" arguments, O2 case only for variants),
# and Nsight Compute on one O2 step when ncu is there. Logs and JSON under $OUT.
# Usage (repository root): OUT=dir CMOCKA_PREFIX=... bash bench/adam_device_run.sh [name:"-DFOO=1 -DBAR=2" ...]
set -uo pipefail
out=${OUT:-build-adam-run}
mkdir -p "$out"
prefix_args=()
if [ -n "${CMOCKA_PREFIX:-}" ]; then
  prefix_args=(-DCMAKE_PREFIX_PATH="$CMOCKA_PREFIX" -DCMAKE_LIBRARY_PATH="$CMOCKA_PREFIX/lib/x86_64-linux-gnu")
  export LD_LIBRARY_PATH="$CMOCKA_PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
t0=$SECONDS
cmake -S . -B build-gpu -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=ON "${prefix_args[@]}" >"$out/configure.log" 2>&1 \
  || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target fp8amp test_optimizer >"$out/build.log" 2>&1 \
  || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "built in $((SECONDS - t0)) s"
# variants build in the background while the tests run
pids=()
for v in "$@"; do
  name=${v%%:*}; flags=${v#*:}
  ( cmake -S . -B "build-$name" -G Ninja -DFP8AMP_CUDA=ON -DCMAKE_CUDA_FLAGS="$flags" >"$out/configure-$name.log" 2>&1 &&
    cmake --build "build-$name" -j 8 --target fp8amp >"$out/build-$name.log" 2>&1 ) &
  pids+=($!)
done
t0=$SECONDS
(cd build-gpu && ./tests/capi/test_optimizer >"$out/test_optimizer.log" 2>&1; echo "test_optimizer exit $?" >>"$out/test_optimizer.log")
grep -E "PASSED|FAILED|exit|Error" "$out/test_optimizer.log" | tail -8
echo "tests in $((SECONDS - t0)) s"
nvcc -O3 -arch=sm_90 -std=c++17 -I kernels bench/adam_ieee_check.cu -o build-gpu/adam_ieee_check && ./build-gpu/adam_ieee_check | tee "$out/ieee_check.txt"
for p in "${pids[@]}"; do wait "$p"; done
export PYTHONUNBUFFERED=1
python3 bench/bench_adam.py --lib build-gpu/libfp8amp.so --out "$out/adam.json" >"$out/bench.log" 2>&1
tail -8 "$out/bench.log"
for v in "$@"; do
  name=${v%%:*}
  if [ -f "build-$name/libfp8amp.so" ]; then
    python3 bench/bench_adam.py --lib "build-$name/libfp8amp.so" --only fp8amp.O2.bf16_p.e4m3_g,fp8amp.O2.f32_p.f32_g \
      --out "$out/adam-$name.json" >"$out/bench-$name.log" 2>&1
    echo "== $name"; grep -E "^fp8amp" "$out/bench-$name.log" | tail -2
  else
    echo "== $name: build failed"; tail -5 "$out/build-$name.log"
  fi
done
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ -n "$ncu_bin" ] && [ -z "${NO_NCU:-}" ]; then
  timeout 120 "$ncu_bin" --kernel-name regex:adam --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section InstructionStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis \
    python3 bench/bench_adam.py --lib build-gpu/libfp8amp.so --params 67108864 --only fp8amp.O2.bf16_p.e4m3_g \
    --out "$out/ncu-bench.json" >"$out/ncu.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|No Eligible|Block Limit Reg" "$out/ncu.txt" | head -30
else
  echo "no ncu"
fi
