// Greedy speculative decoding gives plain greedy decoding's tokens, whatever the drafter, its
// acceptance and the draft length, and leaves the sequence as plain decoding does (the next
// step's logits bit for bit), rejected rows rolled back.
#include <algorithm>
#include <array>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <random>

#include "../common/test_support.h"
#include "fixture_model.h"
#include "spec/dspark_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/oracle_drafter.h"
#include "model/sampler.h"
#include "spec/speculative.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";
auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

// A sequence that consumed `prompt`, and the greedy token its last row chose.
int32_t prefill(fixture_model& m, dsv41::sequence_state& seq, std::span<const int32_t> prompt) {
    std::vector<float> logits;
    dsv41::forward_item item{&seq, prompt, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    return spec::greedy_token(logits);
}

// The logits of feeding `t` next (the state's fingerprint).
std::vector<float> next_logits(fixture_model& m, dsv41::sequence_state& seq, int32_t t) {
    std::vector<float> logits;
    dsv41::forward_item item{&seq, {&t, 1}, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    return logits;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(speculative)

BOOST_AUTO_TEST_CASE(greedy_output_is_plain_greedy_output, *needs()) {
    auto& m = fixture(kFx);
    constexpr int64_t n = 24;
    for (int len : {7, 40}) {
        const auto prompt = prompt_ids(kFx, len);
        // Plain greedy decoding (k = 0).
        auto plain_seq = m.sequence();
        const int32_t first = prefill(m, *plain_seq, prompt);
        spec::ngram_drafter unused;
        std::vector<int32_t> plain;
        auto p = spec::decode_greedy(*m.model, *plain_seq, first, n, unused, {}, plain);
        BOOST_TEST_REQUIRE(p.ok());
        BOOST_TEST(p->target_steps == n - 1);
        // The plain state's fingerprints: the next draft block and the next step's logits (on a
        // copy, so the plain sequence stays where decoding left it).
        auto plain_after = m.sequence();
        plain_after->copy_from(*plain_seq);
        const auto plain_next = next_logits(m, *plain_after, plain.back());
        const std::vector<int32_t> continuation(plain.begin(), plain.end());
        for (int k : {1, 3, 5}) {
            spec::ngram_drafter ngram(1, 3);
            spec::oracle_drafter exact(continuation, len, 0.0, int32_t(m.hp().vocab));
            spec::oracle_drafter half(continuation, len, 0.5, int32_t(m.hp().vocab), 7);
            auto seq_for_dspark = m.sequence();
            spec::dspark_drafter dspark(*m.model, *seq_for_dspark);
            for (spec::drafter* d : {static_cast<spec::drafter*>(&ngram), static_cast<spec::drafter*>(&exact),
                                     static_cast<spec::drafter*>(&half), static_cast<spec::drafter*>(&dspark)}) {
                auto own = m.sequence();
                auto& seq = d == &dspark ? seq_for_dspark : own;
                BOOST_TEST_REQUIRE(prefill(m, *seq, prompt) == first);
                std::vector<int32_t> got;
                spec::greedy_options o;
                o.k = k;
                auto s = spec::decode_greedy(*m.model, *seq, first, n, *d, o, got);
                BOOST_TEST_REQUIRE(s.ok());
                const std::string what = d->name() + " k " + std::to_string(k) + " prompt " + std::to_string(len);
                BOOST_TEST(got == plain, what);
                BOOST_TEST(s->accepted <= s->drafted);
                BOOST_TEST(s->target_steps + s->accepted == n - 1, what);  // every step yields one more
                // The union a verification block loads: at least a row's k experts per layer, more
                // with more rows (host-routed here: the mapping).
                for (size_t kd = 0; kd < s->steps_by_k.size(); ++kd) {
                    BOOST_TEST(s->counted_by_k[kd] == s->steps_by_k[kd]);
                    if (s->counted_by_k[kd] > 0)
                        BOOST_TEST(s->experts_by_k[kd] >= s->counted_by_k[kd] * m.hp().n_active * m.hp().n_layers);
                }
                if (d == &exact) BOOST_TEST(s->accepted == s->drafted, what);
                if (d == &half && k > 1) BOOST_TEST(s->accepted < s->drafted, what);  // some were rejected
                BOOST_TEST_MESSAGE(what << ": " << s->target_steps << " target steps, accepted " << s->accepted
                                        << " of " << s->drafted);
                if (d == &dspark) BOOST_TEST(dspark.error().empty(), dspark.error());
                // The state after the rejections is plain decoding's, bit for bit: the target's
                // and the draft head's (its next block from the same token).
                dsv41::draft_output want_draft, got_draft;
                BOOST_TEST_REQUIRE(m.model->draft(*plain_seq, got.back(), want_draft).ok());
                BOOST_TEST_REQUIRE(m.model->draft(*seq, got.back(), got_draft).ok());
                BOOST_TEST(same_bits(got_draft.logits, want_draft.logits), what);
                BOOST_TEST(same_bits(next_logits(m, *seq, got.back()), plain_next), what);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(drafters_propose_what_they_should) {
    spec::ngram_drafter ngram(2, 3);
    const std::vector<int32_t> ctx{5, 6, 7, 8, 9, 5, 6, 7};
    BOOST_TEST((ngram.propose(ctx, 2) == std::vector<int32_t>{8, 9}));  // "5 6 7" followed by 8 9
    BOOST_TEST((ngram.propose(ctx, 9) == std::vector<int32_t>{8, 9, 5, 6, 7}));  // up to the context's end
    BOOST_TEST(ngram.propose(std::vector<int32_t>{1, 2, 3, 4}, 3).empty());     // nothing repeats
    spec::oracle_drafter exact({10, 11, 12, 13}, 3, 0.0, 100);
    BOOST_TEST((exact.propose(std::vector<int32_t>{1, 2, 3, 10}, 2) == std::vector<int32_t>{11, 12}));
    BOOST_TEST((exact.propose(std::vector<int32_t>{1, 2, 3, 10, 11, 12}, 5) == std::vector<int32_t>{13}));
    spec::oracle_drafter never({10, 11, 12, 13}, 3, 1.0, 100);
    const auto wrong = never.propose(std::vector<int32_t>{1, 2, 3, 10}, 3);
    BOOST_TEST(wrong.size() == 3u);
    for (size_t i = 0; i < wrong.size(); ++i) BOOST_TEST((wrong[i] != 11 + int32_t(i) && wrong[i] >= 0 && wrong[i] < 100));
}

// The policy on synthetic machines: acceptance p per draft, a step of k drafts costing
// base + row * k. It drafts long where rows are cheap and drafts are good, converges to plain
// decoding where drafts are poor or every row costs a step (disk-bound), and follows a change.
BOOST_AUTO_TEST_CASE(draft_policy_follows_acceptance_and_cost) {
    struct machine {
        double p, row;  // acceptance, cost of a row relative to a plain step
    };
    const auto simulate = [](spec::draft_policy& pol, machine m, int steps, uint32_t seed) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<double> u(0, 1);
        std::array<int, 6> chosen{};
        for (int s = 0; s < steps; ++s) {
            const int k = pol.choose();
            int acc = 0;
            while (acc < k && u(rng) < m.p) ++acc;
            pol.record(k, acc, 1.0 + m.row * k);
            if (s >= steps / 2) ++chosen[size_t(k)];
        }
        return chosen;
    };
    const auto most = [](const std::array<int, 6>& c) { return int(std::max_element(c.begin(), c.end()) - c.begin()); };
    {
        spec::draft_policy pol;
        const auto c = simulate(pol, {0.9, 0.05}, 400, 1);
        BOOST_TEST(most(c) == 5);  // good drafts, cheap rows: the longest block
        BOOST_TEST(pol.acceptance(1) > 0.8);
    }
    {
        spec::draft_policy pol;
        const auto c = simulate(pol, {0.1, 0.05}, 400, 2);
        BOOST_TEST(most(c) == 0);  // poor drafts: plain decoding
        BOOST_TEST(c[0] >= 170);   // (of 200: exploration aside)
    }
    {
        spec::draft_policy pol;
        const auto c = simulate(pol, {0.8, 1.0}, 400, 3);
        BOOST_TEST(most(c) == 0);  // every row costs a step: nothing to gain
    }
    {
        spec::draft_policy pol;
        const auto c = simulate(pol, {0.7, 0.15}, 400, 4);
        const int k = most(c);  // E(k)/T(k) peaks at k = 3 for p = 0.7, row = 0.15
        BOOST_TEST((k >= 2 && k <= 4), "chose " << k);
        // The machine turns disk-bound: the policy follows to plain decoding.
        const auto after = simulate(pol, {0.7, 1.5}, 400, 5);
        BOOST_TEST(most(after) == 0);
    }
}

// The per-step policy gives plain greedy output too.
BOOST_AUTO_TEST_CASE(auto_draft_length_gives_plain_output, *needs()) {
    auto& m = fixture(kFx);
    const auto prompt = prompt_ids(kFx, 40);
    auto plain_seq = m.sequence();
    const int32_t first = prefill(m, *plain_seq, prompt);
    spec::ngram_drafter none;
    std::vector<int32_t> plain;
    BOOST_TEST_REQUIRE(spec::decode_greedy(*m.model, *plain_seq, first, 40, none, {}, plain).ok());
    for (double rate : {0.0, 0.3, 1.0}) {
        spec::oracle_drafter d(plain, 40, rate, int32_t(m.hp().vocab), 3);
        spec::draft_policy pol;
        spec::greedy_options o;
        o.k = spec::draft_policy::kMaxK;
        o.policy = &pol;
        auto seq = m.sequence();
        BOOST_TEST_REQUIRE(prefill(m, *seq, prompt) == first);
        std::vector<int32_t> got;
        auto s = spec::decode_greedy(*m.model, *seq, first, 40, d, o, got);
        BOOST_TEST_REQUIRE(s.ok());
        BOOST_TEST(got == plain, "oracle rate " << rate);
        BOOST_TEST_MESSAGE("auto, oracle " << rate << ": " << s->target_steps << " steps, accepted " << s->accepted
                                           << " of " << s->drafted << ", p1 " << pol.acceptance(1));
    }
}

// Speculative sampling preserves the distribution: over many seeded runs on the tiny model
// (temperature 1, top-k 4), the second and third emitted tokens of speculative runs (drafts the
// target often accepts, and drafts it always refuses) are distributed as plain sampling's, by a
// two-sample chi-square test at the 0.999 level (other seeds than the plain runs'); and with the
// same seed a speculative run emits plain sampling's tokens exactly.
BOOST_AUTO_TEST_CASE(speculative_sampling_preserves_the_distribution, *needs()) {
    auto& m = fixture(kFx);
    const auto prompt = prompt_ids(kFx, 7);
    auto base = m.sequence();
    std::vector<float> prefill_logits;
    {
        dsv41::forward_item item{base.get(), prompt, false};
        BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, prefill_logits).ok());
    }
    const int32_t vocab = int32_t(m.hp().vocab);
    std::vector<int32_t> greedy_cont;
    {
        auto seq = m.sequence();
        seq->copy_from(*base);
        spec::ngram_drafter none;
        BOOST_TEST_REQUIRE(
            spec::decode_greedy(*m.model, *seq, spec::greedy_token(prefill_logits), 4, none, {}, greedy_cont).ok());
    }
    sampling_params sp;
    sp.temperature = 1.0f;
    sp.top_k = 4;
    // Tokens of one seeded run: plain (k 0) or with an oracle drafter at `rate`, k 2.
    const auto run = [&](uint64_t seed, double rate, int k) {
        sp.seed = seed;
        sampler smp(sp, vocab);
        smp.reset(prompt);
        auto seq = m.sequence();
        seq->copy_from(*base);
        auto first = smp.sample(prefill_logits);
        BOOST_TEST_REQUIRE(first.ok());
        spec::oracle_drafter d(greedy_cont, int64_t(prompt.size()), rate, vocab, seed);
        spec::greedy_options o;
        o.k = k;
        std::vector<int32_t> out;
        auto st = spec::decode_sampled(*m.model, *seq, first->token, 3, d, o, smp, out);
        BOOST_TEST_REQUIRE(st.ok());
        return std::make_pair(out, *st);
    };
    constexpr int kTrials = 700;
    std::vector<std::vector<int32_t>> plain;
    for (int t = 0; t < kTrials; ++t) plain.push_back(run(1000 + t, 0, 0).first);
    for (double rate : {0.0, 1.0}) {
        std::vector<std::vector<int32_t>> spec_runs;
        int64_t drafted = 0, accepted = 0;
        for (int t = 0; t < kTrials; ++t) {
            auto [out, st] = run(5000 + t, rate, 2);
            spec_runs.push_back(out);
            drafted += st.drafted, accepted += st.accepted;
        }
        BOOST_TEST_MESSAGE("oracle rate " << rate << ": accepted " << accepted << " of " << drafted);
        BOOST_TEST(drafted > 0);
        if (rate == 1.0) BOOST_TEST(accepted < drafted / 4);  // mostly refused: the residual draws
        for (size_t pos : {size_t(1), size_t(2)}) {
            std::map<int32_t, std::pair<double, double>> counts;
            for (const auto& r : plain) counts[r[pos]].first += 1;
            for (const auto& r : spec_runs) counts[r[pos]].second += 1;
            // Bins of fewer than 10 runs together go into one.
            double chi = 0, small_a = 0, small_b = 0;
            int bins = 0;
            const auto add = [&](double a, double b) {
                chi += (a - b) * (a - b) / (a + b);
                ++bins;
            };
            for (const auto& [tok, ab] : counts) {
                if (ab.first + ab.second < 10) {
                    small_a += ab.first, small_b += ab.second;
                    continue;
                }
                add(ab.first, ab.second);
            }
            if (small_a + small_b > 0) add(small_a, small_b);
            const double dof = std::max(1, bins - 1);
            // Wilson-Hilferty: the chi-square quantile at 0.999 (z = 3.090).
            const double q = dof * std::pow(1 - 2 / (9 * dof) + 3.090 * std::sqrt(2 / (9 * dof)), 3);
            BOOST_TEST(chi < q, "rate " << rate << " token " << pos << ": chi-square " << chi << " over " << bins
                                        << " bins, bound " << q);
            BOOST_TEST_MESSAGE("rate " << rate << " token " << pos << ": chi-square " << chi << ", " << bins
                                       << " bins, bound " << q);
        }
    }
    // Same seed, same tokens as plain sampling, whatever is drafted.
    for (uint64_t seed = 1; seed <= 40; ++seed)
        for (auto [rate, k] : {std::pair<double, int>{0.0, 2}, {0.5, 1}, {1.0, 2}})
            BOOST_TEST(run(seed, rate, k).first == run(seed, 0, 0).first, "seed " << seed << " rate " << rate);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
