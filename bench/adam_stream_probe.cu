// What access pattern lets DRAM serve the O2 Adam update's byte mix at copy speed? The update reads,
// per element, 2 B of BF16 weight, 1 B of E4M3 gradient, 1 B of E4M3 m and 2 B of F16 v, and writes
// the weight, m and v back in place (11 B; docs/performance.md, "Adam", second round: the fast
// kernel moves exactly these bytes yet reaches only ~83% of copy, waiting on memory).
// This probe moves the same bytes with no arithmetic (the stores are XORs of the loads) and varies
// one thing at a time:
//   EPL      elements per lane per iteration: 8 (the kernel's: runs of 256-512 B per warp and
//            array), 16 or 32 (runs of 0.5-2 KB), all loads of an iteration issued together;
//   layout   "warp": each warp streams its own contiguous range (the kernel's), "grid": iteration i
//            of warp w takes chunk i * warps + w (all warps side by side, as a copy kernel);
//   spin     a dependent chain of `spin` FMAs per iteration between the loads and the stores, a
//            stand-in for the kernel's ~550 instructions per iteration (0: pure streaming);
//   ctas     CTAs of 256 threads per SM (3: the kernel's 24 warps; 8: 64 warps);
//   bulk     inputs through cp.async.bulk into shared memory, G = 2, 4, 8 iterations per copy (runs
//            of 0.5-4 KB per warp and array) with the next group in flight: the form a kernel with
//            long runs but no more registers would take.
//   work     the stand-in as the kernel's arithmetic is instead: `work` FMAs per lane and iteration in
//            eight independent chains (issue-bound, as the update's ~600 instructions per warp
//            iteration are), with the probe's loads and stores either streaming (ld/st.cs) or the
//            kernel's O2 policy (ld.global.nc.L1::no_allocate, st.global.wb).
//   check    the gradient check's read alone: the 1-byte gradients read once (16 B per lane and
//            load, L loads in flight per lane), each warp its own range front to back or in 4 KB
//            runs back to front (the O2 kernel's order), or grid-stride: how fast the check phase
//            could read (it takes ~104 us for 268 MB in the kernel, launch and grid sync included).
//   linger   whether gradients loaded at the L2 evict-last priority (to keep them for the update)
//            keep that priority after the update's evict-first read, and so crowd the L2 for the
//            kernels after the step: the time of re-reading 24 MB that should fit in L2, after
//            (a) the gradients read at normal or evict-last priority, (b) read again evict-first,
//            with or without applypriority.L2::evict_normal, or not at all.
// Prints GB/s (bytes read + written, as bench_adam.py counts them) and the fraction of a
// device-to-device copy of 2 GiB measured in the same run (bench_adam.py's ceiling).
// Build: nvcc -O3 -arch=sm_90 -std=c++17 bench/adam_stream_probe.cu -o adam_stream_probe
// Run:   ./adam_stream_probe [log2 elements, default 28]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            return 2;                                                                     \
        }                                                                                 \
    } while (0)

// BYTES bytes at p (16-byte aligned when BYTES >= 16, else BYTES-aligned) as 32-bit words.
// POLICY false: ld/st.global.cs (streaming); true: the Adam kernel's O2 policy (ld.global.nc
// without L1 allocation, write-back stores).
template <int BYTES> struct alignas(BYTES >= 16 ? 16 : BYTES) Words {
    uint32_t w[BYTES / 4];
};
template <bool POLICY, class T>
__device__ __forceinline__ T ld(const T *p) {
    if constexpr (!POLICY) {
        return __ldcs(p);
    } else if constexpr (sizeof(T) == 8) {
        T q;
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(q.x), "=r"(q.y) : "l"(p));
        return q;
    } else {
        T q;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "l"(p));
        return q;
    }
}
template <bool POLICY, class T>
__device__ __forceinline__ void st(T *p, T v) {
    if constexpr (POLICY) __stwb(p, v);
    else __stcs(p, v);
}
template <int BYTES, bool POLICY = false>
__device__ __forceinline__ Words<BYTES> load(const uint8_t *p) {
    Words<BYTES> r;
    if constexpr (BYTES == 8) {
        const uint2 q = ld<POLICY>(reinterpret_cast<const uint2 *>(p));
        r.w[0] = q.x, r.w[1] = q.y;
    } else {
#pragma unroll
        for (int k = 0; k < BYTES / 16; ++k) {
            const uint4 q = ld<POLICY>(reinterpret_cast<const uint4 *>(p) + k);
            r.w[4 * k] = q.x, r.w[4 * k + 1] = q.y, r.w[4 * k + 2] = q.z, r.w[4 * k + 3] = q.w;
        }
    }
    return r;
}
template <int BYTES, bool POLICY = false>
__device__ __forceinline__ void store(uint8_t *p, const Words<BYTES> &r) {
    if constexpr (BYTES == 8) {
        st<POLICY>(reinterpret_cast<uint2 *>(p), make_uint2(r.w[0], r.w[1]));
    } else {
#pragma unroll
        for (int k = 0; k < BYTES / 16; ++k)
            st<POLICY>(reinterpret_cast<uint4 *>(p) + k, make_uint4(r.w[4 * k], r.w[4 * k + 1], r.w[4 * k + 2], r.w[4 * k + 3]));
    }
}

// The stores of a lane's EPL elements, written back from the loaded words: m ^= g ^ t, the weight
// and v from those (t, 0 or 1, comes from the arithmetic, so the stores wait for it).
template <int EPL, bool POLICY = false>
__device__ __forceinline__ void store_mixed(uint8_t *w, uint8_t *m, uint8_t *v, int64_t e, const Words<EPL> &gg,
                                            Words<2 * EPL> ww, Words<EPL> mm, Words<2 * EPL> vv, uint32_t t) {
#pragma unroll
    for (int k = 0; k < EPL / 4; ++k) {
        mm.w[k] ^= gg.w[k] ^ t;
        ww.w[2 * k] ^= gg.w[k], ww.w[2 * k + 1] ^= mm.w[k];
        vv.w[2 * k] ^= ww.w[2 * k], vv.w[2 * k + 1] ^= ww.w[2 * k + 1];
    }
    store<2 * EPL, POLICY>(w + 2 * e, ww);
    store<EPL, POLICY>(m + e, mm);
    store<2 * EPL, POLICY>(v + 2 * e, vv);
}

template <int EPL, bool GRID>
__global__ void __launch_bounds__(256) mix(const uint8_t *g, uint8_t *w, uint8_t *m, uint8_t *v, int64_t n, int spin,
                                           float *sink) {
    constexpr int64_t kChunk = 32 * EPL;  // elements per warp iteration
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    const int64_t chunks = n / kChunk;
    const int64_t begin = GRID ? warp : chunks * warp / warps;
    const int64_t end = GRID ? chunks : chunks * (warp + 1) / warps;
    const int64_t step = GRID ? warps : 1;
    float acc = float(lane);
    for (int64_t c = begin; c < end; c += step) {
        const int64_t e = c * kChunk + int64_t(lane) * EPL;
        const Words<EPL> gg = load<EPL>(g + e);
        Words<2 * EPL> ww = load<2 * EPL>(w + 2 * e);
        Words<EPL> mm = load<EPL>(m + e);
        Words<2 * EPL> vv = load<2 * EPL>(v + 2 * e);
        // the chain starts from a loaded value, so it runs after the loads arrive, as the update does
        float x = __uint_as_float((gg.w[0] & 0x007FFFFFu) | 0x3F800000u);
#pragma unroll 4
        for (int i = 0; i < spin; ++i) x = __fmaf_rn(x, 0.999999f, 1e-7f);
        acc += x;
        store_mixed<EPL>(w, m, v, e, gg, ww, mm, vv, __float_as_uint(x) & 0x1u);  // after the chain
    }
    if (acc == 12345.0f) *sink = acc;  // never true; keeps the chain alive
}

// The update's shape with issue-bound arithmetic: 8 elements per lane, each warp its own range, `work`
// FMAs per lane in eight chains seeded by the loaded words; the stores depend on all of them.
// POLICY: as load / store. EXTRA, the kernel's other per-iteration work, bits: 1 each half-warp loads
// its block's two 4-byte scales (ms, vs: one float per 128 elements), 2 the half's first lane stores
// two new ones, 4 two half-warp max reductions (the blocks' amax) that the stores wait for, 8 the new
// scales staged in shared memory and stored 64 bytes per array every 8 iterations instead, 16 the same
// stored per whole 128-byte line of the scale arrays, 32 the single-lane stores into 4 KB only (L2-resident),
// 64 the scales loaded per 128-byte line (one float per lane) and taken by shuffles.
template <bool POLICY, int EXTRA = 0>
__global__ void __launch_bounds__(256) mix_work(const uint8_t *g, uint8_t *w, uint8_t *m, uint8_t *v, int64_t n, int work,
                                                float *sink, float *ms = nullptr, float *vs = nullptr) {
    constexpr int64_t kChunk = 256;
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    const int64_t chunks = n / kChunk;
    const int64_t begin = chunks * warp / warps, end = chunks * (warp + 1) / warps;
    __shared__ float st_m[8][32], st_v[8][32];  // EXTRA & 8, 16: each warp's staged scales
    const int wib = threadIdx.x / 32;
    int64_t gstart = 2 * begin;  // EXTRA & 16: the first block not yet stored
    float lm = 0.0f, lv = 0.0f;   // EXTRA & 64: this lane's scales of the current line
    float acc = 0.0f;
    for (int64_t c = begin; c < end; ++c) {
        const int64_t e = c * kChunk + int64_t(lane) * 8;
        const Words<8> gg = load<8, POLICY>(g + e);
        Words<16> ww = load<16, POLICY>(w + 2 * e);
        Words<8> mm = load<8, POLICY>(m + e);
        Words<16> vv = load<16, POLICY>(v + 2 * e);
        const uint32_t seed[8] = {gg.w[0], gg.w[1], ww.w[0], ww.w[1], ww.w[2], ww.w[3], mm.w[0], vv.w[0]};
        float x[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = __uint_as_float((seed[j] & 0x007FFFFFu) | 0x3F800000u);
        for (int i = 0; i < work / 8; ++i) {
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = __fmaf_rn(x[j], 0.999999f, 1e-7f);
        }
        uint32_t t = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) t ^= __float_as_uint(x[j]) & 0x1u, acc += x[j];
        const int64_t blk = 2 * c + (lane >= 16 ? 1 : 0);
        if (EXTRA & 1) t ^= (__float_as_uint(ms[blk]) ^ __float_as_uint(vs[blk])) & 0x1u;
        if (EXTRA & 64) {  // loads staged per 128-byte line: lane i holds block (line + i)'s scales
            if (c == begin || ((2 * c) & 31) == 0) {
                const int64_t line = (2 * c) & ~int64_t(31), lb = line + lane;
                lm = lb >= 2 * begin && lb < 2 * end ? ms[lb] : 0.0f;
                lv = lb >= 2 * begin && lb < 2 * end ? vs[lb] : 0.0f;
            }
            const int src = int(blk & 31);
            t ^= (__float_as_uint(__shfl_sync(0xFFFFFFFFu, lm, src)) ^ __float_as_uint(__shfl_sync(0xFFFFFFFFu, lv, src))) & 0x1u;
        }
        if (EXTRA & 4) {
            uint32_t a0 = __float_as_uint(x[0]), a1 = __float_as_uint(x[1]);
#pragma unroll
            for (int d = 8; d >= 1; d /= 2) a0 = max(a0, __shfl_xor_sync(0xFFFFFFFFu, a0, d)), a1 = max(a1, __shfl_xor_sync(0xFFFFFFFFu, a1, d));
            t ^= (a0 ^ a1) & 0x1u;
        }
        if ((EXTRA & 2) && (lane & 15) == 0) ms[blk] = x[0], vs[blk] = x[1];
        if ((EXTRA & 32) && (lane & 15) == 0) ms[blk & 1023] = x[0], vs[blk & 1023] = x[1];  // 4 KB: stays in L2
        if (EXTRA & 8) {  // staged: the half's first lane writes shared memory; 64 bytes per array every 8 iterations
            const int slot = int((c - begin) & 7) * 2 + (lane >= 16 ? 1 : 0);
            if ((lane & 15) == 0) st_m[wib][slot] = x[0], st_v[wib][slot] = x[1];
            if (((c - begin) & 7) == 7 || c + 1 == end) {
                __syncwarp();
                const int64_t first = 2 * (c - ((c - begin) & 7));
                const int count = 2 * int(((c - begin) & 7) + 1);
                if (lane < count) ms[first + lane] = st_m[wib][lane], vs[first + lane] = st_v[wib][lane];
                __syncwarp();
            }
        }
        if (EXTRA & 16) {  // staged, flushed per 128-byte line of the scale arrays (32 blocks): whole lines
            const int64_t b0 = 2 * c, b1 = b0 + 2;  // this iteration's blocks [b0, b1)
            if ((lane & 15) == 0) st_m[wib][(b0 + (lane >> 4)) & 31] = x[0], st_v[wib][(b0 + (lane >> 4)) & 31] = x[1];
            if ((b1 & 31) == 0 || c + 1 == end) {
                __syncwarp();
                if (lane < b1 - gstart) ms[gstart + lane] = st_m[wib][(gstart + lane) & 31], vs[gstart + lane] = st_v[wib][(gstart + lane) & 31];
                __syncwarp();
                gstart = b1;
            }
        }
        store_mixed<8, POLICY>(w, m, v, e, gg, ww, mm, vv, t);
    }
    if (acc == 12345.0f) *sink = acc;
}

// The EXTRA combinations main() times, and the launch of mix_work<true, EXTRA> for one of them.
template <int... E> struct Extras {
    static constexpr int list[sizeof...(E)] = {E...};
    static void launch(int extra, dim3 grid, dim3 block, const uint8_t *g, uint8_t *w, uint8_t *m, uint8_t *v, int64_t n,
                       int work, float *sink, float *ms, float *vs) {
        ((extra == E ? (void)mix_work<true, E><<<grid, block>>>(g, w, m, v, n, work, sink, ms, vs) : (void)0), ...);
    }
};
using ProbeExtras = Extras<0, 1, 2, 3, 4, 7, 8, 9, 13, 16, 17, 21, 32, 64, 80, 84>;

// The check's read: n bytes of gradients, L 16-byte loads per lane in flight; MODE 0: each warp its
// range front to back, 1: the same range in runs of 4 KB from the last to the first, 2: grid-stride.
template <int L, int MODE>
__global__ void __launch_bounds__(256) read_check(const uint8_t *g, int64_t n, float *sink) {
    constexpr int64_t kStep = 32 * 16;  // bytes per warp-wide load
    constexpr int64_t kIter = L * kStep;
    const int lane = threadIdx.x % 32;
    const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    const int64_t iters = n / kIter;
    uint32_t acc = 0;
    const auto body = [&](int64_t it) {
        uint4 b[L];
#pragma unroll
        for (int i = 0; i < L; ++i) b[i] = __ldcs(reinterpret_cast<const uint4 *>(g + it * kIter + i * kStep) + lane);
#pragma unroll
        for (int i = 0; i < L; ++i) acc += b[i].x ^ b[i].y ^ b[i].z ^ b[i].w;
    };
    if (MODE == 2) {
        for (int64_t it = warp; it < iters; it += warps) body(it);
    } else {
        const int64_t begin = iters * warp / warps, end = iters * (warp + 1) / warps;
        if (MODE == 0) {
            for (int64_t it = begin; it < end; ++it) body(it);
        } else {
            constexpr int64_t kRun = 4096 / kIter > 0 ? 4096 / kIter : 1;  // iterations per 4 KB run
            if (end > begin)
                for (int64_t rb = begin + (end - begin - 1) / kRun * kRun; rb >= begin; rb -= kRun)
                    for (int64_t it = rb; it < min(rb + kRun, end); ++it) body(it);
        }
    }
    if (acc == 0x12345678u) *sink = float(acc);
}

// A grid-stride read of n bytes (16 per lane and load) at an L2 priority. MODE 0: normal, 1: evict_last,
// 2: evict_first, 3: evict_first and then applypriority.L2::evict_normal on each 128-byte line.
template <int MODE>
__global__ void __launch_bounds__(256) read_prio(const uint8_t *p, int64_t n, float *sink) {
    const int64_t lanes = int64_t(gridDim.x) * blockDim.x;
    uint64_t pol = 0;
    if (MODE == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    if (MODE >= 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    uint32_t acc = 0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 16; i += lanes) {
        const uint8_t *a = p + 16 * i;
        uint4 q;
        if (MODE == 0)
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "l"(a));
        else
            asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                         : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                         : "l"(a), "l"(pol));
        if (MODE == 3 && (i % 8) == 0) asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(a) : "memory");
        acc += q.x ^ q.y ^ q.z ^ q.w;
    }
    if (acc == 0x12345678u) *sink = float(acc);
}

// The bulk-copy form: each warp streams its own range as "warp" does with 8 elements per lane, but
// its inputs arrive through cp.async.bulk (the Tensor Memory Accelerator's 1-D copies) into shared
// memory, G iterations per copy and array (runs of G x 256-512 B), two stages in turn: the next
// group's copies are in flight while this group is computed. Lane 0 issues the copies; an mbarrier
// per stage counts their bytes.
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
        "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int G>
__global__ void __launch_bounds__(256) mix_bulk(const uint8_t *g, uint8_t *w, uint8_t *m, uint8_t *v, int64_t n, int spin,
                                                float *sink) {
    constexpr int64_t kChunk = 256;             // elements per warp iteration (8 per lane)
    constexpr uint32_t kStage = G * kChunk * 6;  // bytes per stage: g 1, w 2, m 1, v 2 per element
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t bars[8][2];
    const int lane = threadIdx.x % 32, wi = threadIdx.x / 32;
    const int64_t warp = int64_t(blockIdx.x) * 8 + wi, warps = int64_t(gridDim.x) * 8;
    const int64_t chunks = n / kChunk;
    const int64_t begin = chunks * warp / warps, end = chunks * (warp + 1) / warps;
    const int64_t groups = (end - begin) / G;
    const uint32_t bar[2] = {smem_addr(&bars[wi][0]), smem_addr(&bars[wi][1])};
    if (lane == 0) {
        bar_init(bar[0]);
        bar_init(bar[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    const auto issue = [&](int s, int64_t k) {  // group k into stage s (lane 0)
        const int64_t e = (begin + k * G) * kChunk;
        const uint32_t d = smem_addr(smem + (wi * 2 + s) * kStage);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stage's last reads before the new writes
        bar_expect(bar[s], kStage);
        bulk_copy(d, g + e, G * kChunk, bar[s]);
        bulk_copy(d + G * kChunk, w + 2 * e, 2 * G * kChunk, bar[s]);
        bulk_copy(d + 3 * G * kChunk, m + e, G * kChunk, bar[s]);
        bulk_copy(d + 4 * G * kChunk, v + 2 * e, 2 * G * kChunk, bar[s]);
    };
    if (lane == 0) {
        if (groups > 0) issue(0, 0);
        if (groups > 1) issue(1, 1);
    }
    float acc = float(lane);
    for (int64_t k = 0; k < groups; ++k) {
        const int s = int(k & 1);
        bar_wait(bar[s], uint32_t((k >> 1) & 1));
        const uint8_t *sg = smem + (wi * 2 + s) * kStage, *sw = sg + G * kChunk, *sm = sg + 3 * G * kChunk, *sv = sg + 4 * G * kChunk;
#pragma unroll 1
        for (int it = 0; it < G; ++it) {
            const int64_t e = (begin + k * G + it) * kChunk + lane * 8;
            const int o = it * int(kChunk) + lane * 8;
            const Words<8> gg = *reinterpret_cast<const Words<8> *>(sg + o);
            const Words<16> ww = *reinterpret_cast<const Words<16> *>(sw + 2 * o);
            const Words<8> mm = *reinterpret_cast<const Words<8> *>(sm + o);
            const Words<16> vv = *reinterpret_cast<const Words<16> *>(sv + 2 * o);
            float x = __uint_as_float((gg.w[0] & 0x007FFFFFu) | 0x3F800000u);
#pragma unroll 4
            for (int i = 0; i < spin; ++i) x = __fmaf_rn(x, 0.999999f, 1e-7f);
            acc += x;
            store_mixed<8>(w, m, v, e, gg, ww, mm, vv, __float_as_uint(x) & 0x1u);
        }
        __syncwarp();  // every lane has read the stage
        if (lane == 0 && k + 2 < groups) issue(s, k + 2);
    }
    for (int64_t c = begin + groups * G; c < end; ++c) {  // the range's last chunks, loaded directly
        const int64_t e = c * kChunk + lane * 8;
        store_mixed<8>(w, m, v, e, load<8>(g + e), load<16>(w + 2 * e), load<8>(m + e), load<16>(v + 2 * e), 0u);
    }
    if (acc == 12345.0f) *sink = acc;
}

template <class F>
float time_ms(F &&launch, cudaEvent_t a, cudaEvent_t b) {
    for (int i = 0; i < 2; ++i) launch();
    std::vector<float> t;
    for (int i = 0; i < 9; ++i) {
        cudaEventRecord(a);
        launch();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    const int log2n = argc > 1 ? std::atoi(argv[1]) : 28;
    const int64_t n = int64_t(1) << log2n;
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    uint8_t *g, *w, *m, *v, *src, *dst;
    float *sink;
    CHECK(cudaMalloc(&g, n));
    CHECK(cudaMalloc(&w, 2 * n));
    CHECK(cudaMalloc(&m, n));
    CHECK(cudaMalloc(&v, 2 * n));
    CHECK(cudaMalloc(&sink, sizeof(float)));
    CHECK(cudaMemset(g, 0x35, n));
    CHECK(cudaMemset(w, 0x3C, 2 * n));
    CHECK(cudaMemset(m, 0x21, n));
    CHECK(cudaMemset(v, 0x1A, 2 * n));
    const size_t copy_bytes = size_t(2) << 30;
    CHECK(cudaMalloc(&src, copy_bytes));
    CHECK(cudaMalloc(&dst, copy_bytes));
    CHECK(cudaMemset(src, 0x5A, copy_bytes));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const float copy_ms = time_ms([&] { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); }, a, b);
    const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    std::printf("{\"device\": \"%s\", \"elements\": %lld, \"bytes_per_element\": 11, \"copy_GB_per_s\": %.1f, \"rows\": [\n",
                prop.name, (long long)n, copy_gbs);
    const double bytes = 11.0 * double(n);
    bool first = true;
    for (int ctas : {3, 8}) {
        for (int spin : {0, 100, 300}) {
            for (int layout = 0; layout < 2; ++layout) {
                for (int epl : {8, 16, 32}) {
                    const dim3 grid(ctas * sms), block(256);
                    auto launch = [&] {
                        const bool gr = layout == 1;
                        if (epl == 8) gr ? mix<8, true><<<grid, block>>>(g, w, m, v, n, spin, sink)
                                         : mix<8, false><<<grid, block>>>(g, w, m, v, n, spin, sink);
                        else if (epl == 16) gr ? mix<16, true><<<grid, block>>>(g, w, m, v, n, spin, sink)
                                               : mix<16, false><<<grid, block>>>(g, w, m, v, n, spin, sink);
                        else gr ? mix<32, true><<<grid, block>>>(g, w, m, v, n, spin, sink)
                                : mix<32, false><<<grid, block>>>(g, w, m, v, n, spin, sink);
                    };
                    const float ms = time_ms(launch, a, b);
                    CHECK(cudaGetLastError());
                    const double gbs = bytes / (ms * 1e-3) / 1e9;
                    std::printf("%s  {\"ctas_per_sm\": %d, \"spin\": %d, \"layout\": \"%s\", \"elements_per_lane\": %d, "
                                "\"ms\": %.4f, \"GB_per_s\": %.1f, \"fraction_of_copy\": %.4f}",
                                first ? "" : ",\n", ctas, spin, layout ? "grid" : "warp", epl, ms, gbs, gbs / copy_gbs);
                    first = false;
                    std::fflush(stdout);
                }
            }
        }
    }
    // The bulk-copy form: G iterations per copy, as many CTAs per SM as its shared memory allows.
    for (int gsz : {2, 4, 8}) {
        const int smem = 8 * 2 * gsz * 256 * 6;
        const void *fn = gsz == 2 ? (const void *)mix_bulk<2> : gsz == 4 ? (const void *)mix_bulk<4> : (const void *)mix_bulk<8>;
        CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int per_sm = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, smem));
        const int ctas = std::min(per_sm, 3);
        if (ctas == 0) continue;
        for (int spin : {0, 100, 300}) {
            const dim3 grid(ctas * sms), block(256);
            auto launch = [&] {
                if (gsz == 2) mix_bulk<2><<<grid, block, smem>>>(g, w, m, v, n, spin, sink);
                else if (gsz == 4) mix_bulk<4><<<grid, block, smem>>>(g, w, m, v, n, spin, sink);
                else mix_bulk<8><<<grid, block, smem>>>(g, w, m, v, n, spin, sink);
            };
            const float ms = time_ms(launch, a, b);
            CHECK(cudaGetLastError());
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            std::printf(",\n  {\"ctas_per_sm\": %d, \"spin\": %d, \"layout\": \"warp, bulk copies of %d iterations\", "
                        "\"elements_per_lane\": 8, \"ms\": %.4f, \"GB_per_s\": %.1f, \"fraction_of_copy\": %.4f}",
                        ctas, spin, gsz, ms, gbs, gbs / copy_gbs);
            std::fflush(stdout);
        }
    }
    // Issue-bound arithmetic in place of the latency stand-in, 3 CTAs per SM (the kernel's).
    for (int policy = 0; policy < 2; ++policy) {
        for (int work : {0, 256, 512, 768, 1024}) {
            const dim3 grid(3 * sms), block(256);
            auto launch = [&] {
                if (policy) mix_work<true><<<grid, block>>>(g, w, m, v, n, work, sink);
                else mix_work<false><<<grid, block>>>(g, w, m, v, n, work, sink);
            };
            const float ms = time_ms(launch, a, b);
            CHECK(cudaGetLastError());
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            std::printf(",\n  {\"ctas_per_sm\": 3, \"work_fma_per_lane\": %d, \"layout\": \"warp\", \"cache\": \"%s\", "
                        "\"elements_per_lane\": 8, \"ms\": %.4f, \"GB_per_s\": %.1f, \"fraction_of_copy\": %.4f}",
                        work, policy ? "nc.L1::no_allocate + wb" : "cs", ms, gbs, gbs / copy_gbs);
            std::fflush(stdout);
        }
    }
    // The kernel's other per-iteration work added to the O2 cache policy's rows (mix_work's EXTRA):
    // block-scale loads, single-lane scale stores, half-warp amax reductions, and staged forms of the
    // scale accesses (cudaMalloc's alignment makes block index multiples of 32 start a 128-byte line).
    // Bytes: 11 per element plus the scales' 2 x 4 per 128 elements read and/or written.
    {
        float *ms, *vs;
        CHECK(cudaMalloc(&ms, n / 128 * sizeof(float)));
        CHECK(cudaMalloc(&vs, n / 128 * sizeof(float)));
        CHECK(cudaMemset(ms, 0x3F, n / 128 * sizeof(float)));
        CHECK(cudaMemset(vs, 0x3F, n / 128 * sizeof(float)));
        for (int extra : ProbeExtras::list) {
            for (int work : {0, 512}) {
                const dim3 grid(3 * sms), block(256);
                auto launch = [&] { ProbeExtras::launch(extra, grid, block, g, w, m, v, n, work, sink, ms, vs); };
                const float ms_t = time_ms(launch, a, b);
                CHECK(cudaGetLastError());
                const double extra_bytes = double(n) / 128 * 8 * (((extra & 65) ? 1 : 0) + ((extra & 26) ? 1 : 0));
                const double gbs = (bytes + extra_bytes) / (ms_t * 1e-3) / 1e9;
                std::printf(",\n  {\"ctas_per_sm\": 3, \"work_fma_per_lane\": %d, \"cache\": \"nc.L1::no_allocate + wb\", "
                            "\"extra\": \"%s%s%s%s\", \"ms\": %.4f, \"GB_per_s\": %.1f, \"fraction_of_copy\": %.4f}",
                            work, (extra & 1) ? "scale loads " : (extra & 64) ? "scale loads per 128-byte line " : "",
                            (extra & 2) ? "scale stores " : "",
                            (extra & 8) ? "scale stores staged by 8 iterations " : (extra & 16) ? "scale stores staged by 128-byte lines "
                                            : (extra & 32) ? "scale stores into 4 KB " : "",
                            (extra & 4) ? "half-warp amax" : (extra ? "" : "none"), ms_t, gbs, gbs / copy_gbs);
                std::fflush(stdout);
            }
        }
        CHECK(cudaFree(ms));
        CHECK(cudaFree(vs));
    }
    // The check's read alone, 3 CTAs per SM; GB/s of the gradients' bytes (n), against the copy.
    for (int mode = 0; mode < 3; ++mode) {
        for (int loads : {4, 8}) {
            const dim3 grid(3 * sms), block(256);
            auto launch = [&] {
                if (loads == 4) mode == 0 ? read_check<4, 0><<<grid, block>>>(g, n, sink)
                                : mode == 1 ? read_check<4, 1><<<grid, block>>>(g, n, sink)
                                            : read_check<4, 2><<<grid, block>>>(g, n, sink);
                else mode == 0 ? read_check<8, 0><<<grid, block>>>(g, n, sink)
                     : mode == 1 ? read_check<8, 1><<<grid, block>>>(g, n, sink)
                                 : read_check<8, 2><<<grid, block>>>(g, n, sink);
            };
            const float ms = time_ms(launch, a, b);
            CHECK(cudaGetLastError());
            const double gbs = double(n) / (ms * 1e-3) / 1e9;
            std::printf(",\n  {\"ctas_per_sm\": 3, \"check_read\": \"%s\", \"loads_per_lane\": %d, \"ms\": %.4f, "
                        "\"GB_per_s\": %.1f, \"fraction_of_copy\": %.4f}",
                        mode == 0 ? "warp range, forward" : mode == 1 ? "warp range, 4 KB runs back to front" : "grid-stride",
                        loads, ms, gbs, gbs / copy_gbs);
            std::fflush(stdout);
        }
    }
    // L2 priority lingering. X: 24 MB (within the 50 MB L2), read once to warm it, then timed.
    {
        const int64_t xn = int64_t(24) << 20;
        const dim3 grid(4 * sms), block(256);
        const auto read = [&](int mode, const uint8_t *p, int64_t bytes) {
            if (mode == 0) read_prio<0><<<grid, block>>>(p, bytes, sink);
            else if (mode == 1) read_prio<1><<<grid, block>>>(p, bytes, sink);
            else if (mode == 2) read_prio<2><<<grid, block>>>(p, bytes, sink);
            else read_prio<3><<<grid, block>>>(p, bytes, sink);
        };
        struct Case { const char *name; int first, second; };  // second < 0: no second read
        const Case cases[] = {{"normal, then evict_first", 0, 2},
                              {"evict_last, no second read", 1, -1},
                              {"evict_last, then evict_first", 1, 2},
                              {"evict_last, then evict_first + applypriority evict_normal", 1, 3}};
        for (const Case &cs : cases) {
            std::vector<float> t;
            for (int rep = 0; rep < 5; ++rep) {
                CHECK(cudaCtxResetPersistingL2Cache());   // every line back to normal
                read(0, w, 2 * n);                         // fill L2 with other data
                read(cs.first, g, n);                      // the check's read of the gradients
                if (cs.second >= 0) read(cs.second, g, n);  // the update's
                read(0, v, xn);                            // warm X
                cudaEventRecord(a);
                read(0, v, xn);                            // X again: from L2 if it has room
                cudaEventRecord(b);
                CHECK(cudaEventSynchronize(b));
                float ms = 0.0f;
                cudaEventElapsedTime(&ms, a, b);
                t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            CHECK(cudaGetLastError());
            std::printf(",\n  {\"linger\": \"%s\", \"reread_24MB_us\": %.2f, \"GB_per_s\": %.1f}", cs.name,
                        t[2] * 1e3, double(xn) / (t[2] * 1e-3) / 1e9);
            std::fflush(stdout);
        }
        CHECK(cudaCtxResetPersistingL2Cache());
    }
    std::printf("\n]}\n");
    CHECK(cudaDeviceSynchronize());
    return 0;
}
