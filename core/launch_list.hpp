// A call's GPU work described as data, and the replay of that work as one CUDA graph launch.
//
// Host time, not GPU time, bounds small layers: behind this project's lent H100 a kernel launch
// costs ~4.5 µs of host time, a cuBLASLt matmul ~10 µs, and one graph launch holding both ~2 µs
// (bench/launch_cost.cu). So the Linear does not launch its kernels directly: it describes them in a
// LaunchList -- each step's kernel and every argument it is launched with, by value -- and hands the
// list to a GraphReplay. Two lists that compare equal launch exactly the same work, whatever led to
// them; the second time a list is seen its launches are captured into a CUDA graph, and from then on
// an equal list is one graph launch. Host-side state (caches, version counters) stays with the
// caller, which updates it after the list ran. The element-wise operations of ops.cpp run their
// one step through a LaunchList too, so that the choice of backend kernel is made in one place.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.hpp"  // kernels/backend.hpp
#include "context.hpp"
#include "kernels.hpp"
#include "tensor.hpp"

namespace fp8amp::core {

class LaunchList {
public:
    static constexpr size_t kMaxSteps = 12;

    void clear() { n_ = 0; }
    size_t size() const { return n_; }

    // The steps, in launch order. Each mirrors the kernels:: function it runs (see kernels.hpp);
    // memory is the caller's, already validated, and must stay valid until the work ran.
    // quantize: src [rows, cols] into dst (and dst_t [cols, rows]), with dst's bound meta; with dst_t
    // and col_sum, also col_sum[c] (+)= the column sums of src in the same pass (kernels.hpp's fixed
    // order; col_partial: kernels::column_sum_partial_floats(rows, cols) floats).
    void quantize(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, const Tensor &dst,
                  const Tensor *dst_t, float *col_sum = nullptr, bool col_accumulate = false,
                  float *col_partial = nullptr);
    void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n);
    void dequantize(const Tensor &src, void *dst, fp8amp_dtype dst_dtype);
    void gemm(const kernels::GemmArgs &args, void *workspace, size_t workspace_bytes);
    void column_sum(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst, bool accumulate,
                    float *partial);
    void transpose_bytes(const void *src, void *dst, size_t rows, size_t cols);
    // meta's recorded amax = max(it, max |src|) (as a delayed-scaling quantize records it), and one
    // fp8amp_scaling_update of a meta: the Linear's E4M3 weight gradient (delayed scaling).
    void record_amax(const void *src, fp8amp_dtype src_dtype, size_t n, const ScalingMeta &meta);
    void update_scaling(const ScalingMeta &meta);

    // The F32 host scratch the backend's kernels of these steps need (their largest; 0 when none
    // does: the CPU backend's GEMM and column sum need some).
    size_t host_scratch_floats(const kernels::Backend &backend) const;
    // Makes what the backend's GEMM steps need before they run (CUDA: the cuBLASLt plans, host memory
    // and a heuristic query), so that running the steps allocates no host memory of fp8amp's own once
    // the first one was launched.
    void prepare(const Context &ctx) const;
    // Runs the steps on ctx's backend, on `stream` (ignored by a backend without streams).
    // host_scratch: at least host_scratch_floats() floats, so that no step allocates host memory once
    // an earlier step changed state (a quantize records its amax); a step that needs it refuses a null one.
    void run(const Context &ctx, void *stream, float *host_scratch = nullptr) const;

    bool operator==(const LaunchList &other) const;

private:
    enum class Kind : uint64_t { quantize, cast, dequantize, gemm, column_sum, transpose_bytes, record_amax, update_scaling };
    // A step's arguments are stored as whole 64-bit words (see the *Args structs in launch_list.cpp,
    // which have no padding), so that equality is a byte comparison with nothing uninitialized in it.
    static constexpr size_t kWords = 20;
    struct Step {
        uint64_t kind;
        uint64_t words[kWords];
    };
    template <class Args>
    void push(Kind kind, const Args &args);
    template <class Args>
    static Args args_of(const Step &step);

    Step steps_[kMaxSteps] = {};
    size_t n_ = 0;
};

// Runs LaunchLists, replaying a captured graph for a list equal to one seen before (on a backend that
// supports graphs: CUDA). Keeps a
// few graphs (least recently used goes first), and captures a list only on its second sighting, so
// that one-off calls pay no capture. The caller's stream being captured (a whole step captured by
// the application) runs the list eagerly, into that capture. A capture that fails turns replay off
// for this object and runs the list eagerly.
class GraphReplay {
public:
    explicit GraphReplay(bool enabled) : enabled_(enabled) {}
    // Runs the list: a captured graph replayed, or its steps (after LaunchList::prepare) eagerly or
    // into a capture. Every host allocation of fp8amp's own comes before the first launch.
    // launched (if given) is set just before the first of the list's work is launched on the caller's
    // stream (a failure before it -- a capture that ran out of memory -- left that stream untouched).
    void run(const Context &ctx, const LaunchList &list, float *host_scratch = nullptr, bool *launched = nullptr);
    uint64_t replays() const { return replays_; }

private:
    // The bookkeeping's fixed capacity, made before anything is launched (no-op once made).
    void reserve();
    static constexpr size_t kGraphs = 4, kSeen = 4;
    struct Graph {
        LaunchList list;
        kernels::Backend::Graph exec;
        uint64_t last_use = 0;
    };
    bool enabled_;
    std::vector<Graph> graphs_;
    std::vector<LaunchList> seen_;  // lists run eagerly once, oldest first
    uint64_t clock_ = 0, replays_ = 0;
};

}  // namespace fp8amp::core
