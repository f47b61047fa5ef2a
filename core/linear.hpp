// The FP8 Linear layer: y = x W^T + b with FP8 GEMMs, its backward with FP8 weight gradients, and
// the BF16 GEMMs it falls back to where FP8 does not pay or cannot run.
#pragma once

#include <initializer_list>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "context.hpp"
#include "launch_list.hpp"
#include "scaling_meta.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

struct GemmCall;  // linear.cpp

class Linear {
public:
    static constexpr HandleKind kKind = HandleKind::Linear;

    // fp8amp_linear_desc_init_default's descriptor (no features yet: the caller sets them).
    static fp8amp_linear_desc default_desc();
    // The size of fp8amp_linear_desc's first layout, which ended with `policy` (before 0.1.0): still
    // accepted by fp8amp_linear_create and fp8amp_linear_desc_init, with graph_replay at its default.
    static constexpr size_t kFirstLayout = offsetof(fp8amp_linear_desc, graph_replay);
    // Validates the descriptor (INVALID_ARGUMENT / DTYPE_MISMATCH) and allocates the parameters.
    static std::shared_ptr<Linear> create(std::shared_ptr<const Context> ctx, const fp8amp_linear_desc &caller_desc);
    ~Linear();  // releases its tensors (see Tensor::set_owner): handles to them may outlive it
    Linear(const Linear &) = delete;
    Linear &operator=(const Linear &) = delete;

    const std::shared_ptr<Tensor> &weight() const { return weight_; }
    const std::shared_ptr<Tensor> &bias() const;  // INVALID_ARGUMENT without a bias
    const std::shared_ptr<Tensor> &weight_grad() const { return weight_grad_; }
    const std::shared_ptr<Tensor> &bias_grad() const;
    std::shared_ptr<ScalingMeta> scaling(int32_t role) const;  // an fp8amp_linear_role, read as an integer
    fp8amp_gemm_kind gemm_kind() const { return kind_; }
    // fp8amp_linear_choose_gemm: the GEMM a forward of m rows of a wide input would run (the
    // policy's choice; NOT_SUPPORTED where that forward would be refused for it).
    fp8amp_gemm_kind choose_gemm(int64_t m, bool training) const;
    uint64_t graph_replays() const { return forward_replay_.replays() + backward_replay_.replays(); }

    // fp8amp_linear_weight_changed: the caller wrote the weight behind the Linear's back.
    void note_weight_written() {
        weight_changed();
        weight_written_since_forward_ = true;
    }
    void weight_changed() {
        weight_fp8_version_ = kStale;
        weight_wide_version_ = kStale;
        bias_cast_version_ = kStale;  // the bias may have been written behind the Linear's back too
        bias_f32_version_ = kStale;
    }
    void forward(const Tensor &x, Tensor &y, bool training);
    // fp8amp_linear_forward_fp8: x8 is E4M3, quantized by the caller (a fused norm or activation).
    void forward_fp8(const Tensor &x8, Tensor &y, bool training);
    void backward(const Tensor &dy, Tensor *dx, bool accumulate);
    // fp8amp_linear_release_buffers: gives back what the Linear keeps between calls beyond its
    // parameters, gradients and a saved forward still awaiting its backward (docs/linear.md section 5).
    void release_buffers();
    // fp8amp_linear_memory_bytes: the bytes of the context's memory its tensors hold now.
    size_t memory_bytes() const;
    // fp8amp_linear_set_lean: what only one call or one forward-backward pair needs is not kept
    // beyond it (1), nor the FP32 weight-gradient sum of a non-accumulating backward (2); 0: off
    // (docs/linear.md section 5).
    void set_lean(int32_t lean) { lean_ = lean; }
    int32_t lean() const { return lean_; }

private:
    static constexpr uint64_t kStale = ~uint64_t{0};

    Linear() = default;
    fp8amp_gemm_kind choose_kind(int64_t m, bool training, const Tensor &y) const;
    // Returns the FP8 weight the forward GEMM reads (the weight itself when it is E4M3); transient:
    // made in the context's scratch, no transpose, nothing cached (a lean training forward).
    const Tensor &refresh_weight_fp8(bool need_transpose, bool transient = false);
    // A lean backward's W8^T, made from the weight in the context's scratch (the forward kept none).
    const Tensor &lean_weight_fp8t();
    void refresh_weight_wide();
    const Tensor *bias_for(fp8amp_dtype bias_dtype);
    // A [rows, cols] tensor of the context kept in `slot`, (re)made when its dtype or shape changes.
    Tensor &buffer(std::shared_ptr<Tensor> &slot, fp8amp_dtype dtype, int64_t rows, int64_t cols,
                   const std::shared_ptr<ScalingMeta> &meta = nullptr);
    // The same over the context's scratch slot `pool_slot`, for what lives only within one call.
    Tensor &scratch(std::shared_ptr<Tensor> &slot, size_t pool_slot, fp8amp_dtype dtype, int64_t rows, int64_t cols,
                    const std::shared_ptr<ScalingMeta> &meta = nullptr);
    // A buffer the saved forward reads (x8t_, x_wide_): while a forward is saved, one that must be
    // re-made is made in `pending` beside it, and replaces it only once the forward succeeded, so a
    // forward that fails keeps the saved one (else as buffer()).
    Tensor &saved_buffer(std::shared_ptr<Tensor> &slot, std::shared_ptr<Tensor> &pending, fp8amp_dtype dtype,
                         int64_t rows, int64_t cols, const std::shared_ptr<ScalingMeta> &meta = nullptr);
    // Makes every host allocation the described steps need, then runs them (see linear.cpp);
    // *launched (if given) is set just before the first step is launched (GraphReplay::run).
    void run_steps(GraphReplay &replay, bool *launched = nullptr);
    void run_gemm(const GemmCall &call);
    // Adds a quantize step to steps_ and marks its destinations written.
    void quantize(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, Tensor &dst, Tensor *dst_t);
    struct FailureGuard;  // linear.cpp
    int64_t check_forward_args(const Tensor &x, const char *x_name, const Tensor &y) const;
    void finish_forward(const Tensor &x, Tensor &y, bool training, fp8amp_gemm_kind kind, int64_t m,
                        FailureGuard &guard);
    void check_not_own(const Tensor &t, const char *argument,
                       std::initializer_list<std::pair<const Tensor *, const char *>> own) const;

    std::shared_ptr<const Context> ctx_;
    fp8amp_linear_desc desc_{};
    fp8amp_dtype wide_dtype_ = FP8AMP_DTYPE_BF16;  // operand dtype of the non-FP8 GEMMs
    std::shared_ptr<Tensor> weight_, bias_, weight_grad_, bias_grad_;
    std::shared_ptr<ScalingMeta> input_meta_, weight_meta_, grad_output_meta_, wgrad_meta_, weight_storage_meta_;

    // FP8 copies: the weight and its transpose (re-made when the weight's version moves), the input's
    // transpose saved for the weight gradient; views of the context's scratch for x8, dY8 and dY8^T.
    std::shared_ptr<Tensor> w8_, w8t_, x8_, x8t_, dy8_, dy8t_;
    std::shared_ptr<Tensor> x8t_pending_, x_wide_pending_;  // see saved_buffer()
    uint64_t weight_fp8_version_ = kStale;
    bool weight_fp8t_valid_ = false;
    // The non-FP8 path: the weight in wide_dtype_, the saved input, dY in wide_dtype_.
    std::shared_ptr<Tensor> w_wide_, x_wide_, dy_wide_;
    uint64_t weight_wide_version_ = kStale;
    // Shared: a weight dequantized to F32 (F16-scaled weights), the bias in its epilogue dtype, the
    // FP32 weight-gradient sum (E4M3/BF16 weight gradients), a F32 staging output, bias-grad scratch.
    // w_f32_, out_stage_, dy_wide_ and colsum_scratch_ are views of the context's scratch (see
    // Linear::scratch); docs/linear.md section 5 classifies every buffer.
    std::shared_ptr<Tensor> w_f32_, bias_cast_, bias_f32_, wgrad_acc_, out_stage_, colsum_scratch_;
    // The WEIGHT_GRAD meta's scale was fitted by a backward (its first one runs an amax pass first).
    bool wgrad_scale_fitted_ = false;
    bool wgrad_sum_valid_ = false;  // wgrad_acc_ holds a sum (a backward into it ran)
    // release_buffers gave a valid sum back: an accumulating backward starts from the delivered
    // gradient's value instead (cleared by the next backward).
    bool wgrad_sum_released_ = false;
    // Lean (fp8amp_linear_set_lean), level 1: a training forward quantizes the weight into the
    // context's scratch (w8s_) and keeps no transpose, the backward re-makes W8^T in the scratch
    // (w8ts_) and gives back the saved input and the weight copies; level 2 also: a backward that
    // does not accumulate sums the weight gradient in the scratch (wsum_s_) instead of wgrad_acc_.
    int32_t lean_ = 0;
    std::shared_ptr<Tensor> w8s_, w8ts_, wsum_s_;
    // The saved forward was lean (its backward makes W8^T itself), the weight's version it read, and
    // whether fp8amp_linear_weight_changed was called since (a lean backward then refuses to run).
    bool saved_lean_ = false;
    uint64_t saved_weight_version_ = 0;
    bool weight_written_since_forward_ = false;
    void release_after_backward();
    // The stream the Linear's own buffers were last allocated on, and whether a call ran on another
    // since (release_buffers then waits for the device before freeing: see there).
    void *buffers_stream_ = nullptr;
    bool buffers_crossed_ = false;
    void note_stream();
    uint64_t bias_cast_version_ = kStale, bias_f32_version_ = kStale;

    // What the last training forward left for backward.
    bool saved_ = false;
    int64_t saved_m_ = 0;
    std::vector<int64_t> saved_x_shape_, saved_y_shape_;
    fp8amp_gemm_kind kind_ = FP8AMP_GEMM_KIND_NONE;
    // The current call's GPU work, and its replay as CUDA graphs, per direction (launch_list.hpp).
    LaunchList steps_;
    // The host scratch of the backend's kernels (LaunchList::host_scratch_floats; the CPU GEMM's and
    // column sum's), grown before a call's steps run.
    std::vector<float> cpu_scratch_;
    GraphReplay forward_replay_{true}, backward_replay_{true};
    // Why this device cannot run FP8 GEMMs ("" when it can), asked once.
    std::string fp8_unsupported_;
};

}  // namespace fp8amp::core
