// The real server in the test process: service + http_server + engine on a forged tiny model,
// listening on a loopback port, and clients that talk to it over real sockets (Beast for
// well-formed HTTP, raw bytes for what no well-behaved client sends). Every client call has a
// time limit, so a server that hangs fails the test instead of hanging it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <simdjson.h>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scheduler/engine.h"
#include "server/http_server.h"
#include "server/service.h"

namespace moestream::test {

// The DeepSeek tokenizer that scripts/setup.sh fetches; forge needs it.
std::filesystem::path tokenizer_json_path();
// The `moestream` binary of this build (forges the tiny model).
std::filesystem::path moestream_binary();

// Precondition: the test is reported skipped, with the reason, when the tokenizer or the binary
// is missing.
struct server_prerequisites {
    boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const;
};
inline auto requires_live_server() { return boost::unit_test::precondition(server_prerequisites{}); }

// True when this build runs under AddressSanitizer (loads are scaled down).
constexpr bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return true;
#else
    return false;
#endif
#else
    return false;
#endif
}

struct live_server_options {
    server::http_options http;        // host and port are forced to 127.0.0.1:0
    int64_t context_tokens = 256;     // per sequence (small: overflow is cheap to provoke)
    int64_t max_sequences = 8;
    int64_t max_waiting = 128;
    std::string alias = "tiny";
};

// One server on the process-wide tiny model (forged and loaded once). Servers may be created one
// after another; never two at once (they would share the model's compute state).
class live_server {
  public:
    explicit live_server(live_server_options o = {});
    ~live_server();
    live_server(const live_server&) = delete;
    live_server& operator=(const live_server&) = delete;

    uint16_t port() const { return port_; }
    engine& eng() { return *engine_; }
    server::service& api() { return *service_; }
    const server::served_model& model() const { return service_->model(); }
    // Waits until no sequence runs or waits in the engine and no completion job is live.
    bool wait_idle(std::chrono::milliseconds limit);
    // Graceful stop (what SIGTERM does); the destructor does it too.
    void stop();

  private:
    std::unique_ptr<engine> engine_;
    std::unique_ptr<server::service> service_;
    std::unique_ptr<server::http_server> http_;
    uint16_t port_ = 0;
    bool stopped_ = false;
};

// ---- clients ---------------------------------------------------------------------------------

struct http_reply {
    int status = 0;
    unsigned version = 0;
    bool keep_alive = false;
    bool chunked = false;
    bool ended_by_close = false;  // the body was delimited by the server closing the connection
    boost::beast::http::fields headers;
    std::string body;
    std::string header(std::string_view name) const;
};

using header_list = std::vector<std::pair<std::string, std::string>>;

// One HTTP connection (keep-alive: several requests in turn).
class http_client {
  public:
    explicit http_client(uint16_t port, std::chrono::milliseconds limit = std::chrono::seconds(60));
    ~http_client();
    // Sends one request and reads the whole response. Transport failures throw.
    http_reply request(std::string_view method, std::string_view target, std::string body = {},
                       const header_list& headers = {}, unsigned version = 11);
    http_reply get(std::string_view target, const header_list& headers = {}) { return request("GET", target, {}, headers); }
    http_reply post(std::string_view target, std::string body, const header_list& headers = {}) {
        return request("POST", target, std::move(body), headers);
    }
    // True when the server closes the connection within `limit` (sends nothing more).
    bool closed_by_server(std::chrono::milliseconds limit);

  private:
    boost::asio::io_context ioc_;
    boost::beast::tcp_stream stream_;
    boost::beast::flat_buffer buffer_;
    std::chrono::milliseconds limit_;
    bool eof_seen_ = false;
};

// A connection for raw bytes: partial requests, slow senders, floods.
class raw_connection {
  public:
    explicit raw_connection(uint16_t port);
    ~raw_connection();
    // False when the server has closed or reset the connection.
    bool send(std::string_view bytes);
    // Shuts down the sending side (the server reads EOF) but keeps reading.
    void half_close();
    // Reads until the server closes the connection or `limit` passes; returns what arrived.
    struct received {
        std::string bytes;
        bool closed = false;  // the server closed (EOF or reset) within the limit
    };
    received read_until_close(std::chrono::milliseconds limit);
    // Reads until `marker` has arrived (or the connection closes / `limit` passes).
    std::string read_until(std::string_view marker, std::chrono::milliseconds limit);

  private:
    boost::asio::io_context ioc_;
    boost::beast::tcp_stream stream_;
    std::string pending_;  // bytes read past a read_until marker
};

// The status code of a raw response ("HTTP/1.1 413 ..."), 0 when there is none.
int status_of_raw(std::string_view raw);
// The body of a raw response with a Content-Length (what follows the blank line).
std::string body_of_raw(std::string_view raw);

// The `data:` payloads of an SSE body in order (comment lines skipped).
std::vector<std::string> sse_events(std::string_view body);

// A parsed JSON document (the parser owns the element's storage).
class json_doc {
  public:
    explicit json_doc(std::string_view text);
    bool ok() const { return ok_; }
    simdjson::dom::element root() const { return root_; }
    // Convenience reads: the default when the path is absent or of another type.
    std::string str(std::initializer_list<std::string_view> path, std::string fallback = {}) const;
    int64_t integer(std::initializer_list<std::string_view> path, int64_t fallback = -1) const;
    bool has(std::initializer_list<std::string_view> path) const;
    // The length of the array at `path`, 0 when it is absent or not an array.
    int64_t length(std::initializer_list<std::string_view> path) const;
    bool is_null(std::initializer_list<std::string_view> path) const;

  private:
    std::optional<simdjson::dom::element> at(std::initializer_list<std::string_view> path) const;
    std::unique_ptr<simdjson::dom::parser> parser_;
    simdjson::dom::element root_;
    bool ok_ = false;
};

// Checks an OpenAI-shaped error body: {"error":{"code":status,"type":type,"message":...}}.
void check_api_error(const http_reply& r, int status, std::string_view type, std::string_view param = {});
void check_api_error_body(std::string_view body, int status, std::string_view type, std::string_view param = {});

// A short completion on a new connection answers 200 with text: the server still serves.
void check_still_serving(uint16_t port);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Anonymous resident memory of this process in bytes (heap, stacks), after handing free heap
// pages back. Pages of mapped files are left out: the model's grow as routing reaches experts
// no earlier request used, which is not memory the server holds on to.
int64_t anonymous_resident_bytes();

}  // namespace moestream::test
