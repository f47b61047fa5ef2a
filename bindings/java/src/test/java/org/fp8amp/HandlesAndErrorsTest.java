package org.fp8amp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.fp8amp.swig.DType;
import org.fp8amp.swig.DeviceType;
import org.fp8amp.swig.Fp8amp;
import org.fp8amp.swig.LinearRole;
import org.fp8amp.swig.Status;
import org.junit.jupiter.api.Test;

/** Handles (closed once, use after close), statuses as exceptions, host copies, versions. */
class HandlesAndErrorsTest {
    private static float[] randomFloats(Random rng, int n, float scale) {
        float[] v = new float[n];
        for (int i = 0; i < n; ++i) v[i] = (float) rng.nextGaussian() * scale;
        return v;
    }

    @Test
    void everyHandleIsDestroyedExactlyOnce() {
        long before = NativeHandle.DESTROYED.get();
        Context ctx = Context.cpu();
        Tensor t = new Tensor(ctx, DType.DTYPE_F32, 3, 5);
        Scaling s = new Scaling(ctx, DType.DTYPE_E4M3);
        Linear lin = new Linear(ctx, 8, 4);
        Tensor w = lin.weight();
        Scaling inputMeta = lin.scaling(LinearRole.ROLE_INPUT);
        Optimizer opt = new Optimizer(ctx, Optimizer.desc(org.fp8amp.swig.OptLevel.OPT_LEVEL_O1));
        GradScaler gs = new GradScaler(ctx);
        NativeHandle[] all = {t, s, w, inputMeta, lin, opt, gs, ctx};
        long[] raw = new long[all.length];
        for (int i = 0; i < all.length; ++i) raw[i] = all[i].handle();
        for (NativeHandle h : all) {
            h.close();
            h.close(); // a second close is a no-op: no second C destroy, no exception
            assertTrue(h.isClosed());
        }
        assertEquals(all.length, NativeHandle.DESTROYED.get() - before);
        // the C handles are gone: the library itself says INVALID_HANDLE for the stale values
        Fp8ampException e = assertThrows(Fp8ampException.class, () -> Fp8amp.tensor_numel(raw[0], new long[1]));
        assertEquals(Status.ERROR_INVALID_HANDLE, e.status());
        e = assertThrows(Fp8ampException.class, () -> Fp8amp.context_synchronize(raw[raw.length - 1]));
        assertEquals(Status.ERROR_INVALID_HANDLE, e.status());
    }

    @Test
    void useAfterCloseThrowsIllegalState() {
        try (Context ctx = Context.cpu()) {
            Tensor t = new Tensor(ctx, DType.DTYPE_F32, 4);
            t.close();
            assertThrows(IllegalStateException.class, t::numel);
            assertThrows(IllegalStateException.class, () -> t.copyFrom(new float[4]));
            try (Tensor u = new Tensor(ctx, DType.DTYPE_F32, 4)) {
                assertThrows(IllegalStateException.class, () -> ctx.cast(t, u));
            }
        }
        Context closed = Context.cpu();
        closed.close();
        assertThrows(IllegalStateException.class, () -> new Tensor(closed, DType.DTYPE_F32, 2));
    }

    @Test
    void tensorsOutliveTheirContext() {
        Random rng = new Random(11);
        float[] v = randomFloats(rng, 6, 3.0f);
        Tensor t;
        try (Context ctx = Context.cpu()) {
            t = new Tensor(ctx, DType.DTYPE_F32, 2, 3).copyFrom(v);
        }
        try (Tensor u = t) {
            assertArrayEquals(v, u.toFloats());
        }
    }

    @Test
    void negativeExtentIsInvalidArgumentWithTheLibrarysMessage() {
        try (Context ctx = Context.cpu()) {
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> new Tensor(ctx, DType.DTYPE_F32, 4, -2));
            assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
            assertEquals(1, e.statusCode());
            assertTrue(e.libraryMessage().startsWith("fp8amp_tensor_create"), e.libraryMessage());
            assertTrue(e.getMessage().startsWith("FP8AMP_ERROR_INVALID_ARGUMENT: fp8amp_tensor_create"), e.getMessage());
            assertEquals(Fp8amp.status_name(e.statusCode()), Fp8ampException.statusName(e.statusCode()));
            // more dimensions than FP8AMP_MAX_NDIM
            e = assertThrows(Fp8ampException.class,
                    () -> new Tensor(ctx, DType.DTYPE_F32, new long[Fp8amp.FP8AMP_MAX_NDIM + 1]));
            assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
        }
    }

    @Test
    void shapeMismatchLeavesTheTensorAsItWas() {
        Random rng = new Random(12);
        try (Context ctx = Context.cpu();
             Tensor a = new Tensor(ctx, DType.DTYPE_F32, 4, 8);
             Tensor b = new Tensor(ctx, DType.DTYPE_F32, 8, 4)) {
            float[] va = randomFloats(rng, 32, 2.0f);
            a.copyFrom(va);
            b.copyFrom(randomFloats(rng, 32, 2.0f));
            float[] vb = b.toFloats();
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> ctx.cast(a, b));
            assertEquals(Status.ERROR_SHAPE_MISMATCH, e.status());
            assertTrue(e.libraryMessage().contains("fp8amp_cast"), e.libraryMessage());
            assertArrayEquals(vb, b.toFloats());
            e = assertThrows(Fp8ampException.class, () -> a.copyFrom(randomFloats(rng, 31, 1.0f)));
            assertEquals(Status.ERROR_SHAPE_MISMATCH, e.status());
            assertArrayEquals(va, a.toFloats());
            // dtype mismatch: quantize into an F32 tensor
            e = assertThrows(Fp8ampException.class, () -> ctx.quantize(a, a));
            assertEquals(Status.ERROR_DTYPE_MISMATCH, e.status());
        }
    }

    @Test
    void leanLevelIsKeptWhenRefused() {
        try (Context ctx = Context.cpu(); Linear lin = new Linear(ctx, 8, 4)) {
            assertEquals(0, lin.lean());
            lin.setLean(1);
            assertEquals(1, lin.lean());
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> lin.setLean(-1));
            assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
            assertTrue(e.libraryMessage().contains("fp8amp_linear_set_lean"), e.libraryMessage());
            assertEquals(1, lin.lean());
        }
    }

    @Test
    void quantizeWithoutMetaIsInvalidArgument() {
        try (Context ctx = Context.cpu();
             Tensor x = new Tensor(ctx, DType.DTYPE_F32, 16);
             Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 16)) {
            x.copyFrom(randomFloats(new Random(13), 16, 1.0f));
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> ctx.quantize(x, q));
            assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
            assertFalse(e.libraryMessage().isEmpty());
        }
    }

    @Test
    void cudaWithoutCudaIsAnExceptionNotACrash() {
        if (Context.deviceCount(DeviceType.DEVICE_CUDA) > 0) {
            try (Context ctx = Context.cuda(0)) {
                assertEquals(DeviceType.DEVICE_CUDA, ctx.deviceType());
            }
            return;
        }
        Fp8ampException e = assertThrows(Fp8ampException.class, () -> Context.cuda(0));
        assertNotNull(e.status());
        assertFalse(e.libraryMessage().isEmpty());
    }

    @Test
    void hostCopiesOfEveryKind() {
        Random rng = new Random(14);
        try (Context ctx = Context.cpu();
             Tensor f = new Tensor(ctx, DType.DTYPE_F32, 5, 7);
             Tensor h = new Tensor(ctx, DType.DTYPE_BF16, 5, 7)) {
            assertArrayEquals(new long[] {5, 7}, f.shape());
            assertEquals(35, f.numel());
            assertEquals(140, f.nbytes());
            assertEquals(DType.DTYPE_BF16, h.dtype());
            float[] v = randomFloats(rng, 35, 10.0f);
            // heap ByteBuffer with a non-zero position: only the remaining bytes count
            ByteBuffer heap = ByteBuffer.allocate(3 + 140).order(ByteOrder.LITTLE_ENDIAN);
            heap.position(3);
            for (float x : v) heap.putFloat(x);
            heap.position(3);
            f.copyFrom(heap);
            assertEquals(3, heap.position());
            assertArrayEquals(v, f.toFloats());
            // direct ByteBuffer round trip (zero copy)
            ByteBuffer direct = f.toByteBuffer();
            assertTrue(direct.isDirect());
            float[] back = new float[35];
            direct.order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(back);
            assertArrayEquals(v, back);
            // bytes
            byte[] raw = f.toBytes();
            f.copyFrom(new byte[140]);
            f.copyFrom(raw);
            assertArrayEquals(v, f.toFloats());
            // BF16 codes: cast rounds to nearest even; the codes are what a Java RNE gives
            ctx.cast(f, h);
            short[] codes = h.toShorts();
            for (int i = 0; i < 35; ++i) {
                assertEquals(Reference.bf16(v[i]), codes[i], "element " + i);
            }
            h.copyFrom(codes);
            assertArrayEquals(codes, h.toShorts());
            // the raw layer refuses a heap buffer rather than guessing an address
            assertThrows(IllegalArgumentException.class,
                    () -> Fp8amp.tensor_copy_from_host(f.handle(), ByteBuffer.allocate(140)));
            // a read-only destination is refused
            assertThrows(java.nio.ReadOnlyBufferException.class,
                    () -> f.copyTo(ByteBuffer.allocateDirect(140).asReadOnlyBuffer()));
        }
    }

    @Test
    void versionsAndNames() {
        assertEquals(Fp8amp.FP8AMP_VERSION, Context.libraryVersion());
        assertEquals(Context.headerVersion(), Context.libraryVersion());
        assertEquals("e4m3", Fp8amp.dtype_name(DType.DTYPE_E4M3));
        assertEquals(1, Fp8amp.dtype_size(DType.DTYPE_E5M2));
        assertEquals("FP8AMP_ERROR_SHAPE_MISMATCH", Fp8amp.status_name(Status.ERROR_SHAPE_MISMATCH.swigValue()));
        assertEquals(1, Context.deviceCount(DeviceType.DEVICE_CPU));
    }

    @Test
    void contextsOnSeveralThreadsAndPerThreadMessages() throws Exception {
        // one context per thread (the C contract); each thread's failures carry its own message
        int threads = 4;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            List<Future<?>> done = new ArrayList<>();
            for (int id = 0; id < threads; ++id) {
                final int extent = -(id + 2);
                final long seed = 100 + id;
                done.add(pool.submit(() -> {
                    Random rng = new Random(seed);
                    try (Context ctx = Context.cpu();
                         Scaling meta = new Scaling(ctx, DType.DTYPE_E4M3);
                         Tensor x = new Tensor(ctx, DType.DTYPE_F32, 256);
                         Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 256)) {
                        q.setScaling(meta);
                        for (int round = 0; round < 50; ++round) {
                            Fp8ampException e = assertThrows(Fp8ampException.class, () -> new Tensor(ctx, DType.DTYPE_F32, extent));
                            assertTrue(e.libraryMessage().contains("is " + extent + ":"), e.libraryMessage());
                            float[] v = randomFloats(rng, 256, 20.0f);
                            x.copyFrom(v);
                            ctx.quantize(x, q);
                            byte[] codes = q.toBytes();
                            for (int i = 0; i < 256; ++i) {
                                assertEquals(Reference.e4m3(v[i]), codes[i], "element " + i);
                            }
                        }
                    }
                    return null;
                }));
            }
            for (Future<?> f : done) f.get();
        } finally {
            pool.shutdown();
        }
    }

    private static long unclosedTensor(Context ctx) {
        Tensor t = new Tensor(ctx, DType.DTYPE_F32, 64);
        return t.handle(); // t becomes unreachable here, never closed
    }

    @Test
    void theCleanerDestroysAnObjectNeverClosed() throws InterruptedException {
        try (Context ctx = Context.cpu()) {
            long raw = unclosedTensor(ctx);
            long[] numel = new long[1];
            Fp8amp.tensor_numel(raw, numel); // still alive
            assertEquals(64, numel[0]);
            boolean destroyed = false;
            for (int i = 0; i < 100 && !destroyed; ++i) {
                System.gc();
                Thread.sleep(50);
                try {
                    Fp8amp.tensor_numel(raw, numel);
                } catch (Fp8ampException e) {
                    assertEquals(Status.ERROR_INVALID_HANDLE, e.status());
                    destroyed = true;
                }
            }
            assertTrue(destroyed, "the Cleaner did not destroy the unreachable tensor within 5 s");
        }
    }
}
