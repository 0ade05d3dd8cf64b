// Shared by the device tier's suites (the CPU's tests/exact/device_tier_test.cpp and the GPU's
// tests/cuda/device_tier_test.cpp): a host tier over a fixture's files, the device tier over it,
// held-back completions, and the forward the streaming tests compare (a prefill, decode steps
// and a DSpark draft, every logit concatenated).
#pragma once

#include <boost/test/unit_test.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "fixture_model.h"
#include "scheduler/device_experts.h"
#include "scheduler/tiered_experts.h"

namespace moestream::test {

inline const char* kTierFx = "dsv41-tiny-bf16";

// A host tier only (no device tier of its own: device_experts is the device tier) with room
// for `host_experts` experts; its strand on `executor` (empty: a thread of its own).
inline result<std::unique_ptr<tiered_experts>> host_tier(const loaded_model& files, double host_experts,
                                                         std::function<uint32_t(int, int32_t)> delay_us = {},
                                                         std::function<bool(int, int32_t)> read_error = {},
                                                         boost::asio::any_io_executor executor = {}) {
    auto probe = tiered_experts::create(files, [] {
        tier_options o;
        o.host_bytes = 1 << 26;
        return o;
    }());
    if (!probe) return probe.err();
    tier_options o;
    o.host_bytes = uint64_t(host_experts * double((*probe)->host_slot_bytes()));
    o.io.depth = 4;
    o.io.chunk_bytes = 4096;
    o.inject_delay_us = std::move(delay_us);
    o.inject_read_error = std::move(read_error);
    o.executor = std::move(executor);
    return tiered_experts::create(files, o);
}

// True (skipped, with a message) when io_uring is unavailable here; any other error fails.
inline bool skip_without_io_uring(const result<std::unique_ptr<tiered_experts>>& t) {
    if (t) return false;
    if (t.message().rfind("io_uring unavailable", 0) == 0) {
        BOOST_TEST_MESSAGE("skipped: " << t.message());
        return true;
    }
    BOOST_FAIL(t.message());
    return true;
}

// Microseconds from a hash of a call counter: every call differs, any thread may ask.
struct random_delay {
    std::shared_ptr<std::atomic<uint64_t>> calls = std::make_shared<std::atomic<uint64_t>>(0);
    uint32_t most_us = 400;
    uint32_t operator()(int layer, int32_t expert) const {
        uint64_t x = calls->fetch_add(1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(layer) << 32 | uint32_t(expert));
        x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
        return uint32_t((x >> 33) % most_us);
    }
};

// Prefill of the 40-token prompt, 4 decode steps and a draft through `mdl`, every logit.
inline std::vector<float> run_forward(dsv41::model& mdl) {
    auto seq = mdl.new_sequence(128, 16);
    const auto tokens = prompt_ids(kTierFx, 40);
    std::vector<float> all, part;
    dsv41::forward_item item{seq.get(), tokens, true};
    auto st = mdl.forward({&item, 1}, all);
    BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? std::string() : st.message()));
    for (int32_t t : {5, 77, 300, 12}) {
        dsv41::forward_item step{seq.get(), {&t, 1}, true};
        st = mdl.forward({&step, 1}, part);
        BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? std::string() : st.message()));
        all.insert(all.end(), part.begin(), part.end());
    }
    dsv41::draft_output d;
    BOOST_TEST_REQUIRE(mdl.draft(*seq, 9, d).ok());
    all.insert(all.end(), d.logits.begin(), d.logits.end());
    return all;
}

// The device tier's counters once every copy it issued has completed (completions are posted
// to its strand after the forward may have returned).
inline device_experts::counters settled(const device_experts& d) {
    for (int i = 0; i < 5000; ++i) {
        const auto k = d.stats();
        if (k.copies_completed == k.copies) return k;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return d.stats();
}

// What every streamed run must show: no thread blocked for an expert (neither tier), each miss
// copied at most once, every copy completed.
inline void check_pipeline_counters(const device_experts::counters& k, const tier_counters& host) {
    BOOST_TEST(k.blocking_waits == 0u);
    BOOST_TEST(host.blocking_waits == 0u);
    BOOST_TEST(k.copies > 0u);
    BOOST_TEST(k.copies <= k.misses);  // a join never copies
    BOOST_TEST(k.copies_completed == k.copies);
    BOOST_TEST(k.fills <= k.copies);
    BOOST_TEST(host.read_errors == 0u);
}

}  // namespace moestream::test
