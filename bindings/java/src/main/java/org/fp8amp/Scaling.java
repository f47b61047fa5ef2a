package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import org.fp8amp.swig.DType;
import org.fp8amp.swig.Fp8amp;
import org.fp8amp.swig.Recipe;
import org.fp8amp.swig.ScalingStats;

/**
 * A scaling meta ({@code fp8amp_scaling}): the scale, scale_inv, amax and amax history of the
 * tensors bound to it, for one scaled dtype (E4M3, E5M2 or F16). Its recipe is a
 * {@link Recipe} ({@code new Recipe()} holds the library's defaults: delayed scaling, HYBRID,
 * history 1024).
 */
public final class Scaling extends NativeHandle {
    /** A meta for tensors of {@code dtype} following {@code recipe}. */
    public Scaling(Context ctx, Recipe recipe, DType dtype) {
        super(create(ctx, recipe, dtype), "Scaling", Fp8amp::scaling_destroy);
    }

    /** A meta with the default recipe. */
    public Scaling(Context ctx, DType dtype) {
        this(ctx, defaultRecipe(), dtype);
    }

    /** Takes ownership of a handle the library returned (a Linear's meta). */
    Scaling(long handle) {
        super(handle, "Scaling", Fp8amp::scaling_destroy);
    }

    private static Recipe defaultRecipe() {
        return new Recipe();
    }

    private static long create(Context ctx, Recipe recipe, DType dtype) {
        long[] out = out();
        try {
            Fp8amp.scaling_create(ctx.handle(), recipe, dtype, out);
        } finally {
            reachabilityFence(ctx);
            reachabilityFence(recipe);
        }
        return out[0];
    }

    private float[] get() {
        float[] scale = new float[1], scaleInv = new float[1], amax = new float[1];
        try {
            Fp8amp.scaling_get(handle(), scale, scaleInv, amax);
        } finally {
            reachabilityFence(this);
        }
        return new float[] {scale[0], scaleInv[0], amax[0]};
    }

    public float scale() {
        return get()[0];
    }

    public float scaleInv() {
        return get()[1];
    }

    /** The amax recorded since the last update (current scaling: of the last quantize). */
    public float amax() {
        return get()[2];
    }

    /**
     * A new tensor (close it) viewing the amax recorded since the last update where it lives: a
     * read-only F32 scalar sharing the meta's memory, live, valid past this meta's close
     * (fp8amp_scaling_amax_tensor). A NaN or an inf recorded reads as +inf.
     */
    public Tensor amaxTensor() {
        long[] out = out();
        try {
            Fp8amp.scaling_amax_tensor(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return new Tensor(out[0]);
    }

    /** Sets scale (and scale_inv = 1/scale); scale must be a normal float > 0. */
    public void setScale(float scale) {
        try {
            Fp8amp.scaling_set_scale(handle(), scale);
        } finally {
            reachabilityFence(this);
        }
    }

    /** Folds the recorded amax into the history and (delayed scaling) computes the next scale. */
    public void update() {
        try {
            Fp8amp.scaling_update(handle());
        } finally {
            reachabilityFence(this);
        }
    }

    /** The amax history, newest first; capacity must be at least the recipe's amax_history_len. */
    public float[] history(int capacity) {
        float[] out = new float[capacity];
        try {
            Fp8amp.scaling_get_history(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out;
    }

    public void enableStats(boolean enable) {
        try {
            Fp8amp.scaling_enable_stats(handle(), enable ? 1 : 0);
        } finally {
            reachabilityFence(this);
        }
    }

    /** The counters since the last reset (quantized, saturated, underflowed elements). */
    public ScalingStats stats() {
        ScalingStats stats = new ScalingStats();
        try {
            Fp8amp.scaling_get_stats(handle(), stats);
        } finally {
            reachabilityFence(this);
        }
        return stats;
    }

    public void resetStats() {
        try {
            Fp8amp.scaling_reset_stats(handle());
        } finally {
            reachabilityFence(this);
        }
    }
}
