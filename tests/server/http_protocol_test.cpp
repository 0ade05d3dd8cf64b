// The HTTP protocol over real sockets: authentication and CORS, routing errors, context limits,
// Expect: 100-continue, keep-alive after a stream, HTTP/1.0 streaming, the shape of a streamed
// chat completion, disconnects and graceful shutdown.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "server_fixture.h"

namespace moestream::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* k_key = "test-key-0123";
constexpr const char* k_origin = "http://app.test";

struct protected_server {
    static live_server_options options() {
        live_server_options o;
        o.http.api_keys = {k_key, "second-key"};
        o.http.cors_origins = {k_origin};
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

struct open_server {
    static live_server_options options() {
        live_server_options o;
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
};

const std::string k_short_completion = R"({"prompt":"Hello","max_tokens":3,"temperature":0})";

std::string token_list(int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) {
        if (i) s += ',';
        s += std::to_string(1000 + i);
    }
    return s + "]";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(http_protocol, *requires_live_server())

BOOST_FIXTURE_TEST_CASE(api_key, protected_server) {
    http_client c(srv.port());
    check_api_error(c.post("/v1/completions", k_short_completion), 401, "authentication_error");
    check_api_error(c.post("/v1/completions", k_short_completion, {{"Authorization", "Bearer wrong"}}), 401,
                    "authentication_error");
    check_api_error(c.get("/props", {{"X-Api-Key", std::string(k_key) + "x"}}), 401, "authentication_error");
    // The keep-alive connection survives a 401.
    auto ok = c.post("/v1/completions", k_short_completion, {{"Authorization", std::string("Bearer ") + k_key}});
    BOOST_TEST(ok.status == 200, ok.body);
    BOOST_TEST(c.get("/v1/models", {{"X-Api-Key", "second-key"}}).status == 200);
    // /health stays public.
    auto h = c.get("/health");
    BOOST_TEST(h.status == 200);
    BOOST_TEST(json_doc(h.body).str({"status"}) == "ok");
}

BOOST_FIXTURE_TEST_CASE(cors_preflight_before_auth, protected_server) {
    http_client c(srv.port());
    auto pre = c.request("OPTIONS", "/v1/chat/completions", {},
                         {{"Origin", k_origin},
                          {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "authorization,content-type"}});
    BOOST_TEST(pre.status == 204);
    BOOST_TEST(pre.header("Access-Control-Allow-Origin") == k_origin);
    BOOST_TEST(pre.header("Access-Control-Allow-Methods").find("POST") != std::string::npos);
    BOOST_TEST(pre.header("Access-Control-Allow-Headers") == "authorization,content-type");
    // Another origin gets no permission.
    auto other = c.request("OPTIONS", "/v1/chat/completions", {},
                           {{"Origin", "http://evil.test"}, {"Access-Control-Request-Method", "POST"}});
    BOOST_TEST(other.status == 204);
    BOOST_TEST(other.header("Access-Control-Allow-Origin").empty());
    // The actual requests carry the origin, also the refused ones (the page can read the 401).
    auto refused = c.post("/v1/completions", k_short_completion, {{"Origin", k_origin}});
    check_api_error(refused, 401, "authentication_error");
    BOOST_TEST(refused.header("Access-Control-Allow-Origin") == k_origin);
    auto ok = c.post("/v1/completions", k_short_completion,
                     {{"Origin", k_origin}, {"Authorization", std::string("Bearer ") + k_key}});
    BOOST_TEST(ok.status == 200);
    BOOST_TEST(ok.header("Access-Control-Allow-Origin") == k_origin);
}

BOOST_FIXTURE_TEST_CASE(unknown_route_and_wrong_method, open_server) {
    http_client c(srv.port());
    check_api_error(c.get("/v1/nothing-here"), 404, "not_found_error");
    check_api_error(c.post("/v2/chat/completions", "{}"), 404, "not_found_error");
    auto get_chat = c.get("/v1/chat/completions");
    check_api_error(get_chat, 405, "invalid_request_error");
    BOOST_TEST(get_chat.header("Allow") == "POST");
    auto post_health = c.post("/health", "{}");
    check_api_error(post_health, 405, "invalid_request_error");
    BOOST_TEST(post_health.header("Allow") == "GET");
    check_api_error(c.request("DELETE", "/v1/models"), 405, "invalid_request_error");
    check_still_serving(srv.port());
}

BOOST_FIXTURE_TEST_CASE(context_overflow, open_server) {
    const int64_t n_ctx = srv.model().n_ctx;
    http_client c(srv.port());
    for (const bool stream : {false, true}) {
        // The first error of a stream is a plain HTTP error, never a 200 stream.
        const std::string body = std::string(R"({"prompt":)") + token_list(int(n_ctx) + 44) +
                                 R"(,"max_tokens":4,"stream":)" + (stream ? "true" : "false") + "}";
        auto r = c.post("/v1/completions", body);
        check_api_error(r, 400, "exceed_context_size_error");
        json_doc d(r.body);
        BOOST_TEST(d.str({"error", "message"}).find("maximum context length") != std::string::npos, r.body);
        BOOST_TEST(d.integer({"error", "n_ctx"}) == n_ctx);
        BOOST_TEST(d.integer({"error", "n_prompt_tokens"}) == n_ctx + 44);
    }
    std::string long_text;
    for (int i = 0; i < 200; ++i) long_text += "overflowing words ";
    auto chat = c.post("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":")" + long_text + R"("}],"stream":true})");
    check_api_error(chat, 400, "exceed_context_size_error");
    // Prompt + max_tokens beyond the context is a cap, not an error: generation stops when full.
    auto capped = c.post("/v1/completions", std::string(R"({"prompt":)") + token_list(int(n_ctx) - 6) +
                                                R"(,"max_tokens":100,"ignore_eos":true,"temperature":0})");
    BOOST_TEST_REQUIRE(capped.status == 200, capped.body);
    json_doc d(capped.body);
    BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "length");
    BOOST_TEST(d.integer({"usage", "completion_tokens"}) == 6);
    BOOST_TEST(d.integer({"usage", "prompt_tokens"}) == n_ctx - 6);
}

BOOST_FIXTURE_TEST_CASE(expect_100_continue, open_server) {
    raw_connection c(srv.port());
    const std::string body = k_short_completion;
    c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n");
    const std::string interim = c.read_until("\r\n\r\n", 10s);
    BOOST_TEST(status_of_raw(interim) == 100, interim);
    BOOST_TEST_REQUIRE(c.send(body));
    auto got = c.read_until_close(30s);
    BOOST_TEST(got.closed);
    BOOST_TEST(status_of_raw(got.bytes) == 200, got.bytes);
    json_doc d(body_of_raw(got.bytes));
    BOOST_TEST(d.str({"object"}) == "text_completion", got.bytes);
}

BOOST_FIXTURE_TEST_CASE(keep_alive_after_stream, open_server) {
    http_client c(srv.port());
    auto streamed = c.post("/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"stream":true})");
    BOOST_TEST_REQUIRE(streamed.status == 200, streamed.body);
    BOOST_TEST(streamed.chunked);
    BOOST_TEST(streamed.keep_alive);
    BOOST_TEST(streamed.header("Content-Type") == "text/event-stream");
    BOOST_TEST(streamed.header("Cache-Control") == "no-cache");
    auto events = sse_events(streamed.body);
    BOOST_TEST_REQUIRE(!events.empty());
    BOOST_TEST(events.back() == "[DONE]");
    // The same connection serves the next requests (the chunked terminator was written).
    auto again = c.post("/v1/completions", k_short_completion);
    BOOST_TEST(again.status == 200, again.body);
    auto streamed_again =
        c.post("/v1/completions", R"({"prompt":"Hi","max_tokens":4,"stream":true,"temperature":0})");
    BOOST_TEST(sse_events(streamed_again.body).back() == "[DONE]");
    BOOST_TEST(c.get("/health").status == 200);
}

BOOST_FIXTURE_TEST_CASE(http_1_0_stream, open_server) {
    // HTTP/1.0 has no chunked encoding: the stream is delimited by the server closing.
    http_client c(srv.port());
    auto r = c.request("POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":6,"stream":true,"temperature":0})",
                       {}, 10);
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    BOOST_TEST(r.version == 10u);
    BOOST_TEST(!r.chunked);
    BOOST_TEST(r.header("Transfer-Encoding").empty());
    BOOST_TEST(r.ended_by_close);
    auto events = sse_events(r.body);
    BOOST_TEST_REQUIRE(events.size() >= 2u);
    BOOST_TEST(events.back() == "[DONE]");
    BOOST_TEST(c.closed_by_server(5s));
    // A plain HTTP/1.0 request: a Content-Length body, then closed too.
    http_client c2(srv.port());
    auto plain = c2.request("POST", "/v1/completions", k_short_completion, {}, 10);
    BOOST_TEST(plain.status == 200);
    BOOST_TEST(!plain.keep_alive);
    BOOST_TEST(c2.closed_by_server(5s));
}

BOOST_FIXTURE_TEST_CASE(streamed_chat_shape, open_server) {
    http_client c(srv.port());
    auto r = c.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"Tell me"}],"max_tokens":12,"ignore_eos":true,)"
                    R"("stream":true,"stream_options":{"include_usage":true},"seed":7})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    auto events = sse_events(r.body);
    BOOST_TEST_REQUIRE(events.size() >= 3u);
    BOOST_TEST(events.back() == "[DONE]");
    int token_chunks = 0, finishes = 0;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        json_doc d(events[i]);
        BOOST_TEST_REQUIRE(d.ok(), events[i]);
        BOOST_TEST(d.str({"object"}) == "chat.completion.chunk");
        BOOST_TEST(d.str({"id"}).starts_with("chatcmpl-"));
        if (i == 0) BOOST_TEST(d.str({"choices", "0", "delta", "role"}) == "assistant", events[i]);
        if (i + 2 == events.size()) {
            // The usage chunk: choices [] and usage.
            BOOST_TEST(d.has({"choices"}));
            BOOST_TEST(!d.has({"choices", "0"}));
            BOOST_TEST(d.integer({"usage", "completion_tokens"}) == 12);
            BOOST_TEST(d.integer({"usage", "prompt_tokens"}) > 0);
            continue;
        }
        if (!d.is_null({"choices", "0", "finish_reason"})) {
            ++finishes;
            BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "length");
        } else {
            ++token_chunks;
        }
    }
    BOOST_TEST(finishes == 1);
    BOOST_TEST(token_chunks == 12);
}

BOOST_FIXTURE_TEST_CASE(disconnect_cancels_generation, open_server) {
    // A stream the client abandons after its first token: the sequence is freed at once, not
    // when its 200 tokens would have been generated.
    {
        raw_connection c(srv.port());
        const std::string body = R"({"prompt":"Go","max_tokens":200,"ignore_eos":true,"stream":true})";
        c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body);
        const std::string first = c.read_until("\"text\"", 30s);
        BOOST_TEST_REQUIRE(status_of_raw(first) == 200, first);
    }
    BOOST_TEST(srv.wait_idle(5s));
    const auto stats = srv.eng().stats();
    BOOST_TEST(stats.generated_tokens < 200u);
    // Also while waiting for the answer of a non-streamed request.
    {
        raw_connection c(srv.port());
        const std::string body = R"({"prompt":"Go","max_tokens":200,"ignore_eos":true})";
        c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body);
        std::this_thread::sleep_for(50ms);
    }
    BOOST_TEST(srv.wait_idle(5s));
    BOOST_TEST(srv.eng().stats().generated_tokens < 400u);
    check_still_serving(srv.port());
}

BOOST_AUTO_TEST_CASE(shutdown_ends_streams) {
    live_server_options o;
    o.context_tokens = 4096;
    o.http.drain = std::chrono::seconds(1);
    live_server srv(o);
    raw_connection c(srv.port());
    const std::string body = R"({"prompt":"Go","max_tokens":4000,"ignore_eos":true,"stream":true})";
    c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body);
    BOOST_TEST_REQUIRE(status_of_raw(c.read_until("\"text\"", 30s)) == 200);
    const auto t0 = std::chrono::steady_clock::now();
    auto stopping = std::async(std::launch::async, [&] { srv.stop(); });
    auto rest = c.read_until_close(20s);
    BOOST_TEST((stopping.wait_for(20s) == std::future_status::ready), "stop() did not return");
    BOOST_TEST(seconds_since(t0) < 8.0);
    BOOST_TEST(rest.closed);
    // Cancelled after the drain period: an error event ends the stream, without [DONE].
    BOOST_TEST(rest.bytes.find("\"error\"") != std::string::npos, rest.bytes.substr(rest.bytes.size() > 400 ? rest.bytes.size() - 400 : 0));
    BOOST_TEST(rest.bytes.find("[DONE]") == std::string::npos);
    BOOST_TEST(rest.bytes.find("0\r\n\r\n") != std::string::npos, "the chunked stream was not terminated");
}

// During the drain the server still accepts connections: /health and new requests answer 503
// (what a load balancer watches), a kept-alive connection's next request too, closing it, and
// the running stream goes on; once it ends the server stops.
BOOST_AUTO_TEST_CASE(the_drain_answers_503) {
    live_server_options o;
    o.context_tokens = 4096;
    o.http.drain = std::chrono::seconds(60);  // the stream's end (its client leaving) ends it
    live_server srv(o);
    http_client kept(srv.port());
    BOOST_TEST_REQUIRE(kept.get("/health").status == 200);
    auto stream = std::make_unique<raw_connection>(srv.port());
    const std::string body = R"({"prompt":"Go","max_tokens":4000,"ignore_eos":true,"stream":true})";
    stream->send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Content-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body);
    BOOST_TEST_REQUIRE(status_of_raw(stream->read_until("\"text\"", 30s)) == 200);
    auto stopping = std::async(std::launch::async, [&] { srv.stop(); });
    for (int i = 0; i < 500 && !srv.api().draining(); ++i) std::this_thread::sleep_for(10ms);
    BOOST_TEST_REQUIRE(srv.api().draining());

    http_client fresh(srv.port());
    const auto health = fresh.get("/health");
    check_api_error(health, 503, "unavailable_error");
    BOOST_TEST(health.header("Retry-After") == "1");
    BOOST_TEST(!health.keep_alive, "a drain answer keeps its connection");
    http_client fresh2(srv.port());
    check_api_error(fresh2.post("/v1/completions", k_short_completion), 503, "unavailable_error");
    const auto again = kept.get("/health");
    check_api_error(again, 503, "unavailable_error");
    BOOST_TEST(kept.closed_by_server(5s));
    // The stream still runs.
    BOOST_TEST(stream->read_until("\"text\"", 10s).find("\"text\"") != std::string::npos);
    BOOST_TEST((stopping.wait_for(0ms) == std::future_status::timeout), "stop() returned while a stream ran");
    stream.reset();  // its client leaves: the generation ends, and with it the drain
    BOOST_TEST((stopping.wait_for(20s) == std::future_status::ready), "stop() did not return");
    // Stopped: nothing listens any more.
    bool refused = false;
    try {
        http_client late(srv.port(), 2s);
        refused = late.get("/health").status == 0;
    } catch (const std::exception&) {
        refused = true;
    }
    BOOST_TEST(refused);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
