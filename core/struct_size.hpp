// Option structs of the public API begin with uint32_t struct_size: the size of the struct the caller
// was compiled with (docs/api.md 1.6). Every function that takes one reads it through read_sized, so
// the rule is one piece of code: this library's layout, or a newer, larger one (its known prefix is
// read, the rest ignored), or an earlier layout named by the caller of read_sized (the fields added
// since take their values from `defaults`, the init function's struct). Only struct_size bytes of
// the caller's struct are read; any other size is INVALID_ARGUMENT.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "error.hpp"

namespace fp8amp {

// what: how the message names the struct ("desc", "args"); type: its C name; init: the function that
// fills it. first_layout: the size of an earlier layout also accepted (0: none), whose missing fields
// come from defaults.
template <class T>
T read_sized(const T &caller, const char *what, const char *type, const char *init, size_t first_layout = 0,
             const T &defaults = T{}) {
    const size_t size = caller.struct_size;
    if (size < sizeof(T) && (first_layout == 0 || size != first_layout)) {
        const std::string head = std::string(what) + "->struct_size is " + std::to_string(size);
        if (first_layout == 0)
            fail(FP8AMP_ERROR_INVALID_ARGUMENT, head + ", less than the " + std::to_string(sizeof(T)) + " bytes of " + type +
                                                    " (initialize it with " + init + ")");
        fail(FP8AMP_ERROR_INVALID_ARGUMENT, head + ": neither this library's " + type + " (" + std::to_string(sizeof(T)) +
                                                " bytes) nor its first layout (" + std::to_string(first_layout) +
                                                " bytes): initialize it with " + init);
    }
    T d = defaults;
    std::memcpy(&d, &caller, std::min(size, sizeof d));
    d.struct_size = sizeof d;
    return d;
}

}  // namespace fp8amp
