// libFuzzer target: the whole C API under hostile arguments.
//
// The input is decoded into a sequence of calls (contexts, tensors, casts, quantize, scaling metas,
// Linear, optimizer, grad scaler, DLPack export, allocator hooks, constant getters, the fused norm and
// activation forwards and backwards, an optimizer's state as tensors) whose arguments
// are drawn hostile: NULL, destroyed handles, handles of another kind, forged handle values and
// pointers that are not handles, negative/overflowing shapes, bad ndim, bad struct_size,
// out-of-range enums, NaN/inf hyperparameters, misaligned or short buffers, failing allocators.
//
// Oracle, after every call: a failing call returns a specific status (never INTERNAL) and sets a new
// message of its own (the message is poisoned before each call), and leaves its outputs as they were
// (they are poisoned before the call); a call with a certainly-invalid argument does not succeed; no
// crash and no sanitizer report. The fused norm and activation calls also write none of their
// outputs' bytes when they fail, and a y_t (dx_t) they write is y (dx) transposed byte for byte. A
// failed fp8amp_optimizer_set_param_state leaves the optimizer's checkpoint bytes as they were, and
// so does writing back the state fp8amp_optimizer_param_state read. At the end of each input
// everything is destroyed: LeakSanitizer then sees any leak, and the allocator hooks must have got
// back every byte they gave.
//
// FP8AMP_FUZZ_SKIP (environment; comma-separated words) turns generators off, to fuzz on past a
// known finding in a local run (docs/fuzzing.md): enums (out-of-range enum values), misaligned_alloc
// (hooks returning memory aligned to less than 256 bytes), failing_alloc (hooks that fail),
// step_lr_inf (a step's lr of -inf).
#include <fuzzer/FuzzedDataProvider.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fp8amp/dlpack.h"
#include "fuzz_common.hpp"

extern "C" {  // fuzz_capi_shim.c
fp8amp_status fuzz_context_create(int type, int32_t index, fp8amp_context *out);
fp8amp_status fuzz_tensor_create(fp8amp_context ctx, int dtype, int32_t ndim, const int64_t *shape, fp8amp_tensor *out);
fp8amp_status fuzz_tensor_wrap(fp8amp_context ctx, int dtype, int32_t ndim, const int64_t *shape, void *data,
                               fp8amp_tensor *out);
fp8amp_status fuzz_scaling_create(fp8amp_context ctx, const fp8amp_recipe *recipe, int dtype, fp8amp_scaling *out);
fp8amp_status fuzz_linear_scaling(fp8amp_linear lin, int role, fp8amp_scaling *out);
fp8amp_status fuzz_device_count(int type, int32_t *count);
size_t fuzz_dtype_size(int dtype);
const char *fuzz_dtype_name(int dtype);
const char *fuzz_status_name(int status);
fp8amp_status fuzz_opt_level_adam_config(int level, fp8amp_adam_desc *desc);
fp8amp_status fuzz_opt_level_config(int level, fp8amp_linear_desc *ld, fp8amp_adam_desc *ad);
fp8amp_status fuzz_activation_forward(fp8amp_context ctx, int kind, fp8amp_tensor x, fp8amp_tensor y, fp8amp_tensor y_t);
fp8amp_status fuzz_activation_backward(fp8amp_context ctx, int kind, fp8amp_tensor dy, fp8amp_tensor x, fp8amp_tensor dx,
                                       fp8amp_tensor dx_t);
}

namespace {

// The sizes fp8amp 0.1.0 gave the option structs (docs/api.md 1.6: recipe, linear desc, adam desc,
// step args, grad scaler desc), the oracle's own copy of the contract: every later library accepts
// them, so a struct_size below this header's sizeof is refused unless it is the 0.1.0 size (only the
// adam desc has grown so far; the rule holds for each struct the day it grows).
constexpr uint32_t kSize010Recipe = 32, kSize010LinearDesc = 80, kSize010AdamDesc = 52, kSize010StepArgs = 32,
                   kSize010ScalerDesc = 24;
bool small_size_refused(uint32_t struct_size, uint32_t size_010) { return struct_size != size_010; }

// Stores an int into an enum field as a C caller would (memcpy: no enum-typed load in C++).
template <class E>
void store(E &field, int v) {
    static_assert(sizeof(E) == sizeof(int), "enums are int-sized");
    std::memcpy(&field, &v, sizeof field);
}

bool g_skip_enums = false, g_skip_misaligned_alloc = false, g_skip_failing_alloc = false, g_skip_step_lr_inf = false;

enum Kind { CTX, TENSOR, META, LINEAR, OPT, SCALER, KINDS };
const char *const kKindName[KINDS] = {"context", "tensor", "scaling", "linear", "optimizer", "grad scaler"};

// Why the arguments of the call about to be made are certainly invalid (empty: they may be valid).
struct Why {
    std::string reasons;
    void add(bool cond, const std::string &r) {
        if (cond) reasons += (reasons.empty() ? "" : ", ") + r;
    }
    bool bad() const { return !reasons.empty(); }
};

// An output slot filled with a poison pattern before a call; unchanged() after a failed call.
template <class T>
struct Out {
    T value;
    unsigned char poison[sizeof(T)];
    Out() {
        std::memset(poison, 0xA5, sizeof poison);
        std::memcpy(static_cast<void *>(&value), poison, sizeof value);
    }
    T *ptr() { return &value; }
    bool unchanged() const { return std::memcmp(static_cast<const void *>(&value), poison, sizeof value) == 0; }
};

// memcmp that also takes n == 0 with NULL pointers (an empty vector's data()).
bool same(const void *a, const void *b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// ---- allocator hooks -------------------------------------------------------------------------

struct Hooks {
    long live_blocks = 0;
    long fail_after = -1;   // >= 0: that many allocations succeed, then every one fails
    bool misalign = false;  // return memory 16 bytes past a 256-byte boundary
} g_hooks;

void *hook_alloc(void *user, size_t nbytes, fp8amp_device, void *) {
    Hooks *h = static_cast<Hooks *>(user);
    if (h->fail_after == 0) return nullptr;
    if (h->fail_after > 0) --h->fail_after;
    const size_t pad = h->misalign ? 256 : 0;
    if (nbytes > SIZE_MAX - pad - 255) return nullptr;  // rounding up would wrap to a small block
    const size_t n = ((nbytes + pad + 255) / 256) * 256;
    unsigned char *base = static_cast<unsigned char *>(std::aligned_alloc(256, n ? n : 256));
    if (!base) return nullptr;
    ++h->live_blocks;
    return h->misalign ? base + 16 : base;
}

void hook_free(void *user, void *ptr, size_t, fp8amp_device, void *) {
    Hooks *h = static_cast<Hooks *>(user);
    if (!ptr) return;
    --h->live_blocks;
    unsigned char *p = static_cast<unsigned char *>(ptr);
    std::free((reinterpret_cast<uintptr_t>(p) % 256) == 16 ? p - 16 : p);
}

// ---- the session of one input ------------------------------------------------------------------

struct Session {
    FuzzedDataProvider &in;
    std::vector<void *> live[KINDS], dead[KINDS];
    std::vector<void *> buffers;                    // memory wrapped by tensors, freed at the end
    std::vector<DLManagedTensorVersioned *> exports;
    int64_t stack_object = 0x1234;
    float lr_on_device = 1e-3f;

    explicit Session(FuzzedDataProvider &i) : in(i) {}

    bool one_in(int n) { return in.ConsumeIntegralInRange<int>(1, n) == 1; }

    // A handle for an argument of kind k. Anything but a live handle of kind k is certainly invalid
    // (a NULL one too, unless null_ok).
    void *handle(Kind k, Why &why, const char *arg, bool null_ok = false) {
        const int mode = in.ConsumeIntegralInRange<int>(0, 15);
        auto any = [&](std::vector<void *> &v) { return v[in.ConsumeIntegralInRange<size_t>(0, v.size() - 1)]; };
        if (mode == 1 && !dead[k].empty()) {
            why.add(true, std::string(arg) + " destroyed");
            return any(dead[k]);
        }
        if (mode == 2) {
            const Kind other = static_cast<Kind>((k + in.ConsumeIntegralInRange<int>(1, KINDS - 1)) % KINDS);
            if (!live[other].empty()) {
                why.add(true, std::string(arg) + " a " + kKindName[other] + " handle");
                return any(live[other]);
            }
        }
        if (mode == 3) {
            static const uintptr_t kBogus[] = {1, 0xdeadbeef, uintptr_t(1) << 32, (uintptr_t(0xFFFFFF) << 32) | 0x0500,
                                               ~uintptr_t(0)};
            why.add(true, std::string(arg) + " not a handle");
            return one_in(2) ? static_cast<void *>(&stack_object)
                             : reinterpret_cast<void *>(kBogus[in.ConsumeIntegralInRange<int>(0, 4)]);
        }
        if (mode == 4 && !live[k].empty()) {  // a live handle's value with its generation or kind changed
            const uintptr_t v = reinterpret_cast<uintptr_t>(any(live[k]));
            why.add(true, std::string(arg) + " forged");
            return reinterpret_cast<void *>(one_in(2) ? v ^ (uintptr_t(1) << (8 + in.ConsumeIntegralInRange<int>(0, 23)))
                                                      : (v & ~uintptr_t(0xFF)) | ((v & 0xFF) % 6 + 1));
        }
        if (mode == 0 || live[k].empty()) {
            why.add(!null_ok, std::string(arg) + " NULL");
            return nullptr;
        }
        return any(live[k]);
    }
    template <class H>
    H h(Kind k, Why &why, const char *arg, bool null_ok = false) {
        return reinterpret_cast<H>(handle(k, why, arg, null_ok));
    }

    void born(Kind k, void *handle_value) { live[k].push_back(handle_value); }
    void died(Kind k, void *handle_value) {
        for (size_t i = 0; i < live[k].size(); ++i)
            if (live[k][i] == handle_value) {
                live[k].erase(live[k].begin() + static_cast<long>(i));
                dead[k].push_back(handle_value);
                return;
            }
    }

    // An enum argument: mostly a valid value in [lo, hi]; now and then an out-of-range one.
    int enumv(int lo, int hi, Why &why, const char *arg) {
        if (!g_skip_enums && one_in(8)) {
            static const int kOdd[] = {-1, 5, 8, 100, 255, 256, 0x7fffffff, -0x7fffffff - 1};
            int v = kOdd[in.ConsumeIntegralInRange<int>(0, 7)];
            if (v >= lo && v <= hi) v = hi + 1;
            why.add(true, std::string(arg) + " out of range");
            return v;
        }
        return in.ConsumeIntegralInRange<int>(lo, hi);
    }

    float hyper(float good_lo, float good_hi, Why &why, const char *arg, bool neg_ok = false) {
        switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: why.add(true, std::string(arg) + " NaN"); return std::numeric_limits<float>::quiet_NaN();
        case 1: why.add(true, std::string(arg) + " +inf"); return INFINITY;
        case 2: why.add(!neg_ok, std::string(arg) + " -inf"); return -INFINITY;
        case 3: why.add(!neg_ok, std::string(arg) + " negative"); return -1.5f;
        default: return good_lo + (good_hi - good_lo) * in.ConsumeProbability<float>();
        }
    }

    // A shape: mostly small and valid; now and then bad (extent < 1, an overflowing product).
    int32_t shape(int64_t *s, Why &why, bool *too_big) {
        int32_t ndim = in.ConsumeIntegralInRange<int32_t>(0, 3);
        *too_big = false;
        if (one_in(12)) {
            ndim = one_in(2) ? in.ConsumeIntegralInRange<int32_t>(-5, -1) : in.ConsumeIntegralInRange<int32_t>(9, 1000);
            if (one_in(4)) ndim = one_in(2) ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max();
            why.add(true, "ndim " + std::to_string(ndim));
        }
        for (int i = 0; i < FP8AMP_MAX_NDIM; ++i) s[i] = in.ConsumeIntegralInRange<int64_t>(1, 6);
        if (ndim >= 1 && ndim <= FP8AMP_MAX_NDIM && one_in(8)) {
            const int i = in.ConsumeIntegralInRange<int>(0, ndim - 1);
            switch (in.ConsumeIntegralInRange<int>(0, 3)) {
            case 0: s[i] = 0; why.add(true, "extent 0"); break;
            case 1: s[i] = -static_cast<int64_t>(in.ConsumeIntegral<uint32_t>()) - 1; why.add(true, "negative extent"); break;
            case 2:  // a product that overflows int64 or size_t
                for (int d = 0; d < ndim; ++d) s[d] = std::numeric_limits<int64_t>::max() / 2;
                if (ndim == 1) s[0] = std::numeric_limits<int64_t>::max();  // * 4 bytes overflows size_t; * 2 is past PTRDIFF_MAX
                *too_big = true;
                why.add(ndim > 1, "extents overflow");
                break;
            case 3: s[i] = int64_t(1) << 40; *too_big = true; break;  // valid, but no memory for it
            }
        }
        return ndim;
    }

    // A host buffer of exactly n bytes (a heap block with ASan red zones), freed at the end.
    void *buffer(size_t n, size_t misalign = 0) {
        unsigned char *b = static_cast<unsigned char *>(std::malloc(n + misalign + 1));
        for (size_t i = 0; i < n + misalign; ++i) b[i] = static_cast<unsigned char>(i * 37u + 11u);
        buffers.push_back(b);
        return b + misalign;
    }

    size_t tensor_nbytes(fp8amp_tensor t) {
        size_t n = 0;
        return fp8amp_tensor_nbytes(t, &n) == FP8AMP_SUCCESS ? n : 0;
    }

    // A live tensor's bytes (empty for NULL or anything but a live tensor handle).
    std::vector<unsigned char> bytes_of(fp8amp_tensor t) {
        bool is_live = false;
        for (void *v : live[TENSOR]) is_live = is_live || v == t;
        std::vector<unsigned char> b(is_live ? tensor_nbytes(t) : 0);
        if (!b.empty() && fp8amp_tensor_copy_to_host(t, b.data(), b.size()) != FP8AMP_SUCCESS) b.clear();
        return b;
    }
    // The outputs' bytes before a call, to check that a failed call wrote none of them.
    std::vector<std::vector<unsigned char>> snapshot(std::initializer_list<fp8amp_tensor> outs) {
        std::vector<std::vector<unsigned char>> v;
        for (fp8amp_tensor t : outs) v.push_back(bytes_of(t));
        return v;
    }
    bool unchanged(std::initializer_list<fp8amp_tensor> outs, const std::vector<std::vector<unsigned char>> &before) {
        size_t k = 0;
        for (fp8amp_tensor t : outs) {
            if (!before[k].empty() && bytes_of(t) != before[k]) return false;
            ++k;
        }
        return true;
    }
    // y_t holds y's [rows, cols] one-byte codes transposed.
    bool is_transpose(fp8amp_tensor y, fp8amp_tensor y_t, int64_t rows, int64_t cols) {
        const std::vector<unsigned char> a = bytes_of(y), b = bytes_of(y_t);
        if (a.size() != size_t(rows * cols) || b.size() != a.size()) return false;
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j)
                if (a[size_t(i * cols + j)] != b[size_t(j * rows + i)]) return false;
        return true;
    }
    // A fresh tensor of fuzzed bytes (NaN, inf and subnormal codes included), or NULL.
    fp8amp_tensor fresh(fp8amp_context c, fp8amp_dtype dt, std::vector<int64_t> shape) {
        fp8amp_tensor t = nullptr;
        if (fp8amp_tensor_create(c, dt, int32_t(shape.size()), shape.data(), &t) != FP8AMP_SUCCESS) return nullptr;
        born(TENSOR, t);
        std::vector<unsigned char> b(tensor_nbytes(t));
        for (auto &v : b) v = in.ConsumeIntegral<uint8_t>();
        fp8amp_tensor_copy_from_host(t, b.data(), b.size());
        return t;
    }
    // An FP8 output of dtype dt bound to a fresh meta (delayed or current scaling), or NULL.
    fp8amp_tensor fresh_fp8(fp8amp_context c, fp8amp_dtype dt, std::vector<int64_t> shape, fp8amp_scaling *meta) {
        fp8amp_tensor t = fresh(c, dt, std::move(shape));
        if (!t) return nullptr;
        if (!*meta) {
            fp8amp_recipe rc;
            fp8amp_recipe_init_default(&rc);
            rc.amax_history_len = 4;
            rc.mode = static_cast<fp8amp_scaling_mode>(in.ConsumeIntegralInRange<int>(0, 1));
            if (fp8amp_scaling_create(c, &rc, dt, meta) != FP8AMP_SUCCESS) return nullptr;
            born(META, *meta);
        }
        return fp8amp_tensor_set_scaling(t, *meta) == FP8AMP_SUCCESS ? t : nullptr;
    }

    // The fused norm / activation calls (op 39): over the pool's tensors with a hostile desc and kind,
    // or well-formed over fresh tensors of fuzzed bytes, forward then backward.
    void fused_hostile(Why &why);
    void fused_well_formed();
    // fp8amp_optimizer_param_state then fp8amp_optimizer_set_param_state (op 39 too).
    void param_state(Why &why);
    // The optimizer's checkpoint bytes (empty when it cannot be saved).
    std::vector<unsigned char> saved(fp8amp_optimizer o) {
        size_t need = 0;
        if (fp8amp_optimizer_save(o, nullptr, 0, &need) != FP8AMP_SUCCESS || need > (1u << 20)) return {};
        std::vector<unsigned char> b(need);
        size_t size = 0;
        if (fp8amp_optimizer_save(o, b.data(), b.size(), &size) != FP8AMP_SUCCESS) return {};
        b.resize(size);
        return b;
    }
    void run();
    void teardown();
};

// Runs one call: poisons the message first; then the oracle.
template <class F>
fp8amp_status call(const char *spelled, const Why &why, F &&f) {
    // "(fp8amp_x_init_default)", an FP8AMP_0 entry point called past its macro: the name is inside.
    std::string bare(spelled);
    if (bare.size() > 2 && bare.front() == '(' && bare.back() == ')') bare = bare.substr(1, bare.size() - 2);
    const char *name = bare.c_str();
    fuzz::poison_message(name);
    const fp8amp_status s = f();
    if (s != FP8AMP_SUCCESS)
        fuzz::check_failure(name, s);
    else
        FUZZ_CHECK(!why.bad(), "%s succeeded with certainly-invalid arguments: %s", name, why.reasons.c_str());
    return s;
}

#define CALL(fn, why, ...) call(#fn, why, [&] { return fn(__VA_ARGS__); })
#define UNCHANGED_ON_FAILURE(s, out) \
    FUZZ_CHECK((s) == FP8AMP_SUCCESS || (out).unchanged(), "a failed call wrote its output " #out)

// The fused norm / activation forward and backward over the pool's tensors, a hostile desc and kind:
// a failed call writes none of its outputs' bytes.
void Session::fused_hostile(Why &why) {
    auto c = h<fp8amp_context>(CTX, why, "ctx");
    const int which = in.ConsumeIntegralInRange<int>(0, 3);
    if (which < 2) {
        fp8amp_norm_desc d;
        fp8amp_norm_desc_init_default(&d);
        const fp8amp_norm_desc *dp = &d;
        switch (in.ConsumeIntegralInRange<int>(0, 7)) {
        case 0: dp = nullptr; break;  // the defaults
        case 1: store(d.kind, enumv(0, 1, why, "desc->kind")); break;
        case 2: d.eps = hyper(0.0f, 1e-3f, why, "desc->eps"); break;
        case 3:
            d.zero_centered_gamma = in.ConsumeIntegralInRange<int32_t>(-1, 2);
            why.add(d.zero_centered_gamma != 0 && d.zero_centered_gamma != 1, "desc->zero_centered_gamma");
            break;
        case 4:  // new in 0.4.0: no earlier size is accepted
            d.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof d - 1);
            why.add(true, "struct_size small");
            break;
        default: break;
        }
        if (which == 0) {
            auto x = h<fp8amp_tensor>(TENSOR, why, "x"), g = h<fp8amp_tensor>(TENSOR, why, "gamma");
            auto b = h<fp8amp_tensor>(TENSOR, why, "beta", true), y = h<fp8amp_tensor>(TENSOR, why, "y");
            auto yt = h<fp8amp_tensor>(TENSOR, why, "y_t", true), m = h<fp8amp_tensor>(TENSOR, why, "mean", true);
            auto r = h<fp8amp_tensor>(TENSOR, why, "rstd", true);
            const auto before = snapshot({y, yt, m, r});
            if (CALL(fp8amp_norm_forward, why, c, dp, x, g, b, y, yt, m, r) != FP8AMP_SUCCESS)
                FUZZ_CHECK(unchanged({y, yt, m, r}, before), "a failed fp8amp_norm_forward wrote an output");
        } else {
            auto dy = h<fp8amp_tensor>(TENSOR, why, "dy"), x = h<fp8amp_tensor>(TENSOR, why, "x");
            auto g = h<fp8amp_tensor>(TENSOR, why, "gamma"), m = h<fp8amp_tensor>(TENSOR, why, "mean", true);
            auto r = h<fp8amp_tensor>(TENSOR, why, "rstd"), dx = h<fp8amp_tensor>(TENSOR, why, "dx");
            auto dg = h<fp8amp_tensor>(TENSOR, why, "dgamma"), db = h<fp8amp_tensor>(TENSOR, why, "dbeta", true);
            const auto before = snapshot({dx, dg, db});
            if (CALL(fp8amp_norm_backward, why, c, dp, dy, x, g, m, r, dx, dg, db) != FP8AMP_SUCCESS)
                FUZZ_CHECK(unchanged({dx, dg, db}, before), "a failed fp8amp_norm_backward wrote an output");
        }
    } else {
        const int kind = enumv(0, 2, why, "kind");
        if (which == 2) {
            auto x = h<fp8amp_tensor>(TENSOR, why, "x"), y = h<fp8amp_tensor>(TENSOR, why, "y");
            auto yt = h<fp8amp_tensor>(TENSOR, why, "y_t", true);
            const auto before = snapshot({y, yt});
            if (call("fp8amp_activation_forward", why, [&] { return fuzz_activation_forward(c, kind, x, y, yt); }) !=
                FP8AMP_SUCCESS)
                FUZZ_CHECK(unchanged({y, yt}, before), "a failed fp8amp_activation_forward wrote an output");
        } else {
            auto dy = h<fp8amp_tensor>(TENSOR, why, "dy"), x = h<fp8amp_tensor>(TENSOR, why, "x");
            auto dx = h<fp8amp_tensor>(TENSOR, why, "dx"), dxt = h<fp8amp_tensor>(TENSOR, why, "dx_t", true);
            const auto before = snapshot({dx, dxt});
            if (call("fp8amp_activation_backward", why,
                     [&] { return fuzz_activation_backward(c, kind, dy, x, dx, dxt); }) != FP8AMP_SUCCESS)
                FUZZ_CHECK(unchanged({dx, dxt}, before), "a failed fp8amp_activation_backward wrote an output");
        }
    }
}

// A well-formed norm or activation, forward then backward, over fresh tensors of fuzzed bytes (NaN
// and inf codes included), FP8 outputs bound to fresh metas: a y_t / dx_t written is y / dx transposed.
void Session::fused_well_formed() {
    Why w;
    auto c = h<fp8amp_context>(CTX, w, "ctx");
    if (w.bad() || !c) return;
    const int64_t rows = in.ConsumeIntegralInRange<int64_t>(1, 40), cols = in.ConsumeIntegralInRange<int64_t>(1, 40);
    auto wide = [&] { return static_cast<fp8amp_dtype>(in.ConsumeIntegralInRange<int>(0, 2)); };
    auto fp8 = [&] { return in.ConsumeBool() ? FP8AMP_DTYPE_E4M3 : FP8AMP_DTYPE_E5M2; };
    const bool use_fp8 = in.ConsumeBool(), use_t = use_fp8 && in.ConsumeBool();
    fp8amp_scaling meta = nullptr;
    if (in.ConsumeBool()) {  // LayerNorm or RMSNorm over [rows, cols]
        fp8amp_norm_desc d;
        fp8amp_norm_desc_init_default(&d);
        const bool rms = in.ConsumeBool();
        d.kind = rms ? FP8AMP_NORM_RMSNORM : FP8AMP_NORM_LAYERNORM;
        d.zero_centered_gamma = in.ConsumeBool();
        d.eps = in.ConsumeBool() ? 1e-5f : 0.0f;
        fp8amp_tensor x = fresh(c, wide(), {rows, cols}), g = fresh(c, wide(), {cols});
        fp8amp_tensor b = rms ? nullptr : fresh(c, wide(), {cols});
        const fp8amp_dtype ydt = use_fp8 ? fp8() : wide();
        fp8amp_tensor y = use_fp8 ? fresh_fp8(c, ydt, {rows, cols}, &meta) : fresh(c, ydt, {rows, cols});
        fp8amp_tensor yt = use_t ? fresh_fp8(c, ydt, {cols, rows}, &meta) : nullptr;
        fp8amp_tensor m = rms ? nullptr : fresh(c, FP8AMP_DTYPE_F32, {rows}), r = fresh(c, FP8AMP_DTYPE_F32, {rows});
        if (!x || !g || (!rms && (!b || !m)) || !y || (use_t && !yt) || !r) return;  // a failing hook
        if (call("fp8amp_norm_forward", w, [&] { return fp8amp_norm_forward(c, &d, x, g, b, y, yt, m, r); }) !=
            FP8AMP_SUCCESS)
            return;
        if (yt) FUZZ_CHECK(is_transpose(y, yt, rows, cols), "fp8amp_norm_forward's y_t is not y transposed");
        fp8amp_tensor dy = fresh(c, wide(), {rows, cols}), dx = fresh(c, wide(), {rows, cols});
        fp8amp_tensor dg = fresh(c, FP8AMP_DTYPE_F32, {cols}), db = rms ? nullptr : fresh(c, FP8AMP_DTYPE_F32, {cols});
        if (!dy || !dx || !dg || (!rms && !db)) return;
        call("fp8amp_norm_backward", w, [&] { return fp8amp_norm_backward(c, &d, dy, x, g, m, r, dx, dg, db); });
    } else {  // GELU, SiLU or SwiGLU: x [rows, in_cols], y [rows, cols]
        const int kind = in.ConsumeIntegralInRange<int>(0, 2);
        const int64_t in_cols = kind == FP8AMP_ACTIVATION_SWIGLU ? 2 * cols : cols;
        fp8amp_tensor x = fresh(c, wide(), {rows, in_cols});
        const fp8amp_dtype ydt = use_fp8 ? fp8() : wide();
        fp8amp_tensor y = use_fp8 ? fresh_fp8(c, ydt, {rows, cols}, &meta) : fresh(c, ydt, {rows, cols});
        fp8amp_tensor yt = use_t ? fresh_fp8(c, ydt, {cols, rows}, &meta) : nullptr;
        if (!x || !y || (use_t && !yt)) return;
        if (call("fp8amp_activation_forward", w, [&] { return fuzz_activation_forward(c, kind, x, y, yt); }) !=
            FP8AMP_SUCCESS)
            return;
        if (yt) FUZZ_CHECK(is_transpose(y, yt, rows, cols), "fp8amp_activation_forward's y_t is not y transposed");
        // the backward into FP8 (a meta of its own) or wide, its transpose [in_cols, rows]
        fp8amp_scaling dmeta = nullptr;
        const bool dfp8 = in.ConsumeBool(), dt_on = dfp8 && in.ConsumeBool();
        const fp8amp_dtype ddt = dfp8 ? fp8() : wide();
        fp8amp_tensor dy = fresh(c, wide(), {rows, cols});
        fp8amp_tensor dx = dfp8 ? fresh_fp8(c, ddt, {rows, in_cols}, &dmeta) : fresh(c, ddt, {rows, in_cols});
        fp8amp_tensor dxt = dt_on ? fresh_fp8(c, ddt, {in_cols, rows}, &dmeta) : nullptr;
        if (!dy || !dx || (dt_on && !dxt)) return;
        if (call("fp8amp_activation_backward", w,
                 [&] { return fuzz_activation_backward(c, kind, dy, x, dx, dxt); }) == FP8AMP_SUCCESS && dxt)
            FUZZ_CHECK(is_transpose(dx, dxt, rows, in_cols), "fp8amp_activation_backward's dx_t is not dx transposed");
    }
}

// A parameter's optimizer state read as tensors (fp8amp_optimizer_param_state), then written back
// (fp8amp_optimizer_set_param_state): as read (the exact form, from the read-only views of the
// optimizer's own memory), or with one part changed: values of a wide dtype (F32/BF16/F16 tensors of
// fuzzed bytes, NaN, inf and negative codes included, their scales NULL), a pool tensor, NULL, a
// meta's scale or amax drawn hostile, a small struct_size. A failed set changes nothing, and writing
// back what was read changes nothing either: the optimizer's checkpoint bytes stay the same.
void Session::param_state(Why &why) {
    auto o = h<fp8amp_optimizer>(OPT, why, "opt");
    int32_t count = 0;
    if (!why.bad() && fp8amp_optimizer_num_params(o, &count) != FP8AMP_SUCCESS) count = 0;
    int32_t index = count > 0 ? in.ConsumeIntegralInRange<int32_t>(0, count - 1) : 0;
    if (one_in(12)) index = one_in(2) ? -1 : count;
    why.add(!why.bad() && (index < 0 || index >= count), "index out of range");
    fp8amp_param_state st;
    fp8amp_param_state_init(&st, sizeof st);
    Why w = why;
    if (one_in(16)) {
        st.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof st - 1);
        w.add(true, "out->struct_size small");
    }
    if (CALL(fp8amp_optimizer_param_state, w, o, index, &st) != FP8AMP_SUCCESS) return;
    fp8amp_tensor *parts[] = {&st.exp_avg, &st.exp_avg_scale_inv, &st.exp_avg_sq, &st.exp_avg_sq_scale_inv,
                              &st.master, &st.master_scale_inv, &st.param_meta_history};
    for (fp8amp_tensor *t : parts)
        if (*t) born(TENSOR, *t);
    fp8amp_param_state set = st;
    Why ws;
    const int change = in.ConsumeIntegralInRange<int>(0, 7);
    switch (change) {
    case 0: break;  // as read
    case 1:
    case 2: {  // values: m, v or the master from a wide tensor of fuzzed bytes, its scale NULL
        const int part = in.ConsumeIntegralInRange<int>(0, 2);
        fp8amp_tensor *t = part == 0 ? &set.exp_avg : part == 1 ? &set.exp_avg_sq : &set.master;
        fp8amp_tensor *scale = part == 0 ? &set.exp_avg_scale_inv : part == 1 ? &set.exp_avg_sq_scale_inv : &set.master_scale_inv;
        if (!*t || live[CTX].empty()) break;
        int64_t shape[FP8AMP_MAX_NDIM];
        int32_t nd = 0;
        if (fp8amp_tensor_ndim(*t, &nd) != FP8AMP_SUCCESS || fp8amp_tensor_shape(*t, FP8AMP_MAX_NDIM, shape) != FP8AMP_SUCCESS)
            break;
        const fp8amp_tensor v = fresh(static_cast<fp8amp_context>(live[CTX][0]),
                                      static_cast<fp8amp_dtype>(in.ConsumeIntegralInRange<int>(0, 2)),
                                      std::vector<int64_t>(shape, shape + nd));
        if (!v) break;
        *t = v;
        *scale = nullptr;
        break;
    }
    case 3: {  // one part replaced by any tensor of the pool (or something that is not one)
        fp8amp_tensor *set_parts[] = {&set.exp_avg, &set.exp_avg_scale_inv, &set.exp_avg_sq, &set.exp_avg_sq_scale_inv,
                                      &set.master, &set.master_scale_inv, &set.param_meta_history};
        *set_parts[in.ConsumeIntegralInRange<int>(0, 6)] = h<fp8amp_tensor>(TENSOR, ws, "a state tensor", true);
        break;
    }
    case 4:  // a required part NULL
        if (in.ConsumeBool()) set.exp_avg = nullptr, ws.add(true, "exp_avg NULL");
        else set.exp_avg_sq = nullptr, ws.add(true, "exp_avg_sq NULL");
        break;
    case 5:  // the meta's state drawn hostile (it only counts with a history)
        if (!set.param_meta_history) break;
        set.param_meta_scale = hyper(0.5f, 4.0f, ws, "param_meta_scale");
        switch (in.ConsumeIntegralInRange<int>(0, 4)) {  // amax: >= 0 or +inf
        case 0: set.param_meta_amax = std::numeric_limits<float>::quiet_NaN(); ws.add(true, "param_meta_amax NaN"); break;
        case 1: set.param_meta_amax = INFINITY; break;
        case 2: set.param_meta_amax = -0.5f; ws.add(true, "param_meta_amax negative"); break;
        case 3: set.param_meta_amax = 10.0f * in.ConsumeProbability<float>(); break;
        default: break;
        }
        if (one_in(4)) set.param_meta_updates = -1, ws.add(true, "param_meta_updates negative");
        break;
    case 6:  // new in 0.4.0: no earlier size is accepted
        set.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof set - 1);
        ws.add(true, "struct_size small");
        break;
    default: break;  // as read, once more: set twice in a row
    }
    const std::vector<unsigned char> before = saved(o);
    const fp8amp_status s = CALL(fp8amp_optimizer_set_param_state, ws, o, index, &set);
    if (before.empty()) return;
    if (s != FP8AMP_SUCCESS)
        FUZZ_CHECK(saved(o) == before, "a failed fp8amp_optimizer_set_param_state changed the optimizer");
    else if (change == 0 || change == 7)
        FUZZ_CHECK(saved(o) == before, "fp8amp_optimizer_set_param_state of the state as read changed the optimizer");
}

void Session::run() {
    while (in.remaining_bytes() > 0) {
        Why why;
        const int op = in.ConsumeIntegralInRange<int>(0, 45);
        switch (op) {
        case 0: {  // context_create
            const int type = enumv(1, 2, why, "device.type");
            const int32_t index = one_in(4) ? in.ConsumeIntegralInRange<int32_t>(-2, 3) : 0;
            why.add(index < 0, "negative index");
            why.add(type == FP8AMP_DEVICE_CPU && index != 0, "cpu index");
            why.add(type == FP8AMP_DEVICE_CUDA, "cuda in a build without CUDA");
            const bool null_out = one_in(16);
            why.add(null_out, "out NULL");
            Out<fp8amp_context> out;
            const fp8amp_status s = call("fp8amp_context_create", why, [&] { return fuzz_context_create(type, index, null_out ? nullptr : out.ptr()); });
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) born(CTX, out.value);
            break;
        }
        case 1: {  // context_destroy
            auto c = h<fp8amp_context>(CTX, why, "ctx", true);
            if (CALL(fp8amp_context_destroy, why, c) == FP8AMP_SUCCESS && c) died(CTX, c);
            break;
        }
        case 2: {  // context getters, stream
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            const bool null_out = one_in(8);
            why.add(null_out, "out NULL");
            Out<fp8amp_device> dev;
            Out<void *> stream;
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 3)) {
            case 0: s = CALL(fp8amp_context_device, why, c, null_out ? nullptr : dev.ptr()); UNCHANGED_ON_FAILURE(s, dev); break;
            case 1: s = CALL(fp8amp_context_get_stream, why, c, null_out ? nullptr : stream.ptr()); UNCHANGED_ON_FAILURE(s, stream); break;
            case 2: {
                const bool nonnull = one_in(2);
                Why w2 = why;
                w2.reasons.clear();
                w2.add(why.bad() && !null_out, why.reasons);  // null_out does not apply here
                w2.add(nonnull, "a stream on a CPU context");
                CALL(fp8amp_context_set_stream, w2, c, nonnull ? static_cast<void *>(&stack_object) : nullptr);
                break;
            }
            default: {
                Why w2;
                w2.add(why.bad() && !null_out, why.reasons);
                CALL(fp8amp_context_synchronize, w2, c);
            }
            }
            break;
        }
        case 3: {  // set_allocator
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            const int mode = in.ConsumeIntegralInRange<int>(0, 5);
            fp8amp_alloc_fn a = hook_alloc;
            fp8amp_free_fn f = hook_free;
            if (mode == 0) a = nullptr, f = nullptr;
            if (mode == 1) a = nullptr, why.add(true, "alloc_fn NULL alone");
            if (mode == 2) f = nullptr, why.add(true, "free_fn NULL alone");
            if (mode >= 3) {
                g_hooks.misalign = !g_skip_misaligned_alloc && one_in(4);
                g_hooks.fail_after = (!g_skip_failing_alloc && one_in(3)) ? in.ConsumeIntegralInRange<long>(0, 6) : -1;
            }
            CALL(fp8amp_context_set_allocator, why, c, a, f, &g_hooks);
            break;
        }
        case 4:
        case 5: {  // tensor_create
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            const int dt = enumv(0, 4, why, "dtype");
            int64_t s[FP8AMP_MAX_NDIM];
            bool too_big;
            const int32_t nd = shape(s, why, &too_big);
            const bool null_shape = nd > 0 && one_in(16);
            why.add(null_shape, "shape NULL");
            const bool null_out = one_in(16);
            why.add(null_out, "out NULL");
            Out<fp8amp_tensor> out;
            const fp8amp_status st = call("fp8amp_tensor_create", why, [&] { return fuzz_tensor_create(c, dt, nd, null_shape ? nullptr : s, null_out ? nullptr : out.ptr()); });
            UNCHANGED_ON_FAILURE(st, out);
            if (st == FP8AMP_SUCCESS) born(TENSOR, out.value);
            break;
        }
        case 6: {  // tensor_wrap, over a buffer of exactly its size (misaligned or NULL now and then)
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            const int dt = enumv(0, 4, why, "dtype");
            int64_t s[FP8AMP_MAX_NDIM];
            bool too_big;
            const int32_t nd = shape(s, why, &too_big);
            if (too_big && !why.bad()) break;  // a valid shape the buffer cannot back: the caller's bug
            size_t n = 1;
            if (!why.bad())
                for (int i = 0; i < nd; ++i) n *= static_cast<size_t>(s[i]);
            const size_t elem = fuzz_dtype_size(dt) ? fuzz_dtype_size(dt) : 1;
            const int dmode = in.ConsumeIntegralInRange<int>(0, 11);
            void *data = dmode == 0 ? nullptr : buffer(why.bad() ? 64 : n * elem, dmode == 1 && elem > 1 ? 1 : 0);
            why.add(dmode == 0, "data NULL");
            why.add(dmode == 1 && elem > 1, "data misaligned");
            Out<fp8amp_tensor> out;
            const fp8amp_status st = call("fp8amp_tensor_wrap", why, [&] { return fuzz_tensor_wrap(c, dt, nd, s, data, out.ptr()); });
            UNCHANGED_ON_FAILURE(st, out);
            if (st == FP8AMP_SUCCESS) born(TENSOR, out.value);
            break;
        }
        case 7: {  // tensor_rebind
            auto t = h<fp8amp_tensor>(TENSOR, why, "t");
            int64_t s[FP8AMP_MAX_NDIM];
            bool too_big;
            const int32_t nd = shape(s, why, &too_big);
            if (too_big && !why.bad()) break;
            size_t n = 1;
            if (!why.bad())
                for (int i = 0; i < nd; ++i) n *= static_cast<size_t>(s[i]);
            Out<fp8amp_dtype> dt;
            const size_t elem = fp8amp_tensor_dtype(t, dt.ptr()) == FP8AMP_SUCCESS ? fp8amp_dtype_size(dt.value) : 4;
            const int dmode = in.ConsumeIntegralInRange<int>(0, 11);
            void *data = dmode == 0 ? nullptr : buffer(why.bad() ? 64 : n * elem, dmode == 1 && elem > 1 ? 1 : 0);
            why.add(dmode == 0, "data NULL");
            why.add(dmode == 1 && elem > 1, "data misaligned");
            size_t before = t ? tensor_nbytes(t) : 0;
            const fp8amp_status st = CALL(fp8amp_tensor_rebind, why, t, data, nd, s);
            if (st != FP8AMP_SUCCESS && t && !why.bad()) FUZZ_CHECK(tensor_nbytes(t) == before, "a failed rebind changed t");
            break;
        }
        case 8: {  // tensor_destroy
            auto t = h<fp8amp_tensor>(TENSOR, why, "t", true);
            if (CALL(fp8amp_tensor_destroy, why, t) == FP8AMP_SUCCESS && t) died(TENSOR, t);
            break;
        }
        case 9: {  // tensor getters
            auto t = h<fp8amp_tensor>(TENSOR, why, "t");
            const bool null_out = one_in(8);
            const Why base = why;
            why.add(null_out, "out NULL");
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 6)) {
            case 0: { Out<fp8amp_dtype> o; s = CALL(fp8amp_tensor_dtype, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 1: { Out<int32_t> o; s = CALL(fp8amp_tensor_ndim, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 2: { Out<int64_t> o; s = CALL(fp8amp_tensor_numel, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 3: { Out<size_t> o; s = CALL(fp8amp_tensor_nbytes, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 4: { Out<void *> o; s = CALL(fp8amp_tensor_data, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 5: { Out<fp8amp_device> o; s = CALL(fp8amp_tensor_device, why, t, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            default: {
                // shape: exactly `capacity` writable slots (a heap block), capacity hostile
                Out<int32_t> nd;
                const bool known = t && fp8amp_tensor_ndim(t, nd.ptr()) == FP8AMP_SUCCESS;
                const int32_t cap = in.ConsumeIntegralInRange<int32_t>(-2, 9);
                why = base;  // a scalar's shape may be NULL (docs/api.md)
                why.add(null_out && known && nd.value > 0, "shape NULL");
                why.add(known && cap < nd.value, "capacity < ndim");
                why.add(cap < 0, "negative capacity");
                int64_t *slots = static_cast<int64_t *>(buffer(sizeof(int64_t) * static_cast<size_t>(cap > 0 ? cap : 0)));
                std::vector<int64_t> copy(slots, slots + (cap > 0 ? cap : 0));
                s = CALL(fp8amp_tensor_shape, why, t, cap, null_out ? nullptr : slots);
                if (s != FP8AMP_SUCCESS)
                    FUZZ_CHECK(std::equal(copy.begin(), copy.end(), slots), "a failed tensor_shape wrote shape");
            }
            }
            break;
        }
        case 10: {  // copy_from_host / copy_to_host with a buffer of exactly the given size
            auto t = h<fp8amp_tensor>(TENSOR, why, "t");
            const size_t actual = t ? tensor_nbytes(t) : 0;
            size_t n = actual;
            if (one_in(6)) n = in.ConsumeIntegralInRange<size_t>(0, 300);
            if (one_in(16)) n = SIZE_MAX;
            why.add(t && actual && n != actual, "nbytes differs");
            const bool null_buf = one_in(12);
            why.add(null_buf, "buffer NULL");
            unsigned char *b = null_buf ? nullptr : static_cast<unsigned char *>(buffer(n == SIZE_MAX ? 8 : n));
            if (in.ConsumeBool()) {
                for (size_t i = 0; b && n != SIZE_MAX && i < n; ++i) b[i] = static_cast<unsigned char>(in.ConsumeIntegral<uint8_t>() | 1);
                CALL(fp8amp_tensor_copy_from_host, why, t, b, n);
            } else {
                std::vector<unsigned char> copy(b && n != SIZE_MAX ? b : nullptr, b && n != SIZE_MAX ? b + n : nullptr);
                const fp8amp_status s = CALL(fp8amp_tensor_copy_to_host, why, t, b, n);
                if (s != FP8AMP_SUCCESS && b && n != SIZE_MAX)
                    FUZZ_CHECK(same(copy.data(), b, n), "a failed copy_to_host wrote dst");
            }
            break;
        }
        case 11: {  // to_dlpack; the exports are deleted now and then, or at the end
            auto t = h<fp8amp_tensor>(TENSOR, why, "t");
            const bool null_out = one_in(12);
            why.add(null_out, "out NULL");
            Out<DLManagedTensorVersioned *> out;
            const fp8amp_status s = call("fp8amp_tensor_to_dlpack", why, [&] {
                return fp8amp_tensor_to_dlpack(t, null_out ? nullptr : reinterpret_cast<struct DLManagedTensorVersioned **>(out.ptr()));
            });
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) exports.push_back(out.value);
            if (!exports.empty() && one_in(3)) {
                exports.back()->deleter(exports.back());
                exports.pop_back();
            }
            break;
        }
        case 12:
        case 13: {  // cast
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            auto a = h<fp8amp_tensor>(TENSOR, why, "src"), b = h<fp8amp_tensor>(TENSOR, why, "dst");
            CALL(fp8amp_cast, why, c, a, b);
            break;
        }
        case 14:
        case 15: {  // quantize, quantize_transpose, dequantize, amax
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            auto a = h<fp8amp_tensor>(TENSOR, why, "src");
            const int which = in.ConsumeIntegralInRange<int>(0, 3);
            auto b = which == 3 ? nullptr : h<fp8amp_tensor>(TENSOR, why, "dst");  // amax has no dst
            switch (which) {
            case 0: CALL(fp8amp_quantize, why, c, a, b); break;
            case 1: {
                auto bt = h<fp8amp_tensor>(TENSOR, why, "dst_t");
                CALL(fp8amp_quantize_transpose, why, c, a, b, bt);
                break;
            }
            case 2: CALL(fp8amp_dequantize, why, c, a, b); break;
            default: {
                const bool null_out = one_in(8);
                why.add(null_out, "amax NULL");
                Out<float> o;
                const fp8amp_status s = CALL(fp8amp_amax, why, c, a, null_out ? nullptr : o.ptr());
                UNCHANGED_ON_FAILURE(s, o);
            }
            }
            break;
        }
        case 16: {  // scaling_create with a hostile recipe
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            fp8amp_recipe r;
            fp8amp_recipe_init_default(&r);
            if (one_in(10)) { r.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof r - 1); why.add(small_size_refused(r.struct_size, kSize010Recipe), "struct_size small"); }
            store(r.format, enumv(0, 1, why, "format"));
            store(r.mode, enumv(0, 1, why, "mode"));
            store(r.amax_algo, enumv(0, 1, why, "amax_algo"));
            if (one_in(6)) { r.margin = in.ConsumeIntegral<int32_t>(); why.add(r.margin < 0 || r.margin > 127, "margin"); }
            r.interval = one_in(6) ? in.ConsumeIntegral<int32_t>() : in.ConsumeIntegralInRange<int32_t>(1, 3);
            why.add(r.interval < 1, "interval");
            r.amax_history_len = one_in(6) ? in.ConsumeIntegral<int32_t>() : in.ConsumeIntegralInRange<int32_t>(1, 16);
            why.add(r.amax_history_len < 1 || r.amax_history_len > FP8AMP_MAX_AMAX_HISTORY, "amax_history_len");
            r.power_of_two_scales = in.ConsumeIntegralInRange<int32_t>(0, 1);
            const int dt = enumv(1, 4, why, "fp8_dtype");  // F16, E4M3, E5M2 (and BF16: refused)
            why.add(dt == FP8AMP_DTYPE_BF16, "fp8_dtype bf16");
            const bool null_recipe = one_in(16), null_out = one_in(16);
            why.add(null_recipe, "recipe NULL");
            why.add(null_out, "out NULL");
            Out<fp8amp_scaling> out;
            const fp8amp_status s = call("fp8amp_scaling_create", why, [&] { return fuzz_scaling_create(c, null_recipe ? nullptr : &r, dt, null_out ? nullptr : out.ptr()); });
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) born(META, out.value);
            break;
        }
        case 17: {  // scaling_destroy
            auto m = h<fp8amp_scaling>(META, why, "s", true);
            if (CALL(fp8amp_scaling_destroy, why, m) == FP8AMP_SUCCESS && m) died(META, m);
            break;
        }
        case 18:
        case 19: {  // the other scaling calls
            auto m = h<fp8amp_scaling>(META, why, "s");
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 7)) {
            case 0: CALL(fp8amp_scaling_update, why, m); break;
            case 1: {
                Out<float> a, b, c;
                s = CALL(fp8amp_scaling_get, why, m, one_in(3) ? nullptr : a.ptr(), one_in(3) ? nullptr : b.ptr(), one_in(3) ? nullptr : c.ptr());
                FUZZ_CHECK(s == FP8AMP_SUCCESS || (a.unchanged() && b.unchanged() && c.unchanged()), "scaling_get wrote on failure");
                break;
            }
            case 2: {
                const int32_t cap = in.ConsumeIntegralInRange<int32_t>(-1, 20);
                why.add(cap < 0, "negative capacity");
                float *hist = static_cast<float *>(buffer(sizeof(float) * static_cast<size_t>(cap > 0 ? cap : 0)));
                const bool null_h = one_in(10);
                why.add(null_h, "history NULL");
                std::vector<float> copy(hist, hist + (cap > 0 ? cap : 0));
                s = CALL(fp8amp_scaling_get_history, why, m, cap, null_h ? nullptr : hist);
                if (s != FP8AMP_SUCCESS) FUZZ_CHECK(same(copy.data(), hist, copy.size() * 4), "get_history wrote on failure");
                break;
            }
            case 3: {
                float v;
                switch (in.ConsumeIntegralInRange<int>(0, 7)) {
                case 0: v = NAN; break;
                case 1: v = INFINITY; break;
                case 2: v = 0.0f; break;
                case 3: v = -2.0f; break;
                case 4: v = 1e-40f; break;  // subnormal
                default: v = std::ldexp(in.ConsumeProbability<float>() + 0.5f, in.ConsumeIntegralInRange<int>(-126, 127));
                }
                why.add(!(v >= FLT_MIN && v <= FLT_MAX), "scale not a normal float > 0");
                CALL(fp8amp_scaling_set_scale, why, m, v);
                break;
            }
            case 4: CALL(fp8amp_scaling_enable_stats, why, m, in.ConsumeIntegral<int32_t>()); break;
            case 5: {
                const bool null_out = one_in(8);
                why.add(null_out, "stats NULL");
                Out<fp8amp_scaling_stats> o;
                s = CALL(fp8amp_scaling_get_stats, why, m, null_out ? nullptr : o.ptr());
                UNCHANGED_ON_FAILURE(s, o);
                break;
            }
            case 6: CALL(fp8amp_scaling_reset_stats, why, m); break;
            default: {  // update_many over a list that may hold duplicates and bad entries
                Why w;
                auto c = h<fp8amp_context>(CTX, w, "ctx");
                int32_t n = in.ConsumeIntegralInRange<int32_t>(0, 6);
                if (one_in(10)) n = in.ConsumeIntegralInRange<int32_t>(-3, -1);
                w.add(n < 0, "n < 0");
                std::vector<fp8amp_scaling> list(static_cast<size_t>(n > 0 ? n : 1));
                for (int32_t i = 0; i < n; ++i) list[static_cast<size_t>(i)] = h<fp8amp_scaling>(META, w, "entry");
                for (int32_t i = 0; i < n; ++i)
                    for (int32_t j = 0; j < i; ++j) w.add(list[static_cast<size_t>(i)] == list[static_cast<size_t>(j)], "a meta listed twice");
                const bool null_list = n > 0 && one_in(10);
                w.add(null_list, "metas NULL");
                CALL(fp8amp_scaling_update_many, w, c, n, null_list ? nullptr : list.data());
            }
            }
            break;
        }
        case 20: {  // tensor_set_scaling / tensor_scale_inv
            auto t = h<fp8amp_tensor>(TENSOR, why, "t");
            if (in.ConsumeBool()) {
                auto m = h<fp8amp_scaling>(META, why, "s", true);
                CALL(fp8amp_tensor_set_scaling, why, t, m);
            } else {
                const bool null_out = one_in(8);
                why.add(null_out, "out NULL");
                Out<fp8amp_tensor> out;
                const fp8amp_status s = CALL(fp8amp_tensor_scale_inv, why, t, null_out ? nullptr : out.ptr());
                UNCHANGED_ON_FAILURE(s, out);
                if (s == FP8AMP_SUCCESS) born(TENSOR, out.value);
            }
            break;
        }
        case 21: {  // linear_create with a hostile desc
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            fp8amp_linear_desc d;
            fp8amp_linear_desc_init_default(&d);
            if (one_in(3)) fp8amp_opt_level_config(static_cast<fp8amp_opt_level>(in.ConsumeIntegralInRange<int>(1, 3)), &d, nullptr);
            if (one_in(12)) { d.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, 8); why.add(small_size_refused(d.struct_size, kSize010LinearDesc), "struct_size small"); }
            d.in_features = one_in(10) ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(1, 24);
            d.out_features = one_in(10) ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(1, 24);
            why.add(d.in_features < 1 || d.out_features < 1, "features < 1");
            if (d.in_features > 4096 || d.out_features > 4096) {
                if (!why.bad()) break;  // valid but huge: not this target's business
            }
            d.has_bias = in.ConsumeIntegralInRange<int32_t>(0, 1);
            if (one_in(4)) {
                const int v = enumv(0, 4, why, "weight_dtype");
                store(d.weight_dtype, v);
                why.add(v == FP8AMP_DTYPE_E5M2, "weight_dtype e5m2");
            }
            if (one_in(4)) {
                const int v = enumv(0, 4, why, "wgrad_dtype");
                store(d.wgrad_dtype, v);
                why.add(v == FP8AMP_DTYPE_F16 || v == FP8AMP_DTYPE_E5M2, "wgrad_dtype");
            }
            if (one_in(4)) store(d.policy, enumv(0, 2, why, "policy"));
            if (one_in(4)) store(d.recipe.mode, enumv(0, 1, why, "recipe.mode"));
            if (one_in(6)) { d.recipe.amax_history_len = in.ConsumeIntegralInRange<int32_t>(-1, 3); why.add(d.recipe.amax_history_len < 1, "history len"); }
            if (one_in(6)) { d.graph_replay = in.ConsumeIntegralInRange<int32_t>(-1, 2); why.add(d.graph_replay != 0 && d.graph_replay != 1, "graph_replay"); }
            const bool null_desc = one_in(16), null_out = one_in(16);
            why.add(null_desc, "desc NULL");
            why.add(null_out, "out NULL");
            Out<fp8amp_linear> out;
            const fp8amp_status s = CALL(fp8amp_linear_create, why, c, null_desc ? nullptr : &d, null_out ? nullptr : out.ptr());
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) born(LINEAR, out.value);
            break;
        }
        case 22: {  // linear_destroy
            auto l = h<fp8amp_linear>(LINEAR, why, "lin", true);
            if (CALL(fp8amp_linear_destroy, why, l) == FP8AMP_SUCCESS && l) died(LINEAR, l);
            break;
        }
        case 23:
        case 24: {  // linear accessors
            auto l = h<fp8amp_linear>(LINEAR, why, "lin");
            const bool null_out = one_in(10);
            why.add(null_out, "out NULL");
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 8)) {
            case 7: {
                const int64_t rows = one_in(4) ? in.ConsumeIntegral<int64_t>() : in.ConsumeIntegralInRange<int64_t>(1, 1 << 20);
                why.add(rows < 1, "rows < 1");
                Out<fp8amp_gemm_kind> o;
                s = CALL(fp8amp_linear_choose_gemm, why, l, rows, in.ConsumeIntegralInRange<int32_t>(0, 2),
                         null_out ? nullptr : o.ptr());
                UNCHANGED_ON_FAILURE(s, o);
                break;
            }
            case 0: { Out<fp8amp_tensor> o; s = CALL(fp8amp_linear_weight, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); if (!s) born(TENSOR, o.value); break; }
            case 1: { Out<fp8amp_tensor> o; s = CALL(fp8amp_linear_bias, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); if (!s) born(TENSOR, o.value); break; }
            case 2: { Out<fp8amp_tensor> o; s = CALL(fp8amp_linear_weight_grad, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); if (!s) born(TENSOR, o.value); break; }
            case 3: { Out<fp8amp_tensor> o; s = CALL(fp8amp_linear_bias_grad, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); if (!s) born(TENSOR, o.value); break; }
            case 4: {
                const int role = enumv(0, 4, why, "role");
                Out<fp8amp_scaling> o;
                s = call("fp8amp_linear_scaling", why, [&] { return fuzz_linear_scaling(l, role, null_out ? nullptr : o.ptr()); });
                UNCHANGED_ON_FAILURE(s, o);
                if (!s) born(META, o.value);
                break;
            }
            case 5: { Out<fp8amp_gemm_kind> o; s = CALL(fp8amp_linear_gemm_kind, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            case 6: { Out<uint64_t> o; s = CALL(fp8amp_linear_graph_replays, why, l, null_out ? nullptr : o.ptr()); UNCHANGED_ON_FAILURE(s, o); break; }
            default: {
                Why w;
                w.add(why.bad() && !null_out, why.reasons);
                CALL(fp8amp_linear_weight_changed, w, l);
            }
            }
            break;
        }
        case 25:
        case 26: {  // linear forward (wide or FP8 input) / backward
            auto l = h<fp8amp_linear>(LINEAR, why, "lin");
            const int which = in.ConsumeIntegralInRange<int>(0, 2);
            if (which == 0) {
                auto x = h<fp8amp_tensor>(TENSOR, why, "x"), y = h<fp8amp_tensor>(TENSOR, why, "y");
                CALL(fp8amp_linear_forward, why, l, x, y, in.ConsumeIntegralInRange<int32_t>(0, 2));
            } else if (which == 1) {
                auto x8 = h<fp8amp_tensor>(TENSOR, why, "x8"), y = h<fp8amp_tensor>(TENSOR, why, "y");
                CALL(fp8amp_linear_forward_fp8, why, l, x8, y, in.ConsumeIntegralInRange<int32_t>(0, 2));
            } else {
                auto dy = h<fp8amp_tensor>(TENSOR, why, "dy"), dx = h<fp8amp_tensor>(TENSOR, why, "dx", true);
                CALL(fp8amp_linear_backward, why, l, dy, dx, in.ConsumeIntegralInRange<int32_t>(0, 1));
            }
            break;
        }
        case 27: {  // optimizer_create with a hostile desc
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            fp8amp_adam_desc d;
            fp8amp_opt_level_adam_config(static_cast<fp8amp_opt_level>(in.ConsumeIntegralInRange<int>(1, 3)), &d);
            // Below this library's size, only 0.1.0's layout is valid (docs/api.md 1.6: accepted
            // forever, the fields added since -- master_rounding, rounding_seed, which this case
            // leaves alone -- at their defaults).
            if (one_in(12)) {
                d.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof d - 1);
                why.add(small_size_refused(d.struct_size, kSize010AdamDesc), "struct_size small");
            }
            if (one_in(3)) d.lr = hyper(0.0f, 0.1f, why, "lr");
            if (one_in(4)) { d.beta1 = hyper(0.0f, 0.999f, why, "beta1"); if (one_in(4)) { d.beta1 = 1.0f; why.add(true, "beta1 1"); } }
            if (one_in(4)) { d.beta2 = hyper(0.0f, 0.9999f, why, "beta2"); if (one_in(4)) { d.beta2 = 1.0f; why.add(true, "beta2 1"); } }
            if (one_in(4)) d.eps = hyper(0.0f, 1e-6f, why, "eps");
            if (one_in(4)) d.weight_decay = hyper(0.0f, 0.1f, why, "weight_decay");
            if (one_in(4)) d.max_grad_norm = hyper(0.0f, 2.0f, why, "max_grad_norm");
            if (one_in(6)) { const int v = enumv(0, 4, why, "exp_avg_dtype"); store(d.exp_avg_dtype, v); why.add(v != FP8AMP_DTYPE_F32 && v != FP8AMP_DTYPE_E4M3, "exp_avg_dtype"); }
            if (one_in(6)) { const int v = enumv(0, 4, why, "exp_avg_sq_dtype"); store(d.exp_avg_sq_dtype, v); why.add(v != FP8AMP_DTYPE_F32 && v != FP8AMP_DTYPE_F16, "exp_avg_sq_dtype"); }
            if (one_in(6)) { d.master_dtype = in.ConsumeIntegralInRange<int32_t>(-2, 5); why.add(d.master_dtype != FP8AMP_NO_MASTER && d.master_dtype != FP8AMP_DTYPE_F16, "master_dtype"); }
            if (one_in(6)) {
                d.state_block_size = one_in(2) ? in.ConsumeIntegral<int32_t>() : (1 << in.ConsumeIntegralInRange<int>(5, 14));
                const int32_t b = d.state_block_size;
                why.add(b != 0 && (b < 128 || b > FP8AMP_MAX_STATE_BLOCK || (b & (b - 1)) != 0), "state_block_size");
            }
            const bool null_desc = one_in(16), null_out = one_in(16);
            why.add(null_desc, "desc NULL");
            why.add(null_out, "out NULL");
            Out<fp8amp_optimizer> out;
            const fp8amp_status s = CALL(fp8amp_optimizer_create, why, c, null_desc ? nullptr : &d, null_out ? nullptr : out.ptr());
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) born(OPT, out.value);
            break;
        }
        case 28: {  // optimizer_destroy
            auto o = h<fp8amp_optimizer>(OPT, why, "opt", true);
            if (CALL(fp8amp_optimizer_destroy, why, o) == FP8AMP_SUCCESS && o) died(OPT, o);
            break;
        }
        case 29:
        case 30: {  // add_param
            auto o = h<fp8amp_optimizer>(OPT, why, "opt");
            auto p = h<fp8amp_tensor>(TENSOR, why, "param"), g = h<fp8amp_tensor>(TENSOR, why, "grad");
            CALL(fp8amp_optimizer_add_param, why, o, p, g);
            break;
        }
        case 31:
        case 32: {  // step with hostile args
            auto o = h<fp8amp_optimizer>(OPT, why, "opt");
            fp8amp_adam_step_args a;
            fp8amp_adam_step_args_init_default(&a);
            if (one_in(12)) { a.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof a - 1); why.add(small_size_refused(a.struct_size, kSize010StepArgs), "struct_size small"); }
            if (one_in(3)) a.lr = hyper(0.0f, 0.1f, why, "lr", true);  // negative = the desc's lr
            if (std::isinf(a.lr) && a.lr < 0) {
                if (g_skip_step_lr_inf) a.lr = -1.0f;
                else why.add(true, "lr -inf");
            }
            if (one_in(4)) a.grad_scale_inv = hyper(0.0f, 2.0f, why, "grad_scale_inv", true);
            if (one_in(8)) a.lr_device = &lr_on_device;
            if (one_in(4)) a.scaler = h<fp8amp_grad_scaler>(SCALER, why, "args->scaler", true);
            const bool null_args = one_in(6);
            Why w = null_args ? Why() : why;
            if (null_args) w.add(why.reasons.find("opt ") != std::string::npos, why.reasons);
            CALL(fp8amp_optimizer_step, w, o, null_args ? nullptr : &a);
            break;
        }
        case 33: {  // optimizer getters
            auto o = h<fp8amp_optimizer>(OPT, why, "opt");
            const bool null_out = one_in(8);
            why.add(null_out, "out NULL");
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 4)) {
            case 0: { Out<int32_t> v; s = CALL(fp8amp_optimizer_get_found_inf, why, o, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 1: { Out<int64_t> v; s = CALL(fp8amp_optimizer_get_step, why, o, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 2: { Out<float> v; s = CALL(fp8amp_optimizer_get_grad_norm, why, o, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 3: { Out<int32_t> v; s = CALL(fp8amp_optimizer_num_params, why, o, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            default: { Out<size_t> v; s = CALL(fp8amp_optimizer_state_bytes, why, o, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); }
            }
            break;
        }
        case 34: {  // save into a buffer of a hostile capacity; load of its bytes, mutated now and then
            auto o = h<fp8amp_optimizer>(OPT, why, "opt");
            Out<size_t> need;
            const fp8amp_status s0 = CALL(fp8amp_optimizer_save, why, o, nullptr, 0, need.ptr());
            UNCHANGED_ON_FAILURE(s0, need);
            if (s0 != FP8AMP_SUCCESS || need.value > (1u << 20)) break;
            size_t cap = need.value;
            if (one_in(4)) cap = in.ConsumeIntegralInRange<size_t>(0, need.value);
            Why w;
            w.add(cap < need.value, "capacity too small");
            const bool null_size = one_in(10);
            w.add(null_size, "size NULL");
            unsigned char *b = static_cast<unsigned char *>(buffer(cap));
            std::vector<unsigned char> copy(b, b + cap);
            Out<size_t> size;
            const fp8amp_status s = CALL(fp8amp_optimizer_save, w, o, b, cap, null_size ? nullptr : size.ptr());
            UNCHANGED_ON_FAILURE(s, size);
            if (s != FP8AMP_SUCCESS) {
                FUZZ_CHECK(same(copy.data(), b, cap), "a failed save wrote its buffer");
                break;
            }
            if (one_in(2) && cap) b[in.ConsumeIntegralInRange<size_t>(0, cap - 1)] ^= static_cast<unsigned char>(1u << in.ConsumeIntegralInRange<int>(0, 7));
            Why w2;
            auto o2 = h<fp8amp_optimizer>(OPT, w2, "opt");
            const bool null_data = one_in(10);
            w2.add(null_data, "data NULL");
            CALL(fp8amp_optimizer_load, w2, o2, null_data ? nullptr : b, size.value);
            break;
        }
        case 35: {  // grad_scaler_create
            auto c = h<fp8amp_context>(CTX, why, "ctx");
            fp8amp_grad_scaler_desc d;
            fp8amp_grad_scaler_desc_init_default(&d);
            if (one_in(12)) { d.struct_size = in.ConsumeIntegralInRange<uint32_t>(0, sizeof d - 1); why.add(small_size_refused(d.struct_size, kSize010ScalerDesc), "struct_size small"); }
            if (one_in(3)) { d.init_scale = hyper(1.0f, 70000.0f, why, "init_scale"); if (one_in(4)) { d.init_scale = 1e-40f; why.add(true, "init_scale subnormal"); } }
            if (one_in(4)) { d.growth_factor = hyper(1.0f, 4.0f, why, "growth_factor"); why.add(!(d.growth_factor > 1.0f), "growth_factor <= 1"); }
            if (one_in(4)) { d.backoff_factor = hyper(0.0f, 1.0f, why, "backoff_factor"); why.add(!(d.backoff_factor > 0.0f && d.backoff_factor < 1.0f), "backoff_factor"); }
            if (one_in(4)) { d.growth_interval = in.ConsumeIntegralInRange<int32_t>(-2, 5); why.add(d.growth_interval < 1, "growth_interval"); }
            if (one_in(4)) { d.hysteresis = in.ConsumeIntegralInRange<int32_t>(-2, 5); why.add(d.hysteresis < 1, "hysteresis"); }
            const bool null_desc = one_in(16), null_out = one_in(16);
            why.add(null_desc, "desc NULL");
            why.add(null_out, "out NULL");
            Out<fp8amp_grad_scaler> out;
            const fp8amp_status s = CALL(fp8amp_grad_scaler_create, why, c, null_desc ? nullptr : &d, null_out ? nullptr : out.ptr());
            UNCHANGED_ON_FAILURE(s, out);
            if (s == FP8AMP_SUCCESS) born(SCALER, out.value);
            break;
        }
        case 36: {  // grad_scaler_destroy
            auto g = h<fp8amp_grad_scaler>(SCALER, why, "scaler", true);
            if (CALL(fp8amp_grad_scaler_destroy, why, g) == FP8AMP_SUCCESS && g) died(SCALER, g);
            break;
        }
        case 37: {  // grad scaler calls
            auto g = h<fp8amp_grad_scaler>(SCALER, why, "scaler");
            const bool null_out = one_in(8);
            fp8amp_status s;
            switch (in.ConsumeIntegralInRange<int>(0, 4)) {
            case 0: { why.add(null_out, "NULL"); Out<float> v; s = CALL(fp8amp_grad_scaler_get_scale, why, g, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 1: { why.add(null_out, "NULL"); Out<const float *> v; s = CALL(fp8amp_grad_scaler_scale_device_ptr, why, g, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 2: { why.add(null_out, "NULL"); Out<fp8amp_grad_scaler_state> v; s = CALL(fp8amp_grad_scaler_get_state, why, g, null_out ? nullptr : v.ptr()); UNCHANGED_ON_FAILURE(s, v); break; }
            case 3: {
                why.add(null_out, "NULL");
                fp8amp_grad_scaler_state st{1024.0f, 0, 1};
                if (one_in(2)) { st.scale = hyper(1.0f, 1e6f, why, "scale"); if (one_in(4)) { st.scale = 0.0f; why.add(true, "scale 0"); } }
                if (one_in(3)) { st.growth_tracker = in.ConsumeIntegral<int32_t>(); why.add(st.growth_tracker < 0, "growth_tracker < 0"); }
                if (one_in(3)) { st.hysteresis_left = in.ConsumeIntegral<int32_t>(); why.add(st.hysteresis_left < 0, "hysteresis_left < 0"); }
                CALL(fp8amp_grad_scaler_set_state, why, g, null_out ? nullptr : &st);
                break;
            }
            default: {
                auto o = h<fp8amp_optimizer>(OPT, why, "opt");
                CALL(fp8amp_grad_scaler_update, why, g, o);
            }
            }
            break;
        }
        case 38: {  // constant getters and init functions, hostile enums
            const int which = in.ConsumeIntegralInRange<int>(0, 14);
            const int v = in.ConsumeIntegralInRange<int>(-2, 14);
            switch (which) {
            case 0: FUZZ_CHECK(fuzz_status_name(v) != nullptr, "status_name NULL"); break;
            case 1: {
                if (g_skip_enums && (v < 0 || v > 4)) break;
                FUZZ_CHECK(fuzz_dtype_name(v) != nullptr, "dtype_name NULL");
                FUZZ_CHECK((fuzz_dtype_size(v) != 0) == (v >= 0 && v <= 4), "dtype_size of %d", v);
                break;
            }
            case 2: {
                if (g_skip_enums && (v < 1 || v > 2)) break;
                const bool null_out = one_in(4);
                why.add(null_out, "count NULL");
                why.add(v != 1 && v != 2, "unknown type");
                Out<int32_t> o;
                const fp8amp_status s = call("fp8amp_device_count", why, [&] { return fuzz_device_count(v, null_out ? nullptr : o.ptr()); });
                UNCHANGED_ON_FAILURE(s, o);
                break;
            }
            case 3: {
                if (g_skip_enums && (v < 1 || v > 3)) break;
                why.add(v < 1 || v > 3, "unknown level");
                const bool null_desc = one_in(4);
                why.add(null_desc, "desc NULL");
                Out<fp8amp_adam_desc> o;
                const fp8amp_status s = call("fp8amp_opt_level_adam_config", why, [&] { return fuzz_opt_level_adam_config(v, null_desc ? nullptr : o.ptr()); });
                UNCHANGED_ON_FAILURE(s, o);
                break;
            }
            case 4: {
                if (g_skip_enums && (v < 1 || v > 3)) break;
                why.add(v < 1 || v > 3, "unknown level");
                const bool n1 = one_in(2), n2 = one_in(2);
                why.add(n1 && n2, "both NULL");
                Out<fp8amp_linear_desc> a;
                Out<fp8amp_adam_desc> b;
                const fp8amp_status s = call("fp8amp_opt_level_config", why, [&] { return fuzz_opt_level_config(v, n1 ? nullptr : a.ptr(), n2 ? nullptr : b.ptr()); });
                FUZZ_CHECK(s == FP8AMP_SUCCESS || (a.unchanged() && b.unchanged()), "opt_level_config wrote on failure");
                break;
            }
            // The header spells the *_init_default names as macros over the sized inits (FP8AMP_0.2);
            // the FP8AMP_0 entry points of those names are reached by their parenthesized names.
            case 5: why.add(true, "NULL"); CALL((fp8amp_recipe_init_default), why, nullptr); break;
            case 6: why.add(true, "NULL"); CALL((fp8amp_adam_desc_init_default), why, nullptr); break;
            case 7: why.add(true, "NULL"); CALL((fp8amp_linear_desc_init_default), why, nullptr); break;
            case 8: why.add(true, "NULL"); CALL((fp8amp_grad_scaler_desc_init_default), why, nullptr); break;
            case 9: why.add(true, "NULL"); CALL((fp8amp_adam_step_args_init_default), why, nullptr); break;
            case 10: why.add(true, "NULL"); CALL(fp8amp_recipe_init, why, nullptr, sizeof(fp8amp_recipe)); break;
            case 11: why.add(true, "NULL"); CALL(fp8amp_adam_desc_init, why, nullptr, sizeof(fp8amp_adam_desc)); break;
            case 12: why.add(true, "NULL"); CALL(fp8amp_linear_desc_init, why, nullptr, sizeof(fp8amp_linear_desc)); break;
            case 13: why.add(true, "NULL"); CALL(fp8amp_grad_scaler_desc_init, why, nullptr, sizeof(fp8amp_grad_scaler_desc)); break;
            default: why.add(true, "NULL"); CALL(fp8amp_adam_step_args_init, why, nullptr, sizeof(fp8amp_adam_step_args)); break;
            }
            break;
        }
        case 39: {  // the fused norm and activation calls; an optimizer's state as tensors
            // Op 39 was a setup step before these calls existed, and the corpus's reproducers of fixed
            // defects (regression-*) begin with it, with no context yet: that case still does what the
            // setup did (a CPU context, no byte consumed), so that they decode as before.
            if (live[CTX].empty()) {
                fp8amp_context c = nullptr;
                if (fp8amp_context_create({FP8AMP_DEVICE_CPU, 0}, &c) == FP8AMP_SUCCESS) born(CTX, c);
                break;
            }
            switch (in.ConsumeIntegralInRange<int>(0, 2)) {
            case 0: fused_hostile(why); break;
            case 1: fused_well_formed(); break;
            default: param_state(why);
            }
            break;
        }
        case 42:
        case 43: {  // a well-formed optimizer over 1..3 fresh parameters (some bound to metas)
            Why w;
            auto c = h<fp8amp_context>(CTX, w, "ctx");
            if (w.bad() || !c) break;
            fp8amp_adam_desc d;
            fuzz_opt_level_adam_config(in.ConsumeIntegralInRange<int>(1, 3), &d);
            fp8amp_optimizer o = nullptr;
            if (call("fp8amp_optimizer_create", w, [&] { return fp8amp_optimizer_create(c, &d, &o); }) != FP8AMP_SUCCESS) break;
            born(OPT, o);
            const int n = in.ConsumeIntegralInRange<int>(1, 3);
            for (int i = 0; i < n; ++i) {
                static const fp8amp_dtype kParam[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_E4M3};
                static const fp8amp_dtype kGrad[] = {FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F16, FP8AMP_DTYPE_BF16};
                const fp8amp_dtype pd = in.PickValueInArray(kParam), gd = in.PickValueInArray(kGrad);
                const int64_t shape[2] = {in.ConsumeIntegralInRange<int64_t>(1, 6), in.ConsumeIntegralInRange<int64_t>(1, 40)};
                fp8amp_tensor p = nullptr, g = nullptr;
                if (fp8amp_tensor_create(c, pd, 2, shape, &p) != FP8AMP_SUCCESS) break;
                born(TENSOR, p);
                if (fp8amp_tensor_create(c, gd, 2, shape, &g) != FP8AMP_SUCCESS) break;
                born(TENSOR, g);
                std::vector<unsigned char> bytes(tensor_nbytes(p) + tensor_nbytes(g));
                for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<unsigned char>(0x30 + (k * 7 + i) % 0x10);  // finite codes
                fp8amp_tensor_copy_from_host(p, bytes.data(), tensor_nbytes(p));
                fp8amp_tensor_copy_from_host(g, bytes.data() + tensor_nbytes(p), tensor_nbytes(g));
                if (pd == FP8AMP_DTYPE_F16 || pd == FP8AMP_DTYPE_E4M3) {
                    fp8amp_recipe r;
                    fp8amp_recipe_init_default(&r);
                    r.amax_history_len = 2;
                    fp8amp_scaling m = nullptr;
                    if (fuzz_scaling_create(c, &r, pd, &m) != FP8AMP_SUCCESS) break;
                    born(META, m);
                    fp8amp_tensor_set_scaling(p, m);
                }
                call("fp8amp_optimizer_add_param", w, [&] { return fp8amp_optimizer_add_param(o, p, g); });
            }
            break;
        }
        case 44:
        case 45: {  // a well-formed Linear with x, y, dy, dx, after a training forward (and maybe a backward)
            Why w;
            auto c = h<fp8amp_context>(CTX, w, "ctx");
            if (w.bad() || !c) break;
            fp8amp_linear_desc d;
            fp8amp_linear_desc_init_default(&d);
            fuzz_opt_level_config(in.ConsumeIntegralInRange<int>(1, 3), &d, nullptr);
            d.in_features = in.ConsumeIntegralInRange<int64_t>(1, 20);
            d.out_features = in.ConsumeIntegralInRange<int64_t>(1, 20);
            d.has_bias = in.ConsumeBool();
            d.policy = in.ConsumeBool() ? FP8AMP_GEMM_AUTO : FP8AMP_GEMM_NEVER_FP8;
            fp8amp_linear l = nullptr;
            if (call("fp8amp_linear_create", w, [&] { return fp8amp_linear_create(c, &d, &l); }) != FP8AMP_SUCCESS) break;
            born(LINEAR, l);
            const int64_t m = in.ConsumeIntegralInRange<int64_t>(1, 8);
            const int64_t xs[2] = {m, d.in_features}, ys[2] = {m, d.out_features};
            fp8amp_tensor x = nullptr, y = nullptr, dy = nullptr, dx = nullptr;
            if (fp8amp_tensor_create(c, FP8AMP_DTYPE_F32, 2, xs, &x) != FP8AMP_SUCCESS) break;
            born(TENSOR, x);
            if (fp8amp_tensor_create(c, FP8AMP_DTYPE_F32, 2, ys, &y) != FP8AMP_SUCCESS) break;
            born(TENSOR, y);
            if (fp8amp_tensor_create(c, FP8AMP_DTYPE_F32, 2, ys, &dy) != FP8AMP_SUCCESS) break;
            born(TENSOR, dy);
            if (fp8amp_tensor_create(c, FP8AMP_DTYPE_BF16, 2, xs, &dx) != FP8AMP_SUCCESS) break;
            born(TENSOR, dx);
            std::vector<float> v(static_cast<size_t>(m * (d.in_features + d.out_features)));
            for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>((k * 37 % 19) - 9) / 8.0f + 0.0625f;
            fp8amp_tensor_copy_from_host(x, v.data(), static_cast<size_t>(m * d.in_features) * 4);
            fp8amp_tensor_copy_from_host(dy, v.data() + m * d.in_features, static_cast<size_t>(m * d.out_features) * 4);
            if (call("fp8amp_linear_forward", w, [&] { return fp8amp_linear_forward(l, x, y, 1); }) == FP8AMP_SUCCESS && in.ConsumeBool())
                call("fp8amp_linear_backward", w, [&] { return fp8amp_linear_backward(l, dy, dx, 0); });
            break;
        }
        default: {  // a quick well-formed setup, so that deeper states are reached: ctx, tensors, meta
            Why w;
            if (live[CTX].empty()) {
                fp8amp_context c = nullptr;
                if (fp8amp_context_create({FP8AMP_DEVICE_CPU, 0}, &c) == FP8AMP_SUCCESS) born(CTX, c);
                break;
            }
            auto c = h<fp8amp_context>(CTX, w, "ctx");
            if (w.bad()) break;
            const auto dt = static_cast<fp8amp_dtype>(in.ConsumeIntegralInRange<int>(0, 4));
            const int64_t s[2] = {in.ConsumeIntegralInRange<int64_t>(1, 8), in.ConsumeIntegralInRange<int64_t>(1, 8)};
            fp8amp_tensor t = nullptr;
            if (fp8amp_tensor_create(c, dt, 2, s, &t) != FP8AMP_SUCCESS) break;
            born(TENSOR, t);
            std::vector<unsigned char> bytes(tensor_nbytes(t));
            for (auto &b : bytes) b = static_cast<unsigned char>(in.ConsumeIntegral<uint8_t>() | 1);
            fp8amp_tensor_copy_from_host(t, bytes.data(), bytes.size());
            if (dt == FP8AMP_DTYPE_F16 || dt == FP8AMP_DTYPE_E4M3 || dt == FP8AMP_DTYPE_E5M2) {
                fp8amp_recipe r;
                fp8amp_recipe_init_default(&r);
                r.amax_history_len = 4;
                r.mode = static_cast<fp8amp_scaling_mode>(in.ConsumeIntegralInRange<int>(0, 1));
                fp8amp_scaling m = nullptr;
                if (fp8amp_scaling_create(c, &r, dt, &m) == FP8AMP_SUCCESS) {
                    born(META, m);
                    fp8amp_tensor_set_scaling(t, m);
                }
            }
        }
        }
    }
}

void Session::teardown() {
    for (Kind k : {OPT, SCALER, LINEAR, META, TENSOR, CTX})
        for (void *v : live[k]) {
            fp8amp_status s = FP8AMP_SUCCESS;
            switch (k) {
            case OPT: s = fp8amp_optimizer_destroy(static_cast<fp8amp_optimizer>(v)); break;
            case SCALER: s = fp8amp_grad_scaler_destroy(static_cast<fp8amp_grad_scaler>(v)); break;
            case LINEAR: s = fp8amp_linear_destroy(static_cast<fp8amp_linear>(v)); break;
            case META: s = fp8amp_scaling_destroy(static_cast<fp8amp_scaling>(v)); break;
            case TENSOR: s = fp8amp_tensor_destroy(static_cast<fp8amp_tensor>(v)); break;
            case CTX: s = fp8amp_context_destroy(static_cast<fp8amp_context>(v)); break;
            default: break;
            }
            FUZZ_CHECK(s == FP8AMP_SUCCESS, "destroying a live %s handle: %s", kKindName[k], fp8amp_status_name(s));
        }
    for (DLManagedTensorVersioned *m : exports) m->deleter(m);
    FUZZ_CHECK(g_hooks.live_blocks == 0, "%ld blocks of the allocator hooks were never freed", g_hooks.live_blocks);
    for (void *b : buffers) std::free(b);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    if (const char *skip = std::getenv("FP8AMP_FUZZ_SKIP")) {
        const std::string s = skip;
        g_skip_enums = s.find("enums") != std::string::npos;
        g_skip_misaligned_alloc = s.find("misaligned_alloc") != std::string::npos;
        g_skip_failing_alloc = s.find("failing_alloc") != std::string::npos;
        g_skip_step_lr_inf = s.find("step_lr_inf") != std::string::npos;
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzedDataProvider in(data, size);
    g_hooks = Hooks{};
    Session session(in);
    session.run();
    session.teardown();
    return 0;
}
