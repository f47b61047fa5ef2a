#!/usr/bin/env bash
# Downloads the wheels the binding needs that the GPU machine's Python lacks (cffi and pycparser for
# CPython 3.12 on x86-64 Linux), for machines with no package index. Usage: fetch_wheels.sh DEST
# Then, there: WHEELS=DEST bash tests/run_on_gpu.sh (installs them into a scratch site first).
set -euo pipefail
dest=${1:?usage: fetch_wheels.sh DEST}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" cffi pycparser
ls "$dest"
