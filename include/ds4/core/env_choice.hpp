#pragma once
// Measurement switches of the launch plans, read from the environment. env_choice forces one of
// a few values (DS4_F16_ROWS=1|2|4|8, DS4_MOE_DOWN_TILES=1|2): unset or empty means the plan's
// own choice (0 here). switch_value parses an on/off switch's value (the CUDA backend's
// DS4_HC_FOLD and DS4_CHUNK_OUTPUTS, backends/cuda/switch_option.hpp): unset or empty gives the
// default, "0" off, "1" on. Any other value is an error naming the variable and what it accepts,
// never ignored.
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "ds4/core/error.hpp"

namespace ds4 {

inline int env_choice(const char* name, std::initializer_list<int> allowed) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return 0;
    std::string what(name);
    what.append("=").append(value).append(": expected one of ");
    bool first = true;
    for (int v : allowed) {
        const std::string text = std::to_string(v);
        if (text == value) return v;
        if (!first) what.push_back('|');
        what.append(text);
        first = false;
    }
    fail(what.append(" (or unset)"));
}

inline bool switch_value(const char* name, const char* value, bool fallback) {
    if (value == nullptr || *value == '\0') return fallback;
    const std::string v(value);
    require(v == "0" || v == "1", std::string(name) + "=" + v + ": expected 0 (off) or 1 (on)");
    return v == "1";
}

}  // namespace ds4
