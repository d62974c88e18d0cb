#pragma once
// Server-sent events framing (WHATWG HTML §9.2) over HTTP/1.1 chunked transfer coding.
#include <string>
#include <string_view>

namespace ds4::server {

// A comment line: ignored by every SSE client, and enough to reset its idle timer.
inline constexpr std::string_view sse_keepalive = ": keep-alive\n\n";

// "data: <payload>\n\n"; the payload is one line (compact JSON never holds a raw newline).
std::string sse_data(std::string_view payload);
// "event: <name>\ndata: <payload>\n\n"
std::string sse_event(std::string_view name, std::string_view payload);
// One HTTP/1.1 chunk (RFC 9112 §7.1); empty payload -> nothing (the last chunk is separate).
std::string http_chunk(std::string_view payload);
inline constexpr std::string_view http_last_chunk = "0\r\n\r\n";

}  // namespace ds4::server
