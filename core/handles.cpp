#include "handles.hpp"

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fp8amp::core {
namespace {

constexpr uint32_t kGenerationMask = 0xFFFFFFu;
// Slot indices are 32 bits and slot + 1 must fit them too.
constexpr uint32_t kMaxSlots = 0xFFFFFFFFu;

// The lock of one slot: held only to check the slot and copy (or swap) its shared_ptr, a few
// nanoseconds with no allocation, no destructor and no system call inside, so a spin is cheaper
// than a std::mutex (40 bytes, a call into pthreads). A waiter spins briefly, then yields (a holder
// preempted on an oversubscribed machine gets the core back), then sleeps: a yield does not let a
// thread of lower real-time priority run, so a waiter of higher priority than a preempted holder on
// the same core must sleep to let the holder finish.
class SlotLock {
public:
    void lock() noexcept {
        unsigned spins = 0;
        while (locked_.exchange(true, std::memory_order_acquire)) {
            while (locked_.load(std::memory_order_relaxed)) {
                if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                    __builtin_ia32_pause();
#endif
                } else if (spins < 128) {
                    std::this_thread::yield();
                } else {
                    std::this_thread::sleep_for(std::chrono::microseconds(20));
                }
            }
        }
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

private:
    std::atomic<bool> locked_{false};
};

// One slot per cache line, so that lookups of different handles from different threads write
// (lock, unlock) different lines and do not bounce one between cores.
struct alignas(64) Slot {
    SlotLock lock;
    // The three below are read and written only under `lock`.
    HandleKind kind = HandleKind::Context;
    uint32_t generation = 0;
    std::shared_ptr<void> object;  // null while the slot is free
};

// Slots live in chunks that never move: chunk c holds kFirstChunk << c slots, starting at slot
// kFirstChunk * (2^c - 1). 25 chunks cover every 32-bit slot index, so the chunk table has a fixed
// size and a lookup reads it without a lock.
constexpr uint32_t kFirstChunk = 256;
constexpr int kChunks = 25;

struct Registry {
    // Creation and destruction: the free list and the growth of the slab. Lookups never take it.
    std::mutex mutex;
    std::deque<uint32_t> free_slots;  // FIFO, under `mutex`
    // Read by every lookup, written only when a slot is used for the first time (under `mutex`):
    // on a cache line of their own, away from the mutex that creation and destruction write.
    alignas(64) std::atomic<uint32_t> size{0};  // slots [0, size) exist; released after their chunk is set
    std::atomic<Slot *> chunks[kChunks] = {};
};

// Never destroyed: objects still alive at exit must not be torn down after the CUDA runtime is.
Registry &registry() {
    static Registry *instance = new Registry();
    return *instance;
}

int chunk_of(uint32_t index) {
    const uint32_t q = index / kFirstChunk + 1;  // >= 1
    return 31 - __builtin_clz(q);
}

uint32_t chunk_begin(int chunk) { return kFirstChunk * ((uint32_t{1} << chunk) - 1); }

// The slot of an index below `size` (its chunk was published before `size` was).
Slot &slot_at(Registry &r, uint32_t index) {
    const int chunk = chunk_of(index);
    return r.chunks[chunk].load(std::memory_order_acquire)[index - chunk_begin(chunk)];
}

uintptr_t encode(uint32_t slot, uint32_t generation, HandleKind kind) {
    return (static_cast<uintptr_t>(slot) + 1) << 32 | static_cast<uintptr_t>(generation & kGenerationMask) << 8 |
           static_cast<uintptr_t>(kind);
}

struct Decoded {
    Slot *slot;
    uint32_t index;
    uint32_t generation;
    HandleKind tag;
};

// Splits a handle into its slot, generation and kind tag; fails for NULL and for any value whose
// slot was never issued. Needs no lock: slots below `size` exist and never move.
Decoded decode(Registry &r, const void *handle, const char *argument) {
    if (!handle) fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is NULL");
    const auto value = reinterpret_cast<uintptr_t>(handle);
    const uint64_t slot_plus_one = static_cast<uint64_t>(value) >> 32;
    if (slot_plus_one == 0 || slot_plus_one > r.size.load(std::memory_order_acquire))
        fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is not an fp8amp handle");
    const auto index = static_cast<uint32_t>(slot_plus_one - 1);
    return {&slot_at(r, index), index, static_cast<uint32_t>(value >> 8) & kGenerationMask,
            static_cast<HandleKind>(value & 0xFF)};
}

// Whether the slot (locked by the caller) holds the live object that `d` was issued for.
bool is_live(const Slot &slot, const Decoded &d) {
    return slot.object && slot.generation == d.generation && slot.kind == d.tag;
}

// The failure of a handle that is not the live object of `kind` (built outside the slot's lock).
[[noreturn]] void refuse(bool live, HandleKind tag, HandleKind kind, const char *argument) {
    if (!live)
        fail(FP8AMP_ERROR_INVALID_HANDLE,
             std::string(argument) + " is not a live handle (already destroyed, or never created)");
    fail(FP8AMP_ERROR_INVALID_HANDLE, std::string(argument) + " is a " + handle_kind_name(tag) +
                                          " handle, not a " + handle_kind_name(kind) + " handle");
}

// Hands the live object of `kind` behind `handle` to copy(object, out), which takes a new reference
// to it. The check and the copy happen under the slot's lock, and destruction swaps the object out
// and advances the generation under the same lock, so a lookup racing a destroy either gets a
// reference (which keeps the object alive until the caller drops it) or is refused; it never copies
// a shared_ptr that is being released.
void take(Registry &r, const void *handle, HandleKind kind, const char *argument, CopyOut copy, void *out) {
    const Decoded d = decode(r, handle, argument);
    bool live, taken = false;
    {
        std::lock_guard<SlotLock> lock(d.slot->lock);
        live = is_live(*d.slot, d);
        if (live && d.tag == kind) {
            copy(d.slot->object, out);
            taken = true;
        }
    }
    if (!taken) refuse(live, d.tag, kind, argument);
}

void copy_void(const std::shared_ptr<void> &object, void *out) noexcept {
    *static_cast<std::shared_ptr<void> *>(out) = object;  // *out is empty: no destructor runs
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
    const bool reuse = !r.free_slots.empty();
    const uint32_t size = r.size.load(std::memory_order_relaxed);
    uint32_t index;
    if (reuse) {
        index = r.free_slots.front();
    } else {
        if (size >= kMaxSlots) fail(FP8AMP_ERROR_OUT_OF_MEMORY, "too many live fp8amp objects");
        index = size;
        const int chunk = chunk_of(index);
        if (!r.chunks[chunk].load(std::memory_order_relaxed))  // may throw bad_alloc: nothing changed yet
            r.chunks[chunk].store(new Slot[size_t{kFirstChunk} << chunk], std::memory_order_release);
    }
    // Nothing below throws.
    Slot &slot = slot_at(r, index);
    uint32_t generation;
    {
        std::lock_guard<SlotLock> slot_lock(slot.lock);
        slot.object = std::move(object);  // the slot was empty: no destructor runs under the lock
        slot.kind = kind;
        generation = slot.generation;
    }
    if (reuse)
        r.free_slots.pop_front();
    else
        r.size.store(index + 1, std::memory_order_release);  // publishes the slot to lookups
    return reinterpret_cast<void *>(encode(index, generation, kind));
}

std::shared_ptr<void> lookup_object(const void *handle, HandleKind kind, const char *argument) {
    std::shared_ptr<void> object;
    take(registry(), handle, kind, argument, copy_void, &object);
    return object;
}

void lookup_object_as(const void *handle, HandleKind kind, const char *argument, CopyOut copy, void *out) {
    take(registry(), handle, kind, argument, copy, out);
}

std::vector<std::shared_ptr<void>> lookup_objects(const void *const *handles, size_t n, HandleKind kind,
                                                  const char *array_name) {
    std::vector<std::shared_ptr<void>> objects;
    objects.reserve(n);
    Registry &r = registry();
    for (size_t i = 0; i < n; ++i) {
        try {
            objects.emplace_back();
            take(r, handles[i], kind, "entry", copy_void, &objects.back());
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
    std::lock_guard<std::mutex> lock(r.mutex);
    const Decoded d = decode(r, handle, argument);
    // Queue the slot before looking: if that throws (bad_alloc), nothing has changed, and nothing
    // allocates under the slot's lock. Taken back below if the handle is not live.
    r.free_slots.push_back(d.index);
    bool live;
    {
        std::lock_guard<SlotLock> slot_lock(d.slot->lock);
        live = is_live(*d.slot, d);
        if (live && d.tag == kind) {
            object = std::move(d.slot->object);
            d.slot->object.reset();
            d.slot->generation = (d.slot->generation + 1) & kGenerationMask;
        }
    }
    if (!object) {
        r.free_slots.pop_back();
        refuse(live, d.tag, kind, argument);
    }
    return object;  // released by the caller, outside both locks: a destructor may free device memory
}

}  // namespace fp8amp::core
