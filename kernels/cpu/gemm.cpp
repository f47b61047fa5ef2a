// The CPU GEMM of the Linear layer, and its two helpers (bias-gradient column sums, byte transpose).
// Semantics follow cuBLASLt's: the operands' raw values are multiplied and summed in FP32, the sum is
// multiplied by scale_a * scale_b, the bias (already in its epilogue dtype) is added, and the result
// is rounded once into D's dtype. The order of the FP32 sum differs from the GPU's, so CPU and CUDA
// agree to FP32 rounding, not bit for bit.
//
// No function here allocates host memory: their F32 scratch is the caller's (sized up front with
// gemm_scratch_floats), so that a call which already changed state (a quantize that recorded its amax
// earlier in the same LaunchList) cannot fail half-way with std::bad_alloc (issue 22). A worker
// thread that cannot be started does its rows on the calling thread instead.
#include <algorithm>
#include <cstring>
#include <thread>

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

// Runs body(begin, end) over [0, rows) on up to hardware_concurrency threads (at most kMaxThreads), for
// work big enough to pay. The threads live in a fixed array (no vector to grow); a thread that cannot
// be started (std::system_error, or std::bad_alloc for its state) leaves its chunk to the calling
// thread. Each row is computed alone, so who computes it changes no bit of the result.
constexpr size_t kMaxThreads = 64;

template <class Body>
void parallel_rows(size_t rows, size_t work_per_row, Body &&body) {
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t wanted = std::min<size_t>({hw, kMaxThreads, rows, 1 + rows * work_per_row / (1u << 20)});
    if (wanted <= 1) {
        body(size_t{0}, rows);
        return;
    }
    std::thread threads[kMaxThreads];
    size_t started = 0;
    const size_t chunk = (rows + wanted - 1) / wanted;
    for (size_t begin = 0; begin < rows; begin += chunk) {
        const size_t end = std::min(rows, begin + chunk);
        try {
            threads[started] = std::thread([&body, begin, end] { body(begin, end); });
            ++started;
        } catch (...) {
            body(begin, end);
        }
    }
    for (size_t t = 0; t < started; ++t) threads[t].join();
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
