#!/usr/bin/env bash
# Times two trees of fp8amp side by side on one GPU, in one run: bench_cast, bench_linear and
# bench_adam of the tree BEFORE (a directory, e.g. from `git archive <commit> | tar x -C dir`) and
# of this tree, alternating, so that a refactoring can be shown to leave the speed as it was
# (issue 16: every ratio within 2%). Each benchmark runs in its own tree, with that tree's scripts
# and library. Logs and JSON go to OUT (default build-compare/); the logs are also packed into
# OUT/logs.tgz, so that one file brings them all back from a remote machine.
# Usage (repository root): BEFORE=dir BEFORE_COMMIT=sha AFTER_COMMIT=sha [OUT=dir] [BENCHES="cast linear adam"]
#   [LINEAR_ARGS="--sections gemm,host"] [TIMEOUT=seconds per benchmark, default 150] bash bench/compare_trees.sh
# CMOCKA_PREFIX, WHEELS: see tests/gpu_env.sh. Builds only the libraries, for sm_90 (H100/H200).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-compare}
mkdir -p "$out"
out=$(cd "$out" && pwd)
. tests/gpu_env.sh
export PYTHONUNBUFFERED=1
before=${BEFORE:?BEFORE=dir of the older tree}
arch=${ARCH:-90-real}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
t0=$(date +%s)
build() {  # src dir
  cmake -S "$1" -B "$2" -G Ninja -DFP8AMP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DFP8AMP_BUILD_TESTS=OFF \
    -DFP8AMP_BUILD_EXAMPLES=OFF >"$out/configure-$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$(( $(nproc) / 2 ))" --target fp8amp >"$out/build-$(basename "$2").log" 2>&1
}
build "$before" "$PWD/build-compare-before" & pb=$!
build "$PWD" "$PWD/build-compare-after" & pa=$!
wait $pb || { echo "the BEFORE tree did not build ($out/build-build-compare-before.log)"; exit 1; }
wait $pa || { echo "this tree did not build ($out/build-build-compare-after.log)"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
failed=0
run() {  # tag tree lib commit bench args...
  local tag=$1 tree=$2 lib=$3 commit=$4 name=$5 s rc
  shift 5
  s=$(date +%s)
  (cd "$tree" && timeout "${TIMEOUT:-150}" python3 -X faulthandler "bench/bench_$name.py" --lib "$lib" \
    --out "$out/$name-$tag.json" --commit "$commit" "$@") >"$out/$name-$tag.log" 2>&1
  rc=$?
  echo "$name $tag rc=$rc $(( $(date +%s) - s )) s"
  [ $rc = 0 ] || { failed=1; tail -5 "$out/$name-$tag.log"; }
}
for name in ${BENCHES:-cast linear adam}; do
  args=()
  [ "$name" = linear ] && read -r -a args <<<"${LINEAR_ARGS:---sections gemm,host}"
  run before "$before" "$PWD/build-compare-before/libfp8amp.so" "${BEFORE_COMMIT:-unknown}" "$name" "${args[@]}"
  run after "$PWD" "$PWD/build-compare-after/libfp8amp.so" "${AFTER_COMMIT:-unknown}" "$name" "${args[@]}"
done
python3 bench/compare_results.py "$out" | tee "$out/compare.txt"
tar czf "$out/logs.tgz" -C "$out" --exclude logs.tgz .
echo "total $(( $(date +%s) - t0 )) s"
exit $failed
