// The CPU GEMM of the Linear layer, and its two helpers (bias-gradient column sums, byte transpose).
// Semantics follow cuBLASLt's: the operands' raw values are multiplied and summed in FP32, the sum is
// multiplied by scale_a * scale_b, the bias (already in its epilogue dtype) is added, and the result
// is rounded once into D's dtype. The order of the FP32 sum differs from the GPU's, so CPU and CUDA
// agree to FP32 rounding, not bit for bit.
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "convert.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cpu {

namespace {

// The operand as a float32 matrix [rows, k], K-contiguous, decoded exactly (no scale).
std::vector<float> decode_k_contiguous(const GemmOperand &op, size_t rows, size_t k) {
    std::vector<float> out(rows * k);
    if (op.k_contiguous) {
        for_each_value(op.data, op.dtype, rows * k, [&](size_t i, float v) { out[i] = v; });
    } else {  // stored [k, rows]
        for_each_value(op.data, op.dtype, rows * k, [&](size_t i, float v) { out[(i % rows) * k + i / rows] = v; });
    }
    return out;
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

// Runs body(begin, end) over [0, rows) on up to hardware_concurrency threads, for work big enough to pay.
template <class Body>
void parallel_rows(size_t rows, size_t work_per_row, Body &&body) {
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t wanted = std::min<size_t>({hw, rows, 1 + rows * work_per_row / (1u << 20)});
    if (wanted <= 1) {
        body(size_t{0}, rows);
        return;
    }
    std::vector<std::thread> threads;
    const size_t chunk = (rows + wanted - 1) / wanted;
    for (size_t begin = 0; begin < rows; begin += chunk)
        threads.emplace_back([&, begin] { body(begin, std::min(rows, begin + chunk)); });
    for (auto &t : threads) t.join();
}

}  // namespace

void gemm(const GemmArgs &g) {
    const auto m = static_cast<size_t>(g.m), n = static_cast<size_t>(g.n), k = static_cast<size_t>(g.k);
    const std::vector<float> a = decode_k_contiguous(g.a, m, k);
    const std::vector<float> b = decode_k_contiguous(g.b, n, k);
    std::vector<float> bias(n, 0.0f);
    if (g.bias) for_each_value(g.bias, g.bias_dtype, n, [&](size_t i, float v) { bias[i] = v; });
    const float scale = scale_of(g.a.scale_inv) * scale_of(g.b.scale_inv);
    std::vector<float> previous;
    if (g.accumulate) {
        if (g.d_dtype != FP8AMP_DTYPE_F32) fail(FP8AMP_ERROR_INTERNAL, "cpu gemm: accumulation needs an F32 output");
        previous.assign(static_cast<const float *>(g.d), static_cast<const float *>(g.d) + m * n);
    }
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

void column_sum(const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols, float *dst, bool accumulate) {
    std::vector<float> sum(cols, 0.0f);
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
