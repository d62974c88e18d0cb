#include "examples/server/api/routes.hpp"
namespace ds4::server {
route_result anthropic_messages(server_context&, const http_request&) { throw_api_error(error_code::not_found, "not yet"); }
}
