// The Anthropic Messages route over real sockets on the forged tiny model: the message object and
// an exact count_tokens, HEAD /, the router's and the transport's errors in Anthropic's shape,
// message_start and pings while a request waits for a sequence, an error event after the stream
// started, the prefix cache's usage across turns, a thinking budget, and a client that hangs up.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "anthropic_check.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* k_key = "anthropic-test-key";

struct open_server {
    static live_server_options options() {
        live_server_options o;
        o.context_tokens = 1024;
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

// One sequence, a one-second ping, a four-second request limit: a second request waits, and a
// long one runs into the limit.
struct one_sequence_server {
    static live_server_options options() {
        live_server_options o;
        o.context_tokens = 8192;
        o.max_sequences = 1;
        o.http.ping_interval = std::chrono::seconds(1);
        o.http.request_timeout = std::chrono::seconds(4);
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

struct protected_server {
    static live_server_options options() {
        live_server_options o;
        o.http.api_keys = {k_key};
        o.http.body_bytes_max = 64u << 10;
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

std::string messages_body(std::string_view content, int max_tokens = 8, std::string_view extra = {}) {
    return R"({"model":"claude-test","max_tokens":)" + std::to_string(max_tokens) +
           R"(,"messages":[{"role":"user","content":")" + std::string(content) + "\"}]" +
           (extra.empty() ? std::string() : "," + std::string(extra)) + "}";
}

// A streamed request sent as HTTP/1.0: the body is the raw SSE, delimited by the close.
std::string raw_post_1_0(std::string_view target, const std::string& body) {
    return "POST " + std::string(target) +
           " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

int64_t usage_total(const json_doc& d) {
    return d.integer({"usage", "input_tokens"}) + d.integer({"usage", "cache_creation_input_tokens"}) +
           d.integer({"usage", "cache_read_input_tokens"});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(anthropic_http, *requires_live_server())

BOOST_FIXTURE_TEST_CASE(message_and_exact_count, open_server) {
    http_client c(srv.port());
    const auto r = c.post("/v1/messages?beta=true", messages_body("Hello"),
                          {{"anthropic-version", "2023-06-01"}, {"anthropic-beta", "claude-code-20250219"}});
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"id"}).starts_with("msg_"));
    BOOST_TEST(d.str({"type"}) == "message");
    BOOST_TEST(d.str({"role"}) == "assistant");
    BOOST_TEST(d.str({"model"}) == "claude-test");
    BOOST_TEST(d.str({"content", "0", "type"}) == "text");
    BOOST_TEST(d.str({"stop_reason"}) == "max_tokens");
    BOOST_TEST(d.is_null({"stop_sequence"}));
    BOOST_TEST(d.integer({"usage", "output_tokens"}) == 8);
    const auto count =
        c.post("/v1/messages/count_tokens", R"({"messages":[{"role":"user","content":"Hello"}]})");
    BOOST_TEST_REQUIRE(count.status == 200, count.body);
    BOOST_TEST(json_doc(count.body).integer({"input_tokens"}) == usage_total(d),
               count.body << " vs " << r.body);
    // Ids differ between requests.
    BOOST_TEST(json_doc(c.post("/v1/messages", messages_body("Hello")).body).str({"id"}) != d.str({"id"}));
}

BOOST_FIXTURE_TEST_CASE(head_and_routing_errors, open_server) {
    http_client c(srv.port());
    const auto head = c.request("HEAD", "/");
    BOOST_TEST(head.status == 200);
    BOOST_TEST(c.get("/health").status == 200);  // the connection goes on after HEAD
    check_anthropic_error(c.get("/v1/messages"), 405, "invalid_request_error");
    check_anthropic_error(c.post("/v1/messages/batches", "{}"), 404, "not_found_error");
    check_anthropic_error(
        c.post("/v1/messages", R"({"max_tokens":8,"messages":[{"role":"user","content":"x"})"), 400,
        "invalid_request_error");
    // The other routes keep OpenAI's shape.
    check_api_error(c.post("/v1/nothing", "{}"), 404, "not_found_error");
}

BOOST_FIXTURE_TEST_CASE(context_overflow_wording, open_server) {
    http_client c(srv.port());
    std::string words;
    for (int i = 0; i < 1500; ++i) words += "word ";
    const auto r = c.post("/v1/messages", messages_body(words));
    check_anthropic_error(r, 400, "invalid_request_error");
    const std::string message = json_doc(r.body).str({"error", "message"});
    BOOST_TEST(message.starts_with("prompt is too long: "), message);
    BOOST_TEST(message.ends_with(" tokens > 1023 maximum"), message);
}

BOOST_FIXTURE_TEST_CASE(transport_errors_in_anthropic_shape, protected_server) {
    http_client c(srv.port());
    check_anthropic_error(c.post("/v1/messages", messages_body("Hi")), 401, "authentication_error");
    check_anthropic_error(c.post("/v1/messages", messages_body("Hi"), {{"x-api-key", "wrong"}}), 401,
                          "authentication_error");
    check_api_error(c.post("/v1/completions", R"({"prompt":"x"})"), 401, "authentication_error");
    BOOST_TEST(c.post("/v1/messages", messages_body("Hi"), {{"x-api-key", k_key}}).status == 200);
    BOOST_TEST(
        c.post("/v1/messages", messages_body("Hi"), {{"Authorization", std::string("Bearer ") + k_key}})
            .status == 200);
    http_client big(srv.port());
    check_anthropic_error(
        big.post("/v1/messages", messages_body(std::string(100u << 10, 'x')), {{"x-api-key", k_key}}), 413,
        "request_too_large");
}

BOOST_FIXTURE_TEST_CASE(message_start_and_pings_while_waiting, one_sequence_server) {
    // The only sequence is busy with a long stream...
    auto blocker = std::make_unique<raw_connection>(srv.port());
    BOOST_TEST_REQUIRE(
        blocker->send(raw_post_1_0("/v1/messages", messages_body("Go on", 6000, R"("stream":true)"))));
    BOOST_TEST_REQUIRE(blocker->read_until("content_block_delta", 60s).find("content_block_delta") !=
                       std::string::npos);
    // ...so this one waits: it is accepted at once (message_start), and pinged while it waits.
    raw_connection waiting(srv.port());
    BOOST_TEST_REQUIRE(
        waiting.send(raw_post_1_0("/v1/messages", messages_body("Hi", 3, R"("stream":true)"))));
    std::string got = waiting.read_until("event: message_start", 10s);
    BOOST_TEST_REQUIRE(got.find("HTTP/1.0 200") == 0, got);
    got += waiting.read_until("event: ping", 30s);
    BOOST_TEST_REQUIRE(got.find("event: ping") != std::string::npos, got);
    BOOST_TEST(got.find("content_block") == std::string::npos, "content before the blocker ended: " << got);
    // The blocker's client leaves; the waiting request gets the sequence and completes.
    blocker.reset();
    const auto rest = waiting.read_until_close(30s);
    BOOST_TEST(rest.closed);
    const auto ws = check_anthropic_stream(sse_events(got + rest.bytes), "waiting");
    BOOST_TEST(ws.pings >= 1);
    BOOST_TEST(ws.error_type.empty(), ws.error_type);
    BOOST_TEST(ws.stop_reason == "max_tokens");
    BOOST_TEST(ws.output_tokens == 3);
    BOOST_TEST(srv.wait_idle(10s));
}

BOOST_FIXTURE_TEST_CASE(error_event_after_the_stream_started, one_sequence_server) {
    // Longer than the request limit: the stream started, so the timeout is an error event.
    raw_connection conn(srv.port());
    BOOST_TEST_REQUIRE(
        conn.send(raw_post_1_0("/v1/messages", messages_body("Go on", 6000, R"("stream":true,"temperature":0)"))));
    const auto got = conn.read_until_close(60s);
    BOOST_TEST_REQUIRE(got.bytes.find("HTTP/1.0 200") == 0, got.bytes.substr(0, 300));
    const auto s = check_anthropic_stream(sse_events(got.bytes), "timed out");
    BOOST_TEST(s.error_type == "timeout_error");
    BOOST_TEST(s.stop_reason.empty());
    BOOST_TEST(!s.text.empty());
    BOOST_TEST_MESSAGE("timed out after " << s.text.size() << " bytes of text");
}

BOOST_FIXTURE_TEST_CASE(prefix_cache_usage_across_turns, open_server) {
    http_client c(srv.port());
    std::string sys;
    for (int i = 0; i < 60; ++i) sys += "Review the code carefully. ";
    auto body = [&](std::string_view billing, std::string_view messages) {
        return R"({"max_tokens":4,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.1; cch=)" +
               std::string(billing) + R"(;"},{"type":"text","text":")" + sys +
               R"(","cache_control":{"type":"ephemeral"}}],"messages":)" + std::string(messages) + "}";
    };
    const auto first = c.post("/v1/messages", body("aaaaa", R"([{"role":"user","content":"First"}])"));
    BOOST_TEST_REQUIRE(first.status == 200, first.body);
    json_doc f(first.body);
    BOOST_TEST(f.integer({"usage", "cache_read_input_tokens"}) == 0);
    BOOST_TEST(f.integer({"usage", "cache_creation_input_tokens"}) == usage_total(f));
    const auto second =
        c.post("/v1/messages",
               body("bbbbb", R"([{"role":"user","content":"First"},{"role":"assistant","content":"Sure."},)"
                             R"({"role":"user","content":"Second"}])"));
    BOOST_TEST_REQUIRE(second.status == 200, second.body);
    json_doc s(second.body);
    // The billing header's new value is dropped: the whole first prompt is read back.
    BOOST_TEST(s.integer({"usage", "cache_read_input_tokens"}) >= usage_total(f) - 1, second.body);
    BOOST_TEST(s.integer({"usage", "input_tokens"}) == 0);
    BOOST_TEST(usage_total(s) - s.integer({"usage", "cache_read_input_tokens"}) ==
               s.integer({"usage", "cache_creation_input_tokens"}));
}

BOOST_FIXTURE_TEST_CASE(thinking_budget_and_blocks, open_server) {
    http_client c(srv.port());
    const auto r = c.post("/v1/messages",
                          messages_body("Think", 40, R"("thinking":{"type":"enabled","budget_tokens":6})"));
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"content", "0", "type"}) == "thinking", r.body);
    BOOST_TEST(!d.str({"content", "0", "thinking"}).empty(), r.body);
    BOOST_TEST(d.has({"content", "0", "signature"}));
    // The reasoning closed within six tokens, so text follows it when the reply ran to 40.
    if (d.str({"stop_reason"}) == "max_tokens") BOOST_TEST(d.str({"content", "1", "type"}) == "text", r.body);
    // The same prompt counts the same, "<think>" included.
    const auto count = c.post(
        "/v1/messages/count_tokens",
        R"({"messages":[{"role":"user","content":"Think"}],"thinking":{"type":"enabled","budget_tokens":6}})");
    BOOST_TEST(json_doc(count.body).integer({"input_tokens"}) == usage_total(d));
}

// Thinking with a strict tool under tool_choice auto (what Claude Code sends, with strict tools):
// the reasoning keeps its budget, and a call after it would follow the schema.
BOOST_FIXTURE_TEST_CASE(thinking_with_strict_tools, open_server) {
    http_client c(srv.port());
    const auto r = c.post(
        "/v1/messages",
        messages_body("Weather?", 40,
                      R"("thinking":{"type":"enabled","budget_tokens":6},"tools":[{"name":"get_weather","strict":true,)"
                      R"("input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])"));
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"content", "0", "type"}) == "thinking", r.body);
    // The reasoning closed within six tokens, so more follows it when the reply ran to 40.
    if (d.str({"stop_reason"}) == "max_tokens") BOOST_TEST(d.length({"content"}) >= 2, r.body);
    for (int64_t i = 1; i < d.length({"content"}); ++i)
        if (d.str({"content", std::to_string(i), "type"}) == "tool_use")
            BOOST_TEST(d.has({"content", std::to_string(i), "input", "city"}), r.body);
}

// A schema error names the field of this route, tools[i].input_schema, in the message.
BOOST_FIXTURE_TEST_CASE(schema_errors_name_the_input_schema, open_server) {
    http_client c(srv.port());
    auto message_of = [](const http_reply& r) { return json_doc(r.body).str({"error", "message"}); };
    // A forced call compiles a non-strict schema leniently, but a schema that is not one is refused.
    const auto forced = c.post(
        "/v1/messages",
        messages_body("Weather?", 40,
                      R"("tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"thing"}}}}],)"
                      R"("tool_choice":{"type":"any"})"));
    check_anthropic_error(forced, 400, "invalid_request_error");
    BOOST_TEST(message_of(forced).starts_with("tools[0].input_schema.properties.city.type: "), forced.body);
    // A strict tool under auto, the second one: the keyword it cannot enforce.
    const auto strict = c.post(
        "/v1/messages",
        messages_body("Weather?", 40,
                      R"("tools":[{"name":"a","input_schema":{"type":"object"}},{"name":"w","strict":true,)"
                      R"("input_schema":{"type":"object","properties":{"city":{"type":"string","pattern":"^[A-Z]"}}}}])"));
    check_anthropic_error(strict, 400, "invalid_request_error");
    BOOST_TEST(message_of(strict).starts_with("tools[1].input_schema.properties.city.pattern: "), strict.body);
}

BOOST_FIXTURE_TEST_CASE(forced_tool_stream, open_server) {
    raw_connection conn(srv.port());
    const std::string body =
        R"({"max_tokens":60,"stream":true,"messages":[{"role":"user","content":"Weather?"}],
        "tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
        "tool_choice":{"type":"tool","name":"get_weather"}})";
    BOOST_TEST_REQUIRE(conn.send(raw_post_1_0("/v1/messages", body)));
    const auto got = conn.read_until_close(60s);
    const auto s = check_anthropic_stream(sse_events(got.bytes), "forced tool");
    BOOST_TEST(s.stop_reason == "tool_use");
    BOOST_TEST(s.tool_inputs.size() == 1u);
    BOOST_TEST(s.text.empty());
}

BOOST_FIXTURE_TEST_CASE(hang_up_cancels, open_server) {
    {
        raw_connection conn(srv.port());
        BOOST_TEST_REQUIRE(
            conn.send(raw_post_1_0("/v1/messages", messages_body("Go", 900, R"("stream":true)"))));
        BOOST_TEST(conn.read_until("content_block_delta", 60s).find("content_block_delta") !=
                   std::string::npos);
    }  // closed mid-stream
    BOOST_TEST(srv.wait_idle(10s), "the generation still runs after its client left");
    check_still_serving(srv.port());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
