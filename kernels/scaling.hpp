// The state of a scaling meta as it lives in device (or, on the CPU backend, host) memory, and the
// delayed-scaling arithmetic shared by both backends. One allocation per meta: this header struct,
// then amax_history_len floats of history (a ring buffer; `head` is the newest entry).
//
// The amax recorded since the last update is kept as the bit pattern of a non-negative float, so
// that concurrent quantize blocks can fold their maxima with an integer atomicMax (non-negative
// floats order like their bits; NaN is recorded as +inf, which makes the next update keep the
// previous scale: docs/numerics.md sections 5.3 and 5.4).
#pragma once

#include <cfloat>
#include <cstdint>

#include "codec.hpp"

namespace fp8amp::kernels {

struct ScalingState {
    float scale;
    float scale_inv;
    uint32_t amax_bits;  // amax recorded since the last update, as float bits
    uint32_t head;       // history index of the newest entry
    uint32_t updates;    // updates so far
    uint32_t history_len;
    uint32_t interval;
    int32_t margin;
    uint32_t most_recent;  // 1: amax_algo MOST_RECENT, 0: MAX
    uint32_t power_of_two;
    uint32_t current;        // 1: current scaling (the scale comes from each quantize)
    uint32_t stats_enabled;  // count saturated / underflowed elements in quantize
    float fp8_max;           // the format's largest finite value: 448 (E4M3), 57344 (E5M2), 65504 (F16)
    uint32_t pad_;
    unsigned long long quantized;
    unsigned long long saturated;
    unsigned long long underflowed;

    FP8AMP_HD float *history() { return reinterpret_cast<float *>(this + 1); }
    FP8AMP_HD const float *history() const { return reinterpret_cast<const float *>(this + 1); }
    static constexpr size_t bytes(uint32_t history_len) { return sizeof(ScalingState) + 4u * history_len; }
    // The ring slot of the k-th newest history entry (k = 0: the newest, at head): the order in which
    // fp8amp_scaling_get_history reads the ring and fp8amp_optimizer_set_param_state writes it.
    static constexpr uint32_t ring_slot(uint32_t head, uint32_t history_len, uint32_t k) {
        return (head + history_len - k) % history_len;
    }
};
static_assert(sizeof(ScalingState) % 8 == 0, "history must stay aligned");

// |x| as recordable amax bits: NaN becomes +inf.
FP8AMP_HD uint32_t amax_bits_of(float x) {
    const uint32_t mag = codec::f32_bits(x) & 0x7FFFFFFFu;
    return mag > 0x7F800000u ? 0x7F800000u : mag;
}

// The scale that maps amax to fp8_max / 2^margin, or `previous` when amax is 0, inf or NaN. An
// overflowing scale becomes FLT_MAX; power_of_two rounds down to a power of two. A scale below
// FLT_MIN (a huge amax with a large margin) becomes FLT_MIN, so that scale_inv = 1/scale stays
// finite and x * scale never turns inf into NaN.
FP8AMP_HD float compute_scale(const ScalingState &s, float amax, float previous) {
    if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return previous;  // 0, negative, NaN, inf
    // fp8_max / 2^margin, exactly: 2^-margin is built in two normal-float factors because 2^-127
    // (margin 127) is not a normal float; fp8_max >= 448 (every scaled format) keeps the product normal for any margin.
    const int first = s.margin < 64 ? s.margin : 64;
    const float target = s.fp8_max * codec::bits_f32(static_cast<uint32_t>(127 - first) << 23) *
                         codec::bits_f32(static_cast<uint32_t>(127 - (s.margin - first)) << 23);
    float scale = target / amax;
    if (scale > FLT_MAX) scale = FLT_MAX;
    if (scale < FLT_MIN) scale = FLT_MIN;
    if (s.power_of_two) scale = codec::bits_f32(codec::f32_bits(scale) & 0xFF800000u);  // drop the mantissa
    return scale;
}

// x * s in float32 as both backends compute it: a NaN x passes through unchanged (sign included;
// a GPU multiply would return a positive NaN), a NaN product is the positive canonical NaN.
FP8AMP_HD float scaled(float x, float s) {
    if (x != x) return x;
    const float y = x * s;
    return y != y ? codec::bits_f32(codec::kF32QuietNaN) : y;
}

// Folds the recorded amax into the history and, every interval-th update, recomputes the scale.
// `history_amax` is the amax to use (max over the history, or the newest) -- computed by the caller
// after fold_history, so the GPU can reduce the history in parallel.
FP8AMP_HD void fold_history(ScalingState &s) {
    s.head = (s.head + 1 == s.history_len) ? 0 : s.head + 1;
    s.history()[s.head] = codec::bits_f32(s.amax_bits);
    s.amax_bits = 0;
    s.updates += 1;
}

FP8AMP_HD bool scale_due(const ScalingState &s) { return !s.current && s.updates % s.interval == 0; }

FP8AMP_HD void apply_scale(ScalingState &s, float history_amax) {
    const float scale = compute_scale(s, history_amax, s.scale);
    s.scale = scale;
    s.scale_inv = 1.0f / scale;
}

}  // namespace fp8amp::kernels
