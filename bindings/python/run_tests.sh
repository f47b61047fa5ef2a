#!/usr/bin/env bash
# Builds the Python binding against a built libfp8amp (no install needed) into a scratch folder and
# runs its pytest suite there. Used by ctest (python.bindings) and so by tests/run_all.sh.
# Usage: run_tests.sh LIB_DIR [SOURCE_DIR] -- LIB_DIR holds libfp8amp.so (the CMake build folder).
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
# Build from a copy, so the source tree gets no build/ or egg-info folders.
cp -r "$src/bindings/python" "$work/pkg"
rm -rf "$work/pkg/build" "$work/pkg/src/fp8amp/_fp8amp_cffi"* "$work/pkg/src/"*.egg-info
# The public headers: capi/include (the build folder's include/ holds a copy of version.h only).
FP8AMP_INCLUDE_DIR="$src/capi/include:$libdir/include" FP8AMP_LIB_DIR="$libdir" \
  "$py" -m pip install -q --no-build-isolation --no-deps --target "$work/site" "$work/pkg" >"$work/pip.log" 2>&1 \
  || { cat "$work/pip.log"; exit 1; }
cd "$work"
FP8AMP_HEADER="$src/capi/include/fp8amp/fp8amp.h" FP8AMP_GENERATED_INCLUDE="$libdir/include" PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" \
  "$py" -m pytest -q -p no:cacheprovider -rs "$src/bindings/python/tests" "${@:3}"
