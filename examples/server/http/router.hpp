#pragma once
// Routes by method and path to handlers that return either a finished response or a generation
// for the connection to drive. The router owns the cross-cutting checks every route shares: the
// API key, 404/405, and turning a thrown api_exception into the route's own error shape.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "examples/server/errors.hpp"
#include "examples/server/job.hpp"

namespace ds4::server {

struct http_request {
    std::string method;
    std::string path;  // the target without its query
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased

    std::string_view header(std::string_view lower_name) const;
};

struct http_response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
};

// Per-API wire format of a generation: SSE frames as events arrive, or one body at the end.
class generation_formatter {
public:
    virtual ~generation_formatter() = default;
    // Frames sent before the first token (OpenAI sends none until the first delta; Anthropic's
    // message_start, Responses' response.created ...).
    virtual std::string stream_start() = 0;
    // The frames of one event; for the final event the closing frames too ([DONE], message_stop).
    virtual std::string stream_event(const gen_event& ev) = 0;
    // Buffered mode: every event, then the body.
    virtual void collect(const gen_event& ev) = 0;
    virtual http_response buffered_response() = 0;
};

struct generation_plan {
    std::shared_ptr<job> work;
    // OpenAI's n: choices 1..n-1, on work's channel, submitted after it (job.hpp).
    std::vector<std::shared_ptr<job>> more;
    std::unique_ptr<generation_formatter> format;
    bool stream = false;
    error_shape shape = error_shape::openai;
};

using route_result = std::variant<http_response, generation_plan>;

http_response error_response(const api_error& e, error_shape shape);

class router {
public:
    using handler = std::function<route_result(const http_request&)>;

    explicit router(std::string api_key) : api_key_(std::move(api_key)) {}

    // public_route: served without the API key (/health, for load balancers).
    void add(std::string method, std::string path, handler h, error_shape shape, bool public_route = false);
    route_result dispatch(const http_request& req) const;
    // The error shape of the API a path belongs to (Anthropic for /v1/messages).
    error_shape shape_of(std::string_view path) const;

private:
    struct route {
        std::string method, path;
        handler h;
        error_shape shape;
        bool public_route;
    };
    std::vector<route> routes_;
    std::string api_key_;
};

}  // namespace ds4::server
