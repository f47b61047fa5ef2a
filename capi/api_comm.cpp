// The boundary of the communicators (fp8amp.h "Communicators"): argument checks, handle lookups and
// core calls; no engine logic.
#include <cmath>
#include <exception>
#include <vector>

#include "boundary.hpp"
#include "communicator.hpp"
#include "context.hpp"
#include "fp8amp/fp8amp.h"
#include "struct_size.hpp"
#include "tensor.hpp"

// The sized-struct rules of struct_size.hpp for fp8amp_comm_reduce_desc (new in 0.3.0: its first
// layout is this one). Found by argument-dependent lookup from the templates there, so they live
// beside the struct, in the global namespace, and struct_size.hpp needs no line for them.
inline constexpr size_t fields_end(const fp8amp_comm_reduce_desc *) { return offsetof(fp8amp_comm_reduce_desc, check) + 4; }
inline constexpr size_t released_size(const fp8amp_comm_reduce_desc *) { return sizeof(fp8amp_comm_reduce_desc); }

using fp8amp::fail;
using fp8amp::read_sized;
using fp8amp::capi::publish;
using fp8amp::capi::require;
using fp8amp::core::CommReduceOptions;
using fp8amp::core::Communicator;
using fp8amp::core::Context;
using fp8amp::core::lookup;
using fp8amp::core::Tensor;

namespace {

fp8amp_comm_reduce_desc default_reduce_desc() {
    fp8amp_comm_reduce_desc d{};
    d.struct_size = sizeof d;
    d.wire_dtype = FP8AMP_DTYPE_E4M3;
    d.average = 1;
    d.check = 1;
    return d;
}

CommReduceOptions options_of(const fp8amp_comm_reduce_desc *caller) {
    CommReduceOptions o;
    if (!caller) return o;
    const fp8amp_comm_reduce_desc d = read_sized(*caller, "desc", "fp8amp_comm_reduce_desc",
                                                 "fp8amp_comm_reduce_desc_init_default");
    fp8amp::core::check_dtype(d.wire_dtype, "desc->wire_dtype");
    if (d.average != 0 && d.average != 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->average is " + std::to_string(d.average) + ", not 0 or 1");
    if (d.check != 0 && d.check != 1)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, "desc->check is " + std::to_string(d.check) + ", not 0 or 1");
    o.wire = d.wire_dtype;
    o.average = d.average != 0;
    o.check = d.check != 0;
    return o;
}

// The desc's options, or the error it gives kept in `error`: raised inside the cross-rank agreement,
// so that a bad desc on one rank fails the call on every rank instead of leaving the others waiting.
CommReduceOptions options_or_deferred_error(const fp8amp_comm_reduce_desc *desc, std::exception_ptr &error) {
    try {
        return options_of(desc);
    } catch (...) {
        error = std::current_exception();
        return CommReduceOptions{};
    }
}

}  // namespace

extern "C" {

FP8AMP_API fp8amp_status fp8amp_comm_unique_id_create(fp8amp_context ctx, fp8amp_comm_unique_id *id) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(id, "id");
        fp8amp_comm_unique_id out{};
        Communicator::unique_id(*c, &out);
        *id = out;
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_create(fp8amp_context ctx, const fp8amp_comm_unique_id *id, int32_t nranks,
                                            int32_t rank, fp8amp_comm *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(id, "id");
        require(out, "out");
        publish(Communicator::create(c, *id, nranks, rank), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_adopt(fp8amp_context ctx, void *native, fp8amp_comm *out) {
    FP8AMP_GUARD({
        auto c = lookup<Context>(ctx, "ctx");
        require(native, "native");
        require(out, "out");
        publish(Communicator::adopt(c, native), out);
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_destroy(fp8amp_comm comm) {
    FP8AMP_GUARD({
        if (comm) fp8amp::core::unregister_object(comm, Communicator::kKind, "comm");
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_abort(fp8amp_comm comm) {
    FP8AMP_GUARD({ lookup<Communicator>(comm, "comm")->abort(); });
}

FP8AMP_API fp8amp_status fp8amp_comm_rank(fp8amp_comm comm, int32_t *rank) {
    FP8AMP_GUARD({
        auto c = lookup<Communicator>(comm, "comm");
        require(rank, "rank");
        *rank = c->rank();
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_size(fp8amp_comm comm, int32_t *nranks) {
    FP8AMP_GUARD({
        auto c = lookup<Communicator>(comm, "comm");
        require(nranks, "nranks");
        *nranks = c->nranks();
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_set_timeout(fp8amp_comm comm, double seconds) {
    FP8AMP_GUARD({
        auto c = lookup<Communicator>(comm, "comm");
        if (!(seconds > 0.0) || !std::isfinite(seconds))
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, "seconds is " + std::to_string(seconds) + ", not a finite value > 0");
        c->set_timeout(seconds);
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_get_saturated(fp8amp_comm comm, uint64_t *count) {
    FP8AMP_GUARD({
        auto c = lookup<Communicator>(comm, "comm");
        require(count, "count");
        *count = c->saturated();
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_reduce_desc_init(fp8amp_comm_reduce_desc *desc, size_t size) {
    FP8AMP_GUARD({
        require(desc, "desc");
        fp8amp::write_sized(desc, size, default_reduce_desc(), "fp8amp_comm_reduce_desc");
    });
}

// The collectives: a bad handle among the tensors, or a bad desc, is this rank's refusal of its
// arguments, which the other ranks must hear of (Communicator::agreed) rather than wait for a call
// that never comes; a bad desc is refused as if its check were the default (on). Only a bad comm
// fails locally at once: there is nothing to tell the others through.
FP8AMP_API fp8amp_status fp8amp_comm_all_reduce(fp8amp_comm comm, int32_t n, const fp8amp_tensor *inputs,
                                                const fp8amp_tensor *outputs, const fp8amp_comm_reduce_desc *desc) {
    return fp8amp::capi::guarded(__func__, [&]() {
        auto c = lookup<Communicator>(comm, "comm");
        std::exception_ptr desc_error;  // a bad desc: refused with the default check, so that the others hear of it
        const CommReduceOptions o = options_or_deferred_error(desc, desc_error);
        std::vector<std::shared_ptr<Tensor>> in, out;
        c->agreed(o.check, "fp8amp_comm_all_reduce", [&] {
            if (desc_error) std::rethrow_exception(desc_error);
            if (n < 1) fail(FP8AMP_ERROR_INVALID_ARGUMENT, "n is " + std::to_string(n) + ", not >= 1");
            require(inputs, "inputs");
            require(outputs, "outputs");
            in = fp8amp::core::lookup_many<Tensor>(reinterpret_cast<const void *const *>(inputs), n, "inputs");
            out = fp8amp::core::lookup_many<Tensor>(reinterpret_cast<const void *const *>(outputs), n, "outputs");
            return Communicator::Signature{};  // the real check follows in all_reduce
        }, /*local_only=*/true);
        c->all_reduce(in, out, o);
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_reduce_scatter(fp8amp_comm comm, fp8amp_tensor input, fp8amp_tensor output,
                                                    const fp8amp_comm_reduce_desc *desc) {
    return fp8amp::capi::guarded(__func__, [&]() {
        auto c = lookup<Communicator>(comm, "comm");
        std::exception_ptr desc_error;
        const CommReduceOptions o = options_or_deferred_error(desc, desc_error);
        std::shared_ptr<Tensor> in, out;
        c->agreed(o.check, "fp8amp_comm_reduce_scatter", [&] {
            if (desc_error) std::rethrow_exception(desc_error);
            in = lookup<Tensor>(input, "input");
            out = lookup<Tensor>(output, "output");
            return Communicator::Signature{};
        }, true);
        c->reduce_scatter(in, out, o);
    });
}

FP8AMP_API fp8amp_status fp8amp_comm_all_gather(fp8amp_comm comm, fp8amp_tensor input, fp8amp_tensor output,
                                                fp8amp_tensor output_scale_inv, const fp8amp_comm_reduce_desc *desc) {
    return fp8amp::capi::guarded(__func__, [&]() {
        auto c = lookup<Communicator>(comm, "comm");
        std::exception_ptr desc_error;
        const CommReduceOptions o = options_or_deferred_error(desc, desc_error);
        std::shared_ptr<Tensor> in, out, si;
        c->agreed(o.check, "fp8amp_comm_all_gather", [&] {
            if (desc_error) std::rethrow_exception(desc_error);
            in = lookup<Tensor>(input, "input");
            out = lookup<Tensor>(output, "output");
            if (output_scale_inv) si = lookup<Tensor>(output_scale_inv, "output_scale_inv");
            return Communicator::Signature{};
        }, true);
        c->all_gather(in, out, si, o.check);
    });
}

}  // extern "C"

static_assert(sizeof(fp8amp_comm_unique_id) == FP8AMP_COMM_UNIQUE_ID_BYTES, "the id's size is part of the ABI");
