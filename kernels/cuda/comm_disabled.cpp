// Built instead of kernels/cuda/comm.cu when the library has no CUDA.
#include "comm.hpp"
#include "error.hpp"

namespace fp8amp::kernels {

std::unique_ptr<CommCompute> make_cuda_comm_compute(int) {
    fail(FP8AMP_ERROR_NOT_SUPPORTED,
         "fp8amp was built without CUDA (FP8AMP_CUDA=OFF or no CUDA compiler at build time): no CUDA communicator");
}

}  // namespace fp8amp::kernels
