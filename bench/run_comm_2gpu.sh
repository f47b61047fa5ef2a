#!/usr/bin/env bash
# Issue 17 on a machine with 2 GPUs. The short sweep (not timed yet; estimated 5-8 minutes with the
# build and the tests, about 2 less with TESTS=0 on a second run; on the device machine, from the
# repository root):
#
#   OUT=$OUT SWEEP=quick COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown) bash bench/run_comm_2gpu.sh
#
# writes $OUT/comm-2gpu-quick.json (every group's results and the summary: fp8amp per group and piece
# size against that group's NCCL bf16 and native E4M3), $OUT/comm-2gpu-quick.*.json (one per group)
# and $OUT/comm-2gpu.tgz (every log). The quick sweep: groups default (the plain NCCL setup, NCCL's
# kernels for the all-gathers), window (FP8AMP_COMM_NCCL_MEMORY=window, opt-in: the all-reduce's
# scratch a symmetric window on a split communicator with CTAPolicy NCCL_CTA_POLICY_ZERO, i.e.
# copy-engine all-gathers), simple (the plain setup with NCCL_PROTO=Simple for those kernels, which
# picked LL before; copy-engine collectives have no protocol, so Simple matters only without them);
# in each, the
# library's default schedule (P = 3C/8 = 48M elements of each rank's 128M-element chunk with the
# taper D = 3: pieces of 16M, 48M, 48M, 16M), pieces of 32M, 48M and 64M with the default taper
# (32M: 10.7M + 4 x 26.7M + 10.7M; 64M: 21M + 2 x 43M + 21M), the taper's variants taper1 (no taper:
# 48M, 48M, 32M), taper2 (edges of 24M: 24M + 2 x 40M + 24M), taper4 (edges of 12M: 12M + 3 x 34.7M +
# 12M), p64M.taper4 (16M + 2 x 48M + 16M, the default's pieces by another P), p64M.taper8 (8M + 2 x
# 56M + 8M), p32M.taper2 (16M + 3 x 32M + 16M) and old4x32M (4 equal pieces of 32M: the default before
# the taper). FP8AMP_COMM_PIECE_ELEMENTS and FP8AMP_COMM_PIECE_TAPER (read at every call) are the
# two knobs (core/communicator.cpp, piece_bounds; docs/communicator.md "Pipeline").
#
# Without SWEEP=quick (about 6-9 minutes): the longer sweep below (grids, sendrecv, NCCL p2p
# settings, registered memory).
#
#   OUT=/some/dir COMMIT=$(git rev-parse --short HEAD) bash bench/run_comm_2gpu.sh
#
# Either way it first builds fp8amp with CUDA and NCCL (incrementally in build-gpu/) and runs the
# two-rank tests of the communicator and of the sharded optimizer (bytes against the CPU model; again
# with FP8AMP_COMM_NCCL_MEMORY=window), the one-rank GPU/CPU tests and cuda.comm_codec (the hardware
# codec against the software one); a failed test is reported ("ctest rc=") but does not stop the
# sweep; TESTS=0 skips them (a second run on the same machine). What to look at is printed on stdout.
#
# Environment: OUT (required), SWEEP (quick, or empty for the long sweep), TESTS (0: no ctest), COMMIT (recorded in the
# JSON), CMOCKA_PREFIX (default $PWD/.deps/cmocka/usr), WHEELS (default $PWD/.deps/wheels, when
# present: cffi for the bench's binding), JOBS (build parallelism, default: every core), ELEMENTS
# (default 268435456: 256M BF16 gradients, the size of the earlier measurements in
# docs/communicator.md); PIECES, VARIANTS, NCCL_ENVS: another sweep (same syntax as below).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a directory for the results}"
export CMOCKA_PREFIX=${CMOCKA_PREFIX:-$PWD/.deps/cmocka/usr}
if [ -z "${WHEELS:-}" ] && [ -d .deps/wheels ]; then export WHEELS=$PWD/.deps/wheels; fi
. tests/gpu_env.sh
export PYTHONUNBUFFERED=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
COMMIT=${COMMIT:-unknown}
JOBS=${JOBS:-$(nproc)}
ELEMENTS=${ELEMENTS:-268435456}
X=$OUT/comm-2gpu
mkdir -p "$X"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m > "$X/topo.txt" 2>&1

cmake -S . -B build-gpu -G Ninja -DFP8AMP_CUDA=ON -DFP8AMP_NCCL=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
  -DFP8AMP_MPI=OFF -DFP8AMP_BUILD_TESTS=ON -DFP8AMP_BUILD_EXAMPLES=OFF "${prefix_args[@]}" > "$X/configure.log" 2>&1 &&
  cmake --build build-gpu -j"$JOBS" --target fp8amp test_comm test_comm_nan test_comm_ranks test_optimizer_shard_ranks \
    test_rank_channel test_comm_codec > "$X/build.log" 2>&1 || {
  grep -B2 -A8 -E "error|Error" "$X/build.log" "$X/configure.log" | head -60
  tar czf "$OUT/comm-2gpu.tgz" -C "$OUT" comm-2gpu
  exit 1
}
echo "build $(( $(date +%s) - t0 )) s"

# The two-rank tests: bytes against the CPU model, over NCCL (the default two-rank data path: one
# all-gather a piece for both halves), in pieces of 48 elements, and with grouped ncclSend/ncclRecv
# (FP8AMP_COMM_EXCHANGE=sendrecv) and a bounded grid; the sharded optimizer; the one-rank GPU/CPU bytes.
if [ "${TESTS:-1}" != 0 ]; then
(cd build-gpu && FP8AMP_RUN_RANKS_TIMEOUT=100 timeout 400 ctest --output-on-failure -R \
  '^(optimizer\.shard\.cuda\.ranks\.np2|comm\.cuda\.ranks\.np2|comm\.cuda\.ranks\.pieces\.np2|comm\.cuda\.ranks\.sendrecv\.np2|capi\.test_comm|capi\.test_comm\.pieces|capi\.test_comm_nan|cuda\.comm_codec)$' \
  > "$X/ctest.log" 2>&1)
echo "ctest rc=$?"
grep -E "Test +#|tests passed|FAIL" "$X/ctest.log" | head -20
# The same two-rank tests with the opt-in copy-engine setup (FP8AMP_COMM_NCCL_MEMORY=window; its
# lost-rank case hung on 2 H100s before, docs/communicator.md: the side channel's timeout bounds that
# at 30 s a test).
(cd build-gpu && FP8AMP_COMM_NCCL_MEMORY=window FP8AMP_TEST_CHANNEL_TIMEOUT=30 FP8AMP_RUN_RANKS_TIMEOUT=100 timeout 200 ctest --output-on-failure -R \
  '^(comm\.cuda\.ranks\.np2|comm\.cuda\.ranks\.pieces\.np2)$' > "$X/ctest-window.log" 2>&1)
echo "ctest (FP8AMP_COMM_NCCL_MEMORY=window) rc=$?"
grep -E "Test +#|tests passed|FAIL" "$X/ctest-window.log" | head -6
fi
echo "ctest $(( $(date +%s) - t0 )) s"

# The sweep. Variants (fp8amp's per-call variables, core/communicator.cpp; the default is
# FP8AMP_COMM_EXCHANGE=auto -- two ranks: one all-gather a piece for both halves --,
# FP8AMP_COMM_GRID_BLOCKS=0 -- unbounded grids of blocks that retire --, and pieces of max(C/4, 4M)
# elements with C the 128M-element chunk of each rank, i.e. 4 pieces):
#  - pieces of 4M, 16M, 32M elements (32, 8, 4 pieces) and one piece (no overlap at all);
#  - the conversions' grid beside a transfer bounded to 66, 100, 120 blocks (of 132 multiprocessors
#    on H100 SXM and H200: the rest stay free for NCCL), also with pieces of 16M and 32M;
#  - the reduce-scatter half as grouped ncclSend/ncclRecv (sendrecv; no self-copy any more, the
#    all-gather half through ncclAllGather), also with a bounded grid.
# NCCL groups (fresh processes each; NCCL reads its variables when a communicator is made):
#  - default;
#  - p2p: NCCL_MIN_P2P_NCHANNELS=64 NCCL_P2P_NVL_CHUNKSIZE=1048576 (for ncclSend/ncclRecv, so only the
#    sendrecv variants use them: 32 blocks an operation instead of the default's probably 16 -- NCCL
#    2.28 gives a two-rank operation half the p2p channels, which are as many as the collective
#    channels rounded up to a power of 2 -- and 1 MB steps instead of 512 kB; docs/communicator.md);
#  - cta16: NCCL_MAX_CTAS=16 (fewer blocks for NCCL's collectives, more multiprocessors for the
#    conversions beside them);
#  - reg (experimental, last because it may fail): FP8AMP_COMM_NCCL_MEMORY=register, the scratch from
#    ncclMemAlloc registered with ncclCommRegister (zero-copy ncclSend/ncclRecv: the sendrecv variants);
#  - window: FP8AMP_COMM_NCCL_MEMORY=window, the opt-in copy-engine setup (the all-reduce's scratch a
#    symmetric window on a split communicator with CTAPolicy NCCL_CTA_POLICY_ZERO, whose all-gathers
#    NCCL 2.28 runs on copy engines with no blocks at all, docs/communicator.md).
# A group that fails or hangs (--hang-s) is reported and the others still count.
# NCCL's INIT lines (channel counts: "... coll channels, ... p2p channels, ... p2p channels per peer")
# go to $X/nccl/ for every process.
if [ "${SWEEP:-}" = quick ]; then
  : "${PIECES:=33554432,50331648,67108864}"
  : "${VARIANTS:=old4x32M:FP8AMP_COMM_PIECE_ELEMENTS=33554432,FP8AMP_COMM_PIECE_TAPER=1;taper1:FP8AMP_COMM_PIECE_TAPER=1;taper2:FP8AMP_COMM_PIECE_TAPER=2;taper4:FP8AMP_COMM_PIECE_TAPER=4;p64M.taper4:FP8AMP_COMM_PIECE_ELEMENTS=67108864,FP8AMP_COMM_PIECE_TAPER=4;p64M.taper8:FP8AMP_COMM_PIECE_ELEMENTS=67108864,FP8AMP_COMM_PIECE_TAPER=8;p32M.taper2:FP8AMP_COMM_PIECE_ELEMENTS=33554432,FP8AMP_COMM_PIECE_TAPER=2}"
  : "${NCCL_ENVS:=default;window:FP8AMP_COMM_NCCL_MEMORY=window;simple:NCCL_PROTO=Simple}"
  NAME=comm-2gpu-quick
else
  NAME=comm-2gpu
fi
mkdir -p "$X/nccl"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$X/nccl/%h.%p.log" timeout 480 \
  python3 -X faulthandler bench/bench_comm.py --hang-s 100 --lib build-gpu/libfp8amp.so --elements "$ELEMENTS" \
  --out "$X/$NAME.json" --commit "$COMMIT" \
  --piece-elements ${PIECES:-4194304,16777216,33554432,134217728} \
  --variants "${VARIANTS-grid66:FP8AMP_COMM_GRID_BLOCKS=66;grid100:FP8AMP_COMM_GRID_BLOCKS=100;grid120:FP8AMP_COMM_GRID_BLOCKS=120;piece16M.grid100:FP8AMP_COMM_PIECE_ELEMENTS=16777216,FP8AMP_COMM_GRID_BLOCKS=100;piece32M.grid100:FP8AMP_COMM_PIECE_ELEMENTS=33554432,FP8AMP_COMM_GRID_BLOCKS=100;sendrecv:FP8AMP_COMM_EXCHANGE=sendrecv;sendrecv.grid100:FP8AMP_COMM_EXCHANGE=sendrecv,FP8AMP_COMM_GRID_BLOCKS=100}" \
  --nccl-env "${NCCL_ENVS:-default;p2p:NCCL_MIN_P2P_NCHANNELS=64,NCCL_P2P_NVL_CHUNKSIZE=1048576;cta16:NCCL_MAX_CTAS=16;reg:FP8AMP_COMM_NCCL_MEMORY=register;window:FP8AMP_COMM_NCCL_MEMORY=window}" \
  > "$X/bench.log" 2>&1
rc=$?
echo "bench rc=$rc"
# Each group's header and baselines, then the summary (every fp8amp variant of every group, sorted
# by time, against its group's NCCL bf16 and native E4M3); the per-group tables are in bench.log.
grep -E "^== group|^nccl\.(bf16|e4m3\.wire) |^fp8amp\.e4m3(\.nocheck)? " "$X/bench.log" | head -40
sed -n '/^== summary/,$p' "$X/bench.log" | head -90
[ "$rc" = 0 ] || tail -40 "$X/bench.log"
# NCCL's channel counts and the variables it took from each group's environment.
grep -h -E "channels per peer|set by environment to" "$X"/nccl/*.log 2>/dev/null | sed 's/^.*NCCL INFO //' |
  sort | uniq -c | head -20
# The JSON beside the archive too.
cp "$X"/"$NAME"*.json "$OUT"/ 2>/dev/null
ls "$OUT"/"$NAME"*.json 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
tar czf "$OUT/comm-2gpu.tgz" -C "$OUT" comm-2gpu && rm -rf "$X"
