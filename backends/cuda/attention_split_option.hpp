#pragma once
// The tensor-core attention's split size (compressed rows per slot) from DS4_ATTN_SPLIT's text:
// unset or empty gives the default; anything but a multiple of 64 in [64, 65536] is an error
// naming the variable and the value. Host-only so that the parse is tested without a GPU.
#include <cstdlib>
#include <string>

#include "ds4/core/error.hpp"

namespace ds4::cuda_backend {

// Fixed so that a row's result never depends on how many rows share the step (the split plan's
// own choice would follow the batch size).
inline constexpr int default_attention_split_rows = 256;

inline int attention_split_rows(const char* value) {
    if (value == nullptr || *value == '\0') return default_attention_split_rows;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    require(end != value && *end == '\0' && n >= 64 && n <= 65536 && n % 64 == 0,
            std::string("DS4_ATTN_SPLIT=") + value + ": expected a multiple of 64 between 64 and 65536");
    return int(n);
}

}  // namespace ds4::cuda_backend
