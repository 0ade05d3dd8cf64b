// The Responses wire shapes (what the OpenAI SDKs and the Codex CLI read): the response object
// and its stream of events, built from a completion job's updates. One builder serves both: a
// streamed request sends the events as they come, a whole one sends response_json() at the end.
//
// Output items, in the order the model writes them: "reasoning" (its reasoning_text), "message"
// (one output_text part), "function_call" (one per tool call, with its call_id). Every event has
// `type` and `sequence_number` (0, 1, 2, ... per response):
//   response.created, response.in_progress             the response, status in_progress, output []
//   response.output_item.added                          an item starts (status in_progress)
//   response.content_part.added                         its part (message, reasoning)
//   response.output_text.delta / .done                  message text
//   response.reasoning_text.delta / .done               reasoning text
//   response.function_call_arguments.delta / .done      a call's arguments (fragments concatenate
//                                                       to the arguments of the .done event)
//   response.content_part.done, response.output_item.done   the complete part / item (Codex takes
//                                                       items, tool calls included, only from these)
//   response.completed | response.incomplete | response.failed   the final response object
// Status: completed (end of sequence, a finished forced call or JSON object), incomplete with
// incomplete_details.reason "max_output_tokens" (the token limit or the end of the context; the
// last item is then "incomplete" too), failed with error {code, message}: code
// context_length_exceeded (the prompt does not fit), rate_limit_exceeded (the wait queue is full;
// the message says "try again in 1s", which Codex's retry reads), server_error otherwise.
// usage: input_tokens (all prompt tokens), input_tokens_details.cached_tokens (of them, reused
// from the prefix cache), output_tokens, output_tokens_details.reasoning_tokens (tokens generated
// up to the end of the reasoning), total_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/api_error.h"
#include "server/completion_job.h"
#include "server/responses_request.h"

namespace moestream::server {

// "resp_", "msg_", "fc_", "rs_", "call_" + 32 hex digits: a random per-process part and a
// counter, so an id never repeats within a process and an id kept by a client from an earlier
// process is not taken for a new response.
std::string new_response_id(std::string_view prefix);

// One server-sent event: `event: type` + `data: data`.
struct sse_event {
    std::string type, data;
    std::string wire() const { return "event: " + type + "\ndata: " + data + "\n\n"; }
};

// The error code of a failed response (see above) and its message.
std::string response_error_code(const api_error& e);

class response_builder {
  public:
    response_builder(std::string id, int64_t created_at, std::string model, response_echo echo);

    // The stream's first events: response.created, response.in_progress.
    void begin(std::vector<sse_event>* out);
    // One update of the job; the final one ends the response. `out` null: no events (a whole
    // response is built).
    void on_update(const job_update& u, std::vector<sse_event>* out);
    // Ends the response as failed (an open item ends incomplete): response.failed.
    void fail(const api_error& e, std::vector<sse_event>* out);
    // While a long prompt is processed: response.in_progress again, a real event that keeps a
    // client's idle timer alive (Codex counts events, not SSE comments). Once an item exists
    // nullopt: an SDK would take a repeated in_progress for a fresh snapshot of the response.
    std::optional<sse_event> keep_alive();

    bool finished() const { return status_ != "in_progress"; }
    const std::string& status() const { return status_; }
    const std::string& id() const { return id_; }
    // The response object as it stands.
    std::string response_json() const;
    // The output as conversation items (messages and function calls; reasoning is not replayed).
    std::vector<conversation_item> output_items() const;

  private:
    struct item {
        enum kind_t { reasoning, message, function_call } kind = message;
        std::string id;
        std::string text;                       // reasoning or message text
        std::string call_id, name, arguments;   // function_call
        std::string status = "in_progress";
    };

    sse_event event(std::string_view type, const std::function<void(json_writer&)>& fields);
    void write_response(json_writer& w) const;
    void write_item(json_writer& w, const item& it) const;
    void append_text(item::kind_t kind, const std::string& text, std::vector<sse_event>* out);
    void on_call(const tool_call_delta& d, std::vector<sse_event>* out);
    void open_item(item it, std::vector<sse_event>* out);
    void close_open_item(std::string status, std::vector<sse_event>* out);
    void count_tokens(const job_update& u);
    void end(std::string_view event_type, std::vector<sse_event>* out);

    std::string id_;
    int64_t created_at_;
    std::string model_;
    response_echo echo_;
    std::string status_ = "in_progress";
    std::optional<api_error> error_;
    std::vector<item> items_;
    int open_ = -1;                             // the item receiving deltas, -1: none
    std::unordered_map<int, size_t> calls_;     // the parser's call index -> item
    int64_t sequence_ = 0;
    job_usage usage_;
    bool usage_known_ = false;
    int64_t reasoning_tokens_ = 0, undecided_tokens_ = 0;
};

}  // namespace moestream::server
