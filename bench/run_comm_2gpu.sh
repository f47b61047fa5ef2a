#!/usr/bin/env bash
# Issue 17 on a machine with 2 GPUs. The short sweep (on the device machine, from the repository
# root; several minutes with the build and the tests, about 2 less with TESTS=0 on a second run):
#
#   OUT=$OUT SWEEP=quick COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown) bash bench/run_comm_2gpu.sh
#
# writes $OUT/comm-2gpu-quick.json (every group's results and the summary: fp8amp per group and
# variant against that group's NCCL bf16 and native E4M3), $OUT/comm-2gpu-quick.*.json (one per
# group) and $OUT/comm-2gpu.tgz (every log). The quick sweep: groups default (the library's default
# setup: the all-reduce's scratch an NCCL symmetric window on a split communicator with CTAPolicy
# NCCL_CTA_POLICY_ZERO, and for two ranks the peer writes -- each rank stores the other's codes in
# its window, 16-byte copy-engine all-gathers order the ranks) and plain (FP8AMP_COMM_NCCL_MEMORY=plain:
# NCCL's kernels for the all-gathers of the codes); in each, the library's default schedule (4 equal
# pieces of each rank's 128M-element chunk), pieces of 16M and 64M elements, the taper 2, and copies
# (FP8AMP_COMM_PEER_WRITES=0: the copy-engine all-gathers of the codes instead of the peer writes).
# FP8AMP_COMM_PIECE_ELEMENTS, FP8AMP_COMM_PIECE_TAPER and FP8AMP_COMM_PEER_WRITES (read at every
# call) are the knobs (core/communicator.cpp; docs/communicator.md "Pipeline", "Peer writes").
#
# Without SWEEP=quick (about 6-9 minutes): the longer sweep below (grids, sendrecv, NCCL p2p
# settings, registered memory).
#
#   OUT=/some/dir COMMIT=$(git rev-parse --short HEAD) bash bench/run_comm_2gpu.sh
#
# Either way it first builds fp8amp with CUDA and NCCL (incrementally in build-gpu/) and runs the
# two-rank tests of the communicator and of the sharded optimizer (bytes against the CPU model; again
# with FP8AMP_COMM_NCCL_MEMORY=plain), the one-rank GPU/CPU tests and cuda.comm_codec (the hardware
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

# The two-rank tests: bytes against the CPU model, over NCCL (the default two-rank data path: the
# peer writes), in pieces of 48 elements, with grouped ncclSend/ncclRecv (FP8AMP_COMM_EXCHANGE=sendrecv)
# and a bounded grid, and with the copies (FP8AMP_COMM_PEER_WRITES=0); the sharded optimizer; the
# one-rank GPU/CPU bytes.
if [ "${TESTS:-1}" != 0 ]; then
(cd build-gpu && FP8AMP_RUN_RANKS_TIMEOUT=100 timeout 400 ctest --output-on-failure -R \
  '^(optimizer\.shard\.cuda\.ranks\.np2|comm\.cuda\.ranks\.np2|comm\.cuda\.ranks\.pieces\.np2|comm\.cuda\.ranks\.sendrecv\.np2|comm\.cuda\.ranks\.copies\.np2|capi\.test_comm|capi\.test_comm\.pieces|capi\.test_comm_nan|cuda\.comm_codec)$' \
  > "$X/ctest.log" 2>&1)
echo "ctest rc=$?"
grep -E "Test +#|tests passed|FAIL" "$X/ctest.log" | head -20
# The same two-rank tests with the plain setup (FP8AMP_COMM_NCCL_MEMORY=plain: no window, so no peer
# writes and no copy engines; the side channel's timeout bounds a hang at 30 s a test).
(cd build-gpu && FP8AMP_COMM_NCCL_MEMORY=plain FP8AMP_TEST_CHANNEL_TIMEOUT=30 FP8AMP_RUN_RANKS_TIMEOUT=100 timeout 200 ctest --output-on-failure -R \
  '^(comm\.cuda\.ranks\.np2|comm\.cuda\.ranks\.pieces\.np2)$' > "$X/ctest-plain.log" 2>&1)
echo "ctest (FP8AMP_COMM_NCCL_MEMORY=plain) rc=$?"
grep -E "Test +#|tests passed|FAIL" "$X/ctest-plain.log" | head -6
fi
echo "ctest $(( $(date +%s) - t0 )) s"

# The sweep. Variants (fp8amp's per-call variables, core/communicator.cpp; the default is
# FP8AMP_COMM_PEER_WRITES unset -- two ranks with a mapped window: the peer writes --,
# FP8AMP_COMM_EXCHANGE=auto -- two ranks: the all-gather layout for both halves --,
# FP8AMP_COMM_GRID_BLOCKS=0 -- unbounded grids of blocks that retire --, and pieces of max(C/4, 4M)
# elements with C the 128M-element chunk of each rank, i.e. 4 pieces):
#  - pieces of 4M, 16M, 32M elements (32, 8, 4 pieces) and one piece (no overlap at all);
#  - the conversions' grid beside a transfer bounded to 66, 100, 120 blocks (of 132 multiprocessors
#    on H100 SXM and H200: the rest stay free for NCCL), also with pieces of 16M and 32M;
#  - the reduce-scatter half as grouped ncclSend/ncclRecv (sendrecv; no self-copy any more, the
#    all-gather half through ncclAllGather), also with a bounded grid;
#  - copies: FP8AMP_COMM_PEER_WRITES=0 (the copy-engine all-gathers of the codes).
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
#  - plain: FP8AMP_COMM_NCCL_MEMORY=plain (the default setup is the window: the all-reduce's scratch
#    a symmetric window on a split communicator with CTAPolicy NCCL_CTA_POLICY_ZERO, whose all-gathers
#    NCCL 2.28 runs on copy engines with no blocks at all, and, for two ranks, the peer writes).
# A group that fails or hangs (--hang-s) is reported and the others still count.
# NCCL's INIT lines (channel counts: "... coll channels, ... p2p channels, ... p2p channels per peer")
# go to $X/nccl/ for every process.
if [ "${SWEEP:-}" = quick ]; then
  : "${PIECES:=16777216,67108864}"
  : "${VARIANTS:=taper2:FP8AMP_COMM_PIECE_TAPER=2;copies:FP8AMP_COMM_PEER_WRITES=0}"
  : "${NCCL_ENVS:=default;plain:FP8AMP_COMM_NCCL_MEMORY=plain}"
  NAME=comm-2gpu-quick
else
  NAME=comm-2gpu
fi
mkdir -p "$X/nccl"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$X/nccl/%h.%p.log" timeout 480 \
  python3 -X faulthandler bench/bench_comm.py --hang-s 100 --lib build-gpu/libfp8amp.so --elements "$ELEMENTS" \
  --out "$X/$NAME.json" --commit "$COMMIT" \
  --piece-elements ${PIECES:-4194304,16777216,33554432,134217728} \
  --variants "${VARIANTS-grid66:FP8AMP_COMM_GRID_BLOCKS=66;grid100:FP8AMP_COMM_GRID_BLOCKS=100;grid120:FP8AMP_COMM_GRID_BLOCKS=120;piece16M.grid100:FP8AMP_COMM_PIECE_ELEMENTS=16777216,FP8AMP_COMM_GRID_BLOCKS=100;piece32M.grid100:FP8AMP_COMM_PIECE_ELEMENTS=33554432,FP8AMP_COMM_GRID_BLOCKS=100;sendrecv:FP8AMP_COMM_EXCHANGE=sendrecv;sendrecv.grid100:FP8AMP_COMM_EXCHANGE=sendrecv,FP8AMP_COMM_GRID_BLOCKS=100;copies:FP8AMP_COMM_PEER_WRITES=0}" \
  --nccl-env "${NCCL_ENVS:-default;p2p:NCCL_MIN_P2P_NCHANNELS=64,NCCL_P2P_NVL_CHUNKSIZE=1048576;cta16:NCCL_MAX_CTAS=16;reg:FP8AMP_COMM_NCCL_MEMORY=register;plain:FP8AMP_COMM_NCCL_MEMORY=plain}" \
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
