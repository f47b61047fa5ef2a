#!/usr/bin/env python3
"""How often an O2 step changes a state block's scale (CPU, through the Python binding).

The fast CUDA kernel writes every block's new scale_inv of m and v at every step (docs/performance.md,
"Adam", fourth round: those writes cost the update's byte mix about 4% in the stream probe). A block's
scale is a power of two that moves only when the block's amax crosses one, so most writes store the
value already there. This script measures how many do not, on two problems:

  - "mlp": a 2-layer MLP (64 -> 1024 -> 10, ReLU, softmax cross-entropy) trained on overlapping
    Gaussian clusters with 10% label noise and fresh mini-batches of 64: gradients that change every
    step and a loss that stays well above zero, as in training;
  - "fixed": one random gradient (N(0, 1e-3)) reused at every step, as bench/bench_adam.py does.

Each step saves the optimizer's checkpoint and reads the block scales of m and v from it (format:
docs/api.md 12.6; F32 parameters, so no parameter metas), then counts the blocks whose scale differs
from the step before. Prints JSON: per problem, the fraction changed per step for m and v, and their
means over steps 11..N (after the first steps, where every scale moves).

Usage: PYTHONPATH=<binding site> FP8AMP_HEADER=capi/include/fp8amp/fp8amp.h python3 bench/adam_scale_churn.py
(the binding built as bindings/python/run_tests.sh does), [--steps 300] [--out file.json]
"""
import argparse
import json
import struct

import numpy as np

import fp8amp


def block_scales(ckpt: bytes):
    """{parameter index: (m scale_inv array, v scale_inv array)} from an O2 checkpoint of F32 params."""
    (count,) = struct.unpack_from("<I", ckpt, 88)
    at, out = 92, {}
    for k in range(count):
        pd, gd, ndim = struct.unpack_from("<iii", ckpt, at)
        at += 12
        shape = struct.unpack_from("<%dq" % ndim, ckpt, at)
        at += 8 * ndim
        has_meta, nscales = struct.unpack_from("<BQ", ckpt, at)
        at += 9
        if has_meta:
            raise ValueError("this reader handles parameters without a meta (F32) only")
        numel = int(np.prod(shape)) if ndim else 1
        at += numel * 4                                   # the F32 parameter
        at += numel * 1                                   # m, E4M3
        ms = np.frombuffer(ckpt, np.float32, nscales, at)
        at += 4 * nscales
        at += numel * 2                                   # v, F16
        vs = np.frombuffer(ckpt, np.float32, nscales, at)
        at += 4 * nscales
        out[k] = (ms.copy(), vs.copy())
    return out


def churn(opt, before):
    now = block_scales(opt.save())
    changed = [0, 0]
    total = 0
    for k, (ms, vs) in now.items():
        if before is not None:
            changed[0] += int(np.count_nonzero(ms != before[k][0]))
            changed[1] += int(np.count_nonzero(vs != before[k][1]))
        total += ms.size
    return now, changed[0] / total, changed[1] / total


def run(problem: str, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    ctx = fp8amp.Context("cpu")
    shapes = [(64, 1024), (1024, 10)]
    weights = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    params = [fp8amp.Tensor.from_numpy(ctx, w) for w in weights]
    grads = [fp8amp.Tensor(ctx, s, fp8amp.DType.F32) for s in shapes]
    opt = fp8amp.Optimizer(ctx, fp8amp.AdamConfig.for_level("O2", lr=1e-3), list(zip(params, grads)))
    centers = rng.standard_normal((10, 64)).astype(np.float32) * 0.3  # overlapping clusters: the loss stays up
    fixed = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]
    fm, fv, losses = [], [], []
    before = None
    for step in range(steps):
        if problem == "fixed":
            gs = fixed
        else:
            c = rng.integers(0, 10, 64)
            x = centers[c] + rng.standard_normal((64, 64)).astype(np.float32)
            y = np.where(rng.random(64) < 0.1, rng.integers(0, 10, 64), c)  # 10% label noise
            w1, w2 = params[0].numpy(), params[1].numpy()
            h = np.maximum(x @ w1, 0.0)
            logits = h @ w2
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            losses.append(float(-np.log(p[np.arange(64), y] + 1e-12).mean()))
            d = p.copy()
            d[np.arange(64), y] -= 1.0
            d /= 64.0
            g2 = h.T @ d
            g1 = x.T @ ((d @ w2.T) * (h > 0))
            gs = [g1.astype(np.float32), g2.astype(np.float32)]
        for t, g in zip(grads, gs):
            t.copy_from_numpy(g)
        opt.step()
        before, cm, cv = churn(opt, before)
        if step > 0:
            fm.append(cm)
            fv.append(cv)
    res = {"steps": steps, "blocks": int(sum(np.prod(s) for s in shapes) // 128),
           "m_changed_per_step": [round(x, 4) for x in fm], "v_changed_per_step": [round(x, 4) for x in fv],
           "m_mean_after_10": float(np.mean(fm[10:])), "v_mean_after_10": float(np.mean(fv[10:]))}
    if losses:
        res["loss_first_last"] = [round(losses[0], 4), round(float(np.mean(losses[-20:])), 4)]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {p: run(p, a.steps, a.seed) for p in ("mlp", "fixed")}
    for p, r in res.items():
        print("%-6s m: %.4f of the blocks change scale per step, v: %.4f (means over steps 11..%d)%s" % (
            p, r["m_mean_after_10"], r["v_mean_after_10"], a.steps,
            "; loss %.3f -> %.3f" % tuple(r["loss_first_last"]) if "loss_first_last" in r else ""))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
