"""Cross-checks fp8amp_cast against ml_dtypes, an independent FP8 implementation (JAX's).

Every F16 and BF16 value and fresh random F32 values are converted to E4M3 and E5M2 by the library
(through its public C API, via the fp8amp package's CFFI module built against the given library:
bindings/python/binding_for.py) and by ml_dtypes. ml_dtypes does not saturate (it maps values
beyond the range to NaN or inf), so the reference converts the input clipped to +-max, which is what
saturating round-to-nearest-even means. NaN must stay NaN with its sign. All 256 codes of each format
are decoded by both and compared too. Runs on the CPU, and on CUDA when a GPU is present.

Usage: codecs_vs_ml_dtypes.py path/to/libfp8amp.so cpu|cuda
Exit 77 = skipped (ctest reports SKIPPED): numpy/ml_dtypes or the binding's build tools (cffi,
setuptools, wheel, Python's headers) missing, or cuda asked for with no GPU.
"""
import os
import sys

try:
    import ml_dtypes
    import numpy as np
except ImportError as e:  # reported as SKIPPED by ctest (SKIP_RETURN_CODE 77)
    print(f"SKIPPED: {e}; pip install numpy ml_dtypes")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
from binding_for import MissingBuildTools, import_fp8amp  # noqa: E402

try:
    fp8amp = import_fp8amp(sys.argv[1])
except MissingBuildTools as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)
ffi, lib = fp8amp._ffi, fp8amp._lib

F32, F16, BF16 = lib.FP8AMP_DTYPE_F32, lib.FP8AMP_DTYPE_F16, lib.FP8AMP_DTYPE_BF16
E4M3, E5M2 = lib.FP8AMP_DTYPE_E4M3, lib.FP8AMP_DTYPE_E5M2
CPU, CUDA = lib.FP8AMP_DEVICE_CPU, lib.FP8AMP_DEVICE_CUDA
NP = {F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16,
      E4M3: ml_dtypes.float8_e4m3fn, E5M2: ml_dtypes.float8_e5m2}
MAX = {E4M3: 448.0, E5M2: 57344.0}


def check(status):
    if status != lib.FP8AMP_SUCCESS:
        raise RuntimeError(f"status {status}: {ffi.string(lib.fp8amp_last_error_message()).decode()}")


def cast(device, x: np.ndarray, dst_dtype: int) -> np.ndarray:
    """Converts x with fp8amp_cast on `device` (copying through device tensors on CUDA)."""
    src_dtype = next(k for k, v in NP.items() if x.dtype == v)
    ctx = ffi.new("fp8amp_context *")
    check(lib.fp8amp_context_create(device, ctx))
    shape = ffi.new("int64_t[1]", [x.size])
    out = np.empty(x.size, dtype=NP[dst_dtype])
    out.view(np.uint8)[:] = 0xA5  # poison
    a, b = ffi.new("fp8amp_tensor *"), ffi.new("fp8amp_tensor *")
    check(lib.fp8amp_tensor_create(ctx[0], src_dtype, 1, shape, a))
    check(lib.fp8amp_tensor_create(ctx[0], dst_dtype, 1, shape, b))
    check(lib.fp8amp_tensor_copy_from_host(a[0], ffi.from_buffer(x), x.nbytes))
    check(lib.fp8amp_cast(ctx[0], a[0], b[0]))
    check(lib.fp8amp_tensor_copy_to_host(b[0], ffi.from_buffer(out), out.nbytes))
    for t in (a, b):
        check(lib.fp8amp_tensor_destroy(t[0]))
    check(lib.fp8amp_context_destroy(ctx[0]))
    return out


def compare_encode(device, x: np.ndarray, fmt: int, label: str) -> int:
    got = cast(device, x, fmt)
    x32 = x.astype(np.float32)
    with np.errstate(invalid="ignore"):  # NaN inputs: compared separately below
        want = np.clip(x32, -MAX[fmt], MAX[fmt]).astype(NP[fmt])
    nan = np.isnan(x32)
    g, w = got.view(np.uint8), want.view(np.uint8)
    bad_value = (~nan) & (g != w)
    bad_nan = nan & ~(np.isnan(got.astype(np.float32)) & (np.signbit(got.astype(np.float32)) == np.signbit(x32)))
    bad = np.flatnonzero(bad_value | bad_nan)
    for i in bad[:5]:
        print(f"  {label} -> {NP[fmt].__name__}: x={x32[i]!r} got 0x{g[i]:02x} want 0x{w[i]:02x}")
    return len(bad)


def run(device) -> int:
    failures = 0
    name = "cuda:0" if device["type"] == CUDA else "cpu"
    all16 = np.arange(65536, dtype=np.uint16)
    rng = np.random.default_rng()  # fresh data each run
    mant = rng.uniform(1.0, 2.0, 1_000_000)
    rand32 = (np.ldexp(mant, rng.integers(-30, 20, mant.size)) * rng.choice([-1.0, 1.0], mant.size)).astype(np.float32)
    inputs = [("all f16", all16.view(np.float16)), ("all bf16", all16.view(ml_dtypes.bfloat16)),
              ("random f32", rand32)]
    for fmt in (E4M3, E5M2):
        for label, x in inputs:
            n = compare_encode(device, x, fmt, label)
            print(f"[{name}] {label:10s} -> {NP[fmt].__name__:14s}: {'ok' if n == 0 else f'{n} MISMATCHES'}")
            failures += n
        codes = np.arange(256, dtype=np.uint8).view(NP[fmt])
        got = cast(device, codes, F32)
        want = codes.astype(np.float32)
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        print(f"[{name}] all 256 {NP[fmt].__name__} codes -> f32: {'ok' if same.all() else 'MISMATCH'}")
        failures += int((~same).sum())
    return failures


def main() -> int:
    which = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    if which == "cuda":
        n_cuda = ffi.new("int32_t *")
        check(lib.fp8amp_device_count(CUDA, n_cuda))
        if n_cuda[0] == 0:
            print("SKIPPED: no CUDA device")
            return 77
        failures = run({"type": CUDA, "index": 0})
    else:
        failures = run({"type": CPU, "index": 0})
    print("codecs vs ml_dtypes:", "PASSED" if failures == 0 else f"FAILED ({failures} mismatches)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
