#!/usr/bin/env bash
# Builds fp8amp and runs every test, on a fresh Debian/Ubuntu machine: installs CMocka, CMake, the
# Python references (numpy, ml_dtypes), SWIG + a JDK + JUnit 5 and cargo first (tests/install_deps.sh).
# The default build includes the Java and Rust bindings and the conformance scenario of every binding. GPU variants run when a GPU is present and are
# reported SKIPPED otherwise. Then the reliability jobs (docs/reliability.md): the CPU suite under
# ASan+UBSan and under TSan (tests/sanitizers.sh), and a short run of each fuzz target
# (tests/fuzz/run.sh; FUZZ_SECONDS per target, default 60). FP8AMP_QUICK=1 skips those two.
# Also the generated API reference (tests/check_docs.sh), the add_subdirectory check and the Python
# wheel installed into a fresh venv (bindings/python/test_wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/install_deps.sh python java rust wheel
# The default build (with CUDA kernels when nvcc is found; MPI required, so that the communicator
# tests under mpirun run rather than skip), then a build without CUDA, whose CUDA
# entry points must answer NOT_SUPPORTED while everything on the CPU works the same.
# The Java (SWIG) and Rust bindings are built and tested here too, with the conformance scenario
# comparing their output to the C runner's.
cmake -S . -B build -G Ninja -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=ON -DFP8AMP_MPI=ON \
  -DFP8AMP_BINDINGS_JAVA=ON -DFP8AMP_BINDINGS_RUST=ON
cmake --build build
cmake -S . -B build-nocuda -G Ninja -DFP8AMP_CUDA=OFF -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=OFF -DFP8AMP_MPI=ON
cmake --build build-nocuda
(cd build-nocuda && ctest --output-on-failure -j "$(nproc)")
# The C function reference generated from the header (Doxygen, warnings are errors), and fp8amp
# added to another project with add_subdirectory (no CMocka, no tests, the parent's build type kept).
bash tests/check_docs.sh
bash tests/subproject/check.sh "$PWD" "$PWD/build-subproject"
# The Python wheel (pip install . at the root, CPU-only here: a CUDA wheel takes too long on CI's
# 2 cores), installed into a fresh venv with no compiler, against ml_dtypes and the package's tests.
FP8AMP_WHEEL_CUDA=OFF bash bindings/python/test_wheel.sh
if [ "${FP8AMP_QUICK:-0}" != 1 ]; then
  bash tests/sanitizers.sh
  bash tests/fuzz/run.sh "${FUZZ_SECONDS:-60}"
fi
# The default build's suite last, so that its summary closes the log.
cd build
ctest --output-on-failure -j "$(nproc)"
