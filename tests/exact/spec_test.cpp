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
#include "scheduler/tiered_experts.h"
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
            spec::oracle_drafter exact(continuation, len, 1.0, int32_t(m.hp().vocab));
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
    spec::oracle_drafter exact({10, 11, 12, 13}, 3, 1.0, 100);
    BOOST_TEST((exact.propose(std::vector<int32_t>{1, 2, 3, 10}, 2) == std::vector<int32_t>{11, 12}));
    BOOST_TEST((exact.propose(std::vector<int32_t>{1, 2, 3, 10, 11, 12}, 5) == std::vector<int32_t>{13}));
    spec::oracle_drafter never({10, 11, 12, 13}, 3, 0.0, 100);
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

// A synthetic streaming machine: a step of T rows routes U(T) = a * T^b experts (summed over
// layers), `share` of them not resident, and costs base + draft + row * T + resident * R +
// missing * M seconds.
struct union_machine {
    double p;                   // acceptance per draft
    double a = 240, b = 0.5;    // the union
    double share = 0.5;         // not resident
    double base = 0.5, draft = 0.0, row = 0.01, resident = 0.001, missing = 0.01;
    double experts(int rows) const { return a * std::pow(double(rows), b); }
    double seconds(int k, double s) const {
        const double u = experts(k + 1);
        return base + (k > 0 ? draft : 0.0) + row * (k + 1) + resident * u * (1 - s) + missing * u * s;
    }
    spec::step_sample sample(int k, double s) const {
        spec::step_sample x;
        x.drafted = k;
        x.experts = experts(k + 1);
        x.not_resident = x.experts * s;
        x.seconds = seconds(k, s);
        return x;
    }
};

std::array<int, 6> simulate_union(spec::draft_policy& pol, const union_machine& m, int steps, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0, 1);
    std::array<int, 6> chosen{};
    for (int s = 0; s < steps; ++s) {
        const int k = pol.choose();
        int acc = 0;
        while (acc < k && u(rng) < m.p) ++acc;
        pol.record_drafts(k, acc);
        pol.record_step(m.sample(k, m.share));
        if (s >= steps / 2) ++chosen[size_t(k)];
    }
    return chosen;
}

int most_chosen(const std::array<int, 6>& c) { return int(std::max_element(c.begin(), c.end()) - c.begin()); }

// The union model: fitted from the steps, it predicts the union of row counts never measured.
BOOST_AUTO_TEST_CASE(union_model_fits_the_measured_union) {
    for (double b : {1.0, 0.6, 0.3}) {
        union_machine m{0.5};
        m.b = b;
        spec::draft_policy pol(5, {240, 240 * 64});
        for (int s = 0; s < 40; ++s) pol.record_step(m.sample(s % 2, 0.0));  // rows 1 and 2 only
        for (int rows : {1, 2, 4, 6})
            BOOST_TEST(std::fabs(pol.expected_union(rows) / m.experts(rows) - 1) < 0.05,
                       "b " << b << " rows " << rows << ": " << pol.expected_union(rows) << " vs " << m.experts(rows));
    }
    // Independent routing over 384 experts a layer (the anchors' E|U| = 384 (1 - (1 - 6/384)^T)),
    // measured at 1..3 rows: within 10% up to 6.
    spec::draft_policy pol(5, {6, 384});
    const auto independent = [](int t) { return 384 * (1 - std::pow(1 - 6.0 / 384, t)); };
    for (int s = 0; s < 60; ++s) {
        spec::step_sample x;
        x.drafted = s % 3;
        x.experts = independent(x.drafted + 1);
        x.seconds = 1;
        pol.record_step(x);
    }
    for (int rows = 1; rows <= 6; ++rows)
        BOOST_TEST(std::fabs(pol.expected_union(rows) / independent(rows) - 1) < 0.1, "rows " << rows);
    // Never more than every expert.
    BOOST_TEST(pol.expected_union(1000) <= 384.0);
}

// DSpark's confidences: a draft's acceptance starts at its sigmoid and is calibrated online (a
// bin whose drafts fail learns it, whatever the sigmoid said), and once drafts are made the
// block is cut where one more row stops paying: sure drafts stay, the first hopeless one ends it.
BOOST_AUTO_TEST_CASE(confidences_are_calibrated_and_cut_the_block) {
    union_machine m{0.5};
    spec::draft_policy pol(5, {240, 240 * 64});
    const std::vector<std::vector<float>> two{{2.f, 2.f}};
    BOOST_TEST(pol.trim(1, two)[0] == 2);  // no cost model yet: every draft
    for (int s = 0; s < 40; ++s) pol.record_step(m.sample(s % 2, m.share));
    BOOST_TEST_REQUIRE(pol.cost().ready);
    BOOST_TEST(std::fabs(pol.calibrated(2.f) - 1 / (1 + std::exp(-2.0))) < 1e-9);
    const std::vector<std::vector<float>> block{{6.f, 6.f, -6.f, 6.f, 6.f}};
    BOOST_TEST(pol.trim(1, block)[0] == 2);
    // Two sequences, one sure and one hopeless from its first draft: each cut on its own.
    const std::vector<std::vector<float>> pair{{6.f, 6.f, 6.f}, {-6.f, 6.f}};
    const auto kept = pol.trim(2, pair);
    BOOST_TEST(kept[0] == 3);
    BOOST_TEST(kept[1] == 0);
    // The sigmoid says 0.88 at 2; drafts of that confidence that always fail teach 0.
    for (int i = 0; i < 200; ++i) {
        const float c[] = {2.f};
        pol.record_drafts(1, 0, c);
    }
    BOOST_TEST(pol.calibrated(2.f) < 0.1);
    BOOST_TEST(pol.trim(1, two)[0] == 0);
    BOOST_TEST(pol.calibrated(6.f) > 0.99);  // other bins keep their own
}

// A drafter whose block costs the same at any length (the DSpark head) is asked for the most
// once the policy cuts drafts by their confidences (the cost model ready, no k being explored),
// so that the confidences choose the step's length; before that, and for other drafters, it is
// asked for what choose() said; never when choose() said 0.
BOOST_AUTO_TEST_CASE(a_whole_block_drafter_is_asked_for_the_most_once_confidences_cut) {
    union_machine m{0.5};
    spec::draft_policy pol(4, {240, 240 * 64});
    BOOST_TEST(!pol.cuts_by_confidence(1));
    BOOST_TEST(pol.request(2, true, 1) == 2);  // no cost model yet: choose()'s k is measured
    for (int s = 0; s < 40; ++s) pol.record_step(m.sample(s % 2, m.share));
    BOOST_TEST_REQUIRE(pol.cost().ready);
    BOOST_TEST(pol.cuts_by_confidence(1));
    BOOST_TEST(pol.request(1, true, 1) == 4);
    BOOST_TEST(pol.request(3, true, 2) == 4);
    BOOST_TEST(pol.request(1, false, 1) == 1);  // an n-gram drafter pays per token
    BOOST_TEST(pol.request(0, true, 1) == 0);   // no draft: the head does not run
    // What the engine then verifies of a block of 4 is trim()'s: sure drafts kept, a doubtful
    // one ends the block.
    const std::vector<std::vector<float>> block{{6.f, 6.f, -6.f, 6.f}};
    BOOST_TEST(pol.trim(1, block)[0] == 2);
}

// A k never measured costs what the union model and the current residency say: measured at
// k 0 and 1 only, the model's time for k 5 is the machine's within 5%, where the line through
// the two measured points is off by more than 15% (the union is concave).
BOOST_AUTO_TEST_CASE(unmeasured_draft_lengths_cost_what_the_union_model_says) {
    union_machine m{0.5};
    m.b = 0.4;
    spec::draft_policy pol(5, spec::union_shape{240, 240 * 64});
    for (int s = 0; s < 40; ++s) pol.record_step(m.sample(s % 2, m.share));
    const double truth = m.seconds(5, m.share);
    const double linear = m.seconds(0, m.share) + 5 * (m.seconds(1, m.share) - m.seconds(0, m.share));
    BOOST_TEST(std::fabs(linear / truth - 1) > 0.15);
    BOOST_TEST_REQUIRE(pol.modelled_seconds(5) > 0);
    BOOST_TEST(std::fabs(pol.step_seconds(5) / truth - 1) < 0.05, pol.step_seconds(5) << " vs " << truth);
    BOOST_TEST(std::fabs(pol.step_seconds(3) / m.seconds(3, m.share) - 1) < 0.05);
    // The residency changes: steps whose share not resident varied teach the cost per resident
    // and per missing expert apart; then everything becomes resident (only plain steps measured
    // since), and the unmeasured k's cost follows the current residency, not the old times.
    spec::draft_policy pol2(5, spec::union_shape{240, 240 * 64});
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> u(0.1, 0.9);
    for (int s = 0; s < 60; ++s) pol2.record_step(m.sample(s % 2, u(rng)));
    BOOST_TEST(pol2.cost().per_missing > pol2.cost().per_resident);
    for (int s = 0; s < 12; ++s) pol2.record_step(m.sample(0, 0.0));
    BOOST_TEST(pol2.not_resident_share() < 0.05);
    for (int k : {2, 3, 4})
        BOOST_TEST(std::fabs(pol2.step_seconds(k) / m.seconds(k, 0.0) - 1) < 0.1,
                   "k " << k << ": " << pol2.step_seconds(k) << " vs " << m.seconds(k, 0.0) << " (at the old residency "
                        << m.seconds(k, 0.5) << ")");
}

// The policy on synthetic streaming machines: a disk-bound machine (most of the union missing,
// a missing expert dear) with low acceptance converges to plain decoding; one whose experts
// are resident with good drafts drafts the longest blocks; and one that turns disk-bound
// follows to plain decoding. Deterministic: the same inputs, the same choices.
BOOST_AUTO_TEST_CASE(draft_policy_with_the_union_model_converges) {
    {
        union_machine m{0.3};
        m.share = 0.6, m.missing = 0.02, m.b = 0.9;
        spec::draft_policy pol(5, {240, 240 * 64});
        const auto c = simulate_union(pol, m, 400, 1);
        BOOST_TEST(most_chosen(c) == 0);
        BOOST_TEST(c[0] >= 170);  // of 200: exploration aside
    }
    {
        // Even good drafts: when every row's experts come from disk, a row costs nearly a step.
        union_machine m{0.8};
        m.share = 0.9, m.missing = 0.05, m.b = 0.95;
        spec::draft_policy pol(5, {240, 240 * 64});
        BOOST_TEST(most_chosen(simulate_union(pol, m, 400, 2)) == 0);
    }
    {
        union_machine m{0.9};
        m.share = 0.0, m.resident = 0.0002, m.row = 0.02, m.b = 0.6;
        spec::draft_policy pol(5, {240, 240 * 64});
        const auto c = simulate_union(pol, m, 400, 3);
        BOOST_TEST(most_chosen(c) == 5);
        // The machine turns disk-bound (the experts no longer fit) and the content is harder to
        // draft: back to plain decoding (acceptance and costs both follow).
        m.share = 0.9, m.missing = 0.05, m.p = 0.4;
        BOOST_TEST(most_chosen(simulate_union(pol, m, 400, 4)) == 0);
    }
    {
        // A draft head dearer than four target steps that drafts nothing the target accepts:
        // plain decoding, and exploration only as often as 2% of the time pays for it, so the
        // policy's decoding takes at most 3% more time than plain decoding's.
        union_machine m{0.0};
        m.share = 0.0, m.draft = 4.0;
        spec::draft_policy pol(5, {240, 240 * 64});
        std::mt19937 rng(6);
        double spent = 0, plain = 0;
        int drafted_steps = 0;
        for (int s = 0; s < 2000; ++s) {
            const int k = pol.choose();
            pol.record_drafts(k, 0);
            pol.record_step(m.sample(k, 0.0));
            if (s >= 200) spent += m.seconds(k, 0.0), plain += m.seconds(0, 0.0), drafted_steps += k > 0;
        }
        BOOST_TEST(spent <= 1.03 * plain, "drafted in " << drafted_steps << " of 1800 steps");
        BOOST_TEST(drafted_steps > 0);  // still tried now and then
    }
    {
        // Acceptance of positions never reached is the estimate of the one before, not 1/2: a
        // policy that found good drafts at k 2 sees the longer blocks' worth.
        spec::draft_policy pol;
        for (int s = 0; s < 50; ++s) pol.record_drafts(2, 2);
        BOOST_TEST(pol.acceptance(2) > 0.9);
        BOOST_TEST(pol.acceptance(5) > 0.9);
        BOOST_TEST(pol.expected_tokens(5) > 5.0);
        for (int s = 0; s < 50; ++s) pol.record_drafts(2, 0);
        BOOST_TEST(pol.acceptance(1) < 0.6);  // forgetting: the content changed
    }
    {
        union_machine m{0.7};
        m.share = 0.1;
        spec::draft_policy a(5, {240, 240 * 64}), b(5, {240, 240 * 64});
        BOOST_TEST((simulate_union(a, m, 200, 5) == simulate_union(b, m, 200, 5)));
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

// Sees every hint (and passes everything on to the mapping's resident experts).
class hint_log final : public dsv41::expert_source {
  public:
    explicit hint_log(dsv41::expert_source& inner) : inner_(inner) {}
    void need(int layer, std::span<const int32_t> ids) override { inner_.need(layer, ids); }
    result<dsv41::expert_weights> get(int layer, int32_t e) override { return inner_.get(layer, e); }
    void release(int layer, int32_t e) override { inner_.release(layer, e); }
    int64_t max_held() const override { return inner_.max_held(); }
    void hint(int layer, std::span<const int32_t> ids) override {
        hints.push_back({layer, std::vector<int32_t>(ids.begin(), ids.end())});
        inner_.hint(layer, ids);
    }
    std::vector<std::pair<int, std::vector<int32_t>>> hints;

  private:
    dsv41::expert_source& inner_;
};

// The accepted draft's routing is the next step's hint: after each verification the kept rows'
// experts go to the source, layer 0's at once and each later layer's while the layer before it
// computes (look-ahead off here, so these are the only hints); the output stays plain greedy
// decoding's, and without the option no hint is sent.
BOOST_AUTO_TEST_CASE(kept_rows_hint_the_next_step, *needs()) {
    auto& m = fixture(kFx);
    const auto prompt = prompt_ids(kFx, 40);
    auto plain_seq = m.sequence();
    const int32_t first = prefill(m, *plain_seq, prompt);
    spec::ngram_drafter none;
    std::vector<int32_t> plain;
    BOOST_TEST_REQUIRE(spec::decode_greedy(*m.model, *plain_seq, first, 20, none, {}, plain).ok());
    for (bool on : {true, false}) {
        hint_log log(*m.experts);
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, log, *m.backend);
        auto seq = mdl.new_sequence(128, 16);
        std::vector<float> logits;
        dsv41::forward_item item{seq.get(), prompt, false};
        BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, logits).ok());
        spec::oracle_drafter d(plain, 40, 0.3, int32_t(m.hp().vocab), 5);
        spec::greedy_options o;
        o.k = 3;
        o.hint_kept_rows = on;
        std::vector<int32_t> got;
        auto st = spec::decode_greedy(mdl, *seq, first, 20, d, o, got);
        BOOST_TEST_REQUIRE(st.ok());
        BOOST_TEST(got == plain);
        if (!on) {
            BOOST_TEST(log.hints.empty());
            continue;
        }
        int64_t first_layer = 0, later = 0;
        for (const auto& [layer, ids] : log.hints) {
            BOOST_TEST((layer >= 0 && layer < m.hp().n_layers));
            BOOST_TEST(std::is_sorted(ids.begin(), ids.end()));
            BOOST_TEST((std::adjacent_find(ids.begin(), ids.end()) == ids.end()));
            // At least one row's experts, at most k + 1 rows'.
            BOOST_TEST((int64_t(ids.size()) >= m.hp().n_active && int64_t(ids.size()) <= 4 * m.hp().n_active));
            (layer == 0 ? first_layer : later) += 1;
        }
        // Every step but the last verified drafts and hints the next one (the last hints nothing
        // that a forward would use, but is sent too when decoding goes on).
        BOOST_TEST(first_layer >= st->target_steps - 2);
        BOOST_TEST(later >= first_layer * (m.hp().n_layers - 1) - (m.hp().n_layers - 1));
        BOOST_TEST_MESSAGE("hints: " << first_layer << " for layer 0, " << later << " for later layers over "
                                     << st->target_steps << " steps");
    }
}

namespace {

// Tiers over the fixture sized in experts, or the reason they cannot start (io_uring).
result<std::unique_ptr<tiered_experts>> tiers_of_experts(fixture_model& m, double device, double host, uint64_t draft_bytes_or_all) {
    tier_options probe;
    probe.device_bytes = 1 << 26, probe.host_bytes = 1 << 26;
    auto p = tiered_experts::create(*m.files, probe);
    if (!p) return p.err();
    tier_options o;
    o.device_bytes = uint64_t(device * double((*p)->device_slot_bytes()));
    o.host_bytes = uint64_t(host * double((*p)->host_slot_bytes()));
    o.draft_bytes = draft_bytes_or_all;
    return tiered_experts::create(*m.files, o);
}

// Where the target's layers found their experts, and what its tiers hold, after a prefill and
// decode steps over fixed tokens, with a DSpark draft after every step or without.
struct target_view {
    std::vector<spec::layer_tally> tallies;  // the target's layers
    std::vector<storage::expert_key> device, host;
    std::vector<storage::expert_key> draft;
    bool operator==(const target_view& o) const {
        if (device != o.device || host != o.host || tallies.size() != o.tallies.size()) return false;
        for (size_t i = 0; i < tallies.size(); ++i) {
            const auto &a = tallies[i], &b = o.tallies[i];
            if (a.experts != b.experts || a.device != b.device || a.host != b.host || a.in_flight != b.in_flight ||
                a.missing != b.missing)
                return false;
        }
        return true;
    }
};

target_view run_target(fixture_model& m, tiered_experts& t, bool drafting) {
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, t, *m.backend);  // no look-ahead: timing-free
    auto seq = mdl.new_sequence(128, 16);
    const auto prompt = prompt_ids(kFx, 40);
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), prompt, false};
    BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, logits).ok());
    dsv41::draft_output d;
    for (int32_t tok : {5, 77, 300, 12, 9, 41, 230, 3}) {
        dsv41::forward_item step{seq.get(), {&tok, 1}, false};
        BOOST_TEST_REQUIRE(mdl.forward({&step, 1}, logits).ok());
        if (drafting) BOOST_TEST_REQUIRE(mdl.draft(*seq, tok, d).ok());
    }
    target_view v;
    v.tallies.resize(size_t(m.hp().n_layers + m.hp().n_mtp));
    BOOST_TEST_REQUIRE(t.layer_tallies(v.tallies));
    v.tallies.resize(size_t(m.hp().n_layers));
    v.device = t.resident_keys(tiered_experts::tier::device);
    v.host = t.resident_keys(tiered_experts::tier::host);
    v.draft = t.resident_keys(tiered_experts::tier::draft);
    return v;
}

}  // namespace

// Draft experts have a budget of their own: a run that drafts after every step leaves the
// target's host tier and where its layers found their experts exactly as a run without
// drafting (host tiers far smaller than the model, so the draft's experts would evict the
// target's), the draft's experts only in their own slots; sharing the tiers (a draft budget of
// 0), drafting does change the target's. With a device tier (whose asynchronous promotions make
// the exact contents timing-dependent) the draft's experts still never enter the target's tiers.
BOOST_AUTO_TEST_CASE(draft_experts_never_evict_the_targets, *needs()) {
    auto& m = fixture(kFx);
    for (double host : {30.0, 70.0}) {
        auto a = tiers_of_experts(m, 0, host, tier_options::kDraftAll);
        if (!a && a.message().rfind("io_uring unavailable", 0) == 0) {
            BOOST_TEST_MESSAGE("skipped: " << a.message());
            return;
        }
        if (!a) BOOST_FAIL(a.message());
        auto b = tiers_of_experts(m, 0, host, tier_options::kDraftAll);
        auto c = tiers_of_experts(m, 0, host, tier_options::kDraftAll);
        auto shared = tiers_of_experts(m, 0, host, 0);
        BOOST_TEST_REQUIRE((b.ok() && c.ok() && shared.ok()));
        BOOST_TEST((*a)->draft_slots() == uint32_t(m.hp().n_mtp * m.hp().dspark_n_experts));
        BOOST_TEST((*shared)->draft_slots() == 0u);
        const auto plain = run_target(m, **a, false);
        const auto plain_again = run_target(m, **b, false);
        BOOST_TEST_REQUIRE((plain == plain_again), "the tiers' bookkeeping is deterministic here");
        const auto drafted = run_target(m, **c, true);
        BOOST_TEST((drafted == plain), "host " << host << ": drafting changed the target's tiers");
        BOOST_TEST(!drafted.draft.empty());
        for (auto k : drafted.draft) BOOST_TEST(int(storage::key_layer(k)) >= m.hp().n_layers);
        for (auto k : drafted.host) BOOST_TEST(int(storage::key_layer(k)) < m.hp().n_layers);
        BOOST_TEST((*c)->counters().draft_hits > 0u);
        const auto sharing = run_target(m, **shared, true);
        BOOST_TEST(!(sharing == plain), "host " << host << ": a shared budget should show the draft's evictions");
        uint64_t shared_missing = 0, plain_missing = 0;
        for (size_t L = 0; L < plain.tallies.size(); ++L)
            shared_missing += sharing.tallies[L].missing, plain_missing += plain.tallies[L].missing;
        BOOST_TEST_MESSAGE("host " << host << " experts: the target's misses " << plain_missing
                                   << " with the draft's own budget (as without drafting), " << shared_missing
                                   << " sharing the tiers");
    }
    auto d = tiers_of_experts(m, 12, 30, tier_options::kDraftAll);
    if (!d) BOOST_FAIL(d.message());
    const auto v = run_target(m, **d, true);
    BOOST_TEST(!v.draft.empty());
    for (auto k : v.device) BOOST_TEST(int(storage::key_layer(k)) < m.hp().n_layers);
    for (auto k : v.host) BOOST_TEST(int(storage::key_layer(k)) < m.hp().n_layers);
}

// The step recorder's union from the tiers' tallies is the model's own union, layer by layer,
// and where the experts were adds up to it; the bits are the resident model's.
BOOST_AUTO_TEST_CASE(recorded_union_is_the_models, *needs()) {
    auto& m = fixture(kFx);
    auto t = tiers_of_experts(m, 4, 30, tier_options::kDraftAll);
    if (!t && t.message().rfind("io_uring unavailable", 0) == 0) return;
    if (!t) BOOST_FAIL(t.message());
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **t, *m.backend);
    auto o = mdl.options();
    o.lookahead = true;
    mdl.set_options(o);
    const auto prompt = prompt_ids(kFx, 40);
    auto plain_seq = m.sequence();
    const int32_t first = prefill(m, *plain_seq, prompt);
    spec::ngram_drafter none;
    std::vector<int32_t> plain;
    BOOST_TEST_REQUIRE(spec::decode_greedy(*m.model, *plain_seq, first, 16, none, {}, plain).ok());
    auto seq = mdl.new_sequence(128, 16);
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), prompt, false};
    BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, logits).ok());
    spec::oracle_drafter d(plain, 40, 0.2, int32_t(m.hp().vocab), 9);
    tiered_experts* tiers = t->get();
    spec::step_recorder rec(m.hp().n_layers, [tiers](std::span<spec::layer_tally> out) { return tiers->layer_tallies(out); });
    spec::draft_policy pol(5, spec::shape_of(m.hp()));
    spec::greedy_options go;
    go.k = 4;
    go.recorder = &rec;
    go.policy = &pol;
    std::vector<int32_t> got;
    auto st = spec::decode_greedy(mdl, *seq, first, 16, d, go, got);
    BOOST_TEST_REQUIRE(st.ok());
    BOOST_TEST(got == plain);
    // The last step: per layer, the tallies' union is the model's.
    const auto& last = rec.last();
    BOOST_TEST(last.residency_known);
    BOOST_TEST(last.experts == mdl.last_forward_experts());
    for (int L = 0; L < m.hp().n_layers; ++L)
        BOOST_TEST(int64_t(rec.last_layers()[size_t(L)].experts) == mdl.last_forward_layer_experts(L));
    BOOST_TEST(last.device + last.host + last.in_flight + last.missing == last.experts);
    int64_t steps = 0;
    for (const auto& k : rec.by_k()) {
        steps += k.steps;
        BOOST_TEST(k.device + k.host + k.in_flight + k.missing == k.experts);
    }
    BOOST_TEST(steps == st->target_steps);
    BOOST_TEST(pol.expected_union(1) > 0);
    BOOST_TEST_MESSAGE("policy: union of 1/3/6 rows " << pol.expected_union(1) << "/" << pol.expected_union(3) << "/"
                                                      << pol.expected_union(6) << ", not resident "
                                                      << pol.not_resident_share());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
