#include "server/completion_job.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <random>

#include "model/chat_template.h"
#include "server/output_constraint.h"
#include "server/reasoning_budget.h"
#include "server/service.h"
#include "server/tool_prompt.h"

namespace moestream::server {

namespace asio = boost::asio;

namespace {

std::atomic<uint64_t> g_serial{1};

api_error unavailable(std::string message) { return make_api_error(503, "unavailable_error", std::move(message)); }

// A token of the model's vocabulary by its exact text, or an error naming what is missing.
api_result<int32_t> special_token(const tokenizer& tok, std::string_view text, std::string_view what) {
    const int32_t id = tok.find_added(text);
    if (id < 0) {
        return make_api_error(501, "not_supported_error",
                              std::string(what) + ": this model's vocabulary has no " + std::string(text) + " token");
    }
    return id;
}

api_result<std::vector<int32_t>> build_prompt(const served_model& m, const completion_request& r,
                                              const job_options& opts) {
    std::vector<int32_t> ids;
    const tokenizer* tok = m.tok;
    auto need_tokenizer = [&](std::string_view what) {
        return bad_request(std::string(what), "this model has no tokenizer: send the prompt as token ids");
    };
    switch (r.route) {
        case api_route::chat_completions: {
            if (!tok) return need_tokenizer("messages");
            std::vector<chat_message> messages = r.messages;
            if (!r.tools.empty() && r.choice.kind != tool_choice::none) {
                std::vector<tool_definition_view> views;
                for (const auto& t : r.tools) views.push_back({t.name, t.description, t.parameters_json});
                std::string_view choice = r.choice.kind == tool_choice::required ? "required"
                                          : r.choice.kind == tool_choice::function ? std::string_view(r.choice.function_name)
                                                                                    : "auto";
                messages = with_tool_definitions(std::move(messages), views, choice);
            }
            chat_special_tokens special;
            special.bos = tok->token_bytes(tok->data().bos_id);
            special.eos = tok->token_bytes(tok->data().eos_id);
            auto text = render_chat(messages, true, special);
            if (!text) return bad_request("messages", text.message());
            if (opts.open_reasoning) *text += "<think>";
            *text += opts.assistant_prefix;
            ids = tok->encode(*text, true);
            break;
        }
        case api_route::completions:
        case api_route::native_completion: {
            if (!r.prompt_tokens.empty()) {
                ids = r.prompt_tokens;
                break;
            }
            if (!tok) return need_tokenizer("prompt");
            if (tok->data().add_bos) ids.push_back(tok->data().bos_id);
            const auto body = tok->encode(r.prompt_text.value_or(""), true);
            ids.insert(ids.end(), body.begin(), body.end());
            if (!r.suffix.empty())
                return bad_request("suffix", "suffix is not supported on this route: use POST /infill");
            break;
        }
        case api_route::infill: {
            if (!tok) return need_tokenizer("input_prefix");
            int32_t fim[3];
            const char* names[3] = {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"};
            for (int i = 0; i < 3; ++i) {
                auto id = special_token(*tok, names[i], "infill");
                if (!id) return id.error();
                fim[i] = *id;
            }
            if (tok->data().add_bos) ids.push_back(tok->data().bos_id);
            ids.push_back(fim[0]);
            std::string prefix;
            for (const auto& [file, text] : r.infill_extra) prefix += "// " + file + "\n" + text + "\n";
            prefix += r.infill_prefix;
            auto add = [&](const std::string& s) {
                const auto t = tok->encode(s, false);
                ids.insert(ids.end(), t.begin(), t.end());
            };
            add(prefix);
            ids.push_back(fim[1]);
            add(r.suffix);
            ids.push_back(fim[2]);
            if (r.prompt_text) add(*r.prompt_text);
            break;
        }
    }
    if (ids.empty()) return bad_request("prompt", "the prompt is empty");
    for (int32_t id : ids)
        if (id < 0 || id >= m.n_vocab)
            return bad_request("prompt", "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                             std::to_string(m.n_vocab));
    return api_result<std::vector<int32_t>>(std::move(ids));
}

parser_options parser_for(const completion_request& r, uint64_t serial, bool open_reasoning) {
    parser_options o;
    o.tools_enabled = r.route == api_route::chat_completions && !r.tools.empty() && r.choice.kind != tool_choice::none;
    o.reasoning_enabled = r.route == api_route::chat_completions && !r.reasoning_in_content;
    o.starts_in_reasoning = open_reasoning;
    o.id_seed = serial;
    return o;
}

// The reasoning budget of a reply that starts inside its reasoning, or null when there is none.
api_result<std::shared_ptr<token_constraint>> budget_for(const served_model& m, const job_options& opts) {
    if (!opts.open_reasoning || opts.reasoning_budget < 0)
        return api_result<std::shared_ptr<token_constraint>>(std::shared_ptr<token_constraint>());
    if (!m.tok) return bad_request("thinking", "this model has no tokenizer, which a thinking budget needs");
    auto table = token_table::of(*m.tok);
    int32_t close = m.tok->find_added(reasoning_budget::k_close);
    if (close >= 0 && (close >= table->vocab() || table->bytes(close) != reasoning_budget::k_close)) close = -1;
    auto budget = reasoning_budget::make(std::move(table), close, std::max<int64_t>(opts.reasoning_budget, 1));
    if (!budget)
        return make_api_error(501, "not_supported_error",
                              "thinking budget: this model's vocabulary cannot spell " +
                                  std::string(reasoning_budget::k_close));
    return api_result<std::shared_ptr<token_constraint>>(std::shared_ptr<token_constraint>(std::move(budget)));
}

}  // namespace

completion_job::completion_job(const served_model& m, completion_request req, std::vector<int32_t> prompt,
                               uint64_t serial, bool open_reasoning)
    : model_(m),
      req_(std::move(req)),
      prompt_(std::move(prompt)),
      serial_(serial),
      stops_(req_.stop),
      parser_(parser_for(req_, serial, open_reasoning)) {}

completion_job::~completion_job() { cancel(); }

// Any thread (shutdown cancels jobs from outside their connection's strand): only the
// generation's atomic flag is touched.
void completion_job::cancel() {
    if (gen_) gen_->cancel();
}

void completion_job::abandon() {
    // The flag first: a coroutine resumed later (its handler was already queued) must not start
    // a new wait on the channel after the pending ones were cancelled.
    abandoned_ = true;
    if (!gen_) return;
    gen_->cancel();
    gen_->events().cancel();
}

api_result<std::vector<int32_t>> completion_job::render_prompt(const served_model& m, const completion_request& req,
                                                               const job_options& opts) {
    return build_prompt(m, req, opts);
}

api_result<std::unique_ptr<completion_job>> completion_job::start(const served_model& m, completion_request req,
                                                                  constraint_spec constraint, job_options opts) {
    if (!m.eng) return unavailable("Loading model");
    auto prompt = build_prompt(m, req, opts);
    if (!prompt) return prompt.error();
    auto& ids = *prompt;
    const int64_t n_prompt = int64_t(ids.size());
    if (n_prompt >= m.n_ctx) return context_exceeded(n_prompt, m.n_ctx);

    generation_request g;
    g.prompt = ids;
    g.sampling = req.sampling;
    g.sampling.n_probs = req.n_probs;
    if (!req.seed_given) {
        std::random_device rd;
        g.sampling.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }
    // Generation runs until the context is full unless the client asked for less (agents send
    // large max_tokens routinely: that is a cap, not an error).
    const int64_t room = m.n_ctx - n_prompt;
    g.max_tokens = req.max_tokens < 0 ? room : std::min(req.max_tokens, room);
    // max_tokens 0 processes the prompt only (with echo and logprobs: scores it).
    g.prompt_only = req.max_tokens == 0;
    g.score_prompt = req.route == api_route::completions && req.echo && req.logprobs_enabled;
    if (!req.ignore_eos && m.eos_id >= 0) g.stop_tokens.push_back(m.eos_id);
    g.reuse_prefix = req.cache_prompt;
    g.spec_max = req.spec_n_max;
    if (auto st = g.sampling.validate(m.n_vocab); !st) return bad_request("", st.message());
    // A forced tool call or JSON output: the parser needs no change, the text is what it reads.
    auto forced = constraint_for_request(req, constraint, m.tok, g.max_tokens, opts.open_reasoning);
    if (!forced) return forced.error();
    g.constraint = std::move(*forced);
    auto budget = budget_for(m, opts);
    if (!budget) return budget.error();
    if (*budget) {
        // A constrained output after the reasoning (built with open_reasoning: it waits for
        // "</think>") and the budget that ends the reasoning in time both hold.
        if (g.constraint)
            g.constraint = std::make_shared<budgeted_output>(std::static_pointer_cast<reasoning_budget>(*budget),
                                                             std::move(g.constraint));
        else
            g.constraint = std::move(*budget);
    }

    const uint64_t serial = g_serial.fetch_add(1);
    std::unique_ptr<completion_job> job(
        new completion_job(m, std::move(req), std::move(ids), serial, opts.open_reasoning));
    auto gen = m.eng->submit(std::move(g));
    if (!gen) {
        api_error e;
        const auto& msg = gen.message();
        if (msg.rfind("the server is busy", 0) == 0) {
            e.status = 429;
            e.type = "rate_limit_error";
        } else {
            e.status = 400;
        }
        e.message = msg;
        return e;
    }
    job->gen_ = std::move(*gen);
    return api_result<std::unique_ptr<completion_job>>(std::move(job));
}

// Echo gives the prompt back as the client sent it: its text (decoding the ids would add the
// BOS the server put in front: "<｜begin▁of▁sentence｜>Once upon..."), or the text of its ids.
std::string completion_job::prompt_text() const {
    if (req_.prompt_text) return *req_.prompt_text;
    if (!model_.tok) return {};
    return model_.tok->decode(req_.prompt_tokens.empty() ? prompt_ : req_.prompt_tokens);
}

void completion_job::finish_text(job_update& u) {
    std::string tail = utf8_.finish();
    std::string safe = stops_.push(tail);
    if (!stops_.stopped()) safe += stops_.finish();
    auto d = parser_.push(safe);
    auto f = parser_.finish();
    u.delta.content += d.content + f.content;
    u.delta.reasoning += d.reasoning + f.reasoning;
    for (auto* v : {&d.tool_calls, &f.tool_calls}) u.delta.tool_calls.insert(u.delta.tool_calls.end(), v->begin(), v->end());
}

void completion_job::end_early(job_update& u, const token_event& e, std::string stop_type) {
    auto f = parser_.finish();
    u.delta.content += f.content;
    u.delta.reasoning += f.reasoning;
    u.delta.tool_calls.insert(u.delta.tool_calls.end(), f.tool_calls.begin(), f.tool_calls.end());
    u.done = true;
    u.finish_reason = parser_.saw_tool_calls() ? "tool_calls" : "stop";
    u.stop_type = std::move(stop_type);
    u.usage.completion_tokens = e.completion_tokens ? e.completion_tokens : 0;
}

// The prompt's tokens as echoed (without the BOS the server put in front of a text prompt),
// with the log-probabilities the engine scored; the first has none (OpenAI's legacy shape).
std::vector<emitted_token> completion_job::echoed_prompt(const std::vector<prompt_score>& scores) const {
    std::vector<emitted_token> out;
    const tokenizer* tok = model_.tok;
    const size_t first = req_.prompt_text && tok && tok->data().add_bos ? 1 : 0;
    for (size_t i = first; i < prompt_.size(); ++i) {
        emitted_token t;
        t.id = prompt_[i];
        if (tok) t.bytes = tok->token_bytes(t.id);
        t.scored = i > first && i - 1 < scores.size();
        if (t.scored) {
            t.logprob = scores[i - 1].logprob;
            t.top = scores[i - 1].top;
        }
        out.push_back(std::move(t));
    }
    return out;
}

job_update completion_job::from_event(const token_event& e) {
    job_update u;
    if (req_.route == api_route::completions && req_.echo && req_.logprobs_enabled && !prompt_echoed_) {
        prompt_echoed_ = true;
        u.prompt_tokens = echoed_prompt(e.prompt_scores);
    }
    u.usage.prompt_tokens = e.prompt_tokens ? e.prompt_tokens : int64_t(prompt_.size());
    u.usage.cached_tokens = e.cached_tokens;
    u.usage.completion_tokens = e.completion_tokens;
    u.usage.draft_n = e.draft_n;
    u.usage.draft_n_accepted = e.draft_n_accepted;
    u.usage.queue_s = e.queue_s;
    u.usage.prefill_s = e.prefill_s;
    u.usage.decode_s = e.decode_s;
    if (!e.done) {
        emitted_token t;
        t.id = e.token;
        t.logprob = e.logprob;
        t.top = e.top;
        if (model_.tok) t.bytes = model_.tok->token_bytes(e.token);
        const std::string text = utf8_.push(t.bytes);
        u.tokens.push_back(std::move(t));
        const std::string safe = stops_.push(text);
        u.delta = parser_.push(safe);
        if (stops_.stopped()) {
            // A stop string ended the text: the engine stops at its next step.
            stopped_by_word_ = true;
            end_early(u, e, "word");
            u.stopping_word = stops_.matched();
        } else if (!req_.parallel_tool_calls && !parser_.tool_calls().empty() && parser_.tool_calls()[0].complete) {
            // One call at most: what follows the first is not read.
            end_early(u, e, "eos");
        }
        return u;
    }
    u.done = true;
    finish_text(u);
    const std::string& r = e.finish_reason;
    if (r == "stop") {
        u.finish_reason = "stop";
        u.stop_type = "eos";
    } else if (r == "length" || r == "context") {
        u.finish_reason = "length";
        u.stop_type = "limit";
    } else if (r == "cancelled") {
        u.finish_reason = "cancelled";
        u.stop_type = "none";
    } else {
        u.finish_reason = "error";
        u.stop_type = "none";
        u.error.status = 500;
        u.error.type = "server_error";
        u.error.message = r.rfind("error: ", 0) == 0 ? r.substr(7) : r;
    }
    if (parser_.saw_tool_calls() && (u.finish_reason == "stop")) u.finish_reason = "tool_calls";
    return u;
}

asio::awaitable<std::optional<job_update>> completion_job::next(std::chrono::milliseconds wait) {
    MS_ASSERT_MSG(!done_, "completion_job::next after the final update");
    if (abandoned_) {
        done_ = true;
        job_update u;
        u.done = true;
        u.finish_reason = "error";
        u.error = make_api_error(503, "unavailable_error", "the server is shutting down");
        co_return u;
    }
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(wait);
    // Both waits run as coroutines of this executor (the channel's own executor is not run)
    // in a parallel group, which reports both outcomes: an event handed over just as the timer
    // fired is still used. (`receive || timer` returns the winner's result only and would drop
    // it: a token lost from the stream while usage still counts it.)
    auto receive = [](generation::channel& ch) -> asio::awaitable<std::tuple<boost::system::error_code, token_event>> {
        co_return co_await ch.async_receive(asio::as_tuple(asio::use_awaitable));
    };
    auto sleep = [](asio::steady_timer& t) -> asio::awaitable<void> {
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    };
    const auto ex = co_await asio::this_coro::executor;
    auto [order, receive_failure, got, sleep_failure] =
        co_await asio::experimental::make_parallel_group(asio::co_spawn(ex, receive(gen_->events()), asio::deferred),
                                                         asio::co_spawn(ex, sleep(timer), asio::deferred))
            .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    (void)sleep_failure;
    if (receive_failure) std::rethrow_exception(receive_failure);
    auto& [ec, event] = got;
    if (ec && order[0] == 1) co_return std::nullopt;  // the timer fired; the receive was cancelled
    if (ec) {
        job_update u;
        u.done = true;
        u.finish_reason = "error";
        u.error.status = 500;
        u.error.type = "server_error";
        u.error.message = "the generation's event channel failed: " + ec.message();
        done_ = true;
        co_return u;
    }
    job_update u = from_event(event);
    if (u.done) {
        if (!event.done) gen_->cancel();  // stopped by a stop string: free the sequence
        done_ = true;
    }
    co_return u;
}

// ---- job_driver ------------------------------------------------------------------------------

job_driver::job_driver(completion_job& job, server_metrics& metrics, std::chrono::seconds time_limit)
    : job_(job), metrics_(metrics), deadline_(job.arrival() + time_limit), time_limit_(time_limit) {}

void job_driver::observe(const job_update& u) {
    const auto now = std::chrono::steady_clock::now();
    auto seconds = [](std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); };
    if (!u.tokens.empty()) {
        if (!first_token_) first_token_ = now;
        else if (last_emit_) obs_.itl_s.push_back(seconds(now - *last_emit_));
        last_emit_ = now;
    }
    if (!u.done) return;
    obs_.queue_s = u.usage.queue_s;
    obs_.prefill_s = u.usage.prefill_s;
    obs_.decode_s = u.usage.decode_s;
    obs_.ttft_s = seconds((first_token_ ? *first_token_ : now) - job_.arrival());
    obs_.e2e_s = seconds(now - job_.arrival());
    obs_.prompt_tokens = u.usage.prompt_tokens;
    obs_.cached_tokens = u.usage.cached_tokens;
    obs_.completion_tokens = u.usage.completion_tokens;
    obs_.finish_reason = u.finish_reason == "cancelled" ? "abort" : u.finish_reason;
    metrics_.observe_request(obs_);
}

asio::awaitable<std::optional<job_update>> job_driver::next(std::chrono::milliseconds wait) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) {
        job_.cancel();
        job_update u;
        u.done = true;
        u.finish_reason = "error";
        u.error = make_api_error(504, "timeout_error", "the request took longer than the server's limit of " +
                                                           std::to_string(time_limit_.count()) + " s");
        observe(u);
        co_return u;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now) + std::chrono::milliseconds(1);
    auto u = co_await job_.next(std::min(wait, left));
    if (!u) co_return u;
    observe(*u);
    if (u->done && u->finish_reason == "cancelled") {
        u->finish_reason = "error";
        u->error = make_api_error(503, "unavailable_error", "the request was cancelled: the server is shutting down");
    }
    co_return u;
}

}  // namespace moestream::server
