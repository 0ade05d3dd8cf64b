// The multiplexed WebSocket token stream GET /v1/ws (subprotocol llmstream.v1; the protocol is in
// docs/websocket.md). One connection carries many requests: a reader coroutine parses client
// messages and starts completion jobs, one pump coroutine per request moves its job's updates into
// the connection's bounded send queue (server/websocket_outbox.h) without ever waiting on the
// socket, and one writer coroutine drains that queue (Beast allows one read and one write in
// flight). Everything of a connection runs on its strand.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http_server.h"
#include "server/websocket_protocol.h"

namespace moestream::server {

class service;

// Runs the /v1/ws protocol on an upgrade request (auth and CORS were checked by the caller) until
// the socket closes. Closing cancels the connection's requests.
boost::asio::awaitable<void> run_websocket(boost::beast::tcp_stream stream,
                                           boost::beast::http::request<boost::beast::http::string_body> req,
                                           service& api, const http_options& opts);

// The limits a connection runs under: a request.create may carry a body as large as the HTTP
// routes accept, plus room for its envelope.
websocket_limits websocket_limits_for(const http_options& opts);

}  // namespace moestream::server
