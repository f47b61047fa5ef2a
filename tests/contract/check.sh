#!/usr/bin/env bash
# Checks that each fact of the public contract that is written down twice agrees with its one
# source (ctest: contract.*).
#
#   check.sh version-map VERSION MAP
#     The linker map's newest version node (cmake/fp8amp.map) is the node of VERSION (CMake's
#     project version): FP8AMP_<major>.<minor>, or FP8AMP_<major> for the major's first release
#     (0.1 for major 0, M.0 otherwise). A release that bumps the minor needs a new node for its new
#     symbols (docs/api.md 1.6); the released nodes themselves are checked by tests/abi.
#   check.sh version-header VERSION INCLUDE_DIR
#     INCLUDE_DIR/fp8amp/version.h defines VERSION's major, minor and patch.
#   check.sh dlpack SOURCE_DIR
#     capi/include/fp8amp/dlpack.h is DLPack v1.1's header byte for byte (dmlc/dlpack, tag v1.1,
#     include/dlpack/dlpack.h, git blob 5533f74f...): update it by copying a release, never by editing.
set -euo pipefail
mode=${1:-}
fail() { echo "FAIL: $*"; exit 1; }
split_version() {
  [[ $1 =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] || fail "'$1' is not MAJOR.MINOR.PATCH"
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} patch=${BASH_REMATCH[3]}
}
case $mode in
  version-map)
    split_version "$2"
    # Node names in the order they appear, comments stripped.
    nodes=$(sed -e 's|/\*.*\*/||g' "$3" | sed -e '/\/\*/,/\*\//d' | sed -n 's/^\(FP8AMP_[0-9][0-9.]*\)[[:space:]]*{.*/\1/p')
    [ -n "$nodes" ] || fail "$3 has no version node"
    newest=$(echo "$nodes" | tail -n 1)
    first_minor=0
    [ "$major" -eq 0 ] && first_minor=1
    if [ "$minor" -eq "$first_minor" ]; then want="FP8AMP_$major"; else want="FP8AMP_$major.$minor"; fi
    [ "$newest" = "$want" ] || fail "the project version is $2, so the newest version node of $3 must be $want; it is $newest (add the node $want {...} for the symbols this release adds)"
    echo "version $2: newest version node $newest"
    ;;
  version-header)
    split_version "$2"
    h="$3/fp8amp/version.h"
    [ -f "$h" ] || fail "no $h (CMake copies capi/include/fp8amp/version.h there)"
    for part in MAJOR:$major MINOR:$minor PATCH:$patch; do
      grep -qE "^#define FP8AMP_VERSION_${part%%:*} ${part#*:}\$" "$h" || fail "$h does not define FP8AMP_VERSION_${part%%:*} ${part#*:}"
    done
    echo "version $2: $h agrees"
    ;;
  dlpack)
    f="$2/capi/include/fp8amp/dlpack.h"
    want=5533f74f7160a36739d552f1229c4494d08a6198
    got=$({ printf 'blob %d\0' "$(wc -c <"$f")"; cat "$f"; } | sha1sum | cut -d' ' -f1)
    [ "$got" = "$want" ] || fail "$f is not DLPack v1.1's include/dlpack/dlpack.h (git blob $got, want $want)"
    [ -f "$2/capi/include/fp8amp/LICENSE.dlpack" ] || fail "DLPack's license (capi/include/fp8amp/LICENSE.dlpack) is missing"
    echo "$f: DLPack v1.1's header, verbatim"
    ;;
  *) echo "usage: check.sh version-map VERSION MAP | version-header VERSION INCLUDE_DIR | dlpack SOURCE_DIR"; exit 2 ;;
esac
