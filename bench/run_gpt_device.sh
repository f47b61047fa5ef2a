#!/usr/bin/env bash
# The end-to-end GPT runs on a GPU machine without a package index (issues 18 and 19): builds fp8amp
# with CUDA (build-gpu/, incremental), installs the Python binding and torchao into a scratch site,
# then runs bench/bench_gpt.py (memory and step time beside bf16 AMP and torchao float8 + compile)
# and, with TRAIN_ARGS, examples/train_gpt_fp8.py (the loss over many steps). From the repository
# root, after tests/fetch_gpu_deps.sh .deps here (the device run carries .deps):
#
#   OUT=$OUT BENCH_ARGS="--preset d2048 --fp8amp-recipe delayed" bash bench/run_gpt_device.sh
#   OUT=$OUT BENCH_ARGS= TRAIN_ARGS="--steps 1000 --modes bf16,O1,O2 --compile --fp8amp-recipe delayed \
#     --eval-batches 64" bash bench/run_gpt_device.sh
#
# PYTEST: test files or node ids of the Python suite to run first against the same build
# (e.g. bindings/python/tests/test_torch_linear_uses.py; bindings/python/run_tests.sh's
# PYTEST_PATHS), log in $OUT/pytest.log.
# Writes $OUT/gpt_step.json and .log (BENCH_ARGS empty: skipped), $OUT/gpt_loss.json, .png and
# train.log (TRAIN_ARGS given), the build's logs. DEPS: where tests/fetch_gpu_deps.sh put its files
# (default .deps); LIMIT: seconds the two runs may take together (default 560); CUDA=OFF and
# BUILD=dir: a CPU build in another folder, for checking the script itself (BENCH_ARGS=--smoke).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a directory for the results}"
deps=$(cd "${DEPS:-.deps}" 2>/dev/null && pwd) || deps=$PWD/${DEPS:-.deps}
export CMOCKA_PREFIX=${CMOCKA_PREFIX:-$deps/cmocka/usr} PYTHONUNBUFFERED=1
if [ -z "${WHEELS:-}" ] && [ -d "$deps/wheels" ]; then export WHEELS=$deps/wheels; fi  # cffi: the binding's build
. tests/gpu_env.sh
build=${BUILD:-build-gpu}
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"; fi
cmake -S . -B "$build" -G Ninja -DFP8AMP_CUDA=${CUDA:-ON} -DCMAKE_CUDA_ARCHITECTURES=90-real -DFP8AMP_MPI=OFF \
  -DFP8AMP_BUILD_TESTS=OFF "${prefix_args[@]}" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target fp8amp >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "built at $SECONDS s"
site=$(mktemp -d)
bash bindings/python/install_site.sh "$build" "$site" . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$deps"/torchao/*.whl \
  >"$OUT/site.log" 2>&1 || echo "no torchao wheel in $deps/torchao (tests/fetch_gpu_deps.sh): the torchao modes will say skipped"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$PWD/$build:${LD_LIBRARY_PATH:-}"
limit=${LIMIT:-560}
if [ -n "${PYTEST:-}" ]; then  # through the suite's own runner (it builds its own site)
  PYTEST_PATHS="$PYTEST" timeout $((limit - SECONDS)) bash bindings/python/run_tests.sh "$build" . >"$OUT/pytest.log" 2>&1
  echo "pytest rc=$? at $SECONDS s"; tail -3 "$OUT/pytest.log"
fi
if [ -n "${BENCH_ARGS:-}" ]; then
  timeout $((limit - SECONDS)) python3 bench/bench_gpt.py $BENCH_ARGS --out "$OUT/gpt_step.json" >"$OUT/gpt_step.log" 2>&1
  echo "bench_gpt rc=$? at $SECONDS s"; grep -E "^GPT|^  \[" "$OUT/gpt_step.log"
fi
if [ -n "${TRAIN_ARGS:-}" ]; then
  timeout $((limit - SECONDS)) python3 examples/train_gpt_fp8.py $TRAIN_ARGS --out "$OUT/gpt_loss.json" \
    --png "$OUT/gpt_loss.png" >"$OUT/train.log" 2>&1
  echo "train rc=$? at $SECONDS s"; grep -E "final|vs bf16" "$OUT/train.log"
fi
