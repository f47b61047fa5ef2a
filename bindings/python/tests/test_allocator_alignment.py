"""Context.set_allocator with a hook that breaks the 256-byte alignment promise (issue 22, defect 8):
the library refuses the block (InvalidArgumentError naming the alignment), gives it straight back
through the free hook (nothing leaks), and the context keeps working. Before the check,
``set_allocator(lambda n, d, s: 1, ...)`` crashed the interpreter on the first write."""
import gc

import numpy as np
import pytest

import fp8amp


class OffsetPool:
    """Host memory from NumPy, handed out `offset` bytes past a 512-byte boundary."""

    def __init__(self, offset):
        self.offset, self.blocks, self.allocs, self.freed = offset, {}, 0, []

    def alloc(self, nbytes, device, stream):
        buf = np.empty(nbytes + self.offset + 512, np.uint8)
        addr = (buf.ctypes.data + 511) // 512 * 512 + self.offset
        self.blocks[addr] = (buf, nbytes)
        self.allocs += 1
        return addr

    def free(self, addr, nbytes, device, stream):
        assert self.blocks.pop(addr)[1] == nbytes
        self.freed.append(addr)


def test_address_one_is_refused_not_a_crash():
    freed = []
    with fp8amp.Context("cpu") as ctx:
        ctx.set_allocator(lambda n, d, s: 1, lambda addr, n, d, s: freed.append((addr, n)))
        data = np.random.default_rng().standard_normal(64).astype(np.float32)
        with pytest.raises(fp8amp.InvalidArgumentError, match="not aligned to 256 bytes"):
            fp8amp.Tensor.from_numpy(ctx, data)
        assert freed == [(1, data.nbytes)]  # given back through the hook, once
        with pytest.raises(fp8amp.InvalidArgumentError, match="0x1 "):
            fp8amp.Tensor(ctx, (3, 5), fp8amp.BF16)
        assert freed[-1] == (1, 3 * 5 * 2)


@pytest.mark.parametrize("offset", [1, 2, 4, 8, 64, 128, 255])
def test_misaligned_blocks_are_refused_and_freed(offset):
    pool = OffsetPool(offset)
    rng = np.random.default_rng()
    with fp8amp.Context("cpu") as ctx:
        ctx.set_allocator(pool.alloc, pool.free)
        with pytest.raises(fp8amp.InvalidArgumentError, match="not aligned to 256 bytes"):
            fp8amp.Tensor.from_numpy(ctx, rng.standard_normal((7, 9)).astype(np.float32))
        with pytest.raises(fp8amp.InvalidArgumentError, match="not aligned to 256 bytes"):
            fp8amp.Scaling(ctx, fp8amp.Recipe(amax_history_len=int(rng.integers(1, 64))), fp8amp.E4M3)
        assert pool.allocs == 2 and not pool.blocks and len(pool.freed) == 2  # nothing leaked

        # The context is unchanged: with aligned blocks (256 past a 512 boundary) it works as before.
        good = OffsetPool(256)
        ctx.set_allocator(good.alloc, good.free)
        x = rng.standard_normal(100).astype(np.float32)
        t = fp8amp.Tensor.from_numpy(ctx, x)
        assert t.data_ptr % 256 == 0 and t.data_ptr in good.blocks
        assert np.array_equal(t.numpy(), x)
        t.close()
        gc.collect()
        assert not good.blocks
