// POST /v1/responses (OpenAI's Responses API, the Codex CLI's wire): the request
// (server/responses_request.h) continues a stored conversation when it names one
// (previous_response_id, server/responses_store.h), becomes a chat completion_request and runs
// through completion_job like the chat route (prompt, tool calls, reasoning, stop, constraints,
// prefix cache), and is answered as a response object or its event stream
// (server/responses_stream.h).
//
// Errors: bad input, an unknown previous_response_id and a function_call_output without its call
// are HTTP 400s naming the field. A streamed request whose prompt does not fit the context or
// that finds the wait queue full gets a 200 stream ending with response.failed
// (context_length_exceeded / rate_limit_exceeded), the form Codex acts on (a context error, a
// retry after the delay); a whole request gets the HTTP error (400 / 429). After the stream
// started every failure is response.failed.
#pragma once

#include <boost/asio/awaitable.hpp>

#include "server/service.h"

namespace moestream::server {

// Answers one request; returns the HTTP status it sent.
boost::asio::awaitable<int> serve_responses(service& s, const api_request& req, responder& out);

}  // namespace moestream::server
