#include "norm_ops.hpp"

#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"  // kernels/backend.hpp
#include "norm.hpp"     // kernels/norm.hpp (the argument structs)
#include "scaling_meta.hpp"

namespace fp8amp::core {

namespace {

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
    std::shared_ptr<Storage> scratch;
    if (const size_t nbytes = backend.norm_backward_scratch_bytes(s.rows, s.d)) scratch = ctx.allocate(nbytes);
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
    backend.norm_backward(a, scratch ? scratch->data() : nullptr);
    dx.mark_written();
    dgamma.mark_written();
    if (dbeta) dbeta->mark_written();
}

}  // namespace fp8amp::core
