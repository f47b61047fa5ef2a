#include "optimizer.hpp"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "checkpoint.hpp"
#include "codec.hpp"
#include "backend.hpp"  // kernels/backend.hpp
#include "scaling.hpp"     // kernels/scaling.hpp: ScalingState
#include "scaling_meta.hpp"
#include "struct_size.hpp"

namespace fp8amp::core {

namespace adam = kernels::adam;
using kernels::ScalingState;

namespace {

bool finite_nonneg(float x) { return x >= 0.0f && x <= FLT_MAX; }

std::string num(double x) { return std::to_string(x); }


constexpr char kMagic[8] = {'F', 'P', '8', 'A', 'M', 'P', 'O', 'P'};
// Version 1: 0.3.0's format. Version 2 (0.4.0) adds the master rounding and its seed after the
// desc, and a master flag per parameter; save writes version 1 whenever it can say everything (every
// parameter has the desc's master choice, rounding to nearest), so those checkpoints keep their bytes
// and older libraries keep reading them.
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kEndianMarker = 0x01020304u;

}  // namespace

fp8amp_adam_desc validate_adam_desc(const fp8amp_adam_desc &desc) {
    fp8amp_adam_desc d = read_sized(desc, "desc", "fp8amp_adam_desc", "fp8amp_adam_desc_init_default");
    d.adamw = d.adamw ? 1 : 0;
    d.maximize = d.maximize ? 1 : 0;
    if (!finite_nonneg(d.lr)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->lr " + num(d.lr) + " is not a finite value >= 0");
    if (!(d.beta1 >= 0.0f && d.beta1 < 1.0f))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->beta1 " + num(d.beta1) + " is not in [0, 1)");
    if (!(d.beta2 >= 0.0f && d.beta2 < 1.0f))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->beta2 " + num(d.beta2) + " is not in [0, 1)");
    if (!finite_nonneg(d.eps)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->eps " + num(d.eps) + " is not a finite value >= 0");
    if (!finite_nonneg(d.weight_decay))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->weight_decay " + num(d.weight_decay) + " is not a finite value >= 0");
    if (!finite_nonneg(d.max_grad_norm))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->max_grad_norm " + num(d.max_grad_norm) + " is not a finite value >= 0");
    // Caller's enum fields: validated as integers before they are loaded as fp8amp_dtype (enums.hpp).
    check_dtype(d.exp_avg_dtype, "desc->exp_avg_dtype");
    check_dtype(d.exp_avg_sq_dtype, "desc->exp_avg_sq_dtype");
    if (d.exp_avg_dtype != FP8AMP_DTYPE_F32 && d.exp_avg_dtype != FP8AMP_DTYPE_E4M3)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string("desc->exp_avg_dtype is ") + fp8amp_dtype_name(d.exp_avg_dtype) +
                                              ": m is stored as f32 (O1) or e4m3 (O2/O3)");
    if (d.exp_avg_sq_dtype != FP8AMP_DTYPE_F32 && d.exp_avg_sq_dtype != FP8AMP_DTYPE_F16)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string("desc->exp_avg_sq_dtype is ") +
                                              fp8amp_dtype_name(d.exp_avg_sq_dtype) + ": v is stored as f32 (O1) or f16 (O2/O3)");
    if (d.master_dtype != FP8AMP_NO_MASTER && d.master_dtype != FP8AMP_DTYPE_F16)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->master_dtype " + std::to_string(d.master_dtype) +
                                                " is neither FP8AMP_NO_MASTER nor FP8AMP_DTYPE_F16");
    if (d.master_rounding != FP8AMP_MASTER_ROUND_NEAREST && d.master_rounding != FP8AMP_MASTER_ROUND_STOCHASTIC)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->master_rounding " + std::to_string(d.master_rounding) +
                                                " is neither FP8AMP_MASTER_ROUND_NEAREST nor FP8AMP_MASTER_ROUND_STOCHASTIC");
    const int32_t bs = d.state_block_size;
    if (bs != 0 && (bs < adam::kChunk || bs > FP8AMP_MAX_STATE_BLOCK || (bs & (bs - 1)) != 0))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->state_block_size " + std::to_string(bs) + " is neither 0 nor a power of two in " +
                                                std::to_string(adam::kChunk) + ".." + std::to_string(FP8AMP_MAX_STATE_BLOCK));
    return d;
}

Optimizer::Optimizer(std::shared_ptr<const Context> ctx, const fp8amp_adam_desc &desc)
    : ctx_(std::move(ctx)), desc_(validate_adam_desc(desc)) {
    status_ = ctx_->allocate(sizeof(adam::Status));
    const adam::Status zero{0, 0, 0.0f};
    to_device(status_->data(), &zero, sizeof zero);
    // The device memory of the step's partial results, if the backend's step needs any.
    if (const int slots = ctx_->backend().adam_partial_slots(); slots > 0) {
        max_partials_ = slots;
        partials_ = ctx_->allocate(sizeof(adam::Partial) * static_cast<size_t>(max_partials_));
    }
}

void Optimizer::to_host(void *dst, const void *src, size_t n) const {
    if (n == 0) return;
    ctx_->backend().copy_to_host(dst, src, n);
}

void Optimizer::to_device(void *dst, const void *src, size_t n) const {
    if (n == 0) return;
    ctx_->backend().copy_to_device(dst, src, n);
}

int64_t Optimizer::scales_of(int64_t numel) const {
    return desc_.state_block_size > 0 ? (numel + desc_.state_block_size - 1) / desc_.state_block_size : 1;
}

// fp8amp_param_desc.master_init against the parameter it starts the master copy of.
void Optimizer::check_master_init(const Tensor &init, const Tensor &p, bool master) const {
    if (!master)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->master_init is given but param (" + p.describe() +
                                                ") gets no master copy: master_init is the value a master copy starts from");
    if (init.dtype() != FP8AMP_DTYPE_F32 && init.dtype() != FP8AMP_DTYPE_BF16 && init.dtype() != FP8AMP_DTYPE_F16)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "desc->master_init is " + init.describe() + ": it must be f32, bf16 or f16");
    check_on_device(*ctx_, init, "desc->master_init");
    if (!init.same_shape(p))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "desc->master_init is " + init.describe() + " but param is " + p.describe());
}

void Optimizer::add_param(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype,
                          const Tensor *master_init) {
    if (comm_) return add_param_sharded(std::move(param), std::move(grad), master_dtype, master_init);  // optimizer_shard.cpp
    add_local(std::move(param), std::move(grad), master_dtype, master_init);
}

void Optimizer::add_local(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype,
                          const Tensor *master_init) {
    const Tensor &p = *param;
    const Tensor &g = *grad;
    // FP8AMP_MASTER_DEFAULT: the desc's choice (fp8amp_optimizer_add_param); otherwise the caller's
    // explicit per-parameter choice (fp8amp_optimizer_add_param_ex), checked like the desc's.
    const bool explicit_choice = master_dtype != FP8AMP_MASTER_DEFAULT;
    if (explicit_choice && master_dtype != FP8AMP_NO_MASTER && master_dtype != FP8AMP_DTYPE_F16)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->master_dtype " + std::to_string(master_dtype) +
                                                " is neither FP8AMP_MASTER_DEFAULT, FP8AMP_NO_MASTER nor FP8AMP_DTYPE_F16");
    const bool master = (explicit_choice ? master_dtype : desc_.master_dtype) == FP8AMP_DTYPE_F16;
    if (stepped_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "the optimizer has already taken a step: add every parameter before the first step");
    // dtypes
    if (p.dtype() == FP8AMP_DTYPE_E5M2)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "param is " + p.describe() + ": parameters are f32, bf16, f16 or e4m3");
    if (master && p.dtype() == FP8AMP_DTYPE_F32)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "param is " + p.describe() +
                                              ": an f16 master copy (O3) is for low-precision parameters, not f32 ones");
    // Asked for explicitly, no master for an e4m3 weight is a mistake (fp8amp_optimizer_add_param keeps
    // accepting it at O1/O2, as 0.3.0 did).
    if (explicit_choice && !master && p.dtype() == FP8AMP_DTYPE_E4M3)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "param is " + p.describe() +
                                              " and desc->master_dtype is FP8AMP_NO_MASTER: an e4m3 parameter needs an f16 "
                                              "master copy (without one, updates below half an e4m3 ulp, 2^-4 relative, vanish)");
    // devices
    check_on_device(*ctx_, p, "param");
    check_on_device(*ctx_, g, "grad");
    if (p.scaling() && !same_device(p.scaling()->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "param's meta is an " + p.scaling()->describe() + ", the optimizer is on " +
                                               device_name(device()));
    if (g.scaling() && !same_device(g.scaling()->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "grad's meta is an " + g.scaling()->describe() + ", the optimizer is on " +
                                               device_name(device()));
    // scaling
    if (p.dtype() == FP8AMP_DTYPE_E4M3 && !p.scaling())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param (" + p.describe() +
                                                ") is not bound to a scaling meta (fp8amp_tensor_set_scaling): an e4m3 parameter needs one");
    if (p.scaling() && p.scaling()->current())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "param's meta uses current scaling: the optimizer writes parameters with delayed scaling (the meta's scale, "
             "updated from the amax of each step); create the meta with FP8AMP_SCALING_DELAYED");
    check_writable(p, "param");
    if (!p.same_shape(g))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "param is " + p.describe() + " but grad is " + g.describe());
    if (p.overlaps(g)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param and grad overlap in memory");
    if (master_init) check_master_init(*master_init, p, master);
    for (size_t i = 0; i < entries_.size(); ++i) {
        const Entry &e = entries_[i];
        if (e.param.get() == &p || e.param->overlaps(p))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param is already registered (it is, or overlaps, parameter #" + std::to_string(i) + ")");
        if (e.param->overlaps(g))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "grad overlaps parameter #" + std::to_string(i));
        if (e.grad->overlaps(p))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param overlaps the gradient of parameter #" + std::to_string(i));
        if (p.scaling() && e.param_meta.get() == p.scaling())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param's meta is already the meta of parameter #" + std::to_string(i) +
                                                    " (the optimizer folds each parameter's meta once per step)");
    }

    // The state: zeros, block scales 1.
    Entry e;
    const int64_t n = p.numel();
    const size_t nn = static_cast<size_t>(n);
    // The step's host scratch grows here, where a failure changes nothing, not in the step (issue 22).
    // Grown beyond the need of a parameter whose add_param then fails, it is only larger.
    reserve_cpu_scratch(std::max(max_numel_, n));
    e.nscales = scales_of(n);
    e.units = desc_.state_block_size > 0 ? e.nscales : (n + adam::kChunk - 1) / adam::kChunk;
    const bool m8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3, v16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    e.m = ctx_->allocate(nn * (m8 ? 1 : 4));
    e.v = ctx_->allocate(nn * (v16 ? 2 : 4));
    const std::vector<float> ones(static_cast<size_t>(e.nscales), 1.0f);
    const size_t scale_bytes = ones.size() * sizeof(float);
    if (m8) e.m_scale = ctx_->allocate(scale_bytes);
    if (v16) e.v_scale = ctx_->allocate(scale_bytes);
    if (master) {
        e.master = ctx_->allocate(nn * 2);
        e.master_scale = ctx_->allocate(scale_bytes);
    }
    ctx_->backend().memset(e.m->data(), 0, e.m->nbytes());
    ctx_->backend().memset(e.v->data(), 0, e.v->nbytes());
    if (e.m_scale) to_device(e.m_scale->data(), ones.data(), scale_bytes);
    if (e.v_scale) to_device(e.v_scale->data(), ones.data(), scale_bytes);
    if (master) {
        // The master copy starts as the parameter's value (or master_init's), block-scaled like the
        // state (kernels/adam.hpp).
        const Tensor &src = master_init ? *master_init : p;
        const char *src_name = master_init ? "desc->master_init" : "param";
        std::vector<unsigned char> raw(src.nbytes());
        to_host(raw.data(), src.data(), raw.size());
        float inv = 1.0f;
        if (src.scale_inv()) to_host(&inv, src.scale_inv(), sizeof inv);
        std::vector<float> w(nn);
        for (size_t i = 0; i < nn; ++i) {
            const float x = adam::load_value(raw.data(), src.dtype(), static_cast<int64_t>(i));
            w[i] = src.scale_inv() ? adam::fmul(x, inv) : x;
            if (!std::isfinite(w[i]))
                fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(src_name) + " element " + std::to_string(i) +
                                                        " is not finite: the master copy cannot start from it");
        }
        std::vector<uint16_t> codes(nn);
        std::vector<float> scale_inv(static_cast<size_t>(e.nscales));
        const int64_t bs = desc_.state_block_size > 0 ? desc_.state_block_size : n;
        for (int64_t b = 0; b < e.nscales; ++b) {
            const int64_t lo = b * bs, hi = std::min<int64_t>(n, lo + bs);
            uint32_t amax = 0;
            for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, kernels::amax_bits_of(w[static_cast<size_t>(i)]));
            const float s = adam::pow2(adam::pow2_exponent(codec::bits_f32(amax), adam::kF16Max));
            scale_inv[static_cast<size_t>(b)] = adam::fdiv(1.0f, s);
            for (int64_t i = lo; i < hi; ++i)
                codes[static_cast<size_t>(i)] =
                    static_cast<uint16_t>(codec::encode<codec::F16, true>(adam::fmul(w[static_cast<size_t>(i)], s)));
        }
        to_device(e.master->data(), codes.data(), nn * 2);
        to_device(e.master_scale->data(), scale_inv.data(), scale_bytes);
    }
    e.param_meta = p.scaling_shared();
    e.grad_meta = g.scaling_shared();
    e.param = std::move(param);
    e.grad = std::move(grad);
    entries_.push_back(std::move(e));
    try {
        rebuild_list();
    } catch (...) {
        entries_.pop_back();
        rebuild_list();
        throw;
    }
    // The device-side list holds both addresses: fp8amp_tensor_rebind must not move them.
    entries_.back().param->pin_address();
    entries_.back().grad->pin_address();
    ctx_->synchronize();
}

void Optimizer::reserve_cpu_scratch(int64_t max_numel) {
    const size_t need = ctx_->backend().adam_host_scratch_floats(desc_.state_block_size, max_numel);
    if (cpu_scratch_.size() < need) cpu_scratch_.resize(need);
}

Optimizer::~Optimizer() {
    for (Entry &e : entries_) {
        e.param->unpin_address();
        e.grad->unpin_address();
    }
}

void Optimizer::rebuild_list() {
    std::vector<adam::Param> list;
    list.reserve(entries_.size());
    int64_t unit = 0;
    int metas = 0;
    int32_t masters = 0;
    uint32_t pairs = 0;
    int64_t max_numel = 0;
    for (const Entry &e : entries_) {
        adam::Param q{};
        const Tensor &p = *e.param, &g = *e.grad;
        q.param = p.data();
        q.grad = g.data();
        q.m = e.m->data();
        q.m_scale_inv = e.m_scale ? static_cast<float *>(e.m_scale->data()) : nullptr;
        q.v = e.v->data();
        q.v_scale_inv = e.v_scale ? static_cast<float *>(e.v_scale->data()) : nullptr;
        q.master = e.master ? e.master->data() : nullptr;
        q.master_scale_inv = e.master_scale ? static_cast<float *>(e.master_scale->data()) : nullptr;
        // The metas bound at add_param (a later add_param must not pick up an earlier parameter's
        // re-binding: the step refuses one, and binding back must find the list as it was).
        q.param_meta = e.param_meta ? e.param_meta->state() : nullptr;
        q.param_scale_inv = e.param_meta ? p.scale_inv() : nullptr;
        // A gradient's value is code * its scale_inv when it is scaled: FP8 (which always carries the
        // scale it was quantized with, bound or not) or F16 bound to a meta (scaled F16).
        q.grad_meta = e.grad_meta ? e.grad_meta->state() : nullptr;
        q.grad_scale_inv = (e.grad_meta || is_fp8(g.dtype())) ? g.scale_inv() : nullptr;
        q.numel = p.numel();
        q.unit_begin = unit;
        q.scale_begin = 0;
        q.param_dtype = p.dtype();
        q.grad_dtype = g.dtype();
        q.element_offset = e.shard_offset;
        q.vec_ok = (reinterpret_cast<uintptr_t>(p.data()) % 16 == 0 && reinterpret_cast<uintptr_t>(g.data()) % 16 == 0) ? 1 : 0;
        unit += e.units;
        metas |= q.param_meta ? 1 : 0;
        masters += q.master ? 1 : 0;
        pairs |= 1u << (q.param_dtype * 5 + q.grad_dtype);
        max_numel = std::max(max_numel, q.numel);
        list.push_back(q);
    }
    auto storage = ctx_->allocate(std::max<size_t>(1, list.size()) * sizeof(adam::Param));
    to_device(storage->data(), list.data(), list.size() * sizeof(adam::Param));
    std::shared_ptr<Storage> amax;
    if (desc_.state_block_size == 0) amax = ctx_->allocate(std::max<size_t>(1, 3 * list.size()) * sizeof(uint32_t));
    list_ = std::move(storage);
    tensor_amax_ = std::move(amax);
    total_units_ = unit;
    has_param_metas_ = metas;
    masters_ = masters;
    pair_mask_ = pairs;
    max_numel_ = max_numel;
}

void Optimizer::check_bindings(bool grads, const char *what) const {
    auto changed = [](const ScalingMeta *now, const ScalingMeta *then) {
        return std::string(!now ? "is no longer bound to the scaling meta it had at fp8amp_optimizer_add_param"
                           : then ? "is bound to another scaling meta than at fp8amp_optimizer_add_param"
                                  : "was bound to a scaling meta after fp8amp_optimizer_add_param (it had none then)") +
               "; bind it back as it was";
    };
    for (size_t i = 0; i < entries_.size(); ++i) {
        const Entry &e = entries_[i];
        if (e.param->scaling() != e.param_meta.get())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string("cannot ") + what + ": parameter #" + std::to_string(i) + " " +
                                                    changed(e.param->scaling(), e.param_meta.get()));
        if (grads && e.grad->scaling() != e.grad_meta.get())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the gradient of parameter #" +
                                                    std::to_string(i) + " " + changed(e.grad->scaling(), e.grad_meta.get()));
    }
}

void Optimizer::step(float lr, const float *lr_device, float grad_scale_inv, GradScaler *scaler) {
    if (comm_ && !in_shard_step_) return step_sharded(lr, lr_device, grad_scale_inv, scaler);  // optimizer_shard.cpp
    // A negative grad_scale_inv would silently turn descent into ascent (maximize is the way to ask
    // for that); -inf lr is "not finite" before it is "negative" (the header's promise).
    if (!(grad_scale_inv >= 0.0f && grad_scale_inv <= FLT_MAX))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "args->grad_scale_inv " + num(grad_scale_inv) + " is not a finite value >= 0");
    if (!std::isfinite(lr)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "args->lr " + num(lr) + " is not finite");
    if (scaler && !same_device(scaler->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "args->scaler is on " + device_name(scaler->device()) + ", the optimizer on " +
                                               device_name(device()));
    // The device list holds the metas the tensors were bound to at add_param (kept alive by the
    // entries); a tensor re-bound since then would be written or read with a meta it no longer has.
    check_bindings(true, "step");
    adam::StepConfig c{};
    c.params = static_cast<const adam::Param *>(list_ ? list_->data() : nullptr);
    c.nparams = num_params();
    c.block_size = desc_.state_block_size;
    c.total_units = total_units_;
    c.m_fp8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3;
    c.v_f16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    c.has_master = masters_ > 0 ? 1 : 0;
    c.mixed_master = masters_ > 0 && masters_ < num_params() ? 1 : 0;
    c.master_stochastic = desc_.master_rounding == FP8AMP_MASTER_ROUND_STOCHASTIC ? 1 : 0;
    c.rounding_seed = desc_.rounding_seed;
    c.adamw = desc_.adamw;
    c.maximize = desc_.maximize;
    c.has_param_metas = has_param_metas_;
    c.pair_mask = pair_mask_;
    c.max_numel = max_numel_;
    c.lr = lr < 0.0f ? desc_.lr : lr;
    c.lr_device = lr_device;
    c.beta1 = desc_.beta1;
    c.beta2 = desc_.beta2;
    c.eps = desc_.eps;
    c.weight_decay = desc_.weight_decay;
    c.max_grad_norm = in_shard_step_ ? 0.0f : desc_.max_grad_norm;  // sharded: clipped before, by the global norm
    c.grad_scale_inv = grad_scale_inv;
    c.status = static_cast<adam::Status *>(status_->data());
    c.scaler = scaler ? scaler->state() : nullptr;
    if (scaler) c.scaler_config = scaler->config();
    c.partials = partials_ ? static_cast<adam::Partial *>(partials_->data()) : nullptr;
    c.tensor_amax = tensor_amax_ ? static_cast<uint32_t *>(tensor_amax_->data()) : nullptr;
    reserve_cpu_scratch(max_numel_);  // sized at add_param already: allocates nothing here
    ctx_->backend().adam_step(c, max_partials_, cpu_scratch_.data());
    stepped_ = true;
    // The parameters were written (unless the step skips, which only the device knows): a Linear
    // re-quantizes a weight whose version moved.
    for (Entry &e : entries_) e.param->mark_written();
}

void Optimizer::update_scaler(GradScaler &scaler) const {
    ctx_->backend().scaler_update(scaler.state(), scaler.config(), status_device());
}

adam::Status Optimizer::status() const {
    adam::Status s{};
    to_host(&s, status_->data(), sizeof s);
    return s;
}

const adam::Status *Optimizer::status_device() const { return static_cast<const adam::Status *>(status_->data()); }

size_t Optimizer::state_bytes() const {
    size_t total = status_->nbytes();
    for (const auto *s : {&list_, &partials_, &tensor_amax_})
        if (*s) total += (*s)->nbytes();
    for (const Entry &e : entries_) {
        for (const auto *s : {&e.m, &e.v, &e.master, &e.m_scale, &e.v_scale, &e.master_scale})
            if (*s) total += (*s)->nbytes();
        if (e.full_param) total += e.param->nbytes();  // sharded: the shard's parameter (its F32 gradient lives during a step only)
    }
    if (shard_scratch_) total += shard_scratch_->nbytes();  // sharded: the step's padded gradient / gathered parameter
    return total;
}

// ---- checkpoints (format: docs/api.md section 12.6) -------------------------------------------------

namespace {

bool host_little_endian() {
    const uint32_t x = 1;
    unsigned char b;
    std::memcpy(&b, &x, 1);
    return b == 1;
}

void require_little_endian() {
    if (!host_little_endian())
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "checkpoints are written and read on little-endian hosts only");
}

// The scaling state of a meta as the checkpoint stores it (field by field, little-endian).
void write_meta(checkpoint::Writer &w, const ScalingState &s, const float *history) {
    w.f32(s.scale);
    w.f32(s.scale_inv);
    w.u32(s.amax_bits);
    w.u32(s.head);
    w.u32(s.updates);
    w.u32(s.history_len);
    w.u32(s.interval);
    w.i32(s.margin);
    w.u32(s.most_recent);
    w.u32(s.power_of_two);
    w.u32(s.current);
    w.u32(s.stats_enabled);
    w.f32(s.fp8_max);
    w.u64(s.quantized);
    w.u64(s.saturated);
    w.u64(s.underflowed);
    for (uint32_t k = 0; k < s.history_len; ++k) w.f32(history[k]);
}

// A block scale_inv as the steps write it: 1 / 2^k with k in [-126, 126] (adam::pow2_exponent).
bool pow2_normal(float x) {
    const uint32_t b = codec::f32_bits(x);
    return (b & 0x807FFFFFu) == 0 && (b >> 23) >= 1 && (b >> 23) <= 253;
}

}  // namespace

uint32_t Optimizer::format_version() const {
    if (desc_.master_rounding != FP8AMP_MASTER_ROUND_NEAREST) return 2;
    const bool desc_master = desc_.master_dtype == FP8AMP_DTYPE_F16;
    for (const Entry &e : entries_)
        if ((e.master != nullptr) != desc_master) return 2;
    return 1;
}

void Optimizer::serialize(checkpoint::Writer &w) const {
    const bool m8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3, v16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    const adam::Status st = status();
    const uint32_t version = format_version();
    w.bytes(kMagic, sizeof kMagic);
    w.u32(version);
    w.u32(kEndianMarker);
    unsigned char *size_field = w.reserve(8);  // the total size, filled in by save()
    (void)size_field;
    w.i32(desc_.adamw);
    w.f32(desc_.lr);
    w.f32(desc_.beta1);
    w.f32(desc_.beta2);
    w.f32(desc_.eps);
    w.f32(desc_.weight_decay);
    w.i32(desc_.maximize);
    w.i32(desc_.exp_avg_dtype);
    w.i32(desc_.exp_avg_sq_dtype);
    w.i32(desc_.master_dtype);
    w.i32(desc_.state_block_size);
    w.f32(desc_.max_grad_norm);
    if (version >= 2) {
        w.i32(desc_.master_rounding);
        w.u32(desc_.rounding_seed);
    }
    w.i64(st.step);
    w.i32(st.found_inf);
    w.f32(st.grad_norm);
    w.u32(static_cast<uint32_t>(entries_.size()));
    auto array = [&](const void *device_src, size_t n) {
        if (unsigned char *dst = w.reserve(n)) to_host(dst, device_src, n);
    };
    for (const Entry &e : entries_) {
        const Tensor &p = *e.param;
        w.i32(p.dtype());
        w.i32(e.grad->dtype());
        w.i32(p.ndim());
        for (int32_t d = 0; d < p.ndim(); ++d) w.i64(p.shape()[d]);
        w.u8(e.param_meta ? 1 : 0);
        if (version >= 2) w.u8(e.master ? 1 : 0);
        w.u64(static_cast<uint64_t>(e.nscales));
        array(p.data(), p.nbytes());
        if (e.param_meta) {
            float slot = 1.0f;
            to_host(&slot, p.scale_inv(), sizeof slot);
            w.f32(slot);
            const uint32_t len = static_cast<uint32_t>(e.param_meta->recipe().amax_history_len);
            std::vector<unsigned char> raw(ScalingState::bytes(len));
            to_host(raw.data(), e.param_meta->state(), raw.size());
            ScalingState s;
            std::memcpy(&s, raw.data(), sizeof s);
            write_meta(w, s, reinterpret_cast<const float *>(raw.data() + sizeof s));
        }
        const size_t scale_bytes = static_cast<size_t>(e.nscales) * 4;
        array(e.m->data(), e.m->nbytes());
        if (m8) array(e.m_scale->data(), scale_bytes);
        array(e.v->data(), e.v->nbytes());
        if (v16) array(e.v_scale->data(), scale_bytes);
        if (e.master) {
            array(e.master->data(), e.master->nbytes());
            array(e.master_scale->data(), scale_bytes);
        }
    }
}

size_t Optimizer::save(unsigned char *buffer) const {
    require_little_endian();
    if (comm_) pull_metas();  // sharded: the checkpoint holds the full parameters' metas
    // A checkpoint pairs each parameter's data and scale_inv slot with its meta's state: after a
    // re-binding the slot belongs to another meta (or to none).
    check_bindings(false, "save");
    checkpoint::Writer counter(nullptr);
    serialize(counter);
    const size_t total = counter.size() + 4;  // + CRC-32
    if (!buffer) return total;
    checkpoint::Writer w(buffer);
    serialize(w);
    const uint64_t size = total;
    for (int k = 0; k < 8; ++k) buffer[16 + k] = static_cast<unsigned char>(size >> (8 * k));
    w.u32(checkpoint::crc32(buffer, total - 4));
    return total;
}

void Optimizer::load(const unsigned char *data, size_t size) {
    require_little_endian();
    check_bindings(false, "load");  // as save: each parameter's slot and meta are restored together
    using checkpoint::Reader;
    // 1. The envelope: magic, size, checksum, version, endianness.
    if (size < 28 + 4)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint truncated: " + std::to_string(size) + " bytes is less than its header");
    if (std::memcmp(data, kMagic, sizeof kMagic) != 0)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "not an fp8amp optimizer checkpoint (bad magic)");
    Reader head(data + 8, size - 8);
    const uint32_t version = head.u32("version");
    const uint32_t marker = head.u32("endianness marker");
    const uint64_t declared = head.u64("size");
    if (declared != size)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint truncated or padded: it declares " + std::to_string(declared) +
                                            " bytes, " + std::to_string(size) + " were given");
    Reader tail(data + size - 4, 4);
    const uint32_t crc = tail.u32("checksum");
    if (checkpoint::crc32(data, size - 4) != crc)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint checksum mismatch (corrupted data)");
    if (version < 1 || version > kFormatVersion)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "checkpoint format version " + std::to_string(version) +
                                             " is not supported (this library reads versions 1.." + std::to_string(kFormatVersion) + ")");
    if (marker != kEndianMarker) fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint endianness marker is wrong");

    // 2. Parse and validate everything; nothing is written before all of it passed.
    Reader r(data + 24, size - 24 - 4);
    fp8amp_adam_desc d = desc_;
    d.adamw = r.i32("desc");
    d.lr = r.f32("desc");
    d.beta1 = r.f32("desc");
    d.beta2 = r.f32("desc");
    d.eps = r.f32("desc");
    d.weight_decay = r.f32("desc");
    d.maximize = r.i32("desc");
    store_enum(d.exp_avg_dtype, r.i32("desc"));  // no cast of an unchecked value
    store_enum(d.exp_avg_sq_dtype, r.i32("desc"));
    d.master_dtype = r.i32("desc");
    d.state_block_size = r.i32("desc");
    d.max_grad_norm = r.f32("desc");
    if (version >= 2) {
        d.master_rounding = r.i32("desc");
        d.rounding_seed = r.u32("desc");
    }
    // save writes the flags as 0 or 1; validate_adam_desc would quietly read any other value as 1.
    if (d.adamw != 0 && d.adamw != 1)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint desc.adamw is " + std::to_string(d.adamw) + ", not 0 or 1");
    if (d.maximize != 0 && d.maximize != 1)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint desc.maximize is " + std::to_string(d.maximize) + ", not 0 or 1");
    try {
        d = validate_adam_desc(d);
    } catch (const Error &e) {
        fail(FP8AMP_ERROR_CORRUPT_DATA, std::string("checkpoint holds an invalid configuration: ") + e.what());
    }
    // The master choice is per parameter, checked below (a version 1 checkpoint gave every parameter
    // its desc's master_dtype): an optimizer whose parameters have the same choices loads it, whatever
    // its own desc's default.
    if (d.exp_avg_dtype != desc_.exp_avg_dtype || d.exp_avg_sq_dtype != desc_.exp_avg_sq_dtype ||
        d.state_block_size != desc_.state_block_size)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH,
             std::string("checkpoint state layout (m ") + fp8amp_dtype_name(d.exp_avg_dtype) + ", v " +
                 fp8amp_dtype_name(d.exp_avg_sq_dtype) + ", master " + std::to_string(d.master_dtype) + ", block " +
                 std::to_string(d.state_block_size) + ") differs from this optimizer's (m " +
                 fp8amp_dtype_name(desc_.exp_avg_dtype) + ", v " + fp8amp_dtype_name(desc_.exp_avg_sq_dtype) + ", master " +
                 std::to_string(desc_.master_dtype) + ", block " + std::to_string(desc_.state_block_size) + ")");
    adam::Status st{};
    st.step = r.i64("step");
    st.found_inf = r.i32("found_inf");
    st.grad_norm = r.f32("grad_norm");
    if (st.step < 0 || st.step > adam::kMaxStep)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint step count " + std::to_string(st.step) + " is outside 0.." +
                                            std::to_string(adam::kMaxStep) + " (a count the steps' int64 arithmetic cannot overflow)");
    if (st.found_inf != 0 && st.found_inf != 1)
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint found_inf is " + std::to_string(st.found_inf) + ", not 0 or 1");
    // A step records the norm of its gradients (>= 0; +inf when their sum of squares overflows
    // float32), or NaN when it found a non-finite gradient and skipped.
    if (st.found_inf ? !std::isnan(st.grad_norm) : !(st.grad_norm >= 0.0f))
        fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint grad_norm " + num(st.grad_norm) +
                                            (st.found_inf ? " is not NaN, though found_inf is 1 (a skipped step records NaN)"
                                                          : " is negative or NaN, though found_inf is 0"));
    const uint32_t count = r.u32("parameter count");
    if (count != entries_.size())
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "checkpoint holds " + std::to_string(count) + " parameters, the optimizer " +
                                              std::to_string(entries_.size()));
    const bool m8 = desc_.exp_avg_dtype == FP8AMP_DTYPE_E4M3, v16 = desc_.exp_avg_sq_dtype == FP8AMP_DTYPE_F16;
    struct Plan {
        const unsigned char *param = nullptr, *m = nullptr, *m_scale = nullptr, *v = nullptr, *v_scale = nullptr,
                            *master = nullptr, *master_scale = nullptr;
        float slot = 1.0f;
        std::vector<unsigned char> meta;  // ScalingState + history, ready to copy
    };
    std::vector<Plan> plans(count);
    auto check_scales = [](const unsigned char *p, int64_t n, const std::string &who, const char *what) {
        for (int64_t k = 0; k < n; ++k) {
            float x;
            std::memcpy(&x, p + 4 * k, 4);
            if (!pow2_normal(x))
                fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + ": " + what + " block scale " + std::to_string(k) + " (" +
                                                    num(x) + ") is not a power of two in [2^-126, 2^126]");
        }
    };
    // Every state element as the step reads it -- its code (or float) times its block's scale_inv --
    // must be finite (v also >= 0): valid codes and valid scales can still overflow together.
    const int64_t block = desc_.state_block_size;
    auto check_values = [block](const unsigned char *p, const unsigned char *scales, int64_t n, int32_t dtype,
                                bool nonneg, const std::string &who, const char *what) {
        const size_t es = fp8amp_dtype_size(static_cast<fp8amp_dtype>(dtype));
        for (int64_t j = 0; j < n; ++j) {
            float inv = 1.0f;
            if (scales) std::memcpy(&inv, scales + 4 * (block > 0 ? j / block : 0), 4);
            uint32_t code = 0;  // the blob's arrays are not aligned: copy the element out first
            std::memcpy(&code, p + static_cast<size_t>(j) * es, es);
            const float x = adam::fmul(adam::load_value(&code, dtype, 0), inv);
            if (!(x <= FLT_MAX && x >= (nonneg ? 0.0f : -FLT_MAX)))
                fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + ": " + what + " element " + std::to_string(j) + " is " +
                                                    num(x) + (scales ? " (code times its block's scale_inv)" : "") +
                                                    (nonneg ? ", not a finite value >= 0" : ", not finite"));
        }
    };
    for (size_t i = 0; i < count; ++i) {
        const Entry &e = entries_[i];
        const Tensor &p = *e.param;
        const std::string who = "parameter #" + std::to_string(i);
        const int64_t numel = p.numel();
        const int32_t pd = r.i32("parameter dtype"), gd = r.i32("gradient dtype"), ndim = r.i32("ndim");
        if (pd != p.dtype() || gd != e.grad->dtype())
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "checkpoint " + who + " has dtypes (" + fp8amp_dtype_name(static_cast<fp8amp_dtype>(pd)) +
                                                  ", grad " + fp8amp_dtype_name(static_cast<fp8amp_dtype>(gd)) + "), the optimizer's is " +
                                                  p.describe() + " with a " + fp8amp_dtype_name(e.grad->dtype()) + " gradient");
        if (ndim < 0 || ndim > FP8AMP_MAX_NDIM) fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + " has an invalid ndim");
        bool same = ndim == p.ndim();
        for (int32_t k = 0; k < ndim; ++k) {
            const int64_t extent = r.i64("shape");
            same = same && k < p.ndim() && extent == p.shape()[k];
        }
        if (!same) fail(FP8AMP_ERROR_SHAPE_MISMATCH, "checkpoint " + who + " has another shape than " + p.describe());
        const uint8_t meta_flag = r.u8("meta flag");
        if (meta_flag > 1)
            fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + ": meta flag is " + std::to_string(meta_flag) + ", not 0 or 1");
        const bool has_meta = meta_flag != 0;
        if (has_meta != (e.param_meta != nullptr))
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "checkpoint " + who + (has_meta ? " is" : " is not") +
                                                  " bound to a scaling meta, the optimizer's parameter" + (has_meta ? " is not" : " is"));
        bool has_master = d.master_dtype == FP8AMP_DTYPE_F16;  // version 1: the desc's, for every parameter
        if (version >= 2) {
            const uint8_t master_flag = r.u8("master flag");
            if (master_flag > 1)
                fail(FP8AMP_ERROR_CORRUPT_DATA,
                     "checkpoint " + who + ": master flag is " + std::to_string(master_flag) + ", not 0 or 1");
            has_master = master_flag != 0;
        }
        if (has_master != (e.master != nullptr))
            fail(FP8AMP_ERROR_DTYPE_MISMATCH, "checkpoint " + who + (has_master ? " has" : " has no") +
                                                  " f16 master copy, the optimizer's parameter" + (has_master ? " has none" : " has one"));
        if (r.u64("scale count") != static_cast<uint64_t>(e.nscales))
            fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + " has an inconsistent number of block scales");
        Plan &plan = plans[i];
        plan.param = r.take(p.nbytes(), "parameter data");
        if (has_meta) {
            plan.slot = r.f32("scale_inv");
            ScalingState s{};
            s.scale = r.f32("meta");
            s.scale_inv = r.f32("meta");
            s.amax_bits = r.u32("meta");
            s.head = r.u32("meta");
            s.updates = r.u32("meta");
            s.history_len = r.u32("meta");
            s.interval = r.u32("meta");
            s.margin = r.i32("meta");
            s.most_recent = r.u32("meta");
            s.power_of_two = r.u32("meta");
            s.current = r.u32("meta");
            s.stats_enabled = r.u32("meta");
            s.fp8_max = r.f32("meta");
            s.quantized = r.u64("meta");
            s.saturated = r.u64("meta");
            s.underflowed = r.u64("meta");
            const fp8amp_recipe &rec = e.param_meta->recipe();
            if (s.history_len != static_cast<uint32_t>(rec.amax_history_len) || s.interval != static_cast<uint32_t>(rec.interval) ||
                s.margin != rec.margin || s.most_recent != (rec.amax_algo == FP8AMP_AMAX_MOST_RECENT ? 1u : 0u) ||
                s.power_of_two != (rec.power_of_two_scales ? 1u : 0u) || s.current != 0u ||
                s.fp8_max != scaled_dtype_max(e.param_meta->dtype()))
                fail(FP8AMP_ERROR_DTYPE_MISMATCH, "checkpoint " + who + "'s scaling meta has another recipe than the optimizer's");
            // The domains every writer of a meta keeps (fp8amp_scaling_set_scale, the updates): a normal
            // scale, scale_inv = 1/scale exactly, amaxes recorded as non-negative floats or +inf (NaN is
            // recorded as +inf). The tensor's slot can be written by the caller: finite and > 0.
            const std::string bad = "checkpoint " + who + ": ";
            if (!(plan.slot > 0.0f && plan.slot <= FLT_MAX))
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "its tensor's scale_inv " + num(plan.slot) + " is not a finite value > 0");
            if (!(s.scale >= FLT_MIN && s.scale <= FLT_MAX))
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta scale " + num(s.scale) + " is not a normal float > 0");
            if (codec::f32_bits(s.scale_inv) != codec::f32_bits(1.0f / s.scale))
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta scale_inv " + num(s.scale_inv) + " is not 1/scale (" +
                                                    num(1.0f / s.scale) + ")");
            if (s.amax_bits > 0x7F800000u)
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta recorded amax " + num(codec::bits_f32(s.amax_bits)) +
                                                    " is negative or NaN");
            if (s.head >= s.history_len)
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta history head " + std::to_string(s.head) +
                                                    " is not below the history length " + std::to_string(s.history_len));
            if (s.stats_enabled > 1)
                fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta stats_enabled is " + std::to_string(s.stats_enabled) + ", not 0 or 1");
            s.stats_enabled = e.param_meta->stats_enabled() ? 1u : 0u;  // the live meta's setting (host mirror) stays
            plan.meta.resize(ScalingState::bytes(s.history_len));
            std::memcpy(plan.meta.data(), &s, sizeof s);
            const unsigned char *history = r.take(4u * s.history_len, "amax history");
            for (uint32_t k = 0; k < s.history_len; ++k) {
                const uint32_t bits = uint32_t(history[4 * k]) | uint32_t(history[4 * k + 1]) << 8 |
                                      uint32_t(history[4 * k + 2]) << 16 | uint32_t(history[4 * k + 3]) << 24;
                if (bits > 0x7F800000u)
                    fail(FP8AMP_ERROR_CORRUPT_DATA, bad + "meta amax history[" + std::to_string(k) + "] " +
                                                        num(codec::bits_f32(bits)) + " is negative or NaN");
            }
            std::memcpy(plan.meta.data() + sizeof s, history, 4u * s.history_len);
        }
        // The parameter's values, as the step reads them (its code times its tensor's scale_inv), are
        // finite: the step never makes a non-finite one (a step with a non-finite gradient is skipped),
        // and a non-finite one would turn m, v and the master non-finite at the next step.
        {
            const size_t es = fp8amp_dtype_size(p.dtype());
            const float inv = has_meta ? plan.slot : 1.0f;
            for (int64_t j = 0; j < numel; ++j) {
                uint32_t code = 0;  // the blob's arrays are not aligned: copy the element out first
                std::memcpy(&code, plan.param + static_cast<size_t>(j) * es, es);
                const float x = adam::fmul(adam::load_value(&code, p.dtype(), 0), inv);
                if (!(x <= FLT_MAX && x >= -FLT_MAX))
                    fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint " + who + ": parameter element " + std::to_string(j) + " is " +
                                                        num(x) + (has_meta ? " (code times its tensor's scale_inv)" : "") +
                                                        ", not finite");
            }
        }
        const size_t scale_bytes = static_cast<size_t>(e.nscales) * 4;
        plan.m = r.take(e.m->nbytes(), "m");
        if (m8) check_scales(plan.m_scale = r.take(scale_bytes, "m scales"), e.nscales, who, "m");
        check_values(plan.m, plan.m_scale, numel, m8 ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_F32, false, who, "m");
        plan.v = r.take(e.v->nbytes(), "v");
        if (v16) check_scales(plan.v_scale = r.take(scale_bytes, "v scales"), e.nscales, who, "v");
        check_values(plan.v, plan.v_scale, numel, v16 ? FP8AMP_DTYPE_F16 : FP8AMP_DTYPE_F32, true, who, "v");
        if (e.master) {
            plan.master = r.take(e.master->nbytes(), "master");
            check_scales(plan.master_scale = r.take(scale_bytes, "master scales"), e.nscales, who, "master");
            check_values(plan.master, plan.master_scale, numel, FP8AMP_DTYPE_F16, false, who, "master");
        }
    }
    if (r.remaining() != 0) fail(FP8AMP_ERROR_CORRUPT_DATA, "checkpoint has trailing bytes before its checksum");

    // 3. Apply.
    for (size_t i = 0; i < count; ++i) {
        const Entry &e = entries_[i];
        const Plan &plan = plans[i];
        const size_t scale_bytes = static_cast<size_t>(e.nscales) * 4;
        to_device(e.param->data(), plan.param, e.param->nbytes());
        if (e.param_meta) {
            to_device(e.param->scale_inv(), &plan.slot, sizeof plan.slot);
            to_device(e.param_meta->state(), plan.meta.data(), plan.meta.size());
        }
        to_device(e.m->data(), plan.m, e.m->nbytes());
        if (m8) to_device(e.m_scale->data(), plan.m_scale, scale_bytes);
        to_device(e.v->data(), plan.v, e.v->nbytes());
        if (v16) to_device(e.v_scale->data(), plan.v_scale, scale_bytes);
        if (e.master) {
            to_device(e.master->data(), plan.master, e.master->nbytes());
            to_device(e.master_scale->data(), plan.master_scale, scale_bytes);
        }
    }
    to_device(status_->data(), &st, sizeof st);
    for (Entry &e : entries_) e.param->mark_written();
    d.master_dtype = desc_.master_dtype;  // the default of later add_param calls: this optimizer's
    desc_ = d;
    if (comm_) gather_params(true);  // sharded: the metas and every rank's shard back into the full parameters
}

}  // namespace fp8amp::core
