#!/usr/bin/env bash
# Builds the fused activation kernels in several tuning variants (kernels/cuda/activation.cu's
# FP8AMP_ACTIVATION_* knobs) and benchmarks each with bench_norm.py --only activation --fp8amp-only,
# on the device, in one run (the builds in parallel first, then the benches one after another).
# Usage: bench/tune_activation.sh OUT_DIR NAME=FLAGS [NAME=FLAGS ...]
#   e.g. bench/tune_activation.sh /tmp/out default="" ring="-DFP8AMP_ACTIVATION_PIPELINE=1" \
#          ring_s2u4="-DFP8AMP_ACTIVATION_PIPELINE=1 -DFP8AMP_ACTIVATION_STAGES1=2 -DFP8AMP_ACTIVATION_UNROLL1=4" \
#          tiles_all="-DFP8AMP_ACTIVATION_TILE_RING=2" tiles_none="-DFP8AMP_ACTIVATION_TILE_RING=0"
# Knobs: FP8AMP_ACTIVATION_PIPELINE (stream kernels: 0, the default, the register loop; 1 the
# cp.async input ring); FP8AMP_ACTIVATION_TILE_RING (tile kernel: 1, the default, the forwards take
# the ring; 2 all that fit; 0 none);
# FP8AMP_ACTIVATION_STAGES1/2/3 and _UNROLL1/2/3: ring slots and groups of 8 per step of the stream
# kernels with 1/2/3 input streams (GELU/SiLU fwd; SwiGLU fwd and GELU/SiLU bwd; SwiGLU bwd), the
# ring (STAGES x UNROLL x streams x 4 KB) within 40 KB a block; FP8AMP_ACTIVATION_TILE_STAGES (the
# +t tile kernel's ring); FP8AMP_ACTIVATION_MIN_BLOCKS (with the ring, the stream kernels' register
# bound, 6 blocks: 40 registers; 5: 48; 0: none) and FP8AMP_ACTIVATION_TILE_MIN_BLOCKS (the tile kernels', 5).
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
