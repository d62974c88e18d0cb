#include "examples/server/http/server.hpp"

#include <cstdio>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>

#include "ds4/core/error.hpp"
#include "examples/server/http/connection.hpp"

namespace ds4::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct http_server::impl {
    http_options options;
    http_counters counters;
    connection_context ctx;
    net::io_context io;
    tcp::acceptor acceptor;
    std::vector<std::thread> threads;

    impl(http_options o, const router& routes, scheduler& sched)
        : options(std::move(o)), ctx{options, routes, sched, counters}, io(options.io_threads), acceptor(io) {
        boost::system::error_code ec;
        const auto address = net::ip::make_address(options.host, ec);
        require(!ec, "--host '" + options.host + "' is not an IP address");
        const tcp::endpoint ep(address, options.port);
        acceptor.open(ep.protocol());
        acceptor.set_option(net::socket_base::reuse_address(true));
        acceptor.bind(ep, ec);
        require(!ec, "cannot bind " + options.host + ":" + std::to_string(options.port) + ": " + ec.message());
        acceptor.listen(net::socket_base::max_listen_connections);
    }

    void accept() {
        // Each connection gets its own strand: its handlers never run concurrently.
        acceptor.async_accept(net::make_strand(io), [this](boost::system::error_code ec, tcp::socket socket) {
            if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
            if (!ec) {
                socket.set_option(tcp::no_delay(true), ec);
                start_connection(std::move(socket), ctx);
            }
            accept();
        });
    }
};

http_server::http_server(http_options options, const router& routes, scheduler& sched)
    : impl_(std::make_unique<impl>(std::move(options), routes, sched)) {}

http_server::~http_server() { stop(); }

unsigned short http_server::port() const { return impl_->acceptor.local_endpoint().port(); }

void http_server::start() {
    impl_->accept();
    for (int i = 0; i < impl_->options.io_threads; ++i) impl_->threads.emplace_back([this] { impl_->io.run(); });
}

void http_server::stop_accepting() {
    net::post(impl_->io, [this] {
        boost::system::error_code ignored;
        impl_->acceptor.close(ignored);
    });
}

void http_server::stop() {
    impl_->io.stop();
    for (std::thread& t : impl_->threads)
        if (t.joinable()) t.join();
    impl_->threads.clear();
}

http_counters& http_server::counters() { return impl_->counters; }

}  // namespace ds4::server
