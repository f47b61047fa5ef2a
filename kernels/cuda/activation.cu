// Fused activations on CUDA (kernels/activation.hpp): GELU (tanh), SiLU, SwiGLU forward into a wide
// or FP8 y, backward into a wide or FP8 dx, the quantize's amax, statistics and scale_inv fused (the
// per-block epilogue of casting_common.cuh), and the transposed FP8 copy written by the same kernel.
// Bit-identical to kernels/cpu/activation.cpp: each output element is the same inline arithmetic of
// the inputs (act::forward_value / backward_value: IEEE float32 operations and FMAs, each rounded
// once), and the amax and counters are order-independent integer reductions. Current scaling runs
// two passes: an amax-only pass, then the writing pass. For GELU/SiLU forwards of BF16 x the amax
// pass reads x at copy speed: a thread's amax is f of its largest input when that is at least 0.5
// (exact: f is non-decreasing on x >= 0 and |f| < f(0.5) on x < 0 over all BF16 inputs, a tested
// property of the shared arithmetic), else f of every element as before.
//
// Why it is shaped so (docs/performance.md, "activation kernels", rounds 2-4): an element costs
// 29-40 SASS instructions with its load and FP8 epilogue while a BF16 -> FP8 stream at copy bandwidth
// leaves an H100 ~32 issue slots per element (forward; ~53 for the backward's 5 bytes), so the
// forwards need their math and their memory traffic to overlap, and everything around the math must
// be near-free:
// - stream_kernel (no transpose): BF16 inputs, 8 elements (a group) per 16-byte load, 8-byte FP8
//   stores; packs of 4 groups per thread step in the forwards (2 in the backwards), whose loads
//   ptxas places next to their math (one load in flight a thread; across 40-48 warps an SM that was
//   measured to be enough: a cp.async ring, FP8AMP_ACTIVATION_PIPELINE=1, made these kernels 4-7%
//   slower). 32-bit group indices, so an address is one wide multiply-add. GELU/SiLU map the element index straight through (no row, no division); SwiGLU
//   finds the row once per group by a multiply-high division (FastDiv), and its backward writes da
//   and db of the same column group from one evaluation of silu(a) / silu'(a) (one exp and two
//   divisions for two outputs). Current scaling's writing pass walks the groups last to first (what
//   the amax pass read last is still in L2).
// - The GELU/SiLU forwards of stream_kernel read f(x) from a table of the BF16 inputs that occur most
//   (act::table: 16 KB in shared memory, copied from the device's copy at each block's start; the
//   other inputs by the formula, not inlined): ~9 integer operations and a shared-memory load an
//   element in place of ~30 float operations (17.7 SASS instructions an element in all), the same
//   bytes, 6-9% faster on an H100 (12% the current-scaling pair). SwiGLU's forward and the tile
//   kernel's were slower with it and keep the formula.
// - tile_kernel ("+t": out_t requested): 64 x 64 output tiles; each tile's FP8 bytes go to out
//   (8-byte row stores) and to a padded shared-memory tile, then 4 x 4 byte blocks are transposed in
//   registers and written to out_t as 4-byte pieces (16 threads write 64 contiguous bytes of a
//   transposed row). In the forwards the block's next fast tile's inputs are copied (cp.async) during
//   this tile (measured 8-15% faster; the backwards, slower with it, keep their loads).
//   Edge tiles and unaligned buffers take a per-element path in the same kernel. Replaces the
//   separate byte transpose (out re-read, out_t written: +2 bytes per element).
// - FP8 quantization as quantize.cu's fast path: one max.NaN per element (the amax, and NaN found by
//   the same chain), a multiply and paired satfinite conversions merged into 32-bit words (fp8x4).
//   stream_kernel tests NaN once per step: a step that holds one (rare) has its NaN codes replaced by
//   the canonical NaN's code (fix_nan_codes) and records amax inf; the tile kernel sends a group with
//   a NaN to the per-element path.
// - activation_generic_kernel: everything else (F32/F16 inputs, dy of another dtype, unaligned
//   buffers, SwiGLU with cols % 8 != 0); 4 elements per thread step, the row by division.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "activation.hpp"
#include "casting_common.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda {
namespace {

using namespace casting;

__device__ __forceinline__ float load_any(const void *p, fp8amp_dtype dt, int64_t i) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: return to_f32<FP8AMP_DTYPE_F32>(static_cast<const float *>(p)[i]);
    case FP8AMP_DTYPE_F16: return to_f32<FP8AMP_DTYPE_F16>(static_cast<const uint16_t *>(p)[i]);
    default: return to_f32<FP8AMP_DTYPE_BF16>(static_cast<const uint16_t *>(p)[i]);
    }
}

__device__ __forceinline__ void store_any(void *p, fp8amp_dtype dt, int64_t i, float v) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: static_cast<float *>(p)[i] = from_f32<FP8AMP_DTYPE_F32>(v); return;
    case FP8AMP_DTYPE_F16: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_F16>(v); return;
    default: static_cast<uint16_t *>(p)[i] = from_f32<FP8AMP_DTYPE_BF16>(v); return;
    }
}

// 4 consecutive elements from p + i (aligned to 4 elements: the caller checked), of a run-time dtype.
__device__ __forceinline__ void load4_any(const void *p, fp8amp_dtype dt, int64_t i, float f[4]) {
    if (dt == FP8AMP_DTYPE_F32) {
        const float4 v = *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
        f[0] = to_f32<FP8AMP_DTYPE_F32>(v.x), f[1] = to_f32<FP8AMP_DTYPE_F32>(v.y);
        f[2] = to_f32<FP8AMP_DTYPE_F32>(v.z), f[3] = to_f32<FP8AMP_DTYPE_F32>(v.w);
        return;
    }
    const uint2 v = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p) + i);
    const uint16_t h[4] = {uint16_t(v.x & 0xFFFFu), uint16_t(v.x >> 16), uint16_t(v.y & 0xFFFFu), uint16_t(v.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; ++e)
        f[e] = dt == FP8AMP_DTYPE_F16 ? to_f32<FP8AMP_DTYPE_F16>(h[e]) : to_f32<FP8AMP_DTYPE_BF16>(h[e]);
}

__device__ __forceinline__ void store4_any(void *p, fp8amp_dtype dt, int64_t i, const float f[4]) {
    if (dt == FP8AMP_DTYPE_F32) {
        *reinterpret_cast<float4 *>(static_cast<float *>(p) + i) = make_float4(f[0], f[1], f[2], f[3]);
        return;
    }
    uint16_t h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        h[e] = dt == FP8AMP_DTYPE_F16 ? from_f32<FP8AMP_DTYPE_F16>(f[e]) : from_f32<FP8AMP_DTYPE_BF16>(f[e]);
    *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p) + i) =
        make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
}

__device__ __forceinline__ bool aligned4(const void *p, fp8amp_dtype dt) {
    const size_t size = dt == FP8AMP_DTYPE_F32 ? 4 : dt == FP8AMP_DTYPE_E4M3 || dt == FP8AMP_DTYPE_E5M2 ? 1 : 2;
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % (4 * size) == 0;
}

// D: E4M3/E5M2, or F32 standing for a wide out (a.out_dtype at run time). kWrite false: amax only.
// A thread takes 4 consecutive output elements at a time. When the rows (and SwiGLU's halves) are
// multiples of 4 elements and the buffers aligned, the 4 share a row, so the row/column is computed
// once for them and every input is read, and the output written, as one vector; otherwise each
// element finds its own row and column.
template <fp8amp_dtype D, bool kWrite, bool kBackward>
__global__ void __launch_bounds__(kThreads) activation_generic_kernel(const ActivationArgs a) {
    constexpr bool kFp8 = D == FP8AMP_DTYPE_E4M3 || D == FP8AMP_DTYPE_E5M2;
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    const int64_t out_cols = kBackward ? in_cols : a.cols;
    const int64_t n = a.rows * out_cols;
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    bool stats = false;
    if constexpr (kFp8) {
        scale = kWrite ? quantize_scale(*meta) : 1.0f;
        fp8_max = meta->fp8_max;
        stats = kWrite && meta->stats_enabled;
    }
    const bool vec = a.cols % 4 == 0 && aligned4(a.x, a.x_dtype) && (!kBackward || aligned4(a.dy, a.dy_dtype)) &&
                     aligned4(a.out, kFp8 ? D : a.out_dtype);
    const bool narrow = n < (int64_t(1) << 32);  // 32-bit index arithmetic (the usual case) is cheaper
    auto row_col = [&](int64_t e, int64_t &r, int64_t &j) {
        if (narrow) {
            r = uint32_t(e) / uint32_t(out_cols);
            j = uint32_t(e) - uint32_t(r) * uint32_t(out_cols);
        } else {
            r = e / out_cols;
            j = e - r * out_cols;
        }
    };
    Tally t;
    const int64_t groups = (n + 3) / 4;
    for (int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * kThreads) {
        const int64_t e0 = 4 * g;
        const int left = n - e0 < 4 ? int(n - e0) : 4;
        float y[4];
        if (vec) {  // left == 4: n is a multiple of 4
            int64_t r, j;
            row_col(e0, r, j);
            if constexpr (!kBackward) {
                float x[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                load4_any(a.x, a.x_dtype, r * in_cols + j, x);
                if (glu) load4_any(a.x, a.x_dtype, r * in_cols + a.cols + j, b);
#pragma unroll
                for (int e = 0; e < 4; ++e) y[e] = act::forward_value(a.kind, x[e], b[e]);
            } else {
                const bool second = glu && j >= a.cols;
                const int64_t c = second ? j - a.cols : j;
                float dy[4], x[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                load4_any(a.dy, a.dy_dtype, r * a.cols + c, dy);
                load4_any(a.x, a.x_dtype, r * in_cols + c, x);
                if (glu) load4_any(a.x, a.x_dtype, r * in_cols + a.cols + c, b);
#pragma unroll
                for (int e = 0; e < 4; ++e) y[e] = act::backward_value(a.kind, dy[e], x[e], b[e], second);
            }
        } else {
#pragma unroll  // constant indices keep y[] in registers
            for (int e = 0; e < 4; ++e) {
                if (e >= left) break;
                int64_t r, j;
                row_col(e0 + e, r, j);
                if constexpr (!kBackward) {
                    const float x = load_any(a.x, a.x_dtype, r * in_cols + j);
                    const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + j) : 0.0f;
                    y[e] = act::forward_value(a.kind, x, b);
                } else {
                    const bool second = glu && j >= a.cols;
                    const int64_t c = second ? j - a.cols : j;
                    const float dy = load_any(a.dy, a.dy_dtype, r * a.cols + c);
                    const float x = load_any(a.x, a.x_dtype, r * in_cols + c);
                    const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
                    y[e] = act::backward_value(a.kind, dy, x, b, second);
                }
            }
        }
        if constexpr (kFp8) {
            uint32_t packed = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (e >= left) break;
                t.amax = max(t.amax, amax_bits_of(y[e]));
                if constexpr (kWrite) {
                    const float s = scaled(y[e], scale);
                    const uint8_t q = from_f32<D>(s);
                    packed |= uint32_t(q) << (8 * e);
                    if (stats) {
                        t.saturated += (fabsf(s) > fp8_max) ? 1u : 0u;  // false for NaN
                        t.underflowed += (y[e] != 0.0f && y[e] == y[e] && (q & 0x7Fu) == 0) ? 1u : 0u;
                    }
                }
            }
            if constexpr (kWrite) {
                auto *out = static_cast<uint8_t *>(a.out) + e0;
                if (vec) {
                    *reinterpret_cast<uint32_t *>(out) = packed;
                } else {
                    for (int e = 0; e < 4; ++e)
                        if (e < left) out[e] = uint8_t(packed >> (8 * e));
                }
            }
        } else if (vec) {
            store4_any(a.out, a.out_dtype, e0, y);
        } else {
            #pragma unroll
            for (int e = 0; e < 4; ++e)
                if (e < left) store_any(a.out, a.out_dtype, e0 + e, y[e]);
        }
    }
    if constexpr (kFp8) {
        if constexpr (!kWrite) {
            const uint32_t amax = block_reduce(t.amax, MaxOp());
            if (threadIdx.x == 0) atomicMax(&meta->amax_bits, amax);
        } else if (stats) {
            finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(n));
        } else {
            finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(n));
        }
    }
}


// ---- the vectorized BF16 kernels ------------------------------------------------------------------

constexpr int kGroup = 8;  // elements per group: one 16-byte BF16 load, one 8-byte FP8 store

// n / d for 32-bit n by a multiply-high (Granlund-Montgomery, the round-up variant with the extra
// add, valid for every 32-bit n and d >= 1): the SwiGLU row of a group without an integer division.
struct FastDiv {
    uint32_t d = 1, m = 1, s1 = 0, s2 = 0;
};
FastDiv make_fastdiv(uint32_t d) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    FastDiv f;
    f.d = d;
    f.m = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << l) - d)) / d + 1);
    f.s1 = l ? 1 : 0;
    f.s2 = l ? l - 1 : 0;
    return f;
}
__device__ __forceinline__ uint32_t fast_div(uint32_t n, const FastDiv &f) {
    const uint32_t t = __umulhi(n, f.m);
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

__device__ __forceinline__ uint4 load16(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

// 8 BF16 -> float (exact: the bits shifted up).
__device__ __forceinline__ void bf16x8(const uint4 v, float f[kGroup]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

// ---- the forwards' table of BF16 inputs (activation.hpp, act::table) ------------------------------

// [0]: GELU (tanh), [1]: SiLU. Written at each CUDA context's creation by activation_prepare
// (cpu::activation_table's entries); each block of a GELU/SiLU forward copies its kind's table into
// shared memory (16 KB), where a warp's 32 lookups cost a few bank-conflict replays, where the same
// lookups from global memory (L1) would touch ~30 different lines.
__device__ __align__(16) float g_act_table[2][act::table::kEntries];

// f of 8 BF16 inputs (a 16-byte group) from the table `lut` (shared memory). An input without an
// entry reads some other entry of the table, and the returned value is then nonzero: the caller
// computes f of those inputs itself (table_fixup). Both halves of a 32-bit word at once: with the
// magnitudes biased to h = (x & 0x7FFF) + 0x8000 - kBase (no carry from the low half into the high
// one), an input has an entry exactly when h lies in [0x8000, 0x8000 + kHalf), i.e. bits 11-15 of
// h ^ 0x8000 are clear; its entry is h - 0x8000, plus kHalf when negative, read at 4 times that many
// bytes (the sign moved to that bit by one shift). ~11 instructions a pair of inputs where computing
// each input's index on its own took 16.
__device__ __forceinline__ uint32_t table8(const float *lut, const uint4 v, float f[kGroup]) {
    static_assert(act::table::kHalf == 0x800u && act::table::kEntries == 0x1000u, "the masks below");
    constexpr uint32_t kBias = (0x8000u - act::table::kBase) * 0x00010001u;  // per half, below 0x8000
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const char *const base = reinterpret_cast<const char *>(lut);
    uint32_t miss = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t u = (w[i] & 0x7FFF7FFFu) + kBias;
        miss |= u ^ 0x80008000u;
        const uint32_t lo = ((u << 2) & 0x1FFCu) | ((w[i] >> 2) & 0x2000u);   // low half: sign bit 15
        const uint32_t hi = ((u >> 14) & 0x1FFCu) | ((w[i] >> 18) & 0x2000u);  // high half: sign bit 31
        f[2 * i] = *reinterpret_cast<const float *>(base + lo);
        f[2 * i + 1] = *reinterpret_cast<const float *>(base + hi);
    }
    return miss & 0xF800F800u;
}

// f of one input without an entry: the formula (kFn: the table's function), the same number the CPU
// computes. Not inlined: its ~30 operations and registers stay out of the lookup loop, whose
// occupancy they would otherwise set (a call's cost is paid only on this rare path).
template <int kFn>
__device__ __noinline__ float table_miss(uint32_t b) {
    return act::forward_raw(kFn, __uint_as_float(b << 16), 0.0f);
}

// The rare inputs of a group without an entry (table8 returned nonzero).
template <int kFn>
__device__ __forceinline__ void table_fixup(const uint4 v, float f[kGroup]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
        const uint32_t b = (w[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
        if (!act::table::covers(b)) f[k] = table_miss<kFn>(b);
    }
}

// max(a, b), NaN if either is (PTX max.NaN, sm_80+): one FMNMX per element finds a group's amax and
// whether it holds a NaN (fabsf is an operand modifier), where integer magnitudes took two.
__device__ __forceinline__ float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// The largest |y| of a group (+0 for zeros), or a NaN when one of them is.
__device__ __forceinline__ float group_abs_max(const float y[kGroup]) {
    float m = fabsf(y[0]);
#pragma unroll
    for (int k = 1; k < kGroup; ++k) m = max_nan(m, fabsf(y[k]));
    return m;
}

// One element into FP8 as the CPU quantizes it (the NaN-safe path): canonical NaN, amax, scaled,
// encoded, counted.
template <fp8amp_dtype D>
__device__ __forceinline__ uint8_t quantize_element(float y, float scale, float fp8_max, bool stats, Tally &t) {
    y = norm::canonical(y);
    t.amax = max(t.amax, amax_bits_of(y));
    const float s = scaled(y, scale);
    const uint8_t q = from_f32<D>(s);
    if (stats) {
        t.saturated += (fabsf(s) > fp8_max) ? 1u : 0u;  // false for NaN
        t.underflowed += (y != 0.0f && y == y && (q & 0x7Fu) == 0) ? 1u : 0u;
    }
    return q;
}

// 8 raw (not yet canonical) values into 8 FP8 codes, the same bits as quantize_element's: without a
// NaN, one magnitude max (the amax), multiplies and paired satfinite conversions (quantize.cu's fast
// path: a scale in [FLT_MIN, FLT_MAX] turns no non-NaN into a NaN); with one, element by element.
template <fp8amp_dtype D>
__device__ __forceinline__ uint2 quantize_group(const float y[kGroup], float scale, float fp8_max, bool stats, Tally &t) {
    const float m = group_abs_max(y);
    if (m != m) {
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int k = 0; k < kGroup; ++k) w[k / 4] |= uint32_t(quantize_element<D>(y[k], scale, fp8_max, stats, t)) << (8 * (k % 4));
        return make_uint2(w[0], w[1]);
    }
    t.amax = max(t.amax, __float_as_uint(m));  // a non-negative float: its bits order like its values
    float s[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) s[k] = y[k] * scale;
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) w[k] = fp8x4<D>(s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]);
    if (stats) {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            t.saturated += fabsf(s[k]) > fp8_max ? 1u : 0u;
            t.underflowed += (y[k] != 0.0f && fabsf(s[k]) <= underflow_limit<D>()) ? 1u : 0u;
        }
    }
    return make_uint2(w[0], w[1]);
}

// 8 values into a wide out (run-time dtype), canonical NaN; out + i 16-byte aligned.
__device__ __forceinline__ void store_wide8(void *out, fp8amp_dtype dt, size_t i, const float y[kGroup]) {
    float v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) v[k] = norm::canonical(y[k]);
    if (dt == FP8AMP_DTYPE_F32) {
        auto *p = reinterpret_cast<float4 *>(static_cast<float *>(out) + i);
        p[0] = make_float4(v[0], v[1], v[2], v[3]);
        p[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint16_t lo = dt == FP8AMP_DTYPE_F16 ? from_f32<FP8AMP_DTYPE_F16>(v[2 * k]) : from_f32<FP8AMP_DTYPE_BF16>(v[2 * k]);
        const uint16_t hi = dt == FP8AMP_DTYPE_F16 ? from_f32<FP8AMP_DTYPE_F16>(v[2 * k + 1]) : from_f32<FP8AMP_DTYPE_BF16>(v[2 * k + 1]);
        w[k] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(out) + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

// What a group's inputs are: x (a), b (SwiGLU) and dy (backward), as loaded.
struct GroupIn {
    uint4 x, b, dy;
};

// Output modes of stream_kernel: FP8 codes (with the epilogue), the amax only, or a wide out.
enum OutMode : int { kOutFp8 = 0, kOutAmax = 1, kOutWide = 2 };

// 8 raw values into 8 FP8 codes by the fast path only (a multiply and half a paired satfinite
// conversion each), statistics included when kStats: right for every group without a NaN. The
// caller finds NaN for a whole pack of groups at once (one max.NaN chain) and, in the rare pack that
// holds one, fixes the NaN codes (fix_nan_codes). The statistics of the fast path are right for a
// NaN group too (a NaN is neither saturated nor underflowed: both comparisons are false for it).
template <fp8amp_dtype D, bool kStats>
__device__ __forceinline__ uint2 encode_group(const float y[kGroup], float scale, float fp8_max, Tally &t) {
    float s[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) s[k] = y[k] * scale;
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) w[k] = fp8x4<D>(s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]);
    if constexpr (kStats) {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            t.saturated += fabsf(s[k]) > fp8_max ? 1u : 0u;
            t.underflowed += (y[k] != 0.0f && fabsf(s[k]) <= underflow_limit<D>()) ? 1u : 0u;
        }
    }
    return make_uint2(w[0], w[1]);
}

// The rare path of a pack that holds a NaN: its fast codes are right but for the NaN elements (a
// satfinite conversion never makes a NaN code of anything else), whose code becomes the one
// quantize_element gives the canonical NaN; the pack's amax is then inf (amax_bits_of(NaN)).
template <fp8amp_dtype D>
__device__ __forceinline__ bool is_nan_code(uint32_t c) {  // c: one code, in the low byte
    return D == FP8AMP_DTYPE_E4M3 ? (c & 0x7Fu) == 0x7Fu : (c & 0x7Fu) > 0x7Cu;
}
template <fp8amp_dtype D>
__device__ __forceinline__ uint32_t fix_nan_codes(uint32_t w) {
    const uint32_t canon = from_f32<D>(codec::bits_f32(codec::kF32QuietNaN));
#pragma unroll
    for (int k = 0; k < 4; ++k)
        if (is_nan_code<D>((w >> (8 * k)) & 0xFFu)) w = (w & ~(0xFFu << (8 * k))) | (canon << (8 * k));
    return w;
}

// BF16 bits of 0.5: from an input this large up, GELU's and SiLU's amax is f of the largest input
// (stream_kernel's amax-only pass; the property is tested over every BF16 input).
constexpr int32_t kAmaxExtremesMin = 0x3F00;

// ---- the input pipeline (tile_kernel's forwards; stream_kernel's with FP8AMP_ACTIVATION_PIPELINE=1) ----
// Why: ptxas schedules a 16-byte load next to the math that uses it, whatever the source order (the
// SASS of every stream_kernel had its pack's loads spread through the pack's math, all into the same
// four registers), so a thread had one load in flight and waited a full memory latency for every
// group, which looked like why the forwards did not overlap memory and math (Nsight Compute: 39% of
// the cycles between issues waiting on L1TEX, 21% of cycles with no eligible warp, DRAM at 59% of
// peak). The ring: the inputs stream through a per-thread ring in shared memory filled by cp.async (LDGSTS, 16 bytes, L2 only): the copies of step s + stages - 1 are issued before the
// math of step s, and ptxas cannot sink them (they write shared memory the thread reads afterwards).
// Each thread reads back only its own 16-byte slots (a warp's read is 512 contiguous bytes: no bank
// conflicts, no barrier).
// Measured (H100, the lead's run of this branch at 2 slots of 4 groups, 48 registers): the ring made
// the stream kernels 4-7% slower, forwards and backwards (GELU fwd 8192 x 4096 46.5 -> 48.2 us on a
// machine with 3.6% more copy bandwidth; GELU bwd 63.6 -> 67.8), while the tile kernel's forwards got
// 8-15% faster (GELU fwd + y_t 65.1 -> 57.9 us) and its backwards 10-14% slower. So the stream
// kernels keep the register loop by default: one 16-byte load in flight a thread across 40-48 warps
// is already ~20 KB an SM in flight, about what the bandwidth needs, and the ring's ~5% more
// instructions and LDGSTS/LDS traffic cost in these near issue-bound kernels; what the tile kernel
// gained was its barrier-synchronized wait (every warp of a block waited for its tile's loads at
// once). FP8AMP_ACTIVATION_PIPELINE=1 builds the stream kernels with the ring (the settings below);
// FP8AMP_ACTIVATION_TILE_RING: 1 (default) the tile kernel's forwards take their ring, 2 all its
// kernels where it fits, 0 none.
#ifndef FP8AMP_ACTIVATION_PIPELINE
#define FP8AMP_ACTIVATION_PIPELINE 0
#endif
#ifndef FP8AMP_ACTIVATION_TILE_RING
#define FP8AMP_ACTIVATION_TILE_RING 1
#endif
// Ring slots (steps in flight + 1) and groups of 8 a step, by the number of input streams: 1 (the
// GELU/SiLU forwards), 2 (SwiGLU's forward: a, b; the GELU/SiLU backwards: x, dy), 3 (SwiGLU's
// backward). The forwards with one stream are issue-bound (~31 instructions an element for 3 bytes):
// 3 slots of 2 groups keep 4 groups a thread in flight like 2 slots of 4, but halve the kernel's
// start (every warp waits for its first step's data before any math) and its end (the last step's
// math with nothing left to load), for ~0.5 instruction an element more; the others are
// memory-bound (5 bytes an element) and keep 2 slots (2 groups; SwiGLU's backward 1).
#ifndef FP8AMP_ACTIVATION_STAGES1
#define FP8AMP_ACTIVATION_STAGES1 3
#endif
#ifndef FP8AMP_ACTIVATION_UNROLL1
#define FP8AMP_ACTIVATION_UNROLL1 2
#endif
#ifndef FP8AMP_ACTIVATION_STAGES2
#define FP8AMP_ACTIVATION_STAGES2 2
#endif
#ifndef FP8AMP_ACTIVATION_UNROLL2
#define FP8AMP_ACTIVATION_UNROLL2 2
#endif
#ifndef FP8AMP_ACTIVATION_STAGES3
#define FP8AMP_ACTIVATION_STAGES3 2
#endif
#ifndef FP8AMP_ACTIVATION_UNROLL3
#define FP8AMP_ACTIVATION_UNROLL3 1
#endif
#ifndef FP8AMP_ACTIVATION_TILE_STAGES  // tile_kernel: ring slots of one 64 x 64 tile's inputs (2 groups a thread)
#define FP8AMP_ACTIVATION_TILE_STAGES 2
#endif
constexpr bool kPipeline = FP8AMP_ACTIVATION_PIPELINE != 0;
constexpr int kTileStages = FP8AMP_ACTIVATION_TILE_STAGES;
// sm_89 (Ada) has 100 KB of shared memory an SM where sm_90 has 228: its device code takes rings of
// at most 16 KB a block (2 slots; 1 group a step with 2 streams; the tile kernel its loads), so that
// the register-limited 5 blocks still fit. (Device code only: the host side never reads the ring's
// sizes, so __CUDA_ARCH__ may differ between the passes.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSmallSmem = true;
#else
constexpr bool kSmallSmem = false;
#endif
static_assert(FP8AMP_ACTIVATION_STAGES1 >= 2 && FP8AMP_ACTIVATION_STAGES2 >= 2 && FP8AMP_ACTIVATION_STAGES3 >= 2 &&
                  kTileStages >= 2,
              "FP8AMP_ACTIVATION_*STAGES*: at least 2 (the next step's copies in flight during this step's math)");

// 16 bytes global -> shared, asynchronously (L2 only: nothing is read twice); src_bytes 0 writes 16
// zero bytes and reads nothing (a step's groups past the end: they compute to zeros, never stored).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, uint32_t src_bytes) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most n of this thread's committed groups are still in flight; their shared-memory
// writes are then visible to this thread.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// 16-byte input streams of a group: x (SwiGLU: a and b), and dy in the backwards.
template <int K, bool kBackward>
constexpr int stream_inputs() {
    return 1 + (K == kSwiglu ? 1 : 0) + (kBackward ? 1 : 0);
}

// Groups a thread takes per step of the main loop: the loop's control, the NaN test and the amax
// update are paid once per step. Pipelined: a step's ring slot holds kU * inputs 16-byte entries
// per thread (4 KB per block each), the ring `stages` slots: 24-32 KB per block by default, so the
// 5-6 blocks of an SM (stream_min_blocks) still fit (the carveout is set to the largest). The
// register loop: the forwards 4 (GELU/SiLU 16 registers of input), the backwards 2.
template <int K, bool kBackward>
constexpr int stream_unroll() {
    if constexpr (!kPipeline) return kBackward ? 2 : 4;
    constexpr int in = stream_inputs<K, kBackward>();
    if constexpr (kSmallSmem) return in == 1 ? 2 : 1;
    return in == 1 ? FP8AMP_ACTIVATION_UNROLL1 : in == 2 ? FP8AMP_ACTIVATION_UNROLL2 : FP8AMP_ACTIVATION_UNROLL3;
}
template <int K, bool kBackward>
constexpr int stream_stages() {
    constexpr int in = stream_inputs<K, kBackward>();
    if constexpr (kSmallSmem) return 2;
    return in == 1 ? FP8AMP_ACTIVATION_STAGES1 : in == 2 ? FP8AMP_ACTIVATION_STAGES2 : FP8AMP_ACTIVATION_STAGES3;
}

// Resident blocks an SM that ptxas must leave room for (a register bound: 6 blocks of 256 threads
// leave 40 registers a thread, 5 leave 48; 0: no bound). With the ring (FP8AMP_ACTIVATION_PIPELINE=1:
// no input registers held across the math) the FP8 stream kernels fit in 40 with no spill and the same
// instructions (sm_90: GELU fwd 498 -> 503 an iteration of 16 elements, the others within 2); left
// to itself ptxas gave them 48-64 depending on unrelated code (4-5 blocks). So the bound pins 6
// blocks (48 warps) an SM, which the rings (24-33 KB a block) fit in an H100's 228 KB.
#ifndef FP8AMP_ACTIVATION_TABLE_MIN_BLOCKS  // the GELU/SiLU forwards with the table (stream_table)
#define FP8AMP_ACTIVATION_TABLE_MIN_BLOCKS 6
#endif
#ifndef FP8AMP_ACTIVATION_MIN_BLOCKS
#define FP8AMP_ACTIVATION_MIN_BLOCKS 6
#endif
// The register loop (the default) keeps the occupancy it was measured at (a9a147a: GELU/SiLU/SwiGLU
// forwards 44 registers, 5 blocks; GELU/SiLU backwards 40, 6; SwiGLU's backward 56, 4): the reversed
// walk of current scaling (a second induction variable) had raised the GELU backward to 44, across
// the 6-block line, so the GELU/SiLU backwards are bound to 6 blocks (40 registers, no spill); the
// others keep ptxas's own count (44-46 and 58: the same blocks; a bound of 5 made SwiGLU's forward
// spill).
//
// Whether stream_kernel reads f from the table (act::table): the GELU/SiLU forwards, but their amax
// pass (it reads x's extremes instead; its rare fallback computes f). Not SwiGLU's forward, which is
// memory-bound (5 bytes an element): with the table it was 12% slower on an H100 (its 16 KB a block
// to fill and look up in, for math that was not what held it back); nor the tile kernel's forwards
// (+ y_t), 9-13% slower with it (docs/performance.md, "the forwards' table").
template <int K, bool kBackward, int kMode>
constexpr bool stream_table() {
    return !kBackward && K != kSwiglu && kMode != kOutAmax;
}

// The GELU/SiLU forwards with the table (stream_table): ptxas took 48 registers (5 blocks); bound to 6
// blocks they need 40 and spill nothing.
template <int K, bool kBackward, int kMode>
constexpr int stream_min_blocks() {
    if constexpr (kMode != kOutFp8) return 0;
    if constexpr (!kPipeline && stream_table<K, kBackward, kMode>()) return FP8AMP_ACTIVATION_TABLE_MIN_BLOCKS;
    if constexpr (kPipeline) return FP8AMP_ACTIVATION_MIN_BLOCKS;
    return kBackward && K != kSwiglu ? 6 : 0;
}

// The streaming kernel (no transpose). Group g: GELU/SiLU elements 8g..8g+7 of x, dy and out (the
// n % 8 tail elements one by one at the end); SwiGLU the forward's columns 8j..8j+7 of row r,
// g = r * d + j (d = cols / 8): a at x[r, 8j], b at x[r, cols + 8j], dy at 8g; the forward writes out
// at 8g, the backward da at dx[r, 8j] and db at dx[r, cols + 8j]. BF16 x and dy, 16-byte aligned;
// groups < 2^31 (32-bit group indices: each address is one wide multiply-add from its base).
// Thread i takes groups i, i + stride, ... (stride = the grid's threads), kUnroll of them per step
// (coalesced: a warp's loads of one step are 512 contiguous bytes), then the last ones one at a time.
// reverse: the grid walks the groups from the last to the first (group g's work is done on group
// groups - 1 - g; same bytes, same results): the writing pass of current scaling, whose amax-only pass
// just read the inputs front to back, so that its first reads find the inputs' end still in L2.
template <int K, bool kBackward, int kMode, fp8amp_dtype D>
__global__ void __launch_bounds__(kThreads, stream_min_blocks<K, kBackward, kMode>()) stream_kernel(const ActivationArgs a, const FastDiv row_div, uint32_t groups,
                                                          uint64_t n, bool reverse) {
    constexpr bool kGlu = K == kSwiglu;
    constexpr int kOuts = kGlu && kBackward ? 2 : 1;  // output groups per input group (da, db)
    constexpr int kUnroll = stream_unroll<K, kBackward>();
    const auto *x = static_cast<const uint16_t *>(a.x);
    const auto *dy = static_cast<const uint16_t *>(a.dy);
    const auto *x4 = static_cast<const uint4 *>(a.x);
    const auto *dy4 = static_cast<const uint4 *>(a.dy);
    auto *out2 = static_cast<uint2 *>(a.out);  // FP8 out, 8 codes per uint2
    ScalingState *meta = a.target.meta;
    float scale = 1.0f, fp8_max = 0.0f;
    bool stats = false;
    if constexpr (kMode == kOutFp8) {
        scale = quantize_scale(*meta);
        fp8_max = meta->fp8_max;
        stats = meta->stats_enabled;
    }
    Tally t;
    // The forwards' table: its copy into shared memory is issued first and waited for (table_ready)
    // once the first pack's loads are in flight, so that the two latencies overlap.
    constexpr bool kTable = stream_table<K, kBackward, kMode>();
    __shared__ __align__(16) float lut[kTable ? act::table::kEntries : 4];
    if constexpr (kTable) {
        const auto *src = reinterpret_cast<const float4 *>(g_act_table[K == kGeluTanh ? 0 : 1]);
        for (int i = int(threadIdx.x); i < int(act::table::kEntries / 4); i += kThreads)
            cp_async16(reinterpret_cast<float4 *>(lut) + i, src + i);
        cp_async_commit();
    }
    auto table_ready = [&]() {
        if constexpr (kTable) {
            cp_async_wait<0>();
            __syncthreads();
        }
    };
    const uint32_t d = row_div.d;  // SwiGLU: groups per row of the forward's output
    // The 16-byte unit of x holding a (GELU/SiLU: x) of group g; b is d units further.
    auto x_unit = [&](uint32_t g) -> uint32_t {
        if constexpr (kGlu) return g + fast_div(g, row_div) * d;  // r * 2d + (g - r * d)
        else return g;
    };
    auto load = [&](uint32_t g, GroupIn &in) {
        const uint32_t xu = x_unit(g);
        in.x = __ldg(x4 + xu);
        if constexpr (kGlu) in.b = __ldg(x4 + xu + d);
        if constexpr (kBackward) in.dy = __ldg(dy4 + g);
    };
    // y[o]: output group o of input group `in` (raw: NaN not yet canonical).
    auto compute = [&](const GroupIn &in, float (&y)[kOuts][kGroup]) {
        float xv[kGroup], bv[kGroup], dv[kGroup];
        if constexpr (kTable) {  // GELU/SiLU forwards: f(x) from the table
            if (table8(lut, in.x, y[0]) != 0u) table_fixup<K>(in.x, y[0]);  // rare
            return;
        }
        bf16x8(in.x, xv);
        if constexpr (kGlu) bf16x8(in.b, bv);
        if constexpr (kBackward) bf16x8(in.dy, dv);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            if constexpr (!kBackward) y[0][k] = act::forward_raw(K, xv[k], kGlu ? bv[k] : 0.0f);
            else if constexpr (!kGlu) y[0][k] = act::backward_raw(K, dv[k], xv[k], 0.0f, false);
            else act::swiglu_backward_raw(dv[k], xv[k], bv[k], y[0][k], y[1][k]);
        }
    };
    // The 8-element unit of out written by output group o of input group g.
    auto out_unit = [&](uint32_t g, int o) -> uint32_t {
        if constexpr (kGlu && kBackward) return x_unit(g) + (o ? d : 0u);
        else return g;
    };
    // kU groups g, g + stride, ... from their inputs `in`: the first `valid` of them exist. The others
    // (the zeros the pipeline fills in past this thread's last group) are computed but neither
    // stored nor counted: f(0) = 0 adds nothing to the amax, and +0 is neither saturated nor
    // underflowed.
    auto process = [&](uint32_t g, uint32_t stride, const auto &in, int valid, auto st) {
        constexpr int kU = int(std::extent_v<std::remove_reference_t<decltype(in)>>);
        [[maybe_unused]] constexpr bool kStats = decltype(st)::value;
        if constexpr (kMode == kOutFp8) {
            uint2 q[kU][kOuts];
            float m = 0.0f;  // the pack's largest |y|, NaN if it holds one
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                float y[kOuts][kGroup];
                compute(in[u], y);
#pragma unroll
                for (int o = 0; o < kOuts; ++o) {
#pragma unroll
                    for (int k = 0; k < kGroup; ++k) m = max_nan(m, fabsf(y[o][k]));
                    q[u][o] = encode_group<D, kStats>(y[o], scale, fp8_max, t);
                }
            }
            if (m != m) {  // rare: canonical NaN codes, amax inf
#pragma unroll
                for (int u = 0; u < kU; ++u)
#pragma unroll
                    for (int o = 0; o < kOuts; ++o) q[u][o] = make_uint2(fix_nan_codes<D>(q[u][o].x), fix_nan_codes<D>(q[u][o].y));
                t.amax = max(t.amax, 0x7F800000u);
            } else {
                t.amax = max(t.amax, __float_as_uint(m));  // a non-negative float: its bits order like its values
            }
#pragma unroll
            for (int u = 0; u < kU; ++u)
                if (u < valid)
#pragma unroll
                    for (int o = 0; o < kOuts; ++o) out2[out_unit(g + u * stride, o)] = q[u][o];
        } else if constexpr (kMode == kOutAmax) {  // NaN counts as inf (max.NaN's NaN is positive)
            float m = 0.0f;
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                float y[kOuts][kGroup];
                compute(in[u], y);
#pragma unroll
                for (int o = 0; o < kOuts; ++o)
#pragma unroll
                    for (int k = 0; k < kGroup; ++k) m = max_nan(m, fabsf(y[o][k]));
            }
            t.amax = max(t.amax, min(__float_as_uint(m), 0x7F800000u));
        } else {
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                float y[kOuts][kGroup];
                compute(in[u], y);
                if (u < valid)
#pragma unroll
                    for (int o = 0; o < kOuts; ++o)
                        store_wide8(a.out, a.out_dtype, size_t(out_unit(g + u * stride, o)) * kGroup, y[o]);
            }
        }
    };
    // The register loop (FP8AMP_ACTIVATION_PIPELINE=0): kU groups g, g + stride, ... (all < groups).
    auto step = [&](uint32_t g, uint32_t stride, auto nu, auto st) {
        constexpr int kU = decltype(nu)::value;
        GroupIn in[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) load(g + u * stride, in[u]);
        process(g, stride, in, kU, st);
    };
    const uint32_t stride = gridDim.x * uint32_t(kThreads);
    const uint32_t first = blockIdx.x * uint32_t(kThreads) + threadIdx.x;
    // A thread's i-th group (i < its count) is first + i stride; reversed, groups - 1 - that, which is
    // gfirst + i gstride modulo 2^32 with gstride = -stride: the same linear form, so the addresses
    // are still one multiply-add (a per-group select made ptxas keep them all: +12 registers).
    const uint32_t gfirst = reverse ? groups - 1 - first : first;  // (used only when first < groups)
    const uint32_t gstride = reverse ? 0u - stride : stride;
    // The pipelined loop: this thread's groups first, first + stride, ... (`mine` of them) in steps of
    // kUnroll; the ring's slot s % kStages holds step s's inputs, entry [u][input][thread].
    constexpr int kStages = stream_stages<K, kBackward>();
    // (Not for the GELU/SiLU amax pass: it reads x at copy speed by its extremes, and its rare
    // fallback keeps the register loop, so that no ring takes shared memory from its blocks.)
    constexpr bool kRing = kPipeline && !(kMode == kOutAmax && !kGlu && !kBackward);
    constexpr int kIn = stream_inputs<K, kBackward>();
    __shared__ uint4 ring[kRing ? kStages : 1][kRing ? kUnroll : 1][kRing ? kIn : 1][kThreads];
    static_assert(sizeof(ring) <= 40 * 1024, "the ring of FP8AMP_ACTIVATION_STAGES* x UNROLL* exceeds 40 KB a block");
    auto pipelined_loop = [&](auto st) {
        table_ready();
        const uint32_t mine = first < groups ? (groups - 1 - first) / stride + 1 : 0u;
        const uint32_t full = mine / kUnroll;                    // steps whose kUnroll groups all exist
        const int rest = int(mine - full * kUnroll);             // groups of the last, partial step
        const int tid = int(threadIdx.x);
        // The copies of step s into its slot; past the last step an empty group, so that the wait
        // below always leaves the same number in flight. No overflow: g < groups < 2^31.
        auto issue = [&](uint32_t s, int k) {  // k: the slot, s % kStages (counted, not divided)
            auto &slot = ring[k];
            if (s < full) {
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const uint32_t g = gfirst + (s * kUnroll + u) * gstride;
                    const uint32_t xu = x_unit(g);
                    cp_async16(&slot[u][0][tid], x4 + xu);
                    if constexpr (kGlu) cp_async16(&slot[u][1][tid], x4 + xu + d);
                    if constexpr (kBackward) cp_async16(&slot[u][kIn - 1][tid], dy4 + g);
                }
            } else if (s == full && rest > 0) {
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const bool ok = u < rest;
                    const uint32_t g = ok ? gfirst + (s * kUnroll + u) * gstride : 0u;
                    const uint32_t bytes = ok ? 16u : 0u;
                    const uint32_t xu = x_unit(g);
                    cp_async16(&slot[u][0][tid], x4 + xu, bytes);
                    if constexpr (kGlu) cp_async16(&slot[u][1][tid], x4 + xu + d, bytes);
                    if constexpr (kBackward) cp_async16(&slot[u][kIn - 1][tid], dy4 + g, bytes);
                }
            }
            cp_async_commit();
        };
        auto consume = [&](uint32_t s, int k, auto valid) {
            const auto &slot = ring[k];
            GroupIn in[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                in[u].x = slot[u][0][tid];
                if constexpr (kGlu) in[u].b = slot[u][1][tid];
                if constexpr (kBackward) in[u].dy = slot[u][kIn - 1][tid];
            }
            process(gfirst + s * kUnroll * gstride, gstride, in, valid, st);
        };
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) issue(uint32_t(s), s);
        int k = 0;  // step s's slot
        for (uint32_t s = 0; s < full; ++s) {
            // into the slot step s - 1 used: this thread read it already
            issue(s + (kStages - 1), k == 0 ? kStages - 1 : k - 1);
            cp_async_wait<kStages - 1>();  // step s's copies have landed
            consume(s, k, std::integral_constant<int, kUnroll>());
            k = k == kStages - 1 ? 0 : k + 1;
        }
        cp_async_wait<0>();  // the partial step's copies (if any) have landed; nothing left in flight
        if (rest > 0) consume(full, k, rest);
    };
    auto main_loop = [&](auto st) {
        if constexpr (kRing) {
            pipelined_loop(st);
        } else {
            uint32_t i = first, g = gfirst;  // i: the group walked forward; g: the group processed
            if constexpr (kTable) {  // the first pack's loads in flight while the table lands
                const bool pack = i + (kUnroll - 1) * stride < groups;
                GroupIn in[kUnroll];
                if (pack)
#pragma unroll
                    for (int u = 0; u < kUnroll; ++u) load(g + u * gstride, in[u]);
                table_ready();  // every thread of the block (a barrier)
                if (pack) {
                    process(g, gstride, in, kUnroll, st);
                    i += kUnroll * stride;
                    g += kUnroll * gstride;
                }
            }
            // Whole packs: groups i .. i + (kUnroll - 1) stride all exist (no overflow: groups < 2^31).
            for (; i + (kUnroll - 1) * stride < groups; i += kUnroll * stride, g += kUnroll * gstride)
                step(g, gstride, std::integral_constant<int, kUnroll>(), st);
            for (; i < groups; i += stride, g += gstride) step(g, gstride, std::integral_constant<int, 1>(), st);
        }
    };
    if constexpr (kMode == kOutAmax && !kGlu && !kBackward) {
        // GELU/SiLU amax from the inputs' extremes (docs/performance.md, "the current-scaling amax
        // pass"): f is non-decreasing over the non-negative BF16 values and |f| of every negative one
        // is below f(0.5), both checked over all 2^16 BF16 inputs (tests/capi/test_activation.c,
        // test_amax_from_extremes_holds). So when this thread's largest input x_max is at least 0.5,
        // its amax is f(x_max) exactly; an input NaN or -inf (f gives NaN) makes it inf. That takes
        // two packed 16-bit maxima per two inputs instead of the activation: copy speed. Otherwise
        // (inputs all below 0.5: rare) the thread evaluates f of each of its elements as before.
        uint32_t smax = 0x80008000u, umax = 0u;  // per 16-bit half: signed max (the largest x >= +0,
                                                 // +NaN above +inf), unsigned max (>= 0xFF80: -inf/-NaN)
        constexpr int kX = 4;  // loads in flight per step (light math: ptxas keeps them ahead)
        uint32_t g = first;
        for (; g + (kX - 1) * stride < groups; g += kX * stride) {
            uint4 v[kX];
#pragma unroll
            for (int u = 0; u < kX; ++u) v[u] = __ldg(x4 + g + u * stride);
#pragma unroll
            for (int u = 0; u < kX; ++u) {
                smax = __vmaxs2(__vmaxs2(smax, v[u].x), __vmaxs2(v[u].y, __vmaxs2(v[u].z, v[u].w)));
                umax = __vmaxu2(__vmaxu2(umax, v[u].x), __vmaxu2(v[u].y, __vmaxu2(v[u].z, v[u].w)));
            }
        }
        for (; g < groups; g += stride) {
            const uint4 v = __ldg(x4 + g);
            smax = __vmaxs2(__vmaxs2(smax, v.x), __vmaxs2(v.y, __vmaxs2(v.z, v.w)));
            umax = __vmaxu2(__vmaxu2(umax, v.x), __vmaxu2(v.y, __vmaxu2(v.z, v.w)));
        }
        const int32_t lo = int16_t(smax & 0xFFFFu), hi = int16_t(smax >> 16);
        const int32_t xmax = lo > hi ? lo : hi;  // BF16 bits of the largest input >= +0, or < 0: none
        const uint32_t umax16 = max(umax & 0xFFFFu, umax >> 16);
        if (xmax > 0x7F80 || umax16 >= 0xFF80u) {  // a NaN (either sign) or -inf among the inputs
            t.amax = 0x7F800000u;
        } else if (xmax >= kAmaxExtremesMin) {
            t.amax = amax_bits_of(act::forward_raw(K, __uint_as_float(uint32_t(xmax) << 16), 0.0f));
        } else {
            main_loop(std::false_type());
        }
    } else if (kMode == kOutFp8 && stats) {
        main_loop(std::true_type());
    } else {
        main_loop(std::false_type());
    }
    if constexpr (!kGlu) {  // the n % 8 tail: element by element
        for (uint64_t e = uint64_t(groups) * kGroup + first; e < n; e += stride) {
            const float xv = to_f32<FP8AMP_DTYPE_BF16>(x[e]);
            const float y = kBackward ? act::backward_raw(K, to_f32<FP8AMP_DTYPE_BF16>(dy[e]), xv, 0.0f, false)
                                      : act::forward_raw(K, xv, 0.0f);
            if constexpr (kMode == kOutAmax) {
                t.amax = max(t.amax, amax_bits_of(y));
            } else if constexpr (kMode == kOutFp8) {
                static_cast<uint8_t *>(a.out)[e] = quantize_element<D>(y, scale, fp8_max, stats, t);
            } else {
                store_any(a.out, a.out_dtype, int64_t(e), norm::canonical(y));
            }
        }
    }
    if constexpr (kMode == kOutAmax) {
        const uint32_t amax = block_reduce(t.amax, MaxOp());
        if (threadIdx.x == 0) atomicMax(&meta->amax_bits, amax);
    } else if constexpr (kMode == kOutFp8) {
        const size_t total = size_t(kGlu && kBackward ? 2 * n : n);
        if (stats) finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, total);
        else finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, total);
    }
}

// ---- the fused transpose: 64 x 64 output tiles ----------------------------------------------------

constexpr int kTileDim = 64;
constexpr int kTileStride = kTileDim / 4 + 1;  // words per tile row: 16 + 1 of padding (2-way conflicts at most)

// Bytes i of four words, as one word (a 4x4 byte transpose, column i): quantize.cu's.
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&col)[4]) {
    const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    col[0] = __byte_perm(ab_lo, cd_lo, 0x5410);
    col[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
    col[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
    col[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// One output element (r, j) of the run-time-dtype path: the generic kernel's arithmetic.
template <bool kBackward>
__device__ __forceinline__ float element_raw(const ActivationArgs &a, int64_t r, int64_t j) {
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    if constexpr (!kBackward) {
        const float x = load_any(a.x, a.x_dtype, r * in_cols + j);
        const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + j) : 0.0f;
        return act::forward_raw(a.kind, x, b);
    } else {
        const bool second = glu && j >= a.cols;
        const int64_t c = second ? j - a.cols : j;
        const float dy = load_any(a.dy, a.dy_dtype, r * a.cols + c);
        const float x = load_any(a.x, a.x_dtype, r * in_cols + c);
        const float b = glu ? load_any(a.x, a.x_dtype, r * in_cols + a.cols + c) : 0.0f;
        return act::backward_raw(a.kind, dy, x, b, second);
    }
}

// Tiles cover the output [rows, out_cols]; SwiGLU's backward tiles its two halves (da, db)
// separately, so no tile straddles them, and puts the da and db tiles of the same columns next to
// each other (the second reads a and b again, mostly from L2). `fast`: BF16 inputs, 16-byte aligned
// x and dy, 8-byte aligned out, 4-byte aligned out_t, rows % 4 == 0 and the forward's cols % 8 == 0;
// a full tile then takes the vector path, an edge tile (or any tile when not fast) the per-element one.
// Whether a tile kernel takes the input ring (FP8AMP_ACTIVATION_TILE_RING; where 2 slots of its
// inputs fit in 32 KB: not SwiGLU's backward, 3 inputs). Host and device alike (sm_89's device code
// also drops it: kSmallSmem, in the kernel).
template <int K, bool kBackward>
constexpr bool tile_ring() {
    return FP8AMP_ACTIVATION_TILE_RING >= (kBackward ? 2 : 1) && kTileStages * 2 * stream_inputs<K, kBackward>() <= 8;
}
// The tile kernels' register bound where they take the ring: GELU/SiLU forwards 48 registers (5
// blocks; 40 would spill), the others 64 (4; their natural count). Without the ring: 4 blocks (64
// registers), the occupancy they were measured at.
#ifndef FP8AMP_ACTIVATION_TILE_MIN_BLOCKS
#define FP8AMP_ACTIVATION_TILE_MIN_BLOCKS 5
#endif
template <int K, bool kBackward>
constexpr int tile_min_blocks() {
    if constexpr (!tile_ring<K, kBackward>()) return 4;  // as measured before (58-64 registers); SwiGLU's
                                                         // backward would take 80 now (3 blocks)
    if constexpr (FP8AMP_ACTIVATION_TILE_MIN_BLOCKS == 0) return 0;
    return K != kSwiglu && !kBackward ? FP8AMP_ACTIVATION_TILE_MIN_BLOCKS : FP8AMP_ACTIVATION_TILE_MIN_BLOCKS - 1;
}

template <int K, bool kBackward, fp8amp_dtype D>
__global__ void __launch_bounds__(kThreads, tile_min_blocks<K, kBackward>()) tile_kernel(const ActivationArgs a, bool fast, bool reverse,
                                                                                  const FastDiv tiles_c_div) {
    constexpr bool kGlu = K == kSwiglu;
    constexpr int kHalves = kGlu && kBackward ? 2 : 1;
    __shared__ uint32_t tile[kTileDim * kTileStride];
    auto *bytes = reinterpret_cast<uint8_t *>(tile);
    ScalingState *meta = a.target.meta;
    const float scale = quantize_scale(*meta);
    const float fp8_max = meta->fp8_max;
    const bool stats = meta->stats_enabled;
    const int64_t rows = a.rows, cols = a.cols, in_cols = kGlu ? 2 * cols : cols;
    const int64_t out_cols = kBackward ? in_cols : cols;
    const int64_t span = kHalves == 2 ? cols : out_cols;  // columns tiled per half
    const int64_t tiles_c = (span + kTileDim - 1) / kTileDim, tiles_r = (rows + kTileDim - 1) / kTileDim;
    const auto *x = static_cast<const uint16_t *>(a.x);
    const auto *dyp = static_cast<const uint16_t *>(a.dy);
    auto *out = static_cast<uint8_t *>(a.out);
    auto *out_t = static_cast<uint8_t *>(a.out_t);
    Tally t;
    const int64_t tiles = tiles_r * tiles_c * kHalves;
    // A tile's place: its half (SwiGLU's backward), first row, first column in the half and in out's
    // row, height and width.
    struct Where {
        int half;
        int64_t r0, cc0, oc0;
        int h, w;
    };
    // reverse (as stream_kernel's): the tiles from the last to the first. 32-bit tile indices (the
    // vector condition, groups < 2^31, keeps tiles below 2^30) and a multiply-high division by tiles_c: a 64-bit division
    // costs ~20 instructions a thread, twice a tile (this tile and the one the ring loads next), over
    // a thread's 16 elements.
    auto where = [&](int64_t id64) {
        const uint32_t id = uint32_t(reverse ? tiles - 1 - id64 : id64);
        Where p;
        p.half = kHalves == 2 ? int(id % 2) : 0;
        const uint32_t rest = kHalves == 2 ? id / 2 : id, tr = fast_div(rest, tiles_c_div);
        p.r0 = int64_t(tr) * kTileDim, p.cc0 = int64_t(rest - tr * tiles_c_div.d) * kTileDim;
        p.oc0 = p.half * cols + p.cc0;
        p.h = rows - p.r0 < kTileDim ? int(rows - p.r0) : kTileDim;
        p.w = span - p.cc0 < kTileDim ? int(span - p.cc0) : kTileDim;
        return p;
    };
    // The fast tiles' inputs through a ring in shared memory as in stream_kernel (cp.async, the next
    // tile's copies issued before this tile's math: ptxas had put the second load after the first
    // group's math and every tile waited a full memory latency behind its barrier). Thread p's 16-byte
    // entries [u][input][p], u = 0, 1: its two groups. 4 KB each; the ring only where it stays within
    // 32 KB (not SwiGLU's backward: 3 inputs), which keeps the former loads.
    constexpr int kIn = stream_inputs<K, kBackward>();
    constexpr int kStages = kTileStages;
    constexpr bool kRing = tile_ring<K, kBackward>() && !kSmallSmem;
    __shared__ uint4 ring[kRing ? kStages : 1][2][kRing ? kIn : 1][kThreads];
    const int tid = int(threadIdx.x);
    auto issue = [&](int64_t id, int slot) {  // the copies of tile id (if it is a fast one), then a commit
        if constexpr (kRing) {
            if (id < tiles) {
                const Where p = where(id);
                if (fast && p.h == kTileDim && p.w == kTileDim) {
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        const int q = tid + u * kThreads, r = q / 8, cg = (q % 8) * kGroup;
                        const int64_t c = p.cc0 + cg;
                        cp_async16(&ring[slot][u][0][tid], x + (p.r0 + r) * in_cols + c);
                        if constexpr (kGlu) cp_async16(&ring[slot][u][1][tid], x + (p.r0 + r) * in_cols + cols + c);
                        if constexpr (kBackward) cp_async16(&ring[slot][u][kIn - 1][tid], dyp + (p.r0 + r) * cols + c);
                    }
                }
            }
            cp_async_commit();
        }
    };
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) issue(blockIdx.x + int64_t(j) * gridDim.x, j);
    int slot = 0;  // the ring slot of this block's current tile
    for (int64_t id = blockIdx.x; id < tiles; id += gridDim.x) {
        issue(id + int64_t(kStages - 1) * gridDim.x, slot == 0 ? kStages - 1 : slot - 1);  // the slot the last tile used
        const Where p = where(id);
        const int half = p.half;
        const int64_t r0 = p.r0, cc0 = p.cc0, oc0 = p.oc0;
        const int h = p.h, w = p.w;
        if (fast && h == kTileDim && w == kTileDim) {
            // 64 rows x 8 groups: thread p takes group p % 8 of row p / 8, p = tid and tid + 256.
            GroupIn in[2];
            if constexpr (kRing) {
                cp_async_wait<kStages - 1>();  // this tile's copies have landed
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    in[u].x = ring[slot][u][0][tid];
                    if constexpr (kGlu) in[u].b = ring[slot][u][1][tid];
                    if constexpr (kBackward) in[u].dy = ring[slot][u][kIn - 1][tid];
                }
            } else {
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int p = threadIdx.x + u * kThreads, r = p / 8, cg = (p % 8) * kGroup;
                    const int64_t c = cc0 + cg;  // the forward's column (GELU/SiLU: out's)
                    in[u].x = load16(x + (r0 + r) * in_cols + c);
                    if constexpr (kGlu) in[u].b = load16(x + (r0 + r) * in_cols + cols + c);
                    if constexpr (kBackward) in[u].dy = load16(dyp + (r0 + r) * cols + c);
                }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int p = threadIdx.x + u * kThreads, r = p / 8, cg = (p % 8) * kGroup;
                float xv[kGroup], bv[kGroup], dv[kGroup], y[kGroup];
                bf16x8(in[u].x, xv);
                if constexpr (kGlu) bf16x8(in[u].b, bv);
                if constexpr (kBackward) bf16x8(in[u].dy, dv);
#pragma unroll
                for (int k = 0; k < kGroup; ++k) {
                    if constexpr (!kBackward) y[k] = act::forward_raw(K, xv[k], kGlu ? bv[k] : 0.0f);
                    else y[k] = act::backward_raw(K, dv[k], xv[k], kGlu ? bv[k] : 0.0f, half == 1);
                }
                const uint2 q = quantize_group<D>(y, scale, fp8_max, stats, t);
                *reinterpret_cast<uint2 *>(out + (r0 + r) * out_cols + oc0 + cg) = q;
                tile[r * kTileStride + cg / 4] = q.x;
                tile[r * kTileStride + cg / 4 + 1] = q.y;
            }
            __syncthreads();
            // Thread (m, wc): rows 4m..4m+3, columns 4wc..4wc+3 of the tile -> 4 bytes of out_t rows
            // oc0 + 4wc + i at r0 + 4m; 16 consecutive threads write 64 contiguous bytes.
            const int m = threadIdx.x % 16, wc = threadIdx.x / 16;
            uint32_t col[4];
            transpose4x4(tile[(4 * m) * kTileStride + wc], tile[(4 * m + 1) * kTileStride + wc],
                         tile[(4 * m + 2) * kTileStride + wc], tile[(4 * m + 3) * kTileStride + wc], col);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                *reinterpret_cast<uint32_t *>(out_t + (oc0 + 4 * wc + i) * rows + r0 + 4 * m) = col[i];
        } else {
            for (int e = threadIdx.x; e < kTileDim * kTileDim; e += kThreads) {
                const int r = e / kTileDim, c = e % kTileDim;
                if (r < h && c < w) {
                    const uint8_t q = quantize_element<D>(element_raw<kBackward>(a, r0 + r, oc0 + c), scale, fp8_max, stats, t);
                    out[(r0 + r) * out_cols + oc0 + c] = q;
                    bytes[r * kTileStride * 4 + c] = q;
                }
            }
            __syncthreads();
            for (int e = threadIdx.x; e < kTileDim * kTileDim; e += kThreads) {
                const int j = e / kTileDim, r = e % kTileDim;  // consecutive threads: consecutive bytes of out_t
                if (j < w && r < h) out_t[(oc0 + j) * rows + r0 + r] = bytes[r * kTileStride * 4 + j];
            }
        }
        __syncthreads();  // the tile is reused by this block's next one
        slot = slot == kStages - 1 ? 0 : slot + 1;
    }
    if constexpr (kRing) cp_async_wait<0>();  // only empty groups can remain; none left in flight at exit
    if (stats) finish_block<true>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(rows * out_cols));
    else finish_block<false>(t, meta, scale, a.target.scale_inv, a.target.scale_inv_t, size_t(rows * out_cols));
}

bool aligned_to(const void *p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

template <class F>
void dispatch_kind(int32_t kind, F &&f) {
    if (kind == kGeluTanh) return f(std::integral_constant<int, kGeluTanh>());
    if (kind == kSilu) return f(std::integral_constant<int, kSilu>());
    f(std::integral_constant<int, kSwiglu>());
}

template <bool kBackward>
void run(int device, void *stream_raw, const ActivationArgs &a) {
    DeviceGuard guard(device);
    auto stream = static_cast<cudaStream_t>(stream_raw);
    const bool glu = a.kind == kSwiglu;
    const int64_t in_cols = glu ? 2 * a.cols : a.cols;
    const int64_t out_cols = kBackward ? in_cols : a.cols;
    const size_t n = static_cast<size_t>(a.rows * out_cols);
    const bool fp8 = a.out_dtype == FP8AMP_DTYPE_E4M3 || a.out_dtype == FP8AMP_DTYPE_E5M2;
    // The BF16 vector kernels: BF16 x (and dy), 16-byte aligned; SwiGLU with whole groups per row;
    // fewer than 2^31 groups (stream_kernel's 32-bit group indices; SwiGLU's FastDiv).
    const size_t fwd_n = static_cast<size_t>(a.rows * a.cols);
    const size_t groups = glu ? fwd_n / kGroup : n / kGroup;
    const bool vec_in = a.x_dtype == FP8AMP_DTYPE_BF16 && aligned_to(a.x, 16) &&
                        (!kBackward || (a.dy_dtype == FP8AMP_DTYPE_BF16 && aligned_to(a.dy, 16))) &&
                        (!glu || a.cols % kGroup == 0) && groups < (size_t(1) << 31);
    const FastDiv row_div = make_fastdiv(glu ? static_cast<uint32_t>(a.cols / kGroup > 0 ? a.cols / kGroup : 1) : 1u);
    auto launch_generic = [&](auto kernel) {
        kernel<<<persistent_grid(device, kernel, (n + 3) / 4), kThreads, 0, stream>>>(a);
        check_launch("activation_kernel");
    };
    // max_shared: the pipeline's ring (up to 32 KB a block) or the forwards' table (16 KB) must not be
    // what limits the blocks per SM.
    auto launch_stream = [&](auto kernel, bool reverse, bool table) {
        kernel<<<persistent_grid(device, kernel, groups + 1, kPipeline || table), kThreads, 0, stream>>>(
            a, row_div, uint32_t(groups), uint64_t(glu ? fwd_n : n), reverse);
        check_launch("activation stream_kernel");
    };
    if (!fp8) {
        const size_t wide = a.out_dtype == FP8AMP_DTYPE_F32 ? 4 : 2;
        if (vec_in && aligned_to(a.out, 16) && (wide == 4 || a.out_dtype == FP8AMP_DTYPE_BF16 || a.out_dtype == FP8AMP_DTYPE_F16)) {
            dispatch_kind(a.kind, [&](auto k) {
                constexpr int K = decltype(k)::value;
                launch_stream(stream_kernel<K, kBackward, kOutWide, FP8AMP_DTYPE_E4M3>, false,
                              stream_table<K, kBackward, kOutWide>());
            });
        } else {
            launch_generic(activation_generic_kernel<FP8AMP_DTYPE_F32, true, kBackward>);
        }
        return;
    }
    const bool vec_out = vec_in && aligned_to(a.out, 8);
    auto run_fp8 = [&](auto dd) {
        constexpr fp8amp_dtype D = decltype(dd)::value;
        if (a.target.current) {
            check(cudaMemsetAsync(&a.target.meta->amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
            if (vec_in) {
                dispatch_kind(a.kind, [&](auto k) {
                    constexpr int K = decltype(k)::value;
                    launch_stream(stream_kernel<K, kBackward, kOutAmax, D>, false, stream_table<K, kBackward, kOutAmax>());
                });
            } else {
                launch_generic(activation_generic_kernel<D, false, kBackward>);
            }
        }
        if (a.out_t && vec_in) {  // the fused transpose (any shape; the fast tiles where aligned)
            // Fast tiles: rows of whole 16-byte loads and 8-byte stores (cols % 8; SwiGLU's vec_in
            // already asks it), 4-byte y_t pieces (rows % 4).
            const bool fast = vec_out && aligned_to(a.out_t, 4) && a.rows % 4 == 0 && a.cols % kGroup == 0;
            dispatch_kind(a.kind, [&](auto k) {
                const auto kernel = tile_kernel<decltype(k)::value, kBackward, D>;
                const size_t tiles = size_t((a.rows + kTileDim - 1) / kTileDim) *
                                     size_t(((glu && kBackward ? a.cols : out_cols) + kTileDim - 1) / kTileDim) *
                                     (glu && kBackward ? 2 : 1);
                const uint32_t tiles_c = uint32_t(((glu && kBackward ? a.cols : out_cols) + kTileDim - 1) / kTileDim);
                constexpr bool kRing = tile_ring<decltype(k)::value, kBackward>();  // max_shared: its ring
                kernel<<<persistent_grid(device, kernel, tiles * kThreads, kRing), kThreads, 0, stream>>>(
                    a, fast, bool(a.target.current), make_fastdiv(tiles_c > 0 ? tiles_c : 1u));
                check_launch("activation tile_kernel");
            });
            return;
        }
        if (vec_out) {
            dispatch_kind(a.kind, [&](auto k) {
                constexpr int K = decltype(k)::value;
                launch_stream(stream_kernel<K, kBackward, kOutFp8, D>, a.target.current, stream_table<K, kBackward, kOutFp8>());
            });
        } else {
            launch_generic(activation_generic_kernel<D, true, kBackward>);
        }
        if (a.out_t) transpose_bytes(device, stream_raw, a.out, a.out_t, static_cast<size_t>(a.rows), static_cast<size_t>(out_cols));
    };
    if (a.out_dtype == FP8AMP_DTYPE_E4M3) run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E4M3>());
    else run_fp8(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_E5M2>());
}

}  // namespace

void activation_prepare(int device) {
    // At every context's creation, not once a process per device: a device's module globals live as
    // long as its primary context, and a cudaDeviceReset (by the host framework, say) would leave a
    // later context reading zeros -- wrong activations, silently. 32 KB, once a context. Writing the
    // same bytes while another context's kernel reads them changes nothing it can see.
    static const std::vector<float> host = [] {
        std::vector<float> v(2 * act::table::kEntries);
        cpu::activation_table(kGeluTanh, v.data());
        cpu::activation_table(kSilu, v.data() + act::table::kEntries);
        return v;
    }();
    DeviceGuard guard(device);
    check(cudaMemcpyToSymbol(g_act_table, host.data(), host.size() * sizeof(float)), "cudaMemcpyToSymbol (activation tables)");
}

void activation_forward(int device, void *stream, const ActivationArgs &a) { run<false>(device, stream, a); }
void activation_backward(int device, void *stream, const ActivationArgs &a) { run<true>(device, stream, a); }

}  // namespace fp8amp::kernels::cuda
