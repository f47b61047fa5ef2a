// The CUDA backend: the kernels::cuda functions of kernels.hpp on one device and the context's stream.
// Plain C++ (no CUDA header): it is built with or without CUDA; without it, the kernels::cuda stubs
// of cuda_disabled.cpp answer NOT_SUPPORTED with the reason (so no CUDA context can be made, and
// device_count is 0 with that reason). It owns the device's cuBLASLt state (the GemmEngine with its
// plan cache), made on first use; memory core allocates through the context's allocator (the GEMM
// workspace, the column-sum partials, the amax word, the optimizer's partials) comes in as arguments.
#include "backend.hpp"
#include "comm.hpp"
#include "comm_transport.hpp"
#include "error.hpp"
#include "kernels.hpp"
#include "activation.hpp"
#include "norm.hpp"

namespace fp8amp::kernels {
namespace {

// The rows/dims FP8 GEMMs on cuBLASLt can take: every leading dimension a multiple of 16 bytes.
constexpr int64_t kFp8Multiple = 16;
// FP8 GEMMs (with their quantization) beat BF16 from about this many multiply-adds on an H100
// (docs/performance.md, "FP8 or BF16": the crossover measured by bench/bench_linear.py).
constexpr double kFp8MinMacs = 2048.0 * 2048.0 * 2048.0;

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int32_t index) : Backend({FP8AMP_DEVICE_CUDA, index}) {}

    int index() const { return device_.index; }

    void set_stream(void *stream, bool order_after_current) override {
        if (order_after_current && stream != stream_) cuda::stream_join(index(), stream_, stream);
        stream_ = stream;
    }

    void *malloc(size_t nbytes) override { return cuda::malloc(index(), nbytes); }
    void free(void *ptr) noexcept override { cuda::free(index(), ptr); }
    std::string foreign_memory(const void *data) const override {
        const int owner = cuda::pointer_device(data);
        if (owner == index()) return {};
        return owner < 0 ? std::string("host memory") : "memory of cuda:" + std::to_string(owner);
    }
    void copy_to_device(void *dst, const void *src, size_t nbytes) override {
        cuda::copy_to_device(index(), stream_, dst, src, nbytes);
    }
    void copy_to_host(void *dst, const void *src, size_t nbytes) override {
        cuda::copy_to_host(index(), stream_, dst, src, nbytes);
    }
    void copy_on_device(void *dst, const void *src, size_t nbytes) override {
        cuda::copy_device_to_device(index(), stream_, dst, src, nbytes);
    }
    void memset(void *dst, int value, size_t nbytes) override { cuda::memset(index(), stream_, dst, value, nbytes); }
    void synchronize() override { cuda::synchronize(index(), stream_); }

    void cast(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
              size_t n) override {
        cuda::cast(index(), stream, src, src_dtype, dst, dst_dtype, n);
    }
    void quantize(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                  const QuantizeTarget &target) override {
        cuda::quantize(index(), stream, src, src_dtype, dst, dst_dtype, n, target);
    }
    void quantize_transpose(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                            fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target) override {
        cuda::quantize_transpose(index(), stream, src, src_dtype, dst, dst_t, dst_dtype, rows, cols, target);
    }
    void dequantize(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                    size_t n, const float *scale_inv) override {
        cuda::dequantize(index(), stream, src, src_dtype, dst, dst_dtype, n, scale_inv);
    }
    void column_sum(void *stream, const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst,
                    bool accumulate, float *partial, float *) override {
        cuda::column_sum(index(), stream, src, src_dtype, rows, cols, dst, accumulate, partial);
    }
    void transpose_bytes(void *stream, const void *src, void *dst, size_t rows, size_t cols) override {
        cuda::transpose_bytes(index(), stream, src, dst, rows, cols);
    }
    void gemm(void *stream, const GemmArgs &args, void *workspace, size_t workspace_bytes, float *) override {
        cuda::gemm(gemm_engine(), index(), stream, args, workspace, workspace_bytes);
    }
    void gemm_prepare(const GemmArgs &args, size_t workspace_bytes) override {
        cuda::gemm_prepare(gemm_engine(), index(), args, workspace_bytes);
    }

    size_t gemm_host_scratch_floats(const GemmArgs &) const override { return 0; }
    size_t column_sum_host_scratch_floats(size_t) const override { return 0; }
    size_t column_sum_partial_rows() const override { return kColumnSumChunks; }
    // 32 MiB: what cuBLASLt's Hopper kernels ask for at most (PyTorch and Transformer Engine use the same).
    size_t gemm_workspace_bytes() const override { return size_t{32} << 20; }

    fp8amp_dtype wide_gemm_dtype() const override { return FP8AMP_DTYPE_BF16; }
    std::string fp8_gemm_unsupported_reason() const override { return cuda::fp8_gemm_unsupported_reason(index()); }
    std::string fp8_gemm_shape_unsupported_reason(int64_t m, int64_t n, int64_t k, bool training) const override {
        if (k % kFp8Multiple || n % kFp8Multiple)
            return "FP8 GEMMs on cuBLASLt need in_features and out_features to be multiples of 16; this Linear is " +
                   std::to_string(k) + " -> " + std::to_string(n);
        if (training && m % kFp8Multiple)
            return "the FP8 weight-gradient GEMM sums over the " + std::to_string(m) +
                   " rows of x, which must then be a multiple of 16 (or run with training = 0)";
        return {};
    }
    bool fp8_gemm_pays_off(int64_t m, int64_t n, int64_t k) const override {
        const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
        return macs >= kFp8MinMacs;
    }
    bool gemm_needs_f32_output(bool fp8_operands, fp8amp_dtype operand_dtype, fp8amp_dtype d_dtype) const override {
        return !fp8_operands && d_dtype == FP8AMP_DTYPE_F16 && operand_dtype != FP8AMP_DTYPE_F16;
    }
    size_t gemm_output_alignment() const override { return 16; }

    // The kernel max-reduces into a device word: zeroed first, read back after.
    size_t amax_scratch_bytes() const override { return sizeof(uint32_t); }
    uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n, void *scratch) override {
        uint32_t bits = 0;
        cuda::copy_to_device(index(), stream_, scratch, &bits, sizeof bits);
        cuda::amax(index(), stream_, src, src_dtype, n, static_cast<uint32_t *>(scratch));
        cuda::copy_to_host(index(), stream_, &bits, scratch, sizeof bits);
        return bits;
    }
    void update_scaling(ScalingState *const *metas, size_t n) override {
        cuda::update_scaling(index(), stream_, metas, n);
    }
    void record_amax(void *stream, const void *src, fp8amp_dtype src_dtype, size_t n, ScalingState *meta) override {
        cuda::amax(index(), stream, src, src_dtype, n, &meta->amax_bits);  // atomicMax into the meta's word
    }
    void update_scaling_on(void *stream, ScalingState *meta) override {
        cuda::update_scaling(index(), stream, &meta, 1);
    }

    int adam_partial_slots() const override { return cuda::adam_grid_size(index()); }
    size_t adam_host_scratch_floats(int32_t, int64_t) const override { return 0; }
    void adam_step(const adam::StepConfig &config, int max_partials, float *) override {
        cuda::adam_step(index(), stream_, config, max_partials);
    }
    void scaler_update(adam::ScalerState *scaler, const adam::ScalerConfig &config,
                       const adam::Status *status) override {
        cuda::scaler_update(index(), stream_, scaler, config, status);
    }

    void norm_forward(const NormForwardArgs &args) override { cuda::norm_forward(index(), stream_, args); }
    size_t norm_backward_scratch_bytes(int64_t rows, int64_t d) const override {
        return cuda::norm_backward_partial_floats(rows, d) * sizeof(float);
    }
    void norm_backward(const NormBackwardArgs &args, void *scratch) override {
        cuda::norm_backward(index(), stream_, args, static_cast<float *>(scratch));
    }
    void activation_forward(const ActivationArgs &args) override { cuda::activation_forward(index(), stream_, args); }
    void activation_backward(const ActivationArgs &args) override { cuda::activation_backward(index(), stream_, args); }

    bool supports_graphs() const override { return true; }
    bool stream_is_capturing(void *stream) override { return cuda::stream_is_capturing(index(), stream); }
    void *capture_stream() override { return cuda::capture_stream(index()); }
    void begin_capture(void *stream) override { cuda::begin_capture(index(), stream); }
    Graph end_capture(void *stream) override { return cuda::end_capture(index(), stream); }
    void abort_capture(void *stream) noexcept override { cuda::abort_capture(index(), stream); }
    void launch_graph(const Graph &graph, void *stream) override {
        cuda::launch_graph(*static_cast<cuda::GraphExec *>(graph.get()), stream);
    }

    void comm_unique_id(fp8amp_comm_unique_id *id) const override { nccl_unique_id(id); }
    std::unique_ptr<CommCompute> make_comm_compute() const override { return make_cuda_comm_compute(index()); }
    std::unique_ptr<Transport> make_comm_transport(const fp8amp_comm_unique_id &id, int nranks, int rank,
                                                   CommCompute &) const override {
        return make_nccl_transport(id, nranks, rank, index());
    }
    std::unique_ptr<Transport> adopt_comm_transport(void *native) const override {
        return adopt_nccl_transport(native, index());
    }

private:
    // cuBLASLt for this context, made on first use (a context is used by one thread at a time).
    cuda::GemmEngine &gemm_engine() {
        if (!gemm_engine_) gemm_engine_ = cuda::gemm_engine_create(index());
        return *gemm_engine_;
    }
    std::shared_ptr<cuda::GemmEngine> gemm_engine_;
};

int cuda_device_count(std::string *why) { return cuda::device_count(why); }

std::unique_ptr<Backend> cuda_create(int32_t index) {
    if (index < 0) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "CUDA device index " + std::to_string(index) + " is negative");
    cuda::check_device(index);
    cuda::activation_prepare(index);  // the activation forwards' tables, into this device's memory
    return std::make_unique<CudaBackend>(index);
}

}  // namespace

extern const BackendType kCudaBackendType{FP8AMP_DEVICE_CUDA, cuda_device_count, cuda_create};

}  // namespace fp8amp::kernels
