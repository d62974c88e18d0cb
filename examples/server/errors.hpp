#pragma once
// Request errors with stable machine-readable codes, rendered in each API's own error shape.
// The code (`invalid_json`, `context_length_exceeded`, ...) never changes once shipped: clients
// branch on it; the message is for people and may name the field and the byte at fault.
#include <stdexcept>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds4::server {

enum class error_code {
    invalid_json,             // the body is not JSON
    invalid_utf8,             // the body is not UTF-8 (byte offset in the message)
    invalid_type,             // a field has the wrong JSON type
    invalid_value,            // a field has the right type and an unusable value
    missing_field,            // a required field is absent
    body_too_large,           // the body is over --max-body
    model_not_found,          // `model` names no served model
    context_length_exceeded,  // prompt + max_tokens over the context
    invalid_max_tokens,       // negative, zero or beyond any context
    insufficient_memory,      // the admission's bytes cannot fit (see retryable)
    unauthorized,             // missing or wrong API key
    not_found,                // no such route
    method_not_allowed,
    shutting_down,            // SIGTERM received: no new work
    timeout,                  // the request ran past --request-timeout
    internal,                 // the engine failed: the message says how
};

struct api_error {
    error_code code = error_code::internal;
    std::string message;
    std::string param;  // the offending field, when there is one
    bool retryable = false;
    std::uint64_t bytes_missing = 0;  // insufficient_memory: how many more bytes the admission needs
};

[[noreturn]] void throw_api_error(error_code code, std::string message, std::string param = {});

std::string_view code_name(error_code code);
// insufficient_memory: 429 when a retry can succeed (the memory is held by other requests), 503
// when it never can on this server.
int http_status(const api_error& e);

enum class error_shape { openai, anthropic };

// {"error":{"message","type","param","code"}} (OpenAI) or
// {"type":"error","error":{"type","message"}} (Anthropic), both with our stable code.
std::string error_body(const api_error& e, error_shape shape);

// The JSON object of the error alone (no envelope), for stream error events.
std::string error_object(const api_error& e, error_shape shape);

// Thrown by request parsing; caught at the route boundary and rendered with error_body.
struct api_exception : std::runtime_error {
    api_error error;
    explicit api_exception(api_error e) : std::runtime_error(e.message), error(std::move(e)) {}
};

}  // namespace ds4::server
