#include "norm_ops.hpp"

#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"  // kernels/backend.hpp
#include "activation.hpp"  // kernels/activation.hpp (the argument struct)
#include "norm.hpp"        // kernels/norm.hpp (the argument structs)
#include "scaling_meta.hpp"

namespace fp8amp::core {

namespace {

// The context's scratch slot of the backward's partial column sums (slots 0-6 are the Linears':
// linear.cpp). A slot of its own, so that a norm backward issued within a Linear's call (a fused
// LayerNormLinear) never takes memory whose pointer the Linear still holds.
constexpr size_t kScratchNorm = 7;
static_assert(kScratchNorm < Context::kScratchSlots, "a slot of its own");

void check_f32(const Tensor &t, const char *argument) {
    if (t.dtype() != FP8AMP_DTYPE_F32)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string(argument) + " is " + t.describe() + ": it must be f32");
}

void check_meta_device(const Context &ctx, const ScalingMeta &m, const char *argument) {
    if (!same_device(ctx.device(), m.device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH,
             std::string(argument) + " is an " + m.describe() + " but the context is on " + device_name(ctx.device()));
}

// x read as [rows, d]: d is the last extent, rows the product of the others.
struct RowShape {
    int64_t rows = 0, d = 0;
};
RowShape row_shape(const Tensor &x, const char *argument) {
    if (x.ndim() < 1)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(argument) + " is " + x.describe() +
                                              ": it must have at least 1 dimension (read as [rows, d])");
    RowShape s;
    s.d = x.shape()[x.ndim() - 1];
    s.rows = x.numel() / s.d;
    return s;
}

void check_vector(const Tensor &t, const char *argument, int64_t n, const char *what) {
    if (t.ndim() != 1 || t.shape()[0] != n)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(argument) + " is " + t.describe() + " but must be [" +
                                              std::to_string(n) + "] (" + what + ")");
}

void check_same_shape(const Tensor &a, const char *a_name, const Tensor &b, const char *b_name) {
    if (!a.same_shape(b))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH,
             std::string(a_name) + " is " + a.describe() + " but " + b_name + " is " + b.describe());
}

struct Named {
    const Tensor *t;
    const char *name;
};

// Every output against every input and every other output.
void check_no_overlaps(const std::vector<Named> &outputs, const std::vector<Named> &inputs) {
    for (size_t i = 0; i < outputs.size(); ++i) {
        for (const Named &in : inputs)
            if (outputs[i].t->overlaps(*in.t))
                fail(FP8AMP_ERROR_INVALID_ARGUMENT,
                     std::string(outputs[i].name) + " and " + in.name + " overlap in memory");
        for (size_t j = i + 1; j < outputs.size(); ++j)
            if (outputs[i].t->overlaps(*outputs[j].t))
                fail(FP8AMP_ERROR_INVALID_ARGUMENT,
                     std::string(outputs[i].name) + " and " + outputs[j].name + " overlap in memory");
    }
}

}  // namespace

void norm_forward(const Context &ctx, const NormOptions &o, const Tensor &x, const Tensor &gamma, const Tensor *beta,
                  Tensor &y, Tensor *y_t, Tensor *mean, Tensor *rstd) {
    // dtypes
    check_wide(x, "x");
    check_wide(gamma, "gamma");
    if (beta) check_wide(*beta, "beta");
    const bool fp8 = is_fp8(y.dtype());
    if (y_t && !is_fp8(y_t->dtype()))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "y_t is " + y_t->describe() + ": it must be e4m3 or e5m2");
    if (y_t && fp8 && y_t->dtype() != y.dtype())
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "y is " + y.describe() + " but y_t is " + y_t->describe());
    if (mean) check_f32(*mean, "mean");
    if (rstd) check_f32(*rstd, "rstd");
    // the kind's optional tensors, and metas
    if (o.rms && beta) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "beta must be NULL for RMSNorm (it has no bias)");
    if (o.rms && mean) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "mean must be NULL for RMSNorm (it subtracts no mean)");
    if (y_t && !fp8)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "y_t is given but y is " + y.describe() + ": the transpose is for an FP8 y");
    ScalingMeta *meta = nullptr;
    if (fp8) {
        meta = y.scaling();
        if (!meta)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT,
                 "y (" + y.describe() + ") is not bound to a scaling meta (fp8amp_tensor_set_scaling)");
        if (y_t && y_t->scaling() != meta)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "y_t is not bound to y's scaling meta");
    }
    // devices
    check_on_device(ctx, x, "x");
    check_on_device(ctx, gamma, "gamma");
    if (beta) check_on_device(ctx, *beta, "beta");
    check_on_device(ctx, y, "y");
    if (y_t) check_on_device(ctx, *y_t, "y_t");
    if (mean) check_on_device(ctx, *mean, "mean");
    if (rstd) check_on_device(ctx, *rstd, "rstd");
    if (meta) check_meta_device(ctx, *meta, "y's scaling meta");
    // writability
    check_writable(y, "y");
    if (y_t) check_writable(*y_t, "y_t");
    if (mean) check_writable(*mean, "mean");
    if (rstd) check_writable(*rstd, "rstd");
    // shapes
    const RowShape s = row_shape(x, "x");
    check_vector(gamma, "gamma", s.d, "x's last extent");
    if (beta) check_vector(*beta, "beta", s.d, "x's last extent");
    check_same_shape(x, "x", y, "y");
    if (y_t && (y_t->ndim() != 2 || y_t->shape()[0] != s.d || y_t->shape()[1] != s.rows))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "x is " + x.describe() + ", read as [" + std::to_string(s.rows) + ", " +
                                              std::to_string(s.d) + "], so y_t must be [" + std::to_string(s.d) + ", " +
                                              std::to_string(s.rows) + "], not " + y_t->describe());
    if (mean) check_vector(*mean, "mean", s.rows, "one per row of x");
    if (rstd) check_vector(*rstd, "rstd", s.rows, "one per row of x");
    // overlaps
    std::vector<Named> outputs{{&y, "y"}}, inputs{{&x, "x"}, {&gamma, "gamma"}};
    if (y_t) outputs.push_back({y_t, "y_t"});
    if (mean) outputs.push_back({mean, "mean"});
    if (rstd) outputs.push_back({rstd, "rstd"});
    if (beta) inputs.push_back({beta, "beta"});
    check_no_overlaps(outputs, inputs);

    kernels::NormForwardArgs a;
    a.rms = o.rms;
    a.zero_centered = o.zero_centered;
    a.eps = o.eps;
    a.rows = s.rows;
    a.d = s.d;
    a.x = x.data();
    a.x_dtype = x.dtype();
    a.gamma = gamma.data();
    a.gamma_dtype = gamma.dtype();
    if (beta) {
        a.beta = beta->data();
        a.beta_dtype = beta->dtype();
    }
    a.y = y.data();
    a.y_dtype = y.dtype();
    a.y_t = y_t ? y_t->data() : nullptr;
    if (meta)
        a.target = kernels::QuantizeTarget{meta->state(), y.scale_inv(), y_t ? y_t->scale_inv() : nullptr,
                                           meta->current(), meta->stats_enabled()};
    a.mean = mean ? static_cast<float *>(mean->data()) : nullptr;
    a.rstd = rstd ? static_cast<float *>(rstd->data()) : nullptr;
    ctx.backend().norm_forward(a);
    y.mark_written();
    if (y_t) y_t->mark_written();
    if (mean) mean->mark_written();
    if (rstd) rstd->mark_written();
}

void norm_backward(const Context &ctx, const NormOptions &o, const Tensor &dy, const Tensor &x, const Tensor &gamma,
                   const Tensor *mean, const Tensor &rstd, Tensor &dx, Tensor &dgamma, Tensor *dbeta) {
    // dtypes
    check_wide(dy, "dy");
    check_wide(x, "x");
    check_wide(gamma, "gamma");
    if (mean) check_f32(*mean, "mean");
    check_f32(rstd, "rstd");
    check_wide(dx, "dx");
    check_f32(dgamma, "dgamma");
    if (dbeta) check_f32(*dbeta, "dbeta");
    // the kind's optional tensors
    if (o.rms && mean) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "mean must be NULL for RMSNorm (it subtracts no mean)");
    if (o.rms && dbeta) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "dbeta must be NULL for RMSNorm (it has no bias)");
    if (!o.rms && !mean)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "mean is NULL: LayerNorm's backward needs the forward's mean");
    // devices
    check_on_device(ctx, dy, "dy");
    check_on_device(ctx, x, "x");
    check_on_device(ctx, gamma, "gamma");
    if (mean) check_on_device(ctx, *mean, "mean");
    check_on_device(ctx, rstd, "rstd");
    check_on_device(ctx, dx, "dx");
    check_on_device(ctx, dgamma, "dgamma");
    if (dbeta) check_on_device(ctx, *dbeta, "dbeta");
    // writability
    check_writable(dx, "dx");
    check_writable(dgamma, "dgamma");
    if (dbeta) check_writable(*dbeta, "dbeta");
    // shapes
    const RowShape s = row_shape(x, "x");
    check_same_shape(x, "x", dy, "dy");
    check_same_shape(x, "x", dx, "dx");
    check_vector(gamma, "gamma", s.d, "x's last extent");
    if (mean) check_vector(*mean, "mean", s.rows, "one per row of x");
    check_vector(rstd, "rstd", s.rows, "one per row of x");
    check_vector(dgamma, "dgamma", s.d, "x's last extent");
    if (dbeta) check_vector(*dbeta, "dbeta", s.d, "x's last extent");
    // overlaps
    std::vector<Named> outputs{{&dx, "dx"}, {&dgamma, "dgamma"}},
        inputs{{&dy, "dy"}, {&x, "x"}, {&gamma, "gamma"}, {&rstd, "rstd"}};
    if (dbeta) outputs.push_back({dbeta, "dbeta"});
    if (mean) inputs.push_back({mean, "mean"});
    check_no_overlaps(outputs, inputs);

    kernels::Backend &backend = ctx.backend();
    // The partial column sums come from the context's scratch slot (kept between calls): a fresh
    // allocation per call would be cudaMalloc + cudaFree on the CUDA backend's own allocator, and
    // cudaFree waits for the device, which put host time into every backward.
    void *scratch = nullptr;
    if (const size_t nbytes = backend.norm_backward_scratch_bytes(s.rows, s.d)) scratch = ctx.scratch(kScratchNorm, nbytes);
    kernels::NormBackwardArgs a;
    a.rms = o.rms;
    a.zero_centered = o.zero_centered;
    a.rows = s.rows;
    a.d = s.d;
    a.dy = dy.data();
    a.dy_dtype = dy.dtype();
    a.x = x.data();
    a.x_dtype = x.dtype();
    a.gamma = gamma.data();
    a.gamma_dtype = gamma.dtype();
    a.mean = mean ? static_cast<const float *>(mean->data()) : nullptr;
    a.rstd = static_cast<const float *>(rstd.data());
    a.dx = dx.data();
    a.dx_dtype = dx.dtype();
    a.dgamma = static_cast<float *>(dgamma.data());
    a.dbeta = dbeta ? static_cast<float *>(dbeta->data()) : nullptr;
    backend.norm_backward(a, scratch);
    dx.mark_written();
    dgamma.mark_written();
    if (dbeta) dbeta->mark_written();
}

namespace {

// The checks of an activation's output `out` (named out_name) and its optional transpose: dtypes
// (check_output_kind), then the meta (check_output_meta: the meta of an FP8 out, null for a wide one).
void check_output_kind(const Tensor &out, const char *out_name, const Tensor *out_t, const char *t_name) {
    const bool fp8 = is_fp8(out.dtype());
    if (!fp8) check_wide(out, out_name);  // F32/F16/BF16 or E4M3/E5M2: nothing else is an output
    if (out_t && !is_fp8(out_t->dtype()))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string(t_name) + " is " + out_t->describe() + ": it must be e4m3 or e5m2");
    if (out_t && fp8 && out_t->dtype() != out.dtype())
        fail(FP8AMP_ERROR_DTYPE_MISMATCH,
             std::string(out_name) + " is " + out.describe() + " but " + t_name + " is " + out_t->describe());
}

ScalingMeta *check_output_meta(const Tensor &out, const char *out_name, const Tensor *out_t, const char *t_name) {
    const bool fp8 = is_fp8(out.dtype());
    if (out_t && !fp8)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(t_name) + " is given but " + out_name + " is " + out.describe() +
                                                ": the transpose is for an FP8 " + out_name);
    if (!fp8) return nullptr;
    ScalingMeta *meta = out.scaling();
    if (!meta)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(out_name) + " (" + out.describe() +
                                                ") is not bound to a scaling meta (fp8amp_tensor_set_scaling)");
    if (out_t && out_t->scaling() != meta)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(t_name) + " is not bound to " + out_name + "'s scaling meta");
    return meta;
}

void check_kind(int32_t kind) {
    if (kind != kernels::kGeluTanh && kind != kernels::kSilu && kind != kernels::kSwiglu)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "kind is " + std::to_string(kind) +
                                                ", not FP8AMP_ACTIVATION_GELU_TANH (0), _SILU (1) or _SWIGLU (2)");
}

// t has x's shape but for the last extent, which is `last` (SwiGLU halves it).
void check_shape_last(const Tensor &t, const char *t_name, const Tensor &x, int64_t last, const char *why) {
    bool ok = t.ndim() == x.ndim();
    for (int32_t i = 0; ok && i + 1 < x.ndim(); ++i) ok = t.shape()[i] == x.shape()[i];
    ok = ok && t.shape()[x.ndim() - 1] == last;
    if (!ok)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(t_name) + " is " + t.describe() + " but x is " + x.describe() +
                                              " (" + why + ")");
}

void check_transpose_shape(const Tensor &out_t, const char *t_name, int64_t rows, int64_t cols) {
    if (out_t.ndim() != 2 || out_t.shape()[0] != cols || out_t.shape()[1] != rows)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(t_name) + " must be [" + std::to_string(cols) + ", " +
                                              std::to_string(rows) + "], not " + out_t.describe());
}

kernels::QuantizeTarget target_of(ScalingMeta *meta, const Tensor &out, const Tensor *out_t) {
    if (!meta) return kernels::QuantizeTarget{nullptr, nullptr};
    return kernels::QuantizeTarget{meta->state(), out.scale_inv(), out_t ? out_t->scale_inv() : nullptr,
                                   meta->current(), meta->stats_enabled()};
}

}  // namespace

void activation_forward(const Context &ctx, int32_t kind, const Tensor &x, Tensor &y, Tensor *y_t) {
    check_kind(kind);
    check_wide(x, "x");
    check_output_kind(y, "y", y_t, "y_t");
    ScalingMeta *meta = check_output_meta(y, "y", y_t, "y_t");
    check_on_device(ctx, x, "x");
    check_on_device(ctx, y, "y");
    if (y_t) check_on_device(ctx, *y_t, "y_t");
    if (meta) check_meta_device(ctx, *meta, "y's scaling meta");
    check_writable(y, "y");
    if (y_t) check_writable(*y_t, "y_t");
    const RowShape s = row_shape(x, "x");
    const bool glu = kind == kernels::kSwiglu;
    if (glu && s.d % 2 != 0)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "x is " + x.describe() + ": SwiGLU needs an even last extent (the two halves)");
    const int64_t cols = glu ? s.d / 2 : s.d;
    check_shape_last(y, "y", x, cols, glu ? "SwiGLU halves the last extent" : "they must be equal");
    if (y_t) check_transpose_shape(*y_t, "y_t", s.rows, cols);
    std::vector<Named> outputs{{&y, "y"}}, inputs{{&x, "x"}};
    if (y_t) outputs.push_back({y_t, "y_t"});
    check_no_overlaps(outputs, inputs);

    kernels::ActivationArgs a;
    a.kind = kind;
    a.rows = s.rows;
    a.cols = cols;
    a.x = x.data();
    a.x_dtype = x.dtype();
    a.out = y.data();
    a.out_dtype = y.dtype();
    a.out_t = y_t ? y_t->data() : nullptr;
    a.target = target_of(meta, y, y_t);
    ctx.backend().activation_forward(a);
    y.mark_written();
    if (y_t) y_t->mark_written();
}

void activation_backward(const Context &ctx, int32_t kind, const Tensor &dy, const Tensor &x, Tensor &dx, Tensor *dx_t) {
    check_kind(kind);
    check_wide(dy, "dy");
    check_wide(x, "x");
    check_output_kind(dx, "dx", dx_t, "dx_t");
    ScalingMeta *meta = check_output_meta(dx, "dx", dx_t, "dx_t");
    check_on_device(ctx, dy, "dy");
    check_on_device(ctx, x, "x");
    check_on_device(ctx, dx, "dx");
    if (dx_t) check_on_device(ctx, *dx_t, "dx_t");
    if (meta) check_meta_device(ctx, *meta, "dx's scaling meta");
    check_writable(dx, "dx");
    if (dx_t) check_writable(*dx_t, "dx_t");
    const RowShape s = row_shape(x, "x");
    const bool glu = kind == kernels::kSwiglu;
    if (glu && s.d % 2 != 0)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "x is " + x.describe() + ": SwiGLU needs an even last extent (the two halves)");
    const int64_t cols = glu ? s.d / 2 : s.d;
    check_shape_last(dy, "dy", x, cols, glu ? "dy is the SwiGLU output's gradient: x's last extent halved" : "they must be equal");
    check_same_shape(x, "x", dx, "dx");
    if (dx_t) check_transpose_shape(*dx_t, "dx_t", s.rows, s.d);
    std::vector<Named> outputs{{&dx, "dx"}}, inputs{{&dy, "dy"}, {&x, "x"}};
    if (dx_t) outputs.push_back({dx_t, "dx_t"});
    check_no_overlaps(outputs, inputs);

    kernels::ActivationArgs a;
    a.kind = kind;
    a.rows = s.rows;
    a.cols = cols;
    a.x = x.data();
    a.x_dtype = x.dtype();
    a.dy = dy.data();
    a.dy_dtype = dy.dtype();
    a.out = dx.data();
    a.out_dtype = dx.dtype();
    a.out_t = dx_t ? dx_t->data() : nullptr;
    a.target = target_of(meta, dx, dx_t);
    ctx.backend().activation_backward(a);
    dx.mark_written();
    if (dx_t) dx_t->mark_written();
}

}  // namespace fp8amp::core
