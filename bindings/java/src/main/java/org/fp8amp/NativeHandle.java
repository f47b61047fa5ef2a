package org.fp8amp;

import java.lang.ref.Cleaner;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One C handle owned by one Java object: destroyed exactly once, by {@link #close()} (or, as a
 * safety net for an object never closed, by a {@link Cleaner} once the object is unreachable).
 * Use after close throws {@link IllegalStateException} before anything reaches C. The library
 * checks every handle too (a stale value is INVALID_HANDLE, never a crash), so even the generated
 * layer cannot crash on a destroyed handle.
 *
 * <p>Threading follows the C contract: a context and the objects made with it are used by one
 * thread at a time. The Cleaner runs on its own thread; it only ever destroys a handle that no Java
 * code can reach any more, and the library's registry is locked, so that is safe. Close explicitly
 * (try-with-resources) all the same: device memory is not something to leave to the GC.
 */
abstract class NativeHandle implements AutoCloseable {
    private static final Cleaner CLEANER = Cleaner.create();
    /** C destroy calls that succeeded, process-wide: what the tests count. */
    static final AtomicLong DESTROYED = new AtomicLong();

    @FunctionalInterface
    interface Destroy {
        void destroy(long handle);
    }

    /** The cleaning action: holds the handle value and the C destroy function, never the object. */
    private static final class Destroyer implements Runnable {
        private final long handle;
        private final Destroy destroy;
        private volatile RuntimeException error;

        Destroyer(long handle, Destroy destroy) {
            this.handle = handle;
            this.destroy = destroy;
        }

        @Override
        public void run() {
            try {
                destroy.destroy(handle);
                DESTROYED.incrementAndGet();
            } catch (RuntimeException e) {
                error = e; // a Cleaner thread cannot throw; close() rethrows it
            }
        }
    }

    private final long handle;
    private final String kind;
    private final Destroyer destroyer;
    private final Cleaner.Cleanable cleanable;
    private volatile boolean closed;

    NativeHandle(long handle, String kind, Destroy destroy) {
        if (handle == 0) {
            throw new IllegalArgumentException(kind + ": a null handle");
        }
        this.handle = handle;
        this.kind = kind;
        this.destroyer = new Destroyer(handle, destroy);
        this.cleanable = CLEANER.register(this, destroyer);
    }

    /** The C handle value; throws IllegalStateException once closed. */
    public final long handle() {
        if (closed) {
            throw new IllegalStateException(kind + " is closed");
        }
        return handle;
    }

    /** Whether {@link #close()} was called. */
    public final boolean isClosed() {
        return closed;
    }

    /**
     * Destroys the C handle. A second close is a no-op (the handle is destroyed once: Cleaner's
     * Cleanable runs its action at most once, even when two threads close together).
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        cleanable.clean();
        RuntimeException e = destroyer.error;
        if (e != null) {
            destroyer.error = null;
            throw e;
        }
    }

    @Override
    public String toString() {
        return kind + (closed ? "(closed)" : "(0x" + Long.toHexString(handle) + ")");
    }

    /** Static holder so that {@code long[1]} out-parameters read naturally. */
    static long[] out() {
        return new long[1];
    }
}
