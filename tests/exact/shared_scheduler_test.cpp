// One scheduler thread for the engine and the expert tiers (scheduler/scheduler_thread.h, issue
// 15): the engine's step loop, the host tier's strand and the device tier's strand all run on its
// one thread. Concurrent requests through one-slot tiers whose read and copy completions are held
// back get the tokens and log-probabilities (bit for bit) of an engine over resident experts, no
// thread blocks for an expert, nothing deadlocks, and each strand's handlers really run on the
// scheduler's thread.
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "../common/test_support.h"
#include "device_tier_support.h"
#include "engine_events.h"
#include "fixture_model.h"
#include "scheduler/engine.h"
#include "scheduler/scheduler_thread.h"

namespace moestream::test {
namespace {

auto needs() { return requires_path(fixtures_dir() / kTierFx / "model.safetensors"); }

// The threads a hook was called on.
class thread_log {
  public:
    void note() {
        std::lock_guard lock(mu_);
        ids_.insert(std::this_thread::get_id());
    }
    std::set<std::thread::id> ids() const {
        std::lock_guard lock(mu_);
        return ids_;
    }

  private:
    mutable std::mutex mu_;
    std::set<std::thread::id> ids_;
};

// A hook's delays (random_delay), noting the thread it runs on.
struct logged_delay {
    random_delay delay;
    thread_log* log;
    uint32_t operator()(int layer, int32_t expert) const {
        log->note();
        return delay(layer, expert);
    }
};

// Sampled requests (a different logit anywhere shows in the log-probabilities) of different
// lengths, more than the engine runs at once, so some wait for a sequence.
std::vector<generation_request> requests() {
    const auto base = prompt_ids(kTierFx, 40);
    std::vector<generation_request> out;
    for (int i = 0; i < 6; ++i) {
        generation_request r;
        r.prompt.assign(base.begin() + i, base.begin() + i + 3 + 6 * i);
        r.sampling.temperature = 0.9f;
        r.sampling.seed = uint64_t(100 + i);
        r.sampling.n_probs = 3;
        r.max_tokens = 8;
        out.push_back(std::move(r));
    }
    return out;
}

engine_options options() {
    engine_options o;
    o.max_sequences = 4;
    o.max_waiting = 16;
    o.prefill_chunk = 7;  // prompts over several steps, beside other sequences' decode rows
    o.context_tokens = 128;
    return o;
}

// Every request submitted at once; every event of each, in order.
std::vector<std::vector<token_event>> serve_all(engine& eng) {
    std::vector<std::shared_ptr<generation>> gens;
    for (auto& r : requests()) {
        auto g = eng.submit(std::move(r));
        BOOST_TEST_REQUIRE(g.ok(), (g.ok() ? std::string() : g.message()));
        gens.push_back(*g);
    }
    std::vector<std::vector<token_event>> out;
    for (auto& g : gens) {
        std::vector<token_event> events;
        receive_events(*g, std::chrono::seconds(300), [&](const token_event& e) {
            events.push_back(e);
            return e.done;
        });
        out.push_back(std::move(events));
    }
    return out;
}

// The same tokens, log-probabilities and alternatives, bit for bit, and the same ends.
void same_events(const std::vector<std::vector<token_event>>& got, const std::vector<std::vector<token_event>>& want,
                 const std::string& what) {
    BOOST_TEST_REQUIRE(got.size() == want.size());
    for (size_t r = 0; r < got.size(); ++r) {
        BOOST_TEST_REQUIRE(got[r].size() == want[r].size(), what << " request " << r);
        for (size_t i = 0; i < got[r].size(); ++i) {
            const token_event& a = got[r][i];
            const token_event& b = want[r][i];
            BOOST_TEST(a.token == b.token, what << " request " << r << " event " << i);
            BOOST_TEST(a.logprob == b.logprob, what << " request " << r << " event " << i);
            BOOST_TEST(a.finish_reason == b.finish_reason, what << " request " << r << " event " << i);
            BOOST_TEST_REQUIRE(a.top.size() == b.top.size());
            for (size_t k = 0; k < a.top.size(); ++k) {
                BOOST_TEST(a.top[k].token == b.top[k].token);
                BOOST_TEST(a.top[k].logprob == b.top[k].logprob);
            }
        }
        BOOST_TEST(got[r].back().finish_reason == "length", what << " request " << r);
    }
}

// Runs `body` on a thread of its own and aborts the process when it does not end in 10 minutes:
// a deadlock fails the run instead of hanging it.
template <class F>
void within_minutes(const char* what, F&& body) {
    auto done = std::async(std::launch::async, std::forward<F>(body));
    if (done.wait_for(std::chrono::minutes(10)) != std::future_status::ready) {
        std::fprintf(stderr, "shared scheduler: %s did not end in 10 minutes (deadlock?)\n", what);
        std::abort();
    }
    done.get();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shared_scheduler)

// What the blocking forms' assertions rely on: the scheduler's executor knows its own thread,
// also through a strand over it (as the tiers and the engine hold it), and no other.
BOOST_AUTO_TEST_CASE(the_scheduler_thread_knows_its_own_handlers) {
    scheduler_thread sched;
    BOOST_TEST(!runs_in_this_thread(sched.executor()));
    auto strand = boost::asio::make_strand(sched.executor());
    std::promise<std::pair<bool, std::thread::id>> on_strand;
    boost::asio::post(strand, [&] {
        on_strand.set_value({runs_in_this_thread(strand.get_inner_executor()), std::this_thread::get_id()});
    });
    const auto [inside, id] = on_strand.get_future().get();
    BOOST_TEST(inside);
    BOOST_TEST((id == sched.thread_id()));
    scheduler_thread other;
    std::promise<bool> elsewhere;
    boost::asio::post(other.executor(), [&] { elsewhere.set_value(runs_in_this_thread(sched.executor())); });
    BOOST_TEST(!elsewhere.get_future().get());
}

// The CPU serving path (tools/model_session.cpp): the host tier with a device tier of its own
// (one slot each) and the engine, one scheduler thread for both strands. Also run with a thread
// per strand, to print the reaper -> strand hop of each arrangement beside the other.
BOOST_AUTO_TEST_CASE(engine_and_tiers_on_one_thread_give_the_resident_bits, *needs()) {
    auto& m = fixture(kTierFx);
    std::vector<std::vector<token_event>> reference;
    {
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, *m.experts, *m.backend);
        engine eng(mdl, options());
        reference = serve_all(eng);
    }
    auto probe = host_tier(*m.files, 1);
    if (skip_without_io_uring(probe)) return;
    const uint64_t host_slot = (*probe)->host_slot_bytes(), device_slot = (*probe)->device_slot_bytes();
    probe->reset();
    for (const bool shared : {true, false}) {
        within_minutes("the engine over one-slot tiers", [&] {
            scheduler_thread sched;
            thread_log tier_threads, engine_threads;
            tier_options o;
            o.device_bytes = device_slot;
            o.host_bytes = host_slot;
            o.io.depth = 2;
            o.io.chunk_bytes = 4096;
            o.inject_delay_us = logged_delay{random_delay{}, &tier_threads};
            if (shared) o.executor = sched.executor();
            auto t = tiered_experts::create(*m.files, o);
            BOOST_TEST_REQUIRE(t.ok(), (t.ok() ? std::string() : t.message()));
            BOOST_TEST_REQUIRE((*t)->device_slots() == 1u);
            BOOST_TEST_REQUIRE((*t)->host_slots() == 1u);
            tiered_experts& tiers = **t;
            dsv41::model mdl(m.hp(), m.files->weights, nullptr, tiers, *m.backend);
            engine_options eo = options();
            if (shared) eo.executor = sched.executor();
            // Called on the step loop's strand every step: what the serving engine reads there.
            eo.waits = [&] {
                engine_threads.note();
                const auto w = tiers.wait_totals();
                return forward_waits{w.wait_seconds, 0, w.copy_seconds};
            };
            std::vector<std::vector<token_event>> got;
            {
                engine eng(mdl, eo);
                got = serve_all(eng);
                BOOST_TEST(eng.stats().time.experts_s > 0);  // the split saw the held reads
            }
            same_events(got, reference, shared ? "one scheduler thread" : "a thread per strand");
            const auto k = tiers.counters();
            BOOST_TEST(k.blocking_waits == 0u);
            BOOST_TEST(k.read_errors == 0u);
            BOOST_TEST(k.disk_reads > 0u);
            BOOST_TEST(k.wait_seconds == tiers.wait_totals().wait_seconds);
            BOOST_TEST_MESSAGE((shared ? "one scheduler thread" : "a thread per strand")
                               << ": " << k.disk_reads << " reads, " << k.completions_posted
                               << " completions, reaper -> strand "
                               << (k.completions_posted ? 1e6 * k.completion_post_seconds / double(k.completions_posted) : 0.0)
                               << " us each");
            if (!shared) return;
            const std::set<std::thread::id> on_scheduler{sched.thread_id()};
            BOOST_TEST((tier_threads.ids() == on_scheduler), "the host tier's handlers run on the scheduler thread");
            BOOST_TEST((engine_threads.ids() == on_scheduler), "the step loop runs on the scheduler thread");
        });
    }
}

// The CUDA path's shape on the CPU backend: the device tier's slots (device_experts, one slot)
// filled from a one-slot host tier, the engine over them, all three strands on one scheduler
// thread, with read and copy completions held back.
BOOST_AUTO_TEST_CASE(engine_device_tier_and_host_tier_share_the_scheduler_thread, *needs()) {
    auto& m = fixture(kTierFx);
    std::vector<std::vector<token_event>> reference;
    {
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, *m.experts, *m.backend);
        engine eng(mdl, options());
        reference = serve_all(eng);
    }
    within_minutes("the engine over one-slot device and host tiers", [&] {
        scheduler_thread sched;
        thread_log host_threads, device_threads, engine_threads;
        auto t = host_tier(*m.files, 1, logged_delay{random_delay{}, &host_threads}, {}, sched.executor());
        if (skip_without_io_uring(t)) return;
        cpu_backend be(2);
        device_tier_options o;
        o.executor = sched.executor();
        o.inject_copy_delay_us = logged_delay{random_delay{}, &device_threads};
        auto d = device_experts::create(be, *m.files, 1, false, t->get(), o);
        BOOST_TEST_REQUIRE(d.ok(), (d.ok() ? std::string() : d.message()));
        dsv41::model mdl(m.hp(), m.files->weights, nullptr, **d, be);
        engine_options eo = options();
        eo.executor = sched.executor();
        eo.waits = [&] {
            engine_threads.note();
            return forward_waits{};
        };
        std::vector<std::vector<token_event>> got;
        {
            engine eng(mdl, eo);
            got = serve_all(eng);
        }
        same_events(got, reference, "device and host tiers on the scheduler thread");
        const auto k = settled(**d);
        const auto h = (*t)->counters();
        check_pipeline_counters(k, h);  // no blocking wait in either tier, every copy completed
        BOOST_TEST_MESSAGE("one scheduler thread, device tier over host tier: " << k.copies << " copies in " << k.fills
                                                                                << " fills, " << h.disk_reads
                                                                                << " reads, copy completion -> strand "
                                                                                << (k.fills ? 1e6 * k.completion_post_seconds / double(k.fills) : 0.0)
                                                                                << " us a fill, reaper -> strand "
                                                                                << (h.completions_posted ? 1e6 * h.completion_post_seconds / double(h.completions_posted) : 0.0)
                                                                                << " us a completion");
        const std::set<std::thread::id> on_scheduler{sched.thread_id()};
        BOOST_TEST((host_threads.ids() == on_scheduler), "the host tier's handlers run on the scheduler thread");
        BOOST_TEST((device_threads.ids() == on_scheduler), "the device tier's handlers run on the scheduler thread");
        BOOST_TEST((engine_threads.ids() == on_scheduler), "the step loop runs on the scheduler thread");
        // The tiers go before the scheduler thread, draining what they still have posted there.
        d->reset();
        t->reset();
    });
}

// --io-mode remap-sync under the device tier (CUDA's baseline) with both strands on one thread:
// the device tier's strand announces the misses to the host tier, whose need() blocks in that
// mode; on the shared thread it must not wait for the host tier's strand (it would wait for
// itself), so the reads block the thread instead. The resident bits, and the forward ends.
BOOST_AUTO_TEST_CASE(remap_sync_under_the_device_tier_on_one_thread, *needs()) {
    auto& m = fixture(kTierFx);
    std::vector<float> reference;
    {
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, *m.experts, *m.backend);
        reference = run_forward(mdl);
    }
    auto probe = host_tier(*m.files, 1);
    if (skip_without_io_uring(probe)) return;
    const uint64_t host_slot = (*probe)->host_slot_bytes();
    probe->reset();
    within_minutes("remap-sync under the device tier", [&] {
        scheduler_thread sched;
        tier_options o;
        o.host_bytes = 3 * host_slot;
        o.remap_sync = true;
        o.executor = sched.executor();
        auto t = tiered_experts::create(*m.files, o);
        BOOST_TEST_REQUIRE(t.ok(), (t.ok() ? std::string() : t.message()));
        cpu_backend be(2);
        device_tier_options d;
        d.executor = sched.executor();
        auto slots = device_experts::create(be, *m.files, 2, false, t->get(), d);
        BOOST_TEST_REQUIRE(slots.ok(), (slots.ok() ? std::string() : slots.message()));
        dsv41::model mdl(m.hp(), m.files->weights, &*m.files->draft, **slots, be);
        BOOST_TEST(same_bits(run_forward(mdl), reference));
        const auto k = settled(**slots);
        const auto h = (*t)->counters();
        BOOST_TEST(k.blocking_waits == 0u);  // the forward never blocked in the device tier
        BOOST_TEST(h.blocking_waits > 0u);   // remap-sync's need() did, on the scheduler thread
        BOOST_TEST(h.disk_reads > 0u);
        BOOST_TEST(h.read_errors == 0u);
        slots->reset();
        t->reset();
    });
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
