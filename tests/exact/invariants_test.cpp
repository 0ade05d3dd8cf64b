// The model's own invariants (issue: exactness): prompt processed in one batch, in chunks or token
// by token gives the same logits; reruns and thread counts are bit-identical; several sequences in
// one forward equal each alone; zeroed engram tables equal engram disabled; truncation restores
// the state exactly, and is refused where rolled-back rows overwrote the ring slots it needs; a
// failed forward changes nothing.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>

#include "../common/test_support.h"
#include "fixture_model.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";

std::vector<int32_t> prompt(int len) { return prompt_ids(kFx, len); }

// Logits of every row when `tokens` are fed in chunks of `chunk` (0: all at once).
std::vector<float> run_chunked(fixture_model& m, const std::vector<int32_t>& tokens, size_t chunk) {
    auto seq = m.sequence();
    std::vector<float> all, part;
    for (size_t i = 0; i < tokens.size();) {
        const size_t n = chunk == 0 ? tokens.size() : std::min(chunk, tokens.size() - i);
        dsv41::forward_item item{seq.get(), std::span<const int32_t>(tokens).subspan(i, n), true};
        BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, part).ok());
        all.insert(all.end(), part.begin(), part.end());
        i += n;
    }
    return all;
}

auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

std::vector<int32_t> concat_tokens(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// Feeds `tokens` in one forward: every row's logits.
void feed_all(fixture_model& m, dsv41::sequence_state& s, const std::vector<int32_t>& tokens, std::vector<float>& out) {
    dsv41::forward_item item{&s, tokens, true};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, out).ok());
}

// Counts the calls and checks the protocol: need() before get(), announced experts only.
struct checking_experts final : dsv41::expert_source {
    const loaded_model& m;
    std::vector<int32_t> announced;
    int layer = -1;
    int64_t gets = 0;
    int fail_at_layer = -2;
    explicit checking_experts(const loaded_model& lm) : m(lm) {}
    void need(int l, std::span<const int32_t> experts) override {
        layer = l;
        announced.assign(experts.begin(), experts.end());
        BOOST_TEST(std::is_sorted(announced.begin(), announced.end()));
    }
    result<dsv41::expert_weights> get(int l, int32_t e) override {
        BOOST_TEST(l == layer);
        BOOST_TEST(std::binary_search(announced.begin(), announced.end(), e));
        ++gets;
        if (l == fail_at_layer) return make_error("simulated read failure of expert " + std::to_string(e));
        return m.expert(l, e);
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(invariants)

// Chunk boundaries at odd and even positions exercise the ratio-2 pending pair across forwards,
// the window rings and the compressed caches. Every value is computed by the same kernels in the
// same order whatever the chunking, so the bound is zero: bit-identical.
BOOST_AUTO_TEST_CASE(chunked_prefill_equals_one_batch, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt(40);
    const auto whole = run_chunked(m, tokens, 0);
    for (size_t chunk : {1, 2, 3, 7, 16}) {
        const auto got = run_chunked(m, tokens, chunk);
        double max_diff = 0;
        for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(got[i] - whole[i])));
        BOOST_TEST_MESSAGE("chunks of " << chunk << ": max |diff| " << max_diff);
        BOOST_TEST(same_bits(got, whole), "chunks of " << chunk << " differ (max |diff| " << max_diff << ")");
    }
}

BOOST_AUTO_TEST_CASE(reruns_and_thread_counts_are_bit_identical, *needs()) {
    const auto tokens = prompt(40);
    const auto a = run_chunked(fixture(kFx, 2), tokens, 0);
    const auto b = run_chunked(fixture(kFx, 2), tokens, 0);
    const auto c = run_chunked(fixture(kFx, 1), tokens, 0);
    const auto d = run_chunked(fixture(kFx, 3), tokens, 5);
    BOOST_TEST(same_bits(a, b));
    BOOST_TEST(same_bits(a, c));
    BOOST_TEST(same_bits(a, d));
}

BOOST_AUTO_TEST_CASE(batched_sequences_equal_each_alone, *needs()) {
    auto& m = fixture(kFx);
    const auto p7 = prompt(7), p40 = prompt(40);
    const auto alone7 = run_chunked(m, p7, 0), alone40 = run_chunked(m, p40, 0);
    auto s1 = m.sequence(), s2 = m.sequence();
    dsv41::forward_item items[2] = {{s1.get(), p7, true}, {s2.get(), p40, true}};
    std::vector<float> logits;
    BOOST_TEST_REQUIRE(m.model->forward(items, logits).ok());
    std::vector<float> both(alone7);
    both.insert(both.end(), alone40.begin(), alone40.end());
    BOOST_TEST(same_bits(logits, both));
    // A decode step of both at once (different positions) equals each alone.
    const int32_t t1 = 5, t2 = 9;
    dsv41::forward_item steps[2] = {{s1.get(), {&t1, 1}, false}, {s2.get(), {&t2, 1}, false}};
    BOOST_TEST_REQUIRE(m.model->forward(steps, logits).ok());
    auto r1 = m.sequence(), r2 = m.sequence();
    std::vector<float> a, b, tmp;
    dsv41::forward_item i1{r1.get(), p7, false}, i2{r2.get(), p40, false};
    BOOST_TEST_REQUIRE(m.model->forward({&i1, 1}, tmp).ok());
    BOOST_TEST_REQUIRE(m.model->forward({&i2, 1}, tmp).ok());
    dsv41::forward_item j1{r1.get(), {&t1, 1}, false}, j2{r2.get(), {&t2, 1}, false};
    BOOST_TEST_REQUIRE(m.model->forward({&j1, 1}, a).ok());
    BOOST_TEST_REQUIRE(m.model->forward({&j2, 1}, b).ok());
    a.insert(a.end(), b.begin(), b.end());
    BOOST_TEST(same_bits(logits, a));
}

// A zero table is the exact identity (zero key -> gate 0.5 on a zero value), so zeroing the tables
// must equal running without the engram layers at all.
BOOST_AUTO_TEST_CASE(zero_engram_tables_equal_engram_disabled, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt(40);
    dsv41::model_weights zeroed = m.files->weights;
    std::vector<uint8_t> zeros(1 << 20, 0);
    for (int L : m.hp().engram_layers) {
        auto& lw = zeroed.layers[size_t(L)];
        BOOST_TEST_REQUIRE(size_t(lw.engram_rows * m.hp().engram_head_dim) <= zeros.size());
        lw.engram_values = zeros.data();
        lw.engram_scales = zeros.data();
    }
    dsv41::hparams no_engram = m.hp();
    no_engram.engram_layers.clear();
    dsv41::model with_zero(m.hp(), zeroed, nullptr, *m.experts, *m.backend);
    dsv41::model disabled(no_engram, m.files->weights, nullptr, *m.experts, *m.backend);
    auto run = [&](dsv41::model& mdl, const dsv41::hparams& hp) {
        dsv41::sequence_state seq(*m.backend, hp, 64, 8, false);
        std::vector<float> out;
        dsv41::forward_item item{&seq, tokens, true};
        BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, out).ok());
        return out;
    };
    const auto a = run(with_zero, m.hp()), b = run(disabled, no_engram);
    BOOST_TEST(same_bits(a, b));
    // And the real tables do change the result (the test would be vacuous otherwise).
    BOOST_TEST(!same_bits(a, run_chunked(m, tokens, 0)));
}

BOOST_AUTO_TEST_CASE(truncate_restores_the_state, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt(40);
    const std::vector<int32_t> more = {3, 141, 59, 26, 5};
    auto seq = m.sequence();
    std::vector<float> first, again, tmp;
    dsv41::forward_item item{seq.get(), tokens, false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, tmp).ok());
    dsv41::forward_item extra{seq.get(), more, true};
    BOOST_TEST_REQUIRE(m.model->forward({&extra, 1}, first).ok());
    // Roll back the 5 positions (odd start: the ratio-2 pending pair must come back) and redo them
    // one by one: the rows must be the same bits as the batched ones.
    BOOST_TEST_REQUIRE(seq->truncate(40).ok());
    BOOST_TEST(seq->size() == 40);
    for (int32_t t : more) {
        dsv41::forward_item one{seq.get(), {&t, 1}, true};
        BOOST_TEST_REQUIRE(m.model->forward({&one, 1}, tmp).ok());
        again.insert(again.end(), tmp.begin(), tmp.end());
    }
    BOOST_TEST(same_bits(first, again));
    BOOST_TEST(!seq->truncate(2).ok());   // beyond what the window rings keep
    BOOST_TEST(!seq->truncate(99).ok());  // beyond the end
    BOOST_TEST(seq->truncate(0).ok());    // starting over is always possible
}

// A verification block writes ring slots for all its rows, also those rolled back: after 6 rows
// of which 1 is kept (rollback 8, window 8: 16 ring slots), the rejected rows at 41..45 overwrote
// the slots of 25..29, so the state can go back to 38 but no further, although 33 is within
// rollback of its size. Every truncation it accepts, of a copy, gives a fresh state's logits and
// draft; without the rolled-back rows it accepts everything within rollback, as before.
BOOST_AUTO_TEST_CASE(rolled_back_rows_limit_truncation, *needs()) {
    auto& m = fixture(kFx);
    const int64_t rollback = 8, window = m.hp().window;
    BOOST_TEST_REQUIRE(window == 8);  // the positions below assume it
    const auto held = concat_tokens(prompt(40), {3});
    const std::vector<int32_t> verified = {3, 141, 59, 26, 5, 35};  // the first is kept
    const std::vector<int32_t> tail = {7, 9, 11};
    std::vector<float> tmp;
    auto spec = m.model->new_sequence(128, rollback);
    feed_all(m, *spec, prompt(40), tmp);
    feed_all(m, *spec, verified, tmp);
    BOOST_TEST_REQUIRE(spec->truncate(41).ok());  // keep 1 of 6: well within rollback
    BOOST_TEST(spec->truncation_floor() == 46 - rollback);
    BOOST_TEST(spec->can_truncate_to(38));
    BOOST_TEST(!spec->can_truncate_to(37));
    BOOST_TEST(spec->can_truncate_to(0));

    auto plain = m.model->new_sequence(128, rollback);
    feed_all(m, *plain, held, tmp);
    BOOST_TEST(plain->truncation_floor() == 41 - rollback, "no rolled-back rows: the rule is unchanged");

    auto copy = m.model->new_sequence(128, rollback);
    for (int64_t n = 41 - rollback; n <= 41; ++n) {
        copy->copy_from(*spec);
        BOOST_TEST(copy->can_truncate_to(n) == (n >= 46 - rollback), "n = " << n);
        const status st = copy->truncate(n);
        BOOST_TEST(st.ok() == (n >= 46 - rollback), "n = " << n << ": refused iff the slots of " << n - window
                                                             << ".. were overwritten");
        if (!st.ok()) {
            BOOST_TEST(copy->size() == 41, "a refused truncation changes nothing");
            continue;
        }
        // The rest after n, then a draft: bits of a fresh state fed the same tokens.
        const auto rest = concat_tokens(std::vector<int32_t>(held.begin() + n, held.end()), tail);
        std::vector<float> got, want;
        feed_all(m, *copy, rest, got);
        auto fresh = m.model->new_sequence(128, rollback);
        feed_all(m, *fresh, std::vector<int32_t>(held.begin(), held.begin() + n), tmp);
        feed_all(m, *fresh, rest, want);
        BOOST_TEST(same_bits(got, want), "n = " << n << ": truncated state = fresh state");
        if (m.model->has_draft()) {
            dsv41::draft_output d_got, d_want;
            BOOST_TEST_REQUIRE(m.model->draft(*copy, 13, d_got).ok());
            BOOST_TEST_REQUIRE(m.model->draft(*fresh, 13, d_want).ok());
            BOOST_TEST(same_bits(d_got.logits, d_want.logits), "n = " << n << ": draft");
        }
    }
}

BOOST_AUTO_TEST_CASE(failed_forward_changes_nothing, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt(7);
    checking_experts experts(*m.files);
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, experts, *m.backend);
    auto seq = m.sequence();
    std::vector<float> ref, got;
    dsv41::forward_item item{seq.get(), tokens, true};
    // Bad token id: refused before anything runs.
    const std::vector<int32_t> bad = {1, 2, int32_t(m.hp().vocab)};
    dsv41::forward_item bad_item{seq.get(), bad, true};
    auto st = mdl.forward({&bad_item, 1}, got);
    BOOST_TEST(!st.ok());
    if (!st.ok()) BOOST_TEST(st.message().find("outside the vocabulary") != std::string::npos);
    // Expert read failure in the middle of the forward (layer 5): error, state unchanged.
    experts.fail_at_layer = 5;
    BOOST_TEST(!mdl.forward({&item, 1}, got).ok());
    BOOST_TEST(seq->size() == 0);
    experts.fail_at_layer = -2;
    BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, got).ok());
    BOOST_TEST(experts.gets > 0);
    ref = run_chunked(m, tokens, 0);
    BOOST_TEST(same_bits(got, ref));
    // Same after a failure in a later forward of an existing sequence.
    const int32_t t = 17;
    dsv41::forward_item step{seq.get(), {&t, 1}, true};
    experts.fail_at_layer = 8;
    BOOST_TEST(!mdl.forward({&step, 1}, got).ok());
    BOOST_TEST(seq->size() == 7);
    experts.fail_at_layer = -2;
    std::vector<float> after;
    BOOST_TEST_REQUIRE(mdl.forward({&step, 1}, after).ok());
    auto fresh = m.sequence();
    dsv41::forward_item f1{fresh.get(), tokens, false}, f2{fresh.get(), {&t, 1}, true};
    BOOST_TEST_REQUIRE(m.model->forward({&f1, 1}, got).ok());
    BOOST_TEST_REQUIRE(m.model->forward({&f2, 1}, got).ok());
    BOOST_TEST(same_bits(after, got));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
