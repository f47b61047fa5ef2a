// The one exception type of the engine. Kernels, core and capi all throw it; only capi catches it
// (together with everything else) and turns it into a status plus a thread-local message. It lives
// at the bottom layer so that the vocabulary flows downward: kernels never include core.
#pragma once

#include <stdexcept>
#include <string>

#include "fp8amp/fp8amp.h"

namespace fp8amp {

class Error : public std::runtime_error {
public:
    Error(fp8amp_status status, const std::string &message) : std::runtime_error(message), status_(status) {}
    fp8amp_status status() const noexcept { return status_; }

private:
    fp8amp_status status_;
};

[[noreturn]] inline void fail(fp8amp_status status, const std::string &message) { throw Error(status, message); }

}  // namespace fp8amp
