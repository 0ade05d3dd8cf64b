#include "server/json_writer.h"

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "server/api_error.h"

using namespace moestream::server;

namespace {

std::string write(auto&& build) {
    std::string out;
    json_writer w(out);
    build(w);
    BOOST_TEST(w.complete());
    return out;
}

std::string string_value(std::string_view s) {
    return write([&](json_writer& w) { w.value(s); });
}

// Parses `json` with simdjson (which validates UTF-8 and the grammar) and returns the string it holds.
std::string parse_back_string(const std::string& json) {
    simdjson::dom::parser p;
    simdjson::dom::element e;
    const auto err = p.parse(json).get(e);
    BOOST_TEST_REQUIRE(!err, "simdjson rejects " << json << ": " << simdjson::error_message(err));
    std::string_view s;
    BOOST_TEST_REQUIRE(!e.get_string().get(s));
    return std::string(s);
}

const std::string k_fffd = "\xEF\xBF\xBD";

// Runs `misuse` in a child process and reports whether it aborted (a failed MS_ASSERT).
bool aborts(void (*misuse)()) {
    const pid_t pid = fork();
    if (pid == 0) {
        const int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);  // the assertion message is expected
        std::signal(SIGABRT, SIG_DFL);       // not Boost.Test's handler, inherited from the parent
        misuse();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(json_writer_suite)

BOOST_AUTO_TEST_CASE(every_control_character_is_escaped) {
    for (int c = 0; c < 0x20; ++c) {
        const std::string in(1, static_cast<char>(c));
        const std::string out = string_value(in);
        std::string expected;
        switch (c) {
            case '\b': expected = "\"\\b\""; break;
            case '\f': expected = "\"\\f\""; break;
            case '\n': expected = "\"\\n\""; break;
            case '\r': expected = "\"\\r\""; break;
            case '\t': expected = "\"\\t\""; break;
            default: {
                char buf[16];
                std::snprintf(buf, sizeof buf, "\"\\u%04x\"", c);
                expected = buf;
            }
        }
        BOOST_TEST(out == expected, "control character " << c);
        BOOST_TEST(parse_back_string(out) == in, "control character " << c);
    }
    // DEL and the rest of printable ASCII pass through.
    BOOST_TEST(string_value("a\x7F~") == "\"a\x7F~\"");
}

BOOST_AUTO_TEST_CASE(quotes_and_backslashes) {
    BOOST_TEST(string_value("say \"hi\" \\ /") == R"("say \"hi\" \\ /")");
    BOOST_TEST(json_escape("\"\\") == R"("\"\\")");
    BOOST_TEST(json_escape("") == "\"\"");
    const std::string tricky = "\\\"\\\\\"\n";
    BOOST_TEST(parse_back_string(json_escape(tricky)) == tricky);
}

BOOST_AUTO_TEST_CASE(multibyte_utf8_passes_through) {
    const std::string s = "é ñ € 中文 😀 \xF4\x8F\xBF\xBF \xEE\x80\x80 <｜tool▁call▁begin｜>";
    BOOST_TEST(string_value(s) == "\"" + s + "\"");
    BOOST_TEST(parse_back_string(string_value(s)) == s);
    BOOST_TEST(is_valid_utf8(s));
}

BOOST_AUTO_TEST_CASE(invalid_utf8_becomes_replacement_characters) {
    struct input_case {
        std::string in, expected;
    };
    const input_case cases[] = {
        {"a\x80" "b", "a" + k_fffd + "b"},                          // lone continuation byte
        {"\xBF\xBF", k_fffd + k_fffd},                                // two lone continuations
        {"x\xE2\x82", "x" + k_fffd},                                  // truncated 3-byte at the end
        {"\xE2\x82" "A", k_fffd + "A"},                               // truncated 3-byte mid-text
        {"\xE2" "A", k_fffd + "A"},                                   // lone lead byte
        {"\xC0\x80", k_fffd + k_fffd},                                // overlong NUL
        {"\xC1\xBF", k_fffd + k_fffd},                                // overlong
        {"\xE0\x80\xAF", k_fffd + k_fffd + k_fffd},                   // overlong 3-byte
        {"\xF0\x80\x80\xAF", k_fffd + k_fffd + k_fffd + k_fffd},      // overlong 4-byte
        {"\xED\xA0\x80", k_fffd + k_fffd + k_fffd},                   // surrogate U+D800
        {"\xED\xBF\xBF", k_fffd + k_fffd + k_fffd},                   // surrogate U+DFFF
        {"\xF4\x90\x80\x80", k_fffd + k_fffd + k_fffd + k_fffd},      // U+110000
        {"\xF5\x80\x80\x80", k_fffd + k_fffd + k_fffd + k_fffd},      // F5 is never a lead
        {"\xFF", k_fffd},
        {"\xF0\x9F\x98", k_fffd},                                     // truncated emoji: one subpart
        {"\xF0\x9F\x98" "\xF0\x9F\x98\x80", k_fffd + "\xF0\x9F\x98\x80"},  // then a whole one
        {"\xE2\x82\xAC\x80", "\xE2\x82\xAC" + k_fffd},                // extra continuation
    };
    for (const auto& c : cases) {
        const std::string out = string_value(c.in);
        BOOST_TEST(out == "\"" + c.expected + "\"");
        BOOST_TEST(is_valid_utf8(out));
        BOOST_TEST(!is_valid_utf8(c.in));
        BOOST_TEST(parse_back_string(out) == c.expected);
    }
    // Keys follow the same rules.
    const std::string out = write([](json_writer& w) { w.begin_object().member("k\xC0", "v\n").end_object(); });
    BOOST_TEST(out == "{\"k" + k_fffd + "\":\"v\\n\"}");
}

BOOST_AUTO_TEST_CASE(random_bytes_always_give_valid_json) {
    std::mt19937 rng(7);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string s(static_cast<size_t>(rng() % 24), '\0');
        for (auto& ch : s) ch = static_cast<char>(rng() & 0xFF);
        const std::string out = string_value(s);
        simdjson::dom::parser p;
        simdjson::dom::element e;
        BOOST_TEST_REQUIRE(!p.parse(out).get(e));
        // Valid input is preserved byte for byte.
        if (is_valid_utf8(s)) BOOST_TEST(std::string(e.get_string().value()) == s);
    }
}

BOOST_AUTO_TEST_CASE(utf8_sequence_lengths) {
    BOOST_TEST(utf8_sequence_length("a", 0) == 1u);
    BOOST_TEST(utf8_sequence_length("\xC3\xA9", 0) == 2u);
    BOOST_TEST(utf8_sequence_length("\xE2\x82\xAC", 0) == 3u);
    BOOST_TEST(utf8_sequence_length("\xF0\x9F\x98\x80", 0) == 4u);
    BOOST_TEST(utf8_sequence_length("\xE2\x82", 0) == 0u);
    BOOST_TEST(utf8_invalid_length("\xE2\x82", 0) == 2u);
    BOOST_TEST(utf8_invalid_length("\xE2\x82" "A", 0) == 2u);
    BOOST_TEST(utf8_invalid_length("\xC0\x80", 0) == 1u);
    BOOST_TEST(utf8_invalid_length("\xED\xA0\x80", 0) == 1u);
    BOOST_TEST(utf8_sequence_length("\xED\x9F\xBF", 0) == 3u);  // U+D7FF, just below the surrogates
    BOOST_TEST(utf8_sequence_length("\xEE\x80\x80", 0) == 3u);  // U+E000, just above
}

BOOST_AUTO_TEST_CASE(nesting_and_commas) {
    const std::string out = write([](json_writer& w) {
        w.begin_object();
        w.member("a", 1).member("b", "x");
        w.key("arr").begin_array().value(1).value(true).null().begin_object().end_object().begin_array().end_array();
        w.end_array();
        w.key("empty").begin_object().end_object();
        w.key("nested").begin_object().key("deep").begin_array().begin_array().value(-2).end_array().end_array();
        w.end_object();
        w.key("raw").raw(R"({"type":"object","properties":{}})");
        w.end_object();
    });
    BOOST_TEST(out == R"({"a":1,"b":"x","arr":[1,true,null,{},[]],"empty":{},"nested":{"deep":[[-2]]},)"
                      R"("raw":{"type":"object","properties":{}}})");
    simdjson::dom::parser p;
    simdjson::dom::element e;
    BOOST_TEST_REQUIRE(!p.parse(out).get(e));
    BOOST_TEST(int64_t(e["nested"]["deep"].at(0).at(0)) == -2);
    BOOST_TEST(std::string_view(e["raw"]["type"]) == "object");
}

BOOST_AUTO_TEST_CASE(appends_to_existing_text) {
    std::string out = "data: ";
    json_writer w(out);
    w.begin_array().value("a").end_array();
    BOOST_TEST(out == "data: [\"a\"]");
    BOOST_TEST(w.complete());
}

BOOST_AUTO_TEST_CASE(integers) {
    const std::string out = write([](json_writer& w) {
        w.begin_array();
        w.value(int32_t{-7}).value(uint32_t{4000000000u}).value(std::numeric_limits<int64_t>::min());
        w.value(std::numeric_limits<uint64_t>::max()).value(static_cast<long long>(-3));
        w.value(static_cast<unsigned long long>(5)).value(static_cast<short>(-1)).value(size_t{9});
        w.end_array();
    });
    BOOST_TEST(out == "[-7,4000000000,-9223372036854775808,18446744073709551615,-3,5,-1,9]");
}

BOOST_AUTO_TEST_CASE(bools_and_strings_do_not_mix_up) {
    // A string literal must not pick the bool overload.
    BOOST_TEST(write([](json_writer& w) { w.value("true"); }) == "\"true\"");
    BOOST_TEST(write([](json_writer& w) { w.value(true); }) == "true");
    BOOST_TEST(write([](json_writer& w) { w.value(std::string("s")); }) == "\"s\"");
}

BOOST_AUTO_TEST_CASE(doubles_round_trip) {
    std::mt19937_64 rng(11);
    std::vector<double> values = {0.0,  -0.0, 1.0,     0.1,      -2.5,  1e300, 5e-324, 1.7976931348623157e308,
                                  1e21, 1e-7, 123456.0, 0.3333333333333333, 2.2250738585072014e-308};
    for (int i = 0; i < 2000; ++i) {
        uint64_t bits = rng();
        double d;
        std::memcpy(&d, &bits, sizeof d);
        if (std::isfinite(d)) values.push_back(d);
    }
    for (double d : values) {
        const std::string out = write([&](json_writer& w) { w.value(d); });
        BOOST_TEST(std::strtod(out.c_str(), nullptr) == d, out);
        // simdjson reads it back as a number too.
        simdjson::dom::parser p;
        simdjson::dom::element e;
        BOOST_TEST_REQUIRE(!p.parse(out).get(e), out);
        BOOST_TEST(e.get_double().value() == d, out);
    }
    BOOST_TEST(write([](json_writer& w) { w.value(0.1); }) == "0.1");  // shortest form
    BOOST_TEST(write([](json_writer& w) { w.value(0.8f); }) == "0.8");  // float's own shortest form
    BOOST_TEST(write([](json_writer& w) { w.value(2.0); }) == "2");
    // Integral values beyond 2^53 get an exponent: a bare 21-digit integer is out of int64 range
    // for simdjson (and most readers).
    BOOST_TEST(write([](json_writer& w) { w.value(1e20); }) == "1e+20");
    BOOST_TEST(write([](json_writer& w) { w.value(-1.3674292695826542e20); }) == "-1.3674292695826542e+20");
    BOOST_TEST(write([](json_writer& w) { w.value(9007199254740991.0); }) == "9007199254740991");
    BOOST_TEST(write([](json_writer& w) { w.value(3e9f); }) == "3e+09");
}

BOOST_AUTO_TEST_CASE(non_finite_doubles_are_null) {
    const std::string out = write([](json_writer& w) {
        w.begin_array();
        w.value(std::numeric_limits<double>::quiet_NaN()).value(std::numeric_limits<double>::infinity());
        w.value(-std::numeric_limits<double>::infinity()).value(std::numeric_limits<float>::infinity());
        w.end_array();
    });
    BOOST_TEST(out == "[null,null,null,null]");
}

BOOST_AUTO_TEST_CASE(nested_document_parses_with_simdjson) {
    const std::string tricky = std::string("line1\nline2\t\"q\"\\ \x01 é 😀 ") + "\xED\xA0\x80" + "\xC3";
    const std::string out = write([&](json_writer& w) {
        w.begin_object();
        w.member("id", "chatcmpl-1").member("created", int64_t{1700000000});
        w.key("choices").begin_array();
        for (int i = 0; i < 3; ++i) {
            w.begin_object().member("index", i);
            w.key("delta").begin_object().member("content", tricky).key("tool_calls").begin_array();
            w.begin_object().member("index", 0).key("function").begin_object().member("arguments", "{\"a\":1}");
            w.end_object().end_object().end_array().end_object();
            w.member("logprob", -0.125).key("finish_reason").null().end_object();
        }
        w.end_array();
        w.key("usage").begin_object().member("prompt_tokens", 5).member("completion_tokens", uint64_t{3});
        w.end_object().end_object();
    });
    simdjson::dom::parser p;
    simdjson::dom::element e;
    BOOST_TEST_REQUIRE(!p.parse(out).get(e));
    BOOST_TEST(simdjson::dom::array(e["choices"]).size() == 3u);
    const std::string_view content = e["choices"].at(2)["delta"]["content"];
    BOOST_TEST(content == "line1\nline2\t\"q\"\\ \x01 é 😀 " + k_fffd + k_fffd + k_fffd + k_fffd);
    BOOST_TEST(std::string_view(e["choices"].at(0)["delta"]["tool_calls"].at(0)["function"]["arguments"]) ==
               "{\"a\":1}");
    BOOST_TEST(double(e["choices"].at(1)["logprob"]) == -0.125);
    BOOST_TEST(e["choices"].at(1)["finish_reason"].is_null());
    BOOST_TEST(uint64_t(e["usage"]["completion_tokens"]) == 3u);
}

BOOST_AUTO_TEST_CASE(misuse_asserts) {
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).begin_object().value(1);  // a value without a key
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).begin_array().key("k");  // a key in an array
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).begin_object().end_array();  // unbalanced
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).end_object();  // nothing open
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).begin_object().key("a").end_object();  // a key without its value
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).begin_object().key("a").key("b");  // two keys in a row
    }));
    BOOST_TEST(aborts([] {
        std::string o;
        json_writer(o).value(1).value(2);  // two roots
    }));
    // The same sequences used correctly do not abort (the helper can tell the difference).
    BOOST_TEST(!aborts([] {
        std::string o;
        json_writer(o).begin_object().key("a").value(1).end_object();
    }));
}

BOOST_AUTO_TEST_CASE(api_error_body) {
    api_error e = bad_request("messages[2].content", "messages[2].content: required");
    BOOST_TEST(to_json(e) == R"({"error":{"code":400,"message":"messages[2].content: required",)"
                             R"("type":"invalid_request_error","param":"messages[2].content"}})");
    const api_error plain = make_api_error(503, "unavailable_error", "Loading model");
    BOOST_TEST(to_json(plain) == R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error","param":null}})");
    const api_error overflow = context_exceeded(9000, 8192);
    const std::string body = to_json(overflow);
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(!p.parse(body).get(doc));
    BOOST_TEST(int64_t(doc["error"]["code"]) == 400);
    BOOST_TEST(std::string_view(doc["error"]["type"]) == "exceed_context_size_error");
    BOOST_TEST(int64_t(doc["error"]["n_prompt_tokens"]) == 9000);
    BOOST_TEST(int64_t(doc["error"]["n_ctx"]) == 8192);
    const std::string_view msg = doc["error"]["message"];
    BOOST_TEST(msg.find("maximum context length is 8192 tokens") != std::string_view::npos);
    BOOST_TEST(msg.find("request (9000 tokens) exceeds the available context size (8192 tokens)") !=
               std::string_view::npos);
}

BOOST_AUTO_TEST_CASE(api_result_holds_value_or_error) {
    api_result<int> ok = 5;
    BOOST_TEST(ok.ok());
    BOOST_TEST(*ok == 5);
    api_result<int> bad = bad_request("temperature", "temperature: too hot");
    BOOST_TEST(!bad.ok());
    BOOST_TEST(bad.error().param == "temperature");
    BOOST_TEST(bad.error().status == 400);
}

BOOST_AUTO_TEST_SUITE_END()
