#include "scheduler/engine.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <future>

namespace moestream {

namespace asio = boost::asio;

struct engine::active {
    generation_request req;
    std::shared_ptr<generation> gen;
    std::unique_ptr<dsv41::sequence_state> seq;
    std::unique_ptr<sampler> sample;
    int64_t prompt_done = 0;   // prompt tokens already in the sequence
    int32_t next = -1;         // sampled, not yet fed
    int64_t generated = 0;
    sample_result scratch;
};

engine::engine(dsv41::model& model, engine_options opts)
    : model_(model), opts_(opts), strand_(asio::make_strand(io_)), wake_(strand_) {
    wake_.expires_at(asio::steady_timer::time_point::max());
    asio::co_spawn(strand_, step_loop(), [](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            std::fprintf(stderr, "moestream engine: step loop stopped: %s\n", ex.what());
        }
    });
    io_thread_ = std::thread([this] { io_.run(); });
}

engine::~engine() {
    stopping_ = true;
    asio::post(strand_, [this] { wake_.cancel(); });
    io_thread_.join();
    compute_.join();
}

result<std::shared_ptr<generation>> engine::submit(generation_request req) {
    const auto& hp = model_.hp();
    if (req.prompt.empty()) return make_error("the prompt is empty");
    for (int32_t t : req.prompt)
        if (t < 0 || t >= hp.vocab)
            return make_error("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(hp.vocab));
    if (req.max_tokens < 1) return make_error("max_tokens must be >= 1");
    if (int64_t(req.prompt.size()) >= opts_.context_tokens)
        return make_error("this model's maximum context length is " + std::to_string(opts_.context_tokens) +
                          " tokens, the prompt has " + std::to_string(req.prompt.size()));
    MS_TRY(req.sampling.validate(hp.vocab));
    auto a = std::make_unique<active>();
    // The channel holds every event of the request, so a slow reader never blocks the step
    // loop; its size is bounded by max_tokens (+ the final event).
    a->gen = std::make_shared<generation>(channels_, size_t(std::min<int64_t>(req.max_tokens, opts_.context_tokens)) + 2);
    a->sample = std::make_unique<sampler>(req.sampling, hp.vocab);
    a->req = std::move(req);
    auto gen = a->gen;
    std::promise<status> admitted;
    auto fut = admitted.get_future();
    asio::post(strand_, [this, a = std::move(a), &admitted]() mutable {
        if (int64_t(waiting_.size()) >= opts_.max_waiting) {
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

asio::awaitable<void> engine::step_loop() {
    const auto& hp = model_.hp();
    auto finish = [&](active& a, std::string reason) {
        token_event e;
        e.done = true;
        e.finish_reason = std::move(reason);
        e.prompt_tokens = int64_t(a.req.prompt.size());
        e.completion_tokens = a.generated;
        a.gen->events().try_send(boost::system::error_code{}, std::move(e));
    };
    for (;;) {
        if (stopping_) break;
        // Admit waiting requests (first come, first served) while there is room.
        while (!waiting_.empty() && int64_t(running_.size()) < opts_.max_sequences) {
            auto a = std::move(waiting_.front());
            waiting_.erase(waiting_.begin());
            a->seq = std::make_unique<dsv41::sequence_state>(hp, opts_.context_tokens, 16, model_.has_draft());
            running_.push_back(std::move(a));
        }
        // Drop cancelled ones (running or still waiting).
        for (auto* list : {&running_, &waiting_})
            for (size_t i = 0; i < list->size();) {
                if ((*list)[i]->gen->cancelled()) {
                    finish(*(*list)[i], "cancelled");
                    list->erase(list->begin() + std::ptrdiff_t(i));
                } else {
                    ++i;
                }
            }
        if (int64_t(running_.size()) < opts_.max_sequences && !waiting_.empty()) continue;  // admit them now
        {
            std::lock_guard lock(stats_mu_);
            stats_.running = int64_t(running_.size());
            stats_.waiting = int64_t(waiting_.size());
        }
        if (running_.empty()) {
            wake_.expires_at(asio::steady_timer::time_point::max());
            boost::system::error_code ec;
            co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        // One forward over every running sequence: a prompt chunk or the last sampled token.
        std::vector<dsv41::forward_item> items;
        std::vector<int64_t> fed;
        for (auto& a : running_) {
            if (a->prompt_done < int64_t(a->req.prompt.size())) {
                const int64_t n = std::min<int64_t>(opts_.prefill_chunk, int64_t(a->req.prompt.size()) - a->prompt_done);
                items.push_back({a->seq.get(), std::span<const int32_t>(a->req.prompt).subspan(size_t(a->prompt_done), size_t(n)), false});
                fed.push_back(n);
            } else {
                items.push_back({a->seq.get(), std::span<const int32_t>(&a->next, 1), false});
                fed.push_back(0);
            }
        }
        std::vector<float> logits;
        // The forward blocks (compute, expert reads): it runs on the compute thread and the
        // strand awaits its completion.
        const status st = co_await asio::co_spawn(
            compute_, [&]() -> asio::awaitable<status> { co_return model_.forward(items, logits); }, asio::use_awaitable);
        {
            std::lock_guard lock(stats_mu_);
            ++stats_.steps;
        }
        // A failed forward changed no sequence. The cause may concern only some of them (an
        // expert only one of them routed to could not be read): run each alone once, so only
        // the requests that hit the fault fail.
        std::vector<std::string> failed(running_.size());
        if (!st) {
            logits.assign(running_.size() * size_t(hp.vocab), 0.0f);
            for (size_t i = 0; i < running_.size(); ++i) {
                std::vector<float> one;
                const status st1 = co_await asio::co_spawn(
                    compute_, [&]() -> asio::awaitable<status> { co_return model_.forward({&items[i], 1}, one); },
                    asio::use_awaitable);
                if (!st1) failed[i] = st1.message();
                else std::copy(one.begin(), one.end(), logits.begin() + std::ptrdiff_t(i * size_t(hp.vocab)));
            }
        }
        std::vector<std::unique_ptr<active>> still_running;
        for (size_t i = 0; i < running_.size(); ++i) {  // row i of the logits is running_[i]'s
            active& a = *running_[i];
            std::span<const float> row(logits.data() + i * size_t(hp.vocab), size_t(hp.vocab));
            bool done = false;
            std::string reason;
            if (!failed[i].empty()) {
                finish(a, "error: " + failed[i]);
                std::lock_guard lock(stats_mu_);
                ++stats_.requests_done;
                continue;
            }
            if (fed[i] > 0) {
                a.prompt_done += fed[i];
                std::lock_guard lock(stats_mu_);
                stats_.prompt_tokens += uint64_t(fed[i]);
            } else {
                a.sample->accept(a.next);
            }
            if (a.prompt_done == int64_t(a.req.prompt.size())) {
                if (auto s = a.sample->sample(row, a.scratch); !s) {
                    done = true;
                    reason = "error: " + s.message();
                } else if (std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), a.scratch.token) !=
                           a.req.stop_tokens.end()) {
                    done = true;
                    reason = "stop";
                } else {
                    a.next = a.scratch.token;
                    ++a.generated;
                    token_event e;
                    e.token = a.next;
                    e.logprob = a.scratch.logprob;
                    a.gen->events().try_send(boost::system::error_code{}, std::move(e));
                    {
                        std::lock_guard lock(stats_mu_);
                        ++stats_.generated_tokens;
                    }
                    if (a.generated >= a.req.max_tokens) done = true, reason = "length";
                    else if (a.seq->size() + 1 >= opts_.context_tokens) done = true, reason = "context";
                }
            }
            if (done) {
                finish(a, reason);
                std::lock_guard lock(stats_mu_);
                ++stats_.requests_done;
            } else {
                still_running.push_back(std::move(running_[i]));
            }
        }
        running_ = std::move(still_running);
    }
    // Shutting down: every request gets its final event.
    for (auto& a : running_) finish(*a, "cancelled");
    for (auto& a : waiting_) finish(*a, "cancelled");
    running_.clear();
    waiting_.clear();
}

}  // namespace moestream
