"""The fused Adam/AdamW step: fp8amp O1/O2/O3 vs torch.optim.AdamW(fused=True), in the same run.

Measures, with CUDA events after warm-up (median of many steps), over --params parameters split into
--tensors tensors:
  - the device copy bandwidth (torch copy_, bytes read + written): the hardware ceiling;
  - torch.optim.AdamW(fused=True), F32 params/grads/state (28 B/param);
  - fp8amp_optimizer_step at O1 (F32 everything), O2 (BF16 params, E4M3 gradients with their scale,
    E4M3 m + F16 v, per-block scales of 128) and O3 (E4M3 params, F16 master, E4M3 gradients), and
    O2 with F32 params and gradients, and with F32 params and E4M3 gradients (the PyTorch front's). "bytes" counts what each step must move: every state read and
    written, parameters read (O3: only written -- the master is the value of record) and written,
    gradients read twice (the finiteness/norm pass must finish before anything is written), the block
    scales;
  - optimizer state memory: torch's exp_avg + exp_avg_sq vs fp8amp_optimizer_state_bytes;
  - a CUDA-graph capture of the O2 step, replayed, checked bit-identical to the eager step.
By default every step sees the same gradients, so after the first steps almost no block scale of m or
v changes from one step to the next (0.06% / 1.0% per step, bench/adam_scale_churn.py). --fresh-grads K
gives each step the next of K gradient sets instead (copied in off the clock, then L2 flushed by a
256 MB read), after --fresh-warmup steps (200: m in steady state, v growing slowly), so that scales
move as they do in training (a small MLP: 18% of m's blocks, 0.8% of v's per step).
Writes bench/results/adam-<device>-<date>.json (or --out) and prints a table.

Usage: python3 bench/bench_adam.py --lib build/libfp8amp.so [--params 268435456] [--out FILE]
"""
import argparse
import datetime
import json
import os

import torch

from fp8amp_bench import C, Lib
from fp8amp_bench import bench as _bench


class AdamLib(Lib):
    def scaling(self, ctx, scale):  # a meta (history 16) with a set scale: the gradients' metas
        return super().scaling(ctx, history=16, scale=scale)


FRESH = {"sets": 0, "warmup": 200}  # --fresh-grads, --fresh-warmup
_flush = []


def bench(fn, grads=None, sets=None):
    """Median ms of fn() over 15 runs (fp8amp_bench.bench). With --fresh-grads, grads (the tensors
    the step reads) take sets[i % K] before run i, off the clock, and L2 is flushed."""
    if not FRESH["sets"] or grads is None:
        return _bench(fn, warmup=3, reps=15)
    if not _flush:
        _flush.append(torch.ones(64 * 1024 * 1024, device="cuda"))  # 256 MB, read to flush L2
        _flush.append(torch.empty((), device="cuda"))

    def prep(i):
        for g, src in zip(grads, sets[i % len(sets)]):
            g.copy_(src)
        torch.sum(_flush[0], dim=0, out=_flush[1])

    return _bench(fn, warmup=FRESH["warmup"], reps=15, prep=prep)


def grad_like(n, gdt):
    """Random gradients of n elements in dtype gdt (E4M3: scaled by the gradient meta's 448 / 5e-3)."""
    g32 = torch.randn(n, device="cuda") * 1e-3
    return (g32 * (448.0 / 5e-3)).clamp(-448, 448).to(torch.float8_e4m3fn) if gdt == C.E4M3 else g32.to(torch_dtype(gdt))


def torch_dtype(d):
    return {C.F32: torch.float32, C.F16: torch.float16, C.BF16: torch.bfloat16, C.E4M3: torch.float8_e4m3fn}[d]


class Problem:
    """Parameters and gradients (torch memory, wrapped) registered with an fp8amp optimizer."""

    def __init__(self, lib, ctx, level, pdt, gdt, sizes, block=128, rounding=0):
        self.lib, self.ctx, self.handles, self.metas = lib, ctx, [], []
        desc = lib.new("fp8amp_adam_desc *")
        lib("fp8amp_opt_level_adam_init", level, desc, lib.ffi.sizeof("fp8amp_adam_desc"))
        desc.state_block_size = block
        desc.master_rounding = rounding  # 1: stochastic (masters, and 16-bit parameters without one)
        opt = lib.new("fp8amp_optimizer *")
        lib("fp8amp_optimizer_create", ctx, desc, opt)
        self.opt = opt[0]
        self.params, self.grads = [], []
        for n in sizes:
            p32 = torch.randn(n, device="cuda") * 0.02
            if pdt == C.E4M3:
                p = (p32 * (448.0 / 0.1)).clamp(-448, 448).to(torch.float8_e4m3fn)
            else:
                p = p32.to(torch_dtype(pdt))
            g = grad_like(n, gdt)
            del p32
            hp, hg = lib.wrap(ctx, p, pdt), lib.wrap(ctx, g, gdt)
            if pdt == C.E4M3:
                m = lib.scaling(ctx, 448.0 / 0.1)
                lib("fp8amp_tensor_set_scaling", hp, m)
                self.metas.append(m)
            if gdt == C.E4M3:
                m = lib.scaling(ctx, 448.0 / 5e-3)
                lib("fp8amp_tensor_set_scaling", hg, m)
                self.metas.append(m)
            lib("fp8amp_optimizer_add_param", self.opt, hp, hg)
            self.params.append(p)
            self.grads.append(g)
            self.handles += [hp, hg]
        # --fresh-grads: K more gradient sets, one per step in turn (bench())
        self.sets = [[grad_like(n, gdt) for n in sizes] for _ in range(FRESH["sets"])]
        self.args = lib.init("fp8amp_adam_step_args")

    def step(self):
        self.lib("fp8amp_optimizer_step", self.opt, self.args)

    def state_bytes(self):
        b = self.lib.new("size_t *")
        self.lib("fp8amp_optimizer_state_bytes", self.opt, b)
        return b[0]

    def save(self):
        size = self.lib.new("size_t *")
        self.lib("fp8amp_optimizer_save", self.opt, self.lib.ffi.NULL, 0, size)
        buf = self.lib.new("unsigned char[]", size[0])
        self.lib("fp8amp_optimizer_save", self.opt, buf, size[0], size)
        return bytes(self.lib.ffi.buffer(buf, size[0]))

    def load(self, data):
        self.lib("fp8amp_optimizer_load", self.opt, self.lib.ffi.from_buffer(data), len(data))

    def close(self):
        self.lib("fp8amp_optimizer_destroy", self.opt)
        for h in self.handles:
            self.lib("fp8amp_tensor_destroy", h)
        for m in self.metas:
            self.lib("fp8amp_scaling_destroy", m)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--params", type=int, default=256 * 1024 * 1024)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--commit", default=os.environ.get("FP8AMP_COMMIT", "unknown"))
    ap.add_argument("--only", help="comma-separated fp8amp case names to run (tuning runs: no torch baseline)")
    ap.add_argument("--fresh-grads", type=int, default=0, metavar="K",
                    help="each step reads the next of K gradient sets (scales move as in training); 0: one set")
    ap.add_argument("--fresh-warmup", type=int, default=200, help="steps before timing with --fresh-grads")
    args = ap.parse_args()
    FRESH["sets"], FRESH["warmup"] = args.fresh_grads, args.fresh_warmup
    lib = AdamLib(args.lib)
    stream = torch.cuda.current_stream()
    ctx = lib.context(stream)
    props = torch.cuda.get_device_properties(0)
    n = args.params
    sizes = [n // args.tensors] * args.tensors
    sizes[-1] += n - sum(sizes)
    results = {"device": props.name, "date": datetime.date.today().isoformat(), "commit": args.commit,
               "torch": torch.__version__, "params": n, "tensors": args.tensors,
               "fresh_grads": args.fresh_grads, "fresh_warmup": args.fresh_warmup if args.fresh_grads else 0, "cases": {}}

    def record(name, ms, bytes_per_param=None, note="", **extra):
        entry = {"ms": ms}
        if bytes_per_param is not None:
            entry["bytes_per_param"] = bytes_per_param
            entry["GB_per_s"] = bytes_per_param * n / (ms * 1e-3) / 1e9
        if note:
            entry["note"] = note
        entry.update(extra)
        results["cases"][name] = entry
        print(f"{name:34s} {ms:8.3f} ms  {entry.get('GB_per_s', 0):7.0f} GB/s  {note}", flush=True)

    # ---- the ceiling
    src = torch.empty(2 * 1024 ** 3, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    copy_bw = 2 * src.numel() / (ms * 1e-3) / 1e9
    results["copy_GB_per_s"] = copy_bw
    print(f"copy: {copy_bw:.0f} GB/s")
    del src, dst

    # ---- PyTorch fused AdamW, F32
    torch_ms = float("nan")
    ps = [] if args.only else [torch.nn.Parameter(torch.randn(s, device="cuda") * 0.02) for s in sizes]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    if ps:
        topt = torch.optim.AdamW(ps, lr=1e-3, fused=True)
        tsets = [[grad_like(p.numel(), C.F32) for p in ps] for _ in range(FRESH["sets"])]
        torch_ms = bench(topt.step, [p.grad for p in ps], tsets)
        del tsets
        torch_state = sum(t.numel() * t.element_size() for st in topt.state.values() for k, t in st.items()
                          if torch.is_tensor(t) and t.numel() > 1)
        record("torch.AdamW(fused).f32", torch_ms, 28, "params, grads, m, v in F32", state_bytes=torch_state,
               state_bytes_per_param=torch_state / n)
        del topt
    del ps
    torch.cuda.empty_cache()

    # ---- fp8amp
    scale_bytes = 4 * 2 / 128  # per state: scale read + written per block of 128
    cases = [
        ("fp8amp.O1.f32", 1, C.F32, C.F32, 4 + 4 + 2 * 4 + 8 + 8, "F32 p/g; m, v F32"),
        ("fp8amp.O2.bf16_p.e4m3_g", 2, C.BF16, C.E4M3, 2 + 2 + 2 * 1 + 2 + 4 + 2 * scale_bytes,
         "BF16 p, E4M3 g; m E4M3 + v F16, block 128"),
        ("fp8amp.O2.bf16_p.e4m3_g.stochastic", 2, C.BF16, C.E4M3, 2 + 2 + 2 * 1 + 2 + 4 + 2 * scale_bytes,
         "as above, the BF16 params rounded stochastically (the PyTorch front's O1/O2 Linear since 2026-11-26)", 1),
        ("fp8amp.O2.f32_p.f32_g", 2, C.F32, C.F32, 4 + 4 + 2 * 4 + 2 + 4 + 2 * scale_bytes, "F32 p/g; m E4M3 + v F16"),
        ("fp8amp.O2.f32_p.e4m3_g", 2, C.F32, C.E4M3, 4 + 4 + 2 * 1 + 2 + 4 + 2 * scale_bytes,
         "F32 p, E4M3 g (the PyTorch front's O2 Linear); m E4M3 + v F16"),
        ("fp8amp.O3.e4m3_p.e4m3_g", 3, C.E4M3, C.E4M3, 1 + 2 * 1 + 2 + 4 + 4 + 3 * scale_bytes,
         "E4M3 p (written), F16 master, E4M3 g"),
        # One scale per tensor (state_block_size 0, MS-AMP's layout): the new state's amax needs a
        # pass of its own before the update (g, w or master, m, v read once more: 6 B/param more).
        ("fp8amp.O2.bf16_p.e4m3_g.per_tensor", 2, C.BF16, C.E4M3, 2 + 2 + 2 * 1 + 2 + 4 + 6,
         "BF16 p, E4M3 g; m E4M3 + v F16, one scale per tensor (phase 1b reads g, p, m, v again)", 0, 0),
        ("fp8amp.O3.e4m3_p.e4m3_g.per_tensor", 3, C.E4M3, C.E4M3, 1 + 2 * 1 + 2 + 4 + 4 + 6,
         "E4M3 p (written), F16 master, E4M3 g, one scale per tensor (phase 1b reads g, master, m, v again)", 0, 0),
    ]
    for name, level, pdt, gdt, bpp, note, *extra in cases:
        rounding = extra[:1]
        block = extra[1] if len(extra) > 1 else 128
        if args.only and name not in args.only.split(","):
            continue
        pb = Problem(lib, ctx, level, pdt, gdt, sizes, block=block, rounding=rounding[0] if rounding else 0)
        ms = bench(pb.step, pb.grads, pb.sets)
        pb.sets = []
        found = lib.new("int32_t *", 1)
        lib("fp8amp_optimizer_get_found_inf", pb.opt, found)
        assert found[0] == 0, f"{name}: the timed steps were skipped (found_inf): the benchmark data is broken"
        sb = pb.state_bytes()
        record(name, ms, bpp, note, state_bytes=sb, state_bytes_per_param=sb / n,
               fraction_of_copy=bpp * n / (ms * 1e-3) / 1e9 / copy_bw, speedup_vs_torch=torch_ms / ms)
        if level == 2 and pdt == C.BF16 and not rounding and block == 128:
            # CUDA graph: capture one step, replay it, compare with the eager step bit for bit.
            snap = pb.save()
            pb.args.lr = 1e-3  # a different lr than the timed steps: the graph replays this captured value
            pb.step()
            torch.cuda.synchronize()
            eager = pb.save()
            pb.load(snap)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    with torch.cuda.graph(graph, stream=side):
                        lib.set_stream(ctx, torch.cuda.current_stream())
                        pb.step()
                lib.set_stream(ctx, stream)
                graph.replay()
                torch.cuda.synchronize()
                replayed = pb.save()
                same = replayed == eager and replayed != snap
                gms = bench(graph.replay)
                results["cuda_graph"] = {"captured": True, "replay_bit_identical_to_eager": same, "replay_ms": gms}
                print(f"CUDA graph: replay identical to eager: {same}; replay {gms:.3f} ms", flush=True)
            except Exception as e:  # report, do not hide
                lib.set_stream(ctx, stream)
                results["cuda_graph"] = {"captured": False, "error": str(e)}
                print("CUDA graph capture failed:", e, flush=True)
        pb.close()
        torch.cuda.empty_cache()

    out_path = args.out or os.path.join(os.path.dirname(__file__), "results",
                                        f"adam-{props.name.replace(' ', '_')}-{results['date']}.json")
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"{'case':34s} {'ms':>8s} {'B/param':>8s} {'GB/s':>7s} {'of copy':>8s} {'vs torch':>8s} {'state B/p':>9s}")
    for name, e in results["cases"].items():
        print(f"{name:34s} {e['ms']:8.3f} {e.get('bytes_per_param', 0):8.2f} {e.get('GB_per_s', 0):7.0f} "
              f"{100 * e.get('fraction_of_copy', e.get('GB_per_s', 0) / copy_bw):7.1f}% "
              f"{e.get('speedup_vs_torch', 1.0):7.2f}x {e.get('state_bytes_per_param', 0):9.3f}")
    print("wrote", out_path)


if __name__ == "__main__":
    main()
