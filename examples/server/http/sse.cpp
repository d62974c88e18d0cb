#include "examples/server/http/sse.hpp"

#include <cstdio>

namespace ds4::server {

std::string sse_data(std::string_view payload) {
    std::string s;
    s.reserve(payload.size() + 8);
    s.append("data: ").append(payload).append("\n\n");
    return s;
}

std::string sse_event(std::string_view name, std::string_view payload) {
    std::string s;
    s.reserve(name.size() + payload.size() + 16);
    s.append("event: ").append(name).append("\ndata: ").append(payload).append("\n\n");
    return s;
}

std::string http_chunk(std::string_view payload) {
    if (payload.empty()) return {};
    char size[24];
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
    std::string s;
    s.reserve(payload.size() + std::size_t(n) + 2);
    s.append(size, std::size_t(n)).append(payload).append("\r\n");
    return s;
}

}  // namespace ds4::server
