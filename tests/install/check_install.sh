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
# fp8amp.h includes version.h; its DLPack functions need DLPack's dlpack.h: both installed.
test -f "$prefix/include/fp8amp/version.h"
test -f "$prefix/include/fp8amp/dlpack.h"
test -n "$(find "$prefix" -name LICENSE.dlpack)"

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
# A DLPack consumer built from the installed headers alone (fp8amp.h says to include <fp8amp/dlpack.h>).
cat >"$prefix/dlpack_user.c" <<'C'
#include <fp8amp/fp8amp.h>
#include <fp8amp/dlpack.h>
#include <stdio.h>
int main(void) {
    const fp8amp_device cpu = {FP8AMP_DEVICE_CPU, 0};
    const int64_t shape[1] = {3};
    fp8amp_context ctx;
    fp8amp_tensor t;
    struct DLManagedTensorVersioned *m;
    if (fp8amp_context_create(cpu, &ctx) || fp8amp_tensor_create(ctx, FP8AMP_DTYPE_E4M3, 1, shape, &t) ||
        fp8amp_tensor_to_dlpack(t, &m)) return 1;
    const int ok = m->version.major == DLPACK_MAJOR_VERSION && m->dl_tensor.dtype.code == kDLFloat8_e4m3fn &&
                   m->dl_tensor.device.device_type == kDLCPU && m->dl_tensor.shape[0] == 3 &&
                   fp8amp_version() == FP8AMP_VERSION;
    m->deleter(m);
    fp8amp_tensor_destroy(t);
    fp8amp_context_destroy(ctx);
    printf("DLPack consumer: %s\n", ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
C
cc -std=c99 -Wall -Werror -pedantic "$prefix/dlpack_user.c" -o "$prefix/dlpack_user" $(pkg-config --cflags --libs fp8amp)
LD_LIBRARY_PATH="$libdir" "$prefix/dlpack_user"

# CMake package
cmake -S "$src/examples/consumer" -B "$prefix/consumer_build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer_build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/consumer_build/consumer"
echo "install check: pkg-config and find_package consumers built and ran"
