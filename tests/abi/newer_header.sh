#!/usr/bin/env bash
# Writes the header of a hypothetical later fp8amp 0.x (minor 99) to OUT/fp8amp/fp8amp.h: the current
# header with one field appended to every option struct that may grow (fp8amp_recipe may not: it is
# embedded in fp8amp_linear_desc, docs/api.md 1.6). The types follow the growth rule: a new field
# begins at or after the old sizeof -- fp8amp_linear_desc's int64_t lands at 80, past its tail padding
# (76..80). tests/abi/consumer.c compiled with -DABI_NEWER against it is a newer binary on this library.
# Its version (minor 99) goes into OUT/fp8amp/version.h, made from the build's copy of version.h.
# Usage: newer_header.sh SOURCE_DIR OUT GENERATED_INCLUDE_DIR (the build folder's include/)
set -euo pipefail
src=$1
out=$2
gen=$3
mkdir -p "$out/fp8amp"
sed -e 's/^#define FP8AMP_VERSION_MINOR [0-9]*$/#define FP8AMP_VERSION_MINOR 99/' \
    "$gen/fp8amp/version.h" >"$out/fp8amp/version.h"
grep -q '^#define FP8AMP_VERSION_MINOR 99$' "$out/fp8amp/version.h" \
  || { echo "newer_header.sh: $gen/fp8amp/version.h has no FP8AMP_VERSION_MINOR line to change"; exit 1; }
sed -e 's/^} fp8amp_linear_desc;/    int64_t abi_newer_field;\n} fp8amp_linear_desc;/' \
    -e 's/^} fp8amp_adam_desc;/    int32_t abi_newer_field;\n} fp8amp_adam_desc;/' \
    -e 's/^} fp8amp_adam_step_args;/    int64_t abi_newer_field;\n} fp8amp_adam_step_args;/' \
    -e 's/^} fp8amp_grad_scaler_desc;/    int32_t abi_newer_field;\n} fp8amp_grad_scaler_desc;/' \
    "$src/capi/include/fp8amp/fp8amp.h" >"$out/fp8amp/fp8amp.h"
n=$(grep -c 'abi_newer_field;' "$out/fp8amp/fp8amp.h")
[ "$n" -eq 4 ] || { echo "newer_header.sh: expected 4 structs to extend, found $n (did a struct's closing line change?)"; exit 1; }
