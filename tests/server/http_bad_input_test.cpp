// Bad input over real sockets: every case gets its exact status and an OpenAI-shaped error body,
// and afterwards a normal request on a new connection still succeeds.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "anthropic_check.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

using namespace std::chrono_literals;

constexpr size_t k_body_limit = 1u << 20;

struct bad_input_server {
    static live_server_options options() {
        live_server_options o;
        o.http.header_timeout = std::chrono::seconds(2);
        o.http.idle_timeout = std::chrono::seconds(4);
        o.http.body_bytes_max = k_body_limit;
        o.http.drain = std::chrono::seconds(1);
        return o;
    }
    live_server srv{options()};
    uint16_t port() const { return srv.port(); }

    // POSTs `body` on a new connection, expects the error, then a normal request to succeed.
    void expect_rejected(std::string_view target, std::string body, int status, std::string_view type,
                         std::string_view param = {}) {
        {
            http_client c(port());
            check_api_error(c.post(target, std::move(body)), status, type, param);
        }
        check_still_serving(port());
    }
};

std::string request_head(std::string_view target, size_t content_length, std::string_view extra = {}) {
    return "POST " + std::string(target) + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
           std::string(extra) + "Content-Length: " + std::to_string(content_length) + "\r\n\r\n";
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(http_bad_input, bad_input_server, *requires_live_server())

BOOST_AUTO_TEST_CASE(malformed_json) {
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 3,)", 400, "invalid_request_error");
    expect_rejected("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"})", 400,
                    "invalid_request_error");
    expect_rejected("/v1/completions", "", 400, "invalid_request_error");
}

BOOST_AUTO_TEST_CASE(invalid_utf8_in_json) {
    expect_rejected("/v1/completions", "{\"prompt\": \"caf\xc3 \xff\xfe\", \"max_tokens\": 3}", 400,
                    "invalid_request_error");
    expect_rejected("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xed\xa0\x80\"}]}",
                    400, "invalid_request_error");
}

BOOST_AUTO_TEST_CASE(body_not_an_object) {
    for (const char* body : {"[1, 2, 3]", "\"prompt\"", "42", "null", "true"})
        expect_rejected("/v1/completions", body, 400, "invalid_request_error");
}

BOOST_AUTO_TEST_CASE(huge_numbers) {
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 1e300})", 400, "invalid_request_error",
                    "max_tokens");
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 1180591620717411303424})", 400,
                    "invalid_request_error", "max_tokens");
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 3, "temperature": 1e400})", 400,
                    "invalid_request_error", "temperature");
    expect_rejected("/completion", R"({"prompt": "hi", "n_predict": 99999999999999999999999})", 400,
                    "invalid_request_error", "n_predict");
}

BOOST_AUTO_TEST_CASE(negative_max_tokens) {
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": -5})", 400, "invalid_request_error",
                    "max_tokens");
    expect_rejected("/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1})", 400,
                    "invalid_request_error", "max_completion_tokens");
    expect_rejected("/completion", R"({"prompt": "hi", "n_predict": -2})", 400, "invalid_request_error", "n_predict");
}

BOOST_AUTO_TEST_CASE(wrong_types) {
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 3, "temperature": "hot"})", 400,
                    "invalid_request_error", "temperature");
    expect_rejected("/v1/chat/completions", R"({"messages": "hi"})", 400, "invalid_request_error", "messages");
    expect_rejected("/v1/chat/completions", R"({"max_tokens": 3})", 400, "invalid_request_error", "messages");
    expect_rejected("/v1/completions", R"({"prompt": "hi", "max_tokens": 1.5})", 400, "invalid_request_error",
                    "max_tokens");
}

BOOST_AUTO_TEST_CASE(ten_thousand_stop_strings) {
    std::string body = R"({"prompt": "hi", "max_tokens": 3, "stop": [)";
    for (int i = 0; i < 10000; ++i) {
        if (i) body += ',';
        body += "\"s";
        body += std::to_string(i);
        body += '"';
    }
    body += "]}";
    BOOST_TEST_REQUIRE(body.size() < k_body_limit);
    expect_rejected("/v1/completions", body, 400, "invalid_request_error", "stop");
}

BOOST_AUTO_TEST_CASE(truncated_body) {
    // Content-Length promises more than arrives, then the client stops sending: 400, and the
    // connection is closed (the client still reads the answer: it only half-closed).
    const std::string partial = R"({"prompt": "hel)";
    {
        raw_connection c(port());
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/completions", 100) + partial));
        c.half_close();
        auto got = c.read_until_close(10s);
        BOOST_TEST(got.closed);
        BOOST_TEST(status_of_raw(got.bytes) == 400, got.bytes);
        check_api_error_body(body_of_raw(got.bytes), 400, "invalid_request_error");
    }
    // The client goes away completely in the middle of the body.
    {
        raw_connection c(port());
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/chat/completions", 5000) + partial));
    }
    // Or just stops sending: dropped after the header timeout without an answer.
    {
        raw_connection c(port());
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/completions", 100) + partial));
        const auto t0 = std::chrono::steady_clock::now();
        auto got = c.read_until_close(15s);
        BOOST_TEST(got.closed);
        BOOST_TEST(seconds_since(t0) < 8.0);
    }
    check_still_serving(port());
}

BOOST_AUTO_TEST_CASE(body_over_the_limit) {
    // Declared by Content-Length: refused from the header, the client still receives the 413.
    {
        raw_connection c(port());
        const std::string body(2 * k_body_limit, 'x');
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/completions", body.size())));
        c.send(body);  // may fail once the server has answered and closed: that is allowed
        auto got = c.read_until_close(15s);
        BOOST_TEST(status_of_raw(got.bytes) == 413, got.bytes.substr(0, 300));
        check_api_error_body(body_of_raw(got.bytes), 413, "invalid_request_error");
        BOOST_TEST(got.closed);
    }
    // Chunked, so only counting the body finds it.
    {
        raw_connection c(port());
        std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n";
        BOOST_TEST_REQUIRE(c.send(head));
        const std::string piece(64 * 1024, 'y');
        char size_line[32];
        std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
        for (size_t sent = 0; sent <= 2 * k_body_limit; sent += piece.size())
            if (!c.send(size_line + piece + "\r\n")) break;
        auto got = c.read_until_close(15s);
        BOOST_TEST(status_of_raw(got.bytes) == 413, got.bytes.substr(0, 300));
        check_api_error_body(body_of_raw(got.bytes), 413, "invalid_request_error");
    }
    check_still_serving(port());
}

BOOST_AUTO_TEST_CASE(header_flood) {
    // Many header lines, and one huge line: both over the 64 KiB header limit -> 431.
    std::string many = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (int i = 0; i < 4000; ++i) many += "X-Flood-" + std::to_string(i) + ": " + std::string(40, 'f') + "\r\n";
    many += "\r\n";
    std::string huge = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: " + std::string(200 * 1024, 'c') + "\r\n\r\n";
    for (const auto* flood : {&many, &huge}) {
        raw_connection c(port());
        c.send(*flood);
        auto got = c.read_until_close(15s);
        BOOST_TEST(status_of_raw(got.bytes) == 431, got.bytes.substr(0, 300));
        check_api_error_body(body_of_raw(got.bytes), 431, "invalid_request_error");
        BOOST_TEST(got.closed);
    }
    check_still_serving(port());
}

BOOST_AUTO_TEST_CASE(garbage_request_line) {
    raw_connection c(port());
    c.send("HELLO THERE\r\n\r\n");
    auto got = c.read_until_close(10s);
    BOOST_TEST(status_of_raw(got.bytes) == 400, got.bytes);
    check_api_error_body(body_of_raw(got.bytes), 400, "invalid_request_error");
    BOOST_TEST(got.closed);
    check_still_serving(port());
}

BOOST_AUTO_TEST_CASE(slowloris) {
    // One header byte every 300 ms: the whole header must arrive within the header timeout (2 s
    // here), so the server drops the connection after about 2 s while others are served.
    raw_connection slow(port());
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(64, 's');
    const auto t0 = std::chrono::steady_clock::now();
    size_t sent = 0;
    bool dropped = false;
    while (sent < head.size() && std::chrono::steady_clock::now() - t0 < 12s) {
        if (!slow.send(head.substr(sent, 1))) {
            dropped = true;
            break;
        }
        ++sent;
        if (sent == 3) check_still_serving(port());  // others are served meanwhile
        std::this_thread::sleep_for(300ms);
        if (std::chrono::steady_clock::now() - t0 > 2500ms) {
            // By now the server must have closed: reading sees EOF at once.
            auto got = slow.read_until_close(3s);
            dropped = got.closed;
            BOOST_TEST(got.bytes.empty(), "a slowloris client got an answer: " << got.bytes);
            break;
        }
    }
    const double held = seconds_since(t0);
    BOOST_TEST(dropped, "the slow client was not disconnected");
    BOOST_TEST(held >= 1.5);
    BOOST_TEST(held < 8.0);
    BOOST_TEST(sent < head.size());
    check_still_serving(port());
}

BOOST_AUTO_TEST_CASE(idle_connections) {
    // A connection that never sends a byte is dropped after the header timeout (2 s here)...
    {
        raw_connection silent(port());
        const auto t0 = std::chrono::steady_clock::now();
        auto got = silent.read_until_close(10s);
        BOOST_TEST(got.closed);
        BOOST_TEST(got.bytes.empty());
        BOOST_TEST(seconds_since(t0) > 1.5);
        BOOST_TEST(seconds_since(t0) < 4.0);
    }
    // ...while a keep-alive connection between requests may idle for the idle timeout (4 s).
    http_client c(port());
    BOOST_TEST(c.post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})").status == 200);
    std::this_thread::sleep_for(3s);
    BOOST_TEST(c.get("/health").status == 200, "the keep-alive connection was closed before the idle timeout");
    const auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(c.closed_by_server(10s));
    BOOST_TEST(seconds_since(t0) > 3.0);
    BOOST_TEST(seconds_since(t0) < 6.5);
}

// ---- the Anthropic Messages route: every case is a 400 in Anthropic's shape that names what is
// wrong, and the server serves on.

BOOST_AUTO_TEST_CASE(anthropic_bad_bodies) {
    const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
    const std::string use = R"({"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}]})";
    const std::pair<std::string, std::string_view> cases[] = {
        {R"({"max_tokens":8,"messages":[{"role":"user","content":"hi"})", "truncated JSON"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":"hi"}]]})", "invalid JSON at byte"},
        {"[1,2]", "must be a JSON object"},
        {"", "empty"},
        {"{\"max_tokens\":8," + msgs + ",\"system\":\"caf\xc3\"}", "UTF-8"},
        {"{" + msgs + "}", "max_tokens: required"},
        {R"({"max_tokens":1e300,)" + msgs + "}", "max_tokens"},
        {R"({"max_tokens":"8",)" + msgs + "}", "max_tokens: expected an integer"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}}]}]})",
         "image content is not supported"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]})",
         "tool_use blocks belong in assistant messages"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"video"}]}]})", "unsupported content block type"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":42}]})", "expected a string or an array of content blocks"},
        {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},)" + use +
             R"(,{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_404","content":"?"}]}]})",
         "unexpected tool_use_id \"toolu_404\""},
        {R"({"max_tokens":8,"thinking":{"type":"enabled","budget_tokens":8},)" + msgs + "}", "must be less than max_tokens"},
        {R"({"max_tokens":8,"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"tool","name":"b"},)" + msgs + "}",
         "no tool named \"b\""},
    };
    for (const auto& [body, fragment] : cases) {
        {
            http_client c(port());
            const auto r = c.post("/v1/messages", body);
            check_anthropic_error(r, 400, "invalid_request_error");
            BOOST_TEST(json_doc(r.body).str({"error", "message"}).find(fragment) != std::string::npos,
                       body << " -> " << r.body);
        }
        check_still_serving(port());
    }
}

BOOST_AUTO_TEST_CASE(anthropic_huge_max_tokens_is_a_cap) {
    // Agents send far more than the context leaves: generation runs to the end of the context.
    http_client c(port());
    const auto r = c.post("/v1/messages", R"({"max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST((d.str({"stop_reason"}) == "model_context_window_exceeded" || d.str({"stop_reason"}) == "end_turn"), r.body);
}

BOOST_AUTO_TEST_CASE(anthropic_truncated_and_oversized_bodies) {
    {
        raw_connection c(port());
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/messages", 100) + R"({"max_tokens":8,"mess)"));
        c.half_close();
        auto got = c.read_until_close(10s);
        BOOST_TEST(status_of_raw(got.bytes) == 400, got.bytes);
    }
    {
        raw_connection c(port());
        const std::string body(2 * k_body_limit, 'x');
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/messages?beta=true", body.size())));
        c.send(body);  // may fail once the server has answered and closed
        auto got = c.read_until_close(15s);
        BOOST_TEST(status_of_raw(got.bytes) == 413, got.bytes.substr(0, 300));
        check_anthropic_error_body(body_of_raw(got.bytes), "request_too_large");
    }
    check_still_serving(port());
}

// ---- the Responses route: every case is a 400 in the OpenAI shape whose param names the field,
// and the server serves on.

BOOST_AUTO_TEST_CASE(responses_bad_bodies) {
    struct bad {
        std::string body, param;
        std::string_view fragment;
    };
    const std::string call = R"({"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"})";
    const bad cases[] = {
        {R"({"input":"hi","max_output_tokens":4)", "", "truncated JSON"},
        {R"({"input":["hi"]]})", "", "invalid JSON at byte"},
        {"[1,2]", "", "must be a JSON object"},
        {"", "", "empty"},
        {"{\"input\":\"caf\xc3\"}", "", "UTF-8"},
        {R"({"max_output_tokens":4})", "input", "input: required"},
        {R"({"input":{"role":"user"}})", "input", "expected a string or an array of items"},
        {R"({"input":[7]})", "input[0]", "expected an item object"},
        {R"({"input":[{"type":"computer_call","id":"c"}]})", "input[0].type", "'computer_call' is not supported"},
        {R"({"input":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})", "input[0].content[0].type",
         "only text content is supported"},
        {R"({"input":[{"role":"critic","content":"x"}]})", "input[0].role", "unknown role 'critic'"},
        {R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id", "required"},
        {R"({"input":[{"type":"function_call_output","call_id":"call_404","output":"x"}]})", "input[0].call_id",
         "no function_call with call_id \"call_404\""},
        {"{\"input\":[" + call + R"(,{"type":"function_call_output","call_id":"call_2","output":"x"}]})",
         "input[1].call_id", "no function_call with call_id \"call_2\""},
        {R"({"input":"hi","max_output_tokens":1e300})", "max_output_tokens", "max_output_tokens"},
        {R"({"input":"hi","max_output_tokens":"many"})", "max_output_tokens", "expected an integer"},
        {R"({"input":"hi","max_output_tokens":0})", "max_output_tokens", "must be >= 1"},
        {R"({"input":"hi","tools":[{"type":"function","function":{"name":"f"}}]})", "tools[0].name", "flat"},
        {R"({"input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}})",
         "tool_choice.name", "no function tool named \"g\""},
        {R"({"input":"hi","previous_response_id":"resp_404"})", "previous_response_id", "no stored response"},
        {R"({"input":"hi","text":{"format":{"type":"xml"}}})", "text.format.type", "unknown type"},
    };
    for (const auto& c : cases) {
        {
            http_client client(port());
            const auto r = client.post("/v1/responses", c.body);
            check_api_error(r, 400, "invalid_request_error", c.param);
            BOOST_TEST(json_doc(r.body).str({"error", "message"}).find(c.fragment) != std::string::npos,
                       c.body << " -> " << r.body);
        }
        check_still_serving(port());
    }
}

BOOST_AUTO_TEST_CASE(responses_huge_max_output_tokens_is_a_cap) {
    http_client c(port());
    const auto r = c.post("/v1/responses", R"({"input":"hi","max_output_tokens":9223372036854775807})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    // The context (256 tokens here) ends it, unless the model ends first.
    BOOST_TEST((d.str({"status"}) == "incomplete" || d.str({"status"}) == "completed"), r.body.substr(0, 300));
    BOOST_TEST(d.integer({"usage", "input_tokens"}) + d.integer({"usage", "output_tokens"}) <= 256);
}

BOOST_AUTO_TEST_CASE(responses_truncated_and_oversized_bodies) {
    {
        raw_connection c(port());
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/responses", 100) + R"({"input":"hi","str)"));
        c.half_close();
        auto got = c.read_until_close(10s);
        BOOST_TEST(status_of_raw(got.bytes) == 400, got.bytes);
    }
    {
        raw_connection c(port());
        const std::string body(2 * k_body_limit, 'x');
        BOOST_TEST_REQUIRE(c.send(request_head("/v1/responses", body.size())));
        c.send(body);  // may fail once the server has answered and closed
        auto got = c.read_until_close(15s);
        BOOST_TEST(status_of_raw(got.bytes) == 413, got.bytes.substr(0, 300));
        check_api_error_body(body_of_raw(got.bytes), 413, "invalid_request_error");
    }
    check_still_serving(port());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
