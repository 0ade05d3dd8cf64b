// The /v1/ws protocol (`llmstream.v1`, docs/websocket.md) as values: client messages parsed out of
// one text frame, and the JSON text of every server message. No I/O here: the session
// (server/websocket_session.cpp) moves these through the socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/completion_job.h"
#include "server/output_parser.h"
#include "server/request.h"

namespace moestream::server {

inline constexpr std::string_view k_ws_subprotocol = "llmstream.v1";

// Per-connection limits, announced in session.created.
struct websocket_limits {
    size_t max_message_bytes = (8u << 20) + (64u << 10);  // a larger client message: close 1009
    size_t max_inflight = 8;                              // live requests per connection
    size_t soft_queue_bytes = 256u << 10;  // above: consecutive deltas of one request are merged
    size_t hard_queue_bytes = 4u << 20;    // above: the connection is a slow consumer (1008)
    size_t max_id_bytes = 256;
    size_t max_defaults_bytes = 64u << 10;  // session.update defaults, as JSON text
    size_t max_ping_bytes = 64u << 10;      // ping's "t", as JSON text (a pong echoes it)
};

// What the client asked about one request's events (request.create "options").
struct ws_request_options {
    bool include_usage = true;  // request.done carries usage
    bool timings = true;        // request.done carries timings
    bool token_ids = false;     // deltas carry the ids of their tokens
};

struct ws_create {
    std::string id;
    api_route route = api_route::chat_completions;
    std::string body;  // the HTTP body, as one JSON object text
    ws_request_options options;
};
struct ws_cancel {
    std::string id;
};
struct ws_ping {
    std::string t_json;  // the raw JSON value of "t", echoed by pong; empty when absent
};
struct ws_session_update {
    std::string defaults_members;  // the members of "defaults" as JSON text without braces; "" clears
};
// A message that cannot be acted on. `id` is set only for a request.create whose id was readable:
// then the error ends that request (unless the id is live: the session decides).
struct ws_bad_message {
    api_error error;
    std::string id;
};

using ws_client_message = std::variant<ws_create, ws_cancel, ws_ping, ws_session_update, ws_bad_message>;

// One text frame from the client. Never fails otherwise: whatever is wrong becomes ws_bad_message.
ws_client_message parse_client_message(std::string_view text, const websocket_limits& limits);

// The body of a request.create with the session's defaults added: a member of `body` (even null)
// wins over a default of the same name. Relies on the request parser's "first occurrence of a key
// counts" rule, so the defaults simply follow the body's own members.
std::string body_with_defaults(const std::string& body, const std::string& defaults_members);

// One streamed piece of a request's output. Within one delta the order is reasoning, content,
// tool_call (the order the model writes them in).
struct ws_delta {
    std::string reasoning, content;
    std::optional<tool_call_delta> call;
    std::vector<int32_t> token_ids;
    bool has_text() const { return !reasoning.empty() || !content.empty() || call.has_value(); }
};

// The deltas of one job update: entries of the same tool call are folded into one tool_call;
// every further call gets a delta of its own. An update without text gives a delta only when
// token ids were asked for (and it has tokens).
std::vector<ws_delta> deltas_of(const job_update& u, bool token_ids);

// Whether `later` can be appended to `earlier` without changing what the client reconstructs.
bool can_merge(const ws_delta& earlier, const ws_delta& later);
void merge_into(ws_delta& earlier, ws_delta&& later);

// ---- server messages (JSON text) ----------------------------------------------------------------

struct ws_session_info {
    std::string server, model;
    int64_t n_ctx = 0, max_parallel = 0;
};
std::string session_created_json(const ws_session_info& info, const websocket_limits& limits);
std::string session_updated_json(const std::string& defaults_members);
std::string request_accepted_json(std::string_view id);
std::string delta_json(std::string_view id, uint64_t seq, const ws_delta& d);
// finish_reason: stop | length | tool_calls | cancelled | error.
std::string request_done_json(std::string_view id, std::string_view finish_reason, const job_usage& usage,
                              const ws_request_options& options);
// `id` empty: a connection-level error.
std::string error_json(std::string_view id, const api_error& e);
std::string pong_json(std::string_view t_json);

}  // namespace moestream::server
