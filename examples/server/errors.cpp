#include "examples/server/errors.hpp"

#include <nlohmann/json.hpp>

namespace ds4::server {

void throw_api_error(error_code code, std::string message, std::string param) {
    throw api_exception(api_error{code, std::move(message), std::move(param), false});
}

std::string_view code_name(error_code code) {
    switch (code) {
    case error_code::invalid_json: return "invalid_json";
    case error_code::invalid_utf8: return "invalid_utf8";
    case error_code::invalid_type: return "invalid_type";
    case error_code::invalid_value: return "invalid_value";
    case error_code::missing_field: return "missing_field";
    case error_code::body_too_large: return "body_too_large";
    case error_code::model_not_found: return "model_not_found";
    case error_code::context_length_exceeded: return "context_length_exceeded";
    case error_code::invalid_max_tokens: return "invalid_max_tokens";
    case error_code::insufficient_memory: return "insufficient_memory";
    case error_code::unauthorized: return "invalid_api_key";
    case error_code::not_found: return "not_found";
    case error_code::method_not_allowed: return "method_not_allowed";
    case error_code::shutting_down: return "shutting_down";
    case error_code::timeout: return "timeout";
    case error_code::internal: return "internal_error";
    }
    return "internal_error";
}

int http_status(const api_error& e) {
    switch (e.code) {
    case error_code::body_too_large: return 413;
    case error_code::model_not_found:
    case error_code::not_found: return 404;
    case error_code::method_not_allowed: return 405;
    case error_code::unauthorized: return 401;
    case error_code::insufficient_memory: return e.retryable ? 429 : 503;
    case error_code::shutting_down: return 503;
    case error_code::timeout: return 408;
    case error_code::internal: return 500;
    default: return 400;
    }
}

namespace {

// OpenAI's `type` families.
std::string_view openai_type(error_code code) {
    switch (code) {
    case error_code::unauthorized: return "authentication_error";
    case error_code::not_found:
    case error_code::model_not_found: return "not_found_error";
    case error_code::insufficient_memory:
    case error_code::shutting_down: return "server_overloaded";
    case error_code::timeout: return "timeout_error";
    case error_code::internal: return "server_error";
    default: return "invalid_request_error";
    }
}

// Anthropic's documented error types.
std::string_view anthropic_type(error_code code) {
    switch (code) {
    case error_code::unauthorized: return "authentication_error";
    case error_code::not_found:
    case error_code::model_not_found: return "not_found_error";
    case error_code::body_too_large: return "request_too_large";
    case error_code::insufficient_memory:
    case error_code::shutting_down: return "overloaded_error";
    case error_code::timeout:
    case error_code::internal: return "api_error";
    default: return "invalid_request_error";
    }
}

nlohmann::json error_json(const api_error& e, error_shape shape) {
    nlohmann::json j;
    j["message"] = e.message;
    j["code"] = code_name(e.code);
    if (shape == error_shape::openai) {
        j["type"] = openai_type(e.code);
        j["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
    } else {
        j["type"] = anthropic_type(e.code);
    }
    if (e.code == error_code::insufficient_memory) {
        j["retryable"] = e.retryable;
        j["bytes_missing"] = e.bytes_missing;
    }
    return j;
}

}  // namespace

std::string error_object(const api_error& e, error_shape shape) {
    return error_json(e, shape).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_body(const api_error& e, error_shape shape) {
    nlohmann::json j;
    if (shape == error_shape::anthropic) j["type"] = "error";
    j["error"] = error_json(e, shape);
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds4::server
