"""DLPack: zero-copy exchange with NumPy (CPU), and on a GPU with PyTorch (whose float8 dtypes are a
second reference for the FP8 casts), CuPy and JAX when they are installed; legacy (unversioned)
capsules; ownership of consumed and unconsumed capsules."""
import os

import numpy as np
import pytest

import fp8amp
from refs import MAX, scaled_f32

HAVE_CUDA = fp8amp.device_count("cuda") > 0


def test_numpy_zero_copy_both_ways():
    with fp8amp.Context("cpu") as ctx:
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        t = fp8amp.from_dlpack(a, ctx)
        assert t.data_ptr == a.ctypes.data and t.shape == (3, 4) and t.dtype == fp8amp.F32
        a[1, 2] = 42.0
        assert t.numpy()[1, 2] == 42.0
        b = np.from_dlpack(t)
        assert b.ctypes.data == t.data_ptr
        t.close()  # the exported memory stays valid while b holds it
        del a
        assert b[1, 2] == 42.0
        h = fp8amp.Tensor.from_numpy(ctx, np.ones(4, np.float16))
        assert np.from_dlpack(h).dtype == np.float16
        assert fp8amp.Tensor(ctx, (2,), fp8amp.F32).__dlpack_device__() == (1, 0)


def test_legacy_capsule_and_ownership():
    with fp8amp.Context("cpu") as ctx:
        src = fp8amp.Tensor.from_numpy(ctx, np.arange(6, dtype=np.float32))
        cap = src.__dlpack__()  # no max_version: a legacy "dltensor" capsule
        assert "dltensor" in repr(cap) and "versioned" not in repr(cap)
        t = fp8amp.from_dlpack(cap, ctx)
        assert t.data_ptr == src.data_ptr
        with pytest.raises(TypeError):
            fp8amp.from_dlpack(cap, ctx)  # consumed
        capv = src.__dlpack__(max_version=(1, 1))
        assert "dltensor_versioned" in repr(capv)
        src.close()
        t2 = fp8amp.from_dlpack(capv, ctx)
        assert np.array_equal(t2.numpy(), np.arange(6, dtype=np.float32)) and np.array_equal(t.numpy(), t2.numpy())
        with pytest.raises(BufferError):
            t2.__dlpack__(copy=True)


def test_import_failure_leaves_the_capsule_owned():
    if not HAVE_CUDA:
        pytest.skip("needs a CPU tensor offered to a CUDA context")
    with fp8amp.Context("cpu") as cpu, fp8amp.Context("cuda") as gpu:
        a = np.arange(4, dtype=np.float32)
        cap = a.__dlpack__(max_version=(1, 1))
        with pytest.raises(fp8amp.DeviceMismatchError):
            fp8amp.from_dlpack(cap, gpu)
        t = fp8amp.from_dlpack(cap, cpu)  # still unconsumed, so it can still be imported
        assert t.data_ptr == a.ctypes.data


# ---- GPU frameworks ------------------------------------------------------------------------------

def torch_cuda():
    torch = pytest.importorskip("torch")
    if not (HAVE_CUDA and torch.cuda.is_available()):
        pytest.skip("no CUDA device for PyTorch")
    return torch


@pytest.mark.parametrize("dtype", [fp8amp.E4M3, fp8amp.E5M2, fp8amp.F16], ids=str)
def test_torch_cuda_quantize_against_torch_float8(dtype):
    torch = torch_cuda()
    tdt = {fp8amp.E4M3: torch.float8_e4m3fn, fp8amp.E5M2: torch.float8_e5m2, fp8amp.F16: torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.randn(1024, 777, device="cuda", generator=gen) * torch.exp2(
        torch.randint(-20, 20, (1024, 777), device="cuda", generator=gen).float())
    with fp8amp.Context("cuda") as ctx:
        ctx.set_stream(torch.cuda.current_stream())
        src = fp8amp.from_dlpack(x, ctx)
        assert src.data_ptr == x.data_ptr() and src.shape == tuple(x.shape)
        meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), dtype)
        q = fp8amp.Tensor(ctx, x.shape, dtype)
        qt = fp8amp.Tensor(ctx, (x.shape[1], x.shape[0]), dtype)
        q.set_scaling(meta)
        qt.set_scaling(meta)
        fp8amp.quantize_transpose(ctx, src, q, qt)
        scale = meta.scale
        assert scale == np.float32(MAX[dtype] / x.abs().max().item())
        got = torch.from_dlpack(q)  # zero copy out, FP8 dtype and all
        assert got.dtype == tdt and got.data_ptr() == q.data_ptr
        want = (x.double() * scale).float().clamp(-MAX[dtype], MAX[dtype]).to(tdt)
        bits = torch.uint8 if dtype.is_fp8 else torch.int16
        assert torch.equal(got.view(bits), want.view(bits))
        assert torch.equal(torch.from_dlpack(qt).view(bits), want.t().contiguous().view(bits))
        # dequantize into a torch-owned bf16 tensor, through DLPack
        y = torch.empty(x.shape, dtype=torch.bfloat16, device="cuda")
        fp8amp.dequantize(ctx, q, fp8amp.from_dlpack(y, ctx))
        ctx.synchronize()
        assert torch.equal(y, (want.float() * np.float32(meta.scale_inv)).to(torch.bfloat16))
        # and a torch FP8 tensor imported as is
        back = fp8amp.from_dlpack(want, ctx)
        assert back.dtype == dtype and back.data_ptr == want.data_ptr()
        for o in (src, q, qt, meta, back):
            o.close()


def test_cupy_zero_copy():
    if not HAVE_CUDA:
        pytest.skip("no CUDA device")
    cp = pytest.importorskip("cupy")
    a = cp.arange(1000, dtype=cp.float32)
    with fp8amp.Context("cuda") as ctx:
        t = fp8amp.from_dlpack(a, ctx)
        assert t.data_ptr == a.data.ptr
        b = cp.from_dlpack(t)
        assert b.data.ptr == t.data_ptr and float(b.sum()) == float(a.sum())
        assert fp8amp.amax(ctx, t) == 999.0


def test_jax_zero_copy():
    if not HAVE_CUDA:
        pytest.skip("no CUDA device")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    a = jnp.arange(256, dtype=jnp.float32) * 2
    with fp8amp.Context("cuda") as ctx:
        t = fp8amp.from_dlpack(a, ctx)
        assert t.data_ptr == a.unsafe_buffer_pointer()
        assert fp8amp.amax(ctx, t) == 510.0
        b = jnp.from_dlpack(t)
        assert float(b.sum()) == float(a.sum())


def test_torch_cpu_zero_copy():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with fp8amp.Context("cpu") as ctx:
        t = fp8amp.from_dlpack(x, ctx)
        assert t.data_ptr == x.data_ptr() and t.shape == (3, 4)
        y = torch.from_dlpack(t)
        assert y.data_ptr() == t.data_ptr
        meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), fp8amp.E5M2)
        q = fp8amp.Tensor(ctx, (3, 4), fp8amp.E5M2)
        q.set_scaling(meta)
        fp8amp.quantize(ctx, t, q)
        got = torch.from_dlpack(q)
        assert got.dtype == torch.float8_e5m2
        want = (x.double() * meta.scale).float().clamp(-57344, 57344).to(torch.float8_e5m2)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
