// The sharded optimizer (fp8amp_optimizer_set_shard; issue 20, ZeRO-style O3): each rank keeps the
// optimizer state (m, v, the F16 master and their block scales) of its shard of every parameter.
//
// Why per parameter, not over the flattened parameter list: a scaled parameter (an E4M3 weight) is
// written with its own meta's scale, so each parameter's all-gather carries one scale_inv per shard
// that is the same on every rank (all encode with the agreed meta) and the gathered codes are the
// unsharded parameter's bytes; a shard of a flattened list would cut across parameters of different
// scales and need a scale per (rank, parameter) piece. The reduce-scatter likewise gets one wire
// scale per parameter, as the unsharded all-reduce of a bucket does per tensor.
//
// A shard is k = ceil(n / nranks) elements rounded up to the state block size: no state block spans
// two ranks, so every block scale is the unsharded one. Each rank's shard is a k-element parameter
// and F32 gradient of a local optimizer (Entry::param/grad; the last ranks' shards are padded with
// zeros, which Adam leaves at zero and which change no amax), updated by the same kernel as the
// unsharded step, so the element arithmetic is shared. What spans the ranks is done here, around it:
//   1. every rank checks its full local gradient for inf/NaN before the wire (the FP8 wire saturates
//      inf), then reduce-scatters it (FP32 accumulation in rank order) into its F32 shard gradient;
//   2. the unscaling and the sum of squares of the shard (the kernel's phase 1, on the host), and one
//      all-gather of per-rank words: found_inf (any rank), the global norm (float64 partial sums added
//      in rank order); a skipped step stops here on every rank, having written nothing;
//   3. the clipped gradient g * coef is written back and the kernel runs with factor 1 and no
//      clipping: fmul(g, 1) = g, so it updates with the unsharded step's values;
//   4. scaled parameters: each shard's private meta copy records the shard's amax, the ranks agree on
//      the maximum (one all-gather), and the full meta folds on the host (the kernel's phase 3);
//   5. every shard is all-gathered into its full parameter.
// On CUDA, steps 2-4 go through host memory (synchronous; correct first, fused later). Compiled with
// -ffp-contract=off, as the CPU kernel: step 2's sums must not contract into an FMA.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "backend.hpp"  // kernels/backend.hpp
#include "communicator.hpp"
#include "optimizer.hpp"
#include "scaling.hpp"  // kernels/scaling.hpp
#include "scaling_meta.hpp"

namespace fp8amp::core {

namespace adam = kernels::adam;
using kernels::ScalingState;

namespace {

bool finite_f(float x) { return (codec::f32_bits(x) & 0x7F800000u) != 0x7F800000u; }

std::string num(double x) { return std::to_string(x); }

// Bytes of a meta's state: the header and its amax history.
size_t meta_bytes(const Context &ctx, const ScalingMeta &m) {
    ScalingState st{};
    ctx.backend().copy_to_host(&st, m.state(), sizeof st);
    return sizeof(ScalingState) + static_cast<size_t>(st.history_len) * sizeof(float);
}

// The kernel's phase 3 for one meta (kernels/cpu/adam.cpp fold_meta), on a host copy of its state.
float fold_on_host(ScalingState &s) {
    const float written_with = s.scale_inv;
    kernels::fold_history(s);
    if (kernels::scale_due(s)) {
        float h = 0.0f;
        if (s.most_recent) {
            h = s.history()[s.head];
        } else {
            for (uint32_t k = 0; k < s.history_len; ++k) h = std::fmax(h, s.history()[k]);
        }
        kernels::apply_scale(s, h);
    }
    return written_with;
}

}  // namespace

void Optimizer::set_shard(std::shared_ptr<Communicator> comm) {
    if (comm_) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "opt is already sharded (fp8amp_optimizer_set_shard was called before)");
    if (!entries_.empty() || stepped_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "opt already holds parameters or took a step: call fp8amp_optimizer_set_shard on a "
                                            "fresh optimizer, before fp8amp_optimizer_add_param");
    if (!same_device(comm->context().device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "comm is on " + device_name(comm->context().device()) + ", the optimizer on " +
                                               device_name(device()));
    if (desc_.state_block_size == 0)
        fail(FP8AMP_ERROR_NOT_SUPPORTED, "the optimizer keeps one state scale per tensor (desc->state_block_size 0), which "
                                         "would span the ranks' shards: shard an optimizer with block scales (128..8192)");
    const int64_t n = comm->nranks();
    auto scale_inv = Tensor::create(ctx_, FP8AMP_DTYPE_F32, 1, &n);
    auto one = ctx_->allocate(sizeof(float));
    const float v = 1.0f;
    to_device(one->data(), &v, sizeof v);
    gather_scale_inv_ = std::move(scale_inv);
    one_ = std::move(one);
    comm_ = std::move(comm);
}

void Optimizer::shard_range(int32_t index, int64_t &begin, int64_t &count) const {
    if (index < 0 || index >= num_params())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "index " + std::to_string(index) + " is not in 0.." + std::to_string(num_params() - 1));
    const Entry &e = entries_[static_cast<size_t>(index)];
    if (!e.full_param) {
        begin = 0;
        count = e.param->numel();
        return;
    }
    const int64_t n = e.full_param->numel();
    begin = std::min(e.shard_offset, n);
    count = std::max<int64_t>(0, std::min(e.shard_k, n - e.shard_offset));
}

void Optimizer::add_param_sharded(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype,
                                  const Tensor *master_init) {
    const Tensor &p = *param;
    const Tensor &g = *grad;
    // The full tensors' own checks (the shard's follow in add_local).
    if (stepped_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "the optimizer has already taken a step: add every parameter before the first step");
    check_on_device(*ctx_, p, "param");
    check_on_device(*ctx_, g, "grad");
    check_writable(p, "param");
    if (!p.same_shape(g)) fail(FP8AMP_ERROR_SHAPE_MISMATCH, "param is " + p.describe() + " but grad is " + g.describe());
    if (p.overlaps(g)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param and grad overlap in memory");
    if (p.dtype() == FP8AMP_DTYPE_E4M3 && !p.scaling())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param (" + p.describe() +
                                                ") is not bound to a scaling meta (fp8amp_tensor_set_scaling): an e4m3 parameter needs one");
    if (p.scaling() && !same_device(p.scaling()->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "param's meta is an " + p.scaling()->describe() + ", the optimizer is on " +
                                               device_name(device()));
    if (g.scaling() && !same_device(g.scaling()->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "grad's meta is an " + g.scaling()->describe() + ", the optimizer is on " +
                                               device_name(device()));
    for (size_t i = 0; i < entries_.size(); ++i) {
        const Entry &e = entries_[i];
        if (e.full_param.get() == &p || e.full_param->overlaps(p))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param is already registered (it is, or overlaps, parameter #" + std::to_string(i) + ")");
        if (e.full_param->overlaps(g)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "grad overlaps parameter #" + std::to_string(i));
        if (e.full_grad->overlaps(p))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param overlaps the gradient of parameter #" + std::to_string(i));
        if (p.scaling() && e.full_meta.get() == p.scaling())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "param's meta is already the meta of parameter #" + std::to_string(i) +
                                                    " (the optimizer folds each parameter's meta once per step)");
    }
    kernels::Backend &be = ctx_->backend();
    const int64_t N = comm_->nranks(), r = comm_->rank();
    const int64_t n = p.numel(), B = desc_.state_block_size;
    const int64_t k = ((n + N - 1) / N + B - 1) / B * B;
    const int64_t offset = r * k;
    const int64_t count = std::max<int64_t>(0, std::min(k, n - offset));
    // The shard: the parameter's slice, zeros past its end.
    auto shard = Tensor::create(ctx_, p.dtype(), 1, &k);
    const size_t es = shard->nbytes() / static_cast<size_t>(k);
    be.memset(shard->data(), 0, shard->nbytes());
    if (count > 0)
        be.copy_on_device(shard->data(), static_cast<const unsigned char *>(p.data()) + static_cast<size_t>(offset) * es,
                          static_cast<size_t>(count) * es);
    // master_init's slice likewise (its full shape checked here, the shard's in add_local).
    std::shared_ptr<Tensor> init_shard;
    if (master_init) {
        check_on_device(*ctx_, *master_init, "desc->master_init");
        if (!master_init->same_shape(p))
            fail(FP8AMP_ERROR_SHAPE_MISMATCH, "desc->master_init is " + master_init->describe() + " but param is " + p.describe());
        init_shard = Tensor::create(ctx_, master_init->dtype(), 1, &k);
        const size_t is = init_shard->nbytes() / static_cast<size_t>(k);
        be.memset(init_shard->data(), 0, init_shard->nbytes());
        if (count > 0)
            be.copy_on_device(init_shard->data(),
                              static_cast<const unsigned char *>(master_init->data()) + static_cast<size_t>(offset) * is,
                              static_cast<size_t>(count) * is);
    }
    std::shared_ptr<ScalingMeta> meta;
    if (p.scaling()) {
        // A private copy of the meta: the kernel writes the shard with its scale (the full meta's) and
        // records the shard's amax in it; the full meta folds with the ranks' agreed amax (step 4).
        meta = std::make_shared<ScalingMeta>(ctx_, p.scaling()->recipe(), p.scaling()->dtype());
        be.copy_on_device(meta->state(), p.scaling()->state(), meta_bytes(*ctx_, *p.scaling()));
        shard->set_scaling(meta);
        be.copy_on_device(shard->scale_inv(), p.scale_inv(), sizeof(float));  // the value the codes stand for
    }
    // The step's scratch: the padded F32 gradient, or the gathered parameter (grown, never shrunk).
    const size_t need = static_cast<size_t>(N * k) * std::max<size_t>(4, es);
    std::shared_ptr<Storage> scratch = shard_scratch_;
    if (!scratch || scratch->nbytes() < need) scratch = ctx_->allocate(need);
    // The shard's F32 gradient lives only during a step (step_sharded points it into that step's
    // memory); between steps every shard gradient points at the scratch, which overlaps no parameter.
    auto shard_grad = Tensor::wrap(ctx_, FP8AMP_DTYPE_F32, 1, &k, scratch->data());
    point_grads(scratch->data(), nullptr);
    try {
        add_local(shard, shard_grad, master_dtype, init_shard.get());  // the state (the master from the shard's values)
    } catch (...) {
        if (shard_scratch_) point_grads(shard_scratch_->data(), nullptr);
        throw;
    }
    Entry &e = entries_.back();
    e.full_param = std::move(param);
    e.full_grad = std::move(grad);
    e.full_meta = e.full_param->scaling_shared();
    e.full_grad_meta = e.full_grad->scaling_shared();
    e.shard_meta = std::move(meta);
    e.shard_k = k;
    e.shard_offset = offset;
    shard_scratch_ = std::move(scratch);
    try {
        rebuild_list();  // the stochastic rounding's element offset (Param::element_offset)
    } catch (...) {
        entries_.back().param->unpin_address();
        entries_.back().grad->unpin_address();
        entries_.pop_back();
        rebuild_list();
        throw;
    }
}

void Optimizer::point_grads(void *base, const std::vector<size_t> *offsets) {
    for (size_t q = 0; q < entries_.size(); ++q) {
        Entry &e = entries_[q];
        if (!e.full_param) continue;
        const int64_t k = e.shard_k;
        e.grad->unpin_address();
        e.grad->rebind(static_cast<unsigned char *>(base) + (offsets ? (*offsets)[q] : 0), 1, &k);
        e.grad->pin_address();
    }
}

void Optimizer::pull_metas() const {
    kernels::Backend &be = ctx_->backend();
    for (const Entry &e : entries_) {
        if (!e.full_meta) continue;
        be.copy_on_device(e.shard_meta->state(), e.full_meta->state(), meta_bytes(*ctx_, *e.full_meta));
        be.copy_on_device(e.param->scale_inv(), e.full_param->scale_inv(), sizeof(float));
    }
}

// The communicator runs on its own context's stream, which may not be the optimizer's (CUDA): each
// collective waits for the optimizer's queued work first, and the optimizer for the collective after.
// Both are no-ops on the CPU, where everything is done when queued.
#define FP8AMP_SHARD_COLLECTIVE(call)          \
    do {                                        \
        ctx_->synchronize();                    \
        call;                                   \
        comm_->context().synchronize();         \
    } while (0)

std::vector<uint32_t> Optimizer::exchange(const std::vector<uint32_t> &mine) const {
    // Wide tensors travel through an all-gather as their bytes (fp8amp_comm_all_gather): exact.
    const int64_t w = static_cast<int64_t>(std::max<size_t>(1, mine.size()));
    const int64_t nw = w * comm_->nranks();
    auto in = Tensor::create(ctx_, FP8AMP_DTYPE_F32, 1, &w);
    auto out = Tensor::create(ctx_, FP8AMP_DTYPE_F32, 1, &nw);
    std::vector<uint32_t> words(static_cast<size_t>(w), 0u);
    std::copy(mine.begin(), mine.end(), words.begin());
    in->copy_from_host(words.data(), words.size() * 4);
    FP8AMP_SHARD_COLLECTIVE(comm_->all_gather(in, out, nullptr, true));
    std::vector<uint32_t> all(static_cast<size_t>(nw));
    out->copy_to_host(all.data(), all.size() * 4);
    return all;
}

void Optimizer::gather_params(bool push_metas) {
    kernels::Backend &be = ctx_->backend();
    const int64_t N = comm_->nranks();
    for (Entry &e : entries_) {
        if (push_metas && e.full_meta) {
            be.copy_on_device(e.full_meta->state(), e.shard_meta->state(), meta_bytes(*ctx_, *e.shard_meta));
            be.copy_on_device(e.full_param->scale_inv(), e.param->scale_inv(), sizeof(float));
        }
        const Tensor &full = *e.full_param;
        const int64_t nk = N * e.shard_k;
        const bool fp8 = is_fp8(full.dtype());
        std::shared_ptr<Tensor> out = e.full_param;
        if (full.numel() != nk) out = Tensor::wrap(ctx_, full.dtype(), 1, &nk, shard_scratch_->data());
        FP8AMP_SHARD_COLLECTIVE(comm_->all_gather(e.param, out, fp8 ? gather_scale_inv_ : nullptr, true));
        if (out != e.full_param) be.copy_on_device(full.data(), out->data(), full.nbytes());
        e.full_param->mark_written();
    }
}

void Optimizer::step_sharded(float lr, const float *lr_device, float grad_scale_inv, GradScaler *scaler) {
    if (!(grad_scale_inv >= 0.0f && grad_scale_inv <= FLT_MAX))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "args->grad_scale_inv " + num(grad_scale_inv) + " is not a finite value >= 0");
    if (!std::isfinite(lr)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "args->lr " + num(lr) + " is not finite");
    if (scaler && !same_device(scaler->device(), device()))
        fail(FP8AMP_ERROR_DEVICE_MISMATCH, "args->scaler is on " + device_name(scaler->device()) + ", the optimizer on " +
                                               device_name(device()));
    check_bindings(true, "step");
    for (size_t i = 0; i < entries_.size(); ++i) {
        const Entry &e = entries_[i];
        if (e.full_param->scaling() != e.full_meta.get() || e.full_grad->scaling() != e.full_grad_meta.get())
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "cannot step: parameter #" + std::to_string(i) +
                                                    " or its gradient is bound to another scaling meta than at "
                                                    "fp8amp_optimizer_add_param; bind it back as it was");
    }
    kernels::Backend &be = ctx_->backend();
    void *stream = ctx_->stream();
    const int64_t N = comm_->nranks();
    CommReduceOptions wire;  // E4M3 on the wire, the mean over the ranks

    // The shards' F32 gradients, for this step only (from the context's allocator: a caching
    // allocator hands the memory to the next forward).
    std::vector<size_t> offsets(entries_.size());
    size_t grad_bytes = 0;
    for (size_t q = 0; q < entries_.size(); ++q) {
        offsets[q] = grad_bytes;
        grad_bytes += static_cast<size_t>(entries_[q].shard_k) * 4;
    }
    std::shared_ptr<Storage> grads = ctx_->allocate(std::max<size_t>(grad_bytes, 4));
    point_grads(grads->data(), &offsets);
    rebuild_list();
    // However the step ends, the gradients point back at the scratch before this memory goes (the
    // device list keeps the old addresses, unread until the next step rebuilds it).
    struct Repoint {
        Optimizer &o;
        ~Repoint() {
            try {
                o.point_grads(o.shard_scratch_->data(), nullptr);
            } catch (...) {  // rebind only fails on a pointer the driver does not know: not this one
            }
        }
    } repoint{*this};

    // 1. Inf/NaN in the local gradients (before the wire, which saturates inf), then the reduce-scatter.
    bool bad = false;
    std::shared_ptr<Storage> amax_scratch;
    if (const size_t nb = be.amax_scratch_bytes()) amax_scratch = ctx_->allocate(nb);
    for (Entry &e : entries_) {
        const Tensor &g = *e.full_grad;
        const auto n = static_cast<size_t>(g.numel());
        if (e.full_grad_meta) {  // a saturated quantize into an FP8 gradient, as the unsharded step checks
            ScalingState st{};
            to_host(&st, e.full_grad_meta->state(), sizeof st);
            if (st.amax_bits >= 0x7F800000u) bad = true;
        }
        if (be.amax(g.data(), g.dtype(), n, amax_scratch ? amax_scratch->data() : nullptr) >= 0x7F800000u) bad = true;
        auto *buf = static_cast<float *>(shard_scratch_->data());
        const bool scaled = is_fp8(g.dtype()) || e.full_grad_meta;
        if (scaled)
            be.dequantize(stream, g.data(), g.dtype(), buf, FP8AMP_DTYPE_F32, n,
                          g.scale_inv() ? g.scale_inv() : static_cast<const float *>(one_->data()));
        else if (g.dtype() == FP8AMP_DTYPE_F32)
            be.copy_on_device(buf, g.data(), n * 4);
        else
            be.cast(stream, g.data(), g.dtype(), buf, FP8AMP_DTYPE_F32, n);
        const int64_t nk = N * e.shard_k;
        be.memset(buf + n, 0, (static_cast<size_t>(nk) - n) * 4);
        auto in = Tensor::wrap(ctx_, FP8AMP_DTYPE_F32, 1, &nk, buf);
        FP8AMP_SHARD_COLLECTIVE(comm_->reduce_scatter(in, e.grad, wire));
    }

    // 2. The kernel's phase 1 on the shards: unscale, check, sum of squares; then agree.
    float loss_scale_inv = 1.0f;
    if (scaler) {
        adam::ScalerState ss{};
        to_host(&ss, scaler->state(), sizeof ss);
        loss_scale_inv = adam::fdiv(1.0f, ss.scale);
    }
    // The unsharded step's factor for an F32 gradient (kernels/cpu/adam.cpp grad_factor).
    const float f = adam::fmul(adam::fmul(grad_scale_inv, 1.0f), loss_scale_inv);
    std::vector<std::vector<float>> gs(entries_.size());
    double sumsq = 0.0;
    for (size_t q = 0; q < entries_.size(); ++q) {
        std::vector<float> &h = gs[q];
        h.resize(static_cast<size_t>(entries_[q].shard_k));
        to_host(h.data(), entries_[q].grad->data(), h.size() * 4);
        for (float &x : h) {
            x = adam::fmul(x, f);
            if (!finite_f(x)) bad = true;
            sumsq += static_cast<double>(x) * static_cast<double>(x);
        }
    }
    uint64_t sbits;
    std::memcpy(&sbits, &sumsq, sizeof sbits);
    const std::vector<uint32_t> all = exchange({bad ? 1u : 0u, static_cast<uint32_t>(sbits), static_cast<uint32_t>(sbits >> 32)});
    bool any_bad = false;
    double total = 0.0;
    for (int64_t r = 0; r < N; ++r) {
        any_bad = any_bad || all[static_cast<size_t>(3 * r)] != 0;
        const uint64_t b = all[static_cast<size_t>(3 * r + 1)] | (static_cast<uint64_t>(all[static_cast<size_t>(3 * r + 2)]) << 32);
        double part;
        std::memcpy(&part, &b, sizeof part);
        total += part;
    }
    stepped_ = true;
    adam::Status st = status();
    if (any_bad) {  // skipped on every rank: nothing written but the status (and the scaler)
        st.found_inf = 1;
        st.grad_norm = codec::bits_f32(codec::kF32QuietNaN);
        to_device(status_->data(), &st, sizeof st);
        if (scaler) update_scaler(*scaler);
        return;
    }
    const float norm = static_cast<float>(std::sqrt(total));

    // 3. The clipped gradients back, and the kernel with factor 1 and no clipping.
    const bool clip = desc_.max_grad_norm > 0.0f;
    const float coef = clip ? adam::clip_coefficient(desc_.max_grad_norm, norm) : 1.0f;
    for (size_t q = 0; q < entries_.size(); ++q) {
        std::vector<float> &h = gs[q];
        if (clip)
            for (float &x : h) x = adam::fmul(x, coef);
        to_device(entries_[q].grad->data(), h.data(), h.size() * 4);
    }
    pull_metas();
    for (const Entry &e : entries_) {  // the private metas record the shard's amax alone
        if (!e.shard_meta) continue;
        const uint32_t zero = 0;
        to_device(reinterpret_cast<unsigned char *>(e.shard_meta->state()) + offsetof(ScalingState, amax_bits), &zero, 4);
    }
    in_shard_step_ = true;
    try {
        step(lr, lr_device, 1.0f, nullptr);
    } catch (...) {
        in_shard_step_ = false;
        throw;
    }
    in_shard_step_ = false;
    st = status();
    st.grad_norm = norm;  // the global norm, not the shard's
    to_device(status_->data(), &st, sizeof st);
    if (scaler) update_scaler(*scaler);

    // 4. The scaled parameters' amax, agreed, and their metas folded as the kernel's phase 3 does.
    std::vector<uint32_t> amax(entries_.size(), 0u);
    bool metas = false;
    std::vector<uint64_t> buf;
    auto read_state = [&](const ScalingMeta &m) -> ScalingState & {
        const size_t nb = meta_bytes(*ctx_, m);
        buf.assign((nb + 7) / 8, 0);
        to_host(buf.data(), m.state(), nb);
        return *reinterpret_cast<ScalingState *>(buf.data());
    };
    for (size_t q = 0; q < entries_.size(); ++q) {
        if (!entries_[q].shard_meta) continue;
        metas = true;
        ScalingState &s = read_state(*entries_[q].shard_meta);
        amax[q] = codec::f32_bits(s.history()[s.head]);  // fold_history put the shard's amax there
    }
    if (metas) {
        const std::vector<uint32_t> amaxes = exchange(amax);
        const size_t w = std::max<size_t>(1, entries_.size());
        for (size_t q = 0; q < entries_.size(); ++q) {
            const Entry &e = entries_[q];
            if (!e.full_meta) continue;
            uint32_t global = 0;
            for (int64_t r = 0; r < N; ++r) global = std::max(global, amaxes[static_cast<size_t>(r) * w + q]);
            ScalingState &s = read_state(*e.full_meta);
            s.amax_bits = std::max(s.amax_bits, global);
            const float slot = fold_on_host(s);
            to_device(e.full_meta->state(), buf.data(), meta_bytes(*ctx_, *e.full_meta));
            to_device(e.full_param->scale_inv(), &slot, sizeof slot);
        }
    }

    // 5. Every shard into its full parameter.
    gather_params(false);
}

}  // namespace fp8amp::core
