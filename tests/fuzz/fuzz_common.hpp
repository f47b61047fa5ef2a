// What the fuzz targets share: the oracle on a call's status and message, and the abort that makes
// libFuzzer keep an input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fp8amp/fp8amp.h"

// A failed expectation is a finding: print it and abort, so that libFuzzer saves the input.
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            std::fprintf(stderr, "\nfuzz check failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                                      \
            std::fprintf(stderr, "\n  last error message: \"%s\"\n", fp8amp_last_error_message());  \
            std::abort();                                                                           \
        }                                                                                           \
    } while (0)

// A request for more memory than there is must come back as NULL (the library then answers
// OUT_OF_MEMORY, which the oracle checks), not abort the run as ASan does by default. Included by
// exactly one translation unit per target.
extern "C" const char *__asan_default_options() { return "allocator_may_return_null=1"; }

namespace fuzz {

// Sets the thread's message to one that `function` cannot write (a failure of another function),
// so that a failing call of `function` is seen to set a new message of its own.
inline void poison_message(const char *function) {
    if (std::strcmp(function, "fp8amp_context_device") != 0)
        fp8amp_context_device(nullptr, nullptr);
    else
        fp8amp_tensor_nbytes(nullptr, nullptr);
}

// The statuses bad input may give: specific ones, never INTERNAL (nor an unknown value).
inline bool specific_status(fp8amp_status s) {
    return s >= FP8AMP_ERROR_INVALID_ARGUMENT && s <= FP8AMP_ERROR_CORRUPT_DATA;
}

// A failing call: a specific status and a fresh message "function: what", what not empty.
inline void check_failure(const char *function, fp8amp_status s) {
    FUZZ_CHECK(specific_status(s), "%s returned %d (%s)", function, static_cast<int>(s), fp8amp_status_name(s));
    const std::string msg = fp8amp_last_error_message();
    const std::string prefix = std::string(function) + ": ";
    FUZZ_CHECK(msg.compare(0, prefix.size(), prefix) == 0 && msg.size() > prefix.size(),
               "%s failed with %s but did not set a message of its own", function, fp8amp_status_name(s));
}

}  // namespace fuzz
