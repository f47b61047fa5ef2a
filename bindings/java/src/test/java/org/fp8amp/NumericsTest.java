package org.fp8amp;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;
import org.fp8amp.swig.AdamDesc;
import org.fp8amp.swig.DType;
import org.fp8amp.swig.GemmKind;
import org.fp8amp.swig.GemmPolicy;
import org.fp8amp.swig.LinearDesc;
import org.fp8amp.swig.LinearRole;
import org.fp8amp.swig.OptLevel;
import org.fp8amp.swig.Recipe;
import org.fp8amp.swig.ScalingMode;
import org.fp8amp.swig.ScalingStats;
import org.fp8amp.swig.Status;
import org.junit.jupiter.api.Test;

/** The numbers: quantize against a Java E4M3 codec, the Linear against float64, Adam's step. */
class NumericsTest {
    private static float[] gaussian(Random rng, int n, double scale) {
        float[] v = new float[n];
        for (int i = 0; i < n; ++i) v[i] = (float) (rng.nextGaussian() * scale);
        return v;
    }

    /** A Linear [k -> n] descriptor with the library's defaults but the policy ALWAYS_FP8. */
    private static LinearDesc fp8Desc(int k, int n) {
        LinearDesc desc = new LinearDesc();
        desc.setInFeatures(k);
        desc.setOutFeatures(n);
        desc.setPolicy(GemmPolicy.GEMM_ALWAYS_FP8);
        return desc;
    }

    private static void assertAllFinite(float[] v, String what) {
        for (int i = 0; i < v.length; ++i) assertTrue(Float.isFinite(v[i]), what + "[" + i + "] = " + v[i]);
    }

    @Test
    void quantizeAndDequantizeMatchTheJavaCodec() {
        Random rng = new Random(21);
        int n = 4096;
        float[] x = new float[n];
        for (int i = 0; i < n; ++i) {
            // magnitudes from subnormal to saturating once scaled by 3.5
            x[i] = (float) (rng.nextGaussian() * Math.pow(2.0, rng.nextInt(24) - 14));
        }
        float scale = 3.5f;
        try (Context ctx = Context.cpu();
             Scaling meta = new Scaling(ctx, DType.DTYPE_E4M3);
             Tensor src = new Tensor(ctx, DType.DTYPE_F32, 64, 64).copyFrom(x);
             Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 64, 64);
             Tensor d = new Tensor(ctx, DType.DTYPE_F32, 64, 64)) {
            meta.setScale(scale);
            meta.enableStats(true);
            q.setScaling(meta);
            ctx.quantize(src, q);
            ctx.dequantize(q, d);
            byte[] codes = q.toBytes();
            float[] back = d.toFloats();
            float scaleInv = meta.scaleInv();
            assertEquals(1.0f / scale, scaleInv);
            float amax = 0;
            int saturated = 0;
            for (int i = 0; i < n; ++i) {
                float y = x[i] * scale;
                assertEquals(Reference.e4m3(y), codes[i], "code of element " + i + " (x*scale = " + y + ")");
                assertEquals(Reference.e4m3ToFloat(codes[i]) * scaleInv, back[i], "dequantized element " + i);
                if (Math.abs(y) <= 448f) {
                    // round trip bound: half an E4M3 step (2^-4 relative, 2^-10 absolute below 2^-6)
                    double bound = Math.max(Math.abs(x[i]) * 0x1p-4, 0x1p-10 * scaleInv) * 1.0000001;
                    assertTrue(Math.abs(back[i] - x[i]) <= bound, "element " + i + ": " + x[i] + " -> " + back[i]);
                } else {
                    saturated++;
                    assertEquals(Math.copySign(448f, y) * scaleInv, back[i]);
                }
                amax = Math.max(amax, Math.abs(x[i]));
            }
            assertTrue(saturated > 0 && saturated < n, "the data should saturate some elements: " + saturated);
            assertEquals(amax, meta.amax());
            assertEquals(amax, ctx.amax(src));
            try (Tensor at = meta.amaxTensor()) { // the same 4 bytes, read-only
                assertArrayEquals(new float[] {amax}, at.toFloats());
                Fp8ampException e = assertThrows(Fp8ampException.class, () -> at.copyFrom(new float[] {1f}));
                assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
            }
            ScalingStats stats = meta.stats();
            assertEquals(n, stats.getQuantized());
            assertEquals(saturated, stats.getSaturated());
            try (Tensor si = q.scaleInv()) {
                assertArrayEquals(new float[] {scaleInv}, si.toFloats());
            }
        }
    }

    @Test
    void currentScalingQuantizeTransposeAndUpdate() {
        Random rng = new Random(22);
        float[] x = gaussian(rng, 24 * 40, 7.0);
        Recipe recipe = new Recipe();
        recipe.setMode(ScalingMode.SCALING_CURRENT);
        recipe.setAmaxHistoryLen(4);
        try (Context ctx = Context.cpu();
             Scaling meta = new Scaling(ctx, recipe, DType.DTYPE_E4M3);
             Tensor src = new Tensor(ctx, DType.DTYPE_F32, 24, 40).copyFrom(x);
             Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 24, 40);
             Tensor qt = new Tensor(ctx, DType.DTYPE_E4M3, 40, 24)) {
            q.setScaling(meta);
            qt.setScaling(meta);
            ctx.quantizeTranspose(src, q, qt);
            float amax = 0;
            for (float v : x) amax = Math.max(amax, Math.abs(v));
            float scale = 448f / amax; // current scaling: the tensor's own amax, margin 0
            assertEquals(scale, meta.scale(), scale * 1e-6f);
            byte[] a = q.toBytes(), b = qt.toBytes();
            for (int r = 0; r < 24; ++r) {
                for (int c = 0; c < 40; ++c) {
                    assertEquals(a[r * 40 + c], b[c * 24 + r]);
                    assertEquals(Reference.e4m3(x[r * 40 + c] * meta.scale()), a[r * 40 + c]);
                }
            }
            meta.update();
            float[] history = meta.history(4);
            assertEquals(amax, history[0]);
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> meta.history(3));
            assertEquals(Status.ERROR_INVALID_ARGUMENT, e.status());
        } finally {
            recipe.delete();
        }
    }

    @Test
    void linearForwardFp8IsTheWideForwardByteForByte() {
        // x quantized by the caller into a tensor bound to the Linear's INPUT meta (what a fused
        // norm writes) gives the bytes of the Linear quantizing the same x itself, backward included.
        Random rng = new Random(31);
        int m = 12, k = 32, n = 16;
        float[] x = gaussian(rng, m * k, 1.0);
        float[] w = gaussian(rng, n * k, 0.125);
        float[] b = gaussian(rng, n, 0.5);
        float[] dy = gaussian(rng, m * n, 0.01);
        LinearDesc desc = fp8Desc(k, n);
        try (Context ctx = Context.cpu();
             Linear wide = new Linear(ctx, desc);
             Linear fed = new Linear(ctx, desc);
             Scaling input = fed.scaling(LinearRole.ROLE_INPUT);
             Tensor w32 = new Tensor(ctx, DType.DTYPE_F32, n, k).copyFrom(w);
             Tensor xt = new Tensor(ctx, DType.DTYPE_F32, m, k).copyFrom(x);
             Tensor x8 = new Tensor(ctx, DType.DTYPE_E4M3, m, k);
             Tensor ya = new Tensor(ctx, DType.DTYPE_F32, m, n);
             Tensor yb = new Tensor(ctx, DType.DTYPE_F32, m, n);
             Tensor dyt = new Tensor(ctx, DType.DTYPE_F32, m, n).copyFrom(dy);
             Tensor dxa = new Tensor(ctx, DType.DTYPE_F32, m, k);
             Tensor dxb = new Tensor(ctx, DType.DTYPE_F32, m, k)) {
            for (Linear lin : new Linear[] {wide, fed}) {
                try (Tensor weight = lin.weight(); Tensor bias = lin.bias()) {
                    ctx.cast(w32, weight);
                    bias.copyFrom(b);
                }
            }
            x8.setScaling(input);
            ctx.quantize(xt, x8);
            assertEquals(GemmKind.GEMM_KIND_FP8, fed.chooseGemm(m, true));
            wide.forward(xt, ya, true);
            fed.forwardFp8(x8, yb, true);
            assertArrayEquals(ya.toFloats(), yb.toFloats());
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> fed.forwardFp8(xt, yb, true));
            assertEquals(Status.ERROR_DTYPE_MISMATCH, e.status());
            wide.backward(dyt, dxa, false);
            fed.backward(dyt, dxb, false);
            assertArrayEquals(dxa.toFloats(), dxb.toFloats());
            try (Tensor ga = wide.weightGrad(); Tensor gb = fed.weightGrad();
                 Tensor ba = wide.biasGrad(); Tensor bb = fed.biasGrad()) {
                assertArrayEquals(ga.toBytes(), gb.toBytes());
                assertArrayEquals(ba.toFloats(), bb.toFloats());
            }
        }
    }

    @Test
    void linearForwardAndBackwardAgreeWithFloat64() {
        Random rng = new Random(23);
        int m = 8, k = 64, n = 16;
        float[] x = gaussian(rng, m * k, 1.0);
        float[] w = gaussian(rng, n * k, 0.125);
        float[] b = gaussian(rng, n, 0.5);
        float[] dy = gaussian(rng, m * n, 0.01);
        LinearDesc desc = fp8Desc(k, n);
        try (Context ctx = Context.cpu();
             Linear lin = new Linear(ctx, desc);
             Tensor weight = lin.weight();
             Tensor bias = lin.bias();
             Tensor bgrad = lin.biasGrad();
             Tensor wgrad = lin.weightGrad();
             Tensor w32 = new Tensor(ctx, DType.DTYPE_F32, n, k).copyFrom(w);
             Tensor xt = new Tensor(ctx, DType.DTYPE_F32, m, k).copyFrom(x);
             Tensor y = new Tensor(ctx, DType.DTYPE_F32, m, n);
             Tensor dyt = new Tensor(ctx, DType.DTYPE_F32, m, n).copyFrom(dy);
             Tensor dx = new Tensor(ctx, DType.DTYPE_F32, m, k);
             Tensor wg32 = new Tensor(ctx, DType.DTYPE_F32, n, k)) {
            assertEquals(DType.DTYPE_BF16, weight.dtype());
            ctx.cast(w32, weight);
            bias.copyFrom(b);
            short[] wCodes = weight.toShorts();
            double[] wv = new double[n * k];
            for (int i = 0; i < wv.length; ++i) wv[i] = Reference.bf16ToFloat(wCodes[i]);

            lin.forward(xt, y, true);
            assertEquals(GemmKind.GEMM_KIND_FP8, lin.gemmKind());
            float[] yv = y.toFloats();
            assertAllFinite(yv, "y");
            double errSq = 0, refSq = 0;
            for (int r = 0; r < m; ++r) {
                for (int c = 0; c < n; ++c) {
                    double ref = b[c], absSum = Math.abs(b[c]);
                    for (int i = 0; i < k; ++i) {
                        ref += (double) x[r * k + i] * wv[c * k + i];
                        absSum += Math.abs((double) x[r * k + i] * wv[c * k + i]);
                    }
                    double err = yv[r * n + c] - ref;
                    // E4M3 operands: each product within ~2 * 2^-4 relative; the bias within BF16's 2^-8
                    assertTrue(Math.abs(err) <= 0.15 * absSum + 1e-6, "y[" + r + "," + c + "] = " + yv[r * n + c] + " vs " + ref);
                    errSq += err * err;
                    refSq += ref * ref;
                }
            }
            assertTrue(Math.sqrt(errSq / refSq) < 0.08, "relative error of y: " + Math.sqrt(errSq / refSq));

            lin.backward(dyt, dx, false);
            float[] dxv = dx.toFloats();
            assertAllFinite(dxv, "dx");
            errSq = 0;
            refSq = 0;
            for (int r = 0; r < m; ++r) {
                for (int i = 0; i < k; ++i) {
                    double ref = 0, absSum = 0;
                    for (int c = 0; c < n; ++c) {
                        ref += (double) dy[r * n + c] * wv[c * k + i];
                        absSum += Math.abs((double) dy[r * n + c] * wv[c * k + i]);
                    }
                    double err = dxv[r * k + i] - ref;
                    // dY in E5M2 (HYBRID): 2^-3 relative, W in E4M3
                    assertTrue(Math.abs(err) <= 0.25 * absSum + 1e-7, "dx[" + r + "," + i + "] = " + dxv[r * k + i] + " vs " + ref);
                    errSq += err * err;
                    refSq += ref * ref;
                }
            }
            assertTrue(Math.sqrt(errSq / refSq) < 0.15, "relative error of dx: " + Math.sqrt(errSq / refSq));

            float[] bg = bgrad.toFloats();
            for (int c = 0; c < n; ++c) {
                double ref = 0;
                for (int r = 0; r < m; ++r) ref += dy[r * n + c];
                assertEquals(ref, bg[c], 1e-6 + 1e-5 * Math.abs(ref), "bias grad " + c);
            }
            // the E4M3 weight gradient, dequantized, against dY^T X in float64
            assertEquals(DType.DTYPE_E4M3, wgrad.dtype());
            ctx.dequantize(wgrad, wg32);
            float[] wgv = wg32.toFloats();
            assertAllFinite(wgv, "wgrad");
            errSq = 0;
            refSq = 0;
            for (int c = 0; c < n; ++c) {
                for (int i = 0; i < k; ++i) {
                    double ref = 0;
                    for (int r = 0; r < m; ++r) ref += (double) dy[r * n + c] * x[r * k + i];
                    errSq += (wgv[c * k + i] - ref) * (wgv[c * k + i] - ref);
                    refSq += ref * ref;
                }
            }
            assertTrue(Math.sqrt(errSq / refSq) < 0.15, "relative error of the weight gradient: " + Math.sqrt(errSq / refSq));

            // a shape mismatch is refused and names the problem
            try (Tensor bad = new Tensor(ctx, DType.DTYPE_F32, m, k + 1)) {
                Fp8ampException e = assertThrows(Fp8ampException.class, () -> lin.forward(bad, y, true));
                assertEquals(Status.ERROR_SHAPE_MISMATCH, e.status());
                assertTrue(e.libraryMessage().startsWith("fp8amp_linear_forward"), e.libraryMessage());
            }
        } finally {
            desc.delete();
        }
    }

    @Test
    void adamWStepMatchesItsFormulaAndCheckpointsRoundTrip() {
        Random rng = new Random(24);
        int n = 300;
        float[] p = gaussian(rng, n, 1.0);
        float[] g = gaussian(rng, n, 0.1);
        AdamDesc desc = Optimizer.desc(OptLevel.OPT_LEVEL_O1);
        float lr = 1e-2f, wd = desc.getWeightDecay(), eps = desc.getEps();
        desc.setLr(lr);
        try (Context ctx = Context.cpu();
             Tensor param = new Tensor(ctx, DType.DTYPE_F32, 10, 30).copyFrom(p);
             Tensor grad = new Tensor(ctx, DType.DTYPE_F32, 10, 30).copyFrom(g);
             Optimizer opt = new Optimizer(ctx, desc)) {
            opt.addParam(param, grad);
            assertEquals(1, opt.numParams());
            assertTrue(opt.stateBytes() >= 2L * 4 * n);
            byte[] checkpoint = opt.save();
            opt.step();
            assertFalse(opt.foundInf());
            assertEquals(1, opt.stepCount());
            float[] after = param.toFloats();
            double norm = 0;
            for (int i = 0; i < n; ++i) {
                // first AdamW step: m^ = g, sqrt(v^) = |g|
                double ref = p[i] * (1.0 - (double) lr * wd) - lr * g[i] / (Math.abs((double) g[i]) + eps);
                assertEquals(ref, after[i], 1e-6 + 1e-6 * Math.abs(ref), "param " + i);
                norm += (double) g[i] * g[i];
            }
            assertEquals(Math.sqrt(norm), opt.gradNorm(), 1e-5 * Math.sqrt(norm));

            // a NaN gradient: the step is skipped and changes nothing
            float[] bad = g.clone();
            bad[17] = Float.NaN;
            grad.copyFrom(bad);
            opt.step();
            assertTrue(opt.foundInf());
            assertEquals(1, opt.stepCount());
            assertArrayEquals(after, param.toFloats());

            // the checkpoint from before the step restores parameter and state
            opt.load(checkpoint);
            assertEquals(0, opt.stepCount());
            assertArrayEquals(p, param.toFloats());
            byte[] corrupt = checkpoint.clone();
            corrupt[corrupt.length / 2] ^= 0x5A;
            Fp8ampException e = assertThrows(Fp8ampException.class, () -> opt.load(corrupt));
            assertEquals(Status.ERROR_CORRUPT_DATA, e.status());
            assertArrayEquals(p, param.toFloats());
        } finally {
            desc.delete();
        }
    }

    @Test
    void aSmallO2TrainingLoopLearns() {
        Random rng = new Random(25);
        int k = 16, n = 4, batch = 32, steps = 60;
        float[] teacher = gaussian(rng, n * k, 0.5);
        LinearDesc desc = new LinearDesc();
        desc.setInFeatures(k);
        desc.setOutFeatures(n);
        desc.setHasBias(0);
        desc.setPolicy(GemmPolicy.GEMM_ALWAYS_FP8);
        AdamDesc adam = Optimizer.desc(OptLevel.OPT_LEVEL_O2);
        adam.setLr(0.05f);
        adam.setWeightDecay(0f);
        try (Context ctx = Context.cpu();
             Linear lin = new Linear(ctx, desc);
             Tensor weight = lin.weight();
             Tensor wgrad = lin.weightGrad();
             Scaling inMeta = lin.scaling(LinearRole.ROLE_INPUT);
             Scaling goMeta = lin.scaling(LinearRole.ROLE_GRAD_OUTPUT);
             Tensor w0 = new Tensor(ctx, DType.DTYPE_F32, n, k).copyFrom(gaussian(rng, n * k, 0.1));
             Tensor x = new Tensor(ctx, DType.DTYPE_F32, batch, k);
             Tensor y = new Tensor(ctx, DType.DTYPE_F32, batch, n);
             Tensor dy = new Tensor(ctx, DType.DTYPE_F32, batch, n);
             Optimizer opt = new Optimizer(ctx, adam)) {
            ctx.cast(w0, weight);
            opt.addParam(weight, wgrad);
            double first = 0, last = 0;
            for (int step = 0; step < steps; ++step) {
                float[] xv = gaussian(rng, batch * k, 1.0);
                x.copyFrom(xv);
                lin.forward(x, y, true);
                float[] yv = y.toFloats();
                float[] dyv = new float[batch * n];
                double loss = 0;
                for (int r = 0; r < batch; ++r) {
                    for (int c = 0; c < n; ++c) {
                        double t = 0;
                        for (int i = 0; i < k; ++i) t += (double) xv[r * k + i] * teacher[c * k + i];
                        double diff = yv[r * n + c] - t;
                        loss += diff * diff / (batch * n);
                        dyv[r * n + c] = (float) (2.0 * diff / (batch * n));
                    }
                }
                assertTrue(Double.isFinite(loss), "loss at step " + step);
                if (step == 0) first = loss;
                last = loss;
                dy.copyFrom(dyv);
                lin.backward(dy, null, false);
                opt.step();
                assertFalse(opt.foundInf(), "step " + step);
                ctx.updateScalings(inMeta, goMeta);
            }
            assertEquals(steps, opt.stepCount());
            assertTrue(last < 0.25 * first, "loss " + first + " -> " + last);
            assertNotEquals(0f, inMeta.scale());
        } finally {
            desc.delete();
            adam.delete();
        }
    }
}
