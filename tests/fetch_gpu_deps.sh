#!/usr/bin/env bash
# Downloads, on a machine with Debian's package index and PyPI, what a GPU machine without either
# needs for the suite and the end-to-end benchmarks, into DEST (the repository's ignored .deps/ is
# the usual place; a device run carries it):
#   DEST/cmocka/usr   CMocka extracted from Debian's .deb files (CMOCKA_PREFIX for tests/gpu_env.sh)
#   DEST/wheels       cffi and pycparser for CPython 3.12 (WHEELS for tests/gpu_env.sh)
#   DEST/torchao      torchao (pure Python float8 training; bench/bench_gpt.py's peer), for
#                     bench/run_gpt_device.sh
# Usage: tests/fetch_gpu_deps.sh DEST
set -euo pipefail
dest=$(mkdir -p "${1:?usage: fetch_gpu_deps.sh DEST}" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dest/cmocka" "$dest/debs" "$dest/torchao"
(cd "$dest/debs" && apt-get download libcmocka0 libcmocka-dev >/dev/null)
for f in "$dest"/debs/*.deb; do dpkg -x "$f" "$dest/cmocka"; done
bash "$here/bindings/python/fetch_wheels.sh" "$dest/wheels" >/dev/null
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dest/torchao" torchao
ls "$dest/cmocka/usr/lib/x86_64-linux-gnu/libcmocka.so" "$dest"/wheels/*.whl "$dest"/torchao/*.whl
