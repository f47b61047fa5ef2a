"""Tensor.wrap / Tensor.rebind (fp8amp_tensor_rebind) and Tensor.scale_inv (fp8amp_tensor_scale_inv)
on the CPU and, with a GPU, on CUDA: a re-pointed view reads and writes the new memory only (contents
against the NumPy data that was written, a cast against ml_dtypes); failures leave it unchanged; the
scale slot against the meta and against codes decoded by ml_dtypes."""
import ml_dtypes
import numpy as np
import pytest

import fp8amp


def owner(ctx, a):
    """An owning fp8amp tensor holding a copy of a (device memory on a CUDA context)."""
    return fp8amp.Tensor.from_numpy(ctx, a)


def test_rebind_follows_new_memory(ctx, rng):
    a = (rng.uniform(0.5, 3.0, size=(4, 6)) * rng.choice([-1, 1], size=(4, 6))).astype(np.float32)
    b = (rng.uniform(0.5, 3.0, size=(30,)) * rng.choice([-1, 1], size=30)).astype(np.float32)
    ta, tb = owner(ctx, a), owner(ctx, b)
    out = fp8amp.Tensor(ctx, (3, 2, 5), fp8amp.BF16)
    v = fp8amp.Tensor.wrap(ctx, ta.data_ptr, a.shape, fp8amp.F32, owner=ta)
    np.testing.assert_array_equal(v.numpy(), a)
    v.rebind(tb.data_ptr, (3, 2, 5), owner=tb)
    assert v.shape == (3, 2, 5) and v.data_ptr == tb.data_ptr
    np.testing.assert_array_equal(v.numpy(), b.reshape(3, 2, 5))
    fp8amp.cast(ctx, v, out)  # reads the new memory
    np.testing.assert_array_equal(out.numpy().view(np.uint16),
                                  b.reshape(3, 2, 5).astype(ml_dtypes.bfloat16).view(np.uint16))
    fresh = rng.uniform(0.5, 3.0, size=(3, 2, 5)).astype(np.float32)
    v.copy_from_numpy(fresh)  # writes land in b's memory, not a's
    np.testing.assert_array_equal(tb.numpy(), fresh.reshape(30))
    np.testing.assert_array_equal(ta.numpy(), a)


def test_rebind_failures_change_nothing(ctx, rng):
    a = rng.uniform(0.5, 3.0, size=(4, 8)).astype(np.float32)
    ta, tb = owner(ctx, a), owner(ctx, a[::-1].copy())
    v = fp8amp.Tensor.wrap(ctx, ta.data_ptr, (4, 8), fp8amp.F32, owner=ta)
    bad = [(tb.data_ptr + 2, (8, 4), fp8amp.InvalidArgumentError, "aligned"),
           (0, (8, 4), fp8amp.InvalidArgumentError, "NULL"),
           (tb.data_ptr, (8, 0), fp8amp.InvalidArgumentError, "at least 1"),
           (tb.data_ptr, (1,) * 9, fp8amp.InvalidArgumentError, "ndim")]
    for address, shape, err, words in bad:
        with pytest.raises(err, match=words):
            v.rebind(address, shape)
        assert v.shape == (4, 8) and v.data_ptr == ta.data_ptr
        np.testing.assert_array_equal(v.numpy(), a)
    with pytest.raises(fp8amp.InvalidArgumentError, match="not made by fp8amp_tensor_wrap"):
        ta.rebind(tb.data_ptr, (8, 4))
    assert ta.data_ptr != tb.data_ptr and ta.shape == (4, 8)
    # An optimizer's parameter keeps its address while the optimizer lives.
    g = owner(ctx, a * 0.5)
    p = fp8amp.Tensor.wrap(ctx, tb.data_ptr, (4, 8), fp8amp.F32, owner=tb)
    opt = fp8amp.Optimizer(ctx, "O1", [(p, g)])
    with pytest.raises(fp8amp.InvalidArgumentError, match="optimizer"):
        p.rebind(ta.data_ptr, (4, 8))
    opt.close()
    del opt
    p.rebind(ta.data_ptr, (8, 4), owner=ta)
    np.testing.assert_array_equal(p.numpy(), a.reshape(8, 4))


@pytest.mark.parametrize("dtype", [fp8amp.E4M3, fp8amp.E5M2])
def test_scale_inv_slot(ctx, rng, dtype):
    src = (rng.uniform(0.25, 40.0, size=(8, 16)) * rng.choice([-1, 1], size=(8, 16))).astype(np.float32)
    meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), dtype)
    q = fp8amp.Tensor(ctx, src.shape, dtype)
    q.set_scaling(meta)
    fp8amp.quantize(ctx, fp8amp.Tensor.from_numpy(ctx, src), q)
    slot = q.scale_inv()
    assert slot.shape == () and slot.dtype == fp8amp.F32
    assert slot.numpy()[()] == np.float32(meta.get().scale_inv)
    v = np.float32(slot.numpy()[()] * rng.uniform(1.5, 3.0))
    slot.copy_from_numpy(np.array(v, dtype=np.float32))
    out = fp8amp.Tensor(ctx, src.shape, fp8amp.F32)
    fp8amp.dequantize(ctx, q, out)
    codes = q.numpy()  # ml_dtypes float8 values
    np.testing.assert_array_equal(out.numpy(), codes.astype(np.float32) * v)
    q.close()
    assert slot.numpy()[()] == v  # the slot outlives the tensor's handle
    with pytest.raises(fp8amp.InvalidArgumentError, match="never bound"):
        fp8amp.Tensor(ctx, (4,), dtype).scale_inv()
