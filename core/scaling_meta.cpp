#include "scaling_meta.hpp"

#include <cfloat>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend.hpp"  // kernels/backend.hpp
#include "tensor.hpp"
#include "struct_size.hpp"
#include "tensor.hpp"
#include "scaling.hpp"  // kernels/scaling.hpp: ScalingState (core has scaling_meta.hpp, not scaling.hpp)

namespace fp8amp::core {

using kernels::ScalingState;

bool is_fp8(fp8amp_dtype dtype) { return dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2; }

bool is_scaled_dtype(fp8amp_dtype dtype) { return is_fp8(dtype) || dtype == FP8AMP_DTYPE_F16; }

float scaled_dtype_max(fp8amp_dtype dtype) {
    switch (dtype) {
    case FP8AMP_DTYPE_E4M3: return 448.0f;
    case FP8AMP_DTYPE_E5M2: return 57344.0f;
    case FP8AMP_DTYPE_F16: return 65504.0f;
    default: fail(FP8AMP_ERROR_INTERNAL, "scaled_dtype_max: not a scaled dtype");
    }
}

fp8amp_recipe default_recipe() {
    fp8amp_recipe r{};
    r.struct_size = sizeof(fp8amp_recipe);
    r.format = FP8AMP_FORMAT_HYBRID;
    r.mode = FP8AMP_SCALING_DELAYED;
    r.margin = 0;
    r.interval = 1;
    r.amax_history_len = 1024;
    r.amax_algo = FP8AMP_AMAX_MAX;
    r.power_of_two_scales = 0;
    return r;
}

fp8amp_recipe validate_recipe(const fp8amp_recipe &recipe) {
    fp8amp_recipe r = read_sized(recipe, "recipe", "fp8amp_recipe", "fp8amp_recipe_init_default");
    // Enum fields read as integers (enum_value): an out-of-range value is no valid C++ enum value.
    const int32_t format = enum_value(r.format), mode = enum_value(r.mode), algo = enum_value(r.amax_algo);
    if (format != FP8AMP_FORMAT_E4M3 && format != FP8AMP_FORMAT_HYBRID)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "recipe->format " + std::to_string(format) + " is not an fp8amp_format");
    if (mode != FP8AMP_SCALING_DELAYED && mode != FP8AMP_SCALING_CURRENT)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "recipe->mode " + std::to_string(mode) + " is not an fp8amp_scaling_mode");
    if (r.margin < 0 || r.margin > 127)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "recipe->margin " + std::to_string(r.margin) + " is outside 0..127");
    if (r.interval < 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "recipe->interval " + std::to_string(r.interval) + " is less than 1");
    if (r.amax_history_len < 1 || r.amax_history_len > FP8AMP_MAX_AMAX_HISTORY)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "recipe->amax_history_len " + std::to_string(r.amax_history_len) +
                                                " is outside 1.." + std::to_string(FP8AMP_MAX_AMAX_HISTORY));
    if (algo != FP8AMP_AMAX_MAX && algo != FP8AMP_AMAX_MOST_RECENT)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT,
             "recipe->amax_algo " + std::to_string(algo) + " is not an fp8amp_amax_algo");
    r.power_of_two_scales = r.power_of_two_scales ? 1 : 0;
    return r;
}

ScalingMeta::ScalingMeta(std::shared_ptr<const Context> ctx, const fp8amp_recipe &recipe, fp8amp_dtype fp8_dtype)
    : ctx_(std::move(ctx)), recipe_(validate_recipe(recipe)), dtype_(fp8_dtype) {
    if (!is_scaled_dtype(fp8_dtype))
        fail(FP8AMP_ERROR_DTYPE_MISMATCH, std::string("fp8_dtype is ") + fp8amp_dtype_name(fp8_dtype) +
                                              " (" + std::to_string(static_cast<int>(fp8_dtype)) +
                                              "): a scaling meta is for e4m3, e5m2 or f16 tensors");
    const auto len = static_cast<uint32_t>(recipe_.amax_history_len);
    const size_t nbytes = ScalingState::bytes(len);

    // The initial state, built on the host (zero history) and copied to the device in one go.
    std::vector<unsigned char> host(nbytes, 0);
    ScalingState init{};
    init.scale = 1.0f;
    init.scale_inv = 1.0f;
    init.amax_bits = 0;
    init.head = 0;
    init.updates = 0;
    init.history_len = len;
    init.interval = static_cast<uint32_t>(recipe_.interval);
    init.margin = recipe_.margin;
    init.most_recent = recipe_.amax_algo == FP8AMP_AMAX_MOST_RECENT ? 1u : 0u;
    init.power_of_two = recipe_.power_of_two_scales ? 1u : 0u;
    init.current = recipe_.mode == FP8AMP_SCALING_CURRENT ? 1u : 0u;
    init.stats_enabled = 0;
    init.fp8_max = scaled_dtype_max(fp8_dtype);
    std::memcpy(host.data(), &init, sizeof init);

    storage_ = ctx_->allocate(nbytes);
    write(0, host.data(), nbytes);
}

std::string ScalingMeta::describe() const {
    return std::string(fp8amp_dtype_name(dtype_)) + " scaling meta on " + device_name(device());
}

ScalingState *ScalingMeta::state() const { return static_cast<ScalingState *>(storage_->data()); }

std::shared_ptr<Tensor> ScalingMeta::amax_view() const {
    return Tensor::view(ctx_, storage_, FP8AMP_DTYPE_F32, 0, nullptr, true, offsetof(ScalingState, amax_bits));
}

const float *ScalingMeta::scale_inv_field() const {
    return reinterpret_cast<const float *>(static_cast<const char *>(storage_->data()) +
                                           offsetof(ScalingState, scale_inv));
}

void ScalingMeta::read(size_t offset, void *dst, size_t nbytes) const {
    const char *src = static_cast<const char *>(storage_->data()) + offset;
    ctx_->backend().copy_to_host(dst, src, nbytes);
}

void ScalingMeta::write(size_t offset, const void *src, size_t nbytes) {
    char *dst = static_cast<char *>(storage_->data()) + offset;
    ctx_->backend().copy_to_device(dst, src, nbytes);
}

void ScalingMeta::get(float *scale, float *scale_inv, float *amax) const {
    ScalingState s;
    read(0, &s, sizeof s);
    if (scale) *scale = s.scale;
    if (scale_inv) *scale_inv = s.scale_inv;
    if (amax) *amax = codec::bits_f32(s.amax_bits);
}

void ScalingMeta::get_history(int32_t capacity, float *history) const {
    if (!history) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "history is NULL");
    if (capacity < recipe_.amax_history_len)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "capacity " + std::to_string(capacity) +
                                                " is less than the recipe's amax_history_len " +
                                                std::to_string(recipe_.amax_history_len));
    // One copy of the whole state, so that head and the ring are read together.
    std::vector<unsigned char> host(storage_->nbytes());
    read(0, host.data(), host.size());
    ScalingState s;
    std::memcpy(&s, host.data(), sizeof s);
    const auto *ring = reinterpret_cast<const float *>(host.data() + sizeof s);
    const uint32_t len = s.history_len;
    for (uint32_t k = 0; k < len; ++k) history[k] = ring[ScalingState::ring_slot(s.head, len, k)];  // newest first
}

void ScalingMeta::set_scale(float scale) {
    // Normal floats only: a subnormal scale would make scale_inv infinite (see compute_scale).
    if (!(scale >= FLT_MIN && scale <= FLT_MAX))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "scale " + std::to_string(scale) + " is not a normal float > 0");
    static_assert(offsetof(ScalingState, scale_inv) == offsetof(ScalingState, scale) + sizeof(float),
                  "scale and scale_inv are written together");
    const float pair[2] = {scale, 1.0f / scale};
    write(offsetof(ScalingState, scale), pair, sizeof pair);
}

void ScalingMeta::enable_stats(bool enable) {
    const uint32_t flag = enable ? 1u : 0u;
    write(offsetof(ScalingState, stats_enabled), &flag, sizeof flag);
    stats_enabled_ = enable;
}

fp8amp_scaling_stats ScalingMeta::stats() const {
    static_assert(offsetof(ScalingState, saturated) == offsetof(ScalingState, quantized) + 8 &&
                      offsetof(ScalingState, underflowed) == offsetof(ScalingState, quantized) + 16,
                  "the counters are read together");
    unsigned long long counters[3];
    read(offsetof(ScalingState, quantized), counters, sizeof counters);
    return fp8amp_scaling_stats{counters[0], counters[1], counters[2]};
}

void ScalingMeta::reset_stats() {
    const unsigned long long zeros[3] = {0, 0, 0};
    write(offsetof(ScalingState, quantized), zeros, sizeof zeros);
}

}  // namespace fp8amp::core
