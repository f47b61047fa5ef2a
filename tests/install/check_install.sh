#!/usr/bin/env bash
# Installs the built library into a scratch prefix and builds examples/consumer against it twice:
# through pkg-config and through find_package(fp8amp). Checks the ABI surface too: SONAME and only
# fp8amp_* symbols exported under FP8AMP_0 (or a later FP8AMP_0.N). Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libfp8amp.so.0' | head -n 1)")
test -f "$prefix/include/fp8amp/fp8amp.h"

soname=$(readelf -d "$libdir/libfp8amp.so.0" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libfp8amp.so.0" ] || { echo "SONAME is '$soname'"; exit 1; }
# FP8AMP_0 and the nodes of later 0.x releases that inherit it (FP8AMP_0.2, ...; cmake/fp8amp.map).
foreign=$(nm -D --defined-only "$libdir/libfp8amp.so.0" | awk '{print $3}' |
          grep -v -E '^(fp8amp_.*@@FP8AMP_0(\.[0-9]+)?|FP8AMP_0(\.[0-9]+)?)$' || true)
[ -z "$foreign" ] || { echo "exported symbols outside fp8amp_*@@FP8AMP_0[.N]:"; echo "$foreign"; exit 1; }

# pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -Wall -Werror -pedantic "$src/examples/consumer/consumer.c" -o "$prefix/consumer_pc" \
  $(pkg-config --cflags --libs fp8amp)
LD_LIBRARY_PATH="$libdir" "$prefix/consumer_pc"

# CMake package
cmake -S "$src/examples/consumer" -B "$prefix/consumer_build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer_build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/consumer_build/consumer"
echo "install check: pkg-config and find_package consumers built and ran"
