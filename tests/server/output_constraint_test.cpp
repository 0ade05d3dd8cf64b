// Output constraints over the real DeepSeek vocabulary (129k tokens): a random "model" (uniform
// random logits through the real sampler, masked as the engine masks them) always ends a forced
// JSON object or tool call within its token limit, and what it wrote parses; an adversary that
// always picks the token farthest from the end cannot stop it either. Then end to end through
// HTTP on the forged tiny model: tool_choice required / named, streamed and not, response_format.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <optional>
#include <set>
#include <simdjson.h>
#include <string>
#include <vector>

#include "../common/test_support.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "server/constraint_request.h"
#include "server/output_constraint.h"
#include "server/output_parser.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

using server::output_constraint;

constexpr int64_t k_vocab = 129280;  // DeepSeek-V3's, as forge pads it
// Random outputs per configuration (fewer under the sanitizers, which are much slower).
constexpr uint64_t k_seeds = sanitized_build() ? 1 : 4;

auto needs_tokenizer() { return requires_path(tokenizer_json_path()); }

const tokenizer& deepseek_tokenizer() {
    static std::optional<tokenizer> tok;
    if (!tok) {
        auto data = load_hf_tokenizer(tokenizer_json_path().string(), k_vocab);
        if (!data.ok()) BOOST_FAIL("loading the tokenizer: " << data.message());
        auto t = tokenizer::create(std::move(*data));
        if (!t.ok()) BOOST_FAIL("building the tokenizer: " << t.message());
        tok.emplace(std::move(*t));
    }
    return *tok;
}

struct step_times {
    double total_s = 0, max_s = 0;
    int64_t steps = 0;
    void add(double s) {
        total_s += s;
        max_s = std::max(max_s, s);
        ++steps;
    }
};

struct generated {
    std::vector<int32_t> tokens;
    std::string text;
    bool done = false;
};

// Samples like the engine: random logits, the forbidden ones at -inf, the real sampler.
generated sample_under(output_constraint& c, const tokenizer& tok, uint64_t seed, int64_t max_tokens,
                       step_times& times) {
    sampling_params p;
    p.temperature = 1.0f;
    p.seed = seed;
    sampler s(p, k_vocab);
    sampler_rng noise(seed * 7919 + 1);
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    std::vector<float> row(static_cast<size_t>(k_vocab));
    sample_result r;
    generated g;
    const int32_t eos = tok.data().eos_id;
    for (int64_t n = 0; n < max_tokens && !c.done(); ++n) {
        const auto t0 = std::chrono::steady_clock::now();
        c.allowed(mask);
        times.add(seconds_since(t0));
        BOOST_TEST_REQUIRE(mask[size_t(eos)] == 0, "the end-of-sequence token is allowed");
        bool any = false;
        for (size_t v = 0; v < row.size(); ++v) {
            any |= mask[v] != 0;
            row[v] = mask[v] ? float(noise.uniform() * 8.0) : -std::numeric_limits<float>::infinity();
        }
        BOOST_TEST_REQUIRE(any, "no token allowed after " << g.text);
        const uint32_t cost = c.cost();
        const bool closing = c.closing();
        if (auto st = s.sample(row, r); !st) BOOST_FAIL(st.message());
        BOOST_TEST_REQUIRE(mask[size_t(r.token)] == 1);
        c.accept(r.token);
        if (closing) BOOST_TEST_REQUIRE(c.cost() < cost, "closing, yet the cost did not fall after " << g.text);
        g.tokens.push_back(r.token);
        g.text += tok.token_bytes(r.token);
    }
    g.done = c.done();
    return g;
}

bool parse_object(const std::string& text, simdjson::dom::parser& parser, simdjson::dom::object& out) {
    simdjson::dom::element e;
    if (parser.parse(simdjson::padded_string(text)).get(e) != simdjson::SUCCESS) return false;
    return e.get_object().get(out) == simdjson::SUCCESS;
}

// The text through the server's pipeline (token bytes -> UTF-8 -> tool-call parser).
server::output_parser parse_output(const generated& g, const tokenizer& tok) {
    server::parser_options o;
    o.tools_enabled = true;
    server::output_parser parser(o);
    utf8_stream_decoder utf8;
    for (int32_t t : g.tokens) parser.push(utf8.push(tok.token_bytes(t)));
    parser.push(utf8.finish());
    parser.finish();
    return parser;
}

const std::vector<std::string> k_names = {"get_weather", "get", "search.web", "x-1"};

void report(const char* what, const step_times& t) {
    BOOST_TEST_MESSAGE(what << ": allowed() over " << k_vocab << " tokens: mean "
                            << (t.total_s / double(std::max<int64_t>(1, t.steps))) * 1e3 << " ms, max "
                            << t.max_s * 1e3 << " ms (" << t.steps << " steps)");
    // The aim is < 5 ms per step in Release; the bound leaves room for a loaded machine.
    if (!sanitized_build()) BOOST_TEST(t.total_s / double(std::max<int64_t>(1, t.steps)) < 0.025);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(output_constraint_vocab, *needs_tokenizer())

BOOST_AUTO_TEST_CASE(the_token_table) {
    const auto& tok = deepseek_tokenizer();
    const auto t0 = std::chrono::steady_clock::now();
    const server::token_table fresh(tok);
    BOOST_TEST_MESSAGE("building the token table of " << k_vocab << " tokens: " << seconds_since(t0) * 1e3 << " ms");
    const auto t = server::token_table::of(tok);
    BOOST_TEST(server::token_table::of(tok).get() == t.get());  // built once, shared
    BOOST_TEST(fresh.ordinary_tokens().ids == t->ordinary_tokens().ids);
    BOOST_TEST(t->vocab() == k_vocab);
    BOOST_TEST(t->has_every_byte());
    const auto& all = t->ordinary_tokens();
    BOOST_TEST(all.ids.size() > 100000u);
    std::set<int32_t> seen(all.ids.begin(), all.ids.end());
    BOOST_TEST(seen.size() == all.ids.size());
    // String text and the rest split the ordinary tokens; most are string text.
    const auto& other = t->other_than_string_text();
    BOOST_TEST(other.ids.size() + t->string_text().size() == all.ids.size());
    BOOST_TEST(t->string_text().size() > all.ids.size() * 3 / 4);
    std::set<int32_t> split(other.ids.begin(), other.ids.end());
    split.insert(t->string_text().begin(), t->string_text().end());
    BOOST_TEST((split == seen));
    for (const auto* list : {&all, &other}) {
        for (size_t i = 1; i < list->ids.size(); ++i) {
            const auto a = t->bytes(list->ids[i - 1]), b = t->bytes(list->ids[i]);
            BOOST_TEST_REQUIRE(a.compare(b) <= 0, "tokens " << list->ids[i - 1] << " and " << list->ids[i] << " out of order");
            size_t k = 0;
            while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
            BOOST_TEST_REQUIRE(list->shared[i] == k);
        }
    }
    // Each string text token, quoted, is a JSON string of its own (simdjson decides).
    simdjson::dom::parser parser;
    for (int32_t id : t->string_text()) {
        const auto b = t->bytes(id);
        BOOST_TEST_REQUIRE(b.find("\xEF\xBD\x9C") == std::string_view::npos, "token " << id);
        std::string quoted = "\"";
        quoted.append(b).push_back('"');
        std::string_view str;
        BOOST_TEST_REQUIRE(parser.parse(simdjson::padded_string(quoted)).get(str) == simdjson::SUCCESS, "token " << id);
    }
    BOOST_TEST((std::find(t->string_text().begin(), t->string_text().end(), tok.encode("hello", false)[0]) !=
                t->string_text().end()));
    for (int32_t id : {tok.data().eos_id, tok.data().bos_id, tok.find_added("<｜tool▁calls▁begin｜>")}) {
        BOOST_TEST_REQUIRE(id >= 0);
        BOOST_TEST(!t->ordinary(id), "added token " << id);
    }
    BOOST_TEST(t->bytes(tok.find_added("<｜tool▁sep｜>")) == "<｜tool▁sep｜>");
}

BOOST_AUTO_TEST_CASE(random_json_objects_end_and_parse) {
    const auto& tok = deepseek_tokenizer();
    step_times times;
    int64_t n = 0;
    for (int64_t max_tokens : {8, 24, 60, 200}) {
        for (size_t budget : {size_t(16), size_t(8192)}) {
            for (uint64_t seed = 1; seed <= k_seeds; ++seed) {
                server::constraint_limits limits;
                limits.max_tokens = max_tokens;
                limits.json_budget_bytes = budget;
                auto c = server::json_object_constraint(server::token_table::of(tok), limits);
                const auto g = sample_under(*c, tok, seed + 100 * uint64_t(max_tokens), max_tokens, times);
                BOOST_TEST_REQUIRE(g.done, "not done within " << max_tokens << " tokens: " << g.text);
                BOOST_TEST(int64_t(g.tokens.size()) <= max_tokens);
                simdjson::dom::parser parser;
                simdjson::dom::object obj;
                BOOST_TEST(parse_object(g.text, parser, obj), g.text);
                BOOST_TEST(g.text.front() == '{');
                BOOST_TEST(g.text.back() == '}');
                // A small budget ends the object soon after it is spent: at most 16 tokens
                // spend it, and closing takes at most the cost then (depth <= 16, plus a few).
                if (budget == 16) BOOST_TEST(g.tokens.size() <= 16u + 16u + 12u, g.text);
                ++n;
            }
        }
    }
    BOOST_TEST(n == int64_t(8 * k_seeds));
    report("json_object", times);
}

BOOST_AUTO_TEST_CASE(random_tool_calls_end_and_parse) {
    const auto& tok = deepseek_tokenizer();
    step_times times;
    std::set<std::string> names_seen;
    for (int64_t max_tokens : {30, 60, 150, 400}) {
        for (uint64_t seed = 1; seed <= k_seeds + 2; ++seed) {
            const bool named = seed % 3 == 0;
            std::vector<std::string> names = named ? std::vector<std::string>{"search.web"} : k_names;
            server::constraint_limits limits;
            limits.max_tokens = max_tokens;
            auto c = server::tool_call_constraint(server::token_table::of(tok), tok, names, limits);
            const auto g = sample_under(*c, tok, seed * 31 + uint64_t(max_tokens), max_tokens, times);
            BOOST_TEST_REQUIRE(g.done, "not done within " << max_tokens << " tokens: " << g.text);
            const auto parser = parse_output(g, tok);
            BOOST_TEST_REQUIRE(parser.tool_calls().size() == 1u, g.text);
            const auto& call = parser.tool_calls()[0];
            BOOST_TEST(call.complete);
            BOOST_TEST(call.arguments_valid, call.arguments);
            BOOST_TEST(parser.content().empty(), parser.content());
            BOOST_TEST(parser.reasoning().empty());
            BOOST_TEST((std::find(names.begin(), names.end(), call.name) != names.end()), call.name);
            if (named) BOOST_TEST(call.name == "search.web");
            names_seen.insert(call.name);
            simdjson::dom::parser p;
            simdjson::dom::object obj;
            BOOST_TEST(parse_object(call.arguments, p, obj), call.arguments);
        }
    }
    BOOST_TEST(names_seen.size() >= 2u);  // random choices reach different names
    report("tool call", times);
}

// allowed() (prefix sharing, pruning, string text decided at once) marks exactly the tokens that
// allows() accepts one by one, in states met along random outputs of both shapes.
BOOST_AUTO_TEST_CASE(the_mask_is_the_token_by_token_answer) {
    const auto& tok = deepseek_tokenizer();
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    sampler_rng rng(77);
    int64_t states = 0, allowed_total = 0;
    for (int shape = 0; shape < 4; ++shape) {
        server::constraint_limits limits;
        limits.max_tokens = sanitized_build() ? 20 : 60;
        limits.json_budget_bytes = shape >= 2 ? 24 : 8192;  // closing states too
        std::unique_ptr<output_constraint> c =
            shape % 2 == 0 ? server::json_object_constraint(server::token_table::of(tok), limits)
                           : server::tool_call_constraint(server::token_table::of(tok), tok, k_names, limits);
        while (!c->done()) {
            c->allowed(mask);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < k_vocab; ++id) {
                BOOST_TEST_REQUIRE(bool(mask[size_t(id)]) == c->allows(id), "token " << id << " state " << states);
                if (mask[size_t(id)]) allowed.push_back(id);
            }
            BOOST_TEST_REQUIRE(!allowed.empty());
            allowed_total += int64_t(allowed.size());
            ++states;
            c->accept(allowed[size_t(rng.next() % allowed.size())]);
        }
    }
    BOOST_TEST_MESSAGE(states << " states checked, " << allowed_total << " allowed tokens in all");
    BOOST_TEST(states > 8);
}

// The markers are offered as their single tokens, and nothing else is added to the vocabulary's
// ordinary tokens: the end-of-sequence token never, other added tokens never.
BOOST_AUTO_TEST_CASE(markers_as_single_tokens) {
    const auto& tok = deepseek_tokenizer();
    auto c = server::tool_call_constraint(server::token_table::of(tok), tok, {"f"}, {});
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    c->allowed(mask);
    const int32_t begin = tok.find_added("<｜tool▁calls▁begin｜>");
    BOOST_TEST(mask[size_t(begin)] == 1);
    BOOST_TEST(mask[size_t(tok.find_added("<｜tool▁call▁begin｜>"))] == 0);
    // Every allowed token is a prefix of the marker's text, spelled by ordinary tokens.
    for (int32_t id = 0; id < k_vocab; ++id) {
        if (!mask[size_t(id)] || id == begin) continue;
        const std::string b = tok.token_bytes(id);
        BOOST_TEST_REQUIRE(std::string_view("<｜tool▁calls▁begin｜>").starts_with(b), "token " << id);
    }
    // Following the single tokens, the fixed text costs one token per marker.
    const uint32_t start = c->cost();
    c->accept(begin);
    BOOST_TEST(c->cost() == start - 1);
    c->accept(tok.find_added("<｜tool▁call▁begin｜>"));
    BOOST_TEST(c->cost() == start - 2);
}

// An adversary that always takes the allowed token leaving the most to do still ends the output
// within the limit; a limit below the shortest output closes as fast as it can.
BOOST_AUTO_TEST_CASE(an_adversary_cannot_prevent_the_end) {
    const auto& tok = deepseek_tokenizer();
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    for (int64_t max_tokens : {31, 45, 90}) {  // 31: the cost of the shortest call
        server::constraint_limits limits;
        limits.max_tokens = max_tokens;
        auto c = server::tool_call_constraint(server::token_table::of(tok), tok, k_names, limits);
        sampler_rng pick(static_cast<uint64_t>(max_tokens));
        std::string text;
        int64_t n = 0;
        for (; n < max_tokens && !c->done(); ++n) {
            c->allowed(mask);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < k_vocab; ++id)
                if (mask[size_t(id)]) allowed.push_back(id);
            BOOST_TEST_REQUIRE(!allowed.empty(), "no token after " << text);
            int32_t worst = allowed[0];
            uint32_t worst_cost = 0;
            for (int k = 0; k < 48; ++k) {
                const int32_t id = allowed[size_t(pick.next() % allowed.size())];
                output_constraint probe = *c;
                probe.accept(id);
                if (probe.cost() >= worst_cost) worst = id, worst_cost = probe.cost();
            }
            c->accept(worst);
            text += tok.token_bytes(worst);
        }
        BOOST_TEST(c->done(), "max_tokens " << max_tokens << ": " << text);
        BOOST_TEST(n <= max_tokens);
    }
    // The shortest tool call is longer than 6 tokens: every token brings the end closer.
    server::constraint_limits tiny;
    tiny.max_tokens = 6;
    auto c = server::tool_call_constraint(server::token_table::of(tok), tok, {"f"}, tiny);
    BOOST_TEST(c->closing());
    step_times times;
    const auto g = sample_under(*c, tok, 5, 6, times);
    BOOST_TEST(!g.done);
    BOOST_TEST(g.tokens.size() == 6u);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the request side ----------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(constraint_request)

BOOST_AUTO_TEST_CASE(response_format_parsing) {
    using server::output_format;
    auto format_of = [](std::string body) {
        auto r = server::parse_constraint_request(body);
        if (!r.ok()) BOOST_FAIL(body << ": " << r.error().message);
        return r->format;
    };
    BOOST_TEST((format_of(R"({"model":"x"})") == output_format::text));
    BOOST_TEST((format_of(R"({"response_format":null})") == output_format::text));
    BOOST_TEST((format_of(R"({"response_format":{"type":"text"}})") == output_format::text));
    BOOST_TEST((format_of(R"({"response_format":{"type":"json_object"}})") == output_format::json_object));
    // Schemas: chat's nested form, the flat (Responses) form, llama-server's two forms.
    BOOST_TEST((format_of(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}})") ==
                output_format::json_schema));
    BOOST_TEST((format_of(R"({"response_format":{"type":"json_schema","name":"x","strict":true,"schema":{"type":"object"}}})") ==
                output_format::json_schema));
    BOOST_TEST((format_of(R"({"response_format":{"type":"json_object","schema":{"type":"object"}}})") ==
                output_format::json_schema));
    BOOST_TEST((format_of(R"({"json_schema":{"type":"object","properties":{"a":{"type":"integer"}}}})") ==
                output_format::json_schema));
    BOOST_TEST((format_of(R"({"response_format":{"type":"json_schema","json_schema":{"name":"no schema"}}})") ==
                output_format::json_object));
    auto named = server::parse_constraint_request(R"({"response_format":{"type":"json_schema","json_schema":{"name":"todo","schema":{"type":"object"}}}})");
    BOOST_TEST_REQUIRE(named.ok());
    BOOST_TEST(named->name == "todo");
    BOOST_TEST(bool(named->schema));
    auto flat = server::parse_output_format(R"({"type":"json_schema","name":"n","schema":{"type":"object","properties":{"x":{"pattern":"a"}}}})",
                                            "text.format");
    BOOST_TEST_REQUIRE(!flat.ok());
    BOOST_TEST(flat.error().param == "text.format.schema.properties.x.pattern");
    struct bad {
        std::string body, param, says;
    };
    for (const auto& b : std::vector<bad>{
             {R"({"response_format":"json_object"})", "response_format", "expected an object"},
             {R"({"response_format":{}})", "response_format.type", "required"},
             {R"({"response_format":{"type":1}})", "response_format.type", "expected a string"},
             {R"({"response_format":{"type":"yaml"}})", "response_format.type", "unknown type 'yaml'"},
             {R"({"response_format":{"type":"json_schema","json_schema":"x"}})", "response_format.json_schema",
              "expected an object"},
             {R"({"response_format":{"type":"json_schema","json_schema":{"strict":"yes"}}})",
              "response_format.json_schema.strict", "expected a boolean"},
             {R"({"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"x":{"type":"string","pattern":"a"}}}}}})",
              "response_format.json_schema.schema.properties.x.pattern", "'pattern' is not supported"},
             {R"({"response_format":{"type":"json_object","schema":{"type":"array"}}})", "response_format.schema",
              "must describe a JSON object"},
             {R"([1])", "", ""},
         }) {
        auto r = server::parse_constraint_request(b.body);
        BOOST_TEST_REQUIRE(!r.ok(), b.body);
        BOOST_TEST(r.error().status == 400);
        BOOST_TEST(r.error().param == b.param, b.body);
        BOOST_TEST(r.error().message.find(b.says) != std::string::npos, r.error().message);
    }
}

BOOST_AUTO_TEST_CASE(which_requests_are_constrained, *needs_tokenizer()) {
    const auto& tok = deepseek_tokenizer();
    server::completion_request r;
    r.tools = {{"a", "", "{}", false, ""}, {"b", "", "{}", false, ""}};
    server::constraint_spec json;
    json.format = server::output_format::json_object;
    auto kind = [&](const server::completion_request& q, const server::constraint_spec& s) {
        auto c = server::constraint_for_request(q, s, &tok, 100);
        if (!c.ok()) BOOST_FAIL(c.error().message);
        return *c;
    };
    BOOST_TEST(!bool(kind(r, {})));  // auto
    r.choice.kind = server::tool_choice::none;
    BOOST_TEST(!bool(kind(r, {})));
    BOOST_TEST(bool(kind(r, json)));  // no call possible: the JSON object
    r.choice.kind = server::tool_choice::required;
    auto forced = kind(r, json);  // the call wins over the format
    BOOST_TEST_REQUIRE(bool(forced));
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    forced->allowed(mask);
    BOOST_TEST(mask[size_t(tok.find_added("<｜tool▁calls▁begin｜>"))] == 1);
    BOOST_TEST(mask[size_t(tok.encode("{", false)[0])] == 0);
    // A strict tool under auto: lazy calls (free text first).
    r.choice.kind = server::tool_choice::auto_;
    r.tools[0].strict = true;
    auto lazy = kind(r, {});
    BOOST_TEST_REQUIRE(bool(lazy));
    auto* oc = dynamic_cast<server::output_constraint*>(lazy.get());
    BOOST_TEST_REQUIRE(oc != nullptr);
    BOOST_TEST(oc->free());
    r.tools[0].strict = false;
    r.route = server::api_route::completions;  // tools only mean something in chat
    BOOST_TEST(!bool(kind(r, {})));
    auto no_tok = server::constraint_for_request(r, json, nullptr, 100);
    BOOST_TEST_REQUIRE(!no_tok.ok());
    BOOST_TEST(no_tok.error().param == "response_format");
}

BOOST_AUTO_TEST_SUITE_END()

// ---- end to end --------------------------------------------------------------------------------

namespace {

const std::string k_tools =
    R"([{"type":"function","function":{"name":"get_weather","description":"The weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},)"
    R"({"type":"function","function":{"name":"search","parameters":{"type":"object"}}}])";

std::string chat_body(const std::string& extra) {
    return R"({"messages":[{"role":"user","content":"What is the weather in Paris?"}],"max_tokens":80,)"
           R"("temperature":1,)" +
           extra + "}";
}

struct constrained_server {
    static live_server_options options() {
        live_server_options o;
        o.context_tokens = 1024;
        return o;
    }
    live_server srv{options()};
};

struct call_seen {
    std::string name, arguments, finish_reason;
    size_t calls = 0;
};

call_seen call_of(const std::string& body) {
    json_doc d(body);
    BOOST_TEST_REQUIRE(d.ok(), body);
    call_seen c;
    c.finish_reason = d.str({"choices", "0", "finish_reason"});
    simdjson::dom::array calls;
    auto e = d.root()["choices"].at(0)["message"]["tool_calls"];
    if (e.get_array().get(calls) == simdjson::SUCCESS) c.calls = calls.size();
    c.name = d.str({"choices", "0", "message", "tool_calls", "0", "function", "name"});
    c.arguments = d.str({"choices", "0", "message", "tool_calls", "0", "function", "arguments"});
    return c;
}

// The streamed deltas, merged as a client merges them.
call_seen streamed_call(const std::string& sse) {
    call_seen c;
    std::set<int64_t> indices;
    for (const auto& ev : sse_events(sse)) {
        if (ev == "[DONE]") continue;
        json_doc d(ev);
        BOOST_TEST_REQUIRE(d.ok(), ev);
        const std::string fr = d.str({"choices", "0", "finish_reason"});
        if (!fr.empty()) c.finish_reason = fr;
        simdjson::dom::array calls;
        auto e = d.root()["choices"].at(0)["delta"]["tool_calls"];
        if (e.get_array().get(calls) != simdjson::SUCCESS) continue;
        for (auto call : calls) {
            int64_t index = -1;
            BOOST_TEST_REQUIRE(call["index"].get(index) == simdjson::SUCCESS);
            indices.insert(index);
            std::string_view s;
            if (call["function"]["name"].get(s) == simdjson::SUCCESS) c.name += std::string(s);
            if (call["function"]["arguments"].get(s) == simdjson::SUCCESS) c.arguments += std::string(s);
        }
    }
    c.calls = indices.size();
    return c;
}

bool is_object(const std::string& text) {
    simdjson::dom::parser p;
    simdjson::dom::object o;
    return parse_object(text, p, o);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(constrained_output_http, *requires_live_server())

BOOST_FIXTURE_TEST_CASE(tool_choice_required_and_named, constrained_server) {
    http_client client(srv.port(), std::chrono::seconds(120));
    std::set<std::string> names;
    for (int seed = 1; seed <= 4; ++seed) {
        const auto r = client.post("/v1/chat/completions",
                                   chat_body(R"("tools":)" + k_tools + R"(,"tool_choice":"required","seed":)" +
                                             std::to_string(seed)));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        const auto c = call_of(r.body);
        BOOST_TEST(c.finish_reason == "tool_calls", r.body);
        BOOST_TEST(c.calls == 1u, r.body);
        BOOST_TEST((c.name == "get_weather" || c.name == "search"), r.body);
        BOOST_TEST(is_object(c.arguments), c.arguments);
        names.insert(c.name);
    }
    const auto named = client.post(
        "/v1/chat/completions",
        chat_body(R"("tools":)" + k_tools + R"(,"tool_choice":{"type":"function","function":{"name":"search"}},"seed":9)"));
    BOOST_TEST_REQUIRE(named.status == 200, named.body);
    const auto c = call_of(named.body);
    BOOST_TEST(c.finish_reason == "tool_calls");
    BOOST_TEST(c.calls == 1u);
    BOOST_TEST(c.name == "search");
    BOOST_TEST(is_object(c.arguments), c.arguments);
    // "auto" and "none" are not constrained: the random model writes whatever it writes, and a
    // text answer without tools never ends "tool_calls".
    const auto none = client.post("/v1/chat/completions",
                                  chat_body(R"("tools":)" + k_tools + R"(,"tool_choice":"none","seed":3)"));
    BOOST_TEST_REQUIRE(none.status == 200, none.body);
    BOOST_TEST(call_of(none.body).finish_reason != "tool_calls", none.body);
    BOOST_TEST(srv.wait_idle(std::chrono::seconds(10)));
}

BOOST_FIXTURE_TEST_CASE(streamed_tool_call_matches_the_whole_one, constrained_server) {
    http_client client(srv.port(), std::chrono::seconds(120));
    const std::string extra = R"("tools":)" + k_tools + R"(,"tool_choice":"required","seed":42)";
    const auto whole = client.post("/v1/chat/completions", chat_body(extra));
    BOOST_TEST_REQUIRE(whole.status == 200, whole.body);
    const auto streamed = client.post("/v1/chat/completions", chat_body(extra + R"(,"stream":true)"));
    BOOST_TEST_REQUIRE(streamed.status == 200, streamed.body);
    const auto a = call_of(whole.body), b = streamed_call(streamed.body);
    BOOST_TEST(b.finish_reason == "tool_calls", streamed.body);
    BOOST_TEST(b.calls == 1u);
    BOOST_TEST(b.name == a.name);
    BOOST_TEST(b.arguments == a.arguments);
    BOOST_TEST(is_object(b.arguments), b.arguments);
}

BOOST_FIXTURE_TEST_CASE(response_format_json_object, constrained_server) {
    http_client client(srv.port(), std::chrono::seconds(120));
    for (int seed = 1; seed <= 3; ++seed) {
        const auto r = client.post("/v1/chat/completions", chat_body(R"("response_format":{"type":"json_object"},"seed":)" +
                                                                     std::to_string(seed)));
        BOOST_TEST_REQUIRE(r.status == 200, r.body);
        json_doc d(r.body);
        BOOST_TEST(d.str({"choices", "0", "finish_reason"}) == "stop", r.body);
        const std::string content = d.str({"choices", "0", "message", "content"});
        BOOST_TEST(is_object(content), content);
    }
    // The native route too, streamed: the pieces add up to one object.
    const auto s = client.post("/completion",
                               R"({"prompt":"JSON:","n_predict":60,"stream":true,"seed":4,"temperature":1,)"
                               R"("response_format":{"type":"json_object"}})");
    BOOST_TEST_REQUIRE(s.status == 200, s.body);
    std::string content;
    for (const auto& ev : sse_events(s.body)) content += json_doc(ev).str({"content"});
    BOOST_TEST(is_object(content), content);
    // json_schema without a schema: any object (json_schema_http_test.cpp has the schemas).
    http_client other(srv.port(), std::chrono::seconds(120));
    const auto unschematic = other.post(
        "/v1/chat/completions", chat_body(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}},"seed":6)"));
    BOOST_TEST_REQUIRE(unschematic.status == 200, unschematic.body);
    BOOST_TEST(is_object(json_doc(unschematic.body).str({"choices", "0", "message", "content"})), unschematic.body);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
