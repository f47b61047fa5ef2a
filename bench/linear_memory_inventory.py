#!/usr/bin/env python3
"""What each fp8amp Linear of bench_gpt's d=2048 GPT holds beyond its parameters and gradients, by lean
level (fp8amp_linear_set_lean), counted on the CPU with fp8amp_linear_memory_bytes and the context's
scratch pool (issue 18: which buffers are alive at the training peak; docs/linear.md section 5).

One block's four Linears (qkv 2048->6144, proj 2048->2048, fc 2048->8192, out 8192->2048; O2: F32
weights, E4M3 weight gradients) run one training forward and one backward on M rows (default 16: the
CPU's reference GEMMs are slow); the saved x8^T (M*K bytes) is reported at the preset's M = 8192, the
rest does not depend on M. Minutes at most on the CPU:

    python3 bench/linear_memory_inventory.py [--rows 16]
"""
import argparse

import torch

import fp8amp.torch as ft

SHAPES = {"qkv": (2048, 6144), "proj": (2048, 2048), "fc": (2048, 8192), "out": (8192, 2048)}
MIB = 2**20


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16, help="rows of the forward on the CPU")
    ap.add_argument("--tokens", type=int, default=8192, help="rows the saved x8^T is reported at")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    out = {}
    for lean in (0, 1, 2):
        for name, (k, n) in SHAPES.items():
            lin = ft.Linear(k, n, weight_dtype=torch.float32, wgrad_dtype=torch.float8_e4m3fn, policy="fp8", lean=lean)
            c, ctx = lin.fp8amp_linear, lin._ctx
            fresh = c.memory_bytes
            x = torch.randn(args.rows, k, requires_grad=True)
            y = lin(x)
            fwd = c.memory_bytes - fresh - args.rows * k - 4  # beyond the saved x8^T and its scale slot
            y.backward(torch.randn_like(y))
            bwd = c.memory_bytes - fresh
            out[lean, name] = (fwd, bwd, ctx.scratch_bytes())
            print("lean %d %-4s (%d params): after the forward %6.1f MiB + x8^T %3d MiB (at %d rows); after the "
                  "backward %6.1f MiB; context scratch %5.1f MiB" % (lean, name, n * k, fwd / MIB, args.tokens * k // MIB,
                                                                    args.tokens, bwd / MIB, out[lean, name][2] / MIB),
                  flush=True)
            ctx.release_scratch()
    return out


if __name__ == "__main__":
    main()
