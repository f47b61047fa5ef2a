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

constexpr int kTile = 64;      // bytes a side of a tile
constexpr int kBlockTiles = 4;  // tiles a block takes, side by side along the columns

// dst[c][r] = src[r][c] for an [rows, cols] byte matrix. A block of 256 threads takes 4 tiles of 64 x
// 64 bytes side by side (64 rows, 256 columns) through shared memory. A whole tile with rows and cols
// multiples of 16 and 16-byte aligned bases (the FP8 copies of the norms' and activations' outputs,
// weights) moves as one 16-byte load and one 16-byte store a thread: each thread loads 16 bytes of a
// tile row (the block's 4 loads issued before any is used: 16 KB in flight a block), then gathers 16
// bytes of a tile column (16 one-byte shared loads) and stores them as one run of dst. The stores:
// 4 consecutive threads write the 64 bytes of one dst row (a warp: 8 rows, 64 whole bytes each), where
// a warp wrote 16 bytes into each of 32 rows (half sectors) before. For the gathers to stay free of
// bank conflicts -- a warp reads 8 columns of 4 rows 16 apart, which a row pitch of 80 bytes puts in
// the same banks -- a tile row's four 16-byte chunks are stored swizzled: chunk q of row i at chunk
// q ^ (i / 16). The one-byte loads and stores a byte of the 32 x 32 tiles before made the +t forwards'
// separate transpose 2-3x the time of their forward. Other tiles go byte by byte (unswizzled).
__global__ void __launch_bounds__(256) transpose_bytes_kernel(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols,
                                                              bool vec) {
    // rows of 80 bytes: 16-byte aligned for the whole tiles, 4-way conflicts (not 16) on the byte path
    __shared__ __align__(16) uint8_t tile[kBlockTiles][kTile][kTile + 16];
    const size_t r0 = static_cast<size_t>(blockIdx.y) * kTile, c0 = static_cast<size_t>(blockIdx.x) * kTile * kBlockTiles;
    const int t = threadIdx.x;
    bool whole[kBlockTiles];  // the same for every thread of the block
#pragma unroll
    for (int u = 0; u < kBlockTiles; ++u) whole[u] = vec && r0 + kTile <= rows && c0 + kTile * (u + 1) <= cols;
    {
        const int i = t / 4, q = t % 4;  // tile row i, its 16-byte quarter q
        uint4 v[kBlockTiles];
#pragma unroll
        for (int u = 0; u < kBlockTiles; ++u)
            if (whole[u]) v[u] = __ldg(reinterpret_cast<const uint4 *>(src + (r0 + i) * cols + c0 + kTile * u + 16 * q));
#pragma unroll
        for (int u = 0; u < kBlockTiles; ++u)
            if (whole[u]) *reinterpret_cast<uint4 *>(&tile[u][i][16 * (q ^ (i >> 4))]) = v[u];
    }
#pragma unroll
    for (int u = 0; u < kBlockTiles; ++u) {
        if (whole[u]) continue;
        for (int k = t; k < kTile * kTile; k += 256) {
            const int i = k / kTile, j = k % kTile;
            const size_t r = r0 + i, c = c0 + kTile * u + j;
            if (r < rows && c < cols) tile[u][i][j] = src[r * cols + c];
        }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kBlockTiles; ++u) {
        const size_t cu = c0 + kTile * u;
        if (whole[u]) {
            const int c = t / 4, g = t % 4;  // tile column c, its rows 16g .. 16g + 15 (swizzle g)
            const int j = 16 * ((c >> 4) ^ g) + (c & 15);  // where column c lies in those rows
            uint32_t w[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const uint32_t b0 = tile[u][16 * g + 4 * m][j], b1 = tile[u][16 * g + 4 * m + 1][j];
                const uint32_t b2 = tile[u][16 * g + 4 * m + 2][j], b3 = tile[u][16 * g + 4 * m + 3][j];
                w[m] = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24);
            }
            *reinterpret_cast<uint4 *>(dst + (cu + c) * rows + r0 + 16 * g) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
            for (int k = t; k < kTile * kTile; k += 256) {
                const int i = k / kTile, j = k % kTile;  // dst row cu + i, column r0 + j
                const size_t c = cu + i, r = r0 + j;
                if (r < rows && c < cols) dst[c * rows + r] = tile[u][j][i];
            }
        }
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
    const size_t block_cols = size_t(kTile) * kBlockTiles;
    const dim3 grid(static_cast<unsigned>((cols + block_cols - 1) / block_cols), static_cast<unsigned>((rows + kTile - 1) / kTile));
    const bool vec = rows % 16 == 0 && cols % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    transpose_bytes_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint8_t *>(src), static_cast<uint8_t *>(dst), rows, cols, vec);
    check_launch("transpose_bytes");
}

}  // namespace fp8amp::kernels::cuda
