#!/usr/bin/env bash
# Builds the fused activation kernels in several tuning variants (kernels/cuda/activation.cu's
# FP8AMP_ACTIVATION_* knobs) and benchmarks each with bench_norm.py --only activation --fp8amp-only,
# on the device, in one run (the builds in parallel first, then the benches one after another).
# Usage: bench/tune_activation.sh OUT_DIR NAME=FLAGS [NAME=FLAGS ...]
#   e.g. bench/tune_activation.sh /tmp/out regs="-DFP8AMP_ACTIVATION_PIPELINE=0" ring="" \
#          s2u4="-DFP8AMP_ACTIVATION_STAGES1=2 -DFP8AMP_ACTIVATION_UNROLL1=4" \
#          bwd_s3u1="-DFP8AMP_ACTIVATION_STAGES2=3 -DFP8AMP_ACTIVATION_UNROLL2=1"
# Knobs: FP8AMP_ACTIVATION_PIPELINE (1: cp.async input ring, 0: the former register loop);
# FP8AMP_ACTIVATION_STAGES1/2/3 and _UNROLL1/2/3: ring slots and groups of 8 per step of the stream
# kernels with 1/2/3 input streams (GELU/SiLU fwd; SwiGLU fwd and GELU/SiLU bwd; SwiGLU bwd), the
# ring (STAGES x UNROLL x streams x 4 KB) within 40 KB a block; FP8AMP_ACTIVATION_TILE_STAGES (the
# +t tile kernel's ring); FP8AMP_ACTIVATION_MIN_BLOCKS (the stream kernels' register bound, 6 blocks:
# 40 registers; 5: 48; 0: none) and FP8AMP_ACTIVATION_TILE_MIN_BLOCKS (the tile kernels', 5).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  (cmake -S . -B "build-tune-act-$name" -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=OFF \
     -DCMAKE_CUDA_FLAGS="$flags" >/dev/null && cmake --build "build-tune-act-$name" -j 4 >"$out/build-$name.log" 2>&1) &
done
wait
for spec in "$@"; do
  name=${spec%%=*}
  echo "== $name: ${spec#*=}"
  python3 bench/bench_norm.py --lib "build-tune-act-$name/libfp8amp.so" --only activation --fp8amp-only \
    --out "$out/tune-$name.json" | grep -E "copy|fp8amp" || tail -5 "$out/build-$name.log"
done
