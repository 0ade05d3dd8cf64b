// Experts through the tiers (device <- host <- io_uring disk reads) give exactly the bits of the
// resident model, whatever the budgets, queue depth, chunk size or thread count.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <atomic>
#include <cstdio>

#include "../common/test_support.h"
#include "device_tier_support.h"
#include "fixture_model.h"
#include "ticking_forward.h"

#include "scheduler/engram_stream.h"
#include "scheduler/tiered_experts.h"
#include "spec/dspark_drafter.h"

namespace moestream::test {
namespace {

const char* kFx = "dsv41-tiny-bf16";

std::vector<int32_t> prompt40() { return prompt_ids(kFx, 40); }

// Prefill of 40 tokens, 4 decode steps and one DSpark draft, every logit concatenated.
std::vector<float> run(fixture_model& m, dsv41::expert_source& experts, backend& be,
                       dsv41::engram_source* engram = nullptr, int lookahead_layers = 1) {
    dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, experts, be);
    dsv41::model_options o;
    o.engram = engram;
    o.lookahead = true;  // look-ahead reads change I/O, never bits
    o.lookahead_layers = lookahead_layers;
    mdl.set_options(o);
    auto seq = mdl.new_sequence(128, 16);
    const auto tokens = prompt40();
    std::vector<float> all, part;
    dsv41::forward_item item{seq.get(), tokens, true};
    BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, all).ok());
    for (int32_t t : {5, 77, 300, 12}) {
        dsv41::forward_item step{seq.get(), {&t, 1}, true};
        BOOST_TEST_REQUIRE(mdl.forward({&step, 1}, part).ok());
        all.insert(all.end(), part.begin(), part.end());
    }
    dsv41::draft_output d;
    BOOST_TEST_REQUIRE(mdl.draft(*seq, 9, d).ok());
    all.insert(all.end(), d.logits.begin(), d.logits.end());
    return all;
}

tier_options budgets(uint64_t device, uint64_t host, std::string policy = "lru");

result<std::unique_ptr<tiered_experts>> tiers(fixture_model& m, double device_experts, double host_experts,
                                              uint32_t depth, uint64_t chunk, bool remap_sync = false,
                                              std::function<uint32_t(int, int32_t)> delay_us = {},
                                              std::string policy = "lru") {
    // Slot sizes in bytes, from a probe.
    auto probe = tiered_experts::create(*m.files, budgets(1 << 26, 1 << 26));
    if (!probe) return probe.err();
    const uint64_t dev_slot = (*probe)->device_slot_bytes();
    const uint64_t host_slot = (*probe)->host_slot_bytes();
    tier_options o;
    o.device_bytes = uint64_t(device_experts * double(dev_slot));
    o.host_bytes = uint64_t(host_experts * double(host_slot));
    o.io.depth = depth;
    o.io.chunk_bytes = chunk;
    o.remap_sync = remap_sync;
    o.inject_delay_us = std::move(delay_us);
    o.policy = std::move(policy);
    o.head_start_forwards = 2;  // the fixture's forwards are short: a head start they feel
    return tiered_experts::create(*m.files, o);
}

auto needs() { return requires_path(fixtures_dir() / kFx / "model.safetensors"); }

tier_options budgets(uint64_t device, uint64_t host, std::string policy) {
    tier_options o;
    o.device_bytes = device;
    o.host_bytes = host;
    o.policy = std::move(policy);
    return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(streaming)

BOOST_AUTO_TEST_CASE(tiny_budgets_give_the_resident_bits, *needs()) {
    auto& m = fixture(kFx);
    const auto reference = run(m, *m.experts, *m.backend);
    struct config {
        double device, host;
        uint32_t depth;
        uint64_t chunk;
        int threads;
        bool remap = false;
        int lookahead_layers = 1;  // d: L+1 .. L+d predicted (6: past the tiny model's last layer)
        const char* policy = "lru";
    };
    // From "one expert in each tier" (every expert read again and again) to everything fits.
    for (const config c : {config{1, 1, 1, 4096, 1}, config{2, 3, 2, 4096, 2}, config{6, 2, 64, 8192, 3},
                           config{0, 7, 4, 4096, 2}, config{0, 1, 8, 1 << 20, 1}, config{64, 8, 16, 1 << 20, 2},
                           config{2000, 2000, 64, 1 << 20, 2}, config{3, 4, 64, 1 << 20, 2, true},
                           config{0, 6, 64, 1 << 20, 1, true}, config{1, 1, 1, 4096, 1, false, 2},
                           config{2, 3, 2, 4096, 2, false, 2}, config{0, 7, 4, 4096, 2, false, 2},
                           config{64, 8, 16, 1 << 20, 2, false, 2}, config{2, 3, 2, 4096, 2, false, 3},
                           config{0, 7, 4, 4096, 2, false, 3}, config{1, 1, 1, 4096, 1, false, 6},
                           config{2, 3, 2, 4096, 2, false, 4}, config{0, 7, 4, 4096, 2, false, 6},
                           config{1, 1, 1, 4096, 1, false, 1, "layered"}, config{2, 3, 2, 4096, 2, false, 2, "layered"},
                           config{0, 7, 4, 4096, 2, false, 4, "layered"}, config{0, 40, 8, 1 << 20, 2, false, 2, "layered"},
                           config{0, 6, 64, 1 << 20, 1, true, 1, "layered"}}) {
        auto t = tiers(m, c.device, c.host, c.depth, c.chunk, c.remap, {}, c.policy);
        if (skip_without_io_uring(t)) return;
        cpu_backend be(c.threads);
        const auto got = run(m, **t, be, nullptr, c.lookahead_layers);
        const auto k = (*t)->counters();
        const auto io = (*t)->io_stats();
        BOOST_TEST_MESSAGE("device " << (*t)->device_slots() << " host " << (*t)->host_slots() << " depth " << c.depth
                                     << " chunk " << c.chunk << ": demands " << k.demands << ", device hits "
                                     << k.device_hits << ", host hits " << k.host_hits << ", joins " << k.joins
                                     << ", disk reads " << k.disk_reads << " (" << k.disk_bytes << " B), look-ahead " << k.hint_reads << "/"
                                     << k.hint_used << ", max in flight "
                                     << io.max_in_flight << ", mean completion post "
                                     << (k.completions_posted ? 1e6 * k.completion_post_seconds / double(k.completions_posted) : 0.0)
                                     << " us" << (c.remap ? " (remap-sync)" : "") << ", look-ahead layers "
                                     << c.lookahead_layers << ", policy " << c.policy);
        BOOST_TEST(same_bits(got, reference), "device " << c.device << " host " << c.host << " depth " << c.depth
                                                         << " look-ahead layers " << c.lookahead_layers
                                                         << " policy " << c.policy);
        BOOST_TEST(k.read_errors == 0u);
        BOOST_TEST(io.max_in_flight <= c.depth);
        BOOST_TEST(k.device_hits + k.host_hits + k.disk_reads >= k.demands - k.joins);
        // A needed expert is never evicted before its use; the only extra reads are wasted predictions.
        BOOST_TEST(k.disk_reads <= k.demands + (k.hint_reads - k.hint_used));
    }
}

// With room for every expert, a second pass over the same prompt reads nothing it demands from
// disk, and no expert is ever read twice. (Its only reads are predictions of experts the first
// pass never needed, left unread there while nearer reads had the disk.)
BOOST_AUTO_TEST_CASE(warm_tiers_read_nothing_again, *needs()) {
    auto& m = fixture(kFx);
    auto t = tiers(m, 0, 5000, 64, 1 << 20);
    if (!t) {
        BOOST_TEST_MESSAGE("skipped: " << t.message());
        return;
    }
    run(m, **t, *m.backend);
    const auto first = (*t)->counters();
    run(m, **t, *m.backend);
    const auto second = (*t)->counters();
    BOOST_TEST(first.disk_reads > 0u);
    BOOST_TEST(second.disk_reads - first.disk_reads == second.hint_reads - first.hint_reads);
    BOOST_TEST(second.hint_used == first.hint_used);
    // Distinct experts touched <= 10 layers * 64 + 3 stages * 16.
    BOOST_TEST(second.disk_reads <= uint64_t(10 * 64 + 3 * 16));
}

// Engram rows read ahead through io_uring (or, past the arena, on demand) give the same bits.
// The last layers' look-ahead predicts the next forward's first layers: such a prediction stands
// while the rest of this forward's layers are demanded (it is ahead, not behind) and counts as
// used when the next forward demands it.
BOOST_AUTO_TEST_CASE(predictions_past_the_last_layer_stand_until_the_next_forward, *needs()) {
    auto& m = fixture(kFx);
    auto t = tiers(m, 0, 5000, 64, 1 << 20);
    if (skip_without_io_uring(t)) return;
    tiered_experts& tier = **t;
    const int n = int(m.hp().n_layers);
    const auto demand = [&](int layer, int32_t expert) {
        const int32_t ids[] = {expert};
        tier.need(layer, ids);
        auto got = tier.acquire_ready(layer, ids, 1);
        BOOST_TEST_REQUIRE(got.ok(), (got.ok() ? std::string() : got.message()));
        BOOST_TEST_REQUIRE(got->size() == 1u);
        tier.release(layer, expert);
    };
    demand(n - 2, 1);
    const int32_t predicted[] = {5};
    tier.hint(0, predicted);  // as the look-ahead of layer n-2 with two layers' reach sends it
    BOOST_TEST(tier.counters().hint_reads == 1u);
    demand(n - 1, 2);
    demand(0, 5);
    const auto k = tier.counters();
    BOOST_TEST(k.hint_reads == 1u);
    BOOST_TEST(k.hint_used == 1u, "the next forward's prediction was dropped as stale");
    BOOST_TEST(k.disk_reads == 3u);  // 1, 5 (predicted), 2: nothing read twice
}

// Nothing predicts the first layer (its router is the forward's first), so its experts stay in
// the host tier once read, in at most an eighth of it: a second pass over the same tokens finds
// every first-layer expert it needs there, where LRU alone had lost some of them.
BOOST_AUTO_TEST_CASE(the_first_layer_stays_in_the_host_tier, *needs()) {
    auto& m = fixture(kFx);
    const auto reference = run(m, *m.experts, *m.backend);
    auto probe = tiered_experts::create(*m.files, budgets(1 << 26, 1 << 26));
    if (skip_without_io_uring(probe)) return;
    uint64_t second_pass_reads[2] = {};
    for (const bool keep : {true, false}) {
        tier_options o;
        o.host_bytes = 8 * uint64_t(m.hp().n_experts) * (*probe)->host_slot_bytes();
        o.keep_first_layer = keep;
        auto t = tiered_experts::create(*m.files, o);
        BOOST_TEST_REQUIRE(t.ok(), (t.ok() ? std::string() : t.message()));
        const auto first_layer = [&] {
            std::vector<spec::layer_tally> tallies(size_t(m.hp().n_layers));
            BOOST_TEST_REQUIRE((*t)->layer_tallies(tallies));
            return tallies[0];
        };
        BOOST_TEST(same_bits(run(m, **t, *m.backend), reference));
        const auto after_first = first_layer();
        BOOST_TEST(same_bits(run(m, **t, *m.backend), reference));
        const auto after_second = first_layer();
        second_pass_reads[keep ? 0 : 1] =
            (after_second.missing - after_first.missing) + (after_second.in_flight - after_first.in_flight);
        BOOST_TEST_MESSAGE("keep " << keep << ": the second pass read " << second_pass_reads[keep ? 0 : 1]
                                   << " first-layer experts, " << (*t)->host_slots() << " host slots");
    }
    BOOST_TEST(second_pass_reads[0] == 0u);
    BOOST_TEST(second_pass_reads[1] > 0u, "LRU kept every first-layer expert: the case shows nothing");
}

BOOST_AUTO_TEST_CASE(engram_rows_read_ahead_give_the_same_bits, *needs()) {
    auto& m = fixture(kFx);
    const auto reference = run(m, *m.experts, *m.backend);
    for (uint32_t slots : {4096u, 16u}) {
        engram_stream_options o;
        o.slots = slots;
        o.resident_max_bytes = 0;  // streamed
        auto es = engram_stream::create(*m.files, o);
        if (!es) {
            BOOST_TEST_MESSAGE("skipped: " << es.message());
            return;
        }
        const auto got = run(m, *m.experts, *m.backend, es->get());
        const auto c = (*es)->counters();
        BOOST_TEST_MESSAGE("engram arena " << slots << " rows: " << c.rows_requested << " looked up, " << c.rows_read
                                           << " read, " << c.overflow << " after the forward reached them, "
                                           << c.refills << " refills, " << c.disk_reads << " disk reads, " << c.waits
                                           << " waited");
        BOOST_TEST(same_bits(got, reference), "arena " << slots);
        BOOST_TEST(c.rows_read > 0u);
        BOOST_TEST((slots == 16u) == (c.overflow > 0u));
        // Past the arena the rows come in windows of `slots`, not one read per row.
        BOOST_TEST((slots == 16u) == (c.refills > 0u));
        BOOST_TEST(c.refills <= c.rows_requested / slots + 4, c.refills << " refills");
        // Coalesced: never more than two reads a row read, fewer where rows share pages.
        BOOST_TEST(c.disk_reads > 0u);
        BOOST_TEST(c.disk_reads < 2 * c.rows_read, c.disk_reads << " reads for " << c.rows_read << " rows");
    }
}

// The forward awaits its engram rows as it awaits experts: while one read of the rows is held
// back, the executor goes on with other work (no thread waits for the row), and the bits are the
// resident ones, with the rows in one window and in windows of 16 rows (refills).
BOOST_AUTO_TEST_CASE(the_forward_awaits_engram_rows_without_blocking, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt40();
    const auto reference = resident_logits(m, tokens);
    const since_start since_start_us;
    for (uint32_t slots : {4096u, 16u}) {
        std::atomic<bool> armed{false};
        std::atomic<int64_t> held_at_us{-1};
        engram_stream_options o;
        o.slots = slots;
        o.resident_max_bytes = 0;  // streamed
        o.inject_delay_us = [&]() -> uint32_t {
            int64_t never = -1;
            if (!armed || !held_at_us.compare_exchange_strong(never, since_start_us())) return 0;
            return 300'000;  // the first completion once the forward runs
        };
        auto es = engram_stream::create(*m.files, o);
        if (!es) {
            BOOST_TEST_MESSAGE("skipped: " << es.message());
            return;
        }
        cpu_backend be(1);
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, *m.experts, be);
        dsv41::model_options mo;
        mo.engram = es->get();
        mdl.set_options(mo);
        auto seq = mdl.new_sequence(128, 16);
        dsv41::forward_item item{seq.get(), tokens, true};
        std::vector<float> logits;
        armed = true;
        const auto run = run_forward_ticking(mdl, item, logits, since_start_us);
        BOOST_TEST_REQUIRE(run.outcome.has_value(), "the forward did not end");
        BOOST_TEST_REQUIRE(run.outcome->ok(), (run.outcome->ok() ? std::string() : run.outcome->message()));
        BOOST_TEST(same_bits(logits, reference), "arena " << slots);
        const auto c = (*es)->counters();
        const int64_t held = held_at_us.load();
        BOOST_TEST_REQUIRE(held >= 0, "no engram row was read");
        const auto during =
            std::count_if(run.ticks.begin(), run.ticks.end(), [&](int64_t at) { return at > held && at < run.ended_us; });
        BOOST_TEST_MESSAGE("arena " << slots << ": " << during << " ticks while an engram read was held ("
                                    << run.ticks.size() << " in all), " << c.waits << " rows waited for, "
                                    << c.wait_seconds << " s, " << c.refills << " refills");
        BOOST_TEST(c.waits >= 1u);
        BOOST_TEST(c.wait_seconds >= 0.2, c.wait_seconds);  // the forward did wait for the held read
        BOOST_TEST(during >= 10);  // 300 ms held, a tick every 5 ms: about 60 when nothing blocks
    }
}

// Tables within the resident budget are read whole at start-up: the same bits, no row read after.
BOOST_AUTO_TEST_CASE(engram_tables_in_ram_give_the_same_bits, *needs()) {
    auto& m = fixture(kFx);
    const auto reference = run(m, *m.experts, *m.backend);
    auto es = engram_stream::create(*m.files, {});
    if (!es) BOOST_FAIL("engram_stream::create: " << es.message());
    const auto loaded = (*es)->counters();
    BOOST_TEST(loaded.resident_bytes > 0u);
    BOOST_TEST(same_bits(run(m, *m.experts, *m.backend, es->get()), reference));
    const auto c = (*es)->counters();
    BOOST_TEST(c.rows_requested > 0u);
    BOOST_TEST(c.disk_reads == loaded.disk_reads);  // nothing read once the tables are in
    BOOST_TEST(c.rows_read == 0u);
}

// A failed expert read fails the forward that needs it with an error naming the expert, leaves
// the sequence as it was and caches nothing: the same forward then succeeds with the same bits.
BOOST_AUTO_TEST_CASE(failed_expert_read_fails_cleanly, *needs()) {
    auto& m = fixture(kFx);
    auto o = budgets(0, 1 << 24);
    bool fail = true;
    o.inject_read_error = [&](int layer, int32_t) { return fail && layer == 5; };
    auto t = tiered_experts::create(*m.files, o);
    if (!t) {
        BOOST_TEST_MESSAGE("skipped: " << t.message());
        return;
    }
    dsv41::model mdl(m.hp(), m.files->weights, nullptr, **t, *m.backend);
    auto seq = m.sequence();
    const auto tokens = prompt40();
    std::vector<float> logits, reference;
    dsv41::forward_item item{seq.get(), tokens, true};
    auto st = mdl.forward({&item, 1}, logits);
    BOOST_TEST_REQUIRE(!st.ok());
    BOOST_TEST(st.message().find("of layer 5 could not be read: injected read error") != std::string::npos, st.message());
    BOOST_TEST(seq->size() == 0);
    BOOST_TEST((*t)->counters().read_errors > 0u);
    fail = false;
    st = mdl.forward({&item, 1}, logits);
    if (!st.ok()) BOOST_FAIL("retry after the failure: " << st.message());
    auto ref_seq = m.sequence();
    dsv41::forward_item ref_item{ref_seq.get(), tokens, true};
    BOOST_TEST_REQUIRE(m.model->forward({&ref_item, 1}, reference).ok());
    BOOST_TEST(same_bits(logits, reference));
}

// A model file replaced on disk while in use is detected.
BOOST_AUTO_TEST_CASE(model_file_changed_on_disk_is_detected, *needs()) {
    auto& m = fixture(kFx);
    const auto dir = scratch_dir("changed-model");
    const auto copy = dir / "t.gguf";
    std::filesystem::copy_file(m.files->stamps.front().path, copy);
    auto files = load_model(copy.string(), "");
    BOOST_TEST_REQUIRE(files.ok());
    BOOST_TEST((*files)->verify_unchanged().ok());
    std::filesystem::last_write_time(copy, std::filesystem::last_write_time(copy) + std::chrono::seconds(5));
    const auto st = (*files)->verify_unchanged();
    BOOST_TEST_REQUIRE(!st.ok());
    BOOST_TEST(st.message().find("changed on disk since it was loaded") != std::string::npos, st.message());
}

// A budget above the whole model (an "auto" host tier on a big machine) gives one slot per
// expert, no more.
BOOST_AUTO_TEST_CASE(budgets_above_the_model_are_clamped, *needs()) {
    auto& m = fixture(kFx);
    auto t = tiered_experts::create(*m.files, budgets(uint64_t(1) << 40, uint64_t(1) << 40));
    BOOST_TEST_REQUIRE(t.ok(), (t.ok() ? "" : t.message()));
    uint64_t experts = uint64_t(m.hp().n_layers) * uint64_t(m.hp().n_experts);
    if (m.files->draft_file) experts += uint64_t(m.hp().n_mtp) * uint64_t(m.hp().dspark_n_experts);
    BOOST_TEST((*t)->host_slots() == experts);
    BOOST_TEST((*t)->device_slots() == experts);
}

BOOST_AUTO_TEST_CASE(budgets_too_small_are_named, *needs()) {
    auto& m = fixture(kFx);
    auto t = tiered_experts::create(*m.files, budgets(0, 100));
    BOOST_TEST_REQUIRE(!t.ok());
    BOOST_TEST(t.message().find("--host-cache is too small") != std::string::npos);
    auto d = tiered_experts::create(*m.files, budgets(100, 1 << 24));
    BOOST_TEST_REQUIRE(!d.ok());
    BOOST_TEST(d.message().find("--device-cache is too small") != std::string::npos);
    auto p = tiered_experts::create(*m.files, budgets(0, 1 << 24, "fifo"));
    BOOST_TEST(!p.ok());
}

// Every expert in slots of the compute backend (the CPU's memory here): decode and small batches
// route on the backend through the slot table (order_picks, moe_gate_up, moe_down), without
// reading the picks or getting an expert, and give the host-scheduled path's bits, with and
// without the reference's activation round trips; a prefill's rows still go through get().
BOOST_AUTO_TEST_CASE(slot_table_routing_gives_the_host_scheduled_bits, *needs()) {
    auto& m = fixture(kFx);
    auto slots = device_experts::create(*m.backend, *m.files, m.files->total_experts(), true);
    BOOST_TEST_REQUIRE(slots.ok(), (slots.ok() ? std::string() : slots.message()));
    auto& table_source = **slots;
    BOOST_TEST_REQUIRE(table_source.slot_table(0) != nullptr);
    BOOST_TEST(m.experts->slot_table(0) == nullptr);  // the mapping: host-scheduled
    for (bool act_quant : {false, true}) {
        std::vector<float> got[2];
        for (int via_slots = 0; via_slots < 2; ++via_slots) {
            dsv41::expert_source& src = via_slots ? static_cast<dsv41::expert_source&>(table_source) : *m.experts;
            dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, src, *m.backend);
            dsv41::model_options o;
            o.act_quant = act_quant;
            mdl.set_options(o);
            auto a = mdl.new_sequence(128, 16), b = mdl.new_sequence(128, 16);
            const auto tokens = prompt40();
            std::vector<float>& all = got[via_slots];
            std::vector<float> part;
            dsv41::forward_item items[2] = {{a.get(), tokens, true}, {b.get(), {tokens.data(), 20}, true}};
            BOOST_TEST_REQUIRE(mdl.forward(items, all).ok());
            const uint64_t gets = table_source.stats().hits;
            for (int32_t t : {5, 77, 300, 12}) {
                dsv41::forward_item one{a.get(), {&t, 1}, true};  // one row
                BOOST_TEST_REQUIRE(mdl.forward({&one, 1}, part).ok());
                all.insert(all.end(), part.begin(), part.end());
                const int32_t u = t + 1;
                dsv41::forward_item two[2] = {{a.get(), {&u, 1}, true}, {b.get(), {&t, 1}, true}};  // two rows
                BOOST_TEST_REQUIRE(mdl.forward(two, part).ok());
                all.insert(all.end(), part.begin(), part.end());
            }
            if (via_slots) BOOST_TEST(table_source.stats().hits == gets);  // no expert was got in decode
            dsv41::draft_output d;
            BOOST_TEST_REQUIRE(mdl.draft(*a, 9, d).ok());
            all.insert(all.end(), d.logits.begin(), d.logits.end());
        }
        BOOST_TEST(same_bits(got[0], got[1]), "act_quant " << act_quant);
    }
}

// Stress: 8 sequences of different lengths, prefilled together and decoded together, through
// one-slot tiers whose read and copy completions are held back by random delays: the resident
// model's bits, every forward ends, and no deadlock (a forward that does not end in time fails
// the run). No thread blocks for an expert: the forward is suspended instead (issue 15).
BOOST_AUTO_TEST_CASE(eight_sequences_through_one_slot_tiers_with_random_delays, *needs()) {
    auto& m = fixture(kFx);
    const auto prompt = prompt40();
    const auto run8 = [&](dsv41::expert_source& src, backend& be) {
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, src, be);
        std::vector<std::unique_ptr<dsv41::sequence_state>> seqs;
        std::vector<dsv41::forward_item> items;
        for (int i = 0; i < 8; ++i) {
            seqs.push_back(mdl.new_sequence(128, 16));
            items.push_back({seqs.back().get(), {prompt.data() + i, size_t(3 + 4 * i)}, true});
        }
        std::vector<float> all, part;
        BOOST_TEST_REQUIRE(mdl.forward(items, all).ok());
        for (int32_t t : {5, 77, 300}) {
            std::vector<int32_t> next(8);
            for (int i = 0; i < 8; ++i) {
                next[size_t(i)] = t + i;
                items[size_t(i)] = {seqs[size_t(i)].get(), {&next[size_t(i)], 1}, true};
            }
            BOOST_TEST_REQUIRE(mdl.forward(items, part).ok());
            all.insert(all.end(), part.begin(), part.end());
        }
        dsv41::draft_output d;
        BOOST_TEST_REQUIRE(mdl.draft(*seqs[3], 9, d).ok());
        all.insert(all.end(), d.logits.begin(), d.logits.end());
        return all;
    };
    const auto reference = run8(*m.experts, *m.backend);
    // A hash of a completion counter: any thread may ask, every answer differs.
    std::atomic<uint64_t> calls{0};
    const auto delay = [&calls](int layer, int32_t expert) -> uint32_t {
        uint64_t x = calls.fetch_add(1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(layer) << 32 | uint32_t(expert));
        x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
        return uint32_t((x >> 33) % 400);  // 0..399 us
    };
    for (const auto& [dev, host] : {std::pair<double, double>{1, 1}, {0, 1}, {2, 3}}) {
        auto t = tiers(m, dev, host, 2, 4096, false, delay);
        if (skip_without_io_uring(t)) return;
        cpu_backend be(3);
        auto done = std::async(std::launch::async, [&] { return run8(**t, be); });
        if (done.wait_for(std::chrono::minutes(10)) != std::future_status::ready) {
            std::fprintf(stderr, "streaming stress: a forward did not end in 10 minutes (deadlock?)\n");
            std::abort();
        }
        const auto got = done.get();
        const auto k = (*t)->counters();
        BOOST_TEST_MESSAGE("stress device " << dev << " host " << host << ": demands " << k.demands << ", disk reads "
                                            << k.disk_reads << ", joins " << k.joins << ", blocking waits "
                                            << k.blocking_waits << ", delays " << calls.load()
                                            << ", mean completion post " << (k.completions_posted ? 1e6 * k.completion_post_seconds / double(k.completions_posted) : 0.0) << " us");
        BOOST_TEST(same_bits(got, reference), "device " << dev << " host " << host);
        BOOST_TEST(k.read_errors == 0u);
        // The forward awaits its experts as a coroutine: no thread ever blocked for one.
        BOOST_TEST(k.blocking_waits == 0u);
    }
}

// While a read is held back, the forward is suspended and its executor's one thread runs other
// handlers: the forward awaits its experts, it does not occupy the thread (issue 15). A ticker
// on the same single-threaded io_context must tick while a read of layer 0 is held for 300 ms,
// before the forward ends; the bits are the resident model's and nothing blocked.
BOOST_AUTO_TEST_CASE(the_executor_runs_other_work_while_a_read_is_held_back, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt40();
    const auto reference = resident_logits(m, tokens);
    std::atomic<int64_t> held_at_us{-1};  // when the held read came back (clock since start)
    std::atomic<int32_t> held_expert{-1};  // the first expert of layer 0 whose read completed
    const since_start since_start_us;
    for (const double device : {0.0, 2.0}) {
        held_at_us = -1;
        held_expert = -1;
        auto t = tiers(m, device, 4, 4, 1 << 20, false, [&](int layer, int32_t expert) -> uint32_t {
            if (layer != 0) return 0;
            int32_t none = -1;
            if (!held_expert.compare_exchange_strong(none, expert) && none != expert) return 0;
            int64_t never = -1;
            held_at_us.compare_exchange_strong(never, since_start_us());
            return 300'000;  // each of its parts' completions (and its promotion's)
        });
        if (skip_without_io_uring(t)) return;
        cpu_backend be(1);
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, **t, be);
        auto seq = mdl.new_sequence(128, 16);
        dsv41::forward_item item{seq.get(), tokens, true};
        std::vector<float> logits;
        // Ticks on the same thread, every 5 ms, until the forward ends.
        const auto run = run_forward_ticking(mdl, item, logits, since_start_us);
        const auto& outcome = run.outcome;
        const auto& ticks = run.ticks;
        const int64_t ended_us = run.ended_us;
        BOOST_TEST_REQUIRE(outcome.has_value(), "the forward did not end");
        BOOST_TEST_REQUIRE(outcome->ok(), (outcome->ok() ? std::string() : outcome->message()));
        BOOST_TEST(same_bits(logits, reference), "device " << device);
        const auto k = (*t)->counters();
        BOOST_TEST(k.blocking_waits == 0u);
        BOOST_TEST(k.wait_seconds >= 0.25, k.wait_seconds);  // it did wait for the held reads
        const int64_t held = held_at_us.load();
        BOOST_TEST_REQUIRE(held >= 0);
        const auto during = std::count_if(ticks.begin(), ticks.end(), [&](int64_t at) { return at > held && at < ended_us; });
        BOOST_TEST_MESSAGE("device " << device << ": " << during << " ticks while a read of layer 0 was held ("
                                     << ticks.size() << " in all), waited " << k.wait_seconds << " s");
        BOOST_TEST(during >= 10);  // 300 ms held, a tick every 5 ms: about 60 when nothing blocks
    }
}

// The DSpark head as the engine drafts (dspark_drafter::propose_async on the compute executor):
// while the reads of one of its experts are held back, the executor goes on with other work (no
// thread waits for the draft's experts), and the drafts are those of the head with every expert
// resident, with the draft's own slots and with the draft sharing the target's tiers.
BOOST_AUTO_TEST_CASE(the_draft_head_awaits_its_experts_without_blocking, *needs()) {
    auto& m = fixture(kFx);
    const auto tokens = prompt40();
    const int n_layers = m.hp().n_layers;
    std::vector<int32_t> context(tokens.begin(), tokens.end());
    context.push_back(9);  // the token the next forward feeds
    const int k = m.hp().dspark_block_size;
    std::vector<int32_t> reference;
    {
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, *m.experts, *m.backend);
        auto seq = mdl.new_sequence(128, 16);
        dsv41::forward_item item{seq.get(), tokens, false};
        std::vector<float> logits;
        BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, logits).ok());
        spec::dspark_drafter d(mdl, *seq);
        reference = d.propose(context, k);
        BOOST_TEST_REQUIRE(d.failures() == 0);
        BOOST_TEST_REQUIRE(int(reference.size()) == k);
    }
    const since_start since_start_us;
    for (const bool own_slots : {true, false}) {
        std::atomic<bool> holding{false};
        std::atomic<int64_t> held_at_us{-1};
        std::atomic<int32_t> held_expert{-1};  // the first draft-stage expert whose read completes
        auto probe = tiered_experts::create(*m.files, budgets(1 << 26, 1 << 26));
        BOOST_TEST_REQUIRE(probe.ok());
        tier_options o = budgets(0, 3 * (*probe)->host_slot_bytes());
        o.io.depth = 8;
        o.io.chunk_bytes = 1 << 20;
        if (!own_slots) o.draft_bytes = 0;
        o.inject_delay_us = [&](int layer, int32_t expert) -> uint32_t {
            if (!holding || layer < n_layers) return 0;
            int32_t none = -1;
            if (!held_expert.compare_exchange_strong(none, expert) && none != expert) return 0;
            int64_t never = -1;
            held_at_us.compare_exchange_strong(never, since_start_us());
            return 300'000;
        };
        auto t = tiered_experts::create(*m.files, o);
        if (skip_without_io_uring(t)) return;
        cpu_backend be(1);
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **t, be);
        auto seq = mdl.new_sequence(128, 16);
        dsv41::forward_item item{seq.get(), tokens, false};
        std::vector<float> logits;
        BOOST_TEST_REQUIRE(mdl.forward({&item, 1}, logits).ok());
        (*t)->forget_resident();  // the draft's experts come from disk, one of them held back
        holding = true;
        spec::dspark_drafter d(mdl, *seq);
        std::vector<int32_t> drafts;
        const auto run = run_ticking(
            [&](coro::executor& ex) -> coro::task<status> {
                drafts = co_await d.propose_async(context, k, ex);
                co_return status{};
            },
            since_start_us);
        BOOST_TEST_REQUIRE(run.outcome.has_value(), "the draft did not end");
        BOOST_TEST(d.failures() == 0, d.error());
        BOOST_TEST(drafts == reference, "own draft slots " << own_slots);
        const auto c = (*t)->counters();
        BOOST_TEST(c.blocking_waits == 0u);
        const int64_t held = held_at_us.load();
        BOOST_TEST_REQUIRE(held >= 0, "no draft expert was read");
        const auto during =
            std::count_if(run.ticks.begin(), run.ticks.end(), [&](int64_t at) { return at > held && at < run.ended_us; });
        BOOST_TEST_MESSAGE("own draft slots " << own_slots << ": " << during << " ticks while a draft expert's read was held ("
                                              << run.ticks.size() << " in all), waited " << c.wait_seconds << " s");
        BOOST_TEST(during >= 10);  // 300 ms held, a tick every 5 ms: about 60 when nothing blocks
    }
}

// Backend expert slots filled from a host tier (the CUDA path with streaming: io_uring reads,
// nothing through the mapping) give the resident bits, from one slot over a one-expert host tier
// to every expert preloaded through it; misses are announced to the tier, which reads them.
BOOST_AUTO_TEST_CASE(backend_slots_filled_from_the_host_tier, *needs()) {
    auto& m = fixture(kFx);
    const auto reference = run(m, *m.experts, *m.backend);
    const int64_t total = m.files->total_experts();
    for (const auto& [slots, host] : {std::pair<int64_t, double>{1, 1}, {7, 2}, {total, 3}}) {
        auto t = tiers(m, 0, host, 4, 1 << 20);
        if (skip_without_io_uring(t)) return;
        cpu_backend be(2);
        auto d = device_experts::create(be, *m.files, slots, slots == total, t->get());
        BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
        const auto got = run(m, **d, be);
        const auto k = (*t)->counters();
        BOOST_TEST_MESSAGE("slots " << slots << " host " << host << ": uploads " << (*d)->stats().misses
                                    << ", tier demands " << k.demands << ", disk reads " << k.disk_reads);
        BOOST_TEST(same_bits(got, reference), "slots " << slots);
        BOOST_TEST(k.disk_reads > 0u);
        BOOST_TEST(k.read_errors == 0u);
        // Nothing is read but what a slot lacked (and wasted predictions).
        BOOST_TEST(k.disk_reads <= (*d)->stats().misses + uint64_t(slots == total ? total : 0) +
                                       (k.hint_reads - k.hint_used));
        BOOST_TEST(((*d)->slot_table(0) != nullptr) == (slots == total));
    }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
