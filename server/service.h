// The API behind the HTTP routes and the WebSocket protocol, free of any transport: a route gets
// the request (method, path, headers it needs, body) and a `responder` to answer through; the
// transport (server/http_server.cpp, server/websocket_session.cpp) implements the responder and
// cancels the handler when the client goes away.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer.h"
#include "scheduler/engine.h"
#include "server/api_error.h"
#include "server/json_writer.h"
#include "server/metrics.h"

namespace moestream::server {

struct http_response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
};

// How a route answers. Either one send(), or stream_begin() + stream_write()* + stream_end().
class responder {
  public:
    virtual ~responder() = default;
    virtual boost::asio::awaitable<void> send(http_response r) = 0;
    // Starts a chunked response (SSE: "text/event-stream").
    virtual boost::asio::awaitable<void> stream_begin(std::string content_type) = 0;
    virtual boost::asio::awaitable<void> stream_write(std::string_view data) = 0;
    virtual boost::asio::awaitable<void> stream_end() = 0;
};

struct api_request {
    std::string_view method;  // GET, POST, ...
    std::string_view path;    // without the query
    std::string_view query;   // after '?', may be empty
    std::string_view body;
    std::string_view api_key;  // the key the request authenticated with; empty when the server has none
};

// What the service needs to know about the model it serves, set once it is loaded.
struct served_model {
    engine* eng = nullptr;
    const tokenizer* tok = nullptr;     // null: the model has no tokenizer (ids only)
    std::string name;                   // the alias clients see in "model"
    std::string path;                   // the GGUF path (/props)
    int64_t n_ctx = 0;                  // per sequence
    int64_t n_ctx_train = 0;
    int64_t n_vocab = 0;
    int64_t n_params = 0;
    int64_t size_bytes = 0;
    int64_t slots = 0;                  // sequences decoded together
    int32_t eos_id = -1;
    int64_t spec_n_max = 0;             // speculative decoding: the most tokens drafted a step (0: off)
    std::string backend;                // what runs the model (/props, /metrics): "cuda", "cpu"
    std::string device;                 // "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB", "16 threads, kernels avx512"
    // Expert-streaming figures for /metrics (null when the experts are not streamed).
    std::function<streaming_figures()> streaming;
};

struct service_limits {
    std::chrono::seconds request_timeout{600};
    std::chrono::seconds ping_interval{10};
    size_t response_store_max = 256;  // /v1/responses kept for previous_response_id (0: none)
};

class completion_job;
class anthropic_route;
class response_store;

class service {
  public:
    explicit service(service_limits limits);

    // Called once the model is loaded (the routes answer 503 before).
    void set_model(served_model m);
    bool ready() const { return ready_.load(); }
    // Shutdown: /health and new requests answer 503; running generations end.
    void set_draining() { draining_ = true; }
    bool draining() const { return draining_.load(); }

    // Routes a request; returns the status it answered (for the access metrics).
    boost::asio::awaitable<int> handle(const api_request& req, responder& out);

    // Completion requests in progress (HTTP and WebSocket), and cancelling all of them
    // (shutdown): each then ends with its final event. A transport holds a registration for
    // every job it runs, so the shutdown drain waits for it.
    size_t live_jobs() const;
    void cancel_all();
    // Transport teardown: cancels every registered job and the pending waits on its events.
    void abandon_all();
    class job_registration {
      public:
        job_registration(service& s, completion_job* job);
        ~job_registration();
        job_registration(const job_registration&) = delete;
        job_registration& operator=(const job_registration&) = delete;

      private:
        service& s_;
        completion_job* job_;
    };

    server_metrics* metrics() { return metrics_.get(); }
    // The responses kept for previous_response_id (server/responses_store.h).
    response_store& responses() { return *responses_; }
    const served_model& model() const { return model_; }
    const service_limits& limits() const { return limits_; }

  private:
    boost::asio::awaitable<int> completion(const api_request& req, responder& out, int route);
    http_response tokenize(std::string_view body) const;
    http_response detokenize(std::string_view body) const;
    http_response models() const;
    http_response model(std::string_view id_in_path) const;  // /v1/models/{id}
    void write_model(json_writer& w) const;
    http_response props() const;
    http_response slots() const;
    http_response health() const;
    http_response metrics_text() const;

    service_limits limits_;
    served_model model_;
    std::unique_ptr<server_metrics> metrics_;
    std::shared_ptr<response_store> responses_;  // shared_ptr: the type is incomplete here
    std::shared_ptr<anthropic_route> anthropic_;  // /v1/messages (server/anthropic_route.h)
    std::atomic<bool> ready_{false};
    std::atomic<bool> draining_{false};
    mutable std::mutex jobs_mu_;
    std::vector<completion_job*> jobs_;
    std::chrono::system_clock::time_point started_ = std::chrono::system_clock::now();
};

// The JSON body and status of an API error, as an HTTP response.
http_response error_response(const api_error& e);
// The body of an error answered on `path`: Anthropic's shape on its routes (/v1/messages...),
// OpenAI's elsewhere. For the errors the transport answers itself (401, 413).
std::string error_body(std::string_view path, const api_error& e);

}  // namespace moestream::server
