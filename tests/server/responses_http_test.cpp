// POST /v1/responses over real sockets against the tiny model: whole and streamed responses,
// forced tool calls and their function_call_output round trip, previous_response_id with the
// stored conversation, JSON output, the prefix cache in usage, and the errors (bad ids, context
// overflow and a full queue, in the stream as Codex reads them and as HTTP errors).
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "json_schema_validator.h"
#include "responses_stream_check.h"
#include "server/responses_store.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

struct responses_server {
    static live_server_options options() {
        live_server_options o;
        o.context_tokens = 2048;  // the tool block of the prompt takes a few hundred tokens
        return o;
    }
    live_server srv{options()};

    http_reply post(const std::string& body) {
        http_client c(srv.port());
        return c.post("/v1/responses", body);
    }
    // A streamed request: the checked events.
    checked_response_stream stream(const std::string& body, const std::string& label) {
        const auto r = post(body);
        BOOST_TEST_REQUIRE(r.status == 200, label << ": " << r.status << " " << r.body);
        BOOST_TEST(r.header("Content-Type") == "text/event-stream");
        BOOST_TEST(r.body.find("[DONE]") == std::string::npos, "Responses streams have no [DONE]");
        return check_response_stream(sse_frames(r.body), label);
    }
};

const std::string k_weather_tool =
    R"({"type":"function","name":"get_weather","description":"The weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}})";

// The JSON text of a string value.
std::string js(std::string_view s) {
    std::string out;
    server::append_json_string(out, s);
    return out;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(responses_http, responses_server, *requires_live_server())

BOOST_AUTO_TEST_CASE(whole_response) {
    const auto r = post(R"({"model":"tiny","input":"Hello","max_output_tokens":6,"instructions":"Answer briefly."})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"object"}) == "response");
    BOOST_TEST(d.str({"id"}).rfind("resp_", 0) == 0u);
    BOOST_TEST(d.str({"model"}) == "tiny");
    const std::string status = d.str({"status"});
    BOOST_TEST((status == "completed" || status == "incomplete"), status);
    BOOST_TEST(d.str({"instructions"}) == "Answer briefly.");
    BOOST_TEST(d.integer({"max_output_tokens"}) == 6);
    BOOST_TEST(d.integer({"usage", "output_tokens"}) >= 1);
    BOOST_TEST(d.integer({"usage", "output_tokens"}) <= 6);
    BOOST_TEST(d.integer({"usage", "total_tokens"}) ==
               d.integer({"usage", "input_tokens"}) + d.integer({"usage", "output_tokens"}));
    BOOST_TEST(d.integer({"usage", "output_tokens_details", "reasoning_tokens"}) >= 0);
    BOOST_TEST(d.has({"usage", "input_tokens_details", "cached_tokens"}));
    BOOST_TEST(!d.has({"error", "code"}));
    BOOST_TEST(d.length({"output"}) >= 1);
    BOOST_TEST(d.str({"output", "0", "type"}) == "message");
}

BOOST_AUTO_TEST_CASE(streamed_equals_whole_and_reuses_the_prefix) {
    const std::string body = R"({"input":"Tell me about the sea","max_output_tokens":12,"temperature":0)";
    const auto whole = post(body + "}");
    BOOST_TEST_REQUIRE(whole.status == 200, whole.body);
    json_doc d(whole.body);
    const auto got = stream(body + R"(,"stream":true})", "greedy stream");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(got.text == d.str({"output", "0", "content", "0", "text"}), "greedy: the same text streamed and whole");
    BOOST_TEST(got.output_tokens == d.integer({"usage", "output_tokens"}));
    BOOST_TEST(got.input_tokens == d.integer({"usage", "input_tokens"}));
    // The same prompt again: its prefix comes from the cache.
    BOOST_TEST(got.cached_tokens > 0, "cached_tokens " << got.cached_tokens);
    BOOST_TEST(got.cached_tokens < got.input_tokens);
}

BOOST_AUTO_TEST_CASE(forced_tool_call_and_its_output) {
    const std::string tools = R"("tools":[)" + k_weather_tool + R"(],"max_output_tokens":96)";
    const auto got = stream(R"({"input":"Weather in Paris?","stream":true,"tool_choice":"required",)" + tools + "}",
                            "forced call stream");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(got.status == "completed");
    BOOST_TEST_REQUIRE(got.calls.size() == 1u);
    BOOST_TEST(got.calls[0].first == "get_weather");
    json_doc args(got.calls[0].second);
    BOOST_TEST((args.ok() && args.root().is_object()), "arguments are a JSON object: " << got.calls[0].second);

    // Whole, with a named function: a function_call item; then its output goes back.
    const auto r = post(R"({"input":"Weather in Paris?","tool_choice":{"type":"function","name":"get_weather"},)" + tools + "}");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    const auto last = std::to_string(d.length({"output"}) - 1);
    BOOST_TEST_REQUIRE(d.str({"output", last, "type"}) == "function_call", r.body);
    const std::string call_id = d.str({"output", last, "call_id"});
    const std::string arguments = d.str({"output", last, "arguments"});
    BOOST_TEST(call_id.rfind("call_", 0) == 0u);
    BOOST_TEST(d.str({"tool_choice", "name"}) == "get_weather");
    const std::string round_trip = R"({"input":[{"role":"user","content":"Weather in Paris?"},)"
                                   R"({"type":"function_call","call_id":)" + js(call_id) +
                                   R"(,"name":"get_weather","arguments":)" + js(arguments) +
                                   R"(},{"type":"function_call_output","call_id":)" + js(call_id) +
                                   R"(,"output":"sunny, 21 C"}],"max_output_tokens":8,)" + R"("tools":[)" +
                                   k_weather_tool + "]}";
    const auto answer = post(round_trip);
    BOOST_TEST_REQUIRE(answer.status == 200, answer.body);
    json_doc a(answer.body);
    BOOST_TEST(a.integer({"usage", "input_tokens"}) > d.integer({"usage", "input_tokens"}));
    // The same call id without its call is refused.
    const auto orphan = post(R"({"input":[{"type":"function_call_output","call_id":)" + js(call_id) +
                             R"(,"output":"sunny"}]})");
    check_api_error(orphan, 400, "invalid_request_error", "input[0].call_id");
}

BOOST_AUTO_TEST_CASE(previous_response_id_continues_the_stored_conversation) {
    const auto first = post(R"({"input":"My name is Ada.","max_output_tokens":6,"store":true,"temperature":0})");
    BOOST_TEST_REQUIRE(first.status == 200, first.body);
    json_doc f(first.body);
    BOOST_TEST(f.root()["store"].get_bool().value_unsafe());
    const std::string id = f.str({"id"});
    BOOST_TEST(srv.api().responses().find(id) != nullptr);

    const auto second = post(R"({"previous_response_id":)" + js(id) +
                             R"(,"input":"What is my name?","max_output_tokens":6,"store":true})");
    BOOST_TEST_REQUIRE(second.status == 200, second.body);
    json_doc s(second.body);
    BOOST_TEST(s.str({"previous_response_id"}) == id);
    // The prompt holds the first exchange: longer, and its start comes from the cache.
    BOOST_TEST(s.integer({"usage", "input_tokens"}) > f.integer({"usage", "input_tokens"}) + f.integer({"usage", "output_tokens"}));
    BOOST_TEST(s.integer({"usage", "input_tokens_details", "cached_tokens"}) >= f.integer({"usage", "input_tokens"}) - 1);
    // A chain: the third continues the second (and so the first).
    const auto third = stream(R"({"previous_response_id":)" + js(s.str({"id"})) +
                              R"(,"input":"And again?","max_output_tokens":4,"stream":true})", "chained stream");
    BOOST_TEST(third.ok);
    BOOST_TEST(third.input_tokens > s.integer({"usage", "input_tokens"}));

    // Not stored (the default), unknown: a 400 that says so.
    const auto unstored = post(R"({"input":"x","max_output_tokens":2})");
    BOOST_TEST_REQUIRE(unstored.status == 200);
    const std::string unstored_id = json_doc(unstored.body).str({"id"});
    for (const std::string& missing : {unstored_id, std::string("resp_unknown")}) {
        const auto r = post(R"({"previous_response_id":)" + js(missing) + R"(,"input":"x"})");
        check_api_error(r, 400, "invalid_request_error", "previous_response_id");
        BOOST_TEST(json_doc(r.body).str({"error", "message"}).find("no stored response") != std::string::npos, r.body);
    }
}

BOOST_AUTO_TEST_CASE(reasoning_effort_thinks_within_its_budget) {
    // "minimal": the reply starts in the reasoning, which ends within 512 tokens; then the answer.
    const auto got = stream(R"({"input":"Think, then answer.","reasoning":{"effort":"minimal"},"max_output_tokens":560,"temperature":0,"stream":true})",
                            "minimal effort");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(!got.reasoning.empty());
    BOOST_TEST(got.reasoning_tokens > 0);
    BOOST_TEST(got.reasoning_tokens <= 512 + 2, "the reasoning ran past its budget: " << got.reasoning_tokens);
    BOOST_TEST(got.reasoning_tokens < got.output_tokens, "nothing after the reasoning");
    json_doc d(got.final_response);
    BOOST_TEST(d.str({"output", "0", "type"}) == "reasoning");
    BOOST_TEST(d.str({"reasoning", "effort"}) == "minimal");
    // Without an effort the reply does not start in the reasoning.
    const auto plain = stream(R"({"input":"Answer.","max_output_tokens":8,"stream":true})", "no effort");
    BOOST_TEST_REQUIRE(plain.ok);
    BOOST_TEST(plain.reasoning_tokens == 0);
}

// A forced call after budgeted reasoning: the reply reasons first (within "minimal"'s 512
// tokens), then makes the call, whose arguments follow the schema; with a token limit below the
// budget the reasoning is closed in time for the call.
BOOST_AUTO_TEST_CASE(reasoning_effort_then_a_forced_call) {
    const std::string schema =
        R"({"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false})";
    for (int limit : {700, 120}) {
        const auto got = stream(R"({"input":"Weather in Paris?","stream":true,"reasoning":{"effort":"minimal"},)"
                                R"("tool_choice":"required","max_output_tokens":)" +
                                    std::to_string(limit) + R"(,"tools":[{"type":"function","name":"get_weather",)"
                                                            R"("parameters":)" + schema + "}]}",
                                "effort and a forced call, limit " + std::to_string(limit));
        BOOST_TEST_REQUIRE(got.ok);
        BOOST_TEST(got.status == "completed", limit);
        BOOST_TEST(!got.reasoning.empty(), limit << ": no reasoning before the call");
        BOOST_TEST(got.reasoning_tokens > 0);
        BOOST_TEST(got.reasoning_tokens <= 512 + 2, "the reasoning ran past its budget: " << got.reasoning_tokens);
        BOOST_TEST(got.output_tokens <= limit);
        BOOST_TEST_REQUIRE(got.calls.size() == 1u, limit);
        BOOST_TEST(got.calls[0].first == "get_weather");
        BOOST_TEST(schema_validator(schema).check(got.calls[0].second) == "", got.calls[0].second);
    }
}

// A strict function tool under tool_choice auto: its schema is compiled exactly (an unsupported
// keyword is a 400 naming the Responses field) and the reasoning before any call keeps its budget.
BOOST_AUTO_TEST_CASE(strict_tools_under_auto) {
    const std::string patterned =
        R"({"type":"function","name":"w","strict":true,"parameters":{"type":"object","properties":{"city":)"
        R"({"type":"string","pattern":"^[A-Z]"}},"required":["city"]}})";
    check_api_error(post(R"({"input":"x","max_output_tokens":4,"tools":[)" + k_weather_tool + "," + patterned + "]}"),
                    400, "invalid_request_error", "tools[1].parameters.properties.city.pattern");
    // Not strict: only shown to the model under auto.
    std::string lenient = patterned;
    lenient.replace(lenient.find(R"("strict":true,)"), 14, "");
    BOOST_TEST(post(R"({"input":"x","max_output_tokens":4,"tools":[)" + lenient + "]}").status == 200);

    const auto got = stream(R"({"input":"Think, then answer.","stream":true,"reasoning":{"effort":"minimal"},)"
                            R"("max_output_tokens":600,"tools":[)" +
                                k_weather_tool.substr(0, k_weather_tool.size() - 1) + R"(,"strict":true}]})",
                            "effort and a strict tool");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(!got.reasoning.empty());
    BOOST_TEST(got.reasoning_tokens > 0);
    BOOST_TEST(got.reasoning_tokens <= 512 + 2, "the reasoning ran past its budget: " << got.reasoning_tokens);
    const schema_validator weather(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
    for (const auto& [name, args] : got.calls) BOOST_TEST(weather.check(args) == "", name << ": " << args);
}

BOOST_AUTO_TEST_CASE(json_output) {
    const auto r = post(R"({"input":"A JSON object please","max_output_tokens":48,"text":{"format":{"type":"json_object"}}})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"status"}) == "completed", r.body);
    const std::string text = d.str({"output", "0", "content", "0", "text"});
    json_doc out(text);
    BOOST_TEST((out.ok() && out.root().is_object()), "not one JSON object: " << text);
    BOOST_TEST(d.str({"text", "format", "type"}) == "json_object");

    // A schema in the Responses API's flat form: the output follows it.
    const auto s = post(R"({"input":"Which city?","max_output_tokens":64,"text":{"format":{"type":"json_schema",)"
                        R"("name":"city","strict":true,"schema":{"type":"object","properties":{"city":{"type":"string",)"
                        R"("maxLength":12}},"required":["city"],"additionalProperties":false}}}})");
    BOOST_TEST_REQUIRE(s.status == 200, s.body);
    json_doc sd(s.body);
    BOOST_TEST(sd.str({"status"}) == "completed", s.body);
    json_doc city(sd.str({"output", "0", "content", "0", "text"}));
    BOOST_TEST_REQUIRE(city.ok());
    simdjson::dom::object o;
    BOOST_TEST_REQUIRE(city.root().get_object().get(o) == simdjson::SUCCESS);
    BOOST_TEST(o.size() == 1u);
    BOOST_TEST(city.has({"city"}));
    BOOST_TEST(sd.str({"text", "format", "name"}) == "city");
    // A schema keyword the constraint cannot enforce is a 400 naming it under text.format.
    const auto bad = post(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":)"
                          R"({"type":"object","properties":{"a":{"type":"string","pattern":"^a"}}}}}})");
    check_api_error(bad, 400, "invalid_request_error", "text.format.schema.properties.a.pattern");
}

BOOST_AUTO_TEST_CASE(context_overflow) {
    std::string long_input;
    for (int i = 0; i < 1500; ++i) long_input += "many words ";
    const std::string body = R"({"input":)" + js(long_input);
    const auto whole = post(body + "}");
    check_api_error(whole, 400, "exceed_context_size_error");
    const auto got = stream(body + R"(,"stream":true})", "overflow stream");
    BOOST_TEST(got.ok);
    BOOST_TEST(got.status == "failed");
    BOOST_TEST(got.error_code == "context_length_exceeded");
    check_still_serving(srv.port());
}

BOOST_AUTO_TEST_CASE(skipped_tools_are_not_refused) {
    const auto r = post(R"({"input":"hi","max_output_tokens":3,"tools":[)" + k_weather_tool +
                        R"(,{"type":"custom","name":"apply_patch"},{"type":"web_search"}]})");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    json_doc d(r.body);
    BOOST_TEST(d.length({"tools"}) == 1, "only the function tool is served and echoed");
}

BOOST_AUTO_TEST_CASE(counted_in_the_metrics) {
    BOOST_TEST_REQUIRE(post(R"({"input":"hi","max_output_tokens":2})").status == 200);
    http_client c(srv.port());
    const auto m = c.get("/metrics");
    BOOST_TEST(m.body.find(R"(moestream:http_requests_total{model_name="tiny",handler="/v1/responses",method="POST",status="200"})") !=
                   std::string::npos,
               m.body.substr(0, 400));
}

BOOST_AUTO_TEST_SUITE_END()

// A server with one sequence and no wait queue, the sequence held by a long generation: every
// request finds it full.
struct full_queue_server {
    static live_server_options options() {
        live_server_options o;
        o.max_sequences = 1;
        o.max_waiting = 0;
        return o;
    }
    live_server srv{options()};
    std::shared_ptr<generation> holder;
    full_queue_server() {
        generation_request r;
        r.prompt = {1, 2, 3};
        r.max_tokens = 200;
        auto g = srv.eng().submit(std::move(r));
        if (!g.ok()) BOOST_FAIL("the holding generation: " << g.message());
        holder = std::move(*g);
        for (int i = 0; i < 5000 && srv.eng().stats().running == 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        BOOST_TEST_REQUIRE(srv.eng().stats().running == 1);
    }
    ~full_queue_server() { holder->cancel(); }
};

BOOST_FIXTURE_TEST_SUITE(responses_busy, full_queue_server, *requires_live_server())

BOOST_AUTO_TEST_CASE(rate_limited_in_the_stream_and_over_http) {
    http_client c(srv.port());
    const auto whole = c.post("/v1/responses", R"({"input":"hi","max_output_tokens":2})");
    check_api_error(whole, 429, "rate_limit_error");
    BOOST_TEST(whole.header("Retry-After") == "1");
    const auto streamed = c.post("/v1/responses", R"({"input":"hi","max_output_tokens":2,"stream":true})");
    BOOST_TEST_REQUIRE(streamed.status == 200, streamed.body);
    const auto got = check_response_stream(sse_frames(streamed.body), "busy stream");
    BOOST_TEST(got.ok);
    BOOST_TEST(got.error_code == "rate_limit_exceeded");
    BOOST_TEST(json_doc(got.final_response).str({"error", "message"}).find("try again in 1s") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
