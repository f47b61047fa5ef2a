// Scaling meta: the recipe of one FP8 dtype's scales and the state it drives (scale, scale_inv, the
// amax recorded since the last update, the amax history, the diagnostic counters). The state lives
// in one allocation on the context's device (kernels::ScalingState followed by the history); the
// kernels read and write it there. Host reads and writes are explicit copies, ordered on the stream
// of the meta's context, so that they never race with the kernels issued on it.
#pragma once

#include <cstddef>
#include <memory>

#include "context.hpp"
#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels {
struct ScalingState;
}

namespace fp8amp::core {

class Tensor;

// fp8amp_recipe_init_default's recipe: HYBRID, delayed scaling, margin 0, interval 1, amax history
// of 1024 by its maximum, scales not rounded to powers of two.
fp8amp_recipe default_recipe();

// The recipe fields this library knows, after checking that the caller's struct is large enough and
// every field is in range (INVALID_ARGUMENT otherwise).
fp8amp_recipe validate_recipe(const fp8amp_recipe &recipe);

bool is_fp8(fp8amp_dtype dtype);
// A dtype a scaling meta can be made for and a tensor bound to: E4M3, E5M2, or F16 (the scaled
// 16-bit format of MS-AMP's O1/O2 weights and O2 Adam state).
bool is_scaled_dtype(fp8amp_dtype dtype);
// The largest finite value of a scaled dtype (448, 57344, 65504).
float scaled_dtype_max(fp8amp_dtype dtype);

class ScalingMeta {
public:
    static constexpr HandleKind kKind = HandleKind::Scaling;

    // A meta for tensors of fp8_dtype (E4M3, E5M2 or F16, else DTYPE_MISMATCH) on ctx's device.
    ScalingMeta(std::shared_ptr<const Context> ctx, const fp8amp_recipe &recipe, fp8amp_dtype fp8_dtype);

    const Context &context() const { return *ctx_; }
    const fp8amp_device &device() const { return ctx_->device(); }
    fp8amp_dtype dtype() const { return dtype_; }
    const fp8amp_recipe &recipe() const { return recipe_; }
    // Host mirrors of the state's configuration, so that launches never read device memory.
    bool current() const { return recipe_.mode == FP8AMP_SCALING_CURRENT; }
    bool stats_enabled() const { return stats_enabled_; }
    std::string describe() const;  // "e4m3 scaling meta on cuda:0", for messages

    // The state in device (CPU backend: host) memory, for the kernels.
    kernels::ScalingState *state() const;
    // The address of the state's scale_inv field (device memory).
    const float *scale_inv_field() const;
    // fp8amp_scaling_amax_tensor: a read-only F32 scalar view of the recorded amax (amax_bits holds
    // the float's bits: the amax is never negative, so the bits read as a float are its value; a NaN
    // is recorded as +inf), sharing -- and keeping alive -- the state's memory.
    std::shared_ptr<Tensor> amax_view() const;

    // Host access; each is synchronous and ordered on the meta's context stream.
    void get(float *scale, float *scale_inv, float *amax) const;
    void get_history(int32_t capacity, float *history) const;
    void set_scale(float scale);
    void enable_stats(bool enable);
    fp8amp_scaling_stats stats() const;
    void reset_stats();

private:
    void read(size_t offset, void *dst, size_t nbytes) const;
    void write(size_t offset, const void *src, size_t nbytes);

    std::shared_ptr<const Context> ctx_;
    fp8amp_recipe recipe_;
    fp8amp_dtype dtype_;
    bool stats_enabled_ = false;  // mirrors the state's stats_enabled
    std::shared_ptr<Storage> storage_;
};

}  // namespace fp8amp::core
