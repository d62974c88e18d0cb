#pragma once
// Byte-by-byte GGUF builder for deliberately malformed files (tests, fuzzing). Unlike the writer
// it checks nothing: it appends exactly the fields asked for and can patch any of them afterwards,
// so a test can produce each failure the reader must reject.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "ds4/format/types.hpp"
#include "ds4/gguf/layout.hpp"

namespace ds4::gguf {

class raw_builder {
public:
    // Appends the object representation of v: little-endian on every supported host (layout.hpp
    // asserts it), which is the file's byte order.
    template <class T>
    raw_builder& put(T v) {
        const auto* p = reinterpret_cast<const std::byte*>(&v);
        bytes_.insert(bytes_.end(), p, p + sizeof v);
        return *this;
    }
    raw_builder& u8(std::uint8_t v) { return put(v); }
    raw_builder& u32(std::uint32_t v) { return put(v); }
    raw_builder& u64(std::uint64_t v) { return put(v); }
    raw_builder& type(value_type t) { return put(static_cast<std::uint32_t>(t)); }
    // A GGUF string: u64 length, then the bytes.
    raw_builder& str(std::string_view s) {
        u64(s.size());
        const auto* p = reinterpret_cast<const std::byte*>(s.data());
        bytes_.insert(bytes_.end(), p, p + s.size());
        return *this;
    }
    raw_builder& zeros(std::uint64_t n) {
        bytes_.resize(bytes_.size() + n);
        return *this;
    }
    raw_builder& pad_to(std::uint64_t alignment) {
        return zeros((alignment - bytes_.size() % alignment) % alignment);
    }

    // The header: magic, version, tensor count, key/value count.
    raw_builder& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = supported_version) {
        return u32(file_magic).u32(version).u64(n_tensors).u64(n_kv);
    }
    // Key, value type and a scalar value of the given C++ type.
    template <class T>
    raw_builder& kv(std::string_view key, value_type t, T v) {
        return str(key).type(t).put(v);
    }
    raw_builder& kv_string(std::string_view key, std::string_view v) {
        return str(key).type(value_type::string).str(v);
    }
    // One tensor directory entry.
    raw_builder& tensor(std::string_view name, std::initializer_list<std::uint64_t> dims, std::uint32_t type_id,
                        std::uint64_t offset) {
        str(name).u32(static_cast<std::uint32_t>(dims.size()));
        for (std::uint64_t d : dims) u64(d);
        return u32(type_id).u64(offset);
    }
    raw_builder& tensor(std::string_view name, std::initializer_list<std::uint64_t> dims, ggml_type t,
                        std::uint64_t offset) {
        return tensor(name, dims, static_cast<std::uint32_t>(t), offset);
    }

    // Overwrites a field already written (a count, a length, a type id) to break a file after the
    // fact; the caller keeps `at` inside the bytes.
    template <class T>
    void patch(std::uint64_t at, T v) {
        std::memcpy(bytes_.data() + at, &v, sizeof v);
    }
    std::uint64_t size() const { return bytes_.size(); }
    const std::vector<std::byte>& bytes() const { return bytes_; }
    std::vector<std::byte> take() { return std::move(bytes_); }

private:
    std::vector<std::byte> bytes_;
};

}  // namespace ds4::gguf
