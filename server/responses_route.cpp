#include "server/responses_route.h"

#include <ctime>
#include <mutex>
#include <spdlog/spdlog.h>

#include "server/completion_job.h"
#include "server/responses_conversation.h"
#include "server/responses_request.h"
#include "server/responses_store.h"
#include "server/responses_stream.h"

namespace moestream::server {

namespace asio = boost::asio;

namespace {

// Agents send the same tool list every turn: a list of skipped tools is logged as a warning when
// it differs from the last one warned about, and at debug level otherwise.
void log_skipped_tools(const std::vector<std::string>& skipped) {
    if (skipped.empty()) return;
    std::string list;
    for (const auto& t : skipped) list += (list.empty() ? "" : ", ") + t;
    static std::mutex mu;
    static std::string last;
    bool fresh = false;
    {
        std::lock_guard lock(mu);
        fresh = list != last;
        if (fresh) last = list;
    }
    const auto level = fresh ? spdlog::level::warn : spdlog::level::debug;
    spdlog::log(level, "/v1/responses: {} tool(s) skipped, only function tools are served: {}", skipped.size(), list);
}

// Errors of admission a streamed response reports in its stream rather than as HTTP errors.
bool reported_in_stream(const api_error& e) { return e.type == "exceed_context_size_error" || e.status == 429; }

}  // namespace

asio::awaitable<int> serve_responses(service& s, const api_request& req, responder& out) {
    auto fail_http = [&](const api_error& e) -> asio::awaitable<int> {
        co_await out.send(error_response(e));
        co_return e.status;
    };
    parse_limits limits;
    limits.vocab = s.model().n_vocab;
    auto parsed = parse_responses_request(req.body, limits);
    if (!parsed) co_return co_await fail_http(parsed.error());
    responses_request& r = *parsed;
    log_skipped_tools(r.skipped_tools);

    std::vector<conversation_item> history;
    if (!r.echo.previous_response_id.empty()) {
        auto previous = s.responses().find(r.echo.previous_response_id);
        if (!previous)
            co_return co_await fail_http(bad_request(
                "previous_response_id",
                "previous_response_id: no stored response has the id " + json_escape(r.echo.previous_response_id) +
                    " (the server keeps the last " + std::to_string(s.responses().capacity()) +
                    " responses created with \"store\": true)"));
        history = previous->conversation;
    }
    if (auto e = check_call_ids(history, r.input)) co_return co_await fail_http(*e);
    r.generation.messages = chat_messages(r.echo.instructions, history, r.input);
    if (r.generation.messages.empty())
        co_return co_await fail_http(bad_request("input", "input: the conversation is empty"));

    const bool stream = r.generation.stream;
    response_builder builder(new_response_id("resp_"), int64_t(std::time(nullptr)),
                             r.echo.model.empty() ? s.model().name : r.echo.model, r.echo);
    std::vector<sse_event> events;
    auto flush = [&]() -> asio::awaitable<void> {
        std::string data;
        for (const auto& e : events) data += e.wire();
        events.clear();
        if (!data.empty()) co_await out.stream_write(data);
    };
    // A finished response is kept for previous_response_id when the request asked for it.
    auto keep = [&] {
        if (!r.echo.store || builder.status() == "failed") return;
        stored_response kept;
        kept.id = builder.id();
        kept.conversation = std::move(history);
        kept.conversation.insert(kept.conversation.end(), r.input.begin(), r.input.end());
        auto output = builder.output_items();
        kept.conversation.insert(kept.conversation.end(), output.begin(), output.end());
        s.responses().put(std::move(kept));
    };

    const reasoning_plan thinking = reasoning_plan_of(r);
    job_options options;
    options.open_reasoning = thinking.open;
    options.reasoning_budget = thinking.budget;
    auto started = completion_job::start(s.model(), std::move(r.generation), r.constraint, options);
    if (!started) {
        if (!stream || !reported_in_stream(started.error())) co_return co_await fail_http(started.error());
        co_await out.stream_begin("text/event-stream");
        builder.begin(&events);
        builder.fail(started.error(), &events);
        co_await flush();
        co_await out.stream_end();
        co_return 200;
    }
    auto job = std::move(*started);
    service::job_registration registered(s, job.get());
    job_driver driver(*job, *s.metrics(), s.limits().request_timeout);

    if (!stream) {
        for (;;) {
            auto u = co_await driver.next(std::chrono::milliseconds(1000));
            if (!u) continue;
            if (u->done && u->finish_reason == "error") co_return co_await fail_http(u->error);
            builder.on_update(*u, nullptr);
            if (u->done) break;
        }
        keep();
        http_response ok;
        ok.body = builder.response_json();
        co_await out.send(std::move(ok));
        co_return 200;
    }

    // The stream starts before the prompt is processed, so a long prefill never looks dead.
    co_await out.stream_begin("text/event-stream");
    builder.begin(&events);
    co_await flush();
    const auto ping = std::chrono::duration_cast<std::chrono::milliseconds>(s.limits().ping_interval);
    for (;;) {
        auto u = co_await driver.next(ping);
        if (!u) {
            if (auto alive = builder.keep_alive()) events.push_back(std::move(*alive));
            else co_await out.stream_write(": keep-alive\n\n");
            co_await flush();
            continue;
        }
        builder.on_update(*u, &events);
        co_await flush();
        if (u->done) break;
    }
    keep();
    co_await out.stream_end();
    co_return 200;
}

}  // namespace moestream::server
