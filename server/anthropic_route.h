// The Anthropic Messages routes (Claude Code's API): POST /v1/messages (also with ?beta=true; the
// anthropic-version and anthropic-beta headers are accepted, x-api-key or a Bearer token go through
// the server's key check) and POST /v1/messages/count_tokens. A request is parsed into the
// internal completion_request (server/anthropic_request.h) and runs as a completion_job, like the
// chat route; the answers are Anthropic's shapes (server/anthropic_response.h).
//
// Streaming: message_start goes out as soon as the job is accepted (before the prompt is
// processed: a long prompt does not look like a dead connection), `ping` whenever nothing was
// written for the ping interval (prefill, a tool call being held until complete, queueing), then
// the content block events, message_delta and message_stop. An error before the stream started
// is an HTTP error; after, an `event: error` and the stream ends.
//
// A full wait queue answers 529 overloaded_error, or 429 rate_limit_error when the request's
// own API key holds at least half of the requests the server has running and waiting (the client
// is over its share, not the server overloaded by others); without API keys requests cannot be
// told apart and a full queue is always 529.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/service.h"

namespace moestream::server {

class anthropic_route {
  public:
    explicit anthropic_route(service& s) : s_(s) {}

    boost::asio::awaitable<int> messages(const api_request& req, responder& out);
    boost::asio::awaitable<int> count_tokens(const api_request& req, responder& out);

    // Requests of this route in flight under an API key (tests).
    int64_t in_flight(std::string_view api_key) const;

  private:
    class in_flight_mark;
    api_error queue_full(std::string_view api_key, const api_error& refused) const;

    service& s_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, int64_t> in_flight_;
};

}  // namespace moestream::server
