// The boundary. Each extern "C" function validates its pointer arguments, resolves handles through
// the registry, calls core, and catches everything: no exception ever crosses into the caller. A
// failure becomes a status plus a thread-local message. No engine logic lives here.
#include <cstring>
#include <new>
#include <string>

#include "fp8amp/fp8amp.h"
#include "boundary.hpp"
#include "context.hpp"
#include "handles.hpp"
#include "ops.hpp"
#include "scaling_meta.hpp"
#include "struct_size.hpp"
#include "tensor.hpp"

using fp8amp::Error;
using fp8amp::fail;
using fp8amp::core::Context;
using fp8amp::core::ScalingMeta;
using fp8amp::core::Tensor;
using fp8amp::core::lookup;

namespace fp8amp::capi {

namespace {
thread_local std::string g_last_error;
}

void set_error(const char *function, const char *message) noexcept {
    try {
        g_last_error = std::string(function) + ": " + message;
    } catch (...) {
        // Out of memory while recording the message: keep the previous one.
    }
}

const char *last_error() noexcept { return g_last_error.c_str(); }

}  // namespace fp8amp::capi

using namespace fp8amp::capi;

extern "C" {

FP8AMP_API uint32_t fp8amp_version(void) { return FP8AMP_VERSION; }

// The getters of constants and fp8amp_device_count switch on the integer a caller's enum holds
// (core/enums.hpp): a value outside the enum's range must not be loaded as the enum.
FP8AMP_API const char *fp8amp_status_name(fp8amp_status status) {
    switch (fp8amp::core::enum_value(status)) {
    case FP8AMP_SUCCESS: return "FP8AMP_SUCCESS";
    case FP8AMP_ERROR_INVALID_ARGUMENT: return "FP8AMP_ERROR_INVALID_ARGUMENT";
    case FP8AMP_ERROR_INVALID_HANDLE: return "FP8AMP_ERROR_INVALID_HANDLE";
    case FP8AMP_ERROR_SHAPE_MISMATCH: return "FP8AMP_ERROR_SHAPE_MISMATCH";
    case FP8AMP_ERROR_DTYPE_MISMATCH: return "FP8AMP_ERROR_DTYPE_MISMATCH";
    case FP8AMP_ERROR_DEVICE_MISMATCH: return "FP8AMP_ERROR_DEVICE_MISMATCH";
    case FP8AMP_ERROR_OUT_OF_MEMORY: return "FP8AMP_ERROR_OUT_OF_MEMORY";
    case FP8AMP_ERROR_NOT_SUPPORTED: return "FP8AMP_ERROR_NOT_SUPPORTED";
    case FP8AMP_ERROR_CUDA: return "FP8AMP_ERROR_CUDA";
    case FP8AMP_ERROR_CUBLAS: return "FP8AMP_ERROR_CUBLAS";
    case FP8AMP_ERROR_NCCL: return "FP8AMP_ERROR_NCCL";
    case FP8AMP_ERROR_CORRUPT_DATA: return "FP8AMP_ERROR_CORRUPT_DATA";
    case FP8AMP_ERROR_INTERNAL: return "FP8AMP_ERROR_INTERNAL";
    case FP8AMP_ERROR_COMM: return "FP8AMP_ERROR_COMM";
    }
    return "FP8AMP_UNKNOWN_STATUS";
}

FP8AMP_API const char *fp8amp_last_error_message(void) { return last_error(); }

FP8AMP_API size_t fp8amp_dtype_size(fp8amp_dtype dtype) {
    switch (fp8amp::core::enum_value(dtype)) {
    case FP8AMP_DTYPE_F32: return 4;
    case FP8AMP_DTYPE_F16:
    case FP8AMP_DTYPE_BF16: return 2;
    case FP8AMP_DTYPE_E4M3:
    case FP8AMP_DTYPE_E5M2: return 1;
    }
    return 0;
}

FP8AMP_API const char *fp8amp_dtype_name(fp8amp_dtype dtype) {
    switch (fp8amp::core::enum_value(dtype)) {
    case FP8AMP_DTYPE_F32: return "f32";
    case FP8AMP_DTYPE_F16: return "f16";
    case FP8AMP_DTYPE_BF16: return "bf16";
    case FP8AMP_DTYPE_E4M3: return "e4m3";
    case FP8AMP_DTYPE_E5M2: return "e5m2";
    }
    return "unknown";
}

FP8AMP_API fp8amp_status fp8amp_device_count(fp8amp_device_type type, int32_t *count) {
    FP8AMP_GUARD({
        require(count, "count");
        *count = fp8amp::core::device_count(fp8amp::core::enum_value(type));
    });
}

/* ---- context ---- */

FP8AMP_API fp8amp_status fp8amp_context_create(fp8amp_device device, fp8amp_context *out) {
    FP8AMP_GUARD({
        require(out, "out");
        publish(std::make_shared<Context>(device), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_context_destroy(fp8amp_context ctx) {
    FP8AMP_GUARD({
        if (ctx) fp8amp::core::unregister_object(ctx, Context::kKind, "ctx");
    });
}

FP8AMP_API fp8amp_status fp8amp_context_device(fp8amp_context ctx, fp8amp_device *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(out, "out");
        *out = c->device();
    });
}

FP8AMP_API fp8amp_status fp8amp_context_set_stream(fp8amp_context ctx, void *cuda_stream) {
    FP8AMP_GUARD({ lookup<Context>(ctx, "ctx")->set_stream(cuda_stream); });
}

FP8AMP_API fp8amp_status fp8amp_context_get_stream(fp8amp_context ctx, void **cuda_stream) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(cuda_stream, "cuda_stream");
        *cuda_stream = c->stream();
    });
}

FP8AMP_API fp8amp_status fp8amp_context_set_allocator(fp8amp_context ctx, fp8amp_alloc_fn alloc_fn,
                                                      fp8amp_free_fn free_fn, void *user_data) {
    FP8AMP_GUARD({ lookup<Context>(ctx, "ctx")->set_allocator(alloc_fn, free_fn, user_data); });
}

FP8AMP_API fp8amp_status fp8amp_context_synchronize(fp8amp_context ctx) {
    FP8AMP_GUARD({ lookup<Context>(ctx, "ctx")->synchronize(); });
}

FP8AMP_API fp8amp_status fp8amp_context_scratch_bytes(fp8amp_context ctx, size_t *bytes) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(bytes, "bytes");
        *bytes = c->scratch_bytes();
    });
}

FP8AMP_API fp8amp_status fp8amp_context_release_scratch(fp8amp_context ctx) {
    FP8AMP_GUARD({ lookup<Context>(ctx, "ctx")->release_scratch(); });
}

/* ---- tensors ---- */

FP8AMP_API fp8amp_status fp8amp_tensor_create(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim,
                                              const int64_t *shape, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(out, "out");
        fp8amp::core::check_dtype(dtype, "dtype");  // before dtype is passed on (loaded) as the enum
        publish(Tensor::create(std::move(c), dtype, ndim, shape), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_wrap(fp8amp_context ctx, fp8amp_dtype dtype, int32_t ndim,
                                            const int64_t *shape, void *data, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(out, "out");
        fp8amp::core::check_dtype(dtype, "dtype");  // before dtype is passed on (loaded) as the enum
        publish(Tensor::wrap(std::move(c), dtype, ndim, shape, data), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_rebind(fp8amp_tensor t, void *data, int32_t ndim, const int64_t *shape) {
    FP8AMP_GUARD({ lookup<Tensor>(t, "t")->rebind(data, ndim, shape); });
}

FP8AMP_API fp8amp_status fp8amp_tensor_destroy(fp8amp_tensor t) {
    FP8AMP_GUARD({
        if (t) fp8amp::core::unregister_object(t, Tensor::kKind, "t");
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_dtype(fp8amp_tensor t, fp8amp_dtype *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->dtype();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_ndim(fp8amp_tensor t, int32_t *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->ndim();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_shape(fp8amp_tensor t, int32_t capacity, int64_t *shape) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        if (x->ndim() > 0) require(shape, "shape");
        if (capacity < x->ndim())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "capacity " + std::to_string(capacity) + " is less than ndim " +
                                                    std::to_string(x->ndim()));
        for (int32_t i = 0; i < x->ndim(); ++i) shape[i] = x->shape()[i];
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_numel(fp8amp_tensor t, int64_t *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->numel();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_nbytes(fp8amp_tensor t, size_t *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->nbytes();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_data(fp8amp_tensor t, void **out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->data();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_device(fp8amp_tensor t, fp8amp_device *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->device();
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_copy_from_host(fp8amp_tensor t, const void *src, size_t nbytes) {
    FP8AMP_GUARD({ lookup<Tensor>(t, "t")->copy_from_host(src, nbytes); });
}

FP8AMP_API fp8amp_status fp8amp_tensor_copy_to_host(fp8amp_tensor t, void *dst, size_t nbytes) {
    FP8AMP_GUARD({ lookup<Tensor>(t, "t")->copy_to_host(dst, nbytes); });
}

FP8AMP_API fp8amp_status fp8amp_tensor_from_dlpack(fp8amp_context ctx, struct DLManagedTensorVersioned *managed,
                                                   fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(out, "out");
        auto t = Tensor::from_dlpack(std::move(c), managed);
        fp8amp_tensor handle = nullptr;
        publish(t, &handle);
        t->adopt_dlpack();  // nothing can fail past this point: fp8amp now owns `managed`
        *out = handle;
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_to_dlpack(fp8amp_tensor t, struct DLManagedTensorVersioned **out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        *out = x->to_dlpack();
    });
}

/* ---- conversion ---- */

FP8AMP_API fp8amp_status fp8amp_cast(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        auto s = lookup<Tensor>(src, "src");
        auto d = lookup<Tensor>(dst, "dst");
        fp8amp::core::cast(*c, *s, *d);
    });
}

/* ---- recipes and scaling meta ---- */

// The sized init writes the caller's sizeof; the FP8AMP_0 entry point (named in parentheses: the
// header's macro of that name means the sized one) writes 0.1.0's layout, which its callers have.
FP8AMP_API fp8amp_status fp8amp_recipe_init(fp8amp_recipe *recipe, size_t size) {
    FP8AMP_GUARD({
        require(recipe, "recipe");
        fp8amp::write_sized(recipe, size, fp8amp::core::default_recipe(), "fp8amp_recipe");
    });
}

FP8AMP_API fp8amp_status(fp8amp_recipe_init_default)(fp8amp_recipe *recipe) {
    FP8AMP_GUARD({
        require(recipe, "recipe");
        fp8amp::write_sized(recipe, fp8amp::kReleased010Recipe, fp8amp::core::default_recipe(), "fp8amp_recipe");
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_create(fp8amp_context ctx, const fp8amp_recipe *recipe,
                                               fp8amp_dtype fp8_dtype, fp8amp_scaling *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(recipe, "recipe");
        require(out, "out");
        // A value that is no fp8amp_dtype is INVALID_ARGUMENT (and must not be loaded as the enum);
        // a real dtype that cannot be scaled is the meta's DTYPE_MISMATCH.
        fp8amp::core::check_dtype(fp8_dtype, "fp8_dtype");
        publish(std::make_shared<ScalingMeta>(std::move(c), *recipe, fp8_dtype), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_destroy(fp8amp_scaling s) {
    FP8AMP_GUARD({
        if (s) fp8amp::core::unregister_object(s, ScalingMeta::kKind, "s");
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_update(fp8amp_scaling s) {
    FP8AMP_GUARD({
        auto m = lookup<ScalingMeta>(s, "s");
        fp8amp::core::update_scaling(m->context(), {m});  // on the stream of the meta's own context
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_update_many(fp8amp_context ctx, int32_t n, const fp8amp_scaling *metas) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        if (n < 0) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "n is " + std::to_string(n) + ", negative");
        if (n > 0) require(metas, "metas");
        const auto all = fp8amp::core::lookup_many<ScalingMeta>(reinterpret_cast<const void *const *>(metas),
                                                                static_cast<size_t>(n), "metas");
        fp8amp::core::update_scaling(*c, all);
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_get(fp8amp_scaling s, float *scale, float *scale_inv, float *amax) {
    FP8AMP_GUARD({
        auto m = lookup<ScalingMeta>(s, "s");
        float values[3];
        m->get(&values[0], &values[1], &values[2]);
        if (scale) *scale = values[0];
        if (scale_inv) *scale_inv = values[1];
        if (amax) *amax = values[2];
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_amax_tensor(fp8amp_scaling s, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto m = lookup<ScalingMeta>(s, "s");
        require(out, "out");
        publish(m->amax_view(), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_get_history(fp8amp_scaling s, int32_t capacity, float *history) {
    FP8AMP_GUARD({
        auto m = lookup<ScalingMeta>(s, "s");
        require(history, "history");
        m->get_history(capacity, history);
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_set_scale(fp8amp_scaling s, float scale) {
    FP8AMP_GUARD({ lookup<ScalingMeta>(s, "s")->set_scale(scale); });
}

FP8AMP_API fp8amp_status fp8amp_scaling_enable_stats(fp8amp_scaling s, int32_t enable) {
    FP8AMP_GUARD({ lookup<ScalingMeta>(s, "s")->enable_stats(enable != 0); });
}

FP8AMP_API fp8amp_status fp8amp_scaling_get_stats(fp8amp_scaling s, fp8amp_scaling_stats *stats) {
    FP8AMP_GUARD({
        auto m = lookup<ScalingMeta>(s, "s");
        require(stats, "stats");
        *stats = m->stats();
    });
}

FP8AMP_API fp8amp_status fp8amp_scaling_reset_stats(fp8amp_scaling s) {
    FP8AMP_GUARD({ lookup<ScalingMeta>(s, "s")->reset_stats(); });
}

FP8AMP_API fp8amp_status fp8amp_tensor_set_scaling(fp8amp_tensor t, fp8amp_scaling s) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        std::shared_ptr<ScalingMeta> m = s ? lookup<ScalingMeta>(s, "s") : nullptr;
        x->set_scaling(std::move(m));
    });
}

FP8AMP_API fp8amp_status fp8amp_tensor_scale_inv(fp8amp_tensor t, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto x = lookup<Tensor>(t, "t");
        require(out, "out");
        publish(x->scale_inv_tensor(), out);
    });
}

/* ---- casting with scales ---- */

FP8AMP_API fp8amp_status fp8amp_quantize(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        auto s = lookup<Tensor>(src, "src");
        auto d = lookup<Tensor>(dst, "dst");
        fp8amp::core::quantize(*c, *s, *d);
    });
}

FP8AMP_API fp8amp_status fp8amp_quantize_transpose(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst,
                                                   fp8amp_tensor dst_t) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        auto s = lookup<Tensor>(src, "src");
        auto d = lookup<Tensor>(dst, "dst");
        auto dt = lookup<Tensor>(dst_t, "dst_t");
        fp8amp::core::quantize_transpose(*c, *s, *d, *dt);
    });
}

FP8AMP_API fp8amp_status fp8amp_dequantize(fp8amp_context ctx, fp8amp_tensor src, fp8amp_tensor dst) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        auto s = lookup<Tensor>(src, "src");
        auto d = lookup<Tensor>(dst, "dst");
        fp8amp::core::dequantize(*c, *s, *d);
    });
}

FP8AMP_API fp8amp_status fp8amp_amax(fp8amp_context ctx, fp8amp_tensor t, float *amax) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        auto x = lookup<Tensor>(t, "t");
        require(amax, "amax");
        *amax = fp8amp::core::amax(*c, *x);
    });
}

}  // extern "C"
