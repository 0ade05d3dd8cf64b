// The device tier's fill pipeline on the GPU (issue 15): experts streamed host tier -> pinned
// host slot -> cudaMemcpyAsync on copy lanes -> the compute stream waiting on the copies' events
// -> the experts' kernels, with completions (cudaLaunchHostFunc) posted to the tier's strand.
// A forward through one VRAM slot over a one-expert host tier, with random delays on the reads'
// and the copies' completions, gives the logits of every expert resident (the slot-table path
// in CUDA graphs), bit for bit; no thread blocks for an expert; a miss on its way is joined.
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <future>

#include "../common/test_support.h"
#include "../exact/device_tier_support.h"
#include "gpu_support.h"
#include "model/mxfp4_tiles.h"

namespace moestream::test {
namespace {

auto needs() { return requires_path(fixtures_dir() / kTierFx / "model.safetensors"); }

// The fixture on its own GPU backend with every expert resident (preloaded slots).
fixture_model& resident_on_gpu() {
    static std::unique_ptr<fixture_model> m = [] {
        auto b = cuda::make_backend({});
        if (!b) BOOST_FAIL("cuda backend: " << b.message());
        return fixture_on(std::move(*b), kTierFx, false, 0);
    }();
    return *m;
}

std::unique_ptr<dsv41::model> model_over(fixture_model& m, dsv41::expert_source& experts) {
    return std::make_unique<dsv41::model>(m.hp(), m.device->weights, &*m.device->draft, experts, *m.backend);
}

std::future<result<dsv41::ready_experts>> ask(device_experts& d, int layer, std::vector<int32_t> ids, int64_t max) {
    auto p = std::make_shared<std::promise<result<dsv41::ready_experts>>>();
    auto f = p->get_future();
    d.async_ready(layer, ids, max, [p](result<dsv41::ready_experts> r) { p->set_value(std::move(r)); });
    return f;
}

void print_latency(const char* what, const device_experts::counters& k) {
    std::printf("%s: %llu copies in %llu fills; issue %.1f us a fill, issue to completion %.1f us a copy, "
                "completion callback to strand %.1f us a fill; %llu joined\n",
                what, static_cast<unsigned long long>(k.copies), static_cast<unsigned long long>(k.fills),
                k.fills ? 1e6 * k.issue_seconds / double(k.fills) : 0.0,
                k.copies_completed ? 1e6 * k.copy_seconds / double(k.copies_completed) : 0.0,
                k.fills ? 1e6 * k.completion_post_seconds / double(k.fills) : 0.0,
                static_cast<unsigned long long>(k.joined));
    std::fflush(stdout);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_device_tier)

BOOST_AUTO_TEST_CASE(streamed_slots_give_the_resident_bits, *needs()) {
    auto& m = resident_on_gpu();
    BOOST_TEST_REQUIRE(m.experts->slot_table(0) != nullptr);  // the reference routes on the device, in graphs
    const auto reference = run_forward(*m.model);
    for (const auto& [slots, host] : {std::pair<int64_t, double>{1, 1}, {2, 3}, {7, 2}}) {
        for (int lanes : {1, 2}) {
            auto t = host_tier(*m.files, host, random_delay{});
            if (skip_without_io_uring(t)) return;
            device_tier_options o;
            o.pinned_source = (*t)->host_region();
            o.copy_lanes = lanes;
            o.inject_copy_delay_us = random_delay{};
            auto d = device_experts::create(*m.backend, *m.files, slots, false, t->get(), o);
            BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
            BOOST_TEST((*d)->notes() == "");  // the host tier page-locked
            auto mdl = model_over(m, **d);
            const auto before = cuda::stats(*m.backend);
            const auto got = run_forward(*mdl);
            const auto after = cuda::stats(*m.backend);
            REQUIRE_BITS_EQUAL(got, reference);
            // The forward awaited its picks and logits: the host never blocked on the stream.
            BOOST_TEST(after.host_waits == before.host_waits);
            BOOST_TEST(after.downloads == before.downloads);
            BOOST_TEST(after.async_downloads > before.async_downloads);
            const auto k = settled(**d);
            check_pipeline_counters(k, (*t)->counters());
            const std::string what = "slots " + std::to_string(slots) + ", host " + std::to_string(int(host)) +
                                     ", lanes " + std::to_string(lanes);
            print_latency(what.c_str(), k);
        }
    }
}

// The same without injected delays, several times over one device tier: the GPU's own timing
// decides what is in flight when (a copy still running when its expert's kernels are queued, a
// slot reused right after its kernels), and the bits never move.
BOOST_AUTO_TEST_CASE(streamed_slots_are_deterministic_at_full_speed, *needs()) {
    auto& m = resident_on_gpu();
    const auto reference = run_forward(*m.model);
    auto t = host_tier(*m.files, 2);
    if (skip_without_io_uring(t)) return;
    device_tier_options o;
    o.pinned_source = (*t)->host_region();
    auto d = device_experts::create(*m.backend, *m.files, 1, false, t->get(), o);
    BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
    auto mdl = model_over(m, **d);
    for (int i = 0; i < 3; ++i) {
        const auto got = run_forward(*mdl);
        REQUIRE_BITS_EQUAL(got, reference);
    }
    const auto k = settled(**d);
    check_pipeline_counters(k, (*t)->counters());
    print_latency("one slot at full speed", k);
}

// Two requests for a miss whose read is held back: one copy, both answered with the same VRAM
// slot; a third while the copy's completion is held back is answered from the slot (joined);
// what the compute stream then reads there is the file's bytes.
BOOST_AUTO_TEST_CASE(a_miss_on_its_way_is_joined_never_copied_twice, *needs()) {
    auto& m = resident_on_gpu();
    const int layer = 0;
    const int32_t expert = 3;
    std::atomic<bool> hold_copy{true};
    auto t = host_tier(*m.files, 2, [](int l, int32_t e) -> uint32_t { return l == layer && e == expert ? 200'000 : 0; });
    if (skip_without_io_uring(t)) return;
    device_tier_options o;
    o.pinned_source = (*t)->host_region();
    o.inject_copy_delay_us = [&](int l, int32_t e) -> uint32_t {
        return l == layer && e == expert && hold_copy.exchange(false) ? 300'000 : 0;
    };
    auto d = device_experts::create(*m.backend, *m.files, 2, false, t->get(), o);
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
    BOOST_TEST(a->front().second.gate.data == b->front().second.gate.data);
    auto third = ask(dev, layer, {expert}, 2);
    BOOST_TEST_REQUIRE((third.wait_for(std::chrono::seconds(20)) == std::future_status::ready));
    auto c = third.get();
    BOOST_TEST_REQUIRE(c.ok());
    BOOST_TEST(c->front().second.down.data == a->front().second.down.data);
    const auto k = dev.stats();
    BOOST_TEST(k.misses == 1u);
    BOOST_TEST(k.copies == 1u);
    BOOST_TEST(k.joined == 2u);
    // The compute stream waits on the copy's event: a download (on it) sees the file's bytes.
    const auto file = m.files->expert(layer, expert);
    for (const auto& [dev_w, host_w] : {std::pair{a->front().second.gate, file.gate}, {a->front().second.up, file.up},
                                        {a->front().second.down, file.down}}) {
        const size_t bytes = size_t(host_w.rows) * host_w.row_stride;
        std::vector<std::byte> back(bytes), want(bytes);
        m.backend->download(back.data(), dev_w.data, bytes);
        if (dev_w.layout == weight_layout::mxfp4_tiles)  // the fill tiled it: the file's bytes, regrouped
            mxfp4_tiles::tile_matrix(static_cast<const uint8_t*>(host_w.data), reinterpret_cast<uint8_t*>(want.data()),
                                     host_w.rows, host_w.cols);
        else
            std::memcpy(want.data(), host_w.data, bytes);
        BOOST_TEST(std::memcmp(back.data(), want.data(), bytes) == 0);
    }
    for (int i = 0; i < 3; ++i) dev.release(layer, expert);
    BOOST_TEST(settled(dev).copies_completed == 1u);
    BOOST_TEST((*t)->counters().disk_reads == 1u);
}

// As many slots as experts, filled on demand (not preloaded): once the last expert has a slot
// the tables are published and decode steps run as CUDA graphs again, to the same bits.
BOOST_AUTO_TEST_CASE(slots_filled_on_demand_publish_the_tables, *needs()) {
    auto& m = resident_on_gpu();
    const auto reference = run_forward(*m.model);
    const int64_t total = m.files->total_experts();
    auto t = host_tier(*m.files, 3, random_delay{});
    if (skip_without_io_uring(t)) return;
    device_tier_options o;
    o.pinned_source = (*t)->host_region();
    auto d = device_experts::create(*m.backend, *m.files, total, false, t->get(), o);
    BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
    auto mdl = model_over(m, **d);
    const auto streamed = run_forward(*mdl);
    REQUIRE_BITS_EQUAL(streamed, reference);
    for (int L = 0; L < int(m.files->expert_index.size()); ++L) {
        const int n = L < m.hp().n_layers ? m.hp().n_experts : m.hp().dspark_n_experts;
        for (int32_t e = 0; e < n; ++e) {
            auto w = (*d)->get(L, e);
            BOOST_TEST_REQUIRE(w.ok(), (w.ok() ? std::string() : w.message()));
            (*d)->release(L, e);
        }
    }
    BOOST_TEST_REQUIRE((*d)->slot_table(0) != nullptr);
    const auto g0 = cuda::stats(*m.backend).graph_launches;
    const auto through_tables = run_forward(*mdl);
    REQUIRE_BITS_EQUAL(through_tables, reference);
    BOOST_TEST(cuda::stats(*m.backend).graph_launches > g0);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
