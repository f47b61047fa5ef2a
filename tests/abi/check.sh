#!/usr/bin/env bash
# The ABI checks of docs/api.md 1.6 (ctest runs both: abi.old_binaries and abi.abidiff).
#
#   check.sh consumers BUILD_DIR SOURCE_DIR
#     Proof by running binaries: tests/abi/consumer.c is compiled against the stored header of the
#     last release (tests/abi/0.1.0), against the current header, and against a newer header
#     (newer_header.sh), and each runs against BUILD_DIR's libfp8amp.so.0 with the same fresh random
#     seed. Each checks the canary bytes around every option struct it initializes and uses; the newer
#     one also checks the zero-tail rule; the three digests of the results must be equal. The old
#     binary must need nothing but FP8AMP_0.
#
#   check.sh abidiff BUILD_DIR SOURCE_DIR
#     abidiff (libabigail, Debian's abigail-tools; installed when missing) of the library against the
#     stored ABI of the last release (tests/abi/libfp8amp-0.1.0.abi). Fails on any change that
#     tests/abi/suppressions.ini does not allow (struct growth at the end of the option structs) other
#     than added functions; fails when a symbol of a released version node changed, vanished or was
#     added to it. A library whose SONAME differs from the baseline's (a new major) is not compared:
#     its release stores a new baseline. abidiff needs debug info: when BUILD_DIR's library has none,
#     a CPU-only RelWithDebInfo library is built from SOURCE_DIR in BUILD_DIR/abi-debug (once; later
#     runs rebuild only what changed).
set -euo pipefail
mode=$1
build=$(cd "$2" && pwd)
src=$(cd "$3" && pwd)
here="$src/tests/abi"
baseline_abi="$here/libfp8amp-0.1.0.abi"
lib="$build/libfp8amp.so.0"
[ -e "$lib" ] || { echo "no $lib: build the library first"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

consumers() {
  local cc=${CC:-cc}
  # The current header includes fp8amp/version.h (beside it; BUILD_DIR/include holds CMake's copy).
  local gen="$build/include"
  bash "$here/newer_header.sh" "$src" "$work/newer" "$gen"
  local seed
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  echo "seed $seed"
  local digests=() name inc flags out
  for name in release-0.1.0 current newer; do
    case $name in
      release-0.1.0) inc="$here/0.1.0"; flags="" ;;
      current) inc="$src/capi/include"; flags="-I$gen" ;;
      newer) inc="$work/newer"; flags="-DABI_NEWER" ;;
    esac
    # The build of a user of the library: its header, then -lfp8amp.
    $cc -std=c99 -pedantic -Wall -Wextra -Werror -O2 $flags -I"$inc" "$here/consumer.c" -o "$work/consumer-$name" \
      -L"$build" -lfp8amp -lm -Wl,-rpath,"$build"
    out=$("$work/consumer-$name" "$seed") || { echo "$out"; echo "the $name binary failed"; exit 1; }
    echo "== $name: $out"
    digests+=("$(echo "$out" | sed -n 's/^digest //p')")
  done
  # An old binary records FP8AMP_0 for every fp8amp symbol (and so loads on every 0.x library).
  local nodes
  nodes=$(objdump -T "$work/consumer-release-0.1.0" | awk '/fp8amp_/ {print $(NF-1)}' | sort -u | tr '\n' ' ')
  [ "$nodes" = "(FP8AMP_0) " ] || { echo "the 0.1.0 binary needs version nodes '$nodes', not just FP8AMP_0"; exit 1; }
  [ "${digests[0]}" = "${digests[1]}" ] && [ "${digests[1]}" = "${digests[2]}" ] \
    || { echo "the three builds computed different results: ${digests[*]}"; exit 1; }
  echo "old, current and newer binaries: same results, no byte outside a struct written"
}

ensure_abigail() {
  command -v abidiff >/dev/null && command -v abidw >/dev/null && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "installing abigail-tools (abidiff)"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq abigail-tools && return
  # A machine with no package index (a GPU machine of the device runs): the check cannot run there,
  # which ctest reports as SKIPPED (77), never as passed. tests/run_all.sh, and so CI, installs
  # abigail-tools before it builds, so there it always runs.
  echo "abigail-tools (abidiff) is not installed and cannot be installed here: ABI diff SKIPPED"
  exit 77
}

has_debug_info() { readelf -S "$1" 2>/dev/null | grep -q '\.debug_info'; }

abi_diff() {
  ensure_abigail
  local target=$lib
  if ! has_debug_info "$lib"; then
    local dbg="$build/abi-debug"
    echo "$lib has no debug info: building a RelWithDebInfo CPU library in $dbg"
    cmake -S "$src" -B "$dbg" -G Ninja -DFP8AMP_CUDA=OFF -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
    cmake --build "$dbg" -j2 --target fp8amp >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
    target="$dbg/libfp8amp.so.0"
  fi
  local soname base_soname
  soname=$(readelf -d "$target" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
  base_soname=$(sed -n "s/^<abi-corpus .*soname='\([^']*\)'.*/\1/p" "$baseline_abi" | head -n 1)
  if [ "$soname" != "$base_soname" ]; then
    echo "SONAME $soname is not the baseline's $base_soname: a new major, not compared (store its ABI as the new baseline)"
    return 0
  fi
  # The released node FP8AMP_0 is exactly the baseline's symbols: none removed (abidiff too), none
  # moved to another node, none added to it (a new symbol belongs to the newest node).
  sed -n "s/.*<elf-symbol name='\([^']*\)' version='FP8AMP_0' .*/\1/p" "$baseline_abi" | sort >"$work/base.syms"
  nm -D --defined-only "$target" | awk '{print $3}' | sed -n 's/^\(fp8amp_[^@]*\)@@FP8AMP_0$/\1/p' | sort >"$work/cur.syms"
  if ! diff -u "$work/base.syms" "$work/cur.syms" >"$work/syms.diff"; then
    echo "the symbols of version node FP8AMP_0 changed (- baseline, + this library):"
    cat "$work/syms.diff"
    exit 1
  fi
  [ -s "$work/base.syms" ] || { echo "no FP8AMP_0 symbol in the baseline: $baseline_abi is damaged"; exit 1; }
  # Added functions are allowed (in a new node, checked above); allowed struct growth is suppressed.
  local rc=0
  # No --headers-dir2/--drop-private-types: against the stored XML they made abidiff filter out every
  # change of a struct reached through a pointer (a field inserted in fp8amp_linear_desc went unseen).
  abidiff --no-added-syms --suppressions "$here/suppressions.ini" "$baseline_abi" "$target" \
    >"$work/abidiff.txt" 2>&1 || rc=$?
  cat "$work/abidiff.txt"
  if [ "$rc" -ne 0 ]; then
    # Bits: 1 error, 2 usage, 4 ABI change, 8 incompatible ABI change.
    echo "abidiff exit status $rc: an ABI change within FP8AMP_0 that docs/api.md 1.6 does not allow"
    echo "(or a tool error). Fix it, or, for a real break, bump the major version (SONAME, version node)."
    exit 1
  fi
  echo "ABI of $target: compatible with fp8amp 0.1.0 (FP8AMP_0, $base_soname)"
}

case $mode in
  consumers) consumers ;;
  abidiff) abi_diff ;;
  *) echo "usage: check.sh consumers|abidiff BUILD_DIR SOURCE_DIR"; exit 2 ;;
esac
