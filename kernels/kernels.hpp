// The numeric kernels and the arguments they take. Core reaches them only through the Backend of its
// context (backend.hpp: cpu/cpu_backend.cpp and cuda/cuda_backend.cpp call the functions below), and
// uses this header for the argument types. Nothing here includes CUDA: the CUDA side (kernels/cuda)
// is compiled only when the build has CUDA, and kernels/cuda/cuda_disabled.cpp provides the same
// functions, answering NOT_SUPPORTED, otherwise.
// Every function reports failure by throwing fp8amp::Error (kernels/error.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fp8amp/fp8amp.h"

namespace fp8amp::kernels {

struct ScalingState;  // kernels/scaling.hpp
namespace adam {
struct StepConfig;    // kernels/adam.hpp
struct ScalerState;
struct ScalerConfig;
struct Status;
}  // namespace adam

// What a quantize writes besides the FP8 data: the meta it records into (amax, statistics; its scale,
// under current scaling) and the tensor's own scale_inv copy.
struct QuantizeTarget {
    ScalingState *meta;            // device (or host, on the CPU backend) memory
    float *scale_inv;              // the destination tensor's scale_inv slot
    float *scale_inv_t = nullptr;  // the transposed copy's slot (quantize_transpose), or null
    // Host-side mirrors of the meta's configuration, so launches never read device memory:
    bool current = false;  // current scaling: compute this tensor's amax and scale first
    bool stats = false;    // count saturated / underflowed elements
    // quantize_transpose only, FP8 destinations: the column sums of src (a Linear's bias gradient from
    // dY) in the same pass, col_sum[c] = (col_accumulate ? col_sum[c] + t : t) with t in the fixed
    // order described below (kColSumBlockRows). col_partial: column_sum_partial_floats(rows, cols) floats of
    // the backend's memory. Null col_sum: none.
    float *col_sum = nullptr;
    float *col_partial = nullptr;
    bool col_accumulate = false;
};

// The fixed summation order of the fused column sums, the same on both backends so that their bias
// gradients agree bit for bit: rows in blocks of kColSumBlockRows; inside a block, kColSumLanes lane
// sums s_g = ((+0 + x[r0 + g]) + x[r0 + g + 16]) + ... (rows r0 + g + 16 j, j ascending, those inside
// the matrix), the block's sum ((+0 + s_0) + s_1) + ... + s_15; the total ((+0 + b_0) + b_1) + ... over
// the blocks in order. (The CUDA quantize-transpose tile is 128 rows and each thread quantizes rows
// g, g + 16, ..., g + 112 of 8 columns: this is the order its registers give.)
constexpr size_t kColSumBlockRows = 128;
constexpr size_t kColSumLanes = 16;
inline size_t column_sum_blocks(size_t rows) { return (rows + kColSumBlockRows - 1) / kColSumBlockRows; }
// The partial sums (one row per block) and, for the CPU, one more row for the lane sums.
inline size_t column_sum_partial_floats(size_t rows, size_t cols) { return (column_sum_blocks(rows) + 1) * cols; }

// One GEMM, row-major: D[m, n] = scale_a * scale_b * sum_k A[m, k] * B[n, k] (+ D when accumulating)
// (+ bias[n]), accumulated in FP32. Each operand is stored K-contiguous ([m, k] / [n, k]) or not
// ([k, m] / [k, n]); FP8 operands must be K-contiguous (the "TN" layout of Hopper's FP8 GEMMs).
struct GemmOperand {
    const void *data;
    fp8amp_dtype dtype;
    const float *scale_inv = nullptr;  // device (CPU: host) pointer to the operand's scale_inv, or null (1)
    bool k_contiguous = true;
};
struct GemmArgs {
    int64_t m = 0, n = 0, k = 0;
    GemmOperand a{}, b{};
    void *d = nullptr;
    fp8amp_dtype d_dtype = FP8AMP_DTYPE_F32;
    bool accumulate = false;                      // D += ..., D F32 only
    const void *bias = nullptr;                   // [n] or null
    fp8amp_dtype bias_dtype = FP8AMP_DTYPE_BF16;  // see bias_dtype_for
    bool fast_accum = false;                      // CUDA FP8: fast (not split) accumulation
};

// The dtype a GEMM's bias must have for an output dtype: cuBLASLt's FP8 kernels take a BF16 bias for
// F32/BF16 outputs and an F16 bias for F16 outputs; its 16-bit kernels take the output's dtype. The
// CPU backend follows the same rule so that both backends round the bias alike.
inline fp8amp_dtype bias_dtype_for(bool fp8_operands, fp8amp_dtype d_dtype) {
    if (d_dtype == FP8AMP_DTYPE_F16) return FP8AMP_DTYPE_F16;
    return fp8_operands ? FP8AMP_DTYPE_BF16 : d_dtype;
}

constexpr size_t kColumnSumChunks = 64;

// ---- CPU reference kernels (portable C++) -------------------------------------------------------
// Same semantics as the CUDA functions below, bit for bit; memory is host memory.
namespace cpu {
// dst[i] = convert(src[i]) for n elements, by the rules of fp8amp_cast.
void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n);
// max |src| (NaN counts as inf), as amax bits (see scaling.hpp).
uint32_t amax(const void *src, fp8amp_dtype src_dtype, size_t n);
// dst = fp8(src * scale); records amax and statistics; current scaling computes the scale first.
// dst_dtype is a scaled dtype: E4M3, E5M2, or F16 (saturating like FP8); dequantize's src likewise.
void quantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
              const QuantizeTarget &target);
// quantize of src [rows, cols] into dst [rows, cols] and dst_t [cols, rows].
void quantize_transpose(const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t, fp8amp_dtype dst_dtype,
                        size_t rows, size_t cols, const QuantizeTarget &target);
// dst = decode(src) * (*scale_inv), rounded into dst_dtype.
void dequantize(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n,
                const float *scale_inv);
// fp8amp_scaling_update of each meta.
void update_scaling(ScalingState *const *metas, size_t n);
// The GEMM above, FP32 accumulation. scratch: gemm_scratch_floats(args) floats of the caller's (the
// CPU kernels allocate no host memory while they run: a failure there would come after earlier steps
// of the same call changed state).
size_t gemm_scratch_floats(const GemmArgs &args);
void gemm(const GemmArgs &args, float *scratch);
// dst[c] (+)= sum over rows of src[r, c], in FP32 (bias gradients). scratch: cols floats.
void column_sum(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst, bool accumulate,
                float *scratch);
// dst[c, r] = src[r, c] for 1-byte elements.
void transpose_bytes(const void *src, void *dst, size_t rows, size_t cols);
// One Adam/AdamW step over the parameter list of `config` (kernels/adam.hpp). scratch:
// adam_scratch_floats(config.block_size, config.max_numel) floats of the caller's (no host allocation
// while the step runs: it could fail after part of the update was written).
size_t adam_scratch_floats(int32_t block_size, int64_t max_numel);
void adam_step(const adam::StepConfig &config, float *scratch);
// Loss-scaler update from a step's found_inf.
void scaler_update(adam::ScalerState *scaler, const adam::ScalerConfig &config, const adam::Status *status);
}  // namespace cpu

// ---- CUDA runtime and kernels -------------------------------------------------------------------
namespace cuda {
// True when this library was built with CUDA kernels.
bool built_with_cuda();
// Number of usable GPUs; 0 when there is no GPU, no driver or no CUDA build (then *why says which).
int device_count(std::string *why);
// Throws NOT_SUPPORTED (with the reason) or DEVICE_MISMATCH when `device` cannot be used.
void check_device(int device);
// Device memory. malloc throws OUT_OF_MEMORY when cudaMalloc cannot serve the request.
void *malloc(int device, size_t nbytes);
void free(int device, void *ptr) noexcept;
// The CUDA ordinal a pointer belongs to, or -1 for host memory the driver does not know.
int pointer_device(const void *ptr);
// Synchronous host<->device copies ordered after the work already queued on `stream`.
void copy_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes);
void copy_to_host(int device, void *stream, void *dst, const void *src, size_t nbytes);
void synchronize(int device, void *stream);
void copy_device_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes);  // async
// Orders `to` after the work queued on `from` so far (an event recorded on one, waited on by the
// other; the host does not wait). Nothing is done when either stream is being captured.
void stream_join(int device, void *from, void *to);
void memset(int device, void *stream, void *dst, int value, size_t nbytes);                        // async
// Asynchronous on `stream`, bit-identical to their cpu:: counterparts (device memory throughout).
void cast(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst,
          fp8amp_dtype dst_dtype, size_t n);
void amax(int device, void *stream, const void *src, fp8amp_dtype src_dtype, size_t n, uint32_t *amax_bits);
void quantize(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
              size_t n, const QuantizeTarget &target);
// dst[c] (+)= ((+0 + partial[0][c]) + partial[1][c]) + ... over `blocks` rows of partials (the last
// step of quantize_transpose's fused column sums).
void column_sum_finish(int device, void *stream, const float *partial, size_t blocks, size_t cols, float *dst,
                       bool accumulate);
void quantize_transpose(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                        fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target);
// yield_sms: blocks that each take a fixed run of elements and retire, instead of a persistent grid, so
// that kernels of another stream running beside it (the communicator's NCCL transfers) get
// multiprocessors as blocks retire (kernels/cuda/comm.cu); max_blocks (with yield_sms, when not 0)
// caps that grid (the loop is grid-stride), so that it leaves multiprocessors free.
void dequantize(int device, void *stream, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                size_t n, const float *scale_inv, bool yield_sms = false, unsigned max_blocks = 0);
// Updates n metas (device pointers) in one launch per 1024 metas.
void update_scaling(int device, void *stream, ScalingState *const *metas, size_t n);

// cuBLASLt for one context: the handle and the cache of plans (descriptors, layouts and the chosen
// algorithm per shape/dtype/layout/alignment), so a warm GEMM asks no heuristic.
struct GemmEngine;
std::shared_ptr<GemmEngine> gemm_engine_create(int device);
// Empty when the device can run FP8 GEMMs (compute capability >= 8.9), else the reason.
std::string fp8_gemm_unsupported_reason(int device);
// Makes (and caches) the plan gemm() will use for these arguments, so that a LaunchList can make it
// before its first step is launched: a failure (out of host memory, no algorithm) then changes nothing.
void gemm_prepare(GemmEngine &engine, int device, const GemmArgs &args, size_t workspace_bytes);
// The GEMM above on `stream`, with `workspace` (workspace_bytes) for cuBLASLt. Throws CUBLAS.
void gemm(GemmEngine &engine, int device, void *stream, const GemmArgs &args, void *workspace,
          size_t workspace_bytes);
// `partial`: device scratch of kColumnSumChunks * cols floats.
void column_sum(int device, void *stream, const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols,
                float *dst, bool accumulate, float *partial);
void transpose_bytes(int device, void *stream, const void *src, void *dst, size_t rows, size_t cols);
// One Adam/AdamW step: one cooperative launch on `stream`, no host synchronization. bit-identical to
// cpu::adam_step when clipping is off. max_partials: how many Partial slots config.partials holds.
void adam_step(int device, void *stream, const adam::StepConfig &config, int max_partials);
// The number of Partial slots adam_step needs on this device (its persistent grid size).
int adam_grid_size(int device);
// Loss-scaler update from a step's found_inf, on the device (one tiny kernel).
void scaler_update(int device, void *stream, adam::ScalerState *scaler, const adam::ScalerConfig &config,
                   const adam::Status *status);

// CUDA graphs (core/launch_list.hpp replays a call's launches with one graph launch).
struct GraphExec;  // an instantiated graph; destroyed with its last shared_ptr
// A private non-blocking stream per device, used only to capture on (it never runs work).
void *capture_stream(int device);
// Whether `stream` is being captured into a graph (by the caller, typically).
bool stream_is_capturing(int device, void *stream);
// Starts a thread-local capture on `stream`; end_capture instantiates what was recorded since;
// abort_capture ends a capture that failed midway and discards it (never throws).
void begin_capture(int device, void *stream);
std::shared_ptr<GraphExec> end_capture(int device, void *stream);
void abort_capture(int device, void *stream) noexcept;
// Launches the graph on `stream`, ordered like any launch on it.
void launch_graph(GraphExec &exec, void *stream);
}  // namespace cuda

}  // namespace fp8amp::kernels
