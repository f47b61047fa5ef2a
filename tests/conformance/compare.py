"""Compares the conformance runners' files (tests/conformance/SCENARIO.md).

Usage: compare.py DIR [--require c,python[,java,rust]]

DIR holds one file per runner, named <binding>.bin (c.bin, python.bin, java.bin, rust.bin, ...).
  (a) every file is byte-identical to c.bin, the optimizer's checkpoint included; the first differing
      record is named, with its offset, and a checksum of every record of every file is printed;
  (b) c.bin's numbers agree with an independent float64 + ml_dtypes reference of the scenario, which
      uses no fp8amp code (the tolerances and how they are derived are in tests/conformance/README.md).
--require lists the bindings whose files must be present (c is always required). The bindings that
were compared are printed. Exit 0 when everything holds, 1 otherwise, 77 (ctest: SKIPPED) when all
present files hold but a required runner left <binding>.skipped instead of its file (its tools are
missing on this machine) or numpy/ml_dtypes are missing here.
"""
import argparse
import os
import sys

try:
    import ml_dtypes
    import numpy as np
except ImportError as e:  # the reference needs them; tests/install_deps.sh installs them
    print("SKIPPED: compare.py needs numpy and ml_dtypes (%s)" % e)
    sys.exit(77)

M, K, N = 16, 32, 24
F32, F64 = np.float32, np.float64
E4M3, E5M2, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16
U32 = 2.0 ** -24  # float32 unit roundoff

# (name, bytes, numpy dtype, shape), in file order: SCENARIO.md, "The output file".
RECORDS = [
    ("Q", 512, E4M3, (M, K)),
    ("D", 2048, "<f4", (M, K)),
    ("Y", 1536, "<f4", (M, N)),
    ("DX", 2048, "<f4", (M, K)),
    ("WGRAD", 768, E4M3, (N, K)),
    ("WGRAD_SCALE_INV", 4, "<f4", ()),
    ("BGRAD", 96, "<f4", (N,)),
    ("W_AFTER", 1536, BF16, (N, K)),
    ("B_AFTER", 96, "<f4", (N,)),
    ("FOUND_INF", 4, "<i4", ()),
]
TOTAL = sum(r[1] for r in RECORDS)
assert TOTAL == 8648
# Then the optimizer's checkpoint after the step: CHECKPOINT_SIZE (uint64) and CHECKPOINT (that many
# bytes; fp8amp's own format, compared byte for byte, not decoded here).


def layout(data):
    """[(name, offset, size)] of every record of a file, the checkpoint's included; None when the
    file is too short or its checkpoint length does not match its size."""
    out, off = [], 0
    for name, size, _, _ in RECORDS:
        out.append((name, off, size))
        off += size
    if len(data) < off + 8:
        return None
    n = int(np.frombuffer(data[off:off + 8], dtype="<u8")[0])
    out.append(("CHECKPOINT_SIZE", off, 8))
    out.append(("CHECKPOINT", off + 8, n))
    return out if len(data) == off + 8 + n else None


def split(data):
    out, off = {}, 0
    for name, size, dtype, shape in RECORDS:
        out[name] = np.frombuffer(data[off:off + size], dtype=dtype).reshape(shape)
        off += size
    return out


def first_difference(a, b):
    """(record name, byte offset in the file, offset in the record) of the first differing byte."""
    for name, off, size in layout(a):
        for i in range(size):
            if off + i >= len(a) or off + i >= len(b) or a[off + i] != b[off + i]:
                return name, off + i, i
    if len(b) != len(a):
        return "(the end: %d bytes against %d)" % (len(b), len(a)), min(len(a), len(b)), 0
    return None


def checksums(data):
    """{record: the first 16 hex digits of its SHA-256}."""
    import hashlib
    return {name: hashlib.sha256(data[off:off + size]).hexdigest()[:16] for name, off, size in layout(data)}


# ---- the reference: SCENARIO.md computed with numpy float64 and ml_dtypes' codecs ---------------

def inputs():
    def gen(n, mul, mod, off, div):
        i = np.arange(n, dtype=np.int64)
        return ((i * mul) % mod - off).astype(F32) / F32(div)  # IEEE float32 division
    return (gen(M * K, 7919, 2003, 1001, 173.0).reshape(M, K), gen(N * K, 104729, 1999, 999, 4096.0).reshape(N, K),
            gen(N, 31, 17, 8, 64.0), gen(M * N, 31337, 997, 498, 256.0).reshape(M, N))


def quantize(a, scale, fmt, fmax):
    """docs/numerics.md 5.1: fp8_rne_satfinite(fl32(a * scale)), as float64 values of the codes."""
    y = (a.astype(F32) * F32(scale)).astype(F32)
    y = np.clip(y, -fmax, fmax)  # saturation (ml_dtypes itself would give NaN past the range)
    return y.astype(fmt).astype(F64)


def current_scale(amax, fmax):
    """docs/numerics.md 5.4 with margin 0, no power of two: scale = fl32(fmax / amax), scale_inv = fl32(1/scale)."""
    s = F32(fmax) / F32(amax)
    return s, F32(1.0) / s


def bf16_spacing(v):
    """The BF16 ulp at |v| (normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -126)))
    return 2.0 ** (e - 7)


def f32_spacing(v):
    return np.spacing(np.abs(v).astype(F32)).astype(F64)


class Checker:
    def __init__(self):
        self.failures = []

    def check(self, name, got, ref, tol, what):
        got, ref = np.asarray(got, dtype=F64), np.asarray(ref, dtype=F64)
        tol = np.broadcast_to(np.asarray(tol, dtype=F64), ref.shape)
        if not np.all(np.isfinite(got)):
            bad = np.argwhere(~np.isfinite(got).reshape(ref.shape))
            self.failures.append("%s: not finite at %s (%s)" % (name, bad[0].tolist(), got.reshape(ref.shape)[tuple(bad[0])]))
            return
        err = np.abs(got - ref)
        ok = err <= tol
        worst = float(np.max(err / np.maximum(tol, 1e-300))) if err.size else 0.0
        if not np.all(ok):
            idx = tuple(np.argwhere(~ok)[0])
            self.failures.append("%s: %s: at %s got %r, reference %r, |diff| %.3g > tolerance %.3g (%d of %d elements)"
                                 % (name, what, [int(v) for v in idx], float(got[idx]), float(ref[idx]), float(err[idx]), float(tol[idx]),
                                    int(np.sum(~ok)), ok.size))
        else:
            print("  %-16s ok  %s; max |diff|/tolerance %.3g, max |diff| %.3g"
                  % (name, what, worst, float(np.max(err)) if err.size else 0.0))


def check_reference(rec):
    """Checks the C runner's records against the independent reference; returns the failures."""
    c = Checker()
    x, w, b, dy = inputs()

    # 1. Quantize at scale 4 (a power of two: the product is exact) and dequantize at 1/4.
    q_ref = quantize(x, 4.0, E4M3, 448.0)
    q_bytes = np.asarray(q_ref).astype(E4M3).view(np.uint8)
    if not np.array_equal(rec["Q"].view(np.uint8), q_bytes):
        i = tuple(np.argwhere(rec["Q"].view(np.uint8) != q_bytes)[0])
        c.failures.append("Q: code 0x%02x at %s, reference 0x%02x" % (rec["Q"].view(np.uint8)[i], list(i), q_bytes[i]))
    else:
        print("  %-16s ok  E4M3 codes of X*4 bit for bit" % "Q")
    c.check("D", rec["D"], q_ref * 0.25, 0.0, "exactly the codes times 1/4")

    # 2. The Linear (docs/linear.md 3.1-3.3), from the same quantized operands as the library:
    #    x8 = E4M3(x) with the INPUT meta (delayed scaling, fresh: scale 1); W8 = E4M3(W_bf16) with the
    #    WEIGHT meta (current scaling: 448 / amax); dY8 = E5M2(dy) with GRAD_OUTPUT (HYBRID, delayed:
    #    scale 1); the bias enters rounded to BF16. Products of FP8 values are exact, and so are their
    #    float64 sums here; the library sums in float32, so each result may differ from the exact one
    #    by the float32 accumulation bound K*u*sum|terms| (Higham's gamma_K, K terms) plus one u per
    #    later rounding (scale_inv product, its multiply, the bias add, the output) -- (K + 4) * u.
    wb = w.astype(BF16).astype(F32)
    sw, sw_inv = current_scale(np.max(np.abs(wb)), 448.0)
    x8 = quantize(x, 1.0, E4M3, 448.0)
    w8 = quantize(wb, sw, E4M3, 448.0)
    dy8 = quantize(dy, 1.0, E5M2, 57344.0)
    s_y = F64(F32(1.0) * sw_inv)
    b_r = b.astype(BF16).astype(F64)
    y_ref = (x8 @ w8.T) * s_y + b_r
    y_tol = (K + 4) * U32 * ((np.abs(x8) @ np.abs(w8).T) * s_y + np.abs(b_r))
    c.check("Y", rec["Y"], y_ref, y_tol, "x8 W8^T * s_x^-1 s_W^-1 + bf16(b) within (K+4)u*sum|terms|")
    dx_ref = (dy8 @ w8) * s_y
    dx_tol = (N + 4) * U32 * (np.abs(dy8) @ np.abs(w8)) * s_y
    c.check("DX", rec["DX"], dx_ref, dx_tol, "dY8 W8 * s_dY^-1 s_W^-1 within (N+4)u*sum|terms|")
    # The weight gradient: the FP32 sum dY8^T x8 (M terms), quantized with current scaling. Its
    # scale_inv follows the sum's amax: within (M+4)u relative of 1/fl32(448/amax_exact). Each code
    # is then within half an E4M3 step of sum * scale: 2^-4 relative for a normal code, 2^-10 / scale
    # absolute below 2^-6 (subnormal codes), plus the sum's own error.
    dw_ref = dy8.T @ x8
    dw_err = (M + 4) * U32 * (np.abs(dy8).T @ np.abs(x8))
    _, si_ref = current_scale(np.max(np.abs(dw_ref)), 448.0)
    si = float(rec["WGRAD_SCALE_INV"])
    c.check("WGRAD_SCALE_INV", si, F64(si_ref), (M + 4) * U32 * float(si_ref), "1/fl32(448/amax(dY8^T x8))")
    wgrad = rec["WGRAD"].astype(F64) * si
    c.check("WGRAD", wgrad, dw_ref, np.maximum(2.0 ** -4 * np.abs(dw_ref), 2.0 ** -10 * si) + dw_err * 1.0625,
            "codes * scale_inv vs dY8^T x8 within half an E4M3 step")
    # The bias gradient: column sums of dy itself, in float32 (M terms): exact here (multiples of
    # 2^-8 below 2^5 need 13 bits), bounded by M*u*sum|dy| in general.
    bg_ref = dy.astype(F64).sum(axis=0)
    c.check("BGRAD", rec["BGRAD"], bg_ref, M * U32 * np.abs(dy).astype(F64).sum(axis=0), "column sums of dY")

    # 3. One AdamW step (t = 1) in float64 on the gradients the library was given: the decoded WGRAD
    #    times its scale_inv and BGRAD. The O2 preset's hyperparameters (float32 values, as in the
    #    desc), lr 1e-3. The step uses m and v of this step before they are stored in E4M3/F16
    #    (kernels/adam.hpp), so the state's precision does not enter the first update; what remains
    #    is the float32 arithmetic (about ten roundings of quantities no larger than |p| + lr: 16u of
    #    that) and the final rounding of p to its dtype: half a BF16 (weight) or F32 (bias) ulp.
    lr, beta1, beta2, eps, wd = (F64(F32(v)) for v in (1e-3, 0.9, 0.999, 1e-8, 0.01))

    def adamw(p, g):
        p = p * (1.0 - lr * wd)
        m = (1.0 - beta1) * g
        v = (1.0 - beta2) * g * g
        denom = np.sqrt(v) / np.sqrt(1.0 - beta2) + eps
        return p - lr / (1.0 - beta1) * (m / denom)

    w_ref = adamw(wb.astype(F64), wgrad)
    w_got = rec["W_AFTER"].astype(F64)
    c.check("W_AFTER", w_got, w_ref, 0.5 * np.maximum(bf16_spacing(w_ref), bf16_spacing(w_got))
            + 16 * U32 * (np.abs(w_ref) + lr), "float64 AdamW step, within half a BF16 ulp + 16u(|p|+lr)")
    b_ref = adamw(b.astype(F64), rec["BGRAD"].astype(F64))
    c.check("B_AFTER", rec["B_AFTER"], b_ref, 0.5 * f32_spacing(b_ref) + 16 * U32 * (np.abs(b_ref) + lr),
            "float64 AdamW step, within half an F32 ulp + 16u(|p|+lr)")
    # The step must have moved every parameter that has a nonzero gradient (a no-op step would
    # otherwise pass for the elements where lr is below half a BF16 ulp).
    moved = rec["B_AFTER"].astype(F64) != b
    if not np.all(moved[rec["BGRAD"] != 0]):
        c.failures.append("B_AFTER: the step left a bias element with a nonzero gradient unchanged")
    if int(rec["FOUND_INF"]) != 0:
        c.failures.append("FOUND_INF: %d, expected 0" % int(rec["FOUND_INF"]))
    else:
        print("  %-16s ok  0" % "FOUND_INF")
    return c.failures


def self_test(c_data):
    """The compare must catch what it is for: returns the mutations it missed."""
    import struct
    offsets, off = {}, 0
    for name, size, _, _ in RECORDS:
        offsets[name] = off
        off += size
    missed = []
    flips = {"Y": offsets["Y"] + 5,  # one bit of one float of Y: within Y's tolerance, not the same file
             "CHECKPOINT": dict((n, o) for n, o, _ in layout(c_data))["CHECKPOINT"] + len(c_data[TOTAL + 8:]) // 2}
    for record, at in flips.items():
        flipped = bytearray(c_data)
        flipped[at] ^= 0x01
        d = first_difference(c_data, bytes(flipped))
        what = "a flipped bit of %s in another file" % record
        if not d or d[0] != record:
            missed.append(what)
        else:
            print("  self-test: %-36s caught: differs first in record %s" % (what, d[0]))
    x, w, b, dy = inputs()
    cases = {
        "a step that did nothing": ("W_AFTER", w.astype(BF16).tobytes()),
        "a NaN in DX": ("DX", struct.pack("<f", float("nan"))),
        "a dequantize at the wrong scale": ("D", (split(c_data)["D"] * F32(2)).astype("<f4").tobytes()),
        "a bias gradient 64 ulps off": ("BGRAD", (split(c_data)["BGRAD"] + np.spacing(split(c_data)["BGRAD"]) * 64).astype("<f4").tobytes()),
        "FOUND_INF 1": ("FOUND_INF", struct.pack("<i", 1)),
    }
    for what, (name, raw) in cases.items():
        bad = bytearray(c_data)
        bad[offsets[name]:offsets[name] + len(raw)] = raw
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            found = check_reference(split(bytes(bad)))
        print("  self-test: %-36s %s" % (what, "caught: " + found[0][:90] if found else "NOT CAUGHT"))
        if not found:
            missed.append(what)
    return missed


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the folder of <binding>.bin files")
    ap.add_argument("--require", default="c", help="comma-separated bindings whose files must exist (c always)")
    ap.add_argument("--self-test", action="store_true",
                    help="also check that broken copies of c.bin are caught (a flipped bit, a no-op step, a NaN, ...)")
    a = ap.parse_args(argv)
    required = {"c"} | {s.strip() for s in a.require.split(",") if s.strip()}
    files = {}
    if os.path.isdir(a.dir):
        for fn in sorted(os.listdir(a.dir)):
            if fn.endswith(".bin"):
                files[fn[:-4]] = os.path.join(a.dir, fn)
    missing = sorted(required - set(files))
    skipped = [b for b in missing if os.path.exists(os.path.join(a.dir, b + ".skipped"))]
    missing = [b for b in missing if b not in skipped]
    if "c" in skipped or missing:
        print("FAIL: no file from %s in %s (its runner did not run or failed)"
              % (", ".join(missing or ["c"]), a.dir))
        return 1
    failures = []
    data = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            data[name] = f.read()
        if layout(data[name]) is None:
            failures.append("%s: %d bytes, not the scenario's %d plus an 8-byte checkpoint length and that many bytes"
                            % (path, len(data[name]), TOTAL))
        elif len(data[name]) == TOTAL + 8:
            failures.append("%s: the optimizer's checkpoint is empty" % path)
    if failures:
        print("\n".join("FAIL: " + m for m in failures))
        return 1
    print("(a) byte-identical to the C runner's file:")
    for name in sorted(files):
        if name == "c":
            continue
        d = first_difference(data["c"], data[name])
        if d is None:
            print("  %-8s identical (%d bytes, a %d-byte checkpoint included)"
                  % (name, len(data[name]), len(data[name]) - TOTAL - 8))
        else:
            failures.append("%s.bin differs from c.bin first in record %s (byte %d of the file, %d of the record)"
                            % (name, d[0], d[1], d[2]))
    sums = {name: checksums(d) for name, d in data.items()}
    order = ["c"] + sorted(n for n in data if n != "c")
    print("checksums (SHA-256, first 16 hex digits) of every record, by binding:")
    print("  %-16s %s" % ("record", " ".join("%-16s" % n for n in order)))
    for rec in sums["c"]:
        print("  %-16s %s" % (rec, " ".join("%-16s" % sums[n].get(rec, "-") for n in order)))
    print("(b) the C runner's numbers against the float64 + ml_dtypes reference:")
    failures += check_reference(split(data["c"]))
    if a.self_test:
        failures += ["self-test: not caught: " + m for m in self_test(data["c"])]
    print("compared bindings: %s" % ", ".join(["c"] + sorted(n for n in files if n != "c")))
    if failures:
        print("\n".join("FAIL: " + m for m in failures))
        return 1
    if skipped:
        print("SKIPPED: the runners of %s were skipped (%s.skipped says why); the others pass"
              % (", ".join(skipped), os.path.join(a.dir, skipped[0])))
        return 77
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
