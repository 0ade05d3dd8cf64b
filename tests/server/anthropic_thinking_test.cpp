// Anthropic's thinking budget as the engine applies it (server/reasoning_budget.h), over the real
// DeepSeek vocabulary (which has no "</think>" token: the closing is spelled by ordinary tokens):
// whatever a random model or an adversary picks, the reasoning ends with "</think>" within the
// budget; a model that closes its reasoning itself is never held.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/test_support.h"
#include "model/tokenizer.h"
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

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
