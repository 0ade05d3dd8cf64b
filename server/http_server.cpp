#include "server/http_server.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <functional>
#include <mutex>
#include <spdlog/spdlog.h>
#include <thread>
#include <unordered_map>

#include "server/api_error.h"
#include "server/peer_watch.h"
#include "server/service.h"
#include "server/websocket_session.h"

namespace moestream::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

namespace {

// Constant-time comparison: the time depends on the lengths only, never on where the first
// difference is, so a key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
    const size_t n = std::max(a.size(), b.size());
    unsigned diff = unsigned(a.size() != b.size());
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= unsigned(x ^ y);
    }
    return diff == 0;
}

api_error error_of(int status, std::string type, std::string message) {
    return make_api_error(status, std::move(type), std::move(message));
}

}  // namespace

// One connection's socket, reachable from shutdown (which closes idle keep-alive connections).
struct connection {
    beast::tcp_stream stream;
    explicit connection(tcp::socket s) : stream(std::move(s)) {}
};

struct http_server::impl {
    http_options& opts;
    service& api;
    // Declared before the io_context, so they outlive it: destroying the io_context destroys
    // the coroutine frames still queued in it, whose guards unregister their connection here.
    std::mutex mu;
    std::unordered_map<uint64_t, std::weak_ptr<connection>> connections;
    uint64_t next_id = 0;
    std::atomic<size_t> live{0};
    asio::io_context ioc;
    asio::executor_work_guard<asio::io_context::executor_type> work{ioc.get_executor()};
    tcp::acceptor acceptor{ioc};
    asio::signal_set signals{ioc};
    std::vector<std::thread> threads;
    std::atomic<bool> shutting_down{false};

    impl(http_options& o, service& a) : opts(o), api(a) {}

    asio::awaitable<void> accept_loop();
    asio::awaitable<void> session(std::shared_ptr<connection> c);
    asio::awaitable<void> drain_and_stop();
    void close_connections();
};

namespace {

// ---- the HTTP responder ----------------------------------------------------------------------

class http_responder final : public responder {
  public:
    // `count` records the request in /metrics; it is called before the response's last bytes are
    // written, so a client that has read a response always finds it counted.
    http_responder(beast::tcp_stream& s, const http::request<http::string_body>& req, const http_options& o,
                   std::vector<std::pair<std::string, std::string>> extra, std::function<void(int)> count)
        : stream_(s), req_(req), opts_(o), extra_(std::move(extra)), count_(std::move(count)) {}

    asio::awaitable<void> send(http_response r) override {
        http::response<http::string_body> res{http::status(r.status), req_.version()};
        res.set(http::field::server, "moestream");
        res.set(http::field::content_type, r.content_type);
        for (const auto& [k, v] : extra_) res.set(k, v);
        for (const auto& [k, v] : r.headers) res.set(k, v);
        res.keep_alive(req_.keep_alive());
        res.body() = std::move(r.body);
        res.prepare_payload();
        status_ = r.status;
        count_once(r.status);
        stream_.expires_after(opts_.write_timeout);
        co_await http::async_write(stream_, res, asio::use_awaitable);
        keep_alive_ = res.keep_alive();
    }

    asio::awaitable<void> stream_begin(std::string content_type) override {
        MS_ASSERT_MSG(!streaming_, "stream_begin twice");
        streaming_ = true;
        status_ = 200;
        // HTTP/1.0 has no chunked encoding: the stream is delimited by closing the connection.
        chunked_ = req_.version() >= 11;
        http::response<http::empty_body> res{http::status::ok, req_.version()};
        res.set(http::field::server, "moestream");
        res.set(http::field::content_type, content_type);
        res.set(http::field::cache_control, "no-cache");
        res.set("X-Accel-Buffering", "no");
        for (const auto& [k, v] : extra_) res.set(k, v);
        res.keep_alive(chunked_ && req_.keep_alive());
        keep_alive_ = res.keep_alive();
        if (chunked_) res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        stream_.expires_after(opts_.write_timeout);
        co_await http::async_write_header(stream_, sr, asio::use_awaitable);
    }

    asio::awaitable<void> stream_write(std::string_view data) override {
        if (data.empty()) co_return;
        stream_.expires_after(opts_.write_timeout);
        if (chunked_) co_await asio::async_write(stream_, http::make_chunk(asio::buffer(data)), asio::use_awaitable);
        else co_await asio::async_write(stream_, asio::buffer(data), asio::use_awaitable);
    }

    asio::awaitable<void> stream_end() override {
        count_once(status_);
        stream_.expires_after(opts_.write_timeout);
        if (chunked_) co_await asio::async_write(stream_, http::make_chunk_last(), asio::use_awaitable);
    }

    bool keep_alive() const { return keep_alive_; }
    int status() const { return status_; }
    // Counts the request unless its response already was (a stream cut before its end, a peer gone).
    void count_once(int status) {
        if (counted_) return;
        counted_ = true;
        count_(status);
    }

  private:
    beast::tcp_stream& stream_;
    const http::request<http::string_body>& req_;
    const http_options& opts_;
    std::vector<std::pair<std::string, std::string>> extra_;
    std::function<void(int)> count_;
    bool streaming_ = false, chunked_ = true, keep_alive_ = false, counted_ = false;
    int status_ = 0;
};

// Writes a complete error response outside any route (limits, parse errors, auth), in the shape of
// the API `path` belongs to (service.h error_body) when it is known.
asio::awaitable<void> send_error(beast::tcp_stream& s, unsigned version, const api_error& e, bool keep_alive,
                                  std::chrono::seconds timeout,
                                  const std::vector<std::pair<std::string, std::string>>& extra = {},
                                  std::string_view path = {}) {
    http::response<http::string_body> res{http::status(e.status), version};
    res.set(http::field::server, "moestream");
    res.set(http::field::content_type, "application/json");
    for (const auto& [k, v] : extra) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = error_body(path, e);
    res.prepare_payload();
    s.expires_after(timeout);
    co_await http::async_write(s, res, use_nothrow);
}

// The path of a request target (without the query).
std::string_view target_path(std::string_view target) { return target.substr(0, target.find('?')); }

// After an error answered before the body was read: stop sending, then read and drop what the
// client is still sending for a moment, so it sees the response instead of a reset.
asio::awaitable<void> lingering_close(beast::tcp_stream& s) {
    boost::system::error_code ignored;
    s.socket().shutdown(tcp::socket::shutdown_send, ignored);
    s.expires_after(std::chrono::seconds(2));
    std::vector<char> sink(16384);  // not std::array: GCC 12 cannot copy arrays into coroutine frames
    size_t total = 0;
    while (total < (16u << 20)) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(sink), use_nothrow);
        if (ec) break;
        total += n;
    }
    s.socket().close(ignored);
}

std::string header_value(const http::request<http::string_body>& req, std::string_view name) {
    auto it = req.find(name);
    return it == req.end() ? std::string() : std::string(it->value());
}

}  // namespace

// ---- accepting and sessions ---------------------------------------------------------------------

asio::awaitable<void> http_server::impl::accept_loop() {
    for (;;) {
        auto [ec, sock] = co_await acceptor.async_accept(asio::make_strand(ioc), use_nothrow);
        if (ec) {
            if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
            spdlog::warn("accept failed: {}", ec.message());
            continue;
        }
        auto c = std::make_shared<connection>(std::move(sock));
        auto ex = c->stream.get_executor();
        asio::co_spawn(ex, session(std::move(c)), [](std::exception_ptr e) {
            // A write to a client that has gone throws a system_error: routine. Anything else
            // ended a request that should have been answered: say so.
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const boost::system::system_error& x) {
                spdlog::debug("connection closed: {}", x.what());
            } catch (const std::exception& x) {
                spdlog::error("a connection ended on an exception: {}", x.what());
            }
        });
    }
}

asio::awaitable<void> http_server::impl::session(std::shared_ptr<connection> c) {
    uint64_t id;
    {
        std::lock_guard lock(mu);
        id = next_id++;
        connections[id] = c;
    }
    ++live;
    struct leave {
        impl* self;
        uint64_t id;
        ~leave() {
            std::lock_guard lock(self->mu);
            self->connections.erase(id);
            --self->live;
        }
    } guard{this, id};
    auto& stream = c->stream;
    beast::flat_buffer buffer;
    // Braced lists are named first: GCC 12 cannot keep an initializer_list across a co_await.
    const std::vector<std::pair<std::string, std::string>> retry_later{{"Retry-After", "1"}};
    if (live.load() > opts.max_connections) {
        co_await send_error(stream, 11, error_of(503, "unavailable_error", "too many connections"), false,
                             opts.write_timeout, retry_later);
        co_await lingering_close(stream);
        co_return;
    }
    bool after_first_request = false;
    for (;;) {
        http::request_parser<http::string_body> parser;
        parser.header_limit(uint32_t(std::min<size_t>(opts.header_bytes_max, UINT32_MAX)));
        parser.body_limit(opts.body_bytes_max);
        // Between requests a keep-alive connection may stay idle for idle_timeout; a request's
        // header (a new connection's first one from the connect on) must arrive within
        // header_timeout once it has begun (slowloris).
        if (after_first_request && buffer.size() == 0) {
            stream.expires_after(opts.idle_timeout);
            auto [iec, in] = co_await stream.async_read_some(buffer.prepare(16384), use_nothrow);
            if (iec) co_return;  // idle for too long, gone, or closed by shutdown
            buffer.commit(in);
        }
        after_first_request = true;
        stream.expires_after(opts.header_timeout);
        auto [hec, hn] = co_await http::async_read_header(stream, buffer, parser, use_nothrow);
        (void)hn;
        if (hec) {
            if (hec == http::error::end_of_stream || hec == asio::error::eof || hec == beast::error::timeout ||
                hec == asio::error::operation_aborted || hec == asio::error::connection_reset)
                co_return;
            if (hec == http::error::header_limit) {
                co_await send_error(stream, 11, error_of(431, "invalid_request_error", "request header fields too large"),
                                     false, opts.write_timeout);
            } else if (hec == http::error::body_limit) {
                co_await send_error(stream, 11,
                                     error_of(413, "invalid_request_error",
                                              "request body too large (limit " + std::to_string(opts.body_bytes_max) +
                                                  " bytes)"),
                                     false, opts.write_timeout, {}, target_path(parser.get().target()));
            } else {
                co_await send_error(stream, 11, error_of(400, "invalid_request_error", "malformed HTTP request: " + hec.message()),
                                     false, opts.write_timeout);
            }
            co_await lingering_close(stream);
            co_return;
        }
        auto& head = parser.get();
        if (beast::iequals(head[http::field::expect], "100-continue")) {
            http::response<http::empty_body> cont{http::status::continue_, head.version()};
            stream.expires_after(opts.write_timeout);
            auto [cec, cn] = co_await http::async_write(stream, cont, use_nothrow);
            (void)cn;
            if (cec) co_return;
        }
        stream.expires_after(opts.header_timeout);
        auto [bec, bn] = co_await http::async_read(stream, buffer, parser, use_nothrow);
        (void)bn;
        if (bec) {
            if (bec == http::error::body_limit)
                co_await send_error(stream, head.version(),
                                     error_of(413, "invalid_request_error",
                                              "request body too large (limit " + std::to_string(opts.body_bytes_max) +
                                                  " bytes)"),
                                     false, opts.write_timeout, {}, target_path(head.target()));
            else if (bec != beast::error::timeout && bec != http::error::end_of_stream && bec != asio::error::eof)
                co_await send_error(stream, head.version(),
                                     error_of(400, "invalid_request_error", "malformed HTTP body: " + bec.message()), false,
                                     opts.write_timeout);
            co_await lingering_close(stream);
            co_return;
        }
        stream.expires_never();
        http::request<http::string_body> req = parser.release();
        // During the shutdown drain requests are still answered (503 but for what runs), each
        // on a connection that then closes.
        if (shutting_down) req.keep_alive(false);

        // CORS: answered before authentication (browsers send no credentials on preflight).
        std::vector<std::pair<std::string, std::string>> extra;
        const std::string origin = header_value(req, "Origin");
        bool origin_ok = false;
        if (!origin.empty() && !opts.cors_origins.empty())
            for (const auto& o : opts.cors_origins)
                if (o == "*" || o == origin) origin_ok = true;
        if (origin_ok) {
            extra.push_back({"Access-Control-Allow-Origin", origin});
            extra.push_back({"Vary", "Origin"});
        }
        const std::string target(req.target());
        const size_t q = target.find('?');
        const std::string path = target.substr(0, q);
        if (req.method() == http::verb::options) {
            http::response<http::empty_body> res{http::status::no_content, req.version()};
            res.set(http::field::server, "moestream");
            for (const auto& [k, v] : extra) res.set(k, v);
            if (origin_ok) {
                res.set("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
                const std::string asked = header_value(req, "Access-Control-Request-Headers");
                res.set("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type, X-Api-Key" : asked);
                res.set("Access-Control-Max-Age", "600");
            }
            res.keep_alive(req.keep_alive());
            stream.expires_after(opts.write_timeout);
            auto [oec, on] = co_await http::async_write(stream, res, use_nothrow);
            (void)on;
            if (oec || !req.keep_alive()) co_return;
            continue;
        }
        // Authentication on every route but /health.
        std::string api_key;
        if (!opts.api_keys.empty() && path != "/health" && path != "/v1/health") {
            std::string key = header_value(req, "X-Api-Key");
            std::string auth = header_value(req, "Authorization");
            if (key.empty() && !auth.empty()) key = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : auth;
            bool ok = false;
            for (const auto& k : opts.api_keys) ok |= same_secret(key, k);
            if (!ok) {
                auto e = error_of(401, "authentication_error", "Invalid API Key");
                co_await send_error(stream, req.version(), e, req.keep_alive(), opts.write_timeout, extra, path);
                api.metrics()->count_http(path, std::string(req.method_string()), 401);
                if (!req.keep_alive()) co_return;
                continue;
            }
            api_key = std::move(key);
        }
        if (beast::websocket::is_upgrade(req) && path == "/v1/ws") {
            if (!api.ready() || shutting_down) {
                co_await send_error(stream, req.version(), error_of(503, "unavailable_error", "Loading model"), false,
                                     opts.write_timeout, retry_later);
                co_return;
            }
            api.metrics()->count_http(path, "GET", 101);
            co_await run_websocket(std::move(stream), std::move(req), api, opts);
            co_return;
        }

        http_responder out(stream, req, opts, extra, [metrics = api.metrics(), path, method = std::string(req.method_string())](int status) {
            metrics->count_http(path, method, status);
        });
        api_request ar;
        ar.method = req.method_string();
        ar.path = path;
        ar.query = q == std::string::npos ? std::string_view() : std::string_view(target).substr(q + 1);
        ar.body = req.body();
        ar.api_key = api_key;
        // The route races the peer: a client that goes away cancels its request (and with it
        // the generation) at once, even while nothing is being written.
        auto raced = co_await (api.handle(ar, out) || watch_peer(stream.socket()));
        const bool peer_gone = raced.index() == 1;
        out.count_once(peer_gone ? 499 : out.status());
        if (peer_gone || !out.keep_alive()) {
            boost::system::error_code ignored;
            stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
            co_return;
        }
    }
}

// ---- lifecycle ---------------------------------------------------------------------------------

http_server::http_server(http_options opts, service& api) : opts_(std::move(opts)), impl_(std::make_unique<impl>(opts_, api)) {}

http_server::~http_server() {
    shutdown();
    wait();
    // A request coroutine may still wait on its generation's channel, whose operations live in
    // the engine's context, not in ours: cancel them now (their handlers are queued here) and
    // run what is ready, so no operation outlives this io_context and completes into it later.
    impl_->api.abandon_all();
    impl_->ioc.restart();
    impl_->ioc.poll();
}

result<uint16_t> http_server::listen() {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(opts_.host, ec);
    if (ec) return make_error("--host '" + opts_.host + "' is not an IP address: " + ec.message());
    tcp::endpoint ep(address, opts_.port);
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        return make_error("cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) + ": " + ec.message());
    const uint16_t port = a.local_endpoint().port();
    asio::co_spawn(impl_->ioc, impl_->accept_loop(), asio::detached);
    const int n = std::max(1, opts_.io_threads);
    for (int i = 0; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
    return port;
}

void http_server::handle_signals() {
    impl_->signals.add(SIGINT);
    impl_->signals.add(SIGTERM);
    impl_->signals.async_wait([this](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        spdlog::info("signal {}: shutting down", sig);
        shutdown();
    });
}

void http_server::impl::close_connections() {
    std::vector<std::shared_ptr<connection>> all;
    {
        std::lock_guard lock(mu);
        for (auto& [id, w] : connections)
            if (auto c = w.lock()) all.push_back(std::move(c));
    }
    for (auto& c : all)
        asio::post(c->stream.get_executor(), [c] {
            boost::system::error_code ignored;
            c->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
            c->stream.socket().close(ignored);
        });
}

asio::awaitable<void> http_server::impl::drain_and_stop() {
    asio::steady_timer t(co_await asio::this_coro::executor);
    // Running generations may finish during the drain period, while new connections are still
    // accepted and answered 503 (/health too: what load balancers watch); then the listener
    // closes, the rest are cancelled and their streams end with an error event; idle
    // connections are closed last.
    const auto until = std::chrono::steady_clock::now() + opts.drain;
    while (api.live_jobs() > 0 && std::chrono::steady_clock::now() < until) {
        t.expires_after(std::chrono::milliseconds(50));
        co_await t.async_wait(use_nothrow);
    }
    boost::system::error_code ignored;
    acceptor.close(ignored);
    api.cancel_all();
    const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (api.live_jobs() > 0 && std::chrono::steady_clock::now() < grace) {
        t.expires_after(std::chrono::milliseconds(20));
        co_await t.async_wait(use_nothrow);
    }
    close_connections();
    const auto last = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (live.load() > 0 && std::chrono::steady_clock::now() < last) {
        t.expires_after(std::chrono::milliseconds(20));
        co_await t.async_wait(use_nothrow);
    }
    signals.cancel();
    work.reset();
    ioc.stop();
}

void http_server::shutdown() {
    if (impl_->shutting_down.exchange(true)) return;
    impl_->api.set_draining();
    if (impl_->threads.empty()) return;  // never listened
    asio::post(impl_->ioc, [this] { asio::co_spawn(impl_->ioc, impl_->drain_and_stop(), asio::detached); });
}

void http_server::wait() {
    for (auto& t : impl_->threads)
        if (t.joinable()) t.join();
    impl_->threads.clear();
}

}  // namespace moestream::server
