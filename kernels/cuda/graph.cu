// CUDA graphs for core's launch replay (core/launch_list.hpp): a call's launches are captured once
// on a private stream, instantiated, and replayed into the caller's stream with one launch.
#include <cuda_runtime.h>

#include <mutex>

#include "cuda_common.cuh"

namespace fp8amp::kernels::cuda {

struct GraphExec {
    int device = 0;
    cudaGraphExec_t exec = nullptr;
    ~GraphExec() {  // never throws: it may run at process exit, after the CUDA runtime is gone
        if (!exec) return;
        DeviceGuardNoThrow guard(device);
        (void)cudaGraphExecDestroy(exec);
    }
};

void *capture_stream(int device) {
    // One per device for the process, made on first use and never destroyed: it only ever records
    // (a capturing stream runs nothing), and destroying it at exit could outlive the CUDA context.
    static std::mutex mutex;
    static cudaStream_t streams[64] = {};
    if (device < 0 || device >= 64) fail(FP8AMP_ERROR_INTERNAL, "capture_stream: device ordinal out of range");
    std::lock_guard<std::mutex> lock(mutex);
    if (!streams[device]) {
        DeviceGuard guard(device);
        check(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
    return streams[device];
}

bool stream_is_capturing(int device, void *stream) {
    DeviceGuard guard(device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
}

void begin_capture(int device, void *stream) {
    DeviceGuard guard(device);
    // Thread-local: other threads' CUDA calls are not affected by this capture.
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
}

std::shared_ptr<GraphExec> end_capture(int device, void *stream) {
    DeviceGuard guard(device);
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph), "cudaStreamEndCapture");
    struct GraphGuard {
        cudaGraph_t g;
        ~GraphGuard() { (void)cudaGraphDestroy(g); }
    } graph_guard{graph};
    auto exec = std::make_shared<GraphExec>();
    exec->device = device;
    check(cudaGraphInstantiate(&exec->exec, graph, 0), "cudaGraphInstantiate");
    return exec;
}

void abort_capture(int device, void *stream) noexcept {
    DeviceGuardNoThrow guard(device);
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) == cudaSuccess && graph)
        (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // an invalidated capture reports its error here; it is handled by the caller
}

void launch_graph(GraphExec &exec, void *stream) {
    DeviceGuard guard(exec.device);
    check(cudaGraphLaunch(exec.exec, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
}

}  // namespace fp8amp::kernels::cuda
