// Prometheus metrics of the server, rendered in the text exposition format 0.0.4 for GET /metrics.
// Two name sets, so existing dashboards work unchanged: llama-server's (`llamacpp:` prefix) and a
// vLLM-style set of latency histograms and counters under our own `moestream:` prefix. Every
// series carries model_name="...".
//
// Families (counters end in _total; h = histogram, g = gauge, c = counter):
//   llamacpp:prompt_tokens_total (c)            prompt tokens processed (reused prefix tokens not)
//   llamacpp:prompt_seconds_total (c)           prefill time, summed over requests
//   llamacpp:prompt_tokens_seconds (g)          the two above divided (0 before any)
//   llamacpp:tokens_predicted_total (c)         tokens generated
//   llamacpp:tokens_predicted_seconds_total (c) decode time (first token -> last), summed
//   llamacpp:predicted_tokens_seconds (g)       the two above divided (0 before any)
//   llamacpp:requests_processing (g), llamacpp:requests_deferred (g)   running / waiting now
//   llamacpp:n_tokens_max (g)                   the most positions a sequence has held
//   llamacpp:n_decode_total (c)                 engine steps (forwards)
//   llamacpp:n_busy_slots_per_decode (g)        sequences per forward, mean
//   {llamacpp,moestream}:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
//              ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total{position="1..5"} (c)
//                                               speculative decoding (a draft: one sequence's drafted
//                                               tokens of one step)
//   moestream:spec_verification_steps_total (c) engine steps that verified drafts
//   moestream:spec_draft_failures_total (c)     drafts that could not be made
//   moestream:step_experts_total{kind="prefill|verify|decode"} (c), moestream:step_experts_steps_total{kind} (c)
//                                               distinct routed experts of a step's rows (summed over MoE
//                                               layers) over the steps whose routing the host saw: the
//                                               union a verification step loads, against a decode step's
//   moestream:{time_to_first_token,inter_token_latency,e2e_request_latency,request_queue_time,
//              request_prefill_time,request_decode_time}_seconds (h)
//   moestream:request_prompt_tokens (h), moestream:request_generation_tokens (h)
//   moestream:num_requests_running (g), moestream:num_requests_waiting (g)
//   moestream:prefix_cached_sequences (g)       states kept for prefix reuse (finished sequences and
//                                               prompt checkpoints)
//   moestream:prefix_cache_queries_total (c), moestream:prefix_cache_hits_total (c)   in tokens
//   moestream:prefix_checkpoints_total (c)      prompt checkpoints kept (scheduler/engine.h)
//   moestream:prompt_tokens_total (c), moestream:generation_tokens_total (c)   of finished requests
//   moestream:request_success_total{finished_reason="stop|length|abort|error"} (c)
//   moestream:http_requests_total{handler,method,status} (c)
//   moestream:engine_busy_seconds_total (c)     time the engine spent in forwards
//   moestream:step_seconds_total{part="compute|expert_wait|engram_wait|copy|scheduler"} (c)
//   moestream:last_step_seconds{part="total|compute|expert_wait|engram_wait|copy|scheduler"} (g)
//   moestream:last_step_layer_microseconds{part=...} (g): the same per layer of the forward
// Expert streaming (only when the experts are streamed; scheduler/tiered_experts.h and
// engram_stream.h counters):
//   moestream:expert_demands_total              experts the model asked for
//   moestream:expert_device_hits_total, moestream:expert_device_misses_total   (misses = demands - hits)
//   moestream:expert_host_hits_total, moestream:expert_host_misses_total       (of the device misses:
//                                               found in host RAM / had to come from disk)
//   moestream:expert_read_joins_total           demands that joined a read already in flight
//   moestream:expert_disk_reads_total, moestream:expert_disk_bytes_total
//   moestream:expert_promoted_bytes_total, moestream:expert_demoted_bytes_total   host <-> device
//   moestream:expert_read_errors_total
//   moestream:expert_hint_reads_total, moestream:expert_hint_used_total   look-ahead reads, useful ones
//   moestream:expert_wait_seconds_total         compute blocked waiting for experts
//   moestream:expert_copy_seconds_total         host <-> device tier copies
//   moestream:expert_first_demands_total (c)    demands of an expert never demanded before (divide by
//                                               generation tokens: new experts per token)
//   moestream:expert_working_set (g)            distinct experts demanded so far
//   moestream:disk_read_seconds_total           wall time with at least one expert read in flight
//   moestream:expert_reads_in_flight_mean (g), moestream:expert_reads_in_flight_max (g)   queue depth
//   moestream:engram_rows_requested_total, moestream:engram_rows_read_total,
//   moestream:engram_bytes_total, moestream:engram_wait_seconds_total
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace moestream {
struct engine_stats;
struct tier_counters;
struct engram_counters;
class tiered_experts;
class engram_stream;
namespace io {
struct reader_stats;
}
}  // namespace moestream

namespace moestream::server {

// Fixed buckets chosen at construction; observe() is lock-free (relaxed atomics), so request
// threads never contend on a lock. A snapshot's count is the sum of its buckets, so the +Inf
// bucket always equals _count even while observations race with a render.
class histogram {
  public:
    // Finite, strictly ascending upper bounds (asserted); the +Inf bucket is implicit.
    explicit histogram(std::vector<double> upper_bounds);
    void observe(double v);  // v <= bound lands in that bucket (Prometheus "le"); NaN is a bug

    struct snapshot {
        std::vector<uint64_t> cumulative;  // per bound, then +Inf
        double sum = 0;
        uint64_t count = 0;
    };
    snapshot read() const;
    const std::vector<double>& bounds() const { return bounds_; }

  private:
    std::vector<double> bounds_;
    std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), +Inf last
    std::atomic<double> sum_{0};
};

// One finished request, as the handler measured it.
struct request_observation {
    double queue_s = 0, ttft_s = 0, e2e_s = 0, prefill_s = 0, decode_s = 0;
    std::vector<double> itl_s;  // gaps between emissions
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    // stop|length|abort|error; the engine's and OpenAI's words are accepted too (see
    // finished_reason_label). TTFT is observed only when completion_tokens > 0.
    std::string finish_reason;
};

// "stop" (also tool_calls), "length" (also context), "abort" (also cancelled), else "error".
std::string_view finished_reason_label(std::string_view reason);

// Expert-streaming figures at one moment, from the tiers' and engram reader's counters.
struct streaming_figures {
    uint64_t demands = 0, device_hits = 0, device_misses = 0, host_hits = 0, host_misses = 0, joins = 0;
    uint64_t disk_reads = 0, disk_bytes = 0, promoted_bytes = 0, demoted_bytes = 0, read_errors = 0;
    uint64_t hint_reads = 0, hint_used = 0;
    uint64_t first_demands = 0, working_set = 0;  // routing: new experts, distinct experts so far
    double wait_seconds = 0;
    double copy_seconds = 0;            // host <-> device tier copies
    double disk_seconds = 0;            // reader busy time (>= 1 read in flight)
    double reads_in_flight_mean = 0;    // time-weighted over busy time
    uint64_t reads_in_flight_max = 0;
    uint64_t engram_rows_requested = 0, engram_rows_read = 0, engram_bytes = 0;
    double engram_wait_seconds = 0;
};
streaming_figures streaming_figures_from(const tier_counters& tiers, const io::reader_stats& reads,
                                         const engram_counters* engram);
// The same from the live objects (engram may be null: engram rows come from the mapping).
streaming_figures streaming_figures_of(const tiered_experts& tiers, const engram_stream* engram);

class server_metrics {
  public:
    explicit server_metrics(std::string model_name);
    server_metrics(const server_metrics&) = delete;
    server_metrics& operator=(const server_metrics&) = delete;

    // Thread-safe; lock-free but for nothing (histograms and counters are atomics).
    void observe_request(const request_observation& r);
    // Thread-safe (a short lock). At most kMaxHttpSeries label sets; later new ones are counted
    // under handler="other", method="other", status="other", so a client cannot grow it.
    void count_http(std::string_view handler, std::string_view method, int status);
    static constexpr size_t kMaxHttpSeries = 256;

    // Every family above; the streaming ones only when `streaming` is given.
    std::string render(const engine_stats& engine, const streaming_figures* streaming) const;

  private:
    std::string model_name_;
    histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, prompt_len_, generation_len_;
    std::atomic<uint64_t> prompt_tokens_{0}, processed_prompt_tokens_{0}, generation_tokens_{0};
    std::atomic<double> prefill_seconds_{0}, decode_seconds_{0};
    std::array<std::atomic<uint64_t>, 4> finished_{};  // stop, length, abort, error
    mutable std::mutex http_mu_;
    std::map<std::tuple<std::string, std::string, std::string>, uint64_t> http_;
};

}  // namespace moestream::server
