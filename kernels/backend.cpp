// The registration point of the backends: one line per kind of device.
#include "backend.hpp"

namespace fp8amp::kernels {

extern const BackendType kCpuBackendType;   // cpu/cpu_backend.cpp
extern const BackendType kCudaBackendType;  // cuda/cuda_backend.cpp

const BackendType *find_backend_type(int32_t type) {
    static const BackendType *const kTypes[] = {&kCpuBackendType, &kCudaBackendType};
    for (const BackendType *t : kTypes)
        if (static_cast<int32_t>(t->type) == type) return t;
    return nullptr;
}

}  // namespace fp8amp::kernels
