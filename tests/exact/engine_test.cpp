// The generation engine: continuous batching over one model on an Asio strand. Requests batched
// together get exactly the tokens each gets alone (also through tiny expert tiers); cancellation,
// stop tokens, the wait-queue limit and bad requests behave.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "../common/test_support.h"
#include "fixture_model.h"
#include "scheduler/engine.h"
#include "scheduler/tiered_experts.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";
auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

struct outcome {
    std::vector<int32_t> tokens;
    std::string reason;
    int64_t completion_tokens = -1;
};

// Receives every event of a generation (polling; the engine runs on its own threads).
outcome collect(generation& g, int64_t cancel_after = -1) {
    outcome o;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (bool done = false; !done;) {
        BOOST_TEST_REQUIRE((std::chrono::steady_clock::now() < deadline), "no final event within 60 s");
        const bool got = g.events().try_receive([&](boost::system::error_code, token_event e) {
            if (e.done) {
                done = true;
                o.reason = e.finish_reason;
                o.completion_tokens = e.completion_tokens;
            } else {
                o.tokens.push_back(e.token);
                if (int64_t(o.tokens.size()) == cancel_after) g.cancel();
            }
        });
        if (!got) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return o;
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
        engine eng(mdl, {4, 64, 7, 256});
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
    engine eng(*m.model, {1, 1, 64, 256});
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
        engine eng(mdl, {1, 4, 256, 256});
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
    engine eng(mdl, {4, 8, 256, 256});
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
        engine eng(*m.model, {1, 4, 64, 256});
        g1 = *eng.submit(greedy_request(prompts()[0], 200));
        g2 = *eng.submit(greedy_request(prompts()[1], 200));
    }
    BOOST_TEST(collect(*g1).reason == "cancelled");
    BOOST_TEST(collect(*g2).reason == "cancelled");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
