#!/usr/bin/env bash
# The main job on a fresh Debian/Ubuntu machine: installs what it needs, builds fp8amp, exports the
# dataset (the UCI digits that scikit-learn ships) and runs the job through the C API.
# Arguments are passed to the job, e.g. --device cpu. CPU by default; CUDA when a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || ! command -v cc >/dev/null; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq cmake ninja-build build-essential pkg-config python3 python3-pip
fi
if ! python3 -c "import sklearn" 2>/dev/null; then
  python3 -m pip install -q scikit-learn numpy 2>/dev/null \
    || { $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-sklearn; }
fi
cmake -S . -B build -G Ninja -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=ON >/dev/null
cmake --build build --target fp8amp_main_job
python3 examples/data/export_digits.py build/digits.bin
build/examples/fp8amp_main_job --data build/digits.bin "$@"
