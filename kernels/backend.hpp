// The device backend: everything core asks of a device, behind one interface, chosen once when a
// Context is made (make_backend). Core never names a device type to pick a code path: it calls
// ctx.backend().X(...), and where the backends differ in more than the kernel they run (the CPU runs
// synchronously on host memory; CUDA queues on a stream, needs device scratch, cuBLASLt's workspace
// and plans, host staging of results) the difference is a method here whose name says what it is.
//
// Layering: capi -> core -> kernels. This header includes no CUDA header; the CUDA backend
// (kernels/cuda/cuda_backend.cpp) reaches CUDA only through the kernels::cuda functions of
// kernels.hpp, which a build without CUDA provides as NOT_SUPPORTED stubs (cuda_disabled.cpp).
// Adding a backend (ROCm, a test double): a folder with a Backend subclass and a BackendType, and one
// line in kernels/backend.cpp's list. Every method reports failure by throwing fp8amp::Error.
//
// Memory: a backend allocates only when the context has no allocator hook (malloc/free); every
// scratch the kernels need beyond that is allocated by core through the context's allocator (so that
// the hooks see it), in the size the backend states (gemm_workspace_bytes, column_sum_partial_rows,
// amax_scratch_bytes, adam_partial_slots), or is host scratch the caller keeps (the *_host_scratch_
// floats), so that no kernel allocates host memory after an earlier step of a call changed state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fp8amp/fp8amp.h"
#include "kernels.hpp"  // GemmArgs, QuantizeTarget; no CUDA

namespace fp8amp::kernels {

class CommCompute;  // comm.hpp
class Transport;    // comm_transport.hpp
struct NormForwardArgs;   // norm.hpp
struct NormBackwardArgs;  // norm.hpp
struct ActivationArgs;    // activation.hpp

class Backend {
public:
    virtual ~Backend() = default;
    Backend(const Backend &) = delete;
    Backend &operator=(const Backend &) = delete;

    const fp8amp_device &device() const { return device_; }

    // ---- the stream work is queued on ------------------------------------------------------------
    // The stream the queue-ordered methods below use (CUDA: the caller's cudaStream_t; null is the
    // legacy default stream; the CPU has none: always null).
    void *stream() const { return stream_; }
    // Validates and adopts `stream` (INVALID_ARGUMENT on a backend that has no streams). When
    // order_after_current, the new stream waits for the work the current one has queued so far
    // (memory the context reuses across calls was last used in that order).
    virtual void set_stream(void *stream, bool order_after_current) = 0;

    // ---- memory (the backend's own allocator: used when the context has no allocator hook) ----------
    virtual void *malloc(size_t nbytes) = 0;  // OUT_OF_MEMORY when refused; aligned to 256 bytes
    virtual void free(void *ptr) noexcept = 0;
    // Empty when `data` can be this device's memory, else what it is instead ("host memory", "memory
    // of cuda:1"), for the DEVICE_MISMATCH message of a tensor that borrows it.
    virtual std::string foreign_memory(const void *data) const = 0;
    // Host <-> device memory copies, ordered after the stream's work and waited for (synchronous).
    virtual void copy_to_device(void *dst, const void *src, size_t nbytes) = 0;
    virtual void copy_to_host(void *dst, const void *src, size_t nbytes) = 0;
    // Device memory to device memory and memset, queued on the stream (CPU: done now).
    virtual void copy_on_device(void *dst, const void *src, size_t nbytes) = 0;
    virtual void memset(void *dst, int value, size_t nbytes) = 0;
    // Waits for the work queued on the stream (CPU: nothing queues).
    virtual void synchronize() = 0;

    // ---- the steps of a LaunchList: queued on `stream`, which may be a capture stream ---------------
    // Same semantics as the kernels:: functions of kernels.hpp; host_scratch: at least the floats the
    // *_host_scratch_floats methods ask for (null when they ask for none).
    virtual void cast(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                      size_t n) = 0;
    virtual void quantize(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                          size_t n, const QuantizeTarget &target) = 0;
    virtual void quantize_transpose(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                                    fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target) = 0;
    virtual void dequantize(void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                            size_t n, const float *scale_inv) = 0;
    // partial: column_sum_partial_rows() x cols floats of device memory (null when 0 rows).
    virtual void column_sum(void *stream, const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols,
                            float *dst, bool accumulate, float *partial, float *host_scratch) = 0;
    virtual void transpose_bytes(void *stream, const void *src, void *dst, size_t rows, size_t cols) = 0;
    // workspace: gemm_workspace_bytes() of device memory (null when 0).
    virtual void gemm(void *stream, const GemmArgs &args, void *workspace, size_t workspace_bytes,
                      float *host_scratch) = 0;
    // Makes whatever gemm() will need for these arguments (CUDA: the cuBLASLt plan, host memory and a
    // heuristic query) before a list's first step is launched, so that a failure changes nothing.
    virtual void gemm_prepare(const GemmArgs &args, size_t workspace_bytes) = 0;

    // The scratch the steps need: host floats the caller holds, device memory core allocates.
    virtual size_t gemm_host_scratch_floats(const GemmArgs &args) const = 0;
    virtual size_t column_sum_host_scratch_floats(size_t cols) const = 0;
    virtual size_t column_sum_partial_rows() const = 0;  // rows of `partial` (x cols floats)
    virtual size_t gemm_workspace_bytes() const = 0;

    // ---- what the GEMMs can do (the Linear's choice of GEMM and of output staging) -------------------
    // The operand dtype of the non-FP8 GEMMs (CUDA: BF16, cuBLASLt's fast path; CPU: F32).
    virtual fp8amp_dtype wide_gemm_dtype() const = 0;
    // Empty when the device can run FP8 GEMMs, else the reason.
    virtual std::string fp8_gemm_unsupported_reason() const = 0;
    // Empty when an FP8 GEMM of this Linear shape (m rows of x; training adds the weight-gradient
    // GEMM, which sums over m) can run, else the reason.
    virtual std::string fp8_gemm_shape_unsupported_reason(int64_t m, int64_t n, int64_t k, bool training) const = 0;
    // Whether AUTO picks FP8 for an m x n x k GEMM (CUDA: above the size where it beats BF16).
    virtual bool fp8_gemm_pays_off(int64_t m, int64_t n, int64_t k) const = 0;
    // Whether a GEMM of these operands cannot write d_dtype itself: it writes F32 and one conversion
    // rounds that (cuBLASLt's 16-bit GEMMs have no F16 output for BF16 operands).
    virtual bool gemm_needs_f32_output(bool fp8_operands, fp8amp_dtype operand_dtype, fp8amp_dtype d_dtype) const = 0;
    // The alignment, in bytes, the GEMM needs of its output (a misaligned one is made in aligned
    // scratch and copied; 1: any).
    virtual size_t gemm_output_alignment() const = 0;

    // ---- scaling, on the context's stream ------------------------------------------------------------
    // max |src| as amax bits (scaling.hpp), waited for. scratch: amax_scratch_bytes() of device memory
    // (null when 0) the result is reduced into before it is read back.
    virtual size_t amax_scratch_bytes() const = 0;
    virtual uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n, void *scratch) = 0;
    virtual void update_scaling(ScalingState *const *metas, size_t n) = 0;
    // The same two as steps of a LaunchList, on `stream` (which may be capturing): meta->amax_bits =
    // max(meta->amax_bits, max |src|) without waiting, and one meta's update.
    virtual void record_amax(void *stream, const void *src, fp8amp_dtype src_dtype, size_t n, ScalingState *meta) = 0;
    virtual void update_scaling_on(void *stream, ScalingState *meta) = 0;

    // ---- the optimizer, on the context's stream ------------------------------------------------------
    // How many adam::Partial slots of device memory the step needs (CUDA: its persistent grid; 0: none).
    virtual int adam_partial_slots() const = 0;
    // The host floats the step needs for parameters of up to max_numel elements (0: none).
    virtual size_t adam_host_scratch_floats(int32_t block_size, int64_t max_numel) const = 0;
    virtual void adam_step(const adam::StepConfig &config, int max_partials, float *host_scratch) = 0;
    virtual void scaler_update(adam::ScalerState *scaler, const adam::ScalerConfig &config,
                               const adam::Status *status) = 0;

    // ---- fused normalization (kernels/norm.hpp), queued on the context's stream ----------------------
    virtual void norm_forward(const NormForwardArgs &args) = 0;
    // Bytes of device memory norm_backward needs as scratch (core allocates them through the context).
    virtual size_t norm_backward_scratch_bytes(int64_t rows, int64_t d) const = 0;
    virtual void norm_backward(const NormBackwardArgs &args, void *scratch) = 0;
    // Fused activations (kernels/activation.hpp), queued on the context's stream.
    virtual void activation_forward(const ActivationArgs &args) = 0;
    virtual void activation_backward(const ActivationArgs &args) = 0;

    // ---- graphs: a LaunchList's launches captured once and replayed as one launch ---------------------
    // An instantiated graph, opaque to core (destroyed with its last reference).
    using Graph = std::shared_ptr<void>;
    virtual bool supports_graphs() const = 0;  // false: the methods below are never called
    virtual bool stream_is_capturing(void *stream) = 0;
    // A private stream of the device to capture on (it never runs work; one per device, so the
    // caller serializes captures).
    virtual void *capture_stream() = 0;
    virtual void begin_capture(void *stream) = 0;
    virtual Graph end_capture(void *stream) = 0;
    virtual void abort_capture(void *stream) noexcept = 0;
    virtual void launch_graph(const Graph &graph, void *stream) = 0;

    // ---- communicators (docs/communicator.md): what a communicator of this device is made of -------
    // The id one rank makes and every rank passes to make_comm_transport (CPU: random bytes with a
    // tag, checked there; CUDA: NCCL's own ncclUniqueId).
    virtual void comm_unique_id(fp8amp_comm_unique_id *id) const = 0;
    // The device compute of the collectives (quantize, fixed-order FP32 accumulation, requantize).
    virtual std::unique_ptr<CommCompute> make_comm_compute() const = 0;
    // The transport between the ranks (CPU: local for one rank, else MPI; CUDA: NCCL), for this
    // process's rank of nranks; compute serves a local transport's copies.
    virtual std::unique_ptr<Transport> make_comm_transport(const fp8amp_comm_unique_id &id, int nranks, int rank,
                                                           CommCompute &compute) const = 0;
    // A transport over the caller's own communicator (CPU: a pointer to an MPI_Comm; CUDA: an ncclComm_t).
    virtual std::unique_ptr<Transport> adopt_comm_transport(void *native) const = 0;

protected:
    explicit Backend(fp8amp_device device) : device_(device) {}
    fp8amp_device device_;
    void *stream_ = nullptr;
};

// One kind of device: how many there are, and how to make the backend of one of them. Each backend's
// folder defines one (cpu/cpu_backend.cpp, cuda/cuda_backend.cpp); backend.cpp lists them.
struct BackendType {
    fp8amp_device_type type;
    // Number of usable devices; 0 when there are none (then *why, if given, says why).
    int (*device_count)(std::string *why);
    // The backend of device `index`: INVALID_ARGUMENT for an index that cannot name a device of this
    // type, NOT_SUPPORTED (with the reason) or DEVICE_MISMATCH when it cannot be used.
    std::unique_ptr<Backend> (*create)(int32_t index);
};

// The registered type of that value of fp8amp_device_type, or null when there is none.
const BackendType *find_backend_type(int32_t type);

}  // namespace fp8amp::kernels
