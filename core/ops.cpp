#include "ops.hpp"

#include "kernels.hpp"

namespace fp8amp::core {

namespace {
bool overlap(const Tensor &a, const Tensor &b) {
    const auto *a0 = static_cast<const char *>(a.data());
    const auto *b0 = static_cast<const char *>(b.data());
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}
}  // namespace

void cast(const Context &ctx, const Tensor &src, Tensor &dst) {
    check_on_device(ctx, src, "src");
    check_on_device(ctx, dst, "dst");
    check_writable(dst, "dst");
    if (!src.same_shape(dst))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "src is " + src.describe() + " but dst is " + dst.describe());
    if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;  // the same memory: nothing to do
    if (overlap(src, dst)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "src and dst overlap in memory");
    const auto n = static_cast<size_t>(src.numel());
    if (ctx.is_cuda())
        kernels::cuda::cast(ctx.device().index, ctx.stream(), src.data(), src.dtype(), dst.data(), dst.dtype(), n);
    else
        kernels::cpu::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), n);
}

}  // namespace fp8amp::core
