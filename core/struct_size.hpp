// Option structs of the public API begin with uint32_t struct_size: the size of the struct the caller
// was compiled with (docs/api.md 1.6). Every function that takes one reads it through read_sized, and
// every init function writes it through write_sized, so each rule is one piece of code:
// - this library's layout;
// - an earlier layout: 0.1.0's (released_size), or one named by the caller of read_sized (the fields
//   added since take their values from `defaults`, the init function's struct);
// - a newer, larger one (a caller built against a newer header): its known prefix is read, and the
//   rest -- the newer fields -- must be zero (the Linux kernel's copy_struct_from_user rule). A zero
//   there is what an init function of this library writes, and a field appended later must mean "as
//   before" at 0; a non-zero byte is a field the caller set that this library cannot honour, refused
//   with NOT_SUPPORTED rather than silently ignored. New fields begin at or after the old sizeof
//   (docs/api.md 1.6; tests/abi checks it): a field put in a struct's tail padding would leave the
//   size unchanged, and an older library could not tell it from padding, which C leaves undefined.
// Only struct_size bytes of the caller's struct are read or written; any other size is
// INVALID_ARGUMENT.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "error.hpp"

namespace fp8amp {

// The end of the last field this library knows of each option struct: the init functions write zeros
// from there (the tail padding too), so that what they write is fully defined. A new option struct
// adds a line.
inline constexpr size_t fields_end(const fp8amp_recipe *) { return offsetof(fp8amp_recipe, power_of_two_scales) + 4; }
inline constexpr size_t fields_end(const fp8amp_linear_desc *) { return offsetof(fp8amp_linear_desc, graph_replay) + 4; }
inline constexpr size_t fields_end(const fp8amp_adam_desc *) { return offsetof(fp8amp_adam_desc, rounding_seed) + 4; }
inline constexpr size_t fields_end(const fp8amp_adam_step_args *) {
    return offsetof(fp8amp_adam_step_args, scaler) + sizeof(fp8amp_grad_scaler);
}
inline constexpr size_t fields_end(const fp8amp_grad_scaler_desc *) {
    return offsetof(fp8amp_grad_scaler_desc, hysteresis) + 4;
}

// The sizes fp8amp 0.1.0 (the first release, FP8AMP_0) gave the structs: what the ..._init_default
// entry points of FP8AMP_0 write forever, since the binaries that call them were compiled with these,
// and a layout every later library accepts (read and init) once the struct has grown, the fields
// added since at their zero (which means the old behaviour: docs/api.md 1.6).
inline constexpr size_t kReleased010Recipe = 32, kReleased010LinearDesc = 80, kReleased010AdamDesc = 52,
                        kReleased010StepArgs = 32, kReleased010ScalerDesc = 24;
inline constexpr size_t released_size(const fp8amp_recipe *) { return kReleased010Recipe; }
inline constexpr size_t released_size(const fp8amp_linear_desc *) { return kReleased010LinearDesc; }
inline constexpr size_t released_size(const fp8amp_adam_desc *) { return kReleased010AdamDesc; }
inline constexpr size_t released_size(const fp8amp_adam_step_args *) { return kReleased010StepArgs; }
inline constexpr size_t released_size(const fp8amp_grad_scaler_desc *) { return kReleased010ScalerDesc; }
// Structs only grow; fp8amp_recipe, embedded in fp8amp_linear_desc, never does within FP8AMP_0.
static_assert(sizeof(fp8amp_recipe) == kReleased010Recipe, "fp8amp_recipe is frozen (docs/api.md 1.6)");
static_assert(sizeof(fp8amp_linear_desc) >= kReleased010LinearDesc && sizeof(fp8amp_adam_desc) >= kReleased010AdamDesc &&
                  sizeof(fp8amp_adam_step_args) >= kReleased010StepArgs &&
                  sizeof(fp8amp_grad_scaler_desc) >= kReleased010ScalerDesc,
              "an option struct shrank");

// The largest struct_size taken for a struct of a newer header: a bound on how far past the fields
// this library knows it reads or writes the caller's memory, so that a garbage struct_size (an
// uninitialized struct) is refused instead of read or cleared for gigabytes.
inline constexpr size_t kMaxStructSize = 4096;

namespace detail {
template <class T>
// hint: what the caller should do ("initialize it with ...").
void check_size(size_t size, const std::string &head, const char *type, const std::string &hint, size_t first_layout) {
    const bool known = size == sizeof(T) || size == released_size(static_cast<const T *>(nullptr)) ||
                       (first_layout != 0 && size == first_layout);
    const bool newer = size > sizeof(T) && size <= kMaxStructSize && size % alignof(T) == 0;
    if (known || newer) return;
    std::string what = std::string(head) + " is " + std::to_string(size);
    if (size > kMaxStructSize)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, what + ", more than the " + std::to_string(kMaxStructSize) +
                                                " bytes any " + type + " may have: an uninitialized struct? (" + hint + ")");
    if (size > sizeof(T))
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, what + ", not a multiple of the " + std::to_string(alignof(T)) +
                                                "-byte alignment of " + type + " (" + hint + ")");
    if (first_layout == 0)
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, what + ", less than the " + std::to_string(sizeof(T)) + " bytes of " + type +
                                                " (" + hint + ")");
    fail(FP8AMP_ERROR_INVALID_ARGUMENT, what + ": neither this library's " + type + " (" + std::to_string(sizeof(T)) +
                                            " bytes) nor its first layout (" + std::to_string(first_layout) +
                                            " bytes): " + hint);
}
}  // namespace detail

// what: how the message names the struct ("desc", "args"); type: its C name; init: the function that
// fills it. first_layout: the size of an earlier layout also accepted (0: none), whose missing fields
// come from defaults.
template <class T>
T read_sized(const T &caller, const char *what, const char *type, const char *init, size_t first_layout = 0,
             const T &defaults = T{}) {
    const size_t size = caller.struct_size;
    detail::check_size<T>(size, std::string(what) + "->struct_size", type, std::string("initialize it with ") + init,
                          first_layout);
    if (size > sizeof(T)) {
        // The caller's struct really is `size` bytes (it says so): the bytes past this library's struct.
        const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&caller);
        for (size_t i = sizeof(T); i < size; ++i)
            if (bytes[i] != 0)
                fail(FP8AMP_ERROR_NOT_SUPPORTED,
                     std::string(what) + "->struct_size is " + std::to_string(size) + ", more than the " +
                         std::to_string(sizeof(T)) + " bytes of this library's " + type + " (fp8amp " +
                         std::to_string(FP8AMP_VERSION_MAJOR) + "." + std::to_string(FP8AMP_VERSION_MINOR) + "." +
                         std::to_string(FP8AMP_VERSION_PATCH) + "), and byte " + std::to_string(i) +
                         " is not zero: it sets a field this library version does not support");
    }
    T d = defaults;
    std::memcpy(&d, &caller, std::min(size, sizeof d));
    d.struct_size = sizeof d;
    return d;
}

// The sized init functions: fills the caller's struct of `size` bytes (its sizeof where the caller was
// compiled) with `defaults`, writing exactly `size` bytes: an earlier layout gets its prefix of the
// defaults, a newer one the defaults then zeros (the value of every field this library does not know,
// which read_sized accepts). struct_size becomes `size`. The caller has checked that out is not NULL.
template <class T>
void write_sized(void *out, size_t size, const T &defaults, const char *type, size_t first_layout = 0) {
    detail::check_size<T>(size, "size", type, std::string("pass sizeof(") + type + ")", first_layout);
    unsigned char image[kMaxStructSize] = {};
    std::memcpy(image, &defaults, sizeof(T));
    // Padding too: zero, not whatever `defaults` held.
    std::memset(image + fields_end(&defaults), 0, sizeof(T) - fields_end(&defaults));
    const uint32_t struct_size = static_cast<uint32_t>(size);
    std::memcpy(image + offsetof(T, struct_size), &struct_size, sizeof struct_size);
    std::memcpy(out, image, size);
}

}  // namespace fp8amp
