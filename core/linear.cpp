#include "linear.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "backend.hpp"  // kernels/backend.hpp
#include "kernels.hpp"
#include "struct_size.hpp"

namespace fp8amp::core {

namespace {

// The context's scratch slots (Context::scratch) and what the Linear keeps in them during a call.
constexpr size_t kScratchFp8 = 0;     // x8 (forward), dY8 (backward)
constexpr size_t kScratchFp8T = 1;    // dY8 transposed (backward)
constexpr size_t kScratchStage = 2;   // a staged GEMM output (y or dX)
constexpr size_t kScratchWeight = 3;  // a scaled F16 weight dequantized (forward), dY in BF16 (backward)
constexpr size_t kScratchColSum = 4;  // the bias gradient's partial column sums (backward)
// Lean Linears (fp8amp_linear_set_lean) only: the FP32 weight-gradient sum of a backward that does not
// accumulate; the FP8 weight of a training forward (and the row-major copy a backward's W8^T
// quantize writes beside it, before the sum is written).
constexpr size_t kScratchWgrad = 5;
constexpr size_t kScratchW8T = 6;  // lean: the backward's W8^T
static_assert(kScratchW8T < Context::kScratchSlots, "one slot each");

std::string shape_string(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// t's shape equals `shape` (compared in place: the per-call checks allocate nothing).
bool has_shape(const Tensor &t, const std::vector<int64_t> &shape) {
    return static_cast<size_t>(t.ndim()) == shape.size() && std::equal(shape.begin(), shape.end(), t.shape());
}

// y's shape is x's with the last extent replaced by n.
bool is_output_shape(const Tensor &x, const Tensor &y, int64_t n) {
    const int32_t d = x.ndim();
    return y.ndim() == d && std::equal(x.shape(), x.shape() + d - 1, y.shape()) && y.shape()[d - 1] == n;
}

fp8amp_recipe with_mode(fp8amp_recipe r, fp8amp_scaling_mode mode) {
    r.mode = mode;
    return r;
}

}  // namespace

// One GEMM of the layer, row-major D[m, n] = A[m, k] B[n, k]^T (see kernels::GemmArgs).
struct GemmCall {
    int64_t m, n, k;
    const void *a;
    fp8amp_dtype a_dtype;
    bool a_k_contiguous;
    const float *a_scale_inv;
    const void *b;
    fp8amp_dtype b_dtype;
    bool b_k_contiguous;
    const float *b_scale_inv;
    void *d;
    fp8amp_dtype d_dtype;
    bool accumulate;
    bool with_bias;
    bool fast_accum;
};

fp8amp_linear_desc Linear::default_desc() {
    fp8amp_linear_desc d{};
    d.struct_size = sizeof d;
    d.in_features = 0;
    d.out_features = 0;
    d.has_bias = 1;
    d.weight_dtype = FP8AMP_DTYPE_BF16;
    d.wgrad_dtype = FP8AMP_DTYPE_E4M3;
    d.recipe = default_recipe();
    d.policy = FP8AMP_GEMM_AUTO;
    d.graph_replay = 1;
    return d;
}

std::shared_ptr<Linear> Linear::create(std::shared_ptr<const Context> ctx, const fp8amp_linear_desc &caller_desc) {
    // A caller built against the first layout gets the defaults of the fields added since (graph_replay: 1).
    static_assert(kFirstLayout % alignof(fp8amp_linear_desc) == 0, "the first layout's size is its end");
    const fp8amp_linear_desc desc = read_sized(caller_desc, "desc", "fp8amp_linear_desc", "fp8amp_linear_desc_init_default",
                                               kFirstLayout, default_desc());
    // Beyond 2^31 - 1 features cuBLASLt's 32-bit dimensions give out; no real layer comes near.
    constexpr int64_t kMaxFeatures = (int64_t{1} << 31) - 1;
    if (desc.in_features < 1 || desc.in_features > kMaxFeatures)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->in_features " + std::to_string(desc.in_features) + " is outside 1..2^31-1");
    if (desc.out_features < 1 || desc.out_features > kMaxFeatures)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "desc->out_features " + std::to_string(desc.out_features) + " is outside 1..2^31-1");
    // No fp8amp_dtype at all is INVALID_ARGUMENT; a dtype the role cannot take, DTYPE_MISMATCH.
    check_dtype(desc.weight_dtype, "desc->weight_dtype");
    check_dtype(desc.wgrad_dtype, "desc->wgrad_dtype");
    switch (enum_value(desc.weight_dtype)) {
    case FP8AMP_DTYPE_F32: case FP8AMP_DTYPE_F16: case FP8AMP_DTYPE_BF16: case FP8AMP_DTYPE_E4M3: break;
    default:
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "desc->weight_dtype " + std::to_string(enum_value(desc.weight_dtype)) +
                                              " is not f32, f16, bf16 or e4m3");
    }
    switch (enum_value(desc.wgrad_dtype)) {
    case FP8AMP_DTYPE_F32: case FP8AMP_DTYPE_BF16: case FP8AMP_DTYPE_E4M3: break;
    default:
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "desc->wgrad_dtype " + std::to_string(enum_value(desc.wgrad_dtype)) +
                                              " is not e4m3, f32 or bf16");
    }
    const int32_t policy = enum_value(desc.policy);
    if (policy != FP8AMP_GEMM_AUTO && policy != FP8AMP_GEMM_ALWAYS_FP8 && policy != FP8AMP_GEMM_NEVER_FP8)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->policy " + std::to_string(policy) + " is unknown");
    // The recipe is embedded by value: its layout is frozen within FP8AMP_0 (docs/api.md 1.6), and a
    // struct_size other than its sizeof would have read_sized take the fields after it for its tail.
    if (desc.recipe.struct_size != sizeof(fp8amp_recipe))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->recipe.struct_size is " + std::to_string(desc.recipe.struct_size) +
                                                ", not the " + std::to_string(sizeof(fp8amp_recipe)) +
                                                " bytes of the fp8amp_recipe a fp8amp_linear_desc embeds "
                                                "(initialize it with fp8amp_recipe_init_default)");
    const fp8amp_recipe recipe = validate_recipe(desc.recipe);
    if (desc.graph_replay != 0 && desc.graph_replay != 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->graph_replay " + std::to_string(desc.graph_replay) + " is not 0 or 1");

    std::shared_ptr<Linear> lin(new Linear());
    lin->desc_ = desc;
    lin->desc_.recipe = recipe;
    lin->ctx_ = ctx;
    lin->forward_replay_ = GraphReplay(desc.graph_replay != 0);
    lin->backward_replay_ = GraphReplay(desc.graph_replay != 0);
    lin->wide_dtype_ = ctx->backend().wide_gemm_dtype();
    lin->fp8_unsupported_ = ctx->backend().fp8_gemm_unsupported_reason();
    const fp8amp_dtype grad_dtype = recipe.format == FP8AMP_FORMAT_HYBRID ? FP8AMP_DTYPE_E5M2 : FP8AMP_DTYPE_E4M3;
    // Inputs and output gradients follow the recipe; the weight and its gradient are quantized once
    // per step from their exact values, so they use current scaling (no stale scale on a fresh weight).
    lin->input_meta_ = std::make_shared<ScalingMeta>(ctx, recipe, FP8AMP_DTYPE_E4M3);
    lin->weight_meta_ = std::make_shared<ScalingMeta>(ctx, with_mode(recipe, FP8AMP_SCALING_CURRENT), FP8AMP_DTYPE_E4M3);
    lin->grad_output_meta_ = std::make_shared<ScalingMeta>(ctx, recipe, grad_dtype);
    if (desc.wgrad_dtype == FP8AMP_DTYPE_E4M3) {
        if (recipe.mode == FP8AMP_SCALING_DELAYED) {
            // Under a delayed recipe the E4M3 weight gradient uses delayed scaling too (issue 19): the
            // scale comes from the amax history of earlier backwards, and the quantize that writes the
            // gradient records this one's amax in the same pass -- no amax pass over the FP32 sum,
            // which cost as much as the quantize. The Linear updates this meta itself after every
            // backward (interval 1); the first backward fits the scale to its own amax first (one amax
            // pass, once). Saturations are counted (statistics on): an amax that outgrew the history
            // saturates at 448, and is never silent. Under a current recipe (deterministic, and
            // resumable from a checkpoint, which holds no meta history) it stays current scaling.
            fp8amp_recipe wr = recipe;
            wr.interval = 1;
            lin->wgrad_meta_ = std::make_shared<ScalingMeta>(ctx, wr, FP8AMP_DTYPE_E4M3);
            lin->wgrad_meta_->enable_stats(true);
        } else {
            lin->wgrad_meta_ =
                std::make_shared<ScalingMeta>(ctx, with_mode(recipe, FP8AMP_SCALING_CURRENT), FP8AMP_DTYPE_E4M3);
        }
    }

    const int64_t n = desc.out_features, k = desc.in_features;
    const int64_t w_shape[2] = {n, k};
    auto zeros = [&](const std::shared_ptr<Tensor> &t) {
        std::vector<unsigned char> z(t->nbytes(), 0);
        t->copy_from_host(z.data(), z.size());
    };
    lin->weight_ = Tensor::create(ctx, desc.weight_dtype, 2, w_shape);
    zeros(lin->weight_);
    // A weight stored scaled (E4M3 for O3, scaled F16 for MS-AMP's O1/O2 FP16 weights) is bound to a
    // meta with delayed scaling: its writer -- the optimizer -- writes with the meta's scale and records
    // the new amax, which gives the next step's scale (the optimizer refuses current-scaling metas).
    // For an E4M3 weight that meta is also the WEIGHT meta: the weight is its own FP8 copy.
    if (desc.weight_dtype == FP8AMP_DTYPE_E4M3 || desc.weight_dtype == FP8AMP_DTYPE_F16) {
        lin->weight_storage_meta_ =
            std::make_shared<ScalingMeta>(ctx, with_mode(recipe, FP8AMP_SCALING_DELAYED), desc.weight_dtype);
        lin->weight_->set_scaling(lin->weight_storage_meta_);
        if (desc.weight_dtype == FP8AMP_DTYPE_E4M3) lin->weight_meta_ = lin->weight_storage_meta_;
    }
    lin->weight_grad_ = Tensor::create(ctx, desc.wgrad_dtype, 2, w_shape);
    zeros(lin->weight_grad_);
    if (lin->wgrad_meta_) lin->weight_grad_->set_scaling(lin->wgrad_meta_);
    if (desc.has_bias) {
        lin->bias_ = Tensor::create(ctx, FP8AMP_DTYPE_F32, 1, &n);
        zeros(lin->bias_);
        lin->bias_grad_ = Tensor::create(ctx, FP8AMP_DTYPE_F32, 1, &n);
        zeros(lin->bias_grad_);
    }
    // The tensors handed out are the Linear's: unbinding the E4M3 weight gradient (or binding it
    // elsewhere) would leave the backward quantizing without its meta, unbinding a scaled weight would
    // make the Linear read its codes unscaled. Refusing such calls (set_owner) is cheaper than
    // re-checking every binding on every call. The owners' names go into the refusal messages.
    lin->weight_->set_owner("a Linear's weight");
    lin->weight_grad_->set_owner("a Linear's weight gradient");
    if (lin->bias_) {
        lin->bias_->set_owner("a Linear's bias");
        lin->bias_grad_->set_owner("a Linear's bias gradient");
    }
    return lin;
}

Linear::~Linear() {
    for (const auto *t : {&weight_, &bias_, &weight_grad_, &bias_grad_})
        if (*t) (*t)->set_owner(nullptr);
}

const std::shared_ptr<Tensor> &Linear::bias() const {
    if (!bias_) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "this Linear has no bias (desc.has_bias was 0)");
    return bias_;
}

const std::shared_ptr<Tensor> &Linear::bias_grad() const {
    if (!bias_grad_) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "this Linear has no bias (desc.has_bias was 0)");
    return bias_grad_;
}

std::shared_ptr<ScalingMeta> Linear::scaling(int32_t role) const {
    switch (role) {
    case FP8AMP_ROLE_INPUT: return input_meta_;
    case FP8AMP_ROLE_WEIGHT: return weight_meta_;
    case FP8AMP_ROLE_GRAD_OUTPUT: return grad_output_meta_;
    case FP8AMP_ROLE_WEIGHT_GRAD:
        if (!wgrad_meta_)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "this Linear's weight gradient is not e4m3, so it has no scaling meta");
        return wgrad_meta_;
    case FP8AMP_ROLE_WEIGHT_STORAGE:
        if (!weight_storage_meta_)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "this Linear's weight is " + weight_->describe() +
                                                    ": only f16 and e4m3 weights are bound to a scaling meta");
        return weight_storage_meta_;
    }
    fail(FP8AMP_ERROR_INVALID_ARGUMENT, "role " + std::to_string(role) + " is unknown");
}

Tensor &Linear::buffer(std::shared_ptr<Tensor> &slot, fp8amp_dtype dtype, int64_t rows, int64_t cols,
                       const std::shared_ptr<ScalingMeta> &meta) {
    if (!slot || slot->dtype() != dtype || slot->shape()[0] != rows || slot->shape()[1] != cols) {
        slot.reset();  // give the old memory back before asking for the new
        const int64_t shape[2] = {rows, cols};
        // Stored only once bound: binding allocates too (the scale_inv slot), and a tensor left in the
        // slot unbound would be taken as ready by the next call (a quantize without a meta, a GEMM
        // reading a missing scale_inv: a crash or silently wrong weight gradients).
        std::shared_ptr<Tensor> made = Tensor::create(ctx_, dtype, 2, shape);
        if (meta) made->set_scaling(meta);
        slot = std::move(made);
        note_stream();
    }
    return *slot;
}

// Records the stream the Linear's buffers are used on (see release_buffers).
void Linear::note_stream() {
    void *const stream = ctx_->stream();
    if (buffers_stream_ && buffers_stream_ != stream) buffers_crossed_ = true;
    buffers_stream_ = stream;
}

// What the Linear keeps between calls is needed only from a training forward to its backward (the
// saved input, the weight's transposed FP8 copy or wide copy the backward reads) and across the
// backwards of one accumulation window (the FP32 weight-gradient sum); the weight and bias copies are
// a cache the optimizer's update makes stale anyway. At a step boundary all of it can go back (issue
// 18 point 3: at rest a Linear holds its parameters and gradients). A forward still awaiting its
// backward keeps what that backward reads. Freeing is asynchronous, in the order of the stream the
// block was allocated on (a stream-ordered allocator such as torch's hands it out again only after
// the work queued there; the CUDA backend's own cudaFree waits for the device); a buffer used on
// another stream since may still be read there, so then the host waits for the device first (rare:
// the context's stream changed).
void Linear::release_buffers() {
    if (buffers_crossed_) ctx_->synchronize();
    buffers_crossed_ = false;
    buffers_stream_ = nullptr;
    if (!saved_) {
        x8t_.reset();
        x_wide_.reset();
        w8_.reset();
        w8t_.reset();
        w_wide_.reset();
        weight_fp8_version_ = kStale;
        weight_fp8t_valid_ = false;
        weight_wide_version_ = kStale;
    }
    bias_cast_.reset();
    bias_f32_.reset();
    bias_cast_version_ = kStale;
    bias_f32_version_ = kStale;
    if (wgrad_acc_) {
        // An accumulating backward after this adds to the delivered gradient's value (backward()).
        wgrad_sum_released_ = wgrad_sum_released_ || wgrad_sum_valid_;
        wgrad_acc_.reset();
        wgrad_sum_valid_ = false;
    }
    // The CPU kernels' host scratch (grown again, before any step runs, by the next call).
    std::vector<float>().swap(cpu_scratch_);
}

size_t Linear::memory_bytes() const {
    size_t total = 0;
    for (const std::shared_ptr<Tensor> *t : {&weight_, &bias_, &weight_grad_, &bias_grad_, &w8_, &w8t_, &x8t_,
                                             &x8t_pending_, &x_wide_, &x_wide_pending_, &w_wide_, &bias_cast_,
                                             &bias_f32_, &wgrad_acc_})
        if (*t) total += (*t)->nbytes() + ((*t)->scale_inv() ? sizeof(float) : 0);  // + its scale slot
    return total;
}

Tensor &Linear::saved_buffer(std::shared_ptr<Tensor> &slot, std::shared_ptr<Tensor> &pending, fp8amp_dtype dtype,
                             int64_t rows, int64_t cols, const std::shared_ptr<ScalingMeta> &meta) {
    const bool fits = slot && slot->dtype() == dtype && slot->shape()[0] == rows && slot->shape()[1] == cols;
    // Without a saved forward the old memory goes back before the new is asked for (buffer()); with
    // one, both are held for the length of the call (the price of keeping it should the call fail).
    if (fits || !saved_) return buffer(slot, dtype, rows, cols, meta);
    return buffer(pending, dtype, rows, cols, meta);
}

// Every host allocation of the call happens before its first step runs: the CPU kernels' scratch
// here, the cuBLASLt plans and the replay's bookkeeping in GraphReplay::run. Once a step ran (a
// quantize records its amax into a meta, the GEMMs write the outputs), a std::bad_alloc could no
// longer leave the call's state unchanged (issue 22).
void Linear::run_steps(GraphReplay &replay, bool *launched) {
    const size_t need = steps_.host_scratch_floats(ctx_->backend());
    if (cpu_scratch_.size() < need) {
        std::vector<float>().swap(cpu_scratch_);  // the old block goes back first
        cpu_scratch_.resize(need);
    }
    replay.run(*ctx_, steps_, cpu_scratch_.data(), launched);
}

Tensor &Linear::scratch(std::shared_ptr<Tensor> &slot, size_t pool_slot, fp8amp_dtype dtype, int64_t rows,
                        int64_t cols, const std::shared_ptr<ScalingMeta> &meta) {
    const size_t nbytes = static_cast<size_t>(rows) * static_cast<size_t>(cols) * fp8amp_dtype_size(dtype);
    void *data = ctx_->scratch(pool_slot, nbytes);
    if (!slot || slot->data() != data || slot->dtype() != dtype || slot->shape()[0] != rows ||
        slot->shape()[1] != cols) {
        slot.reset();
        const int64_t shape[2] = {rows, cols};
        // the context's memory: not owned by the view. Stored only once bound, as in buffer().
        std::shared_ptr<Tensor> made = Tensor::wrap(ctx_, dtype, 2, shape, data);
        if (meta) made->set_scaling(meta);
        slot = std::move(made);
    }
    return *slot;
}

fp8amp_gemm_kind Linear::choose_kind(int64_t m, bool training, const Tensor &y) const {
    (void)y;
    // The non-FP8 GEMMs run in the backend's wide dtype (CUDA: BF16; CPU: F32).
    const fp8amp_gemm_kind wide = wide_dtype_ == FP8AMP_DTYPE_BF16 ? FP8AMP_GEMM_KIND_BF16 : FP8AMP_GEMM_KIND_F32;
    if (desc_.policy == FP8AMP_GEMM_NEVER_FP8) return wide;
    const kernels::Backend &backend = ctx_->backend();
    const int64_t n = desc_.out_features, k = desc_.in_features;
    std::string why = fp8_unsupported_;
    if (why.empty()) why = backend.fp8_gemm_shape_unsupported_reason(m, n, k, training);
    if (!why.empty()) {
        if (desc_.policy == FP8AMP_GEMM_ALWAYS_FP8) fail(FP8AMP_ERROR_NOT_SUPPORTED, why + " (policy ALWAYS_FP8)");
        return wide;
    }
    if (desc_.policy == FP8AMP_GEMM_ALWAYS_FP8) return FP8AMP_GEMM_KIND_FP8;
    // The CPU backend exists for FP8 numerics, not speed: AUTO runs FP8 there for any shape; on CUDA
    // from the size where FP8 beats BF16.
    return backend.fp8_gemm_pays_off(m, n, k) ? FP8AMP_GEMM_KIND_FP8 : wide;
}

fp8amp_gemm_kind Linear::choose_gemm(int64_t m, bool training) const {
    if (m < 1) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "rows is " + std::to_string(m) + ": a forward has at least one row");
    return choose_kind(m, training, *weight_);  // (choose_kind does not read its y)
}

// The weight's E4M3 copy (and its transpose), re-made only when the weight was written since.
// transient (a lean training forward): the copy the forward GEMM reads is made in the context's
// scratch, shared by all Linears, without the transpose (the lean backward makes W8^T itself, see
// lean_weight_fp8t), and nothing is cached: re-made at every such forward, one quantize of the weight
// more where it did not change since (a second micro-batch, a layer used twice); at a step's first
// forward the optimizer's update made any copy stale anyway.
const Tensor &Linear::refresh_weight_fp8(bool need_transpose, bool transient) {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    const uint64_t version = weight_->version();
    if (desc_.weight_dtype == FP8AMP_DTYPE_E4M3) {  // the weight is its own FP8 copy; only the transpose
        if (need_transpose && !transient && !(weight_fp8t_valid_ && weight_fp8_version_ == version)) {
            Tensor &wt = buffer(w8t_, FP8AMP_DTYPE_E4M3, k, n);
            steps_.transpose_bytes(weight_->data(), wt.data(), static_cast<size_t>(n), static_cast<size_t>(k));
            wt.mark_written();
            weight_fp8t_valid_ = true;
            weight_fp8_version_ = version;
        }
        return *weight_;
    }
    if (!transient && weight_fp8_version_ == version && (weight_fp8t_valid_ || !need_transpose)) return *w8_;
    const void *src = weight_->data();
    fp8amp_dtype src_dtype = weight_->dtype();
    if (weight_->scaling()) {  // a scaled 16-bit weight: its true value first
        Tensor &w32 = scratch(w_f32_, kScratchWeight, FP8AMP_DTYPE_F32, n, k);
        steps_.dequantize(*weight_, w32.data(), FP8AMP_DTYPE_F32);
        w32.mark_written();
        src = w32.data();
        src_dtype = FP8AMP_DTYPE_F32;
    }
    if (transient) {
        w8_.reset();  // a kept copy (an inference forward's) is not kept through training
        Tensor &w8 = scratch(w8s_, kScratchWgrad, FP8AMP_DTYPE_E4M3, n, k, weight_meta_);
        quantize(src, src_dtype, static_cast<size_t>(n), static_cast<size_t>(k), w8, nullptr);
        weight_fp8_version_ = kStale;
        weight_fp8t_valid_ = false;
        return w8;
    }
    Tensor &w8 = buffer(w8_, FP8AMP_DTYPE_E4M3, n, k, weight_meta_);
    Tensor *w8t = need_transpose ? &buffer(w8t_, FP8AMP_DTYPE_E4M3, k, n, weight_meta_) : nullptr;
    quantize(src, src_dtype, static_cast<size_t>(n), static_cast<size_t>(k), w8, w8t);
    weight_fp8_version_ = version;
    weight_fp8t_valid_ = need_transpose;
    return w8;
}

// A lean backward's W8^T (for the dX GEMM), made from the weight as the forward's W8 was -- the same
// bits: the weight is unchanged since (backward() checks) and its WEIGHT meta is current scaling, so
// the scale is the weight's amax again -- in the context's scratch (slot kScratchW8T; the row-major
// copy the quantize also writes goes to slot kScratchWgrad, which backward() has already asked for
// the weight-gradient sum at its full size, so no slot grows after it was described). An E4M3
// weight's is a transpose of its codes. What this saves is the forward keeping W8^T (1 byte per
// parameter of every layer not yet backed) through the backward of the layers after it; what it
// costs is one quantize of the weight per backward.
const Tensor &Linear::lean_weight_fp8t() {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    if (desc_.weight_dtype == FP8AMP_DTYPE_E4M3) {
        Tensor &wt = scratch(w8ts_, kScratchW8T, FP8AMP_DTYPE_E4M3, k, n);
        steps_.transpose_bytes(weight_->data(), wt.data(), static_cast<size_t>(n), static_cast<size_t>(k));
        wt.mark_written();
        return wt;
    }
    const void *src = weight_->data();
    fp8amp_dtype src_dtype = weight_->dtype();
    if (weight_->scaling()) {
        Tensor &w32 = scratch(w_f32_, kScratchWeight, FP8AMP_DTYPE_F32, n, k);
        steps_.dequantize(*weight_, w32.data(), FP8AMP_DTYPE_F32);
        w32.mark_written();
        src = w32.data();
        src_dtype = FP8AMP_DTYPE_F32;
    }
    Tensor &w8 = scratch(w8s_, kScratchWgrad, FP8AMP_DTYPE_E4M3, n, k, weight_meta_);
    Tensor &wt = scratch(w8ts_, kScratchW8T, FP8AMP_DTYPE_E4M3, k, n, weight_meta_);
    quantize(src, src_dtype, static_cast<size_t>(n), static_cast<size_t>(k), w8, &wt);
    return wt;
}

// The weight in the non-FP8 GEMMs' operand dtype (the weight itself when it already is).
void Linear::refresh_weight_wide() {
    if (weight_->dtype() == wide_dtype_ && !weight_->scaling()) return;
    const uint64_t version = weight_->version();
    if (w_wide_ && weight_wide_version_ == version) return;
    Tensor &ww = buffer(w_wide_, wide_dtype_, desc_.out_features, desc_.in_features);
    if (weight_->scaling())
        steps_.dequantize(*weight_, ww.data(), ww.dtype());
    else
        steps_.cast(weight_->data(), weight_->dtype(), ww.data(), ww.dtype(), static_cast<size_t>(ww.numel()));
    ww.mark_written();
    weight_wide_version_ = version;
}

const Tensor *Linear::bias_for(fp8amp_dtype bias_dtype) {
    if (bias_dtype == FP8AMP_DTYPE_F32) return bias_.get();
    const int64_t n = desc_.out_features;
    if (!bias_cast_ || bias_cast_->dtype() != bias_dtype || bias_cast_version_ != bias_->version()) {
        if (!bias_cast_ || bias_cast_->dtype() != bias_dtype) {
            bias_cast_.reset();
            bias_cast_ = Tensor::create(ctx_, bias_dtype, 1, &n);
        }
        steps_.cast(bias_->data(), FP8AMP_DTYPE_F32, bias_cast_->data(), bias_dtype, static_cast<size_t>(n));
        bias_cast_->mark_written();
        bias_cast_version_ = bias_->version();
    }
    return bias_cast_.get();
}

void Linear::run_gemm(const GemmCall &c) {
    const bool fp8 = is_fp8(c.a_dtype);
    kernels::GemmArgs g;
    g.m = c.m;
    g.n = c.n;
    g.k = c.k;
    g.a = {c.a, c.a_dtype, c.a_scale_inv, c.a_k_contiguous};
    g.b = {c.b, c.b_dtype, c.b_scale_inv, c.b_k_contiguous};
    g.accumulate = c.accumulate;
    g.fast_accum = c.fast_accum;
    const kernels::Backend &backend = ctx_->backend();
    // The backend's GEMM may want outputs aligned (cuBLASLt: 16 bytes): a misaligned output is made
    // in an aligned buffer of its own dtype (same numerics, bias included) and copied. It may not
    // write some dtypes from these operands (cuBLASLt's 16-bit GEMMs have no F16 output for BF16
    // operands): that output is made in F32 and rounded once to F16, with the bias rounded to F16
    // first, as on the CPU.
    const bool misaligned = reinterpret_cast<uintptr_t>(c.d) % backend.gemm_output_alignment() != 0;
    const bool f16_from_bf16 = backend.gemm_needs_f32_output(fp8, wide_dtype_, c.d_dtype);
    const bool stage = !c.accumulate && (f16_from_bf16 || misaligned);
    const fp8amp_dtype stage_dtype = f16_from_bf16 ? FP8AMP_DTYPE_F32 : c.d_dtype;
    Tensor *staging = stage ? &scratch(out_stage_, kScratchStage, stage_dtype, c.m, c.n) : nullptr;
    g.d = stage ? staging->data() : c.d;
    g.d_dtype = stage ? stage_dtype : c.d_dtype;
    if (c.with_bias && bias_) {
        const fp8amp_dtype bias_dtype = kernels::bias_dtype_for(fp8, c.d_dtype);
        const Tensor *bias = bias_for(bias_dtype);
        if (f16_from_bf16) {  // the F16-rounded bias, held in F32 for the F32 epilogue (made once per bias)
            Tensor &b32 = buffer(bias_f32_, FP8AMP_DTYPE_F32, 1, desc_.out_features);
            if (bias_f32_version_ != bias_->version()) {
                steps_.cast(bias->data(), bias->dtype(), b32.data(), FP8AMP_DTYPE_F32,
                            static_cast<size_t>(desc_.out_features));
                b32.mark_written();
                bias_f32_version_ = bias_->version();
            }
            bias = &b32;
        }
        g.bias = bias->data();
        g.bias_dtype = bias->dtype();
    }
    if (backend.gemm_workspace_bytes() != 0) {  // cuBLASLt's workspace, from the context's allocator
        Storage &ws = ctx_->gemm_workspace();
        steps_.gemm(g, ws.data(), ws.nbytes());
    } else {
        steps_.gemm(g, nullptr, 0);
    }
    if (stage) steps_.cast(staging->data(), stage_dtype, c.d, c.d_dtype, static_cast<size_t>(c.m * c.n));
}

void Linear::quantize(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, Tensor &dst, Tensor *dst_t) {
    steps_.quantize(src, src_dtype, rows, cols, dst, dst_t);
    dst.mark_written();
    if (dst_t) dst_t->mark_written();
}

// Undoes the cache bookkeeping of a forward that failed: describing a forward's work records the
// copies it will make (weight FP8/BF16, bias casts) as fresh before they are launched, so after a
// failure (an allocation while describing, a launch) no cached copy is trusted. The saved forward
// survives a failure before the first step was launched: what a backward reads (x8t_ / x_wide_,
// w8t_, the saved shapes, kind_) was not written, the buffers re-made for a new shape wait in the
// pending slots (dropped here). Once steps were launched (a CUDA launch that failed) they may have
// overwritten it: nothing is left for a backward then.
struct Linear::FailureGuard {
    Linear &lin;
    bool launched = false;
    bool done = false;
    ~FailureGuard() {
        if (done) return;
        lin.weight_changed();
        lin.weight_fp8t_valid_ = false;
        lin.x8t_pending_.reset();
        lin.x_wide_pending_.reset();
        if (launched) lin.saved_ = false;
    }
};

// Refuses an argument whose memory is one of this Linear's tensors that the call reads while writing
// the argument, or writes while reading it: the result would depend on the order of the steps (on
// CUDA, a race).
void Linear::check_not_own(const Tensor &t, const char *argument,
                           std::initializer_list<std::pair<const Tensor *, const char *>> own) const {
    for (const auto &[mine, name] : own)
        if (mine && t.overlaps(*mine))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " overlaps this Linear's " + name +
                                                    " in memory, which the call also reads or writes");
}

// The checks both forwards make of x (or x8) and y; returns M, the rows of x.
int64_t Linear::check_forward_args(const Tensor &x, const char *x_name, const Tensor &y) const {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    check_on_device(*ctx_, x, x_name);
    check_on_device(*ctx_, y, "y");
    if (x.ndim() < 1 || x.shape()[x.ndim() - 1] != k)
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(x_name) + " is " + x.describe() + " but this Linear takes [..., " +
                                              std::to_string(k) + "] (in_features)");
    if (!is_output_shape(x, y, n)) {
        std::vector<int64_t> y_shape(x.shape(), x.shape() + x.ndim());
        y_shape.back() = n;
        fail(FP8AMP_ERROR_SHAPE_MISMATCH, "y is " + y.describe() + " but " + x_name + " " + x.describe() + " gives y " +
                                              shape_string(y_shape));
    }
    const int64_t m = x.numel() / k;
    if (m == 0) fail(FP8AMP_ERROR_SHAPE_MISMATCH, std::string(x_name) + " is " + x.describe() + ": it holds no rows");
    check_writable(y, "y");
    if (x.overlaps(y)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(x_name) + " and y overlap in memory");
    // The GEMM that writes y reads the weight (or a copy made from it in the same call) and the bias.
    check_not_own(y, "y", {{weight_.get(), "weight"}, {bias_.get(), "bias"}});
    return m;
}

void Linear::forward(const Tensor &x, Tensor &y, bool training) {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    check_wide(x, "x");
    check_wide(y, "y");
    const int64_t m = check_forward_args(x, "x", y);
    const fp8amp_gemm_kind kind = choose_kind(m, training, y);
    FailureGuard guard{*this};
    steps_.clear();
    note_stream();
    if (kind == FP8AMP_GEMM_KIND_FP8) {
        const Tensor &w8 = refresh_weight_fp8(training, lean_ != 0 && training);
        Tensor &x8 = scratch(x8_, kScratchFp8, FP8AMP_DTYPE_E4M3, m, k, input_meta_);
        Tensor *x8t = training ? &saved_buffer(x8t_, x8t_pending_, FP8AMP_DTYPE_E4M3, k, m, input_meta_) : nullptr;
        quantize(x.data(), x.dtype(), static_cast<size_t>(m), static_cast<size_t>(k), x8, x8t);
        run_gemm({m, n, k, x8.data(), FP8AMP_DTYPE_E4M3, true, x8.scale_inv(), w8.data(), FP8AMP_DTYPE_E4M3, true,
                  w8.scale_inv(), y.data(), y.dtype(), false, true, true});
    } else {
        refresh_weight_wide();
        const Tensor &ww = w_wide_ && (weight_->dtype() != wide_dtype_ || weight_->scaling()) ? *w_wide_ : *weight_;
        const void *xw = x.data();
        if (training || x.dtype() != wide_dtype_) {  // training keeps its own copy of x for backward
            Tensor &copy = saved_buffer(x_wide_, x_wide_pending_, wide_dtype_, m, k);
            steps_.cast(x.data(), x.dtype(), copy.data(), wide_dtype_, static_cast<size_t>(m * k));
            copy.mark_written();
            xw = copy.data();
        }
        run_gemm({m, n, k, xw, wide_dtype_, true, nullptr, ww.data(), wide_dtype_, true, nullptr, y.data(), y.dtype(),
                  false, true, false});
    }
    finish_forward(x, y, training, kind, m, guard);
}

// An input the caller quantized (a fused norm or activation wrote it): the same FP8 path as forward's
// less the quantize of x. Training keeps x8's transpose (a byte transpose into the Linear's own saved
// buffer) and x8's scale_inv beside it, so the backward reads nothing of the caller's.
void Linear::forward_fp8(const Tensor &x8, Tensor &y, bool training) {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    if (x8.dtype() != FP8AMP_DTYPE_E4M3)
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, "x8 is " + x8.describe() +
                                              ": fp8amp_linear_forward_fp8 takes an E4M3 input (fp8amp_linear_forward "
                                              "takes f32, f16 and bf16 ones)");
    check_wide(y, "y");
    const int64_t m = check_forward_args(x8, "x8", y);
    if (!x8.scale_inv())
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "x8 " + x8.describe() +
                                                " has no scale_inv: it was never bound to a scaling meta (bind it, "
                                                "e.g. to this Linear's INPUT meta, and quantize into it)");
    if (desc_.policy == FP8AMP_GEMM_NEVER_FP8)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "this Linear's policy is NEVER_FP8: it runs no FP8 GEMM, so it takes no FP8 input (use fp8amp_linear_forward)");
    // The input is FP8 already: AUTO's choice of BF16 for small shapes (speed) does not apply, but a
    // shape or GPU FP8 GEMMs cannot take is refused as under ALWAYS_FP8.
    std::string why = fp8_unsupported_;
    if (why.empty()) why = ctx_->backend().fp8_gemm_shape_unsupported_reason(m, n, k, training);
    if (!why.empty()) fail(FP8AMP_ERROR_NOT_SUPPORTED, why + " (an FP8 input needs an FP8 GEMM)");
    FailureGuard guard{*this};
    steps_.clear();
    note_stream();
    const Tensor &w8 = refresh_weight_fp8(training, lean_ != 0 && training);
    if (training) {
        Tensor &x8t = saved_buffer(x8t_, x8t_pending_, FP8AMP_DTYPE_E4M3, k, m, input_meta_);
        steps_.transpose_bytes(x8.data(), x8t.data(), static_cast<size_t>(m), static_cast<size_t>(k));
        steps_.cast(x8.scale_inv(), FP8AMP_DTYPE_F32, x8t.scale_inv(), FP8AMP_DTYPE_F32, 1);
        x8t.mark_written();
    }
    run_gemm({m, n, k, x8.data(), FP8AMP_DTYPE_E4M3, true, x8.scale_inv(), w8.data(), FP8AMP_DTYPE_E4M3, true,
              w8.scale_inv(), y.data(), y.dtype(), false, true, true});
    finish_forward(x8, y, training, FP8AMP_GEMM_KIND_FP8, m, guard);
}

// Runs a described forward and keeps what its backward needs (both forwards).
void Linear::finish_forward(const Tensor &x, Tensor &y, bool training, fp8amp_gemm_kind kind, int64_t m,
                            FailureGuard &guard) {
    // The saved shapes' memory before anything runs: assign() below must not allocate.
    saved_x_shape_.reserve(static_cast<size_t>(x.ndim()));
    saved_y_shape_.reserve(static_cast<size_t>(y.ndim()));
    run_steps(forward_replay_, &guard.launched);
    guard.done = true;
    y.mark_written();
    kind_ = kind;
    if (x8t_pending_) x8t_ = std::move(x8t_pending_);  // the saved forward is this one's now
    if (x_wide_pending_) x_wide_ = std::move(x_wide_pending_);
    saved_ = training;  // an inference forward leaves none
    if (training) {
        saved_lean_ = lean_ != 0;
        saved_weight_version_ = weight_->version();
        weight_written_since_forward_ = false;
        saved_m_ = m;
        saved_x_shape_.assign(x.shape(), x.shape() + x.ndim());  // reuses the vectors' memory
        saved_y_shape_.assign(y.shape(), y.shape() + y.ndim());
    }
}

void Linear::backward(const Tensor &dy, Tensor *dx, bool accumulate) {
    const int64_t n = desc_.out_features, k = desc_.in_features;
    if (!saved_)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "no training forward (fp8amp_linear_forward with training = 1) since the last backward");
    check_wide(dy, "dy");
    if (dx) check_wide(*dx, "dx");
    check_on_device(*ctx_, dy, "dy");
    if (dx) check_on_device(*ctx_, *dx, "dx");
    if (!has_shape(dy, saved_y_shape_))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH,
             "dy is " + dy.describe() + " but the forward's y was " + shape_string(saved_y_shape_));
    if (dx && !has_shape(*dx, saved_x_shape_))
        fail(FP8AMP_ERROR_SHAPE_MISMATCH,
             "dx is " + dx->describe() + " but the forward's x was " + shape_string(saved_x_shape_));
    if (dx) {
        check_writable(*dx, "dx");
        if (dy.overlaps(*dx)) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "dy and dx overlap in memory");
        // dX's GEMM may read the weight itself; the gradients are written by the same call.
        check_not_own(*dx, "dx",
                      {{weight_.get(), "weight"}, {weight_grad_.get(), "weight gradient"}, {bias_grad_.get(), "bias gradient"}});
    }
    // dy is read while the gradients are written (the bias gradient's column sums, fused into dY's
    // quantize on the FP8 path, a pass of their own after the weight gradient on the wide path).
    check_not_own(dy, "dy", {{weight_grad_.get(), "weight gradient"}, {bias_grad_.get(), "bias gradient"}});
    // A lean forward kept no FP8 copy of the weight: the backward's dX GEMM re-makes W8^T from the
    // weight, which must still be the one the forward read (else dX would silently use another).
    const bool remake_w8t = saved_lean_ && kind_ == FP8AMP_GEMM_KIND_FP8 && dx;
    if (remake_w8t && (weight_written_since_forward_ || weight_->version() != saved_weight_version_))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "the weight was written since the training forward, and this Linear is lean "
             "(fp8amp_linear_set_lean): its backward re-makes the weight's FP8 copy from the weight, so it "
             "would not back that forward. Run the training forward again, or write the weight after the backward");
    const int64_t m = saved_m_;
    const bool e4m3_weight = desc_.weight_dtype == FP8AMP_DTYPE_E4M3;
    // The weight gradient is summed in FP32: into weight_grad itself when it is F32, else into the
    // Linear's FP32 buffer, from which the delivered E4M3/BF16 tensor is re-made below.
    const bool direct_wgrad = desc_.wgrad_dtype == FP8AMP_DTYPE_F32;
    // No failure guard here: describing a backward records no cache as fresh and touches nothing the
    // forward saved (x8t / the wide x, w8t), so a backward that fails (out of memory while describing)
    // leaves the saved forward for a retry, as "a failed call changes nothing" promises.
    steps_.clear();
    note_stream();
    // Lean level 2, a backward that does not accumulate sums in the context's scratch and keeps no
    // sum: the same bits now, and a later accumulating backward starts from the delivered gradient.
    const bool scratch_sum = lean_ >= 2 && !direct_wgrad && !accumulate;
    Tensor &wsum = direct_wgrad ? *weight_grad_
                   : scratch_sum ? scratch(wsum_s_, kScratchWgrad, FP8AMP_DTYPE_F32, n, k)
                                 : buffer(wgrad_acc_, FP8AMP_DTYPE_F32, n, k);
    // release_buffers gave the sum back (or a lean backward kept none): accumulating starts from the
    // delivered gradient's value (its E4M3 codes dequantized, its BF16 values widened), the one
    // rounding more a given-back sum costs.
    const bool reload = accumulate && !direct_wgrad && wgrad_sum_released_;
    if (reload) {
        if (desc_.wgrad_dtype == FP8AMP_DTYPE_E4M3)
            steps_.dequantize(*weight_grad_, wsum.data(), FP8AMP_DTYPE_F32);
        else
            steps_.cast(weight_grad_->data(), weight_grad_->dtype(), wsum.data(), FP8AMP_DTYPE_F32,
                        static_cast<size_t>(n * k));
        wsum.mark_written();
    }
    // The FP32 buffer holds a sum only once a backward into it ran: one made by a backward that then
    // failed holds garbage, so accumulating into it is overwriting it.
    const bool add = accumulate && (direct_wgrad || wgrad_sum_valid_ || reload);

    if (kind_ == FP8AMP_GEMM_KIND_FP8) {
        const fp8amp_dtype gdtype = grad_output_meta_->dtype();
        Tensor &dy8 = scratch(dy8_, kScratchFp8, gdtype, m, n, grad_output_meta_);
        Tensor &dy8t = scratch(dy8t_, kScratchFp8T, gdtype, n, m, grad_output_meta_);
        // The bias gradient is summed in the pass that quantizes and transposes dY (no second read of
        // dY): kernels.hpp's fixed order, the same bits on both backends.
        float *bias_partial = nullptr;
        if (bias_grad_) {
            const size_t floats = kernels::column_sum_partial_floats(static_cast<size_t>(m), static_cast<size_t>(n));
            bias_partial = static_cast<float *>(scratch(colsum_scratch_, kScratchColSum, FP8AMP_DTYPE_F32,
                                                        static_cast<int64_t>(floats / static_cast<size_t>(n)), n)
                                                    .data());
        }
        steps_.quantize(dy.data(), dy.dtype(), static_cast<size_t>(m), static_cast<size_t>(n), dy8, &dy8t,
                        bias_grad_ ? static_cast<float *>(bias_grad_->data()) : nullptr, accumulate, bias_partial);
        dy8.mark_written();
        dy8t.mark_written();
        if (dx) {
            const Tensor &w8t = remake_w8t ? lean_weight_fp8t() : *w8t_;
            const float *wt_scale_inv = e4m3_weight ? weight_->scale_inv() : w8t.scale_inv();
            run_gemm({m, k, n, dy8.data(), gdtype, true, dy8.scale_inv(), w8t.data(), FP8AMP_DTYPE_E4M3, true,
                      wt_scale_inv, dx->data(), dx->dtype(), false, false, false});
        }
        run_gemm({n, k, m, dy8t.data(), gdtype, true, dy8t.scale_inv(), x8t_->data(), FP8AMP_DTYPE_E4M3, true,
                  x8t_->scale_inv(), wsum.data(), FP8AMP_DTYPE_F32, add, false, false});
    } else {
        const Tensor &ww = w_wide_ && (weight_->dtype() != wide_dtype_ || weight_->scaling()) ? *w_wide_ : *weight_;
        const void *dyw = dy.data();
        if (dy.dtype() != wide_dtype_) {
            Tensor &copy = scratch(dy_wide_, kScratchWeight, wide_dtype_, m, n);
            steps_.cast(dy.data(), dy.dtype(), copy.data(), wide_dtype_, static_cast<size_t>(m * n));
            copy.mark_written();
            dyw = copy.data();
        }
        // dX[m, k] = dY[m, n] W[n, k]: W read as the [k, n] operand, stored [n, k] (not K-contiguous).
        if (dx)
            run_gemm({m, k, n, dyw, wide_dtype_, true, nullptr, ww.data(), wide_dtype_, false, nullptr, dx->data(),
                      dx->dtype(), false, false, false});
        // dW[n, k] = dY^T X: both operands stored with the summed dimension (m) leading.
        run_gemm({n, k, m, dyw, wide_dtype_, false, nullptr, x_wide_->data(), wide_dtype_, false, nullptr, wsum.data(),
                  FP8AMP_DTYPE_F32, add, false, false});
    }
    if (dx) dx->mark_written();
    if (!direct_wgrad) {
        if (desc_.wgrad_dtype == FP8AMP_DTYPE_E4M3) {
            const size_t count = static_cast<size_t>(n * k);
            const bool delayed = !wgrad_meta_->current();
            if (delayed && !wgrad_scale_fitted_) {  // first backward: no history yet, fit the scale to this sum
                steps_.record_amax(wsum.data(), FP8AMP_DTYPE_F32, count, *wgrad_meta_);
                steps_.update_scaling(*wgrad_meta_);
            }
            quantize(wsum.data(), FP8AMP_DTYPE_F32, static_cast<size_t>(n), static_cast<size_t>(k), *weight_grad_,
                     nullptr);
            if (delayed) steps_.update_scaling(*wgrad_meta_);  // this amax into the history: the next scale
        } else {
            steps_.cast(wsum.data(), FP8AMP_DTYPE_F32, weight_grad_->data(), weight_grad_->dtype(),
                        static_cast<size_t>(n * k));
        }
    }
    weight_grad_->mark_written();
    if (bias_grad_ && kind_ != FP8AMP_GEMM_KIND_FP8) {  // the FP8 path summed it with dY's quantize
        float *partial = nullptr;  // the per-chunk column sums, if the backend needs them (CUDA)
        if (const size_t chunks = ctx_->backend().column_sum_partial_rows())
            partial = static_cast<float *>(
                scratch(colsum_scratch_, kScratchColSum, FP8AMP_DTYPE_F32, static_cast<int64_t>(chunks), n).data());
        steps_.column_sum(dy.data(), dy.dtype(), static_cast<size_t>(m), static_cast<size_t>(n),
                          static_cast<float *>(bias_grad_->data()), accumulate, partial);
    }
    if (bias_grad_) bias_grad_->mark_written();
    run_steps(backward_replay_);
    wgrad_sum_valid_ = !direct_wgrad && !scratch_sum;
    wgrad_sum_released_ = scratch_sum;  // the sum was in the scratch: the next accumulation reloads
    if (wgrad_meta_) wgrad_scale_fitted_ = true;
    saved_ = false;
    if (lean_ != 0) release_after_backward();
}

// Lean: what a backward read and nothing later needs goes back as soon as it ran -- the saved input,
// the weight's transposed FP8 copy or wide copy (re-made by the next training forward), a kept FP32
// sum that a non-accumulating backward replaced -- in the stream's order as in release_buffers (on a
// stream-ordered allocator such as torch's, no host wait; cudaFree, the CUDA backend's own
// allocator's, waits for the device: lean is for allocator hooks). A buffer used on another stream
// since it was allocated makes the host wait first, as in release_buffers. What this saves is
// memory at the training peak (issue 18): the backward of the last layers runs while the earlier
// layers' saved inputs are still alive, and without lean every Linear backed so far would still hold
// its FP32 sum (4 bytes per parameter), its saved input and its weight copies.
void Linear::release_after_backward() {
    if (buffers_crossed_) ctx_->synchronize();  // (kept set: what stays may still be used there)
    x8t_.reset();
    x_wide_.reset();
    w8t_.reset();
    w_wide_.reset();
    weight_fp8t_valid_ = false;
    weight_wide_version_ = kStale;
    if (!wgrad_sum_valid_) wgrad_acc_.reset();
}

}  // namespace fp8amp::core
