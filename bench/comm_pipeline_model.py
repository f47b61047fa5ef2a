#!/usr/bin/env python3
"""A two-stream model of the all-reduce's pipeline (core/communicator.cpp, docs/communicator.md "Pipeline").

Not a measurement: it replays the order in which the host enqueues the pieces' steps -- at step t,
S: Q(t) -> X: RS(t); S: R(t-1) after RS(t-1) -> X: AG(t-1); S: D(t-2) after AG(t-2) -- with costs
linear in a piece's length (microseconds per million elements of a rank's chunk) plus a fixed cost per
transport operation, and prints the time from the first quantization to the last decoding for the
piece schedules of core/communicator.cpp (piece_bounds: pieces of P, or a first and last piece of
P / D and the middle ones of equal length at most P).

The default constants were fitted to the 2 x H200 sweep with the copy-engine setup (256M BF16
elements a rank, C = 128M; docs/communicator.md "Single-pass requantization, measured": 2, 4, 8, 16
equal pieces gave 1050, 1035, 1133, 1385 us without the amax pass and its agreement; the model gives
1034, 1029, 1128, 1382). With them, 4 pieces of C/8, 3C/8, 3C/8, C/8 (P = 3C/8 and D = 3) come out
~37 us below 4 equal pieces, while a fifth piece costs about what its smaller bubbles save. Measured
on 2 x H100 (2026-11-26) the tapered schedule was ~24 us *slower* than 4 equal pieces, so the
library's default is 4 equal pieces again (docs/communicator.md, "Pipeline"): the model misses
something (e.g. the copy-engine operations' cost depending on their size), and is kept as a tool
for reasoning, not as a prediction. Usage: comm_pipeline_model.py [--chunk-m 128] [--q 1.2 --r 0.7 --d 1.1 --x 3.2 --op 17]
"""
import argparse
import math


def bounds(C, P, D):
    """core/communicator.cpp's piece_bounds, in (possibly fractional) millions of elements."""
    if D <= 1 or C <= P or P / D >= P:
        k = math.ceil(C / P - 1e-9)
        return [min(C, i * P) for i in range(k + 1)]
    E = P / D
    rest = C - 2 * E
    b = [0, E]
    if rest > 0:
        m = math.ceil(rest / P - 1e-9)
        b += [E + k * rest / m for k in range(1, m)] + [C - E]
    return b + [C]


def run(pieces, q, r, d, x, op):
    n = len(pieces)
    S = X = 0.0
    rs, ag = {}, {}
    for t in range(n + 2):
        if t < n:
            S += q * pieces[t]
            X = max(X, S) + op + x * pieces[t]
            rs[t] = X
        if 1 <= t <= n:
            p = t - 1
            S = max(S, rs[p]) + r * pieces[p]
            X = max(X, S) + op + x * pieces[p]
            ag[p] = X
        if t >= 2:
            p = t - 2
            S = max(S, ag[p]) + d * pieces[p]
    return S


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--chunk-m", type=float, default=128.0, help="C, millions of elements a rank chunk")
    for name, v, h in (("q", 1.2, "quantize"), ("r", 0.7, "reduce + requantize"), ("d", 1.1, "decode"),
                       ("x", 3.2, "one transfer (all-gather)")):
        a.add_argument("--" + name, type=float, default=v, help=f"us per M elements of a piece: {h}")
    a.add_argument("--op", type=float, default=17.0, help="us of fixed cost per transport operation")
    o = a.parse_args()
    C = o.chunk_m
    print(f"C = {C}M elements; us from the first quantization to the last decoding (pieces)")
    for P in (C / 8, C / 6, C / 4, C / 3, 3 * C / 8, C / 2):
        row = []
        for D in (1, 2, 3, 4, 8):
            b = bounds(C, P, D)
            pieces = [b[i + 1] - b[i] for i in range(len(b) - 1)]
            row.append(f"D={D}: {run(pieces, o.q, o.r, o.d, o.x, o.op):6.0f} ({len(pieces)})")
        print(f"P = {P:7.2f}M  " + "  ".join(row))


if __name__ == "__main__":
    main()
