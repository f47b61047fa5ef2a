// The exception boundary for capi/*.cpp files other than api.cpp (which has its own copy): every
// exception becomes a status plus the thread-local message that fp8amp_last_error_message returns.
#pragma once

#include <memory>
#include <new>
#include <string>

#include "error.hpp"
#include "fp8amp/fp8amp.h"
#include "handles.hpp"

namespace fp8amp::capi {

void set_last_error(const char *function, const char *message) noexcept;  // capi/api.cpp

template <class F>
fp8amp_status guarded(const char *function, F &&body) noexcept {
    try {
        body();
        return FP8AMP_SUCCESS;
    } catch (const Error &e) {
        set_last_error(function, e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        set_last_error(function, "out of host memory");
        return FP8AMP_ERROR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        set_last_error(function, e.what());
        return FP8AMP_ERROR_INTERNAL;
    } catch (...) {
        set_last_error(function, "unknown internal error");
        return FP8AMP_ERROR_INTERNAL;
    }
}

template <class T>
void require(const T *pointer, const char *argument) {
    if (!pointer) fail(FP8AMP_ERROR_INVALID_ARGUMENT, std::string(argument) + " is NULL");
}

template <class Handle, class T>
void publish(std::shared_ptr<T> object, Handle *out) {
    *out = reinterpret_cast<Handle>(fp8amp::core::register_handle(std::move(object)));
}

}  // namespace fp8amp::capi

#define FP8AMP_CAPI_GUARD(body) return ::fp8amp::capi::guarded(__func__, [&]() body)
