#include "handles.hpp"

#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace fp8amp::core {
namespace {

constexpr uint32_t kGenerationMask = 0xFFFFFFu;

struct Slot {
    std::shared_ptr<void> object;
    HandleKind kind = HandleKind::Context;
    uint32_t generation = 0;
};

struct Registry {
    std::mutex mutex;
    std::vector<Slot> slots;
    std::deque<uint32_t> free_slots;
};

// Never destroyed: objects still alive at exit must not be torn down after the CUDA runtime is.
Registry &registry() {
    static Registry *instance = new Registry();
    return *instance;
}

uintptr_t encode(uint32_t slot, uint32_t generation, HandleKind kind) {
    return (static_cast<uintptr_t>(slot) + 1) << 32 | static_cast<uintptr_t>(generation & kGenerationMask) << 8 |
           static_cast<uintptr_t>(kind);
}

// Finds the slot of a live handle of `kind` (registry locked by the caller).
Slot &find(Registry &r, const void *handle, HandleKind kind, const char *argument) {
    const auto value = reinterpret_cast<uintptr_t>(handle);
    if (!handle) fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is NULL");
    const uint64_t slot_plus_one = static_cast<uint64_t>(value) >> 32;
    const uint32_t generation = static_cast<uint32_t>(value >> 8) & kGenerationMask;
    const auto tag = static_cast<HandleKind>(value & 0xFF);
    if (slot_plus_one == 0 || slot_plus_one > r.slots.size())
        fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is not an fp8amp handle");
    Slot &slot = r.slots[slot_plus_one - 1];
    if (!slot.object || slot.generation != generation || slot.kind != tag)
        fail(FP8AMP_ERROR_INVALID_HANDLE,
             std::string(argument) + " is not a live handle (already destroyed, or never created)");
    if (slot.kind != kind)
        fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is a " + handle_kind_name(slot.kind) +
                                              " handle, not a " + handle_kind_name(kind) + " handle");
    return slot;
}

}  // namespace

const char *handle_kind_name(HandleKind kind) {
    switch (kind) {
    case HandleKind::Context: return "context";
    case HandleKind::Tensor: return "tensor";
    case HandleKind::Scaling: return "scaling";
    case HandleKind::Linear: return "linear";
    case HandleKind::Optimizer: return "optimizer";
    case HandleKind::GradScaler: return "grad scaler";
    case HandleKind::Communicator: return "communicator";
    }
    return "unknown";
}

void *register_object(HandleKind kind, std::shared_ptr<void> object) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    uint32_t index;
    if (!r.free_slots.empty()) {
        index = r.free_slots.front();
        r.free_slots.pop_front();
    } else {
        if (r.slots.size() >= 0xFFFFFFFEu) fail(FP8AMP_ERROR_OUT_OF_MEMORY, "too many live fp8amp objects");
        r.slots.emplace_back();
        index = static_cast<uint32_t>(r.slots.size() - 1);
    }
    Slot &slot = r.slots[index];
    slot.object = std::move(object);
    slot.kind = kind;
    return reinterpret_cast<void *>(encode(index, slot.generation, kind));
}

std::shared_ptr<void> lookup_object(const void *handle, HandleKind kind, const char *argument) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    return find(r, handle, kind, argument).object;
}

std::vector<std::shared_ptr<void>> lookup_objects(const void *const *handles, size_t n, HandleKind kind,
                                                  const char *array_name) {
    std::vector<std::shared_ptr<void>> objects;
    objects.reserve(n);
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (size_t i = 0; i < n; ++i) {
        try {
            objects.push_back(find(r, handles[i], kind, "entry").object);
        } catch (const Error &e) {
            // Name the entry only now: building "metas[i]" for every handle would cost the hot path.
            std::string message = e.what();
            message.replace(0, 5, std::string(array_name) + "[" + std::to_string(i) + "]");
            throw Error(e.status(), message);
        }
    }
    return objects;
}

std::shared_ptr<void> unregister_object(const void *handle, HandleKind kind, const char *argument) {
    Registry &r = registry();
    std::shared_ptr<void> object;
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        Slot &slot = find(r, handle, kind, argument);
        object = std::move(slot.object);
        slot.object.reset();
        slot.generation = (slot.generation + 1) & kGenerationMask;
        r.free_slots.push_back(static_cast<uint32_t>(&slot - r.slots.data()));
    }
    return object;  // released outside the lock: a destructor may free device memory
}

}  // namespace fp8amp::core
