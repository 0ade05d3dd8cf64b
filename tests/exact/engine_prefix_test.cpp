// The engine's pool of sequence states (scheduler/engine_prefix.h) on its own: a finished state
// that ran more than `rollback` past its prompt cannot serve a prompt that parts from it at the
// prompt's end, while the prompt's checkpoint (keep_prefix) serves the whole earlier prompt, with
// the bits of processing it again; the checkpoint is dropped when the final state covers it and
// never copied twice or without a pool; under a full pool it evicts the least recently used
// state and a free state is left for every admission; a state that speculated serves only what
// its rings still hold.
#include <boost/test/unit_test.hpp>

#include "../common/test_support.h"
#include "fixture_model.h"
#include "scheduler/engine_prefix.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";
auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

prefix_pool_options pool_options(int64_t running, int64_t cached) {
    prefix_pool_options o;
    o.running = running;
    o.cached = cached;
    o.context = 160;
    o.rollback = 16;
    o.min_copy = 16;
    return o;
}

// Feeds `tokens` to the state; the last row's logits.
std::vector<float> feed(fixture_model& m, dsv41::sequence_state& s, std::span<const int32_t> tokens) {
    std::vector<float> logits;
    dsv41::forward_item item{&s, tokens, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    return logits;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// `n` tokens standing for a reply (any tokens do: the pool only compares them).
std::vector<int32_t> reply(int32_t first, int n) {
    std::vector<int32_t> r;
    for (int i = 0; i < n; ++i) r.push_back(int32_t((first + 37 * i) % 512));
    return r;
}

// The sequence that took `g` processes the rest of `prompt`: its logits.
std::vector<float> finish_prompt(fixture_model& m, const prefix_pool::grant& g,
                                 const std::vector<int32_t>& prompt) {
    return feed(m, *g.state, std::span<const int32_t>(prompt).subspan(size_t(g.reused)));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(prefix_pool_suite)

// Turn 1 generates 30 tokens (rollback 16): its final state is refused for turn 2, whose
// re-tokenized reply parts from the generated one at its first token; the checkpoint taken while
// the state could still be truncated to the prompt's end serves turn 1's whole prompt, in place,
// and turn 2's logits are those of a fresh state.
BOOST_AUTO_TEST_CASE(the_prompt_checkpoint_serves_what_the_finished_state_cannot, *needs()) {
    auto& m = fixture(kFx);
    prefix_pool pool(*m.model, pool_options(2, 2));
    const auto p1 = prompt_ids(kFx, 40);
    const auto generated = reply(100, 30);
    const auto p2 = concat(concat(p1, reply(101, 12)), {7, 8, 9});  // parts from `generated` at once

    auto t1 = pool.acquire(p1, true, {});
    BOOST_TEST(t1.reused == 0);
    finish_prompt(m, t1, p1);
    feed(m, *t1.state, std::span(generated).first(10));
    const uint64_t checkpoint = pool.keep_prefix(*t1.state, 40);
    BOOST_TEST(checkpoint != 0u);
    BOOST_TEST(pool.kept() == 1);
    BOOST_TEST(pool.free() == 2);  // 4 states: one out, one kept
    BOOST_TEST(t1.state->size() == 50, "the running state is not changed");
    feed(m, *t1.state, std::span(generated).subspan(10));
    BOOST_TEST(pool.usable(*t1.state, p2) == 0, "30 tokens past the common prefix: refused");
    BOOST_TEST(!pool.covers(*t1.state, p1));
    pool.give_back(std::move(t1.state), true, checkpoint);
    BOOST_TEST(pool.kept() == 2, "the final state does not cover the checkpoint: both are kept");

    auto t2 = pool.acquire(p2, true, {});
    BOOST_TEST(t2.reused == 40);
    BOOST_TEST(!t2.copied, "the checkpoint is taken in place");
    BOOST_TEST(pool.kept() == 1);
    const auto reused = finish_prompt(m, t2, p2);
    auto fresh = m.sequence(160);
    BOOST_TEST(same_bits(reused, feed(m, *fresh, p2)), "turn 2 from the checkpoint = turn 2 processed whole");
    pool.give_back(std::move(t2.state), false);
    BOOST_TEST(pool.free() == 3);

    // Without the checkpoint nothing serves turn 2.
    prefix_pool plain(*m.model, pool_options(2, 2));
    auto u1 = plain.acquire(p1, true, {});
    finish_prompt(m, u1, p1);
    feed(m, *u1.state, generated);
    plain.give_back(std::move(u1.state), true);
    BOOST_TEST(plain.acquire(p2, true, {}).reused == 0);
}

// A final state within rollback of its prompt covers the checkpoint, which is dropped; a second
// checkpoint of tokens a kept state covers is not copied (that state becomes the most recent);
// without a pool nothing is ever copied.
BOOST_AUTO_TEST_CASE(a_covered_checkpoint_is_dropped_and_never_copied_twice, *needs()) {
    auto& m = fixture(kFx);
    prefix_pool pool(*m.model, pool_options(2, 2));
    const auto p = prompt_ids(kFx, 40);
    auto a = pool.acquire(p, true, {});
    finish_prompt(m, a, p);
    const uint64_t checkpoint = pool.keep_prefix(*a.state, 40);
    BOOST_TEST_REQUIRE(checkpoint != 0u);
    BOOST_TEST(pool.keep_prefix(*a.state, 40) == 0u, "the kept checkpoint covers it");
    BOOST_TEST(pool.kept() == 1);
    feed(m, *a.state, reply(5, 16));  // exactly rollback past the prompt
    BOOST_TEST(pool.covers(*a.state, p));
    pool.give_back(std::move(a.state), true, checkpoint);
    BOOST_TEST(pool.kept() == 1, "the final state replaced the checkpoint");
    BOOST_TEST(pool.free() == 3);
    // The final state now serves the prompt, from a truncated copy.
    auto b = pool.acquire(concat(p, {1}), true, {});
    BOOST_TEST(b.reused == 40);
    BOOST_TEST(b.copied);
    // b's state covers p: nothing is copied, and the kept state it covers stays.
    BOOST_TEST(pool.keep_prefix(*b.state, 40) == 0u);
    BOOST_TEST(pool.kept() == 1);
    // An unknown or stale checkpoint id changes nothing.
    pool.give_back(std::move(b.state), true, checkpoint);
    BOOST_TEST(pool.kept() == 2);

    prefix_pool none(*m.model, pool_options(2, 0));
    auto c = none.acquire(p, true, {});
    finish_prompt(m, c, p);
    BOOST_TEST(none.keep_prefix(*c.state, 40) == 0u);
    BOOST_TEST(none.kept() == 0);
    BOOST_TEST(none.free() == 1);
    none.give_back(std::move(c.state), true);
    BOOST_TEST(none.free() == 2);
}

// A kept state that speculated: 8 verification rows of which 1 is kept (rollback 16, window 8:
// 24 ring slots) leave it at 41 positions, but the rejected rows at 41..47 overwrote the slots of
// 17..23. A prompt parting from it at 28 (13 back, within rollback) is not served from it; one
// parting at 34 is, with a fresh state's bits; neither state covers less than it truly holds.
BOOST_AUTO_TEST_CASE(a_speculated_state_serves_only_what_its_rings_hold, *needs()) {
    auto& m = fixture(kFx);
    BOOST_TEST_REQUIRE(m.hp().window == 8);  // the positions below assume it
    prefix_pool pool(*m.model, pool_options(2, 2));
    const auto p = prompt_ids(kFx, 40);
    auto a = pool.acquire(p, true, {});
    finish_prompt(m, a, p);
    feed(m, *a.state, reply(200, 8));  // a verification block: its first row is kept
    BOOST_TEST_REQUIRE(a.state->truncate(41).ok());
    BOOST_TEST(a.state->truncation_floor() == 48 - 16);
    const auto head = [&](int64_t n) { return std::vector<int32_t>(p.begin(), p.begin() + n); };
    BOOST_TEST(!pool.covers(*a.state, head(31)));
    BOOST_TEST(pool.covers(*a.state, head(32)));
    pool.give_back(std::move(a.state), true);
    BOOST_TEST_REQUIRE(pool.kept() == 1);

    const auto fresh_logits = [&](const std::vector<int32_t>& prompt) {
        auto fresh = m.sequence(160);
        return feed(m, *fresh, prompt);
    };
    for (const auto& [parts_at, served] : {std::pair{28, 0}, std::pair{34, 34}}) {
        const auto q = concat(head(parts_at), {7, 8, 9});
        auto g = pool.acquire(q, true, {});
        BOOST_TEST(g.reused == served, "parting at " << parts_at);
        BOOST_TEST(same_bits(finish_prompt(m, g, q), fresh_logits(q)), "parting at " << parts_at);
        pool.give_back(std::move(g.state), false);
    }
    BOOST_TEST(pool.kept() == 1, "the speculated state stays kept (it served a copy)");
}

// Two kept states and two running sequences: every state is out or kept. Each checkpoint evicts
// the least recently used kept state (one that served a copy counts as used) and takes its place;
// a free state is left whenever a sequence ends.
BOOST_AUTO_TEST_CASE(checkpoints_under_a_full_pool_evict_the_least_recently_used, *needs()) {
    auto& m = fixture(kFx);
    prefix_pool pool(*m.model, pool_options(2, 2));
    const auto pa = reply(10, 20), pb = reply(11, 20), pd = reply(13, 24);
    const auto pc = concat(pa, reply(12, 20));  // extends A's prompt by more than rollback
    // A and B finish 3 tokens past their prompts and are kept.
    for (const auto* p : {&pa, &pb}) {
        auto g = pool.acquire(*p, true, {});
        finish_prompt(m, g, *p);
        feed(m, *g.state, reply(3, 3));
        pool.give_back(std::move(g.state), true);
    }
    BOOST_TEST(pool.kept() == 2);
    // C starts from a truncated copy of A (A becomes more recent than B), D from nothing.
    auto c = pool.acquire(pc, true, {});
    BOOST_TEST(c.reused == 20);
    BOOST_TEST(c.copied);
    finish_prompt(m, c, pc);
    const std::vector<const dsv41::sequence_state*> running{c.state.get()};
    auto d = pool.acquire(pd, true, running);
    BOOST_TEST(d.reused == 0);
    finish_prompt(m, d, pd);
    BOOST_TEST(pool.free() == 0, "two kept, two out");
    BOOST_TEST(pool.keep_prefix(*c.state, int64_t(pc.size())) != 0u, "evicts B");
    BOOST_TEST(pool.kept() == 2);
    BOOST_TEST(pool.free() == 0);
    BOOST_TEST(pool.keep_prefix(*d.state, int64_t(pd.size())) != 0u, "evicts A");
    BOOST_TEST(pool.kept() == 2);
    pool.give_back(std::move(c.state), false);
    BOOST_TEST(pool.free() == 1, "an admission finds a free state");
    pool.give_back(std::move(d.state), false);
    BOOST_TEST(pool.free() == 2);
    // What is kept: the checkpoints of C and D; A and B are gone.
    const auto reused = [&](const std::vector<int32_t>& p) {
        auto g = pool.acquire(concat(p, {1}), true, {});
        const int64_t n = g.reused;
        pool.give_back(std::move(g.state), false);
        return n;
    };
    BOOST_TEST(reused(pa) == 0);
    BOOST_TEST(reused(pb) == 0);
    BOOST_TEST(reused(pd) == int64_t(pd.size()));  // taken in place: no longer kept
    BOOST_TEST(reused(pc) == int64_t(pc.size()));
    BOOST_TEST(pool.kept() == 0);
    BOOST_TEST(pool.free() == 4);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
