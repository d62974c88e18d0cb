#pragma once
// GGML tensor type ids as they appear in GGUF files, and the block geometry of each. The ids
// are the file format's, so they are fixed; the geometry is what the GGUF reader uses to
// bounds-check tensor sizes before any byte is read.
#include <cstdint>
#include <optional>
#include <string_view>

namespace ds4 {

enum class ggml_type : std::uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,
    q8_1 = 9,
    q2_k = 10,
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    iq2_xxs = 16,
    iq2_xs = 17,
    iq3_xxs = 18,
    iq1_s = 19,
    iq4_nl = 20,
    iq3_s = 21,
    iq2_s = 22,
    iq4_xs = 23,
    i8 = 24,
    i16 = 25,
    i32 = 26,
    i64 = 27,
    f64 = 28,
    iq1_m = 29,
    bf16 = 30,
};

struct type_geometry {
    std::string_view name;
    std::uint32_t block_elems;  // elements per block (1 for scalar types)
    std::uint32_t block_bytes;  // bytes per block
};

// Geometry for every id GGML defines; std::nullopt for ids it does not (the reader reports
// those as unknown types with the tensor name and offset).
constexpr std::optional<type_geometry> geometry_of(std::uint32_t id) {
    switch (static_cast<ggml_type>(id)) {
        case ggml_type::f32: return type_geometry{"F32", 1, 4};
        case ggml_type::f16: return type_geometry{"F16", 1, 2};
        case ggml_type::q4_0: return type_geometry{"Q4_0", 32, 18};
        case ggml_type::q4_1: return type_geometry{"Q4_1", 32, 20};
        case ggml_type::q5_0: return type_geometry{"Q5_0", 32, 22};
        case ggml_type::q5_1: return type_geometry{"Q5_1", 32, 24};
        case ggml_type::q8_0: return type_geometry{"Q8_0", 32, 34};
        case ggml_type::q8_1: return type_geometry{"Q8_1", 32, 36};
        case ggml_type::q2_k: return type_geometry{"Q2_K", 256, 84};
        case ggml_type::q3_k: return type_geometry{"Q3_K", 256, 110};
        case ggml_type::q4_k: return type_geometry{"Q4_K", 256, 144};
        case ggml_type::q5_k: return type_geometry{"Q5_K", 256, 176};
        case ggml_type::q6_k: return type_geometry{"Q6_K", 256, 210};
        case ggml_type::q8_k: return type_geometry{"Q8_K", 256, 292};
        case ggml_type::iq2_xxs: return type_geometry{"IQ2_XXS", 256, 66};
        case ggml_type::iq2_xs: return type_geometry{"IQ2_XS", 256, 74};
        case ggml_type::iq3_xxs: return type_geometry{"IQ3_XXS", 256, 98};
        case ggml_type::iq1_s: return type_geometry{"IQ1_S", 256, 50};
        case ggml_type::iq4_nl: return type_geometry{"IQ4_NL", 32, 18};
        case ggml_type::iq3_s: return type_geometry{"IQ3_S", 256, 110};
        case ggml_type::iq2_s: return type_geometry{"IQ2_S", 256, 82};
        case ggml_type::iq4_xs: return type_geometry{"IQ4_XS", 256, 136};
        case ggml_type::i8: return type_geometry{"I8", 1, 1};
        case ggml_type::i16: return type_geometry{"I16", 1, 2};
        case ggml_type::i32: return type_geometry{"I32", 1, 4};
        case ggml_type::i64: return type_geometry{"I64", 1, 8};
        case ggml_type::f64: return type_geometry{"F64", 1, 8};
        case ggml_type::iq1_m: return type_geometry{"IQ1_M", 256, 56};
        case ggml_type::bf16: return type_geometry{"BF16", 1, 2};
    }
    return std::nullopt;
}

constexpr std::string_view type_name(ggml_type t) {
    const auto g = geometry_of(static_cast<std::uint32_t>(t));
    return g ? g->name : std::string_view{"unknown"};
}

}  // namespace ds4
