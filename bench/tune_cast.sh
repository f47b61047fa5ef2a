#!/usr/bin/env bash
# Builds the casting kernels in several tuning variants (kernels/cuda/quantize.cu's FP8AMP_* knobs)
# and benchmarks each with bench_cast.py --fp8amp-only, on the device, in one run.
# Usage: bench/tune_cast.sh OUT_DIR NAME=FLAGS [NAME=FLAGS ...]
#   e.g. bench/tune_cast.sh /tmp/out v8u4="-DFP8AMP_QUANTIZE_VEC=8 -DFP8AMP_QUANTIZE_UNROLL=4"
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  (cmake -S . -B "build-tune-$name" -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=OFF \
     -DCMAKE_CUDA_FLAGS="$flags" >/dev/null && cmake --build "build-tune-$name" -j 4 >"$out/build-$name.log" 2>&1) &
done
wait
for spec in "$@"; do
  name=${spec%%=*}
  echo "== $name: ${spec#*=}"
  python3 bench/bench_cast.py --lib "build-tune-$name/libfp8amp.so" --fp8amp-only --out "$out/tune-$name.json" \
    | grep -E "copy|fp8amp" || tail -5 "$out/build-$name.log"
done
