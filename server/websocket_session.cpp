#include "server/websocket_session.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>
#include <unordered_map>

#include "server/completion_job.h"
#include "server/constraint_request.h"
#include "server/service.h"
#include "server/websocket_outbox.h"


namespace moestream::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using namespace asio::experimental::awaitable_operators;
using clock_type = std::chrono::steady_clock;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

websocket_limits websocket_limits_for(const http_options& opts) {
    websocket_limits l;
    l.max_message_bytes = opts.body_bytes_max + (64u << 10);
    return l;
}

namespace {

// How often a connection checks for shutdown and for a write that does not finish.
constexpr auto k_tick = std::chrono::milliseconds(100);
// How long a job is waited on before the request's deadline is checked again.
constexpr auto k_job_wait = std::chrono::milliseconds(1000);
// At the end of a connection, how long its cancelled requests get to deliver their final events
// (they are cancelled at the engine's next step; a step of a large model can take a while).
constexpr auto k_final_wait = std::chrono::seconds(10);

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

// The subprotocol to echo: ours when the client offered it among its comma-separated list.
std::string chosen_subprotocol(const http::request<http::string_body>& req) {
    auto it = req.find(http::field::sec_websocket_protocol);
    if (it == req.end()) return {};
    std::string_view offered = it->value();
    while (!offered.empty()) {
        const size_t comma = offered.find(',');
        std::string_view p = offered.substr(0, comma);
        while (!p.empty() && (p.front() == ' ' || p.front() == '\t')) p.remove_prefix(1);
        while (!p.empty() && (p.back() == ' ' || p.back() == '\t')) p.remove_suffix(1);
        if (p == k_ws_subprotocol) return std::string(k_ws_subprotocol);
        if (comma == std::string_view::npos) break;
        offered.remove_prefix(comma + 1);
    }
    return {};
}

struct live_request {
    ws_stream_state stream;
    std::unique_ptr<completion_job> job;
    // After `job`, so it is unregistered before the job is destroyed; the shutdown drain waits
    // for registered jobs.
    std::optional<service::job_registration> registered;
    ws_request_options options;
    bool cancel_asked = false;  // request.cancel: ends as "cancelled"
};

class ws_session : public std::enable_shared_from_this<ws_session> {
  public:
    ws_session(beast::tcp_stream stream, service& api, const http_options& opts)
        : ws_(std::move(stream)),
          api_(api),
          opts_(opts),
          limits_(websocket_limits_for(opts)),
          out_(limits_.soft_queue_bytes, limits_.hard_queue_bytes),
          writer_wake_(ws_.get_executor()) {}

    asio::awaitable<void> run(http::request<http::string_body> req);
    // After an unexpected exception: stop everything at once.
    void abandon() {
        finished_ = true;
        output_stopped_ = true;
        cancel_all_requests();
        tear_down();
    }

  private:
    asio::awaitable<void> read_loop();
    asio::awaitable<void> write_loop();
    asio::awaitable<void> housekeeping(std::shared_ptr<ws_session> self);
    asio::awaitable<void> pump(std::shared_ptr<ws_session> self, std::shared_ptr<live_request> r);

    void on_message(std::string_view text);
    void create(ws_create c);
    void cancel(const std::string& id);
    void finish_request(live_request& r, const job_update& last, clock_type::time_point arrival,
                        request_observation& obs, std::optional<clock_type::time_point> first_token, bool timed_out);

    void send(std::string json, ws_stream_state* owner = nullptr);
    void send_delta(live_request& r, ws_delta d);
    void request_close(websocket::close_code code, std::string_view reason);
    void slow_consumer(std::string_view why);
    // Drops what is queued, cancels the requests and closes with `code` after the current write.
    void close_now(websocket::close_code code, std::string_view reason);
    void cancel_all_requests();
    void tear_down();
    bool output_open() const { return !output_stopped_ && !close_sent_; }

    websocket::stream<beast::tcp_stream> ws_;
    service& api_;
    const http_options& opts_;
    websocket_limits limits_;
    ws_outbox out_;
    asio::steady_timer writer_wake_;  // cancelled to wake the writer
    std::unordered_map<std::string, std::shared_ptr<live_request>> live_;
    size_t pumps_ = 0;                 // pump coroutines still running
    std::string defaults_;             // session.update: members added to every request body
    std::optional<websocket::close_reason> close_;  // the writer closes with it once the queue is empty
    bool close_sent_ = false;
    bool output_stopped_ = false;      // slow consumer or connection gone: nothing more is queued
    bool reading_done_ = false;
    bool finished_ = false;            // run() is over: housekeeping stops
    bool writing_ = false;
    clock_type::time_point write_started_{};
    std::optional<clock_type::time_point> draining_since_;
};

// ---- connection ------------------------------------------------------------------------------------

asio::awaitable<void> ws_session::run(http::request<http::string_body> req) {
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(0);  // no limit in Beast: read_loop enforces max_message_bytes (see there)
    websocket::permessage_deflate pmd;  // off: compression costs latency on small token messages
    pmd.server_enable = false;
    pmd.client_enable = false;
    ws_.set_option(pmd);
    const std::string protocol = chosen_subprotocol(req);
    ws_.set_option(websocket::stream_base::decorator([protocol](websocket::response_type& res) {
        res.set(http::field::server, "moestream");
        if (!protocol.empty()) res.set(http::field::sec_websocket_protocol, protocol);
    }));
    auto [aec] = co_await ws_.async_accept(req, use_nothrow);
    if (aec) {
        spdlog::debug("websocket: handshake failed: {}", aec.message());
        co_return;
    }
    ws_.text(true);

    const auto& m = api_.model();
    ws_session_info info;
    info.server = "moestream " MOESTREAM_VERSION;
    info.model = m.name;
    info.n_ctx = m.n_ctx;
    info.max_parallel = m.slots;
    send(session_created_json(info, limits_));

    auto self = shared_from_this();
    asio::co_spawn(ws_.get_executor(), housekeeping(self), asio::detached);
    co_await (read_loop() && write_loop());

    // The socket is done: every request still running is cancelled (as an HTTP client going away
    // cancels its generation), and gets a moment to deliver its final event so that the engine
    // has freed its sequence and the metrics saw it before the connection counts as gone.
    output_stopped_ = true;
    cancel_all_requests();
    asio::steady_timer t(ws_.get_executor());
    const auto until = clock_type::now() + k_final_wait;
    while (pumps_ > 0 && clock_type::now() < until) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(use_nothrow);
    }
    if (pumps_ > 0) spdlog::warn("websocket: {} request(s) did not end within {} s of the connection closing", pumps_,
                                 k_final_wait.count());
    finished_ = true;
    tear_down();
}

// Messages are read piece by piece and their size checked here rather than by Beast's
// read_message_max: Beast fails an oversized message by closing the TCP connection while the
// rest of it is still arriving, so the client gets a reset instead of the 1009 close. Here the
// close frame is sent and the rest discarded until the client answers it.
asio::awaitable<void> ws_session::read_loop() {
    constexpr size_t k_piece = 64u << 10;
    constexpr uint64_t k_discard_max = 64u << 20;  // then the connection is dropped
    beast::flat_buffer buffer;
    bool discarding = false;
    uint64_t discarded = 0;
    for (;;) {
        const size_t room = discarding ? k_piece : std::min(k_piece, limits_.max_message_bytes + 1 - buffer.size());
        auto [ec, n] = co_await ws_.async_read_some(buffer, room, use_nothrow);
        (void)n;
        if (ec) {
            if (ec != websocket::error::closed) spdlog::debug("websocket: read ended: {}", ec.message());
            break;
        }
        if (discarding) {
            discarded += buffer.size();
            buffer.clear();
            if (discarded > k_discard_max) tear_down();
            continue;
        }
        if (buffer.size() > limits_.max_message_bytes) {
            spdlog::info("websocket: a client message exceeded {} bytes: closing with 1009", limits_.max_message_bytes);
            discarding = true;
            buffer.clear();
            buffer.shrink_to_fit();
            close_now(websocket::close_code::too_big, "message too big");
            continue;
        }
        if (!ws_.is_message_done()) continue;
        if (!ws_.got_text()) {
            send(error_json("", bad_request("", "binary messages are not part of llmstream.v1: send JSON text")));
        } else {
            const auto data = buffer.cdata();
            on_message(std::string_view(static_cast<const char*>(data.data()), data.size()));
        }
        buffer.consume(buffer.size());
        if (buffer.capacity() > (1u << 20)) buffer.shrink_to_fit();  // after a large body
    }
    reading_done_ = true;
    output_stopped_ = true;
    writer_wake_.cancel();
    // A write that waits on a peer which is gone would otherwise hold the connection until the
    // write timeout.
    if (writing_) tear_down();
}

asio::awaitable<void> ws_session::write_loop() {
    for (;;) {
        if (reading_done_) break;
        if (!out_.empty()) {
            std::string message = out_.pop();
            writing_ = true;
            write_started_ = clock_type::now();
            auto [ec, n] = co_await ws_.async_write(asio::buffer(message), use_nothrow);
            (void)n;
            writing_ = false;
            if (ec) {
                spdlog::debug("websocket: write failed: {}", ec.message());
                output_stopped_ = true;
                break;
            }
            continue;
        }
        if (close_) {
            close_sent_ = true;
            writing_ = true;
            write_started_ = clock_type::now();
            auto [ec] = co_await ws_.async_close(*close_, use_nothrow);
            writing_ = false;
            if (ec) spdlog::debug("websocket: close failed: {}", ec.message());
            break;
        }
        writer_wake_.expires_at(clock_type::time_point::max());
        co_await writer_wake_.async_wait(use_nothrow);
    }
}

// Shutdown and stuck writes, checked every tick.
asio::awaitable<void> ws_session::housekeeping(std::shared_ptr<ws_session> self) {
    (void)self;  // keeps the session alive while this runs
    asio::steady_timer t(ws_.get_executor());
    while (!finished_) {
        t.expires_after(k_tick);
        co_await t.async_wait(use_nothrow);
        if (finished_) break;
        const auto now = clock_type::now();
        if (writing_ && now - write_started_ > opts_.write_timeout) {
            // The client has read nothing for the write timeout: no close frame can get through
            // either, so the connection is dropped.
            slow_consumer("a write did not complete within the write timeout");
            tear_down();
        }
        if (api_.draining() && !reading_done_) {
            if (!draining_since_) draining_since_ = now;
            if (now - *draining_since_ >= opts_.drain) cancel_all_requests();
            if (live_.empty()) request_close(websocket::close_code::service_restart, "server shutting down");
        }
    }
}

void ws_session::tear_down() {
    boost::system::error_code ignored;
    beast::get_lowest_layer(ws_).socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws_).socket().close(ignored);
}

// ---- output -------------------------------------------------------------------------------------

void ws_session::send(std::string json, ws_stream_state* owner) {
    if (!output_open()) return;
    const bool ok = out_.push_text(std::move(json), owner);
    writer_wake_.cancel();
    if (!ok) slow_consumer("the send queue is over its hard limit");
}

void ws_session::send_delta(live_request& r, ws_delta d) {
    if (!output_open()) return;
    const bool ok = out_.push_delta(r.stream, std::move(d));
    writer_wake_.cancel();
    if (!ok) slow_consumer("the send queue is over its hard limit");
}

void ws_session::request_close(websocket::close_code code, std::string_view reason) {
    if (close_) return;
    close_.emplace(code, reason);
    writer_wake_.cancel();
}

void ws_session::slow_consumer(std::string_view why) {
    if (output_stopped_) return;
    spdlog::warn("websocket: slow consumer ({}; {} bytes queued): cancelling its {} request(s), closing with 1008",
                 why, out_.bytes(), live_.size());
    close_now(websocket::close_code::policy_error, "slow consumer");
}

void ws_session::close_now(websocket::close_code code, std::string_view reason) {
    output_stopped_ = true;
    out_.clear();
    cancel_all_requests();
    close_.reset();
    close_.emplace(code, reason);
    writer_wake_.cancel();
}

void ws_session::cancel_all_requests() {
    for (auto& [id, r] : live_) r->job->cancel();
}

// ---- client messages ----------------------------------------------------------------------------

void ws_session::on_message(std::string_view text) {
    if (output_stopped_ || close_) return;  // closing: nothing more is started or answered
    auto msg = parse_client_message(text, limits_);
    if (auto* c = std::get_if<ws_create>(&msg)) return create(std::move(*c));
    if (auto* c = std::get_if<ws_cancel>(&msg)) return cancel(c->id);
    if (auto* p = std::get_if<ws_ping>(&msg)) return send(pong_json(p->t_json));
    if (auto* u = std::get_if<ws_session_update>(&msg)) {
        defaults_ = std::move(u->defaults_members);
        return send(session_updated_json(defaults_));
    }
    auto& bad = std::get<ws_bad_message>(msg);
    if (!bad.id.empty() && !live_.contains(bad.id)) {
        // A request.create that cannot start: its error ends it, and request.done follows.
        send(error_json(bad.id, bad.error));
        send(request_done_json(bad.id, "error", job_usage{}, ws_request_options{}));
        return;
    }
    // An error naming a live id would end that request by the protocol's rule: connection level.
    send(error_json("", bad.error));
}

void ws_session::create(ws_create c) {
    if (live_.contains(c.id)) {
        // The id belongs to a running request: an error carrying it would read as that request's
        // end, so the refusal is connection-level and names the id in its message.
        send(error_json("", make_api_error(409, "invalid_request_error",
                                           "request id \"" + c.id + "\" is already in flight on this connection",
                                           "id")));
        return;
    }
    auto refuse = [&](const api_error& e) {
        send(error_json(c.id, e));
        send(request_done_json(c.id, "error", job_usage{}, c.options));
    };
    if (api_.draining() || draining_since_) {
        auto e = make_api_error(503, "unavailable_error", "the server is shutting down");
        return refuse(e);
    }
    if (live_.size() >= limits_.max_inflight) {
        return refuse(make_api_error(429, "rate_limit_error",
                                     "too many requests in flight on this connection (limit " +
                                         std::to_string(limits_.max_inflight) + "): wait for a request.done"));
    }
    parse_limits pl;
    pl.vocab = api_.model().n_vocab;
    const std::string body = body_with_defaults(c.body, defaults_);
    auto parsed = parse_completion_request(body, c.route, pl);
    if (!parsed.ok()) return refuse(parsed.error());
    auto constraint = parse_constraint_request(body);  // response_format
    if (!constraint.ok()) return refuse(constraint.error());
    auto started = completion_job::start(api_.model(), std::move(*parsed), *constraint);
    if (!started.ok()) return refuse(started.error());

    auto r = std::make_shared<live_request>();
    r->stream.id = c.id;
    r->job = std::move(*started);
    r->registered.emplace(api_, r->job.get());
    r->options = c.options;
    live_.emplace(c.id, r);
    send(request_accepted_json(c.id), &r->stream);
    ++pumps_;
    asio::co_spawn(ws_.get_executor(), pump(shared_from_this(), std::move(r)), asio::detached);
}

void ws_session::cancel(const std::string& id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;  // unknown or already finished: nothing to stop
    it->second->cancel_asked = true;
    it->second->job->cancel();
}

// ---- one request --------------------------------------------------------------------------------

asio::awaitable<void> ws_session::pump(std::shared_ptr<ws_session> self, std::shared_ptr<live_request> r) {
    (void)self;  // keeps the session alive while this runs
    const auto arrival = r->job->arrival();
    const auto deadline = arrival + api_.limits().request_timeout;
    request_observation obs;
    std::optional<clock_type::time_point> first_token, last_emit;
    bool timed_out = false;
    for (;;) {
        const auto now = clock_type::now();
        if (!timed_out && now >= deadline) {
            timed_out = true;
            r->job->cancel();
        }
        auto wait = k_job_wait;
        if (!timed_out)
            wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                                      std::chrono::milliseconds(1));
        std::optional<job_update> u;
        try {
            u = co_await r->job->next(wait);
        } catch (const std::exception& e) {
            // Not expected; the request ends with an error rather than taking the connection down.
            job_update failed;
            failed.done = true;
            failed.finish_reason = "error";
            failed.error = make_api_error(500, "server_error", std::string("internal error: ") + e.what());
            u = std::move(failed);
        }
        if (!u) continue;
        if (!u->tokens.empty()) {
            const auto t = clock_type::now();
            if (!first_token) first_token = t;
            else if (last_emit) obs.itl_s.push_back(seconds(t - *last_emit));
            last_emit = t;
        }
        for (auto& d : deltas_of(*u, r->options.token_ids)) send_delta(*r, std::move(d));
        if (u->done) {
            finish_request(*r, *u, arrival, obs, first_token, timed_out);
            break;
        }
    }
    auto it = live_.find(r->stream.id);
    if (it != live_.end() && it->second == r) live_.erase(it);
    --pumps_;
}

void ws_session::finish_request(live_request& r, const job_update& last, clock_type::time_point arrival,
                                request_observation& obs, std::optional<clock_type::time_point> first_token,
                                bool timed_out) {
    std::string reason = last.finish_reason;
    std::optional<api_error> error;
    if (reason == "error") {
        error = last.error;
    } else if (reason == "cancelled" && !r.cancel_asked && output_open()) {
        // Not the client's doing: the request's time limit or the server's shutdown. (With the
        // connection gone or closing it stays "cancelled", an abort in the metrics.)
        reason = "error";
        if (timed_out)
            error = make_api_error(504, "timeout_error",
                                   "the request took longer than the server's limit of " +
                                       std::to_string(api_.limits().request_timeout.count()) + " s");
        else
            error = make_api_error(503, "unavailable_error", "the request was cancelled: the server is shutting down");
    }
    if (error) send(error_json(r.stream.id, *error), &r.stream);
    send(request_done_json(r.stream.id, reason, last.usage, r.options), &r.stream);

    const auto now = clock_type::now();
    obs.queue_s = last.usage.queue_s;
    obs.prefill_s = last.usage.prefill_s;
    obs.decode_s = last.usage.decode_s;
    obs.ttft_s = seconds((first_token ? *first_token : now) - arrival);
    obs.e2e_s = seconds(now - arrival);
    obs.prompt_tokens = last.usage.prompt_tokens;
    obs.cached_tokens = last.usage.cached_tokens;
    obs.completion_tokens = last.usage.completion_tokens;
    obs.finish_reason = std::string(finished_reason_label(reason));
    api_.metrics()->observe_request(obs);
}

}  // namespace

asio::awaitable<void> run_websocket(beast::tcp_stream stream, http::request<http::string_body> req, service& api,
                                    const http_options& opts) {
    auto session = std::make_shared<ws_session>(std::move(stream), api, opts);
    try {
        co_await session->run(std::move(req));
    } catch (const std::exception& e) {
        spdlog::error("websocket: session failed: {}", e.what());
        session->abandon();
    }
}

}  // namespace moestream::server
