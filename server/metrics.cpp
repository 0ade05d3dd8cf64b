#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "config/assert.h"
#include "scheduler/engine.h"
#include "scheduler/engram_stream.h"
#include "scheduler/tiered_experts.h"

namespace moestream::server {

namespace {

// Bucket bounds. Streaming a large MoE from disk on one GPU is slower than a resident model, so
// the latency buckets reach further (a cold prefill of a long prompt can take minutes).
std::vector<double> ttft_bounds() {
    return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600, 1800};
}
std::vector<double> itl_bounds() {
    return {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30};
}
std::vector<double> request_bounds() {
    return {0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200};
}
std::vector<double> token_bounds() {
    return {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576};
}

void add(std::atomic<double>& a, double v) { a.fetch_add(v, std::memory_order_relaxed); }

// Writes the exposition text: families with HELP and TYPE first, then their samples, each with
// model_name first.
class exposition {
  public:
    exposition(std::string& out, std::string_view model) : out_(out), model_(model) {}

    void family(std::string_view name, std::string_view type, std::string_view help) {
        out_ += "# HELP ";
        out_ += name;
        out_ += ' ';
        for (char c : help) {  // HELP escapes only backslash and newline
            if (c == '\\') out_ += "\\\\";
            else if (c == '\n') out_ += "\\n";
            else out_ += c;
        }
        out_ += "\n# TYPE ";
        out_ += name;
        out_ += ' ';
        out_ += type;
        out_ += '\n';
    }

    using label = std::pair<std::string_view, std::string_view>;
    void sample(std::string_view name, std::string_view suffix, double v, std::initializer_list<label> labels = {}) {
        begin(name, suffix, labels);
        number(v);
        out_ += '\n';
    }
    void sample(std::string_view name, std::string_view suffix, uint64_t v, std::initializer_list<label> labels = {}) {
        begin(name, suffix, labels);
        char buf[24];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);
        out_.append(buf, r.ptr);
        out_ += '\n';
    }

    void counter(std::string_view name, std::string_view help, uint64_t v) {
        family(name, "counter", help);
        sample(name, "", v);
    }
    void counter(std::string_view name, std::string_view help, double v) {
        family(name, "counter", help);
        sample(name, "", v);
    }
    void gauge(std::string_view name, std::string_view help, double v) {
        family(name, "gauge", help);
        sample(name, "", v);
    }
    void gauge(std::string_view name, std::string_view help, uint64_t v) {
        family(name, "gauge", help);
        sample(name, "", v);
    }
    void hist(std::string_view name, std::string_view help, const histogram& h) {
        family(name, "histogram", help);
        const auto s = h.read();
        std::string le;
        for (size_t i = 0; i < h.bounds().size(); ++i) {
            le.clear();
            append_number(le, h.bounds()[i]);
            sample(name, "_bucket", s.cumulative[i], {{"le", le}});
        }
        sample(name, "_bucket", s.count, {{"le", "+Inf"}});
        sample(name, "_sum", s.sum);
        sample(name, "_count", s.count);
    }

    static void append_number(std::string& out, double v) {
        if (std::isnan(v)) {
            out += "NaN";
        } else if (std::isinf(v)) {
            out += v > 0 ? "+Inf" : "-Inf";
        } else {
            char buf[32];
            const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
            out.append(buf, r.ptr);
        }
    }

  private:
    void begin(std::string_view name, std::string_view suffix, std::initializer_list<label> labels) {
        out_ += name;
        out_ += suffix;
        out_ += "{model_name=\"";
        escape(model_);
        out_ += '"';
        for (const auto& [k, v] : labels) {
            out_ += ',';
            out_ += k;
            out_ += "=\"";
            escape(v);
            out_ += '"';
        }
        out_ += "} ";
    }
    void number(double v) { append_number(out_, v); }
    // Label values escape backslash, double quote and newline.
    void escape(std::string_view v) {
        for (char c : v) {
            if (c == '\\') out_ += "\\\\";
            else if (c == '"') out_ += "\\\"";
            else if (c == '\n') out_ += "\\n";
            else out_ += c;
        }
    }

    std::string& out_;
    std::string_view model_;
};

constexpr std::array<std::string_view, 4> kReasons = {"stop", "length", "abort", "error"};

// Speculative decoding, under llama-server's names and ours, and the union of a step's experts.
void render_speculation(exposition& x, const engine_stats& e) {
    static constexpr std::string_view kPrefixes[] = {"llamacpp:", "moestream:"};
    const std::string positions[] = {"1", "2", "3", "4", "5"};
    for (std::string_view prefix : kPrefixes) {
        const std::string p(prefix);
        x.counter(p + "spec_decode_num_drafts_total", "Speculative drafts verified (a sequence's drafted tokens of one step).",
                  e.spec_drafts);
        x.counter(p + "spec_decode_num_draft_tokens_total", "Tokens drafted by speculative decoding.", e.spec_draft_tokens);
        x.counter(p + "spec_decode_num_accepted_tokens_total", "Drafted tokens the target model accepted.",
                  e.spec_accepted_tokens);
        const std::string per_pos = p + "spec_decode_num_accepted_tokens_per_pos_total";
        x.family(per_pos, "counter", "Accepted drafted tokens by their position in the draft (1 = first).");
        for (size_t i = 0; i < e.spec_accepted_by_position.size(); ++i)
            x.sample(per_pos, "", e.spec_accepted_by_position[i], {{"position", positions[i]}});
    }
    x.counter("moestream:spec_verification_steps_total", "Engine steps that verified drafted tokens.", e.spec_steps);
    x.counter("moestream:spec_draft_failures_total", "Drafts that could not be made (decoding went on without them).",
              e.spec_failures);
    // The union a step loads: over the steps of each kind whose routing the host saw.
    static constexpr std::string_view kKinds[] = {"prefill", "verify", "decode"};
    x.family("moestream:step_experts_total", "counter",
             "Distinct routed experts of a step's rows, summed over the MoE layers and the steps counted "
             "(by kind: with prompt rows, verifying drafts, other decode steps); divide by step_experts_steps_total.");
    for (size_t k = 0; k < 3; ++k) x.sample("moestream:step_experts_total", "", e.step_experts[k], {{"kind", kKinds[k]}});
    x.family("moestream:step_experts_steps_total", "counter",
             "Steps counted in step_experts_total (those whose routing the host saw), by kind.");
    for (size_t k = 0; k < 3; ++k)
        x.sample("moestream:step_experts_steps_total", "", e.step_experts_steps[k], {{"kind", kKinds[k]}});
    // Where those experts were (the speculation policy's records: steps without prompt rows).
    x.family("moestream:step_experts_not_resident_total", "counter",
             "Routed experts of a step that were in no tier when announced (read from disk or joined in flight), "
             "summed over the steps of step_residency_steps_total, by kind.");
    for (size_t k = 1; k < 3; ++k)
        x.sample("moestream:step_experts_not_resident_total", "", e.step_not_resident[k], {{"kind", kKinds[k]}});
    x.family("moestream:step_disk_bytes_total", "counter",
             "Bytes of routed experts read from disk during those steps, by kind.");
    for (size_t k = 1; k < 3; ++k) x.sample("moestream:step_disk_bytes_total", "", e.step_bytes_read[k], {{"kind", kKinds[k]}});
    x.family("moestream:step_residency_steps_total", "counter",
             "Steps counted in step_experts_not_resident_total and step_disk_bytes_total, by kind.");
    for (size_t k = 1; k < 3; ++k)
        x.sample("moestream:step_residency_steps_total", "", e.step_residency_steps[k], {{"kind", kKinds[k]}});
}

}  // namespace

// ---- histogram ----------------------------------------------------------------------------

histogram::histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
    for (size_t i = 0; i < bounds_.size(); ++i) {
        MS_ASSERT_MSG(std::isfinite(bounds_[i]), "histogram bounds are finite (+Inf is implicit)");
        MS_ASSERT_MSG(i == 0 || bounds_[i - 1] < bounds_[i], "histogram bounds ascend strictly");
    }
    for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void histogram::observe(double v) {
    MS_ASSERT_MSG(!std::isnan(v), "a NaN observation");
    const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    counts_[b].fetch_add(1, std::memory_order_relaxed);
    add(sum_, v);
}

histogram::snapshot histogram::read() const {
    snapshot s;
    s.cumulative.resize(bounds_.size() + 1);
    uint64_t run = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
        run += counts_[i].load(std::memory_order_relaxed);
        s.cumulative[i] = run;
    }
    s.count = run;
    s.sum = sum_.load(std::memory_order_relaxed);
    return s;
}

// ---- observations -------------------------------------------------------------------------

std::string_view finished_reason_label(std::string_view reason) {
    if (reason == "stop" || reason == "tool_calls") return kReasons[0];
    if (reason == "length" || reason == "context") return kReasons[1];
    if (reason == "abort" || reason == "cancelled") return kReasons[2];
    return kReasons[3];
}

server_metrics::server_metrics(std::string model_name)
    : model_name_(std::move(model_name)),
      ttft_(ttft_bounds()),
      itl_(itl_bounds()),
      e2e_(request_bounds()),
      queue_(request_bounds()),
      prefill_(request_bounds()),
      decode_(request_bounds()),
      prompt_len_(token_bounds()),
      generation_len_(token_bounds()) {}

void server_metrics::observe_request(const request_observation& r) {
    if (r.completion_tokens > 0) ttft_.observe(r.ttft_s);
    for (double gap : r.itl_s) itl_.observe(gap);
    e2e_.observe(r.e2e_s);
    queue_.observe(r.queue_s);
    prefill_.observe(r.prefill_s);
    decode_.observe(r.decode_s);
    prompt_len_.observe(double(r.prompt_tokens));
    generation_len_.observe(double(r.completion_tokens));
    prompt_tokens_.fetch_add(uint64_t(std::max<int64_t>(r.prompt_tokens, 0)), std::memory_order_relaxed);
    processed_prompt_tokens_.fetch_add(uint64_t(std::max<int64_t>(r.prompt_tokens - r.cached_tokens, 0)),
                                       std::memory_order_relaxed);
    generation_tokens_.fetch_add(uint64_t(std::max<int64_t>(r.completion_tokens, 0)), std::memory_order_relaxed);
    add(prefill_seconds_, r.prefill_s);
    add(decode_seconds_, r.decode_s);
    const auto label = finished_reason_label(r.finish_reason);
    for (size_t i = 0; i < kReasons.size(); ++i)
        if (kReasons[i] == label) finished_[i].fetch_add(1, std::memory_order_relaxed);
}

void server_metrics::count_http(std::string_view handler, std::string_view method, int status) {
    auto key = std::make_tuple(std::string(handler), std::string(method), std::to_string(status));
    std::lock_guard lock(http_mu_);
    auto it = http_.find(key);
    if (it == http_.end()) {
        if (http_.size() >= kMaxHttpSeries) key = {"other", "other", "other"};
        it = http_.try_emplace(std::move(key), 0).first;
    }
    ++it->second;
}

// ---- streaming figures --------------------------------------------------------------------

streaming_figures streaming_figures_from(const tier_counters& t, const io::reader_stats& reads,
                                         const engram_counters* engram) {
    streaming_figures f;
    f.demands = t.demands;
    f.device_hits = t.device_hits;
    f.device_misses = t.demands >= t.device_hits ? t.demands - t.device_hits : 0;
    f.host_hits = t.host_hits;
    f.host_misses = f.device_misses >= t.host_hits ? f.device_misses - t.host_hits : 0;
    f.joins = t.joins;
    f.disk_reads = t.disk_reads;
    f.disk_bytes = t.disk_bytes;
    f.promoted_bytes = t.promoted_bytes;
    f.demoted_bytes = t.demoted_bytes;
    f.read_errors = t.read_errors;
    f.hint_reads = t.hint_reads;
    f.hint_used = t.hint_used;
    f.wait_seconds = t.wait_seconds;
    f.copy_seconds = t.copy_seconds;
    f.first_demands = t.first_demands;
    f.working_set = t.working_set;
    f.disk_seconds = reads.busy_seconds;
    f.reads_in_flight_mean = reads.time_mean_in_flight;
    f.reads_in_flight_max = reads.max_in_flight;
    if (engram) {
        f.engram_rows_requested = engram->rows_requested;
        f.engram_rows_read = engram->rows_read;
        f.engram_bytes = engram->bytes_read;
        f.engram_wait_seconds = engram->wait_seconds;
    }
    return f;
}

streaming_figures streaming_figures_of(const tiered_experts& tiers, const engram_stream* engram) {
    const auto reads = tiers.io_stats();
    if (!engram) return streaming_figures_from(tiers.counters(), reads, nullptr);
    const auto rows = engram->counters();
    return streaming_figures_from(tiers.counters(), reads, &rows);
}

// ---- rendering ----------------------------------------------------------------------------

std::string server_metrics::render(const engine_stats& engine, const streaming_figures* streaming) const {
    std::string out;
    out.reserve(16384);
    exposition x(out, model_name_);
    const auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
    const uint64_t processed = processed_prompt_tokens_.load(std::memory_order_relaxed);
    const uint64_t generated = generation_tokens_.load(std::memory_order_relaxed);
    const double prefill_s = prefill_seconds_.load(std::memory_order_relaxed);
    const double decode_s = decode_seconds_.load(std::memory_order_relaxed);

    // llama-server's names.
    x.counter("llamacpp:prompt_tokens_total", "Prompt tokens processed (reused prefix tokens not counted).", processed);
    x.counter("llamacpp:prompt_seconds_total", "Prompt processing time, summed over requests.", prefill_s);
    x.gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", ratio(double(processed), prefill_s));
    x.counter("llamacpp:tokens_predicted_total", "Tokens generated.", generated);
    x.counter("llamacpp:tokens_predicted_seconds_total", "Generation time, summed over requests.", decode_s);
    x.gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
            ratio(double(generated), decode_s));
    x.gauge("llamacpp:requests_processing", "Requests being processed.", double(engine.running));
    x.gauge("llamacpp:requests_deferred", "Requests waiting for a sequence slot.", double(engine.waiting));
    x.gauge("llamacpp:n_tokens_max", "Largest context a sequence has held, in tokens.", engine.tokens_max);
    x.counter("llamacpp:n_decode_total", "Forward passes (engine steps).", engine.steps);
    x.gauge("llamacpp:n_busy_slots_per_decode", "Average sequences per forward pass.",
            ratio(double(engine.decode_rows), double(engine.steps)));
    render_speculation(x, engine);

    // Latency and size distributions.
    x.hist("moestream:time_to_first_token_seconds", "Time from arrival to the first token.", ttft_);
    x.hist("moestream:inter_token_latency_seconds", "Time between two emissions of a request.", itl_);
    x.hist("moestream:e2e_request_latency_seconds", "Time from arrival to the end of a request.", e2e_);
    x.hist("moestream:request_queue_time_seconds", "Time a request waited before its first step.", queue_);
    x.hist("moestream:request_prefill_time_seconds", "Time from the first step to the first token.", prefill_);
    x.hist("moestream:request_decode_time_seconds", "Time from the first token to the last.", decode_);
    x.hist("moestream:request_prompt_tokens", "Prompt length of finished requests, in tokens.", prompt_len_);
    x.hist("moestream:request_generation_tokens", "Tokens generated by finished requests.", generation_len_);

    x.gauge("moestream:num_requests_running", "Requests in the running batch.", double(engine.running));
    x.gauge("moestream:num_requests_waiting", "Requests waiting to be scheduled.", double(engine.waiting));
    x.gauge("moestream:prefix_cached_sequences",
            "Sequence states kept for prefix reuse (finished sequences and prompt checkpoints).",
            double(engine.cached_sequences));
    x.counter("moestream:prefix_cache_queries_total", "Prompt tokens looked up for prefix reuse.",
              engine.prefix_queries_tokens);
    x.counter("moestream:prefix_cache_hits_total", "Prompt tokens served from a reused prefix.", engine.prefix_hit_tokens);
    x.counter("moestream:prefix_checkpoints_total",
              "Copies of a running sequence's state at the end of its prompt kept for prefix reuse.",
              engine.prefix_checkpoints);
    x.counter("moestream:prompt_tokens_total", "Prompt tokens of finished requests (reused ones included).",
              prompt_tokens_.load(std::memory_order_relaxed));
    x.counter("moestream:generation_tokens_total", "Tokens generated by finished requests.", generated);
    x.counter("moestream:engine_busy_seconds_total", "Time the engine spent in forward passes.", engine.busy_s);
    // The step time split (issue: accounting): where each engine step's wall time went.
    x.family("moestream:step_seconds_total", "counter",
             "Engine step time by part: compute, waiting for expert reads, waiting for engram rows, host->device "
             "copies, and the scheduler's own work (admission, batching, sampling, delivery).");
    const std::pair<const char*, double> parts[] = {{"compute", engine.time.compute_s},
                                                    {"expert_wait", engine.time.experts_s},
                                                    {"engram_wait", engine.time.engram_s},
                                                    {"copy", engine.time.copy_s},
                                                    {"scheduler", engine.time.scheduler_s}};
    for (const auto& [part, v] : parts) x.sample("moestream:step_seconds_total", "", v, {{"part", part}});
    x.family("moestream:last_step_seconds", "gauge", "The latest engine step's time by part (see step_seconds_total).");
    const std::pair<const char*, double> last[] = {{"total", engine.last_step.total_s},
                                                   {"compute", engine.last_step.compute_s},
                                                   {"expert_wait", engine.last_step.experts_s},
                                                   {"engram_wait", engine.last_step.engram_s},
                                                   {"copy", engine.last_step.copy_s},
                                                   {"scheduler", engine.last_step.scheduler_s}};
    for (const auto& [part, v] : last) x.sample("moestream:last_step_seconds", "", v, {{"part", part}});
    // The same per layer of the forward, in microseconds (a streamed layer's budget: how long it
    // waited for its experts, computed, copied and was scheduled).
    if (engine.layers > 0) {
        x.family("moestream:last_step_layer_microseconds", "gauge",
                 "The latest engine step's time by part per layer of the forward, in microseconds "
                 "(last_step_seconds / layers).");
        for (const auto& [part, v] : last)
            x.sample("moestream:last_step_layer_microseconds", "", v * 1e6 / double(engine.layers), {{"part", part}});
    }

    x.family("moestream:request_success_total", "counter", "Finished requests by finish reason.");
    for (size_t i = 0; i < kReasons.size(); ++i)
        x.sample("moestream:request_success_total", "", finished_[i].load(std::memory_order_relaxed),
                 {{"finished_reason", kReasons[i]}});

    x.family("moestream:http_requests_total", "counter", "HTTP requests by handler, method and status.");
    {
        std::lock_guard lock(http_mu_);
        for (const auto& [key, n] : http_)
            x.sample("moestream:http_requests_total", "", n,
                     {{"handler", std::get<0>(key)}, {"method", std::get<1>(key)}, {"status", std::get<2>(key)}});
    }

    if (streaming) {
        const auto& s = *streaming;
        x.counter("moestream:expert_demands_total", "Routed experts the model asked for.", s.demands);
        x.counter("moestream:expert_device_hits_total", "Expert demands found in the device tier.", s.device_hits);
        x.counter("moestream:expert_device_misses_total", "Expert demands not in the device tier.", s.device_misses);
        x.counter("moestream:expert_host_hits_total", "Device misses found in the host tier.", s.host_hits);
        x.counter("moestream:expert_host_misses_total", "Device misses that had to come from disk.", s.host_misses);
        x.counter("moestream:expert_read_joins_total", "Demands that joined a read already in flight.", s.joins);
        x.counter("moestream:expert_disk_reads_total", "Experts read from disk.", s.disk_reads);
        x.counter("moestream:expert_disk_bytes_total", "Expert bytes read from disk.", s.disk_bytes);
        x.counter("moestream:expert_promoted_bytes_total", "Expert bytes copied from host to device.", s.promoted_bytes);
        x.counter("moestream:expert_demoted_bytes_total", "Expert bytes copied from device to host.", s.demoted_bytes);
        x.counter("moestream:expert_read_errors_total", "Expert reads that failed.", s.read_errors);
        x.counter("moestream:expert_hint_reads_total", "Expert reads started from look-ahead predictions.", s.hint_reads);
        x.counter("moestream:expert_hint_used_total", "Look-ahead reads demanded afterwards.", s.hint_used);
        x.counter("moestream:expert_wait_seconds_total", "Time compute waited for experts.", s.wait_seconds);
        x.counter("moestream:expert_copy_seconds_total", "Time spent copying experts between the host and device tiers.",
                  s.copy_seconds);
        x.counter("moestream:expert_first_demands_total",
                  "Demands of an expert never demanded before (over generation tokens: new experts per token).",
                  s.first_demands);
        x.gauge("moestream:expert_working_set", "Distinct experts demanded so far (the working set).", s.working_set);
        x.counter("moestream:disk_read_seconds_total", "Time with at least one expert read in flight.", s.disk_seconds);
        x.gauge("moestream:expert_reads_in_flight_mean", "Mean expert reads in flight while reading.",
                s.reads_in_flight_mean);
        x.gauge("moestream:expert_reads_in_flight_max", "Most expert reads in flight at once.", s.reads_in_flight_max);
        x.counter("moestream:engram_rows_requested_total", "Engram rows the model read.", s.engram_rows_requested);
        x.counter("moestream:engram_rows_read_total", "Engram rows read from disk.", s.engram_rows_read);
        x.counter("moestream:engram_bytes_total", "Engram bytes read from disk.", s.engram_bytes);
        x.counter("moestream:engram_wait_seconds_total", "Time compute waited for engram rows.", s.engram_wait_seconds);
    }
    return out;
}

}  // namespace moestream::server
