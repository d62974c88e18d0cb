#pragma once
// An on/off switch from an environment variable's text (DS4_HC_FOLD, DS4_CHUNK_OUTPUTS): unset or
// empty gives the default, "0" off, "1" on; anything else is an error naming the variable and
// the value. Host-only so that the parse is tested without a GPU.
#include <string>

#include "ds4/core/env_choice.hpp"

namespace ds4::cuda_backend {

inline bool switch_option(const char* name, const char* value, bool fallback) {
    return switch_value(name, value, fallback);  // core/env_choice.hpp, shared with the kernels' plans
}

}  // namespace ds4::cuda_backend
