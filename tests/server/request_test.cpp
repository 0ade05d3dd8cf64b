#include "server/request.h"

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "server/request_fields.h"

using namespace moestream;
using namespace moestream::server;

namespace {

constexpr auto k_chat = api_route::chat_completions;
constexpr auto k_cmpl = api_route::completions;
constexpr auto k_native = api_route::native_completion;
constexpr auto k_infill = api_route::infill;

const std::string k_user_hi = R"("messages":[{"role":"user","content":"hi"}])";

// A chat body: the one-message conversation plus `extra` members ("" for none).
std::string chat_body(const std::string& extra = "") {
    return "{" + k_user_hi + (extra.empty() ? "" : "," + extra) + "}";
}

// The body a route needs at minimum, plus `extra` members.
std::string body_for(api_route route, const std::string& extra = "") {
    switch (route) {
        case api_route::chat_completions: return chat_body(extra);
        case api_route::completions:
        case api_route::native_completion: return R"({"prompt":"p")" + (extra.empty() ? "" : "," + extra) + "}";
        case api_route::infill: return "{" + extra + "}";
    }
    return "";
}

completion_request parse_ok(const std::string& body, api_route route = k_chat, parse_limits limits = {}) {
    auto r = parse_completion_request(body, route, limits);
    if (!r.ok()) BOOST_FAIL("unexpected error for " << body << ": " << r.error().message << " (param " << r.error().param << ")");
    // Everything accepted must pass the sampler's own validation.
    const status st = r->sampling.validate(limits.vocab > 0 ? limits.vocab : 1 << 20);
    if (!st.ok()) BOOST_FAIL("accepted sampling parameters fail validation: " << st.message());
    return std::move(r).value();
}

// Checks that `body` is refused with a 400 naming `param`, whose message contains `fragment`.
void expect_error(const std::string& body, api_route route, const std::string& param, const std::string& fragment,
                  parse_limits limits = {}) {
    auto r = parse_completion_request(body, route, limits);
    if (r.ok()) BOOST_FAIL("accepted but expected an error on " << param << ": " << body);
    const api_error& e = r.error();
    BOOST_TEST(e.status == 400, body);
    BOOST_TEST(e.type == "invalid_request_error", body);
    BOOST_TEST(e.param == param, body << " -> message: " << e.message);
    BOOST_TEST(e.message.find(fragment) != std::string::npos,
               body << " -> message '" << e.message << "' lacks '" << fragment << "'");
}

void expect_chat_error(const std::string& extra, const std::string& param, const std::string& fragment) {
    expect_error(chat_body(extra), k_chat, param, fragment);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(request_suite)

// ---------------------------------------------------------------- defaults

BOOST_AUTO_TEST_CASE(defaults_on_openai_routes) {
    for (api_route route : {k_chat, k_cmpl}) {
        const completion_request r = parse_ok(body_for(route), route);
        BOOST_TEST((r.route == route));
        BOOST_TEST(r.model.empty());
        BOOST_TEST(r.sampling.temperature == 1.0f);
        BOOST_TEST(r.sampling.top_k == 0);
        BOOST_TEST(r.sampling.top_p == 1.0f);
        BOOST_TEST(r.sampling.min_p == 0.0f);
        BOOST_TEST(r.sampling.presence_penalty == 0.0f);
        BOOST_TEST(r.sampling.frequency_penalty == 0.0f);
        BOOST_TEST(r.sampling.repeat_penalty == 1.0f);
        BOOST_TEST(r.sampling.repeat_last_n == 64);
        BOOST_TEST(r.sampling.logit_bias.empty());
        BOOST_TEST(r.sampling.n_probs == 0);
        BOOST_TEST(!r.seed_given);
        BOOST_TEST(r.max_tokens == -1);
        BOOST_TEST(!r.stream);
        BOOST_TEST(!r.include_usage);
        BOOST_TEST(r.stop.empty());
        BOOST_TEST(!r.ignore_eos);
        BOOST_TEST(!r.echo);
        BOOST_TEST(r.n_probs == 0);
        BOOST_TEST(!r.logprobs_enabled);
        BOOST_TEST(r.cache_prompt);
        BOOST_TEST(r.return_timings);
        BOOST_TEST(!r.reasoning_in_content);
        BOOST_TEST(r.enable_thinking);
        BOOST_TEST(r.n == 1);
        BOOST_TEST(r.parallel_tool_calls);
        BOOST_TEST(r.choice.kind == tool_choice::auto_);
        BOOST_TEST(r.tools.empty());
        BOOST_TEST(r.suffix.empty());
    }
}

BOOST_AUTO_TEST_CASE(defaults_on_native_routes) {
    for (api_route route : {k_native, k_infill}) {
        const completion_request r = parse_ok(body_for(route), route);
        BOOST_TEST(r.sampling.temperature == 0.8f);
        BOOST_TEST(r.sampling.top_k == 40);
        BOOST_TEST(r.sampling.top_p == 0.95f);
        BOOST_TEST(r.sampling.min_p == 0.05f);
        BOOST_TEST(r.max_tokens == -1);
        BOOST_TEST(r.cache_prompt);
    }
    const sampling_params s = default_sampling(k_native);
    BOOST_TEST(s.temperature == 0.8f);
    BOOST_TEST(default_sampling(k_cmpl).temperature == 1.0f);
}

// ---------------------------------------------------------------- every field

BOOST_AUTO_TEST_CASE(every_chat_field) {
    const completion_request r = parse_ok(R"({
        "model": "deepseek-v4.1", "stream": true, "stream_options": {"include_usage": true},
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "reasoning_content": "thought", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"function": {"name": "f2", "arguments": {"x": [1, 2]}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "done", "reasoning": "r"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                  {"type": "function", "function": {"name": "f2"}}],
        "tool_choice": {"type": "function", "function": {"name": "f2"}},
        "parallel_tool_calls": false,
        "max_completion_tokens": 77, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1, "repeat_last_n": 128,
        "seed": 42, "stop": ["</s>", "\n\n"], "ignore_eos": true, "logprobs": true, "top_logprobs": 5,
        "cache_prompt": false, "return_timings": false, "logit_bias": {"10": -100, "11": 2.5},
        "reasoning_format": "none", "chat_template_kwargs": {"enable_thinking": false}, "n": 1
    })");
    BOOST_TEST(r.model == "deepseek-v4.1");
    BOOST_TEST(r.stream);
    BOOST_TEST(r.include_usage);
    BOOST_TEST_REQUIRE(r.messages.size() == 6u);
    BOOST_TEST(r.messages[0].role == "system");  // developer -> system
    BOOST_TEST(*r.messages[0].content == "be brief");
    BOOST_TEST(r.messages[1].role == "system");
    BOOST_TEST(*r.messages[2].content == "ab");
    BOOST_TEST(!r.messages[3].content.has_value());
    BOOST_TEST_REQUIRE(r.messages[3].tool_calls.size() == 2u);
    BOOST_TEST(r.messages[3].tool_calls[0].type == "function");
    BOOST_TEST(r.messages[3].tool_calls[0].name == "get_weather");
    BOOST_TEST(r.messages[3].tool_calls[0].arguments == R"({"city":"Paris"})");
    BOOST_TEST(r.messages[3].tool_calls[1].name == "f2");
    BOOST_TEST(r.messages[3].tool_calls[1].arguments == R"({"x":[1,2]})");  // an object, serialised
    BOOST_TEST(r.messages[4].role == "tool");
    BOOST_TEST(*r.messages[4].content == "sunny");
    BOOST_TEST(*r.messages[5].content == "done");
    BOOST_TEST_REQUIRE(r.tools.size() == 2u);
    BOOST_TEST(r.tools[0].name == "get_weather");
    BOOST_TEST(r.tools[0].description == "weather");
    BOOST_TEST(r.tools[0].parameters_json == R"({"type":"object","properties":{"city":{"type":"string"}}})");
    BOOST_TEST(r.tools[1].description.empty());
    BOOST_TEST(r.tools[1].parameters_json == "{}");
    BOOST_TEST(r.choice.kind == tool_choice::function);
    BOOST_TEST(r.choice.function_name == "f2");
    BOOST_TEST(!r.parallel_tool_calls);
    BOOST_TEST(r.max_tokens == 77);
    BOOST_TEST(r.sampling.temperature == 0.5f);
    BOOST_TEST(r.sampling.top_p == 0.9f);
    BOOST_TEST(r.sampling.top_k == 20);
    BOOST_TEST(r.sampling.min_p == 0.1f);
    BOOST_TEST(r.sampling.presence_penalty == 0.5f);
    BOOST_TEST(r.sampling.frequency_penalty == -0.5f);
    BOOST_TEST(r.sampling.repeat_penalty == 1.1f);
    BOOST_TEST(r.sampling.repeat_last_n == 128);
    BOOST_TEST(r.seed_given);
    BOOST_TEST(r.sampling.seed == 42u);
    BOOST_TEST((r.stop == std::vector<std::string>{"</s>", "\n\n"}));
    BOOST_TEST(r.ignore_eos);
    BOOST_TEST(r.logprobs_enabled);
    BOOST_TEST(r.n_probs == 5);
    BOOST_TEST(r.sampling.n_probs == 5);
    BOOST_TEST(!r.cache_prompt);
    BOOST_TEST(!r.return_timings);
    BOOST_TEST_REQUIRE(r.sampling.logit_bias.size() == 2u);
    BOOST_TEST(r.sampling.logit_bias[0].token == 10);
    BOOST_TEST(r.sampling.logit_bias[0].bias == -100.0f);
    BOOST_TEST(r.sampling.logit_bias[1].token == 11);
    BOOST_TEST(r.sampling.logit_bias[1].bias == 2.5f);
    BOOST_TEST(r.reasoning_in_content);
    BOOST_TEST(!r.enable_thinking);
    BOOST_TEST(r.n == 1);
}

BOOST_AUTO_TEST_CASE(every_completions_field) {
    const completion_request r = parse_ok(R"({"model":"m","prompt":"Once upon","echo":true,"suffix":"end",
        "logprobs":3,"max_tokens":16,"stop":"\n","stream":true,"stream_options":{"include_usage":false},
        "seed":7,"temperature":0,"n":1})",
                                          k_cmpl);
    BOOST_TEST(r.model == "m");
    BOOST_TEST(r.prompt_text.value() == "Once upon");
    BOOST_TEST(r.prompt_tokens.empty());
    BOOST_TEST(r.echo);
    BOOST_TEST(r.suffix == "end");
    BOOST_TEST(r.logprobs_enabled);
    BOOST_TEST(r.n_probs == 3);
    BOOST_TEST(r.sampling.n_probs == 3);
    BOOST_TEST(r.max_tokens == 16);
    BOOST_TEST((r.stop == std::vector<std::string>{"\n"}));
    BOOST_TEST(r.stream);
    BOOST_TEST(!r.include_usage);
    BOOST_TEST(r.sampling.seed == 7u);
    BOOST_TEST(r.sampling.temperature == 0.0f);
    // logprobs 0: the chosen tokens' log-probabilities, no alternatives.
    const completion_request z = parse_ok(R"({"prompt":"x","logprobs":0})", k_cmpl);
    BOOST_TEST(z.logprobs_enabled);
    BOOST_TEST(z.n_probs == 0);
}

BOOST_AUTO_TEST_CASE(every_native_field) {
    const completion_request r = parse_ok(R"({"prompt":[1,2,3],"n_predict":-1,"n_probs":4,"cache_prompt":false,
        "stop":["a"],"ignore_eos":true,"temperature":50,"top_k":-1,"top_p":1,"min_p":0,"repeat_penalty":1.3,
        "repeat_last_n":-1,"presence_penalty":2,"frequency_penalty":-2,"seed":-1,"logit_bias":[[5,-1.5],[6,false]],
        "stream":true,"max_tokens":9})",
                                          k_native);
    BOOST_TEST((r.prompt_tokens == std::vector<int32_t>{1, 2, 3}));
    BOOST_TEST(!r.prompt_text.has_value());
    BOOST_TEST(r.max_tokens == -1);  // n_predict wins over max_tokens
    BOOST_TEST(r.n_probs == 4);
    BOOST_TEST(r.logprobs_enabled);
    BOOST_TEST(!r.cache_prompt);
    BOOST_TEST(r.ignore_eos);
    BOOST_TEST(r.sampling.temperature == 50.0f);  // the native range goes up to 100
    BOOST_TEST(r.sampling.top_k == 0);            // -1 = off
    BOOST_TEST(r.sampling.repeat_penalty == 1.3f);
    BOOST_TEST(r.sampling.repeat_last_n == -1);
    BOOST_TEST(r.sampling.presence_penalty == 2.0f);
    BOOST_TEST(r.sampling.frequency_penalty == -2.0f);
    BOOST_TEST(!r.seed_given);  // -1 = drawn by the server
    BOOST_TEST_REQUIRE(r.sampling.logit_bias.size() == 2u);
    BOOST_TEST(r.sampling.logit_bias[0].token == 5);
    BOOST_TEST(r.sampling.logit_bias[0].bias == -1.5f);
    BOOST_TEST(r.sampling.logit_bias[1].token == 6);
    BOOST_TEST(std::isinf(r.sampling.logit_bias[1].bias));
    BOOST_TEST(r.sampling.logit_bias[1].bias < 0.0f);
    BOOST_TEST(!r.include_usage);  // no stream_options
}

BOOST_AUTO_TEST_CASE(every_infill_field) {
    const completion_request r = parse_ok(R"({"input_prefix":"def f(","input_suffix":"):\n  return 1",
        "input_extra":[{"filename":"a.py","text":"import os"},{"text":"x = 1"}],"prompt":"  x","n_predict":32,
        "t_max_prompt_ms":500})",
                                          k_infill);
    BOOST_TEST(r.infill_prefix == "def f(");
    BOOST_TEST(r.suffix == "):\n  return 1");
    BOOST_TEST_REQUIRE(r.infill_extra.size() == 2u);
    BOOST_TEST(r.infill_extra[0].first == "a.py");
    BOOST_TEST(r.infill_extra[0].second == "import os");
    BOOST_TEST(r.infill_extra[1].first.empty());
    BOOST_TEST(r.infill_extra[1].second == "x = 1");
    BOOST_TEST(r.prompt_text.value() == "  x");
    BOOST_TEST(r.max_tokens == 32);
    // Everything is optional on /infill.
    const completion_request empty = parse_ok("{}", k_infill);
    BOOST_TEST(empty.infill_prefix.empty());
    BOOST_TEST(!empty.prompt_text.has_value());
    BOOST_TEST(empty.prompt_tokens.empty());
    expect_error(R"({"input_extra":[{"filename":"a"}]})", k_infill, "input_extra[0].text", "required");
    expect_error(R"({"input_extra":{"text":"a"}})", k_infill, "input_extra", "expected an array");
    expect_error(R"({"input_extra":["a"]})", k_infill, "input_extra[0]", "expected an object");
    expect_error(R"({"input_prefix":5})", k_infill, "input_prefix", "input_prefix: expected a string, got number");
    parse_limits small;
    small.max_input_extra = 1;
    expect_error(R"({"input_extra":[{"text":"a"},{"text":"b"}]})", k_infill, "input_extra", "at most 1", small);
}

// ---------------------------------------------------------------- lengths and aliases

BOOST_AUTO_TEST_CASE(max_tokens_precedence) {
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":5)")).max_tokens == 5);
    BOOST_TEST(parse_ok(chat_body(R"("max_completion_tokens":6)")).max_tokens == 6);
    BOOST_TEST(parse_ok(chat_body(R"("n_predict":7)")).max_tokens == 7);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":5,"max_completion_tokens":6)")).max_tokens == 6);
    BOOST_TEST(parse_ok(chat_body(R"("max_completion_tokens":6,"max_tokens":5)")).max_tokens == 6);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":5,"max_completion_tokens":6,"n_predict":7)")).max_tokens == 7);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":5,"n_predict":-1)")).max_tokens == -1);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":0)")).max_tokens == 0);
    // null is absent: the next alias applies.
    BOOST_TEST(parse_ok(chat_body(R"("n_predict":null,"max_tokens":5)")).max_tokens == 5);
    // An overridden alias is still validated.
    expect_chat_error(R"("n_predict":7,"max_tokens":-5)", "max_tokens", "must be >= 0");
    expect_chat_error(R"("max_tokens":-1)", "max_tokens", "max_tokens: must be >= 0, got -1");
    expect_chat_error(R"("max_completion_tokens":-1)", "max_completion_tokens", "must be >= 0");
    expect_chat_error(R"("n_predict":-2)", "n_predict", "n_predict: must be >= -1, got -2");
}

BOOST_AUTO_TEST_CASE(repetition_penalty_alias) {
    BOOST_TEST(parse_ok(chat_body(R"("repetition_penalty":1.2)")).sampling.repeat_penalty == 1.2f);
    BOOST_TEST(parse_ok(chat_body(R"("repetition_penalty":1.2,"repeat_penalty":1.5)")).sampling.repeat_penalty ==
               1.5f);
    BOOST_TEST(parse_ok(chat_body(R"("repeat_penalty":1.5,"repetition_penalty":1.2)")).sampling.repeat_penalty ==
               1.5f);
    expect_chat_error(R"("repetition_penalty":0)", "repetition_penalty", "must be > 0");
}

// llama-server's per-request speculation cap, a flat key with a dot, on every route.
BOOST_AUTO_TEST_CASE(speculative_n_max) {
    for (auto route : {k_chat, k_cmpl, k_native, k_infill}) {
        BOOST_TEST(parse_ok(body_for(route), route).spec_n_max == -1);
        BOOST_TEST(parse_ok(body_for(route, R"("speculative.n_max":0)"), route).spec_n_max == 0);
        BOOST_TEST(parse_ok(body_for(route, R"("speculative.n_max":3)"), route).spec_n_max == 3);
        BOOST_TEST(parse_ok(body_for(route, R"("speculative.n_max":null)"), route).spec_n_max == -1);
    }
    expect_chat_error(R"("speculative.n_max":-1)", "speculative.n_max", "must be in [0, 2147483647], got -1");
    expect_chat_error(R"("speculative.n_max":"2")", "speculative.n_max", "expected an integer");
    // The nested form is not llama-server's: ignored like any unknown field.
    BOOST_TEST(parse_ok(chat_body(R"("speculative":{"n_max":0})")).spec_n_max == -1);
}

BOOST_AUTO_TEST_CASE(n_and_n_cmpl) {
    BOOST_TEST(parse_ok(chat_body(R"("n":1,"n_cmpl":1)")).n == 1);
    expect_chat_error(R"("n":2)", "n", "only one choice");
    expect_chat_error(R"("n":0)", "n", "only one choice");
    expect_chat_error(R"("n_cmpl":3)", "n_cmpl", "only one choice");
    expect_chat_error(R"("n":"1")", "n", "n: expected an integer, got string");
}

BOOST_AUTO_TEST_CASE(stream_options_only_with_stream) {
    BOOST_TEST(parse_ok(chat_body(R"("stream":true,"stream_options":{"include_usage":true})")).include_usage);
    BOOST_TEST(!parse_ok(chat_body(R"("stream":false,"stream_options":{"include_usage":true})")).include_usage);
    BOOST_TEST(!parse_ok(chat_body(R"("stream_options":{"include_usage":true})")).include_usage);
    BOOST_TEST(!parse_ok(chat_body(R"("stream":true,"stream_options":{})")).include_usage);
    BOOST_TEST(!parse_ok(chat_body(R"("stream":true,"stream_options":null)")).include_usage);
    expect_chat_error(R"("stream":true,"stream_options":{"include_usage":"yes"})", "stream_options.include_usage",
                      "stream_options.include_usage: expected a boolean, got string");
    expect_chat_error(R"("stream_options":true)", "stream_options", "expected an object, got boolean");
}

BOOST_AUTO_TEST_CASE(logprobs_per_route) {
    // chat: logprobs bool + top_logprobs
    auto r = parse_ok(chat_body(R"("logprobs":true)"));
    BOOST_TEST(r.logprobs_enabled);
    BOOST_TEST(r.n_probs == 0);
    r = parse_ok(chat_body(R"("logprobs":false,"top_logprobs":0)"));
    BOOST_TEST(!r.logprobs_enabled);
    expect_chat_error(R"("top_logprobs":3)", "top_logprobs", "needs \"logprobs\": true");
    expect_chat_error(R"("logprobs":true,"top_logprobs":21)", "top_logprobs", "must be in [0, 20], got 21");
    expect_chat_error(R"("logprobs":3)", "logprobs", "logprobs: expected a boolean, got number");
    // completions: an integer
    expect_error(R"({"prompt":"x","logprobs":true})", k_cmpl, "logprobs", "expected an integer, got boolean");
    expect_error(R"({"prompt":"x","logprobs":21})", k_cmpl, "logprobs", "must be in [0, 20]");
    expect_error(R"({"prompt":"x","logprobs":-1})", k_cmpl, "logprobs", "must be in [0, 20]");
    // native: n_probs; n_probs also wins on the OAI routes
    r = parse_ok(R"({"prompt":"x","n_probs":0})", k_native);
    BOOST_TEST(!r.logprobs_enabled);
    r = parse_ok(R"({"prompt":"x","logprobs":2,"n_probs":7})", k_cmpl);
    BOOST_TEST(r.n_probs == 7);
    BOOST_TEST(r.logprobs_enabled);
    r = parse_ok(chat_body(R"("n_probs":2)"));
    BOOST_TEST(r.n_probs == 2);
    BOOST_TEST(r.logprobs_enabled);
    BOOST_TEST(r.sampling.n_probs == 2);
    expect_error(R"({"prompt":"x","n_probs":21})", k_native, "n_probs", "must be in [0, 20]");
    // On the native route "logprobs" is not a known field: ignored whatever its type.
    BOOST_TEST(!parse_ok(R"({"prompt":"x","logprobs":"whatever"})", k_native).logprobs_enabled);
}

BOOST_AUTO_TEST_CASE(reasoning_options) {
    BOOST_TEST(!parse_ok(chat_body(R"("reasoning_format":"auto")")).reasoning_in_content);
    BOOST_TEST(!parse_ok(chat_body(R"("reasoning_format":"deepseek")")).reasoning_in_content);
    BOOST_TEST(parse_ok(chat_body(R"("reasoning_format":"none")")).reasoning_in_content);
    expect_chat_error(R"("reasoning_format":"xml")", "reasoning_format", "expected \"none\"");
    expect_chat_error(R"("reasoning_format":1)", "reasoning_format", "expected a string, got number");
    BOOST_TEST(!parse_ok(chat_body(R"("chat_template_kwargs":{"thinking":false})")).enable_thinking);
    BOOST_TEST(parse_ok(chat_body(R"("chat_template_kwargs":{"thinking":false,"enable_thinking":true})")).enable_thinking);
    BOOST_TEST(parse_ok(chat_body(R"("chat_template_kwargs":{"other":1})")).enable_thinking);
    expect_chat_error(R"("chat_template_kwargs":{"enable_thinking":"no"})", "chat_template_kwargs.enable_thinking",
                      "expected a boolean, got string");
    expect_chat_error(R"("chat_template_kwargs":[])", "chat_template_kwargs", "expected an object, got array");
}

// ---------------------------------------------------------------- null, unknown fields, numbers

BOOST_AUTO_TEST_CASE(null_means_default) {
    const std::string nulls =
        R"("model":null,"stream":null,"stream_options":null,"max_tokens":null,"max_completion_tokens":null,
        "n_predict":null,"temperature":null,"top_p":null,"top_k":null,"min_p":null,"presence_penalty":null,
        "frequency_penalty":null,"repeat_penalty":null,"repetition_penalty":null,"repeat_last_n":null,"seed":null,
        "stop":null,"ignore_eos":null,"logprobs":null,"top_logprobs":null,"n_probs":null,"cache_prompt":null,
        "logit_bias":null,"tools":null,"tool_choice":null,"parallel_tool_calls":null,"reasoning_format":null,
        "chat_template_kwargs":null,"n":null,"n_cmpl":null,"return_timings":null,"echo":null,"suffix":null)";
    const completion_request r = parse_ok(chat_body(nulls));
    const completion_request d = parse_ok(chat_body());
    BOOST_TEST(r.model == d.model);
    BOOST_TEST(r.stream == d.stream);
    BOOST_TEST(r.max_tokens == d.max_tokens);
    BOOST_TEST(r.sampling.temperature == d.sampling.temperature);
    BOOST_TEST(r.sampling.top_p == d.sampling.top_p);
    BOOST_TEST(r.sampling.top_k == d.sampling.top_k);
    BOOST_TEST(r.sampling.repeat_penalty == d.sampling.repeat_penalty);
    BOOST_TEST(r.seed_given == d.seed_given);
    BOOST_TEST(r.stop.empty());
    BOOST_TEST(r.cache_prompt);
    BOOST_TEST(r.parallel_tool_calls);
    BOOST_TEST(r.return_timings);
    BOOST_TEST(r.enable_thinking);
    BOOST_TEST(r.choice.kind == tool_choice::auto_);
    BOOST_TEST(r.sampling.logit_bias.empty());
    const completion_request c = parse_ok(R"({"prompt":"x","echo":null,"suffix":null,"logprobs":null})", k_cmpl);
    BOOST_TEST(!c.echo);
    BOOST_TEST(!c.logprobs_enabled);
    // A null message content is a missing content: required for a user.
    expect_error(R"({"messages":[{"role":"user","content":null}]})", k_chat, "messages[0].content", "required");
    // vLLM's benchmark client sends these.
    parse_ok(R"({"prompt":"x","logprobs":null,"ignore_eos":true,"repetition_penalty":1.0,"max_tokens":10})", k_cmpl);
}

BOOST_AUTO_TEST_CASE(unknown_fields_are_ignored) {
    const completion_request r = parse_ok(chat_body(
        R"("user":"u1","metadata":{"a":[1,{"b":null}]},"store":false,"response_format":{"type":"text"},
        "typical_p":"not even a number","mirostat":2,"dry_multiplier":0.5,"samplers":["top_k"],"id_slot":-1,
        "x-custom":[[[]]],"temperature":0.25)"));
    BOOST_TEST(r.sampling.temperature == 0.25f);
    // Unknown members of known objects too.
    parse_ok(chat_body(R"("stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true})"));
    parse_ok(R"({"messages":[{"role":"user","content":"hi","name":"bob","extra":{}}]})");
    parse_ok(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"x"}}]}]})");
}

BOOST_AUTO_TEST_CASE(integers_and_decimals) {
    BOOST_TEST(parse_ok(chat_body(R"("temperature":1)")).sampling.temperature == 1.0f);
    BOOST_TEST(parse_ok(chat_body(R"("temperature":1.0)")).sampling.temperature == 1.0f);
    BOOST_TEST(parse_ok(chat_body(R"("temperature":2e-1)")).sampling.temperature == 0.2f);
    BOOST_TEST(parse_ok(chat_body(R"("top_p":1)")).sampling.top_p == 1.0f);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":100.0)")).max_tokens == 100);
    BOOST_TEST(parse_ok(chat_body(R"("max_tokens":1e2)")).max_tokens == 100);
    BOOST_TEST(parse_ok(chat_body(R"("top_k":40.0)")).sampling.top_k == 40);
    BOOST_TEST(parse_ok(chat_body(R"("seed":5.0)")).sampling.seed == 5u);
    expect_chat_error(R"("max_tokens":1.5)", "max_tokens", "max_tokens: expected an integer, got 1.5");
    expect_chat_error(R"("top_k":0.5)", "top_k", "expected an integer");
    expect_chat_error(R"("seed":0.5)", "seed", "expected an integer");
}

BOOST_AUTO_TEST_CASE(big_numbers_are_errors_not_undefined_behaviour) {
    expect_chat_error(R"("temperature":1e300)", "temperature", "temperature: must be in [0, 2], got 1e+300");
    expect_chat_error(R"("temperature":-1e300)", "temperature", "must be in [0, 2]");
    expect_error(R"({"prompt":"x","repeat_penalty":1e300})", k_native, "repeat_penalty",
                 "must be > 0 and at most 3.4028234663852886e+38, got 1e+300");
    expect_chat_error(R"("max_tokens":1e300)", "max_tokens", "at most 2^53");
    expect_chat_error(R"("max_tokens":9223372036854775808)", "max_tokens", "at most 9223372036854775807");
    expect_chat_error(R"("top_k":2147483648)", "top_k", "must be in [-1, 2147483647]");
    expect_chat_error(R"("repeat_last_n":4294967296)", "repeat_last_n", "must be in [-1, 2147483647]");
    // Numbers no 64-bit type holds are refused by the JSON parser; the error still names the field.
    expect_chat_error(R"("max_tokens":1180591620717411303424)", "max_tokens", "out of the supported range");
    expect_chat_error(R"("temperature":1e400)", "temperature", "out of the supported range");
    expect_chat_error(R"("seed":-9223372036854775809)", "seed", "out of the supported range");
    // Underflow is fine (it reads as 0).
    BOOST_TEST(parse_ok(chat_body(R"("min_p":1e-400)")).sampling.min_p == 0.0f);
    // Seeds use the whole uint64 range.
    BOOST_TEST(parse_ok(chat_body(R"("seed":18446744073709551615)")).sampling.seed ==
               std::numeric_limits<uint64_t>::max());
    BOOST_TEST(parse_ok(chat_body(R"("seed":0)")).seed_given);
    expect_chat_error(R"("seed":18446744073709551616)", "seed", "out of the supported range");
    expect_chat_error(R"("seed":-2)", "seed", "seed: must be an integer >= 0, or -1");
    expect_chat_error(R"("seed":1e300)", "seed", "at most 2^53");
}

// ---------------------------------------------------------------- wrong types and ranges

BOOST_AUTO_TEST_CASE(wrong_types_name_the_field) {
    struct wrong {
        std::string member, param, message;
    };
    const wrong cases[] = {
        {R"("temperature":"0.5")", "temperature", "temperature: expected a number, got string"},
        {R"("top_p":true)", "top_p", "top_p: expected a number, got boolean"},
        {R"("top_k":[1])", "top_k", "top_k: expected an integer, got array"},
        {R"("min_p":{})", "min_p", "min_p: expected a number, got object"},
        {R"("presence_penalty":"x")", "presence_penalty", "expected a number"},
        {R"("frequency_penalty":"x")", "frequency_penalty", "expected a number"},
        {R"("repeat_penalty":"x")", "repeat_penalty", "expected a number"},
        {R"("repeat_last_n":"x")", "repeat_last_n", "expected an integer"},
        {R"("seed":"42")", "seed", "seed: expected an integer, got string"},
        {R"("max_tokens":"10")", "max_tokens", "max_tokens: expected an integer, got string"},
        {R"("max_completion_tokens":true)", "max_completion_tokens", "expected an integer, got boolean"},
        {R"("n_predict":[])", "n_predict", "expected an integer, got array"},
        {R"("stream":"true")", "stream", "stream: expected a boolean, got string"},
        {R"("stream":1)", "stream", "stream: expected a boolean, got number"},
        {R"("model":42)", "model", "model: expected a string, got number"},
        {R"("stop":5)", "stop", "stop: expected a string or an array of strings, got number"},
        {R"("stop":["a",5])", "stop[1]", "stop[1]: expected a string, got number"},
        {R"("ignore_eos":0)", "ignore_eos", "expected a boolean"},
        {R"("cache_prompt":"no")", "cache_prompt", "expected a boolean"},
        {R"("return_timings":1)", "return_timings", "expected a boolean"},
        {R"("parallel_tool_calls":"yes")", "parallel_tool_calls", "expected a boolean"},
        {R"("logit_bias":5)", "logit_bias", "expected an object or an array"},
        {R"("tools":{})", "tools", "tools: expected an array, got object"},
        {R"("tool_choice":5)", "tool_choice", "expected a string or an object, got number"},
        {R"("top_logprobs":"3")", "top_logprobs", "expected an integer"},
    };
    for (const auto& c : cases) expect_chat_error(c.member, c.param, c.message);
}

BOOST_AUTO_TEST_CASE(ranges_name_the_field) {
    struct bad {
        api_route route;
        std::string member, param, message;
    };
    const bad cases[] = {
        {k_chat, R"("temperature":2.5)", "temperature", "temperature: must be in [0, 2], got 2.5"},
        {k_cmpl, R"("temperature":-0.1)", "temperature", "must be in [0, 2]"},
        {k_native, R"("temperature":101)", "temperature", "temperature: must be in [0, 100], got 101"},
        {k_infill, R"("temperature":-1)", "temperature", "must be in [0, 100]"},
        {k_chat, R"("top_p":0)", "top_p", "top_p: must be in (0, 1], got 0"},
        {k_chat, R"("top_p":1.01)", "top_p", "(0, 1]"},
        {k_chat, R"("top_k":-2)", "top_k", "top_k: must be in [-1, 2147483647], got -2"},
        {k_chat, R"("min_p":-0.1)", "min_p", "min_p: must be in [0, 1]"},
        {k_chat, R"("min_p":1.5)", "min_p", "[0, 1]"},
        {k_chat, R"("presence_penalty":2.01)", "presence_penalty", "must be in [-2, 2]"},
        {k_chat, R"("frequency_penalty":-3)", "frequency_penalty", "must be in [-2, 2]"},
        {k_native, R"("repeat_penalty":0)", "repeat_penalty", "repeat_penalty: must be > 0 and at most 3.4028234663852886e+38, got 0"},
        {k_native, R"("repeat_penalty":-1)", "repeat_penalty", "must be > 0"},
        {k_native, R"("repeat_last_n":-2)", "repeat_last_n", "must be in [-1, 2147483647]"},
    };
    for (const auto& c : cases) expect_error(body_for(c.route, c.member), c.route, c.param, c.message);
    // The edges are inside.
    BOOST_TEST(parse_ok(chat_body(R"("temperature":2)")).sampling.temperature == 2.0f);
    BOOST_TEST(parse_ok(chat_body(R"("temperature":0)")).sampling.temperature == 0.0f);
    BOOST_TEST(parse_ok(chat_body(R"("top_p":1e-9)")).sampling.top_p > 0.0f);
    BOOST_TEST(parse_ok(chat_body(R"("min_p":1)")).sampling.min_p == 1.0f);
    BOOST_TEST(parse_ok(chat_body(R"("top_k":0)")).sampling.top_k == 0);
    BOOST_TEST(parse_ok(body_for(k_native, R"("temperature":100)"), k_native).sampling.temperature == 100.0f);
}

// ---------------------------------------------------------------- body-level errors

BOOST_AUTO_TEST_CASE(empty_and_non_object_bodies) {
    expect_error("", k_chat, "", "the request body is empty");
    expect_error(" \n\t ", k_chat, "", "the request body is empty");
    expect_error("[1,2]", k_chat, "", "must be a JSON object, got array");
    expect_error(R"("text")", k_cmpl, "", "must be a JSON object, got string");
    expect_error("42", k_native, "", "must be a JSON object, got number");
    expect_error("null", k_chat, "", "must be a JSON object, got null");
    // A UTF-8 byte order mark (PowerShell sends one) is skipped; offsets still count it.
    BOOST_TEST(parse_ok("\xEF\xBB\xBF" + chat_body()).messages.size() == 1u);
    expect_error("\xEF\xBB\xBF{\"a\":}", k_chat, "a", "invalid JSON at byte 8 (in a): unexpected character '}'");
}

BOOST_AUTO_TEST_CASE(malformed_json_says_where) {
    // Truncated: the offset is the end of the body, the param the value being read.
    const std::string truncated = R"({"messages":[{"role":"user","content":"hi"}],"temperature":)";
    expect_error(truncated, k_chat, "temperature", "invalid JSON at byte " + std::to_string(truncated.size()));
    expect_error(R"({"messages":[{"role":"user","content":"hi)", k_chat, "messages[0].content", "unterminated string");
    expect_error(R"({"messages":[{"role":"user")", k_chat, "messages[0]", "truncated");
    expect_error(R"({"a":1,})", k_chat, "", "invalid JSON at byte 7: expected a string key");
    expect_error(R"({"a" 1})", k_chat, "a", "invalid JSON at byte 5 (in a): expected ':' after a key");
    expect_error(R"({"a":[1,]})", k_chat, "a[1]", "invalid JSON at byte 8 (in a[1]): unexpected character ']'");
    expect_error(R"({"a":tru})", k_chat, "a", "invalid JSON at byte 5 (in a): invalid literal (expected true)");
    expect_error(R"({"a":01})", k_chat, "a", "leading zeros");
    // After a complete value, the container is the place.
    expect_error(R"({"a":{"b":1 "c":2}})", k_chat, "a", "expected ',' or '}'");
    expect_error(R"({"a":[1 2]})", k_chat, "a", "expected ',' or ']'");
    expect_error(R"({"a":1.})", k_chat, "a", "decimal point");
    expect_error(R"({"a":"\x"})", k_chat, "a", "invalid escape");
    expect_error(R"({"a":"\ud800"})", k_chat, "a", "surrogate");
    expect_error("{\"a\":\"x\x01\"}", k_chat, "a", "control character");
    expect_error(R"({} x)", k_chat, "", "invalid JSON at byte 3: unexpected content after the JSON value");
    expect_error(R"({"a":1}})", k_chat, "", "unexpected content");
    expect_error(R"({'a':1})", k_chat, "", "expected a string key");
    // The path follows arrays and objects: an error deep in the third message.
    expect_error(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":[{"type":"text","text":nul}]}]})",
                 k_chat, "messages[2].content[0].text", "invalid literal");
    // Too deep is refused, not a stack overflow.
    std::string deep = "{\"a\":";
    deep.append(5000, '[').append(5000, ']').append("}");
    std::string deepest = "a";
    for (int i = 0; i < 1023; ++i) deepest.append("[0]");
    expect_error(deep, k_chat, deepest, "nesting deeper than 1024");
}

BOOST_AUTO_TEST_CASE(invalid_utf8_body) {
    const std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xC3\" }]}";
    auto r = parse_completion_request(body, k_chat, {});
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().status == 400);
    BOOST_TEST(r.error().param == "messages[0].content");
    BOOST_TEST(r.error().message.find("invalid UTF-8") != std::string::npos, r.error().message);
    BOOST_TEST(r.error().message.find("at byte 42") != std::string::npos, r.error().message);
    // Surrogates, overlong forms and bytes outside any string are invalid too.
    expect_error(chat_body("\"stop\":\"\xED\xA0\x80\""), k_chat, "stop", "invalid UTF-8");
    expect_error(chat_body("\"stop\":\"\xC0\x80\""), k_chat, "stop", "invalid UTF-8");
    expect_error("{\"a\":1,\xFF}", k_chat, "", "invalid UTF-8");
    expect_error("{\"k\xFF\":1}", k_chat, "", "invalid UTF-8");
    // Valid multi-byte text is kept as is.
    BOOST_TEST(*parse_ok(R"({"messages":[{"role":"user","content":"café 😀 中"}]})").messages[0].content ==
               "café 😀 中");
}

BOOST_AUTO_TEST_CASE(duplicate_keys_first_wins) {
    BOOST_TEST(parse_ok(chat_body(R"("temperature":0.5,"temperature":1.5)")).sampling.temperature == 0.5f);
}

// ---------------------------------------------------------------- prompts

BOOST_AUTO_TEST_CASE(prompt_shapes) {
    for (api_route route : {k_cmpl, k_native}) {
        auto r = parse_ok(R"({"prompt":"text"})", route);
        BOOST_TEST(r.prompt_text.value() == "text");
        r = parse_ok(R"({"prompt":""})", route);
        BOOST_TEST(r.prompt_text.value().empty());
        r = parse_ok(R"({"prompt":["only"]})", route);
        BOOST_TEST(r.prompt_text.value() == "only");
        r = parse_ok(R"({"prompt":[1,2,3]})", route);
        BOOST_TEST((r.prompt_tokens == std::vector<int32_t>{1, 2, 3}));
        BOOST_TEST(!r.prompt_text.has_value());
        r = parse_ok(R"({"prompt":[[4,5]]})", route);
        BOOST_TEST((r.prompt_tokens == std::vector<int32_t>{4, 5}));
        r = parse_ok(R"({"prompt":[7.0]})", route);
        BOOST_TEST((r.prompt_tokens == std::vector<int32_t>{7}));

        expect_error(R"({})", route, "prompt", "prompt: required");
        expect_error(R"({"prompt":null})", route, "prompt", "prompt: required");
        expect_error(R"({"prompt":["a","b"]})", route, "prompt", "only one prompt per request is supported");
        expect_error(R"({"prompt":[[1],[2]]})", route, "prompt", "only one prompt per request is supported");
        expect_error(R"({"prompt":["a",[2]]})", route, "prompt", "only one prompt per request is supported");
        expect_error(R"({"prompt":["a",1]})", route, "prompt", "mixing strings and token ids");
        expect_error(R"({"prompt":[1,[2]]})", route, "prompt", "mixing");
        expect_error(R"({"prompt":[]})", route, "prompt", "prompt: must not be empty");
        expect_error(R"({"prompt":[[]]})", route, "prompt[0]", "prompt[0]: must not be empty");
        expect_error(R"({"prompt":5})", route, "prompt", "prompt: expected a string or an array, got number");
        expect_error(R"({"prompt":{"a":1}})", route, "prompt", "got object");
        expect_error(R"({"prompt":[true]})", route, "prompt[0]", "got boolean");
        expect_error(R"({"prompt":[1,null]})", route, "prompt[1]", "got null");
        expect_error(R"({"prompt":[1,-2]})", route, "prompt[1]", "token id -2");
        expect_error(R"({"prompt":[1,2.5]})", route, "prompt[1]", "expected an integer");
        expect_error(R"({"prompt":[[1,"a"]]})", route, "prompt[0][1]", "expected an integer, got string");
    }
    parse_limits limits;
    limits.vocab = 100;
    BOOST_TEST(parse_ok(R"({"prompt":[0,99]})", k_cmpl, limits).prompt_tokens.size() == 2u);
    expect_error(R"({"prompt":[0,100]})", k_cmpl, "prompt[1]", "token id 100 is outside the vocabulary [0, 100)",
                 limits);
    expect_error(R"({"prompt":[[5,100]]})", k_native, "prompt[0][1]", "outside the vocabulary", limits);
    expect_error(R"({"prompt":[2147483648]})", k_native, "prompt[0]", "must be in [0, 2^31)");
    // Infill: prompt optional, same shapes.
    BOOST_TEST(parse_ok(R"({"prompt":[3]})", k_infill).prompt_tokens.size() == 1u);
    expect_error(R"({"prompt":["a","b"]})", k_infill, "prompt", "only one prompt");
    // The chat route does not read "prompt".
    BOOST_TEST(!parse_ok(chat_body(R"("prompt":5)")).prompt_text.has_value());
}

BOOST_AUTO_TEST_CASE(long_token_prompt) {
    std::string body = R"({"prompt":[)";
    for (int i = 0; i < 100000; ++i) body += std::to_string(i % 1000) + (i + 1 < 100000 ? "," : "");
    body += "]}";
    const completion_request r = parse_ok(body, k_native);
    BOOST_TEST_REQUIRE(r.prompt_tokens.size() == 100000u);
    BOOST_TEST(r.prompt_tokens[99999] == 999);
}

// ---------------------------------------------------------------- stop

BOOST_AUTO_TEST_CASE(stop_strings) {
    BOOST_TEST((parse_ok(chat_body(R"("stop":"END")")).stop == std::vector<std::string>{"END"}));
    BOOST_TEST((parse_ok(chat_body(R"("stop":["a","","b"])")).stop == std::vector<std::string>{"a", "b"}));
    BOOST_TEST(parse_ok(chat_body(R"("stop":"")")).stop.empty());
    BOOST_TEST(parse_ok(chat_body(R"("stop":[])")).stop.empty());
    std::string sixteen = R"("stop":[)";
    for (int i = 0; i < 16; ++i) sixteen += "\"s" + std::to_string(i) + "\"" + (i < 15 ? "," : "]");
    BOOST_TEST(parse_ok(chat_body(sixteen)).stop.size() == 16u);
    std::string seventeen = R"("stop":[)";
    for (int i = 0; i < 17; ++i) seventeen += "\"s\"" + std::string(i < 16 ? "," : "]");
    expect_chat_error(seventeen, "stop", "stop: at most 16 stop strings are supported, got 17");
    const std::string long_stop(1025, 'x');
    BOOST_TEST(parse_ok(chat_body("\"stop\":\"" + std::string(1024, 'x') + "\"")).stop[0].size() == 1024u);
    expect_chat_error("\"stop\":\"" + long_stop + "\"", "stop", "at most 1024 bytes, got 1025");
    expect_chat_error("\"stop\":[\"a\",\"" + long_stop + "\"]", "stop[1]", "at most 1024 bytes");
    parse_limits limits;
    limits.max_stop_strings = 2;
    limits.max_stop_bytes = 3;
    expect_error(chat_body(R"("stop":["a","b","c"])"), k_chat, "stop", "at most 2", limits);
    expect_error(chat_body(R"("stop":"abcd")"), k_chat, "stop", "at most 3 bytes", limits);
}

BOOST_AUTO_TEST_CASE(huge_stop_array_is_refused_by_its_size) {
    std::string member = R"("stop":[)";
    for (int i = 0; i < 10000; ++i) member += "\"" + std::string(100, 'a' + i % 26) + "\"" + (i < 9999 ? "," : "]");
    const std::string body = chat_body(member);
    const auto t0 = std::chrono::steady_clock::now();
    expect_chat_error(member, "stop", "got 10000");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A 1 MB body: parsing it is milliseconds; building 10,000 strings would still pass, so this
    // bound only catches something pathological (quadratic work).
    BOOST_TEST(s < 2.0);
}

// ---------------------------------------------------------------- logit_bias

BOOST_AUTO_TEST_CASE(logit_bias_forms) {
    parse_limits limits;
    limits.vocab = 1000;
    auto r = parse_ok(chat_body(R"("logit_bias":{"5":-100,"6":100,"7":0.5,"8":false})"), k_chat, limits);
    BOOST_TEST_REQUIRE(r.sampling.logit_bias.size() == 4u);
    BOOST_TEST(r.sampling.logit_bias[0].token == 5);
    BOOST_TEST(r.sampling.logit_bias[0].bias == -100.0f);
    BOOST_TEST(r.sampling.logit_bias[1].bias == 100.0f);
    BOOST_TEST(r.sampling.logit_bias[2].bias == 0.5f);
    BOOST_TEST(std::isinf(r.sampling.logit_bias[3].bias));
    r = parse_ok(body_for(k_native, R"("logit_bias":[[123,-1.5],[456,false],[123,1]])"), k_native, limits);
    BOOST_TEST_REQUIRE(r.sampling.logit_bias.size() == 3u);
    BOOST_TEST(r.sampling.logit_bias[0].token == 123);
    BOOST_TEST(r.sampling.logit_bias[0].bias == -1.5f);
    BOOST_TEST(r.sampling.logit_bias[1].token == 456);
    BOOST_TEST(r.sampling.logit_bias[1].bias == -std::numeric_limits<float>::infinity());
    BOOST_TEST(r.sampling.logit_bias[2].token == 123);  // duplicates kept: the sampler adds them up
    BOOST_TEST(parse_ok(chat_body(R"("logit_bias":{})")).sampling.logit_bias.empty());
    BOOST_TEST(parse_ok(chat_body(R"("logit_bias":[])")).sampling.logit_bias.empty());

    const std::string by_string = "logit_bias by string is not supported; use token ids";
    expect_error(chat_body(R"("logit_bias":[["hello",1.0]])"), k_chat, "logit_bias", by_string);
    expect_error(chat_body(R"("logit_bias":{"hello":1.0})"), k_chat, "logit_bias", by_string);
    expect_error(chat_body(R"("logit_bias":{"-5":1.0})"), k_chat, "logit_bias", by_string);
    expect_error(chat_body(R"("logit_bias":{"1000":1})"), k_chat, "logit_bias", "token id 1000 is outside the vocabulary [0, 1000)",
                 limits);
    expect_error(chat_body(R"("logit_bias":{"99999999999":1})"), k_chat, "logit_bias", by_string);
    expect_error(chat_body(R"("logit_bias":{"5":101})"), k_chat, "logit_bias.5", "logit_bias.5: must be in [-100, 100], got 101");
    expect_error(chat_body(R"("logit_bias":{"5":"1"})"), k_chat, "logit_bias.5", "expected a number in [-100, 100] or false, got string");
    expect_error(chat_body(R"("logit_bias":{"5":true})"), k_chat, "logit_bias.5", "true is not a bias");
    expect_error(chat_body(R"("logit_bias":[[1000,1]])"), k_chat, "logit_bias[0][0]", "outside the vocabulary", limits);
    expect_error(chat_body(R"("logit_bias":[[-1,1]])"), k_chat, "logit_bias[0][0]", "token id -1");
    expect_error(chat_body(R"("logit_bias":[[1,-101]])"), k_chat, "logit_bias[0][1]", "must be in [-100, 100]");
    expect_error(chat_body(R"("logit_bias":[[1]])"), k_chat, "logit_bias[0]", "got 1 elements");
    expect_error(chat_body(R"("logit_bias":[[1,2,3]])"), k_chat, "logit_bias[0]", "got 3 elements");
    expect_error(chat_body(R"("logit_bias":[5])"), k_chat, "logit_bias[0]", "expected a [token id, bias] pair, got number");
    expect_error(chat_body(R"("logit_bias":[[1.5,1]])"), k_chat, "logit_bias[0][0]", "expected an integer");
    parse_limits few;
    few.max_logit_bias = 1;
    expect_error(chat_body(R"("logit_bias":{"1":1,"2":1})"), k_chat, "logit_bias", "at most 1 entries", few);
    expect_error(chat_body(R"("logit_bias":[[1,1],[2,1]])"), k_chat, "logit_bias", "at most 1 entries", few);
}

// ---------------------------------------------------------------- messages

BOOST_AUTO_TEST_CASE(messages_validation) {
    expect_error("{}", k_chat, "messages", "messages: required");
    expect_error(R"({"messages":null})", k_chat, "messages", "messages: required");
    expect_error(R"({"messages":[]})", k_chat, "messages", "messages: must not be empty");
    expect_error(R"({"messages":"hi"})", k_chat, "messages", "messages: expected an array, got string");
    expect_error(R"({"messages":["hi"]})", k_chat, "messages[0]", "expected a message object, got string");
    expect_error(R"({"messages":[{"content":"hi"}]})", k_chat, "messages[0].role", "messages[0].role: required");
    expect_error(R"({"messages":[{"role":5,"content":"hi"}]})", k_chat, "messages[0].role", "expected a string");
    expect_error(R"({"messages":[{"role":"function","content":"hi"}]})", k_chat, "messages[0].role",
                 "unknown role 'function'");
    expect_error(R"({"messages":[{"role":"user"}]})", k_chat, "messages[0].content", "required for a user message");
    expect_error(R"({"messages":[{"role":"system","content":null}]})", k_chat, "messages[0].content", "required");
    expect_error(R"({"messages":[{"role":"tool","content":"x","tool_call_id":5}]})", k_chat, "messages[0].tool_call_id",
                 "expected a string");
    expect_error(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":5}]})", k_chat,
                 "messages[1].content", "expected a string, null or an array of text parts, got number");
    expect_error(R"({"messages":[{"role":"assistant","content":null}]})", k_chat, "messages[0].content",
                 "an assistant message needs content or tool_calls");
    expect_error(R"({"messages":[{"role":"assistant"}]})", k_chat, "messages[0].content", "needs content or tool_calls");
    parse_limits limits;
    limits.max_messages = 2;
    expect_error(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]})",
                 k_chat, "messages", "at most 2 messages are supported, got 3", limits);
    // An empty string is content.
    BOOST_TEST(parse_ok(R"({"messages":[{"role":"user","content":""}]})").messages[0].content.value().empty());
    BOOST_TEST(parse_ok(R"({"messages":[{"role":"assistant","content":""}]})").messages[0].content.value().empty());
}

BOOST_AUTO_TEST_CASE(content_parts) {
    auto r = parse_ok(R"({"messages":[{"role":"user","content":[{"type":"text","text":"one "},{"type":"text","text":"two"}]}]})");
    BOOST_TEST(r.messages[0].content.value() == "one two");
    r = parse_ok(R"({"messages":[{"role":"user","content":[]}]})");
    BOOST_TEST(r.messages[0].content.value().empty());
    expect_error(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", k_chat,
                 "messages[0].content[0].type", "only text content is supported");
    expect_error(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_audio"}]}]})",
                 k_chat, "messages[0].content[1].type", "only text content is supported");
    expect_error(R"({"messages":[{"role":"user","content":[{"text":"a"}]}]})", k_chat, "messages[0].content[0].type",
                 "required");
    expect_error(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", k_chat, "messages[0].content[0].text",
                 "required");
    expect_error(R"({"messages":[{"role":"user","content":[{"type":"text","text":5}]}]})", k_chat,
                 "messages[0].content[0].text", "expected a string, got number");
    expect_error(R"({"messages":[{"role":"user","content":["a"]}]})", k_chat, "messages[0].content[0]",
                 "expected a content part object, got string");
}

BOOST_AUTO_TEST_CASE(assistant_tool_calls) {
    // "" with tool calls becomes null so the template renders the calls.
    auto r = parse_ok(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"",
        "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"out"}]})");
    BOOST_TEST(!r.messages[1].content.has_value());
    BOOST_TEST(r.messages[1].tool_calls.size() == 1u);
    // Content and tool calls both kept when the content is not empty.
    r = parse_ok(R"({"messages":[{"role":"assistant","content":"let me check","tool_calls":[{"function":{"name":"f"}}]}]})");
    BOOST_TEST(r.messages[0].content.value() == "let me check");
    BOOST_TEST(r.messages[0].tool_calls[0].arguments == "{}");  // absent arguments: an empty object
    // tool_calls: null and [] are no calls.
    BOOST_TEST(parse_ok(R"({"messages":[{"role":"assistant","content":"x","tool_calls":null}]})").messages[0].tool_calls.empty());
    BOOST_TEST(parse_ok(R"({"messages":[{"role":"assistant","content":"x","tool_calls":[]}]})").messages[0].tool_calls.empty());
    // Only assistant messages carry tool calls; elsewhere the member is ignored.
    BOOST_TEST(parse_ok(R"({"messages":[{"role":"user","content":"x","tool_calls":5}]})").messages[0].tool_calls.empty());

    const std::string pre = R"({"messages":[{"role":"assistant","content":null,"tool_calls":)";
    expect_error(pre + R"(5}]})", k_chat, "messages[0].tool_calls", "expected an array, got number");
    expect_error(pre + R"([5]}]})", k_chat, "messages[0].tool_calls[0]", "expected an object, got number");
    expect_error(pre + R"([{"type":"code","function":{"name":"f"}}]}]})", k_chat, "messages[0].tool_calls[0].type",
                 "only \"function\" tool calls are supported");
    expect_error(pre + R"([{"id":1,"function":{"name":"f"}}]}]})", k_chat, "messages[0].tool_calls[0].id",
                 "expected a string");
    expect_error(pre + R"([{"type":"function"}]}]})", k_chat, "messages[0].tool_calls[0].function", "required");
    expect_error(pre + R"([{"function":"f"}]}]})", k_chat, "messages[0].tool_calls[0].function",
                 "expected an object, got string");
    expect_error(pre + R"([{"function":{"arguments":"{}"}}]}]})", k_chat, "messages[0].tool_calls[0].function.name",
                 "required");
    expect_error(pre + R"([{"function":{"name":"f","arguments":5}}]}]})", k_chat,
                 "messages[0].tool_calls[0].function.arguments", "expected a string, got number");
}

// ---------------------------------------------------------------- tools and tool_choice

BOOST_AUTO_TEST_CASE(tools_validation) {
    auto r = parse_ok(chat_body(R"("tools":[{"function":{"name":"a.b-c_D9"}}])"));
    BOOST_TEST(r.tools[0].name == "a.b-c_D9");
    BOOST_TEST(parse_ok(chat_body("\"tools\":[{\"function\":{\"name\":\"" + std::string(64, 'n') + "\"}}]")).tools.size() ==
               1u);
    expect_chat_error("\"tools\":[{\"function\":{\"name\":\"" + std::string(65, 'n') + "\"}}]", "tools[0].function.name",
                      "must be 1 to 64 characters");
    expect_chat_error(R"("tools":[{"function":{"name":""}}])", "tools[0].function.name", "must be 1 to 64 characters");
    expect_chat_error(R"("tools":[{"function":{"name":"has space"}}])", "tools[0].function.name", "must be 1 to 64");
    expect_chat_error(R"("tools":[{"function":{"name":"ünï"}}])", "tools[0].function.name", "must be 1 to 64");
    expect_chat_error(R"("tools":[{"type":"retrieval","function":{"name":"f"}}])", "tools[0].type",
                      "only \"function\" tools are supported");
    expect_chat_error(R"("tools":[{"type":"function"}])", "tools[0].function", "tools[0].function: required");
    expect_chat_error(R"("tools":[{"function":{}}])", "tools[0].function.name", "required");
    expect_chat_error(R"("tools":[{"function":{"name":"f","parameters":"{}"}}])", "tools[0].function.parameters",
                      "expected a JSON schema object, got string");
    expect_chat_error(R"("tools":[{"function":{"name":"f","description":5}}])", "tools[0].function.description",
                      "expected a string");
    expect_chat_error(R"("tools":[{"function":{"name":"f"}},{"function":{"name":"f"}}])", "tools[1].function.name",
                      "duplicate tool name 'f'");
    expect_chat_error(R"("tools":["f"])", "tools[0]", "expected a tool object, got string");
    BOOST_TEST(parse_ok(chat_body(R"("tools":[])")).tools.empty());
    parse_limits limits;
    limits.max_tools = 1;
    expect_error(chat_body(R"("tools":[{"function":{"name":"a"}},{"function":{"name":"b"}}])"), k_chat, "tools",
                 "at most 1 tools", limits);
    // Parameters keep their JSON text (escapes re-serialised correctly).
    r = parse_ok(chat_body(R"("tools":[{"function":{"name":"f","parameters":{"description":"say \"hi\"\n","enum":[1,2.5,null,true]}}}])"));
    BOOST_TEST(r.tools[0].parameters_json == R"({"description":"say \"hi\"\n","enum":[1,2.5,null,true]})");
    // strict (OpenAI's structured tool calls): false unless said.
    BOOST_TEST(!r.tools[0].strict);
    BOOST_TEST(parse_ok(chat_body(R"("tools":[{"function":{"name":"f","strict":true}}])")).tools[0].strict);
    BOOST_TEST(!parse_ok(chat_body(R"("tools":[{"function":{"name":"f","strict":null}}])")).tools[0].strict);
    expect_chat_error(R"("tools":[{"function":{"name":"f","strict":"yes"}}])", "tools[0].function.strict", "expected a boolean");
}

BOOST_AUTO_TEST_CASE(tool_choice_validation) {
    const std::string tools = R"("tools":[{"function":{"name":"f"}},{"function":{"name":"g"}}])";
    BOOST_TEST(parse_ok(chat_body(tools + R"(,"tool_choice":"auto")")).choice.kind == tool_choice::auto_);
    BOOST_TEST(parse_ok(chat_body(tools + R"(,"tool_choice":"none")")).choice.kind == tool_choice::none);
    BOOST_TEST(parse_ok(chat_body(tools + R"(,"tool_choice":"required")")).choice.kind == tool_choice::required);
    auto r = parse_ok(chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}})"));
    BOOST_TEST(r.choice.kind == tool_choice::function);
    BOOST_TEST(r.choice.function_name == "g");
    // Without tools: auto and none are fine, required and a named function are not.
    BOOST_TEST(parse_ok(chat_body(R"("tool_choice":"none")")).choice.kind == tool_choice::none);
    BOOST_TEST(parse_ok(chat_body(R"("tool_choice":"auto")")).choice.kind == tool_choice::auto_);
    expect_chat_error(R"("tool_choice":"required")", "tool_choice", "\"required\" needs a non-empty tools list");
    expect_chat_error(R"("tool_choice":{"type":"function","function":{"name":"f"}})", "tool_choice.function.name",
                      "no tool named \"f\" in tools");
    expect_chat_error(tools + R"(,"tool_choice":{"type":"function","function":{"name":"h"}})",
                      "tool_choice.function.name", "no tool named \"h\"");
    expect_chat_error(tools + R"(,"tool_choice":"any")", "tool_choice", "expected \"auto\", \"none\", \"required\"");
    expect_chat_error(tools + R"(,"tool_choice":{"type":"allowed_tools"})", "tool_choice.type",
                      "only \"function\" is supported");
    expect_chat_error(tools + R"(,"tool_choice":{"type":"function"})", "tool_choice.function", "required");
    expect_chat_error(tools + R"(,"tool_choice":{"type":"function","function":{}})", "tool_choice.function.name",
                      "required");
    expect_chat_error(tools + R"(,"tool_choice":{"function":{"name":5}})", "tool_choice.function.name",
                      "expected a string, got number");
}

// ---------------------------------------------------------------- robustness

BOOST_AUTO_TEST_CASE(mutated_bodies_never_crash) {
    const std::string base = R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hé"}]},)"
                             R"({"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}],)"
                             R"("tools":[{"function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto",)"
                             R"("stop":["a"],"logit_bias":{"1":2},"temperature":0.5,"seed":3,"max_tokens":9})";
    parse_ok(base);
    std::mt19937 rng(3);
    size_t accepted = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string body = base;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < edits; ++k) {
            const size_t at = rng() % body.size();
            switch (rng() % 4) {
                case 0: body[at] = static_cast<char>(rng() & 0xFF); break;
                case 1: body.erase(at, 1 + rng() % 8); break;
                case 2: body.resize(at); break;
                default: body.insert(at, 1, "{}[]\",:0-e.\\ntf"[rng() % 16]); break;
            }
            if (body.empty()) break;
        }
        for (api_route route : {k_chat, k_cmpl, k_native, k_infill}) {
            auto r = parse_completion_request(body, route, {});
            if (r.ok()) {
                ++accepted;
                continue;
            }
            BOOST_TEST(r.error().status == 400);
            BOOST_TEST(!r.error().message.empty());
        }
    }
    BOOST_TEST(accepted > 0u);  // some edits (inside strings) keep the body valid
}

BOOST_AUTO_TEST_CASE(error_locator_agrees_with_simdjson) {
    // The locator must find an error exactly when simdjson rejects a text, or error messages
    // would lose their position (or invent one).
    const std::string base = R"({"a":[1,-2.5e3,true,false,null,"s\u00e9\n\ud83d\ude00",{"b":{}},[]],"c":"Ã©",)"
                             R"("d":18446744073709551615,"e":-9223372036854775808,"f":0.1e-2})";
    const std::string_view replace_chars = "{}[]\",:0123-+eE.\\/ntfrulsa \x01\xC3\xA9\xFF";
    const std::string_view insert_chars = "{}[]\",:09-e.\\u \xC3";
    std::mt19937 rng(5);
    size_t rejected = 0;
    simdjson::dom::parser parser;
    for (int iter = 0; iter < 20000; ++iter) {
        std::string text = base;
        const int edits = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < edits && !text.empty(); ++k) {
            const size_t at = rng() % text.size();
            switch (rng() % 3) {
                case 0: text[at] = replace_chars[rng() % replace_chars.size()]; break;
                case 1: text.erase(at, 1 + rng() % 3); break;
                default: text.insert(at, 1, insert_chars[rng() % insert_chars.size()]); break;
            }
        }
        if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;  // "empty", said apart
        simdjson::dom::element e;
        const bool simdjson_ok = parser.parse(text).get(e) == simdjson::SUCCESS;
        const auto where = moestream::server::detail::locate_json_error(text);
        const bool locator_ok = !where.has_value();
        if (simdjson_ok != locator_ok) BOOST_FAIL("disagreement on " << text << ": simdjson " << simdjson_ok);
        if (where) BOOST_TEST(where->offset <= text.size());
        rejected += !simdjson_ok;
    }
    BOOST_TEST(rejected > 1000u);
}

// ---------------------------------------------------------------- tokenize / detokenize

BOOST_AUTO_TEST_CASE(tokenize_requests) {
    auto r = parse_tokenize_request(R"({"content":"Hello <｜User｜>"})");
    BOOST_TEST_REQUIRE(r.ok());
    BOOST_TEST(r->content == "Hello <｜User｜>");
    BOOST_TEST(!r->add_special);
    BOOST_TEST(r->parse_special);
    BOOST_TEST(!r->with_pieces);
    r = parse_tokenize_request(R"({"content":"","add_special":true,"parse_special":false,"with_pieces":true,"x":1})");
    BOOST_TEST_REQUIRE(r.ok());
    BOOST_TEST(r->content.empty());
    BOOST_TEST(r->add_special);
    BOOST_TEST(!r->parse_special);
    BOOST_TEST(r->with_pieces);
    r = parse_tokenize_request(R"({"add_special":true})");
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().param == "content");
    r = parse_tokenize_request(R"({"content":5})");
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().message == "content: expected a string, got number");
    r = parse_tokenize_request(R"({"content":"a","with_pieces":"yes"})");
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().param == "with_pieces");
    r = parse_tokenize_request("[]");
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().message.find("must be a JSON object") != std::string::npos);
    r = parse_tokenize_request("");
    BOOST_TEST(!r.ok());
}

BOOST_AUTO_TEST_CASE(detokenize_requests) {
    auto r = parse_detokenize_request(R"({"tokens":[1,2,99]})", 100);
    BOOST_TEST_REQUIRE(r.ok());
    BOOST_TEST((r->tokens == std::vector<int32_t>{1, 2, 99}));
    r = parse_detokenize_request(R"({})", 100);
    BOOST_TEST_REQUIRE(r.ok());
    BOOST_TEST(r->tokens.empty());
    r = parse_detokenize_request(R"({"tokens":[1,100]})", 100);
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().param == "tokens[1]");
    BOOST_TEST(r.error().message.find("outside the vocabulary [0, 100)") != std::string::npos);
    r = parse_detokenize_request(R"({"tokens":[1,"a"]})", 100);
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().param == "tokens[1]");
    r = parse_detokenize_request(R"({"tokens":"1,2"})", 100);
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().message == "tokens: expected an array of token ids, got string");
    r = parse_detokenize_request(R"({"tokens":[1,2)", 100);
    BOOST_TEST_REQUIRE(!r.ok());
    BOOST_TEST(r.error().message.find("invalid JSON at byte 14") != std::string::npos, r.error().message);
}

BOOST_AUTO_TEST_SUITE_END()
