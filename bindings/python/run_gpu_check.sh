#!/usr/bin/env bash
# The Python binding's GPU check (what produced the H100 numbers in bindings/python/README.md and
# docs/performance.md): builds libfp8amp with CUDA (library only), installs the binding into a
# scratch site (cffi from WHEELS, a folder of wheels: bindings/python/fetch_wheels.sh), runs the
# pytest suite (CUDA and PyTorch tests included), the PyTorch-front host-overhead bench and the GPT
# training check. Usage: OUT=DIR [WHEELS=DIR] [GPT_STEPS=600] bash bindings/python/run_gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build-gpu-py}
mkdir -p "$out"
site=$(mktemp -d)
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
t0=$(date +%s)
{ cmake -S . -B build-gpu -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release && \
  cmake --build build-gpu --target fp8amp -j "$(nproc)"; } >"$out/build.log" 2>&1 \
  || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "library built in $(( $(date +%s) - t0 )) s"
FP8AMP_INCLUDE_DIR=$PWD/capi/include:$PWD/build-gpu/include FP8AMP_LIB_DIR=$PWD/build-gpu \
  python3 -m pip install -q --no-build-isolation --no-deps --target "$site" ./bindings/python >"$out/pip.log" 2>&1 \
  || { tail -30 "$out/pip.log"; exit 1; }
(cd "$site" && FP8AMP_HEADER=$OLDPWD/capi/include/fp8amp/fp8amp.h timeout "${PYTEST_TIMEOUT:-200}" \
  python3 -m pytest -q -p no:cacheprovider -rs "$OLDPWD/bindings/python/tests" 2>&1) | tee "$out/pytest.log" | tail -25
timeout 120 python3 bench/bench_torch_linear.py --out "$out/torch-linear.json" 2>&1 | tee "$out/bench.log" | tail -20
timeout "${GPT_TIMEOUT:-300}" python3 examples/train_gpt_fp8.py --steps "${GPT_STEPS:-600}" --out "$out/gpt_fp8.json" \
  --png "$out/gpt_fp8_loss.png" 2>&1 | tee "$out/gpt.log" | tail -40
