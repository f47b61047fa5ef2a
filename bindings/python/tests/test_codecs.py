"""fp8amp.cast (the codec, scale 1) against ml_dtypes and NumPy: every F16 and BF16 value and fresh
random F32 values into E4M3/E5M2 (saturating), F16 and BF16 (IEEE), and every FP8 code decoded."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp
from refs import MAX, NP


def cast(ctx, x: np.ndarray, dst) -> np.ndarray:
    with fp8amp.Tensor.from_numpy(ctx, x) as a, fp8amp.Tensor(ctx, x.shape, dst) as b:
        b.copy_from_numpy(np.frombuffer(b"\xa5" * b.nbytes, dtype=NP[dst]).reshape(x.shape))  # poison
        fp8amp.cast(ctx, a, b)
        return b.numpy()


def expect_same(got: np.ndarray, want: np.ndarray, x: np.ndarray, label: str) -> None:
    """Bit-equal codes, except that a NaN only has to stay a NaN with its sign."""
    g, w = got.view(np.uint8 if got.dtype.itemsize == 1 else np.uint16), want.view(g_type(want))
    xf = x.astype(np.float32)
    nan = np.isnan(xf)
    gf = got.astype(np.float32)
    bad = (~nan & (g != w)) | (nan & ~(np.isnan(gf) & (np.signbit(gf) == np.signbit(xf))))
    idx = np.flatnonzero(bad)
    assert idx.size == 0, "%s: %d mismatches, first x=%r got %r want %r" % (
        label, idx.size, xf[idx[0]], g[idx[0]], w[idx[0]])


def g_type(a):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]


def all_codes_16(dtype) -> np.ndarray:
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(NP[dtype])


@pytest.mark.parametrize("src", [fp8amp.F16, fp8amp.BF16], ids=str)
@pytest.mark.parametrize("dst", [fp8amp.E4M3, fp8amp.E5M2], ids=str)
def test_every_16bit_value_into_fp8(ctx, src, dst):
    x = all_codes_16(src)
    with np.errstate(invalid="ignore"):
        want = np.clip(x.astype(np.float32), -MAX[dst], MAX[dst]).astype(NP[dst])
    expect_same(cast(ctx, x, dst), want, x, "%s -> %s" % (src.short_name, dst.short_name))


def test_random_f32_into_every_dtype(ctx, rng):
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)  # every exponent, NaN payloads and subnormals included
    for dst in (fp8amp.E4M3, fp8amp.E5M2):
        with np.errstate(invalid="ignore"):
            want = np.clip(x, -MAX[dst], MAX[dst]).astype(NP[dst])
        expect_same(cast(ctx, x, dst), want, x, "f32 -> " + dst.short_name)
    for dst in (fp8amp.F16, fp8amp.BF16):  # IEEE: overflow gives inf
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(NP[dst])
        expect_same(cast(ctx, x, dst), want, x, "f32 -> " + dst.short_name)


@pytest.mark.parametrize("src", [fp8amp.E4M3, fp8amp.E5M2], ids=str)
def test_every_fp8_code_decodes(ctx, src):
    codes = np.arange(256, dtype=np.uint8).view(NP[src])
    got = cast(ctx, codes, fp8amp.F32)
    want = codes.astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want) &
                                                            (np.signbit(got) == np.signbit(want)))
    assert same.all()
    assert ml_dtypes.finfo(NP[src]).max == (448.0 if src == fp8amp.E4M3 else 57344.0)


def test_numpy_round_trip_keeps_bits(ctx, rng):
    for d in fp8amp.DType:
        codes = rng.integers(0, 256 ** d.itemsize, 1000, dtype=np.uint64).astype(g_type(np.empty(0, NP[d])))
        x = codes.view(NP[d]).reshape(10, 100)
        with fp8amp.Tensor.from_numpy(ctx, x) as t:
            assert t.dtype == d and t.shape == (10, 100) and t.nbytes == x.nbytes
            assert np.array_equal(t.numpy().view(codes.dtype), x.view(codes.dtype))
        # FP8 data from a framework that only has bytes: a uint8 array with the dtype named
        if d.is_fp8:
            with fp8amp.Tensor.from_numpy(ctx, codes.reshape(10, 100), dtype=d) as t:
                assert t.dtype == d and np.array_equal(t.numpy().view(np.uint8), codes.reshape(10, 100))
