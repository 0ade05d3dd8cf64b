// moestream bench copy: expert uploads from the pinned host tier into VRAM slots through the
// device tier's pipeline (scheduler/device_experts: the host tier's answers, a fill's experts in
// one cudaMemcpyBatchAsync on a copy lane after the compute stream's mark, each expert one copy
// of its slot's span where both tiers' slots lay it out alike and consecutive slots merged, the
// compute stream waiting on the copies' events, completions posted to the strand; beside it the
// same with a cudaMemcpyAsync a piece) as a fraction of the pinned host-to-device bandwidth
// measured in the same run (one cudaMemcpyAsync of 1 GiB of page-locked memory); and the host
// latency of learning that a copy finished (cudaLaunchHostFunc against a thread polling the
// copy's event, then the hop to the strand).
//
// The experts: the first layers' experts, 1 GiB of them at most, held by a host tier that has
// room for all of them (read once from disk before the timed rounds), uploaded in order into a
// quarter as many VRAM slots, so every upload is a VRAM miss and a host hit. A round asks the
// device tier for each layer's experts in groups of half the slots (so one group's copies run
// while the next is asked for), releases each group at once and ends when the compute stream,
// which waits on every copy, is idle.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "config/config.h"
#include "scheduler/device_experts.h"
#include "scheduler/model_loader.h"
#include "scheduler/tiered_experts.h"
#include "tools/bench_stats.h"
#include "tools/command.h"

#if MOESTREAM_HAVE_CUDA
#include "model/cuda/copy_bench.h"
#include "model/cuda/cuda_backend.h"
#endif

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench copy";

#if MOESTREAM_HAVE_CUDA

using clock_type = std::chrono::steady_clock;
constexpr size_t kSetBytes = size_t(1) << 30;

struct layer_experts {
    int layer;
    std::vector<int32_t> ids;
};

// One pass over the set: every layer's experts asked for in groups of `group` (an answer
// holds at least one), each released as soon as it is answered.
status upload_pass(device_experts& d, const std::vector<layer_experts>& set, int64_t group) {
    for (const auto& [layer, ids] : set) {
        d.need(layer, ids);
        std::vector<int32_t> pending = ids;
        while (!pending.empty()) {
            std::promise<result<dsv41::ready_experts>> answer;
            auto f = answer.get_future();
            d.async_ready(layer, pending, group, [&answer](result<dsv41::ready_experts> r) { answer.set_value(std::move(r)); });
            auto got = f.get();
            if (!got) return got.err();
            for (const auto& [id, unused] : *got) {
                d.release(layer, id);
                pending.erase(std::find(pending.begin(), pending.end(), id));
            }
        }
    }
    return {};
}

struct lane_figures {
    std::vector<double> gbps;
    device_experts::counters per_round;  // the last round's counters
    double issue_share = 0;              // of the last round's time, the strand's issuing of the fills
    std::string notes;
};

result<lane_figures> measure_lanes(backend& gpu, const loaded_model& m, tiered_experts& host,
                                   const std::vector<layer_experts>& set, int64_t slots, int lanes, bool batched,
                                   int rounds) {
    device_tier_options o;
    o.pinned_source = host.host_region();
    o.copy_lanes = lanes;
    o.batched_copies = batched;
    auto d = device_experts::create(gpu, m, slots, false, &host, o);
    if (!d) return d.err();
    const int64_t group = std::max<int64_t>(1, slots / 2);
    // Warm-up: the host tier reads the set from disk the first time; later passes find it there.
    if (auto st = upload_pass(**d, set, group); !st) return st.err();
    gpu.synchronize();
    lane_figures out;
    out.notes = (*d)->notes();
    for (int r = 0; r < rounds; ++r) {
        const auto before = (*d)->stats();
        const auto t0 = clock_type::now();
        if (auto st = upload_pass(**d, set, group); !st) return st.err();
        gpu.synchronize();  // the compute stream waits on every copy's event
        const double dt = std::chrono::duration<double>(clock_type::now() - t0).count();
        const auto after = (*d)->stats();
        out.gbps.push_back(double(after.bytes_uploaded - before.bytes_uploaded) / dt / 1e9);
        auto& k = out.per_round;
        k = after;
        k.hits -= before.hits;
        k.misses -= before.misses;
        k.joined -= before.joined;
        k.copies -= before.copies;
        k.copies_completed -= before.copies_completed;
        k.bytes_uploaded -= before.bytes_uploaded;
        k.blocking_waits -= before.blocking_waits;
        k.copy_seconds -= before.copy_seconds;
        k.completion_post_seconds -= before.completion_post_seconds;
        k.fills -= before.fills;
        k.pieces -= before.pieces;
        k.issue_seconds -= before.issue_seconds;
        out.issue_share = k.issue_seconds / dt;
    }
    return out;
}

result<std::vector<int>> parse_lanes(const std::string& text) {
    std::vector<int> out;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string part = text.substr(at, comma - at);
        const int v = std::atoi(part.c_str());
        if (v < 1 || v > 16 || std::to_string(v) != part)
            return make_error("--lanes takes numbers from 1 to 16 separated by commas, got '" + text + "'");
        out.push_back(v);
        at = comma + 1;
    }
    return out;
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    auto rounds = a.get_int("rounds", 5);
    if (!rounds) return usage_error(kName, rounds.message());
    if (*rounds < 3) return usage_error(kName, "--rounds must be >= 3");
    auto lanes = parse_lanes(a.get_or("lanes", "1,2,4"));
    if (!lanes) return usage_error(kName, lanes.message());
    if (cfg->model.path.empty()) return usage_error(kName, "--model is required");
    if (cfg->runtime.backend == "cpu")
        return usage_error(kName, "it measures uploads into VRAM: --backend cuda (or auto, the default)");
    auto be = cuda::make_backend({});
    if (!be) return fail(kName, be.message());
    backend& gpu = **be;
    auto files = load_model(cfg->model.path, std::string());
    if (!files) return fail(kName, files.message());
    const loaded_model& m = **files;

    // The set: the first layers' experts, whole layers while they fit in kSetBytes (at least 8).
    const size_t expert_bytes = device_experts::slot_bytes(m);
    std::vector<layer_experts> set;
    int64_t count = 0;
    for (int L = 0; L < m.hp.n_layers && (count < 8 || size_t(count) * expert_bytes < kSetBytes); ++L) {
        layer_experts le{L, {}};
        for (int32_t e = 0; e < m.hp.n_experts && (count < 8 || size_t(count + 1) * expert_bytes <= kSetBytes); ++e) {
            le.ids.push_back(e);
            ++count;
        }
        if (le.ids.empty()) break;
        set.push_back(std::move(le));
    }
    const int64_t slots = std::max<int64_t>(2, count / 4);
    tier_options t;
    t.host_bytes = uint64_t(count + 2) * (expert_bytes + 6 * io::kReadAlign);  // every expert of the set
    t.io.depth = uint32_t(cfg->io.depth);
    t.io.chunk_bytes = uint64_t(cfg->io.chunk_kib) * 1024;
    auto host = tiered_experts::create(m, t);
    if (!host) return fail(kName, host.message());

    std::printf("bench copy: %s on %s, median of %lld rounds (min-max)\n", cfg->model.path.c_str(),
                gpu.device_description().c_str(), static_cast<long long>(*rounds));
    auto h2d = cuda::pinned_h2d_seconds(gpu, kSetBytes, int(*rounds));
    if (!h2d) return fail(kName, h2d.message());
    const double bus = double(kSetBytes) / h2d->median / 1e9;
    std::printf("pinned host-to-device copy (1 GiB, one cudaMemcpyAsync): %.1f GB/s (%.1f-%.1f)\n", bus,
                double(kSetBytes) / h2d->max / 1e9, double(kSetBytes) / h2d->min / 1e9);
    std::printf("expert uploads: %lld experts of %.2f MiB (layers 0-%d) from a host tier of %u slots into %lld VRAM "
                "slots, asked for in groups of %lld\n",
                static_cast<long long>(count), double(expert_bytes) / double(1 << 20), set.back().layer,
                (*host)->host_slots(), static_cast<long long>(slots), static_cast<long long>(std::max<int64_t>(1, slots / 2)));
    // Each lane count with a fill's pieces in one cudaMemcpyBatchAsync, then the last one with a
    // call a piece (the comparison: what batching buys).
    std::vector<std::pair<int, bool>> runs;
    for (int l : *lanes) runs.push_back({l, true});
    runs.push_back({lanes->back(), false});
    for (const auto& [l, batched] : runs) {
        auto f = measure_lanes(gpu, m, **host, set, slots, l, batched, int(*rounds));
        if (!f) return fail(kName, f.message());
        const double med = median(f->gbps);
        const auto [lo, hi] = std::minmax_element(f->gbps.begin(), f->gbps.end());
        const auto& k = f->per_round;
        std::printf("  %d copy lane%s, %s: %.1f GB/s (%.1f-%.1f), ratio %.3f of the pinned copy (target >= 0.85); a "
                    "round: %llu experts in %llu fills of %llu copies, %llu joined, %llu blocking waits, issue %.1f us "
                    "a fill (%.0f%% of the round), issue to completion %.1f us, completion to strand %.1f us%s%s\n",
                    l, l == 1 ? "" : "s", batched ? "batched" : "a call a piece", med, *lo, *hi, med / bus,
                    static_cast<unsigned long long>(k.copies), static_cast<unsigned long long>(k.fills),
                    static_cast<unsigned long long>(k.pieces), static_cast<unsigned long long>(k.joined),
                    static_cast<unsigned long long>(k.blocking_waits),
                    k.fills ? 1e6 * k.issue_seconds / double(k.fills) : 0.0, 100.0 * f->issue_share,
                    k.copies_completed ? 1e6 * k.copy_seconds / double(k.copies_completed) : 0.0,
                    k.fills ? 1e6 * k.completion_post_seconds / double(k.fills) : 0.0, f->notes.empty() ? "" : "; ",
                    f->notes.c_str());
        std::fflush(stdout);
    }
    const auto hk = (*host)->counters();
    std::printf("host tier: %llu experts read from disk (the warm-up), %llu host hits\n",
                static_cast<unsigned long long>(hk.disk_reads), static_cast<unsigned long long>(hk.host_hits));
    auto lat = cuda::completion_latency(gpu, 20 * int(*rounds));
    if (!lat) return fail(kName, lat.message());
    std::printf("copy completion seen by the host (64 KiB copies, %lld rounds): cudaLaunchHostFunc on a notification "
                "stream %.1f us after an event poller (median; %.1f-%.1f), the poller %.1f us after the issue\n",
                static_cast<long long>(20 * *rounds), lat->host_func_after_poll.median * 1e6,
                lat->host_func_after_poll.min * 1e6, lat->host_func_after_poll.max * 1e6,
                lat->poll_after_issue.median * 1e6);
    return 0;
}

#else

int run(const cli::args&) { return fail(kName, "this build has no CUDA backend (nvcc was not found when it was built)"); }

#endif

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"rounds", "N", "timed rounds, median reported (default 5)"},
        {"lanes", "LIST", "copy lanes to measure, e.g. 1,2,4 (default 1,2,4)"},
    });
    return specs;
}

const command kCommand{kName, "--model FILE.gguf [--rounds N] [--lanes 1,2,4] [--backend cuda]",
                       "Expert uploads from the pinned host tier into VRAM slots through the device tier's pipeline "
                       "(copy lanes, events, completions on the strand) as a fraction of the pinned host-to-device "
                       "bandwidth measured in the same run; the host latency of copy completions "
                       "(cudaLaunchHostFunc against an event poller).",
                       options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
