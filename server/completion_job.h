// One completion request from prompt to final event, independent of the wire format: builds the
// prompt (chat template with tool definitions, plain text, token ids or fill-in-the-middle),
// submits it to the engine, and turns each token event into a transport-neutral update through
// the text pipeline (UTF-8 hold-back -> stop strings -> reasoning / tool-call parser). The HTTP
// routes format updates as OpenAI chunks or llama-server objects; the WebSocket as its deltas.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/sampler.h"
#include "model/tokenizer.h"
#include "scheduler/engine.h"
#include "server/api_error.h"
#include "server/constraint_request.h"
#include "server/metrics.h"
#include "server/output_parser.h"
#include "server/request.h"
#include "server/stop_matcher.h"

namespace moestream::server {

struct served_model;

struct emitted_token {
    int32_t id = 0;
    double logprob = 0;
    std::string bytes;  // the token's raw bytes (may be part of a UTF-8 character)
    std::vector<token_logprob> top;
    bool scored = true;  // false: no log-probability (the first token of an echoed prompt)
};

struct job_usage {
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    int64_t draft_n = 0, draft_n_accepted = 0;  // speculative decoding: tokens drafted, of them accepted
    double queue_s = 0, prefill_s = 0, decode_s = 0;
};

struct job_update {
    output_delta delta;                  // text that became safe to send
    std::vector<emitted_token> tokens;   // tokens behind it (logprobs, native "tokens")
    std::vector<emitted_token> prompt_tokens;  // the first update of echo + logprobs: the prompt's, scored
    bool done = false;
    // OpenAI finish_reason: stop, length, tool_calls; "error" (see error) or "cancelled".
    std::string finish_reason;
    std::string stop_type;               // llama-server: eos, word, limit, none
    std::string stopping_word;
    api_error error;                     // when finish_reason == "error"
    job_usage usage;
};

// How a reply starts and how long it may think, for routes that say so (Anthropic Messages).
struct job_options {
    // The reply starts inside the model's reasoning: the prompt ends with "<think>"
    // (DeepSeek-V3.1's thinking mode) and the output is reasoning until "</think>".
    bool open_reasoning = false;
    // With open_reasoning: the reasoning ends within this many tokens (server/reasoning_budget.h);
    // -1: no limit.
    int64_t reasoning_budget = -1;
    // Text the assistant's reply is given to start with (Anthropic's final assistant message):
    // appended after the generation prompt, not part of the output.
    std::string assistant_prefix;
};

class completion_job {
  public:
    // Validates and submits; errors are the HTTP answer (400 context overflow, 429 queue full,
    // 503 draining...). The output is constrained when the request forces a tool call or
    // `constraint` asks for JSON (server/output_constraint.h), and while a reasoning budget runs.
    // With parallel_tool_calls false the reply ends after its first complete tool call.
    static api_result<std::unique_ptr<completion_job>> start(const served_model& m, completion_request req,
                                                             constraint_spec constraint = {}, job_options opts = {});
    // The prompt start() would submit (token counting: the same rendering as generation).
    static api_result<std::vector<int32_t>> render_prompt(const served_model& m, const completion_request& req,
                                                          const job_options& opts = {});
    ~completion_job();  // cancels the generation if it is still running

    // The next update, or nullopt when nothing arrived within `wait`. After an update with
    // done = true there are no more.
    boost::asio::awaitable<std::optional<job_update>> next(std::chrono::milliseconds wait);
    void cancel();
    // cancel(), and completes a pending next() with an error now (the transport is going away).
    void abandon();

    const completion_request& request() const { return req_; }
    const std::vector<int32_t>& prompt() const { return prompt_; }
    // The prompt as the client sent it (echo): its text, or the decoded ids it gave.
    std::string prompt_text() const;
    const output_parser& parser() const { return parser_; }
    const served_model& model() const { return model_; }
    // Request id material: a deterministic per-job number (ids of chunks and tool calls).
    uint64_t serial() const { return serial_; }
    std::chrono::steady_clock::time_point arrival() const { return arrival_; }

  private:
    completion_job(const served_model& m, completion_request req, std::vector<int32_t> prompt, uint64_t serial,
                   bool open_reasoning);
    job_update from_event(const token_event& e);
    std::vector<emitted_token> echoed_prompt(const std::vector<prompt_score>& scores) const;
    void finish_text(job_update& u);
    // Ends the reply before the engine does (a stop string, the first tool call when parallel
    // calls are off): flushes the parser into `u` and marks it final.
    void end_early(job_update& u, const token_event& e, std::string stop_type);

    const served_model& model_;
    completion_request req_;
    std::vector<int32_t> prompt_;
    uint64_t serial_;
    std::chrono::steady_clock::time_point arrival_ = std::chrono::steady_clock::now();
    std::shared_ptr<generation> gen_;
    utf8_stream_decoder utf8_;
    stop_matcher stops_;
    output_parser parser_;
    bool done_ = false;
    std::atomic<bool> abandoned_{false};  // next() no longer waits on the engine
    bool stopped_by_word_ = false;
    bool prompt_echoed_ = false;  // the scored prompt went out with an update
};

// Drives a started job for a route handler: next() waits for the job's updates within the
// request's time limit (past it the job is cancelled and ends with a 504 error; a job cancelled
// by the shutdown ends with a 503 error) and reports the finished request to the metrics (queue,
// prefill and decode time, TTFT, inter-token gaps, tokens, finish reason), as service.cpp's
// completion routes do.
class job_driver {
  public:
    job_driver(completion_job& job, server_metrics& metrics, std::chrono::seconds time_limit);
    boost::asio::awaitable<std::optional<job_update>> next(std::chrono::milliseconds wait);

  private:
    void observe(const job_update& u);

    completion_job& job_;
    server_metrics& metrics_;
    std::chrono::steady_clock::time_point deadline_;
    std::chrono::seconds time_limit_;
    request_observation obs_;
    std::optional<std::chrono::steady_clock::time_point> first_token_, last_emit_;
};

}  // namespace moestream::server
