// The fused Adam/AdamW step on CUDA: one cooperative launch of a persistent grid (sized by occupancy)
// for every parameter of the optimizer, no allocation, no host synchronization (graph-capturable).
//
// Work is a list of units: state blocks (per-tensor mode: 128-element chunks) of all parameters,
// numbered globally; each warp takes one contiguous range of units (the fast kernel's update: most
// of them, the rest in runs from a counter, see run_pairs), and how its lanes share a unit is each
// kernel's own (adam_generic.cu: 4 elements a lane; adam_fast.cu: 8 elements a lane, a half-warp a
// 128-element block).
//   phase 1  every gradient: finiteness (NaN/inf codes, overflow of the unscaling, an inf amax in an
//            FP8 gradient's meta) and the sum of squares; one Partial per CTA.   -- grid sync --
//            every CTA reduces the partials in the same order: found_inf, norm, clip coefficient.
//            If found_inf, nobody writes anything (CTA 0 records found_inf, updates the scaler).
//   phase 1b per-tensor mode only: the new amax of every tensor's m, v, master. -- grid sync --
//   phase 2  the update: new values, block scales from their new amax, stores; scaled parameters
//            are written with their meta's scale and their amax recorded.
//   phase 3  (scaled parameters only)                                          -- grid sync --
//            each such meta: publish the scale_inv used, fold the history, next scale.
// The step count, the scaler's scale and the slots are read before the first sync and written only
// after it, so no CTA can see a half-updated value. The arithmetic is kernels/adam.hpp's, shared with
// kernels/cpu/adam.cpp: with clipping off the two backends agree bit for bit.
//
// The files: adam_generic.cu and adam_fast.cu hold the two kernels, each with its launcher;
// adam_common.cuh what both kernels share (end_check: the end of phase 1; fold_param_metas: phase 3);
// adam_launch.cuh the cooperative launch and the launchers' declarations; loss_scaler.cu the scaler's
// own update kernel; this file the entry points of kernels/kernels.hpp.
#include <cuda_runtime.h>

#include "adam.hpp"
#include "adam_launch.cuh"
#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda {
namespace {

using namespace adam;
using namespace adam_launch;

// The fast kernel when the configuration has one (adam_fast.cu), else the generic one.
template <bool M8, bool V16, bool MASTER>
void launch(int device, cudaStream_t stream, const StepConfig &c, int max_partials) {
    if (!launch_fast<M8, V16, MASTER>(device, stream, c, max_partials))
        launch_generic<M8, V16, MASTER>(device, stream, c, max_partials);
}

}  // namespace

int adam_grid_size(int device) {
    DeviceGuard guard(device);
    return multiprocessor_count(device) * (2048 / kThreads);
}

void adam_step(int device, void *stream_raw, const StepConfig &config, int max_partials) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const int key = (config.m_fp8 ? 4 : 0) | (config.v_f16 ? 2 : 0) | (config.has_master ? 1 : 0);
    switch (key) {
    case 0: launch<false, false, false>(device, stream, config, max_partials); break;
    case 1: launch<false, false, true>(device, stream, config, max_partials); break;
    case 2: launch<false, true, false>(device, stream, config, max_partials); break;
    case 3: launch<false, true, true>(device, stream, config, max_partials); break;
    case 4: launch<true, false, false>(device, stream, config, max_partials); break;
    case 5: launch<true, false, true>(device, stream, config, max_partials); break;
    case 6: launch<true, true, false>(device, stream, config, max_partials); break;
    default: launch<true, true, true>(device, stream, config, max_partials); break;
    }
}

}  // namespace fp8amp::kernels::cuda
