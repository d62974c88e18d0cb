#pragma once
// The HTTP/1.1 front: one acceptor and a few I/O threads (Boost.Asio) holding every connection;
// a connection costs a socket and a small buffer, never a thread, so thousands of idle or
// streaming clients fit. Beast stays inside http/*.cpp.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ds4::server {

class router;
class scheduler;

struct http_options {
    std::string host = "127.0.0.1";
    unsigned short port = 0;  // 0: the kernel picks a free port
    int io_threads = 2;
    std::size_t max_body = std::size_t{8} << 20;
    int sse_keepalive_ms = 5000;   // a comment frame after this long without output
    int idle_timeout_s = 300;      // a keep-alive connection with no request for this long closes
    int request_timeout_s = 1800;  // a generation running this long ends with a timeout error
};

struct http_counters {
    std::atomic<std::int64_t> connections_open{0};
    std::atomic<std::uint64_t> connections_total{0};
    std::atomic<std::uint64_t> requests_total{0};
    std::atomic<std::uint64_t> errors_total{0};
    std::atomic<std::uint64_t> client_disconnects{0};
    std::atomic<std::int64_t> generations_open{0};
};

class http_server {
public:
    http_server(http_options options, const router& routes, scheduler& sched);
    ~http_server();

    unsigned short port() const;
    void start();
    void stop_accepting();
    // Stops the I/O threads; open connections are dropped.
    void stop();
    http_counters& counters();

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ds4::server
