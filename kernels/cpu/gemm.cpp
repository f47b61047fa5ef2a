// The CPU GEMM of the Linear layer, and its two helpers (bias-gradient column sums, byte transpose).
// Semantics follow cuBLASLt's: the operands' raw values are multiplied and summed in FP32, the sum is
// multiplied by scale_a * scale_b, the bias (already in its epilogue dtype) is added, and the result
// is rounded once into D's dtype. The order of the FP32 sum differs from the GPU's, so CPU and CUDA
// agree to FP32 rounding, not bit for bit.
//
// No function here allocates host memory: their F32 scratch is the caller's (sized up front with
// gemm_scratch_floats), so that a call which already changed state (a quantize that recorded its amax
// earlier in the same LaunchList) cannot fail half-way with std::bad_alloc (issue 22). Big GEMMs
// share their rows with a persistent pool of worker threads (RowPool below); a worker that cannot be
// started leaves its rows to the others and to the calling thread.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>

#include "convert.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cpu {

namespace {

// The operand as a float32 matrix [rows, k], K-contiguous, decoded exactly (no scale), into out.
void decode_k_contiguous(const GemmOperand &op, size_t rows, size_t k, float *out) {
    if (op.k_contiguous) {
        for_each_value(op.data, op.dtype, rows * k, [&](size_t i, float v) { out[i] = v; });
    } else {  // stored [k, rows]
        for_each_value(op.data, op.dtype, rows * k, [&](size_t i, float v) { out[(i % rows) * k + i / rows] = v; });
    }
}

float scale_of(const float *scale_inv) { return scale_inv ? *scale_inv : 1.0f; }

// Eight interleaved FP32 partial sums, added pairwise at the end: the compiler vectorizes it, and the
// rounding error grows like that of a blocked GPU sum rather than a long serial one.
float dot(const float *a, const float *b, size_t k) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
    for (int l = 0; i < k; ++i, ++l) lanes[l] += a[i] * b[i];
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// The worker threads of parallel_rows: started once, on the first GEMM big enough to want them, and
// kept for the life of the process, so that a GEMM does not pay a thread start (tens of microseconds
// each) on every call. Why not OpenMP: libgomp ends the process (gomp_fatal, exit) when it cannot
// allocate its team or start a thread, and a failed call here must return a status instead (issue
// 22; tests/capi/test_fault_injection_host.c refuses each of those in turn); ThreadSanitizer does not
// see into an uninstrumented libgomp either. This pool uses only std::thread, std::mutex and
// std::condition_variable, and allocates nothing per call: a worker that cannot be started (its
// std::thread state, pthread_create) leaves its chunks to the others and to the calling thread, and
// the next call tries to start it again.
//
// One job at a time: a second thread calling while the pool is busy (GEMMs of two contexts at once)
// runs its rows alone on its own thread. Chunks are handed out in order to whoever asks next; each row
// is computed alone, so who computes it changes no bit of the result.
//
// The pool lives in static storage and is never destroyed: its workers are detached and wait on its
// condition variable until the process ends. Destroying it at exit would have to join them, which
// hangs in a child of fork() (the threads were not copied) and races with static destructors.
constexpr size_t kMaxThreads = 64;

class RowPool {
public:
    using Fn = void (*)(void *body, size_t begin, size_t end) noexcept;

    static RowPool &instance() {
        alignas(RowPool) static unsigned char storage[sizeof(RowPool)];
        static RowPool *const pool = new (storage) RowPool;  // no heap; never destroyed (see above)
        return *pool;
    }

    // Runs fn(body, begin, end) over [0, rows) in `chunks` chunks of `chunk` rows, on the calling thread
    // and up to chunks - 1 workers. Returns false, having run nothing, when another caller holds the pool.
    bool run(size_t rows, size_t chunk, size_t chunks, Fn fn, void *body) {
        std::unique_lock<std::mutex> caller(caller_, std::try_to_lock);
        if (!caller.owns_lock()) return false;
        start_workers(std::min(chunks - 1, kMaxThreads));
        std::unique_lock<std::mutex> lock(mutex_);
        fn_ = fn;
        body_ = body;
        rows_ = rows;
        chunk_ = chunk;
        chunks_ = chunks;
        next_ = 0;
        done_ = 0;
        wake_.notify_all();
        while (next_ < chunks_) run_chunk(lock);
        finished_.wait(lock, [this] { return done_ == chunks_; });
        chunks_ = next_ = done_ = 0;  // nothing left to take: the workers sleep
        return true;
    }

private:
    RowPool() = default;

    // Called with caller_ held: started_ is the caller's alone.
    void start_workers(size_t wanted) {
        for (; started_ < wanted; ++started_) {
            try {
                std::thread(&RowPool::work, this).detach();
            } catch (...) {  // std::system_error, std::bad_alloc: fewer workers this time
                return;
            }
        }
    }

    // Takes the next chunk and runs it outside the lock. Called with the lock held and next_ < chunks_.
    void run_chunk(std::unique_lock<std::mutex> &lock) {
        const size_t begin = next_++ * chunk_;
        const size_t end = std::min(rows_, begin + chunk_);
        const Fn fn = fn_;
        void *const body = body_;
        lock.unlock();
        fn(body, begin, end);
        lock.lock();
        if (++done_ == chunks_) finished_.notify_one();
    }

    void work() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [this] { return next_ < chunks_; });
            run_chunk(lock);
        }
    }

    std::mutex caller_;  // held by the one caller whose job the pool runs
    std::mutex mutex_;   // guards the job below
    std::condition_variable wake_, finished_;
    size_t started_ = 0;
    Fn fn_ = nullptr;
    void *body_ = nullptr;
    size_t rows_ = 0, chunk_ = 0, chunks_ = 0, next_ = 0, done_ = 0;
};

// Runs body(begin, end) over [0, rows) on up to hardware_concurrency threads (at most kMaxThreads),
// the calling thread included, for work big enough to pay (more than 2^20 multiply-adds a thread).
template <class Body>
void parallel_rows(size_t rows, size_t work_per_row, Body &&body) {
    // Asked once: glibc answers hardware_concurrency by reading /sys, which costs microseconds a call.
    static const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t wanted = std::min<size_t>({hw, kMaxThreads, rows, 1 + rows * work_per_row / (1u << 20)});
    if (wanted > 1) {
        using B = std::remove_reference_t<Body>;
        const RowPool::Fn fn = [](void *b, size_t begin, size_t end) noexcept { (*static_cast<B *>(b))(begin, end); };
        const size_t chunk = (rows + wanted - 1) / wanted;
        if (RowPool::instance().run(rows, chunk, (rows + chunk - 1) / chunk, fn, &body)) return;
    }
    body(size_t{0}, rows);
}

}  // namespace

size_t gemm_scratch_floats(const GemmArgs &g) {
    const auto m = static_cast<size_t>(g.m), n = static_cast<size_t>(g.n), k = static_cast<size_t>(g.k);
    return m * k + n * k + n + (g.accumulate ? m * n : 0);
}

void gemm(const GemmArgs &g, float *scratch) {
    const auto m = static_cast<size_t>(g.m), n = static_cast<size_t>(g.n), k = static_cast<size_t>(g.k);
    if (g.accumulate && g.d_dtype != FP8AMP_DTYPE_F32)
        fail(FP8AMP_ERROR_INTERNAL, "cpu gemm: accumulation needs an F32 output");
    // scratch: A [m, k], B [n, k], the bias [n], then (accumulating) D's previous values [m, n].
    float *const a = scratch;
    float *const b = a + m * k;
    float *const bias = b + n * k;
    float *const previous = bias + n;
    decode_k_contiguous(g.a, m, k, a);
    decode_k_contiguous(g.b, n, k, b);
    std::fill(bias, bias + n, 0.0f);
    if (g.bias) for_each_value(g.bias, g.bias_dtype, n, [&](size_t i, float v) { bias[i] = v; });
    const float scale = scale_of(g.a.scale_inv) * scale_of(g.b.scale_inv);
    if (g.accumulate) std::memcpy(previous, g.d, m * n * sizeof(float));
    with_store(g.d, g.d_dtype, [&](auto store) {
        parallel_rows(m, n * k, [&](size_t begin, size_t end) {
            for (size_t i = begin; i < end; ++i)
                for (size_t j = 0; j < n; ++j) {
                    float v = scale * dot(&a[i * k], &b[j * k], k);
                    if (g.accumulate) v += previous[i * n + j];
                    store(i * n + j, v + bias[j]);
                }
        });
    });
}

void column_sum(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst, bool accumulate,
                float *scratch) {
    float *const sum = scratch;  // cols floats
    std::fill(sum, sum + cols, 0.0f);
    for_each_value(src, src_dtype, rows * cols, [&](size_t i, float v) { sum[i % cols] += v; });
    for (size_t c = 0; c < cols; ++c) dst[c] = accumulate ? dst[c] + sum[c] : sum[c];
}

void transpose_bytes(const void *src, void *dst, size_t rows, size_t cols) {
    const auto *in = static_cast<const uint8_t *>(src);
    auto *out = static_cast<uint8_t *>(dst);
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

}  // namespace fp8amp::kernels::cpu
