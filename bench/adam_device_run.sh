#!/usr/bin/env bash
# One device run for the Adam kernel work (docs/performance.md, "Adam / AdamW step"): builds
# everything, runs the whole test suite (ctest), the div_const check, bench_adam (the default build;
# variants given as "name:cuda-flags" arguments are built meanwhile and timed on the O2 cases), and
# Nsight Compute on one O2 step when ncu is there and time is left. Logs and JSON under $OUT.
# Each variant also runs test_optimizer against its library (LD_LIBRARY_PATH), except those whose
# name starts with "p1" (timing-only builds such as FP8AMP_ADAM_PHASE1_ONLY or FP8AMP_ADAM_SKIP_CHECK, whose steps are not real updates).
# Usage (repository root): OUT=dir CMOCKA_PREFIX=... WHEELS=dir bash bench/adam_device_run.sh [name:"-DFOO=1" ...]
# A variant named name@dir builds the sources in dir instead (an older commit's tree, from git archive).
# SUITE=0: skip the test suite and the default build's full bench (variant runs only).
# PROBE=1: first run bench/adam_stream_probe.cu (probe.json), while the variants build.
# ONLY: the bench cases the variants are timed on (default: the two O2 cases). BENCH_ARGS: more
# bench_adam.py arguments for the variants' runs and the default build's (e.g. "--fresh-grads 4"); with
# FRESH=K, every library is timed a second time with --fresh-grads K (adam-fresh-*.json). NCU_LIBS: the libraries
# Nsight Compute profiles in turn (default NCU_LIB, else build-gpu/libfp8amp.so); NCU_BEFORE: skip it
# past this many seconds. The warp-stall breakdown at the timed runs' clocks: bench/adam_ncu_stalls.sh.
set -uo pipefail
out=${OUT:-build-adam-run}
only=${ONLY:-fp8amp.O2.bf16_p.e4m3_g,fp8amp.O2.f32_p.f32_g}  # the cases the variants are timed on
mkdir -p "$out"
. tests/gpu_env.sh  # CMOCKA_PREFIX, WHEELS
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
pids=()
for v in "$@"; do  # variants build alongside the default build and the tests
  name=${v%%:*}; flags=${v#*:}; src=.
  if [[ $name == *@* ]]; then src=${name#*@}; name=${name%%@*}; fi  # name@dir: the sources in dir (an older tree)
  ( cmake -S "$src" -B "$PWD/build-$name" -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS="$flags" >"$out/configure-$name.log" 2>&1 &&
    cmake --build "build-$name" -j 4 --target fp8amp >"$out/build-$name.log" 2>&1 ) &
  pids+=($!)
done
if [ "${PROBE:-0}" = 1 ]; then  # the access-pattern probe (bench/adam_stream_probe.cu) while the builds run
  nvcc -O3 -arch=sm_90 -std=c++17 bench/adam_stream_probe.cu -o "$out/adam_stream_probe" &&
    timeout 150 "$out/adam_stream_probe" >"$out/probe.json" 2>&1
  echo "probe rc=$? at ${SECONDS} s"; grep -c fraction_of_copy "$out/probe.json"
  rm -f "$out/adam_stream_probe"
fi
cmake -S . -B build-gpu -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=ON "${prefix_args[@]}" >"$out/configure.log" 2>&1 \
  || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "built at ${SECONDS} s"
if [ "${SUITE:-1}" = 1 ]; then  # SUITE=0: variants only (the default build still provides the tests)
  (cd build-gpu && timeout 200 ctest --output-on-failure -j 6 >"$out/ctest.log" 2>&1)
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -12
  grep -E "test_cpu_cuda_bit_identical|FAILED" build-gpu/Testing/Temporary/LastTest.log 2>/dev/null | head -5
  echo "tests done at ${SECONDS} s"
  nvcc -O3 -arch=sm_90 -std=c++17 -I kernels bench/adam_ieee_check.cu -o build-gpu/adam_ieee_check &&
    timeout 30 ./build-gpu/adam_ieee_check | tee "$out/ieee_check.txt"
  timeout 90 python3 bench/bench_adam.py --lib build-gpu/libfp8amp.so --out "$out/adam.json" ${BENCH_ARGS:-} >"$out/bench.log" 2>&1
  tail -9 "$out/bench.log"
else  # the default build on the variants' cases, as their baseline in this run
  timeout 90 python3 bench/bench_adam.py --lib build-gpu/libfp8amp.so --only "$only" \
    --out "$out/adam.json" ${BENCH_ARGS:-} >"$out/bench.log" 2>&1
  echo "== default"; grep -E "^fp8amp" "$out/bench.log" | tail -4
fi
for p in "${pids[@]}"; do wait "$p"; done
for v in "$@"; do
  name=${v%%:*}; name=${name%%@*}
  if [ -f "build-$name/libfp8amp.so" ]; then
    timeout 90 python3 bench/bench_adam.py --lib "build-$name/libfp8amp.so" --only "$only" \
      --out "$out/adam-$name.json" ${BENCH_ARGS:-} >"$out/bench-$name.log" 2>&1
    echo "== $name"; grep -E "^fp8amp" "$out/bench-$name.log" | tail -4
    if [[ $name != p1* ]]; then
      LD_LIBRARY_PATH="$PWD/build-$name:${LD_LIBRARY_PATH:-}" timeout 90 build-gpu/tests/capi/test_optimizer >"$out/test-$name.log" 2>&1
      echo "   test_optimizer rc=$? ($(LD_LIBRARY_PATH="$PWD/build-$name:${LD_LIBRARY_PATH:-}" ldd build-gpu/tests/capi/test_optimizer | grep -o 'build-[a-z0-9]*/libfp8amp.so'))" \
        "$(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$out/test-$name.log" | tr '\n' ' ')"
    fi
  else
    echo "== $name: build failed"; tail -3 "$out/build-$name.log"
  fi
done
if [ -n "${FRESH:-}" ]; then  # every library again, each step with the next of FRESH gradient sets
  for lib in build-gpu/libfp8amp.so $(for v in "$@"; do n=${v%%:*}; echo "build-${n%%@*}/libfp8amp.so"; done); do
    [ -f "$lib" ] || continue
    tag=$(basename "$(dirname "$lib")")
    timeout 120 python3 bench/bench_adam.py --lib "$lib" --only "$only" \
      --fresh-grads "$FRESH" --out "$out/adam-fresh-$tag.json" >"$out/bench-fresh-$tag.log" 2>&1
    echo "== fresh $tag"; grep -E "^fp8amp" "$out/bench-fresh-$tag.log" | tail -4
  done
fi
echo "benches done at ${SECONDS} s"
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ -n "$ncu_bin" ] && [ "$SECONDS" -lt "${NCU_BEFORE:-230}" ]; then
  # NCU_LIBS: the libraries profiled in turn (default: NCU_LIB); one O2 step of 64M parameters each
  for lib in ${NCU_LIBS:-${NCU_LIB:-build-gpu/libfp8amp.so}}; do
    tag=$(basename "$(dirname "$lib")")
    timeout $(( ${NCU_BEFORE:-230} + 60 - SECONDS )) "$ncu_bin" --kernel-name regex:adam_fast --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section InstructionStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sector_op_read_hit_rate.pct,lts__t_sector_op_write_hit_rate.pct \
      python3 bench/bench_adam.py --lib "$lib" --params 67108864 --only fp8amp.O2.bf16_p.e4m3_g \
      --out "$out/ncu-bench-$tag.json" >"$out/ncu-$tag.txt" 2>&1
    echo "== ncu $tag"
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|No Eligible|dram__bytes|sm__cycles_elapsed|lts__t_sector" "$out/ncu-$tag.txt" | head -24
  done
else
  echo "ncu: ${ncu_bin:-none}, skipped at ${SECONDS} s"
fi
echo "end at ${SECONDS} s"
