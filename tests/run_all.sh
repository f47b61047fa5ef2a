#!/usr/bin/env bash
# Builds fp8amp and runs every test, on a fresh Debian/Ubuntu machine: installs CMocka, CMake and
# the Python references (numpy, ml_dtypes) first. GPU variants run when a GPU is present and are
# reported SKIPPED otherwise. Then the reliability jobs (docs/reliability.md): the CPU suite under
# ASan+UBSan and under TSan (tests/sanitizers.sh), and a short run of each fuzz target
# (tests/fuzz/run.sh; FUZZ_SECONDS per target, default 60). FP8AMP_QUICK=1 skips those two.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev)
command -v abidiff >/dev/null || need+=(abigail-tools)  # the ABI check (tests/abi)
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi
if ! python3 -c "import numpy, ml_dtypes" 2>/dev/null; then
  python3 -m pip install -q numpy ml_dtypes 2>/dev/null \
    || { $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-numpy python3-ml-dtypes; }
fi
# The Python binding's build and tests (ctest python.bindings): cffi, pytest, setuptools, wheel and
# Python's headers, through pip, or apt where pip cannot install them.
if ! python3 -c "import cffi, pytest, setuptools, wheel" 2>/dev/null; then
  python3 -m pip install -q cffi pytest setuptools wheel 2>/dev/null \
    || { $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-cffi python3-pytest python3-setuptools python3-wheel; }
fi
if ! python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
  $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-dev
fi
# The default build (with CUDA kernels when nvcc is found), then a build without CUDA, whose CUDA
# entry points must answer NOT_SUPPORTED while everything on the CPU works the same.
cmake -S . -B build -G Ninja -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=ON
cmake --build build
cmake -S . -B build-nocuda -G Ninja -DFP8AMP_CUDA=OFF -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=OFF
cmake --build build-nocuda
(cd build-nocuda && ctest --output-on-failure -j "$(nproc)")
if [ "${FP8AMP_QUICK:-0}" != 1 ]; then
  bash tests/sanitizers.sh
  bash tests/fuzz/run.sh "${FUZZ_SECONDS:-60}"
fi
# The default build's suite last, so that its summary closes the log.
cd build
ctest --output-on-failure -j "$(nproc)"
