// moestream bench decode: streaming decode speed on new content (cold tiers) and on repeated
// content (warm tiers), the stall split, the ceiling min(raw disk bandwidth / disk bytes per
// token, resident rate) measured in the same run, the published routing statistics (new experts
// per token, working set, device-tier hit rate), and the same cold run in --io-mode remap-sync.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include "scheduler/model_gguf.h"
#include "tools/bench_disk.h"
#include "tools/bench_gpu_decode.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench decode";
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Varied content: prose, code, a list of numbers, another language.
const char* const kDefaultPrompts[] = {
    "The history of the printing press begins in the fifteenth century, when movable type changed how books were made.",
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n    mid = len(items) // 2\n",
    "Die Verwaltung der Stadt hat beschlossen, den alten Bahnhof in ein Museum umzubauen, das im Herbst eroeffnet.",
};

// Sees every need() (the router's union per layer) to count new experts and the working set.
class routing_stats final : public dsv41::expert_source {
  public:
    explicit routing_stats(dsv41::expert_source& inner) : inner_(inner) {}
    void need(int layer, std::span<const int32_t> ids) override {
        for (int32_t e : ids)
            if (seen_.insert(uint64_t(layer) << 32 | uint32_t(e)).second) ++new_this_step_;
        selections_this_step_ += int64_t(ids.size());
        inner_.need(layer, ids);
    }
    result<dsv41::expert_weights> get(int layer, int32_t e) override { return inner_.get(layer, e); }
    void release(int layer, int32_t e) override { inner_.release(layer, e); }
    int64_t max_held() const override { return inner_.max_held(); }
    void hint(int layer, std::span<const int32_t> ids) override { inner_.hint(layer, ids); }
    // Call after each decode step.
    void end_step() {
        new_per_step_.push_back(new_this_step_);
        new_this_step_ = 0;
        selections_this_step_ = 0;
    }
    // Prefill experts count for the working set but not as new experts of a decode step.
    void end_prefill() { new_this_step_ = 0; }
    void reset() {
        seen_.clear();
        new_per_step_.clear();
        new_this_step_ = 0;
    }
    size_t working_set() const { return seen_.size(); }
    double mean_new_last(size_t k) const {
        if (new_per_step_.empty()) return 0;
        const size_t n = std::min(k, new_per_step_.size());
        double s = 0;
        for (size_t i = new_per_step_.size() - n; i < new_per_step_.size(); ++i) s += double(new_per_step_[i]);
        return s / double(n);
    }

  private:
    dsv41::expert_source& inner_;
    std::set<uint64_t> seen_;
    std::vector<int64_t> new_per_step_;
    int64_t new_this_step_ = 0, selections_this_step_ = 0;
};

// Drops the model files from the page cache (cold disk for buffered readers), then pages the
// dense tensors back in: the benchmark is about experts, not about faulting in attention weights.
void make_cold(const loaded_model& m) {
    for (const auto& s : m.stamps) {
        const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            ::close(fd);
        }
    }
    touch_pages(m.target, [](const gguf::tensor_info& t) {
        return t.n_dims != 3 && t.name.find("engram_embd") == std::string::npos;  // dense weights only
    });
}

struct phase_result {
    double ttft = 0, decode_tps = 0, decode_s = 0, wait_s = 0, engram_wait_s = 0, copy_s = 0;
    uint64_t disk_bytes = 0, demands = 0, device_hits = 0, steps = 0;
    double new_per_token = 0, mean_in_flight = 0;
    size_t working_set = 0;
};

result<phase_result> run_phase(model_session& s, routing_stats& rs, std::span<const int32_t> prompt, int64_t n,
                               bool cold) {
    if (cold) make_cold(*s.files);
    const auto before = s.streamed->counters();
    const auto eng_before = s.engram ? s.engram->counters() : engram_counters{};
    rs.reset();
    auto seq = s.new_sequence(int64_t(prompt.size()) + n + 1);
    std::vector<float> logits;
    phase_result r;
    auto t0 = clock_type::now();
    dsv41::forward_item item{seq.get(), prompt, false};
    MS_TRY(s.model->forward({&item, 1}, logits));
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.ttft = since(t0);
    rs.end_prefill();  // the prompt's experts are not "new per token"
    t0 = clock_type::now();
    for (int64_t k = 0; k < n; ++k) {
        dsv41::forward_item step{seq.get(), {&next, 1}, false};
        MS_TRY(s.model->forward({&step, 1}, logits));
        next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        rs.end_step();
    }
    r.decode_s = since(t0);
    r.steps = uint64_t(n);
    r.decode_tps = double(n) / r.decode_s;
    const auto after = s.streamed->counters();
    r.wait_s = after.wait_seconds - before.wait_seconds;
    r.copy_s = after.copy_seconds - before.copy_seconds;
    r.disk_bytes = after.disk_bytes - before.disk_bytes;
    r.demands = after.demands - before.demands;
    r.device_hits = after.device_hits - before.device_hits;
    if (s.engram) r.engram_wait_s = s.engram->counters().wait_seconds - eng_before.wait_seconds;
    r.new_per_token = rs.mean_new_last(16);
    r.working_set = rs.working_set();
    r.mean_in_flight = s.streamed->io_stats().time_mean_in_flight;
    return r;
}

void print_phase(const char* what, const phase_result& r, const dsv41::hparams& hp, int64_t prompt_tokens) {
    const double total_experts = double(hp.n_layers) * hp.n_experts;
    const double total = std::max(1e-9, r.decode_s + r.ttft);
    std::printf("  %-9s TTFT %.3f s (%lld prompt tokens) | decode %.2f tok/s | time: %.1f%% compute, %.1f%% waiting on "
                "experts, %.1f%% on engram rows, %.1f%% host->device copies | disk %.1f MB/token | device-tier hit rate %.0f%% | new experts/token %.1f "
                "(last 16) | working set %.0f%% of experts | %.1f reads in flight (mean)\n",
                what, r.ttft, static_cast<long long>(prompt_tokens), r.decode_tps,
                100.0 * std::max(0.0, total - r.wait_s - r.engram_wait_s - r.copy_s) / total, 100.0 * r.wait_s / total,
                100.0 * r.engram_wait_s / total, 100.0 * r.copy_s / total,
                double(r.disk_bytes) / 1e6 / double(std::max<uint64_t>(1, r.steps)),
                100.0 * double(r.device_hits) / double(std::max<uint64_t>(1, r.demands)), r.new_per_token,
                100.0 * double(r.working_set) / total_experts, r.mean_in_flight);
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    auto n = a.get_int("n-predict", 32);
    if (!n) return usage_error(kName, n.message());
    if (*n < 1) return usage_error(kName, "-n must be >= 1");
    // On the GPU: experts in VRAM slots, against the floor (streaming: the disk's ceiling), the
    // remap-sync baseline and the CPU unless --no-remap (tools/bench_gpu_decode.cpp).
    if (cfg->runtime.backend == "cuda") {
        auto p = a.get_int("prompt-tokens", 2048);
        if (!p) return usage_error(kName, p.message());
        if (*p < 1) return usage_error(kName, "--prompt-tokens must be >= 1");
        const std::string graphs = a.get_or("graphs", "both");
        if (graphs != "both" && graphs != "on" && graphs != "off")
            return usage_error(kName, "--graphs must be both, on or off (got '" + graphs + "')");
        return run_gpu_decode(kName, *cfg, *n, *p, graphs != "off", graphs != "on", !a.flag("no-remap"));
    }
    cfg->runtime.backend = "cpu";  // the tiers below are the CPU backend's
    std::vector<std::string> prompts;
    if (a.has("prompts")) {
        std::ifstream in(a.get_or("prompts", ""));
        if (!in) return fail(kName, "cannot read " + a.get_or("prompts", ""));
        for (std::string line; std::getline(in, line);)
            if (!line.empty()) prompts.push_back(line);
        if (prompts.empty()) return usage_error(kName, "--prompts has no non-empty line");
    } else {
        prompts.assign(std::begin(kDefaultPrompts), std::end(kDefaultPrompts));
    }
    auto tok = load_tokenizer(cfg->model.path);
    if (!tok) return fail(kName, tok.message());
    const bool compare = !a.flag("no-remap");
    // An auto host tier is sized when each pass opens the model (its slots are in the pass's
    // tier line), so the header states the rule, not a number.
    char host[96];
    if (cfg->cache.host_cache_gib == cache_settings::k_auto)
        std::snprintf(host, sizeof host, "auto (%.2f of the available memory, at most every expert)",
                      cfg->cache.host_cache_share);
    else
        std::snprintf(host, sizeof host, "%.2f GiB", cfg->cache.host_cache_gib);
    std::printf("bench decode: %s | device cache %.2f GiB, host cache %s | io depth %lld, chunk %lld KiB | %lld "
                "tokens per prompt, greedy\n",
                cfg->model.path.c_str(), cfg->cache.device_cache_gib, host,
                static_cast<long long>(cfg->io.depth), static_cast<long long>(cfg->io.chunk_kib), static_cast<long long>(*n));
    double coroutine_cold_tps = 0;
    // Passes: coroutine with look-ahead (the engine), coroutine without it, remap-sync baseline.
    const int passes = compare ? 3 : 1;
    for (int pass = 0; pass < passes; ++pass) {
        moestream_config c = *cfg;
        c.io.mode = pass == 2 ? io_mode::remap_sync : io_mode::coroutine;
        auto session = open_model_session(c, false, true);
        if (!session) return fail(kName, session.message());
        auto& s = **session;
        // The same model, its experts seen through the routing statistics.
        routing_stats rs(*s.streamed);
        auto mo = s.model->options();
        mo.lookahead = pass == 0 && c.io.lookahead_layers > 0;
        s.model = std::make_unique<dsv41::model>(s.hp(), s.files->weights, nullptr, rs, *s.compute, mo);
        std::printf("io mode %s (%u device slots, %u host slots):\n",
                    pass == 0 ? "coroutine + look-ahead" : pass == 1 ? "coroutine, no look-ahead" : "remap-sync",
                    s.device_slot_count(), s.streamed->host_slots());
        double cold_tps = 0, warm_tps = 0, bytes_per_token = 0;
        for (const auto& p : prompts) {
            auto ids = tok->encode(p, false);
            if (tok->data().add_bos) ids.insert(ids.begin(), tok->data().bos_id);
            auto cold = run_phase(s, rs, ids, *n, true);
            if (!cold) return fail(kName, cold.message());
            auto warm = run_phase(s, rs, ids, *n, false);
            if (!warm) return fail(kName, warm.message());
            std::printf(" prompt \"%.40s...\"\n", p.c_str());
            print_phase("new", *cold, s.hp(), int64_t(ids.size()));
            print_phase("repeated", *warm, s.hp(), int64_t(ids.size()));
            cold_tps += cold->decode_tps / double(prompts.size());
            warm_tps += warm->decode_tps / double(prompts.size());
            bytes_per_token += double(cold->disk_bytes) / double(cold->steps) / double(prompts.size());
        }
        if (pass == 0) {
            // The disk's own bandwidth, measured after the decode (as bench_gpu_decode does) so
            // that nothing it reads (a host-side cache of a virtual disk) can speed the decode up.
            const double raw = raw_disk_bandwidth(*s.files, c, uint64_t(1) << 30);
            std::printf("raw O_DIRECT read bandwidth of the file (1 GiB, same depth and chunk): %.2f GB/s\n", raw / 1e9);
            // The CPU's "resident" rate is the warm tiers' (repeated content).
            print_disk_ceiling("mean over the prompts", cold_tps, raw, bytes_per_token, warm_tps);
            s.print_streaming_stats();
            coroutine_cold_tps = cold_tps;
        } else if (pass == 1) {
            std::printf("without look-ahead, new content: %.2f tok/s; look-ahead gains %.2fx\n", cold_tps,
                        coroutine_cold_tps / cold_tps);
            s.print_streaming_stats();
        } else {
            std::printf("remap-sync new content: %.2f tok/s; coroutine / remap-sync = %.2fx (target >= 1.5x where disk "
                        "time dominates)\n",
                        cold_tps, coroutine_cold_tps / cold_tps);
        }
    }
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file (with its tokenizer)"},
        {"prompts", "FILE", "one prompt per line (default: three built-in prompts of different content)"},
        {"n-predict", "N", "tokens generated per prompt (default 32)", 'n'},
        {"no-remap", "", "skip the comparison runs (without look-ahead, --io-mode remap-sync; --backend cuda: "
                         "remap-sync, the per-op profile and the CPU backend)"},
        {"prompt-tokens", "N", "--backend cuda: the prefill prompt's length (default 2048)"},
        {"graphs", "both|on|off", "--backend cuda: decode with steps as CUDA graphs, with stream launches, or both "
                                  "(default both; off alone suits a profiler that times kernels one by one)"},
    });
    return specs;
}

const command kCommand{kName,
                       "--model FILE.gguf [--device-cache GiB] [--host-cache GiB] [--prompts FILE] [-n N] [--no-remap]",
                       "Streaming decode on new content (cold tiers, page cache dropped) and repeated content (warm "
                       "tiers): TTFT, tok/s, stall split, disk bytes per token, device-tier hit rate, new experts per "
                       "token and working set; the ceiling min(raw disk bandwidth / disk bytes per token, resident "
                       "rate) measured in the same run, and the same cold run with --io-mode remap-sync. With "
                       "--backend cuda: decode with the experts in VRAM slots against the bytes/D2D + launch floor "
                       "measured in the same run, prefill of a --prompt-tokens prompt, launches per token, and the "
                       "CPU backend beside it.",
                       options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
