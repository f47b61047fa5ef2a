// Byte-level tools of the optimizer checkpoint format (docs/api.md section 12.6): CRC-32 and
// little-endian writers/readers that never read past the end of their buffer (a short read throws
// CORRUPT_DATA), so a truncated or corrupted checkpoint can never crash the loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "error.hpp"

namespace fp8amp::core::checkpoint {

// CRC-32 as zlib's crc32() and IEEE 802.3 compute it: reflected polynomial 0xEDB88320, initial value
// and final xor 0xFFFFFFFF. Table-driven (256 entries built once); crc32("123456789") = 0xCBF43926.
uint32_t crc32(const void *data, size_t n);

class Writer {
public:
    // buffer null: only counts bytes (the size query of fp8amp_optimizer_save).
    explicit Writer(unsigned char *buffer) : buffer_(buffer) {}
    size_t size() const { return pos_; }
    unsigned char *reserve(size_t n) {  // space for n raw bytes (null in counting mode)
        unsigned char *p = buffer_ ? buffer_ + pos_ : nullptr;
        pos_ += n;
        return p;
    }
    void bytes(const void *src, size_t n) {
        if (unsigned char *p = reserve(n)) std::memcpy(p, src, n);
    }
    void u8(uint8_t v) { bytes(&v, 1); }
    void u32(uint32_t v) {
        const unsigned char b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
        bytes(b, 4);
    }
    void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
    void u64(uint64_t v) {
        u32(static_cast<uint32_t>(v));
        u32(static_cast<uint32_t>(v >> 32));
    }
    void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
    void f32(float v) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        u32(b);
    }

private:
    unsigned char *buffer_;
    size_t pos_ = 0;
};

class Reader {
public:
    Reader(const unsigned char *data, size_t n) : data_(data), n_(n) {}
    size_t remaining() const { return n_ - pos_; }
    const unsigned char *take(size_t n, const char *what) {
        if (n > n_ - pos_)
            fail(FP8AMP_ERROR_CORRUPT_DATA, std::string("checkpoint truncated or inconsistent: ") + what + " needs " +
                                                std::to_string(n) + " bytes, " + std::to_string(n_ - pos_) + " left");
        const unsigned char *p = data_ + pos_;
        pos_ += n;
        return p;
    }
    uint8_t u8(const char *what) { return *take(1, what); }
    uint32_t u32(const char *what) {
        const unsigned char *b = take(4, what);
        return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
    }
    int32_t i32(const char *what) { return static_cast<int32_t>(u32(what)); }
    uint64_t u64(const char *what) {
        const uint64_t lo = u32(what);
        return lo | uint64_t(u32(what)) << 32;
    }
    int64_t i64(const char *what) { return static_cast<int64_t>(u64(what)); }
    float f32(const char *what) {
        const uint32_t b = u32(what);
        float v;
        std::memcpy(&v, &b, 4);
        return v;
    }

private:
    const unsigned char *data_;
    size_t n_;
    size_t pos_ = 0;
};

}  // namespace fp8amp::core::checkpoint
