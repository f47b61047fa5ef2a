#!/usr/bin/env bash
# Builds the Python binding against a built libfp8amp (no install needed) into the folder SITE (for
# PYTHONPATH), from a copy of the sources, so that the source tree gets no build/ or egg-info
# folders. Used by run_tests.sh and bench/run_gpt_device.sh.
# Usage: install_site.sh LIB_DIR SITE [SOURCE_DIR] -- LIB_DIR holds libfp8amp.so (the CMake build
# folder). PYTHON: the interpreter (default python3). Prints pip's log when the build fails.
set -euo pipefail
libdir=$(cd "$1" && pwd)
site=${2:?usage: install_site.sh LIB_DIR SITE [SOURCE_DIR]}
src=$(cd "${3:-$(dirname "$0")/../..}" && pwd)
py=${PYTHON:-python3}
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
cp -r "$src/bindings/python/." "$pkg"
rm -rf "$pkg/build" "$pkg/src/fp8amp/_fp8amp_cffi"* "$pkg/src/"*.egg-info
# The public headers: capi/include (the build folder's include/ holds a copy of version.h only).
FP8AMP_INCLUDE_DIR="$src/capi/include:$libdir/include" FP8AMP_LIB_DIR="$libdir" \
  "$py" -m pip install -q --no-build-isolation --no-deps --target "$site" "$pkg" >"$pkg.log" 2>&1 \
  || { cat "$pkg.log"; rm -f "$pkg.log"; exit 1; }
rm -f "$pkg.log"
