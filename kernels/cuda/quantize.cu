// Scaled FP8 casting on CUDA: quantize (amax and statistics fused into the same pass), current-
// scaling amax, quantize + transpose, dequantize, and the batched scaling-meta update.
//
// The element-wise kernels are memory-bound: each thread moves 16-byte (or wider) packs, keeps
// kUnroll packs in flight before using the first, and folds its amax and counters in registers; a
// block reduces them once and issues one atomic per block. The grid is persistent (a few blocks per
// multiprocessor), so the per-block epilogue is paid a few hundred times, not once per tile.
// Numerics are kernels/cpu/quantize.cpp's, bit for bit: decode exactly, one float32 multiply by the
// scale, one rounding into the destination.
#include <cstdint>
#include <type_traits>

#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "quantize_f16.cuh"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda {
namespace {

using namespace casting;  // the pack, the reduction, the tally, the epilogue, the launch helpers

// Tuning knobs, overridable at build time (-DFP8AMP_QUANTIZE_VEC=8 ...) so that bench/ can compare
// variants in one run on the device; the defaults are the measured best (docs/performance.md).
#ifndef FP8AMP_QUANTIZE_VEC
#define FP8AMP_QUANTIZE_VEC 8
#endif
#ifndef FP8AMP_QUANTIZE_UNROLL
#define FP8AMP_QUANTIZE_UNROLL 2
#endif
#ifndef FP8AMP_TRANSPOSE_MIN_BLOCKS
#define FP8AMP_TRANSPOSE_MIN_BLOCKS 1
#endif

#ifndef FP8AMP_STREAMING_STORES  // 1: evict-first stores (st.global.cs) for the streaming outputs
#define FP8AMP_STREAMING_STORES 0
#endif

constexpr int kVec = FP8AMP_QUANTIZE_VEC;        // elements per pack of the streaming kernels
constexpr int kUnroll = FP8AMP_QUANTIZE_UNROLL;  // packs in flight per thread
#ifndef FP8AMP_DEQUANTIZE_UNROLL
#define FP8AMP_DEQUANTIZE_UNROLL 4
#endif
#ifndef FP8AMP_DEQUANTIZE_TABLE  // 1: dequantize looks its results up in a per-block shared-memory table
#define FP8AMP_DEQUANTIZE_TABLE 1
#endif
#ifndef FP8AMP_DEQUANTIZE_COPIES  // replicas of that table (32: no bank conflicts; 16: at most 2-way)
#define FP8AMP_DEQUANTIZE_COPIES 16
#endif
#ifndef FP8AMP_DEQUANTIZE_VEC  // FP8 codes per pack of the table kernel (8 or 16)
#define FP8AMP_DEQUANTIZE_VEC 8
#endif
#ifndef FP8AMP_DEQUANTIZE_STREAMING_STORES  // 1: the table kernel stores with the evict-first hint
#define FP8AMP_DEQUANTIZE_STREAMING_STORES 1
#endif
#ifndef FP8AMP_DEQUANTIZE_STREAMING_LOADS  // 1: the table kernel loads its codes with the evict-first hint
#define FP8AMP_DEQUANTIZE_STREAMING_LOADS 1
#endif
#ifndef FP8AMP_DEQUANTIZE_MIN_BLOCKS  // > 0: __launch_bounds__ minimum of resident blocks of the table kernel
#define FP8AMP_DEQUANTIZE_MIN_BLOCKS 8
#endif
constexpr int kDequantizeUnroll = FP8AMP_DEQUANTIZE_UNROLL;
constexpr int kDequantizeCopies = FP8AMP_DEQUANTIZE_COPIES;
constexpr int kDequantizeVec = FP8AMP_DEQUANTIZE_VEC;
constexpr int kTransposeMinBlocks = FP8AMP_TRANSPOSE_MIN_BLOCKS;

template <class T>
using Pack = PackN<T, kVec>;

// Stores a pack, optionally with the evict-first hint: outputs that nobody reads soon need not
// displace L2 lines.
template <class P>
__device__ __forceinline__ void store_pack(P *dst, const P &v) {
    if constexpr (FP8AMP_STREAMING_STORES && sizeof(P) % 16 == 0) {
        const auto *src = reinterpret_cast<const uint4 *>(&v);
#pragma unroll
        for (int i = 0; i < int(sizeof(P) / 16); ++i) __stcs(reinterpret_cast<uint4 *>(dst) + i, src[i]);
    } else if constexpr (FP8AMP_STREAMING_STORES && sizeof(P) == 8) {
        __stcs(reinterpret_cast<uint2 *>(dst), *reinterpret_cast<const uint2 *>(&v));
    } else {
        *dst = v;
    }
}



template <fp8amp_dtype D, bool kStats>
__device__ __forceinline__ uint8_t quantize_one(float x, float scale, float fp8_max, Tally &t) {
    t.amax = max(t.amax, amax_bits_of(x));
    const float y = scaled(x, scale);
    const uint8_t q = from_f32<D>(y);
    if (kStats) {
        t.saturated += (fabsf(y) > fp8_max) ? 1u : 0u;  // false for NaN
        t.underflowed += (x != 0.0f && x == x && (q & 0x7Fu) == 0) ? 1u : 0u;
    }
    return q;
}

// ---- the fast path of a pack ----------------------------------------------------------------------
// Per element it is a few instructions: an exact hardware decode, a magnitude max (the amax), one
// multiply, and half a paired satfinite conversion. A pack that holds a NaN leaves it for
// quantize_one, whose explicit NaN handling keeps the sign; for every other pack the two paths give
// the same bits (a scale in [FLT_MIN, FLT_MAX] never turns a non-NaN into a NaN).

template <fp8amp_dtype S>
__device__ __forceinline__ float fast_to_f32(typename Storage<S>::type v) {
    if constexpr (S == FP8AMP_DTYPE_F32) return v;
    if constexpr (S == FP8AMP_DTYPE_F16) return __half2float(__ushort_as_half(v));
    if constexpr (S == FP8AMP_DTYPE_BF16) return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

// fp8x2 and underflow_limit: casting_common.cuh (shared with the fused activations).

// Quantizes one pack; returns false (and writes nothing) when the pack holds a NaN.
template <fp8amp_dtype S, fp8amp_dtype D, bool kStats, class SrcPack, int kN = int(sizeof(SrcPack::v) / sizeof(SrcPack::v[0]))>
__device__ __forceinline__ bool quantize_pack_fast(const SrcPack &a, PackN<uint8_t, kN> &b, float scale, float fp8_max,
                                                   Tally &t) {
    constexpr int kVec = kN;
    float x[kVec];
    uint32_t mag = 0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
        x[k] = fast_to_f32<S>(a.v[k]);
        mag = max(mag, __float_as_uint(x[k]) & 0x7FFFFFFFu);
    }
    if (mag > 0x7F800000u) return false;
    t.amax = max(t.amax, mag);
    float y[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) y[k] = x[k] * scale;
    uint16_t pairs[kVec / 2];
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) pairs[k] = fp8x2<D>(y[2 * k], y[2 * k + 1]);
    memcpy(b.v, pairs, kVec);
    if (kStats) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
            t.saturated += fabsf(y[k]) > fp8_max ? 1u : 0u;
            t.underflowed += (x[k] != 0.0f && fabsf(y[k]) <= underflow_limit<D>()) ? 1u : 0u;
        }
    }
    return true;
}

// Packs with a NaN (rare) take the element-by-element path with its explicit NaN handling.
template <fp8amp_dtype S, fp8amp_dtype D, bool kStats, class SrcPack, int kVec = int(sizeof(SrcPack::v) / sizeof(SrcPack::v[0]))>
__device__ __forceinline__ void quantize_pack_slow(const SrcPack &a, PackN<uint8_t, kVec> &b, float scale, float fp8_max,
                                                Tally &t) {
    for (int k = 0; k < kVec; ++k) b.v[k] = quantize_one<D, kStats>(to_f32<S>(a.v[k]), scale, fp8_max, t);
}

template <fp8amp_dtype S, fp8amp_dtype D, bool kStats, class SrcPack, int kVec = int(sizeof(SrcPack::v) / sizeof(SrcPack::v[0]))>
__device__ __forceinline__ PackN<uint8_t, kVec> quantize_pack(const SrcPack &a, float scale, float fp8_max, Tally &t) {
    PackN<uint8_t, kVec> b;
    if (!quantize_pack_fast<S, D, kStats>(a, b, scale, fp8_max, t)) quantize_pack_slow<S, D, kStats>(a, b, scale, fp8_max, t);
    return b;
}

// The per-element dequantize with the shared software codec. The result table below computes its
// 256 entries with the same functions. As a kernel of its own (FP8AMP_DEQUANTIZE_TABLE=0) it reached
// 75% of copy on an H100, faster than the hardware FP8x2 -> F16x2 conversion (62%), an
// exponent-rebias decode (61%) and a shared-memory decode table (63%), but issue-bound
// (docs/performance.md).
template <fp8amp_dtype S, fp8amp_dtype D>
__device__ __forceinline__ Pack<typename Storage<D>::type> dequantize_pack(const Pack<uint8_t> &a, float scale_inv) {
    Pack<typename Storage<D>::type> b;
#pragma unroll
    for (int k = 0; k < kVec; ++k) b.v[k] = from_f32<D>(scaled(to_f32<S>(a.v[k]), scale_inv));
    return b;
}



// The grid-stride walk of the streaming kernels: packs of kVec elements, kU of them loaded before
// the first is used (when kVectorized), then the remaining elements one by one.
// on_pack(i, pack) gets pack index i; on_element(i) gets element index i.
template <int kU, bool kVectorized, class T, class OnPack, class OnElement>
__device__ __forceinline__ void for_each_pack(const T *__restrict__ src, size_t n, OnPack &&on_pack,
                                              OnElement &&on_element) {
    const size_t stride = size_t(gridDim.x) * kThreads;
    size_t done = 0;
    if (kVectorized) {
        const size_t packs = n / kVec;
        const auto *in = reinterpret_cast<const Pack<T> *>(src);
        size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x;
        for (; i + (kU - 1) * stride < packs; i += kU * stride) {
            Pack<T> a[kU];
#pragma unroll
            for (int u = 0; u < kU; ++u) a[u] = in[i + u * stride];
#pragma unroll
            for (int u = 0; u < kU; ++u) on_pack(i + u * stride, a[u]);
        }
        for (; i < packs; i += stride) on_pack(i, in[i]);
        done = packs * kVec;
    }
    for (size_t i = done + blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += stride) on_element(i);
}

template <fp8amp_dtype S, fp8amp_dtype D, bool kVectorized, bool kStats>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const typename Storage<S>::type *__restrict__ src,
                                                            uint8_t *__restrict__ dst, size_t n, ScalingState *meta,
                                                            float *scale_inv, float *scale_inv_t) {
    using SrcT = typename Storage<S>::type;
    const float scale = quantize_scale(*meta);
    const float fp8_max = meta->fp8_max;
    Tally t;
    auto *out = reinterpret_cast<Pack<uint8_t> *>(dst);
    for_each_pack<kUnroll, kVectorized>(
        src, n,
        [&](size_t i, const Pack<SrcT> &a) { store_pack(out + i, quantize_pack<S, D, kStats>(a, scale, fp8_max, t)); },
        [&](size_t i) { dst[i] = quantize_one<D, kStats>(to_f32<S>(src[i]), scale, fp8_max, t); });
    finish_block<kStats>(t, meta, scale, scale_inv, scale_inv_t, n);
}

// Max magnitude of a pack as amax bits. 16-bit formats are reduced two at a time on their own bit
// patterns (magnitudes order like their bits, NaN above inf), then converted once per pack.
template <fp8amp_dtype S, class SrcPack>
__device__ __forceinline__ uint32_t pack_amax_bits(const SrcPack &a) {
    if constexpr (S == FP8AMP_DTYPE_F16 || S == FP8AMP_DTYPE_BF16) {
        uint32_t w[kVec / 2];
        memcpy(w, a.v, sizeof w);
        uint32_t m2 = 0;
#pragma unroll
        for (int k = 0; k < kVec / 2; ++k) m2 = __vmaxu2(m2, w[k] & 0x7FFF7FFFu);
        const uint32_t code = max(m2 & 0xFFFFu, m2 >> 16);
        if constexpr (S == FP8AMP_DTYPE_BF16) return min(code << 16, 0x7F800000u);
        else return code > 0x7C00u ? 0x7F800000u : __float_as_uint(__half2float(__ushort_as_half(code)));
    } else {
        uint32_t m = 0;
#pragma unroll
        for (int k = 0; k < kVec; ++k) m = max(m, amax_bits_of(to_f32<S>(a.v[k])));
        return m;
    }
}

template <fp8amp_dtype S, bool kVectorized>
__global__ void __launch_bounds__(kThreads) amax_kernel(const typename Storage<S>::type *__restrict__ src, size_t n,
                                                        uint32_t *amax_bits) {
    using SrcT = typename Storage<S>::type;
    uint32_t m = 0;
    for_each_pack<kUnroll, kVectorized>(
        src, n, [&](size_t, const Pack<SrcT> &a) { m = max(m, pack_amax_bits<S>(a)); },
        [&](size_t i) { m = max(m, amax_bits_of(to_f32<S>(src[i]))); });
    m = block_reduce(m, MaxOp());
    if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

template <fp8amp_dtype S, fp8amp_dtype D, bool kVectorized>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint8_t *__restrict__ src,
                                                              typename Storage<D>::type *__restrict__ dst, size_t n,
                                                              const float *scale_inv_ptr) {
    using DstT = typename Storage<D>::type;
    const float scale_inv = *scale_inv_ptr;
    auto *out = reinterpret_cast<Pack<DstT> *>(dst);
    for_each_pack<kDequantizeUnroll, kVectorized>(
        src, n, [&](size_t i, const Pack<uint8_t> &a) { store_pack(out + i, dequantize_pack<S, D>(a, scale_inv)); },
        [&](size_t i) { dst[i] = from_f32<D>(scaled(to_f32<S>(src[i]), scale_inv)); });
}

// ---- dequantize through a result table -----------------------------------------------------------
//
// A dequantized element depends only on its 8-bit code (the launch has one scale_inv), so each block
// computes the 256 results once, with the very functions dequantize_pack uses (bit-identical, NaN
// codes included), and then every element is a byte extract and one shared-memory load instead of a
// decode, a multiply and a rounding: the per-element decode made the kernel issue-bound (Nsight
// Compute: 61% of issue slots at 33% of DRAM throughput; docs/performance.md).
// The table is replicated against bank conflicts: lane l reads copy l % kCopies of entry q, at word
// q * kCopies + l % kCopies. With 32 copies that is always bank l (no conflict, 32 KB per block);
// with 16 (the default) lanes l and l + 16 can meet in one bank (at most 2-way), and the 16 KB table
// with a 32-register bound lets 8 blocks share a multiprocessor instead of 6. The kernel is now
// memory-bound (Nsight Compute: 26% of SM throughput, 76% of DRAM peak), so the rare 2-way conflict
// costs nothing measurable, and the two extra blocks (more loads in flight) gained 0.3-1.1% of copy.
// Loads and stores carry the evict-first hint: each byte is touched once, and the hint kept L2 from
// holding dead lines (+1.6% for the stores, +0.3-0.9% for the loads). Measurements in
// docs/performance.md.
constexpr int kTableCopies = kDequantizeCopies;
static_assert(kTableCopies == 32 || kTableCopies == 16 || kTableCopies == 8, "copies: 8, 16 or 32");
static_assert(kThreads == 256, "the table fill gives each thread one code");
static_assert(kDequantizeVec == 8 || kDequantizeVec == 16, "dequantize packs: 8 or 16 codes");

// The table word of code q: the destination's bits (a 16-bit result in the low half).
template <fp8amp_dtype S, fp8amp_dtype D>
__device__ __forceinline__ uint32_t table_word(uint8_t q, float scale_inv) {
    const auto y = from_f32<D>(scaled(to_f32<S>(q), scale_inv));
    if constexpr (D == FP8AMP_DTYPE_F32) return __float_as_uint(y);
    else return static_cast<uint32_t>(y);
}

// Fills the block's table (each thread one code, kCopies stores rotated across banks) and waits for it.
template <fp8amp_dtype S, fp8amp_dtype D>
__device__ __forceinline__ void fill_table(uint32_t *table, float scale_inv) {
    const uint32_t q = threadIdx.x;
    const uint32_t w = table_word<S, D>(static_cast<uint8_t>(q), scale_inv);
#pragma unroll
    for (int c = 0; c < kTableCopies; ++c) table[q * kTableCopies + (c + q) % kTableCopies] = w;
    __syncthreads();
}

// The result of code byte k of word w, from this lane's copy: `slot` is the byte offset of that copy
// ((lane % kCopies) * 4); the entry's byte offset q * kCopies * 4 has no bit in common with it.
template <int k>
__device__ __forceinline__ uint32_t lookup(const uint32_t *table, uint32_t w, uint32_t slot) {
    constexpr int kShift = kTableCopies == 32 ? 7 : kTableCopies == 16 ? 6 : 5;  // log2(kCopies * 4)
    const uint32_t offset = ((w >> (8 * k)) & 0xFFu) << kShift;
    return *reinterpret_cast<const uint32_t *>(reinterpret_cast<const char *>(table) + (offset | slot));
}

// Four results of the codes in w, as destination words: two per word for 16-bit destinations.
template <fp8amp_dtype D>
__device__ __forceinline__ void lookup4(const uint32_t *table, uint32_t w, uint32_t slot, uint32_t *out) {
    const uint32_t r0 = lookup<0>(table, w, slot), r1 = lookup<1>(table, w, slot);
    const uint32_t r2 = lookup<2>(table, w, slot), r3 = lookup<3>(table, w, slot);
    if constexpr (D == FP8AMP_DTYPE_F32) {
        out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
    } else {
        out[0] = __byte_perm(r0, r1, 0x5410);
        out[1] = __byte_perm(r2, r3, 0x5410);
    }
}

template <class P>
__device__ __forceinline__ P load_codes(const P *p) {
    static_assert(sizeof(P) == 8 || sizeof(P) == 16, "code packs are 8 or 16 bytes");
    if constexpr (FP8AMP_DEQUANTIZE_STREAMING_LOADS && sizeof(P) == 8) {
        const uint2 v = __ldcs(reinterpret_cast<const uint2 *>(p));
        return *reinterpret_cast<const P *>(&v);
    } else if constexpr (FP8AMP_DEQUANTIZE_STREAMING_LOADS) {
        const uint4 v = __ldcs(reinterpret_cast<const uint4 *>(p));
        return *reinterpret_cast<const P *>(&v);
    } else {
        return *p;
    }
}

__device__ __forceinline__ void store_results(uint4 *p, uint4 v) {
    if constexpr (FP8AMP_DEQUANTIZE_STREAMING_STORES) __stcs(p, v);
    else *p = v;
}

// The resident-block bound of the table kernel: F32 destinations (twice the results per pack) would
// spill under the 32 registers that 8 blocks leave, so they keep the compiler's own choice.
template <fp8amp_dtype D>
constexpr int dequantize_min_blocks() {
    return sizeof(typename Storage<D>::type) == 2 ? FP8AMP_DEQUANTIZE_MIN_BLOCKS : 0;
}

template <fp8amp_dtype S, fp8amp_dtype D, bool kVectorized>
__global__ void __launch_bounds__(kThreads, dequantize_min_blocks<D>())
    dequantize_table_kernel(const uint8_t *__restrict__ src, typename Storage<D>::type *__restrict__ dst, size_t n,
                            const float *scale_inv_ptr) {
    using DstT = typename Storage<D>::type;
    constexpr int kV = kDequantizeVec, kU = kDequantizeUnroll;
    constexpr int kWordsIn = kV / 4, kWordsOut = kV * int(sizeof(DstT)) / 4;
    using InPack = PackN<uint32_t, kWordsIn>;
    __shared__ uint32_t table[256 * kTableCopies];
    const uint32_t slot = (threadIdx.x % kTableCopies) * 4;
    const size_t stride = size_t(gridDim.x) * kThreads;
    size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x;
    size_t done = 0;
    if (kVectorized) {
        // The first packs are requested before the table is built, so that the fill overlaps their
        // latency; afterwards each round requests the next packs before storing this one's.
        const size_t packs = n / kV;
        const auto *in = reinterpret_cast<const InPack *>(src);
        auto *out = reinterpret_cast<uint4 *>(dst);
        InPack a[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
            if (i + u * stride < packs) a[u] = load_codes(in + i + u * stride);
        fill_table<S, D>(table, *scale_inv_ptr);
        for (; i < packs; i += kU * stride) {
            InPack b[kU];
#pragma unroll
            for (int u = 0; u < kU; ++u) b[u] = a[u];
#pragma unroll
            for (int u = 0; u < kU; ++u)
                if (i + (kU + u) * stride < packs) a[u] = load_codes(in + i + (kU + u) * stride);
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                if (i + u * stride < packs) {
                    uint32_t r[kWordsOut];
#pragma unroll
                    for (int j = 0; j < kWordsIn; ++j) lookup4<D>(table, b[u].v[j], slot, r + j * (kWordsOut / kWordsIn));
#pragma unroll
                    for (int j = 0; j < kWordsOut / 4; ++j)
                        store_results(out + (i + u * stride) * (kWordsOut / 4) + j,
                                      make_uint4(r[4 * j], r[4 * j + 1], r[4 * j + 2], r[4 * j + 3]));
                }
            }
        }
        done = packs * kV;
    } else {
        fill_table<S, D>(table, *scale_inv_ptr);
    }
    // The scalar tail (and the whole of an unaligned tensor), through the same table.
    for (size_t e = done + blockIdx.x * size_t(kThreads) + threadIdx.x; e < n; e += stride) {
        const uint32_t r = *reinterpret_cast<const uint32_t *>(reinterpret_cast<const char *>(table) +
                                                               ((uint32_t(src[e]) * kTableCopies * 4) | slot));
        if constexpr (D == FP8AMP_DTYPE_F32) dst[e] = __uint_as_float(r);
        else dst[e] = static_cast<DstT>(r);
    }
}

// ---- quantize + transpose: 128 x 128 tiles through shared memory --------------------------------
//
// Each tile row is 128 bytes = 32 words. Word w of row r is stored at word (w + 4 * (r / 16)) % 32:
// the transposing threads of a warp read 8 row groups x 4 columns at once, and this swizzle puts those
// 32 words in 32 different banks. Each of them reads one word from 16 rows (4 columns x 16 rows),
// transposes the 4x4 byte blocks in registers, and writes four 16-byte pieces of dst_t; a warp writes
// 128 contiguous bytes of each of 4 dst_t rows.

constexpr int kTile = 128;
constexpr int kTileVec = 8;  // source elements per load in a tile

__device__ __forceinline__ int tile_word(int r, int w) { return r * 32 + ((w + 4 * (r / 16)) & 31); }

// Bytes i of four words, as one word (a 4x4 byte transpose, column i).
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&col)[4]) {
    const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    col[0] = __byte_perm(ab_lo, cd_lo, 0x5410);
    col[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
    col[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
    col[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// One tile: reads src[r0:r0+128, c0:c0+128], writes dst (row-major) and dst_t (its transpose).
// fast: the whole tile is inside the matrix and every access can be vectorized.
// kColSum: also the tile's column sums (the bias gradient fused into dY's quantize-transpose), in
// the order kernels.hpp fixes (kColSumBlockRows): lane g of column c sums rows g, g + 16, ..., g + 112
// (those inside the matrix) from +0, then threads 0..127 sum the 16 lanes of their column in order
// into partial[tile row][c]. colsum: the block's [16][128] floats of shared memory.
template <fp8amp_dtype S, fp8amp_dtype D, bool kStats, bool kColSum>
__device__ __forceinline__ void transpose_tile(const typename Storage<S>::type *__restrict__ src, uint8_t *__restrict__ dst,
                                               uint8_t *__restrict__ dst_t, size_t rows, size_t cols, size_t r0,
                                               size_t c0, bool fast, float scale, float fp8_max, Tally &t,
                                               uint32_t *tile, float *colsum, float *partial) {
    using SrcT = typename Storage<S>::type;
    using SrcPack = PackN<SrcT, kTileVec>;
    static_assert(kTile == int(kColSumBlockRows) && kTile / kTileVec == int(kColSumLanes),
                  "the fused column sums' order is this tile's");
    auto *bytes = reinterpret_cast<uint8_t *>(tile);
    if (fast) {
        // Thread t quantizes the 8 columns (t % 16) * 8.. of rows t / 16 + 16 j, j = 0..7 in order.
        float lane[kTileVec];
        if constexpr (kColSum) {
#pragma unroll
            for (int e = 0; e < kTileVec; ++e) lane[e] = 0.0f;
        }
        // 128 rows x 16 packs of 8: 8 packs per thread, in two rounds of 4 loads in flight.
        constexpr int kPer = kTile * kTile / kTileVec / kThreads, kRound = 4;
#pragma unroll
        for (int h = 0; h < kPer; h += kRound) {
        SrcPack a[kRound];
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
            const int p = threadIdx.x + (h + u) * kThreads;
            const int r = p / (kTile / kTileVec), c = (p % (kTile / kTileVec)) * kTileVec;
            a[u] = *reinterpret_cast<const SrcPack *>(src + (r0 + r) * cols + c0 + c);
        }
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
            const int p = threadIdx.x + (h + u) * kThreads;
            const int r = p / (kTile / kTileVec), c = (p % (kTile / kTileVec)) * kTileVec;
            if constexpr (kColSum) {
#pragma unroll
                for (int e = 0; e < kTileVec; ++e) lane[e] = lane[e] + fast_to_f32<S>(a[u].v[e]);
            }
            const PackN<uint8_t, kTileVec> b = quantize_pack<S, D, kStats>(a[u], scale, fp8_max, t);
            *reinterpret_cast<PackN<uint8_t, kTileVec> *>(dst + (r0 + r) * cols + c0 + c) = b;
            uint32_t w[2];
            memcpy(w, b.v, 8);
            tile[tile_word(r, c / 4)] = w[0];
            tile[tile_word(r, c / 4 + 1)] = w[1];
        }
        }
        if constexpr (kColSum) {
            const int g = threadIdx.x / (kTile / kTileVec), c = (threadIdx.x % (kTile / kTileVec)) * kTileVec;
#pragma unroll
            for (int e = 0; e < kTileVec; ++e) colsum[g * kTile + c + e] = lane[e];
        }
        __syncthreads();
        const int group = threadIdx.x % 8, word = threadIdx.x / 8;  // rows 16*group.., columns 4*word..
        uint32_t out[4][4];  // [column][4-row block]
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int r = group * 16 + m * 4;
            uint32_t col[4];
            transpose4x4(tile[tile_word(r, word)], tile[tile_word(r + 1, word)], tile[tile_word(r + 2, word)],
                         tile[tile_word(r + 3, word)], col);
#pragma unroll
            for (int i = 0; i < 4; ++i) out[i][m] = col[i];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
            *reinterpret_cast<uint4 *>(dst_t + (c0 + word * 4 + i) * rows + r0 + group * 16) =
                make_uint4(out[i][0], out[i][1], out[i][2], out[i][3]);
    } else {
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
            const int r = e / kTile, c = e % kTile;
            if (r0 + r < rows && c0 + c < cols) {
                const uint8_t q = quantize_one<D, kStats>(to_f32<S>(src[(r0 + r) * cols + c0 + c]), scale, fp8_max, t);
                dst[(r0 + r) * cols + c0 + c] = q;
                bytes[tile_word(r, c / 4) * 4 + c % 4] = q;
            }
        }
        if constexpr (kColSum) {  // the same lanes as the fast path, read again (edge tiles only)
            for (int e = threadIdx.x; e < int(kColSumLanes) * kTile; e += kThreads) {
                const int g = e / kTile, c = e % kTile;
                float s = 0.0f;
                if (c0 + c < cols)
                    for (int r = g; r < kTile && r0 + r < rows; r += int(kColSumLanes))
                        s = s + to_f32<S>(src[(r0 + r) * cols + c0 + c]);
                colsum[g * kTile + c] = s;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
            const int j = e / kTile, r = e % kTile;  // consecutive threads write consecutive bytes of dst_t
            if (c0 + j < cols && r0 + r < rows) dst_t[(c0 + j) * rows + r0 + r] = bytes[tile_word(r, j / 4) * 4 + j % 4];
        }
    }
    if constexpr (kColSum) {
        if (threadIdx.x < kTile && c0 + threadIdx.x < cols) {
            float s = 0.0f;
#pragma unroll
            for (int g = 0; g < int(kColSumLanes); ++g) s = s + colsum[g * kTile + threadIdx.x];
            partial[(r0 / kTile) * cols + c0 + threadIdx.x] = s;
        }
    }
    __syncthreads();  // the tile (and the lane sums) are reused by this block's next tile
}

template <fp8amp_dtype S, fp8amp_dtype D, bool kStats, bool kColSum>
__global__ void __launch_bounds__(kThreads, kTransposeMinBlocks) quantize_transpose_kernel(const typename Storage<S>::type *__restrict__ src,
                                                                      uint8_t *__restrict__ dst,
                                                                      uint8_t *__restrict__ dst_t, size_t rows,
                                                                      size_t cols, bool aligned, ScalingState *meta,
                                                                      float *scale_inv, float *scale_inv_t,
                                                                      float *col_partial) {
    __shared__ uint32_t tile[kTile * kTile / 4];
    // The lane sums of the fused column sums (8 KB), only in the kernels that make them.
    __shared__ float colsum[kColSum ? int(kColSumLanes) * kTile : 1];
    const float scale = quantize_scale(*meta);
    const float fp8_max = meta->fp8_max;
    Tally t;
    const size_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
    for (size_t id = blockIdx.x; id < tiles_r * tiles_c; id += gridDim.x) {
        const size_t r0 = (id / tiles_c) * kTile, c0 = (id % tiles_c) * kTile;
        const bool fast = aligned && r0 + kTile <= rows && c0 + kTile <= cols;
        transpose_tile<S, D, kStats, kColSum>(src, dst, dst_t, rows, cols, r0, c0, fast, scale, fp8_max, t, tile, colsum,
                                              col_partial);
    }
    finish_block<kStats>(t, meta, scale, scale_inv, scale_inv_t, rows * cols);
}

// ---- scaling-meta update --------------------------------------------------------------------------

constexpr int kMetasPerLaunch = 1024;  // 8 KB of kernel parameters
struct MetaList {
    ScalingState *meta[kMetasPerLaunch];
};

__global__ void __launch_bounds__(kThreads) update_scaling_kernel(const __grid_constant__ MetaList list) {
    ScalingState &m = *list.meta[blockIdx.x];
    if (threadIdx.x == 0) fold_history(m);
    __syncthreads();
    if (!scale_due(m)) return;  // the same answer in every thread of the block
    const float *history = m.history();
    uint32_t best = 0;
    if (m.most_recent) {
        best = codec::f32_bits(history[m.head]);
    } else {
        for (uint32_t i = threadIdx.x; i < m.history_len; i += kThreads) best = max(best, codec::f32_bits(history[i]));
    }
    best = block_reduce(best, MaxOp());
    if (threadIdx.x == 0) apply_scale(m, codec::bits_f32(best));
}

// ---- launch helpers ------------------------------------------------------------------------------


template <class T>
bool pack_aligned(const void *p) {
    return reinterpret_cast<uintptr_t>(p) % alignof(Pack<T>) == 0;
}


template <class F>
void dispatch_fp8(fp8amp_dtype d, F &&f) {
    switch (d) {
    case FP8AMP_DTYPE_E4M3: return f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
    case FP8AMP_DTYPE_E5M2: return f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
    default: fail(FP8AMP_ERROR_INTERNAL, "quantize: destination dtype is not FP8");
    }
}

template <class F>
void dispatch_any(fp8amp_dtype s, F &&f) {
    if (s == FP8AMP_DTYPE_E4M3 || s == FP8AMP_DTYPE_E5M2) return dispatch_fp8(s, f);
    dispatch_src(s, f);
}


}  // namespace

void copy_device_to_device(int device, void *stream, void *dst, const void *src, size_t nbytes) {
    DeviceGuard guard(device);
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync (device to device)");
}

void amax(int device, void *stream_raw, const void *src, fp8amp_dtype src_dtype, size_t n, uint32_t *amax_bits) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    dispatch_any(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        using SrcT = typename Storage<S>::type;
        const auto *p = static_cast<const SrcT *>(src);
        dispatch_bool(pack_aligned<SrcT>(src), [&](auto vec) {
            const auto kernel = amax_kernel<S, decltype(vec)::value>;
            kernel<<<persistent_grid(device, kernel, n / kVec + 1), kThreads, 0, stream>>>(p, n, amax_bits);
        });
    });
    check_launch("amax_kernel");
}

void quantize(int device, void *stream_raw, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
              size_t n, const QuantizeTarget &target) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    if (target.current) {
        check(cudaMemsetAsync(&target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
        amax(device, stream_raw, src, src_dtype, n, &target.meta->amax_bits);
    }
    if (dst_dtype == FP8AMP_DTYPE_F16)  // scaled F16: its own kernels (quantize_f16.cu)
        return scaled_f16::quantize(device, stream, src, src_dtype, dst, n, target);
    dispatch_src(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        using SrcT = typename Storage<S>::type;
        const bool vec = pack_aligned<SrcT>(src) && pack_aligned<uint8_t>(dst);
        dispatch_fp8(dst_dtype, [&](auto d) {
            constexpr fp8amp_dtype D = decltype(d)::value;
            dispatch_bool(vec, [&](auto v) {
                dispatch_bool(target.stats, [&](auto st) {
                    const auto kernel = quantize_kernel<S, D, decltype(v)::value, decltype(st)::value>;
                    kernel<<<persistent_grid(device, kernel, n / kVec + 1), kThreads, 0, stream>>>(
                            static_cast<const SrcT *>(src), static_cast<uint8_t *>(dst), n, target.meta,
                            target.scale_inv, target.scale_inv_t);
                });
            });
        });
    });
    check_launch("quantize_kernel");
}

void quantize_transpose(int device, void *stream_raw, const void *src, fp8amp_dtype src_dtype, void *dst, void *dst_t,
                        fp8amp_dtype dst_dtype, size_t rows, size_t cols, const QuantizeTarget &target) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    if (target.current) {
        check(cudaMemsetAsync(&target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
        amax(device, stream_raw, src, src_dtype, rows * cols, &target.meta->amax_bits);
    }
    if (target.col_sum && dst_dtype == FP8AMP_DTYPE_F16)
        fail(FP8AMP_ERROR_INTERNAL, "quantize_transpose: fused column sums need an FP8 destination");
    if (dst_dtype == FP8AMP_DTYPE_F16)  // scaled F16: its own kernels (quantize_f16.cu)
        return scaled_f16::quantize_transpose(device, stream, src, src_dtype, dst, dst_t, rows, cols, target);
    const size_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
    dispatch_src(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        using SrcT = typename Storage<S>::type;
        // Fast tiles need 16-byte source packs, 8-byte row-major stores and 16-byte transposed stores.
        const bool aligned = cols % kTileVec == 0 && rows % 16 == 0 &&
                             reinterpret_cast<uintptr_t>(src) % alignof(PackN<SrcT, kTileVec>) == 0 &&
                             reinterpret_cast<uintptr_t>(dst) % kTileVec == 0 &&
                             reinterpret_cast<uintptr_t>(dst_t) % 16 == 0;
        dispatch_fp8(dst_dtype, [&](auto d) {
            constexpr fp8amp_dtype D = decltype(d)::value;
            dispatch_bool(target.stats, [&](auto st) {
                dispatch_bool(target.col_sum != nullptr, [&](auto cs) {
                    const auto kernel = quantize_transpose_kernel<S, D, decltype(st)::value, decltype(cs)::value>;
                    kernel<<<persistent_grid(device, kernel, tiles * kThreads), kThreads, 0, stream>>>(
                        static_cast<const SrcT *>(src), static_cast<uint8_t *>(dst), static_cast<uint8_t *>(dst_t),
                        rows, cols, aligned, target.meta, target.scale_inv, target.scale_inv_t, target.col_partial);
                });
            });
        });
    });
    check_launch("quantize_transpose_kernel");
    // The blocks' partial sums in order (kernels.hpp's fixed order; linear_aux.cu).
    if (target.col_sum)
        column_sum_finish(device, stream_raw, target.col_partial, column_sum_blocks(rows), cols, target.col_sum,
                          target.col_accumulate);
}

void dequantize(int device, void *stream_raw, const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype,
                size_t n, const float *scale_inv, bool yield_sms, unsigned max_blocks) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    if (src_dtype == FP8AMP_DTYPE_F16)  // scaled F16: its own kernels (quantize_f16.cu)
        return scaled_f16::dequantize(device, stream, src, dst, dst_dtype, n, scale_inv);
    dispatch_fp8(src_dtype, [&](auto s) {
        constexpr fp8amp_dtype S = decltype(s)::value;
        dispatch_src(dst_dtype, [&](auto d) {
            constexpr fp8amp_dtype D = decltype(d)::value;
            using DstT = typename Storage<D>::type;
            if constexpr (FP8AMP_DEQUANTIZE_TABLE) {
                // Packs of kDequantizeVec codes in, 16-byte stores out.
                const bool vec = reinterpret_cast<uintptr_t>(src) % kDequantizeVec == 0 &&
                                 reinterpret_cast<uintptr_t>(dst) % 16 == 0;
                dispatch_bool(vec, [&](auto v) {
                    const auto kernel = dequantize_table_kernel<S, D, decltype(v)::value>;
                    // yield_sms: 8 rounds of kDequantizeUnroll packs per thread, then the block retires
                    // (the table fill is then a few percent of a block's work).
                    const size_t per_block = size_t(kThreads) * kDequantizeUnroll * kDequantizeVec * 8;
                    unsigned grid = yield_sms ? unsigned(n / per_block + 1)
                                              : persistent_grid(device, kernel, n / kDequantizeVec + 1, true);
                    if (yield_sms && max_blocks && grid > max_blocks) grid = max_blocks;  // grid-stride beyond
                    kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t *>(src), static_cast<DstT *>(dst),
                                                          n, scale_inv);
                });
            } else {
                dispatch_bool(pack_aligned<uint8_t>(src) && pack_aligned<DstT>(dst), [&](auto v) {
                    const auto kernel = dequantize_kernel<S, D, decltype(v)::value>;
                    kernel<<<persistent_grid(device, kernel, n / kVec + 1), kThreads, 0, stream>>>(
                            static_cast<const uint8_t *>(src), static_cast<DstT *>(dst), n, scale_inv);
                });
            }
        });
    });
    check_launch("dequantize_kernel");
}

void update_scaling(int device, void *stream_raw, ScalingState *const *metas, size_t n) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    for (size_t first = 0; first < n; first += kMetasPerLaunch) {
        const size_t count = (n - first < size_t(kMetasPerLaunch)) ? n - first : size_t(kMetasPerLaunch);
        MetaList list{};
        for (size_t i = 0; i < count; ++i) list.meta[i] = metas[first + i];
        update_scaling_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(list);
        check_launch("update_scaling_kernel");
    }
}

}  // namespace fp8amp::kernels::cuda
