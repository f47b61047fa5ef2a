#!/usr/bin/env bash
# Builds the Python binding against a built libfp8amp (no install needed) into a scratch folder and
# runs its pytest suite there. Used by ctest (python.bindings) and so by tests/run_all.sh.
# Usage: run_tests.sh LIB_DIR [SOURCE_DIR] [pytest arguments] -- LIB_DIR holds libfp8amp.so (the CMake
# build folder); PYTEST_PATHS: what to run, relative to SOURCE_DIR (default bindings/python/tests).
# Exit 77 (ctest: SKIPPED) when the Python tools are missing: numpy, ml_dtypes, cffi, pytest,
# setuptools/wheel and the Python headers (tests/run_all.sh installs them).
set -euo pipefail
libdir=$(cd "$1" && pwd)
src=$(cd "${2:-$(dirname "$0")/../..}" && pwd)
py=${PYTHON:-python3}
if ! "$py" -c "import numpy, ml_dtypes, cffi, pytest, setuptools, wheel, sysconfig, os, sys; \
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')) else 1)" 2>/dev/null; then
  echo "SKIPPED: the binding needs numpy, ml_dtypes, cffi, pytest, setuptools, wheel and Python's headers"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$src/bindings/python/install_site.sh" "$libdir" "$work/site" "$src"
# PYTEST_PATHS: test files or node ids relative to SOURCE_DIR (default: the whole suite)
paths=()
for t in ${PYTEST_PATHS:-bindings/python/tests}; do paths+=("$src/$t"); done
cd "$work"
FP8AMP_HEADER="$src/capi/include/fp8amp/fp8amp.h" FP8AMP_GENERATED_INCLUDE="$libdir/include" PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" \
  "$py" -m pytest -q -p no:cacheprovider -rs "${paths[@]}" "${@:3}"
