#include "ops.hpp"

#include <algorithm>
#include <cstring>

#include "backend.hpp"  // kernels/backend.hpp
#include "launch_list.hpp"

namespace fp8amp::core {

namespace {
void check_no_overlap(const Tensor &a, const char *a_name, const Tensor &b, const char *b_name) {
    if (a.overlaps(b))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(a_name) + " and " + b_name + " overlap in memory");
}

// Throws DTYPE_MISMATCH unless t is of a scaled dtype: E4M3, E5M2 or F16. (An F16 tensor is a
// scaled tensor when it is the quantize destination or dequantize source; bound_meta then requires
// its meta. As a quantize source or dequantize destination F16 is a plain wide dtype.)
void check_scaled(const Tensor &t, const char *argument) {
    if (!is_scaled_dtype(t.dtype()))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH,
             std::string(argument) + " is " + t.describe() + ": it must be e4m3, e5m2 or f16 (scaled)");
}

// The meta t is bound to; INVALID_ARGUMENT if none.
ScalingMeta &bound_meta(const Tensor &t, const char *argument) {
    if (!t.scaling())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " (" + t.describe() +
                                                ") is not bound to a scaling meta (fp8amp_tensor_set_scaling)");
    return *t.scaling();
}

void check_meta_on_device(const Context &ctx, const ScalingMeta &m, const char *argument) {
    if (!same_device(ctx.device(), m.device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, std::string(argument) + " is an " + m.describe() +
                                               " but the context is on " + device_name(ctx.device()));
}

// Runs one step on ctx's stream: the backend dispatch lives in LaunchList, shared with the Linear.
void run_quantize(const Context &ctx, const Tensor &src, size_t rows, size_t cols, Tensor &dst, Tensor *dst_t) {
    LaunchList steps;
    steps.quantize(src.data(), src.dtype(), rows, cols, dst, dst_t);
    steps.run(ctx, ctx.stream());
    dst.mark_written();
    if (dst_t) dst_t->mark_written();
}

void check_same_shape(const Tensor &a, const char *a_name, const Tensor &b, const char *b_name) {
    if (!a.same_shape(b))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH,
             std::string(a_name) + " is " + a.describe() + " but " + b_name + " is " + b.describe());
}
}  // namespace

void cast(const Context &ctx, const Tensor &src, Tensor &dst) {
    check_on_device(ctx, src, "src");
    check_on_device(ctx, dst, "dst");
    check_writable(dst, "dst");
    check_same_shape(src, "src", dst, "dst");
    if (src.data() == dst.data() && src.dtype() == dst.dtype()) return;  // the same memory: nothing to do
    check_no_overlap(src, "src", dst, "dst");
    LaunchList steps;
    steps.cast(src.data(), src.dtype(), dst.data(), dst.dtype(), static_cast<size_t>(src.numel()));
    steps.run(ctx, ctx.stream());
    dst.mark_written();
}

void quantize(const Context &ctx, const Tensor &src, Tensor &dst) {
    check_wide(src, "src");
    check_scaled(dst, "dst");
    ScalingMeta &meta = bound_meta(dst, "dst");
    check_on_device(ctx, src, "src");
    check_on_device(ctx, dst, "dst");
    check_meta_on_device(ctx, meta, "dst's scaling meta");
    check_writable(dst, "dst");
    check_same_shape(src, "src", dst, "dst");
    check_no_overlap(src, "src", dst, "dst");
    run_quantize(ctx, src, static_cast<size_t>(src.numel()), 1, dst, nullptr);
}

void quantize_transpose(const Context &ctx, const Tensor &src, Tensor &dst, Tensor &dst_t) {
    check_wide(src, "src");
    check_scaled(dst, "dst");
    check_scaled(dst_t, "dst_t");
    if (dst.dtype() != dst_t.dtype())
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "dst is " + dst.describe() + " but dst_t is " + dst_t.describe());
    ScalingMeta &meta = bound_meta(dst, "dst");
    if (&bound_meta(dst_t, "dst_t") != &meta)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "dst and dst_t are bound to different scaling metas");
    check_on_device(ctx, src, "src");
    check_on_device(ctx, dst, "dst");
    check_on_device(ctx, dst_t, "dst_t");
    check_meta_on_device(ctx, meta, "dst's scaling meta");
    check_writable(dst, "dst");
    check_writable(dst_t, "dst_t");
    // src read as [rows, cols]: cols is the last extent, rows the product of the others (1 for a
    // 1-D or 0-D src).
    const size_t cols = src.ndim() > 0 ? static_cast<size_t>(src.shape()[src.ndim() - 1]) : 1;
    const size_t rows = static_cast<size_t>(src.numel()) / cols;
    check_same_shape(src, "src", dst, "dst");
    if (dst_t.ndim() != 2 || static_cast<size_t>(dst_t.shape()[0]) != cols ||
        static_cast<size_t>(dst_t.shape()[1]) != rows)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "src is " + src.describe() + ", read as [" + std::to_string(rows) + ", " +
                                              std::to_string(cols) + "], so dst_t must be [" + std::to_string(cols) +
                                              ", " + std::to_string(rows) + "], not " + dst_t.describe());
    check_no_overlap(src, "src", dst, "dst");
    check_no_overlap(src, "src", dst_t, "dst_t");
    check_no_overlap(dst, "dst", dst_t, "dst_t");
    run_quantize(ctx, src, rows, cols, dst, &dst_t);
}

void dequantize(const Context &ctx, const Tensor &src, Tensor &dst) {
    check_scaled(src, "src");
    check_wide(dst, "dst");
    ScalingMeta &meta = bound_meta(src, "src");
    check_on_device(ctx, src, "src");
    check_on_device(ctx, dst, "dst");
    check_meta_on_device(ctx, meta, "src's scaling meta");
    check_writable(dst, "dst");
    check_same_shape(src, "src", dst, "dst");
    check_no_overlap(src, "src", dst, "dst");
    LaunchList steps;
    steps.dequantize(src, dst.data(), dst.dtype());
    steps.run(ctx, ctx.stream());
    dst.mark_written();
}

float amax(const Context &ctx, const Tensor &t) {
    check_on_device(ctx, t, "t");
    const auto n = static_cast<size_t>(t.numel());
    kernels::Backend &backend = ctx.backend();
    // The device memory the backend reduces into (from the context's allocator), if it needs any.
    std::shared_ptr<Storage> scratch;
    if (const size_t nbytes = backend.amax_scratch_bytes()) scratch = ctx.allocate(nbytes);
    const uint32_t bits = backend.amax(t.data(), t.dtype(), n, scratch ? scratch->data() : nullptr);
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

void update_scaling(const Context &ctx, const std::vector<std::shared_ptr<ScalingMeta>> &metas) {
    std::vector<kernels::ScalingState *> states;
    states.reserve(metas.size());
    for (size_t i = 0; i < metas.size(); ++i) {
        // The argument's name is built only for the message: this loop runs for every meta of a model.
        if (!same_device(ctx.device(), metas[i]->device()))
            check_meta_on_device(ctx, *metas[i], ("metas[" + std::to_string(i) + "]").c_str());
        states.push_back(metas[i]->state());
    }
    std::vector<kernels::ScalingState *> sorted = states;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        const auto dup = *std::adjacent_find(sorted.begin(), sorted.end());
        const auto first = std::find(states.begin(), states.end(), dup);
        const auto second = std::find(first + 1, states.end(), dup);
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "metas[" + std::to_string(first - states.begin()) + "] and metas[" +
                                                std::to_string(second - states.begin()) + "] are the same meta");
    }
    if (states.empty()) return;
    ctx.backend().update_scaling(states.data(), states.size());
}

}  // namespace fp8amp::core
