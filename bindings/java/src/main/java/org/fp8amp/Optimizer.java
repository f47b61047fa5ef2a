package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import org.fp8amp.swig.AdamDesc;
import org.fp8amp.swig.AdamStepArgs;
import org.fp8amp.swig.Fp8amp;
import org.fp8amp.swig.OptLevel;

/**
 * Adam / AdamW with low-precision state ({@code fp8amp_optimizer}; O1: F32 m and v, O2: E4M3 m and
 * F16 v, O3: also an F16 master copy). Parameters and gradients stay the caller's tensors; the
 * optimizer keeps them alive. Checkpoints: {@link #save()} and {@link #load(byte[])}.
 */
public final class Optimizer extends NativeHandle {
    public Optimizer(Context ctx, AdamDesc desc) {
        super(create(ctx, desc), "Optimizer", Fp8amp::optimizer_destroy);
    }

    /** The descriptor of an optimization level (fp8amp_opt_level_adam_init): defaults plus its state dtypes. */
    public static AdamDesc desc(OptLevel level) {
        AdamDesc desc = new AdamDesc();
        Fp8amp.opt_level_adam_init(level, desc);
        return desc;
    }

    private static long create(Context ctx, AdamDesc desc) {
        long[] out = out();
        try {
            Fp8amp.optimizer_create(ctx.handle(), desc, out);
        } finally {
            reachabilityFence(ctx);
            reachabilityFence(desc);
        }
        return out[0];
    }

    /** Registers a parameter and its gradient (before the first step). */
    public void addParam(Tensor param, Tensor grad) {
        try {
            Fp8amp.optimizer_add_param(handle(), param.handle(), grad.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(param);
            reachabilityFence(grad);
        }
    }

    /** One step with the default arguments (the descriptor's lr, gradients as they are). */
    public void step() {
        step(null, null);
    }

    /** One step with args (null: the defaults). */
    public void step(AdamStepArgs args) {
        step(args, null);
    }

    /** One step with args (null: the defaults) whose gradients are also unscaled by scaler's loss
     *  scale, which the step updates (args.scaler is set from scaler for the call). */
    public void step(AdamStepArgs args, GradScaler scaler) {
        AdamStepArgs a = args;
        if (scaler != null) {
            a = new AdamStepArgs();
            if (args != null) {
                a.setLr(args.getLr());
                a.setGradScaleInv(args.getGradScaleInv());
            }
            a.setScaler(scaler.handle());
        }
        try {
            Fp8amp.optimizer_step(handle(), a);
        } finally {
            reachabilityFence(this);
            reachabilityFence(a);
            reachabilityFence(scaler);
        }
    }

    /** Whether the last step was skipped because a gradient was not finite. */
    public boolean foundInf() {
        int[] out = new int[1];
        try {
            Fp8amp.optimizer_get_found_inf(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0] != 0;
    }

    /** Steps taken (skipped ones not counted). */
    public long stepCount() {
        long[] out = out();
        try {
            Fp8amp.optimizer_get_step(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** The global L2 norm of the last step's unscaled gradients, before clipping. */
    public float gradNorm() {
        float[] out = new float[1];
        try {
            Fp8amp.optimizer_get_grad_norm(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    public int numParams() {
        int[] out = new int[1];
        try {
            Fp8amp.optimizer_num_params(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** Bytes of state the optimizer holds (m, v, master, block scales, bookkeeping). */
    public long stateBytes() {
        long[] out = out();
        try {
            Fp8amp.optimizer_state_bytes(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    /** A checkpoint of the optimizer and its parameters (docs/api.md 12.6). */
    public byte[] save() {
        long[] size = out();
        try {
            Fp8amp.optimizer_save(handle(), null, size);
            byte[] buffer = new byte[Math.toIntExact(size[0])];
            Fp8amp.optimizer_save(handle(), buffer, size);
            if (size[0] != buffer.length) {
                throw new IllegalStateException("optimizer_save wrote " + size[0] + " of " + buffer.length + " bytes");
            }
            return buffer;
        } finally {
            reachabilityFence(this);
        }
    }

    /** Restores a checkpoint written by {@link #save()} (everything validated first: a failure changes nothing). */
    public void load(byte[] checkpoint) {
        try {
            Fp8amp.optimizer_load(handle(), checkpoint);
        } finally {
            reachabilityFence(this);
        }
    }
}
