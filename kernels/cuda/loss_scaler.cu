// The loss scaler's update on the device, for steps that are not Adam's (an Adam step updates the
// scaler itself, in its CTA 0): one thread applies kernels/adam.hpp's scaler_update to a step's
// found_inf, so the scale never leaves the device.
#include "adam.hpp"
#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda {
namespace {

using namespace adam;

__global__ void scaler_update_kernel(ScalerState *scaler, ScalerConfig config, const Status *status) {
    adam::scaler_update(*scaler, config, status->found_inf != 0);
}

}  // namespace

void scaler_update(int device, void *stream, ScalerState *scaler, const ScalerConfig &config, const Status *status) {
    DeviceGuard guard(device);
    scaler_update_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scaler, config, status);
    check_launch("scaler_update_kernel");
}

}  // namespace fp8amp::kernels::cuda
