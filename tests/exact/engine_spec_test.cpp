// Speculative decoding in the engine: with every drafter (prompt lookup, the DSpark head, the
// oracle at acceptance 1 and about 1/2), a fixed draft length or the policy's, requests batched
// together (some prefilling in chunks while others verify, one opting out, one constrained, one
// ending at a stop token, one at the context's end) get plain serving's tokens and
// log-probabilities, greedy and sampled (the same seed); the accounting adds up; and the rollback
// of rejected rows in a batch leaves each sequence as plain decoding does, draft head included.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <chrono>
#include <map>

#include "../common/test_support.h"
#include "engine_events.h"
#include "fixture_model.h"
#include "scheduler/engine.h"
#include "spec/dspark_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/oracle_drafter.h"
#include "spec/speculative.h"
#include "spec/verify.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";
auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

struct outcome {
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
    std::string reason;
    int64_t draft_n = -1, draft_n_accepted = -1;
    int64_t cached_tokens = -1;
};

outcome collect(generation& g) {
    outcome o;
    receive_events(g, std::chrono::seconds(120), [&](const token_event& e) {
        BOOST_TEST(e.draft_n_accepted <= e.draft_n);
        if (e.done) {
            o.reason = e.finish_reason;
            o.draft_n = e.draft_n;
            o.draft_n_accepted = e.draft_n_accepted;
            o.cached_tokens = e.cached_tokens;
            return true;
        }
        o.tokens.push_back(e.token);
        o.logprobs.push_back(e.logprob);
        return false;
    });
    return o;
}

// Allows odd tokens only; done after `length` of them.
struct odd_tokens final : token_constraint {
    int64_t length, seen = 0;
    explicit odd_tokens(int64_t n) : length(n) {}
    void allowed(std::span<uint8_t> mask) const override {
        for (size_t v = 0; v < mask.size(); ++v) mask[v] = v % 2 == 1;
    }
    void accept(int32_t) override { ++seen; }
    bool done() const override { return seen >= length; }
};

constexpr int64_t kContext = 64;

std::vector<std::vector<int32_t>> prompts() {
    return {prompt_ids(kFx, 7), prompt_ids(kFx, 40), {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7}, {300, 301}};
}

// Every request of a round, fresh (a constraint holds state): greedy ones, sampled ones, an
// opt-out, a constrained one, one stopping at `stop` and one running to the context's end.
std::vector<generation_request> requests(int32_t stop) {
    std::vector<generation_request> out;
    const auto ps = prompts();
    for (const auto& p : ps) {
        generation_request r;
        r.prompt = p;
        r.sampling.temperature = 0;
        r.sampling.n_probs = 2;
        r.max_tokens = 16;
        out.push_back(r);
        r.sampling.temperature = 1.0f;
        r.sampling.top_k = 8;
        r.sampling.seed = 7 + p.size();
        r.sampling.repeat_penalty = 1.3f;  // the history (every accepted draft) matters
        out.push_back(r);
    }
    out[2].spec_max = 0;  // opts out
    generation_request c = out[0];
    c.constraint = std::make_shared<odd_tokens>(6);
    c.max_tokens = 50;
    out.push_back(c);
    generation_request s = out[4];
    s.stop_tokens = {stop};
    out.push_back(s);
    generation_request ctx = out[2];
    ctx.spec_max = -1;
    ctx.max_tokens = 0;  // until the context is full
    out.push_back(ctx);
    return out;
}

struct round_result {
    std::vector<outcome> outcomes;
    engine_stats stats;
};

// Every request at once, 4 sequences at a time, prompts in chunks of 7.
round_result serve(dsv41::model& m, speculation_options spec, int32_t stop) {
    engine_options o;
    o.max_sequences = 4;
    o.prefill_chunk = 7;
    o.context_tokens = kContext;
    o.spec = std::move(spec);
    BOOST_TEST_REQUIRE(validate(o.spec, m).ok());
    engine eng(m, o);
    std::vector<std::shared_ptr<generation>> gens;
    for (auto& r : requests(stop)) {
        auto g = eng.submit(std::move(r));
        BOOST_TEST_REQUIRE(g.ok(), (g.ok() ? std::string() : g.message()));
        gens.push_back(*g);
    }
    round_result out;
    for (auto& g : gens) out.outcomes.push_back(collect(*g));
    out.stats = eng.stats();
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engine_speculation_suite)

BOOST_AUTO_TEST_CASE(speculative_serving_gives_plain_serving_tokens, *needs()) {
    auto& m = fixture(kFx);
    BOOST_TEST_REQUIRE(m.model->has_draft());
    // Plain serving, and its greedy continuations for the oracle.
    speculation_options off;
    off.drafter = "none";
    const int32_t stop_probe = -1;
    auto plain = serve(*m.model, off, stop_probe);
    const int32_t stop = plain.outcomes[4].tokens.at(5);  // a greedy token of the repeating prompt
    plain = serve(*m.model, off, stop);
    BOOST_TEST(plain.stats.spec_draft_tokens == 0u);
    BOOST_TEST(plain.outcomes[8].reason == "stop");   // constrained: done after 6
    BOOST_TEST(plain.outcomes[9].reason == "stop");   // the stop token
    BOOST_TEST(plain.outcomes[9].tokens.size() <= 5u);
    BOOST_TEST(plain.outcomes[10].reason == "context");
    std::map<std::vector<int32_t>, std::vector<int32_t>> continuation;
    const auto ps = prompts();
    for (size_t i = 0; i < ps.size(); ++i) continuation[ps[i]] = plain.outcomes[2 * i].tokens;
    continuation[ps[1]] = plain.outcomes[10].tokens;  // the longest: to the context's end
    const auto oracle = [&](double rate) {
        return [&, rate](const std::vector<int32_t>& prompt, const dsv41::sequence_state&) {
            return std::unique_ptr<spec::drafter>(std::make_unique<spec::oracle_drafter>(
                continuation.at(prompt), int64_t(prompt.size()), rate, int32_t(m.hp().vocab), 5));
        };
    };
    struct config {
        std::string what;
        speculation_options o;
    };
    std::vector<config> configs;
    const auto add = [&](std::string what, std::string drafter, int k, bool adaptive, double rate = -1) {
        speculation_options o;
        o.drafter = std::move(drafter);
        o.k = k;
        o.adaptive = adaptive;
        if (rate >= 0) o.make_drafter = oracle(rate);
        configs.push_back({std::move(what), std::move(o)});
    };
    add("ngram k 3", "ngram", 3, false);
    add("ngram auto", "ngram", 5, true);
    add("dspark k 2", "dspark", 2, false);
    add("dspark auto", "dspark", 5, true);
    add("oracle 1 k 5", "", 5, false, 1.0);
    add("oracle 0.5 k 3", "", 3, false, 0.5);
    add("oracle 0.5 auto", "", 5, true, 0.5);
    for (const auto& c : configs) {
        const auto got = serve(*m.model, c.o, stop);
        int64_t drafted = 0, accepted = 0;
        for (size_t i = 0; i < got.outcomes.size(); ++i) {
            const auto& g = got.outcomes[i];
            const auto& p = plain.outcomes[i];
            const std::string what = c.what + ", request " + std::to_string(i);
            BOOST_TEST(g.tokens == p.tokens, what);
            BOOST_TEST(g.logprobs == p.logprobs, what);
            BOOST_TEST(g.reason == p.reason, what);
            BOOST_TEST(g.draft_n_accepted <= g.draft_n, what);
            drafted += g.draft_n, accepted += g.draft_n_accepted;
            if (i == 2) BOOST_TEST(g.draft_n == 0, what);  // opted out
            // The DSpark head always drafts (at a fixed length: the policy learns to stop where
            // its drafts fail); the exact oracle's greedy drafts all stand.
            if (c.o.drafter == "dspark" && !c.o.adaptive && i != 2) BOOST_TEST(g.draft_n > 0, what);
            if (c.what == "oracle 1 k 5" && i != 2 && i % 2 == 0 && i < 8) {
                BOOST_TEST(g.draft_n > 0, what);
                BOOST_TEST(g.draft_n_accepted == g.draft_n, what);
            }
        }
        const auto& s = got.stats;
        BOOST_TEST(s.spec_draft_tokens == uint64_t(drafted), c.what);
        BOOST_TEST(s.spec_accepted_tokens == uint64_t(accepted), c.what);
        BOOST_TEST(s.spec_failures == 0u, c.what);
        BOOST_TEST(s.generated_tokens == plain.stats.generated_tokens, c.what);
        if (drafted > 0) {
            BOOST_TEST(s.spec_drafts > 0u, c.what);
            BOOST_TEST(s.spec_steps > 0u, c.what);
            BOOST_TEST(s.spec_accepted_by_position[0] <= s.spec_drafts, c.what);
            // Verification steps load at least a row's experts per layer (host-routed here).
            BOOST_TEST(s.step_experts_steps[engine_stats::verify_step] > 0u, c.what);
            BOOST_TEST(s.step_experts[engine_stats::verify_step] >=
                           s.step_experts_steps[engine_stats::verify_step] * uint64_t(m.hp().n_active * m.hp().n_layers),
                       c.what);
        }
        if (c.o.make_drafter && c.what == "oracle 1 k 5") {
            BOOST_TEST(accepted > 0);
            BOOST_TEST(s.steps < plain.stats.steps, c.what);  // fewer forwards for the same tokens
        }
        // Drafts that partly stand, at a fixed length. (The adaptive policy's lengths follow the
        // step times it measures: on a loaded machine it may stop after its first probes, so
        // under "auto" only the tokens are checked.)
        if (c.what == "oracle 0.5 k 3") BOOST_TEST((accepted > 0 && accepted < drafted), c.what);
        BOOST_TEST_MESSAGE(c.what << ": " << s.steps << " steps (plain " << plain.stats.steps << "), accepted "
                                  << accepted << " of " << drafted);
    }
}

// Two sequences verified in one forward, each rolled back to its own kept rows (spec::keep_rows
// at its batch row): both end where plain decoding leaves them, the target's state and the draft
// head's, bit for bit.
BOOST_AUTO_TEST_CASE(a_batched_rollback_leaves_plain_states, *needs()) {
    auto& m = fixture(kFx);
    BOOST_TEST_REQUIRE(m.model->has_draft());
    const int32_t vocab = int32_t(m.hp().vocab);
    const std::vector<std::vector<int32_t>> ps{prompt_ids(kFx, 7), {5, 6, 7, 8, 9}};
    const std::vector<int64_t> keep{1, 0};  // drafts of each that stand
    std::vector<std::unique_ptr<dsv41::sequence_state>> seqs, refs;
    std::vector<std::vector<int32_t>> rows;
    std::vector<int32_t> nexts;
    for (size_t i = 0; i < ps.size(); ++i) {
        // Plain greedy tokens after the prompt, on a reference sequence that consumed the kept ones.
        auto seq = m.sequence(), ref = m.sequence();
        std::vector<float> logits;
        dsv41::forward_item item{seq.get(), ps[i], false};
        BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
        const int32_t first = spec::greedy_token(logits);
        ref->copy_from(*seq);
        std::vector<int32_t> greedy;
        spec::ngram_drafter none;
        BOOST_TEST_REQUIRE(spec::decode_greedy(*m.model, *ref, first, 2 + keep[i], none, {}, greedy).ok());
        // ref consumed greedy[0..keep]: plain decoding's state with greedy[keep + 1] next.
        std::vector<int32_t> r{first};
        for (int64_t j = 1; j <= keep[i]; ++j) r.push_back(greedy[size_t(j)]);
        r.push_back((greedy[size_t(keep[i] + 1)] + 1) % vocab);  // refused
        r.push_back(3);
        rows.push_back(r);
        nexts.push_back(greedy[size_t(keep[i] + 1)]);
        seqs.push_back(std::move(seq));
        refs.push_back(std::move(ref));
    }
    std::vector<dsv41::forward_item> items;
    std::vector<int64_t> before;
    for (size_t i = 0; i < ps.size(); ++i) {
        before.push_back(seqs[i]->size());
        items.push_back({seqs[i].get(), rows[i], true});
    }
    std::vector<float> logits;
    BOOST_TEST_REQUIRE(m.model->forward(items, logits).ok());
    int64_t first_row = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
        const auto draft = std::span<const int32_t>(rows[i]).subspan(1);
        const auto choose = [&](size_t j, int32_t& t) {
            t = spec::greedy_token(
                std::span<const float>(logits.data() + (size_t(first_row) + j) * size_t(vocab), size_t(vocab)));
            return status{};
        };
        auto v = spec::verify_rows(draft, choose, [](int32_t) { return true; });
        BOOST_TEST_REQUIRE(v.ok());
        BOOST_TEST(v->kept == keep[i]);
        BOOST_TEST(v->next == nexts[i]);
        BOOST_TEST_REQUIRE(
            spec::keep_rows(*m.model, *seqs[i], before[i], int64_t(rows[i].size()), v->kept, first_row).ok());
        first_row += int64_t(rows[i].size());
    }
    for (size_t i = 0; i < ps.size(); ++i) {
        BOOST_TEST(seqs[i]->size() == refs[i]->size());
        dsv41::draft_output want, got;
        BOOST_TEST_REQUIRE(m.model->draft(*refs[i], nexts[i], want).ok());
        BOOST_TEST_REQUIRE(m.model->draft(*seqs[i], nexts[i], got).ok());
        BOOST_TEST(same_bits(got.logits, want.logits), "sequence " << i << ": the draft head's state");
        BOOST_TEST(!refs[i]->last_main_hidden().empty());
        BOOST_TEST(same_bits(seqs[i]->last_main_hidden(), refs[i]->last_main_hidden()),
                   "sequence " << i << ": the features the draft head continues from");
        std::vector<float> a, b;
        dsv41::forward_item fa{seqs[i].get(), {&nexts[i], 1}, false}, fb{refs[i].get(), {&nexts[i], 1}, false};
        BOOST_TEST_REQUIRE(m.model->forward({&fa, 1}, a).ok());
        BOOST_TEST_REQUIRE(m.model->forward({&fb, 1}, b).ok());
        BOOST_TEST(same_bits(a, b), "sequence " << i << ": the target's state");
    }
}

namespace {

// The DSpark head as a drafter, the logits of every block it drafts and the target features it
// drafts from recorded (per prompt).
struct recording_drafter final : spec::drafter {
    dsv41::model& m;
    const dsv41::sequence_state& seq;
    std::vector<std::vector<float>>& log;
    dsv41::draft_output out;
    recording_drafter(dsv41::model& mm, const dsv41::sequence_state& s, std::vector<std::vector<float>>& l)
        : m(mm), seq(s), log(l) {}
    std::string name() const override { return "recorded dspark"; }
    std::vector<int32_t> propose(std::span<const int32_t> context, int k) override {
        BOOST_TEST_REQUIRE(m.draft(seq, context.back(), out).ok());
        log.push_back(out.logits);
        log.push_back(seq.last_main_hidden());  // the features it continues from
        return std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + std::min<size_t>(size_t(k), out.tokens.size()));
    }
};

}  // namespace

// The draft head continues from the right row of a batched verification (keep_rows at the
// sequence's batch row): batched with others, each request's draft blocks and the target
// features they start from are those it gets alone, bit for bit.
BOOST_AUTO_TEST_CASE(the_draft_head_drafts_in_a_batch_what_it_drafts_alone, *needs()) {
    auto& m = fixture(kFx);
    BOOST_TEST_REQUIRE(m.model->has_draft());
    const auto ps = prompts();
    using logs = std::map<std::vector<int32_t>, std::vector<std::vector<float>>>;
    const auto run = [&](const std::vector<std::vector<int32_t>>& batch, logs& out) {
        engine_options o;
        o.max_sequences = 4;
        o.prefill_chunk = 7;
        o.context_tokens = kContext;
        o.spec.k = 3;
        o.spec.adaptive = false;
        o.spec.make_drafter = [&](const std::vector<int32_t>& prompt, const dsv41::sequence_state& seq) {
            return std::unique_ptr<spec::drafter>(std::make_unique<recording_drafter>(*m.model, seq, out[prompt]));
        };
        engine eng(*m.model, o);
        std::vector<std::shared_ptr<generation>> gens;
        for (const auto& p : batch) {
            generation_request r;
            r.prompt = p;
            r.sampling.temperature = 0;
            r.max_tokens = 12;
            r.reuse_prefix = false;
            auto g = eng.submit(r);
            BOOST_TEST_REQUIRE(g.ok());
            gens.push_back(*g);
        }
        for (auto& g : gens) BOOST_TEST(collect(*g).reason == "length");
    };
    logs batched, alone;
    run(ps, batched);
    for (const auto& p : ps) run({p}, alone);
    for (const auto& p : ps) {
        BOOST_TEST(!alone[p].empty());
        BOOST_TEST_REQUIRE(batched[p].size() == alone[p].size());
        for (size_t i = 0; i < alone[p].size(); ++i)
            BOOST_TEST(same_bits(batched[p][i], alone[p][i]), "prompt of " << p.size() << " tokens, draft " << i);
    }
}

namespace {

// The prompt checkpoint tests' engine: two sequences, prefill chunks of 16, two kept states and
// a rollback of 8, so drafts of 5 reach past it within a few steps.
engine_options checkpoint_options(int64_t context_tokens) {
    engine_options o;
    o.max_sequences = 2;
    o.prefill_chunk = 16;
    o.context_tokens = context_tokens;
    o.cached_sequences = 2;
    o.rollback = 8;
    return o;
}

generation_request greedy_request(std::vector<int32_t> prompt, int64_t n, bool reuse) {
    generation_request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.n_probs = 2;
    r.max_tokens = n;
    r.reuse_prefix = reuse;
    return r;
}

outcome run_request(engine& eng, generation_request r) {
    auto g = eng.submit(std::move(r));
    BOOST_TEST_REQUIRE(g.ok());
    return collect(**g);
}

}  // namespace

// A speculating sequence's prompt checkpoint is taken before a step's verification rows (rolled
// back or not) could reach more than rollback past its prompt: with drafts of 5 that half stand
// and a rollback of 8, the next turn starts from it and gets plain serving's bits.
BOOST_AUTO_TEST_CASE(a_speculating_sequence_checkpoints_its_prompt_within_reach, *needs()) {
    auto& m = fixture(kFx);
    const engine_options o = checkpoint_options(128);
    const auto base = prompt_ids(kFx, 40);
    outcome plain1;
    {
        engine plain(*m.model, o);
        plain1 = run_request(plain, greedy_request(base, 40, false));
    }
    BOOST_TEST_REQUIRE(plain1.tokens.size() == 40u);
    std::vector<int32_t> turn2 = base;
    turn2.push_back((plain1.tokens[0] + 1) % int32_t(m.hp().vocab));  // the reply, tokenized otherwise
    turn2.insert(turn2.end(), plain1.tokens.begin() + 1, plain1.tokens.end());
    turn2.insert(turn2.end(), {7, 8, 9});
    outcome plain2;
    {
        engine plain(*m.model, o);
        plain2 = run_request(plain, greedy_request(turn2, 8, false));
    }
    engine_options s = o;
    s.spec.k = 5;
    s.spec.adaptive = false;
    s.spec.make_drafter = [&](const std::vector<int32_t>& prompt, const dsv41::sequence_state&) {
        return prompt == base ? std::unique_ptr<spec::drafter>(std::make_unique<spec::oracle_drafter>(
                                    plain1.tokens, int64_t(base.size()), 0.5, int32_t(m.hp().vocab), 5))
                              : nullptr;
    };
    BOOST_TEST_REQUIRE(validate(s.spec, *m.model).ok());
    engine eng(*m.model, s);
    const auto t1 = run_request(eng, greedy_request(base, 40, true));
    BOOST_TEST(t1.tokens == plain1.tokens);
    BOOST_TEST(t1.logprobs == plain1.logprobs);
    BOOST_TEST((t1.draft_n_accepted > 0 && t1.draft_n_accepted < t1.draft_n), "drafts partly stand");
    BOOST_TEST(eng.stats().prefix_checkpoints == 1u);
    const auto t2 = run_request(eng, greedy_request(turn2, 8, true));
    BOOST_TEST(t2.cached_tokens == 40);
    BOOST_TEST(t2.tokens == plain2.tokens);
    BOOST_TEST(t2.logprobs == plain2.logprobs);
}

// A sequence may start from a kept state that itself speculated: turn 1 drafts (about half its
// drafts stand, rollback 8) and ends at a stop token in the middle of a verification, so its
// kept state carries rolled-back rows past its end. Turn 2 extends it in place by two tokens
// (the rolled-back rows still reach past its prompt) and speculates on long enough for its own
// prompt checkpoint; turn 3 parts from turn 2 right after turn 2's prompt, so only that
// checkpoint serves it: bit for bit what a fresh engine gives. (A reused state is truncated no
// lower than its floor, so its rolled-back rows end before prompt + rollback: the checkpoint
// falls due by the new sequence's own rows, when the drafts it verifies could reach past that.)
BOOST_AUTO_TEST_CASE(a_sequence_from_a_speculated_state_checkpoints_its_prompt, *needs()) {
    auto& m = fixture(kFx);
    const int32_t vocab = int32_t(m.hp().vocab);
    const engine_options o = checkpoint_options(160);
    const auto base = prompt_ids(kFx, 40);
    const auto fresh = [&](generation_request r) {
        engine plain(*m.model, o);  // no speculation
        r.reuse_prefix = false;
        return run_request(plain, std::move(r));
    };
    // Turn 1's plain continuation (the oracle's), and a stop token well into it.
    const auto plain1 = fresh(greedy_request(base, 40, false));
    BOOST_TEST_REQUIRE(plain1.tokens.size() == 40u);
    size_t at = 24;
    while (std::find(plain1.tokens.begin(), plain1.tokens.begin() + std::ptrdiff_t(at), plain1.tokens[at]) !=
           plain1.tokens.begin() + std::ptrdiff_t(at))
        ++at;
    BOOST_TEST_REQUIRE(at < plain1.tokens.size());
    auto r1 = greedy_request(base, 40, true);
    r1.stop_tokens = {plain1.tokens[at]};
    const std::vector<int32_t> t1_tokens(plain1.tokens.begin(), plain1.tokens.begin() + std::ptrdiff_t(at));
    // Turn 2: turn 1's tokens, the stop token and one more (its prompt ends within the reach of
    // turn 1's rolled-back rows).
    auto turn2 = base;
    turn2.insert(turn2.end(), t1_tokens.begin(), t1_tokens.end());
    turn2.insert(turn2.end(), {plain1.tokens[at], 7});
    const int64_t p2 = int64_t(turn2.size());
    const auto r2 = greedy_request(turn2, 24, true);
    const auto plain2 = fresh(r2);
    BOOST_TEST_REQUIRE(plain2.tokens.size() == 24u);
    // Turn 3 parts from turn 2 right after its prompt.
    auto turn3 = turn2;
    turn3.insert(turn3.end(), {(plain2.tokens[0] + 1) % vocab, 11, 12});
    const auto r3 = greedy_request(turn3, 12, true);
    const auto plain3 = fresh(r3);

    engine_options s = o;
    s.spec.k = 5;
    s.spec.adaptive = false;
    int64_t admitted_size = -1, admitted_floor = -1;  // turn 2's state when admitted
    s.spec.make_drafter = [&](const std::vector<int32_t>& prompt,
                              const dsv41::sequence_state& seq) -> std::unique_ptr<spec::drafter> {
        if (prompt == base)
            return std::make_unique<spec::oracle_drafter>(plain1.tokens, int64_t(base.size()), 0.5, vocab, 5);
        if (prompt == turn2) {
            admitted_size = seq.size();
            admitted_floor = seq.truncation_floor();
            return std::make_unique<spec::oracle_drafter>(plain2.tokens, p2, 0.5, vocab, 5);
        }
        return nullptr;
    };
    BOOST_TEST_REQUIRE(validate(s.spec, *m.model).ok());
    engine eng(*m.model, s);
    const auto t1 = run_request(eng, r1);
    BOOST_TEST(t1.reason == "stop");
    BOOST_TEST(t1.tokens == t1_tokens);
    BOOST_TEST((t1.draft_n_accepted > 0 && t1.draft_n_accepted < t1.draft_n), "turn 1's drafts partly stand");
    const uint64_t checkpoints1 = eng.stats().prefix_checkpoints;
    BOOST_TEST(checkpoints1 == 1u, "turn 1's prompt");

    const auto t2 = run_request(eng, r2);
    BOOST_TEST(t2.cached_tokens == p2 - 2, "turn 2 starts from turn 1's whole final state");
    BOOST_TEST(admitted_size == p2 - 2);
    // Rolled-back rows past its end: the rings were written beyond size() (floor > size - rollback),
    // and past turn 2's prompt.
    BOOST_TEST_MESSAGE("turn 2 admitted at " << admitted_size << ", floor " << admitted_floor << ", prompt " << p2);
    BOOST_TEST(admitted_floor + o.rollback > p2, "turn 1's rolled-back rows reach past turn 2's prompt");
    BOOST_TEST(t2.tokens == plain2.tokens);
    BOOST_TEST(t2.logprobs == plain2.logprobs);
    BOOST_TEST((t2.draft_n_accepted > 0 && t2.draft_n_accepted < t2.draft_n), "turn 2's drafts partly stand");
    BOOST_TEST(eng.stats().prefix_checkpoints == checkpoints1 + 1, "turn 2's prompt");

    const auto t3 = run_request(eng, r3);
    BOOST_TEST(t3.cached_tokens == p2, "turn 2's prompt checkpoint");
    BOOST_TEST(t3.reason == plain3.reason);
    BOOST_TEST(t3.tokens == plain3.tokens);
    BOOST_TEST(t3.logprobs == plain3.logprobs);
}

BOOST_AUTO_TEST_CASE(speculation_options_are_checked, *needs()) {
    auto& m = fixture(kFx);
    dsv41::model plain(m.hp(), m.files->weights, nullptr, *m.experts, *m.backend);
    speculation_options o;
    o.drafter = "dspark";
    BOOST_TEST(validate(o, *m.model).ok());
    BOOST_TEST(validate(o, plain).message().find("draft head") != std::string::npos);
    o.drafter = "eagle";
    BOOST_TEST(!validate(o, *m.model).ok());
    o.drafter = "ngram";
    o.k = 6;
    BOOST_TEST(!validate(o, *m.model).ok());
    o.k = 0;
    BOOST_TEST(validate(o, *m.model).ok());
    BOOST_TEST(!engine_speculation(*m.model, o).on());  // k 0: off
    BOOST_TEST(engine_speculation(*m.model, o).cap(3) == 0);
    o.k = 4;
    const engine_speculation on(*m.model, o);
    BOOST_TEST(on.on());
    BOOST_TEST(on.cap(-1) == 4);
    BOOST_TEST(on.cap(2) == 2);
    BOOST_TEST(on.cap(0) == 0);
    BOOST_TEST(on.cap(9) == 4);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
