package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import org.fp8amp.swig.Fp8amp;
import org.fp8amp.swig.GemmKind;
import org.fp8amp.swig.LinearDesc;
import org.fp8amp.swig.LinearRole;
import org.fp8amp.swig.OptLevel;

/**
 * An FP8 Linear layer ({@code fp8amp_linear}): y = x W^T + b on FP8 GEMMs with FP32 accumulation,
 * FP8 weight gradients (docs/linear.md). Its parameters and gradients are tensors of the Linear:
 * {@link #weight()} and friends return a new handle each time (close it; the tensor lives on while
 * the Linear or a handle holds it).
 */
public final class Linear extends NativeHandle {
    /** A Linear configured by desc ({@code new LinearDesc()} holds the defaults; set in/out features). */
    public Linear(Context ctx, LinearDesc desc) {
        super(create(ctx, desc), "Linear", Fp8amp::linear_destroy);
    }

    /** A Linear with the default configuration (BF16 weight, E4M3 weight gradient, bias, GEMM policy AUTO). */
    public Linear(Context ctx, long inFeatures, long outFeatures) {
        this(ctx, desc(inFeatures, outFeatures));
    }

    private static LinearDesc desc(long in, long out) {
        LinearDesc desc = new LinearDesc();
        desc.setInFeatures(in);
        desc.setOutFeatures(out);
        return desc;
    }

    /** The descriptor of an optimization level (fp8amp_opt_level_init) with the given features. */
    public static LinearDesc desc(OptLevel level, long inFeatures, long outFeatures) {
        LinearDesc desc = new LinearDesc();
        Fp8amp.opt_level_init(level, desc, null);
        desc.setInFeatures(inFeatures);
        desc.setOutFeatures(outFeatures);
        return desc;
    }

    private static long create(Context ctx, LinearDesc desc) {
        long[] out = out();
        try {
            Fp8amp.linear_create(ctx.handle(), desc, out);
        } finally {
            reachabilityFence(ctx);
            reachabilityFence(desc);
        }
        return out[0];
    }

    @FunctionalInterface
    private interface Getter {
        void get(long lin, long[] out);
    }

    private long get(Getter getter) {
        long[] out = out();
        try {
            getter.get(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** A new handle to the weight [out, in]. Write it through tensor calls (copyFrom, cast, ...). */
    public Tensor weight() {
        return new Tensor(get(Fp8amp::linear_weight));
    }

    /** A new handle to the bias [out] (F32); INVALID_ARGUMENT without a bias. */
    public Tensor bias() {
        return new Tensor(get(Fp8amp::linear_bias));
    }

    /** A new handle to the weight gradient [out, in] (wgrad dtype; E4M3: bound to its meta). */
    public Tensor weightGrad() {
        return new Tensor(get(Fp8amp::linear_weight_grad));
    }

    /** A new handle to the bias gradient [out] (F32). */
    public Tensor biasGrad() {
        return new Tensor(get(Fp8amp::linear_bias_grad));
    }

    /** A new handle to one of the Linear's scaling metas. */
    public Scaling scaling(LinearRole role) {
        long[] out = out();
        try {
            Fp8amp.linear_scaling(handle(), role, out);
        } finally {
            reachabilityFence(this);
        }
        return new Scaling(out[0]);
    }

    /** Tells the Linear its weight or bias was written behind its back (fp8amp_linear_weight_changed). */
    public void weightChanged() {
        try {
            Fp8amp.linear_weight_changed(handle());
        } finally {
            reachabilityFence(this);
        }
    }

    /** y = x W^T + b; with training, x is kept (in FP8) for {@link #backward}. */
    public void forward(Tensor x, Tensor y, boolean training) {
        try {
            Fp8amp.linear_forward(handle(), x.handle(), y.handle(), training ? 1 : 0);
        } finally {
            reachabilityFence(this);
            reachabilityFence(x);
            reachabilityFence(y);
        }
    }

    /** The GEMM a forward of {@code rows} rows of a wide input would run now: the policy's choice
     *  (fp8amp_linear_choose_gemm); a fused front asks it before writing the input in FP8. */
    public GemmKind chooseGemm(long rows, boolean training) {
        int[] out = new int[1];
        try {
            Fp8amp.linear_choose_gemm(handle(), rows, training ? 1 : 0, out);
        } finally {
            reachabilityFence(this);
        }
        return GemmKind.swigToEnum(out[0]);
    }

    /** y = x8 W^T + b from an E4M3 x8 the caller quantized (a fused norm or activation writing into a
     *  tensor bound to {@code scaling(LinearRole.INPUT)}); with training, the Linear keeps its own
     *  copy of x8 for {@link #backward} (fp8amp_linear_forward_fp8). */
    public void forwardFp8(Tensor x8, Tensor y, boolean training) {
        try {
            Fp8amp.linear_forward_fp8(handle(), x8.handle(), y.handle(), training ? 1 : 0);
        } finally {
            reachabilityFence(this);
            reachabilityFence(x8);
            reachabilityFence(y);
        }
    }

    /** Backward of the last training forward: dx (null skips it), and the weight and bias gradients
     *  (overwritten, or added to with accumulate). */
    public void backward(Tensor dy, Tensor dx, boolean accumulate) {
        try {
            Fp8amp.linear_backward(handle(), dy.handle(), dx == null ? 0 : dx.handle(), accumulate ? 1 : 0);
        } finally {
            reachabilityFence(this);
            reachabilityFence(dy);
            reachabilityFence(dx);
        }
    }

    /** Gives back what the Linear keeps between calls beyond its parameters and gradients, at a step
     *  boundary (fp8amp_linear_release_buffers). */
    public void releaseBuffers() {
        try {
            Fp8amp.linear_release_buffers(handle());
        } finally {
            reachabilityFence(this);
        }
    }

    /** How much the Linear keeps between calls: 0 (everything until the step), 1 (its FP8 weight copies
     *  in the context's scratch, the saved input freed by its backward), 2 (also no FP32 weight-gradient
     *  sum when not accumulating) (fp8amp_linear_set_lean; docs/linear.md section 5). */
    public void setLean(int lean) {
        try {
            Fp8amp.linear_set_lean(handle(), lean);
        } finally {
            reachabilityFence(this);
        }
    }

    /** The Linear's lean level (fp8amp_linear_get_lean). */
    public int lean() {
        int[] out = new int[1];
        try {
            Fp8amp.linear_get_lean(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** The bytes of the context's memory the Linear's own tensors hold now (fp8amp_linear_memory_bytes). */
    public long memoryBytes() {
        return get(Fp8amp::linear_memory_bytes);
    }

    /** Which GEMM the last forward ran (NONE before any). */
    public GemmKind gemmKind() {
        int[] out = new int[1];
        try {
            Fp8amp.linear_gemm_kind(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return GemmKind.swigToEnum(out[0]);
    }

    /** How many calls ran as one CUDA graph launch (0 on the CPU). */
    public long graphReplays() {
        return get(Fp8amp::linear_graph_replays);
    }
}
