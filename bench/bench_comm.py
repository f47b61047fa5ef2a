"""fp8amp's FP8 gradient all-reduce against NCCL on the same GPUs, in one run (issue 17).

    python3 bench/bench_comm.py --lib build/libfp8amp.so --out comm.json [--elements 268435456]
                                [--nranks 2] [--commit sha] [--variants ...] [--nccl-env ...]

Starts one process per GPU (rank r on cuda:r). Every rank holds its own BF16 "gradients" (normal
values with a few orders of magnitude of spread, different on every rank), and each method reduces
the same data to the mean over ranks, out of place, timed with CUDA events on the rank's stream
(median of the iterations; every rank waits for the others before each method):

- ``nccl.bf16``, ``nccl.f32``: ncclAllReduce SUM of the BF16 data, and of it converted to F32 (the
  conversion not timed), then the division by N (timed, as a framework must do it);
- ``nccl.e4m3.wire``: ncclAllReduce SUM with NCCL's native ncclFloat8e4m3 of data already in E4M3:
  the wire alone, no amax, no cast (the floor for any FP8 all-reduce on these links);
- ``nccl.e4m3.torch_casts``: what a framework does with native E4M3 for BF16 gradients: amax, an
  all-reduce MAX of it, cast to E4M3 with scale 448 / (amax * N) (so that the sum cannot overflow),
  ncclAllReduce SUM in E4M3, cast back to BF16 and unscale (eager torch ops, unfused);
- ``nccl.e4m3.compiled_casts``: the same with the three casts under torch.compile (one fused kernel
  each): the fastest native E4M3 all-reduce of BF16 data a framework gets, the fair peer of fp8amp's;
- ``fp8amp.e4m3``: fp8amp_comm_all_reduce of the BF16 tensor into a BF16 output (agreed scales, one
  per scale region of each rank's chunk, the later regions' agreed while earlier pieces move,
  quantize, FP8 reduce-scatter, FP32 accumulation in rank order, requantize, FP8 all-gather,
  dequantize: all included), with the cross-rank argument check (``check=1``, the default) and
  without it (``check=0``).

The sweep (one run answers which configuration is fastest): ``--variants`` times fp8amp (check=0)
once more per variant, each a set of fp8amp's per-call environment variables (FP8AMP_COMM_EXCHANGE,
FP8AMP_COMM_GRID_BLOCKS, FP8AMP_COMM_PIECE_ELEMENTS, FP8AMP_COMM_PEER_WRITES: core/communicator.cpp),
e.g. ``--variants 'copies:FP8AMP_COMM_PEER_WRITES=0'`` for the copy-engine path beside the default peer
writes, and checks that it
gives the default's bytes; ``--nccl-env`` repeats the whole thing in a fresh group of processes per
NCCL environment (NCCL reads its variables when a communicator is made), with its own NCCL bf16 and
native E4M3 baselines. The first group also times NCCL f32, native E4M3 with torch casts, fp8amp with
the check and profiles fp8amp's kernels; the others only what the comparison needs.

NCCL is called through ctypes on the libnccl loaded in the process (torch's; libfp8amp's libnccl.so.2
resolves to it, so that every method uses one NCCL build); torch.distributed (gloo) only exchanges the ids and the results. Errors are measured
against the exact mean (the F32 sum of BF16 values of up to 8 ranks is exact here: their exponents
span far less than F32's 24 bits), as a relative RMS and as the largest error over the largest |mean|.
Bus bandwidth is NCCL's definition, (bytes / time) * 2 (N - 1) / N, with the bytes the data type
puts on the wire (2 for BF16, 1 for FP8); fp8amp's is also given as a fraction of NCCL BF16's.
"""
import argparse
import ctypes
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NCCL_SUM, NCCL_MAX = 0, 2
NCCL_FLOAT32, NCCL_BF16, NCCL_E4M3 = 7, 9, 10  # ncclDataType_t (nccl.h 2.24+)


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]  # not c_char: its value would stop at the first NUL


def nccl_path():
    """The libnccl already loaded in this process (torch's, which libfp8amp's libnccl.so.2 also
    resolves to once torch is imported: the loader matches the soname), so that every method runs
    on one NCCL build; a second copy loaded by path would be another NCCL instance in the process."""
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if re.search(r"/libnccl\.so", line)})
    if not paths:
        raise SystemExit("no libnccl is loaded in this process (libfp8amp built without NCCL?)")
    return paths[0]


class Nccl:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        self.version = v.value
        self.lib.ncclCommInitRank.argtypes = [ctypes.c_void_p, ctypes.c_int, NcclUniqueId, ctypes.c_int]
        self.lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p

    def check(self, r, what):
        if r != 0:
            raise RuntimeError(f"{what}: {self.lib.ncclGetErrorString(r).decode()}")

    def unique_id(self):
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), 128)

    def comm(self, uid_bytes, nranks, rank):
        uid = NcclUniqueId()
        ctypes.memmove(ctypes.byref(uid), uid_bytes, 128)
        c = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(c), nranks, uid, rank), "ncclCommInitRank")
        self.c = c

    def all_reduce(self, src, dst, dtype, op):
        self.check(self.lib.ncclAllReduce(src.data_ptr(), dst.data_ptr(), src.numel(), dtype, op, self.c,
                                          torch.cuda.current_stream().cuda_stream), "ncclAllReduce")


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)  # µs
    dist.barrier()
    return statistics.median(times), times


def errors(y, exact):
    d = (y.float() - exact)
    return {"rel_rms": float(d.norm() / exact.norm()), "max_err_over_amax": float(d.abs().max() / exact.abs().max()),
            "nonfinite": int((~torch.isfinite(y)).sum())}


def rank_main(rank, args, store):
    import faulthandler
    import traceback
    faulthandler.enable()
    faulthandler.dump_traceback_later(args.hang_s, exit=True)  # a hung rank shows where it hangs
    try:
        run_rank(rank, args, store)
    except BaseException:
        print(f"[rank {rank}] " + traceback.format_exc(), file=sys.stderr, flush=True)
        raise


def run_rank(rank, args, store):
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.nranks)
    N, n = args.nranks, args.elements
    from fp8amp_bench import Lib
    L = Lib(args.lib)
    fp8amp = L.fp8amp
    nccl = Nccl(nccl_path())
    box = [nccl.unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    nccl.comm(box[0], N, rank)

    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    # Normal values times a per-block power of two in [2^-6, 2^2]: gradients of different layers.
    x = torch.randn(n, device="cuda", generator=g)
    blocks = torch.randint(-6, 3, ((n + 65535) // 65536,), device="cuda", generator=g).float().exp2()
    x = (x * blocks.repeat_interleave(65536)[:n]).to(torch.bfloat16)
    del blocks
    exact = torch.empty(n, device="cuda")
    nccl.all_reduce(x.float(), exact, NCCL_FLOAT32, NCCL_SUM)
    torch.cuda.synchronize()
    exact /= N
    out = torch.empty_like(x)
    res = {}

    def record(name, fn, y):
        """y: the result tensor, or a function giving it (evaluated after the timed calls)."""
        med, all_t = timed(fn, args.iters, args.warmup)
        res[name] = {"us": med, "all_us": all_t, **errors(y() if callable(y) else y, exact)}

    record("nccl.bf16", lambda: (nccl.all_reduce(x, out, NCCL_BF16, NCCL_SUM), out.div_(N)), out)
    if args.full:
        x32, out32 = x.float(), torch.empty(n, device="cuda")
        record("nccl.f32", lambda: (nccl.all_reduce(x32, out32, NCCL_FLOAT32, NCCL_SUM), out32.div_(N)), out32)
        del x32, out32
    amax0 = x.abs().max().float()
    q = (x.float() * (448.0 / (amax0 * N))).to(torch.float8_e4m3fn)
    qo = torch.empty_like(q)
    record("nccl.e4m3.wire", lambda: nccl.all_reduce(q, qo, NCCL_E4M3, NCCL_SUM),
           lambda: (qo.float() * (amax0 * N / 448.0)) / N)

    amax = torch.empty(1, device="cuda")

    def native_casts():
        amax.copy_(torch.linalg.vector_norm(x, float("inf")))
        nccl.all_reduce(amax, amax, NCCL_FLOAT32, NCCL_MAX)
        scale = 448.0 / (amax * N)
        qq = x.float().mul_(scale).to(torch.float8_e4m3fn)  # eager torch: unfused casts
        nccl.all_reduce(qq, qq, NCCL_E4M3, NCCL_SUM)
        torch.mul(qq.float(), 1.0 / (scale * N), out=out)
    if args.full:
        record("nccl.e4m3.torch_casts", native_casts, out)

    # The same with the casts compiled (torch.compile: inductor fuses the amax, the scaled cast and the
    # cast back into one kernel each), the fastest a framework gets from native E4M3 for BF16 data: the
    # fair peer of fp8amp's all-reduce, whose time includes its own quantize and dequantize.
    amax_fn = torch.compile(lambda t: t.abs().amax().float().reshape(1))
    quant_fn = torch.compile(lambda t, a: (t.float() * (448.0 / (a * N))).to(torch.float8_e4m3fn))
    dequant_fn = torch.compile(lambda t, a: (t.float() * (a / 448.0)).to(torch.bfloat16))  # (a N / 448) / N
    compiled_out = {}

    def native_compiled_casts():
        amax.copy_(amax_fn(x))
        nccl.all_reduce(amax, amax, NCCL_FLOAT32, NCCL_MAX)
        qq = quant_fn(x, amax)
        nccl.all_reduce(qq, qq, NCCL_E4M3, NCCL_SUM)
        compiled_out["y"] = dequant_fn(qq, amax)
    if args.full:
        import faulthandler
        faulthandler.dump_traceback_later(args.hang_s + 600, exit=True)  # compiling takes a while, once
        native_compiled_casts()
        torch.cuda.synchronize()
        faulthandler.dump_traceback_later(args.hang_s, exit=True)
        record("nccl.e4m3.compiled_casts", native_compiled_casts, lambda: compiled_out["y"])
        compiled_out.clear()
    del q, qo

    # fp8amp on the rank's current stream.
    ffi, lib = L.ffi, L.lib
    ctx = L.context(torch.cuda.current_stream())
    uid_p = ffi.new("fp8amp_comm_unique_id *")
    if rank == 0:
        L("fp8amp_comm_unique_id_create", ctx, uid_p)
    box = [bytes(ffi.buffer(uid_p)) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ffi.memmove(uid_p, box[0], 128)
    comm_p = ffi.new("fp8amp_comm *")
    L("fp8amp_comm_create", ctx, uid_p, N, rank, comm_p)
    comm = comm_p[0]
    ins = ffi.new("fp8amp_tensor[]", [L.wrap(ctx, x, L.lib.FP8AMP_DTYPE_BF16)])
    outs = ffi.new("fp8amp_tensor[]", [L.wrap(ctx, out, L.lib.FP8AMP_DTYPE_BF16)])
    for check in ((1, 0) if args.full else (0,)):
        desc = L.init("fp8amp_comm_reduce_desc")
        desc.check = check
        record(f"fp8amp.e4m3{'' if check else '.nocheck'}",
               lambda: L("fp8amp_comm_all_reduce", comm, 1, ins, outs, desc), out)
    # The variants (core/communicator.cpp's per-call environment: the pipeline piece, the exchange of
    # the reduce-scatter half, the conversions' grid), each without the check; the bytes must not
    # depend on any of them.
    ref = out.clone()
    # A digest of the default's bytes (an exact sum of the 16-bit patterns and a strided sample), which
    # the parent compares across groups: the NCCL environment must not change a byte either.
    res["fp8amp.e4m3.nocheck"]["digest"] = [int(ref.view(torch.int16).to(torch.int64).sum().item()),
                                            ref[::4099].cpu().view(torch.int16).numpy().tobytes().hex()[:4096]]
    desc_np = L.init("fp8amp_comm_reduce_desc")
    desc_np.check = 0
    for vname, venv in args.variant_list:
        saved = {k: os.environ.get(k) for k in venv}
        os.environ.update(venv)
        name = f"fp8amp.e4m3.nocheck.{vname}"
        try:
            record(name, lambda: L("fp8amp_comm_all_reduce", comm, 1, ins, outs, desc_np), out)
            res[name]["env"] = venv
            res[name]["same_bytes_as_default"] = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    # Where fp8amp's time goes: the GPU kernels of 3 calls (without the check), rank 0 profiled. The
    # conversions overlap the NCCL kernels (a second stream), so their sum exceeds the call's time.
    desc = L.init("fp8amp_comm_reduce_desc")
    desc.check = 0
    prof = None
    if rank == 0 and args.full:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    for _ in range(3):
        L("fp8amp_comm_all_reduce", comm, 1, ins, outs, desc)
    torch.cuda.synchronize()
    if prof is not None:
        prof.__exit__(None, None, None)
        if args.trace:  # the timeline of the 3 calls, per stream (chrome://tracing, Perfetto)
            prof.export_chrome_trace(args.trace)
        kernels = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t:
                kernels[e.key[:90]] = {"us_per_call": t / 3, "launches_per_call": e.count / 3}
        res["fp8amp.e4m3.nocheck"]["kernels"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_call"]))
    dist.barrier()
    sat = ffi.new("uint64_t *")
    L("fp8amp_comm_get_saturated", comm, sat)
    first = "fp8amp.e4m3" if args.full else "fp8amp.e4m3.nocheck"
    res[first]["saturated"] = int(sat[0])
    # Every rank must hold identical bytes: an exact checksum of all of them plus a strided sample.
    digest = (int(out.view(torch.int16).to(torch.int64).sum().item()), out[::4099].cpu().view(torch.int16).numpy().tobytes())
    digests = [None] * N
    dist.all_gather_object(digests, digest)
    res[first]["identical_on_every_rank"] = all(d == digests[0] for d in digests)
    L("fp8amp_comm_destroy", comm)

    if rank == 0:
        bf16 = res["nccl.bf16"]["us"]
        bus = lambda nbytes, us: nbytes / (us * 1e-6) * 2 * (N - 1) / N / 1e9  # GB/s
        for k, v in res.items():
            wire = {"nccl.bf16": 2, "nccl.f32": 4}.get(k, 1)
            v["busbw_GBps"] = bus(n * wire, v["us"])
            v["speedup_vs_nccl_bf16"] = bf16 / v["us"]
        nb = res["nccl.bf16"]["busbw_GBps"]
        for k in res:
            if not k.startswith("fp8amp."):
                continue
            res[k]["busbw_fraction_of_nccl_bf16"] = res[k]["busbw_GBps"] / nb
            res[k]["vs_native_e4m3_wire"] = res["nccl.e4m3.wire"]["us"] / res[k]["us"]
            if "nccl.e4m3.compiled_casts" in res:
                res[k]["vs_native_e4m3_compiled_casts"] = res["nccl.e4m3.compiled_casts"]["us"] / res[k]["us"]
            if "nccl.e4m3.torch_casts" in res:
                res[k]["vs_native_e4m3_casts"] = res["nccl.e4m3.torch_casts"]["us"] / res[k]["us"]
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
        doc = {"device": gpus, "topology": topo, "date": datetime.date.today().isoformat(), "commit": args.commit,
               "torch": torch.__version__, "nccl_version": nccl.version, "nranks": N, "elements": n,
               "iters": args.iters, "warmup": args.warmup, "group": args.group_name,
               "nccl_env": args.group_env, "methods": res}
        with open(args.group_out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"== group {args.group_name} (NCCL env {args.group_env or 'as inherited'}): "
              f"{n} BF16 elements, {N} ranks, NCCL {nccl.version}")
        print(f"{'method':40s} {'us':>9s} {'x bf16':>7s} {'x e4m3':>7s} {'busbw GB/s':>10s} {'rel_rms':>9s} "
              f"{'max/amax':>9s} same")
        for k, v in res.items():
            same = v.get("same_bytes_as_default", v.get("identical_on_every_rank", ""))
            print(f"{k:40s} {v['us']:9.1f} {v['speedup_vs_nccl_bf16']:7.3f} "
                  f"{res['nccl.e4m3.wire']['us'] / v['us']:7.3f} {v['busbw_GBps']:10.1f} "
                  f"{v['rel_rms']:9.2e} {v['max_err_over_amax']:9.2e} {same}")
        if args.full:
            print("fp8amp's GPU time per call (3 calls profiled on rank 0, check=0; kernels on the two streams "
                  "overlap, so they add up to more than the call):")
            for name, v in res["fp8amp.e4m3.nocheck"].get("kernels", {}).items():
                print(f"  {v['us_per_call']:9.1f} us  x{v['launches_per_call']:.0f}  {name}")
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--elements", type=int, default=256 * 1024 * 1024)
    p.add_argument("--nranks", type=int, default=None)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--piece-elements", default="",
                   help="comma-separated FP8AMP_COMM_PIECE_ELEMENTS values to time fp8amp with as well "
                        "(e.g. 1048576,4194304,16777216,67108864); the default is the library's choice. "
                        "Shorthand for variants pieceN:FP8AMP_COMM_PIECE_ELEMENTS=N")
    p.add_argument("--variants", default="",
                   help="';'-separated fp8amp variants, each NAME:VAR=VALUE[,VAR=VALUE...] of fp8amp's per-call "
                        "variables, e.g. 'sendrecv:FP8AMP_COMM_EXCHANGE=sendrecv;grid100:FP8AMP_COMM_GRID_BLOCKS=100'")
    p.add_argument("--nccl-env", default="",
                   help="';'-separated groups, each NAME:VAR=VALUE[,...] or NAME alone (the inherited environment): "
                        "the whole benchmark runs once per group in fresh processes with those variables set, "
                        "e.g. 'default;p2p32:NCCL_MIN_P2P_NCHANNELS=32'. Empty: one group, the inherited environment")
    p.add_argument("--trace", default="",
                   help="write the profiled calls' timeline (rank 0, check=0, the first group) to this Chrome trace file")
    p.add_argument("--hang-s", type=float, default=200.0, help="dump every rank's stack and exit after this long")
    args = p.parse_args()
    args.lib = os.path.abspath(args.lib)
    args.out = os.path.abspath(args.out)
    args.trace = os.path.abspath(args.trace) if args.trace else ""
    gpus = torch.cuda.device_count()
    args.nranks = args.nranks or gpus
    if args.nranks < 2 or gpus < args.nranks:
        raise SystemExit(f"bench_comm needs at least 2 GPUs and nranks <= GPUs ({gpus} visible, nranks {args.nranks})")

    def parse(spec, what):
        out = []
        for item in [v.strip() for v in spec.split(";") if v.strip()]:
            name, _, rest = item.partition(":")
            env = {}
            for kv in [v.strip() for v in rest.split(",") if v.strip()]:
                k, eq, v = kv.partition("=")
                if not eq:
                    raise SystemExit(f"{what} {item!r}: {kv!r} is not VAR=VALUE")
                env[k] = v
            out.append((name, env))
        return out

    args.variant_list = [(f"piece{int(v)}", {"FP8AMP_COMM_PIECE_ELEMENTS": str(int(v))})
                         for v in args.piece_elements.split(",") if v.strip()]
    args.variant_list += parse(args.variants, "--variants")
    groups = parse(args.nccl_env, "--nccl-env") or [("inherited", {})]
    merged = {"groups": [], "failed_groups": []}
    for gi, (gname, genv) in enumerate(groups):
        args.group_name, args.group_env, args.full = gname, genv, gi == 0
        args.group_out = args.out if len(groups) == 1 else f"{args.out}.{gname}.json"
        saved = {k: os.environ.get(k) for k in genv}
        os.environ.update(genv)  # the spawned ranks inherit it; NCCL reads it when they make communicators
        try:
            store = tempfile.mktemp(prefix="fp8amp_bench_comm_")
            mp.spawn(rank_main, args=(args, store), nprocs=args.nranks, join=True)
        except Exception as e:  # a group that fails (an experimental setting) does not cost the others
            if len(groups) == 1:
                raise
            print(f"== group {gname} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            print(f"== group {gname} FAILED (see the log above)")
            merged["failed_groups"].append({"group": gname, "nccl_env": genv, "error": f"{type(e).__name__}: {e}"})
            continue
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if len(groups) > 1:
            with open(args.group_out) as f:
                merged["groups"].append(json.load(f))
    if len(groups) > 1:
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=1)
        # One line per (group, fp8amp method): the answer to "which is fastest".
        print("== summary: fp8amp (check=0) per group and variant, against that group's NCCL baselines")
        rows = []
        for g in merged["groups"]:
            m = g["methods"]
            for k, v in m.items():
                if k.startswith("fp8amp.e4m3.nocheck"):
                    rows.append((v["us"], g["group"], k, m["nccl.bf16"]["us"] / v["us"],
                                 m["nccl.e4m3.wire"]["us"] / v["us"], v.get("same_bytes_as_default", "")))
        for us, g, k, xb, xe, same in sorted(rows):
            print(f"{g:12s} {k:40s} {us:9.1f} us  x{xb:.3f} NCCL bf16  x{xe:.3f} native E4M3 (wire)  same bytes: {same}")
        for g in merged["groups"]:  # the first group's fair native peer: E4M3 with compiled casts
            m = g["methods"]
            if "nccl.e4m3.compiled_casts" in m:
                c = m["nccl.e4m3.compiled_casts"]
                print(f"{g['group']:12s} nccl.e4m3.compiled_casts {c['us']:9.1f} us (rel. RMS {c['rel_rms']:.2e}); "
                      f"fp8amp.e4m3 (check) x{c['us'] / m['fp8amp.e4m3']['us']:.3f} of it"
                      if "fp8amp.e4m3" in m else "")
        digests = {g["group"]: g["methods"]["fp8amp.e4m3.nocheck"].get("digest") for g in merged["groups"]}
        first = next(iter(digests.values()), None)
        merged["same_bytes_in_every_group"] = all(d == first for d in digests.values())
        print(f"the default's bytes are the same in every group: {merged['same_bytes_in_every_group']}")
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=1)
        if merged["failed_groups"]:
            raise SystemExit(f"failed groups: {[g['group'] for g in merged['failed_groups']]}")


if __name__ == "__main__":
    main()
