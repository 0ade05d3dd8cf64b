// The device tier's fill pipeline (scheduler/device_experts) on the CPU backend, whose copy
// stream copies at once (model/cpu_copy_stream.cpp), so what is checked here is the pipeline's
// bookkeeping: answers through the strand, misses asked of the host tier once (joined when
// already on their way), slots reused only once their copy completed, completions held back,
// errors, and the forward suspended (not blocking) meanwhile. tests/cuda/device_tier_test.cpp
// runs the same on the GPU, where the copies are asynchronous.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <future>
#include <optional>
#include <random>
#include <vector>

#include "../common/test_support.h"
#include "device_tier_support.h"
#include "model/q8_0_tiles.h"
#include "scheduler/device_weights.h"
#include "scheduler/layer_split_experts.h"
#include "ticking_forward.h"

namespace moestream::test {
namespace {

auto needs() { return requires_path(fixtures_dir() / kTierFx / "model.safetensors"); }

std::vector<float> resident_reference() {
    auto& m = fixture(kTierFx);
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, *m.experts, *m.backend);
    return run_forward(mdl);
}

// async_ready() as a future (tests only).
std::future<result<dsv41::ready_experts>> ask(device_experts& d, int layer, std::vector<int32_t> ids, int64_t max) {
    auto p = std::make_shared<std::promise<result<dsv41::ready_experts>>>();
    auto f = p->get_future();
    d.async_ready(layer, ids, max, [p](result<dsv41::ready_experts> r) { p->set_value(std::move(r)); });
    return f;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_tier)

// From one VRAM slot over a one-expert host tier to every expert filled on demand, with random
// delays on the host tier's read completions and on the device tier's copy completions: the
// resident bits, nothing blocked, no expert copied twice.
BOOST_AUTO_TEST_CASE(streamed_slots_give_the_resident_bits, *needs()) {
    auto& m = fixture(kTierFx);
    const auto reference = resident_reference();
    const int64_t total = m.files->total_experts();
    struct config {
        int64_t slots;
        double host;
        bool preload;
    };
    for (const config c : {config{1, 1, false}, config{2, 3, false}, config{7, 2, false}, config{total, 3, false},
                           config{total, 3, true}}) {
        auto t = host_tier(*m.files, c.host, random_delay{});
        if (skip_without_io_uring(t)) return;
        cpu_backend be(2);
        device_tier_options o;
        o.inject_copy_delay_us = random_delay{};
        auto d = device_experts::create(be, *m.files, c.slots, c.preload, t->get(), o);
        BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **d, be);
        const auto got = run_forward(mdl);
        BOOST_TEST(same_bits(got, reference), "slots " << c.slots << " host " << c.host);
        const auto k = settled(**d);
        const auto h = (*t)->counters();
        BOOST_TEST_MESSAGE("slots " << c.slots << " host " << c.host << (c.preload ? " preloaded" : "") << ": "
                                    << k.misses << " misses, " << k.hits << " hits, " << k.joined << " joined, "
                                    << k.copies << " copies in " << k.fills << " fills, completion to strand "
                                    << (k.fills ? 1e6 * k.completion_post_seconds / double(k.fills) : 0.0)
                                    << " us a fill; host tier " << h.disk_reads << " reads, " << h.joins << " joins");
        if (!c.preload) check_pipeline_counters(k, h);
        BOOST_TEST(k.blocking_waits == 0u);
        BOOST_TEST(h.blocking_waits == 0u);
        if (c.slots < total) {
            BOOST_TEST((*d)->slot_table(0) == nullptr);
            continue;
        }
        // Every expert in a slot, filled on demand (the rest fetched here, outside a forward)
        // or preloaded, publishes the tables; the next forward routes through them (decode on
        // the backend), to the same bits, and copies nothing.
        for (int L = 0; L < int(m.files->expert_index.size()); ++L) {
            const int n = L < m.hp().n_layers ? m.hp().n_experts : m.hp().dspark_n_experts;
            for (int32_t e = 0; e < n; ++e) {
                auto w = (*d)->get(L, e);
                BOOST_TEST_REQUIRE(w.ok(), (w.ok() ? std::string() : w.message()));
                (*d)->release(L, e);
            }
        }
        BOOST_TEST_REQUIRE((*d)->slot_table(0) != nullptr);
        const auto before = settled(**d);
        BOOST_TEST(same_bits(run_forward(mdl), reference));
        BOOST_TEST((*d)->stats().copies == before.copies);
    }
}

// Two requests for a miss whose read is held back share it: one ask of the host tier, one copy;
// a third while that copy's completion is held back is answered from the slot at once (joined,
// not copied again); a fourth after it completed is a hit.
BOOST_AUTO_TEST_CASE(a_miss_on_its_way_is_joined_never_copied_twice, *needs()) {
    auto& m = fixture(kTierFx);
    const int layer = 0;
    const int32_t expert = 3;
    std::atomic<bool> hold_copy{true};
    auto t = host_tier(*m.files, 2, [](int l, int32_t e) -> uint32_t { return l == layer && e == expert ? 200'000 : 0; });
    if (skip_without_io_uring(t)) return;
    cpu_backend be(1);
    device_tier_options o;
    o.inject_copy_delay_us = [&](int l, int32_t e) -> uint32_t {
        return l == layer && e == expert && hold_copy.exchange(false) ? 300'000 : 0;
    };
    auto d = device_experts::create(be, *m.files, 2, false, t->get(), o);
    BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
    device_experts& dev = **d;
    dev.need(layer, std::vector<int32_t>{expert});
    auto first = ask(dev, layer, {expert}, 2);
    auto second = ask(dev, layer, {expert}, 2);
    BOOST_TEST_REQUIRE((first.wait_for(std::chrono::seconds(20)) == std::future_status::ready));
    BOOST_TEST_REQUIRE((second.wait_for(std::chrono::seconds(20)) == std::future_status::ready));
    auto a = first.get(), b = second.get();
    BOOST_TEST_REQUIRE(a.ok());
    BOOST_TEST_REQUIRE(b.ok());
    BOOST_TEST_REQUIRE(a->size() == 1u);
    BOOST_TEST_REQUIRE(b->size() == 1u);
    BOOST_TEST(a->front().second.gate.data == b->front().second.gate.data);  // the same slot
    // The copy's completion is still held back: the slot answers anyway (the compute stream
    // would wait for the copy's event), and the host tier still holds its source.
    auto third = ask(dev, layer, {expert}, 2);
    BOOST_TEST_REQUIRE((third.wait_for(std::chrono::seconds(20)) == std::future_status::ready));
    auto c = third.get();
    BOOST_TEST_REQUIRE(c.ok());
    BOOST_TEST(c->front().second.gate.data == a->front().second.gate.data);
    auto k = dev.stats();
    BOOST_TEST(k.misses == 1u);
    BOOST_TEST(k.copies == 1u);
    BOOST_TEST(k.joined == 2u);
    BOOST_TEST(k.copies_completed == 0u);  // held back for 300 ms
    for (int i = 0; i < 3; ++i) dev.release(layer, expert);
    k = settled(dev);
    BOOST_TEST(k.copies_completed == 1u);
    auto fourth = ask(dev, layer, {expert}, 2);
    BOOST_TEST_REQUIRE((fourth.wait_for(std::chrono::seconds(20)) == std::future_status::ready));
    BOOST_TEST_REQUIRE(fourth.get().ok());
    dev.release(layer, expert);
    k = dev.stats();
    BOOST_TEST(k.hits == 1u);
    BOOST_TEST(k.copies == 1u);
    BOOST_TEST((*t)->counters().disk_reads == 1u);
}

// A read error fails the forward that needed the expert, naming it; nothing is kept from it, so
// the next forward (the error gone) reads it again and gives the resident bits.
BOOST_AUTO_TEST_CASE(a_read_error_fails_the_forward_and_the_next_one_reads_again, *needs()) {
    auto& m = fixture(kTierFx);
    const auto reference = resident_reference();
    std::atomic<bool> failing{true};
    auto t = host_tier(*m.files, 2, {}, [&](int layer, int32_t) { return failing.load() && layer == 1; });
    if (skip_without_io_uring(t)) return;
    cpu_backend be(1);
    auto d = device_experts::create(be, *m.files, 2, false, t->get());
    BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **d, be);
    auto seq = mdl.new_sequence(128, 16);
    const auto tokens = prompt_ids(kTierFx, 40);
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), tokens, true};
    const auto st = mdl.forward({&item, 1}, logits);
    BOOST_TEST_REQUIRE(!st.ok());
    BOOST_TEST(st.message().find("of layer 1 could not be read") != std::string::npos, st.message());
    failing = false;
    BOOST_TEST(same_bits(run_forward(mdl), reference));
    BOOST_TEST(settled(**d).blocking_waits == 0u);
}

// While the host tier holds a read back, the forward is suspended in the device tier and its
// executor's one thread runs other handlers (a ticker on the same io_context keeps ticking).
BOOST_AUTO_TEST_CASE(the_forward_is_suspended_while_the_device_tier_waits, *needs()) {
    auto& m = fixture(kTierFx);
    const auto tokens = prompt_ids(kTierFx, 40);
    const auto reference = resident_logits(m, tokens);
    const since_start since_start_us;
    std::atomic<int64_t> held_at_us{-1};
    std::atomic<int32_t> held_expert{-1};
    auto t = host_tier(*m.files, 4, [&](int layer, int32_t expert) -> uint32_t {
        if (layer != 0) return 0;
        int32_t none = -1;
        if (!held_expert.compare_exchange_strong(none, expert) && none != expert) return 0;
        int64_t never = -1;
        held_at_us.compare_exchange_strong(never, since_start_us());
        return 300'000;
    });
    if (skip_without_io_uring(t)) return;
    cpu_backend be(1);
    auto d = device_experts::create(be, *m.files, 1, false, t->get());
    BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
    dsv41::model mdl(m.hp(), m.files->weights, nullptr, **d, be);
    auto seq = mdl.new_sequence(128, 16);
    dsv41::forward_item item{seq.get(), tokens, true};
    std::vector<float> logits;
    const auto run = run_forward_ticking(mdl, item, logits, since_start_us);
    const auto& outcome = run.outcome;
    const auto& ticks = run.ticks;
    const int64_t ended_us = run.ended_us;
    BOOST_TEST_REQUIRE(outcome.has_value(), "the forward did not end");
    BOOST_TEST_REQUIRE(outcome->ok(), (outcome->ok() ? std::string() : outcome->message()));
    BOOST_TEST(same_bits(logits, reference));
    const auto k = settled(**d);
    BOOST_TEST(k.blocking_waits == 0u);
    BOOST_TEST(k.wait_seconds >= 0.25, k.wait_seconds);  // it did wait for the held read
    const int64_t held = held_at_us.load();
    BOOST_TEST_REQUIRE(held >= 0);
    const auto during = std::count_if(ticks.begin(), ticks.end(), [&](int64_t at) { return at > held && at < ended_us; });
    BOOST_TEST_MESSAGE(during << " ticks while a read of layer 0 was held back");
    BOOST_TEST(during >= 10);  // 300 ms held, a tick every 5 ms: about 60 when nothing blocks
}

// The start-up tiler's threads each take a run of whole strips: the same bytes as one thread,
// for strip counts that do not divide among the threads, one strip, and threads to spare.
// The draft's stages in device slots of their own (layer_split_experts.h, issue 16): the resident
// bits whether the target's slots hold one expert or all of them; each tier asked only for its own
// layers. Run again, the same requests cost the split tiers no miss (drafting evicted nothing of
// the target's), while one tier of as many slots as the target used, shared with the draft, loses
// target experts to the draft and misses them again.
BOOST_AUTO_TEST_CASE(a_draft_tier_of_its_own_never_evicts_the_target, *needs()) {
    auto& m = fixture(kTierFx);
    const auto reference = resident_reference();
    const int n_layers = int(m.hp().n_layers);
    const int64_t target = int64_t(n_layers) * m.hp().n_experts;
    const int64_t draft = m.files->total_experts() - target;
    BOOST_TEST_REQUIRE(draft > 0);
    uint64_t target_used = 0;  // distinct target experts the forward needs
    for (const int64_t target_slots : {int64_t(1), target}) {
        auto t = host_tier(*m.files, 3, random_delay{});
        if (skip_without_io_uring(t)) return;
        cpu_backend be(2);
        device_tier_options to, dro;
        to.end_layer = n_layers;
        to.inject_copy_delay_us = random_delay{};
        dro.first_layer = n_layers;
        auto td = device_experts::create(be, *m.files, target_slots, false, t->get(), to);
        BOOST_TEST_REQUIRE(td.ok(), (td.ok() ? std::string() : td.message()));
        auto dd = device_experts::create(be, *m.files, draft + 5, false, t->get(), dro);
        BOOST_TEST_REQUIRE(dd.ok(), (dd.ok() ? std::string() : dd.message()));
        BOOST_TEST((*dd)->slots() == draft);  // never more slots than its layers' experts
        layer_split_experts split(**td, **dd, n_layers);
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, split, be);
        BOOST_TEST(same_bits(run_forward(mdl), reference), "target slots " << target_slots);
        const auto t1 = settled(**td), d1 = settled(**dd);
        BOOST_TEST(d1.misses > 0u);
        BOOST_TEST(d1.misses <= uint64_t(draft));
        BOOST_TEST(t1.blocking_waits == 0u);
        BOOST_TEST(d1.blocking_waits == 0u);
        if (target_slots < target) continue;
        target_used = t1.misses;  // every slot free: each needed expert missed once
        BOOST_TEST(same_bits(run_forward(mdl), reference));
        BOOST_TEST(settled(**td).misses == t1.misses);
        BOOST_TEST(settled(**dd).misses == d1.misses);
        BOOST_TEST(((*td)->slot_table(0) != nullptr) == (t1.misses == uint64_t(target)));
    }
    // The contrast: one tier over every layer with the target's working set of slots.
    auto t = host_tier(*m.files, 3);
    if (skip_without_io_uring(t)) return;
    cpu_backend be(2);
    auto shared = device_experts::create(be, *m.files, int64_t(target_used), false, t->get());
    BOOST_TEST_REQUIRE(shared.ok(), (shared.ok() ? std::string() : shared.message()));
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **shared, be);
    BOOST_TEST(same_bits(run_forward(mdl), reference));
    const uint64_t first = settled(**shared).misses;
    BOOST_TEST(same_bits(run_forward(mdl), reference));
    BOOST_TEST(settled(**shared).misses > first, "the draft evicted no target expert from shared slots");
}

BOOST_AUTO_TEST_CASE(dense_q8_0_tiles_on_threads_as_on_one) {
    std::mt19937 rng(5);
    for (int64_t strips : {1, 13, 200, 1000}) {
        const int64_t rows = strips * q8_0_tiles::kStripRows, cols = 2304;
        std::vector<uint8_t> src(size_t(rows * (cols / 32) * q8_0_tiles::kBlockBytes));
        for (auto& b : src) b = uint8_t(rng());
        std::vector<uint8_t> want(src.size()), got(src.size());
        q8_0_tiles::tile_matrix(src.data(), want.data(), rows, cols);
        for (int threads : {1, 3, 8, 64}) {
            std::fill(got.begin(), got.end(), uint8_t(0xEE));
            tile_q8_0_on_threads(src.data(), got.data(), rows, cols, threads);
            BOOST_TEST((got == want), strips << " strips on " << threads << " threads");
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
