// The CPU backend: the portable reference kernels of kernels::cpu on host memory. Everything runs
// synchronously on the calling thread, so there is no stream, nothing to wait for, and no graphs; the
// kernels' scratch is host memory the caller holds (the *_host_scratch_floats).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend.hpp"
#include "comm.hpp"
#include "comm_transport.hpp"
#include "error.hpp"
#include "kernels.hpp"
#include "activation.hpp"
#include "norm.hpp"

namespace fp8amp::kernels {
namespace {

constexpr size_t kHostAlignment = 256;  // what cudaMalloc gives; lets every kernel vectorize

class CpuBackend final : public Backend {
public:
    CpuBackend() : Backend({FP8AMP_DEVICE_CPU, 0}) {}

    void set_stream(void *stream, bool) override {
        if (stream) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "a CPU context has no CUDA stream; pass NULL");
    }

    void *malloc(size_t nbytes) override {
        // Sizes beyond PTRDIFF_MAX cannot be addressed as one object: refuse them before the allocator.
        const size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
        void *data = (rounded >= nbytes && rounded <= static_cast<size_t>(PTRDIFF_MAX))
                         ? std::aligned_alloc(kHostAlignment, rounded)
                         : nullptr;
        if (!data)
            fail(FP8AMP_ERROR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(nbytes) + " bytes of host memory");
        return data;
    }
    void free(void *ptr) noexcept override { std::free(ptr); }
    // Host memory cannot be told from any other: every pointer is taken for host memory.
    std::string foreign_memory(const void *) const override { return {}; }
    void copy_to_device(void *dst, const void *src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
    void copy_to_host(void *dst, const void *src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
    void copy_on_device(void *dst, const void *src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
    void memset(void *dst, int value, size_t nbytes) override { std::memset(dst, value, nbytes); }
    void synchronize() override {}

    void cast(void *, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n) override {
        cpu::cast(src, src_dtype, dst, dst_dtype, n);
    }
    void quantize(void *, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                  const QuantizeTarget &target) override {
        cpu::quantize(src, src_dtype, dst, dst_dtype, n, target);
    }
    void quantize_transpose(void *, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                            fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target) override {
        cpu::quantize_transpose(src, src_dtype, dst, dst_t, dst_dtype, rows, cols, target);
    }
    void dequantize(void *, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                    const float *scale_inv) override {
        cpu::dequantize(src, src_dtype, dst, dst_dtype, n, scale_inv);
    }
    void column_sum(void *, const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst,
                    bool accumulate, float *, float *host_scratch) override {
        cpu::column_sum(src, src_dtype, rows, cols, dst, accumulate, host_scratch);
    }
    void transpose_bytes(void *, const void *src, void *dst, size_t rows, size_t cols) override {
        cpu::transpose_bytes(src, dst, rows, cols);
    }
    void gemm(void *, const GemmArgs &args, void *, size_t, float *host_scratch) override {
        cpu::gemm(args, host_scratch);
    }
    void gemm_prepare(const GemmArgs &, size_t) override {}

    size_t gemm_host_scratch_floats(const GemmArgs &args) const override { return cpu::gemm_scratch_floats(args); }
    size_t column_sum_host_scratch_floats(size_t cols) const override { return cols; }
    size_t column_sum_partial_rows() const override { return 0; }
    size_t gemm_workspace_bytes() const override { return 0; }

    fp8amp_dtype wide_gemm_dtype() const override { return FP8AMP_DTYPE_F32; }
    std::string fp8_gemm_unsupported_reason() const override { return {}; }
    // The CPU backend exists for FP8 numerics, not speed: FP8 runs there for any shape.
    std::string fp8_gemm_shape_unsupported_reason(int64_t, int64_t, int64_t, bool) const override { return {}; }
    bool fp8_gemm_pays_off(int64_t, int64_t, int64_t) const override { return true; }
    bool gemm_needs_f32_output(bool, fp8amp_dtype, fp8amp_dtype) const override { return false; }
    size_t gemm_output_alignment() const override { return 1; }

    size_t amax_scratch_bytes() const override { return 0; }
    uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n, void *) override {
        return cpu::amax(src, src_dtype, n);
    }
    void update_scaling(ScalingState *const *metas, size_t n) override { cpu::update_scaling(metas, n); }
    void record_amax(void *, const void *src, fp8amp_dtype src_dtype, size_t n, ScalingState *meta) override {
        meta->amax_bits = std::max(meta->amax_bits, cpu::amax(src, src_dtype, n));
    }
    void update_scaling_on(void *, ScalingState *meta) override { cpu::update_scaling(&meta, 1); }

    int adam_partial_slots() const override { return 0; }
    size_t adam_host_scratch_floats(int32_t block_size, int64_t max_numel) const override {
        return cpu::adam_scratch_floats(block_size, max_numel);
    }
    void adam_step(const adam::StepConfig &config, int, float *host_scratch) override {
        cpu::adam_step(config, host_scratch);
    }
    void scaler_update(adam::ScalerState *scaler, const adam::ScalerConfig &config,
                       const adam::Status *status) override {
        cpu::scaler_update(scaler, config, status);
    }

    void norm_forward(const NormForwardArgs &args) override { cpu::norm_forward(args); }
    size_t norm_backward_scratch_bytes(int64_t rows, int64_t d) const override {
        return cpu::norm_backward_scratch_floats(rows, d) * sizeof(float);
    }
    void norm_backward(const NormBackwardArgs &args, void *scratch) override {
        cpu::norm_backward(args, static_cast<float *>(scratch));
    }
    void activation_forward(const ActivationArgs &args) override { cpu::activation_forward(args); }
    void activation_backward(const ActivationArgs &args) override { cpu::activation_backward(args); }

    bool supports_graphs() const override { return false; }
    [[noreturn]] static void no_graphs() { fail(FP8AMP_ERROR_INTERNAL, "the CPU backend has no graphs"); }
    bool stream_is_capturing(void *) override { return false; }
    void *capture_stream() override { no_graphs(); }
    void begin_capture(void *) override { no_graphs(); }
    Graph end_capture(void *) override { no_graphs(); }
    void abort_capture(void *) noexcept override {}
    void launch_graph(const Graph &, void *) override { no_graphs(); }

    void comm_unique_id(fp8amp_comm_unique_id *id) const override { mpi_unique_id(id); }
    std::unique_ptr<CommCompute> make_comm_compute() const override { return make_cpu_comm_compute(); }
    std::unique_ptr<Transport> make_comm_transport(const fp8amp_comm_unique_id &id, int nranks, int rank,
                                                   CommCompute &compute) const override {
        check_cpu_unique_id(id);
        // One rank needs no MPI: a send to itself is a copy.
        if (nranks == 1) return make_local_transport(copy_on_host, &compute);
        return make_mpi_transport(id, nranks, rank);
    }
    std::unique_ptr<Transport> adopt_comm_transport(void *native) const override { return adopt_mpi_transport(native); }

private:
    static void copy_on_host(void *compute, void *dst, const void *src, size_t n, void *stream) {
        static_cast<CommCompute *>(compute)->copy_async(dst, src, n, stream);
    }
};

int cpu_device_count(std::string *) { return 1; }

std::unique_ptr<Backend> cpu_create(int32_t index) {
    if (index != 0) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "a CPU device has index 0, not " + std::to_string(index));
    return std::make_unique<CpuBackend>();
}

}  // namespace

extern const BackendType kCpuBackendType{FP8AMP_DEVICE_CPU, cpu_device_count, cpu_create};

}  // namespace fp8amp::kernels
