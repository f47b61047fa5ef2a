// What the scaled casting kernels share (quantize.cu's FP8 kernels and quantize_f16.cu's scaled-F16
// ones): the pack type, the block reduction, the per-thread tally and the per-block epilogue that
// publishes amax, statistics and the scale_inv used, and the launch helpers (a persistent grid sized
// by each kernel's own occupancy, asked once; compile-time dispatch over dtypes and flags).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda_common.cuh"
#include "scaling.hpp"

namespace fp8amp::kernels::cuda::casting {

constexpr int kThreads = 256;  // threads per block of every casting kernel

template <class T, int N>
struct alignas(sizeof(T) * N) PackN {
    T v[N];
};

// The FP8 fast path's conversions, shared by quantize.cu and the fused activations: satfinite pairs
// (a non-NaN never becomes a NaN code; a NaN's code is left to the callers' NaN handling).
template <fp8amp_dtype D>
__device__ __forceinline__ uint16_t fp8x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, D == FP8AMP_DTYPE_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// 4 values into 4 FP8 codes (a in the low byte), the same bits as fp8x2 twice: two paired satfinite
// conversions whose halves the hardware merges into one register (F2FP ... MERGE_C), where building
// the word from two 16-bit results in C++ cost a PRMT and a MOV per word.
template <fp8amp_dtype D>
__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
    uint32_t w;
    if constexpr (D == FP8AMP_DTYPE_E4M3) {
        asm("{\n\t.reg .b16 lo, hi;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
            "mov.b32 %0, {lo, hi};\n\t}"
            : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
    } else {
        asm("{\n\t.reg .b16 lo, hi;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\t"
            "mov.b32 %0, {lo, hi};\n\t}"
            : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
    }
    return w;
}

// Half the smallest subnormal of D: |y| at or below it rounds to zero.
template <fp8amp_dtype D>
__device__ __forceinline__ float underflow_limit() {
    return D == FP8AMP_DTYPE_E4M3 ? 0x1p-10f : 0x1p-17f;
}

// Block-wide reduction of one value; the result is valid in thread 0.
template <class Op>
__device__ __forceinline__ uint32_t block_reduce(uint32_t v, Op op) {
    __shared__ uint32_t warp_values[kThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // warp_values may still be read by a previous reduction
    if (lane == 0) warp_values[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < kThreads / 32 ? warp_values[lane] : 0u;
        for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
    }
    return v;
}

struct MaxOp {
    __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};
struct AddOp {
    __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a + b; }
};

// Per-thread accumulators of a quantize pass.
struct Tally {
    uint32_t amax = 0;
    uint32_t saturated = 0;
    uint32_t underflowed = 0;
};

// The scale a quantize uses: the meta's, or under current scaling the one its recorded amax (this
// tensor's, written by amax_kernel just before) gives.
__device__ __forceinline__ float quantize_scale(const ScalingState &m) {
    return m.current ? compute_scale(m, codec::bits_f32(m.amax_bits), m.scale) : m.scale;
}

// Folds a block's tally into the meta and, once per launch, publishes the scale_inv used.
template <bool kStats>
__device__ __forceinline__ void finish_block(Tally t, ScalingState *meta, float scale, float *scale_inv,
                                             float *scale_inv_t, size_t n) {
    const uint32_t amax = block_reduce(t.amax, MaxOp());
    uint32_t saturated = 0, underflowed = 0;
    if (kStats) {
        saturated = block_reduce(t.saturated, AddOp());
        underflowed = block_reduce(t.underflowed, AddOp());
    }
    if (threadIdx.x != 0) return;
    if (!meta->current) atomicMax(&meta->amax_bits, amax);
    if (kStats) {
        if (saturated) atomicAdd(&meta->saturated, static_cast<unsigned long long>(saturated));
        if (underflowed) atomicAdd(&meta->underflowed, static_cast<unsigned long long>(underflowed));
    }
    if (blockIdx.x == 0) {
        const float inv = meta->current ? 1.0f / scale : meta->scale_inv;
        if (meta->current) {
            // Every block computed this same scale from the same amax; only the value matters.
            meta->scale = scale;
            meta->scale_inv = inv;
        }
        if (kStats) atomicAdd(&meta->quantized, static_cast<unsigned long long>(n));
        *scale_inv = inv;
        if (scale_inv_t) *scale_inv_t = inv;
    }
}

// A persistent grid: as many blocks as can be resident at once (by the kernel's own occupancy, asked
// once: resident_blocks_per_sm; so a register-heavy variant never runs in two waves), or fewer when
// there is less work. max_shared: see resident_blocks_per_sm (the dequantize table).
template <class Kernel>
unsigned persistent_grid(int device, Kernel kernel, size_t work_items, bool max_shared = false) {
    const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void *>(kernel), device, kThreads, max_shared);
    const size_t wanted = (work_items + kThreads - 1) / kThreads;
    const size_t cap = size_t(multiprocessor_count(device)) * size_t(per_sm > 0 ? per_sm : 1);
    return static_cast<unsigned>(wanted == 0 ? 1 : (wanted < cap ? wanted : cap));
}

template <class F>
void dispatch_src(fp8amp_dtype s, F &&f) {
    switch (s) {
    case FP8AMP_DTYPE_F32: return f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F32>());
    case FP8AMP_DTYPE_F16: return f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_F16>());
    case FP8AMP_DTYPE_BF16: return f(std::integral_constant<fp8amp_dtype, FP8AMP_DTYPE_BF16>());
    default: fail(FP8AMP_ERROR_INTERNAL, "casting: a dtype that must be F32/F16/BF16 is not");
    }
}

template <class F>
void dispatch_bool(bool b, F &&f) {
    if (b) return f(std::true_type());
    f(std::false_type());
}

}  // namespace fp8amp::kernels::cuda::casting
