package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.fp8amp.swig.DType;
import org.fp8amp.swig.Fp8amp;

/**
 * A tensor ({@code fp8amp_tensor}): a contiguous row-major array on its context's device. Host
 * copies take byte[] (FP8 codes, or any dtype's raw bytes), short[] (F16/BF16 codes), float[] (F32)
 * or a ByteBuffer (raw bytes: a direct buffer is read or written in place; a heap buffer goes
 * through one direct copy). Every copy moves exactly the tensor's byte size (else SHAPE_MISMATCH).
 */
public final class Tensor extends NativeHandle {
    /** A new tensor on ctx's device; its contents are unspecified until written. */
    public Tensor(Context ctx, DType dtype, long... shape) {
        super(create(ctx, dtype, shape), "Tensor", Fp8amp::tensor_destroy);
    }

    /** Takes ownership of a handle the library returned (a Linear's weight, a scale_inv view). */
    Tensor(long handle) {
        super(handle, "Tensor", Fp8amp::tensor_destroy);
    }

    private static long create(Context ctx, DType dtype, long[] shape) {
        long[] out = out();
        try {
            Fp8amp.tensor_create(ctx.handle(), dtype, shape, out);
        } finally {
            reachabilityFence(ctx);
        }
        return out[0];
    }

    public DType dtype() {
        int[] out = new int[1];
        try {
            Fp8amp.tensor_dtype(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return DType.swigToEnum(out[0]);
    }

    public int ndim() {
        int[] out = new int[1];
        try {
            Fp8amp.tensor_ndim(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    public long[] shape() {
        long[] shape = new long[ndim()];
        try {
            Fp8amp.tensor_shape(handle(), shape);
        } finally {
            reachabilityFence(this);
        }
        return shape;
    }

    public long numel() {
        long[] out = out();
        try {
            Fp8amp.tensor_numel(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    public long nbytes() {
        long[] out = out();
        try {
            Fp8amp.tensor_nbytes(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** Copies the tensor's bytes from src (FP8 codes, or raw little-endian bytes of any dtype). */
    public Tensor copyFrom(byte[] src) {
        try {
            Fp8amp.tensor_copy_from_host_bytes(handle(), src);
        } finally {
            reachabilityFence(this);
        }
        return this;
    }

    /** Copies 16-bit codes (F16 or BF16) from src. */
    public Tensor copyFrom(short[] src) {
        try {
            Fp8amp.tensor_copy_from_host_shorts(handle(), src);
        } finally {
            reachabilityFence(this);
        }
        return this;
    }

    /** Copies F32 values from src. */
    public Tensor copyFrom(float[] src) {
        try {
            Fp8amp.tensor_copy_from_host_floats(handle(), src);
        } finally {
            reachabilityFence(this);
        }
        return this;
    }

    /** Copies src's remaining bytes (position to limit; which must be the tensor's byte size). The
     *  position does not move. A direct buffer is read in place. */
    public Tensor copyFrom(ByteBuffer src) {
        ByteBuffer view = src.slice();
        if (!view.isDirect()) {
            ByteBuffer direct = ByteBuffer.allocateDirect(view.remaining());
            direct.put(view.duplicate());
            view = direct;
        }
        try {
            Fp8amp.tensor_copy_from_host(handle(), view);
        } finally {
            reachabilityFence(this);
            reachabilityFence(view);
        }
        return this;
    }

    /** Copies the tensor into dst's remaining bytes (their count must be the tensor's byte size).
     *  The position does not move. A direct buffer is written in place. */
    public void copyTo(ByteBuffer dst) {
        if (dst.isReadOnly()) {
            throw new java.nio.ReadOnlyBufferException();
        }
        ByteBuffer view = dst.slice();
        ByteBuffer target = view.isDirect() ? view : ByteBuffer.allocateDirect(view.remaining());
        try {
            Fp8amp.tensor_copy_to_host(handle(), target);
        } finally {
            reachabilityFence(this);
            reachabilityFence(target);
        }
        if (target != view) {
            view.put(target);
        }
    }

    /** The tensor's bytes (FP8 codes; or raw little-endian bytes of any dtype). */
    public byte[] toBytes() {
        byte[] out = new byte[Math.toIntExact(nbytes())];
        try {
            Fp8amp.tensor_copy_to_host_bytes(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out;
    }

    /** The 16-bit codes of an F16 or BF16 tensor. */
    public short[] toShorts() {
        short[] out = new short[Math.toIntExact(nbytes() / 2)];
        try {
            Fp8amp.tensor_copy_to_host_shorts(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out;
    }

    /** The values of an F32 tensor (another dtype: SHAPE_MISMATCH, its byte size differs; convert
     *  with {@link Context#cast} or {@link Context#dequantize} first). */
    public float[] toFloats() {
        float[] out = new float[Math.toIntExact(numel())];
        try {
            Fp8amp.tensor_copy_to_host_floats(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out;
    }

    /** A new direct buffer, in native (little-endian on x86/ARM) order, holding the tensor's bytes. */
    public ByteBuffer toByteBuffer() {
        ByteBuffer out = ByteBuffer.allocateDirect(Math.toIntExact(nbytes())).order(ByteOrder.nativeOrder());
        copyTo(out);
        return out;
    }

    /** Binds this E4M3/E5M2/F16 tensor to a scaling meta (null unbinds): fp8amp_tensor_set_scaling. */
    public void setScaling(Scaling meta) {
        try {
            Fp8amp.tensor_set_scaling(handle(), meta == null ? 0 : meta.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(meta);
        }
    }

    /** A new tensor (close it) viewing this bound tensor's scale_inv: an F32 scalar (fp8amp_tensor_scale_inv). */
    public Tensor scaleInv() {
        long[] out = out();
        try {
            Fp8amp.tensor_scale_inv(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return new Tensor(out[0]);
    }
}
