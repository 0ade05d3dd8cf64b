#include "server/anthropic_route.h"

#include <chrono>
#include <optional>
#include <random>

#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/completion_job.h"
#include "server/json_writer.h"
#include "server/output_parser.h"

namespace moestream::server {

namespace asio = boost::asio;
using clock_type = std::chrono::steady_clock;

// Counts a request against its API key while it runs.
class anthropic_route::in_flight_mark {
  public:
    in_flight_mark(anthropic_route& r, std::string_view key) : r_(r), key_(key) {
        std::lock_guard lock(r_.mu_);
        ++r_.in_flight_[key_];
    }
    ~in_flight_mark() {
        std::lock_guard lock(r_.mu_);
        if (--r_.in_flight_[key_] == 0) r_.in_flight_.erase(key_);
    }
    in_flight_mark(const in_flight_mark&) = delete;
    in_flight_mark& operator=(const in_flight_mark&) = delete;

  private:
    anthropic_route& r_;
    std::string key_;
};

int64_t anthropic_route::in_flight(std::string_view api_key) const {
    std::lock_guard lock(mu_);
    const auto it = in_flight_.find(std::string(api_key));
    return it == in_flight_.end() ? 0 : it->second;
}

api_error anthropic_route::queue_full(std::string_view api_key, const api_error& refused) const {
    const auto stats = s_.model().eng->stats();
    const int64_t held = stats.running + stats.waiting;
    const int64_t mine = in_flight(api_key) - 1;  // this request is counted too, and was refused
    if (!api_key.empty() && mine > 0 && 2 * mine >= held)
        return make_api_error(
            429, "rate_limit_error",
            "this API key has " + std::to_string(mine) + " of the " + std::to_string(held) +
                " requests the server holds, and its wait queue is full: wait for some of them "
                "to finish");
    return make_api_error(529, "overloaded_error", "the server is overloaded: " + refused.message);
}

namespace {

// By value, and callers pass named values: GCC 12 mishandles temporaries across co_await.
asio::awaitable<int> send_error(responder& out, api_error e) {
    http_response r = anthropic_error_response(e);
    const int status = r.status;
    co_await out.send(std::move(r));
    co_return status;
}

parse_limits limits_of(const served_model& m) {
    parse_limits l;
    l.vocab = m.n_vocab;
    return l;
}

bool forces_call(const completion_request& r) {
    return !r.tools.empty() &&
           (r.choice.kind == tool_choice::required || r.choice.kind == tool_choice::function);
}

// "msg_" + 24 letters: distinct within a run (the job's serial) and across restarts (a salt drawn
// once per process), since clients keep message ids in their transcripts.
std::string message_id(uint64_t serial) {
    static const uint64_t salt = [] {
        std::random_device rd;
        return (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }();
    return "msg_" + tool_call_id(serial ^ salt, 0).substr(5);
}

}  // namespace

asio::awaitable<int> anthropic_route::count_tokens(const api_request& req, responder& out) {
    auto parsed = parse_anthropic_request(req.body, anthropic_body::count_tokens, limits_of(s_.model()));
    if (!parsed) co_return co_await send_error(out, parsed.error());
    // The very prompt a generation would submit, so the count is exact.
    auto ids = completion_job::render_prompt(s_.model(), parsed->completion, parsed->options);
    if (!ids) co_return co_await send_error(out, ids.error());
    std::string body;
    json_writer w(body);
    w.begin_object().member("input_tokens", int64_t(ids->size())).end_object();
    http_response r;
    r.body = std::move(body);
    co_await out.send(std::move(r));
    co_return 200;
}

asio::awaitable<int> anthropic_route::messages(const api_request& req, responder& out) {
    auto parsed = parse_anthropic_request(req.body, anthropic_body::messages, limits_of(s_.model()));
    if (!parsed) co_return co_await send_error(out, parsed.error());
    anthropic_request& ar = *parsed;
    const int64_t max_tokens = ar.completion.max_tokens;
    const bool stream = ar.completion.stream;
    const bool stream_tool_input = forces_call(ar.completion);
    const bool display_thinking = ar.display_thinking;

    in_flight_mark mark(*this, req.api_key);
    auto started = completion_job::start(s_.model(), std::move(ar.completion), {}, std::move(ar.options));
    if (!started) {
        api_error e = started.error();
        if (e.status == 429) e = queue_full(req.api_key, e);
        co_return co_await send_error(out, std::move(e));
    }
    auto job = std::move(*started);
    service::job_registration registered(s_, job.get());
    job_driver driver(*job, *s_.metrics(), s_.limits().request_timeout);

    anthropic_meta meta;
    meta.id = message_id(job->serial());
    meta.model = job->request().model.empty() ? s_.model().name : job->request().model;
    anthropic_content content(job->parser(), display_thinking, stream_tool_input);
    std::vector<block_event> events;

    if (!stream) {
        std::optional<job_update> last;
        while (!last) {
            auto u = co_await driver.next(std::chrono::milliseconds(1000));
            if (!u) continue;
            if (u->finish_reason == "error") co_return co_await send_error(out, u->error);
            content.on_update(*u, events);
            if (u->done) last = std::move(u);
        }
        content.finish(events);
        http_response r;
        r.body = anthropic_message_json(meta, content, anthropic_stop_of(*last, content, max_tokens),
                                        anthropic_usage_of(last->usage, job->request().cache_prompt));
        co_await out.send(std::move(r));
        co_return 200;
    }

    // Accepted: the stream starts now, before the prompt is processed.
    co_await out.stream_begin("text/event-stream");
    job_usage accepted;
    accepted.prompt_tokens = int64_t(job->prompt().size());
    const std::string start =
        sse_message_start(meta, anthropic_usage_of(accepted, job->request().cache_prompt));
    co_await out.stream_write(start);
    const auto ping = std::chrono::duration_cast<std::chrono::milliseconds>(s_.limits().ping_interval);
    auto last_write = clock_type::now();
    for (;;) {
        const auto quiet = clock_type::now() - last_write;
        const auto wait = std::max(std::chrono::milliseconds(1),
                                   ping - std::chrono::duration_cast<std::chrono::milliseconds>(quiet));
        auto u = co_await driver.next(wait);
        std::string data;
        bool done = false;
        if (u && u->finish_reason == "error") {
            data = sse_error(u->error);
            done = true;
        } else if (u) {
            events.clear();
            content.on_update(*u, events);
            if (u->done) content.finish(events);
            data = sse_blocks(content, events);
            if (u->done) {
                data += sse_message_end(anthropic_stop_of(*u, content, max_tokens),
                                        anthropic_usage_of(u->usage, job->request().cache_prompt));
                done = true;
            }
        }
        // Nothing to say for a ping interval (prefill, a held tool call, queueing): a ping.
        if (data.empty() && clock_type::now() - last_write >= ping) data = sse_ping();
        if (!data.empty()) {
            co_await out.stream_write(data);
            last_write = clock_type::now();
        }
        if (done) break;
    }
    co_await out.stream_end();
    co_return 200;
}

}  // namespace moestream::server
