// Helpers shared by the .cu files: error checks and a device guard.
#pragma once

#include <cuda_runtime.h>

#include "error.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char *what);

inline void check(cudaError_t err, const char *what) {
    if (err != cudaSuccess) throw_cuda(err, what);
}

// Checks the launch just made (configuration errors surface here; faults surface at the next sync).
inline void check_launch(const char *kernel) { check(cudaGetLastError(), kernel); }

// Makes `device` current for the guard's lifetime and restores the caller's device afterwards.
class DeviceGuard {
public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;

private:
    int previous_ = -1;
};

// The same for code that must not throw (destructors, clean-up after a failure): a failure to read
// or switch the current device is ignored, and the caller's call then acts on the current device.
class DeviceGuardNoThrow {
public:
    explicit DeviceGuardNoThrow(int device) noexcept;
    ~DeviceGuardNoThrow();
    DeviceGuardNoThrow(const DeviceGuardNoThrow &) = delete;
    DeviceGuardNoThrow &operator=(const DeviceGuardNoThrow &) = delete;

private:
    int previous_ = -1;
};

// Streaming multiprocessors of a device (cached).
int multiprocessor_count(int device);

// How many blocks of `threads` threads of `kernel` (no dynamic shared memory) can be resident on one
// multiprocessor at once: the size of a persistent grid. Asked of the runtime once per (kernel,
// device), since the query costs microseconds of host time that a launch made every forward or every
// optimizer step should not pay; so a kernel must always be asked with the same threads.
// max_shared: ask for the largest shared-memory carveout first (kernels whose static shared memory,
// not their registers, limits how many blocks fit), so that the occupancy found is the launch's.
int resident_blocks_per_sm(const void *kernel, int device, int threads, bool max_shared = false);

}  // namespace fp8amp::kernels::cuda
