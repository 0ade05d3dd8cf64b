#include "scheduler/engine.h"

#include "scheduler/asio_task.h"
#include "scheduler/engine_active.h"
#include "scheduler/event_outbox.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <limits>
#include <optional>

#include "scheduler/engine_prefix.h"

namespace moestream {

namespace asio = boost::asio;

using steady = std::chrono::steady_clock;

namespace {
double seconds(steady::duration d) { return std::chrono::duration<double>(d).count(); }

// The log-probability of `token` in `row` (log-softmax) and the `n` most likely tokens.
prompt_score score_row(std::span<const float> row, int32_t token, int32_t n) {
    double top = -std::numeric_limits<double>::infinity();
    for (float x : row)
        if (x > top) top = x;
    double sum = 0;
    for (float x : row)
        if (std::isfinite(x)) sum += std::exp(double(x) - top);
    const double log_sum = top + std::log(sum);
    prompt_score s;
    s.logprob = std::isfinite(row[size_t(token)]) ? double(row[size_t(token)]) - log_sum
                                                  : -std::numeric_limits<double>::infinity();
    if (n <= 0) return s;
    // A small sorted list of the best so far: n is at most 20.
    auto better = [](const token_logprob& a, const token_logprob& b) {
        return a.logprob != b.logprob ? a.logprob > b.logprob : a.token < b.token;
    };
    for (size_t v = 0; v < row.size(); ++v) {
        if (!std::isfinite(row[v])) continue;
        const token_logprob c{int32_t(v), double(row[v]) - log_sum};
        if (int32_t(s.top.size()) == n && !better(c, s.top.back())) continue;
        s.top.insert(std::upper_bound(s.top.begin(), s.top.end(), c, better), c);
        if (int32_t(s.top.size()) > n) s.top.pop_back();
    }
    return s;
}
}  // namespace

engine::engine(dsv41::model& model, engine_options opts)
    : model_(model),
      opts_(std::move(opts)),
      own_(opts_.executor ? nullptr : std::make_unique<scheduler_thread>()),
      strand_(asio::make_strand(opts_.executor ? opts_.executor : own_->executor())),
      wake_(strand_) {
    MS_ASSERT(opts_.max_sequences >= 1 && opts_.max_waiting >= 0 && opts_.prefill_chunk >= 1 &&
              opts_.context_tokens >= 2 && opts_.cached_sequences >= 0 && opts_.rollback >= 0);
    MS_ASSERT_MSG(validate(opts_.spec, model_).ok(), "engine_options::spec passes validate()");
    spec_ = std::make_unique<engine_speculation>(model_, opts_.spec);
    // Rejected drafts are rolled back within the step.
    MS_ASSERT(!spec_->on() || opts_.rollback >= opts_.spec.k);
    prefix_pool_options po;
    po.running = opts_.max_sequences;
    po.cached = opts_.cached_sequences;
    po.context = opts_.context_tokens;
    po.rollback = opts_.rollback;
    states_ = std::make_unique<prefix_pool>(model_, po);
    stats_.layers = int(model_.hp().n_layers);
    outbox_ = std::make_unique<event_outbox>();
    wake_.expires_at(asio::steady_timer::time_point::max());
    asio::co_spawn(strand_, step_loop(), [this](std::exception_ptr e) {
        if (e) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                std::fprintf(stderr, "moestream engine: step loop stopped: %s\n", ex.what());
            }
        }
        loop_ended_.set_value();
    });
}

engine::~engine() {
    MS_ASSERT_MSG(!runs_in_this_thread(strand_.get_inner_executor()),
                  "the engine destroyed on its scheduler's thread: it waits for its step loop there");
    stopping_ = true;
    asio::post(strand_, [this] { wake_.cancel(); });
    // The scheduler thread goes on after the engine (the tiers' strands run there too), so the
    // engine waits for its own work instead of joining it: the step loop's end (every request's
    // final event sent or given up), then whatever the strand still holds from before (the
    // wake-up above, if the loop ended without it) through one more handler behind it.
    loop_ended_.get_future().wait();
    std::promise<void> drained;
    asio::post(strand_, [&drained] { drained.set_value(); });
    drained.get_future().wait();
    compute_.join();
}

result<std::shared_ptr<generation>> engine::submit(generation_request req) {
    const auto& hp = model_.hp();
    if (req.prompt.empty()) return make_error("the prompt is empty");
    for (int32_t t : req.prompt)
        if (t < 0 || t >= hp.vocab)
            return make_error("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(hp.vocab));
    if (int64_t(req.prompt.size()) >= opts_.context_tokens)
        return make_error("this model's maximum context length is " + std::to_string(opts_.context_tokens) +
                          " tokens, the prompt has " + std::to_string(req.prompt.size()));
    MS_TRY(req.sampling.validate(hp.vocab));
    auto a = std::make_unique<active>();
    a->submitted = steady::now();
    // The channel holds every event of the request, so a slow reader never blocks the step
    // loop; its size is bounded by what the request may generate (+ the final event).
    const int64_t room = opts_.context_tokens - int64_t(req.prompt.size());
    const int64_t most = req.max_tokens > 0 ? std::min(req.max_tokens, room) : room;
    a->gen = std::make_shared<generation>(channels_, size_t(most) + 2);
    a->sample = std::make_unique<sampler>(req.sampling, hp.vocab);
    if (req.score_prompt) req.reuse_prefix = false;  // every prompt row is needed
    if (req.constraint) {
        a->allowed.resize(size_t(hp.vocab));
        a->constrained_row.resize(size_t(hp.vocab));
    }
    a->req = std::move(req);
    auto gen = a->gen;
    MS_ASSERT_MSG(!runs_in_this_thread(strand_.get_inner_executor()),
                  "engine::submit() on the scheduler's thread: it waits for the step loop's strand there");
    std::promise<status> admitted;
    auto fut = admitted.get_future();
    asio::post(strand_, [this, a = std::move(a), &admitted]() mutable {
        // Requests the step loop has not admitted yet but will, since sequences are free, are
        // not waiting for one: only the rest count against the queue (two requests sent at once
        // to an idle one-sequence server with a one-place queue are both held).
        const int64_t free_sequences = std::max<int64_t>(0, opts_.max_sequences - int64_t(running_.size()));
        if (int64_t(waiting_.size()) >= opts_.max_waiting + free_sequences) {
            admitted.set_value(make_error("the server is busy: " + std::to_string(waiting_.size()) +
                                          " requests are already waiting"));
            return;
        }
        waiting_.push_back(std::move(a));
        wake_.cancel();
        admitted.set_value({});
    });
    if (auto st = fut.get(); !st) return st.err();
    return gen;
}

engine_stats engine::stats() const {
    std::lock_guard lock(stats_mu_);
    return stats_;
}

void engine::stamp(const active& a, token_event& e) const {
    const auto now = steady::now();
    e.prompt_tokens = int64_t(a.req.prompt.size());
    e.cached_tokens = a.cached;
    e.completion_tokens = a.generated;
    e.draft_n = a.drafted;
    e.draft_n_accepted = a.accepted;
    e.queue_s = seconds(a.scheduled.value_or(now) - a.submitted);
    if (a.scheduled) e.prefill_s = seconds(a.first_token.value_or(now) - *a.scheduled);
    if (a.first_token) e.decode_s = seconds(now - *a.first_token);
}

void engine::finish(active& a, std::string reason, bool keep_state) {
    token_event e;
    e.done = true;
    e.finish_reason = std::move(reason);
    stamp(a, e);
    e.prompt_scores = std::move(a.scores);
    // A scored prompt went in smaller chunks than the others: its state is not offered for reuse.
    keep_state = keep_state && !a.req.score_prompt;
    // The state is consistent whatever ended the sequence (see engine_prefix.h), so it may serve
    // a later prompt; a failed one is not kept (what failed may fail again). Kept and counted
    // before the final event goes out, so whoever sees the end sees the pool that follows it.
    if (a.seq) states_->give_back(std::move(a.seq), keep_state, a.checkpoint);
    {
        std::lock_guard lock(stats_mu_);
        stats_.cached_sequences = states_->kept();
    }
    outbox_->send(a.gen, std::move(e));
}

void engine::checkpoint_prompt(active& a) {
    const int64_t prompt = int64_t(a.req.prompt.size());
    if (!a.checkpoint_due || a.prompt_done < prompt) return;
    MS_ASSERT(a.seq->size() >= prompt && a.seq->can_truncate_to(prompt));
    // Until then the state itself can be truncated back to the prompt's end: it serves the
    // prompt while it runs (copied) and once finished (kept), and a sequence that ends before
    // needs no copy. The state refuses a truncation its rings no longer serve, but cannot undo
    // the overwrite: the copy is due before the step that could take that away, which feeds the
    // sampled token and at most spec_cap drafts, whose rows overwrite ring slots even when rolled
    // back.
    const int64_t next_rows = 1 + a.spec_cap;
    if (a.seq->truncation_floor(next_rows) <= prompt) return;
    a.checkpoint_due = false;
    // A scored prompt's state is not offered for reuse (see finish); a short one is cheaper to
    // process again than to copy.
    if (!opts_.prompt_checkpoints || a.req.score_prompt || prompt < states_->options().min_copy) return;
    a.checkpoint = states_->keep_prefix(*a.seq, prompt);
    std::lock_guard lock(stats_mu_);
    stats_.cached_sequences = states_->kept();
    if (a.checkpoint != 0) ++stats_.prefix_checkpoints;
}

void engine::admit() {
    std::vector<const dsv41::sequence_state*> others;
    others.reserve(size_t(opts_.max_sequences));
    // First come, first served, while there is room.
    while (!waiting_.empty() && int64_t(running_.size()) < opts_.max_sequences) {
        auto a = std::move(waiting_.front());
        waiting_.erase(waiting_.begin());
        others.clear();
        for (const auto& r : running_) others.push_back(r->seq.get());
        auto g = states_->acquire(a->req.prompt, a->req.reuse_prefix, others);
        a->seq = std::move(g.state);
        a->prompt_done = a->cached = g.reused;
        a->spec_cap = spec_->cap(a->req.spec_max);
        if (a->spec_cap > 0) a->drafter = spec_->drafter_for(a->req.prompt, *a->seq);
        MS_ASSERT(a->seq->size() == a->prompt_done && a->prompt_done < int64_t(a->req.prompt.size()));
        if (a->req.reuse_prefix) {
            std::lock_guard lock(stats_mu_);
            stats_.prefix_queries_tokens += uint64_t(a->req.prompt.size());
            stats_.prefix_hit_tokens += uint64_t(g.reused);
        }
        running_.push_back(std::move(a));
    }
}

asio::awaitable<void> engine::step_loop() {
    const auto& hp = model_.hp();
    for (;;) {
        if (stopping_) break;
        // Drop cancelled ones (running or still waiting), then admit waiting ones.
        for (auto* list : {&running_, &waiting_})
            for (size_t i = 0; i < list->size();) {
                if ((*list)[i]->gen->cancelled()) {
                    finish(*(*list)[i], "cancelled", true);
                    list->erase(list->begin() + std::ptrdiff_t(i));
                } else {
                    ++i;
                }
            }
        admit();
        {
            std::lock_guard lock(stats_mu_);
            stats_.running = int64_t(running_.size());
            stats_.waiting = int64_t(waiting_.size());
            stats_.cached_sequences = states_->kept();
        }
        outbox_->flush();
        if (running_.empty()) {
            // Refused events are sent again as soon as their receiver can take them (event_outbox.h).
            if (outbox_->empty()) wake_.expires_at(asio::steady_timer::time_point::max());
            else wake_.expires_after(std::chrono::milliseconds(1));
            boost::system::error_code ec;
            co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        // One forward over every running sequence: a prompt chunk, or the last sampled token and
        // its drafts. Speculation: one draft length for the step (scheduler/engine_spec.h), and
        // each decoding sequence's drafts, proposed by a coroutine on the compute executor (the
        // DSpark head runs the model there and, like the forward, is suspended while it awaits
        // experts: no thread waits for a draft's reads).
        const auto step_start = steady::now();
        bool any_prompt = false;
        std::vector<active*> drafting;
        int decoding_rows = 0;
        for (auto& a : running_) {
            if (!a->scheduled) a->scheduled = step_start;
            const bool decoding = a->prompt_done == int64_t(a->req.prompt.size());
            any_prompt |= !decoding;
            if (!decoding) continue;
            a->rows.assign(1, a->next);
            a->confidences.clear();
            ++decoding_rows;
            if (a->drafter) drafting.push_back(a.get());
        }
        // The policy times (and records the union of) steps that are all decoding.
        const bool timed = !drafting.empty() && !any_prompt;
        if (timed) spec_->begin_step();
        const int step_k = drafting.empty() ? 0 : spec_->choose(decoding_rows, int(drafting.size()));
        double draft_s = 0;
        if (step_k > 0) {
            const auto draft_start = steady::now();
            for (active* a : drafting) {
                const int want = draft_room(*a, spec_->request(step_k, *a->drafter, decoding_rows));
                if (want <= 0) continue;
                const int64_t failures = a->drafter->failures();
                const auto drafts =
                    co_await run_task(a->drafter->propose_async(a->context, want, compute_exec_), compute_exec_);
                take_drafts(*a, drafts, want, failures);
                const auto c = a->drafter->confidences();
                if (c.size() >= a->rows.size() - 1) a->confidences.assign(c.begin(), c.begin() + std::ptrdiff_t(a->rows.size() - 1));
            }
            draft_s = seconds(steady::now() - draft_start);
            // Drafts with confidences are cut where one more row stops paying (spec/draft_policy.h,
            // trim); in a step of decoding rows only, the shape the cost model knows.
            if (!any_prompt) {
                std::vector<active*> trimmed;
                std::vector<std::vector<float>> confidences;
                int base_rows = decoding_rows;
                for (active* a : drafting) {
                    if (!a->confidences.empty()) {
                        trimmed.push_back(a);
                        confidences.push_back(a->confidences);
                    } else {
                        base_rows += int(a->rows.size()) - 1;  // another drafter's rows go in whole
                    }
                }
                if (!trimmed.empty()) {
                    const std::vector<int> keep = spec_->trim(base_rows, confidences);
                    for (size_t i = 0; i < trimmed.size(); ++i) {
                        trimmed[i]->rows.resize(1 + size_t(keep[i]));
                        trimmed[i]->confidences.resize(size_t(keep[i]));
                    }
                }
            }
        }
        std::vector<dsv41::forward_item> items;
        std::vector<int64_t> fed;
        int most_drafted = 0;
        for (auto& a : running_) {
            if (a->prompt_done < int64_t(a->req.prompt.size())) {
                const bool scored = a->req.score_prompt;
                const int64_t chunk =
                    scored ? std::min(opts_.prefill_chunk, generation_request::k_score_chunk) : opts_.prefill_chunk;
                const int64_t n = std::min<int64_t>(chunk, int64_t(a->req.prompt.size()) - a->prompt_done);
                const auto tokens = std::span<const int32_t>(a->req.prompt).subspan(size_t(a->prompt_done), size_t(n));
                items.push_back({a->seq.get(), tokens, scored});
                fed.push_back(n);
            } else {
                // Verification rows (several) need every row's logits.
                items.push_back({a->seq.get(), a->rows, a->rows.size() > 1});
                fed.push_back(0);
                most_drafted = std::max(most_drafted, int(a->rows.size()) - 1);
            }
        }
        // Where each item's logits start: one row each, or every row of a scored prompt chunk or
        // of a verification.
        std::vector<size_t> first_row(items.size() + 1, 0);
        const auto place_rows = [&] {
            for (size_t i = 0; i < items.size(); ++i)
                first_row[i + 1] = first_row[i] + (items[i].all_logits ? items[i].tokens.size() : 1);
        };
        place_rows();
        // Where each item's rows start in the batch (a draft head's features are per row).
        std::vector<int64_t> batch_row(items.size() + 1, 0);
        for (size_t i = 0; i < items.size(); ++i) batch_row[i + 1] = batch_row[i] + int64_t(items[i].tokens.size());
        std::vector<float> logits;
        const forward_waits waits_before = opts_.waits ? opts_.waits() : forward_waits{};
        const auto forward_start = steady::now();
        // The forward is a coroutine: its compute runs on the compute thread, and while it awaits
        // experts it is suspended (no thread waits) until the tiers' strand posts it back there.
        // The step loop is suspended meanwhile; the strand goes on with other handlers.
        const status st = co_await run_task(model_.forward_async(items, logits, compute_exec_), compute_exec_);
        const int64_t step_experts = st ? model_.last_forward_experts() : -1;
        // A failed forward changed no sequence. The cause may concern only some of them (an
        // expert only one of them routed to could not be read): run each alone once, without
        // its drafts (a draft head continues from the rows of the forward it was in), so only
        // the requests that hit the fault fail.
        std::vector<std::string> failed(running_.size());
        if (!st) {
            for (size_t i = 0; i < running_.size(); ++i)
                if (fed[i] == 0 && running_[i]->rows.size() > 1) {
                    running_[i]->rows.resize(1);
                    items[i] = {running_[i]->seq.get(), running_[i]->rows, false};
                }
            place_rows();
            logits.assign(first_row.back() * size_t(hp.vocab), 0.0f);
            for (size_t i = 0; i < running_.size(); ++i) {
                std::vector<float> one;
                const status st1 =
                    co_await run_task(model_.forward_async({&items[i], 1}, one, compute_exec_), compute_exec_);
                if (!st1) failed[i] = st1.message();
                else std::copy(one.begin(), one.end(), logits.begin() + std::ptrdiff_t(first_row[i] * size_t(hp.vocab)));
            }
        }
        const auto forward_end = steady::now();
        step_split split;
        {
            const forward_waits w = opts_.waits ? opts_.waits() : forward_waits{};
            split.experts_s = std::max(0.0, w.experts_s - waits_before.experts_s);
            split.engram_s = std::max(0.0, w.engram_s - waits_before.engram_s);
            split.copy_s = std::max(0.0, w.copy_s - waits_before.copy_s);
            split.compute_s = draft_s + std::max(0.0, seconds(forward_end - forward_start) - split.experts_s -
                                                          split.engram_s - split.copy_s);
        }
        {
            std::lock_guard lock(stats_mu_);
            ++stats_.steps;
            stats_.busy_s += seconds(steady::now() - step_start);
            stats_.decode_rows += uint64_t(items.size());
            for (const auto& a : running_) stats_.tokens_max = std::max(stats_.tokens_max, uint64_t(a->seq->size()));
            if (step_experts >= 0) {
                const size_t kind = any_prompt ? engine_stats::prefill_step
                                    : most_drafted > 0 ? engine_stats::verify_step
                                                       : engine_stats::decode_step;
                stats_.step_experts[kind] += uint64_t(step_experts);
                ++stats_.step_experts_steps[kind];
            }
            if (st && most_drafted > 0) ++stats_.spec_steps;
        }
        // The policy learns the step's cost when the step was all decoding (prompt rows cost
        // what the prompt costs), drafting included.
        if (timed && st) {
            int drafted_sequences = 0;
            for (const auto& a : running_) drafted_sequences += a->rows.size() > 1 ? 1 : 0;
            const auto& r =
                spec_->end_step(most_drafted, int(batch_row.back()), drafted_sequences, seconds(forward_end - step_start));
            if (r.residency_known) {
                const size_t kind = most_drafted > 0 ? engine_stats::verify_step : engine_stats::decode_step;
                std::lock_guard lock(stats_mu_);
                stats_.step_not_resident[kind] += uint64_t(r.not_resident());
                stats_.step_bytes_read[kind] += r.bytes_read;
                ++stats_.step_residency_steps[kind];
            }
        }
        std::vector<std::unique_ptr<active>> still_running;
        for (size_t i = 0; i < running_.size(); ++i) {  // rows first_row[i].. of the logits are running_[i]'s
            active& a = *running_[i];
            if (!failed[i].empty()) {
                finish(a, "error: " + failed[i], false);
                std::lock_guard lock(stats_mu_);
                ++stats_.requests_done;
                continue;
            }
            if (fed[i] > 0 && a.req.score_prompt) {
                // Row r follows the token at prompt_done + r: it scores the next prompt token.
                for (int64_t r = 0; r < fed[i] && a.prompt_done + r + 1 < int64_t(a.req.prompt.size()); ++r) {
                    std::span<const float> scored(logits.data() + (first_row[i] + size_t(r)) * size_t(hp.vocab),
                                                  size_t(hp.vocab));
                    const int32_t token = a.req.prompt[size_t(a.prompt_done + r + 1)];
                    a.scores.push_back(score_row(scored, token, a.req.sampling.n_probs));
                }
            }
            if (fed[i] > 0) {
                a.prompt_done += fed[i];
                std::lock_guard lock(stats_mu_);
                stats_.prompt_tokens += uint64_t(fed[i]);
            }
            const int64_t drafts = fed[i] > 0 ? 0 : int64_t(a.rows.size()) - 1;
            // Every emitted token but the last was fed before; the last and the drafts just now.
            MS_ASSERT(a.seq->size() == a.prompt_done + a.generated + drafts);
            std::string reason;
            if (a.prompt_done == int64_t(a.req.prompt.size()) && a.req.prompt_only) {
                a.first_token = steady::now();
                reason = "length";
            } else if (a.prompt_done == int64_t(a.req.prompt.size())) {
                // The rows to sample: a prompt chunk's last, or the verification rows in order.
                reason = sample_rows(a, logits, fed[i] > 0 ? first_row[i + 1] - 1 : first_row[i], batch_row[i], drafts);
            }
            if (!reason.empty()) {
                // A sampling error leaves the state consistent too, but is not kept, as above.
                finish(a, reason, reason.rfind("error", 0) != 0);
                std::lock_guard lock(stats_mu_);
                ++stats_.requests_done;
            } else {
                checkpoint_prompt(a);
                still_running.push_back(std::move(running_[i]));
            }
        }
        running_ = std::move(still_running);
        spec_->send_hints();  // the kept rows' routing, for the next step's first layers
        split.total_s = seconds(steady::now() - step_start);
        split.scheduler_s = std::max(0.0, split.total_s - seconds(forward_end - forward_start) - draft_s);
        {
            std::lock_guard lock(stats_mu_);
            stats_.time.add(split);
            stats_.last_step = split;
        }
    }
    // Shutting down: every request gets its final event.
    for (auto& a : running_) finish(*a, "cancelled", false);
    for (auto& a : waiting_) finish(*a, "cancelled", false);
    running_.clear();
    waiting_.clear();
    // Final events a channel refused go out once their receivers can take them (for at most a
    // second: a receiver that never comes back has dropped its generation anyway).
    for (int tries = 0; tries < 1000; ++tries) {
        outbox_->flush();
        if (outbox_->empty()) break;
        wake_.expires_after(std::chrono::milliseconds(1));
        boost::system::error_code ec;
        co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
}

}  // namespace moestream
