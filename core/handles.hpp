// The registry of live objects behind every public handle.
//
// A handle is not a pointer: it encodes (slot + 1) << 32 | generation << 8 | kind. The slot holds the
// object, its kind and its generation; destroying the object bumps the generation and frees the slot.
// So a destroyed handle, a handle of another kind, or any pointer that was never a handle is caught
// on lookup (FP8AMP_ERROR_INVALID_HANDLE) instead of being dereferenced. Freed slots are reused
// first-in first-out, which keeps a stale handle from meeting its slot's next owner for as long as
// possible; with 24 generation bits it would take 16M reuses of one slot to alias.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "error.hpp"

namespace fp8amp::core {

enum class HandleKind : uint8_t {
    Context = 1,
    Tensor = 2,
    Scaling = 3,
    Linear = 4,
    Optimizer = 5,
    GradScaler = 6,
    Communicator = 7,
};

const char *handle_kind_name(HandleKind kind);

// Registers an object; returns its handle.
void *register_object(HandleKind kind, std::shared_ptr<void> object);
// The object behind a live handle of the given kind; throws INVALID_HANDLE otherwise.
std::shared_ptr<void> lookup_object(const void *handle, HandleKind kind, const char *argument);
// The objects behind n handles of one kind, under one lock (the per-step path of a whole model);
// a failure names the entry as array_name[i].
std::vector<std::shared_ptr<void>> lookup_objects(const void *const *handles, size_t n, HandleKind kind,
                                                  const char *array_name);
// Unregisters the handle and returns the object (the last reference may then go with it).
std::shared_ptr<void> unregister_object(const void *handle, HandleKind kind, const char *argument);

template <class T>
std::shared_ptr<T> lookup(const void *handle, const char *argument) {
    return std::static_pointer_cast<T>(lookup_object(handle, T::kKind, argument));
}

template <class T>
std::vector<std::shared_ptr<T>> lookup_many(const void *const *handles, size_t n, const char *array_name) {
    std::vector<std::shared_ptr<T>> out;
    out.reserve(n);
    for (auto &object : lookup_objects(handles, n, T::kKind, array_name))
        out.push_back(std::static_pointer_cast<T>(std::move(object)));
    return out;
}

template <class T>
T *register_handle(std::shared_ptr<T> object) {
    return static_cast<T *>(register_object(T::kKind, std::move(object)));
}

}  // namespace fp8amp::core
