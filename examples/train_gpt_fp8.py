#!/usr/bin/env python3
"""A real training check of fp8amp.torch: a GPT-style byte-level decoder trained on the Python
standard library's own source files, three ways with the same seed, initial weights and batches:

  bf16 : torch.autocast(bfloat16) + torch.optim.AdamW(fused=True), gradient clipping 1.0
  O1   : fp8amp.torch.initialize(..., "O1"): every nn.Linear of the blocks on fp8amp's FP8 GEMMs
         (the output head stays bf16, as is usual; --keep-bf16 '' puts it in FP8 too) with E4M3 weight
         gradients, BF16 weights rounded stochastically by the step (no F32 copy; --weight-dtype
         float32 keeps F32 weights), Adam states in F32 (fp8amp's optimizer); attention, LayerNorm,
         embeddings in bf16 autocast as in the baseline
  O2   : the same with O2 (m in E4M3, v in F16, per-block scales)

Prints progress; writes the loss curves, held-out losses, peak GPU memory and step times to a JSON
(bench/results/) and plots the curves to a PNG (docs/gpt_fp8_loss.png).

    python3 examples/train_gpt_fp8.py --steps 600 --out bench/results/gpt_fp8.json --png docs/gpt_fp8_loss.png
"""
import argparse
import datetime
import gc
import glob
import json
import math
import os
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_corpus(limit_bytes):
    """The bytes of the standard library's .py files, in sorted path order (deterministic)."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    chunks, total = [], 0
    for f in files:
        if "site-packages" in f or "dist-packages" in f:
            continue
        with open(f, "rb") as fh:
            b = fh.read()
        chunks.append(b)
        total += len(b)
        if total >= limit_bytes:
            break
    data = b"".join(chunks)[:limit_bytes]
    return root, len(files), torch.frombuffer(bytearray(data), dtype=torch.uint8)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq, vocab=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)  # untied: tied weights would stay an nn.Linear
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / (math.sqrt(2 * layers) if n.endswith(("proj.weight", "out.weight")) else 1))
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batches(data, n, batch, seq, seed, device):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ix = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        xy = torch.stack([data[i:i + seq + 1] for i in ix.tolist()]).to(device, non_blocking=True).long()
        yield xy[:, :-1], xy[:, 1:]


def run(mode, args, train, held_out, device):
    import fp8amp
    import fp8amp.torch as ft

    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.d, args.heads, args.seq).to(device)
    nparams = sum(p.numel() for p in model.parameters())
    if args.snap_init_e4m3:  # experiment: start from E4M3-rounded Linear weights, as O3's first E4M3 copy
        keep = {x for x in args.keep_bf16.split(",") if x}
        with torch.no_grad():
            for name, m in model.named_modules():
                if isinstance(m, nn.Linear) and name not in keep:
                    s = 448.0 / m.weight.abs().max().float()
                    m.weight.copy_((m.weight * s).to(torch.float8_e4m3fn).float() / s)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    if mode == "bf16":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=device.type == "cuda")
    else:
        # --amax-history: the history of the delayed metas (O3's E4M3 weights are written with the scale
        # from their amax history); the GEMM operands keep current scaling.
        # --fp8amp-recipe delayed: delayed scaling for the metas (the E4M3 weight gradient without its amax pass:
        # what bench/bench_gpt.py times as its fastest mode); current (the default) keeps the front's recipe.
        smode = fp8amp.ScalingMode.DELAYED if args.fp8amp_recipe == "delayed" else fp8amp.ScalingMode.CURRENT
        recipe = None
        if args.amax_history or args.fp8amp_recipe == "delayed":
            recipe = fp8amp.Recipe(mode=smode, **({"amax_history_len": args.amax_history} if args.amax_history else {}))
        model, opt = ft.initialize(model, torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                                            weight_decay=0.1),
                                   opt_level=mode, policy=args.policy, max_grad_norm=1.0,
                                   master_rounding=args.master_rounding, recipe=recipe,
                                   **({"weight_dtype": getattr(torch, args.weight_dtype)} if args.weight_dtype else {}),
                                   **({"state_block_size": args.state_block_size} if args.state_block_size is not None else {}),
                                   exclude=tuple(x for x in args.keep_bf16.split(",") if x))
    # --compile: torch.compile the model (the fp8amp Linears are custom ops, so inductor fuses the rest
    # around them); bf16 is compiled too, so that each mode is measured the same way.
    fwd = torch.compile(model) if args.compile else model
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    losses = torch.empty(args.steps, device=device)
    t_start, t_timed = time.perf_counter(), None
    for step, (x, y) in enumerate(batches(train, args.steps, args.batch, args.seq, args.seed + 1, device)):
        if step == args.timing_warmup:
            sync(device)
            t_timed = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fwd(x)
        loss = F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))
        loss.backward()
        if mode == "bf16":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses[step] = loss.detach()
        if (step + 1) % args.log_every == 0 or step == 0:
            print("  [%s] step %4d/%d  loss %.4f  lr %.2e  %.1f s" % (
                mode, step + 1, args.steps, float(loss), opt.param_groups[0]["lr"], time.perf_counter() - t_start),
                flush=True)
    sync(device)
    step_ms = (time.perf_counter() - t_timed) / (args.steps - args.timing_warmup) * 1e3
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        ev = [float(F.cross_entropy(model(x).float().view(-1, 256), y.reshape(-1)))
              for x, y in batches(held_out, args.eval_batches, args.batch, args.seq, args.seed + 2, device)]
    curve = losses.tolist()
    res = {"loss": curve, "final_train_loss": sum(curve[-50:]) / len(curve[-50:]), "eval_loss": sum(ev) / len(ev),
           "step_ms": step_ms, "tokens_per_s": args.batch * args.seq / step_ms * 1e3,
           "peak_mem_MiB": peak / 2**20, "params": nparams}
    if mode != "bf16":
        res["fp8amp_state_MiB"] = opt.state_bytes() / 2**20
        kinds = {}
        for m in model.modules():
            if isinstance(m, ft.Linear):
                kinds[m.gemm_kind.name] = kinds.get(m.gemm_kind.name, 0) + 1
        res["linear_gemm_kinds"] = kinds
    print("  [%s] final train loss %.4f, held-out %.4f, %.1f ms/step, peak %.0f MiB" % (
        mode, res["final_train_loss"], res["eval_loss"], step_ms, res["peak_mem_MiB"]), flush=True)
    del model, fwd, opt, sched
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, r in results["runs"].items():
        c = r["loss"]
        k = 20
        smooth = [sum(c[max(0, i - k + 1):i + 1]) / len(c[max(0, i - k + 1):i + 1]) for i in range(len(c))]
        ax.plot(range(1, len(c) + 1), smooth, label="%s (held-out %.3f, %.0f ms/step, %.1f GiB peak)" % (
            mode, r["eval_loss"], r["step_ms"], r["peak_mem_MiB"] / 1024))
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte, 20-step mean)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(top=min(3.5, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--master-rounding", default=None, choices=(None, "nearest", "stochastic"),
                    help="the value of record's rounding (O3's F16 master copies, the O1/O2 16-bit weights): "
                         "nearest or stochastic; default: initialize's (stochastic for 16-bit weights without a "
                         "master, nearest for O3's masters; docs/numerics.md 6.3)")
    ap.add_argument("--weight-dtype", default=None, choices=(None, "bfloat16", "float32"),
                    help="the O1/O2 Linear weights' dtype; default: initialize's (bfloat16, MS-AMP's 16-bit weights)")
    ap.add_argument("--state-block-size", type=int, default=None,
                    help="O2/O3 optimizer state: elements per scale (0: one per tensor, MS-AMP's); default initialize's (128)")
    ap.add_argument("--amax-history", type=int, default=0,
                    help="amax history length of the delayed metas (O3's E4M3 weights); 0: the recipe default")
    ap.add_argument("--snap-init-e4m3", action="store_true",
                    help="experiment: round the initial Linear weights to E4M3 (per-tensor scale) before training")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (every mode)")
    ap.add_argument("--fp8amp-recipe", choices=("current", "delayed"), default="current",
                    help="scaling mode of the fp8amp metas (delayed: no amax pass for the E4M3 weight gradients)")
    ap.add_argument("--policy", default="fp8", help="fp8amp GEMM policy: fp8 (always), auto, bf16")
    ap.add_argument("--modes", default="bf16,O1,O2")
    ap.add_argument("--keep-bf16", default="head",
                    help="comma-separated nn.Linear names left to bf16 autocast in the fp8amp runs ('' for none)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu for a small smoke run")
    ap.add_argument("--corpus-mb", type=float, default=24)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--timing-warmup", type=int, default=20)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--out", default="bench/results/gpt_fp8.json")
    ap.add_argument("--png", default="docs/gpt_fp8_loss.png")
    args = ap.parse_args()
    device = torch.device(args.device)
    root, nfiles, data = load_corpus(int(args.corpus_mb * 2**20))
    split = int(data.numel() * 0.95)
    train, held_out = data[:split], data[split:]
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else argparse.Namespace(name="cpu")
    print("corpus: %.1f MiB of %s (%d .py files there); %s" % (data.numel() / 2**20, root, nfiles, props.name), flush=True)
    results = {"device": props.name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
               "config": {k: v for k, v in vars(args).items()}, "corpus": {"root": root, "bytes": data.numel()},
               "runs": {}}
    for mode in args.modes.split(","):
        print("run %s" % mode, flush=True)
        results["runs"][mode] = run(mode, args, train, held_out, device)
    base = results["runs"].get("bf16")
    if base:
        results["ratios_vs_bf16"] = {m: {"final_train_loss": r["final_train_loss"] / base["final_train_loss"],
                                         "eval_loss": r["eval_loss"] / base["eval_loss"],
                                         "step_time": r["step_ms"] / base["step_ms"],
                                         "peak_mem": r["peak_mem_MiB"] / max(base["peak_mem_MiB"], 1e-9)}
                                     for m, r in results["runs"].items() if m != "bf16"}
        for m, r in results["ratios_vs_bf16"].items():
            print("%s vs bf16: final train loss x%.4f, held-out loss x%.4f, step time x%.2f, peak memory x%.2f" % (
                m, r["final_train_loss"], r["eval_loss"], r["step_time"], r["peak_mem"]), flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    if args.png:
        try:
            plot(results, args.png, "GPT %dL d%d, %.0fM params, byte-level on the Python stdlib, batch %dx%d, %s" % (
                args.layers, args.d, next(iter(results["runs"].values()))["params"] / 1e6, args.batch, args.seq,
                props.name))
        except ImportError as e:
            print("no plot (%s); plot from %s later" % (e, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
