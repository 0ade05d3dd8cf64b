#include "tools/model_session.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "storage/system_memory.h"

#if MOESTREAM_HAVE_CUDA
#include "model/cuda/cuda_backend.h"
#endif

namespace moestream::tools {

std::unique_ptr<dsv41::sequence_state> model_session::new_sequence(int64_t tokens, int64_t rollback) const {
    return model->new_sequence(std::max<int64_t>(tokens, 1), rollback);
}

spec::tally_probe model_session::tally_probe() const {
    if (!streamed) return {};
    const tiered_experts* t = streamed.get();
    return [t](std::span<spec::layer_tally> out) { return t->layer_tallies(out); };
}

void model_session::print_streaming_stats() const {
    if (!streamed) return;
    const auto k = streamed->counters();
    const auto io = streamed->io_stats();
    std::fprintf(stderr,
                 "experts: %llu demands, %llu device hits, %llu host hits, %llu joined in flight, %llu read from disk "
                 "(%.1f MB, %.2f GB/s while busy, %.1f reads in flight on average, max %u), %.3f s waited; tiers: "
                 "%u device slots, %u host slots, %u draft slots (%llu hits); look-ahead: %llu reads, %llu used%s%s\n",
                 static_cast<unsigned long long>(k.demands), static_cast<unsigned long long>(k.device_hits),
                 static_cast<unsigned long long>(k.host_hits), static_cast<unsigned long long>(k.joins),
                 static_cast<unsigned long long>(k.disk_reads), double(k.disk_bytes) / 1e6, io.bandwidth() / 1e9,
                 io.time_mean_in_flight, io.max_in_flight, k.wait_seconds, device_slot_count(),
                 streamed->host_slots(), streamed->draft_slots(), static_cast<unsigned long long>(k.draft_hits),
                 static_cast<unsigned long long>(k.hint_reads),
                 static_cast<unsigned long long>(k.hint_used), streamed->notes().empty() ? "" : "; ",
                 streamed->notes().c_str());
    std::fprintf(stderr,
                 "host->device copies: %.3f s on the compute thread, %.3f s on the copy thread (%llu experts "
                 "promoted ahead of their use)\n",
                 k.copy_seconds, k.async_copy_seconds, static_cast<unsigned long long>(k.async_promotions));
    // The host latency of a read completion's hop from the reaper's callback to the tiers'
    // strand (it includes waiting behind the strand's other handlers).
    std::fprintf(stderr, "read completions: %llu posted to the strand, %.1f us each from the reaper's callback\n",
                 static_cast<unsigned long long>(k.completions_posted),
                 k.completions_posted ? 1e6 * k.completion_post_seconds / double(k.completions_posted) : 0.0);
    if (slots) {
        const auto d = slots->stats();
        std::fprintf(stderr,
                     "device slots: %llu hits, %llu misses, %llu joined, %llu copies (%.1f MB, %.1f us each from issue "
                     "to completion), %llu blocking waits%s%s\n",
                     static_cast<unsigned long long>(d.hits), static_cast<unsigned long long>(d.misses),
                     static_cast<unsigned long long>(d.joined), static_cast<unsigned long long>(d.copies),
                     double(d.bytes_uploaded) / 1e6,
                     d.copies_completed ? 1e6 * d.copy_seconds / double(d.copies_completed) : 0.0,
                     static_cast<unsigned long long>(d.blocking_waits), slots->notes().empty() ? "" : "; ",
                     slots->notes().c_str());
    }
    if (engram) {
        const auto e = engram->counters();
        if (e.resident_bytes)
            std::fprintf(stderr, "engram: tables in RAM (%.1f MB, read at start-up), %llu rows looked up\n",
                         double(e.resident_bytes) / 1e6, static_cast<unsigned long long>(e.rows_requested));
        else
            std::fprintf(stderr,
                         "engram: %llu rows looked up, %llu read from disk (%.2f MB), %llu of them after the forward "
                         "reached them (%llu arena refills), %llu disk reads (coalesced), %llu waited (%.3f s)\n",
                         static_cast<unsigned long long>(e.rows_requested), static_cast<unsigned long long>(e.rows_read),
                         double(e.bytes_read) / 1e6, static_cast<unsigned long long>(e.overflow),
                         static_cast<unsigned long long>(e.refills), static_cast<unsigned long long>(e.disk_reads),
                         static_cast<unsigned long long>(e.waits), e.wait_seconds);
    }
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
    return buf;
}

// The backend --backend asks for: one clear line when it cannot be had.
result<std::unique_ptr<backend>> make_compute(const moestream_config& cfg) {
    const std::string& want = cfg.runtime.backend;
    if (want == "cuda" || want == "auto") {
#if MOESTREAM_HAVE_CUDA
        auto gpu = cuda::make_backend({});
        if (gpu) return std::move(*gpu);
        if (want == "cuda") return make_error("--backend cuda: " + gpu.message());
#else
        if (want == "cuda")
            return make_error("--backend cuda: this build has no CUDA backend (nvcc was not found when it was built)");
#endif
    }
    int threads = int(cfg.runtime.threads);
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    return std::unique_ptr<backend>(std::make_unique<cpu_backend>(threads));
}

// Dense weights in VRAM and the experts in slots, after checking that the card holds them, the
// slots and the sequence states (with room for the forward's buffers).
// The streaming tiers' budgets and reader settings from the configuration.
tier_options tiers_of(const moestream_config& cfg, uint64_t device_bytes, scheduler_thread& scheduler) {
    tier_options t;
    t.executor = scheduler.executor();
    t.device_bytes = device_bytes;
    t.host_bytes = host_tier_bytes(cfg.cache, storage::available_memory_bytes());
    t.io.depth = uint32_t(cfg.io.depth);
    t.io.chunk_bytes = uint64_t(cfg.io.chunk_kib) * 1024;
    t.remap_sync = cfg.io.mode == io_mode::remap_sync;
    t.policy = cfg.cache.policy;
    // A/B knob for the layered policy's head start, in forwards (docs/streaming.md).
    if (const char* h = std::getenv("MOESTREAM_HEAD_START"); h && *h) t.head_start_forwards = std::atof(h);
    t.draft_bytes = cfg.cache.draft_cache_gib == cache_settings::k_all ? tier_options::kDraftAll
                                                                        : uint64_t(cfg.cache.draft_cache_gib * kGiB);
    // A/B switch for measuring what keeping the first layer gains (docs/streaming.md).
    if (const char* k = std::getenv("MOESTREAM_KEEP_FIRST_LAYER"); k && std::string_view(k) == "0")
        t.keep_first_layer = false;
    return t;
}

// With `stream`, the slots are filled from a host tier read through io_uring (tiered_experts
// without a device tier of its own): the request path reads nothing through the mapping.
status place_on_device(model_session& s, const moestream_config& cfg, int64_t sequences, bool with_draft,
                       bool stream) {
    const loaded_model& m = *s.files;
    const size_t dense = dense_weight_bytes(m);
    const size_t slot = device_experts::slot_bytes(m);
    const int64_t total = m.total_experts();
    // The draft's experts get VRAM slots of their own (--draft-cache: all by default, or GiB of
    // them; 0 shares the target's slots), so drafting never evicts the target's hot experts.
    const int64_t draft_experts = with_draft && m.draft.has_value() ? total - int64_t(m.hp.n_layers) * m.hp.n_experts : 0;
    int64_t draft_slots = 0;
    if (draft_experts > 0 && cfg.cache.draft_cache_gib != 0)
        draft_slots = cfg.cache.draft_cache_gib == cache_settings::k_all
                          ? draft_experts
                          : std::clamp<int64_t>(int64_t(cfg.cache.draft_cache_gib * kGiB / double(slot)), 1, draft_experts);
    const int64_t target_total = draft_slots > 0 ? total - draft_experts : total;
    int64_t slots = std::max<int64_t>(1, int64_t(cfg.cache.device_cache_gib * kGiB / double(slot)));
    slots = std::min(slots, target_total);
    const size_t states = size_t(std::max<int64_t>(sequences, 1)) *
                          dsv41::sequence_state::memory_bytes(m.hp, cfg.runtime.context_tokens, 64,
                                                              with_draft && m.draft.has_value());
    // The forward's own buffers: a few hundred MB for the largest models' prefill chunks.
    const size_t reserve = size_t(1) << 30;
    const size_t need = dense + size_t(slots + draft_slots) * slot + states + reserve;
#if MOESTREAM_HAVE_CUDA
    if (auto info = cuda::probe(0); info && need > info->free_bytes)
        return make_error("the GPU (" + info->describe() + ", " + gib(double(info->free_bytes)) +
                          " free) cannot hold the dense weights (" + gib(double(dense)) + ") + the expert cache (" +
                          std::to_string(slots + draft_slots) + " experts" +
                          (draft_slots > 0 ? " with the draft's " + std::to_string(draft_slots) : std::string()) + ", " +
                          gib(double(size_t(slots + draft_slots) * slot)) +
                          ") + the sequence states (" + std::to_string(sequences) + " of " +
                          std::to_string(cfg.runtime.context_tokens) + " tokens, " + gib(double(states)) +
                          ") + 1 GiB of working buffers = " + gib(double(need)) +
                          ": lower --device-cache, --ctx-size or runtime.sequences_max");
#endif
    auto dev = upload_dense_weights(*s.compute, m);
    if (!dev) return dev.err();
    s.device = std::move(*dev);
    if (stream) {
        tier_options t = tiers_of(cfg, 0, *s.scheduler);
        // Everything fits on the card: the host tier only stages the preload, a layer at a time.
        if (slots == target_total && (draft_slots == 0 || draft_slots == draft_experts))
            t.host_bytes = std::min<uint64_t>(t.host_bytes, uint64_t(std::max(m.hp.n_experts, m.hp.dspark_n_experts)) *
                                                                (slot + 3 * io::kReadAlign));
        auto tiers = tiered_experts::create(m, t);
        if (!tiers) return tiers.err();
        s.streamed = std::move(*tiers);
    }
    device_tier_options d;
    d.executor = s.scheduler->executor();
    if (s.streamed) d.pinned_source = s.streamed->host_region();  // uploads straight from the host slots
    device_tier_options draft_opts = d;
    if (draft_slots > 0) d.end_layer = int(m.hp.n_layers);
    auto ex = device_experts::create(*s.compute, m, slots, slots == target_total, s.streamed.get(), std::move(d));
    if (!ex) return ex.err();
    s.slots = std::move(*ex);
    if (draft_slots > 0) {
        draft_opts.first_layer = int(m.hp.n_layers);
        auto dx = device_experts::create(*s.compute, m, draft_slots, draft_slots == draft_experts, s.streamed.get(),
                                         std::move(draft_opts));
        if (!dx) return dx.err();
        s.draft_slots = std::move(*dx);
        s.split = std::make_unique<layer_split_experts>(*s.slots, *s.draft_slots, int(m.hp.n_layers));
    }
    return {};
}

}  // namespace

std::string model_session::backend_line() const {
    return std::string(compute->name()) + " (" + compute->device_description() + ")";
}

result<std::unique_ptr<model_session>> open_model_session(const moestream_config& cfg, bool with_draft, bool stream,
                                                          int64_t sequences) {
    if (cfg.model.path.empty()) return make_error("--model is required");
    auto s = std::make_unique<model_session>();
    auto compute = make_compute(cfg);
    if (!compute) return compute.err();
    s->compute = std::move(*compute);
    s->cpu = dynamic_cast<cpu_backend*>(s->compute.get());
    auto files = load_model(cfg.model.path, with_draft ? cfg.model.draft_path : std::string());
    if (!files) return files.err();
    s->files = std::move(*files);
    s->experts = std::make_unique<resident_experts>(*s->files);
    dsv41::expert_source* source = s->experts.get();
    if (!s->compute->host_memory()) {
        if (auto st = place_on_device(*s, cfg, sequences, with_draft, stream); !st) return st.err();
        source = s->split ? static_cast<dsv41::expert_source*>(s->split.get()) : s->slots.get();
    } else if (stream) {
        // The request path reads nothing through the mapping: the dense weights are copied into
        // the backend's (anonymous) memory, experts and engram rows come through the reader. A
        // model file truncated under a server then fails the requests that need the lost bytes
        // with read errors instead of a SIGBUS.
        auto dense = upload_dense_weights(*s->compute, *s->files);
        if (!dense) return dense.err();
        s->device = std::move(*dense);
        auto tiers = tiered_experts::create(*s->files, tiers_of(cfg, uint64_t(cfg.cache.device_cache_gib * kGiB), *s->scheduler));
        if (!tiers) return tiers.err();
        s->streamed = std::move(*tiers);
        source = s->streamed.get();
    }
    dsv41::model_options mo;
    // On CUDA the hints reach the host tier through the slots.
    mo.lookahead = s->streamed != nullptr && cfg.io.lookahead_layers > 0;
    mo.lookahead_layers = int(cfg.io.lookahead_layers);
    s->model = std::make_unique<dsv41::model>(s->files->hp, s->weights(), s->draft(), *source, *s->compute, mo);
    if (stream && !s->files->hp.engram_layers.empty()) {
        engram_stream_options eo;
        eo.io.depth = uint32_t(cfg.io.depth);
        auto es = engram_stream::create(*s->files, eo);
        if (!es) return es.err();
        s->engram = std::move(*es);
        auto o = s->model->options();
        o.engram = s->engram.get();
        s->model->set_options(o);
    }
    return s;
}

void check_options::apply(model_session& s, dsv41::tensor_observer* observer) {
    auto o = s.model->options();
    o.ref_compat = ref_compat;
    o.hook = picks ? &*picks : nullptr;
    o.observer = observer;
    o.act_quant = act_quant;
    s.model->set_options(o);
}

std::string check_options::summary() const {
    std::string out;
    if (picks) out += ", picks forced";
    if (ref_compat) out += ", reference quirks on";
    if (act_quant) out += ", reference activation rounding";
    return out;
}

void check_options::print_unmatched() const {
    if (picks && picks->unmatched() > 0)
        std::printf("note: %lld selections had no recorded picks and were computed\n",
                    static_cast<long long>(picks->unmatched()));
}

std::variant<check_options, check_options_error> read_check_options(const cli::args& a, const dsv41::hparams& hp,
                                                                    std::span<const int32_t> tokens) {
    check_options c;
    c.ref_compat = a.flag("ref-compat");
    const std::string act = a.get_or("act-quant", "off");
    if (act != "off" && act != "reference")
        return check_options_error{true, std::string("--act-quant must be 'off' or 'reference', got '") + act + "'"};
    c.act_quant = act == "reference";
    if (a.has("force-picks")) {
        c.picks_path = a.get_or("force-picks", "");
        auto p = recorded_picks::load(c.picks_path, hp);
        if (!p) return check_options_error{false, p.message()};
        if (!std::equal(p->input_ids().begin(), p->input_ids().end(), tokens.begin(), tokens.end()))
            return check_options_error{false, std::string("--force-picks records a prompt of ") +
                                                  std::to_string(p->input_ids().size()) +
                                                  " tokens that differs from --tokens: the recorded picks only "
                                                  "apply to their own prompt"};
        c.picks = std::move(*p);
    }
    return c;
}

std::vector<cli::option_spec> with_check_options(std::initializer_list<cli::option_spec> specs) {
    auto out = with_config_options(specs);
    const cli::option_spec checks[] = {
        {"force-picks", "PROMPT.safetensors", "use a fixture's recorded router/indexer/candidate picks"},
        {"ref-compat", "", "reproduce the reference's decode quirk (stale ratio-2 index keys, §3.4.6)"},
        {"act-quant", "MODE", "off (default) or reference: simulate the reference's fp8/fp4 activation round trips (§3.8)"},
    };
    out.insert(out.begin() + std::ptrdiff_t(specs.size()), std::begin(checks), std::end(checks));
    return out;
}

void touch_pages(const gguf::model_file& f, bool (*keep)(const gguf::tensor_info&)) {
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
        if (keep && !keep(t)) continue;
        const auto d = f.data(t);
        ::madvise(const_cast<std::byte*>(d.data()) - (reinterpret_cast<uintptr_t>(d.data()) & 4095), d.size() + 4096,
                  MADV_WILLNEED);
        for (size_t i = 0; i < d.size(); i += 4096) sink = sink + uint8_t(d[i]);
    }
    (void)sink;
}

result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string_view::npos) j = text.size();
        auto v = cli::parse_int(text.substr(i, j - i), flag);
        if (!v || *v < 0 || *v > INT32_MAX)
            return make_error("--" + std::string(flag) + ": '" + std::string(text.substr(i, j - i)) +
                              "' is not a token id (expected comma-separated non-negative integers)");
        out.push_back(int32_t(*v));
        i = j + 1;
    }
    return out;
}

}  // namespace moestream::tools
