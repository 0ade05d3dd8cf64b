// Schema-following output and the serving fixes end to end, through HTTP on the forged tiny
// model: response_format json_schema (chat, streamed and not; llama-server's json_schema field),
// forced and strict tool calls whose arguments validate against their schemas (independent
// validator), the 400s naming an unsupported keyword; max_tokens 0 on every route, echo with
// logprobs scoring the prompt (checked against the generation's own log-probability), and
// GET /v1/models/{id}.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <string>

#include "json_schema_validator.h"
#include "server_fixture.h"
#include "tools/agent_schemas.h"

namespace moestream::test {
namespace {

using namespace std::chrono_literals;

struct schema_server {
    static live_server_options options() {
        live_server_options o;
        o.context_tokens = 4096;
        return o;
    }
    live_server srv{options()};
};

std::string_view schema_of(std::string_view name) {
    for (const auto& a : tools::k_agent_schemas)
        if (a.name == name) return a.schema;
    return {};
}

std::string chat(const std::string& extra, int max_tokens = 300) {
    return R"({"messages":[{"role":"user","content":"Plan the work."}],"temperature":1,"max_tokens":)" +
           std::to_string(max_tokens) + "," + extra + "}";
}

std::string tool(std::string_view name, std::string_view schema, bool strict) {
    return R"({"type":"function","function":{"name":")" + std::string(name) + R"(","parameters":)" +
           std::string(schema) + (strict ? R"(,"strict":true)" : "") + "}}";
}

const std::string k_weather =
    R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})";

}  // namespace

BOOST_AUTO_TEST_SUITE(json_schema_http, *requires_live_server())

BOOST_FIXTURE_TEST_CASE(response_format_json_schema, schema_server) {
    http_client client(srv.port(), 120s);
    const auto todo = schema_of("TodoWrite");
    const schema_validator v(todo);
    for (int seed = 1; seed <= 3; ++seed) {
        const auto r = client.post(
            "/v1/chat/completions",
            chat(
                R"("response_format":{"type":"json_schema","json_schema":{"name":"todos","strict":true,"schema":)" +
                std::string(todo) + R"(}},"seed":)" + std::to_string(seed)));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        json_doc d(r.body);
        BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "stop", r.body);
        const std::string content = d.str({"choices", "0", "message", "content"});
        BOOST_TEST(v.check(content) == "", content);
    }
    // Streamed: the pieces add up to a valid value.
    const auto s = client.post(
        "/v1/chat/completions",
        chat(
            R"("stream":true,"seed":8,"response_format":{"type":"json_schema","json_schema":{"name":"b","schema":)" +
            std::string(schema_of("browser")) + "}}"));
    BOOST_TEST_REQUIRE(s.status == 200, s.body);
    std::string content;
    for (const auto& ev : sse_events(s.body))
        if (ev != "[DONE]") content += json_doc(ev).str({"choices", "0", "delta", "content"});
    BOOST_TEST(schema_validator(schema_of("browser")).check(content) == "", content);
    // llama-server's field on the native route.
    const auto native =
        client.post("/completion", R"({"prompt":"JSON:","n_predict":200,"seed":5,"json_schema":)" +
                                       std::string(schema_of("read_file")) + "}");
    BOOST_TEST_REQUIRE(native.status == 200, native.body);
    const std::string text = json_doc(native.body).str({"content"});
    BOOST_TEST(schema_validator(schema_of("read_file")).check(text) == "", text);
}

BOOST_FIXTURE_TEST_CASE(forced_calls_follow_the_schema, schema_server) {
    http_client client(srv.port(), 120s);
    // The new user's case: required "city", nothing else.
    const schema_validator weather(k_weather);
    for (int seed = 1; seed <= 4; ++seed) {
        const auto r = client.post("/v1/chat/completions",
                                   chat(R"("tools":[)" + tool("get_weather", k_weather, false) +
                                            R"(],"tool_choice":"required","seed":)" + std::to_string(seed),
                                        120));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        json_doc d(r.body);
        BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "tool_calls", r.body);
        const std::string args =
            d.str({"choices", "0", "message", "tool_calls", "0", "function", "arguments"});
        BOOST_TEST(weather.check(args) == "", args);
        json_doc a(args);
        BOOST_TEST(a.has({"city"}), args);
        BOOST_TEST(a.root().get_object().value_unsafe().size() == 1u,
                   "keys the schema does not declare: " << args);
    }
    // A named call among the corpus tools: its own schema.
    std::string tools;
    for (const auto& t : tools::k_agent_schemas)
        tools += (tools.empty() ? "" : ",") + tool(t.name, t.schema, true);
    for (std::string_view name : {"shell", "TodoWrite", "grep"}) {
        const auto r = client.post(
            "/v1/chat/completions",
            chat(R"("tools":[)" + tools + R"(],"tool_choice":{"type":"function","function":{"name":")" +
                 std::string(name) + R"("}},"seed":3)"));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        json_doc d(r.body);
        BOOST_TEST(d.str({"choices", "0", "message", "tool_calls", "0", "function", "name"}) == name);
        const std::string args =
            d.str({"choices", "0", "message", "tool_calls", "0", "function", "arguments"});
        BOOST_TEST(schema_validator(schema_of(name)).check(args) == "", name << ": " << args);
    }
}

// A strict tool under tool_choice auto: the random model is pushed to open a call (logit_bias on
// the marker token); the call's arguments follow the schema.
BOOST_FIXTURE_TEST_CASE(strict_tools_under_auto, schema_server) {
    http_client client(srv.port(), 120s);
    const int32_t marker = srv.model().tok->find_added("<｜tool▁calls▁begin｜>");
    BOOST_TEST_REQUIRE(marker >= 0);
    for (bool stream : {false, true}) {
        const auto r = client.post(
            "/v1/chat/completions",
            chat(R"("tools":[)" + tool("read_file", schema_of("read_file"), true) + "," +
                 tool("free", "{}", false) +
                 R"(],"tool_choice":"auto","parallel_tool_calls":false,"seed":4,"stream":)" +
                 (stream ? "true" : "false") + R"(,"logit_bias":{")" + std::to_string(marker) + R"(":100})"));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        std::string name, args, finish;
        if (!stream) {
            json_doc d(r.body);
            finish = d.str({"choices", "0", "finish_reason"});
            name = d.str({"choices", "0", "message", "tool_calls", "0", "function", "name"});
            args = d.str({"choices", "0", "message", "tool_calls", "0", "function", "arguments"});
        } else {
            for (const auto& ev : sse_events(r.body)) {
                if (ev == "[DONE]") continue;
                json_doc d(ev);
                if (d.has({"choices", "0", "finish_reason"}) && !d.is_null({"choices", "0", "finish_reason"}))
                    finish = d.str({"choices", "0", "finish_reason"});
                name += d.str({"choices", "0", "delta", "tool_calls", "0", "function", "name"});
                args += d.str({"choices", "0", "delta", "tool_calls", "0", "function", "arguments"});
            }
        }
        BOOST_TEST(finish == "tool_calls", r.body);
        BOOST_TEST_REQUIRE((name == "read_file" || name == "free"), r.body);
        if (name == "read_file")
            BOOST_TEST(schema_validator(schema_of("read_file")).check(args) == "", args);
        else
            BOOST_TEST(json_doc(args).root().is_object(), args);
    }
}

BOOST_FIXTURE_TEST_CASE(unsupported_keywords_are_a_400, schema_server) {
    http_client client(srv.port(), 60s);
    const std::string patterned =
        R"({"type":"object","properties":{"city":{"type":"string","pattern":"^[A-Z]"}},"required":["city"]})";
    // Strict: refused, naming the keyword.
    check_api_error(client.post("/v1/chat/completions", chat(R"("tools":[)" + tool("w", patterned, true) +
                                                             R"(],"tool_choice":"required")")),
                    400, "invalid_request_error", "tools[0].function.parameters.properties.city.pattern");
    // Not strict: the call is still forced, with what can be enforced.
    const auto lenient = client.post(
        "/v1/chat/completions",
        chat(R"("tools":[)" + tool("w", patterned, false) + R"(],"tool_choice":"required","seed":2)", 80));
    BOOST_TEST_REQUIRE(lenient.status == 200, lenient.body);
    BOOST_TEST(json_doc(json_doc(lenient.body)
                            .str({"choices", "0", "message", "tool_calls", "0", "function", "arguments"}))
                   .has({"city"}));
    // auto without strict tools: the schema is not compiled, so it is never refused.
    const auto untouched = client.post(
        "/v1/chat/completions", chat(R"("tools":[)" + tool("w", patterned, false) + R"(],"seed":2)", 8));
    BOOST_TEST(untouched.status == 200, untouched.body);
    check_api_error(
        client.post(
            "/v1/chat/completions",
            chat(
                R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string","format":"date","not":{"const":""}}}}}})")),
        400, "invalid_request_error", "response_format.json_schema.schema.properties.a.not");
    check_api_error(
        client.post(
            "/v1/chat/completions",
            chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"array"}}})")),
        400, "invalid_request_error", "response_format.json_schema.schema");
    check_api_error(
        client.post("/v1/chat/completions",
                    chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":5}})")),
        400, "invalid_request_error", "response_format.json_schema.schema");
    check_still_serving(srv.port());
}

// ---- the serving fixes ---------------------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(max_tokens_zero_on_every_route, schema_server) {
    http_client client(srv.port(), 60s);
    for (const auto& [route, body] : std::vector<std::pair<std::string, std::string>>{
             {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":0})"},
             {"/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":0})"},
             {"/v1/completions", R"({"prompt":"Once upon a time","max_tokens":0})"},
             {"/completion", R"({"prompt":"Once upon a time","n_predict":0})"}}) {
        const auto r = client.post(route, body);
        BOOST_TEST_REQUIRE(r.status == 200, route << ": " << r.body);
        json_doc d(r.body);
        if (route == "/completion") {
            BOOST_TEST(d.integer({"tokens_predicted"}) == 0);
            BOOST_TEST(d.integer({"tokens_evaluated"}) > 0);
            BOOST_TEST(d.str({"content"}) == "");
        } else {
            BOOST_TEST(d.integer({"usage", "completion_tokens"}) == 0, r.body);
            BOOST_TEST(d.integer({"usage", "prompt_tokens"}) > 0, r.body);
            BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "length", r.body);
        }
    }
}

// echo + logprobs scores the prompt: the echoed tokens carry log-probabilities (the first null);
// the last one agrees with what the same model gave that token when it generated it.
BOOST_FIXTURE_TEST_CASE(echo_scores_the_prompt, schema_server) {
    http_client client(srv.port(), 60s);
    // What the model gives the token it generates after the prompt (greedy: the raw distribution).
    const auto gen = client.post(
        "/completion", R"({"prompt":[3,1000,2000,3000],"n_predict":1,"temperature":0,"n_probs":1})");
    BOOST_TEST_REQUIRE(gen.status == 200, gen.body);
    json_doc g(gen.body);
    const int64_t next = g.integer({"tokens", "0"});
    double generated_lp = 0;
    BOOST_TEST_REQUIRE(
        g.root()["completion_probabilities"].at(0)["logprob"].get(generated_lp) == simdjson::SUCCESS,
        gen.body);
    const std::string prompt = "[3,1000,2000,3000," + std::to_string(next) + "]";

    for (bool stream : {false, true}) {
        const auto r =
            client.post("/v1/completions", R"({"prompt":)" + prompt +
                                               R"(,"max_tokens":0,"echo":true,"logprobs":2,"stream":)" +
                                               (stream ? "true" : "false") + "}");
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        std::string body = r.body;
        if (stream) body = sse_events(r.body).at(0);  // the echo and its log-probabilities come first
        json_doc d(body);
        auto lp = d.root()["choices"].at(0)["logprobs"];
        auto tokens = lp["tokens"].get_array().value_unsafe();
        auto values = lp["token_logprobs"].get_array().value_unsafe();
        auto tops = lp["top_logprobs"].get_array().value_unsafe();
        auto offsets = lp["text_offset"].get_array().value_unsafe();
        BOOST_TEST_REQUIRE(tokens.size() == 5u, body);
        BOOST_TEST(values.size() == 5u);
        BOOST_TEST(tops.size() == 5u);
        BOOST_TEST(offsets.size() == 5u);
        BOOST_TEST(values.at(0).value_unsafe().is_null());
        BOOST_TEST(tops.at(0).value_unsafe().is_null());
        for (size_t i = 1; i < 5; ++i) {
            BOOST_TEST(values.at(i).value_unsafe().get_double().value_unsafe() <= 0.0);
            BOOST_TEST(tops.at(i).value_unsafe().get_object().value_unsafe().size() == 2u);
        }
        const double scored = values.at(4).value_unsafe().get_double().value_unsafe();
        BOOST_TEST(std::fabs(scored - generated_lp) < 1e-3,
                   "scored " << scored << ", generated " << generated_lp);
        BOOST_TEST(offsets.at(0).value_unsafe().get_int64().value_unsafe() == 0);
        if (!stream) BOOST_TEST(json_doc(body).integer({"usage", "completion_tokens"}) == 0);
    }
    // A text prompt: the BOS the server adds is not echoed; the text and offsets line up.
    const auto t = client.post(
        "/v1/completions",
        R"({"prompt":"Once upon a time","max_tokens":2,"echo":true,"logprobs":1,"temperature":0})");
    BOOST_TEST_REQUIRE(t.status == 200, t.body);
    json_doc d(t.body);
    const std::string text = d.str({"choices", "0", "text"});
    BOOST_TEST(text.starts_with("Once upon a time"));
    auto lp = d.root()["choices"].at(0)["logprobs"];
    auto tokens = lp["tokens"].get_array().value_unsafe();
    auto offsets = lp["text_offset"].get_array().value_unsafe();
    const size_t echoed = size_t(d.integer({"usage", "prompt_tokens"})) - 1;  // all but the BOS
    BOOST_TEST_REQUIRE(tokens.size() == echoed + 2, t.body);
    std::string joined;
    for (size_t i = 0; i < echoed; ++i) {
        BOOST_TEST(size_t(offsets.at(i).value_unsafe().get_int64().value_unsafe()) == joined.size());
        joined += std::string(tokens.at(i).value_unsafe().get_string().value_unsafe());
    }
    BOOST_TEST(joined == "Once upon a time");
    BOOST_TEST(offsets.at(echoed).value_unsafe().get_int64().value_unsafe() == int64_t(joined.size()));
    BOOST_TEST(lp["token_logprobs"].at(0).value_unsafe().is_null());
    BOOST_TEST(d.integer({"usage", "completion_tokens"}) == 2);
}

BOOST_FIXTURE_TEST_CASE(models_by_id, schema_server) {
    http_client client(srv.port());
    for (const char* path : {"/v1/models/tiny", "/models/tiny", "/v1/models/t%69ny"}) {
        const auto r = client.get(path);
        BOOST_TEST_REQUIRE(r.status == 200, path << ": " << r.body);
        json_doc d(r.body);
        BOOST_TEST(d.str({"id"}) == "tiny");
        BOOST_TEST(d.str({"object"}) == "model");
        BOOST_TEST(d.integer({"meta", "n_ctx"}) == 4096);
    }
    check_api_error(client.get("/v1/models/gpt-4o"), 404, "invalid_request_error", "model");
    check_api_error(client.get("/v1/models/org/tiny"), 404, "invalid_request_error", "model");
    const auto post = client.post("/v1/models/tiny", "{}");
    BOOST_TEST(post.status == 405);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
