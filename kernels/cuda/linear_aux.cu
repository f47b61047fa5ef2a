// The Linear layer's two small kernels besides the GEMMs: the bias gradient (column sums of dY, in
// FP32, from dY itself rather than its FP8 copy) and the byte transpose that gives an E4M3 weight its
// transposed copy for the backward GEMM.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_common.cuh"
#include "elementwise.cuh"

namespace fp8amp::kernels::cuda {

namespace {

constexpr int kSumCols = 256;   // columns per block, one per thread: coalesced row reads

// partial[chunk][c] = sum of src[r][c] over the chunk's rows.
template <fp8amp_dtype D>
__global__ void column_partial_sums(const typename Storage<D>::type *src, size_t rows, size_t cols, size_t chunk_rows,
                                    float *partial) {
    const size_t c = static_cast<size_t>(blockIdx.x) * kSumCols + threadIdx.x;
    if (c >= cols) return;
    const size_t begin = blockIdx.y * chunk_rows, end = min(rows, begin + chunk_rows);
    float sum = 0.0f;
    for (size_t r = begin; r < end; ++r) sum += to_f32<D>(src[r * cols + c]);
    partial[blockIdx.y * cols + c] = sum;
}

__global__ void column_finish(const float *partial, int chunks, size_t cols, float *dst, bool accumulate) {
    const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float sum = 0.0f;
    for (int i = 0; i < chunks; ++i) sum += partial[i * cols + c];
    dst[c] = accumulate ? dst[c] + sum : sum;
}

constexpr int kTile = 32;

__global__ void transpose_bytes_kernel(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols) {
    __shared__ uint8_t tile[kTile][kTile + 4];
    const size_t r0 = static_cast<size_t>(blockIdx.y) * kTile, c0 = static_cast<size_t>(blockIdx.x) * kTile;
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
        const size_t r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
        const size_t c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
    }
}

}  // namespace

void column_sum(int device, void *stream, const void *src, fp8amp_dtype src_dtype, size_t rows, size_t cols,
                float *dst, bool accumulate, float *partial) {
    DeviceGuard guard(device);
    auto s = static_cast<cudaStream_t>(stream);
    // Row chunks summed separately, then in order: deterministic, and parallel over tall matrices.
    const int chunks = static_cast<int>(std::min<size_t>(kColumnSumChunks, std::max<size_t>(rows, 1)));
    const size_t chunk_rows = (rows + chunks - 1) / chunks;
    const dim3 grid(static_cast<unsigned>((cols + kSumCols - 1) / kSumCols), static_cast<unsigned>(chunks));
    switch (src_dtype) {
    case FP8AMP_DTYPE_F32:
        column_partial_sums<FP8AMP_DTYPE_F32><<<grid, kSumCols, 0, s>>>(static_cast<const float *>(src), rows, cols,
                                                                        chunk_rows, partial);
        break;
    case FP8AMP_DTYPE_F16:
        column_partial_sums<FP8AMP_DTYPE_F16><<<grid, kSumCols, 0, s>>>(static_cast<const uint16_t *>(src), rows, cols,
                                                                        chunk_rows, partial);
        break;
    case FP8AMP_DTYPE_BF16:
        column_partial_sums<FP8AMP_DTYPE_BF16><<<grid, kSumCols, 0, s>>>(static_cast<const uint16_t *>(src), rows,
                                                                         cols, chunk_rows, partial);
        break;
    default: fail(FP8AMP_ERROR_INTERNAL, "column_sum: unsupported dtype");
    }
    check_launch("column_partial_sums");
    column_finish<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, s>>>(partial, chunks, cols, dst, accumulate);
    check_launch("column_finish");
}

void column_sum_finish(int device, void *stream, const float *partial, size_t blocks, size_t cols, float *dst,
                       bool accumulate) {
    DeviceGuard guard(device);
    column_finish<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        partial, static_cast<int>(blocks), cols, dst, accumulate);
    check_launch("column_finish");
}

void transpose_bytes(int device, void *stream, const void *src, void *dst, size_t rows, size_t cols) {
    DeviceGuard guard(device);
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
    transpose_bytes_kernel<<<grid, dim3(kTile, 8), 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint8_t *>(src), static_cast<uint8_t *>(dst), rows, cols);
    check_launch("transpose_bytes");
}

}  // namespace fp8amp::kernels::cuda
