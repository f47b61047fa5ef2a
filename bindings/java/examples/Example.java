import java.util.Random;
import org.fp8amp.Context;
import org.fp8amp.Fp8ampException;
import org.fp8amp.Linear;
import org.fp8amp.Optimizer;
import org.fp8amp.Scaling;
import org.fp8amp.Tensor;
import org.fp8amp.swig.DType;
import org.fp8amp.swig.OptLevel;
import org.fp8amp.swig.Recipe;
import org.fp8amp.swig.ScalingMode;

public class Example {
    public static void main(String[] args) {
        Random rng = new Random(0);
        float[] x = new float[8 * 32], w = new float[16 * 32], dy = new float[8 * 16];
        for (int i = 0; i < x.length; ++i) x[i] = (float) rng.nextGaussian();
        for (int i = 0; i < w.length; ++i) w[i] = (float) rng.nextGaussian() * 0.2f;
        for (int i = 0; i < dy.length; ++i) dy[i] = (float) rng.nextGaussian() * 0.01f;

        try (Context ctx = Context.cpu();
             Tensor xt = new Tensor(ctx, DType.DTYPE_F32, 8, 32).copyFrom(x)) {
            // 1. Quantize to E4M3 with current scaling (scale = 448 / amax), then back to F32.
            Recipe current = new Recipe();                  // the library's defaults
            current.setMode(ScalingMode.SCALING_CURRENT);
            try (Scaling meta = new Scaling(ctx, current, DType.DTYPE_E4M3);
                 Tensor q = new Tensor(ctx, DType.DTYPE_E4M3, 8, 32);
                 Tensor back = new Tensor(ctx, DType.DTYPE_F32, 8, 32)) {
                q.setScaling(meta);
                ctx.quantize(xt, q);
                ctx.dequantize(q, back);
                System.out.printf("scale %.2f: %.4f -> code 0x%02x -> %.4f%n",
                        meta.scale(), x[0], q.toBytes()[0], back.toFloats()[0]);
            }

            // 2. One training step: an FP8 Linear (BF16 weight, E4M3 weight gradient), Adam at O2.
            try (Linear lin = new Linear(ctx, 32, 16);
                 Tensor weight = lin.weight();                 // handles: close them too
                 Tensor wgrad = lin.weightGrad();
                 Tensor bias = lin.bias();
                 Tensor bgrad = lin.biasGrad();
                 Tensor w32 = new Tensor(ctx, DType.DTYPE_F32, 16, 32).copyFrom(w);
                 Tensor y = new Tensor(ctx, DType.DTYPE_F32, 8, 16);
                 Tensor dyt = new Tensor(ctx, DType.DTYPE_F32, 8, 16).copyFrom(dy);
                 Optimizer opt = new Optimizer(ctx, Optimizer.desc(OptLevel.OPT_LEVEL_O2))) {
                ctx.cast(w32, weight);                         // F32 -> BF16, round to nearest even
                opt.addParam(weight, wgrad);
                opt.addParam(bias, bgrad);
                lin.forward(xt, y, true);
                lin.backward(dyt, null, false);                // null: no input gradient
                opt.step();
                System.out.printf("y[0] %.4f, gemm %s, step %d, skipped %b, state %d bytes%n",
                        y.toFloats()[0], lin.gemmKind(), opt.stepCount(), opt.foundInf(), opt.stateBytes());
            }

            // 3. A failed call throws, with the status and the library's message.
            try {
                new Tensor(ctx, DType.DTYPE_F32, 4, -1).close();
            } catch (Fp8ampException e) {
                System.out.println(e.status() + " | " + e.libraryMessage());
            }
        }
    }
}
