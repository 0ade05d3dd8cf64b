// output_parser: every case is parsed whole, one byte at a time, one character at a time, cut at
// every single point and in random pieces; the deltas, accumulated as a client does, must give
// the same message every time, and the same as the parser's own final message.
#include <boost/test/unit_test.hpp>

#include <cctype>
#include <random>
#include <string>
#include <vector>

#include "server/output_parser.h"
#include "tests/common/test_support.h"

namespace moestream::server {
namespace {

const std::string CB = "<｜tool▁calls▁begin｜>";
const std::string CE_ALL = "<｜tool▁calls▁end｜>";
const std::string C = "<｜tool▁call▁begin｜>";
const std::string CE = "<｜tool▁call▁end｜>";
const std::string SEP = "<｜tool▁sep｜>";

struct call_want {
    std::string name, arguments;
    bool complete = true, valid = true;
    bool operator==(const call_want&) const = default;
};

struct message {
    std::string content, reasoning;
    std::vector<call_want> calls;
    bool operator==(const message&) const = default;
};

std::ostream& operator<<(std::ostream& os, const message& m) {
    os << "{content '" << m.content << "', reasoning '" << m.reasoning << "', calls [";
    for (const auto& c : m.calls)
        os << "{" << c.name << ", '" << c.arguments << "', complete " << c.complete << ", valid " << c.valid << "}";
    return os << "]}";
}

parser_options tools_on() {
    parser_options o;
    o.tools_enabled = true;
    o.id_seed = 42;
    return o;
}

// Adds deltas up as an OpenAI client does, checking the delta rules on the way.
struct accumulator {
    std::string content, reasoning;
    std::vector<parsed_tool_call> calls;

    void add(const output_delta& d) {
        content += d.content;
        reasoning += d.reasoning;
        for (const tool_call_delta& t : d.tool_calls) {
            if (!t.id.empty()) {  // a header: once per call, in order, name complete, no arguments
                BOOST_TEST(t.index == static_cast<int>(calls.size()));
                BOOST_TEST(!t.name.empty());
                BOOST_TEST(t.arguments.empty());
                calls.push_back(parsed_tool_call{t.id, t.name, "", false, false});
            } else {  // a fragment of the latest call
                BOOST_TEST(t.name.empty());
                BOOST_TEST(!t.arguments.empty());
                BOOST_REQUIRE(!calls.empty());
                BOOST_REQUIRE(t.index == static_cast<int>(calls.size()) - 1);
                calls.back().arguments += t.arguments;
            }
        }
    }
};

message parse(const parser_options& opts, const std::vector<std::string_view>& pieces) {
    output_parser p(opts);
    accumulator acc;
    for (std::string_view piece : pieces) acc.add(p.push(piece));
    acc.add(p.finish());
    // The streamed deltas and the final message agree.
    BOOST_TEST(acc.content == p.content());
    BOOST_TEST(acc.reasoning == p.reasoning());
    BOOST_REQUIRE(acc.calls.size() == p.tool_calls().size());
    BOOST_TEST(p.saw_tool_calls() == !acc.calls.empty());
    message m{p.content(), p.reasoning(), {}};
    for (size_t i = 0; i < acc.calls.size(); ++i) {
        const parsed_tool_call& f = p.tool_calls()[i];
        BOOST_TEST(acc.calls[i].id == f.id);
        BOOST_TEST(f.id == tool_call_id(opts.id_seed, static_cast<int>(i)));
        BOOST_TEST(acc.calls[i].name == f.name);
        BOOST_TEST(acc.calls[i].arguments == f.arguments);
        m.calls.push_back(call_want{f.name, f.arguments, f.complete, f.arguments_valid});
    }
    return m;
}

using test::cut;

// The whole text, and the same text in every chunking listed in the file's comment.
void check(const parser_options& opts, const std::string& text, const message& want) {
    BOOST_TEST_CONTEXT("whole") { BOOST_TEST(parse(opts, {text}) == want); }
    std::vector<size_t> bytes, chars;
    for (size_t i = 1; i < text.size(); ++i) {
        bytes.push_back(i);
        if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) chars.push_back(i);
    }
    BOOST_TEST_CONTEXT("byte by byte") { BOOST_TEST(parse(opts, cut(text, bytes)) == want); }
    BOOST_TEST_CONTEXT("character by character") { BOOST_TEST(parse(opts, cut(text, chars)) == want); }
    for (size_t at = 1; at < text.size(); ++at)
        BOOST_TEST_CONTEXT("cut at " << at) { BOOST_TEST(parse(opts, cut(text, {at})) == want); }
    std::mt19937 rng(static_cast<unsigned>(text.size()));
    for (int round = 0; round < 40; ++round) {
        std::vector<size_t> cuts;
        for (size_t i = 1; i < text.size(); ++i)
            if (rng() % (1 + round % 8) == 0) cuts.push_back(i);
        BOOST_TEST_CONTEXT("random round " << round) { BOOST_TEST(parse(opts, cut(text, cuts)) == want); }
    }
}

std::string v3_call(const std::string& name, const std::string& args) {
    return C + "function" + SEP + name + "\n```json\n" + args + "\n```" + CE;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(output_parser_suite)

BOOST_AUTO_TEST_CASE(plain_text) {
    check(tools_on(), "Hello <b>world</b>, a < b and ｜ü｜.", {"Hello <b>world</b>, a < b and ｜ü｜.", "", {}});
}

BOOST_AUTO_TEST_CASE(v3_single_call_after_content) {
    const std::string text = "Let me look.\n" + CB + v3_call("get_weather", R"({"city": "Paris"})") + CE_ALL;
    check(tools_on(), text, {"Let me look.\n", "", {{"get_weather", R"({"city": "Paris"})"}}});
}

BOOST_AUTO_TEST_CASE(v3_two_calls) {
    const std::string text = CB + v3_call("get_weather", R"({"city": "Paris"})") + "\n" +
                             v3_call("get_time", "{\n  \"zone\": \"CET\"\n}") + CE_ALL;
    check(tools_on(), text,
          {"", "", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{\n  \"zone\": \"CET\"\n}"}}});
}

BOOST_AUTO_TEST_CASE(v31_form) {
    check(tools_on(), CB + C + "get_weather" + SEP + R"({"city":"Paris"})" + CE + C + "get.time-2" + SEP + "{}" + CE + CE_ALL,
          {"", "", {{"get_weather", R"({"city":"Paris"})"}, {"get.time-2", "{}"}}});
    // A V3.1 call to a tool named "function": what follows the separator is not a name.
    check(tools_on(), CB + C + "function" + SEP + R"({"x": 1})" + CE + CE_ALL, {"", "", {{"function", R"({"x": 1})"}}});
    // A section opened directly by a call; whitespace left after it is formatting.
    check(tools_on(), "Sure." + C + "ping" + SEP + "{}" + CE + "\n", {"Sure.", "", {{"ping", "{}"}}});
}

BOOST_AUTO_TEST_CASE(v3_call_without_arguments) {
    check(tools_on(), CB + C + "function" + SEP + "ping" + CE + CE_ALL, {"", "", {{"ping", "", true, false}}});
}

BOOST_AUTO_TEST_CASE(reasoning_then_tool_call) {
    const std::string text = "<think>\nI need the weather.\n</think>\n\n" + CB + v3_call("get_weather", "{}") + CE_ALL;
    check(tools_on(), text, {"", "I need the weather.\n", {{"get_weather", "{}"}}});
}

BOOST_AUTO_TEST_CASE(reasoning_then_content) {
    check(tools_on(), "<think>a < b</think>\n\nThe answer.", {"The answer.", "a < b", {}});
    // Only a leading <think> opens reasoning.
    check(tools_on(), "a<think>b</think>", {"a<think>b</think>", "", {}});
    check(tools_on(), "<thin", {"<thin", "", {}});
    // Unclosed: everything is reasoning (generation was cut).
    check(tools_on(), "<think>still thinking </thi", {"", "still thinking </thi", {}});
}

BOOST_AUTO_TEST_CASE(prompt_ended_inside_reasoning) {
    parser_options o = tools_on();
    o.starts_in_reasoning = true;
    check(o, "\nthinking</think>answer", {"answer", "thinking", {}});
}

BOOST_AUTO_TEST_CASE(markers_inside_reasoning_are_reasoning) {
    const std::string inner = "maybe " + CB + v3_call("x", "{}") + CE_ALL;
    check(tools_on(), "<think>" + inner + "</think>no tools", {"no tools", inner, {}});
}

BOOST_AUTO_TEST_CASE(tools_disabled_markers_are_content) {
    parser_options o = tools_on();
    o.tools_enabled = false;
    const std::string text = "x" + CB + v3_call("get_weather", "{}") + CE_ALL;
    check(o, text, {text, "", {}});
}

BOOST_AUTO_TEST_CASE(reasoning_disabled_think_is_content) {
    parser_options o = tools_on();
    o.reasoning_enabled = false;
    o.starts_in_reasoning = true;  // ignored: reasoning is off
    check(o, "<think>a</think>b", {"<think>a</think>b", "", {}});
}

BOOST_AUTO_TEST_CASE(unfinished_call_after_its_header) {
    // The header was streamed, so the call stays, incomplete, with the arguments that came.
    check(tools_on(), CB + C + "function" + SEP + "get_weather\n```json\n{\"city\": \"Pa",
          {"", "", {{"get_weather", "{\"city\": \"Pa", false, false}}});
    // The start of the closing fence is markup and is dropped.
    check(tools_on(), CB + C + "function" + SEP + "get_weather\n```json\n{\"city\": \"Paris\"}\n``",
          {"", "", {{"get_weather", "{\"city\": \"Paris\"}", false, true}}});
    check(tools_on(), CB + C + "get_weather" + SEP + "{\"a\":1}<｜tool▁call",
          {"", "", {{"get_weather", "{\"a\":1}", false, true}}});
}

BOOST_AUTO_TEST_CASE(unfinished_call_before_its_header_is_content) {
    const std::string text = "Hi" + CB + C + "function" + SEP + "get_wea";
    check(tools_on(), text, {text, "", {}});
    check(tools_on(), "Hi" + CB, {"Hi" + CB, "", {}});
    check(tools_on(), "Hi<｜tool▁ca", {"Hi<｜tool▁ca", "", {}});
}

BOOST_AUTO_TEST_CASE(invalid_json_arguments_are_reported_as_written) {
    check(tools_on(), CB + C + "get_weather" + SEP + "{city: Paris}" + CE + CE_ALL,
          {"", "", {{"get_weather", "{city: Paris}", true, false}}});
    check(tools_on(), CB + v3_call("get_weather", "[1, 2]") + CE_ALL, {"", "", {{"get_weather", "[1, 2]", true, false}}});
}

BOOST_AUTO_TEST_CASE(malformed_markup_goes_back_to_content) {
    check(tools_on(), CB + "Sure thing", {CB + "Sure thing", "", {}});
    const std::string bad_name = CB + C + "bad name" + SEP + "{}" + CE + CE_ALL;
    check(tools_on(), bad_name, {bad_name, "", {}});
    const std::string long_name = CB + C + std::string(200, 'n') + SEP + "{}" + CE + CE_ALL;
    check(tools_on(), long_name, {long_name, "", {}});
    // Endless whitespace in a section is not a call; the call after it still is.
    const std::string spaces(300, ' ');
    check(tools_on(), CB + spaces + C + "ping" + SEP + "{}" + CE, {CB + spaces, "", {{"ping", "{}"}}});
}

BOOST_AUTO_TEST_CASE(text_after_the_calls_is_content) {
    check(tools_on(), "Before. " + CB + v3_call("a", "{}") + CE_ALL + "After.", {"Before. After.", "", {{"a", "{}"}}});
    // A call followed by something that is neither a call nor the section's end.
    check(tools_on(), CB + v3_call("a", "{}") + "\nok", {"\nok", "", {{"a", "{}"}}});
    // A second section continues the numbering.
    check(tools_on(), CB + v3_call("a", "{}") + CE_ALL + " and " + CB + v3_call("b", "{}") + CE_ALL,
          {" and ", "", {{"a", "{}"}, {"b", "{}"}}});
}

BOOST_AUTO_TEST_CASE(header_waits_for_the_name_and_arguments_stream) {
    output_parser p(tools_on());
    BOOST_TEST(p.push("Hi <｜tool▁").content == "Hi ");
    BOOST_TEST(p.push("calls▁begin｜>" + C + "function" + SEP + "get_wea").empty());
    BOOST_TEST(p.push("ther").empty());
    output_delta d = p.push("\n");
    BOOST_REQUIRE(d.tool_calls.size() == 1u);
    BOOST_TEST(d.tool_calls[0].index == 0);
    BOOST_TEST(d.tool_calls[0].id == tool_call_id(42, 0));
    BOOST_TEST(d.tool_calls[0].name == "get_weather");
    BOOST_TEST(d.tool_calls[0].arguments == "");
    BOOST_TEST(p.saw_tool_calls());
    BOOST_TEST(p.push("```js").empty());
    d = p.push("on\n{\"a\":");
    BOOST_REQUIRE(d.tool_calls.size() == 1u);
    BOOST_TEST(d.tool_calls[0].id == "");
    BOOST_TEST(d.tool_calls[0].arguments == "{\"a\":");
    d = p.push(" 1}\n``");
    BOOST_REQUIRE(d.tool_calls.size() == 1u);
    BOOST_TEST(d.tool_calls[0].arguments == " 1}");
    BOOST_TEST(p.push("`").empty());
    BOOST_TEST(p.push(CE).empty());
    BOOST_TEST(p.push(CE_ALL).empty());
    BOOST_TEST(p.finish().empty());
    BOOST_REQUIRE(p.tool_calls().size() == 1u);
    BOOST_TEST(p.tool_calls()[0].arguments == "{\"a\": 1}");
    BOOST_TEST(p.tool_calls()[0].complete);
    BOOST_TEST(p.tool_calls()[0].arguments_valid);
    BOOST_TEST(p.content() == "Hi ");
}

BOOST_AUTO_TEST_CASE(only_possible_markers_are_withheld) {
    output_parser p(tools_on());
    BOOST_TEST(p.push("a < b").content == "a < b");
    BOOST_TEST(p.push("x <").content == "x ");
    BOOST_TEST(p.push("b>").content == "<b>");
    BOOST_TEST(p.push("<｜User｜>").content == "<｜User｜>");
    BOOST_TEST(p.finish().empty());
}

BOOST_AUTO_TEST_CASE(tool_call_ids) {
    const std::string id = tool_call_id(7, 0);
    BOOST_TEST(id.size() == 5u + 24u);
    BOOST_TEST(id.starts_with("call_"));
    for (char c : id.substr(5)) BOOST_TEST(std::isalnum(static_cast<unsigned char>(c)) != 0);
    BOOST_TEST(tool_call_id(7, 0) == id);
    BOOST_TEST(tool_call_id(7, 1) != id);
    BOOST_TEST(tool_call_id(8, 0) != id);
    BOOST_TEST(tool_call_id(0, 0) != tool_call_id(0, 1));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::server
