// What every extern "C" file of capi shares: the guard that turns any exception into a status and
// a thread-local message, and small argument helpers. Only capi includes it.
#pragma once

#include <memory>
#include <new>
#include <string>

#include "fp8amp/fp8amp.h"
#include "handles.hpp"  // core; with it fp8amp::Error (kernels/error.hpp, the vocabulary of every layer)

namespace fp8amp::capi {

// The thread-local message of fp8amp_last_error_message ("function: message").
void set_error(const char *function, const char *message) noexcept;
const char *last_error() noexcept;

template <class F>
fp8amp_status guarded(const char *function, F &&body) noexcept {
    try {
        body();
        return FP8AMP_SUCCESS;
    } catch (const Error &e) {
        set_error(function, e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        set_error(function, "out of host memory");
        return FP8AMP_ERROR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        set_error(function, e.what());
        return FP8AMP_ERROR_INTERNAL;
    } catch (...) {
        set_error(function, "unknown internal error");
        return FP8AMP_ERROR_INTERNAL;
    }
}

template <class T>
void require(const T *pointer, const char *argument) {
    if (!pointer) fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " is NULL");
}

// Registers a new object and writes its handle, or leaves *out untouched if registration fails.
template <class Handle, class T>
void publish(std::shared_ptr<T> object, Handle *out) {
    *out = reinterpret_cast<Handle>(fp8amp::core::register_handle(std::move(object)));
}

}  // namespace fp8amp::capi

#define FP8AMP_GUARD(body) return ::fp8amp::capi::guarded(__func__, [&]() body)
