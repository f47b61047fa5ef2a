// libFuzzer target: fp8amp_optimizer_load of hostile checkpoints.
//
// Input: byte 0 picks the optimizer (level O1/O2/O3, state block 128 or per tensor, the parameter
// set: F32, BF16, scaled F16 and E4M3 parameters with F32/BF16/E5M2/F16 gradients); the rest is the
// checkpoint. The optimizer is built and stepped, saved, then given the checkpoint. Oracle: a refusal
// gives a specific status and a new message and leaves the optimizer as it was (its save is
// byte-identical to before); an accepted checkpoint is saved and loaded again, and a step with finite
// gradients leaves every parameter (and its scale_inv) finite.
//
// A checksum guards the format (core/checkpoint.cpp: CRC-32 of everything before the last 4 bytes,
// which hold it little-endian; bytes 16..24 hold the total size). Random bytes never get past it, so
// the custom mutator below mostly repairs the size and checksum after mutating, and now and then
// replaces the input by a fresh valid checkpoint of a random optimizer (random steps and values).
//
// FP8AMP_FUZZ_SKIP=finite (environment) leaves out the finiteness checks, to fuzz on past a known
// finding of the loader (values it should refuse) in a local run (docs/fuzzing.md).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint.hpp"
#include "fuzz_common.hpp"

extern "C" size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

namespace {

bool g_skip_finite = false;

#define OK(call) FUZZ_CHECK((call) == FP8AMP_SUCCESS, "%s", #call)

struct Rng {
    uint64_t s;
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.0f; }
    float value() {  // nonzero, either sign, a spread of magnitudes
        const float x = uniform(0.05f, 2.0f) * std::ldexp(1.0f, static_cast<int>(next() % 9) - 4);
        return (next() & 1) ? -x : x;
    }
};

struct Param {
    fp8amp_dtype pdtype, gdtype;
    int32_t ndim;
    int64_t shape[2];
};

struct Rig {
    fp8amp_context ctx = nullptr;
    fp8amp_optimizer opt = nullptr;
    std::vector<fp8amp_tensor> tensors;  // params, grads, scratch
    std::vector<fp8amp_tensor> params, grads;
    std::vector<fp8amp_scaling> metas;

    fp8amp_scaling meta(fp8amp_dtype dtype, int history) {
        fp8amp_recipe r;
        OK(fp8amp_recipe_init_default(&r));
        r.amax_history_len = history;
        fp8amp_scaling s = nullptr;
        OK(fp8amp_scaling_create(ctx, &r, dtype, &s));
        metas.push_back(s);
        return s;
    }
    fp8amp_tensor tensor(fp8amp_dtype dtype, int32_t ndim, const int64_t *shape) {
        fp8amp_tensor t = nullptr;
        OK(fp8amp_tensor_create(ctx, dtype, ndim, shape, &t));
        tensors.push_back(t);
        return t;
    }
    // Fills t with random values: through an F32 tensor and a cast, or a quantize for a bound one.
    void fill(fp8amp_tensor t, Rng &rng, bool bound) {
        int32_t ndim;
        int64_t shape[FP8AMP_MAX_NDIM], numel;
        OK(fp8amp_tensor_ndim(t, &ndim));
        OK(fp8amp_tensor_shape(t, FP8AMP_MAX_NDIM, shape));
        OK(fp8amp_tensor_numel(t, &numel));
        std::vector<float> host(static_cast<size_t>(numel));
        for (float &x : host) x = rng.value();
        fp8amp_tensor src = nullptr;
        OK(fp8amp_tensor_create(ctx, FP8AMP_DTYPE_F32, ndim, shape, &src));
        OK(fp8amp_tensor_copy_from_host(src, host.data(), host.size() * 4));
        OK(bound ? fp8amp_quantize(ctx, src, t) : fp8amp_cast(ctx, src, t));
        OK(fp8amp_tensor_destroy(src));
    }

    void build(uint8_t selector, Rng &rng) {
        const fp8amp_device cpu{FP8AMP_DEVICE_CPU, 0};
        OK(fp8amp_context_create(cpu, &ctx));
        const int level = 1 + selector % 3;
        fp8amp_adam_desc d;
        OK(fp8amp_opt_level_adam_config(static_cast<fp8amp_opt_level>(level), &d));
        d.state_block_size = (selector / 3) % 2 ? 0 : 128;
        d.max_grad_norm = (selector / 12) % 2 ? 1.0f : 0.0f;
        OK(fp8amp_optimizer_create(ctx, &d, &opt));
        std::vector<Param> set;
        const Param f32{FP8AMP_DTYPE_F32, FP8AMP_DTYPE_F32, 2, {3, 50}};
        const Param bf16{FP8AMP_DTYPE_BF16, FP8AMP_DTYPE_BF16, 1, {130, 0}};
        const Param f16{FP8AMP_DTYPE_F16, FP8AMP_DTYPE_E5M2, 2, {2, 3}};
        const Param e4m3{FP8AMP_DTYPE_E4M3, FP8AMP_DTYPE_F16, 1, {5, 0}};
        if ((selector / 6) % 2) {
            set = {e4m3};
        } else {
            if (level != 3) set.push_back(f32);  // an F32 parameter cannot have the F16 master
            set.push_back(bf16);
            set.push_back(f16);
            set.push_back(e4m3);
        }
        for (const Param &p : set) {
            fp8amp_tensor param = tensor(p.pdtype, p.ndim, p.shape), grad = tensor(p.gdtype, p.ndim, p.shape);
            const bool pbound = p.pdtype == FP8AMP_DTYPE_F16 || p.pdtype == FP8AMP_DTYPE_E4M3;
            const bool gbound = p.gdtype == FP8AMP_DTYPE_E5M2;
            if (pbound) OK(fp8amp_tensor_set_scaling(param, meta(p.pdtype, 3)));
            if (gbound) OK(fp8amp_tensor_set_scaling(grad, meta(p.gdtype, 2)));
            fill(param, rng, pbound);
            fill(grad, rng, gbound);
            OK(fp8amp_optimizer_add_param(opt, param, grad));
            params.push_back(param);
            grads.push_back(grad);
        }
    }
    void new_grads(Rng &rng) {
        for (fp8amp_tensor g : grads) {
            fp8amp_dtype dt;
            OK(fp8amp_tensor_dtype(g, &dt));
            fill(g, rng, dt == FP8AMP_DTYPE_E5M2);
        }
    }
    std::vector<uint8_t> save() {
        size_t n = 0;
        OK(fp8amp_optimizer_save(opt, nullptr, 0, &n));
        std::vector<uint8_t> bytes(n);
        size_t written = 0;
        OK(fp8amp_optimizer_save(opt, bytes.data(), n, &written));
        FUZZ_CHECK(written == n, "save wrote %zu of %zu bytes", written, n);
        return bytes;
    }
    ~Rig() {
        if (opt) OK(fp8amp_optimizer_destroy(opt));
        for (fp8amp_tensor t : tensors) OK(fp8amp_tensor_destroy(t));
        for (fp8amp_scaling s : metas) OK(fp8amp_scaling_destroy(s));
        if (ctx) OK(fp8amp_context_destroy(ctx));
    }
};

bool finite_code(fp8amp_dtype dt, const uint8_t *p) {
    switch (dt) {
    case FP8AMP_DTYPE_F32: {
        float x;
        std::memcpy(&x, p, 4);
        return std::isfinite(x);
    }
    case FP8AMP_DTYPE_F16: return ((p[1] << 8 | p[0]) & 0x7C00) != 0x7C00;
    case FP8AMP_DTYPE_BF16: return ((p[1] << 8 | p[0]) & 0x7F80) != 0x7F80;
    case FP8AMP_DTYPE_E4M3: return (p[0] & 0x7F) != 0x7F;
    case FP8AMP_DTYPE_E5M2: return (p[0] & 0x7C) != 0x7C;
    }
    return false;
}

void check_finite_params(Rig &rig, const char *when) {
    if (g_skip_finite) return;
    for (size_t i = 0; i < rig.params.size(); ++i) {
        fp8amp_tensor p = rig.params[i];
        fp8amp_dtype dt;
        size_t nbytes;
        OK(fp8amp_tensor_dtype(p, &dt));
        OK(fp8amp_tensor_nbytes(p, &nbytes));
        std::vector<uint8_t> host(nbytes);
        OK(fp8amp_tensor_copy_to_host(p, host.data(), nbytes));
        const size_t elem = fp8amp_dtype_size(dt);
        for (size_t k = 0; k < nbytes; k += elem)
            FUZZ_CHECK(finite_code(dt, &host[k]), "%s: parameter #%zu (%s) element %zu is not finite", when, i,
                       fp8amp_dtype_name(dt), k / elem);
        if (dt == FP8AMP_DTYPE_F16 || dt == FP8AMP_DTYPE_E4M3) {
            fp8amp_tensor si = nullptr;
            OK(fp8amp_tensor_scale_inv(p, &si));
            float x = 0.0f;
            OK(fp8amp_tensor_copy_to_host(si, &x, 4));
            OK(fp8amp_tensor_destroy(si));
            FUZZ_CHECK(std::isfinite(x) && x > 0.0f, "%s: parameter #%zu's scale_inv is %g", when, i, x);
        }
    }
}

void fix_envelope(uint8_t *ckpt, size_t n) {  // the size field and the checksum of a checkpoint
    if (n < 32) return;
    for (int k = 0; k < 8; ++k) ckpt[16 + k] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * k));
    const uint32_t crc = fp8amp::core::checkpoint::crc32(ckpt, n - 4);
    for (int k = 0; k < 4; ++k) ckpt[n - 4 + k] = static_cast<uint8_t>(crc >> (8 * k));
}

// A valid checkpoint of optimizer `selector` after a random number of steps of random gradients.
std::vector<uint8_t> fresh_checkpoint(uint8_t selector, Rng &rng) {
    Rig rig;
    rig.build(selector, rng);
    const int steps = static_cast<int>(rng.next() % 4);
    for (int s = 0; s < steps; ++s) {
        rig.new_grads(rng);
        fp8amp_adam_step_args a;
        OK(fp8amp_adam_step_args_init_default(&a));
        a.lr = rng.uniform(1e-4f, 1e-1f);
        OK(fp8amp_optimizer_step(rig.opt, &a));
        for (fp8amp_scaling m : rig.metas) OK(fp8amp_scaling_update(m));
    }
    std::vector<uint8_t> out(1, selector);
    const std::vector<uint8_t> bytes = rig.save();
    out.insert(out.end(), bytes.begin(), bytes.end());
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char *skip = std::getenv("FP8AMP_FUZZ_SKIP");
    g_skip_finite = skip && std::strstr(skip, "finite");
    return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    Rng rng{0x9E3779B97F4A7C15ull ^ seed};
    if (size < 2 || rng.next() % 32 == 0) {  // start again from a valid checkpoint
        const std::vector<uint8_t> fresh = fresh_checkpoint(static_cast<uint8_t>(rng.next() % 24), rng);
        if (fresh.size() <= max_size) {
            std::memcpy(data, fresh.data(), fresh.size());
            return fresh.size();
        }
    }
    size = LLVMFuzzerMutate(data, size, max_size);
    // Mostly keep the envelope valid, so that the loader's later checks are reached; sometimes leave
    // the mutation as it is (the envelope's own checks).
    if (size > 1 && rng.next() % 8 != 0) fix_envelope(data + 1, size - 1);
    return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t selector = data[0] % 24;
    Rng rng{0x2545F4914F6CDD1Dull + selector};
    Rig rig;
    rig.build(selector, rng);
    fp8amp_adam_step_args a;
    OK(fp8amp_adam_step_args_init_default(&a));
    OK(fp8amp_optimizer_step(rig.opt, &a));
    const std::vector<uint8_t> before = rig.save();

    // The loader gets a copy of exactly the checkpoint's bytes, so that ASan sees any read past them.
    std::vector<uint8_t> ckpt(data + 1, data + size);
    uint8_t *heap = static_cast<uint8_t *>(std::malloc(ckpt.size() ? ckpt.size() : 1));
    if (!ckpt.empty()) std::memcpy(heap, ckpt.data(), ckpt.size());
    fuzz::poison_message("fp8amp_optimizer_load");
    const fp8amp_status s = fp8amp_optimizer_load(rig.opt, heap, ckpt.size());
    FUZZ_CHECK(ckpt.empty() || std::memcmp(heap, ckpt.data(), ckpt.size()) == 0, "load wrote into its input");
    std::free(heap);
    if (s != FP8AMP_SUCCESS) {
        fuzz::check_failure("fp8amp_optimizer_load", s);
        const std::vector<uint8_t> after = rig.save();
        FUZZ_CHECK(after == before, "a refused checkpoint (%s) changed the optimizer", fp8amp_status_name(s));
        return 0;
    }
    check_finite_params(rig, "after an accepted load");
    // What was accepted saves and loads again.
    const std::vector<uint8_t> again = rig.save();
    const fp8amp_status s2 = fp8amp_optimizer_load(rig.opt, again.data(), again.size());
    FUZZ_CHECK(s2 == FP8AMP_SUCCESS, "the save of an accepted checkpoint was refused: %s", fp8amp_status_name(s2));
    // Two steps with finite gradients run (sanitizer-clean, SUCCESS). Their parameters are not
    // required to stay finite: the loader checks each value's domain, and finite values can still
    // make an update overflow (an m near FLT_MAX over a v near 0 gives m / (sqrt(v) + eps) > FLT_MAX),
    // as extreme but finite hyperparameters can in an optimizer made by fp8amp_optimizer_create. The
    // fuzzer found such a state; Adam's joint bound on m and v is not a per-field domain.
    rig.new_grads(rng);
    OK(fp8amp_optimizer_step(rig.opt, &a));
    for (fp8amp_scaling m : rig.metas) OK(fp8amp_scaling_update(m));
    OK(fp8amp_optimizer_step(rig.opt, &a));
    return 0;
}
