// The generation engine: continuous batching over one model on an Asio strand. Requests batched
// together get exactly the tokens each gets alone (also through tiny expert tiers); cancellation,
// stop tokens, the wait-queue limit and bad requests behave. Prefix reuse (from kept and from
// running states) gives the bits of a fresh engine; log-probabilities, timings and counters;
// constrained decoding (only allowed tokens, the others' tokens unchanged).
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "../common/test_support.h"
#include "engine_events.h"
#include "fixture_model.h"
#include "scheduler/engine.h"
#include "scheduler/tiered_experts.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";
auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

struct outcome {
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
    std::string reason;
    int64_t completion_tokens = -1;
    int64_t cached_tokens = -1;
    std::vector<token_event> events;  // every one, the final one last
};

// Receives every event of a generation (polling; the engine runs on its own threads), until the
// final one, or only `stop_after` tokens when that is >= 0.
outcome collect(generation& g, int64_t cancel_after = -1, int64_t stop_after = -1) {
    outcome o;
    receive_events(g, std::chrono::seconds(60), [&](const token_event& e) {
        o.events.push_back(e);
        if (e.done) {
            o.reason = e.finish_reason;
            o.completion_tokens = e.completion_tokens;
            o.cached_tokens = e.cached_tokens;
            return true;
        }
        o.tokens.push_back(e.token);
        o.logprobs.push_back(e.logprob);
        if (int64_t(o.tokens.size()) == cancel_after) g.cancel();
        return int64_t(o.tokens.size()) == stop_after;
    });
    return o;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// Greedy tokens of one prompt straight through the model (no engine).
std::vector<int32_t> greedy_alone(fixture_model& m, const std::vector<int32_t>& prompt, int n) {
    auto seq = m.sequence(256);
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), prompt, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
        const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(t);
        if (k + 1 == n) break;
        dsv41::forward_item step{seq.get(), {&t, 1}, false};
        BOOST_TEST_REQUIRE(m.model->forward({&step, 1}, logits).ok());
    }
    return out;
}

std::vector<std::vector<int32_t>> prompts() {
    std::vector<std::vector<int32_t>> out;
    for (int len : {1, 7, 40}) out.push_back(prompt_ids(kFx, len));
    out.push_back({5, 6, 7, 8, 9, 10, 11, 12, 13});
    out.push_back({300, 301});
    out.push_back({42, 17, 99, 256, 511, 3, 3, 3, 77, 1, 2});
    return out;
}

engine_options options(int64_t sequences, int64_t waiting, int64_t chunk, int64_t context) {
    engine_options o;
    o.max_sequences = sequences;
    o.max_waiting = waiting;
    o.prefill_chunk = chunk;
    o.context_tokens = context;
    return o;
}

generation_request greedy_request(std::vector<int32_t> prompt, int64_t n) {
    generation_request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_tokens = n;
    return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engine_suite)

BOOST_AUTO_TEST_CASE(batched_requests_get_the_tokens_they_get_alone, *needs()) {
    auto& m = fixture(kFx);
    const auto ps = prompts();
    std::vector<std::vector<int32_t>> expected;
    for (const auto& p : ps) expected.push_back(greedy_alone(m, p, 12));
    // Alone in the model, then through the engine (4 at a time, prompts in chunks of 7) with
    // every expert resident, and again through tiny streaming tiers.
    auto tiers = tiered_experts::create(*m.files, [] {
        tier_options o;
        o.device_bytes = 3 * 13000;
        o.host_bytes = 5 * 25000;
        return o;
    }());
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1 && !tiers) {
            BOOST_TEST_MESSAGE("streaming pass skipped: " << tiers.message());
            break;
        }
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, pass == 0 ? static_cast<dsv41::expert_source&>(*m.experts)
                                                                       : static_cast<dsv41::expert_source&>(**tiers),
                         *m.backend);
        engine eng(mdl, options(4, 64, 7, 256));
        std::vector<std::shared_ptr<generation>> gens;
        for (const auto& p : ps) {
            auto g = eng.submit(greedy_request(p, 12));
            BOOST_TEST_REQUIRE(g.ok());
            gens.push_back(*g);
        }
        for (size_t i = 0; i < gens.size(); ++i) {
            const auto o = collect(*gens[i]);
            BOOST_TEST(o.reason == "length");
            BOOST_TEST(o.completion_tokens == 12);
            BOOST_TEST(o.tokens == expected[i], "request " << i << " pass " << pass);
        }
        const auto s = eng.stats();
        BOOST_TEST(s.generated_tokens == uint64_t(12 * ps.size()));
        BOOST_TEST(s.steps < uint64_t(12 * ps.size()));  // batched: fewer steps than tokens
        BOOST_TEST_MESSAGE("pass " << pass << ": " << s.steps << " steps for " << s.generated_tokens << " tokens");
    }
}

BOOST_AUTO_TEST_CASE(cancel_stop_tokens_and_limits, *needs()) {
    auto& m = fixture(kFx);
    const auto p = prompts()[1];
    const auto greedy = greedy_alone(m, p, 6);
    engine eng(*m.model, options(1, 1, 64, 256));
    // Cancel after 3 tokens.
    auto g = eng.submit(greedy_request(p, 200));
    BOOST_TEST_REQUIRE(g.ok());
    const auto o = collect(**g, 3);
    BOOST_TEST(o.reason == "cancelled");
    BOOST_TEST(o.tokens.size() >= 3u);
    // A stop token ends the generation before it is emitted.
    auto req = greedy_request(p, 50);
    req.stop_tokens = {greedy[2]};
    auto s = eng.submit(req);
    BOOST_TEST_REQUIRE(s.ok());
    const auto so = collect(**s);
    BOOST_TEST(so.reason == "stop");
    BOOST_TEST(so.tokens == std::vector<int32_t>(greedy.begin(), greedy.begin() + 2));
    // One running, one waiting: a third request is refused.
    auto a = eng.submit(greedy_request(p, 100));
    for (int i = 0; i < 5000 && eng.stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto b = eng.submit(greedy_request(p, 100));
    auto c = eng.submit(greedy_request(p, 100));
    BOOST_TEST_REQUIRE((a.ok() && b.ok()));
    BOOST_TEST(!c.ok());
    if (!c.ok()) BOOST_TEST(c.message().find("busy") != std::string::npos);
    (*a)->cancel();
    (*b)->cancel();
    collect(**a);
    collect(**b);
    // Bad requests.
    BOOST_TEST(!eng.submit(greedy_request({}, 5)).ok());
    BOOST_TEST(!eng.submit(greedy_request({1, 2, 100000}, 5)).ok());
    auto bad = greedy_request(p, 5);
    bad.sampling.top_p = 0;
    BOOST_TEST(!eng.submit(bad).ok());
    BOOST_TEST(!eng.submit(greedy_request(std::vector<int32_t>(300, 1), 5)).ok());  // beyond the context
}

// Which experts of a layer a greedy generation routes to.
struct recording_source final : dsv41::expert_source {
    dsv41::expert_source& inner;
    int layer;
    std::set<int32_t> seen;
    recording_source(dsv41::expert_source& i, int l) : inner(i), layer(l) {}
    void need(int l, std::span<const int32_t> ids) override {
        if (l == layer) seen.insert(ids.begin(), ids.end());
        inner.need(l, ids);
    }
    result<dsv41::expert_weights> get(int l, int32_t e) override { return inner.get(l, e); }
};

// An expert read that keeps failing fails only the request that routes to it.
BOOST_AUTO_TEST_CASE(a_failing_expert_fails_only_its_request, *needs()) {
    auto& m = fixture(kFx);
    const auto ps = prompts();
    const auto& a_prompt = ps[2];  // 40 tokens
    const auto& b_prompt = ps[3];
    auto used = [&](const std::vector<int32_t>& p) {
        recording_source rec(*m.experts, 5);
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, rec, *m.backend);
        engine eng(mdl, options(1, 4, 256, 256));
        collect(**eng.submit(greedy_request(p, 8)));
        return rec.seen;
    };
    const auto a_used = used(a_prompt), b_used = used(b_prompt);
    int32_t victim = -1;
    for (int32_t e : a_used)
        if (!b_used.count(e)) victim = e;
    BOOST_TEST_REQUIRE(victim >= 0, "no layer-5 expert used by one prompt only");
    tier_options o;
    o.host_bytes = 1 << 24;
    o.inject_read_error = [victim](int layer, int32_t e) { return layer == 5 && e == victim; };
    auto tiers = tiered_experts::create(*m.files, o);
    if (!tiers) {
        BOOST_TEST_MESSAGE("skipped: " << tiers.message());
        return;
    }
    dsv41::model mdl(m.hp(), m.files->weights, nullptr, **tiers, *m.backend);
    engine eng(mdl, options(4, 8, 256, 256));
    auto ga = eng.submit(greedy_request(a_prompt, 8));
    auto gb = eng.submit(greedy_request(b_prompt, 8));
    BOOST_TEST_REQUIRE((ga.ok() && gb.ok()));
    const auto oa = collect(**ga), ob = collect(**gb);
    BOOST_TEST(oa.reason.find("of layer 5 could not be read: injected read error") != std::string::npos, oa.reason);
    BOOST_TEST(ob.reason == "length");
    BOOST_TEST(ob.tokens == greedy_alone(m, b_prompt, 8));
}

// Destroying the engine with requests in flight delivers their final events.
BOOST_AUTO_TEST_CASE(shutdown_finishes_every_request, *needs()) {
    auto& m = fixture(kFx);
    std::shared_ptr<generation> g1, g2;
    {
        engine eng(*m.model, options(1, 4, 64, 256));
        g1 = *eng.submit(greedy_request(prompts()[0], 200));
        g2 = *eng.submit(greedy_request(prompts()[1], 200));
    }
    BOOST_TEST(collect(*g1).reason == "cancelled");
    BOOST_TEST(collect(*g2).reason == "cancelled");
}

int32_t other(int32_t t) { return (t + 1) % 512; }  // a token that differs from t (the fixture's vocabulary)

// A request that samples (so a different logit anywhere would show in the log-probabilities).
generation_request sampled_request(std::vector<int32_t> prompt, int64_t n) {
    generation_request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 1234;
    r.sampling.n_probs = 3;
    r.max_tokens = n;
    return r;
}

engine_options prefix_options(int64_t cached, int64_t rollback) {
    engine_options o;
    o.max_sequences = 2;
    o.max_waiting = 8;
    o.prefill_chunk = 16;
    o.context_tokens = 256;
    o.cached_sequences = cached;
    o.rollback = rollback;
    return o;
}

// What a fresh engine (nothing to reuse) gives for the request.
outcome fresh(fixture_model& m, generation_request r, engine_options o) {
    engine eng(*m.model, o);
    r.reuse_prefix = false;
    auto g = eng.submit(std::move(r));
    BOOST_TEST_REQUIRE(g.ok());
    return collect(**g);
}

// The same tokens and the same log-probabilities (bit for bit) as the fresh run.
void same_as_fresh(const outcome& o, const outcome& f, const std::string& what) {
    BOOST_TEST(o.reason == f.reason, what);
    BOOST_TEST(o.tokens == f.tokens, what);
    BOOST_TEST(o.logprobs == f.logprobs, what);
    BOOST_TEST(o.events.size() == f.events.size(), what);
    for (size_t i = 0; i + 1 < std::min(o.events.size(), f.events.size()); ++i) {
        const auto& a = o.events[i].top;
        const auto& b = f.events[i].top;
        BOOST_TEST_REQUIRE(a.size() == b.size(), what);
        for (size_t k = 0; k < a.size(); ++k) {
            BOOST_TEST(a[k].token == b[k].token, what);
            BOOST_TEST(a[k].logprob == b[k].logprob, what);
        }
    }
}

outcome run(engine& eng, generation_request r) {
    auto g = eng.submit(std::move(r));
    BOOST_TEST_REQUIRE(g.ok());
    return collect(**g);
}

// Agent turns: the previous prompt + its completion + a new turn reuses the kept state in place;
// the same prompt again, and one diverging within `rollback`, truncate a copy; one diverging
// further back than that processes everything. Every one matches a fresh engine.
BOOST_AUTO_TEST_CASE(prefix_reuse_gives_the_bits_of_a_fresh_engine, *needs()) {
    auto& m = fixture(kFx);
    const auto opts = prefix_options(2, 16);
    engine eng(*m.model, opts);
    const auto base = prompt_ids(kFx, 40);
    uint64_t queried = 0, hits = 0;
    auto check = [&](const generation_request& r, int64_t want_cached, const std::string& what) {
        const auto o = run(eng, r);
        BOOST_TEST(o.cached_tokens == want_cached, what);
        for (const auto& e : o.events) BOOST_TEST(e.cached_tokens == want_cached, what);
        same_as_fresh(o, fresh(m, r, opts), what);
        queried += r.prompt.size();
        hits += uint64_t(want_cached);
        return o;
    };
    const auto t1 = check(sampled_request(base, 8), 0, "turn 1");
    BOOST_TEST_REQUIRE(t1.tokens.size() == 8u);
    // The kept state consumed the prompt and every token but the last sampled one (47).
    const auto turn2 = concat(concat(base, t1.tokens), {7, 8, 9});
    check(sampled_request(turn2, 8), 47, "turn 2 (the kept state, in place)");
    // The whole prompt (51 of the 58 kept) is held: its last token is processed again.
    check(sampled_request(turn2, 8), 50, "the same prompt again");
    check(sampled_request(concat({turn2.begin(), turn2.begin() + 45}, {other(turn2[45]), 2, 3}), 6), 45,
          "diverging 13 positions back");
    check(sampled_request(concat({base.begin(), base.begin() + 20}, {other(base[20]), 4, 4}), 6), 0,
          "diverging 33 positions back (beyond the rollback)");
    auto no_reuse = sampled_request(turn2, 4);
    no_reuse.reuse_prefix = false;
    BOOST_TEST(run(eng, no_reuse).cached_tokens == 0);
    // A short prompt reuses a copy when it shares most of it, not when it shares a small part.
    const std::vector<int32_t> short3 = {base[5], base[6], base[7]};
    const auto s3 = check(greedy_request(short3, 4), 0, "a 3-token prompt");
    check(greedy_request(short3, 4), 2, "the 3-token prompt again");
    std::vector<int32_t> longer = concat(short3, {other(s3.tokens[0])});
    longer.resize(23, 1);
    check(greedy_request(longer, 4), 0, "sharing 3 of 23 tokens");
    const auto s = eng.stats();
    BOOST_TEST(s.prefix_queries_tokens == queried);
    BOOST_TEST(s.prefix_hit_tokens == hits);
    BOOST_TEST(s.cached_sequences == 2);
    BOOST_TEST(s.prompt_tokens == queried - hits + no_reuse.prompt.size());  // processed ones only
}

// The kept pool holds `cached_sequences` states and evicts the least recently used one (a kept
// state that served a copy counts as used).
BOOST_AUTO_TEST_CASE(the_kept_pool_is_bounded_and_lru, *needs()) {
    auto& m = fixture(kFx);
    const auto opts = prefix_options(2, 16);
    engine eng(*m.model, opts);
    const auto pa = prompt_ids(kFx, 40);
    std::vector<int32_t> pb;
    for (int i = 0; i < 30; ++i) pb.push_back(int32_t(100 + 7 * i));
    std::vector<int32_t> pc(35, 11);
    const auto a = run(eng, greedy_request(pa, 6));
    const auto b = run(eng, greedy_request(pb, 6));
    BOOST_TEST(eng.stats().cached_sequences == 2);
    // A again: a truncated copy of A's state (A stays kept and becomes the most recent); its
    // state, kept when it finishes, evicts B.
    BOOST_TEST(run(eng, greedy_request(pa, 6)).cached_tokens == 39);
    BOOST_TEST(eng.stats().cached_sequences == 2);
    const auto b2 = run(eng, greedy_request(concat(concat(pb, b.tokens), {1}), 4));
    BOOST_TEST(b2.cached_tokens == 0, "B was evicted");
    // B2 evicted A (A's second run was used later), C evicts A's second run: A's prefix is gone.
    run(eng, greedy_request(pc, 4));
    BOOST_TEST(run(eng, greedy_request(concat(concat(pa, a.tokens), {2}), 4)).cached_tokens == 0, "A was evicted");
    BOOST_TEST(eng.stats().cached_sequences == 2);
    // No pool: nothing is kept.
    engine none(*m.model, prefix_options(0, 16));
    run(none, greedy_request(pa, 4));
    BOOST_TEST(run(none, greedy_request(pa, 4)).cached_tokens == 0);
    BOOST_TEST(none.stats().cached_sequences == 0);
}

// A running sequence's state is copied (between steps) for a request that shares its prefix.
BOOST_AUTO_TEST_CASE(a_running_sequence_serves_a_prefix, *needs()) {
    auto& m = fixture(kFx);
    engine_options opts = prefix_options(0, 1024);  // no pool: only the running one can serve
    opts.context_tokens = 1024;
    engine eng(*m.model, opts);
    const auto pa = prompt_ids(kFx, 40);
    auto ra = greedy_request(pa, 0);  // until the context is full: still running below
    auto ga = eng.submit(ra);
    BOOST_TEST_REQUIRE(ga.ok());
    const auto first = collect(**ga, -1, 3);
    BOOST_TEST_REQUIRE(first.tokens.size() == 3u);
    const auto rb = sampled_request(concat(concat(pa, first.tokens), {9, 9}), 6);
    const auto b = run(eng, rb);
    (*ga)->cancel();
    const auto rest = collect(**ga);
    BOOST_TEST(rest.reason == "cancelled", "A was running all along");
    // A had consumed the prompt and at least its first two tokens when B came (B's last token
    // is always processed).
    BOOST_TEST(b.cached_tokens >= 42);
    BOOST_TEST(b.cached_tokens <= 44);
    same_as_fresh(b, fresh(m, rb, opts), "copied from a running sequence");
    BOOST_TEST(eng.stats().prefix_hit_tokens == uint64_t(b.cached_tokens));
}

// Turn 1 generates more than rollback tokens; turn 2 is turn 1's prompt, its reply tokenized
// otherwise (from its first token on) and a new turn, as chat clients send it. The finished state
// cannot be truncated back to where they part, the prompt's checkpoint serves turn 1's whole
// prompt: bit for bit what a fresh engine gives. A reply that ends within rollback (its final
// state serves), a short prompt and an engine without a pool make no checkpoint; a cancelled
// sequence keeps its.
BOOST_AUTO_TEST_CASE(a_prompt_checkpoint_serves_the_next_turn_after_a_long_reply, *needs()) {
    auto& m = fixture(kFx);
    const auto opts = prefix_options(2, 16);  // prompts in chunks of 16
    const auto base = prompt_ids(kFx, 40);
    const auto next_turn = [&](const outcome& t1) {
        std::vector<int32_t> retokenized{other(t1.tokens[0])};
        retokenized.insert(retokenized.end(), t1.tokens.begin() + 1, t1.tokens.end());
        return concat(concat(base, retokenized), {7, 8, 9});
    };
    engine eng(*m.model, opts);
    const auto t1 = run(eng, sampled_request(base, 30));
    BOOST_TEST_REQUIRE(t1.tokens.size() == 30u);
    BOOST_TEST(eng.stats().prefix_checkpoints == 1u);
    BOOST_TEST(eng.stats().cached_sequences == 2, "the checkpoint and the final state");
    const auto r2 = sampled_request(next_turn(t1), 8);
    const auto t2 = run(eng, r2);
    BOOST_TEST(t2.cached_tokens == 40, "turn 1's whole prompt");
    same_as_fresh(t2, fresh(m, r2, opts), "turn 2 from the checkpoint");
    BOOST_TEST(eng.stats().prefix_checkpoints == 1u, "8 tokens: turn 2's final state serves its prompt");

    // The same turns without checkpoints: nothing serves turn 2.
    engine_options without = opts;
    without.prompt_checkpoints = false;
    engine plain(*m.model, without);
    BOOST_TEST(run(plain, sampled_request(base, 30)).tokens == t1.tokens);
    BOOST_TEST(run(plain, r2).cached_tokens == 0);
    BOOST_TEST(plain.stats().prefix_checkpoints == 0u);

    // Short replies, a short prompt (under min_copy, 16), no pool: nothing is copied.
    engine other_eng(*m.model, opts);
    run(other_eng, sampled_request(base, 12));
    run(other_eng, greedy_request(std::vector<int32_t>(base.begin(), base.begin() + 7), 30));
    BOOST_TEST(other_eng.stats().prefix_checkpoints == 0u);
    engine no_pool(*m.model, prefix_options(0, 16));
    run(no_pool, sampled_request(base, 30));
    BOOST_TEST(no_pool.stats().prefix_checkpoints == 0u);
    BOOST_TEST(no_pool.stats().cached_sequences == 0);

    // Cancelled after 25 tokens (of up to ~980: still running when the cancel comes): its
    // checkpoint serves the next turn.
    engine_options long_context = opts;
    long_context.context_tokens = 1024;
    engine cancelling(*m.model, long_context);
    auto g = cancelling.submit(sampled_request(base, 0));
    BOOST_TEST_REQUIRE(g.ok());
    const auto c1 = collect(**g, 25);
    BOOST_TEST(c1.reason == "cancelled");
    BOOST_TEST_REQUIRE(c1.tokens.size() >= 25u);
    BOOST_TEST(cancelling.stats().prefix_checkpoints == 1u);
    const auto rc = sampled_request(next_turn(c1), 6);
    const auto c2 = run(cancelling, rc);
    BOOST_TEST(c2.cached_tokens == 40);
    same_as_fresh(c2, fresh(m, rc, long_context), "the turn after a cancelled one");
}

BOOST_AUTO_TEST_CASE(log_probabilities_timings_and_counters, *needs()) {
    auto& m = fixture(kFx);
    engine_options opts = prefix_options(2, 16);
    opts.max_sequences = 1;
    opts.context_tokens = 64;
    engine eng(*m.model, opts);
    const auto p = prompt_ids(kFx, 40);
    // Greedy with 5 alternatives: the chosen token leads them.
    auto r1 = greedy_request(p, 20);
    r1.sampling.n_probs = 5;
    r1.reuse_prefix = false;
    auto r2 = greedy_request(concat(p, {1, 2}), 5);
    r2.reuse_prefix = false;
    const auto t0 = std::chrono::steady_clock::now();
    auto g1 = eng.submit(r1);
    auto g2 = eng.submit(r2);
    const double submitting = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST_REQUIRE((g1.ok() && g2.ok()));
    const auto o1 = collect(**g1), o2 = collect(**g2);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST_REQUIRE(o1.tokens.size() == 20u);
    for (size_t i = 0; i < o1.tokens.size(); ++i) {
        const auto& e = o1.events[i];
        BOOST_TEST_REQUIRE(e.top.size() == 5u);
        BOOST_TEST(e.top[0].token == e.token);
        BOOST_TEST(e.top[0].logprob == e.logprob);
        BOOST_TEST(e.logprob <= 0.0);
        for (size_t k = 1; k < e.top.size(); ++k) BOOST_TEST(e.top[k].logprob <= e.top[k - 1].logprob);
        BOOST_TEST(e.completion_tokens == int64_t(i + 1));
        BOOST_TEST(e.prompt_tokens == 40);
    }
    BOOST_TEST(o1.events.back().top.empty());
    for (const auto& e : o2.events) BOOST_TEST(e.top.empty());
    // Timings: queue and prefill are fixed once the first token came; decode grows from ~0.
    for (const auto* o : {&o1, &o2}) {
        const auto& ev = o->events;
        for (size_t i = 0; i < ev.size(); ++i) {
            BOOST_TEST(ev[i].queue_s == ev[0].queue_s);
            BOOST_TEST(ev[i].prefill_s == ev[0].prefill_s);
            BOOST_TEST(ev[i].queue_s >= 0.0);
            BOOST_TEST(ev[i].prefill_s > 0.0);
            if (i > 0) BOOST_TEST(ev[i].decode_s >= ev[i - 1].decode_s);
        }
        BOOST_TEST(ev.back().decode_s > ev.front().decode_s);
        BOOST_TEST(ev.back().queue_s + ev.back().prefill_s + ev.back().decode_s <= wall);
    }
    // One sequence at a time: the second waited (at least) while the first was processed.
    const auto& last1 = o1.events.back();
    BOOST_TEST(o2.events[0].queue_s >= last1.prefill_s + last1.decode_s - submitting);
    // The context fills up: max_tokens <= 0 runs until then.
    const auto c = run(eng, greedy_request(concat(p, {5}), 0));
    BOOST_TEST(c.reason == "context");
    BOOST_TEST(c.completion_tokens == int64_t(c.tokens.size()));
    BOOST_TEST(41 + c.completion_tokens == 64);
    const auto s = eng.stats();
    BOOST_TEST(s.tokens_max == 63u);
    BOOST_TEST(s.busy_s > 0.0);
    BOOST_TEST(s.busy_s <= wall + c.events.back().queue_s + c.events.back().prefill_s + c.events.back().decode_s);
    BOOST_TEST(s.decode_rows == s.steps);  // one sequence at a time
    BOOST_TEST(s.requests_done == 3u);
}

namespace {

// Allows the tokens `allow` accepts; done after `length` tokens. accept() runs on the engine's
// strand: what it records is read once the final event arrived.
struct rule_constraint final : token_constraint {
    std::function<bool(int32_t)> allow;
    int64_t length = 0;
    std::vector<int32_t> accepted;
    rule_constraint(std::function<bool(int32_t)> a, int64_t n) : allow(std::move(a)), length(n) {}
    void allowed(std::span<uint8_t> mask) const override {
        for (size_t v = 0; v < mask.size(); ++v) mask[v] = allow(int32_t(v)) ? 1 : 0;
    }
    void accept(int32_t token) override { accepted.push_back(token); }
    bool done() const override { return int64_t(accepted.size()) >= length; }
};

// Greedy tokens of one prompt straight through the model, the argmax over allowed tokens only.
std::vector<int32_t> greedy_alone_allowed(fixture_model& m, const std::vector<int32_t>& prompt, int n,
                                          const std::function<bool(int32_t)>& allow) {
    auto seq = m.sequence(256);
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), prompt, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
        int32_t best = -1;
        for (int32_t v = 0; v < int32_t(logits.size()); ++v)
            if (allow(v) && (best < 0 || logits[size_t(v)] > logits[size_t(best)])) best = v;
        out.push_back(best);
        if (k + 1 == n) break;
        dsv41::forward_item step{seq.get(), {&best, 1}, false};
        BOOST_TEST_REQUIRE(m.model->forward({&step, 1}, logits).ok());
    }
    return out;
}

}  // namespace

// Constrained decoding: a constrained request only gets allowed tokens (the greedy choice among
// them, as computed alone), ends with "stop" when its constraint is done, sees a stop token only
// when the constraint allows it, and fails cleanly when nothing is allowed; sampling under a
// constraint is reproducible; requests batched with constrained ones keep their exact tokens.
BOOST_AUTO_TEST_CASE(constrained_requests_get_only_allowed_tokens, *needs()) {
    auto& m = fixture(kFx);
    const auto ps = prompts();
    const auto odd = [](int32_t t) { return t % 2 == 1; };
    std::vector<std::vector<int32_t>> plain;
    for (const auto& p : ps) plain.push_back(greedy_alone(m, p, 8));
    const auto odd_alone = greedy_alone_allowed(m, ps[1], 6, odd);
    engine eng(*m.model, options(4, 64, 7, 256));

    auto constrained = greedy_request(ps[1], 50);
    auto rule = std::make_shared<rule_constraint>(odd, 6);
    constrained.constraint = rule;
    auto gc = eng.submit(constrained);
    BOOST_TEST_REQUIRE(gc.ok());
    std::vector<std::shared_ptr<generation>> gens;
    for (const auto& p : ps) {
        auto g = eng.submit(greedy_request(p, 8));
        BOOST_TEST_REQUIRE(g.ok());
        gens.push_back(*g);
    }
    const auto oc = collect(**gc);
    BOOST_TEST(oc.reason == "stop");
    BOOST_TEST(oc.completion_tokens == 6);
    BOOST_TEST(oc.tokens == odd_alone);
    BOOST_TEST(rule->accepted == oc.tokens);
    for (int32_t t : oc.tokens) BOOST_TEST(odd(t));
    BOOST_TEST(odd_alone != std::vector<int32_t>(plain[1].begin(), plain[1].begin() + 6));  // it did constrain
    for (size_t i = 0; i < gens.size(); ++i) {
        const auto o = collect(*gens[i]);
        BOOST_TEST(o.tokens == plain[i], "unconstrained request " << i << " batched with a constrained one");
    }

    // Sampling under a constraint: the same seed gives the same tokens, all allowed.
    const auto third = [](int32_t t) { return t % 3 == 0; };
    std::vector<int32_t> first;
    for (int round = 0; round < 2; ++round) {
        auto r = greedy_request(ps[2], 100);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = 11;
        r.reuse_prefix = round == 1;
        r.constraint = std::make_shared<rule_constraint>(third, 10);
        const auto o = run(eng, r);
        BOOST_TEST(o.reason == "stop");
        BOOST_TEST_REQUIRE(o.tokens.size() == 10u);
        for (int32_t t : o.tokens) BOOST_TEST(third(t));
        if (round == 0) first = o.tokens;
        else BOOST_TEST(o.tokens == first);
    }

    // A stop token ends a constrained request only when the constraint allows it.
    const int32_t stop = plain[1][2];
    auto no_stop = greedy_request(ps[1], 6);
    no_stop.stop_tokens = {stop};
    no_stop.constraint = std::make_shared<rule_constraint>([stop](int32_t t) { return t != stop; }, 100);
    const auto ns = run(eng, no_stop);
    BOOST_TEST(ns.reason == "length");
    BOOST_TEST(ns.tokens.size() == 6u);
    BOOST_TEST((std::find(ns.tokens.begin(), ns.tokens.end(), stop) == ns.tokens.end()));
    auto only_stop = greedy_request(ps[1], 6);
    only_stop.stop_tokens = {stop};
    only_stop.constraint = std::make_shared<rule_constraint>([stop](int32_t t) { return t == stop; }, 100);
    const auto os = run(eng, only_stop);
    BOOST_TEST(os.reason == "stop");
    BOOST_TEST(os.tokens.empty());

    // Nothing allowed: an error, and the engine goes on serving.
    auto nothing = greedy_request(ps[1], 6);
    nothing.constraint = std::make_shared<rule_constraint>([](int32_t) { return false; }, 100);
    BOOST_TEST(run(eng, nothing).reason == "error: the output constraint allows no token");
    BOOST_TEST(run(eng, greedy_request(ps[0], 8)).tokens == plain[0]);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
