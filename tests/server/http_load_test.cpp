// Load: 64 concurrent streaming clients (coroutines on one client thread) send a bounded number
// of chat and text completions, about 20% of them hang up at a random point. Every stream that
// is read to its end must end with [DONE], carry exactly one finish_reason and exactly as many
// tokens (counted in the chunks' logprobs) as usage.completion_tokens (= max_tokens, ignore_eos); a greedy probe gives
// the same text under load as alone; afterwards the engine holds no sequence, the server still
// serves, and the process's memory is back near where it was.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "anthropic_check.h"
#include "responses_stream_check.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

// Sanitized builds run the same shape with fewer and shorter requests.
constexpr int k_clients = 64;
constexpr int k_requests = sanitized_build() ? 96 : 320;
constexpr int k_max_tokens = sanitized_build() ? 10 : 40;
constexpr int k_probe_tokens = sanitized_build() ? 8 : 24;

struct planned_request {
    bool chat = false;
    bool probe = false;        // the greedy determinism probe
    int max_tokens = 0;
    int hang_up_after = -1;    // close after this many data events (-1: read to the end)
    uint64_t seed = 0;
};

struct stream_result {
    planned_request plan;
    int status = 0;
    bool hung_up = false;
    std::string transport_error;
    std::string content_type;
    std::vector<std::string> events;
};

const char* k_probe_prompt = "The quick brown fox jumps over the lazy dog and then";

std::string body_of(const planned_request& p) {
    // Log-probabilities list every token a chunk carries: text alone cannot be counted in tokens
    // (a chunk may hold none while a UTF-8 character is incomplete, the last one a flushed rest).
    const std::string common = R"("stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,)"
                               R"("max_tokens":)" +
                               std::to_string(p.max_tokens) + (p.chat ? R"(,"logprobs":true,)" : R"(,"logprobs":0,)");
    const std::string sampling =
        p.probe ? std::string(R"("temperature":0)") : R"("temperature":1.0,"seed":)" + std::to_string(p.seed);
    if (p.chat)
        return R"({"messages":[{"role":"user","content":"Write about the sea, number )" + std::to_string(p.seed) +
               R"("}],)" + common + sampling + "}";
    if (p.probe) return R"({"prompt":")" + std::string(k_probe_prompt) + R"(",)" + common + sampling + "}";
    return R"({"prompt":"Count the stars, round )" + std::to_string(p.seed) + R"(",)" + common + sampling + "}";
}

// Completed data events in `body` from `offset` on (each ends with a blank line).
void take_events(const std::string& body, size_t& offset, std::vector<std::string>& out) {
    for (;;) {
        const size_t end = body.find("\n\n", offset);
        if (end == std::string::npos) return;
        auto events = sse_events(std::string_view(body).substr(offset, end - offset));
        out.insert(out.end(), events.begin(), events.end());
        offset = end + 2;
    }
}

asio::awaitable<stream_result> run_stream(uint16_t port, planned_request plan) {
    stream_result r;
    r.plan = plan;
    beast::tcp_stream s(co_await asio::this_coro::executor);
    s.expires_after(sanitized_build() ? 600s : 120s);
    auto [cec] = co_await s.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), use_nothrow);
    if (cec) {
        r.transport_error = "connect: " + cec.message();
        co_return r;
    }
    http::request<http::string_body> req{http::verb::post, plan.chat ? "/v1/chat/completions" : "/v1/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body_of(plan);
    req.prepare_payload();
    auto [wec, wn] = co_await http::async_write(s, req, use_nothrow);
    (void)wn;
    if (wec) {
        r.transport_error = "write: " + wec.message();
        co_return r;
    }
    if (plan.hang_up_after == 0) {  // gone while queued or being prefilled
        r.hung_up = true;
        co_return r;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    size_t offset = 0;
    while (!parser.is_done()) {
        auto [ec, n] = co_await http::async_read_some(s, buffer, parser, use_nothrow);
        (void)n;
        if (ec) {
            r.transport_error = "read: " + ec.message();
            co_return r;
        }
        if (parser.is_header_done() && r.status == 0) {
            r.status = int(parser.get().result_int());
            r.content_type = std::string(parser.get()[http::field::content_type]);
        }
        take_events(parser.get().body(), offset, r.events);
        if (plan.hang_up_after > 0 && int(r.events.size()) >= plan.hang_up_after) {
            r.hung_up = true;
            co_return r;  // the socket closes here, mid-stream
        }
    }
    if (r.status == 0) r.status = int(parser.get().result_int());
    take_events(parser.get().body() + "\n\n", offset, r.events);
    co_return r;
}

// Runs `plans` with at most k_clients streams open at a time; returns the results in order.
std::vector<stream_result> run_load(uint16_t port, const std::vector<planned_request>& plans) {
    asio::io_context ioc;
    std::vector<stream_result> results(plans.size());
    size_t next = 0;
    int finished = 0;
    auto client = [&]() -> asio::awaitable<void> {
        while (next < plans.size()) {
            const size_t i = next++;
            results[i] = co_await run_stream(port, plans[i]);
            ++finished;
        }
    };
    for (int c = 0; c < k_clients; ++c) asio::co_spawn(ioc, client(), asio::detached);
    ioc.run_for(sanitized_build() ? 900s : 180s);
    BOOST_TEST_REQUIRE(finished == int(plans.size()), "only " << finished << " of " << plans.size()
                                                              << " requests finished in time");
    return results;
}

// The checks of one stream read to its end; returns the generated text.
std::string check_complete_stream(const stream_result& r) {
    const std::string label = std::string(r.plan.chat ? "chat" : "text") + " seed " + std::to_string(r.plan.seed);
    BOOST_TEST_REQUIRE(r.transport_error.empty(), label << ": " << r.transport_error);
    BOOST_TEST_REQUIRE(r.status == 200, label << ": status " << r.status);
    BOOST_TEST(r.content_type == "text/event-stream");
    BOOST_TEST_REQUIRE(r.events.size() >= 3u, label);
    BOOST_TEST_REQUIRE(r.events.back() == "[DONE]", label << ": last event " << r.events.back());
    int64_t tokens = 0;
    int finishes = 0;
    int64_t usage_tokens = -1;
    std::string text;
    for (size_t i = 0; i + 1 < r.events.size(); ++i) {
        json_doc d(r.events[i]);
        BOOST_TEST_REQUIRE(d.ok(), label << ": not JSON: " << r.events[i]);
        BOOST_TEST_REQUIRE(!d.has({"error"}), label << ": error event " << r.events[i]);
        if (d.has({"usage"}) && !d.is_null({"usage"})) {
            BOOST_TEST(i + 2 == r.events.size(), label << ": the usage chunk is not the last one");
            BOOST_TEST(!d.has({"choices", "0"}), label << ": the usage chunk has choices");
            usage_tokens = d.integer({"usage", "completion_tokens"});
            continue;
        }
        if (!d.is_null({"choices", "0", "finish_reason"})) {
            ++finishes;
            BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "length", label);
            continue;
        }
        tokens += r.plan.chat ? d.length({"choices", "0", "logprobs", "content"})
                              : d.length({"choices", "0", "logprobs", "tokens"});
        text += r.plan.chat ? d.str({"choices", "0", "delta", "content"}) + d.str({"choices", "0", "delta", "reasoning_content"})
                            : d.str({"choices", "0", "text"});
    }
    BOOST_TEST(finishes == 1, label);
    BOOST_TEST(usage_tokens == r.plan.max_tokens, label);
    BOOST_TEST(tokens == r.plan.max_tokens, label << ": " << tokens << " tokens in the chunks");
    return text;
}

std::vector<planned_request> make_plans(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<planned_request> plans(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        auto& p = plans[static_cast<size_t>(i)];
        p.seed = seed * 1000 + uint64_t(i);
        if (i % 8 == 3) {
            p.probe = true;
            p.max_tokens = k_probe_tokens;
            continue;
        }
        p.chat = i % 2 == 0;
        p.max_tokens = 2 + int(rng() % uint64_t(k_max_tokens - 1));
        if (rng() % 100 < 20) p.hang_up_after = int(rng() % uint64_t(p.max_tokens + 2));
    }
    return plans;
}

struct load_server {
    static live_server_options options() {
        live_server_options o;
        o.max_sequences = 8;
        o.max_waiting = 2 * k_clients;
        o.context_tokens = 256;
        o.http.ping_interval = std::chrono::seconds(1);  // queued streams take the keep-alive path too
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

}  // namespace

BOOST_AUTO_TEST_SUITE(http_load, *requires_live_server())

BOOST_FIXTURE_TEST_CASE(concurrent_streams_with_disconnects, load_server) {
    const auto t0 = std::chrono::steady_clock::now();
    // The probe alone first: its text is what every probe under load must produce.
    planned_request probe;
    probe.probe = true;
    probe.max_tokens = k_probe_tokens;
    const std::string alone = check_complete_stream(run_load(srv.port(), {probe})[0]);
    BOOST_TEST_REQUIRE(!alone.empty());

    // A warm-up round settles the allocator and the engine's pools before memory is measured.
    auto check_round = [&](const std::vector<stream_result>& results) {
        int completed = 0, hung_up = 0, probes = 0;
        for (const auto& r : results) {
            if (r.hung_up) {
                ++hung_up;
                BOOST_TEST(r.transport_error.empty(), r.transport_error);
                continue;
            }
            const std::string text = check_complete_stream(r);
            ++completed;
            if (r.plan.probe) {
                ++probes;
                BOOST_TEST(text == alone, "the greedy probe differs under load");
            }
        }
        BOOST_TEST(completed + hung_up == int(results.size()));
        BOOST_TEST(probes > 0);
        BOOST_TEST(hung_up > 0);
        BOOST_TEST_MESSAGE("load round: " << completed << " completed, " << hung_up << " hung up, " << probes
                                          << " greedy probes");
    };
    check_round(run_load(srv.port(), make_plans(k_requests / 4, 1)));
    BOOST_TEST(srv.wait_idle(10s));
    const int64_t rss_before = anonymous_resident_bytes();

    check_round(run_load(srv.port(), make_plans(k_requests, 2)));

    // Hung-up requests are cancelled: nothing runs or waits, no job is left.
    BOOST_TEST(srv.wait_idle(10s), "the engine still holds sequences after the load");
    const auto stats = srv.eng().stats();
    BOOST_TEST(stats.running == 0);
    BOOST_TEST(stats.waiting == 0);
    BOOST_TEST(srv.api().live_jobs() == 0u);
    check_still_serving(srv.port());
    const int64_t rss_after = anonymous_resident_bytes();
    BOOST_TEST_MESSAGE("anonymous resident memory " << rss_before / (1 << 20) << " MiB before the load, "
                                          << rss_after / (1 << 20) << " MiB after; "
                                          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                          << " s in all");
    // Under ASan freed memory sits in quarantine; LeakSanitizer checks for leaks there instead.
    if (!sanitized_build()) BOOST_TEST(rss_after - rss_before < int64_t(32) << 20);
}

// ---- the Anthropic Messages route: 64 concurrent streams, about 20% of them hang up at a random
// point; every stream read to its end follows the event grammar and reports its tokens.

namespace {

struct anthropic_plan {
    uint64_t seed = 0;
    int max_tokens = 0;
    int hang_up_after = -1;  // close after this many data events (-1: read to the end)
    bool tools = false;      // a forced tool call (input_json_delta) instead of text
};

asio::awaitable<stream_result> run_anthropic_stream(uint16_t port, anthropic_plan plan) {
    stream_result r;
    beast::tcp_stream s(co_await asio::this_coro::executor);
    s.expires_after(sanitized_build() ? 600s : 120s);
    auto [cec] = co_await s.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), use_nothrow);
    if (cec) {
        r.transport_error = "connect: " + cec.message();
        co_return r;
    }
    http::request<http::string_body> req{http::verb::post, "/v1/messages?beta=true", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.set("anthropic-version", "2023-06-01");
    req.body() = R"({"stream":true,"max_tokens":)" + std::to_string(plan.max_tokens) + R"(,"messages":[{"role":"user","content":"Tell the tale, part )" +
                 std::to_string(plan.seed) + R"("}])" +
                 (plan.tools ? R"(,"tools":[{"name":"save","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"})" : "") + "}";
    req.prepare_payload();
    auto [wec, wn] = co_await http::async_write(s, req, use_nothrow);
    (void)wn;
    if (wec) {
        r.transport_error = "write: " + wec.message();
        co_return r;
    }
    if (plan.hang_up_after == 0) {
        r.hung_up = true;
        co_return r;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    size_t offset = 0;
    while (!parser.is_done()) {
        auto [ec, n] = co_await http::async_read_some(s, buffer, parser, use_nothrow);
        (void)n;
        if (ec) {
            r.transport_error = "read: " + ec.message();
            co_return r;
        }
        if (parser.is_header_done() && r.status == 0) {
            r.status = int(parser.get().result_int());
            r.content_type = std::string(parser.get()[http::field::content_type]);
        }
        take_events(parser.get().body(), offset, r.events);
        if (plan.hang_up_after > 0 && int(r.events.size()) >= plan.hang_up_after) {
            r.hung_up = true;
            co_return r;
        }
    }
    take_events(parser.get().body() + "\n\n", offset, r.events);
    co_return r;
}

}  // namespace

BOOST_FIXTURE_TEST_CASE(anthropic_concurrent_streams_with_disconnects, load_server) {
    std::mt19937_64 rng(11);
    std::vector<anthropic_plan> plans(size_t(k_requests / 2));
    for (size_t i = 0; i < plans.size(); ++i) {
        auto& p = plans[i];
        p.seed = i;
        p.tools = i % 5 == 2;
        p.max_tokens = (p.tools ? 32 : 2) + int(rng() % uint64_t(k_max_tokens - 1));
        if (rng() % 100 < 20) p.hang_up_after = int(rng() % uint64_t(p.max_tokens + 4));
    }
    asio::io_context ioc;
    std::vector<stream_result> results(plans.size());
    size_t next = 0;
    int finished = 0;
    auto client = [&]() -> asio::awaitable<void> {
        while (next < plans.size()) {
            const size_t i = next++;
            results[i] = co_await run_anthropic_stream(srv.port(), plans[i]);
            ++finished;
        }
    };
    for (int c = 0; c < k_clients; ++c) asio::co_spawn(ioc, client(), asio::detached);
    ioc.run_for(sanitized_build() ? 900s : 180s);
    BOOST_TEST_REQUIRE(finished == int(plans.size()));
    int completed = 0, hung_up = 0;
    for (size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        if (r.hung_up) {
            ++hung_up;
            BOOST_TEST(r.transport_error.empty(), r.transport_error);
            continue;
        }
        const std::string label = "anthropic stream " + std::to_string(i);
        BOOST_TEST_REQUIRE(r.transport_error.empty(), label << ": " << r.transport_error);
        BOOST_TEST_REQUIRE(r.status == 200, label << ": status " << r.status);
        BOOST_TEST(r.content_type == "text/event-stream");
        const auto s = check_anthropic_stream(r.events, label);
        BOOST_TEST(s.error_type.empty(), label << ": " << s.error_type);
        if (plans[i].tools) {
            BOOST_TEST(s.stop_reason == "tool_use", label);
            BOOST_TEST(s.tool_inputs.size() == 1u, label);
        } else if (s.stop_reason == "max_tokens") {
            BOOST_TEST(s.output_tokens == plans[i].max_tokens, label);
        } else {
            BOOST_TEST(s.stop_reason == "end_turn", label << ": " << s.stop_reason);
        }
        ++completed;
    }
    BOOST_TEST(hung_up > 0);
    BOOST_TEST_MESSAGE("anthropic load: " << completed << " completed, " << hung_up << " hung up");
    BOOST_TEST(srv.wait_idle(10s), "the engine still holds sequences after the load");
    BOOST_TEST(srv.api().live_jobs() == 0u);
    check_still_serving(srv.port());
}

// ---- the Responses route: 64 concurrent streams (some forcing a tool call), about 20% of them
// hang up at a random point; every stream read to its end passes the SDK-level event checks.

namespace {

struct responses_plan {
    int max_tokens = 0;
    int hang_up_after = -1;  // close after this many events (-1: read to the end)
    bool tool = false;       // tool_choice "required": one function_call item
    uint64_t seed = 0;
};

struct responses_result {
    int status = 0;
    bool hung_up = false;
    std::string transport_error, content_type, body;
};

asio::awaitable<responses_result> run_responses_stream(uint16_t port, responses_plan plan) {
    responses_result r;
    beast::tcp_stream s(co_await asio::this_coro::executor);
    s.expires_after(sanitized_build() ? 600s : 120s);
    auto [cec] = co_await s.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), use_nothrow);
    if (cec) {
        r.transport_error = "connect: " + cec.message();
        co_return r;
    }
    http::request<http::string_body> req{http::verb::post, "/v1/responses", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = R"({"stream":true,"max_output_tokens":)" + std::to_string(plan.max_tokens) +
                 R"(,"input":"Sing of the sea, verse )" + std::to_string(plan.seed) + "\"" +
                 (plan.tool ? R"(,"tools":[{"type":"function","name":"save","parameters":{"type":"object"}}],"tool_choice":"required")"
                            : "") +
                 "}";
    req.prepare_payload();
    auto [wec, wn] = co_await http::async_write(s, req, use_nothrow);
    (void)wn;
    if (wec) {
        r.transport_error = "write: " + wec.message();
        co_return r;
    }
    if (plan.hang_up_after == 0) {
        r.hung_up = true;
        co_return r;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    while (!parser.is_done()) {
        auto [ec, n] = co_await http::async_read_some(s, buffer, parser, use_nothrow);
        (void)n;
        if (ec) {
            r.transport_error = "read: " + ec.message();
            co_return r;
        }
        if (parser.is_header_done() && r.status == 0) {
            r.status = int(parser.get().result_int());
            r.content_type = std::string(parser.get()[http::field::content_type]);
        }
        if (plan.hang_up_after > 0 && int(sse_frames(parser.get().body()).size()) >= plan.hang_up_after) {
            r.hung_up = true;
            co_return r;
        }
    }
    if (r.status == 0) r.status = int(parser.get().result_int());
    r.body = parser.get().body();
    co_return r;
}

}  // namespace

BOOST_FIXTURE_TEST_CASE(responses_concurrent_streams_with_disconnects, load_server) {
    std::mt19937_64 rng(17);
    std::vector<responses_plan> plans(size_t(k_requests / 2));
    for (size_t i = 0; i < plans.size(); ++i) {
        auto& p = plans[i];
        p.seed = i;
        p.tool = i % 5 == 1;
        p.max_tokens = (p.tool ? 40 : 2) + int(rng() % uint64_t(k_max_tokens - 1));
        if (rng() % 100 < 20) p.hang_up_after = int(rng() % uint64_t(p.max_tokens + 6));
    }
    asio::io_context ioc;
    std::vector<responses_result> results(plans.size());
    size_t next = 0;
    int finished = 0;
    auto client = [&]() -> asio::awaitable<void> {
        while (next < plans.size()) {
            const size_t i = next++;
            results[i] = co_await run_responses_stream(srv.port(), plans[i]);
            ++finished;
        }
    };
    for (int c = 0; c < k_clients; ++c) asio::co_spawn(ioc, client(), asio::detached);
    ioc.run_for(sanitized_build() ? 900s : 180s);
    BOOST_TEST_REQUIRE(finished == int(plans.size()));
    int completed = 0, hung_up = 0;
    for (size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        if (r.hung_up) {
            ++hung_up;
            BOOST_TEST(r.transport_error.empty(), r.transport_error);
            continue;
        }
        const std::string label = "responses stream " + std::to_string(i);
        BOOST_TEST_REQUIRE(r.transport_error.empty(), label << ": " << r.transport_error);
        BOOST_TEST_REQUIRE(r.status == 200, label << ": status " << r.status);
        BOOST_TEST(r.content_type == "text/event-stream");
        const auto s = check_response_stream(sse_frames(r.body), label);
        BOOST_TEST(s.ok, label);
        if (plans[i].tool) {
            BOOST_TEST(s.status == "completed", label << ": " << s.status);
            BOOST_TEST(s.calls.size() == 1u, label);
        } else if (s.status == "incomplete") {
            BOOST_TEST(s.output_tokens == plans[i].max_tokens, label);
        } else {
            BOOST_TEST(s.status == "completed", label << ": " << s.status);
            BOOST_TEST(s.output_tokens <= plans[i].max_tokens, label);
        }
        ++completed;
    }
    BOOST_TEST(hung_up > 0);
    BOOST_TEST_MESSAGE("responses load: " << completed << " completed, " << hung_up << " hung up");
    BOOST_TEST(srv.wait_idle(10s), "the engine still holds sequences after the load");
    BOOST_TEST(srv.api().live_jobs() == 0u);
    check_still_serving(srv.port());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
