"""Independent float64 references (NumPy and ml_dtypes), written from the formats' definitions:
    - the scaled value is x * scale computed exactly in float64 (both are float32 values) and
      rounded once to float32 (numpy's astype rounds to nearest even);
    - saturating round-to-nearest-even into a format is ml_dtypes' (or numpy's float16) conversion of
      the value clipped to +-max (ml_dtypes itself maps out-of-range values to NaN/inf);
    - the scale is max / 2**margin / amax in float64, rounded to float32, kept in [FLT_MIN, FLT_MAX],
      optionally rounded down to a power of two."""
import ml_dtypes
import numpy as np

import fp8amp

NP = {fp8amp.F32: np.float32, fp8amp.F16: np.float16, fp8amp.BF16: ml_dtypes.bfloat16,
      fp8amp.E4M3: ml_dtypes.float8_e4m3fn, fp8amp.E5M2: ml_dtypes.float8_e5m2}
MAX = {fp8amp.E4M3: 448.0, fp8amp.E5M2: 57344.0, fp8amp.F16: 65504.0}
FLT_MIN, FLT_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)


def scaled_f32(x, scale: float) -> np.ndarray:
    """fl32(x * scale) for float32-representable x (NaN passes through)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(x, dtype=np.float64) * np.float64(np.float32(scale))).astype(np.float32)


def encode_satfinite(y32: np.ndarray, dtype) -> np.ndarray:
    """Saturating RNE of float32 values into a scaled dtype (E4M3, E5M2, F16), as codes (uint8/uint16)."""
    with np.errstate(invalid="ignore", over="ignore"):
        clipped = np.clip(y32, -MAX[dtype], MAX[dtype])
        out = clipped.astype(NP[dtype])
    return out.view(np.uint8 if dtype in (fp8amp.E4M3, fp8amp.E5M2) else np.uint16)


def decode(codes: np.ndarray, dtype) -> np.ndarray:
    """Codes of a dtype as float64 values."""
    return codes.view(NP[dtype]).astype(np.float64)


def scale_for(amax: float, fmt_max: float, margin: int = 0, pow2: bool = False, previous: float = 1.0) -> float:
    if not (amax > 0) or not np.isfinite(amax):
        return previous
    s = fmt_max / 2.0**margin / amax
    s = FLT_MAX if s >= FLT_MAX else float(np.float32(s))
    s = max(s, FLT_MIN)
    if pow2:
        s = 2.0 ** np.floor(np.log2(s))
    return float(np.float32(s))


def random_values(rng, n: int, lo: int, hi: int, dtype=fp8amp.F32, specials: bool = False) -> np.ndarray:
    """n values of a wide dtype, random signs, mantissas and binary exponents in [lo, hi], some zeros;
    with specials a few +-inf and +-NaN at random places."""
    mant = rng.uniform(1.0, 2.0, n)
    exp = rng.integers(lo, hi + 1, n)
    x = np.where(rng.random(n) < 0.5, -1.0, 1.0) * np.ldexp(mant, exp)
    x[rng.random(n) < 0.02] = 0.0
    with np.errstate(over="ignore"):
        x = x.astype(NP[dtype])
    if specials and n >= 8:
        idx = rng.choice(n, 4, replace=False)
        x[idx] = np.array([np.inf, -np.inf, np.nan, -np.nan], dtype=np.float64).astype(NP[dtype])
    return x
