"""Handle lifetime: close(), context managers and finalizers each destroy the C object exactly once;
closed objects raise InvalidHandleError; tensors outlive their context; 10,000 create/destroy
cycles leak no memory."""
import gc
import os

import numpy as np
import pytest

import fp8amp
from fp8amp import _ffi as ffi
from fp8amp import _lib as lib


def alive(tensor_handle) -> bool:
    out = ffi.new("int32_t *")
    return lib.fp8amp_tensor_ndim(tensor_handle, out) == lib.FP8AMP_SUCCESS


def test_close_with_and_finalizer(ctx):
    t = fp8amp.Tensor(ctx, (3,), fp8amp.F32)
    h = t.handle
    assert alive(h) and not t.closed
    t.close()
    assert t.closed and not alive(h)
    t.close()  # idempotent
    with pytest.raises(fp8amp.InvalidHandleError):
        t.numpy()
    with fp8amp.Tensor(ctx, (3,), fp8amp.F32) as t2:
        h2 = t2.handle
        assert alive(h2)
    assert not alive(h2)
    t3 = fp8amp.Tensor(ctx, (3,), fp8amp.F32)
    h3 = t3.handle
    del t3
    gc.collect()
    assert not alive(h3)


def test_tensor_and_meta_outlive_their_context(device):
    ctx = fp8amp.Context(device)
    meta = fp8amp.Scaling(ctx, None, fp8amp.E5M2)
    t = fp8amp.Tensor.from_numpy(ctx, np.arange(5, dtype=np.float32))
    ctx.close()
    assert np.array_equal(t.numpy(), np.arange(5, dtype=np.float32))
    assert meta.scale == 1.0
    with pytest.raises(fp8amp.InvalidHandleError):
        ctx.synchronize()
    t.close()
    meta.close()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_no_leak_over_10000_cycles(device):
    data = np.ones(1024, np.float32)  # 4 KiB per tensor: a leak of the tensors alone would be 40 MB

    def cycle(i):
        if i % 2:
            with fp8amp.Context(device) as ctx, fp8amp.Tensor.from_numpy(ctx, data) as t, \
                    fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=16), fp8amp.E4M3) as m, \
                    fp8amp.Tensor(ctx, (1024,), fp8amp.E4M3) as q:
                q.set_scaling(m)
                fp8amp.quantize(ctx, t, q)
        else:  # dropped without close(): the finalizers destroy them
            ctx = fp8amp.Context(device)
            t = fp8amp.Tensor.from_numpy(ctx, data)
            m = fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=16), fp8amp.E4M3)
            q = fp8amp.Tensor(ctx, (1024,), fp8amp.E4M3)
            q.set_scaling(m)
            fp8amp.quantize(ctx, t, q)
            capsule = t.__dlpack__(max_version=(1, 1))  # never consumed: its destructor releases it
            del ctx, t, m, q, capsule

    for i in range(1000):  # warm-up: allocator pools, caches
        cycle(i)
    gc.collect()
    before = rss_bytes()
    for i in range(10000):
        cycle(i)
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 4 * 2**20, "RSS grew by %d bytes over 10,000 cycles" % grown
