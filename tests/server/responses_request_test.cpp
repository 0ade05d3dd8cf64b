// The /v1/responses request parser and the conversation it builds: what each field becomes in the
// chat completion_request, what is echoed, and that bad input is a 400 naming the field.
#include "server/responses_request.h"

#include <boost/test/unit_test.hpp>
#include <string>

#include "server/responses_conversation.h"

using namespace moestream;
using namespace moestream::server;

namespace {

responses_request parse_ok(const std::string& body, parse_limits limits = {}) {
    auto r = parse_responses_request(body, limits);
    if (!r.ok()) BOOST_FAIL("unexpected error for " << body << ": " << r.error().message << " (param " << r.error().param << ")");
    return std::move(r).value();
}

// `body` is refused with a 400 naming `param`, whose message contains `fragment`.
void expect_error(const std::string& body, const std::string& param, const std::string& fragment, parse_limits limits = {}) {
    auto r = parse_responses_request(body, limits);
    if (r.ok()) BOOST_FAIL("accepted but expected an error on " << param << ": " << body);
    const api_error& e = r.error();
    BOOST_TEST(e.status == 400, body);
    BOOST_TEST(e.type == "invalid_request_error", body);
    BOOST_TEST(e.param == param, body << " -> message: " << e.message);
    BOOST_TEST(e.message.find(fragment) != std::string::npos,
               body << " -> message '" << e.message << "' lacks '" << fragment << "'");
}

// A body with input "hi" and `extra` members.
std::string with_input(const std::string& extra) { return R"({"input":"hi",)" + extra + "}"; }

const std::string k_tool =
    R"({"type":"function","name":"get_weather","description":"Weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true})";

}  // namespace

BOOST_AUTO_TEST_SUITE(responses_request_parsing)

BOOST_AUTO_TEST_CASE(defaults_and_string_input) {
    const auto r = parse_ok(R"({"input":"Hello"})");
    BOOST_TEST(r.input.size() == 1u);
    BOOST_TEST(r.input[0].kind == conversation_item::message);
    BOOST_TEST(r.input[0].role == "user");
    BOOST_TEST(r.input[0].text == "Hello");
    BOOST_TEST((r.generation.route == api_route::chat_completions));
    BOOST_TEST(r.generation.max_tokens == -1);
    BOOST_TEST(!r.generation.stream);
    BOOST_TEST(r.generation.sampling.temperature == 1.0f);
    BOOST_TEST(r.generation.sampling.top_p == 1.0f);
    BOOST_TEST(!r.echo.store, "stateless by default");
    BOOST_TEST(r.echo.format_json == R"({"type":"text"})");
    BOOST_TEST(r.echo.tool_choice_json == R"("auto")");
    BOOST_TEST(r.echo.metadata_json == "{}");
    BOOST_TEST((r.constraint.format == output_format::text));
}

BOOST_AUTO_TEST_CASE(generation_options) {
    const auto r = parse_ok(with_input(
        R"("model":"m","instructions":"Be brief.","max_output_tokens":1000000000,"temperature":0,"top_p":0.5,)"
        R"("stream":true,"store":true,"parallel_tool_calls":false,"reasoning":{"effort":"none","summary":"auto"},)"
        R"("metadata":{"k":"v"},"prompt_cache_key":"abc","include":["reasoning.encrypted_content"],"user":"u",)"
        R"("service_tier":"auto","truncation":"disabled","stream_options":{"include_obfuscation":false})"));
    BOOST_TEST(r.echo.model == "m");
    BOOST_TEST(r.generation.model == "m");
    BOOST_TEST(r.echo.instructions.value_or("") == "Be brief.");
    BOOST_TEST(r.generation.max_tokens == 1000000000, "a huge limit is a cap, not an error");
    BOOST_TEST(r.echo.max_output_tokens.value_or(0) == 1000000000);
    BOOST_TEST(r.generation.sampling.temperature == 0.0f);
    BOOST_TEST(r.generation.sampling.top_p == 0.5f);
    BOOST_TEST(r.generation.stream);
    BOOST_TEST(r.echo.store);
    BOOST_TEST(!r.generation.parallel_tool_calls);
    BOOST_TEST(!r.echo.parallel_tool_calls);
    BOOST_TEST(r.echo.reasoning_effort == "none");
    BOOST_TEST(r.echo.reasoning_summary == "auto");
    BOOST_TEST(!r.generation.enable_thinking);
    BOOST_TEST(r.echo.metadata_json == R"({"k":"v"})");
}

BOOST_AUTO_TEST_CASE(input_items) {
    const auto r = parse_ok(R"({"input":[
        {"type":"message","role":"developer","content":[{"type":"input_text","text":"Rules."}]},
        {"role":"user","content":"What is the weather?"},
        {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"x"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me ","annotations":[]},
                                                        {"type":"refusal","refusal":"check."}]},
        {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
        {"type":"function_call","call_id":"c2","name":"get_weather","arguments":{"city":"Rome"}},
        {"type":"function_call_output","call_id":"c1","output":"sunny"},
        {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rain"},{"type":"output_text","text":"y"}]}
    ]})");
    BOOST_TEST_REQUIRE(r.input.size() == 7u, "the reasoning item is dropped");
    BOOST_TEST(r.input[0].role == "system");
    BOOST_TEST(r.input[0].text == "Rules.");
    BOOST_TEST(r.input[1].role == "user");
    BOOST_TEST(r.input[2].role == "assistant");
    BOOST_TEST(r.input[2].text == "Let me check.");
    BOOST_TEST(r.input[3].kind == conversation_item::function_call);
    BOOST_TEST(r.input[3].arguments == R"({"city":"Paris"})");
    BOOST_TEST(r.input[4].arguments == R"({"city":"Rome"})", "an arguments object is serialised");
    BOOST_TEST(r.input[5].kind == conversation_item::function_call_output);
    BOOST_TEST(r.input[6].text == "rainy");
    BOOST_TEST(!check_call_ids({}, r.input).has_value());

    // The chat messages: instructions first, the two calls in one content-less assistant message.
    const auto m = chat_messages(std::string("Be brief."), {}, r.input);
    BOOST_TEST_REQUIRE(m.size() == 7u);
    BOOST_TEST(m[0].role == "system");
    BOOST_TEST(m[0].content.value_or("") == "Be brief.");
    BOOST_TEST(m[1].role == "system");
    BOOST_TEST(m[3].role == "assistant");
    BOOST_TEST(m[4].role == "assistant");
    BOOST_TEST(!m[4].content.has_value());
    BOOST_TEST_REQUIRE(m[4].tool_calls.size() == 2u);
    BOOST_TEST(m[4].tool_calls[1].name == "get_weather");
    BOOST_TEST(m[4].tool_calls[1].arguments == R"({"city":"Rome"})");
    BOOST_TEST(m[5].role == "tool");
    BOOST_TEST(m[5].content.value_or("") == "sunny");
    BOOST_TEST(m[6].content.value_or("") == "rainy");
}

BOOST_AUTO_TEST_CASE(call_ids_must_answer_an_earlier_call) {
    const auto r = parse_ok(R"({"input":[{"type":"function_call_output","call_id":"nope","output":"x"}]})");
    auto e = check_call_ids({}, r.input);
    BOOST_TEST_REQUIRE(e.has_value());
    BOOST_TEST(e->status == 400);
    BOOST_TEST(e->param == "input[0].call_id");
    BOOST_TEST(e->message.find("\"nope\"") != std::string::npos, e->message);
    // The call may come from the stored history.
    conversation_item call;
    call.kind = conversation_item::function_call;
    call.call_id = "nope";
    call.name = "f";
    call.arguments = "{}";
    BOOST_TEST(!check_call_ids({call}, r.input).has_value());
    // An output before its call does not count.
    const auto late = parse_ok(R"({"input":[{"type":"function_call_output","call_id":"c","output":"x"},
        {"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]})");
    BOOST_TEST(check_call_ids({}, late.input).has_value());
}

BOOST_AUTO_TEST_CASE(tools_and_choice) {
    const auto r = parse_ok(with_input(R"("tools":[)" + k_tool +
                                       R"(,{"type":"custom","name":"apply_patch","format":{"type":"grammar"}},)"
                                       R"({"type":"web_search","external_web_access":false},)"
                                       R"({"type":"namespace","name":"mcp","tools":[]}],)"
                                       R"("tool_choice":{"type":"function","name":"get_weather"})"));
    BOOST_TEST_REQUIRE(r.generation.tools.size() == 1u);
    BOOST_TEST(r.generation.tools[0].name == "get_weather");
    BOOST_TEST(r.generation.tools[0].description == "Weather of a city");
    BOOST_TEST(r.generation.tools[0].parameters_json ==
               R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
    BOOST_TEST_REQUIRE(r.echo.tools.size() == 1u);
    BOOST_TEST(r.echo.tools[0].strict);
    BOOST_TEST_REQUIRE(r.skipped_tools.size() == 3u);
    BOOST_TEST(r.skipped_tools[0] == "custom apply_patch");
    BOOST_TEST(r.skipped_tools[1] == "web_search");
    BOOST_TEST(r.skipped_tools[2] == "namespace mcp");
    BOOST_TEST((r.generation.choice.kind == tool_choice::function));
    BOOST_TEST(r.generation.choice.function_name == "get_weather");
    BOOST_TEST(r.echo.tool_choice_json == R"({"type":"function","name":"get_weather"})");

    const auto required = parse_ok(with_input(R"("tools":[)" + k_tool + R"(],"tool_choice":"required")"));
    BOOST_TEST((required.generation.choice.kind == tool_choice::required));
    const auto none = parse_ok(with_input(R"("tools":[)" + k_tool + R"(],"tool_choice":"none")"));
    BOOST_TEST((none.generation.choice.kind == tool_choice::none));
    BOOST_TEST(parse_ok(with_input(R"("tools":[{"type":"function","name":"f"}])")).generation.tools[0].parameters_json == "{}");
}

BOOST_AUTO_TEST_CASE(text_format_goes_through_response_format) {
    const auto r = parse_ok(with_input(R"("text":{"format":{"type":"json_object"},"verbosity":"low"})"));
    BOOST_TEST((r.constraint.format == output_format::json_object));
    BOOST_TEST(r.echo.format_json == R"({"type":"json_object"})");
    BOOST_TEST(r.echo.verbosity == "low");
    BOOST_TEST((parse_ok(with_input(R"("text":{"format":{"type":"text"}})")).constraint.format == output_format::text));
    // The chat route's errors, under this route's name.
    expect_error(with_input(R"("text":{"format":{"type":"yaml"}})"), "text.format.type", "unknown type 'yaml'");
    expect_error(with_input(R"("text":{"format":{"name":"x"}})"), "text.format.type", "required");
    expect_error(with_input(R"("text":{"format":"json"})"), "text.format", "expected an object");
    expect_error(with_input(R"("text":{"verbosity":"loud"})"), "text.verbosity", "expected one of low, medium, high");
}

BOOST_AUTO_TEST_CASE(bad_input_names_the_field) {
    expect_error("{}", "input", "required");
    expect_error(R"({"input":5})", "input", "expected a string or an array of items, got number");
    expect_error(R"({"input":[5]})", "input[0]", "expected an item object");
    expect_error(R"({"input":[{"content":"x"}]})", "input[0].type", "required");
    expect_error(R"({"input":[{"type":"item_reference","id":"x"}]})", "input[0].type", "'item_reference' is not supported");
    expect_error(R"({"input":[{"type":"custom_tool_call","call_id":"c","name":"x","input":""}]})", "input[0].type",
                 "not supported");
    expect_error(R"({"input":[{"role":"tool","content":"x"}]})", "input[0].role", "unknown role 'tool'");
    expect_error(R"({"input":[{"role":"user"}]})", "input[0].content", "required");
    expect_error(R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:"}]}]})",
                 "input[0].content[0].type", "only text content is supported");
    expect_error(R"({"input":[{"role":"user","content":[{"type":"input_text"}]}]})", "input[0].content[0].text",
                 "required");
    expect_error(R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id", "required");
    expect_error(R"({"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]})", "input[0].name", "required");
    expect_error(R"({"input":[{"type":"function_call","call_id":"c","name":"f","arguments":5}]})",
                 "input[0].arguments", "expected a string");
    expect_error(R"({"input":[{"type":"function_call_output","call_id":"c"}]})", "input[0].output", "required");
    expect_error(R"({"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_file"}]}]})",
                 "input[0].output[0].type", "only text content");
    expect_error(R"({"input":[{"type":"reasoning","summary":"x"}]})", "input[0].summary", "expected an array");
    expect_error(with_input(R"("max_output_tokens":0)"), "max_output_tokens", "must be >= 1");
    expect_error(with_input(R"("max_output_tokens":-5)"), "max_output_tokens", "must be >= 1");
    expect_error(with_input(R"("max_output_tokens":1.5)"), "max_output_tokens", "expected an integer");
    expect_error(with_input(R"("temperature":3)"), "temperature", "must be in [0, 2]");
    expect_error(with_input(R"("top_p":0)"), "top_p", "must be in (0, 1]");
    expect_error(with_input(R"("stream":"yes")"), "stream", "expected a boolean");
    expect_error(with_input(R"("instructions":["a"])"), "instructions", "expected a string");
    expect_error(with_input(R"("previous_response_id":"")"), "previous_response_id", "must not be empty");
    expect_error(with_input(R"("reasoning":{"effort":"extreme"})"), "reasoning.effort", "expected one of none");
    expect_error(with_input(R"("metadata":[1])"), "metadata", "expected an object");
    expect_error(with_input(R"("tools":{"type":"function"})"), "tools", "expected an array");
    expect_error(with_input(R"("tools":[{"name":"f"}])"), "tools[0].type", "required");
    expect_error(with_input(R"("tools":[{"type":"function","function":{"name":"f"}}])"), "tools[0].name",
                 "Responses tools are flat");
    expect_error(with_input(R"("tools":[{"type":"function","name":"bad name"}])"), "tools[0].name", "must be 1 to 64");
    expect_error(with_input(R"("tools":[{"type":"function","name":"f","parameters":"x"}])"), "tools[0].parameters",
                 "expected a JSON schema object");
    expect_error(with_input(R"("tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}])"),
                 "tools[1].name", "duplicate tool name 'f'");
    expect_error(with_input(R"("tool_choice":"required")"), "tool_choice", "needs at least one function tool");
    expect_error(with_input(R"("tools":[{"type":"custom","name":"x"}],"tool_choice":"required")"), "tool_choice",
                 "needs at least one function tool");
    expect_error(with_input(R"("tool_choice":"any")"), "tool_choice", "expected \"auto\"");
    expect_error(with_input(R"("tools":[)" + k_tool + R"(],"tool_choice":{"type":"function","name":"other"})"),
                 "tool_choice.name", "no function tool named \"other\"");
    expect_error(with_input(R"("tool_choice":{"type":"allowed_tools","mode":"auto","tools":[]})"), "tool_choice.type",
                 "only \"function\" is supported");
    expect_error(with_input(R"("background":true)"), "background", "not supported");
    expect_error(with_input(R"("conversation":"conv_1")"), "conversation", "not supported");
    expect_error(with_input(R"("prompt":{"id":"p"})"), "prompt", "not supported");
    expect_error(with_input(R"("truncation":"auto")"), "truncation", "never drops input");
    expect_error(with_input(R"("top_logprobs":3)"), "top_logprobs", "not supported");
    expect_error(with_input(R"("max_tool_calls":2)"), "max_tool_calls", "not supported");
    parse_limits small;
    small.max_messages = 2;
    expect_error(R"({"input":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]})",
                 "input", "at most 2 items", small);
    small.max_tools = 1;
    expect_error(R"({"input":"x","tools":[{"type":"function","name":"a"},{"type":"function","name":"b"}]})", "tools",
                 "at most 1 function tools", small);
    // Malformed JSON: the shared body parser's message.
    expect_error(R"({"input":"hi",)", "", "truncated JSON");
}

BOOST_AUTO_TEST_CASE(reasoning_effort_plans_the_thinking) {
    auto plan = [](const std::string& extra) { return reasoning_plan_of(parse_ok(with_input(extra))); };
    BOOST_TEST(!plan(R"("max_output_tokens":5)").open, "no effort: no thinking");
    BOOST_TEST(!plan(R"("reasoning":{"summary":"auto"})").open);
    BOOST_TEST(!plan(R"("reasoning":{"effort":"none"})").open);
    const auto low = plan(R"("reasoning":{"effort":"low"})");
    BOOST_TEST(low.open);
    BOOST_TEST(low.budget == 2048);
    BOOST_TEST(plan(R"("reasoning":{"effort":"minimal"})").budget == 512);
    BOOST_TEST(plan(R"("reasoning":{"effort":"high"})").budget == 32768);
    BOOST_TEST(plan(R"("reasoning":{"effort":"xhigh"})").budget == -1, "no limit");
    // A constrained shape follows the reasoning, which keeps its budget.
    const auto forced = plan(R"("reasoning":{"effort":"low"},"tools":[)" + k_tool + R"(],"tool_choice":"required")");
    BOOST_TEST(forced.open);
    BOOST_TEST(forced.budget == 2048);
    BOOST_TEST(plan(R"("reasoning":{"effort":"low"},"text":{"format":{"type":"json_object"}})").budget == 2048);
    BOOST_TEST(plan(R"("reasoning":{"effort":"low"},"tools":[)" + k_tool + "]").budget == 2048, "a strict tool");
}

BOOST_AUTO_TEST_CASE(previous_response_id_alone_is_enough) {
    const auto r = parse_ok(R"({"previous_response_id":"resp_1"})");
    BOOST_TEST(r.echo.previous_response_id == "resp_1");
    BOOST_TEST(r.input.empty());
    BOOST_TEST(!r.input_given);
}

BOOST_AUTO_TEST_SUITE_END()
