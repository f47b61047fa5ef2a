package org.fp8amp.conformance;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.fp8amp.Context;
import org.fp8amp.Fp8ampException;
import org.fp8amp.Linear;
import org.fp8amp.Optimizer;
import org.fp8amp.Scaling;
import org.fp8amp.Tensor;
import org.fp8amp.swig.AdamDesc;
import org.fp8amp.swig.AdamStepArgs;
import org.fp8amp.swig.DType;
import org.fp8amp.swig.GemmPolicy;
import org.fp8amp.swig.LinearDesc;
import org.fp8amp.swig.OptLevel;
import org.fp8amp.swig.Recipe;

/**
 * The Java runner of the conformance scenario (tests/conformance/SCENARIO.md): the same fixed
 * computation as the C, Python and Rust runners, through this binding's classes, written as the
 * same little-endian file (8648 bytes of records, then the optimizer's checkpoint).
 *
 * <pre>java -Dfp8amp.jni.library=/path/libfp8amp_java.so -cp fp8amp.jar:fp8amp-conformance.jar \
 *     org.fp8amp.conformance.Conformance OUTPUT</pre>
 * Exit status 0 on success; 1 with the library's message on stderr when a call fails; 2 on bad usage.
 */
public final class Conformance {
    private Conformance() {}

    // Inputs (SCENARIO.md): float32 from exact integers, one IEEE division each, as every runner.
    static float[] x() {
        float[] v = new float[16 * 32];
        for (int i = 0; i < v.length; ++i) v[i] = (float) ((i * 7919) % 2003 - 1001) / 173.0f;
        return v;
    }

    static float[] w() {
        float[] v = new float[24 * 32];
        for (int i = 0; i < v.length; ++i) v[i] = (float) ((i * 104729) % 1999 - 999) / 4096.0f;
        return v;
    }

    static float[] b() {
        float[] v = new float[24];
        for (int i = 0; i < v.length; ++i) v[i] = (float) ((i * 31) % 17 - 8) / 64.0f;
        return v;
    }

    static float[] dy() {
        float[] v = new float[16 * 24];
        for (int i = 0; i < v.length; ++i) v[i] = (float) ((i * 31337) % 997 - 498) / 256.0f;
        return v;
    }

    /** Runs the scenario and returns the file's bytes: the 8648 of the records, then the checkpoint. */
    public static byte[] run() {
        ByteBuffer out = ByteBuffer.allocate(8648).order(ByteOrder.LITTLE_ENDIAN);
        byte[] checkpoint;
        try (Context ctx = Context.cpu();
             Tensor x = new Tensor(ctx, DType.DTYPE_F32, 16, 32)) {
            x.copyFrom(x());

            // 1. quantize / dequantize with a fixed scale of 4
            Recipe recipe = new Recipe();
            try (Scaling meta = new Scaling(ctx, recipe, DType.DTYPE_E4M3);
                 Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 16, 32);
                 Tensor d = new Tensor(ctx, DType.DTYPE_F32, 16, 32)) {
                meta.setScale(4.0f);
                q.setScaling(meta);
                ctx.quantize(x, q);
                ctx.dequantize(q, d);
                out.put(q.toBytes());
                putFloats(out, d.toFloats());
            } finally {
                recipe.delete();
            }

            // 2. Linear forward and backward
            LinearDesc desc = new LinearDesc();
            desc.setInFeatures(32);
            desc.setOutFeatures(24);
            desc.setHasBias(1);
            desc.setWeightDtype(DType.DTYPE_BF16);
            desc.setWgradDtype(DType.DTYPE_E4M3);
            desc.setPolicy(GemmPolicy.GEMM_ALWAYS_FP8);
            try (Linear lin = new Linear(ctx, desc);
                 Tensor weight = lin.weight();
                 Tensor bias = lin.bias();
                 Tensor wgrad = lin.weightGrad();
                 Tensor bgrad = lin.biasGrad();
                 Tensor w32 = new Tensor(ctx, DType.DTYPE_F32, 24, 32);
                 Tensor y = new Tensor(ctx, DType.DTYPE_F32, 16, 24);
                 Tensor dyT = new Tensor(ctx, DType.DTYPE_F32, 16, 24);
                 Tensor dx = new Tensor(ctx, DType.DTYPE_F32, 16, 32)) {
                w32.copyFrom(w());
                ctx.cast(w32, weight);
                bias.copyFrom(b());
                lin.forward(x, y, true);
                dyT.copyFrom(dy());
                lin.backward(dyT, dx, false);
                putFloats(out, y.toFloats());
                putFloats(out, dx.toFloats());
                out.put(wgrad.toBytes());
                try (Tensor scaleInv = wgrad.scaleInv()) {
                    putFloats(out, scaleInv.toFloats());
                }
                putFloats(out, bgrad.toFloats());

                // 3. one O2 optimizer step
                AdamDesc adam = Optimizer.desc(OptLevel.OPT_LEVEL_O2);
                adam.setLr(1e-3f);
                AdamStepArgs args = new AdamStepArgs();
                try (Optimizer opt = new Optimizer(ctx, adam)) {
                    opt.addParam(weight, wgrad);
                    opt.addParam(bias, bgrad);
                    opt.step(args);
                    out.put(weight.toBytes());
                    putFloats(out, bias.toFloats());
                    out.putInt(opt.foundInf() ? 1 : 0);
                    checkpoint = opt.save();
                } finally {
                    adam.delete();
                    args.delete();
                }
            } finally {
                desc.delete();
            }
        }
        if (out.position() != out.capacity()) {
            throw new IllegalStateException("wrote " + out.position() + " bytes, the scenario has " + out.capacity());
        }
        // The optimizer's checkpoint after the step: its length (uint64, little-endian) and its bytes.
        ByteBuffer all = ByteBuffer.allocate(out.capacity() + 8 + checkpoint.length).order(ByteOrder.LITTLE_ENDIAN);
        all.put(out.array()).putLong(checkpoint.length).put(checkpoint);
        return all.array();
    }

    private static void putFloats(ByteBuffer out, float[] values) {
        for (float v : values) out.putFloat(v);
    }

    public static void main(String[] argv) {
        if (argv.length != 1) {
            System.err.println("usage: java ... org.fp8amp.conformance.Conformance OUTPUT");
            System.exit(2);
        }
        try {
            byte[] bytes = run();
            Path path = Paths.get(argv[0]);
            Files.write(path, bytes);
        } catch (Fp8ampException e) {
            System.err.println("conformance (java): " + e.getMessage());
            System.exit(1);
        } catch (IOException e) {
            System.err.println("conformance (java): cannot write " + argv[0] + ": " + e);
            System.exit(1);
        }
    }
}
