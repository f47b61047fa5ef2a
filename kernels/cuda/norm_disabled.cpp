// Built instead of kernels/cuda/norm.cu and activation.cu when the library has no CUDA (no CUDA context can be made
// then, so these are never reached through a context; they exist for the link).
#include "error.hpp"
#include "activation.hpp"
#include "norm.hpp"

namespace fp8amp::kernels::cuda {
namespace {
[[noreturn]] void unavailable() {
    fail(FP8AMP_ERROR_NOT_SUPPORTED, "fp8amp was built without CUDA (FP8AMP_CUDA=OFF or no CUDA compiler at build time)");
}
}  // namespace

void norm_forward(int, void *, const NormForwardArgs &) { unavailable(); }
size_t norm_backward_partial_floats(int64_t, int64_t) { return 0; }
void norm_backward(int, void *, const NormBackwardArgs &, float *) { unavailable(); }
void activation_forward(int, void *, const ActivationArgs &) { unavailable(); }
void activation_backward(int, void *, const ActivationArgs &) { unavailable(); }
void activation_prepare(int) { unavailable(); }

}  // namespace fp8amp::kernels::cuda
