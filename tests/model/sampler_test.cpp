// Tests for model/sampler: expected values come from closed-form distributions computed here with
// the C library (std::exp/std::log), from an independent Python model of the generator (the
// pinned streams), or from hand-built cases. Every statistical check draws from a fixed seed, so
// it is exact and cannot flake; the bounds (4 standard deviations) only say the seed is not special.
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/common/test_support.h"

using namespace moestream;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

sampling_params greedy_params() {
    sampling_params p;
    p.temperature = 0.0f;
    return p;
}

int32_t sample_one(sampler& s, const std::vector<float>& logits) {
    sample_result r;
    const status st = s.sample(logits, r);
    BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? std::string() : st.message()));
    return r.token;
}

std::vector<int64_t> histogram(sampler& s, const std::vector<float>& logits, int draws) {
    std::vector<int64_t> counts(logits.size(), 0);
    sample_result r;
    for (int i = 0; i < draws; ++i) {
        BOOST_TEST_REQUIRE(s.sample(logits, r).ok());
        ++counts[size_t(r.token)];
    }
    return counts;
}

// Each count within 4 standard deviations of draws * p (binomial).
void check_frequencies(const std::vector<int64_t>& counts, const std::vector<double>& p, int draws) {
    BOOST_TEST_REQUIRE(counts.size() == p.size());
    for (size_t i = 0; i < p.size(); ++i) {
        const double mean = draws * p[i];
        const double sd = std::sqrt(draws * p[i] * (1 - p[i]));
        if (p[i] == 0) {
            BOOST_TEST(counts[i] == 0, "token " << i);
        } else {
            BOOST_TEST(std::abs(double(counts[i]) - mean) <= 4 * sd,
                       "token " << i << ": " << counts[i] << " draws, expected " << mean << " +- " << sd);
        }
    }
}

// softmax(logits / t) with the C library.
std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
    double m = -INFINITY;
    for (float l : logits) m = std::max(m, double(l) / t);
    std::vector<double> p(logits.size());
    double sum = 0;
    for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(double(logits[i]) / t - m);
    for (auto& x : p) x /= sum;
    return p;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// p = {0.5, 0.3, 0.2} as logits.
const std::vector<float> k532{float(std::log(0.5)), float(std::log(0.3)), float(std::log(0.2))};

std::string validate_message(const sampling_params& p, int64_t vocab) {
    const status st = p.validate(vocab);
    return st.ok() ? std::string("ok") : st.message();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sampler_tests)

// ---------------------------------------------------------------- deterministic building blocks

BOOST_AUTO_TEST_CASE(sampler_rng_matches_reference_streams) {
    // xoshiro256** seeded by splitmix64 (an independent Python model of prng.di.unimi.it's C code;
    // its splitmix64(0) stream starts e220a8397b1dcdaf, 6e789e6aa1b965f4 as published).
    sampler_rng a(0);
    BOOST_TEST(a.next() == 0x99ec5f36cb75f2b4ULL);
    BOOST_TEST(a.next() == 0xbf6e1f784956452aULL);
    BOOST_TEST(a.next() == 0x1a5f849d4933e6e0ULL);
    BOOST_TEST(a.next() == 0x6aa594f1262d2d2cULL);
    sampler_rng b(42);
    BOOST_TEST(b.next() == 0x15780b2e0c2ec716ULL);
    BOOST_TEST(b.next() == 0x6104d9866d113a7eULL);
    sampler_rng c(42);
    c.next();
    BOOST_TEST(c.uniform() == double(0x6104d9866d113a7eULL >> 11) * 0x1.0p-53);
    for (int i = 0; i < 10000; ++i) {
        const double u = c.uniform();
        BOOST_TEST_REQUIRE((u >= 0.0 && u < 1.0));
    }
}

BOOST_AUTO_TEST_CASE(deterministic_exp_matches_libm) {
    BOOST_TEST(deterministic_exp(0.0) == 1.0);
    BOOST_TEST(deterministic_exp(-INFINITY) == 0.0);
    BOOST_TEST(deterministic_exp(-800.0) == 0.0);
    double worst = 0;
    for (double x = -745.0; x <= 1.0; x += 0.001371) {
        const double want = std::exp(x);
        const double err = std::abs(deterministic_exp(x) - want);
        BOOST_TEST_REQUIRE(err <= 5e-16 * want + 0x1p-1074, "x = " << x);  // + one subnormal ulp
        if (want > 0x1p-1022) worst = std::max(worst, err / want);
    }
    BOOST_TEST_MESSAGE("deterministic_exp: worst relative error " << worst);
}

// ---------------------------------------------------------------- validate

BOOST_AUTO_TEST_CASE(validate_names_the_field) {
    const int64_t v = 512;
    BOOST_TEST(validate_message(sampling_params{}, v) == "ok");
    auto with = [](auto edit) {
        sampling_params p;
        edit(p);
        return p;
    };
    BOOST_TEST(validate_message(with([](auto& p) { p.top_p = 1.5f; }), v) == "top_p must be in (0, 1], got 1.5");
    BOOST_TEST(validate_message(with([](auto& p) { p.top_p = 0.0f; }), v) == "top_p must be in (0, 1], got 0");
    BOOST_TEST(validate_message(with([](auto& p) { p.top_k = -1; }), v) == "top_k must be >= 0 (0 disables it), got -1");
    BOOST_TEST(validate_message(with([](auto& p) { p.min_p = 2.0f; }), v) == "min_p must be in [0, 1], got 2");
    BOOST_TEST(validate_message(with([](auto& p) { p.temperature = kNaN; }), v) ==
               "temperature must be a finite number, got nan");
    BOOST_TEST(validate_message(with([](auto& p) { p.presence_penalty = INFINITY; }), v) ==
               "presence_penalty must be a finite number, got inf");
    BOOST_TEST(validate_message(with([](auto& p) { p.frequency_penalty = kNaN; }), v) ==
               "frequency_penalty must be a finite number, got nan");
    BOOST_TEST(validate_message(with([](auto& p) { p.repeat_penalty = 0.0f; }), v) ==
               "repeat_penalty must be a finite number > 0 (1 disables it), got 0");
    BOOST_TEST(validate_message(with([](auto& p) { p.repeat_last_n = -2; }), v) ==
               "repeat_last_n must be >= -1 (-1: the whole history, 0: no penalties), got -2");
    BOOST_TEST(validate_message(with([](auto& p) { p.n_probs = 21; }), v) == "n_probs must be in [0, 20], got 21");
    BOOST_TEST(validate_message(with([](auto& p) { p.logit_bias = {{999999, -100.0f}}; }), v) ==
               "logit_bias token 999999 is outside the vocabulary of 512");
    BOOST_TEST(validate_message(with([](auto& p) { p.logit_bias = {{-1, 1.0f}}; }), v) ==
               "logit_bias token -1 is outside the vocabulary of 512");
    BOOST_TEST(validate_message(with([](auto& p) { p.logit_bias = {{5, kNaN}}; }), v) ==
               "logit_bias for token 5 must be a finite number or -inf, got nan");
    BOOST_TEST(validate_message(with([](auto& p) { p.logit_bias = {{5, INFINITY}}; }), v) ==
               "logit_bias for token 5 must be a finite number or -inf, got inf");
    BOOST_TEST(validate_message(sampling_params{}, 0) == "the vocabulary size must be in [1, 2^31), got 0");
    // Accepted edges: bans, negative temperature (greedy, as llama.cpp), the whole-history window.
    BOOST_TEST(validate_message(with([](auto& p) {
                                    p.logit_bias = {{0, kNegInf}, {511, -100.0f}};
                                    p.temperature = -1.0f;
                                    p.repeat_last_n = -1;
                                    p.top_p = 1.0f;
                                    p.min_p = 1.0f;
                                    p.n_probs = 20;
                                }),
                                v) == "ok");
}

// ---------------------------------------------------------------- greedy and truncation

BOOST_AUTO_TEST_CASE(greedy_picks_argmax_lowest_id_on_ties) {
    sampler s(greedy_params(), 6);
    BOOST_TEST(sample_one(s, {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f - 1e-6f}) == 1);
    BOOST_TEST(sample_one(s, {0.1f, 2.0f, -1.0f, 3.0f, 0.0f, 3.0f}) == 3);  // tie: lower id
    BOOST_TEST(sample_one(s, {5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f}) == 0);
    // A negative temperature is greedy too, and greedy ignores the truncation settings.
    sampling_params p;
    p.temperature = -0.5f;
    p.top_k = 3;
    p.min_p = 0.9f;
    sampler n(p, 6);
    BOOST_TEST(sample_one(n, {0.1f, 2.0f, -1.0f, 3.0f, 0.0f, 3.0f}) == 3);

    // Its log-probability is that of softmax at temperature 1: p(1) = 3 / 4.
    sampler g(greedy_params(), 2);
    sample_result r;
    BOOST_TEST_REQUIRE(g.sample(std::vector<float>{0.0f, float(std::log(3.0))}, r).ok());
    BOOST_TEST(r.token == 1);
    BOOST_TEST(std::abs(r.logprob - std::log(0.75)) < 1e-7);
}

BOOST_AUTO_TEST_CASE(logit_bias_bans_and_boosts) {
    sampling_params p = greedy_params();
    p.logit_bias = {{2, kNegInf}, {0, -100.0f}};
    sampler s(p, 4);
    BOOST_TEST(sample_one(s, {10.0f, 1.0f, 20.0f, 0.5f}) == 1);
    // Entries for one token add up: +3 then +2 lifts token 3 above token 0.
    p.logit_bias = {{3, 3.0f}, {3, 2.0f}};
    sampler b(p, 4);
    BOOST_TEST(sample_one(b, {5.5f, 1.0f, 0.0f, 1.0f}) == 3);
    // Banned tokens are never drawn at any temperature.
    p = sampling_params{};
    p.temperature = 5.0f;
    p.logit_bias = {{0, kNegInf}, {2, kNegInf}};
    sampler t(p, 3);
    const auto counts = histogram(t, {3.0f, 0.0f, 3.0f}, 2000);
    BOOST_TEST(counts[0] == 0);
    BOOST_TEST(counts[2] == 0);
    BOOST_TEST(counts[1] == 2000);
}

BOOST_AUTO_TEST_CASE(top_k_1_and_tiny_top_p_equal_greedy) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
        const auto logits = random_logits(257, seed);
        sampler g(greedy_params(), 257);
        const int32_t want = sample_one(g, logits);
        sampling_params k;
        k.temperature = 1.7f;
        k.top_k = 1;
        k.seed = seed;
        sampling_params t;
        t.temperature = 1.7f;
        t.top_p = 1e-6f;
        t.seed = seed;
        sampler sk(k, 257), st(t, 257);
        for (int i = 0; i < 20; ++i) {
            BOOST_TEST_REQUIRE(sample_one(sk, logits) == want);
            BOOST_TEST_REQUIRE(sample_one(st, logits) == want);
        }
    }
}

BOOST_AUTO_TEST_CASE(top_k_top_p_min_p_truncate_before_temperature) {
    const int draws = 20000;
    // top_k = 2 keeps {0, 1}: renormalised 5/8, 3/8.
    sampling_params p;
    p.top_k = 2;
    p.seed = 7;
    sampler k(p, 3);
    check_frequencies(histogram(k, k532, draws), {0.625, 0.375, 0.0}, draws);

    // top_p = 0.7: 0.5 < 0.7 <= 0.8, so the nucleus is {0, 1}.
    p = sampling_params{};
    p.top_p = 0.7f;
    p.seed = 8;
    sampler t(p, 3);
    check_frequencies(histogram(t, k532, draws), {0.625, 0.375, 0.0}, draws);

    // min_p = 0.5 keeps p >= 0.25: {0, 1}. At temperature 10 token 2 would be close to the others
    // if temperature came first; truncation happens on the untempered distribution.
    p = sampling_params{};
    p.min_p = 0.5f;
    p.temperature = 10.0f;
    p.seed = 9;
    sampler m(p, 3);
    const double a = std::pow(0.5, 0.1), b = std::pow(0.3, 0.1);
    check_frequencies(histogram(m, k532, draws), {a / (a + b), b / (a + b), 0.0}, draws);

    // min_p = 1 keeps only the maximum.
    p.min_p = 1.0f;
    sampler one(p, 3);
    BOOST_TEST(histogram(one, k532, 500)[0] == 500);
}

BOOST_AUTO_TEST_CASE(top_p_nucleus_on_a_large_vocabulary) {
    // The nucleus is found by sorting in growing blocks; compare it with a full sort here.
    const size_t v = 5000;
    const auto logits = random_logits(v, 3, 1.5f);
    const auto prob = softmax(logits);
    std::vector<int32_t> order(v);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    });
    double cum = 0;
    size_t nucleus = 0;
    while (cum < 0.9) cum += prob[size_t(order[nucleus++])];
    BOOST_TEST_REQUIRE(nucleus > 1024);  // several sorting blocks
    std::vector<bool> inside(v, false);
    for (size_t i = 0; i < nucleus; ++i) inside[size_t(order[i])] = true;

    sampling_params p;
    p.top_p = 0.9f;
    p.seed = 11;
    sampler s(p, int64_t(v));
    const int draws = 4000;
    const auto counts = histogram(s, logits, draws);
    int64_t outside = 0;
    for (size_t i = 0; i < v; ++i)
        if (!inside[i]) outside += counts[i];
    BOOST_TEST(outside == 0);
    // The least likely member of the nucleus is reachable: the top token's frequency matches its
    // renormalised probability.
    const double p0 = prob[size_t(order[0])] / cum;
    check_frequencies({counts[size_t(order[0])]}, {p0}, draws);
}

BOOST_AUTO_TEST_CASE(temperature_reshapes_the_distribution) {
    const int draws = 20000;
    for (const double t : {1.0, 2.0, 0.5}) {
        sampling_params p;
        p.temperature = float(t);
        p.seed = 1234;
        sampler s(p, 3);
        // p_i^(1/T), renormalised.
        std::vector<double> want{std::pow(0.5, 1 / t), std::pow(0.3, 1 / t), std::pow(0.2, 1 / t)};
        const double sum = want[0] + want[1] + want[2];
        for (auto& w : want) w /= sum;
        check_frequencies(histogram(s, k532, draws), want, draws);
    }
}

// ---------------------------------------------------------------- reproducibility

BOOST_AUTO_TEST_CASE(same_seed_same_sequence_different_seed_differs) {
    const auto logits = random_logits(64, 5, 0.5f);
    auto run = [&](uint64_t seed) {
        sampling_params p;
        p.seed = seed;
        p.top_k = 40;
        p.top_p = 0.95f;
        p.temperature = 0.8f;
        sampler s(p, 64);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) out.push_back(sample_one(s, logits));
        return out;
    };
    BOOST_TEST(run(99) == run(99));
    BOOST_TEST(run(99) != run(100));

    // reset() restarts the random stream.
    sampling_params p;
    p.seed = 5;
    sampler s(p, 64);
    std::vector<int32_t> first, second;
    for (int i = 0; i < 50; ++i) first.push_back(sample_one(s, logits));
    s.reset();
    for (int i = 0; i < 50; ++i) second.push_back(sample_one(s, logits));
    BOOST_TEST(first == second);
}

BOOST_AUTO_TEST_CASE(pinned_sequence) {
    // Pins the whole chain (generator, uniform, weights, cumulative walk): an independent Python
    // model (xoshiro256**, math.exp softmax at temperature 0.7, walk in id order) draws these.
    const std::vector<float> logits{1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, 0.25f, -0.5f};
    sampling_params p;
    p.temperature = 0.7f;
    p.seed = 20240601;
    sampler s(p, 8);
    std::vector<int32_t> got;
    for (int i = 0; i < 24; ++i) got.push_back(sample_one(s, logits));
    const std::vector<int32_t> want{2, 2, 5, 2, 4, 2, 0, 2, 5, 2, 2, 2, 2, 2, 5, 2, 2, 2, 2, 5, 5, 0, 0, 4};
    BOOST_TEST(got == want, boost::test_tools::per_element());
}

// ---------------------------------------------------------------- penalties

BOOST_AUTO_TEST_CASE(repeat_penalty_changes_the_argmax) {
    sampling_params p = greedy_params();
    p.repeat_penalty = 1.2f;
    sampler s(p, 4);
    const std::vector<float> logits{2.0f, 1.9f, -1.0f, -1.1f};
    BOOST_TEST(sample_one(s, logits) == 0);
    s.accept(0);  // 2.0 / 1.2 = 1.67 < 1.9
    BOOST_TEST(sample_one(s, logits) == 1);
    // Negative logits are multiplied (made more negative), never divided towards zero.
    p.logit_bias = {{0, kNegInf}, {1, kNegInf}};
    sampler n(p, 4);
    n.accept(2);  // -1.0 * 1.2 = -1.2 < -1.1
    BOOST_TEST(sample_one(n, logits) == 3);
}

BOOST_AUTO_TEST_CASE(frequency_and_presence_penalties) {
    const std::vector<float> logits{2.0f, 1.75f, 0.0f};
    sampling_params p = greedy_params();
    p.frequency_penalty = 0.1f;
    sampler f(p, 3);
    f.reset(std::vector<int32_t>{0, 0});  // 2.0 - 0.2 = 1.8 > 1.75
    BOOST_TEST(sample_one(f, logits) == 0);
    f.accept(0);  // 2.0 - 0.3 = 1.7 < 1.75
    BOOST_TEST(sample_one(f, logits) == 1);

    p = greedy_params();
    p.presence_penalty = 0.3f;  // once, whatever the count
    sampler pr(p, 3);
    pr.reset(std::vector<int32_t>{0, 0, 0, 1});  // 1.7 vs 1.45
    BOOST_TEST(sample_one(pr, logits) == 0);

    // Logit bias comes first: (1 + 1) / 2 = 1.0 < 1.2, whereas 1 / 2 + 1 = 1.5 would win.
    p = greedy_params();
    p.repeat_penalty = 2.0f;
    p.logit_bias = {{0, 1.0f}};
    sampler order(p, 2);
    order.accept(0);
    BOOST_TEST(sample_one(order, {1.0f, 1.2f}) == 1);
}

BOOST_AUTO_TEST_CASE(repeat_last_n_window) {
    const std::vector<float> logits{2.0f, 1.9f, 0.0f, 0.0f};
    sampling_params p = greedy_params();
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;
    sampler s(p, 4);
    s.accept(0);
    BOOST_TEST(sample_one(s, logits) == 1);
    s.accept(2);
    BOOST_TEST(sample_one(s, logits) == 1);  // window {0, 2}
    s.accept(3);
    BOOST_TEST(sample_one(s, logits) == 0);  // window {2, 3}: token 0 left it
    s.accept(0);
    s.accept(0);
    BOOST_TEST(sample_one(s, logits) == 1);  // window {0, 0} after the ring wrapped
    s.reset(std::vector<int32_t>{0, 2, 3});  // only the last two count
    BOOST_TEST(sample_one(s, logits) == 0);

    // -1: the whole history; 0: no penalties at all.
    p.repeat_last_n = -1;
    sampler all(p, 4);
    all.accept(0);
    for (int i = 0; i < 1000; ++i) all.accept(3);
    BOOST_TEST(sample_one(all, logits) == 1);
    p.repeat_last_n = 0;
    sampler none(p, 4);
    none.accept(0);
    BOOST_TEST(sample_one(none, logits) == 0);
}

// ---------------------------------------------------------------- reported probabilities

BOOST_AUTO_TEST_CASE(n_probs_sorted_with_ties_and_mass_at_most_one) {
    const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 2.0f, kNegInf, 0.5f};
    sampling_params p;
    p.n_probs = 5;
    p.temperature = 0.9f;
    p.seed = 3;
    sampler s(p, 8);
    sample_result r;
    BOOST_TEST_REQUIRE(s.sample(logits, r).ok());
    std::vector<int32_t> ids;
    for (const auto& e : r.top) ids.push_back(e.token);
    BOOST_TEST(ids == std::vector<int32_t>({1, 3, 2, 5, 0}), boost::test_tools::per_element());
    const auto prob = softmax(logits, double(0.9f));  // the sampler divides by the float
    double mass = 0;
    for (size_t i = 0; i < r.top.size(); ++i) {
        BOOST_TEST(std::abs(r.top[i].logprob - std::log(prob[size_t(r.top[i].token)])) < 1e-9);
        if (i > 0) BOOST_TEST(r.top[i].logprob <= r.top[i - 1].logprob);
        mass += std::exp(r.top[i].logprob);
    }
    BOOST_TEST(mass <= 1.0 + 1e-12);
    // The chosen token's log-probability is over the whole vocabulary.
    BOOST_TEST(std::abs(r.logprob - std::log(prob[size_t(r.token)])) < 1e-9);

    // Banned tokens are left out, so the list can be shorter than n_probs; with everything kept
    // the mass is one.
    p.n_probs = 20;
    sampler all(p, 8);
    BOOST_TEST_REQUIRE(all.sample(logits, r).ok());
    BOOST_TEST(r.top.size() == 7u);
    mass = 0;
    for (const auto& e : r.top) mass += std::exp(e.logprob);
    BOOST_TEST(std::abs(mass - 1.0) < 1e-12);

    // The result is reusable: refilling it does not reallocate.
    const auto* data = r.top.data();
    for (int i = 0; i < 10; ++i) BOOST_TEST_REQUIRE(all.sample(logits, r).ok());
    BOOST_TEST(r.top.data() == data);
}

// ---------------------------------------------------------------- banned, NaN and infinite logits

BOOST_AUTO_TEST_CASE(nan_and_banned_logits) {
    // NaN is never chosen nor reported, even where it sits above every real logit's index.
    sampling_params p;
    p.temperature = 3.0f;
    p.n_probs = 4;
    sampler s(p, 4);
    const std::vector<float> with_nan{0.0f, kNaN, 0.5f, kNaN};
    sample_result r;
    for (int i = 0; i < 1000; ++i) {
        BOOST_TEST_REQUIRE(s.sample(with_nan, r).ok());
        BOOST_TEST_REQUIRE((r.token == 0 || r.token == 2));
        BOOST_TEST_REQUIRE(r.top.size() == 2u);
    }
    sampler g(greedy_params(), 4);
    BOOST_TEST(sample_one(g, {kNaN, -5.0f, kNaN, kNaN}) == 1);

    // All but one banned: that one, with certainty.
    sampler one(p, 4);
    BOOST_TEST_REQUIRE(one.sample(std::vector<float>{kNegInf, kNegInf, 7.0f, kNaN}, r).ok());
    BOOST_TEST(r.token == 2);
    BOOST_TEST(r.logprob == 0.0);

    // Everything banned (by the logits or the bias): an error value, not a token.
    for (const auto& logits : {std::vector<float>{kNaN, kNaN, kNaN, kNaN},
                               std::vector<float>{kNegInf, kNaN, kNegInf, kNegInf}}) {
        const status st = s.sample(logits, r);
        BOOST_TEST_REQUIRE(!st.ok());
        BOOST_TEST(st.message() == "every token is banned: all logits are -inf or NaN after logit_bias and penalties");
        BOOST_TEST(r.token == -1);
        BOOST_TEST(r.top.empty());
        BOOST_TEST(!g.sample(logits).ok());
    }
    p.logit_bias = {{0, kNegInf}, {1, kNegInf}};
    sampler b(p, 2);
    BOOST_TEST(!b.sample(std::vector<float>{1.0f, 2.0f}).ok());

    // +inf acts as the largest logit, and a tiny temperature overflows nothing.
    p = sampling_params{};
    p.temperature = 1e-30f;
    sampler hot(p, 3);
    for (int i = 0; i < 100; ++i) {
        const auto res = hot.sample(std::vector<float>{1.0f, INFINITY, 3.0f});
        BOOST_TEST_REQUIRE(res.ok());
        BOOST_TEST_REQUIRE(res->token == 1);
        BOOST_TEST_REQUIRE(res->logprob == 0.0);
    }
    BOOST_TEST(sample_one(hot, {1.0f, 2.0f, 3.0f}) == 2);
}

BOOST_AUTO_TEST_SUITE_END()
