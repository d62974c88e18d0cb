#pragma once
// A measurement switch that forces one of a few values of a launch plan (DS4_F16_ROWS=1|2|4|8,
// DS4_MOE_DOWN_TILES=1|2): unset or empty means the plan's own choice (0 here); any other value
// than the allowed ones is an error naming the variable and what it accepts, never ignored.
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

}  // namespace ds4
