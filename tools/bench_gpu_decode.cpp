// `moestream bench decode --backend cuda`: decode on the GPU with the experts in VRAM slots (all
// of them when --device-cache covers them), against its floor measured in the same run: the
// bytes a token touches (the dense weights it reads and the experts it routes to) over the
// device-to-device copy bandwidth, plus the launch floor (this many kernel launches at the
// measured cost of an empty one); the same prompts decoded by the CPU backend beside it; prefill
// tokens/s of a 2k-token prompt; kernel launches per token.
#include "tools/bench_gpu_decode.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "tools/bench_disk.h"
#include "tools/bench_stats.h"
#include "tools/command.h"
#include "tools/model_session.h"

#if MOESTREAM_HAVE_CUDA
#include "model/cuda/cuda_backend.h"
#include "model/cuda/kernel_bench.h"
#endif

namespace moestream::tools {

#if MOESTREAM_HAVE_CUDA
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Counts the experts a step routes to (the union per layer) and their bytes.
class counting_source final : public dsv41::expert_source {
  public:
    counting_source(dsv41::expert_source& inner, const loaded_model& m) : inner_(inner), m_(m) {}
    void need(int layer, std::span<const int32_t> ids) override {
        const auto w = m_.expert(layer, 0);
        bytes_ += int64_t(ids.size()) * int64_t(w.gate.rows * w.gate.row_stride + w.up.rows * w.up.row_stride +
                                                w.down.rows * w.down.row_stride);
        inner_.need(layer, ids);
    }
    result<dsv41::expert_weights> get(int layer, int32_t e) override { return inner_.get(layer, e); }
    result<std::vector<std::pair<int32_t, dsv41::expert_weights>>> acquire_ready(int layer,
                                                                                std::span<const int32_t> pending,
                                                                                int64_t max) override {
        return inner_.acquire_ready(layer, pending, max);
    }
    // The forward's awaits reach the tiers as they are (the default would block in acquire_ready).
    void async_ready(int layer, std::span<const int32_t> pending, int64_t max, dsv41::ready_callback done) override {
        inner_.async_ready(layer, pending, max, std::move(done));
    }
    void hint(int layer, std::span<const int32_t> ids) override { inner_.hint(layer, ids); }
    void release(int layer, int32_t e) override { inner_.release(layer, e); }
    int64_t max_held() const override { return inner_.max_held(); }
    const expert_slot_table* slot_table(int layer) override { return inner_.slot_table(layer); }
    int64_t take_bytes() { return std::exchange(bytes_, 0); }

  private:
    dsv41::expert_source& inner_;
    const loaded_model& m_;
    int64_t bytes_ = 0;
};

// New content: the model file's pages out of the page cache (POSIX_FADV_DONTNEED drops clean
// pages; no privileges needed), so a pass reads from the disk, whatever an earlier pass or the
// forge left cached (remap-sync's buffered reads otherwise find a just-forged file in RAM).
void drop_page_cache(const gguf::model_file& f) {
    for (size_t i = 0; i < f.shard_count(); ++i) {
        const int fd = ::open(f.shard_path(uint32_t(i)).c_str(), O_RDONLY);
        if (fd < 0) continue;
        (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
}

// Dense bytes a decode step reads: every non-expert tensor once, but the embedding and engram
// tables (gathers of a few rows).
int64_t dense_bytes_per_token(const gguf::model_file& f) {
    int64_t total = 0;
    for (const auto& t : f.tensors()) {
        if (t.n_dims == 3 || t.name == "token_embd.weight" || t.name.rfind("engram_", 0) == 0 ||
            t.name.find("engram_embd") != std::string::npos)
            continue;
        total += int64_t(t.bytes);
    }
    return total;
}

struct decode_figures {
    double prefill_tps = 0;
    std::vector<double> token_s;      // every decode step
    double launches_per_token = 0;
    double expert_bytes_per_token = 0;
    cuda::backend_stats decode_stats;  // the decode steps' counters
    std::vector<cuda::op_time> profile;  // the decode steps' ops, when profiled
    std::vector<cuda::op_time> prefill_profile;  // the prefill's ops, when profiled
    double prefill_profiled_s = 0;               // that prefill's time (events after each op)
    double disk_bytes_per_token = 0;             // expert bytes the decode steps read from the disk
    // Streaming: where the decode steps' wall time went (seconds over all of them).
    struct split {
        double wall = 0;         // the steps
        double disk_busy = 0;    // with >= 1 read in flight (the ceiling assumes all of it)
        double in_flight = 0;    // reads in flight, time-weighted over the busy time
        double expert_wait = 0;  // the forward waiting for its experts (the device tier's waiting requests)
        double engram_wait = 0;  // ... for engram rows
        double copies = 0;       // expert uploads
        double copy_s = 0;       // their issue to completion, summed
    } spent;
};

// Expert bytes a one-row step touches when it routes through the slot table (it announces
// nothing): a row's k picks are distinct.
int64_t slot_table_bytes_per_token(dsv41::expert_source& source, const dsv41::hparams& hp) {
    int64_t bytes = 0;
    for (int L = 0; L < hp.n_layers; ++L) {
        const expert_slot_table* t = source.slot_table(L);
        if (!t) return 0;
        bytes += hp.n_active * int64_t(t->gate.rows * int64_t(t->gate.row_stride) +
                                       t->up.rows * int64_t(t->up.row_stride) + t->down.rows * int64_t(t->down.row_stride));
    }
    return bytes;
}

// A deterministic prompt spread over the vocabulary.
std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
    std::vector<int32_t> p;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p.push_back(int32_t((x >> 33) % uint64_t(vocab)));
    }
    return p;
}

// drop_cache: the model file's pages dropped from the page cache before every step (outside its
// time), so buffered reads (remap-sync) find nothing an earlier step or the prefill left there.
result<decode_figures> decode_on(model_session& s, dsv41::expert_source& source, int64_t prompt_len, int64_t n,
                                 bool profile = false, bool drop_cache = false) {
    counting_source count(source, *s.files);
    dsv41::model mdl(s.hp(), s.weights(), nullptr, count, *s.compute, s.model->options());
    const auto prompt = prompt_of(prompt_len, s.hp().vocab);
    auto seq = mdl.new_sequence(prompt_len + n + 1, 16);
    std::vector<float> logits;
    decode_figures f;
    // Warm-up forward (first-use costs), then the timed prefill on a fresh sequence.
    {
        auto warm = mdl.new_sequence(prompt_len + 1, 16);
        dsv41::forward_item w{warm.get(), {prompt.data(), std::min<size_t>(prompt.size(), 64)}, false};
        if (auto st = mdl.forward({&w, 1}, logits); !st) return st.err();
    }
    auto t0 = clock_type::now();
    dsv41::forward_item item{seq.get(), prompt, false};
    if (auto st = mdl.forward({&item, 1}, logits); !st) return st.err();
    f.prefill_tps = double(prompt_len) / since(t0);
    count.take_bytes();
    if (profile) {
        // The same prefill again on a fresh sequence, each op timed.
        cuda::set_profile(*s.compute, true);
        auto again = mdl.new_sequence(prompt_len + 1, 16);
        dsv41::forward_item p{again.get(), prompt, false};
        const auto tp = clock_type::now();
        if (auto st = mdl.forward({&p, 1}, logits); !st) return st.err();
        f.prefill_profiled_s = since(tp);
        f.prefill_profile = cuda::take_profile(*s.compute);
        count.take_bytes();
    }
    const auto stats0 = cuda::stats(*s.compute);
    const int64_t routed_bytes = slot_table_bytes_per_token(source, s.hp());
    int64_t expert_bytes = 0;
    const uint64_t disk0 = s.streamed ? s.streamed->counters().disk_bytes : 0;
    const auto io0 = s.streamed ? s.streamed->io_stats() : io::reader_stats{};
    const auto dev0 = s.slots && s.streamed ? s.slots->stats() : device_experts::counters{};
    const double engram0 = s.engram ? s.engram->counters().wait_seconds : 0.0;
    for (int64_t k = 0; k < n; ++k) {
        const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (drop_cache) drop_page_cache(s.files->target);
        t0 = clock_type::now();
        dsv41::forward_item step{seq.get(), {&next, 1}, false};
        if (auto st = mdl.forward({&step, 1}, logits); !st) return st.err();
        f.token_s.push_back(since(t0));
        const int64_t announced = count.take_bytes();
        expert_bytes += announced > 0 ? announced : routed_bytes;
    }
    if (s.streamed) {
        f.disk_bytes_per_token = double(s.streamed->counters().disk_bytes - disk0) / double(n);
        const auto io1 = s.streamed->io_stats();
        auto& sp = f.spent;
        for (double t : f.token_s) sp.wall += t;
        sp.disk_busy = io1.busy_seconds - io0.busy_seconds;
        // The reader's time-weighted mean is cumulative: this stretch's share of it.
        if (sp.disk_busy > 0)
            sp.in_flight = (io1.time_mean_in_flight * io1.busy_seconds - io0.time_mean_in_flight * io0.busy_seconds) /
                           sp.disk_busy;
        if (s.slots) {
            const auto dev1 = s.slots->stats();
            sp.expert_wait = dev1.wait_seconds - dev0.wait_seconds;
            sp.copies = double(dev1.copies_completed - dev0.copies_completed);
            sp.copy_s = dev1.copy_seconds - dev0.copy_seconds;
        }
        if (s.engram) sp.engram_wait = s.engram->counters().wait_seconds - engram0;
    }
    const auto stats1 = cuda::stats(*s.compute);
    if (profile) {
        f.profile = cuda::take_profile(*s.compute);
        cuda::set_profile(*s.compute, false);
    }
    f.decode_stats.launches = stats1.launches - stats0.launches;
    f.decode_stats.graph_launches = stats1.graph_launches - stats0.graph_launches;
    f.decode_stats.graph_instantiations = stats1.graph_instantiations - stats0.graph_instantiations;
    f.decode_stats.graph_updates = stats1.graph_updates - stats0.graph_updates;
    f.decode_stats.graph_nodes_set = stats1.graph_nodes_set - stats0.graph_nodes_set;
    f.decode_stats.step_host_ns = stats1.step_host_ns - stats0.step_host_ns;
    f.decode_stats.step_wait_ns = stats1.step_wait_ns - stats0.step_wait_ns;
    f.decode_stats.step_device_ns = stats1.step_device_ns - stats0.step_device_ns;
    f.decode_stats.steps_timed = stats1.steps_timed - stats0.steps_timed;
    f.decode_stats.host_waits = stats1.host_waits - stats0.host_waits;
    f.decode_stats.downloads = stats1.downloads - stats0.downloads;
    f.decode_stats.async_downloads = stats1.async_downloads - stats0.async_downloads;
    f.decode_stats.async_download_waits = stats1.async_download_waits - stats0.async_download_waits;
    f.launches_per_token = double(f.decode_stats.launches) / double(n);
    f.expert_bytes_per_token = double(expert_bytes) / double(n);
    return f;
}

}  // namespace

int run_gpu_decode(std::string_view name, const moestream_config& cfg, int64_t n, int64_t prompt_len,
                   bool with_graphs, bool with_stream, bool compare) {
    moestream_config c = cfg;
    c.runtime.backend = "cuda";
    // The slots fill from a host tier read through io_uring (the serving path), so a device cache
    // smaller than the model streams as it would under `serve`.
    auto session = open_model_session(c, false, true);
    if (!session) return fail(name, session.message());
    auto& s = **session;
    backend& gpu = *s.compute;
    std::printf("bench decode --backend cuda: %s on %s | %lld of %lld experts in VRAM slots | %lld-token prompt, %lld "
                "decode steps, greedy\n",
                cfg.model.path.c_str(), gpu.device_description().c_str(), static_cast<long long>(s.slots->slots()),
                static_cast<long long>(s.files->total_experts()), static_cast<long long>(prompt_len),
                static_cast<long long>(n));
    auto copy = cuda::copy_seconds(gpu, size_t(1) << 30, 9);
    if (!copy) return fail(name, copy.message());
    const double d2d = 2.0 * double(size_t(1) << 30) / copy->median;
    // An empty launch's cost: many one-element ops, timed on the device.
    backend_array<float> one(gpu, 1);
    constexpr int kProbe = 2000;
    auto launch = cuda::device_seconds(gpu, [&] {
        for (int i = 0; i < kProbe; ++i) gpu.round_bf16(one.data(), 1);
    });
    if (!launch) return fail(name, launch.message());
    const double per_launch = *launch / kProbe;
    auto node = cuda::graph_node_seconds(gpu, kProbe, 9);
    if (!node) return fail(name, node.message());
    std::printf("device-to-device copy: %.0f GB/s; an empty launch: %.2f us on a stream, %.2f us in a graph\n",
                d2d / 1e9, per_launch * 1e6, *node * 1e6);
    const double dense = double(dense_bytes_per_token(s.files->target));
    double t_gpu = 0;
    // Each step replayed as a CUDA graph (the default), then every kernel launched on the stream.
    const bool streaming = s.slots->slots() < s.files->total_experts();
    double stream_bytes_per_token = 0, stream_prefill_tps = 0;
    if (streaming)
        std::printf("streaming: the model file's pages are dropped from the page cache before each pass (new "
                    "content for remap-sync's buffered reads; the engine reads with O_DIRECT)\n");
    for (bool graphs : {true, false}) {
        if (graphs ? !with_graphs : !with_stream) continue;
        cuda::set_graphs(gpu, graphs);
        if (streaming) drop_page_cache(s.files->target);
        auto g = decode_on(s, *s.slots, prompt_len, n, false, streaming);
        if (!g) return fail(name, g.message());
        if (streaming) {
            const auto& sp = g->spent;
            const double per = 1e3 / double(n), layers = double(s.hp().n_layers);
            const double rest = sp.wall - sp.expert_wait - sp.engram_wait;
            std::printf("  streaming: %.1f MB read from the disk per decode step; a step %.2f ms (mean): the disk busy "
                        "%.2f ms (%.0f%% of the time, %.1f reads in flight then), the forward waiting for experts %.2f ms "
                        "(%.0f us a layer) and for engram rows %.2f ms, the rest (compute, host scheduling) %.2f ms "
                        "(%.0f us a layer); %.1f uploads a step, %.0f us each from issue to completion\n",
                        g->disk_bytes_per_token / 1e6, sp.wall * per, sp.disk_busy * per,
                        sp.wall > 0 ? 100.0 * sp.disk_busy / sp.wall : 0.0, sp.in_flight, sp.expert_wait * per,
                        sp.expert_wait * per * 1e3 / layers, sp.engram_wait * per,
                        rest * per, rest * per * 1e3 / layers, sp.copies / double(n),
                        sp.copies > 0 ? 1e6 * sp.copy_s / sp.copies : 0.0);
        }
        const double bytes = dense + g->expert_bytes_per_token;
        const double t = median(g->token_s);
        const auto& st = g->decode_stats;
        const bool replayed = st.graph_launches > 0;
        const double bytes_floor = bytes / d2d, launch_floor = g->launches_per_token * (replayed ? *node : per_launch);
        std::printf("GPU, %s: prefill %.0f tok/s; decode %.3f ms/token (median of %lld; %.3f-%.3f), %.0f tok/s; %.0f "
                    "kernels per token (the published port: 6,669 launches)",
                    graphs ? (cuda::graph_programmatic_edges() ? "graphs, programmatic edges" : "graphs, plain edges")
                           : "stream launches",
                    g->prefill_tps, t * 1e3, static_cast<long long>(n),
                    *std::min_element(g->token_s.begin(), g->token_s.end()) * 1e3,
                    *std::max_element(g->token_s.begin(), g->token_s.end()) * 1e3, 1.0 / t, g->launches_per_token);
        if (replayed)
            std::printf("; %.2f graph launches per token (%llu built, %llu reused with %.1f nodes set anew a step)",
                        double(st.graph_launches) / double(n), static_cast<unsigned long long>(st.graph_instantiations),
                        static_cast<unsigned long long>(st.graph_updates),
                        st.graph_updates ? double(st.graph_nodes_set) / double(st.graph_updates) : 0.0);
        if (replayed)
            std::printf("\n  a step: %.3f ms of host code and recording, then %.3f ms waiting for its graph; the "
                        "device's span of its graphs %.3f ms (the device time when a step is one graph: "
                        "MOESTREAM_STEP_SEGMENT_OPS=0)",
                        double(st.step_host_ns) / 1e6 / double(n), double(st.step_wait_ns) / 1e6 / double(n),
                        st.steps_timed ? double(st.step_device_ns) / 1e6 / double(st.steps_timed) : 0.0);
        // The forward awaits what it reads back (issue 15): host waits per token should be zero.
        std::printf("\n  the host's reads: %.2f awaited downloads per token (%.2f found not yet landed: the "
                    "forward suspended), %.2f blocking downloads and %.2f host waits on the stream per token",
                    double(st.async_downloads) / double(n), double(st.async_download_waits) / double(n),
                    double(st.downloads) / double(n), double(st.host_waits) / double(n));
        std::printf("\n");
        std::printf("  floor: %.1f MB touched per token (dense %.1f + experts %.1f) / D2D = %.3f ms, + %s floor %.3f ms "
                    "= %.3f ms; decode at %.2fx the floor (target <= 1.5x)\n",
                    bytes / 1e6, dense / 1e6, g->expert_bytes_per_token / 1e6, bytes_floor * 1e3,
                    replayed ? "graph-node" : "launch", launch_floor * 1e3, (bytes_floor + launch_floor) * 1e3,
                    t / (bytes_floor + launch_floor));
        if (graphs) {
            t_gpu = t;
            stream_bytes_per_token = g->disk_bytes_per_token;
            stream_prefill_tps = g->prefill_tps;
        }
    }
    if (streaming && t_gpu > 0) {
        // The ceiling: the disk's rate for the bytes a step read, or the rate with every expert
        // resident (measured here when the card holds them all), whichever is lower.
        s.print_streaming_stats();
        // The disk's own bandwidth, measured after the decode so that nothing it reads here (a
        // host-side cache of a virtual disk) can speed the decode up; the ceiling is then the
        // conservative one.
        const double raw = raw_disk_bandwidth(*s.files, c, uint64_t(1) << 30);
        std::printf("raw O_DIRECT read bandwidth of the file (1 GiB, same depth and chunk): %.2f GB/s\n", raw / 1e9);
        double resident_tps = 0;
        {
            moestream_config all = c;
            all.cache.device_cache_gib = 1e6;  // clamped to every expert
            auto res = open_model_session(all, false, true);
            if (!res) {
                std::printf("resident rate not measured (%s): the ceiling is the disk's alone\n", res.message().c_str());
            } else {
                cuda::set_graphs(*(*res)->compute, true);
                auto r = decode_on(**res, *(*res)->slots, prompt_len, n);
                if (!r) return fail(name, r.message());
                resident_tps = 1.0 / median(r->token_s);
            }
        }
        print_disk_ceiling("graphs, median step", 1.0 / t_gpu, raw, stream_bytes_per_token, resident_tps);
    }
    if (!compare) return 0;  // --no-remap: the engine's figures alone (rounds of an A/B)
    if (streaming && t_gpu > 0) {
        c.io.mode = io_mode::remap_sync;
        drop_page_cache(s.files->target);
        auto remap = open_model_session(c, false, true);
        if (!remap) return fail(name, remap.message());
        auto r = decode_on(**remap, *(*remap)->slots, prompt_len, std::min<int64_t>(n, 16), false, true);
        if (!r) return fail(name, r.message());
        std::printf("GPU, --io-mode remap-sync (the published port's per-layer blocking reads): decode %.3f ms/token "
                    "(median of %zu; the page cache dropped before each step): the engine is %.2fx faster\n",
                    median(r->token_s) * 1e3, r->token_s.size(), median(r->token_s) / t_gpu);
        // Time to first token on new content: the pass's first prompt, its tiers empty but for
        // the 64-token warm-up forward before it.
        std::printf("GPU, new content: the %lld-token prompt's prefill (time to first token) %.3f s, remap-sync "
                    "%.3f s: %.2fx\n",
                    static_cast<long long>(prompt_len), double(prompt_len) / stream_prefill_tps,
                    double(prompt_len) / r->prefill_tps, r->prefill_tps > 0 ? stream_prefill_tps / r->prefill_tps : 0.0);
        (*remap)->print_streaming_stats();
    }
    // Where a step's device time goes: stream launches with an event after every op (16 steps).
    {
        cuda::set_graphs(gpu, false);
        auto p = decode_on(s, *s.slots, prompt_len, std::min<int64_t>(n, 16), true);
        cuda::set_graphs(gpu, true);
        if (!p) return fail(name, p.message());
        double total = 0;
        for (const auto& o : p->profile) total += o.seconds;
        const double steps = double(p->token_s.size());
        std::printf("device time of a decode step by op (stream launches, an event after each op, so an op's time "
                    "holds the gap before it; median step %.3f ms; %.3f ms of ops):\n",
                    median(p->token_s) * 1e3, total / steps * 1e3);
        for (size_t i = 0; i < p->profile.size() && i < 16; ++i) {
            const auto& o = p->profile[i];
            std::printf("  %-24s %6.1f a step %9.1f us %5.1f%%\n", o.op.c_str(), double(o.count) / steps,
                        o.seconds / steps * 1e6, 100.0 * o.seconds / total);
        }
        double prefill_total = 0;
        for (const auto& o : p->prefill_profile) prefill_total += o.seconds;
        std::printf("device time of the %lld-token prefill by op (stream launches, an event after each op; %.3f s, "
                    "%.3f s of ops):\n",
                    static_cast<long long>(prompt_len), p->prefill_profiled_s, prefill_total);
        for (size_t i = 0; i < p->prefill_profile.size() && i < 12; ++i) {
            const auto& o = p->prefill_profile[i];
            std::printf("  %-24s %8llu %10.1f ms %5.1f%%\n", o.op.c_str(), static_cast<unsigned long long>(o.count),
                        o.seconds * 1e3, 100.0 * o.seconds / prefill_total);
        }
    }
    // The CPU backend on the same prompt, for the ratio.
    c.runtime.backend = "cpu";
    auto cpu_session = open_model_session(c, false, false);
    if (!cpu_session) return fail(name, cpu_session.message());
    auto& cs = **cpu_session;
    touch_pages(cs.files->target);
    auto cf = decode_on(cs, *cs.experts, prompt_len, std::min<int64_t>(n, 16));
    if (!cf) return fail(name, cf.message());
    const double t_cpu = median(cf->token_s);
    std::printf("CPU (%s): prefill %.0f tok/s; decode %.3f ms/token: the GPU decodes %.1fx faster\n",
                cs.compute->device_description().c_str(), cf->prefill_tps, t_cpu * 1e3, t_cpu / t_gpu);
    return 0;
}

#else

int run_gpu_decode(std::string_view name, const moestream_config&, int64_t, int64_t, bool, bool, bool) {
    return fail(name, "--backend cuda: this build has no CUDA backend (nvcc was not found when it was built)");
}

#endif

}  // namespace moestream::tools
