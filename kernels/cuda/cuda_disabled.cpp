// Built instead of the .cu files when the library has no CUDA (FP8AMP_CUDA=OFF or no nvcc): the
// CUDA half of kernels.hpp answers NOT_SUPPORTED with the reason, so the CPU backend stays usable.
#include "error.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cuda {
namespace {
const char *const kWhy = "fp8amp was built without CUDA (FP8AMP_CUDA=OFF or no CUDA compiler at build time)";
[[noreturn]] void unavailable() { fail(FP8AMP_ERROR_NOT_SUPPORTED, kWhy); }
}  // namespace

bool built_with_cuda() { return false; }
int device_count(std::string *why) {
    if (why) *why = kWhy;
    return 0;
}
void check_device(int) { unavailable(); }
void *malloc(int, size_t) { unavailable(); }
void free(int, void *) noexcept {}
int pointer_device(const void *) { return -1; }
void copy_to_device(int, void *, void *, const void *, size_t) { unavailable(); }
void copy_to_host(int, void *, void *, const void *, size_t) { unavailable(); }
void synchronize(int, void *) { unavailable(); }
void cast(int, void *, const void *, fp8amp_dtype, void *, fp8amp_dtype, size_t) { unavailable(); }
void copy_device_to_device(int, void *, void *, const void *, size_t) { unavailable(); }
void memset(int, void *, void *, int, size_t) { unavailable(); }
void stream_join(int, void *, void *) { unavailable(); }
void amax(int, void *, const void *, fp8amp_dtype, size_t, uint32_t *) { unavailable(); }
void quantize(int, void *, const void *, fp8amp_dtype, void *, fp8amp_dtype, size_t, const QuantizeTarget &) {
    unavailable();
}
void quantize_transpose(int, void *, const void *, fp8amp_dtype, void *, void *, fp8amp_dtype, size_t, size_t,
                        const QuantizeTarget &) {
    unavailable();
}
void dequantize(int, void *, const void *, fp8amp_dtype, void *, fp8amp_dtype, size_t, const float *, bool, unsigned) {
    unavailable();
}
void update_scaling(int, void *, ScalingState *const *, size_t) { unavailable(); }
struct GemmEngine {};
std::shared_ptr<GemmEngine> gemm_engine_create(int) { unavailable(); }
std::string fp8_gemm_unsupported_reason(int) { unavailable(); }
void gemm_prepare(GemmEngine &, int, const GemmArgs &, size_t) { unavailable(); }
void gemm(GemmEngine &, int, void *, const GemmArgs &, void *, size_t) { unavailable(); }
void column_sum(int, void *, const void *, fp8amp_dtype, size_t, size_t, float *, bool, float *) { unavailable(); }
void transpose_bytes(int, void *, const void *, void *, size_t, size_t) { unavailable(); }
void adam_step(int, void *, const adam::StepConfig &, int) { unavailable(); }
int adam_grid_size(int) { unavailable(); }
void scaler_update(int, void *, adam::ScalerState *, const adam::ScalerConfig &, const adam::Status *) {
    unavailable();
}
struct GraphExec {};
void *capture_stream(int) { unavailable(); }
bool stream_is_capturing(int, void *) { unavailable(); }
void begin_capture(int, void *) { unavailable(); }
std::shared_ptr<GraphExec> end_capture(int, void *) { unavailable(); }
void abort_capture(int, void *) noexcept {}
void launch_graph(GraphExec &, void *) { unavailable(); }

}  // namespace fp8amp::kernels::cuda
