#pragma once
// The GGUF v3 byte layout shared by the reader and the writer: magic, version, value type ids and
// their sizes, the limits ds4 enforces, and the tensor size rule. Keeping the rule in one place
// means a file the writer produces is, by construction, a file the reader accepts.
//
// File layout (all little-endian):
//   u32 magic "GGUF", u32 version (3), u64 n_tensors, u64 n_kv
//   n_kv x { string key, u32 value_type, value }            string = u64 length + bytes (no NUL)
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims] (ne0 first), u32 ggml type, u64 offset }
//   padding to general.alignment (default 32), then the data section; offsets are relative to it.
#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ds4/format/types.hpp"

namespace ds4::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader and writer copy little-endian fields without swapping");

inline constexpr std::uint32_t file_magic = 0x46554747u;  // the bytes "GGUF" read as a u32
inline constexpr std::uint32_t supported_version = 3;     // the only version ds4.c accepts
inline constexpr std::uint64_t default_alignment = 32;
inline constexpr std::uint32_t max_dims = 4;               // GGML_MAX_DIMS
// Arrays of arrays are legal GGUF but no known model uses them; a small cap keeps a hostile file
// from driving the parser's recursion deep.
inline constexpr int max_array_depth = 3;
inline constexpr std::string_view alignment_key = "general.alignment";

enum class value_type : std::uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
};

constexpr bool is_known_value_type(std::uint32_t id) { return id <= 12; }

constexpr std::string_view value_type_name(value_type t) {
    switch (t) {
        case value_type::u8: return "u8";
        case value_type::i8: return "i8";
        case value_type::u16: return "u16";
        case value_type::i16: return "i16";
        case value_type::u32: return "u32";
        case value_type::i32: return "i32";
        case value_type::f32: return "f32";
        case value_type::boolean: return "bool";
        case value_type::string: return "string";
        case value_type::array: return "array";
        case value_type::u64: return "u64";
        case value_type::i64: return "i64";
        case value_type::f64: return "f64";
    }
    return "unknown";
}

// Bytes of one fixed-size value; 0 for string and array, whose size depends on their content.
constexpr std::uint64_t fixed_size_of(value_type t) {
    switch (t) {
        case value_type::u8:
        case value_type::i8:
        case value_type::boolean: return 1;
        case value_type::u16:
        case value_type::i16: return 2;
        case value_type::u32:
        case value_type::i32:
        case value_type::f32: return 4;
        case value_type::u64:
        case value_type::i64:
        case value_type::f64: return 8;
        case value_type::string:
        case value_type::array: return 0;
    }
    return 0;
}

constexpr bool is_integer_type(value_type t) {
    switch (t) {
        case value_type::u8:
        case value_type::i8:
        case value_type::u16:
        case value_type::i16:
        case value_type::u32:
        case value_type::i32:
        case value_type::u64:
        case value_type::i64: return true;
        default: return false;
    }
}

constexpr bool is_power_of_two(std::uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Overflow-checked arithmetic: every size in the file comes from untrusted u64 fields.
constexpr std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
    if (a > UINT64_MAX - b) return std::nullopt;
    return a + b;
}
constexpr std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return std::nullopt;
    return a * b;
}
// `alignment` must be a power of two.
constexpr std::optional<std::uint64_t> checked_align_up(std::uint64_t x, std::uint64_t alignment) {
    const auto bumped = checked_add(x, alignment - 1);
    if (!bumped) return std::nullopt;
    return *bumped & ~(alignment - 1);
}

struct tensor_shape {
    std::uint64_t n_elements = 0;
    std::uint64_t n_bytes = 0;
};

// Validates a tensor's type id and dims and computes its element and byte counts. Returns the
// problem in words (empty on success) so the reader and the writer can each prefix their own
// context (file label, tensor name, byte offset).
inline std::string shape_problem(std::uint32_t type_id, std::span<const std::uint64_t> dims,
                                 tensor_shape& out) {
    const auto geometry = geometry_of(type_id);
    if (!geometry) return "unknown tensor type id " + std::to_string(type_id);
    if (dims.empty() || dims.size() > max_dims)
        return "n_dims = " + std::to_string(dims.size()) + " (must be 1.." + std::to_string(max_dims) + ")";
    std::uint64_t n = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (dims[i] == 0) return "dimension " + std::to_string(i) + " is zero";
        const auto next = checked_mul(n, dims[i]);
        if (!next) return "the element count overflows 64 bits";
        n = *next;
    }
    // GGML blocks run along ne0, so every row must hold whole blocks.
    if (dims[0] % geometry->block_elems != 0)
        return "ne0 = " + std::to_string(dims[0]) + " is not a multiple of the block size " +
               std::to_string(geometry->block_elems) + " of " + std::string(geometry->name);
    const auto bytes = checked_mul(n / geometry->block_elems, geometry->block_bytes);
    if (!bytes) return "the byte size overflows 64 bits";
    out = {n, *bytes};
    return {};
}

}  // namespace ds4::gguf
