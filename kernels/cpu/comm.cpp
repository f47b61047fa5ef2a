// CPU reference of the communicator's device compute (kernels/comm.hpp): plain loops over the shared
// inline arithmetic, the bytes the CUDA kernels must reproduce.
#include <algorithm>
#include <cstring>

#include "comm.hpp"
#include "convert.hpp"
#include "error.hpp"

namespace fp8amp::kernels {
namespace {

// Calls visit(k, value) with the k-th value of src: FP8 codes times their scale_inv (scaled(): a NaN
// keeps its sign), wide dtypes as they are.
template <class Visit>
void for_each_real(const void *src, fp8amp_dtype dtype, const float *scale_inv, int64_t n, Visit &&visit) {
    const bool fp8 = dtype == FP8AMP_DTYPE_E4M3 || dtype == FP8AMP_DTYPE_E5M2;
    const float s = fp8 ? *scale_inv : 1.0f;
    cpu::for_each_value(src, dtype, static_cast<size_t>(n), [&](size_t k, float v) { visit(k, fp8 ? scaled(v, s) : v); });
}

class CpuCommCompute final : public CommCompute {
public:
    void memset_async(void *dst, int value, size_t nbytes, void *) override { std::memset(dst, value, nbytes); }
    void add_count(unsigned long long *dst, const unsigned long long *src, void *) override { *dst += *src; }
    void copy_async(void *dst, const void *src, size_t nbytes, void *) override {
        if (nbytes) std::memmove(dst, src, nbytes);
    }
    void to_host(void *dst, const void *src, size_t nbytes, void *) override { std::memcpy(dst, src, nbytes); }
    void from_host(void *dst, const void *src, size_t nbytes, void *) override { std::memcpy(dst, src, nbytes); }

    void amax(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n, uint32_t *amax_bits,
              void *) override {
        uint32_t m = *amax_bits;
        for_each_real(src, dtype, src_scale_inv, n, [&](size_t, float v) { m = std::max(m, amax_bits_of(v)); });
        *amax_bits = m;
    }

    void quantize(const void *src, fp8amp_dtype dtype, const float *src_scale_inv, int64_t n,
                  const uint32_t *amax_bits, fp8amp_dtype wire, uint8_t *dst, float *scale_inv_out,
                  unsigned long long *saturated, void *) override {
        const float fp8_max = comm_fp8_max(wire);
        const float s = comm_scale(fp8_max, *amax_bits);
        unsigned long long sat = 0;
        for_each_real(src, dtype, src_scale_inv, n, [&](size_t k, float v) {
            const float y = scaled(v, s);
            sat += comm_saturates(wire, y);
            dst[k] = comm_encode(wire, y);
        });
        if (scale_inv_out) *scale_inv_out = 1.0f / s;
        *saturated += sat;
    }

    void accumulate(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                    const float *wire_scale_inv, bool average, float *dst, uint32_t *amax_bits, void *) override {
        const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
        uint32_t m = amax_bits ? *amax_bits : 0;
        for (int64_t k = 0; k < n; ++k) {
            const float v = comm_reduce(wire, nranks, f, [&](int j) { return src[j * stride + k]; });
            if (dst) dst[k] = v;
            m = std::max(m, amax_bits_of(v));
        }
        if (amax_bits) *amax_bits = m;
    }

    // The same values as accumulate, quantized as requantize does (scaled() then the codec).
    void accumulate_quantize(const uint8_t *src, int64_t stride, int nranks, int64_t n, fp8amp_dtype wire,
                             const float *wire_scale_inv, bool average, const uint32_t *amax_bits, fp8amp_dtype format,
                             uint8_t *dst, unsigned long long *saturated, void *) override {
        const float f = comm_reduce_factor(*wire_scale_inv, nranks, average);
        const float s = comm_scale(comm_fp8_max(format), *amax_bits);
        unsigned long long sat = 0;
        for (int64_t k = 0; k < n; ++k) {
            const float y = scaled(comm_reduce(wire, nranks, f, [&](int j) { return src[j * stride + k]; }), s);
            sat += comm_saturates(format, y);
            dst[k] = comm_encode(format, y);
        }
        *saturated += sat;
    }

    void reduce_requantize(const uint8_t *src, int64_t stride, int nranks, int own, const OwnInput &in, int64_t n,
                           fp8amp_dtype wire, fp8amp_dtype format, uint8_t *dst, const OwnOutput &out,
                           unsigned long long *saturated, void *) override {
        const float s = comm_scale(comm_fp8_max(wire), *in.amax_bits);
        const float g = comm_requant_factor(wire, format, nranks);
        unsigned long long sat = 0;
        // store(k, code): what element k of the output gets besides dst[k].
        auto pass = [&](auto &&store) {
            for_each_real(in.data, in.dtype, in.scale_inv, n, [&](size_t k, float v) {
                const float q = scaled(v, s);  // as quantize: this rank's code, never stored
                sat += comm_saturates(wire, q);
                const uint8_t mine = comm_encode(wire, q);
                const float y = comm_reduce(wire, nranks, g, [&](int j) { return j == own ? mine : src[j * stride + k]; });
                sat += comm_saturates(format, y);
                dst[k] = comm_encode(format, y);
                store(k, dst[k]);
            });
        };
        if (!out.data) {
            pass([](size_t, uint8_t) {});
        } else if (out.dtype == format) {
            pass([codes = static_cast<uint8_t *>(out.data)](size_t k, uint8_t c) { codes[k] = c; });
        } else {
            const float si = *out.scale_inv;  // as dequantize: decode(code) * scale_inv, rounded once
            cpu::with_store(out.data, out.dtype, [&](auto st) {
                pass([&](size_t k, uint8_t c) { st(k, scaled(comm_decode(format, c), si)); });
            });
        }
        *saturated += sat;
    }

    void all_reduce_scales(const uint32_t *amax_bits, int64_t count, fp8amp_dtype wire, fp8amp_dtype format,
                           int nranks, bool average, float *wire_scale_inv, float *out_scale_inv, void *) override {
        for (int64_t k = 0; k < count; ++k) {
            const float si = 1.0f / comm_scale(comm_fp8_max(wire), amax_bits[k]);
            wire_scale_inv[k] = si;
            out_scale_inv[k] = comm_requant_scale_inv(si, wire, format, nranks, average);
        }
    }

    void requantize(const float *src, int64_t n, const uint32_t *amax_bits, fp8amp_dtype format, uint8_t *dst,
                    float *scale_inv_out, unsigned long long *saturated, void *stream) override {
        quantize(src, FP8AMP_DTYPE_F32, nullptr, n, amax_bits, format, dst, scale_inv_out, saturated, stream);
    }

    void scale_inv(const uint32_t *amax_bits, fp8amp_dtype format, float *scale_inv_out, void *) override {
        *scale_inv_out = 1.0f / comm_scale(comm_fp8_max(format), *amax_bits);
    }

    void dequantize(const uint8_t *src, fp8amp_dtype format, const float *scale_inv, int64_t n, void *dst,
                    fp8amp_dtype dtype, void *) override {
        cpu::with_store(dst, dtype, [&](auto store) {
            for_each_real(src, format, scale_inv, n, [&](size_t k, float v) { store(k, v); });
        });
    }

    void convert(const float *src, int64_t n, void *dst, fp8amp_dtype dtype, void *) override {
        cpu::with_store(dst, dtype, [&](auto store) {
            for (int64_t k = 0; k < n; ++k) store(static_cast<size_t>(k), src[k]);
        });
    }
};

}  // namespace

std::unique_ptr<CommCompute> make_cpu_comm_compute() { return std::make_unique<CpuCommCompute>(); }

}  // namespace fp8amp::kernels
