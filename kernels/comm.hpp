// The device compute of a communicator (core/communicator.cpp): quantize onto the wire with the
// agreed scale, accumulate received FP8 chunks in float32 in a fixed rank order, requantize, and
// decode into the output. The arithmetic lives in the inline functions below, shared by the CPU
// reference (kernels/cpu/comm.cpp) and the CUDA kernels (kernels/cuda/comm.cu), so that both compute
// the same bytes; CommCompute is the per-device interface, chosen once when a communicator is made
// (the lead folds it into the per-context Backend later).
//
// Every scalar that one step computes and a later step needs (amaxes, scales) stays in the device
// memory of the communicator's context: no host synchronization between the steps, so a CUDA
// sequence can be captured in a graph.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "codec.hpp"
#include "fp8amp/fp8amp.h"
#include "scaling.hpp"

namespace fp8amp::kernels {

// The scale that maps amax onto the format's largest finite value: the delayed-scaling rule of
// scaling.hpp (compute_scale) with margin 0, no power-of-two rounding, and 1 when amax is 0, inf or
// NaN (an inf input then saturates, and is counted).
FP8AMP_HD float comm_scale(float fp8_max, uint32_t amax_bits) {
    ScalingState s{};
    s.fp8_max = fp8_max;
    return compute_scale(s, codec::bits_f32(amax_bits), 1.0f);
}

FP8AMP_HD float comm_fp8_max(fp8amp_dtype d) { return d == FP8AMP_DTYPE_E5M2 ? 57344.0f : 448.0f; }

// An FP8 code of format d (E4M3 or E5M2) for the already-scaled y, and whether it saturated.
FP8AMP_HD uint8_t comm_encode(fp8amp_dtype d, float y) {
    return static_cast<uint8_t>(d == FP8AMP_DTYPE_E5M2 ? codec::encode<codec::E5M2, true>(y)
                                                       : codec::encode<codec::E4M3, true>(y));
}
FP8AMP_HD float comm_decode(fp8amp_dtype d, uint8_t code) {
    return d == FP8AMP_DTYPE_E5M2 ? codec::decode<codec::E5M2>(code) : codec::decode<codec::E4M3>(code);
}
// Whether the scaled y saturated: it rounds (to nearest, ties to even, with an unbounded exponent)
// to a magnitude beyond the format's largest finite value -- inf included, NaN not. A y a little
// above fp8_max that still rounds to it (amax * scale is fp8_max up to the scale's rounding) did not.
// E4M3: 448 is 1.110b * 2^8 and the next value would be 480, so up to 464 inclusive (the tie goes
// to the even 448) rounds to 448. E5M2: 57344 is 1.11b * 2^15, the next 65536, and the tie 61440
// goes to the even 65536.
FP8AMP_HD bool comm_saturates(fp8amp_dtype d, float y) {
    const float a = y < 0.0f ? -y : y;
    return d == FP8AMP_DTYPE_E5M2 ? a >= 61440.0f : a > 464.0f;  // false for NaN
}

// The mean factor: the reduced value is sum * (wire scale_inv / nranks), one division (IEEE, on both
// devices) -- the mean is folded into the scale, never a separate averaging pass.
FP8AMP_HD float comm_reduce_factor(float wire_scale_inv, int nranks, bool average) {
    return average ? wire_scale_inv / static_cast<float>(nranks) : wire_scale_inv;
}

// The all-reduce's requantization (docs/communicator.md, "Algorithm", step 5): the reduced value of an
// element in the output format's scaled units is y = (sum over ranks of the decoded wire codes) * g
// with g = (1 / nranks) * (fp8_max(format) / fp8_max(wire)), the second factor an exact power of two
// (1, 2^7 or 2^-7: 448 = 7 * 2^6, 57344 = 7 * 2^13). Every decoded code is at most fp8_max(wire) in
// magnitude, so their mean is at most fp8_max(wire) and y at most fp8_max(format) (times 1 + 2^-23
// for the float32 roundings, far below the saturation threshold): requantizing with the agreed wire
// scale needs no new amax -- no second cross-rank agreement, no amax pass -- and cannot overflow.
// The same factor for the mean and the sum: the sum's output scale_inv carries the factor nranks.
FP8AMP_HD float comm_requant_factor(fp8amp_dtype wire, fp8amp_dtype format, int nranks) {
    return (1.0f / static_cast<float>(nranks)) * (comm_fp8_max(format) / comm_fp8_max(wire));
}
// The output's scale_inv for that requantization: code * it is the reduced value, the mean
// (wire_scale_inv / ratio) or the sum (wire_scale_inv * nranks / ratio), ratio = fp8_max(format) /
// fp8_max(wire) (a power of two: dividing by it is exact), at most FLT_MAX: for the sum over more
// than about 447 ranks of values near float32's largest (a wire scale_inv up to FLT_MAX / 448) the
// product would be inf, and a zero code times inf a NaN; with FLT_MAX a zero stays zero and a sum
// beyond float32's range still overflows. (Not reachable with the tests' 2 or 3 ranks.)
FP8AMP_HD float comm_requant_scale_inv(float wire_scale_inv, fp8amp_dtype wire, fp8amp_dtype format, int nranks,
                                       bool average) {
    const float ratio = comm_fp8_max(format) / comm_fp8_max(wire);
    const float v = (average ? wire_scale_inv : wire_scale_inv * static_cast<float>(nranks)) / ratio;
    return v > FLT_MAX ? FLT_MAX : v;
}

// One step of the fixed-order accumulation, sum + d, identical on both devices also for NaN: the
// first NaN in rank order stays (sign and all: the decoded NaN is the canonical one with its code's
// sign), and a NaN made by the addition itself (inf + -inf, E5M2 only) is the canonical positive one.
// Without this a NaN sum would differ between the devices: x86 returns the NaN operand (its sign
// kept) and inf + -inf as the negative default NaN, CUDA's add returns 0x7FFFFFFF for both.
FP8AMP_HD float comm_add(float sum, float d) {
    if (sum != sum) return sum;
    if (d != d) return d;
#if defined(__CUDA_ARCH__)
    const float t = __fadd_rn(sum, d);  // never contracted into an FMA
#else
    const float t = sum + d;
#endif
    return t != t ? codec::bits_f32(codec::kF32QuietNaN) : t;
}

// The reduced value of element k: (sum over j = 0..nranks-1, in that order, of decode(code_j)) times
// f = comm_reduce_factor(...), through scaled() (NaN kept, 0 * inf canonical). code(j) gives rank j's
// code. The one definition both devices and every kernel (accumulate, requantize) use.
template <class Code>
FP8AMP_HD float comm_reduce(fp8amp_dtype wire, int nranks, float f, Code &&code) {
    float sum = 0.0f;
    for (int j = 0; j < nranks; ++j) sum = comm_add(sum, comm_decode(wire, code(j)));
    return scaled(sum, f);
}

class CommCompute {
public:
    virtual ~CommCompute() = default;

    // Device memory comes from the context's allocator (core); these move bytes on the device.
    virtual void memset_async(void *dst, int value, size_t nbytes, void *stream) = 0;
    virtual void copy_async(void *dst, const void *src, size_t nbytes, void *stream) = 0;  // device to device
    // *dst += *src (device counters), in stream order: the all-reduce counts a call's saturations in
    // scratch and adds them to the communicator's count only once the call went through.
    virtual void add_count(unsigned long long *dst, const unsigned long long *src, void *stream) = 0;
    // Synchronous copies between the host and the device (the consistency check, getters).
    virtual void to_host(void *dst, const void *src, size_t nbytes, void *stream) = 0;
    virtual void from_host(void *dst, const void *src, size_t nbytes, void *stream) = 0;

    // *amax_bits = max(*amax_bits, amax_bits_of(value)) over the n values of src (dtype; FP8 codes
    // times *src_scale_inv).
    virtual void amax(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, uint32_t *amax_bits,
                      void *stream) = 0;
    // dst[k] = code of scaled(value_k, s) in `wire` with s = comm_scale(amax); *scale_inv_out = 1 / s
    // (when not null); saturated elements are added to *saturated.
    virtual void quantize(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n,
                          const uint32_t *amax_bits, fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out,
                          unsigned long long *saturated, void *stream) = 0;
    // dst[k] = (sum over j = 0..nranks-1, in that order, of decode(src[j * stride + k])) *
    // comm_reduce_factor(*wire_scale_inv, nranks, average), for k < n, in float32 (comm_reduce); amax
    // of dst folded into *amax_bits (when not null). dst may be null: the amax pass only.
    virtual void accumulate(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                            const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits,
                            void *stream) = 0;
    // The fused second pass of the all-reduce: the reduced values of accumulate (computed again from
    // the FP8 codes, never stored in float32) quantized with comm_scale(*amax_bits) of `format` into
    // dst; saturated elements added to *saturated. Identical bytes to accumulate into a float32
    // buffer then requantize.
    virtual void accumulate_quantize(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                                     const float *wire_scale_inv, bool average, const uint32_t *amax_bits,
                                     fp8amp_dtype format, uint8_t *dst, unsigned long long *saturated,
                                     void *stream) = 0;
    // This rank's own part of the all-reduce's sum (reduce_requantize): its input, read where the
    // other ranks' codes are read, and quantized there as quantize would have (comm_scale(*amax_bits)
    // of the wire, saturations counted) -- its codes are never stored nor read back.
    struct OwnInput {
        const void *data;
        fp8amp_dtype dtype;
        const float *scale_inv;  // FP8 inputs: their scale_inv; else unused
        const uint32_t *amax_bits;  // the agreed amax of its scale segment (its wire scale)
    };
    // The output elements the pass writes as well (data null: none): the requantized codes themselves
    // when dtype is `format`, else decode(code) * *scale_inv rounded once into dtype (F32, F16, BF16:
    // dequantize's bytes).
    struct OwnOutput {
        void *data;
        fp8amp_dtype dtype;
        const float *scale_inv;
    };
    // The all-reduce's one pass after the reduce-scatter: dst[k] = code in `format` of
    // scaled(sum over j = 0..nranks-1, in that order, of decode(code_j(k)),
    // comm_requant_factor(wire, format, nranks)) (comm_reduce with that factor), where code_j(k) =
    // src[j * stride + k] for every rank j but `own`, whose code is computed from own.data's element
    // k (src + own * stride is never read); saturated elements (of own's quantization; the
    // requantization cannot saturate: see comm_requant_factor) added to *saturated. Reads no device
    // scalar another piece writes, so it can run as soon as the other ranks' codes have landed.
    // out.data may be own.data (in place): each element is read before it is written.
    virtual void reduce_requantize(const uint8_t *src, int64_t stride, int nranks, int own, const OwnInput &in,
                                   int64_t n, fp8amp_dtype wire, fp8amp_dtype format, uint8_t *dst,
                                   const OwnOutput &out, unsigned long long *saturated, void *stream) = 0;
    // The all-reduce's scales from the agreed amaxes, for count consecutive scale segments (a tensor,
    // or a tensor's part in one scale region: core/communicator.cpp) of one output format:
    // wire_scale_inv[k] = 1 / comm_scale(amax_bits[k]) of `wire`, out_scale_inv[k] =
    // comm_requant_scale_inv(that, wire, format, nranks, average).
    virtual void all_reduce_scales(const uint32_t *amax_bits, int64_t count, fp8amp_dtype wire, fp8amp_dtype format,
                                   int nranks, bool average, float *wire_scale_inv, float *out_scale_inv,
                                   void *stream) = 0;
    // dst = codes of f32 src scaled by comm_scale(*amax_bits) in `format`; *scale_inv_out = 1 / s.
    virtual void requantize(const float *src, int64_t n, const uint32_t *amax_bits, fp8amp_dtype format, uint8_t *dst,
                            float *scale_inv_out, unsigned long long *saturated, void *stream) = 0;
    // dst (dtype F32/F16/BF16) = decode(src) * *scale_inv, rounded once into dtype.
    virtual void dequantize(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n, void *dst,
                            fp8amp_dtype dtype, void *stream) = 0;
    // *scale_inv_out = 1 / comm_scale(*amax_bits) of `format`: the scale_inv requantize uses.
    virtual void scale_inv(const uint32_t *amax_bits, fp8amp_dtype format, float *scale_inv_out, void *stream) = 0;
    // dst (dtype F32/F16/BF16) = src rounded into dtype.
    virtual void convert(const float *src, int64_t n, void *dst, fp8amp_dtype dtype, void *stream) = 0;

    // Pipelining (core/communicator.cpp overlaps the conversions with the transfers): the stream the
    // transport's operations go on, and ordering between the two through event slots
    // (kEventSlots): record(slot, s) marks the work enqueued on s so far, wait(slot, t) makes t wait
    // for the last mark of that slot (at the time of the call, as cudaStreamWaitEvent). CPU: one
    // synchronous stream, nothing to do. CUDA: a second stream of the context's device (created on
    // first use, the highest priority so that NCCL's blocks are scheduled first) and events; both
    // work under graph capture (the fork and the join are captured).
    // Slot 7 hands the all-reduce's per-piece agreed amaxes back from the agreement stream
    // (agreement_stream); slot 6 joins that stream back after a refused call (its amaxes run there).
    static constexpr int kEventSlots = 8;
    // The grid of the launches that follow (until changed): at most max_blocks blocks (grid-stride
    // loops beyond), 0 for as many as the work needs. Changes no byte of any result (every value is
    // computed element by element; amaxes and saturation counts are a max and a sum). CUDA only: a
    // grid smaller than the device leaves multiprocessors (and memory bandwidth) to the NCCL kernels
    // running on the other stream beside the conversions.
    virtual void set_grid_limit(int max_blocks) { (void)max_blocks; }
    virtual void *side_stream(void *stream) { return stream; }
    // A third stream for the all-reduce's small per-piece agreements of the amaxes (CUDA: created
    // with side_stream, the same highest priority), so that they do not queue behind the large
    // transfers on side_stream's stream: an agreement there would wait for the piece on the wire.
    // CPU: the same stream.
    virtual void *agreement_stream(void *stream) { return stream; }
    virtual void record(int slot, void *stream) { (void)slot, (void)stream; }
    virtual void wait(int slot, void *stream) { (void)slot, (void)stream; }
};

std::unique_ptr<CommCompute> make_cpu_comm_compute();
// The CUDA kernels on `device` (kernels/cuda/comm.cu); throws NOT_SUPPORTED in a build without CUDA.
std::unique_ptr<CommCompute> make_cuda_comm_compute(int device);

}  // namespace fp8amp::kernels
