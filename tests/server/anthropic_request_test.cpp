// The Anthropic Messages parser: how every block maps onto the chat messages the DeepSeek template
// renders, what Claude Code sends (mid-conversation system turns, its billing header, deferred
// tools, adaptive thinking), and the 400s for what cannot be served, each naming its field.
#include "server/anthropic_request.h"

#include <boost/test/unit_test.hpp>
#include <string>

namespace moestream::test {
namespace {

using server::anthropic_body;
using server::anthropic_request;
using server::tool_choice;

server::parse_limits limits() {
    server::parse_limits l;
    l.vocab = 129280;
    return l;
}

anthropic_request parse_ok(const std::string& body, anthropic_body kind = anthropic_body::messages) {
    auto r = server::parse_anthropic_request(body, kind, limits());
    BOOST_TEST_REQUIRE(r.ok(), (r.ok() ? "" : r.error().message));
    return std::move(*r);
}

void expect_error(const std::string& body, std::string_view param, std::string_view message_part,
                  anthropic_body kind = anthropic_body::messages) {
    auto r = server::parse_anthropic_request(body, kind, limits());
    BOOST_TEST_REQUIRE(!r.ok(), body);
    BOOST_TEST(r.error().status == 400);
    BOOST_TEST(r.error().param == param, body << " -> param " << r.error().param);
    BOOST_TEST(r.error().message.find(message_part) != std::string::npos,
               body << " -> " << r.error().message);
}

// A request with `fields` added to a one-user-message body.
std::string with(const std::string& fields) {
    return R"({"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"Hi"}])" +
           (fields.empty() ? std::string() : "," + fields) + "}";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(anthropic_request_parsing)

BOOST_AUTO_TEST_CASE(minimal_request_and_defaults) {
    const auto r = parse_ok(with(""));
    const auto& c = r.completion;
    BOOST_TEST(c.model == "claude-x");
    BOOST_TEST(c.max_tokens == 64);
    BOOST_TEST(!c.stream);
    BOOST_TEST((c.route == server::api_route::chat_completions));
    BOOST_TEST(c.sampling.temperature == 1.0f);
    BOOST_TEST(c.sampling.top_k == 0);
    BOOST_TEST(c.cache_prompt);
    BOOST_TEST_REQUIRE(c.messages.size() == 1u);
    BOOST_TEST(c.messages[0].role == "user");
    BOOST_TEST(*c.messages[0].content == "Hi");
    BOOST_TEST(!r.options.open_reasoning);
    BOOST_TEST(r.options.assistant_prefix.empty());
    BOOST_TEST(r.display_thinking);
}

BOOST_AUTO_TEST_CASE(system_blocks_and_the_billing_header) {
    const auto r = parse_ok(R"({"max_tokens":8,"system":[
        {"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=sdk-cli; cch=4f2a1;"},
        {"type":"text","text":"You are an agent.","cache_control":{"type":"ephemeral"}},
        {"type":"text","text":"\nBe brief."}],
        "messages":[{"role":"user","content":"Hi"}]})");
    const auto& m = r.completion.messages;
    BOOST_TEST_REQUIRE(m.size() == 2u);
    BOOST_TEST(m[0].role == "system");
    BOOST_TEST(*m[0].content == "You are an agent.\nBe brief.");
    // Two requests that differ only in the header's value render the same prompt.
    const auto other = parse_ok(R"({"max_tokens":8,"system":[
        {"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.17; cch=00000;"},
        {"type":"text","text":"You are an agent."},{"type":"text","text":"\nBe brief."}],
        "messages":[{"role":"user","content":"Hi"}]})");
    BOOST_TEST(*other.completion.messages[0].content == *m[0].content);
    BOOST_TEST(*parse_ok(with(R"("system":"Plain")")).completion.messages[0].content == "Plain");
    expect_error(with(R"("system":[{"type":"image","source":{}}])"), "system[0].type", "text only");
    expect_error(with(R"("system":42)"), "system", "expected a string or an array of text blocks");
}

BOOST_AUTO_TEST_CASE(content_blocks_map_onto_chat_messages) {
    const auto r = parse_ok(R"({"max_tokens":8,"messages":[
        {"role":"user","content":[{"type":"text","text":"<reminder>\n"},{"type":"text","text":"List files"}]},
        {"role":"system","content":"# Environment"},
        {"role":"assistant","content":[
            {"type":"thinking","thinking":"I should run ls","signature":"sig"},
            {"type":"text","text":"Let me look."},
            {"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}},
            {"type":"tool_use","id":"toolu_2","name":"Read","input":{"file_path":"a.txt"}}]},
        {"role":"user","content":[
            {"type":"tool_result","tool_use_id":"toolu_1","content":"a.txt"},
            {"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"no such file"}],"is_error":true},
            {"type":"text","text":"Go on"}]}]})");
    const auto& m = r.completion.messages;
    BOOST_TEST_REQUIRE(m.size() == 7u);
    BOOST_TEST(m[0].role == "user");
    BOOST_TEST(*m[0].content == "<reminder>\nList files");
    BOOST_TEST(m[1].role == "system");
    // The assistant turn's text and its calls become two turns (the template renders the calls
    // of a content-less turn only); its thinking is not rendered.
    BOOST_TEST(m[2].role == "assistant");
    BOOST_TEST(*m[2].content == "Let me look.");
    BOOST_TEST(m[3].role == "assistant");
    BOOST_TEST(!m[3].content.has_value());
    BOOST_TEST_REQUIRE(m[3].tool_calls.size() == 2u);
    BOOST_TEST(m[3].tool_calls[0].name == "Bash");
    BOOST_TEST(m[3].tool_calls[0].arguments == R"({"command":"ls"})");
    BOOST_TEST(m[4].role == "tool");
    BOOST_TEST(*m[4].content == "a.txt");
    BOOST_TEST(m[5].role == "tool");
    BOOST_TEST(*m[5].content == "Error: no such file");
    BOOST_TEST(m[6].role == "user");
    BOOST_TEST(*m[6].content == "Go on");
}

BOOST_AUTO_TEST_CASE(tool_results_must_answer_the_previous_tool_use) {
    const std::string use =
        R"({"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}]})";
    parse_ok(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},)" + use +
             R"(,{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]})");
    // A system turn in between does not break the pairing.
    parse_ok(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},)" + use +
        R"(,{"role":"system","content":"note"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]})");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},)" + use +
            R"(,{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9","content":"?"}]}]})",
        "messages[2].content[0].tool_use_id", "unexpected tool_use_id \"toolu_9\"");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]})",
        "messages[0].content[0].tool_use_id", "unexpected tool_use_id");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},)" + use +
            R"(,{"role":"user","content":"no results"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]})",
        "messages[3].content[0].tool_use_id", "unexpected tool_use_id");
}

BOOST_AUTO_TEST_CASE(blocks_in_the_wrong_place_or_unsupported) {
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64"}}]}]})",
        "messages[0].content[0].type", "image content is not supported");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]})",
        "messages[0].content[0].type", "text only");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]})",
        "messages[0].content[0].type", "tool_use blocks belong in assistant messages");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]},{"role":"user","content":"y"}]})",
        "messages[1].content[0].type", "tool_result blocks belong in user messages");
    expect_error(R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"server_tool_use"}]}]})",
                 "messages[0].content[0].type", "unsupported content block type \"server_tool_use\"");
    expect_error(R"({"max_tokens":8,"messages":[{"role":"user","content":[{"text":"no type"}]}]})",
                 "messages[0].content[0].type", "required");
    expect_error(R"({"max_tokens":8,"messages":[{"role":"user","content":[]}]})", "messages[0].content",
                 "must not be empty");
    expect_error(R"({"max_tokens":8,"messages":[{"role":"robot","content":"x"}]})", "messages[0].role",
                 "unknown role");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":"ls"}]},{"role":"user","content":"y"}]})",
        "messages[1].content[0].input", "expected an object");
    expect_error(R"({"max_tokens":8,"messages":[]})", "messages", "must not be empty");
    expect_error(R"({"max_tokens":8,"messages":[{"role":"system","content":"only a system turn"}]})",
                 "messages", "needs a user message");
    expect_error(R"({"max_tokens":8})", "messages", "required");
}

BOOST_AUTO_TEST_CASE(a_final_assistant_message_starts_the_reply) {
    const auto r = parse_ok(R"({"max_tokens":8,"messages":[{"role":"user","content":"Name a colour"},
        {"role":"assistant","content":"The colour is"}]})");
    BOOST_TEST(r.completion.messages.size() == 1u);
    BOOST_TEST(r.options.assistant_prefix == "The colour is");
    expect_error(
        R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]})",
        "messages[1].content", "may only hold text");
}

BOOST_AUTO_TEST_CASE(tools_and_tool_choice) {
    const std::string tools = R"("tools":[
        {"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"cache_control":{"type":"ephemeral"}},
        {"name":"mcp__files__read_file","input_schema":{"type":"object"},"strict":true},
        {"name":"Later","input_schema":{"type":"object"},"defer_loading":true},
        {"type":"web_search_20250305","name":"web_search","max_uses":3}])";
    auto r = parse_ok(with(tools));
    auto& c = r.completion;
    // The server tool is skipped, the deferred one is not shown to the model.
    BOOST_TEST_REQUIRE(c.tools.size() == 2u);
    BOOST_TEST(c.tools[0].name == "get_weather");
    BOOST_TEST(c.tools[0].description == "Weather");
    BOOST_TEST(c.tools[0].parameters_json ==
               R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
    BOOST_TEST(c.tools[0].schema_param == "tools[0].input_schema");
    BOOST_TEST(!c.tools[0].strict);
    BOOST_TEST(c.tools[1].strict);
    BOOST_TEST(c.choice.kind == tool_choice::auto_);
    BOOST_TEST(c.parallel_tool_calls);

    BOOST_TEST(parse_ok(with(tools + R"(,"tool_choice":{"type":"any"})")).completion.choice.kind ==
               tool_choice::required);
    BOOST_TEST(parse_ok(with(tools + R"(,"tool_choice":{"type":"none"})")).completion.choice.kind ==
               tool_choice::none);
    const auto named = parse_ok(with(
        tools + R"(,"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true})"));
    BOOST_TEST(named.completion.choice.kind == tool_choice::function);
    BOOST_TEST(named.completion.choice.function_name == "get_weather");
    BOOST_TEST(!named.completion.parallel_tool_calls);
    BOOST_TEST(!parse_ok(with(tools + R"(,"tool_choice":{"type":"auto","disable_parallel_tool_use":true})"))
                    .completion.parallel_tool_calls);
    // Naming a deferred tool brings it in.
    const auto deferred = parse_ok(with(tools + R"(,"tool_choice":{"type":"tool","name":"Later"})"));
    BOOST_TEST(deferred.completion.tools.size() == 3u);

    expect_error(with(tools + R"(,"tool_choice":{"type":"tool","name":"nope"})"), "tool_choice.name",
                 "no tool named \"nope\"");
    expect_error(with(tools + R"(,"tool_choice":{"type":"tool","name":"web_search"})"), "tool_choice.name",
                 "no tool named");
    expect_error(with(tools + R"(,"tool_choice":{"type":"tool"})"), "tool_choice.name", "required");
    expect_error(with(R"("tool_choice":{"type":"any"})"), "tool_choice.type", "needs a non-empty tools list");
    expect_error(with(tools + R"(,"tool_choice":{"type":"required"})"), "tool_choice.type",
                 "expected \"auto\", \"any\"");
    expect_error(with(tools + R"(,"tool_choice":"auto")"), "tool_choice", "expected an object");
    expect_error(with(R"("tools":[{"name":"a"}])"), "tools[0].input_schema", "required");
    expect_error(with(R"("tools":[{"name":"a","input_schema":"{}"}])"), "tools[0].input_schema",
                 "expected a JSON schema object");
    expect_error(with(R"("tools":[{"name":"has space","input_schema":{}}])"), "tools[0].name",
                 "must be 1 to 128 characters");
    expect_error(with(R"("tools":[{"name":"a","input_schema":{}},{"name":"a","input_schema":{}}])"),
                 "tools[1].name", "duplicate tool name");
}

BOOST_AUTO_TEST_CASE(generation_fields) {
    const auto r =
        parse_ok(with(R"("stop_sequences":["\n\nHuman:","END",""],"temperature":0.5,"top_p":0.9,"top_k":40,
        "metadata":{"user_id":"u-1"},"stream":true,"context_management":{"edits":[]},"output_config":{"effort":"high"})"));
    const auto& c = r.completion;
    BOOST_TEST(c.stop.size() == 2u);
    BOOST_TEST(c.stop[1] == "END");
    BOOST_TEST(c.sampling.temperature == 0.5f);
    BOOST_TEST(c.sampling.top_p == 0.9f);
    BOOST_TEST(c.sampling.top_k == 40);
    BOOST_TEST(c.stream);
    // A huge max_tokens is a cap (the job clamps it to the context), not an error.
    BOOST_TEST(parse_ok(R"({"max_tokens":9000000000,"messages":[{"role":"user","content":"x"}]})")
                   .completion.max_tokens == 9000000000);

    expect_error(R"({"messages":[{"role":"user","content":"x"}]})", "max_tokens", "required");
    expect_error(R"({"max_tokens":0,"messages":[{"role":"user","content":"x"}]})", "max_tokens",
                 "must be >= 1");
    expect_error(with(R"("temperature":1.5)"), "temperature", "must be in [0, 1]");
    expect_error(with(R"("top_p":0)"), "top_p", "must be in (0, 1]");
    expect_error(with(R"("top_k":-1)"), "top_k", "must be in [0, 2147483647]");
    expect_error(with(R"("stop_sequences":"END")"), "stop_sequences", "expected an array of strings");
    expect_error(with(R"("stop_sequences":[1])"), "stop_sequences[0]", "expected a string");
    expect_error(with(R"("metadata":"u")"), "metadata", "expected an object");
    expect_error(with(R"("mcp_servers":[{"type":"url","url":"http://x"}])"), "mcp_servers",
                 "does not connect to MCP");
    // count_tokens takes the same body without max_tokens.
    parse_ok(R"({"messages":[{"role":"user","content":"x"}]})", anthropic_body::count_tokens);
}

BOOST_AUTO_TEST_CASE(thinking) {
    const auto enabled = parse_ok(with(R"("thinking":{"type":"enabled","budget_tokens":32})"));
    BOOST_TEST(enabled.options.open_reasoning);
    BOOST_TEST(enabled.options.reasoning_budget == 32);
    const auto adaptive = parse_ok(with(R"("thinking":{"type":"adaptive","display":"omitted"})"));
    BOOST_TEST(!adaptive.options.open_reasoning);
    BOOST_TEST(!adaptive.display_thinking);
    BOOST_TEST(!parse_ok(with(R"("thinking":{"type":"disabled"})")).options.open_reasoning);

    expect_error(with(R"("thinking":{"type":"enabled"})"), "thinking.budget_tokens", "required");
    expect_error(with(R"("thinking":{"type":"enabled","budget_tokens":64})"), "thinking.budget_tokens",
                 "must be less than max_tokens (64)");
    expect_error(with(R"("thinking":{"type":"enabled","budget_tokens":0})"), "thinking.budget_tokens",
                 "must be >= 1");
    expect_error(with(R"("thinking":{"type":"on"})"), "thinking.type", "expected \"enabled\"");
    expect_error(
        with(
            R"("thinking":{"type":"enabled","budget_tokens":8},"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"any"})"),
        "thinking", "thinking may not be enabled when tool_choice forces tool use");
    expect_error(
        R"({"max_tokens":64,"thinking":{"type":"enabled","budget_tokens":8},"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"Sure"}]})",
        "messages", "prefill");
}

BOOST_AUTO_TEST_CASE(malformed_bodies) {
    expect_error(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"})", "messages",
                 "truncated JSON");
    expect_error("", "", "empty");
    expect_error("[]", "", "must be a JSON object");
    expect_error(R"({"max_tokens":"8","messages":[{"role":"user","content":"x"}]})", "max_tokens",
                 "expected an integer");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
