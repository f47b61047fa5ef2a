"""Why O3 trains worse than O2, on the CPU (issue 20): a small MLP with a GPT's scales (weights
~0.02, AdamW lr 6e-4 with cosine decay to 10%, weight decay 0.1, noisy gradients) trained through
fp8amp's optimizer in several configurations on the same batches, each following its own weights:

  f32        O2 state, F32 weights, no master (what O2 does; the reference trajectory)
  o3         O3: E4M3 weights + F16 master (NEAREST), F32 biases without one -- one optimizer, the
             per-parameter masters of fp8amp_optimizer_add_param_ex
  o3-sr      the same with FP8AMP_MASTER_ROUND_STOCHASTIC
  bf16m      BF16 weights + F16 master (NEAREST): the master's rounding without E4M3's forward error
  bf16m-sr   the same, stochastic
  bf16       BF16 weights without a master, NEAREST (an update below half a BF16 ulp is lost)
  bf16-sr    BF16 weights without a master, STOCHASTIC: MS-AMP's 16-bit O1/O2 weights as the PyTorch
             front keeps them since 2026-11-26 (the parameter is its own value of record)

Per weight tensor it prints: the fraction of the f32 run's updates that are smaller than half an
F16 ulp of the master (block-scaled as the optimizer stores it: the updates a NEAREST master loses),
the same for the weight-decay term alone, the drift ||w - w_f32|| / ||w_f32 - w_0|| at the end, and
each run's held-out loss. numpy + the fp8amp package on a CPU context; no torch.

Usage: PYTHONPATH=<site with fp8amp> python3 bench/o3_master_drift.py [--steps N] [--json out.json]
"""
import argparse
import json
import math

import ml_dtypes
import numpy as np

import fp8amp

D_IN, D_H, D_OUT, BATCH = 64, 256, 32, 32


def half_ulp_f16_blocked(w, block=128):
    """Half an F16 ulp of each element of w as the optimizer's master stores it: per block of 128,
    scaled by the largest power of two 2^k with amax * 2^k <= 65504, then F16."""
    flat = w.reshape(-1).astype(np.float64)
    out = np.empty_like(flat)
    for b in range(0, flat.size, block):
        x = flat[b:b + block]
        amax = np.max(np.abs(x))
        k = 0 if amax == 0 else math.floor(math.log2(65504.0 / amax))
        k = max(-126, min(126, k))
        xs = np.abs(x) * 2.0 ** k
        e = np.floor(np.log2(np.maximum(xs, 2.0 ** -24)))
        ulp = np.where(xs >= 2.0 ** -14, 2.0 ** (e - 10), 2.0 ** -24)
        out[b:b + block] = ulp / 2 * 2.0 ** -k
    return out.reshape(w.shape)


class Run:
    def __init__(self, ctx, name, init, lr, wd):
        self.name = name
        kind = {"f32": "f32", "o3": "e4m3", "o3-sr": "e4m3", "bf16m": "bf16", "bf16m-sr": "bf16", "bf16": "bf16",
                "bf16-sr": "bf16"}[name]
        master = fp8amp.F16 if name not in ("bf16", "bf16-sr") else None
        cfg = fp8amp.AdamConfig.for_level("O2", lr=lr, weight_decay=wd, beta2=0.95,
                                          master_rounding="stochastic" if name.endswith("-sr") else "nearest",
                                          rounding_seed=1234)
        self.opt = fp8amp.Optimizer(ctx, cfg)
        self.kind, self.ctx = kind, ctx
        self.params, self.grads = {}, {}
        for key, v in init.items():
            weight = key.startswith("W")
            if weight and kind == "e4m3":
                meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.DELAYED, amax_history_len=16))
                src = fp8amp.Tensor.from_numpy(ctx, v)
                p = fp8amp.Tensor(ctx, v.shape, fp8amp.E4M3)
                p.set_scaling(meta)
                meta.set_scale(float(2.0 ** math.floor(math.log2(448.0 / np.max(np.abs(v))))))
                fp8amp.ops.quantize(ctx, src, p)
                self._keep = getattr(self, "_keep", []) + [meta]
            elif weight and kind == "bf16":
                p = fp8amp.Tensor.from_numpy(ctx, v.astype(ml_dtypes.bfloat16))
            else:
                p = fp8amp.Tensor.from_numpy(ctx, v)
            g = fp8amp.Tensor(ctx, v.shape, fp8amp.F32)
            if weight and kind != "f32":
                self.opt.add_param(p, g, master=master)
            else:
                self.opt.add_param(p, g, master=None)
            self.params[key], self.grads[key] = p, g

    def value(self, key):
        p = self.params[key]
        x = p.numpy().astype(np.float32)
        if p.dtype == fp8amp.E4M3:
            x = x * float(p.scale_inv().numpy().reshape(-1)[0])
        return x

    def weights(self):
        return {k: self.value(k) for k in self.params}

    def step(self, grads, lr):
        for k, g in grads.items():
            self.grads[k].copy_from_numpy(g.astype(np.float32))
        self.opt.step(lr=lr)


def forward(w, x):
    h = x @ w["W1"] + w["b1"]
    a = np.maximum(h, 0)
    return h, a, a @ w["W2"] + w["b2"]


def loss_and_grads(w, x, y):
    h, a, out = forward(w, x)
    err = out - y
    loss = float(np.mean(err ** 2))
    d_out = 2 * err / err.size
    g = {"W2": a.T @ d_out, "b2": d_out.sum(0)}
    d_h = (d_out @ w["W2"].T) * (h > 0)
    g["W1"] = x.T @ d_h
    g["b1"] = d_h.sum(0)
    return loss, g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0, help="teacher, initial weights and batches")
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    teacher = {"W1": rng.normal(0, 0.15, (D_IN, D_H)), "b1": rng.normal(0, 0.05, D_H),
               "W2": rng.normal(0, 0.1, (D_H, D_OUT)), "b2": rng.normal(0, 0.05, D_OUT)}

    def batch(r, n):
        x = r.standard_normal((n, D_IN))
        return x.astype(np.float32), (forward(teacher, x)[2] + r.normal(0, 0.3, (n, D_OUT))).astype(np.float32)

    init = {"W1": rng.normal(0, 0.02, (D_IN, D_H)).astype(np.float32), "b1": np.zeros(D_H, np.float32),
            "W2": rng.normal(0, 0.02, (D_H, D_OUT)).astype(np.float32), "b2": np.zeros(D_OUT, np.float32)}
    x_test, y_test = batch(np.random.default_rng(99 + 1000 * args.seed), 4096)
    ctx = fp8amp.Context("cpu")
    names = ["f32", "o3", "o3-sr", "bf16m", "bf16m-sr", "bf16", "bf16-sr"]
    runs = [Run(ctx, n, init, args.lr, args.wd) for n in names]
    w0 = {n: r.weights() for n, r in zip(names, runs)}
    lost = {k: [0, 0, 0] for k in ("W1", "W2")}  # updates below half an ulp, decay terms below, all
    data = np.random.default_rng(1 + 1000 * args.seed)
    for t in range(args.steps):
        lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t / args.steps)))
        x, y = batch(data, BATCH)
        for r in runs:
            w = r.weights()
            _, g = loss_and_grads(w, x, y)
            r.step(g, lr)
            if r.name == "f32":
                w_new = r.weights()
                for k in lost:
                    hu = half_ulp_f16_blocked(w_new[k])
                    lost[k][0] += int(np.sum(np.abs(w_new[k] - w[k]) < hu))
                    lost[k][1] += int(np.sum(np.abs(lr * args.wd * w[k]) < hu))
                    lost[k][2] += w[k].size
    result = {"steps": args.steps, "lr": args.lr, "wd": args.wd, "seed": args.seed, "runs": {}}
    ref = runs[0].weights()
    print("per weight tensor, along the f32 run: updates below half an F16 ulp of the master / "
          "weight-decay terms below it")
    for k, (a, b, n) in lost.items():
        print("  %s: %.1f%% / %.1f%%" % (k, 100.0 * a / n, 100.0 * b / n))
    result["below_half_ulp"] = {k: a / n for k, (a, b, n) in lost.items()}
    result["decay_below_half_ulp"] = {k: b / n for k, (a, b, n) in lost.items()}
    for r in runs:
        w = r.weights()
        test_loss = loss_and_grads(w, x_test, y_test)[0]
        drift = {k: float(np.linalg.norm(w[k] - ref[k]) / np.linalg.norm(ref[k] - w0["f32"][k])) for k in w}
        result["runs"][r.name] = {"test_loss": test_loss, "drift": drift, "state_bytes": r.opt.state_bytes}
        print("%-9s held-out loss %.5f  drift %s" % (r.name, test_loss,
                                                     " ".join("%s %.4f" % (k, v) for k, v in drift.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
