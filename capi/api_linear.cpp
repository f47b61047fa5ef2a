// The extern "C" functions of the FP8 Linear layer (see capi/api.cpp for the boundary's rules).
#include <cstring>
#include <string>

#include "boundary.hpp"
#include "context.hpp"
#include "linear.hpp"
#include "scaling_meta.hpp"
#include "struct_size.hpp"
#include "tensor.hpp"

using fp8amp::fail;
using fp8amp::core::Context;
using fp8amp::core::Linear;
using fp8amp::core::ScalingMeta;
using fp8amp::core::Tensor;
using fp8amp::core::lookup;
using namespace fp8amp::capi;

extern "C" {

// The sized init writes the caller's sizeof (the first layout's 72 bytes too); the FP8AMP_0 entry
// point (named in parentheses: the header's macro of that name means the sized one) writes 0.1.0's.
FP8AMP_API fp8amp_status fp8amp_linear_desc_init(fp8amp_linear_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, Linear::default_desc(), "fp8amp_linear_desc", Linear::kFirstLayout);
    });
}

FP8AMP_API fp8amp_status(fp8amp_linear_desc_init_default)(fp8amp_linear_desc *desc) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, fp8amp::kReleased010LinearDesc, Linear::default_desc(), "fp8amp_linear_desc");
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_create(fp8amp_context ctx, const fp8amp_linear_desc *desc, fp8amp_linear *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(desc, "desc");
        require(out, "out");
        publish(Linear::create(c, *desc), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_destroy(fp8amp_linear lin) {
    FP8AMP_GUARD({
        if (lin) fp8amp::core::unregister_object(lin, Linear::kKind, "lin");
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_weight(fp8amp_linear lin, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        publish(l->weight(), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_bias(fp8amp_linear lin, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        publish(l->bias(), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_weight_grad(fp8amp_linear lin, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        publish(l->weight_grad(), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_bias_grad(fp8amp_linear lin, fp8amp_tensor *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        publish(l->bias_grad(), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_scaling(fp8amp_linear lin, fp8amp_linear_role role, fp8amp_scaling *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        publish(l->scaling(fp8amp::core::enum_value(role)), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_weight_changed(fp8amp_linear lin) {
    FP8AMP_GUARD({ lookup<Linear>(lin, "lin")->note_weight_written(); });
}

FP8AMP_API fp8amp_status fp8amp_linear_forward(fp8amp_linear lin, fp8amp_tensor x, fp8amp_tensor y, int32_t training) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        auto tx = lookup<Tensor>(x, "x");
        auto ty = lookup<Tensor>(y, "y");
        l->forward(*tx, *ty, training != 0);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_choose_gemm(fp8amp_linear lin, int64_t rows, int32_t training,
                                                   fp8amp_gemm_kind *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        *out = l->choose_gemm(rows, training != 0);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_forward_fp8(fp8amp_linear lin, fp8amp_tensor x8, fp8amp_tensor y,
                                                   int32_t training) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        auto tx = lookup<Tensor>(x8, "x8");
        auto ty = lookup<Tensor>(y, "y");
        l->forward_fp8(*tx, *ty, training != 0);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_backward(fp8amp_linear lin, fp8amp_tensor dy, fp8amp_tensor dx,
                                                int32_t accumulate_wgrad) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        auto tdy = lookup<Tensor>(dy, "dy");
        std::shared_ptr<Tensor> tdx = dx ? lookup<Tensor>(dx, "dx") : nullptr;
        l->backward(*tdy, tdx.get(), accumulate_wgrad != 0);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_release_buffers(fp8amp_linear lin) {
    FP8AMP_GUARD({ lookup<Linear>(lin, "lin")->release_buffers(); });
}

FP8AMP_API fp8amp_status fp8amp_linear_set_lean(fp8amp_linear lin, int32_t lean) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        if (lean < 0 || lean > 2)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "lean is " + std::to_string(lean) + ", not 0, 1 or 2");
        l->set_lean(lean);
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_get_lean(fp8amp_linear lin, int32_t *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        *out = l->lean();
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_memory_bytes(fp8amp_linear lin, size_t *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        *out = l->memory_bytes();
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_gemm_kind(fp8amp_linear lin, fp8amp_gemm_kind *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        *out = l->gemm_kind();
    });
}

FP8AMP_API fp8amp_status fp8amp_linear_graph_replays(fp8amp_linear lin, uint64_t *out) {
    FP8AMP_GUARD({
        auto l = lookup<Linear>(lin, "lin");
        require(out, "out");
        *out = l->graph_replays();
    });
}

namespace {
// fp8amp_opt_level_init and its FP8AMP_0 spelling: both descriptors are checked (sizes included)
// before either is written.
// l: the caller's fp8amp_opt_level as the integer it holds (core/enums.hpp enum_value), so that an
// out-of-range value is never loaded as the enum.
void opt_level_init(int32_t l, fp8amp_linear_desc *linear_desc, size_t linear_size, fp8amp_adam_desc *adam_desc,
                    size_t adam_size) {
    if (!linear_desc && !adam_desc) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "linear_desc and adam_desc are both NULL");
    if (l != FP8AMP_OPT_LEVEL_O1 && l != FP8AMP_OPT_LEVEL_O2 && l != FP8AMP_OPT_LEVEL_O3)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "level " + std::to_string(l) + " is not O1, O2 or O3");
    fp8amp_linear_desc ld{};
    fp8amp_adam_desc ad{};
    if (fp8amp_linear_desc_init(&ld, sizeof ld) != FP8AMP_SUCCESS || fp8amp_opt_level_adam_init(static_cast<fp8amp_opt_level>(l), &ad, sizeof ad) != FP8AMP_SUCCESS)
        fail(FP8AMP_ERROR_INTERNAL, "filling the defaults failed");
    ld.weight_dtype = l == FP8AMP_OPT_LEVEL_O3 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F16;
    ld.wgrad_dtype = FP8AMP_DTYPE_E4M3;
    // write_sized checks the size before it writes: the Adam size is checked on a scratch copy first.
    alignas(fp8amp_adam_desc) unsigned char scratch[fp8amp::kMaxStructSize];
    if (adam_desc) fp8amp::write_sized(scratch, adam_size, ad, "fp8amp_adam_desc");
    if (linear_desc) fp8amp::write_sized(linear_desc, linear_size, ld, "fp8amp_linear_desc", Linear::kFirstLayout);
    if (adam_desc) std::memcpy(adam_desc, scratch, adam_size);
}
}  // namespace

FP8AMP_API fp8amp_status fp8amp_opt_level_init(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc, size_t linear_size,
                                               fp8amp_adam_desc *adam_desc, size_t adam_size) {
    FP8AMP_GUARD({ opt_level_init(fp8amp::core::enum_value(level), linear_desc, linear_size, adam_desc, adam_size); });
}

FP8AMP_API fp8amp_status(fp8amp_opt_level_config)(fp8amp_opt_level level, fp8amp_linear_desc *linear_desc,
                                                  fp8amp_adam_desc *adam_desc) {
    FP8AMP_GUARD({
        opt_level_init(fp8amp::core::enum_value(level), linear_desc, fp8amp::kReleased010LinearDesc, adam_desc, fp8amp::kReleased010AdamDesc);
    });
}

}  // extern "C"
