// The HTTP server: Boost.Beast over Asio C++20 coroutines. One acceptor coroutine; every
// connection runs on its own strand (reads, writes and the disconnect watch of one connection
// never race); the model runs on the engine's threads and hands tokens back through per-request
// channels, so no coroutine ever blocks on compute.
//
// Start-up order: listen() binds the port first, so /health answers 503 "Loading model" while
// the model is opened; service::set_model() then opens the API. shutdown() (also on SIGTERM/SIGINT when
// handle_signals is set) turns /health and new requests to 503 (connections are still accepted
// and answered, each closed after its answer), lets streams run for the drain period, then stops
// accepting and cancels the rest; every stream ends with a final event.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/result.h"

namespace moestream::server {

class service;  // the API behind the routes (server/service.h)

struct http_options {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;                    // 0: any free port (tests); listen() returns it
    std::vector<std::string> api_keys;       // empty: no authentication
    std::vector<std::string> cors_origins;   // empty: CORS off; "*" allows every origin
    size_t body_bytes_max = 8u << 20;        // larger bodies get 413
    size_t header_bytes_max = 64u << 10;     // larger header blocks get 431
    std::chrono::seconds header_timeout{30}; // a request's header must arrive within this (slowloris)
    std::chrono::seconds idle_timeout{120};  // an idle keep-alive connection is closed after this
    std::chrono::seconds request_timeout{600};  // a generation is cancelled after this
    std::chrono::seconds write_timeout{60};  // a client that reads nothing for this long is dropped
    std::chrono::seconds drain{5};           // shutdown: streams may finish for this long
    std::chrono::seconds ping_interval{10};  // SSE ": ping" comments while a prompt is processed
    size_t max_connections = 1024;           // beyond: 503 and close
    int io_threads = 2;
};

// Lifetime: destroy the engine the service serves before the server (as `moestream serve`
// does): a generation the engine finishes later would complete its waiter into this server's
// io_context.
class http_server {
  public:
    http_server(http_options opts, service& api);
    ~http_server();
    http_server(const http_server&) = delete;
    http_server& operator=(const http_server&) = delete;

    // Binds and starts accepting on the I/O threads; returns the bound port.
    result<uint16_t> listen();
    // Graceful stop (idempotent, any thread): see the header comment.
    void shutdown();
    // Installs SIGTERM/SIGINT handlers that call shutdown().
    void handle_signals();
    // Blocks until shutdown has completed and the I/O threads are done.
    void wait();

    const http_options& options() const { return opts_; }

  private:
    struct impl;
    http_options opts_;
    std::unique_ptr<impl> impl_;
};

}  // namespace moestream::server
