"""Context.set_allocator: Python allocation hooks serve every allocation of a context; each block is
freed through the hooks that allocated it (also after they were replaced or the context was closed);
a hook that fails or raises gives OutOfMemoryError; on a GPU, PyTorch's caching allocator as the hooks."""
import gc

import numpy as np
import pytest

import fp8amp


class HostPool:
    """Host memory from NumPy, 256-byte aligned, with a record of what is live."""

    def __init__(self):
        self.blocks, self.allocs, self.frees = {}, 0, 0

    def alloc(self, nbytes, device, stream):
        assert device == fp8amp.Device("cpu", 0) and stream == 0
        buf = np.empty(nbytes + 256, np.uint8)
        addr = (buf.ctypes.data + 255) // 256 * 256
        self.blocks[addr] = (buf, nbytes)
        self.allocs += 1
        return addr

    def free(self, addr, nbytes, device, stream):
        assert self.blocks.pop(addr)[1] == nbytes
        self.frees += 1


def test_hooks_serve_and_free_every_block():
    pool, other = HostPool(), HostPool()
    ctx = fp8amp.Context("cpu")
    ctx.set_allocator(pool.alloc, pool.free)
    x = fp8amp.Tensor.from_numpy(ctx, np.arange(1000, dtype=np.float32))
    meta = fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=8), fp8amp.F16)
    q = fp8amp.Tensor(ctx, (1000,), fp8amp.F16)
    assert x.data_ptr in pool.blocks and q.data_ptr in pool.blocks
    assert pool.allocs == 3  # two tensors and the meta's state
    q.set_scaling(meta)  # the scale_inv slot
    assert pool.allocs == 4
    fp8amp.quantize(ctx, x, q)
    assert np.array_equal(q.numpy().astype(np.float32) * np.float32(meta.scale_inv), np.arange(1000, dtype=np.float32))
    ctx.set_allocator(other.alloc, other.free)  # later blocks from `other`, earlier ones freed by `pool`
    y = fp8amp.Tensor(ctx, (10,), fp8amp.F32)
    assert y.data_ptr in other.blocks and other.allocs == 1
    ctx.close()
    for o in (x, q, meta):
        o.close()
    gc.collect()
    assert pool.frees == 4 and not pool.blocks and pool.allocs == 4  # freed by the hooks that allocated them
    y.close()
    assert not other.blocks


def test_failing_hooks_raise_out_of_memory(capsys):
    with fp8amp.Context("cpu") as ctx:
        ctx.set_allocator(lambda n, d, s: 0, lambda *a: None)
        with pytest.raises(fp8amp.OutOfMemoryError, match="allocator hook returned NULL"):
            fp8amp.Tensor(ctx, (4,), fp8amp.F32)

        def boom(n, d, s):
            raise RuntimeError("pool exhausted")

        ctx.set_allocator(boom, lambda *a: None)
        with pytest.raises(fp8amp.OutOfMemoryError):
            fp8amp.Tensor(ctx, (4,), fp8amp.F32)
        assert "pool exhausted" in capsys.readouterr().err
        with pytest.raises(fp8amp.InvalidArgumentError, match="both"):
            ctx.set_allocator(boom, None)
        ctx.set_allocator(None, None)  # the built-in allocator again
        with fp8amp.Tensor(ctx, (4,), fp8amp.F32) as t:
            assert t.numel == 4


def test_torch_caching_allocator_on_cuda():
    torch = pytest.importorskip("torch")
    if not (fp8amp.device_count("cuda") > 0 and torch.cuda.is_available()):
        pytest.skip("no CUDA device for PyTorch")
    live = {}

    def alloc(nbytes, device, stream):
        ptr = torch.cuda.caching_allocator_alloc(nbytes, device.index, stream)
        live[ptr] = nbytes
        return ptr

    def free(ptr, nbytes, device, stream):
        assert live.pop(ptr) == nbytes
        torch.cuda.caching_allocator_delete(ptr)

    with fp8amp.Context("cuda") as ctx:
        ctx.set_stream(torch.cuda.current_stream())
        ctx.set_allocator(alloc, free)
        x = torch.randn(512, 256, device="cuda")
        src = fp8amp.from_dlpack(x, ctx)
        meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), fp8amp.E4M3)
        q = fp8amp.Tensor(ctx, x.shape, fp8amp.E4M3)
        q.set_scaling(meta)
        fp8amp.quantize(ctx, src, q)
        assert q.data_ptr in live and len(live) == 3  # q, the meta's state, q's scale_inv slot
        want = (x.double() * meta.scale).float().clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(torch.from_dlpack(q).view(torch.uint8), want.view(torch.uint8))
        for o in (src, q, meta):
            o.close()
    assert not live


def test_scratch_pool_through_hooks():
    """Context.scratch_bytes / release_scratch: the Linears' shared pool comes through the context's
    hooks, grows to the largest need of two Linears, and release gives exactly it back."""
    pool = HostPool()
    ctx = fp8amp.Context("cpu")
    ctx.set_allocator(pool.alloc, pool.free)
    assert ctx.scratch_bytes() == 0
    rng = np.random.default_rng()
    sizes = []
    for k, n, m in ((64, 96, 48), (32, 16, 16)):
        lin = fp8amp.Linear(ctx, k, n)
        x = fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((m, k)).astype(np.float32))
        y = fp8amp.Tensor.from_numpy(ctx, np.zeros((m, n), np.float32))
        lin.forward(x, y, training=True)
        lin.backward(fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((m, n)).astype(np.float32)))
        sizes.append(ctx.scratch_bytes())
    assert sizes[0] > 0 and sizes[1] == sizes[0]  # the second, smaller Linear needed no more
    live = sum(n for _, n in pool.blocks.values())
    ctx.release_scratch()
    assert ctx.scratch_bytes() == 0
    assert sum(n for _, n in pool.blocks.values()) == live - sizes[0]
