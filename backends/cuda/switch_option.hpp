#pragma once
// An on/off switch from an environment variable's text (DS4_HC_FOLD, DS4_CHUNK_OUTPUTS): unset or
// empty gives the default, "0" off, "1" on; anything else is an error naming the variable and
// the value. Host-only so that the parse is tested without a GPU.
#include <string>

#include "ds4/core/error.hpp"

namespace ds4::cuda_backend {

inline bool switch_option(const char* name, const char* value, bool fallback) {
    if (value == nullptr || *value == '\0') return fallback;
    const std::string v(value);
    require(v == "0" || v == "1", std::string(name) + "=" + v + ": expected 0 (off) or 1 (on)");
    return v == "1";
}

}  // namespace ds4::cuda_backend
