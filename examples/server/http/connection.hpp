#pragma once
// One client connection: reads requests (body limit enforced while reading), dispatches them,
// writes buffered responses, or drives a generation: SSE frames as the engine produces them,
// keep-alive comments while it is quiet, and cancellation when the client goes away.
#include <boost/asio/ip/tcp.hpp>

#include "examples/server/http/server.hpp"

namespace ds4::server {

struct connection_context {
    const http_options& options;
    const router& routes;
    scheduler& sched;
    http_counters& counters;
};

void start_connection(boost::asio::ip::tcp::socket socket, const connection_context& ctx);

}  // namespace ds4::server
