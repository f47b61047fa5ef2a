// Fused LayerNorm / RMSNorm on CUDA (kernels/norm.hpp): the forward writes y (wide, or FP8 with the
// amax, statistics and scale_inv of a quantize fused), the backward dx and the column sums dgamma,
// dbeta. Bit-identical to kernels/cpu/norm.cpp: the same inline arithmetic (norm.hpp, __f*_rn and the
// explicit __fmaf_rn), and the same summation orders (norm.hpp's header, docs/numerics.md 7.2).
//
// Why this shape. These kernels move 3-6 bytes an element and do 20-30 operations an element, so
// they are fast only with many bytes in flight on every SM and few instructions and barriers per row.
// The previous design (one 256-thread block per row, 4 elements a thread, the row's sums through
// three block-wide barriers each) had a 2 KB row in flight per block and a serial
// load -> reduce -> reduce -> write chain per row: 15-45% of copy bandwidth.
//
// A row belongs to groups(d) warps (1 warp up to d = 1024, 2, 4, then 8 warps past d = 4096); a
// 256-thread block holds slots(d) = 8 / groups(d) rows at once, one per group of warps. Thread j of a
// row (a lane of the order: j = warp-in-group * 32 + lane) takes the pieces of 8 consecutive
// elements k = j, j + lanes, ... -- one 16-byte load each for BF16/F16 (two for F32) -- and keeps
// them in registers as loaded (raw, kPieces pieces at most: d <= 8 * kPieces * lanes), so x is read
// from memory once and all its loads are issued before the first addition. The lane sums are one
// warp butterfly (every lane gets the total; the same additions as the tree of norm::tree_sum since
// fadd commutes exactly) and, for groups(d) > 1, one exchange through shared memory behind a named
// barrier of the row's warps only (double-buffered, so one barrier per sum; the groups' sums are
// then added across lanes by shuffles, tree_sum's order). No block-wide barrier is on a row's path;
// the other rows of the block and the other blocks fill the latency.
//
// Forward: pass 1 sums x (LayerNorm) or x^2 (RMSNorm) from the registers, pass 2 (LayerNorm) sums
// (x - mean)^2, the write pass computes y and stores 8 FP8 codes as one 8-byte store (16 bytes for
// BF16 y). gamma (as the weight, 1 + gamma when zero-centered) and beta are converted to float once
// per block into shared memory for register-cached rows up to d = 12288 (the grid is then 1-4 waves of
// resident blocks, each walking many rows: fwd_fast_waves); otherwise they are read per piece (L1/L2
// hits) and the grid is up to 16 waves. The FP8 conversion is the hardware's two at a time
// (cvt.rn.satfinite.*x2) with no per-element NaN test: the amax is a max.NaN over |y| (one FMNMX an
// element), and only a piece whose max is NaN or inf makes its NaN codes the positive quiet code
// (clamped to inf once per thread for the amax). Wide y likewise: paired cvt.rn.bf16x2 / f16x2, NaN
// codes fixed up only in a piece holding a NaN. Current scaling runs the kernel twice: a pass that only
// reduces y's amax into the meta, then the writing pass (as quantize.cu does with its amax kernel).
// Rows longer than 8 * 8 * 256 = 16384 elements are read again from L1/L2 in each pass.
// y_t: for d <= 2048 (d % 4 == 0, rows % 32 == 0) the forward writes it itself -- a block takes
// tiles of 32 rows, stages their codes in shared memory (32 * d bytes) and writes each column's 32
// codes as one 32-byte run (a whole sector; 4 x 4 byte transposes with __byte_perm) -- unless the lean
// forward runs and rows and d are multiples of 16 (see norm_forward: the lean forward then the
// 16-byte byte transpose). Otherwise (longer rows would need 128+ KB a tile, or 16-byte runs) the
// byte transpose of linear_aux.cu writes it.
//
// Backward: one block per row chunk (norm::chunks(rows) blocks: 264, two per SM of an H100, one
// wave), each row slot walking its sub-chunk of the chunk's rows; the weights c + gamma are converted
// to float once per block into shared memory after the partials (where both fit in 100 KB: two
// blocks a SM). Per row: dy and x in registers
// (the next row's loaded while this one is computed), both dot products in one group reduction, then dx written in one pass while the slot's column
// partials (dy * xhat, dy) accumulate in shared memory (each column's partial owned by one thread,
// float4 laid out by lane so the accesses are conflict-free; 16 KB per piece of a lane, 64 KB up to
// d = 8192). At the end the block adds its slots' partials in slot order. The lean kernel on sm_90
// runs as clusters of two blocks (chunks 2j, 2j + 1), which add the pair's partials through
// distributed shared memory and write one partial row a pair; otherwise a block writes its chunk's
// row. A finishing kernel adds the rows in order, pairing chunk rows first (a tile of 32 columns x
// all rows staged in shared memory by float4 loads, then one warp's sequential sums). Rows past 12
// pieces a lane (d > 24576; one slot a block) keep the partials in the partial buffer itself.
//
// Lean and general kernels. Each direction has a lean kernel for the common case and the general
// one (norm_forward_kernel, norm_backward_kernel) for the rest; both compute the same bytes. The
// general kernels test at run time, per piece or per element, what the common case never needs: a
// partial last piece (d % 8 != 0), unaligned rows, gamma read per piece, dtypes chosen at run time,
// RMSNorm or not, beta or not; ptxas compiles every such path into the row loop, whose registers
// and instructions they inflate (the backward at 4 pieces: 128 registers and spills, some 60 SASS
// instructions an element in the ncu of an earlier version). The lean kernels
// (norm_forward_fast_kernel: d % 8 == 0, x 16-byte aligned, y aligned for whole-piece stores, d <=
// kMaxParamD, no fused y_t; norm_backward_fast_kernel: dy, x, dx of one dtype, d % 8 == 0, 16-byte
// aligned, up to 6 pieces a lane, F32 up to 4) make those choices at compile time -- RMSNorm,
// beta/dbeta and the dtype are template or lambda-tag parameters, pieces always whole, weights
// always from shared memory (but the backward's LayerNorm at 5-6 pieces, where they do not fit
// beside its 96 KB of partials: its block is one row slot, whose lanes take the same columns in
// every row, so they sit in registers) -- and the backward keeps xhat from its first pass to its
// second where registers allow (up to 2 pieces of BF16/F16; F32 and 4+ pieces compute it again),
// and addresses its shared partials as sp[((array * kPieces + piece) * 2 + half) * 256 +
// threadIdx.x] (one base pointer, compile-time offsets). Both issue their first row's loads before
// the block's setup (weights to shared memory, partials zeroed), whose latency then overlaps the
// loads'. The paired conversions' words are stored as they come (packed_word: joining the halves
// again cost 2 PRMTs a pair), and whole 16-byte pieces of dx / wide y by one st.global.v4 (store16:
// the front end split most into 4 word stores). The summation orders are unchanged. The lean
// forward has a variant without any piece test for rows where every lane has 4 or 6 whole pieces.
//
// Tried for the lean backward and not kept: xhat kept across the passes at 4 pieces beside the
// prefetched row (spills 300 bytes, ~40 LDL a row); two register buffers taking turns instead of the
// prefetch's copy (-6% instructions, but twice the row loop's code). A variant without piece tests
// for rows every lane covers fully spilled 500 bytes (~90 LDL/STL a row) until each pass sat behind
// one guard (kFull: LayerNorm now runs it at 4 and 6 pieces).
//
// Registers (ptxas -v, sm_90, BF16 -> BF16 / E4M3): the general forward is held to 64 registers (4
// blocks a SM) where a lane's raw pieces take at most 16 registers (BF16 up to 4 pieces: d <= 8192),
// spilling a few dozen bytes at 4 pieces (ptxas would otherwise take 128 registers, 2 blocks a SM);
// 8 pieces take 119. The lean forward likewise (64 registers up to 4 pieces; past that 2 blocks a SM
// and the next row loaded while this one is computed). The fused-y_t variant and the backwards take
// 128 (the backward's grid is 2 blocks a SM anyway); the general backward spills a few hundred bytes
// at 4 and 8 pieces (the 8-piece variant loads the next row only after the current one: two copies
// would not fit); the lean one spills 36/52 bytes at 4 pieces of BF16/F16 (a few LDL a row, none an
// element), nothing at 1, 2 and F32's 4, and 200/664 bytes in LayerNorm's 6-piece variant (part of
// its register-held gamma: a few dozen LDL a row of 48 elements a lane).
//
// Tried and measured slower on an H100 before this design (docs/performance.md): one warp per row
// with the old 256-lane order (8 lane sums a thread) -- the order, not the warp, was the cost.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include <cooperative_groups.h>

#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "norm.hpp"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda {
namespace {

using namespace casting;
static_assert(kThreads == norm::kBlockWarps * 32, "a block is kBlockWarps warps");
static_assert(norm::kPiece == 8, "pieces of 8 elements");

constexpr int kMaxPieces = 8;        // register pieces of a lane (forward and backward)
constexpr int kMaxSmemPieces = 12;   // backward: partials in shared memory up to 12 pieces a lane
constexpr int kFinishCols = 32;      // finishing kernel: columns a block
constexpr int kFinishChunks = int(norm::kMaxChunks);  // finishing kernel: chunks staged at once (all)
constexpr int kTile = 32;            // forward with a fused y_t: rows a block stages (32-byte runs of y_t)
constexpr int64_t kMaxParamD = 12288;  // forward: gamma and beta in shared memory up to 96 KB (8 * d bytes)

template <fp8amp_dtype D>
constexpr bool is_fp8_v = D == FP8AMP_DTYPE_E4M3 || D == FP8AMP_DTYPE_E5M2;

// ---- raw pieces: 8 elements as loaded (BF16/F16: 4 words of 2; F32: 8 words) ------------------------

template <fp8amp_dtype S>
constexpr int kWords = S == FP8AMP_DTYPE_F32 ? 8 : 4;

// How the pieces of a row can be loaded: 2 = whole 16-byte vectors (BF16/F16: d % 8 == 0 and a
// 16-byte aligned base; F32: d % 4 == 0 and 16-byte aligned: two float4), 1 = 8-byte halves
// (BF16/F16 with d % 4 == 0 and an 8-byte aligned base), 0 = element by element.
__device__ __forceinline__ int vec_mode(const void *p, int64_t d, int size) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (size == 4) return d % 4 == 0 && a % 16 == 0 ? 2 : 0;
    if (size == 2) return d % 8 == 0 && a % 16 == 0 ? 2 : d % 4 == 0 && a % 8 == 0 ? 1 : 0;
    return d % 8 == 0 && a % 8 == 0 ? 2 : d % 4 == 0 && a % 4 == 0 ? 1 : 0;  // FP8 stores
}

// Loads the piece at element i0 of a row (left = min(8, d - i0) elements exist; the rest read as 0).
template <fp8amp_dtype S>
__device__ __forceinline__ void load_raw(const typename Storage<S>::type *row, int64_t i0, int left, int vec,
                                         uint32_t (&w)[kWords<S>]) {
    if constexpr (S == FP8AMP_DTYPE_F32) {
        if (left == 8 && vec == 2) {
            const float4 a = __ldg(reinterpret_cast<const float4 *>(row + i0));
            const float4 b = __ldg(reinterpret_cast<const float4 *>(row + i0 + 4));
            w[0] = __float_as_uint(a.x), w[1] = __float_as_uint(a.y), w[2] = __float_as_uint(a.z);
            w[3] = __float_as_uint(a.w), w[4] = __float_as_uint(b.x), w[5] = __float_as_uint(b.y);
            w[6] = __float_as_uint(b.z), w[7] = __float_as_uint(b.w);
            return;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = e < left ? __float_as_uint(row[i0 + e]) : 0u;
    } else {
        if (left == 8 && vec == 2) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(row + i0));
            w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
            return;
        }
        if (left == 8 && vec == 1) {
            const uint2 a = __ldg(reinterpret_cast<const uint2 *>(row + i0));
            const uint2 b = __ldg(reinterpret_cast<const uint2 *>(row + i0 + 4));
            w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
            return;
        }
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            const uint32_t lo = 2 * h < left ? row[i0 + 2 * h] : 0u;
            const uint32_t hi = 2 * h + 1 < left ? row[i0 + 2 * h + 1] : 0u;
            w[h] = lo | (hi << 16);
        }
    }
}

// Element e of a raw piece as a float. No NaN canonicalization (to_f32 does it): a NaN input only
// ever reaches outputs through arithmetic, whose NaN results are stored canonical.
template <fp8amp_dtype S>
__device__ __forceinline__ float raw_at(const uint32_t (&w)[kWords<S>], int e) {
    if constexpr (S == FP8AMP_DTYPE_F32) return __uint_as_float(w[e]);
    const uint32_t v = w[e / 2];
    if constexpr (S == FP8AMP_DTYPE_BF16) return __uint_as_float(e % 2 ? v & 0xFFFF0000u : v << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(e % 2 ? v >> 16 : v & 0xFFFFu)));
}

// FP8 y, 8 elements: sv = y * scale (scaled(canonical(y))) and its codes, two a conversion
// (cvt.rn.satfinite.*x2), in two words. A NaN y (only then is y * scale NaN, for a positive finite
// scale) makes pm (the piece's max.NaN of |y|) exceed inf's bits: only such a rare piece, or every
// piece where check_all (a scale that is not positive and finite), looks at its codes and makes a
// NaN's the positive quiet code. Shared by both forwards.
template <fp8amp_dtype D>
__device__ __forceinline__ void encode_fp8x8(const float (&y)[8], float scale, float pm, bool check_all, float (&sv)[8],
                                             uint32_t (&word)[2]) {
    constexpr __nv_fp8_interpretation_t kFmt = D == FP8AMP_DTYPE_E4M3 ? __NV_E4M3 : __NV_E5M2;
    constexpr uint32_t kNaN = D == FP8AMP_DTYPE_E4M3 ? codec::E4M3::kQuietNaN : codec::E5M2::kQuietNaN;
#pragma unroll
    for (int e = 0; e < 8; ++e) sv[e] = norm::fmul(y[e], scale);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(sv[4 * h], sv[4 * h + 1]), __NV_SATFINITE, kFmt);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(sv[4 * h + 2], sv[4 * h + 3]), __NV_SATFINITE, kFmt);
        word[h] = lo | (hi << 16);
    }
    if (check_all || __float_as_uint(pm) >= 0x7F800000u) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (sv[e] != sv[e]) word[e / 4] = (word[e / 4] & ~(0xFFu << (8 * (e % 4)))) | (kNaN << (8 * (e % 4)));
    }
}

// A parameter vector's 8 elements at i0 (gamma or beta; its dtype chosen at run time) as floats,
// 0 past d; vec: 16-byte aligned base.
__device__ __forceinline__ void load_param(const void *p, fp8amp_dtype dt, int64_t i0, int left, bool vec, float f[8]) {
    if (dt == FP8AMP_DTYPE_F32) {
        const float *q = static_cast<const float *>(p) + i0;
        if (left == 8 && vec) {
            const float4 a = __ldg(reinterpret_cast<const float4 *>(q)), b = __ldg(reinterpret_cast<const float4 *>(q + 4));
            f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
            return;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = e < left ? __ldg(q + e) : 0.0f;
        return;
    }
    const uint16_t *q = static_cast<const uint16_t *>(p) + i0;
    uint32_t w[4];
    if (left == 8 && vec) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(q));
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
#pragma unroll
        for (int h = 0; h < 4; ++h)
            w[h] = (2 * h < left ? uint32_t(__ldg(q + 2 * h)) : 0u) | ((2 * h + 1 < left ? uint32_t(__ldg(q + 2 * h + 1)) : 0u) << 16);
    }
    if (dt == FP8AMP_DTYPE_BF16) {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = raw_at<FP8AMP_DTYPE_BF16>(w, e);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = raw_at<FP8AMP_DTYPE_F16>(w, e);
    }
}

// max(a, b) with a NaN propagated (max.NaN: one FMNMX.NAN, and ptxas folds an |x| operand into it):
// the amax of |y| in one instruction an element, a NaN y making the piece's (and the thread's) max a
// NaN, whose bits lie above inf's as those of amax_bits_of's max over |y|'s bits do.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// The 32-bit word of a pair as the paired conversion left it (.x in the low half): the register
// itself, where taking the halves apart and joining them again cost two PRMTs a pair.
template <class Pair>
__device__ __forceinline__ uint32_t packed_word(const Pair &h) {
    static_assert(sizeof(Pair) == 4, "a pair of 16-bit values");
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}

// One 16-byte store of 4 words to global memory at q (16-byte aligned). A plain uint4 store through a
// cast pointer was split by the front end into 4 word stores for most pieces of the lean backward
// (the PTX held st.global.u32 x 4); 4 STGs where one does.
__device__ __forceinline__ void store16(void *q, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(q)), "r"(a), "r"(b), "r"(c),
                 "r"(d));
}

// Stores 8 values of a wide output (F32/F16/BF16, chosen at run time) at element `base` (the piece's
// first, `left` of them in the row); vec as vec_mode for the output's element size. A NaN (any sign or
// payload) is stored as the dtype's positive quiet NaN, as norm::canonical then from_f32 store it:
// the hardware's paired conversions (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, the same rounding as one
// at a time) run on every value with no NaN test, and only a piece holding a NaN (its max.NaN of |f|
// a NaN) fixes its codes up.
__device__ __forceinline__ void store_wide8(void *p, fp8amp_dtype dt, int64_t base, int left, int vec, const float f[8]) {
    float pm = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) pm = fmax_nan(pm, fabsf(f[e]));
    const bool has_nan = __float_as_uint(pm) > 0x7F800000u;
    if (dt == FP8AMP_DTYPE_F32) {
        float *q = static_cast<float *>(p) + base;
        float c[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) c[e] = f[e];
        if (has_nan)
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (f[e] != f[e]) c[e] = codec::bits_f32(codec::kF32QuietNaN);
        if (left == 8 && vec == 2) {
            store16(q, __float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]), __float_as_uint(c[3]));
            store16(q + 4, __float_as_uint(c[4]), __float_as_uint(c[5]), __float_as_uint(c[6]), __float_as_uint(c[7]));
            return;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (e < left) q[e] = c[e];
        return;
    }
    uint32_t w[4];
    if (dt == FP8AMP_DTYPE_F16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[k] = packed_word(__floats2half2_rn(f[2 * k], f[2 * k + 1]));  // .x (low half) = f[2k]
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[k] = packed_word(__floats2bfloat162_rn(f[2 * k], f[2 * k + 1]));  // .x (low half) = f[2k]
        }
    }
    if (has_nan) {
        const uint32_t qn = dt == FP8AMP_DTYPE_F16 ? codec::F16::kQuietNaN : codec::BF16::kQuietNaN;
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (f[e] != f[e]) w[e / 2] = (w[e / 2] & ~(0xFFFFu << (16 * (e % 2)))) | (qn << (16 * (e % 2)));
    }
    uint16_t *q = static_cast<uint16_t *>(p) + base;
    if (left == 8 && vec == 2) {
        store16(q, w[0], w[1], w[2], w[3]);
    } else if (left == 8 && vec == 1) {
        reinterpret_cast<uint2 *>(q)[0] = make_uint2(w[0], w[1]);
        reinterpret_cast<uint2 *>(q)[1] = make_uint2(w[2], w[3]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (e < left) q[e] = uint16_t(w[e / 2] >> (16 * (e % 2)));
    }
}

__device__ __forceinline__ size_t wide_size(fp8amp_dtype dt) { return dt == FP8AMP_DTYPE_F32 ? 4 : 2; }

// ---- the group reductions -------------------------------------------------------------------------

// Where a thread stands: its row slot, its place in the row's group of warps, its lane of the order.
struct Place {
    int groups, slot, member, lane, j;
    __device__ Place(int64_t d) {
        groups = norm::groups(d);
        const int warp = threadIdx.x / 32;
        lane = threadIdx.x % 32;
        slot = warp / groups;
        member = warp % groups;
        j = member * 32 + lane;
    }
};

// The warps of one row slot only (named barrier 1 + slot; 0 is __syncthreads).
__device__ __forceinline__ void slot_barrier(const Place &pl) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + pl.slot), "r"(32 * pl.groups) : "memory");
}

// Shared memory of the group sums: [parity][value][warp], double-buffered so that one barrier a sum
// suffices (a buffer is written again only after the next sum's barrier, which every reader of the
// previous one has passed).
struct GroupScratch {
    float v[2][2][norm::kBlockWarps];
};

// The row sums of n = 1 or 2 values (one term per lane each) in norm::tree_sum's order, returned to
// every thread of the row.
template <int N>
__device__ __forceinline__ void group_sum(float (&v)[N], const Place &pl, GroupScratch &gs, int &parity) {
#pragma unroll
    for (int s = 16; s > 0; s /= 2)
#pragma unroll
        for (int n = 0; n < N; ++n) v[n] = norm::fadd(v[n], __shfl_xor_sync(0xFFFFFFFFu, v[n], s));
    if (pl.groups == 1) return;
    const int base = pl.slot * pl.groups;
    if (pl.lane == 0)
#pragma unroll
        for (int n = 0; n < N; ++n) gs.v[parity][n][base + pl.member] = v[n];
    slot_barrier(pl);
    // The group tree across lanes: lane w < groups holds warp w's sum; at stride s lane w (< s) adds
    // lane w + s's (< 2s <= groups: always a warp's sum), as tree_sum's p[32w] += p[32(w + s)]; lane 0
    // ends with the total, which every lane takes. One shared-memory load and a few shuffles, where
    // a register array of kMaxGroups sums under per-entry predicates took some 60 instructions a sum.
#pragma unroll
    for (int n = 0; n < N; ++n) {
        float q = pl.lane < pl.groups ? gs.v[parity][n][base + pl.lane] : 0.0f;
#pragma unroll
        for (int s = norm::kMaxGroups / 2; s > 0; s /= 2)
            if (s < pl.groups) q = norm::fadd(q, __shfl_down_sync(0xFFFFFFFFu, q, s));
        v[n] = __shfl_sync(0xFFFFFFFFu, q, 0);
    }
    parity ^= 1;
}

// Calls f(p, i0, left) for the pieces of lane j of a row of d: piece k = j + p * lanes, elements
// i0 = 8k .. 8k + left - 1. kPieces > 0: p < kPieces (the launch guarantees that they cover d), for
// a register cache indexed by p; 0: any d, p counts up.
template <int kPieces, class F>
__device__ __forceinline__ void for_pieces(int64_t d, int j, int n_lanes, F &&f) {
    if constexpr (kPieces > 0) {
#pragma unroll
        for (int p = 0; p < kPieces; ++p) {
            const int64_t i0 = (int64_t(j) + int64_t(p) * n_lanes) * norm::kPiece;
            if (i0 < d) f(p, i0, d - i0 >= 8 ? 8 : int(d - i0));
        }
    } else {
        int p = 0;
        for (int64_t i0 = int64_t(j) * norm::kPiece; i0 < d; i0 += int64_t(n_lanes) * norm::kPiece, ++p)
            f(p, i0, d - i0 >= 8 ? 8 : int(d - i0));
    }
}

// ---- forward ---------------------------------------------------------------------------------------

// Blocks a SM the forward is compiled for: 4 (64 registers: 32 warps, 2-8 KB of a row in flight
// each) where the row's raw pieces take at most 16 registers, else 2. ptxas would take 128 registers
// for the 16-register case too (spilling a little either way); the occupancy matters more here.
constexpr int fwd_min_blocks(fp8amp_dtype s, int pieces, bool t) {
    return !t && (s == FP8AMP_DTYPE_F32 ? 8 : 4) * (pieces > 0 ? pieces : 1) <= 16 ? 4 : 2;
}

// norm.hpp's run-time choices in forms without a per-element select, bit for bit the same for every
// float (NaN included; NaN results are stored canonical): xhat(x, mean, rstd, rms) is
// (x - mean) * rstd with mean = +0 for RMSNorm (x - (+0) == x); weight(g, zc) is c + g with
// c = 1 or -0 (-0 + g == g); y without beta is t + (-0) (== t); RMSNorm's dx term g - c1 has c1 = +0.
__device__ __forceinline__ float weight_c(bool zero_centered) { return zero_centered ? 1.0f : -0.0f; }

// y into D (E4M3/E5M2; F32 stands for any wide dtype, a.y_dtype, chosen at run time). kWrite false:
// only y's amax (current scaling's first pass). kT (FP8, fused_t_ok): y_t too -- the block takes
// tiles of kTile consecutive rows (slot s: rows s, s + slots, ...), stages their codes in dynamic shared
// memory (kTile * d bytes) and writes y_t's columns as kTile-byte runs (whole 32-byte sectors).
//
// param_pieces > 0 (not kT; the launch gives 4 * param_pieces float4 of dynamic shared memory, and
// param_pieces = ceil(d / 8)): the block first converts gamma (as the weight: 1 + gamma when
// zero-centered) and beta to float in shared memory, float4 sw[array][half][piece] (conflict-free: a
// warp's lanes read consecutive pieces), and its rows read them from there: one LDS.128 per 4 values,
// where reading them per row and piece from global memory took a load, a run-time dtype switch and
// an unpack an element. The grid is then one wave of resident blocks, each walking many rows, so that
// the conversion is paid once per block.
template <fp8amp_dtype S, fp8amp_dtype D, int kPieces, bool kWrite, bool kT = false>
__global__ void __launch_bounds__(kThreads, fwd_min_blocks(S, kPieces, kT)) norm_forward_kernel(const NormForwardArgs a,
                                                                                                 int param_pieces) {
    using SrcT = typename Storage<S>::type;
    constexpr bool kFp8 = is_fp8_v<D>;
    constexpr int kW = kWords<S>;
    constexpr int kCache = kPieces > 0 ? kPieces : 1;
    __shared__ GroupScratch gs;
    const int64_t d = a.d;
    const Place pl(d);
    const int n_lanes = 32 * pl.groups, n_slots = norm::kBlockWarps / pl.groups;
    int parity = 0;
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    bool stats = false;
    if constexpr (kFp8) {
        scale = kWrite ? quantize_scale(*meta) : 1.0f;
        fp8_max = meta->fp8_max;
        stats = kWrite && meta->stats_enabled;
    }
    const auto *x = static_cast<const SrcT *>(a.x);
    const int vx = vec_mode(a.x, d, sizeof(SrcT));
    const int vy = vec_mode(a.y, d, kFp8 ? 1 : int(wide_size(a.y_dtype)));
    const bool vg = reinterpret_cast<uintptr_t>(a.gamma) % 16 == 0;
    const bool vb = reinterpret_cast<uintptr_t>(a.beta) % 16 == 0;
    const bool has_beta = a.beta != nullptr, rms = a.rms;
    const float wc = weight_c(a.zero_centered);
    float amax = 0.0f;  // max of |y|, a NaN propagated (fmax_nan)
    uint32_t saturated = 0, underflowed = 0;
    // y * scale is NaN only for a NaN y (which makes its piece's max a NaN) as long as the scale is
    // positive and finite; otherwise (inf * 0, 0 * inf, a NaN scale) every piece checks its codes.
    const bool check_all = kFp8 && !(scale > 0.0f && scale < __int_as_float(0x7F800000));
    const bool zc = a.zero_centered;
    extern __shared__ __align__(16) uint32_t stage[];  // kT: [kTile][d / 4] words of codes
    // param_pieces > 0: the weights and betas as floats, sw[half * np + piece] and sb[...]
    const int np = kT ? 0 : param_pieces;
    float4 *const sw = reinterpret_cast<float4 *>(stage), *const sb = sw + 2 * np;
    if (np > 0) {
        for (int k = threadIdx.x; k < np; k += kThreads) {
            const int64_t i0 = int64_t(k) * norm::kPiece;
            const int left = d - i0 >= 8 ? 8 : int(d - i0);
            float f[8];
            load_param(a.gamma, a.gamma_dtype, i0, left, vg, f);
            if (zc)
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = norm::fadd(1.0f, f[e]);
            sw[k] = make_float4(f[0], f[1], f[2], f[3]);
            sw[np + k] = make_float4(f[4], f[5], f[6], f[7]);
            if (has_beta) {
                load_param(a.beta, a.beta_dtype, i0, left, vb, f);
                sb[k] = make_float4(f[0], f[1], f[2], f[3]);
                sb[np + k] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
        __syncthreads();
    }
    // Row r (ti: its place in the tile, kT).
    auto do_row = [&](int64_t r, int ti) {
        const SrcT *xr = x + r * d;
        uint32_t raw[kCache][kW];
        if constexpr (kPieces > 0)  // every load of the row in flight before the first addition
            for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) { load_raw<S>(xr, i0, left, vx, raw[p]); });
        auto piece = [&](int p, int64_t i0, int left) -> const uint32_t(&)[kW] {
            if constexpr (kPieces > 0) {
                return raw[p];
            } else {
                load_raw<S>(xr, i0, left, vx, raw[0]);
                return raw[0];
            }
        };
        // Pass 1: sum(x) (LayerNorm) or sum(x^2) (RMSNorm). A piece's missing elements read as +0, and
        // adding +0 (or +0 squared) to a lane sum that started from +0 changes no bit.
        float acc[1] = {0.0f};
        if (rms) {
            for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
                const auto &w = piece(p, i0, left);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[0] = norm::add_square(acc[0], raw_at<S>(w, e));
            });
        } else {
            for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
                const auto &w = piece(p, i0, left);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[0] = norm::fadd(acc[0], raw_at<S>(w, e));
            });
        }
        group_sum<1>(acc, pl, gs, parity);
        float mean = 0.0f, rstd;
        if (!rms) {
            mean = norm::mean_of(acc[0], d);
            acc[0] = 0.0f;
            for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
                const auto &w = piece(p, i0, left);
                if (left == 8) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[0] = norm::add_centered_square(acc[0], raw_at<S>(w, e), mean);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        if (e < left) acc[0] = norm::add_centered_square(acc[0], raw_at<S>(w, e), mean);
                }
            });
            group_sum<1>(acc, pl, gs, parity);
        }
        rstd = norm::rstd_of(acc[0], d, a.eps);
        if (kWrite && pl.j == 0) {
            if (a.mean) a.mean[r] = norm::canonical(mean);
            if (a.rstd) a.rstd[r] = norm::canonical(rstd);
        }
        for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
            const auto &w = piece(p, i0, left);
            float g[8], y[8];
            const int k = int(i0 / norm::kPiece);
            if (np > 0) {
                const float4 g0 = sw[k], g1 = sw[np + k];
                g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w, g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;
            } else {
                load_param(a.gamma, a.gamma_dtype, i0, left, vg, g);
                // weight(): c + g with c = 1 (zero-centered) or -0, and -0 + g == g: the addition
                // only where it changes something (a uniform branch, not an instruction an element)
                if (zc)
#pragma unroll
                    for (int e = 0; e < 8; ++e) g[e] = norm::fadd(1.0f, g[e]);
            }
            if (has_beta) {  // y = xhat * w + beta, one fused multiply-add (norm::y_value)
                float b[8];
                if (np > 0) {
                    const float4 b0 = sb[k], b1 = sb[np + k];
                    b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
                } else {
                    load_param(a.beta, a.beta_dtype, i0, left, vb, b);
                }
#pragma unroll
                for (int e = 0; e < 8; ++e)  // canonical below (the FP8 path: the NaN code)
                    y[e] = norm::ffma(norm::xhat(raw_at<S>(w, e), mean, rstd, false), g[e], b[e]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] = norm::fmul(norm::xhat(raw_at<S>(w, e), mean, rstd, false), g[e]);
            }
            const int64_t base = r * d + i0;
            if constexpr (kFp8) {
                // the piece's max |y| (a NaN propagated), then the thread's
                float pm = 0.0f;
                if (left == 8) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) pm = fmax_nan(pm, fabsf(y[e]));
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        if (e < left) pm = fmax_nan(pm, fabsf(y[e]));
                }
                amax = fmax_nan(amax, pm);
                if constexpr (kWrite) {
                    float sv[8];
                    uint32_t word[2];
                    encode_fp8x8<D>(y, scale, pm, check_all, sv, word);
                    if (stats) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            if (e >= left) break;
                            const uint32_t q = (word[e / 4] >> (8 * (e % 4))) & 0xFFu;
                            saturated += (fabsf(sv[e]) > fp8_max) ? 1u : 0u;  // false for NaN
                            underflowed += (y[e] != 0.0f && y[e] == y[e] && (q & 0x7Fu) == 0) ? 1u : 0u;
                        }
                    }
                    if constexpr (kT) {  // d % 4 == 0: the piece's words are word-aligned in the tile
                        uint32_t *st = stage + size_t(ti) * (d / 4) + i0 / 4;
                        st[0] = word[0];
                        if (left > 4) st[1] = word[1];
                    }
                    auto *out = static_cast<uint8_t *>(a.y) + base;
                    if (left == 8 && vy == 2) {
                        *reinterpret_cast<uint2 *>(out) = make_uint2(word[0], word[1]);
                    } else if (left == 8 && vy == 1) {
                        reinterpret_cast<uint32_t *>(out)[0] = word[0];
                        reinterpret_cast<uint32_t *>(out)[1] = word[1];
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; ++e)
                            if (e < left) out[e] = uint8_t(word[e / 4] >> (8 * (e % 4)));
                    }
                }
            } else {
                store_wide8(a.y, a.y_dtype, base, left, vy, y);  // canonical NaN there
            }
        });
    };
    if constexpr (kT) {
        const int64_t n_tiles = a.rows / kTile, quads = d / 4;
        for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
            for (int ti = pl.slot; ti < kTile; ti += n_slots) do_row(tile * kTile + ti, ti);
            __syncthreads();
            // Column quad q: the tile's 32 words of it (conflict-free: a warp reads consecutive words of a
            // row), transposed 4 x 4 bytes at a time into 32-byte runs of its 4 columns.
            for (int64_t q = threadIdx.x; q < quads; q += kThreads) {
                uint32_t w[kTile];
#pragma unroll
                for (int i = 0; i < kTile; ++i) w[i] = stage[size_t(i) * quads + q];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    uint32_t o[kTile / 4];
                    const uint32_t sel = uint32_t(c) | (uint32_t(c + 4) << 4);
#pragma unroll
                    for (int k = 0; k < kTile / 4; ++k)
                        o[k] = __byte_perm(__byte_perm(w[4 * k], w[4 * k + 1], sel), __byte_perm(w[4 * k + 2], w[4 * k + 3], sel), 0x5410);
                    auto *dst = reinterpret_cast<uint4 *>(static_cast<uint8_t *>(a.y_t) + (4 * q + c) * a.rows + tile * kTile);
#pragma unroll
                    for (int k = 0; k < kTile / 16; ++k) dst[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
                }
            }
            __syncthreads();  // the tile is staged again
        }
    } else {
        for (int64_t r = int64_t(blockIdx.x) * n_slots + pl.slot; r < a.rows; r += int64_t(gridDim.x) * n_slots) do_row(r, 0);
    }
    if constexpr (kFp8) {
        Tally t;
        const uint32_t amax_bits = __float_as_uint(amax);  // |y|'s max: a NaN's bits lie above inf's
        t.amax = amax_bits > 0x7F800000u ? 0x7F800000u : amax_bits;  // amax_bits_of: NaN as inf
        t.saturated = saturated;
        t.underflowed = underflowed;
        if constexpr (!kWrite) {
            const uint32_t m = block_reduce(t.amax, MaxOp());
            if (threadIdx.x == 0) atomicMax(&meta->amax_bits, m);
        } else if (stats) {
            finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        } else {
            finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        }
    }
}

// The forward's common case (the host checks): x 16-byte aligned with d % 8 == 0 (every piece whole,
// one 16-byte load), y aligned for whole-piece stores (FP8: 8 bytes; wide: 16), gamma and beta in
// shared memory (d <= kMaxParamD) and no fused y_t. The same arithmetic and orders as
// norm_forward_kernel with fewer instructions an element: RMSNorm and "no beta" are compile-time
// branches of one kernel; no per-element tests of a partial piece, an alignment or the weights'
// source; one base pointer a row. Where the launch is 2 blocks a SM anyway (more than 16 registers of
// raw pieces: BF16 past 4 pieces a lane), the next row's x is loaded while this one is computed, as
// the backward does (a 12288-wide row is a block's only row at a time). kFull (the host passes it where
// every lane has 4 or 6 whole pieces): no piece tests at all. kPassGuard (kFull at 4 pieces): each
// pass behind one run-time test that always holds (d > 0), a region boundary ptxas does not move
// values across, so each pass unpacks x from the raw words again instead of keeping 8 floats a piece
// live from pass 1 (which spills at 4 pieces and 64 registers; at 6 pieces, 128 registers, it does
// not).
constexpr int fwd_fast_min_blocks(fp8amp_dtype s, int pieces) { return (s == FP8AMP_DTYPE_F32 ? 8 : 4) * pieces <= 16 ? 4 : 2; }

template <fp8amp_dtype S, fp8amp_dtype D, int kPieces, bool kWrite, bool kStats, bool kFull>
__global__ void __launch_bounds__(kThreads, fwd_fast_min_blocks(S, kPieces)) norm_forward_fast_kernel(const NormForwardArgs a) {
    using SrcT = typename Storage<S>::type;
    constexpr bool kFp8 = is_fp8_v<D>;
    constexpr int kW = kWords<S>, kP = kPieces;
    constexpr bool kPrefetch = fwd_fast_min_blocks(S, kP) == 2 && 2 * kP * kW <= 64;
    constexpr bool kPassGuard = kFull && kP == 4;
    __shared__ GroupScratch gs;
    const int64_t d = a.d;
    const Place pl(d);
    const int n_lanes = 32 * pl.groups, n_slots = norm::kBlockWarps / pl.groups;
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    // The statistics (saturated and underflowed counts) are compile-time, from the meta's host mirror
    // (a.target.stats): off, as by default, the loop carries neither their code nor their registers
    // (the 4-piece BF16 -> E4M3 forward spilled 40 bytes with them).
    constexpr bool stats = kFp8 && kWrite && kStats;
    if constexpr (kFp8) {
        scale = kWrite ? quantize_scale(*meta) : 1.0f;
        fp8_max = meta->fp8_max;
    }
    // y * scale is NaN only for a NaN y as long as the scale is positive and finite (see
    // norm_forward_kernel); otherwise every piece checks its codes.
    const bool check_all = kFp8 && !(scale > 0.0f && scale < __int_as_float(0x7F800000));
    const auto *x = static_cast<const SrcT *>(a.x);
    const bool vg = reinterpret_cast<uintptr_t>(a.gamma) % 16 == 0;
    const bool vb = reinterpret_cast<uintptr_t>(a.beta) % 16 == 0;
    const bool zc = a.zero_centered;
    // gamma (as the weight) and beta as floats: sw[half * np + piece], sb[...] (norm_forward_kernel's
    // param_pieces layout: a warp's 16-byte reads of them are consecutive, free of bank conflicts; the
    // four arrays interleaved piece by piece, 64 bytes a piece, took LayerNorm into E4M3 from 0.74 to
    // 0.60 of copy at 16384 x 1024), converted after the first row's loads are issued (their latency
    // and the conversion overlap).
    extern __shared__ float4 sw[];
    const int np = int(d / norm::kPiece);
    float4 *const sb = sw + 2 * np;
    auto setup = [&](auto beta_tag) {
        for (int k = threadIdx.x; k < np; k += kThreads) {
            const int64_t i0 = int64_t(k) * norm::kPiece;
            float f[8];
            load_param(a.gamma, a.gamma_dtype, i0, 8, vg, f);
            if (zc)
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = norm::fadd(1.0f, f[e]);
            sw[k] = make_float4(f[0], f[1], f[2], f[3]);
            sw[np + k] = make_float4(f[4], f[5], f[6], f[7]);
            if constexpr (decltype(beta_tag)::value) {
                load_param(a.beta, a.beta_dtype, i0, 8, vb, f);
                sb[k] = make_float4(f[0], f[1], f[2], f[3]);
                sb[np + k] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
        __syncthreads();
    };
    const int64_t lane0 = int64_t(pl.j) * norm::kPiece;   // this lane's first element
    const int64_t step = int64_t(n_lanes) * norm::kPiece;  // elements between its pieces
    float amax = 0.0f;  // max of |y|, a NaN propagated (fmax_nan)
    uint32_t saturated = 0, underflowed = 0;
    auto run = [&](auto rms_tag, auto beta_tag) {
        constexpr bool kRms = decltype(rms_tag)::value, kBeta = decltype(beta_tag)::value;
        int parity = 0;
        uint32_t raw[kP][kW];
        auto fetch = [&](int64_t r, uint32_t (&w)[kP][kW]) {
            const SrcT *xr = x + r * d + lane0;
#pragma unroll
            for (int p = 0; p < kP; ++p)
                if (kFull || lane0 + p * step < d) load_raw<S>(xr, p * step, 8, 2, w[p]);
        };
        const int64_t r_first = int64_t(blockIdx.x) * n_slots + pl.slot, r_step = int64_t(gridDim.x) * n_slots;
        if (r_first < a.rows) fetch(r_first, raw);
        setup(beta_tag);
        for (int64_t r = r_first; r < a.rows; r += r_step) {
            [[maybe_unused]] uint32_t nraw[kP][kW];
            if constexpr (kPrefetch) {
                if (r + r_step < a.rows) fetch(r + r_step, nraw);
            } else {
                if (r > r_first) fetch(r, raw);
            }
            // Pass 1: sum(x) (LayerNorm) or sum(x^2) (RMSNorm); pass 2 (LayerNorm): sum((x - mean)^2).
            float acc[1] = {0.0f};
            if (!kPassGuard || d > 0) {  // a region boundary, see kPassGuard
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    if (!kFull && lane0 + p * step >= d) continue;
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const float v = raw_at<S>(raw[p], e);
                        acc[0] = kRms ? norm::add_square(acc[0], v) : norm::fadd(acc[0], v);
                    }
                }
            }
            group_sum<1>(acc, pl, gs, parity);
            float mean = 0.0f;
            if constexpr (!kRms) {
                mean = norm::mean_of(acc[0], d);
                acc[0] = 0.0f;
                if (!kPassGuard || d > 0) {  // a region boundary, see kPassGuard
#pragma unroll
                    for (int p = 0; p < kP; ++p) {
                        if (!kFull && lane0 + p * step >= d) continue;
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[0] = norm::add_centered_square(acc[0], raw_at<S>(raw[p], e), mean);
                    }
                }
                group_sum<1>(acc, pl, gs, parity);
            }
            const float rstd = norm::rstd_of(acc[0], d, a.eps);
            if (kWrite && pl.j == 0) {
                if (a.mean) a.mean[r] = norm::canonical(mean);
                if (a.rstd) a.rstd[r] = norm::canonical(rstd);
            }
            if (!kPassGuard || d > 0) {  // a region boundary, see kPassGuard
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    const int64_t i0 = lane0 + p * step;
                    if (!kFull && i0 >= d) continue;
                    const int k = pl.j + p * n_lanes;
                    float y[8];
                    {
                        const float4 g0 = sw[k], g1 = sw[np + k];
                        const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
                        float b[8] = {};
                        if constexpr (kBeta) {
                            const float4 b0 = sb[k], b1 = sb[np + k];
                            b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
                        }
#pragma unroll
                        for (int e = 0; e < 8; ++e) {  // canonical below (the FP8 path: the NaN code)
                            const float v = raw_at<S>(raw[p], e);
                            const float xh = kRms ? norm::fmul(v, rstd) : norm::fmul(norm::fsub(v, mean), rstd);
                            y[e] = kBeta ? norm::ffma(xh, g[e], b[e]) : norm::fmul(xh, g[e]);  // norm::y_value
                        }
                    }
                    [[maybe_unused]] const int64_t base = r * d + i0;
                    if constexpr (kFp8) {
                        float pm = 0.0f;
#pragma unroll
                        for (int e = 0; e < 8; ++e) pm = fmax_nan(pm, fabsf(y[e]));
                        amax = fmax_nan(amax, pm);
                        if constexpr (kWrite) {
                            float sv[8];
                            uint32_t word[2];
                            encode_fp8x8<D>(y, scale, pm, check_all, sv, word);
                            if constexpr (stats) {
#pragma unroll
                                for (int e = 0; e < 8; ++e) {
                                    const uint32_t q = (word[e / 4] >> (8 * (e % 4))) & 0xFFu;
                                    saturated += (fabsf(sv[e]) > fp8_max) ? 1u : 0u;  // false for NaN
                                    underflowed += (y[e] != 0.0f && y[e] == y[e] && (q & 0x7Fu) == 0) ? 1u : 0u;
                                }
                            }
                            *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(a.y) + base) = make_uint2(word[0], word[1]);
                        }
                    } else {
                        store_wide8(a.y, a.y_dtype, base, 8, 2, y);  // canonical NaN there
                    }
                }
            }
            if constexpr (kPrefetch) {
#pragma unroll
                for (int p = 0; p < kP; ++p)
#pragma unroll
                    for (int q = 0; q < kW; ++q) raw[p][q] = nraw[p][q];
            }
        }
    };
    if (a.rms) run(std::true_type(), std::false_type());  // RMSNorm has no beta (the host checks)
    else if (a.beta) run(std::false_type(), std::true_type());
    else run(std::false_type(), std::false_type());
    if constexpr (kFp8) {
        Tally t;
        const uint32_t amax_bits = __float_as_uint(amax);  // |y|'s max: a NaN's bits lie above inf's
        t.amax = amax_bits > 0x7F800000u ? 0x7F800000u : amax_bits;  // amax_bits_of: NaN as inf
        t.saturated = saturated;
        t.underflowed = underflowed;
        if constexpr (!kWrite) {
            const uint32_t m = block_reduce(t.amax, MaxOp());
            if (threadIdx.x == 0) atomicMax(&meta->amax_bits, m);
        } else if constexpr (stats) {
            finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        } else {
            finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(a.rows * d));
        }
    }
}

// ---- backward --------------------------------------------------------------------------------------

// One block per chunk of rows (norm::chunk_begin), slot s of the block on sub-chunk s. dx of each row;
// the chunk's column partials of dgamma (dy * xhat) and dbeta (dy) into partial[(2k + 0 / 1) * d + c].
// smem_pieces > 0: the slots' partials in dynamic shared memory, float4 sp[slot][array][piece][half][lane]
// (smem_pieces = the pieces of a lane); 0: one slot (groups(d) == 8), partials accumulated in the
// partial buffer itself (each column owned by one thread).
template <fp8amp_dtype SDY, fp8amp_dtype SX, int kPieces>
__global__ void __launch_bounds__(kThreads, 2) norm_backward_kernel(const NormBackwardArgs a, float *partial,
                                                                 int64_t n_chunks, int smem_pieces,
                                                                 int param_pieces) {
    using DyT = typename Storage<SDY>::type;
    using XT = typename Storage<SX>::type;
    constexpr int kCache = kPieces > 0 ? kPieces : 1;
    extern __shared__ float4 sp[];
    __shared__ GroupScratch gs;
    const int64_t d = a.d, k = blockIdx.x;
    const Place pl(d);
    const int n_lanes = 32 * pl.groups, n_slots = norm::kBlockWarps / pl.groups;
    const int n_arrays = a.dbeta ? 2 : 1;
    int parity = 0;
    const float fd = static_cast<float>(d);
    const bool rms = a.rms;
    const float wc = weight_c(a.zero_centered);
    const int vdy = vec_mode(a.dy, d, sizeof(DyT)), vx = vec_mode(a.x, d, sizeof(XT));
    const int vdx = vec_mode(a.dx, d, int(wide_size(a.dx_dtype)));
    const bool vg = reinterpret_cast<uintptr_t>(a.gamma) % 16 == 0;
    const int P = smem_pieces;
    float4 *mine = sp + size_t(pl.slot) * 2 * P * 2 * n_lanes;  // this slot's partials
    auto at = [&](int arr, int p, int h) -> float4 & { return mine[((arr * P + p) * 2 + h) * n_lanes + pl.j]; };
    float *pg = partial + (2 * k) * d, *pb = partial + (2 * k + 1) * d;
    if (P > 0) {
        for (int arr = 0; arr < n_arrays; ++arr)
            for (int p = 0; p < P; ++p) at(arr, p, 0) = at(arr, p, 1) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
        for_pieces<0>(d, pl.j, n_lanes, [&](int, int64_t i0, int left) {
            for (int e = 0; e < left; ++e) {
                pg[i0 + e] = 0.0f;
                if (a.dbeta) pb[i0 + e] = 0.0f;
            }
        });
    }
    // param_pieces > 0: the weights (weight(gamma) = c + gamma) as floats in shared memory after the
    // partials, bw[half * np + piece], converted once per block (a chunk of many rows) instead of
    // loaded, unpacked and added to c per element in both passes of every row.
    const int np = param_pieces;
    float4 *const bw = sp + size_t(P) * 4 * kThreads;
    if (np > 0) {
        for (int kk = threadIdx.x; kk < np; kk += kThreads) {
            const int64_t i0 = int64_t(kk) * norm::kPiece;
            const int left = d - i0 >= 8 ? 8 : int(d - i0);
            float f[8];
            load_param(a.gamma, a.gamma_dtype, i0, left, vg, f);
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] = norm::fadd(wc, f[e]);
            bw[kk] = make_float4(f[0], f[1], f[2], f[3]);
            bw[np + kk] = make_float4(f[4], f[5], f[6], f[7]);
        }
        __syncthreads();
    }
    // The weights of the piece at i0: c + gamma (past d: c + 0, as before).
    auto weights = [&](int64_t i0, int left, float (&w)[8]) {
        if (np > 0) {
            const int kk = int(i0 / norm::kPiece);
            const float4 w0 = bw[kk], w1 = bw[np + kk];
            w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
        } else {
            load_param(a.gamma, a.gamma_dtype, i0, left, vg, w);
#pragma unroll
            for (int e = 0; e < 8; ++e) w[e] = norm::fadd(wc, w[e]);
        }
    };
    const auto *dy = static_cast<const DyT *>(a.dy);
    const auto *x = static_cast<const XT *>(a.x);
    const int64_t c0 = norm::chunk_begin(k, a.rows, n_chunks), c1 = norm::chunk_begin(k + 1, a.rows, n_chunks);
    const int64_t r0 = c0 + norm::chunk_begin(pl.slot, c1 - c0, n_slots);
    const int64_t r1 = c0 + norm::chunk_begin(pl.slot + 1, c1 - c0, n_slots);
    // kPrefetch: the next row's dy, x, mean and rstd are loaded while this row is computed (a slot walks
    // its rows one after another, so its loads would otherwise wait on its own arithmetic); not for 8
    // pieces of BF16 (or 4+ of F32), whose two copies would not fit in the registers.
    constexpr bool kPrefetch = kPieces > 0 && kPieces * (kWords<SDY> + kWords<SX>) <= 32;
    uint32_t rdy[kCache][kWords<SDY>], rx[kCache][kWords<SX>];
    float cur_mean = 0.0f, cur_rstd = 0.0f;
    auto fetch = [&](int64_t rr, uint32_t (&ddy)[kCache][kWords<SDY>], uint32_t (&dxx)[kCache][kWords<SX>],
                     float &m, float &rs) {
        m = rms ? 0.0f : a.mean[rr];
        rs = a.rstd[rr];
        for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
            load_raw<SDY>(dy + rr * d, i0, left, vdy, ddy[p]);
            load_raw<SX>(x + rr * d, i0, left, vx, dxx[p]);
        });
    };
    if constexpr (kPrefetch)
        if (r0 < r1) fetch(r0, rdy, rx, cur_mean, cur_rstd);
    for (int64_t r = r0; r < r1; ++r) {
        uint32_t ndy[kCache][kWords<SDY>], nx[kCache][kWords<SX>];
        float next_mean = 0.0f, next_rstd = 0.0f;
        if constexpr (kPrefetch) {
            if (r + 1 < r1) fetch(r + 1, ndy, nx, next_mean, next_rstd);
        } else if constexpr (kPieces > 0) {
            fetch(r, rdy, rx, cur_mean, cur_rstd);
        } else {
            cur_mean = rms ? 0.0f : a.mean[r];
            cur_rstd = a.rstd[r];
        }
        const float mean = cur_mean, rstd = cur_rstd;
        const DyT *dyr = dy + r * d;
        const XT *xr = x + r * d;
        auto load = [&](int p, int64_t i0, int left) -> int {
            if constexpr (kPieces > 0) {
                return p;
            } else {
                load_raw<SDY>(dyr, i0, left, vdy, rdy[0]);
                load_raw<SX>(xr, i0, left, vx, rx[0]);
                return 0;
            }
        };
        float acc[2] = {0.0f, 0.0f};
        for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
            const int c = load(p, i0, left);
            float w[8];
            weights(i0, left, w);
            // a missing element: g = +0 (adds nothing); g * xhat may be NaN (xhat of 0): skipped
            auto body = [&](auto full) {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const float g = norm::fmul(raw_at<SDY>(rdy[c], e), w[e]);
                    const float xh = norm::xhat(raw_at<SX>(rx[c], e), mean, rstd, false);
                    acc[0] = norm::fadd(acc[0], g);  // unused by RMSNorm
                    acc[1] = norm::fadd(acc[1], decltype(full)::value || e < left ? norm::fmul(g, xh) : 0.0f);
                }
            };
            if (left == 8) body(std::true_type());
            else body(std::false_type());
        });
        group_sum<2>(acc, pl, gs, parity);
        const float c1v = rms ? 0.0f : norm::fdiv(acc[0], fd);
        const float c2v = norm::fdiv(acc[1], fd);
        for_pieces<kPieces>(d, pl.j, n_lanes, [&](int p, int64_t i0, int left) {
            const int c = load(p, i0, left);
            float w[8], dyv[8], xh[8], dx[8];
            weights(i0, left, w);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                dyv[e] = raw_at<SDY>(rdy[c], e);
                xh[e] = norm::xhat(raw_at<SX>(rx[c], e), mean, rstd, false);
                // norm::dx_value less its canonical(), which store_wide8 applies (g - c1 with c1 = +0
                // for RMSNorm is g)
                const float g = norm::fmul(dyv[e], w[e]);
                dx[e] = norm::fmul(norm::fsub(norm::fsub(g, c1v), norm::fmul(xh[e], c2v)), rstd);
            }
            store_wide8(a.dx, a.dx_dtype, r * d + i0, left, vdx, dx);
            if (P > 0) {  // the partials of missing elements are never read
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float4 &g4 = at(0, p, h);
                    g4.x = norm::fadd(g4.x, norm::fmul(dyv[4 * h + 0], xh[4 * h + 0]));
                    g4.y = norm::fadd(g4.y, norm::fmul(dyv[4 * h + 1], xh[4 * h + 1]));
                    g4.z = norm::fadd(g4.z, norm::fmul(dyv[4 * h + 2], xh[4 * h + 2]));
                    g4.w = norm::fadd(g4.w, norm::fmul(dyv[4 * h + 3], xh[4 * h + 3]));
                    if (a.dbeta) {
                        float4 &b4 = at(1, p, h);
                        b4.x = norm::fadd(b4.x, dyv[4 * h + 0]);
                        b4.y = norm::fadd(b4.y, dyv[4 * h + 1]);
                        b4.z = norm::fadd(b4.z, dyv[4 * h + 2]);
                        b4.w = norm::fadd(b4.w, dyv[4 * h + 3]);
                    }
                }
            } else {
                for (int e = 0; e < left; ++e) {
                    pg[i0 + e] = norm::fadd(pg[i0 + e], norm::fmul(dyv[e], xh[e]));
                    if (a.dbeta) pb[i0 + e] = norm::fadd(pb[i0 + e], dyv[e]);
                }
            }
        });
        if constexpr (kPrefetch) {
            if (r + 1 < r1) {
#pragma unroll
                for (int p = 0; p < kCache; ++p) {
#pragma unroll
                    for (int q = 0; q < kWords<SDY>; ++q) rdy[p][q] = ndy[p][q];
#pragma unroll
                    for (int q = 0; q < kWords<SX>; ++q) rx[p][q] = nx[p][q];
                }
                cur_mean = next_mean;
                cur_rstd = next_rstd;
            }
        }
    }
    if (P == 0) return;
    // The chunk's partial: its slots' partials added in slot order from +0.
    __syncthreads();
    for (int64_t col = threadIdx.x; col < d; col += kThreads) {
        const int64_t piece = col / norm::kPiece;
        const int jj = int(piece % n_lanes), p = int(piece / n_lanes), h = int(col % 8) / 4, e = int(col % 4);
        for (int arr = 0; arr < n_arrays; ++arr) {
            float s = 0.0f;
            for (int slot = 0; slot < n_slots; ++slot) {
                const float4 *q = sp + size_t(slot) * 2 * P * 2 * n_lanes + ((arr * P + p) * 2 + h) * n_lanes + jj;
                s = norm::fadd(s, reinterpret_cast<const float *>(q)[e]);
            }
            partial[(2 * k + arr) * d + col] = s;
        }
    }
}

// ---- backward, the common case --------------------------------------------------------------------

// Stores the 8 values f of a whole piece into dtype S at q (16-byte aligned), a NaN as the dtype's
// positive quiet NaN (store_wide8's scheme with the dtype known at compile time).
template <fp8amp_dtype S>
__device__ __forceinline__ void store_piece(typename Storage<S>::type *q, const float (&f)[8]) {
    float pm = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) pm = fmax_nan(pm, fabsf(f[e]));
    const bool has_nan = __float_as_uint(pm) > 0x7F800000u;
    if constexpr (S == FP8AMP_DTYPE_F32) {
        float c[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) c[e] = f[e];
        if (has_nan)
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (f[e] != f[e]) c[e] = codec::bits_f32(codec::kF32QuietNaN);
        store16(q, __float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]), __float_as_uint(c[3]));
        store16(q + 4, __float_as_uint(c[4]), __float_as_uint(c[5]), __float_as_uint(c[6]), __float_as_uint(c[7]));
    } else {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (S == FP8AMP_DTYPE_F16) w[k] = packed_word(__floats2half2_rn(f[2 * k], f[2 * k + 1]));
            else w[k] = packed_word(__floats2bfloat162_rn(f[2 * k], f[2 * k + 1]));
        }
        if (has_nan) {
            constexpr uint32_t qn = S == FP8AMP_DTYPE_F16 ? codec::F16::kQuietNaN : codec::BF16::kQuietNaN;
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (f[e] != f[e]) w[e / 2] = (w[e / 2] & ~(0xFFFFu << (16 * (e % 2)))) | (qn << (16 * (e % 2)));
        }
        store16(q, w[0], w[1], w[2], w[3]);
    }
}

// The backward where dy, x and dx share one dtype S, d % 8 == 0 (every piece whole) and the three
// are 16-byte aligned (the host checks; norm_backward_kernel takes every other case). The same
// arithmetic and orders as norm_backward_kernel, with fewer instructions an element:
// - xhat is computed once per element (pass 1) and kept in registers for pass 2 (raw x is dead
//   after pass 1), so pass 2 neither widens x again nor subtracts and multiplies;
// - RMSNorm and "no dbeta" are compile-time branches of one kernel (no sum(g), no x - mean, no
//   g - c1, no dbeta partial where they are not needed);
// - the partials live at sp[((arr * kPieces + p) * 2 + h) * kThreads + threadIdx.x] (one base
//   pointer, compile-time offsets: no per-piece address arithmetic; conflict-free, as consecutive
//   threads take consecutive float4), the weights at bw[piece] / bw[np + piece] after them;
// - no per-element tests of a partial piece or an alignment, no run-time dtype switch.
// Up to 4 pieces (BF16/F16; 2 for F32) the next row's dy and x are loaded while this row is
// computed, as norm_backward_kernel does. kFull (the host passes it for LayerNorm rows where every
// lane has 4 or 6 whole pieces): no piece tests, and each pass behind one run-time test that always
// holds (d > 0), a region boundary that keeps ptxas from carrying one pass's unpacked values into
// the next (see norm_forward_fast_kernel's kPassGuard).
// (xh is written and read under the same per-piece tests, which the front end cannot pair.)
#pragma nv_diag_suppress 549
template <fp8amp_dtype S, int kPieces, bool kSmemW, bool kFull = false>
__global__ void __launch_bounds__(kThreads, 2) norm_backward_fast_kernel(const NormBackwardArgs a, float *partial,
                                                                      int64_t n_chunks, int param_pieces,
                                                                      int paired) {
    using T = typename Storage<S>::type;
    constexpr int kW = kWords<S>;
    constexpr int kP = kPieces;
    constexpr bool kPrefetch = kP * 2 * kW <= 32;
    constexpr bool kPassGuard = kFull;  // each pass behind one guard, as norm_forward_fast_kernel's
    // xhat kept from pass 1 to pass 2 (8 registers a piece in place of the raw x's kW) where the
    // registers allow it beside the prefetched row; else pass 2 computes it again from the raw x.
    constexpr bool kKeepXh = kW < 8 && (kPrefetch ? kP * (3 * kW + 8) : kP * (kW + 8)) <= 64;
    constexpr int kXh = kKeepXh ? kP : 1;
    extern __shared__ float4 sp[];
    __shared__ GroupScratch gs;
    const int64_t d = a.d, k = blockIdx.x;
    const Place pl(d);
    const int n_lanes = 32 * pl.groups, n_slots = norm::kBlockWarps / pl.groups;
    const int n_arrays = a.dbeta ? 2 : 1;
    float4 *const mine = sp + threadIdx.x;
    const int np = param_pieces;  // kSmemW: d / 8
    float4 *const bw = sp + n_arrays * kP * 2 * kThreads;
    const float wc = weight_c(a.zero_centered);
    const bool vg = reinterpret_cast<uintptr_t>(a.gamma) % 16 == 0;
    // The block's setup: its partials zeroed, the weights converted (kSmemW). Called after the first
    // row's loads are issued, so that their latency and the setup's overlap.
    auto setup = [&]() {
        for (int q = 0; q < n_arrays * kP * 2; ++q) mine[q * kThreads] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if constexpr (kSmemW) {
            for (int kk = threadIdx.x; kk < np; kk += kThreads) {
                const int64_t i0 = int64_t(kk) * norm::kPiece;
                float f[8];
                load_param(a.gamma, a.gamma_dtype, i0, 8, vg, f);
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = norm::fadd(wc, f[e]);
                bw[kk] = make_float4(f[0], f[1], f[2], f[3]);
                bw[np + kk] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
        __syncthreads();  // the weights
    };
    // !kSmemW: the weights of this lane's pieces in registers (a block of one row slot: its lanes
    // take the same columns in every row).
    [[maybe_unused]] float wreg[kSmemW ? 1 : kP][8];
    if constexpr (!kSmemW) {
#pragma unroll
        for (int p = 0; p < kP; ++p) {
            const int64_t i0 = int64_t(pl.j) * norm::kPiece + int64_t(p) * n_lanes * norm::kPiece;
            if (kFull || i0 < d) {
                load_param(a.gamma, a.gamma_dtype, i0, 8, vg, wreg[p]);
#pragma unroll
                for (int e = 0; e < 8; ++e) wreg[p][e] = norm::fadd(wc, wreg[p][e]);
            }
        }
    }
    // The weights of piece p of this lane (element i0): c + gamma, from shared memory (kSmemW) or
    // from registers (ptxas spills some of them: a few dozen LDL a row of 48 elements a lane, where
    // reading gamma per piece from global memory took a load, a run-time dtype switch, an unpack and
    // the addition of c an element in each pass: ~20% more instructions).
    auto weights = [&](int p, int64_t i0, float (&w)[8]) {
        if constexpr (kSmemW) {
            const int kk = pl.j + p * n_lanes;
            const float4 w0 = bw[kk], w1 = bw[np + kk];
            w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) w[e] = wreg[p][e];
        }
    };
    const T *const dy = static_cast<const T *>(a.dy);
    const T *const x = static_cast<const T *>(a.x);
    T *const dxo = static_cast<T *>(a.dx);
    // (paired: the grid is rounded up to whole clusters of two; a block past the last chunk has no rows.)
    const int64_t c0 = k < n_chunks ? norm::chunk_begin(k, a.rows, n_chunks) : a.rows;
    const int64_t c1 = k < n_chunks ? norm::chunk_begin(k + 1, a.rows, n_chunks) : a.rows;
    const int64_t r0 = c0 + norm::chunk_begin(pl.slot, c1 - c0, n_slots);
    const int64_t r1 = c0 + norm::chunk_begin(pl.slot + 1, c1 - c0, n_slots);
    const int64_t lane0 = int64_t(pl.j) * norm::kPiece;  // this lane's first element
    const int64_t step = int64_t(n_lanes) * norm::kPiece;  // elements between its pieces
    const float fd = static_cast<float>(d);
    auto run = [&](auto rms_tag, auto db_tag) {
        constexpr bool kRms = decltype(rms_tag)::value, kDb = decltype(db_tag)::value;
        int parity = 0;
        uint32_t rdy[kP][kW], rx[kP][kW];
        float cur_mean = 0.0f, cur_rstd = 0.0f;
        auto fetch = [&](int64_t rr, uint32_t (&ddy)[kP][kW], uint32_t (&dxx)[kP][kW], float &m, float &rs) {
            m = kRms ? 0.0f : a.mean[rr];
            rs = a.rstd[rr];
            const T *dyr = dy + rr * d + lane0, *xr = x + rr * d + lane0;
#pragma unroll
            for (int p = 0; p < kP; ++p)
                if (kFull || lane0 + p * step < d) {
                    load_raw<S>(dyr, p * step, 8, 2, ddy[p]);
                    load_raw<S>(xr, p * step, 8, 2, dxx[p]);
                }
        };
        if (r0 < r1) fetch(r0, rdy, rx, cur_mean, cur_rstd);
        setup();
        for (int64_t r = r0; r < r1; ++r) {
            [[maybe_unused]] uint32_t ndy[kP][kW], nx[kP][kW];
            [[maybe_unused]] float next_mean = 0.0f, next_rstd = 0.0f;
            if constexpr (kPrefetch) {
                if (r + 1 < r1) fetch(r + 1, ndy, nx, next_mean, next_rstd);
            } else {
                if (r > r0) fetch(r, rdy, rx, cur_mean, cur_rstd);
            }
            const float mean = cur_mean, rstd = cur_rstd;
            // Pass 1: sum(g) (LayerNorm) and sum(g * xhat), g = dy * w; xhat kept.
            [[maybe_unused]] float xh[kXh][8];
            // xhat of element e of piece p: kept, or computed again from the raw x
            auto xhat_at = [&](int p, int e) -> float {
                if constexpr (kKeepXh) {
                    return xh[p][e];
                } else {
                    const float xv = raw_at<S>(rx[p], e);
                    return kRms ? norm::fmul(xv, rstd) : norm::fmul(norm::fsub(xv, mean), rstd);
                }
            };
            float s1[1] = {0.0f}, s2[2] = {0.0f, 0.0f};
            if (!kPassGuard || d > 0) {  // a region boundary, see kPassGuard
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    const int64_t i0 = lane0 + p * step;
                    if (!kFull && i0 >= d) continue;
                    float w[8];
                    weights(p, i0, w);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const float g = norm::fmul(raw_at<S>(rdy[p], e), w[e]);
                        const float xv = raw_at<S>(rx[p], e);
                        const float xe = kRms ? norm::fmul(xv, rstd) : norm::fmul(norm::fsub(xv, mean), rstd);
                        if constexpr (kKeepXh) xh[p][e] = xe;
                        if constexpr (kRms) {
                            s1[0] = norm::fadd(s1[0], norm::fmul(g, xe));
                        } else {
                            s2[0] = norm::fadd(s2[0], g);
                            s2[1] = norm::fadd(s2[1], norm::fmul(g, xe));
                        }
                    }
                }
            }
            float c1v = 0.0f, c2v;
            if constexpr (kRms) {
                group_sum<1>(s1, pl, gs, parity);
                c2v = norm::fdiv(s1[0], fd);
            } else {
                group_sum<2>(s2, pl, gs, parity);
                c1v = norm::fdiv(s2[0], fd);
                c2v = norm::fdiv(s2[1], fd);
            }
            // Pass 2: dx, and the slot's column partials (dy * xhat, dy).
            T *const dxr = dxo + r * d + lane0;
            if (!kPassGuard || d > 0) {  // a region boundary, see kPassGuard
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    const int64_t i0 = lane0 + p * step;
                    if (!kFull && i0 >= d) continue;
                    float w[8], dyv[8], xe[8], out[8];
                    weights(p, i0, w);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        dyv[e] = raw_at<S>(rdy[p], e);
                        xe[e] = xhat_at(p, e);
                        // norm::dx_value less its canonical(), which store_piece applies
                        const float g = norm::fmul(dyv[e], w[e]);
                        const float t = kRms ? g : norm::fsub(g, c1v);
                        out[e] = norm::fmul(norm::fsub(t, norm::fmul(xe[e], c2v)), rstd);
                    }
                    store_piece<S>(dxr + p * step, out);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float4 &g4 = mine[(p * 2 + h) * kThreads];
                        float4 v = g4;
                        v.x = norm::fadd(v.x, norm::fmul(dyv[4 * h + 0], xe[4 * h + 0]));
                        v.y = norm::fadd(v.y, norm::fmul(dyv[4 * h + 1], xe[4 * h + 1]));
                        v.z = norm::fadd(v.z, norm::fmul(dyv[4 * h + 2], xe[4 * h + 2]));
                        v.w = norm::fadd(v.w, norm::fmul(dyv[4 * h + 3], xe[4 * h + 3]));
                        g4 = v;
                        if constexpr (kDb) {
                            float4 &b4 = mine[((kP + p) * 2 + h) * kThreads];
                            float4 u = b4;
                            u.x = norm::fadd(u.x, dyv[4 * h + 0]);
                            u.y = norm::fadd(u.y, dyv[4 * h + 1]);
                            u.z = norm::fadd(u.z, dyv[4 * h + 2]);
                            u.w = norm::fadd(u.w, dyv[4 * h + 3]);
                            b4 = u;
                        }
                    }
                }
            }
            if constexpr (kPrefetch) {
                if (r + 1 < r1) {
#pragma unroll
                    for (int p = 0; p < kP; ++p) {
#pragma unroll
                        for (int q = 0; q < kW; ++q) rdy[p][q] = ndy[p][q], rx[p][q] = nx[p][q];
                    }
                    cur_mean = next_mean;
                    cur_rstd = next_rstd;
                }
            }
        }
    };
    if (a.rms) run(std::true_type(), std::false_type());  // RMSNorm has no dbeta (the host checks)
    else if (a.dbeta) run(std::false_type(), std::true_type());
    else run(std::false_type(), std::false_type());
    // The chunk's partial: its slots' partials added in slot order from +0, 4 columns at a time. The
    // float4 cell c = ((arr * kP + p) * 2 + h) * kThreads + jj of slot 0 (jj < n_lanes) holds columns
    // col0 .. col0 + 3, col0 = (p * n_lanes + jj) * 8 + 4h (whole pieces: all 4 exist where col0 < d);
    // slot s's is cell c + s * n_lanes. 32-bit index arithmetic (64-bit divisions cost ~100
    // instructions each).
    const int n_cells = n_arrays * kP * 2 * n_lanes;
    auto place = [&](int v, int &cell, int &arr, int &col0) {
        const int jj = v % n_lanes, rest = v / n_lanes, h = rest % 2, ap = rest / 2, p = ap % kP;
        arr = ap / kP;
        cell = ((arr * kP + p) * 2 + h) * kThreads + jj;
        col0 = (p * n_lanes + jj) * norm::kPiece + 4 * h;
    };
    __syncthreads();
    for (int v = threadIdx.x; v < n_cells; v += kThreads) {
        int c, arr, col0;
        place(v, c, arr, col0);
        if (col0 >= d) continue;
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int slot = 0; slot < n_slots; ++slot) {
            const float4 t = sp[c + slot * n_lanes];
            s.x = norm::fadd(s.x, t.x), s.y = norm::fadd(s.y, t.y), s.z = norm::fadd(s.z, t.z), s.w = norm::fadd(s.w, t.w);
        }
        if (paired) sp[c] = s;  // slot 0's cell: only this thread reads or writes it
        else
            store16(partial + (2 * k + arr) * d + col0, __float_as_uint(s.x), __float_as_uint(s.y), __float_as_uint(s.z),
                    __float_as_uint(s.w));
    }
    if (!paired) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    // No clusters before sm_90: the host never launches this code paired there (cluster_launch).
#else
    // Paired (a cluster of two blocks, chunks 2j and 2j + 1): pair j's partial = chunk 2j's + chunk
    // 2j + 1's, into partial's row j. Each block writes every other cell, reading the other block's
    // value through distributed shared memory.
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // both chunks' partials in their blocks' shared memory
    const int rank = int(cluster.block_rank());
    const float4 *const peer = cluster.map_shared_rank(sp, unsigned(rank ^ 1));
    const int64_t j = k / 2;
#pragma unroll 4
    for (int v = 2 * int(threadIdx.x) + rank; v < n_cells; v += 2 * kThreads) {
        int c, arr, col0;
        place(v, c, arr, col0);
        if (col0 >= d) continue;
        const float4 m = sp[c], o = peer[c];
        const float4 e = rank == 0 ? m : o, f = rank == 0 ? o : m;  // chunk 2j's, chunk 2j + 1's
        store16(partial + (2 * j + arr) * d + col0, __float_as_uint(norm::fadd(e.x, f.x)),
                __float_as_uint(norm::fadd(e.y, f.y)), __float_as_uint(norm::fadd(e.z, f.z)),
                __float_as_uint(norm::fadd(e.w, f.w)));
    }
    cluster.sync();  // neither block leaves while the other still reads its shared memory
#endif
}

#pragma nv_diag_default 549

// out[c] = the sum over rows k of partial, in order from +0, of partial[(2k + arr) * d + c] (arr =
// blockIdx.y: dgamma, dbeta). Rows are chunk pairs' partials (n_rows pairs, from the paired backward)
// or, with pair_rows, chunks' partials (n_rows chunks), which it adds in pairs itself first (norm.hpp's
// order: rows 2j and 2j + 1; the last alone where n_rows is odd). A block stages 32 columns x all its
// rows (264 at most) in shared memory, then one warp adds them in order. Each thread issues all its
// staging loads (float4 when d % 4 == 0) into registers before it stores any: a loop of load ->
// store compiled to one DRAM round trip after another (8-9 a thread; ~8.5 us however few the bytes,
// docs/performance.md).
__global__ void __launch_bounds__(kThreads, 4) norm_column_finish_kernel(const float *partial, int64_t n_rows, int64_t d,
                                                                      float *dgamma, float *dbeta, int pair_rows) {
    static_assert(kFinishChunks % 2 == 0 && kFinishChunks >= norm::kMaxChunks, "every pair staged at once");
    constexpr int kVecLoads = (kFinishChunks * (kFinishCols / 4) + kThreads - 1) / kThreads;  // float4s a thread
    constexpr int kLoads = (kFinishChunks * kFinishCols + kThreads - 1) / kThreads;           // floats a thread
    __shared__ float tile[kFinishChunks][kFinishCols + 1];
    const int arr = blockIdx.y;
    float *out = arr == 0 ? dgamma : dbeta;
    const int64_t col0 = int64_t(blockIdx.x) * kFinishCols;
    const bool vec = d % 4 == 0;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < n_rows; k0 += kFinishChunks) {
        const int kn = int(n_rows - k0 < kFinishChunks ? n_rows - k0 : kFinishChunks);
        // Thread t stages column cc of chunks kk0, kk0 + kStep, ... (idx = t + u * kThreads), so its
        // loads are one base address and a stride apart.
        if (vec) {
            constexpr int kStep = kThreads / (kFinishCols / 4);
            const int kk0 = int(threadIdx.x) / (kFinishCols / 4), cc = 4 * (int(threadIdx.x) % (kFinishCols / 4));
            const bool in_row = col0 + cc < d;
            const float *q = partial + (2 * (k0 + kk0) + arr) * d + col0 + cc;
            const int64_t stride = 2 * int64_t(kStep) * d;
            float4 v[kVecLoads];
#pragma unroll
            for (int u = 0; u < kVecLoads; ++u) {
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (kk0 + u * kStep < kn && in_row) v[u] = __ldg(reinterpret_cast<const float4 *>(q + u * stride));
            }
#pragma unroll
            for (int u = 0; u < kVecLoads; ++u) {
                const int kk = kk0 + u * kStep;
                if (kk < kn)
                    tile[kk][cc] = v[u].x, tile[kk][cc + 1] = v[u].y, tile[kk][cc + 2] = v[u].z, tile[kk][cc + 3] = v[u].w;
            }
        } else {
            constexpr int kStep = kThreads / kFinishCols;
            const int kk0 = int(threadIdx.x) / kFinishCols, cc = int(threadIdx.x) % kFinishCols;
            const bool in_row = col0 + cc < d;
            const float *q = partial + (2 * (k0 + kk0) + arr) * d + col0 + cc;
            const int64_t stride = 2 * int64_t(kStep) * d;
            float v[kLoads];
#pragma unroll
            for (int u = 0; u < kLoads; ++u) {
                v[u] = 0.0f;
                if (kk0 + u * kStep < kn && in_row) v[u] = __ldg(q + u * stride);
            }
#pragma unroll
            for (int u = 0; u < kLoads; ++u)
                if (kk0 + u * kStep < kn) tile[kk0 + u * kStep][cc] = v[u];
        }
        __syncthreads();
        if (threadIdx.x < kFinishCols) {
            if (pair_rows)
                for (int kk = 0; kk < kn; kk += 2)
                    acc = norm::fadd(acc, kk + 1 < kn ? norm::fadd(tile[kk][threadIdx.x], tile[kk + 1][threadIdx.x])
                                                      : tile[kk][threadIdx.x]);
            else
                for (int kk = 0; kk < kn; ++kk) acc = norm::fadd(acc, tile[kk][threadIdx.x]);
        }
        __syncthreads();
    }
    if (threadIdx.x < kFinishCols && col0 + threadIdx.x < d) out[col0 + threadIdx.x] = norm::canonical(acc);
}

// Lets kernel take smem bytes of dynamic shared memory: beyond 48 KB *including its static shared
// memory* a launch needs the opt-in attribute, else it fails with cudaErrorInvalidValue (the backward
// at d = 4099 did on an H100: 48 KB of partials plus its static GroupScratch). Returns the kernel's
// static shared memory. The runtime is asked once per (kernel, device) -- cudaFuncGetAttributes and
// cudaFuncSetAttribute cost microseconds of host time that a forward or backward made every step
// should not pay -- and asked again only for a larger opt-in than the one already made. A fixed
// table (no allocation between the launches of one call); past its size (far more kernels than
// norm.cu has) the runtime is asked every time.
size_t allow_dynamic_smem_raw(const void *kernel, int device, size_t smem, const char *what) {
    struct Slot {
        const void *kernel;
        int device;
        size_t static_bytes, allowed;
    };
    static constexpr size_t kSlots = 512;  // a power of two
    static std::mutex mutex;
    static Slot cache[kSlots] = {};
    std::lock_guard<std::mutex> lock(mutex);
    const size_t hash = (reinterpret_cast<uintptr_t>(kernel) >> 4) * 31u + static_cast<size_t>(device);
    Slot *slot = nullptr;
    for (size_t probe = 0; probe < kSlots; ++probe) {
        Slot &s = cache[(hash + probe) & (kSlots - 1)];
        if (!s.kernel || (s.kernel == kernel && s.device == device)) {
            slot = &s;
            break;
        }
    }
    size_t static_bytes, allowed = 48 * 1024;
    if (slot && slot->kernel) {
        static_bytes = slot->static_bytes;
        allowed = slot->allowed;
    } else {
        cudaFuncAttributes attr{};
        check(cudaFuncGetAttributes(&attr, kernel), what);
        static_bytes = attr.sharedSizeBytes;
        allowed = static_bytes < allowed ? allowed - static_bytes : 0;  // dynamic bytes allowed without the opt-in
    }
    if (smem > allowed) {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), what);
        allowed = smem;
    }
    if (slot) *slot = {kernel, device, static_bytes, allowed};
    return static_bytes;
}

template <class K>
size_t allow_dynamic_smem(K kernel, int device, size_t smem, const char *what) {
    return allow_dynamic_smem_raw(reinterpret_cast<const void *>(kernel), device, smem, what);
}

// Shared memory of one multiprocessor, asked once per device.
int sm_shared_memory(int device) {
    static std::atomic<int> cached[64] = {};
    if (device >= 0 && device < 64) {
        const int v = cached[device].load(std::memory_order_relaxed);
        if (v > 0) return v;
    }
    int n = 0;
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device), "cudaDeviceGetAttribute");
    if (device >= 0 && device < 64) cached[device].store(n, std::memory_order_relaxed);
    return n;
}

// Whether the lean backward runs as clusters of two: the device launches thread block clusters
// (sm_90 and later; asked once per device) and FP8AMP_NORM_CLUSTERS is not "0" (read at every call: a
// diagnostic switch to the path GPUs without clusters take, which test_norm runs on an H100 too).
bool cluster_launch(int device) {
    if (const char *env = std::getenv("FP8AMP_NORM_CLUSTERS"); env && std::strcmp(env, "0") == 0) return false;
    static std::atomic<int> cached[64] = {};  // 0: not asked yet, 1: no, 2: yes
    if (device >= 0 && device < 64) {
        const int v = cached[device].load(std::memory_order_relaxed);
        if (v > 0) return v == 2;
    }
    int yes = 0;
    check(cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, device), "cudaDeviceGetAttribute");
    if (device >= 0 && device < 64) cached[device].store(yes ? 2 : 1, std::memory_order_relaxed);
    return yes != 0;
}

// The pieces of a lane for a row of d.
inline int64_t lane_pieces(int64_t d) {
    const int64_t per = int64_t(norm::lanes(d)) * norm::kPiece;
    return (d + per - 1) / per;
}

// Whether every lane of a row of d has exactly `pieces` whole pieces (d = lanes(d) * 8 * pieces: at 4
// pieces 1024, 2048, 4096, 8192; at 6, 12288), the rows the kFull kernel variants take.
inline bool whole_pieces(int64_t d, int pieces) { return d == int64_t(norm::lanes(d)) * norm::kPiece * pieces; }

// The register pieces of a lane for a row of d: the smallest of 1, 2, 4, 8 that holds it, or 0 (the
// row is read again in each pass).
template <class F>
void dispatch_pieces(int64_t d, F &&f) {
    const int64_t pieces = lane_pieces(d);
    if (pieces <= 1) return f(std::integral_constant<int, 1>());
    if (pieces <= 2) return f(std::integral_constant<int, 2>());
    if (pieces <= 4) return f(std::integral_constant<int, 4>());
    if (pieces <= kMaxPieces) return f(std::integral_constant<int, 8>());
    f(std::integral_constant<int, 0>());
}

// The lean forward's grid, in waves of resident blocks (each block converts gamma and beta once and
// walks rows r, r + grid * slots, ...). One wave is best where the kernel is issue-bound (LayerNorm
// into FP8, every long row); more blocks, each with fewer rows, overlap one block's setup and closing
// reduction with the others' rows where it is more memory-bound: wide outputs (RMSNorm at any d,
// LayerNorm up to d = 4096) and RMSNorm into FP8 up to d = 4096. Measured on an H100 for 1, 2, 4 and
// 8 waves at d = 1024, 4096, 8192, 12288 (docs/performance.md, "The lean norm forward's grid").
int fwd_fast_waves(bool rms, bool fp8, int64_t d) {
    if (!fp8) return rms || d <= 4096 ? 4 : 1;
    if (rms && d <= 4096) return d > 2048 ? 4 : 2;
    return 1;
}

// A grid of one block per `n_slots` rows, at most `waves` waves of resident blocks (a block past
// that walks further rows).
template <class Kernel>
unsigned row_grid(int device, Kernel kernel, int64_t rows, int n_slots, int waves) {
    const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads);
    const int64_t wanted = (rows + n_slots - 1) / n_slots;
    const int64_t cap = int64_t(multiprocessor_count(device)) * (per_sm > 0 ? per_sm : 1) * waves;
    return static_cast<unsigned>(wanted < 1 ? 1 : wanted < cap ? wanted : cap);
}

}  // namespace

void norm_forward(int device, void *stream_raw, const NormForwardArgs &a) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const bool fp8 = a.y_dtype == FP8AMP_DTYPE_E4M3 || a.y_dtype == FP8AMP_DTYPE_E5M2;
    const size_t rows = static_cast<size_t>(a.rows);
    const int n_slots = norm::slots(a.d);
    // The common case (norm_forward_fast_kernel): whole 16-byte pieces of x, y aligned for whole-piece
    // stores, gamma and beta in shared memory (d <= kMaxParamD: at most 6 pieces a lane), y_t not
    // fused. fused_t's writing pass stays with norm_forward_kernel (its amax pass may be fast).
    const int64_t pieces = lane_pieces(a.d);
    const size_t y_align = fp8 ? 8 : 16;
    const bool fast = !(a.rms && a.beta) && a.d % norm::kPiece == 0 && a.d <= kMaxParamD && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.y) % y_align == 0;
    // y_t written by the forward itself: rows of whole 32-row tiles, 32-byte aligned runs, codes of a
    // tile in at most 64 KB of shared memory (d <= 2048: one or two warps a row, so 1-4 register pieces).
    // Not where the lean forward runs and the byte transpose moves whole 16-byte runs (rows and d
    // multiples of 16, y and y_t 16-byte aligned): the fused path is the general kernel (128
    // registers, the tile's transpose behind a block barrier), measured at 0.41-0.48 of copy at
    // 16384 x 1024 (1f7501e) against 0.67-0.71 for the lean forward alone; the lean forward and the
    // 16-byte transpose (whose read of y, just written, mostly hits L2) are expected faster. Not
    // measured yet: kLeanThenTranspose = false restores the fused path for those shapes.
    constexpr bool kLeanThenTranspose = true;
    const bool lean_then_transpose = kLeanThenTranspose && fast && a.rows % 16 == 0 && a.d % 16 == 0 &&
                                     reinterpret_cast<uintptr_t>(a.y) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y_t) % 16 == 0;
    const bool fused_t = fp8 && a.y_t && !lean_then_transpose && a.d <= 2048 && a.d % 4 == 0 && a.rows % kTile == 0 &&
                         reinterpret_cast<uintptr_t>(a.y_t) % 16 == 0;
    const int fast_pieces = pieces <= 1 ? 1 : pieces <= 2 ? 2 : pieces <= 4 ? 4 : 6;
    static_assert(kMaxParamD <= 6 * 8 * norm::kMaxLanes, "a row of kMaxParamD takes at most 6 pieces a lane");
    auto with_kernel = [&](auto s, auto dd, auto write) {
        constexpr fp8amp_dtype S = decltype(s)::value, D = decltype(dd)::value;
        constexpr bool W = decltype(write)::value;
        if constexpr (W && is_fp8_v<D>) {
            if (fused_t) {
                const size_t smem = size_t(kTile) * size_t(a.d);
                auto go = [&](auto kernel) {
                    allow_dynamic_smem(kernel, device, smem, "norm_forward_kernel");
                    const int64_t tiles = a.rows / kTile;
                    const int64_t cap = int64_t(multiprocessor_count(device)) * 16;
                    kernel<<<unsigned(tiles < cap ? tiles : cap), kThreads, smem, stream>>>(a, 0);
                    check_launch("norm_forward_kernel");
                };
                const int64_t pieces = lane_pieces(a.d);
                if (pieces <= 1) go(norm_forward_kernel<S, D, 1, true, true>);
                else if (pieces <= 2) go(norm_forward_kernel<S, D, 2, true, true>);
                else go(norm_forward_kernel<S, D, 4, true, true>);
                return;
            }
        }
        if (fast) {
            // norm_forward_fast_kernel: fwd_fast_waves() waves of resident blocks (counting the shared
            // memory: gamma and, with beta, beta as floats), each converting them once and walking rows.
            const size_t smem = size_t(a.d / norm::kPiece) * (a.beta ? 4 : 2) * sizeof(float4);
            auto go = [&](auto kernel) {
                const size_t static_smem = allow_dynamic_smem(kernel, device, smem, "norm_forward_fast_kernel");
                const int by_regs = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads);
                const int by_smem = int(size_t(sm_shared_memory(device)) / (smem + static_smem + 1024));  // 1 KB a block reserved
                const int per_sm = by_regs < by_smem ? by_regs : by_smem;
                const int64_t wanted = (a.rows + n_slots - 1) / n_slots;
                const int64_t cap = int64_t(multiprocessor_count(device)) * (per_sm > 0 ? per_sm : 1) *
                                    fwd_fast_waves(a.rms, fp8, a.d);
                kernel<<<unsigned(wanted < 1 ? 1 : wanted < cap ? wanted : cap), kThreads, smem, stream>>>(a);
                check_launch("norm_forward_fast_kernel");
            };
            // kFull: every lane has 4 or 6 whole pieces (d = lanes(d) * 8 * pieces: 1024, 2048, 4096,
            // 8192 and 12288), so no piece tests; each pass is straight-line code scheduled across the
            // pieces. LayerNorm -> E4M3 at 2048 x 12288: 0.59 -> 0.72 of copy. At 4 pieces (64
            // registers) each pass also sits behind one run-time test (kPassGuard): without it ptxas
            // keeps the first pass's unpacked x for the later passes and spills 64 bytes (up to 22%
            // slower); with it, no spill and 1-8% faster than the piece tests. docs/performance.md, "The
            // lean norm forward without piece tests".
            const bool full = (fast_pieces == 4 || fast_pieces == 6) && whole_pieces(a.d, fast_pieces);
            auto with_stats = [&](auto st) {
                constexpr bool St = decltype(st)::value;
                if (fast_pieces == 1) go(norm_forward_fast_kernel<S, D, 1, W, St, false>);
                else if (fast_pieces == 2) go(norm_forward_fast_kernel<S, D, 2, W, St, false>);
                else if (fast_pieces == 4 && full) go(norm_forward_fast_kernel<S, D, 4, W, St, true>);
                else if (fast_pieces == 4) go(norm_forward_fast_kernel<S, D, 4, W, St, false>);
                else if (full) go(norm_forward_fast_kernel<S, D, 6, W, St, true>);
                else go(norm_forward_fast_kernel<S, D, 6, W, St, false>);
            };
            // Only the FP8 writing pass counts; every other variant is instantiated once.
            if constexpr (is_fp8_v<D> && W) {
                if (a.target.stats) {
                    with_stats(std::true_type());
                    return;
                }
            }
            with_stats(std::false_type());
            return;
        }
        dispatch_pieces(a.d, [&](auto p) {
            constexpr int P = decltype(p)::value;
            const auto kernel = norm_forward_kernel<S, D, P, W>;
            // gamma and beta as floats in shared memory (the kernel's param_pieces) for register-cached
            // rows up to kMaxParamD; then one wave of resident blocks (counting the shared memory),
            // each converting them once and walking many rows. Otherwise up to 16 waves: enough blocks
            // that the scheduler overlaps one block's reductions and epilogue with another's loads, few
            // enough that the per-block epilogue atomics stay rare.
            const int np = P > 0 && a.d <= kMaxParamD ? int((a.d + norm::kPiece - 1) / norm::kPiece) : 0;
            const size_t smem = size_t(np) * 4 * sizeof(float4);
            unsigned grid;
            if (np > 0) {
                const size_t static_smem = allow_dynamic_smem(kernel, device, smem, "norm_forward_kernel");
                const int by_regs = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads);
                const int by_smem = int(size_t(sm_shared_memory(device)) / (smem + static_smem + 1024));  // 1 KB a block reserved
                const int per_sm = by_regs < by_smem ? by_regs : by_smem;
                const int64_t wanted = (a.rows + n_slots - 1) / n_slots;
                const int64_t cap = int64_t(multiprocessor_count(device)) * (per_sm > 0 ? per_sm : 1);
                grid = unsigned(wanted < 1 ? 1 : wanted < cap ? wanted : cap);
            } else {
                grid = row_grid(device, kernel, a.rows, n_slots, 16);
            }
            kernel<<<grid, kThreads, smem, stream>>>(a, np);
            check_launch("norm_forward_kernel");
        });
    };
    dispatch_src(a.x_dtype, [&](auto s) {
        if (!fp8) return with_kernel(s, std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F32>(), std::true_type());
        auto run_fp8 = [&](auto dd) {
            if (a.target.current) {
                check(cudaMemsetAsync(&a.target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
                with_kernel(s, dd, std::false_type());
            }
            with_kernel(s, dd, std::true_type());
        };
        if (a.y_dtype == FP8AMP_DTYPE_E4M3) run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
        else run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
    });
    if (fp8 && a.y_t && !fused_t) transpose_bytes(device, stream_raw, a.y, a.y_t, rows, static_cast<size_t>(a.d));
}

size_t norm_backward_partial_floats(int64_t rows, int64_t d) {
    return static_cast<size_t>(norm::chunks(rows)) * 2 * static_cast<size_t>(d);
}

void norm_backward(int device, void *stream_raw, const NormBackwardArgs &a, float *partial) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const int64_t n_chunks = norm::chunks(a.rows);
    const int64_t pieces = lane_pieces(a.d);
    // The slots' partials in shared memory: 2 arrays x pieces x 8 floats x 256 threads.
    const int smem_pieces = pieces <= kMaxSmemPieces ? int(pieces) : 0;
    // The weights as floats after them (register-cached rows, 4 * d bytes) where both fit in 100 KB,
    // so that the grid's 2 blocks a SM stay resident on an H100 (228 KB a SM): d <= 9216.
    const size_t partial_smem = size_t(smem_pieces) * 2 * norm::kPiece * kThreads * sizeof(float);
    const size_t param_smem = size_t((a.d + norm::kPiece - 1) / norm::kPiece) * 2 * sizeof(float4);
    const int np = pieces <= kMaxPieces && partial_smem + param_smem <= 100 * 1024 ? int((a.d + norm::kPiece - 1) / norm::kPiece) : 0;
    const size_t smem = partial_smem + (np > 0 ? param_smem : 0);
    // The common case (norm_backward_fast_kernel): dy, x and dx of one dtype, whole pieces, 16-byte
    // aligned rows, up to 6 pieces a lane (d <= 12288; F32: 4, d <= 8192). The weights go to shared
    // memory where they fit beside the partials in 100 KB (two blocks a SM): always up to 4 pieces,
    // and for RMSNorm (one partial array) at 6.
    auto aligned = [](const void *q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    int64_t partial_rows = n_chunks;  // rows of partial the finishing kernel adds up
    bool paired = false;              // they are chunk pairs' partials already
    const bool fast = !(a.rms && a.dbeta) && a.dy_dtype == a.x_dtype && a.dx_dtype == a.x_dtype && a.d % norm::kPiece == 0 &&
                      pieces <= (a.x_dtype == FP8AMP_DTYPE_F32 ? 4 : 6) && aligned(a.dy) && aligned(a.x) && aligned(a.dx);
    if (fast) {
        const int n_arrays = a.dbeta ? 2 : 1;
        const int kp = pieces <= 1 ? 1 : pieces <= 2 ? 2 : pieces <= 4 ? 4 : 6;
        const size_t fast_partials = size_t(n_arrays) * size_t(kp) * 2 * kThreads * sizeof(float4);
        const bool smem_w = fast_partials + param_smem <= 100 * 1024;
        const size_t fast_smem = fast_partials + (smem_w ? param_smem : 0);
        // kFull: LayerNorm rows where every lane has 4 or 6 whole pieces (d = 1024, 2048, 4096, 8192,
        // 12288) run without piece tests, each pass behind one guard (as the lean forward): 4-10%
        // faster on an H100 (the 4-piece kernel's 16 bytes of spills gone, the 6-piece one's 128 ->
        // 104). RMSNorm keeps its piece tests: the same variant moved it by -2% to +3%.
        const bool full = !a.rms && (kp == 4 || kp == 6) && whole_pieces(a.d, kp);
        // Where the device launches clusters, blocks 2j and 2j + 1 form one and write chunk pair j's
        // partial (norm.hpp's order), half the partial rows the finishing kernel then reads: 13 of
        // 26 MB each way at 2048 x 12288 (docs/performance.md). Two-block clusters keep the grid's
        // 264 blocks resident at once on an H100 (larger ones would not: bench/cluster_occupancy.cu).
        auto go = [&](auto kernel) {
            allow_dynamic_smem(kernel, device, fast_smem, "norm_backward_fast_kernel");
            if (cluster_launch(device)) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(static_cast<unsigned>(2 * norm::chunk_pairs(n_chunks)));
                cfg.blockDim = dim3(kThreads);
                cfg.dynamicSmemBytes = fast_smem;
                cfg.stream = stream;
                cudaLaunchAttribute cluster[1];
                cluster[0].id = cudaLaunchAttributeClusterDimension;
                cluster[0].val.clusterDim.x = 2;
                cluster[0].val.clusterDim.y = 1;
                cluster[0].val.clusterDim.z = 1;
                cfg.attrs = cluster;
                cfg.numAttrs = 1;
                check(cudaLaunchKernelEx(&cfg, kernel, a, partial, n_chunks, int(a.d / norm::kPiece), 1),
                      "norm_backward_fast_kernel (clusters of two)");
                partial_rows = norm::chunk_pairs(n_chunks);
                paired = true;
            } else {
                kernel<<<static_cast<unsigned>(n_chunks), kThreads, fast_smem, stream>>>(a, partial, n_chunks,
                                                                                        int(a.d / norm::kPiece), 0);
            }
            check_launch("norm_backward_fast_kernel");
        };
        dispatch_src(a.x_dtype, [&](auto s) {
            constexpr fp8amp_dtype S = decltype(s)::value;
            if (kp == 1) go(norm_backward_fast_kernel<S, 1, true>);
            else if (kp == 2) go(norm_backward_fast_kernel<S, 2, true>);
            else if (kp == 4 && full) go(norm_backward_fast_kernel<S, 4, true, true>);
            else if (kp == 4) go(norm_backward_fast_kernel<S, 4, true>);
            else if constexpr (S != FP8AMP_DTYPE_F32) {
                if (smem_w) {
                    if (full) go(norm_backward_fast_kernel<S, 6, true, true>);
                    else go(norm_backward_fast_kernel<S, 6, true>);
                } else {
                    if (full) go(norm_backward_fast_kernel<S, 6, false, true>);
                    else go(norm_backward_fast_kernel<S, 6, false>);
                }
            }
        });
    } else {
        dispatch_src(a.dy_dtype, [&](auto sdy) {
            constexpr fp8amp_dtype SDY = decltype(sdy)::value;
            dispatch_src(a.x_dtype, [&](auto sx) {
                constexpr fp8amp_dtype SX = decltype(sx)::value;
                dispatch_pieces(a.d, [&](auto p) {
                    const auto kernel = norm_backward_kernel<SDY, SX, decltype(p)::value>;
                    allow_dynamic_smem(kernel, device, smem, "norm_backward_kernel");
                    kernel<<<static_cast<unsigned>(n_chunks), kThreads, smem, stream>>>(a, partial, n_chunks, smem_pieces, np);
                    check_launch("norm_backward_kernel");
                });
            });
        });
    }
    const dim3 grid(static_cast<unsigned>((a.d + kFinishCols - 1) / kFinishCols), a.dbeta ? 2u : 1u);
    norm_column_finish_kernel<<<grid, kThreads, 0, stream>>>(partial, partial_rows, a.d, a.dgamma, a.dbeta, paired ? 0 : 1);
    check_launch("norm_column_finish_kernel");
}

}  // namespace fp8amp::kernels::cuda
