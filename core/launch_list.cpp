#include "launch_list.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "backend.hpp"  // kernels/backend.hpp
#include "scaling_meta.hpp"

namespace fp8amp::core {

namespace {

// Every field a whole word: no padding, so equal arguments are equal bytes.
using Word = uint64_t;
Word word(fp8amp_dtype d) { return static_cast<Word>(static_cast<int64_t>(d)); }
fp8amp_dtype dtype(Word w) { return static_cast<fp8amp_dtype>(static_cast<int32_t>(w)); }

struct QuantizeArgs {
    const void *src;
    Word src_dtype;
    void *dst;
    void *dst_t;  // null: no transposed copy
    Word dst_dtype;
    Word rows, cols;
    kernels::ScalingState *meta;
    float *scale_inv;
    float *scale_inv_t;
    Word current, stats;
    float *col_sum;  // null: no fused column sums
    float *col_partial;
    Word col_accumulate;
};
struct CastArgs {
    const void *src;
    Word src_dtype;
    void *dst;
    Word dst_dtype;
    Word n;
};
struct DequantizeArgs {
    const void *src;
    Word src_dtype;
    void *dst;
    Word dst_dtype;
    Word n;
    const float *scale_inv;
};
struct GemmStepArgs {
    int64_t m, n, k;
    const void *a;
    Word a_dtype;
    const float *a_scale_inv;
    Word a_k_contiguous;
    const void *b;
    Word b_dtype;
    const float *b_scale_inv;
    Word b_k_contiguous;
    void *d;
    Word d_dtype;
    Word accumulate;
    const void *bias;
    Word bias_dtype;
    Word fast_accum;
    void *workspace;
    Word workspace_bytes;
};
struct ColumnSumArgs {
    const void *src;
    Word src_dtype;
    Word rows, cols;
    float *dst;
    Word accumulate;
    float *partial;
};
struct TransposeArgs {
    const void *src;
    void *dst;
    Word rows, cols;
};
struct RecordAmaxArgs {
    const void *src;
    Word src_dtype;
    Word n;
    kernels::ScalingState *meta;
};
struct UpdateScalingArgs {
    kernels::ScalingState *meta;
};

kernels::GemmArgs to_gemm_args(const GemmStepArgs &s) {
    kernels::GemmArgs g;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.a = {s.a, dtype(s.a_dtype), s.a_scale_inv, s.a_k_contiguous != 0};
    g.b = {s.b, dtype(s.b_dtype), s.b_scale_inv, s.b_k_contiguous != 0};
    g.d = s.d;
    g.d_dtype = dtype(s.d_dtype);
    g.accumulate = s.accumulate != 0;
    g.bias = s.bias;
    g.bias_dtype = dtype(s.bias_dtype);
    g.fast_accum = s.fast_accum != 0;
    return g;
}

}  // namespace

template <class Args>
void LaunchList::push(Kind kind, const Args &args) {
    static_assert(std::has_unique_object_representations_v<Args>, "step arguments must have no padding");
    static_assert(sizeof(Args) <= sizeof(Step::words), "step arguments too large");
    if (n_ == kMaxSteps) fail(FP8AMP_ERROR_INTERNAL, "LaunchList: more than kMaxSteps steps");
    Step &s = steps_[n_++];
    std::memset(&s, 0, sizeof s);
    s.kind = static_cast<uint64_t>(kind);
    std::memcpy(s.words, &args, sizeof args);
}

template <class Args>
Args LaunchList::args_of(const Step &step) {
    Args args;
    std::memcpy(&args, step.words, sizeof args);
    return args;
}

void LaunchList::quantize(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, const Tensor &dst,
                          const Tensor *dst_t, float *col_sum, bool col_accumulate, float *col_partial) {
    if (col_sum && (!dst_t || !col_partial))
        fail(FP8AMP_ERROR_INTERNAL, "quantize: fused column sums need the transposed copy and the partials");
    // The callers bind their destinations first; a missing binding would be a null dereference here
    // (or a null scale_inv the kernels skip, leaving a stale scale): refuse it instead.
    if (!dst.scaling() || (dst_t && !dst_t->scale_inv()))
        fail(FP8AMP_ERROR_INTERNAL, "quantize into " + dst.describe() + " that is not bound to a scaling meta");
    const ScalingMeta &meta = *dst.scaling();
    push(Kind::quantize, QuantizeArgs{src, word(src_dtype), dst.data(), dst_t ? dst_t->data() : nullptr,
                                      word(dst.dtype()), rows, cols, meta.state(), dst.scale_inv(),
                                      dst_t ? dst_t->scale_inv() : nullptr, meta.current(), meta.stats_enabled(),
                                      col_sum, col_sum ? col_partial : nullptr, col_sum && col_accumulate});
}

void LaunchList::cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n) {
    push(Kind::cast, CastArgs{src, word(src_dtype), dst, word(dst_dtype), n});
}

void LaunchList::dequantize(const Tensor &src, void *dst, fp8amp_dtype dst_dtype) {
    push(Kind::dequantize, DequantizeArgs{src.data(), word(src.dtype()), dst, word(dst_dtype),
                                          static_cast<Word>(src.numel()), src.scale_inv()});
}

void LaunchList::gemm(const kernels::GemmArgs &g, void *workspace, size_t workspace_bytes) {
    push(Kind::gemm, GemmStepArgs{g.m, g.n, g.k, g.a.data, word(g.a.dtype), g.a.scale_inv, g.a.k_contiguous, g.b.data,
                                  word(g.b.dtype), g.b.scale_inv, g.b.k_contiguous, g.d, word(g.d_dtype), g.accumulate,
                                  g.bias, word(g.bias ? g.bias_dtype : FP8AMP_DTYPE_F32), g.fast_accum, workspace,
                                  workspace_bytes});
}

void LaunchList::column_sum(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst,
                            bool accumulate, float *partial) {
    push(Kind::column_sum, ColumnSumArgs{src, word(src_dtype), rows, cols, dst, accumulate, partial});
}

void LaunchList::transpose_bytes(const void *src, void *dst, size_t rows, size_t cols) {
    push(Kind::transpose_bytes, TransposeArgs{src, dst, rows, cols});
}

void LaunchList::record_amax(const void *src, fp8amp_dtype src_dtype, size_t n, const ScalingMeta &meta) {
    push(Kind::record_amax, RecordAmaxArgs{src, word(src_dtype), n, meta.state()});
}

void LaunchList::update_scaling(const ScalingMeta &meta) {
    push(Kind::update_scaling, UpdateScalingArgs{meta.state()});
}

bool LaunchList::operator==(const LaunchList &other) const {
    return n_ == other.n_ && std::memcmp(steps_, other.steps_, n_ * sizeof(Step)) == 0;
}

size_t LaunchList::host_scratch_floats(const kernels::Backend &backend) const {
    size_t need = 0;
    for (size_t i = 0; i < n_; ++i) {
        const Step &step = steps_[i];
        if (static_cast<Kind>(step.kind) == Kind::gemm)
            need = std::max(need, backend.gemm_host_scratch_floats(to_gemm_args(args_of<GemmStepArgs>(step))));
        else if (static_cast<Kind>(step.kind) == Kind::column_sum)
            need = std::max(need, backend.column_sum_host_scratch_floats(
                                      static_cast<size_t>(args_of<ColumnSumArgs>(step).cols)));
    }
    return need;
}

void LaunchList::prepare(const Context &ctx) const {
    kernels::Backend &backend = ctx.backend();
    for (size_t i = 0; i < n_; ++i) {
        if (static_cast<Kind>(steps_[i].kind) != Kind::gemm) continue;
        const auto a = args_of<GemmStepArgs>(steps_[i]);
        backend.gemm_prepare(to_gemm_args(a), a.workspace_bytes);
    }
}

void LaunchList::run(const Context &ctx, void *stream, float *host_scratch) const {
    kernels::Backend &backend = ctx.backend();
    // Checked before the first step runs: a refusal half-way would leave the earlier steps done.
    if (!host_scratch && host_scratch_floats(backend) != 0)
        fail(FP8AMP_ERROR_INTERNAL, "LaunchList::run: steps that need host scratch got none");
    for (size_t i = 0; i < n_; ++i) {
        const Step &step = steps_[i];
        switch (static_cast<Kind>(step.kind)) {
        case Kind::quantize: {
            const auto a = args_of<QuantizeArgs>(step);
            const kernels::QuantizeTarget target{a.meta,      a.scale_inv,   a.scale_inv_t,          a.current != 0,
                                                 a.stats != 0, a.col_sum,    a.col_partial, a.col_accumulate != 0};
            if (a.dst_t)
                backend.quantize_transpose(stream, a.src, dtype(a.src_dtype), a.dst, a.dst_t, dtype(a.dst_dtype),
                                           a.rows, a.cols, target);
            else
                backend.quantize(stream, a.src, dtype(a.src_dtype), a.dst, dtype(a.dst_dtype), a.rows * a.cols,
                                 target);
            break;
        }
        case Kind::cast: {
            const auto a = args_of<CastArgs>(step);
            backend.cast(stream, a.src, dtype(a.src_dtype), a.dst, dtype(a.dst_dtype), a.n);
            break;
        }
        case Kind::dequantize: {
            const auto a = args_of<DequantizeArgs>(step);
            backend.dequantize(stream, a.src, dtype(a.src_dtype), a.dst, dtype(a.dst_dtype), a.n, a.scale_inv);
            break;
        }
        case Kind::gemm: {
            const auto a = args_of<GemmStepArgs>(step);
            backend.gemm(stream, to_gemm_args(a), a.workspace, a.workspace_bytes, host_scratch);
            break;
        }
        case Kind::column_sum: {
            const auto a = args_of<ColumnSumArgs>(step);
            backend.column_sum(stream, a.src, dtype(a.src_dtype), a.rows, a.cols, a.dst, a.accumulate != 0, a.partial,
                               host_scratch);
            break;
        }
        case Kind::transpose_bytes: {
            const auto a = args_of<TransposeArgs>(step);
            backend.transpose_bytes(stream, a.src, a.dst, a.rows, a.cols);
            break;
        }
        case Kind::record_amax: {
            const auto a = args_of<RecordAmaxArgs>(step);
            backend.record_amax(stream, a.src, dtype(a.src_dtype), a.n, a.meta);
            break;
        }
        case Kind::update_scaling: {
            const auto a = args_of<UpdateScalingArgs>(step);
            backend.update_scaling_on(stream, a.meta);
            break;
        }
        }
    }
}

void GraphReplay::reserve() {
    // seen_ and graphs_ never hold more than kSeen / kGraphs lists: with this capacity, remembering a
    // list after it ran (seen_.push_back) cannot fail with the work already launched.
    seen_.reserve(kSeen);
    graphs_.reserve(kGraphs);
}

void GraphReplay::run(const Context &ctx, const LaunchList &list, float *host_scratch, bool *launched) {
    // *launched: set just before the first work reaches the caller's stream (or runs, on the CPU).
    auto launching = [launched] {
        if (launched) *launched = true;
    };
    // Every path that runs the list step by step first makes its GEMM plans (LaunchList::prepare: the
    // host allocations, before the first launch); a replayed graph needs none, so the steady state
    // makes no plan look-up at all.
    kernels::Backend &backend = ctx.backend();
    if (!enabled_ || !backend.supports_graphs() || list.size() == 0) {
        list.prepare(ctx);
        launching();
        return list.run(ctx, ctx.stream(), host_scratch);
    }
    reserve();  // the bookkeeping's fixed capacity (a no-op after the first call)
    void *stream = ctx.stream();
    // The application is capturing its own stream: these launches belong in its graph.
    if (backend.stream_is_capturing(stream)) {
        list.prepare(ctx);
        launching();
        return list.run(ctx, stream);
    }
    ++clock_;
    for (Graph &g : graphs_) {
        if (g.list == list) {
            launching();
            backend.launch_graph(g.exec, stream);
            g.last_use = clock_;
            ++replays_;
            return;
        }
    }
    list.prepare(ctx);  // it runs step by step below: eagerly, or into a capture
    const auto seen = std::find(seen_.begin(), seen_.end(), list);
    if (seen == seen_.end()) {  // first sighting: run it, remember it
        launching();
        list.run(ctx, stream);
        if (seen_.size() == kSeen) seen_.erase(seen_.begin());
        seen_.push_back(list);
        return;
    }
    seen_.erase(seen);
    // Second sighting: capture on a private stream (nothing runs there), then launch on the caller's.
    // The stream is one per device for the process: threads (each with its own context) take turns.
    static std::mutex capture_mutex;
    std::lock_guard<std::mutex> lock(capture_mutex);
    void *capture = backend.capture_stream();
    kernels::Backend::Graph exec;
    try {
        backend.begin_capture(capture);
        try {
            list.run(ctx, capture);
        } catch (...) {
            backend.abort_capture(capture);
            throw;
        }
        exec = backend.end_capture(capture);
    } catch (const Error &) {
        // Not capturable here (the list ran eagerly once already, so the work itself is sound):
        // run eagerly from now on.
        enabled_ = false;
        graphs_.clear();
        seen_.clear();
        launching();
        return list.run(ctx, stream);
    }
    if (graphs_.size() == kGraphs)
        graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(),
                                       [](const Graph &a, const Graph &b) { return a.last_use < b.last_use; }));
    graphs_.push_back({list, exec, clock_});
    launching();
    backend.launch_graph(exec, stream);
    ++replays_;
}

}  // namespace fp8amp::core
