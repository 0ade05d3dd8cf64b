#include "tools/model_session.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <thread>

namespace moestream::tools {

std::unique_ptr<dsv41::sequence_state> model_session::new_sequence(int64_t tokens, int64_t rollback) const {
    return model->new_sequence(std::max<int64_t>(tokens, 1), rollback);
}

void model_session::print_streaming_stats() const {
    if (!streamed) return;
    const auto k = streamed->counters();
    const auto io = streamed->io_stats();
    std::fprintf(stderr,
                 "experts: %llu demands, %llu device hits, %llu host hits, %llu joined in flight, %llu read from disk "
                 "(%.1f MB, %.2f GB/s while busy, %.1f reads in flight on average, max %u), %.3f s waited; tiers: "
                 "%u device slots, %u host slots; look-ahead: %llu reads, %llu used%s%s\n",
                 static_cast<unsigned long long>(k.demands), static_cast<unsigned long long>(k.device_hits),
                 static_cast<unsigned long long>(k.host_hits), static_cast<unsigned long long>(k.joins),
                 static_cast<unsigned long long>(k.disk_reads), double(k.disk_bytes) / 1e6, io.bandwidth() / 1e9,
                 io.time_mean_in_flight, io.max_in_flight, k.wait_seconds, streamed->device_slots(),
                 streamed->host_slots(), static_cast<unsigned long long>(k.hint_reads),
                 static_cast<unsigned long long>(k.hint_used), streamed->notes().empty() ? "" : "; ",
                 streamed->notes().c_str());
    std::fprintf(stderr,
                 "host->device copies: %.3f s on the compute thread, %.3f s on the copy thread (%llu experts "
                 "promoted ahead of their use)\n",
                 k.copy_seconds, k.async_copy_seconds, static_cast<unsigned long long>(k.async_promotions));
    if (engram) {
        const auto e = engram->counters();
        std::fprintf(stderr,
                     "engram: %llu rows looked up, %llu read ahead from disk (%.2f MB), %llu from the mapping "
                     "(arena full), %llu waited (%.3f s)\n",
                     static_cast<unsigned long long>(e.rows_requested), static_cast<unsigned long long>(e.rows_read),
                     double(e.bytes_read) / 1e6, static_cast<unsigned long long>(e.overflow),
                     static_cast<unsigned long long>(e.waits), e.wait_seconds);
    }
}

result<std::unique_ptr<model_session>> open_model_session(const moestream_config& cfg, bool with_draft, bool stream) {
    if (cfg.model.path.empty()) return make_error("--model is required");
    if (cfg.runtime.backend == "cuda") return make_error("the CUDA backend is not built yet: use --backend cpu");
    auto s = std::make_unique<model_session>();
    auto files = load_model(cfg.model.path, with_draft ? cfg.model.draft_path : std::string());
    if (!files) return files.err();
    s->files = std::move(*files);
    int threads = int(cfg.runtime.threads);
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    s->backend = std::make_unique<cpu_backend>(threads);
    s->experts = std::make_unique<resident_experts>(*s->files);
    dsv41::expert_source* source = s->experts.get();
    if (stream) {
        constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
        tier_options t;
        t.device_bytes = uint64_t(cfg.cache.device_cache_gib * kGiB);
        t.host_bytes = uint64_t(cfg.cache.host_cache_gib * kGiB);
        t.io.depth = uint32_t(cfg.io.depth);
        t.io.chunk_bytes = uint64_t(cfg.io.chunk_kib) * 1024;
        t.remap_sync = cfg.io.mode == io_mode::remap_sync;
        auto tiers = tiered_experts::create(*s->files, t);
        if (!tiers) return tiers.err();
        s->streamed = std::move(*tiers);
        source = s->streamed.get();
    }
    dsv41::model_options mo;
    mo.lookahead = stream;
    s->model = std::make_unique<dsv41::model>(s->files->hp, s->files->weights,
                                              s->files->draft ? &*s->files->draft : nullptr, *source, *s->backend, mo);
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
