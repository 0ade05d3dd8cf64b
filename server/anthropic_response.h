// Wire shapes of the Anthropic Messages route: the error object, the message object and its SSE
// events, and the content blocks both are built from.
//
// Content blocks come from the job's updates in the order the model wrote them: thinking (its
// reasoning), text, tool_use. A tool call whose arguments are guaranteed to be a JSON object (a
// forced call: constrained decoding) streams its input_json_delta fragments as they come; any
// other call is held until it is complete and its arguments parse as a JSON object, then sent
// whole, so the fragments a client concatenates are always valid JSON. A call that ends
// incomplete or with other arguments is no tool_use: it becomes a text block saying so, with
// the arguments as written (nothing is lost, nothing runs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/completion_job.h"
#include "server/service.h"

namespace moestream::server {

// ---- errors ----------------------------------------------------------------------------------

// An internal error in Anthropic's terms: the status it answers with and its error type
//   400 invalid_request_error (a context overflow says "prompt is too long: N tokens > M maximum",
//   M the longest prompt that fits), 401 authentication_error, 403 permission_error,
//   404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500/501 api_error,
//   503 and 529 overloaded_error, 504 timeout_error.
api_error anthropic_error(const api_error& e);
// {"type":"error","error":{"type":...,"message":...}} of anthropic_error(e).
std::string anthropic_error_json(const api_error& e);
// The HTTP answer: anthropic_error(e)'s status and body, retry-after on 429, 503 and 529.
http_response anthropic_error_response(const api_error& e);
// Whether a path is one of this API's (its errors take this shape).
bool is_anthropic_path(std::string_view path);

// ---- content ---------------------------------------------------------------------------------

enum class block_kind { thinking, text, tool_use };

struct content_block {
    block_kind kind = block_kind::text;
    std::string text;   // thinking / text
    std::string id;     // tool_use: "toolu_..."
    std::string name;   // tool_use
    std::string input;  // tool_use: the arguments as the model wrote them
    // tool_use: input is one JSON object (false only for a streamed call cut off before its end:
    // the whole message then holds {}).
    bool input_valid = false;
};

// What happened to the blocks in one update: a block started, got a fragment, or stopped.
struct block_event {
    enum type_t { start, delta, stop } type = start;
    size_t index = 0;
    std::string fragment;  // delta: text / thinking / partial JSON
};

class anthropic_content {
  public:
    // `parser`: the job's (completion_job::parser()), which says when a call is complete.
    // display_thinking false: thinking blocks carry no text. stream_tool_input: tool-call
    // arguments are certain to be a JSON object (forced call), so they stream as they come.
    anthropic_content(const output_parser& parser, bool display_thinking, bool stream_tool_input)
        : parser_(parser), display_thinking_(display_thinking), stream_tool_input_(stream_tool_input) {}

    void on_update(const job_update& u, std::vector<block_event>& events);
    // The end: held calls are decided, the open block stops.
    void finish(std::vector<block_event>& events);

    const std::vector<content_block>& blocks() const { return blocks_; }
    bool has_tool_use() const;

  private:
    struct held_call {
        int index = -1;                   // the parser's call number
        std::string id, name, arguments;  // arguments: held ones only
        std::optional<size_t> block;      // streamed: its tool_use block
    };
    void open_block(content_block b, std::vector<block_event>& events);
    void close_block(std::vector<block_event>& events);
    void append(block_kind kind, std::string_view text, std::vector<block_event>& events);
    void call_fragments(const tool_call_delta& d, std::vector<block_event>& events);
    void release_complete_calls(bool at_end, std::vector<block_event>& events);

    const output_parser& parser_;
    bool display_thinking_, stream_tool_input_;
    std::vector<content_block> blocks_;
    bool block_open_ = false;
    std::vector<held_call> calls_;  // held (not yet sent) or streamed-and-open calls
};

// ---- message ---------------------------------------------------------------------------------

struct anthropic_usage {
    int64_t input_tokens = 0, cache_creation_input_tokens = 0, cache_read_input_tokens = 0, output_tokens = 0;
};
// The prefix cache's figures in Anthropic's terms. Every prompt token the request processed is
// kept in the engine's prefix cache for the next request (cache_creation_input_tokens); those
// read from it are cache_read_input_tokens; input_tokens are the ones neither, which is none while
// the prompt is cached (the server caches every prompt, as with automatic caching).
anthropic_usage anthropic_usage_of(const job_usage& u, bool cached_prompt);

struct anthropic_stop {
    std::string reason;    // end_turn, max_tokens, stop_sequence, tool_use, model_context_window_exceeded
    std::string sequence;  // the stop sequence, for stop_sequence
};
// The stop of a finished (not failed) job. max_tokens: what the request asked for.
anthropic_stop anthropic_stop_of(const job_update& last, const anthropic_content& content,
                                 int64_t max_tokens);

struct anthropic_meta {
    std::string id;     // msg_...
    std::string model;  // as sent, or the served alias
};

std::string anthropic_message_json(const anthropic_meta& meta, const anthropic_content& content,
                                   const anthropic_stop& stop, const anthropic_usage& usage);

// SSE events ("event: NAME\ndata: {...}\n\n").
// `usage`: the figures known when the job is accepted, before the prompt is processed: how much of
// it the prefix cache holds is not known yet, so the whole prompt counts as new
// (anthropic_usage_of with nothing cached); message_delta then carries the final split (clients
// take it over field by field), and the totals agree in both.
std::string sse_message_start(const anthropic_meta& meta, const anthropic_usage& usage);
std::string sse_ping();
std::string sse_blocks(const anthropic_content& content, const std::vector<block_event>& events);
std::string sse_message_end(const anthropic_stop& stop, const anthropic_usage& usage);
std::string sse_error(const api_error& e);

// Anthropic's id of a call ("toolu_" + 24 letters), the same for the same call id within a run
// and distinct across runs.
std::string anthropic_tool_id(std::string_view call_id);

}  // namespace moestream::server
