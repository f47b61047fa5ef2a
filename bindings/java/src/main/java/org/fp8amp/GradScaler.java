package org.fp8amp;

import static java.lang.ref.Reference.reachabilityFence;

import org.fp8amp.swig.Fp8amp;
import org.fp8amp.swig.GradScalerDesc;
import org.fp8amp.swig.GradScalerState;

/** A dynamic loss scaler ({@code fp8amp_grad_scaler}): growth, backoff and hysteresis. */
public final class GradScaler extends NativeHandle {
    /** A scaler configured by desc ({@code new GradScalerDesc()} holds the defaults: 65536, x2, x0.5, 2000). */
    public GradScaler(Context ctx, GradScalerDesc desc) {
        super(create(ctx, desc), "GradScaler", Fp8amp::grad_scaler_destroy);
    }

    public GradScaler(Context ctx) {
        this(ctx, new GradScalerDesc());
    }

    private static long create(Context ctx, GradScalerDesc desc) {
        long[] out = out();
        try {
            Fp8amp.grad_scaler_create(ctx.handle(), desc, out);
        } finally {
            reachabilityFence(ctx);
            reachabilityFence(desc);
        }
        return out[0];
    }

    /** The current loss scale. */
    public float scale() {
        float[] out = new float[1];
        try {
            Fp8amp.grad_scaler_get_scale(handle(), out);
        } finally {
            reachabilityFence(this);
        }
        return out[0];
    }

    public GradScalerState state() {
        GradScalerState state = new GradScalerState();
        try {
            Fp8amp.grad_scaler_get_state(handle(), state);
        } finally {
            reachabilityFence(this);
        }
        return state;
    }

    public void setState(GradScalerState state) {
        try {
            Fp8amp.grad_scaler_set_state(handle(), state);
        } finally {
            reachabilityFence(this);
            reachabilityFence(state);
        }
    }

    /** Updates the scale from opt's last step (for steps not given this scaler). */
    public void update(Optimizer opt) {
        try {
            Fp8amp.grad_scaler_update(handle(), opt.handle());
        } finally {
            reachabilityFence(this);
            reachabilityFence(opt);
        }
    }
}
