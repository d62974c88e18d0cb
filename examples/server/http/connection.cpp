#include "examples/server/http/connection.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <memory>
#include <optional>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "examples/server/http/router.hpp"
#include "examples/server/http/sse.hpp"
#include "examples/server/scheduler.hpp"

namespace ds4::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

class session : public std::enable_shared_from_this<session> {
public:
    session(tcp::socket socket, const connection_context& ctx)
        : stream_(std::move(socket)), ctx_(ctx), keepalive_timer_(stream_.get_executor()) {
        ++ctx_.counters.connections_open;
        ++ctx_.counters.connections_total;
    }
    ~session() {
        --ctx_.counters.connections_open;
        if (work_) {
            cancel_all();
            end_generation();
        }
    }

    void start() {
        net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
    }

private:
    void read_request() {
        parser_.emplace();
        parser_->body_limit(ctx_.options.max_body);
        parser_->header_limit(64 * 1024);
        stream_.expires_after(std::chrono::seconds(ctx_.options.idle_timeout_s));
        http::async_read_header(stream_, buffer_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
    }

    // curl and others send "Expect: 100-continue" with a large body and wait (curl: 1 s) for the
    // interim response before sending it.
    void on_header(beast::error_code ec) {
        if (ec) return on_read(ec);
        const auto read_body = [self = shared_from_this()] {
            http::async_read(self->stream_, self->buffer_, *self->parser_,
                             [self](beast::error_code ec, std::size_t) { self->on_read(ec); });
        };
        if (!beast::iequals(parser_->get()[http::field::expect], "100-continue") || parser_->is_done()) return read_body();
        static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
        net::async_write(stream_, net::buffer(cont.data(), cont.size()), [self = shared_from_this(), read_body](beast::error_code ec, std::size_t) {
            if (ec) return self->close();
            read_body();
        });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::body_limit) {
            // The header is parsed: answer in the shape of the API the path belongs to, then close
            // (the rest of the body is never read).
            const std::string path(parser_->get().target());
            keep_alive_ = false;
            send(error_response({error_code::body_too_large,
                                 "the request body is over the limit of " + std::to_string(ctx_.options.max_body) + " bytes",
                                 "", false},
                                ctx_.routes.shape_of(path.substr(0, path.find('?')))));
            return;
        }
        if (ec) {
            if (ec != http::error::end_of_stream && ec != beast::error::timeout && ec != net::error::operation_aborted &&
                ec != net::error::connection_reset && ec != net::error::eof) {
                keep_alive_ = false;
                send({400, "application/json", error_body({error_code::invalid_value, "malformed HTTP request: " + ec.message(), "", false},
                                                          error_shape::openai)});
                return;
            }
            close();
            return;
        }
        stream_.expires_never();
        ++ctx_.counters.requests_total;
        http::request<http::string_body> msg = parser_->release();
        keep_alive_ = msg.keep_alive();
        chunked_ = msg.version() >= 11;  // HTTP/1.0 has no chunked coding: SSE then ends with the connection
        if (!chunked_) keep_alive_ = false;
        http_request req;
        req.method = std::string(msg.method_string());
        const std::string target(msg.target());
        req.path = target.substr(0, target.find('?'));
        for (const auto& f : msg) {
            std::string name(f.name_string());
            std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
            req.headers.emplace_back(std::move(name), std::string(f.value()));
        }
        req.body = std::move(msg.body());
        route_result r = ctx_.routes.dispatch(req);
        if (auto* resp = std::get_if<http_response>(&r)) send(std::move(*resp));
        else start_generation(std::move(std::get<generation_plan>(r)));
    }

    void send(http_response r) {
        if (r.status >= 400) ++ctx_.counters.errors_total;
        auto msg = std::make_shared<http::response<http::string_body>>(http::status(r.status), 11);
        msg->set(http::field::server, "ds4-server");
        msg->set(http::field::content_type, r.content_type);
        msg->keep_alive(keep_alive_);
        msg->body() = std::move(r.body);
        msg->prepare_payload();
        http::async_write(stream_, *msg, [self = shared_from_this(), msg](beast::error_code ec, std::size_t) {
            if (ec || !self->keep_alive_) self->close();
            else self->read_request();
        });
    }

    void close() {
        beast::error_code ignored;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        stream_.socket().close(ignored);
    }

    // ---- generations -------------------------------------------------------------------------

    void start_generation(generation_plan plan) {
        work_ = std::move(plan.work);
        more_ = std::move(plan.more);
        finals_left_ = 1 + int(more_.size());
        format_ = std::move(plan.format);
        streaming_ = plan.stream;
        shape_ = plan.shape;
        final_seen_ = false;
        ++generation_;
        ++ctx_.counters.generations_open;
        work_->deadline = work_->arrival + std::chrono::seconds(ctx_.options.request_timeout_s);
        for (auto& j : more_) j->deadline = work_->deadline;
        std::weak_ptr<session> weak = shared_from_this();
        auto ex = stream_.get_executor();
        work_->out->set_wake([weak, ex] {
            net::post(ex, [weak] {
                if (auto self = weak.lock()) self->on_events();
            });
        });
        try {
            ctx_.sched.submit(work_);
            for (auto& j : more_) ctx_.sched.submit(j);
        } catch (const api_exception& e) {
            cancel_all();  // choices already queued end at the next step; nobody reads them
            end_generation();
            send(error_response(e.error, shape_));
            return;
        }
        watch_disconnect();
        // A stream's 200 and first frames wait for the first event, so a refusal at admission
        // (memory) is still an HTTP error; a quiet keep-alive period sends them instead.
        headers_sent_ = false;
        // Buffered generations arm it too: the pending timer keeps the session alive, and with it
        // the job's reader, until the final event.
        arm_keepalive();
    }

    // A peek that reads 0 bytes is a closed peer. Readable with no data can also be a stale
    // readiness edge left by the request's own read: that re-arms the watch. Data is a pipelined
    // request: it stays in the kernel for the next read, and the watch ends.
    void watch_disconnect() {
        const std::uint64_t gen = generation_;
        stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
            if (gen != self->generation_ || !self->work_ || ec == net::error::operation_aborted) return;
            if (ec) return self->client_gone();
            char byte;
            beast::error_code peek_ec;
            self->stream_.socket().non_blocking(true, peek_ec);
            const std::size_t n = self->stream_.socket().receive(net::buffer(&byte, 1), tcp::socket::message_peek, peek_ec);
            if (peek_ec == net::error::would_block || peek_ec == net::error::try_again) return self->watch_disconnect();
            if (peek_ec || n == 0) self->client_gone();
        });
    }

    void cancel_all() {
        if (work_) work_->cancelled = true;
        for (auto& j : more_) j->cancelled = true;
    }

    void client_gone() {
        if (!work_ || dead_) return;
        dead_ = true;
        ++ctx_.counters.client_disconnects;
        cancel_all();  // freed at the engine's next step; their final events end us
        close();
    }

    void arm_keepalive() {
        const std::uint64_t gen = generation_;
        keepalive_timer_.expires_after(std::chrono::milliseconds(ctx_.options.sse_keepalive_ms));
        keepalive_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
            if (ec || gen != self->generation_ || self->final_seen_ || self->dead_) return;
            if (self->streaming_ && !self->headers_sent_) self->start_stream();
            else if (self->streaming_ && std::chrono::steady_clock::now() - self->last_write_ >= std::chrono::milliseconds(self->ctx_.options.sse_keepalive_ms) / 2)
                self->queue_write(self->frame(sse_keepalive));
            self->arm_keepalive();
        });
    }

    void start_stream() {
        std::string head = "HTTP/1.1 200 OK\r\nServer: ds4-server\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
        if (chunked_) head += "Transfer-Encoding: chunked\r\n";
        head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
        headers_sent_ = true;
        queue_write(std::move(head));
        queue_write(frame(format_->stream_start()));
    }

    void on_events() {
        if (!work_) return;
        for (gen_event& ev : work_->out->drain()) {
            if (final_seen_) break;
            if (ev.final && --finals_left_ == 0) final_seen_ = true;
            // A buffered response with a failed choice is that error: the other choices stop now.
            if (ev.final && ev.error && !streaming_) cancel_all();
            if (dead_) continue;
            if (streaming_ && !headers_sent_) {
                if (ev.final && ev.error && ev.deltas.empty()) {
                    const api_error e = *ev.error;
                    cancel_all();  // one refused choice refuses the request
                    end_generation();
                    send(error_response(e, shape_));
                    return;
                }
                start_stream();
            }
            if (streaming_) {
                queue_write(frame(format_->stream_event(ev)));
                if (final_seen_ && chunked_) queue_write(std::string(http_last_chunk));
            } else {
                format_->collect(ev);
            }
        }
        if (!final_seen_) return;
        if (dead_) {
            end_generation();
            return;
        }
        if (!streaming_) {
            http_response r = format_->buffered_response();
            end_generation();
            send(std::move(r));
        } else if (!writing_) {
            finish_stream();
        }
    }

    void end_generation() {
        if (!work_) return;
        work_->out->set_wake(nullptr);
        work_.reset();
        more_.clear();
        format_.reset();
        ++generation_;  // stale watch and timer handlers see a new generation and return
        keepalive_timer_.cancel();
        --ctx_.counters.generations_open;
    }

    void finish_stream() {
        end_generation();
        if (dead_ || !keep_alive_) {
            close();
            return;
        }
        // The disconnect watch may still be pending; cancel it before the next read.
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
        read_request();
    }

    std::string frame(std::string_view sse) const { return chunked_ ? http_chunk(sse) : std::string(sse); }

    void queue_write(std::string data) {
        if (data.empty() || dead_) return;
        out_.push_back(std::move(data));
        if (!writing_) write_next();
    }

    void write_next() {
        writing_ = true;
        last_write_ = std::chrono::steady_clock::now();
        net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, std::size_t) {
            self->out_.pop_front();
            if (ec) {
                self->writing_ = false;
                self->out_.clear();
                self->client_gone();
                return;
            }
            if (!self->out_.empty()) return self->write_next();
            self->writing_ = false;
            if (self->final_seen_ && self->work_) self->finish_stream();
        });
    }

    beast::tcp_stream stream_;
    const connection_context& ctx_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    bool keep_alive_ = true;
    bool chunked_ = true;

    std::shared_ptr<job> work_;
    std::vector<std::shared_ptr<job>> more_;  // the request's other choices (OpenAI's n), on work_'s channel
    int finals_left_ = 0;                     // choices whose final event has not come
    std::unique_ptr<generation_formatter> format_;
    bool streaming_ = false, final_seen_ = false, dead_ = false, writing_ = false, headers_sent_ = false;
    error_shape shape_ = error_shape::openai;
    std::uint64_t generation_ = 0;
    std::deque<std::string> out_;
    net::steady_timer keepalive_timer_;
    std::chrono::steady_clock::time_point last_write_{};
};

}  // namespace

void start_connection(tcp::socket socket, const connection_context& ctx) {
    std::make_shared<session>(std::move(socket), ctx)->start();
}

}  // namespace ds4::server
