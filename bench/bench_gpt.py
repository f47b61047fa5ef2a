#!/usr/bin/env python3
"""End-to-end GPT training step time (issue 19): one model, the same batches, several ways.

  bf16          torch.autocast(bfloat16), eager, torch.optim.AdamW (fused on CUDA)
  bf16_compile  the same under torch.compile
  torchao       torchao.float8 (tensorwise scaling) on the blocks' nn.Linear + torch.compile, when
                torchao imports (skipped, and said so in the JSON, otherwise)
  O1, O2, O3    fp8amp.torch.initialize(model, AdamW, opt_level): the blocks' nn.Linear on fp8amp's
                FP8 Linear (E4M3 weight gradients), fp8amp's optimizer; the output head stays bf16
  O2_compile    O2, then torch.compile(model): the Linears are custom ops (no graph break), so
                inductor fuses the rest of the model (norms, activations, residuals) as it does for
                bf16_compile and torchao
  O2_cudagraphs, torchao_cudagraphs
                the same with torch.compile(mode="reduce-overhead"): inductor's CUDA graphs around
                the fp8amp Linears (whose ops are cudagraph_unsafe: they run between the graphs and
                replay their own launches); asked for by name only (not in the default list)

The model is examples/train_gpt_fp8.py's GPT (imported, not copied). Presets from the issue:
  --preset d2048: 4 layers, d=2048, context 1024, batch 8   (8192 tokens/step)
  --preset d768:  8 layers, d=768,  context 1024, batch 16  (16384 tokens/step)
  --preset d4096: 4 layers, d=4096, context 1024, batch 8   (8192 tokens/step; 0.8B parameters)
or --d/--layers/--heads/--seq/--batch. Reports per mode the median step time (CUDA events around
each step, warmup excluded), tokens/s, peak memory, memory at rest after a step (allocated bytes
after the last step, optimizer state included, minus those before the model was built) and that per
parameter and per nn.Linear parameter of the model as built, the loss of the first and last step, for the
fp8amp modes how many of their Linears' calls per timed step ran as one CUDA graph launch
(linear_graph_replays_per_step, against linear_calls_per_step), and, for
fp8amp O2 (O2_compile when that mode runs) and its peer (torchao if present, else bf16_compile, else bf16), the torch-profiler
per-kernel top list of a few steps; writes a JSON with the device, date and git commit.

    python3 bench/bench_gpt.py --preset d2048 --out bench/results/gpt_step-<device>-<date>.json
    python3 bench/bench_gpt.py --smoke --out /tmp/smoke.json     # tiny, CPU, seconds (tested)
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from train_gpt_fp8 import GPT  # noqa: E402  (the example's model: one definition)

PRESETS = {
    "d2048": dict(layers=4, d=2048, heads=16, seq=1024, batch=8),
    "d768": dict(layers=8, d=768, heads=12, seq=1024, batch=16),
    "d4096": dict(layers=4, d=4096, heads=32, seq=1024, batch=8),
    "smoke": dict(layers=2, d=64, heads=4, seq=32, batch=2),
}
ALL_MODES = ("bf16", "bf16_compile", "torchao", "O1", "O2", "O2_compile", "O3")
EXTRA_MODES = ("O2_cudagraphs", "torchao_cudagraphs")  # run when named in --modes


def compiled(model, mode):
    """torch.compile for the modes that ask for it: *_compile and torchao with the default mode,
    *_cudagraphs with mode="reduce-overhead" (CUDA graphs)."""
    if mode.endswith("_cudagraphs"):
        return torch.compile(model, mode="reduce-overhead")
    if mode.endswith("_compile") or mode == "torchao":
        return torch.compile(model)
    return model
VOCAB = 256  # the example's byte-level vocabulary


def git_commit():
    if os.environ.get("FP8AMP_COMMIT"):  # a copy of the tree without its git history (the device machine)
        return os.environ["FP8AMP_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def make_batches(args, device):
    """The same token batches for every mode (random bytes: the step time does not depend on them)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    n = args.warmup + args.steps
    return [torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=g).to(device) for _ in range(n)]


class Timer:
    """Per-step times: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.pairs = []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, t0):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs.append((t0, e))
        else:
            self.pairs.append((t0, time.perf_counter()))

    def ms(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.pairs]
        return [(b - a) * 1e3 for a, b in self.pairs]


def torchao_unavailable(device):
    """Why torchao's float8 training cannot run here, or None."""
    try:
        import torchao.float8  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return "torchao.float8 does not import: %s: %s" % (type(e).__name__, e)
    if device.type != "cuda":
        return "torchao float8 training needs a CUDA device"
    return None


def build(mode, args, device):
    """(model, optimizer, step function) of one mode, or a string saying why it cannot run here."""
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.d, args.heads, args.seq).to(device)
    adamw = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    keep = ("head",)
    # the Linear parameters of the model as defined (before any conversion): the memory report's unit
    linear_params = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())
    counts = dict(params_built=sum(p.numel() for p in model.parameters()), linear_params=linear_params)
    if mode.split("_")[0] in ("O1", "O2", "O3"):
        import fp8amp.torch as ft

        import fp8amp

        recipe = fp8amp.Recipe(mode=fp8amp.ScalingMode.DELAYED if args.fp8amp_recipe == "delayed"
                               else fp8amp.ScalingMode.CURRENT)
        save_input = {"auto": None, "true": True, "false": False}[args.fp8amp_save_input]
        # initialize's layout options, given only when set: --fp8amp-weight-dtype (the O1/O2 Linear
        # weights; default bfloat16 rounded stochastically by the step, float32 until 2026-11-26) and
        # --fp8amp-state-block (elements per optimizer-state scale; 0: one per tensor, MS-AMP's)
        layout = {}
        if args.fp8amp_weight_dtype:
            layout["weight_dtype"] = getattr(torch, args.fp8amp_weight_dtype)
        if args.fp8amp_state_block is not None:
            layout["state_block_size"] = args.fp8amp_state_block
        model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), **adamw), opt_level=mode.split("_")[0],
                                   policy=args.policy, exclude=keep, recipe=recipe, save_input=save_input, **layout)
        if args.fp8amp_lean != 1:  # the front's default is 1 (0: the buffers kept between calls, as before)
            for m in fp8amp_linears(model):
                m.fp8amp_linear.lean = args.fp8amp_lean
        fwd = compiled(model, mode)
    else:
        if mode.startswith("torchao"):
            why = torchao_unavailable(device)
            if why:
                return why
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig.from_recipe_name("tensorwise")
            convert_to_float8_training(
                model, config=config,
                module_filter_fn=lambda m, fqn: fqn.split(".")[-1] not in keep and m.in_features % 16 == 0
                and m.out_features % 16 == 0)
        opt = torch.optim.AdamW(model.parameters(), fused=device.type == "cuda", **adamw)
        fwd = compiled(model, mode)

    def step(xy):
        x, y = xy[:, :-1], xy[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fwd(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return model, opt, step, counts


def profile_top(step, batches, device, top):
    """The profiler's per-kernel list over a few steps: the `top` names by self device time (CPU time
    on the CPU), with call counts and totals in microseconds."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for xy in batches:
            step(xy)
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0)
        rows.append({"name": e.key, "count": e.count, "self_device_us": float(dev_us or 0),
                     "self_cpu_us": float(e.self_cpu_time_total)})
    key = "self_device_us" if device.type == "cuda" else "self_cpu_us"
    rows.sort(key=lambda r: -r[key])
    return [r for r in rows if r[key] > 0][:top]


def fp8amp_linears(model):
    return [m for m in model.modules() if type(m).__module__.startswith("fp8amp.torch")
            and hasattr(m, "fp8amp_linear")]


def linear_graph_replays(model):
    """The fp8amp Linears' CUDA graph replays so far (fp8amp_linear_graph_replays; None for other
    modes): every forward and backward of a steady step should be one (2 per Linear per step), also
    since the Linears give their buffers back at each step (the caching allocator hands the same
    blocks back; a call whose buffers moved captures anew instead)."""
    lins = fp8amp_linears(model)
    return sum(m.fp8amp_linear.graph_replays for m in lins) if lins else None


def release_fp8amp_contexts():
    """Gives back what fp8amp's per-device contexts (shared by every mode of this process) still hold
    from an earlier mode -- their scratch pools and GEMM workspaces -- so that each mode's memory at
    rest counts its own (before, a mode after another fp8amp mode found them allocated in its base and
    looked about 1.2 bytes per Linear parameter lighter: the 'eager vs compiled' gap of the 2026-11-26
    measurement, whose O2_compile ran after O2)."""
    ftc = sys.modules.get("fp8amp.torch.context")
    if ftc is None:
        return
    for ctx in list(ftc._CONTEXTS.values()):
        if not ctx.closed:
            ctx.synchronize()
            ctx.release_scratch()


def warm_torch(device):
    """torch's own cuBLAS/cuBLASLt workspaces are allocated at the first GEMM of each dtype and kept:
    made here, before any mode's base, so that no mode counts them (the first mode run did before)."""
    if device.type != "cuda":
        return
    for dt in (torch.float32, torch.bfloat16):
        a = torch.ones(64, 64, device=device, dtype=dt)
        (a @ a).sum().item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            (a @ a).float().sum().item()
    torch.cuda.synchronize(device)


def fp8amp_memory(model):
    """fp8amp's own bytes now: the Linears' tensors (fp8amp_linear_memory_bytes: parameters, gradients
    and whatever buffers they keep) and the scratch pools of their contexts."""
    lins = fp8amp_linears(model)
    if not lins:
        return None
    ctxs = {id(m._ctx): m._ctx for m in lins}
    return {"linear_bytes": sum(m.fp8amp_linear.memory_bytes for m in lins),
            "scratch_bytes": sum(c.scratch_bytes() for c in ctxs.values())}


def held_bytes(model, opt):
    """Bytes held at rest for the Linear layers' parameters and for the other parameters, counted from
    the tensors themselves: each parameter with its gradient and its optimizer state (torch's AdamW
    state tensors, or fp8amp's compact storage as its state_dict exports it: m, v, masters and their
    scales), and an fp8amp Linear's own tensors by fp8amp_linear_memory_bytes (its weight, its
    gradient, the buffers it keeps). Device tensors only (torch's AdamW keeps `step` on the host)."""
    lins = fp8amp_linears(model)
    own = {id(p) for m in lins for p in m.parameters()}  # counted by memory_bytes
    linear_ids = own | {id(p) for m in model.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters()}
    state = opt.state_dict().get("state", {})
    params = [p for g in opt.param_groups for p in g["params"]]
    held = {"linear": sum(m.fp8amp_linear.memory_bytes for m in lins), "other": 0}
    held["fp8amp"] = held["linear"]  # the fp8amp Linears alone (without the Linears kept in bf16: the head)
    for i, p in enumerate(params):
        b = sum(t.nbytes for t in state.get(i, {}).values() if torch.is_tensor(t) and t.device == p.device)
        if id(p) not in own:
            b += p.nbytes + (p.grad.nbytes if p.grad is not None else 0)
        else:
            held["fp8amp"] += b
        held["linear" if id(p) in linear_ids else "other"] += b
    held["fp8amp_params"] = sum(p.numel() for m in lins for p in m.parameters())
    return held


def run_mode(mode, args, device, batches, want_profile):
    gc.collect()
    release_fp8amp_contexts()
    base_bytes = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
        base_bytes = torch.cuda.memory_allocated(device)  # the batches and whatever an earlier mode left
    built = build(mode, args, device)
    if isinstance(built, str):
        print("  [%s] skipped: %s" % (mode, built), flush=True)
        return {"skipped": built}
    model, opt, step, counts = built
    linear_params, built_params = counts["linear_params"], counts["params_built"]
    losses = []
    for xy in batches[:args.warmup]:  # compiles, plans, graphs, allocator warm-up
        losses.append(float(step(xy)))
    replays_before = linear_graph_replays(model)
    timer = Timer(device)
    for xy in batches[args.warmup:]:
        t0 = timer.start()
        losses.append(step(xy))
        timer.stop(t0)
    times = timer.ms()
    replays = linear_graph_replays(model)
    losses = [float(v) for v in losses]
    rest = None
    if base_bytes is not None:  # after the last step (times() synchronized): weights, grads if kept, state
        rest = torch.cuda.memory_allocated(device) - base_bytes
    med = statistics.median(times)
    res = {"step_ms_median": med, "step_ms_all": times, "tokens_per_s": args.batch * args.seq / med * 1e3,
           "peak_mem_MiB": (torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
           "loss_first": losses[0], "loss_last": losses[-1],
           "params": sum(p.numel() for p in model.parameters()), "linear_params": linear_params,
           "rest_mem_MiB": rest / 2**20 if rest is not None else None}
    res["base_MiB"] = base_bytes / 2**20 if base_bytes is not None else None
    if base_bytes is not None:  # the peak of this mode's own memory (peak_mem_MiB counts the base too)
        res["peak_above_base_MiB"] = res["peak_mem_MiB"] - res["base_MiB"]
    mem = fp8amp_memory(model)
    if mem is not None:  # at rest: what fp8amp itself holds (the Linears' tensors, the contexts' scratch)
        res["fp8amp_rest_linear_MiB"] = mem["linear_bytes"] / 2**20
        res["fp8amp_rest_scratch_MiB"] = mem["scratch_bytes"] / 2**20
    if replays is not None:  # fp8amp modes: how many Linear calls per timed step ran as one graph launch
        res["linear_graph_replays_per_step"] = (replays - replays_before) / max(len(times), 1)
        res["linear_calls_per_step"] = 2 * sum(1 for _ in fp8amp_linears(model))
    # per parameter of the model as built and per nn.Linear parameter (the unit: everything at
    # rest, the head, embeddings and norms included, over the Linear parameters)
    res["params_built"] = built_params
    res["rest_bytes_per_param"] = rest / built_params if rest is not None else None
    res["rest_bytes_per_linear_param"] = rest / linear_params if rest is not None else None
    # The issue's unit taken per Linear parameter: what is held for the Linears' parameters. From the
    # tensors (held_bytes): the other parameters' share (embeddings, norms: their values, gradients
    # and state) comes off the measured rest; whatever the allocator holds beyond both (scratch,
    # rounding; the residual) stays on the Linears' side.
    held = held_bytes(model, opt)
    res["held_linear_MiB"], res["held_other_MiB"] = held["linear"] / 2**20, held["other"] / 2**20
    if held["fp8amp_params"]:  # the fp8amp Linears' own layout, from their tensors (no allocator residual)
        res["held_bytes_per_fp8amp_linear_param"] = held["fp8amp"] / held["fp8amp_params"]
    if rest is not None:
        res["rest_residual_MiB"] = (rest - held["linear"] - held["other"]) / 2**20
        res["rest_bytes_per_linear_param_own"] = (rest - held["other"]) / linear_params
    else:
        res["rest_residual_MiB"] = res["rest_bytes_per_linear_param_own"] = None
    if want_profile:
        res["profile_top"] = profile_top(step, batches[args.warmup:args.warmup + args.profile_steps], device,
                                         args.profile_top)
    print("  [%s] median %.3f ms/step, %.0f tokens/s, peak %s MiB, at rest %s MiB (%s B per Linear param; "
          "%s B held for the Linears' own; %s B per fp8amp Linear param), loss %.4f -> %.4f" % (
              mode, med, res["tokens_per_s"], "%.0f" % res["peak_mem_MiB"] if res["peak_mem_MiB"] is not None else "-",
              "%.0f" % res["rest_mem_MiB"] if rest is not None else "-",
              "%.2f" % res["rest_bytes_per_linear_param"] if rest is not None else "-",
              "%.3f" % res["rest_bytes_per_linear_param_own"] if rest is not None else "-",
              "%.4f" % res["held_bytes_per_fp8amp_linear_param"] if "held_bytes_per_fp8amp_linear_param" in res else "-",
              res["loss_first"], res["loss_last"]), flush=True)
    del model, opt, step
    gc.collect()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), help="the issue's configurations (or smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU, 2 + 2 steps (for the test)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--d", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--seq", type=int, help="context length")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--modes", default=",".join(ALL_MODES))
    ap.add_argument("--policy", default="auto", help="fp8amp GEMM policy: auto, fp8, bf16")
    ap.add_argument("--fp8amp-recipe", choices=("current", "delayed"), default="current",
                    help="the fp8amp modes' scaling: current (the front's default) or delayed (E4M3 weight "
                         "gradients without their amax pass: docs/numerics.md 9.2)")
    ap.add_argument("--fp8amp-weight-dtype", choices=("bfloat16", "float32"), default=None,
                    help="the O1/O2 Linear weights' dtype (default: initialize's, bfloat16)")
    ap.add_argument("--fp8amp-state-block", type=int, default=None,
                    help="elements per optimizer-state scale (default: initialize's 128; 0: one per tensor)")
    ap.add_argument("--fp8amp-save-input", choices=("auto", "true", "false"), default="auto",
                    help="the fp8amp Linears' save_input (docs/torch.md section 2): auto keeps each input for the "
                         "backward under torch.compile (a layer may be reused); false keeps only the C Linear's FP8 "
                         "copy (every layer of this GPT runs once per forward)")
    ap.add_argument("--fp8amp-lean", type=int, choices=(0, 1, 2), default=1,
                    help="the fp8amp Linears' lean level (fp8amp_linear_set_lean; 1 is the front's default)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    preset = "smoke" if args.smoke else (args.preset or "d2048")
    for k, v in PRESETS[preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.smoke:
        args.steps, args.warmup, args.profile_steps = min(args.steps, 2), min(args.warmup, 2), 1
        if args.modes == ",".join(ALL_MODES):
            args.modes = "bf16,torchao,O1,O2"  # torch.compile on the CPU needs minutes: asked for explicitly only
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ALL_MODES + EXTRA_MODES:
            ap.error("unknown mode %r (one of %s)" % (m, ", ".join(ALL_MODES + EXTRA_MODES)))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print("GPT %dL d%d heads %d, context %d, batch %d (%d tokens/step) on %s" % (
        args.layers, args.d, args.heads, args.seq, args.batch, args.seq * args.batch, name), flush=True)
    batches = make_batches(args, device)
    warm_torch(device)
    # O2's peer for the profiler: torchao where it runs, else bf16 + compile, else bf16
    runnable = [m for m in ("torchao", "bf16_compile", "bf16")
                if m in modes and not (m == "torchao" and torchao_unavailable(device))]
    peer = runnable[0] if runnable else None
    # ...and the fp8amp mode profiled beside it: the compiled O2 when it runs, else eager O2
    mine = "O2_compile" if "O2_compile" in modes else "O2"
    out = {"device": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(), "torch": torch.__version__, "preset": preset,
           "config": {k: getattr(args, k) for k in ("layers", "d", "heads", "seq", "batch", "steps", "warmup",
                                                    "policy", "fp8amp_recipe", "fp8amp_weight_dtype", "fp8amp_state_block", "fp8amp_save_input", "fp8amp_lean",
                                                    "seed")},
           "tokens_per_step": args.seq * args.batch, "modes": {}}
    for m in modes:
        print("mode %s" % m, flush=True)
        out["modes"][m] = run_mode(m, args, device, batches, not args.no_profile and m in (mine, peer))
    out["profile_peer"], out["profile_fp8amp"] = peer, mine
    base = out["modes"].get("bf16", {}).get("step_ms_median")
    if base:
        out["speedup_vs_bf16"] = {m: base / r["step_ms_median"] for m, r in out["modes"].items()
                                  if "step_ms_median" in r}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote %s" % args.out)
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
