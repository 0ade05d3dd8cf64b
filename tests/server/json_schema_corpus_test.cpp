// Schema-following output over the real DeepSeek vocabulary (129k tokens), for the tool schemas
// real agents send (tools/agent_schemas.h): a random "model" (uniform random logits through the
// real sampler, masked as the engine masks them) writes response_format JSON, forced tool calls
// and lazy strict tool calls, and every output validates against its schema with an
// independent validator (json_schema_validator.h). An adversary that always picks the token
// leaving the most to do still ends within the limit, and the mask is exactly the token-by-token
// answer in schema, union and free-text states. The mask's cost per token is printed (and
// measured properly by `moestream bench constraint`); it is not asserted.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/test_support.h"
#include "json_schema_validator.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "server/output_constraint.h"
#include "server/output_parser.h"
#include "server_fixture.h"
#include "tools/agent_schemas.h"

namespace moestream::test {
namespace {

using server::output_constraint;

constexpr int64_t k_vocab = 129280;
constexpr uint64_t k_seeds = sanitized_build() ? 1 : 2;

auto needs_tokenizer() {
    return requires_path(tokenizer_json_path());
}

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

std::shared_ptr<const server::json_schema> compiled(std::string_view schema) {
    auto s = server::json_schema::compile(schema, "schema", server::schema_mode::exact);
    if (!s) BOOST_FAIL(std::string(schema) << ": " << s.error().message);
    return *s;
}

struct mask_times {
    double total_s = 0, max_s = 0;
    int64_t steps = 0;
    void add(double s) {
        total_s += s;
        max_s = std::max(max_s, s);
        ++steps;
    }
    double mean_us() const { return steps ? total_s / double(steps) * 1e6 : 0; }
};

struct generated {
    std::vector<int32_t> tokens;
    std::string text;
    bool done = false;
};

// The model's choice at one step, given the allowed mask: -1 lets the random sampler choose.
using chooser = std::function<int32_t(const output_constraint&, const std::vector<uint8_t>&, int64_t step)>;

// Samples like the engine: random logits, the forbidden ones at -inf, the real sampler; a token
// the sampler picks that is a stop token (the end of sequence, allowed in free text) ends it.
generated sample_under(output_constraint& c, const tokenizer& tok, uint64_t seed, int64_t max_tokens,
                       mask_times& times, const chooser& choose = nullptr) {
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
        bool any = false;
        for (size_t v = 0; v < row.size(); ++v) {
            any |= mask[v] != 0;
            row[v] = mask[v] ? float(noise.uniform() * 8.0) : -std::numeric_limits<float>::infinity();
        }
        BOOST_TEST_REQUIRE(any, "no token allowed after " << g.text);
        if (!c.free())
            BOOST_TEST_REQUIRE(mask[size_t(eos)] == 0, "the end of sequence is allowed inside a shape");
        row[size_t(eos)] = -std::numeric_limits<float>::infinity();  // this model goes on
        const uint32_t cost = c.cost();
        const bool closing = c.closing();
        int32_t token = choose ? choose(c, mask, n) : -1;
        if (token < 0) {
            if (auto st = s.sample(row, r); !st) BOOST_FAIL(st.message());
            token = r.token;
        }
        BOOST_TEST_REQUIRE(mask[size_t(token)] == 1);
        c.accept(token);
        if (closing)
            BOOST_TEST_REQUIRE(c.cost() < cost, "closing, yet the cost did not fall after " << g.text);
        g.tokens.push_back(token);
        g.text += tok.token_bytes(token);
    }
    g.done = c.done();
    return g;
}

server::output_parser parse_output(const generated& g, const tokenizer& tok, bool reasoning) {
    server::parser_options o;
    o.tools_enabled = true;
    o.reasoning_enabled = reasoning;
    server::output_parser parser(o);
    utf8_stream_decoder utf8;
    for (int32_t t : g.tokens) parser.push(utf8.push(tok.token_bytes(t)));
    parser.push(utf8.finish());
    parser.finish();
    return parser;
}

std::vector<server::tool_spec> corpus_tools() {
    std::vector<server::tool_spec> tools;
    for (const auto& a : tools::k_agent_schemas) tools.push_back({std::string(a.name), compiled(a.schema)});
    return tools;
}

std::string_view schema_of(std::string_view name) {
    for (const auto& a : tools::k_agent_schemas)
        if (a.name == name) return a.schema;
    return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(json_schema_corpus, *needs_tokenizer())

BOOST_AUTO_TEST_CASE(response_format_outputs_validate) {
    const auto& tok = deepseek_tokenizer();
    auto table = server::token_table::of(tok);
    int64_t validated = 0;
    for (const auto& a : tools::k_agent_schemas) {
        const auto schema = compiled(a.schema);
        const schema_validator v(a.schema);
        mask_times times;
        for (auto [max_tokens, budget] : {std::pair<int64_t, size_t>{400, 8192}, {120, 48}}) {
            for (uint64_t seed = 1; seed <= k_seeds; ++seed) {
                server::constraint_limits limits;
                limits.max_tokens = max_tokens;
                limits.json_budget_bytes = budget;
                auto c = server::json_object_constraint(table, limits, schema);
                const auto g = sample_under(*c, tok, seed * 131 + uint64_t(max_tokens), max_tokens, times);
                BOOST_TEST_REQUIRE(g.done,
                                   a.name << ": not done within " << max_tokens << " tokens: " << g.text);
                BOOST_TEST_REQUIRE(v.check(g.text) == "", a.name << ": " << g.text);
                ++validated;
            }
        }
        BOOST_TEST_MESSAGE(a.name << ": mask " << times.mean_us() << " us/token mean, " << times.max_s * 1e6
                                  << " us max over " << times.steps << " tokens");
    }
    BOOST_TEST(validated == int64_t(2 * k_seeds * tools::k_agent_schemas.size()));
}

BOOST_AUTO_TEST_CASE(forced_tool_call_arguments_validate) {
    const auto& tok = deepseek_tokenizer();
    auto table = server::token_table::of(tok);
    std::map<std::string, int> calls_per_tool;
    mask_times times;
    for (int64_t max_tokens : {160, 500}) {
        for (uint64_t seed = 1; seed <= 4 * k_seeds; ++seed) {
            server::constraint_limits limits;
            limits.max_tokens = max_tokens;
            limits.json_budget_bytes = max_tokens < 200 ? 64 : 8192;
            auto c = server::tool_call_constraint(table, tok, corpus_tools(), limits, {});
            const auto g = sample_under(*c, tok, seed * 17 + uint64_t(max_tokens), max_tokens, times);
            BOOST_TEST_REQUIRE(g.done, "not done within " << max_tokens << " tokens: " << g.text);
            const auto parser = parse_output(g, tok, false);
            BOOST_TEST_REQUIRE(parser.tool_calls().size() == 1u, g.text);
            const auto& call = parser.tool_calls()[0];
            BOOST_TEST(call.complete);
            BOOST_TEST(parser.content().empty(), parser.content());
            const auto schema = schema_of(call.name);
            BOOST_TEST_REQUIRE(!schema.empty(), "called an unknown tool " << call.name);
            BOOST_TEST_REQUIRE(schema_validator(schema).check(call.arguments) == "",
                               call.name << ": " << call.arguments);
            ++calls_per_tool[call.name];
        }
    }
    BOOST_TEST(calls_per_tool.size() >= 3u);  // random choices reach different tools
    BOOST_TEST_MESSAGE("forced calls over the corpus: mask " << times.mean_us() << " us/token mean");
}

// Strict tools under tool_choice auto: free text (the model here writes some, then calls), the
// call's arguments follow the tool's schema, more calls may follow, and the section ends the
// output. Markers inside the reasoning are reasoning text, not a call.
BOOST_AUTO_TEST_CASE(lazy_strict_calls_validate) {
    const auto& tok = deepseek_tokenizer();
    auto table = server::token_table::of(tok);
    const int32_t calls_begin = tok.find_added("<｜tool▁calls▁begin｜>");
    BOOST_TEST_REQUIRE(calls_begin >= 0);
    mask_times times;
    int64_t calls = 0;
    for (uint64_t seed = 1; seed <= 3 * k_seeds; ++seed) {
        server::constraint_limits limits;
        limits.max_tokens = 600;
        server::tool_call_options o;
        o.lazy = true;
        o.parallel = seed % 2 == 0;
        o.reasoning = output_constraint::reasoning_start::may_open;
        auto c = server::tool_call_constraint(table, tok, corpus_tools(), limits, o);
        // Some text first, then the call marker as soon as the text allows it.
        const int64_t text_tokens = int64_t(seed % 3) * 4;
        const auto g =
            sample_under(*c, tok, seed * 7, limits.max_tokens, times,
                         [&](const output_constraint& oc, const std::vector<uint8_t>& mask, int64_t n) {
                             if (oc.free() && n >= text_tokens && mask[size_t(calls_begin)])
                                 return calls_begin;
                             return int32_t(-1);
                         });
        BOOST_TEST_REQUIRE(g.done, "not done: " << g.text);
        const auto parser = parse_output(g, tok, true);
        BOOST_TEST_REQUIRE(!parser.tool_calls().empty(), g.text);
        if (!o.parallel) BOOST_TEST(parser.tool_calls().size() == 1u);
        for (const auto& call : parser.tool_calls()) {
            BOOST_TEST(call.complete);
            BOOST_TEST_REQUIRE(schema_validator(schema_of(call.name)).check(call.arguments) == "",
                               call.name << ": " << call.arguments);
            ++calls;
        }
    }
    BOOST_TEST(calls >= int64_t(3 * k_seeds));
    BOOST_TEST_MESSAGE("lazy calls: mask " << times.mean_us() << " us/token mean");

    // In the reasoning the marker is text; after "</think>" it starts a call.
    server::tool_call_options o;
    o.lazy = true;
    o.reasoning = output_constraint::reasoning_start::may_open;
    auto c = server::tool_call_constraint(table, tok, corpus_tools(), {}, o);
    for (int32_t t : tok.encode("<think>Let me", false)) c->accept(t);
    c->accept(calls_begin);
    BOOST_TEST(c->free(), "a marker inside the reasoning started a call");
    for (int32_t t : tok.encode(" see.</think>", false)) c->accept(t);
    BOOST_TEST(c->free());
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    c->allowed(mask);
    BOOST_TEST(mask[size_t(tok.data().eos_id)] == 1, "free text may end");
    c->accept(calls_begin);
    BOOST_TEST(!c->free(), "after the reasoning the marker starts a call");
    c->allowed(mask);
    BOOST_TEST(mask[size_t(tok.data().eos_id)] == 0);
    BOOST_TEST(mask[size_t(tok.find_added("<｜tool▁call▁begin｜>"))] == 1);
}

// An adversary that always takes the allowed token leaving the most to do ends within the limit.
BOOST_AUTO_TEST_CASE(an_adversary_cannot_prevent_the_end) {
    const auto& tok = deepseek_tokenizer();
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    for (std::string_view name : {"Edit", "browser", "TodoWrite"}) {
        const auto schema = compiled(schema_of(name));
        // The shortest output's cost (every byte a token) and some room beyond it.
        const int64_t shortest =
            server::json_object_constraint(server::token_table::of(tok), {}, schema)->cost();
        for (int64_t max_tokens : {shortest, shortest + 40}) {
            server::constraint_limits limits;
            limits.max_tokens = max_tokens;
            auto c = server::json_object_constraint(server::token_table::of(tok), limits, schema);
            sampler_rng pick(uint64_t(max_tokens) + name.size());
            std::string text;
            int64_t n = 0;
            for (; n < max_tokens && !c->done(); ++n) {
                c->allowed(mask);
                std::vector<int32_t> allowed;
                for (int32_t id = 0; id < k_vocab; ++id)
                    if (mask[size_t(id)]) allowed.push_back(id);
                BOOST_TEST_REQUIRE(!allowed.empty(), name << ": no token after " << text);
                int32_t worst = allowed[0];
                uint32_t worst_cost = 0;
                for (int k = 0; k < 32; ++k) {
                    const int32_t id = allowed[size_t(pick.next() % allowed.size())];
                    output_constraint probe = *c;
                    probe.accept(id);
                    if (probe.cost() >= worst_cost) worst = id, worst_cost = probe.cost();
                }
                c->accept(worst);
                text += tok.token_bytes(worst);
            }
            BOOST_TEST(c->done(), name << " max_tokens " << max_tokens << ": " << text);
            if (c->done())
                BOOST_TEST(schema_validator(schema_of(name)).check(text) == "", name << ": " << text);
        }
    }
}

// allowed() (prefix sharing, pruning, string text decided at once within length bounds, several
// alternatives followed together, free text decided without a walk) marks exactly the tokens
// that allows() accepts one by one.
BOOST_AUTO_TEST_CASE(the_mask_is_the_token_by_token_answer) {
    const auto& tok = deepseek_tokenizer();
    auto table = server::token_table::of(tok);
    std::vector<uint8_t> mask(static_cast<size_t>(k_vocab));
    sampler_rng rng(91);
    const int64_t per_shape = sanitized_build() ? 4 : 14;
    int64_t states = 0;
    // Checks n_states states, moving on by a random allowed token (advance false: the last state
    // is checked and left as it is).
    auto check_along = [&](output_constraint& c, const char* what, int64_t n_states, bool advance = true) {
        for (int64_t k = 0; k < n_states && !c.done(); ++k) {
            c.allowed(mask);
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < k_vocab; ++id) {
                BOOST_TEST_REQUIRE(bool(mask[size_t(id)]) == c.allows(id),
                                   what << ": token " << id << " at state " << k);
                if (mask[size_t(id)]) allowed.push_back(id);
            }
            BOOST_TEST_REQUIRE(!allowed.empty());
            ++states;
            if (advance || k + 1 < n_states) c.accept(allowed[size_t(rng.next() % allowed.size())]);
        }
    };
    for (std::string_view name : {"TodoWrite", "browser", "run", "read_file"}) {
        server::constraint_limits limits;
        limits.max_tokens = 200;
        limits.json_budget_bytes = name == "run" ? 20 : 8192;  // closing states too
        auto c = server::json_object_constraint(table, limits, compiled(schema_of(name)));
        // Into the interesting part first: the browser's union, TodoWrite's strings.
        if (name == "browser")
            for (int32_t t : tok.encode(R"({"action":{"type":")", false)) c->accept(t);
        if (name == "TodoWrite")
            for (int32_t t : tok.encode(R"({"todos":[{"content":")", false)) c->accept(t);
        check_along(*c, std::string(name).c_str(), per_shape);
    }
    // Lazy calls: free text at a root, after a '<' (a marker may be starting), then in the call.
    server::tool_call_options o;
    o.lazy = true;
    o.parallel = true;
    o.reasoning = output_constraint::reasoning_start::may_open;
    auto lazy = server::tool_call_constraint(table, tok, corpus_tools(), {}, o);
    check_along(*lazy, "free start", 1, false);
    for (int32_t t : tok.encode("Sure", false)) lazy->accept(t);
    check_along(*lazy, "free content", 1, false);
    for (int32_t t : tok.encode(" <", false)) lazy->accept(t);
    check_along(*lazy, "free after <", 1, false);
    for (int32_t t : tok.encode("｜tool▁calls▁begin｜>", false)) lazy->accept(t);
    BOOST_TEST_REQUIRE(!lazy->free(), "the spelled marker did not start a call");
    check_along(*lazy, "lazy call", per_shape);
    BOOST_TEST_MESSAGE(states << " states checked");
    BOOST_TEST(states > 4 * per_shape);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
