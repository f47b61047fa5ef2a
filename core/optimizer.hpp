// Adam/AdamW with low-precision state (O1/O2/O3). The optimizer keeps, per parameter, its state in
// memory of the context's device (m, v, an optional master copy, and one scale_inv per state block)
// and a device-side list of all parameters (kernels/adam.hpp Param), rebuilt only when a parameter is
// added, so that a step is one kernel launch with no allocation and no host synchronization. The step
// count, found_inf and the gradient norm live on the device (kernels/adam.hpp Status).
#pragma once

#include <memory>
#include <vector>

#include "adam.hpp"  // kernels/adam.hpp
#include "context.hpp"
#include "checkpoint.hpp"
#include "grad_scaler.hpp"
#include "scaling_meta.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

class Communicator;

// The desc fields this library knows, checked (INVALID_ARGUMENT / DTYPE_MISMATCH otherwise).
fp8amp_adam_desc validate_adam_desc(const fp8amp_adam_desc &desc);

class Optimizer {
public:
    static constexpr HandleKind kKind = HandleKind::Optimizer;

    Optimizer(std::shared_ptr<const Context> ctx, const fp8amp_adam_desc &desc);
    ~Optimizer();  // unpins the parameters' and gradients' addresses
    Optimizer(const Optimizer &) = delete;
    Optimizer &operator=(const Optimizer &) = delete;

    const Context &context() const { return *ctx_; }
    const fp8amp_device &device() const { return ctx_->device(); }
    const fp8amp_adam_desc &desc() const { return desc_; }
    int32_t num_params() const { return static_cast<int32_t>(entries_.size()); }

    // master_dtype: FP8AMP_MASTER_DEFAULT (the desc's), FP8AMP_NO_MASTER or FP8AMP_DTYPE_F16.
    // master_init: the value an F16 master copy starts from (fp8amp_param_desc.master_init), or null:
    // the parameter's own value.
    void add_param(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype = FP8AMP_MASTER_DEFAULT,
                   const Tensor *master_init = nullptr);
    // scaler may be null. lr < 0: the desc's.
    void step(float lr, const float *lr_device, float grad_scale_inv, GradScaler *scaler);
    // The loss scaler's update from the last step's found_inf (fp8amp_grad_scaler_update), queued on
    // this optimizer's stream after its step; scaler is on the same device.
    void update_scaler(GradScaler &scaler) const;

    // Synchronous reads of the device-side status.
    kernels::adam::Status status() const;
    const kernels::adam::Status *status_device() const;

    size_t state_bytes() const;
    // Writes the checkpoint into buffer (null: only measures); returns its size.
    size_t save(unsigned char *buffer) const;
    void load(const unsigned char *data, size_t size);

    // One parameter's state as tensors (fp8amp_optimizer_param_state, _set_param_state, _set_step;
    // core/optimizer_state.cpp). Unsharded optimizers only.
    struct StateTensors {
        std::shared_ptr<Tensor> m, m_scale, v, v_scale, master, master_scale;
        // A parameter bound to a meta: a copy of its amax history (newest first), its scale, recorded
        // amax and update count.
        std::shared_ptr<Tensor> meta_history;
        float meta_scale = 0.0f, meta_amax = 0.0f;
        int64_t meta_updates = 0;
    };
    StateTensors param_state(int32_t index) const;  // read-only views of the state's memory
    struct StateInput {
        const Tensor *m = nullptr, *m_scale = nullptr, *v = nullptr, *v_scale = nullptr, *master = nullptr,
                     *master_scale = nullptr, *meta_history = nullptr;
        float meta_scale = 0.0f, meta_amax = 0.0f;
        int64_t meta_updates = 0;
    };
    void set_param_state(int32_t index, const StateInput &in);
    void set_step(int64_t step);

    // Sharding (fp8amp_optimizer_set_shard; core/optimizer_shard.cpp): before any add_param.
    void set_shard(std::shared_ptr<Communicator> comm);
    bool sharded() const { return comm_ != nullptr; }
    // The elements of parameter `index` this rank holds.
    void shard_range(int32_t index, int64_t &begin, int64_t &count) const;

private:
    struct Entry {
        std::shared_ptr<Tensor> param, grad;
        std::shared_ptr<Storage> m, v, master, m_scale, v_scale, master_scale;
        // The metas as bound at add_param, kept alive here: the device list points into their state and
        // save/load read and write it, so a meta unbound and destroyed by the caller must not be freed.
        std::shared_ptr<const ScalingMeta> param_meta, grad_meta;
        int64_t nscales = 0;
        int64_t units = 0;
        // Sharded (core/optimizer_shard.cpp): param and grad above are this rank's shard (k elements,
        // zeros past the parameter's end), param_meta a private copy of full_meta; these are the
        // caller's full tensors and metas.
        std::shared_ptr<Tensor> full_param, full_grad;
        std::shared_ptr<ScalingMeta> full_meta;
        std::shared_ptr<const ScalingMeta> full_grad_meta;
        std::shared_ptr<ScalingMeta> shard_meta;  // == param_meta, writable
        int64_t shard_k = 0;      // elements per rank (the padded shard)
        int64_t shard_offset = 0; // rank * shard_k: the shard's first element in the full parameter
    };
    void check_master_init(const Tensor &init, const Tensor &p, bool master) const;
    void add_local(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype,
                   const Tensor *master_init);
    void add_param_sharded(std::shared_ptr<Tensor> param, std::shared_ptr<Tensor> grad, int32_t master_dtype,
                           const Tensor *master_init);
    void step_sharded(float lr, const float *lr_device, float grad_scale_inv, GradScaler *scaler);
    // Copies the full metas' states into the shards' private metas (before a step or a save).
    void pull_metas() const;
    // All-gathers every shard into its full parameter (after a step; after a load also the private
    // metas back into the full ones, with push_metas).
    void gather_params(bool push_metas);
    std::vector<uint32_t> exchange(const std::vector<uint32_t> &mine) const;
    // Points every shard's gradient at base (+ offsets[i]; null: all at base).
    void point_grads(void *base, const std::vector<size_t> *offsets);
    int64_t scales_of(int64_t numel) const;
    void rebuild_list();
    void to_host(void *dst, const void *src, size_t n) const;
    void to_device(void *dst, const void *src, size_t n) const;
    void serialize(checkpoint::Writer &w) const;
    uint32_t format_version() const;  // of the checkpoint save writes (optimizer.cpp kFormatVersion)
    // INVALID_ARGUMENT when a parameter (and, with grads, a gradient) is no longer bound to the meta it
    // had at add_param: `what` names the refused operation.
    void check_bindings(bool grads, const char *what) const;
    // Grows cpu_scratch_ to what the backend's step needs for parameters of up to max_numel elements.
    void reserve_cpu_scratch(int64_t max_numel);

    std::shared_ptr<const Context> ctx_;
    fp8amp_adam_desc desc_;
    std::vector<Entry> entries_;
    bool stepped_ = false;  // a step was issued: no more parameters
    int has_param_metas_ = 0;
    int32_t masters_ = 0;  // parameters with a master copy
    uint32_t pair_mask_ = 0;  // (param dtype, grad dtype) pairs present: adam::StepConfig::pair_mask
    int64_t max_numel_ = 0;
    int64_t total_units_ = 0;
    int max_partials_ = 1;
    std::shared_ptr<Storage> status_, list_, partials_, tensor_amax_;
    // The host scratch the backend's step needs (Backend::adam_host_scratch_floats; the CPU's
    // per-block values), kept so that the step allocates no host memory once it started writing.
    std::vector<float> cpu_scratch_;
    // Sharded: the communicator and the step's buffers (core/optimizer_shard.cpp).
    std::shared_ptr<Communicator> comm_;
    bool in_shard_step_ = false;  // step() runs the local kernel on the shards
    std::shared_ptr<Storage> shard_scratch_, one_;  // the padded full gradient (F32) / gathered parameter; 1.0f
    std::shared_ptr<Tensor> gather_scale_inv_;        // F32 [nranks]
};

}  // namespace fp8amp::core
