#include "server_fixture.h"

#include <malloc.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "../common/test_support.h"
#include "model/cpu_backend.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "scheduler/model_loader.h"

namespace moestream::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;
using namespace boost::asio::experimental::awaitable_operators;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

std::filesystem::path tokenizer_json_path() {
    return source_dir() / ".deps" / "tokenizer-deepseek_v3" / "models" / "tokenizer.json";
}

std::filesystem::path moestream_binary() { return binary_dir() / "tools" / "moestream"; }

boost::test_tools::assertion_result server_prerequisites::operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(true);
    if (!std::filesystem::exists(tokenizer_json_path())) {
        r = false;
        r.message() << "skipped: " << tokenizer_json_path().string()
                    << " is absent (scripts/setup.sh fetches it); the tiny model cannot be forged";
    } else if (!std::filesystem::exists(moestream_binary())) {
        r = false;
        r.message() << "skipped: " << moestream_binary().string() << " is not built";
    }
    return r;
}

namespace {

// The forged tiny model with its tokenizer, loaded once per process; its folder is removed at exit.
struct tiny_model {
    std::filesystem::path dir;
    std::unique_ptr<loaded_model> files;
    std::unique_ptr<cpu_backend> backend;
    std::unique_ptr<resident_experts> experts;
    std::unique_ptr<dsv41::model> model;
    std::optional<tokenizer> tok;
    std::filesystem::path path() const { return dir / "tiny.gguf"; }

    ~tiny_model() {
        tok.reset();
        model.reset();
        experts.reset();
        backend.reset();
        files.reset();
        std::error_code ignored;
        if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
};

std::string quoted(const std::filesystem::path& p) {
    std::string out = "'";
    for (char c : p.string()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

tiny_model& shared_tiny_model() {
    static std::unique_ptr<tiny_model> m;
    if (m) return *m;
    auto made = std::make_unique<tiny_model>();
    std::string tmpl = (std::filesystem::temp_directory_path() / "moestream-server-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) BOOST_FAIL("mkdtemp failed");
    made->dir = tmpl;
    const auto log = made->dir / "forge.log";
    const std::string cmd = quoted(moestream_binary()) + " forge --preset tiny --out " + quoted(made->path()) +
                            " --tokenizer-json " + quoted(tokenizer_json_path()) + " >" + quoted(log) + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
        std::ifstream in(log);
        std::stringstream s;
        s << in.rdbuf();
        BOOST_FAIL("forging the tiny model failed: " << cmd << "\n" << s.str());
    }
    auto files = load_model(made->path().string(), "");
    if (!files.ok()) BOOST_FAIL("loading the tiny model: " << files.message());
    made->files = std::move(*files);
    made->backend = std::make_unique<cpu_backend>(2);
    made->experts = std::make_unique<resident_experts>(*made->files);
    made->model = std::make_unique<dsv41::model>(made->files->hp, made->files->weights, nullptr, *made->experts,
                                                 *made->backend);
    auto tok = load_tokenizer(made->path().string());
    if (!tok.ok()) BOOST_FAIL("the tiny model's tokenizer: " << tok.message());
    made->tok.emplace(std::move(*tok));
    m = std::move(made);
    return *m;
}

// Runs one client coroutine on `ioc` to completion. `limit` is a safety net above the stream's
// own timeouts: past it `abort` closes the socket, which ends the coroutine with an error.
template <class T, class Abort>
T run_client(asio::io_context& ioc, asio::awaitable<T> op, std::chrono::milliseconds limit, Abort abort,
             std::string_view what) {
    std::optional<T> out;
    std::exception_ptr err;
    bool done = false;
    asio::co_spawn(ioc, std::move(op), [&](std::exception_ptr e, T v) {
        done = true;
        err = e;
        if (!e) out.emplace(std::move(v));
    });
    ioc.restart();
    ioc.run_for(limit + 5s);
    if (!done) {
        abort();
        ioc.restart();
        ioc.run_for(5s);
        MS_ASSERT_MSG(done, "a client coroutine ignored the closing of its socket");
        throw std::runtime_error(std::string(what) + ": no answer within " + std::to_string(limit.count()) + " ms");
    }
    if (err) std::rethrow_exception(err);
    return std::move(*out);
}

tcp::endpoint loopback(uint16_t port) { return {asio::ip::make_address("127.0.0.1"), port}; }

asio::awaitable<http_reply> exchange(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                     http::request<http::string_body> req, std::chrono::milliseconds limit) {
    stream.expires_after(limit);
    co_await http::async_write(stream, req, asio::use_awaitable);
    // Interim 1xx responses (100 Continue) precede the real one.
    std::optional<http::response_parser<http::string_body>> parser;
    for (;;) {
        parser.emplace();
        parser->body_limit(256u << 20);
        co_await http::async_read_header(stream, buffer, *parser, asio::use_awaitable);
        if (parser->get().result_int() >= 200) break;
    }
    co_await http::async_read(stream, buffer, *parser, asio::use_awaitable);
    http_reply r;
    auto& res = parser->get();
    r.status = int(res.result_int());
    r.version = res.version();
    r.keep_alive = res.keep_alive();
    r.chunked = res.chunked();
    r.ended_by_close = parser->need_eof();
    for (const auto& f : res) r.headers.set(f.name_string(), f.value());
    r.body = std::move(res.body());
    co_return r;
}

}  // namespace

// ---- the server ----------------------------------------------------------------------------------

live_server::live_server(live_server_options o) {
    auto& m = shared_tiny_model();
    engine_options eo;
    eo.max_sequences = o.max_sequences;
    eo.max_waiting = o.max_waiting;
    eo.context_tokens = o.context_tokens;
    engine_ = std::make_unique<engine>(*m.model, eo);
    server::service_limits limits;
    limits.request_timeout = o.http.request_timeout;
    limits.ping_interval = o.http.ping_interval;
    service_ = std::make_unique<server::service>(limits);
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    http_ = std::make_unique<server::http_server>(o.http, *service_);
    auto port = http_->listen();
    if (!port.ok()) BOOST_FAIL("listen: " << port.message());
    port_ = *port;

    server::served_model sm;
    sm.eng = engine_.get();
    sm.tok = &*m.tok;
    sm.name = o.alias;
    sm.path = m.path().string();
    sm.n_ctx = o.context_tokens;
    sm.n_ctx_train = m.files->hp.max_position;
    sm.n_vocab = m.files->hp.vocab;
    for (const auto& t : m.files->target.tensors()) sm.n_params += t.elements();
    sm.size_bytes = int64_t(std::filesystem::file_size(m.path()));
    sm.slots = o.max_sequences;
    sm.eos_id = m.tok->data().eos_id;
    service_->set_model(std::move(sm));
}

live_server::~live_server() {
    stop();
    // The order of `moestream serve`: the engine goes first (it ends every generation while the
    // server's io_context still exists to take the final events), then the server, then the API.
    engine_.reset();
    http_.reset();
    service_.reset();
}

void live_server::stop() {
    if (stopped_) return;
    stopped_ = true;
    http_->shutdown();
    http_->wait();
}

bool live_server::wait_idle(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
        const auto s = engine_->stats();
        if (s.running == 0 && s.waiting == 0 && service_->live_jobs() == 0) return true;
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(10ms);
    }
}

// ---- HTTP client ---------------------------------------------------------------------------------

std::string http_reply::header(std::string_view name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : std::string(it->value());
}

http_client::http_client(uint16_t port, std::chrono::milliseconds limit) : stream_(ioc_), limit_(limit) {
    stream_.socket().connect(loopback(port));
}

http_client::~http_client() {
    boost::system::error_code ignored;
    stream_.socket().close(ignored);
}

http_reply http_client::request(std::string_view method, std::string_view target, std::string body,
                                const header_list& headers, unsigned version) {
    http::request<http::string_body> req{http::string_to_verb(method), target, version};
    req.set(http::field::host, "127.0.0.1");
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = std::move(body);
    if (!req.body().empty() || method == "POST") req.prepare_payload();
    auto r = run_client(
        ioc_, exchange(stream_, buffer_, std::move(req), limit_), limit_,
        [this] {
            boost::system::error_code ignored;
            stream_.socket().close(ignored);
        },
        "HTTP request");
    eof_seen_ = eof_seen_ || r.ended_by_close;
    return r;
}

namespace {
// On the socket itself with a timer of its own (no beast::tcp_stream timeout).
asio::awaitable<bool> await_close(tcp::socket& s, std::chrono::milliseconds limit) {
    asio::steady_timer timer(co_await asio::this_coro::executor, limit);
    std::vector<char> sink(4096);
    auto got = co_await (s.async_read_some(asio::buffer(sink), use_nothrow) || timer.async_wait(use_nothrow));
    if (got.index() == 1) co_return false;
    const auto ec = std::get<0>(std::get<0>(got));
    co_return ec == asio::error::eof || ec == asio::error::connection_reset;
}
}  // namespace

bool http_client::closed_by_server(std::chrono::milliseconds limit) {
    // Asio (1.81, epoll) does not report EOF to a second read once one read has consumed it (it
    // waits for another edge that never comes), so an EOF the parser saw is remembered.
    if (eof_seen_) return true;
    return run_client(
        ioc_, await_close(stream_.socket(), limit), limit,
        [this] {
            boost::system::error_code ignored;
            stream_.socket().close(ignored);
        },
        "waiting for the server to close");
}

// ---- raw connection --------------------------------------------------------------------------------

raw_connection::raw_connection(uint16_t port) : stream_(ioc_) { stream_.socket().connect(loopback(port)); }

raw_connection::~raw_connection() {
    boost::system::error_code ignored;
    stream_.socket().close(ignored);
}

namespace {
asio::awaitable<bool> write_all(beast::tcp_stream& s, std::string_view bytes) {
    s.expires_after(30s);
    auto [ec, n] = co_await asio::async_write(s, asio::buffer(bytes), use_nothrow);
    (void)n;
    co_return !ec;
}

asio::awaitable<raw_connection::received> read_to_close(beast::tcp_stream& s, std::string pending,
                                                       std::chrono::milliseconds limit) {
    raw_connection::received r;
    r.bytes = std::move(pending);
    s.expires_after(limit);
    std::vector<char> chunk(16384);  // not std::array: GCC 12 cannot copy arrays into coroutine frames
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(chunk), use_nothrow);
        r.bytes.append(chunk.data(), n);
        if (!ec) continue;
        r.closed = ec != beast::error::timeout;
        co_return r;
    }
}

asio::awaitable<std::string> read_marker(beast::tcp_stream& s, std::string& pending, std::string marker,
                                         std::chrono::milliseconds limit) {
    s.expires_after(limit);
    std::vector<char> chunk(4096);
    while (pending.find(marker) == std::string::npos) {
        auto [ec, n] = co_await s.async_read_some(asio::buffer(chunk), use_nothrow);
        pending.append(chunk.data(), n);
        if (ec) break;
    }
    const size_t at = pending.find(marker);
    const size_t end = at == std::string::npos ? pending.size() : at + marker.size();
    std::string out = pending.substr(0, end);
    pending.erase(0, end);
    co_return out;
}
}  // namespace

bool raw_connection::send(std::string_view bytes) {
    return run_client(
        ioc_, write_all(stream_, bytes), 30s,
        [this] {
            boost::system::error_code ignored;
            stream_.socket().close(ignored);
        },
        "raw send");
}

void raw_connection::half_close() {
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

raw_connection::received raw_connection::read_until_close(std::chrono::milliseconds limit) {
    auto r = run_client(
        ioc_, read_to_close(stream_, std::move(pending_), limit), limit,
        [this] {
            boost::system::error_code ignored;
            stream_.socket().close(ignored);
        },
        "raw read");
    pending_.clear();
    return r;
}

std::string raw_connection::read_until(std::string_view marker, std::chrono::milliseconds limit) {
    return run_client(
        ioc_, read_marker(stream_, pending_, std::string(marker), limit), limit,
        [this] {
            boost::system::error_code ignored;
            stream_.socket().close(ignored);
        },
        "raw read");
}

int status_of_raw(std::string_view raw) {
    if (!raw.starts_with("HTTP/1.") || raw.size() < 12) return 0;
    const std::string_view code = raw.substr(9, 3);
    int v = 0;
    for (char c : code) {
        if (c < '0' || c > '9') return 0;
        v = v * 10 + (c - '0');
    }
    return v;
}

std::string body_of_raw(std::string_view raw) {
    const size_t at = raw.find("\r\n\r\n");
    return at == std::string_view::npos ? std::string() : std::string(raw.substr(at + 4));
}

std::vector<std::string> sse_events(std::string_view body) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
        size_t end = body.find('\n', pos);
        if (end == std::string_view::npos) end = body.size();
        std::string_view line = body.substr(pos, end - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.starts_with("data:")) {
            line.remove_prefix(5);
            if (line.starts_with(' ')) line.remove_prefix(1);
            out.emplace_back(line);
        }
        pos = end + 1;
    }
    return out;
}

// ---- JSON ------------------------------------------------------------------------------------------

json_doc::json_doc(std::string_view text) : parser_(std::make_unique<simdjson::dom::parser>()) {
    simdjson::padded_string padded(text);
    ok_ = parser_->parse(padded).get(root_) == simdjson::SUCCESS;
}

std::optional<simdjson::dom::element> json_doc::at(std::initializer_list<std::string_view> path) const {
    if (!ok_) return std::nullopt;
    simdjson::dom::element e = root_;
    for (std::string_view key : path) {
        simdjson::dom::element next;
        if (e.is_array()) {
            size_t index = 0;
            for (char c : key) {
                if (c < '0' || c > '9') return std::nullopt;
                index = index * 10 + size_t(c - '0');
            }
            if (e.at(index).get(next) != simdjson::SUCCESS) return std::nullopt;
        } else if (e.is_object()) {
            if (e[key].get(next) != simdjson::SUCCESS) return std::nullopt;
        } else {
            return std::nullopt;
        }
        e = next;
    }
    return e;
}

std::string json_doc::str(std::initializer_list<std::string_view> path, std::string fallback) const {
    auto e = at(path);
    std::string_view s;
    if (!e || e->get_string().get(s) != simdjson::SUCCESS) return fallback;
    return std::string(s);
}

int64_t json_doc::integer(std::initializer_list<std::string_view> path, int64_t fallback) const {
    auto e = at(path);
    int64_t v = 0;
    if (!e || e->get_int64().get(v) != simdjson::SUCCESS) return fallback;
    return v;
}

bool json_doc::has(std::initializer_list<std::string_view> path) const { return at(path).has_value(); }

int64_t json_doc::length(std::initializer_list<std::string_view> path) const {
    auto e = at(path);
    simdjson::dom::array a;
    if (!e || e->get_array().get(a) != simdjson::SUCCESS) return 0;
    return int64_t(a.size());
}

bool json_doc::is_null(std::initializer_list<std::string_view> path) const {
    auto e = at(path);
    return e && e->is_null();
}

void check_api_error_body(std::string_view body, int status, std::string_view type, std::string_view param) {
    json_doc d(body);
    BOOST_TEST_REQUIRE(d.ok(), "the error body is not JSON: " << body);
    BOOST_TEST(d.integer({"error", "code"}) == status, body);
    BOOST_TEST(d.str({"error", "type"}) == type, body);
    BOOST_TEST(!d.str({"error", "message"}).empty(), body);
    if (!param.empty()) BOOST_TEST(d.str({"error", "param"}) == param, body);
}

void check_api_error(const http_reply& r, int status, std::string_view type, std::string_view param) {
    BOOST_TEST(r.status == status, "status " << r.status << ", body " << r.body);
    BOOST_TEST(r.header("Content-Type") == "application/json");
    check_api_error_body(r.body, status, type, param);
}

void check_still_serving(uint16_t port) {
    http_client c(port);
    auto r = c.post("/v1/completions", R"({"prompt":"Hello","max_tokens":3,"temperature":0})");
    BOOST_TEST_REQUIRE(r.status == 200, "the server no longer serves: " << r.status << " " << r.body);
    json_doc d(r.body);
    BOOST_TEST(d.str({"object"}) == "text_completion");
    BOOST_TEST(d.integer({"usage", "completion_tokens"}) > 0, r.body);
}

int64_t anonymous_resident_bytes() {
    malloc_trim(0);  // free heap pages back to the system: RSS then follows what is allocated
    std::ifstream in("/proc/self/statm");
    int64_t size = 0, resident = 0, file_backed = 0;
    in >> size >> resident >> file_backed;
    return (resident - file_backed) * int64_t(sysconf(_SC_PAGESIZE));
}

}  // namespace moestream::test
