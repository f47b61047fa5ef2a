package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import org.fp8amp.swig.Device;
import org.fp8amp.swig.DeviceType;
import org.fp8amp.swig.Fp8amp;

/**
 * A context ({@code fp8amp_context}): a device (CPU or a CUDA GPU), the stream its work runs on
 * and its allocator. The element-wise operations (cast, quantize, dequantize, amax) are its methods.
 * Used by one thread at a time, like every object made with it; different contexts may be used from
 * different threads. Tensors keep what they need of their context, so closing it first is safe.
 */
public final class Context extends NativeHandle {
    private final DeviceType deviceType;
    private final int deviceIndex;

    /** A context on {@code type}:{@code index} (the CPU is index 0). */
    public Context(DeviceType type, int index) {
        super(create(type, index), "Context", Fp8amp::context_destroy);
        this.deviceType = type;
        this.deviceIndex = index;
    }

    private static long create(DeviceType type, int index) {
        Device device = new Device();
        try {
            device.setType(type);
            device.setIndex(index);
            long[] out = out();
            Fp8amp.context_create(device, out);
            return out[0];
        } finally {
            device.delete();
        }
    }

    /** A CPU context. */
    public static Context cpu() {
        return new Context(DeviceType.DEVICE_CPU, 0);
    }

    /** A context on CUDA GPU {@code index} (NOT_SUPPORTED without CUDA: the message says why). */
    public static Context cuda(int index) {
        return new Context(DeviceType.DEVICE_CUDA, index);
    }

    public DeviceType deviceType() {
        return deviceType;
    }

    public int deviceIndex() {
        return deviceIndex;
    }

    /** Waits for the work issued through this context (CUDA; a no-op on the CPU). */
    public void synchronize() {
        try {
            Fp8amp.context_synchronize(handle());
        } finally {
            reachabilityFence(this);
        }
    }

    /** A new tensor of this context (contents unspecified until written). */
    public Tensor tensor(org.fp8amp.swig.DType dtype, long... shape) {
        return new Tensor(this, dtype, shape);
    }

    /** dst = convert(src) element by element, scale 1 (fp8amp_cast: RNE, saturating into FP8). */
    public void cast(Tensor src, Tensor dst) {
        try {
            Fp8amp.cast(handle(), src.handle(), dst.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(src);
            reachabilityFence(dst);
        }
    }

    /** dst = fp8(src * scale) with dst's scaling meta, recording amax into it (fp8amp_quantize). */
    public void quantize(Tensor src, Tensor dst) {
        try {
            Fp8amp.quantize(handle(), src.handle(), dst.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(src);
            reachabilityFence(dst);
        }
    }

    /** quantize, plus the transposed copy dstT (fp8amp_quantize_transpose). */
    public void quantizeTranspose(Tensor src, Tensor dst, Tensor dstT) {
        try {
            Fp8amp.quantize_transpose(handle(), src.handle(), dst.handle(), dstT.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(src);
            reachabilityFence(dst);
            reachabilityFence(dstT);
        }
    }

    /** dst = decode(src) * src's scale_inv (fp8amp_dequantize). */
    public void dequantize(Tensor src, Tensor dst) {
        try {
            Fp8amp.dequantize(handle(), src.handle(), dst.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(src);
            reachabilityFence(dst);
        }
    }

    /** max |t| (NaN counts as inf); synchronous. */
    public float amax(Tensor t) {
        float[] out = new float[1];
        try {
            Fp8amp.amax(handle(), t.handle(), out);
        } finally {
            reachabilityFence(this);
            reachabilityFence(t);
        }
        return out[0];
    }

    /** fp8amp_scaling_update_many: the per-step update of many metas in one launch. */
    public void updateScalings(Scaling... metas) {
        long[] handles = new long[metas.length];
        for (int i = 0; i < metas.length; ++i) {
            handles[i] = metas[i].handle();
        }
        try {
            Fp8amp.scaling_update_many(handle(), handles);
        } finally {
            reachabilityFence(this);
            reachabilityFence(metas);
        }
    }

    /** The loaded library's version, major * 10000 + minor * 100 + patch. */
    public static long libraryVersion() {
        return Fp8amp.version();
    }

    /** The version this binding was generated from (the header's FP8AMP_VERSION). */
    public static long headerVersion() {
        return Fp8amp.FP8AMP_VERSION;
    }

    /** How many devices of a type this process can use (CUDA: 0 without a GPU or CUDA build). */
    public static int deviceCount(DeviceType type) {
        int[] out = new int[1];
        Fp8amp.device_count(type, out);
        return out[0];
    }
}
