// Reading enum values that come from C callers (arguments, struct fields, checkpoint bytes).
//
// C lets a caller put any int into an fp8amp enum. In C++ an enum without a fixed underlying type
// only has the values of its enumerators' bit range; loading anything else as the enum type -- a
// switch, a comparison, passing it by value -- is undefined behaviour (UBSan's -fsanitize=enum
// reports it), and the compiler may assume it cannot happen. So every caller-provided enum is read
// as the integer it holds (enum_value) and validated before it is ever loaded as the enum.
#pragma once

#include <cstdint>
#include <cstring>

namespace fp8amp::core {

// The value of an enum field a caller passed, read as the integer it holds (no load as the enum).
template <class Enum>
int32_t enum_value(const Enum &field) {
    static_assert(sizeof(Enum) == sizeof(int32_t), "fp8amp's enums are 32-bit");
    int32_t v;
    std::memcpy(&v, &field, sizeof v);
    return v;
}

// Stores integer v into an enum field without a conversion to the enum type (a static_cast of a
// value outside the enum's range is itself undefined, and so is returning such an enum by value: a
// load). Validate the field with enum_value before it is used as the enum.
template <class Enum>
void store_enum(Enum &field, int32_t v) {
    static_assert(sizeof(Enum) == sizeof(int32_t), "fp8amp's enums are 32-bit");
    std::memcpy(&field, &v, sizeof field);
}

}  // namespace fp8amp::core
