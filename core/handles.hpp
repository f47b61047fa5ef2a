// The registry of live objects behind every public handle.
//
// A handle is not a pointer: it encodes (slot + 1) << 32 | generation << 8 | kind. The slot holds the
// object, its kind and its generation; destroying the object bumps the generation and frees the slot.
// So a destroyed handle, a handle of another kind, or any pointer that was never a handle is caught
// on lookup (FP8AMP_ERROR_INVALID_HANDLE) instead of being dereferenced. Freed slots are reused
// first-in first-out, which keeps a stale handle from meeting its slot's next owner for as long as
// possible; with 24 generation bits it would take 16M reuses of one slot to alias.
//
// Lookups scale across threads (docs/api.md 1.5: different contexts are independent), so they take
// no lock shared by all handles:
// - Slots live in chunks that never move (chunk c holds 256 << c slots; a fixed table of 25 chunk
//   pointers covers every 32-bit slot index). A lookup reads the number of slots issued and the
//   chunk pointer with acquire loads, both published (release) after the chunk was made, so it
//   reaches its slot without a lock, and a value whose slot was never issued is refused unread.
// - Each slot has a lock of its own (spin, yield, then sleep) and a cache line of its own. Under it
//   a lookup checks generation, kind and liveness and copies the slot's shared_ptr; destruction,
//   under the same lock, moves the shared_ptr out and advances the generation. So a lookup racing a
//   destroy either takes its reference first, and the object then lives until the call that looked
//   it up drops it, or comes second and is refused; it never copies a shared_ptr being released, and
//   no ABA beyond the generation wrap above is possible, because reuse also writes under that lock.
//   Lookups of different handles touch different locks and lines, so calls on different contexts
//   from different threads do not serialize (bench/bench_handles.c measures it). Nothing that can
//   allocate, throw or run a destructor happens under a slot's lock: messages are built after it,
//   and the released object is dropped by the caller of unregister_object.
// - Registration and unregistration (the FIFO free list and the growth of the slab) still take one
//   registry mutex, then the slot's lock; lookups never take that mutex, so there is one lock order.
// - lookup_objects takes each slot's lock in turn: every entry is checked and referenced as by
//   lookup_object, and the call fails as a whole, naming the first bad entry, before anything uses
//   them. (It no longer sees all entries at one instant; a concurrent destroy of an entry makes the
//   call either succeed with the object kept alive or fail, as for a single lookup.)
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
// The objects behind n handles of one kind (the per-step path of a whole model); a failure names
// the entry as array_name[i].
std::vector<std::shared_ptr<void>> lookup_objects(const void *const *handles, size_t n, HandleKind kind,
                                                  const char *array_name);
// Unregisters the handle and returns the object (the last reference may then go with it).
std::shared_ptr<void> unregister_object(const void *handle, HandleKind kind, const char *argument);

// The same, for lookup<T>: copy(object, out) runs under the slot's lock and must only take a
// reference (no allocation, no throw, no destructor: *out is empty).
using CopyOut = void (*)(const std::shared_ptr<void> &object, void *out) noexcept;
void lookup_object_as(const void *handle, HandleKind kind, const char *argument, CopyOut copy, void *out);

// Copies straight into a shared_ptr<T> (the aliasing constructor), so a lookup costs one reference
// count increment, not a shared_ptr<void> and then a second count for static_pointer_cast.
template <class T>
std::shared_ptr<T> lookup(const void *handle, const char *argument) {
    std::shared_ptr<T> out;
    lookup_object_as(
        handle, T::kKind, argument,
        [](const std::shared_ptr<void> &object, void *target) noexcept {
            *static_cast<std::shared_ptr<T> *>(target) = std::shared_ptr<T>(object, static_cast<T *>(object.get()));
        },
        &out);
    return out;
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
