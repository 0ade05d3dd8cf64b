// The generation engine: continuous batching of many requests over one model, driven by a C++20
// coroutine on Boost.Asio. One strand owns the scheduling state (waiting queue, active sequences,
// samplers); each step gathers every active sequence's next rows (a prefill chunk or one decode
// token) into one forward, a coroutine (model::forward_async) started from the strand whose compute
// runs on the compute thread; while it awaits experts it is suspended and no thread waits (the
// tiers' strand posts it back; scheduler/asio_task.h). The strand awaits its end; then every
// sequence samples its token and the tokens are delivered
// through per-request channels. A forward's rows are bit-identical to running each sequence
// alone (see the exactness suite), so batching never changes anyone's tokens.
// The strand runs on the serving process's scheduler thread (engine_options::executor,
// scheduler/scheduler_thread.h), beside the expert tiers' strands: nothing the step loop does may
// wait for a handler there (the tiers' blocking forms assert it), so its per-step time split reads
// the tiers' waits without a round trip (tiered_experts::wait_totals()).
//
// Prefix reuse (llama-server's cache_prompt): agents send the whole conversation again every
// turn, so a new request starts from the state of an earlier sequence that shares its first
// tokens, either a finished one kept in a small LRU pool or one still running (copied between
// steps), and only the rest of its prompt is processed. Every sequence state is allocated once,
// at construction (max_sequences running + cached_sequences kept); see scheduler/engine_prefix.h.
// A reused prefix gives the same bits as processing it again, so reuse never changes tokens.
// A sequence about to run more than `rollback` tokens past its prompt also leaves a copy of its
// state truncated to the prompt's end in the pool (a prompt checkpoint): chat clients send the
// reply back re-tokenized, often differently from how it was generated, and a finished state
// that ran far past where the next prompt parts from it can no longer serve it.
//
// Speculative decoding (engine_options::spec, docs/speculative.md): a decoding sequence feeds
// its sampled token and up to k drafted ones, its k + 1 verification rows in the same forward
// as everyone's; its sampler walks the rows (spec/verify.h), each token is delivered as it
// stands, and the rows after the last draft that stood are rolled back before the step ends, so
// every state is still consistent between steps. One draft length a step for the whole batch
// (scheduler/engine_spec.h says why); greedy output is plain decoding's token for token, sampled
// output plain sampling's for the same seed.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/sampler.h"
#include "scheduler/asio_task.h"
#include "scheduler/engine_spec.h"
#include "scheduler/scheduler_thread.h"
#include "scheduler/token_constraint.h"

namespace moestream {

class prefix_pool;

struct generation_request {
    std::vector<int32_t> prompt;
    sampling_params sampling;  // temperature 0: greedy; n_probs > 0: top log-probabilities per token
    int64_t max_tokens = 128;  // <= 0: until a stop token or the context is full
    std::vector<int32_t> stop_tokens;  // end of generation (e.g. the tokenizer's EOS); not emitted
    bool reuse_prefix = true;  // start from a kept state sharing the prompt's first tokens
    // Restricts every sampled token (forced tool calls, JSON output); null: unconstrained. When it
    // reports done() the request ends with "stop"; when it allows no token at all, with
    // "error: the output constraint allows no token". Used on the engine's strand only.
    std::shared_ptr<token_constraint> constraint;
    // Scores the prompt (OpenAI's echo with logprobs): every prompt token after the first gets
    // its log-probability given the tokens before it (the log-softmax of the model's logits:
    // no temperature, penalties or bias) and the top sampling.n_probs alternatives, delivered
    // with the first event after the prompt. Such a prompt is processed in full, in chunks of
    // k_score_chunk rows (every row's logits are kept for a step), and its state is not kept for
    // reuse.
    bool score_prompt = false;
    // Processes the prompt and ends ("length") without generating (max_tokens 0).
    bool prompt_only = false;
    // Speculative decoding (engine_options::spec): the most tokens drafted a step for this
    // request, within the engine's; -1: the engine's, 0: none (llama-server's speculative.n_max).
    int64_t spec_max = -1;
    static constexpr int64_t k_score_chunk = 32;
};

// One scored prompt token (generation_request::score_prompt).
struct prompt_score {
    double logprob = 0;
    std::vector<token_logprob> top;  // best first, lower id first on ties
};

// One message on a request's channel. The last one has done = true.
struct token_event {
    int32_t token = -1;  // -1 on the final event
    double logprob = 0;
    std::vector<token_logprob> top;  // the sampler's top n_probs alternatives; empty when n_probs == 0
    bool done = false;
    std::string finish_reason;  // "stop", "length", "cancelled", "context", or "error: ..."
    // score_prompt: prompt tokens 1..n-1, on the first event after the prompt (or the final one).
    std::vector<prompt_score> prompt_scores;
    // Counts so far, on every event: the prompt's tokens, how many of them came from a reused
    // state (not processed again), tokens emitted.
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    // Speculative decoding so far: tokens drafted for the request and how many of them stood
    // (llama-server's draft_n, draft_n_accepted); both 0 without speculation.
    int64_t draft_n = 0, draft_n_accepted = 0;
    // Seconds on the steady clock, on every event: queue = submitted -> the first step that
    // included the request (-> now while never scheduled); prefill = that step -> the first
    // token was sampled (-> now before it); decode = the first token -> this event.
    double queue_s = 0, prefill_s = 0, decode_s = 0;
};

class generation {
  public:
    using channel = boost::asio::experimental::concurrent_channel<void(boost::system::error_code, token_event)>;
    // The channel's state lives in `owner`'s services, which the generation keeps alive, so a
    // handle stays valid (with its final event) after the engine is gone.
    generation(std::shared_ptr<boost::asio::io_context> owner, size_t capacity)
        : owner_(std::move(owner)), events_(owner_->get_executor(), capacity) {}
    // Token events in order; receive with async_receive (awaitable) or try_receive.
    channel& events() { return events_; }
    // Stops the generation at the next step; a final "cancelled" event follows.
    void cancel() { cancelled_ = true; }
    bool cancelled() const { return cancelled_; }

  private:
    std::shared_ptr<boost::asio::io_context> owner_;
    channel events_;
    std::atomic<bool> cancelled_{false};
};

// Cumulative seconds the forwards spent blocked on something other than compute, read from the
// expert tiers and the engram reader (scheduler/tiered_experts.h, engram_stream.h).
struct forward_waits {
    double experts_s = 0;  // waiting for expert reads (disk)
    double engram_s = 0;   // waiting for engram rows
    double copy_s = 0;     // host -> device tier copies
};

// One step's time split (seconds): the forward (compute + the waits above) and the scheduler's
// own work around it (admission, batching, sampling, delivering events).
struct step_split {
    double total_s = 0, compute_s = 0, experts_s = 0, engram_s = 0, copy_s = 0, scheduler_s = 0;
    void add(const step_split& o) {
        total_s += o.total_s, compute_s += o.compute_s, experts_s += o.experts_s, engram_s += o.engram_s,
            copy_s += o.copy_s, scheduler_s += o.scheduler_s;
    }
};

// Every sequence state is allocated at construction: max_sequences + cached_sequences of them,
// each sized for context_tokens (plus window + rollback ring positions per layer).
struct engine_options {
    int64_t max_sequences = 8;        // sequences decoded together
    int64_t max_waiting = 64;         // queued requests beyond that (submit() refuses more)
    int64_t prefill_chunk = 256;      // prompt tokens per sequence per step
    int64_t context_tokens = 8192;    // per sequence
    int64_t cached_sequences = 4;     // states kept for prefix reuse (LRU): finished sequences, prompt checkpoints
    int64_t rollback = 64;            // how far back a kept state can be truncated to serve a prefix
    // Prompt checkpoints (above): taken for prompts of at least the pool's min_copy tokens, when
    // cached_sequences > 0.
    bool prompt_checkpoints = true;
    // Where the per-step time split reads the waits from; null: all forward time is compute.
    std::function<forward_waits()> waits;
    // Speculative decoding of the decoding sequences (scheduler/engine_spec.h); off by default.
    speculation_options spec;
    // Where the step loop's strand runs: the serving process's scheduler (scheduler_thread.h),
    // shared with the expert tiers' strands; empty: a scheduler thread of the engine's own.
    boost::asio::any_io_executor executor;
};

struct engine_stats {
    int64_t running = 0, waiting = 0;
    uint64_t steps = 0, prompt_tokens = 0, generated_tokens = 0, requests_done = 0;
    // Prefix reuse: prompt tokens of admitted requests that asked for it, and how many of those
    // came from a reused state; states kept now (finished sequences and prompt checkpoints); prompt
    // checkpoints copied into the pool.
    uint64_t prefix_queries_tokens = 0, prefix_hit_tokens = 0;
    int64_t cached_sequences = 0;
    uint64_t prefix_checkpoints = 0;
    uint64_t tokens_max = 0;   // the most positions any sequence has held (high-water mark)
    double busy_s = 0;         // seconds spent in forwards
    uint64_t decode_rows = 0;  // sequences in each forward, summed (/ steps = mean batch)
    step_split time;           // every step's split, summed
    step_split last_step;      // the latest step's
    int layers = 0;            // the target's layers (a forward's layers, for figures per layer)
    // Speculative decoding: drafts (one sequence's tokens drafted in one step, at least one),
    // the tokens drafted and accepted, accepted by draft position (1..5), engine steps that
    // verified drafts, proposals that failed (decoding went on without drafts).
    uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_steps = 0, spec_failures = 0;
    std::array<uint64_t, 5> spec_accepted_by_position{};
    // The union of a step's routed experts (model::last_forward_experts: distinct experts summed
    // over the MoE layers), summed over the steps whose routing the host saw, and those steps, by
    // kind: steps with prompt rows, steps verifying drafts, other decode steps.
    enum step_kind { prefill_step, verify_step, decode_step };
    std::array<uint64_t, 3> step_experts{}, step_experts_steps{};
    // Of the speculating engine's all-decoding steps whose experts the tiers saw (the policy's
    // records, spec/expert_union.h): experts not resident when announced, and bytes read from
    // disk during the step, summed over those steps (counted too), by kind as above.
    std::array<uint64_t, 3> step_not_resident{}, step_bytes_read{}, step_residency_steps{};
};

class event_outbox;

class engine {
  public:
    // The model (and what it streams from) must outlive the engine, and so must
    // opts.executor's io_context while it runs.
    engine(dsv41::model& model, engine_options opts);
    // Cancels everything, delivers final events, waits for the step loop's end and joins the
    // compute thread. Not on the scheduler's thread (it waits for a handler there).
    ~engine();
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

    // Queues a request. Errors: invalid request (empty prompt, bad token id, sampling values,
    // prompt longer than the context) or the wait queue is full. Waits for the strand's answer:
    // not on the scheduler's thread (the HTTP server's threads, tools and tests call it).
    result<std::shared_ptr<generation>> submit(generation_request req);
    // A copy kept under a mutex: never waits for the strand, from any thread.
    engine_stats stats() const;
    // The scheduler's executor the step loop's strand runs on.
    boost::asio::any_io_executor executor() const { return strand_.get_inner_executor(); }

  private:
    struct active;
    boost::asio::awaitable<void> step_loop();
    void admit();
    void finish(active& a, std::string reason, bool keep_state);
    void stamp(const active& a, token_event& e) const;
    // A running sequence's prompt checkpoint, made (once) between steps when its next step could
    // take its state beyond `rollback` past the prompt's end.
    void checkpoint_prompt(active& a);
    // Speculation (engine_rows.cpp): a decoding sequence's drafts for a step of at most k, after
    // its `next` in a.rows: draft_room() says how many it may take (and sets a.context), the
    // drafter proposes them as a coroutine on the compute executor (the DSpark head suspends
    // while its experts are on their way), take_drafts() keeps the valid ones. Then the sampling
    // of its rows from `row0` of the logits (`drafts` after the first; `batch_row`: the first's
    // row in the forward's batch), each token delivered as it stands, the rows after them rolled
    // back. The finish reason, or empty while it goes on.
    int draft_room(active& a, int k);
    void take_drafts(active& a, const std::vector<int32_t>& drafts, int want, int64_t failures_before);
    std::string sample_rows(active& a, const std::vector<float>& logits, size_t row0, int64_t batch_row,
                            int64_t drafts);

    dsv41::model& model_;
    engine_options opts_;
    std::unique_ptr<engine_speculation> spec_;  // strand-owned
    // Without opts.executor: the engine's own scheduler thread (declared before the strand and
    // the timer made on it, so that it outlives them).
    std::unique_ptr<scheduler_thread> own_;
    std::shared_ptr<boost::asio::io_context> channels_ = std::make_shared<boost::asio::io_context>();
    boost::asio::strand<boost::asio::any_io_executor> strand_;
    // Forwards compute here; a forward awaiting experts is suspended and occupies no thread. The
    // DSpark drafter still calls model::draft() (run_sync) here, so its waits do.
    boost::asio::thread_pool compute_{1};
    asio_coro_executor compute_exec_{compute_.get_executor()};  // the forwards' coro::executor
    boost::asio::steady_timer wake_;       // the step loop sleeps on it while nothing is queued
    std::vector<std::unique_ptr<active>> waiting_, running_;  // strand-owned
    std::unique_ptr<prefix_pool> states_;                      // strand-owned
    std::unique_ptr<event_outbox> outbox_;                     // strand-owned: events try_send refused
    std::atomic<bool> stopping_{false};
    mutable std::mutex stats_mu_;
    engine_stats stats_;
    std::promise<void> loop_ended_;  // set by the step loop's completion handler
};

}  // namespace moestream
