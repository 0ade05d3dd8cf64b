// `moestream serve`: the HTTP/WebSocket server (server/) over the generation engine
// (scheduler/engine.h) with the experts streamed through the tiers. The port is bound before the
// model is opened, so /health answers 503 "Loading model" meanwhile.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <spdlog/spdlog.h>

#include "model/tokenizer.h"
#include "scheduler/engine.h"
#include "scheduler/model_gguf.h"
#include "server/http_server.h"
#include "server/service.h"
#include "spec/draft_policy.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "serve";

result<std::chrono::seconds> seconds_option(const cli::args& a, std::string_view name, int64_t fallback) {
    auto v = a.get_int(name, fallback);
    if (!v) return v.err();
    if (*v < 1) return make_error("--" + std::string(name) + " must be >= 1 second");
    return std::chrono::seconds(*v);
}

// The engine's speculation from the effective settings: auto is dspark when a draft head is
// given, else none; k auto lets the policy choose each step's length, up to 5.
result<speculation_options> speculation_of(const moestream_config& cfg) {
    speculation_options o;
    const auto& s = cfg.speculative;
    o.drafter = s.drafter == "auto" ? (cfg.model.draft_path.empty() ? "none" : "dspark") : s.drafter;
    if (o.drafter == "dspark" && cfg.model.draft_path.empty())
        return make_error("--drafter dspark needs the draft head: --draft FILE.gguf");
    o.adaptive = s.k == spec_settings::k_auto;
    o.k = o.adaptive ? spec::draft_policy::kMaxK : int(s.k);
    if (o.drafter == "none") o.k = 0;
    return o;
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    if (!a.positional().empty()) return usage_error(kName, "unexpected argument '" + a.positional()[0] + "'");
    if (cfg->model.path.empty()) return usage_error(kName, "missing required option --model");
    if (auto st = apply_spec_flags(a, cfg->speculative); !st) return usage_error(kName, st.message());
    auto spec_opts = speculation_of(*cfg);
    if (!spec_opts) return usage_error(kName, spec_opts.message());

    server::http_options http;
    http.host = cfg->server.host;
    http.port = uint16_t(cfg->server.port);
    http.api_keys = cfg->server.api_keys;
    http.cors_origins = cfg->server.cors_origins;
    for (const auto& o : a.values("cors-origin")) http.cors_origins.push_back(o);
    http.body_bytes_max = size_t(cfg->server.body_bytes_max);
    http.request_timeout = std::chrono::seconds(cfg->server.request_timeout_s);
    auto drain = seconds_option(a, "drain", 5);
    if (!drain) return usage_error(kName, drain.message());
    http.drain = *drain;
    auto idle = seconds_option(a, "idle-timeout", 120);
    if (!idle) return usage_error(kName, idle.message());
    http.idle_timeout = *idle;
    http.header_timeout = std::min(http.header_timeout, *idle);
    auto io_threads = a.get_int("http-threads", 2);
    if (!io_threads) return usage_error(kName, io_threads.message());
    if (*io_threads < 1 || *io_threads > 64) return usage_error(kName, "--http-threads must be between 1 and 64");
    http.io_threads = int(*io_threads);

    server::service_limits limits;
    limits.request_timeout = http.request_timeout;
    limits.response_store_max = size_t(cfg->server.response_store_max);
    server::service api(limits);
    server::http_server srv(http, api);
    auto port = srv.listen();
    if (!port) return fail(kName, port.message());
    srv.handle_signals();
    // Scripts wait for this line (it carries the port when --port 0 picked one).
    std::printf("moestream serve: listening on http://%s:%u (loading %s)\n", http.host.c_str(), unsigned(*port),
                cfg->model.path.c_str());
    std::fflush(stdout);

    // The sequence states the engine keeps: the running ones and up to 4 finished ones for reuse.
    // The draft head is loaded only for the dspark drafter (its rings cost every forward).
    auto session = open_model_session(*cfg, spec_opts->drafter == "dspark", true, cfg->runtime.sequences_max + 4);
    if (!session) {
        srv.shutdown();
        srv.wait();
        return fail(kName, session.message());
    }
    auto& s = **session;
    std::optional<tokenizer> tok;
    if (s.files->target.find("tokenizer.ggml.tokens") != nullptr) {
        auto data = read_tokenizer_data(s.files->target);
        if (!data) return fail(kName, data.message());
        auto t = tokenizer::create(*data);
        if (!t) return fail(kName, cfg->model.path + ": " + t.message());
        tok.emplace(std::move(*t));
    }
    engine_options eo;
    eo.executor = s.scheduler->executor();  // the step loop beside the tiers' strands
    eo.max_sequences = cfg->runtime.sequences_max;
    eo.max_waiting = cfg->server.wait_queue_max;
    eo.context_tokens = cfg->runtime.context_tokens;
    if (s.streamed) {
        const tiered_experts* tiers = s.streamed.get();
        const engram_stream* engram = s.engram.get();
        // Read on the step loop's strand, on the scheduler's thread: nothing there may wait for
        // the tiers' strand (counters() would), so the tiers' published totals.
        eo.waits = [tiers, engram] {
            forward_waits w;
            const auto c = tiers->wait_totals();
            w.experts_s = c.wait_seconds;
            w.copy_s = c.copy_seconds;
            if (engram) w.engram_s = engram->counters().wait_seconds;
            return w;
        };
    }
    eo.spec = *spec_opts;
    eo.spec.tallies = s.tally_probe();
    if (auto st = validate(eo.spec, *s.model); !st) {
        srv.shutdown();
        srv.wait();
        return fail(kName, st.message());
    }
    engine eng(*s.model, eo);

    server::served_model m;
    m.eng = &eng;
    m.tok = tok ? &*tok : nullptr;
    m.name = a.get_or("alias", std::filesystem::path(cfg->model.path).stem().string());
    m.path = cfg->model.path;
    m.n_ctx = cfg->runtime.context_tokens;
    m.n_ctx_train = s.hp().max_position;
    m.n_vocab = s.hp().vocab;
    for (const auto& t : s.files->target.tensors()) m.n_params += t.elements();
    for (size_t i = 0; i < s.files->target.shard_count(); ++i)
        m.size_bytes += int64_t(s.files->target.shard_size(uint32_t(i)));
    m.slots = cfg->runtime.sequences_max;
    m.eos_id = tok ? tok->data().eos_id : -1;
    m.spec_n_max = eo.spec.drafter == "none" ? 0 : eo.spec.k;
    m.backend = s.compute->name();
    m.device = s.compute->device_description();
    if (s.streamed) {
        const tiered_experts* tiers = s.streamed.get();
        const engram_stream* engram = s.engram.get();
        m.streaming = [tiers, engram] { return server::streaming_figures_of(*tiers, engram); };
    }
    api.set_model(std::move(m));
    spdlog::info("serving {} ({} sequences of {} tokens) on {}", cfg->model.path, cfg->runtime.sequences_max,
                 cfg->runtime.context_tokens, s.backend_line());
    if (m.spec_n_max > 0)
        spdlog::info("speculative decoding: drafter {}, k {}", eo.spec.drafter,
                     eo.spec.adaptive ? "auto (up to " + std::to_string(eo.spec.k) + ")" : std::to_string(eo.spec.k));
    if (s.streamed)
        spdlog::info("expert tiers: {} device slots, {} host slots{}", s.device_slot_count(),
                     s.streamed->host_slots(),
                     cfg->cache.host_cache_gib == cache_settings::k_auto
                         ? " (host tier auto: " + std::to_string(int(cfg->cache.host_cache_share * 100)) +
                               "% of the memory available at start-up, at most every expert)"
                         : std::string());
    std::printf("moestream serve: ready (backend %s)\n", s.backend_line().c_str());
    std::fflush(stdout);
    srv.wait();
    std::printf("moestream serve: stopped\n");
    return 0;
}

std::span<const cli::option_spec> options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"host", "ADDR", "address to bind (default 127.0.0.1)"},
        {"port", "N", "TCP port (default 8080; 0 picks a free one, printed at start)"},
        {"api-key", "KEY", "require this key (Authorization: Bearer KEY or X-Api-Key) on every route but /health; "
                           "repeat for several"},
        {"cors-origin", "ORIGIN", "allow browser requests from ORIGIN (\"*\": any); repeat for several"},
        {"alias", "NAME", "model name reported to clients (default: the file name)"},
        {"drain", "S", "on SIGTERM, let running requests finish for S seconds before cancelling them (default 5)"},
        {"idle-timeout", "S", "close keep-alive connections idle for S seconds (default 120)"},
        {"http-threads", "N", "I/O threads of the HTTP server (default 2)"},
        {"draft", "FILE.gguf", "DSpark draft head (dflash): speculative decoding with it, unless --drafter says otherwise"},
        {"drafter", "NAME", "speculative decoding: dspark (the --draft head; the default with --draft), ngram (prompt "
                            "lookup) or none (the default without --draft); requests opt out with "
                            "\"speculative.n_max\": 0"},
        {"spec-k", "K", "tokens drafted a step: auto (the default: chosen per step from measured acceptance and step "
                        "times, up to 5) or 0..5"},
    });
    return specs;
}

const command kCommand{
    kName,
    "--model FILE.gguf [--config FILE.json] [--host ADDR] [--port N] [--api-key KEY]... [--cors-origin O]... "
    "[--draft FILE.gguf] [--drafter dspark|ngram|none] [--spec-k auto|K]",
    "Serves the model over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/models), llama-server "
    "(/completion, /infill, /tokenize, /detokenize, /props, /slots), /health, /metrics (Prometheus), and the "
    "multiplexed WebSocket token stream /v1/ws. Requests are batched continuously (runtime.sequences_max); a full "
    "wait queue (server.wait_queue_max) answers 429. Speculative decoding (--draft, --drafter) verifies drafted tokens "
    "in the same batched forwards, with the same output. SIGTERM/SIGINT stop gracefully. See docs/api.md.",
    options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
