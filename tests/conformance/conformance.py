"""The conformance scenario's Python runner (tests/conformance/SCENARIO.md), through the ``fp8amp``
package's own classes (Context, Scaling, Tensor, Linear, Optimizer), so that the binding's layer --
not only its CFFI module -- is what is compared with the C runner.

Usage: conformance.py OUTPUT_PATH

The package: with FP8AMP_LIB set (a libfp8amp.so path, as ctest does), the binding built against
that library (bindings/python/binding_for.py, cached beside it); otherwise the installed ``fp8amp``.
Exits 0 on success, 1 with the library's message on stderr when a call fails, 77 when the binding
cannot be built here (missing cffi/setuptools/wheel/Python headers: ctest reports SKIPPED), leaving
OUTPUT_PATH's stem + ".skipped" so that compare.py reports the binding as skipped, not missing.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

M, K, N = 16, 32, 24


def load_fp8amp(out_path):
    lib = os.environ.get("FP8AMP_LIB")
    if not lib:
        import fp8amp
        return fp8amp
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    from binding_for import MissingBuildTools, import_fp8amp
    try:
        return import_fp8amp(lib)
    except MissingBuildTools as e:
        # A marker beside the output tells compare.py that this runner was skipped, not broken.
        with open(os.path.splitext(out_path)[0] + ".skipped", "w") as f:
            f.write("%s\n" % e)
        print("SKIPPED: %s" % e)
        sys.exit(77)


def inputs(np):
    """SCENARIO.md's inputs: exact integers (int64) divided in IEEE float32."""
    def gen(n, mul, mod, off, div):
        i = np.arange(n, dtype=np.int64)
        return ((i * mul) % mod - off).astype(np.float32) / np.float32(div)
    x = gen(M * K, 7919, 2003, 1001, 173.0).reshape(M, K)
    w = gen(N * K, 104729, 1999, 999, 4096.0).reshape(N, K)
    b = gen(N, 31, 17, 8, 64.0)
    dy = gen(M * N, 31337, 997, 498, 256.0).reshape(M, N)
    return x, w, b, dy


def run(fp8amp, np, out_path):
    x, w, b, dy = inputs(np)
    records = []
    with fp8amp.Context("cpu") as ctx:
        # 1. Quantize / dequantize: a default-recipe E4M3 meta at scale 4.
        meta = fp8amp.Scaling(ctx, fp8amp.Recipe(), fp8amp.E4M3)
        meta.set_scale(4.0)
        tx = fp8amp.Tensor.from_numpy(ctx, x)
        q = fp8amp.Tensor(ctx, (M, K), fp8amp.E4M3)
        q.set_scaling(meta)
        fp8amp.quantize(ctx, tx, q)
        d = fp8amp.Tensor(ctx, (M, K), fp8amp.F32)
        fp8amp.dequantize(ctx, q, d)

        # 2. The Linear: the BF16 weight made from W by the library's cast, the bias copied.
        lin = fp8amp.Linear(ctx, K, N, bias=True, weight_dtype=fp8amp.BF16, wgrad_dtype=fp8amp.E4M3,
                            policy=fp8amp.GemmPolicy.ALWAYS_FP8)
        fp8amp.cast(ctx, fp8amp.Tensor.from_numpy(ctx, w), lin.weight)
        lin.bias.copy_from_numpy(b)
        y = fp8amp.Tensor(ctx, (M, N), fp8amp.F32)
        lin.forward(tx, y, training=True)
        dx = fp8amp.Tensor(ctx, (M, K), fp8amp.F32)
        lin.backward(fp8amp.Tensor.from_numpy(ctx, dy), dx, accumulate=False)
        for t in (q, d, y, dx, lin.weight_grad, lin.weight_grad.scale_inv(), lin.bias_grad):
            records.append(t.numpy().tobytes())

        # 3. One O2 AdamW step, lr 1e-3, the preset's other fields.
        opt = fp8amp.Optimizer(ctx, fp8amp.AdamConfig.for_level("O2", lr=1e-3))
        opt.add_param(lin.weight, lin.weight_grad)
        opt.add_param(lin.bias, lin.bias_grad)
        opt.step()
        records.append(lin.weight.numpy().tobytes())
        records.append(lin.bias.numpy().tobytes())
        records.append(np.array([1 if opt.found_inf else 0], dtype="<i4").tobytes())
        ckpt = opt.save()
    data = b"".join(records)
    if len(data) != 8648:
        raise RuntimeError("the records hold %d bytes, the scenario says 8648" % len(data))
    data += np.array([len(ckpt)], dtype="<u8").tobytes() + ckpt  # the checkpoint: its length, its bytes
    if sys.byteorder != "little":  # the numpy arrays are in host order
        raise RuntimeError("this runner writes host byte order and needs a little-endian host")
    with open(out_path, "wb") as f:
        f.write(data)


def main(argv):
    if len(argv) != 2:
        print("usage: conformance.py OUTPUT_PATH", file=sys.stderr)
        return 2
    fp8amp = load_fp8amp(argv[1])
    import numpy as np
    try:
        run(fp8amp, np, argv[1])
    except fp8amp.Error as e:
        print("conformance.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
