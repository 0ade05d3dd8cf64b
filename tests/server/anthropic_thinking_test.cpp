// Anthropic's thinking budget as the engine applies it (server/reasoning_budget.h), over the real
// DeepSeek vocabulary (which has no "</think>" token: the closing is spelled by ordinary tokens):
// whatever a random model or an adversary picks, the reasoning ends with "</think>" within the
// budget; a model that closes its reasoning itself is never held. With a shape after the
// reasoning (a forced call, strict tools: budgeted_output), both hold at once: the reasoning
// closes within the budget, nothing ends the reply inside it, and the call that follows is whole
// and follows its schema.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/test_support.h"
#include "json_schema_validator.h"
#include "model/tokenizer.h"
#include "server/output_constraint.h"
#include "server/reasoning_budget.h"
#include "server_fixture.h"

namespace moestream::test {
namespace {

using server::reasoning_budget;

constexpr int64_t k_vocab = 129280;  // DeepSeek-V3's, as forge pads it

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

std::shared_ptr<const server::token_table> table() {
    return server::token_table::of(deepseek_tokenizer());
}

// Runs the constraint over `steps` tokens chosen by `pick` among the allowed ones; returns the
// text and the number of tokens up to and including the one that closed the reasoning (-1: never).
struct run_result {
    std::string text;
    int64_t closed_after = -1;
};
template <class Pick>
run_result run(reasoning_budget& c, int steps, Pick pick) {
    const auto t = table();
    std::vector<uint8_t> mask(size_t(t->vocab()));
    run_result r;
    for (int i = 0; i < steps; ++i) {
        c.allowed(mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < t->vocab(); ++id)
            if (mask[size_t(id)]) allowed.push_back(id);
        BOOST_TEST_REQUIRE(!allowed.empty());
        const int32_t token = pick(allowed);
        c.accept(token);
        r.text += t->bytes(token);
        if (c.closed() && r.closed_after < 0) r.closed_after = i + 1;
    }
    return r;
}

auto needs_tokenizer() {
    return requires_path(tokenizer_json_path());
}

const std::string k_city_schema =
    R"({"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],)"
    R"("additionalProperties":false})";

// The budget and, after the reasoning, get_weather's calls: forced (one call) or lazy (strict
// tools under tool_choice auto).
std::unique_ptr<server::budgeted_output> budgeted_call(int64_t budget, int64_t max_tokens, bool lazy = false) {
    auto schema = server::json_schema::compile(k_city_schema, "tools[0].function.parameters", server::schema_mode::exact);
    if (!schema) BOOST_FAIL(schema.error().message);
    server::constraint_limits limits;
    limits.max_tokens = max_tokens;
    server::tool_call_options options;
    options.lazy = lazy;
    options.reasoning = server::output_constraint::reasoning_start::open;
    std::shared_ptr<token_constraint> calls =
        server::tool_call_constraint(table(), deepseek_tokenizer(), {{"get_weather", *schema}}, limits, options);
    return std::make_unique<server::budgeted_output>(reasoning_budget::make(table(), -1, budget), std::move(calls));
}

// Runs a budgeted output until it is done or `max_tokens` were written; nothing but the closing
// may end the reasoning (the end-of-sequence token is never allowed in it when the shape is forced).
struct shaped_run {
    std::string text;
    int64_t tokens = 0, closed_after = -1;
};
template <class Pick>
shaped_run run_shaped(server::budgeted_output& c, int64_t max_tokens, bool forced, Pick pick) {
    const auto t = table();
    const int32_t eos = deepseek_tokenizer().data().eos_id;
    std::vector<uint8_t> mask(size_t(t->vocab()));
    shaped_run r;
    while (r.tokens < max_tokens && !c.done()) {
        c.allowed(mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < t->vocab(); ++id)
            if (mask[size_t(id)]) allowed.push_back(id);
        BOOST_TEST_REQUIRE(!allowed.empty(), "no token allowed after " << r.text);
        if (forced && !c.budget().closed()) BOOST_TEST_REQUIRE(!mask[size_t(eos)], "the reply may end in its reasoning");
        const int32_t token = pick(allowed);
        c.accept(token);
        r.text += t->bytes(token);
        ++r.tokens;
        if (c.budget().closed() && r.closed_after < 0) r.closed_after = r.tokens;
    }
    return r;
}

// "...</think>" + one whole call to get_weather: "" or what is wrong with it.
std::string check_call_after_reasoning(const std::string& text) {
    const std::string head = "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n";
    const std::string tail = "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    const size_t at = text.find(head);
    if (at == std::string::npos) return "no call right after the reasoning: " + text;
    if (text.find("</think>") != at) return "the reasoning closed before the call's opening: " + text;
    if (!text.ends_with(tail)) return "the call is not closed: " + text;
    const std::string args = text.substr(at + head.size(), text.size() - at - head.size() - tail.size());
    const std::string why = schema_validator(k_city_schema).check(args);
    return why.empty() ? "" : why + " in " + args;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(anthropic_thinking, *needs_tokenizer())

BOOST_AUTO_TEST_CASE(random_model_closes_within_the_budget) {
    std::mt19937_64 rng(7);
    for (int64_t budget : {1, 2, 3, 5, 8, 20, 64}) {
        for (int seed = 0; seed < 4; ++seed) {
            auto c = reasoning_budget::make(table(), -1, budget);
            BOOST_TEST_REQUIRE(c != nullptr);
            const auto r =
                run(*c, int(budget) + 10, [&](const std::vector<int32_t>& a) { return a[rng() % a.size()]; });
            BOOST_TEST_REQUIRE(r.closed_after > 0, "budget " << budget << ": never closed: " << r.text);
            // A budget below the closing's own length closes at once; any other within it.
            BOOST_TEST(r.closed_after <= std::max(budget, c->closing_cost()),
                       "budget " << budget << ": closed after " << r.closed_after);
            BOOST_TEST(r.text.find("</think>") != std::string::npos);
            BOOST_TEST(!c->closing());  // closed: nothing is restricted any more
        }
    }
}

BOOST_AUTO_TEST_CASE(an_adversary_cannot_stretch_it) {
    // Picks tokens that start the marker and then break it off ("</th" then "x"), the hardest
    // partial matches for the closing to finish from.
    const auto t = table();
    auto looks_like_marker = [&](int32_t id) {
        const std::string_view b = t->bytes(id);
        return !b.empty() && b[0] == '<' &&
               std::string_view(reasoning_budget::k_close).substr(0, b.size()) == b;
    };
    for (int64_t budget : {4, 9, 16}) {
        auto c = reasoning_budget::make(t, -1, budget);
        BOOST_TEST_REQUIRE(c->closing_cost() <= 4);  // "</think>" in at most four DeepSeek tokens
        bool flip = false;
        const auto r = run(*c, int(budget) + 4, [&](const std::vector<int32_t>& a) {
            flip = !flip;
            for (int32_t id : a)
                if (flip ? looks_like_marker(id) : t->bytes(id) == "x") return id;
            return a.front();
        });
        BOOST_TEST(r.closed_after > 0);
        BOOST_TEST(r.closed_after <= budget, "budget " << budget << ": " << r.text);
    }
}

BOOST_AUTO_TEST_CASE(a_model_that_closes_by_itself_is_free) {
    const auto& tok = deepseek_tokenizer();
    const auto close = tok.encode("</think>", false);
    auto c = reasoning_budget::make(table(), -1, 100);
    size_t i = 0;
    const auto r = run(*c, int(close.size()) + 5, [&](const std::vector<int32_t>& a) {
        if (i < close.size()) return close[i++];
        return a[a.size() / 2];
    });
    BOOST_TEST(r.closed_after == int64_t(close.size()));
    BOOST_TEST(c->used() == int64_t(close.size()));
    std::vector<uint8_t> mask(size_t(table()->vocab()));
    c->allowed(mask);
    BOOST_TEST(std::count(mask.begin(), mask.end(), uint8_t(1)) == int64_t(mask.size()));
}

BOOST_AUTO_TEST_CASE(a_forced_call_follows_the_budgeted_reasoning) {
    const auto t = table();
    std::mt19937_64 rng(11);
    auto random = [&](const std::vector<int32_t>& a) { return a[rng() % a.size()]; };
    // Starts the marker, then breaks it off, as long as it can.
    bool flip = false;
    auto adversary = [&](const std::vector<int32_t>& a) {
        flip = !flip;
        for (int32_t id : a) {
            const std::string_view b = t->bytes(id);
            if (flip ? !b.empty() && b[0] == '<' && std::string_view(reasoning_budget::k_close).starts_with(b)
                     : b == "x")
                return id;
        }
        return a.front();
    };
    for (int64_t budget : {1, 4, 20, 64}) {
        for (bool adversarial : {false, true}) {
            auto c = budgeted_call(budget, 200);
            const auto r = adversarial ? run_shaped(*c, 200, true, adversary) : run_shaped(*c, 200, true, random);
            BOOST_TEST_REQUIRE(c->done(), "budget " << budget << ": the call did not finish: " << r.text);
            BOOST_TEST(r.closed_after > 0);
            BOOST_TEST(r.closed_after <= std::max(budget, c->budget().closing_cost()),
                       "budget " << budget << ": the reasoning closed after " << r.closed_after);
            BOOST_TEST(check_call_after_reasoning(r.text) == "");
        }
    }
    // A token limit below the budget: the reasoning is closed in time for the call.
    for (int seed = 0; seed < 3; ++seed) {
        auto c = budgeted_call(500, 48);
        const auto r = run_shaped(*c, 48, true, random);
        BOOST_TEST_REQUIRE(c->done(), "the call did not finish within 48 tokens: " << r.text);
        BOOST_TEST(check_call_after_reasoning(r.text) == "");
    }
}

BOOST_AUTO_TEST_CASE(the_combined_mask_is_exact_at_the_closing) {
    // After "</think" the budget alone allows any token, ">\n\n" too; with a forced call after
    // the reasoning, a token that closes it must go on with the call's opening.
    const auto& tok = deepseek_tokenizer();
    const auto t = table();
    auto c = budgeted_call(50, 200);
    std::vector<uint8_t> mask(size_t(t->vocab()));
    for (int32_t id : tok.encode("Hmm </think", false)) {
        c->allowed(mask);
        BOOST_TEST_REQUIRE(bool(mask[size_t(id)]), "\"" << t->bytes(id) << "\" is refused in the reasoning");
        c->accept(id);
    }
    BOOST_TEST_REQUIRE(!c->budget().closed());
    c->allowed(mask);
    const std::string_view opening = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function";
    int64_t refused = 0;
    for (int32_t id = 0; id < t->vocab(); ++id) {
        const std::string_view b = t->bytes(id);
        if (!t->ordinary(id) || b.size() < 2 || b[0] != '>') continue;
        const bool starts_call = opening.starts_with(b.substr(1));
        BOOST_TEST(bool(mask[size_t(id)]) == starts_call, "after \"</think\": \"" << b << "\"");
        refused += starts_call ? 0 : 1;
    }
    BOOST_TEST(refused > 0);
    const auto close = tok.encode(">", false);
    BOOST_TEST_REQUIRE(close.size() == 1u);
    BOOST_TEST(mask[size_t(close[0])]);
    BOOST_TEST(!mask[size_t(tok.data().eos_id)]);
    c->accept(close[0]);
    BOOST_TEST(c->budget().closed());
    BOOST_TEST(c->budget().used() <= 50);
}

BOOST_AUTO_TEST_CASE(strict_tools_after_the_budgeted_reasoning) {
    // Lazy calls: the reply may end (and write text) after the reasoning, which still closes
    // within the budget.
    std::mt19937_64 rng(5);
    for (int64_t budget : {2, 10, 40}) {
        auto c = budgeted_call(budget, 120, true);
        const auto r = run_shaped(*c, budget + 20, false, [&](const std::vector<int32_t>& a) { return a[rng() % a.size()]; });
        BOOST_TEST(r.closed_after > 0, "budget " << budget << ": never closed: " << r.text);
        BOOST_TEST(r.closed_after <= std::max(budget, c->budget().closing_cost()));
    }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
