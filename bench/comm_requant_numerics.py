"""The all-reduce's requantization, two definitions compared in float64 (docs/communicator.md,
"Why the wire's scale, not a fresh amax"): the reduced mean requantized with a fresh amax of the
reduced values (the definition until 2026-11-26: a second cross-rank agreement and an amax pass)
against the same mean requantized with the agreed wire scale (the current one). A simulation with
torch's CPU E4M3 casts (round to nearest even), not the library: the library's bytes are checked
against tests/capi/comm_reference.h by the C tests. Outputs rounded to BF16, as in
bench/bench_comm.py, whose data the first rows generate the same way.

    python3 bench/comm_requant_numerics.py [elements]     # default 16M; needs torch (CPU is enough)
"""
import sys

import torch

torch.manual_seed(0)
def e4m3(t):  # RNE into E4M3 (finite values <= 448 + rounding): torch's cast
    return t.to(torch.float8_e4m3fn).to(torch.float32)
def run(xs, label):
    N = len(xs)
    x64 = [x.double() for x in xs]
    exact = sum(x64) / N
    amax = max(float(x.abs().max()) for x in xs)
    s = torch.tensor(448.0, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)
    si = (1.0 / s).float()
    codes = [e4m3(x.float() * s) for x in xs]
    sm = torch.zeros_like(codes[0])
    for c in codes: sm = sm + c
    # old: fresh amax of the reduced values
    f = (si / N).float()
    v = sm * f
    amax2 = float(v.abs().max())
    s2 = (torch.tensor(448.0) / torch.tensor(amax2, dtype=torch.float32)).float()
    si2 = (1.0 / s2).float()
    old = e4m3(v * s2) * si2
    # new: the wire's scale
    g = torch.tensor(1.0 / N, dtype=torch.float32)
    new = e4m3(sm * g) * si
    res = {}
    for name, y in (("old", old), ("new", new)):
        yb = y.to(torch.bfloat16).double()
        d = yb - exact
        res[name] = (float(d.norm() / exact.norm()), float(d.abs().max() / exact.abs().max()))
    # fraction of reduced values in E4M3's subnormal range (|y| < 2^-6 in scaled units)
    sub_old = float(((v * s2).abs() < 2**-6).double().mean()); sub_new = float(((sm * g).abs() < 2**-6).double().mean())
    print(f"{label}: amax_in {amax:.4g}, amax of the mean {amax2:.4g} (ratio {amax2/amax:.3f}); "
          f"rel RMS old {res['old'][0]:.4e} new {res['new'][0]:.4e}; max/amax old {res['old'][1]:.4e} new {res['new'][1]:.4e}; "
          f"subnormal fraction old {sub_old:.2e} new {sub_new:.2e}")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 24
for N in (2, 3, 8):
    xs = []
    for r in range(N):
        g = torch.Generator().manual_seed(1234 + r)
        x = torch.randn(n, generator=g)
        blocks = torch.randint(-6, 3, ((n + 65535) // 65536,), generator=g).float().exp2()
        xs.append((x * blocks.repeat_interleave(65536)[:n]).to(torch.bfloat16).float())
    run(xs, f"bench data, {n} elements, N={N}")
# the tests' data: random sign, magnitude 2^U[lo, hi)
for (lo, hi) in ((-8, 0), (-3, 4), (-10, 3)):
    for N in (2, 3):
        xs = []
        for r in range(N):
            g = torch.Generator().manual_seed(99 + r)
            m = torch.pow(2.0, lo + (hi - lo) * torch.rand(1 << 20, generator=g, dtype=torch.float64))
            sg = torch.where(torch.rand(1 << 20, generator=g) < 0.5, -1.0, 1.0).double()
            xs.append((m * sg).float())
        run(xs, f"log-uniform 2^[{lo},{hi}), N={N}")
# cancellation: ranks hold nearly opposite gradients (worst case for the fixed scale)
g = torch.Generator().manual_seed(7)
a = torch.randn(1 << 20, generator=g)
b = -a + 0.01 * torch.randn(1 << 20, generator=g)
run([a, b], "near-cancelling ranks (x, -x + 0.01 noise), N=2")
