#!/usr/bin/env python3
"""Bytes per parameter, per rank, of fp8amp's O3 -- unsharded and sharded over N = 1, 2, 3 ranks
(fp8amp_optimizer_set_shard) -- beside MS-AMP's O3 table (FP8 weights 1, FP16 masters 2, FP8 grads 1,
FP8 + FP16 states 3 = 7 bytes; its ZeRO optimizer divides the masters and states by N).

    python3 bench/o3_shard_memory.py [--block 128] [--model gpt2-small]

The numbers are the allocation sizes of the code (core/optimizer.cpp add_local, core/optimizer_shard.cpp
add_param_sharded), per E4M3 Linear weight of n elements with an F16 master, its E4M3 weight
gradient written by the Linear, state block B (default 128):
  weights      the E4M3 parameter (1 byte, every rank: the forward needs all of it); sharded, also
               the shard's own copy (k bytes, k = ceil(n/N) rounded up to B), which the kernel writes
               and the all-gather reads;
  masters      F16 master (2k) and its block scales (4 per block);
  states       m E4M3 (k) + v F16 (2k), each with its block scales;
  gradients    the local E4M3 weight gradient (n bytes, every rank);
  step only    sharded: the shards' F32 gradients (4k: the reduce-scatter's float32 output), allocated
               by each step from the context's allocator and released at its end (a caching
               allocator gives that memory to the next forward): part of the step's peak, not held.
Not per parameter: a sharded optimizer also holds one scratch of 4 x N x k of the largest parameter
(the padded F32 gradient for the reduce-scatter, reused for the gathered parameter), and every
optimizer a few hundred bytes of bookkeeping; the scratch is in --model's totals.
The sharded numbers are checked against fp8amp_optimizer_state_bytes per rank by
tests/mpi/test_optimizer_shard.c (the state of a sharded rank minus the unsharded one)."""
import argparse


def shard_k(n, nranks, block):
    k = -(-n // nranks)
    return -(-k // block) * block


def per_param(n, nranks, block, sharded):
    """Bytes of one E4M3 weight of n elements with its master, by category, on one rank."""
    k = shard_k(n, nranks, block) if sharded else n
    blocks = -(-k // block)
    out = {
        "weights": n + (k if sharded else 0),
        "masters": 2 * k + 4 * blocks,
        "states": k + 2 * k + 2 * 4 * blocks,
        "gradients": n,
        "step only": 4 * k if sharded else 0,
    }
    return out


# GPT-2 small (124M): the Linear weights of 12 blocks (qkv, proj, fc, fc2) and the LM head.
MODELS = {
    "gpt2-small": [(768 * 2304, 12), (768 * 768, 12), (768 * 3072, 12), (3072 * 768, 12), (50257 * 768, 1)],
    "one-4096x4096": [(4096 * 4096, 1)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--model", default="gpt2-small", choices=sorted(MODELS))
    a = ap.parse_args()
    cats = ["weights", "masters", "states", "gradients"]  # held between steps; "step only" apart
    big = 1 << 24  # per element, padding negligible
    print("Bytes per parameter per rank (an E4M3 Linear weight with an F16 master, state block %d):\n" % a.block)
    print("| configuration | " + " | ".join(cats) + " | total held | + during the step |")
    print("|---|" + "---|" * (len(cats) + 2))
    rows = [("MS-AMP O3 (its table)", {"weights": 1, "masters": 2, "states": 3, "gradients": 1, "step only": 0}, False)]
    for nr in (2, 3):
        rows.append(("MS-AMP O3 + ZeRO, N=%d" % nr,
                     {"weights": 1, "masters": 2 / nr, "states": 3 / nr, "gradients": 1, "step only": 0}, False))
    rows.append(("fp8amp O3, unsharded", {c: v / big for c, v in per_param(big, 1, a.block, False).items()}, True))
    for nr in (1, 2, 3):
        rows.append(("fp8amp O3, sharded, N=%d" % nr,
                     {c: v / big for c, v in per_param(big, nr, a.block, True).items()}, True))
    for name, d, _ in rows:
        print("| %s | %s | %.3f | %.3f |" % (name, " | ".join("%.3f" % d[c] for c in cats), sum(d[c] for c in cats),
                                            d["step only"]))
    shapes = MODELS[a.model]
    total_params = sum(n * c for n, c in shapes)
    print("\n%s: %d weight elements (%.1f M); per rank, in MB (10^6 bytes):\n" % (a.model, total_params, total_params / 1e6))
    print("| configuration | " + " | ".join(cats) + " | step scratch | total held | bytes/param | + during the step |")
    print("|---|" + "---|" * (len(cats) + 4))
    for name, nranks, sharded in [("unsharded", 1, False), ("sharded N=1", 1, True), ("sharded N=2", 2, True),
                                  ("sharded N=3", 3, True)]:
        sums = dict.fromkeys(cats + ["step only"], 0)
        for n, count in shapes:
            for c, v in per_param(n, nranks, a.block, sharded).items():
                sums[c] += v * count
        scratch = 4 * nranks * max(shard_k(n, nranks, a.block) for n, _ in shapes) if sharded else 0
        tot = sum(sums[c] for c in cats) + scratch
        print("| %s | %s | %.1f | %.1f | %.3f | %.1f |" % (name, " | ".join("%.1f" % (sums[c] / 1e6) for c in cats),
                                                          scratch / 1e6, tot / 1e6, tot / total_params,
                                                          sums["step only"] / 1e6))


if __name__ == "__main__":
    main()
