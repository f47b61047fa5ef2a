"""Aggregates examples/train_gpt_fp8.py results over seeds (issue 20: is O3 within 1% of bf16?).

    python3 bench/gpt_seeds_summary.py --out bench/results/gpt_o3_seeds-....json --png docs/o3_loss.png \
        --commit SHA [--label NAME=GLOB ...] RUN.json ...

Each RUN.json is one seed's output (its "config" has the seed; its "runs" one entry per mode). A
mode may come from several files (e.g. bf16/O1/O2/O3 in one run, an O3 variant in another, same
seeds): --label renames the modes of the files matching GLOB ("O3=*init*" -> "O3 (master_init)").
Writes, per mode, every seed's held-out loss, its ratio to bf16's on the same seed, the mean,
standard error and largest ratio, and the mean loss curve (every 10th step); plots the mean curves."""
import argparse
import fnmatch
import json
import math
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--label", action="append", default=[], help="MODE=GLOB:NEWNAME, e.g. O3=*init*:O3 (master_init)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--png")
    ap.add_argument("--commit", default="")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rules = []
    for lab in args.label:
        mode, rest = lab.split("=", 1)
        glob, name = rest.split(":", 1)
        rules.append((mode, glob, name))
    evals, curves, meta = {}, {}, {}
    for f in args.files:
        d = json.load(open(f))
        seed = d["config"]["seed"]
        meta = {k: d[k] for k in ("device", "date", "torch") if k in d}
        meta["config"] = {k: v for k, v in d["config"].items() if k not in ("seed", "out", "png", "modes")}
        for mode, r in d["runs"].items():
            name = mode
            for m, g, n in rules:
                if m == mode and fnmatch.fnmatch(f, g):
                    name = n
            evals.setdefault(name, {})[seed] = r["eval_loss"]
            curves.setdefault(name, []).append(r["loss"])
    base = evals["bf16"]
    out = dict(meta, commit=args.commit, note=args.note, seeds=sorted(base), modes={})
    for name, per in evals.items():
        seeds = sorted(s for s in per if s in base)
        ratios = [per[s] / base[s] for s in seeds]
        c = curves[name]
        mean_curve = [sum(x[i] for x in c) / len(c) for i in range(0, min(map(len, c)), 10)]
        out["modes"][name] = {
            "held_out": {str(s): per[s] for s in seeds},
            "vs_bf16": {str(s): r for s, r in zip(seeds, ratios)},
            "mean_vs_bf16": statistics.mean(ratios),
            "stderr_vs_bf16": statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else None,
            "max_vs_bf16": max(ratios),
            "mean_train_loss_every_10_steps": mean_curve,
        }
        print("%-18s mean x%.4f  se %.4f  max x%.4f  (%d seeds)" % (
            name, statistics.mean(ratios), out["modes"][name]["stderr_vs_bf16"] or 0, max(ratios), len(seeds)))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for name, r in out["modes"].items():
            c = r["mean_train_loss_every_10_steps"]
            xs = [10 * i + 1 for i in range(len(c))]
            lab = "%s (held-out x%.4f of bf16, mean of %d seeds)" % (name, r["mean_vs_bf16"], len(r["vs_bf16"]))
            a1.plot(xs, c, label=lab)
            a2.plot(xs[len(xs) // 2:], c[len(c) // 2:], label=name)
        a1.set_xlabel("step"); a1.set_ylabel("train loss (mean over seeds)"); a1.legend(fontsize=7)
        a2.set_xlabel("step"); a2.set_title("second half"); a2.legend(fontsize=7)
        fig.suptitle("GPT 57M (8 layers, d=768, 4096 tokens/step), %s" % meta.get("device", ""))
        fig.tight_layout()
        fig.savefig(args.png, dpi=90)


if __name__ == "__main__":
    main()
