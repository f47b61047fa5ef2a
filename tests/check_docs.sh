#!/usr/bin/env bash
# The documentation check (CI: tests/run_all.sh runs it; needs doxygen, Debian: apt-get install doxygen).
#   1. The C API reference builds from the public header's comments with Doxygen (target fp8amp_docs,
#      WARN_AS_ERROR): every function, type, enumerator and macro is documented, and no comment
#      names a parameter that does not exist.
#   2. Every function the header declares is in the generated reference.
#   3. docs/api.md keeps conventions and guides only: no per-function section ("### `fp8amp_...`"),
#      whose statuses would be a second copy of the header's.
# Usage: check_docs.sh [SOURCE_DIR [BUILD_DIR]] (default: this repository, SOURCE_DIR/build-docs).
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
build=${2:-$src/build-docs}
if ! command -v doxygen >/dev/null; then
  # As tests/abi/check.sh does for abidiff: install it where apt can (CI), else fail (never skip).
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "check_docs: installing doxygen"
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq doxygen; } \
    || { echo "check_docs: doxygen is not installed and apt could not install it (apt-get install doxygen)"; exit 1; }
fi
cmake -S "$src" -B "$build" -G Ninja -DFP8AMP_CUDA=OFF -DFP8AMP_BUILD_TESTS=OFF -DFP8AMP_BUILD_EXAMPLES=OFF \
  -DFP8AMP_BUILD_DOCS=ON >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
rm -f "$build.configure.log"
cmake --build "$build" --target fp8amp_docs
html="$build/docs/html"
missing=()
for f in $(sed -n 's/.*FP8AMP_API[^(]*[ (*]\(fp8amp_[a-z0-9_]*\))\{0,1\}(.*/\1/p' "$src/capi/include/fp8amp/fp8amp.h" | sort -u); do
  grep -q "$f" "$html"/group__*.html || missing+=("$f")
done
[ ${#missing[@]} -eq 0 ] || { echo "check_docs: not in the generated reference: ${missing[*]}"; exit 1; }
n=$(sed -n 's/.*FP8AMP_API[^(]*[ (*]\(fp8amp_[a-z0-9_]*\))\{0,1\}(.*/\1/p' "$src/capi/include/fp8amp/fp8amp.h" | sort -u | wc -l)
if grep -n '^###* `fp8amp_' "$src/docs/api.md"; then
  echo "check_docs: docs/api.md has per-function sections (above): the reference is generated from fp8amp.h;"
  echo "put per-function detail into the header's comments and keep conventions and guides in api.md"
  exit 1
fi
echo "check_docs: C API reference generated without warnings ($n functions) in $html; docs/api.md has no per-function copy"
