// `moestream bench serve`: a serving benchmark of any OpenAI-compatible server, measured the way
// `vllm bench serve` measures (server-api-anchors.md §5.1), so numbers compare across servers:
// streaming requests with stream_options.include_usage and ignore_eos, random prompts of about P
// tokens made of words, a fixed number of requests with at most N in flight. Per request:
//   TTFT  send -> the first SSE event whose choices carry text,
//   ITL   the gaps between later such events,
//   E2EL  send -> the end of the stream,
//   TPOT  (E2EL - TTFT) / (output tokens - 1), output tokens from the usage chunk.
// The client is Beast over Asio coroutines on one thread: a request in flight is a suspended
// coroutine, never a blocked thread, so the client's own overhead does not grow with N.
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <simdjson.h>
#include <string>
#include <vector>

#include "server/json_writer.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);

constexpr std::string_view kName = "bench serve";

const cli::option_spec kOptions[] = {
    {"url", "http://HOST:PORT", "the server (a path after the port is kept as a prefix of the API routes)"},
    {"api", "chat|completions", "POST /v1/chat/completions or /v1/completions (default completions)"},
    {"concurrency", "N", "requests in flight at most (default 8)"},
    {"requests", "M", "requests in all (default 64)"},
    {"prompt-tokens", "P", "prompt length in words, about one token each (default 128)"},
    {"max-tokens", "T", "tokens generated per request, with ignore_eos (default 64)"},
    {"api-key", "K", "sent as Authorization: Bearer K"},
    {"model", "NAME", "the request's \"model\" field (default: none; single-model servers accept any)"},
    {"seed", "S", "seed of the random prompts (default 0)"},
    {"timeout", "S", "a request that receives nothing for S seconds fails (default 600)"},
};

struct settings {
    std::string host, port, path_prefix;
    bool chat = false;
    int64_t concurrency = 8, requests = 64, prompt_tokens = 128, max_tokens = 64;
    std::string api_key, model;
    uint64_t seed = 0;
    std::chrono::seconds timeout{600};
    std::string route() const { return path_prefix + (chat ? "/v1/chat/completions" : "/v1/completions"); }
};

// http://HOST[:PORT][/PREFIX]; HOST may be [IPv6].
status parse_url(std::string_view url, settings& s) {
    constexpr std::string_view scheme = "http://";
    if (url.starts_with("https://"))
        return make_error("--url: https is not supported (benchmark the server's plain HTTP port)");
    if (!url.starts_with(scheme)) return make_error("--url must start with http:// (got '" + std::string(url) + "')");
    std::string_view rest = url.substr(scheme.size());
    const size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    std::string_view prefix = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
    while (prefix.ends_with('/')) prefix.remove_suffix(1);
    s.path_prefix = std::string(prefix);
    if (authority.starts_with('[')) {
        const size_t close = authority.find(']');
        if (close == std::string_view::npos) return make_error("--url: unterminated [IPv6] address");
        s.host = std::string(authority.substr(1, close - 1));
        authority.remove_prefix(close + 1);
        if (!authority.empty() && !authority.starts_with(':')) return make_error("--url: bad text after the address");
        s.port = authority.empty() ? "80" : std::string(authority.substr(1));
    } else {
        const size_t colon = authority.rfind(':');
        s.host = std::string(authority.substr(0, colon));
        s.port = colon == std::string_view::npos ? "80" : std::string(authority.substr(colon + 1));
    }
    if (s.host.empty()) return make_error("--url has no host");
    auto port = cli::parse_int(s.port, "--url port");
    if (!port) return port.err();
    if (*port < 1 || *port > 65535) return make_error("--url: port " + s.port + " is out of range");
    return {};
}

// Common English words, almost all one token each with their leading space, as vLLM's random
// dataset does with token ids; the server's own count comes back in usage.prompt_tokens.
constexpr const char* kWords[] = {
    "time",  "year",   "people", "way",    "day",    "man",   "thing",  "woman", "life",   "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",  "place", "case",
    "week",  "company", "system", "program", "question", "work", "number", "night", "point", "home",  "water",
    "room",  "mother", "area",   "money",  "story",  "fact",  "month",  "lot",   "right",  "study", "book",
    "eye",   "job",    "word",   "business", "issue", "side", "kind",   "head",  "house",  "service", "friend",
    "father", "power", "hour",   "game",   "line",   "end",   "member", "law",   "car",    "city",  "name",
    "team",  "minute", "idea",   "kid",    "body",   "back",  "parent", "face",  "others", "level", "office",
    "door",  "health", "person", "art",    "war",    "history", "party", "result", "change", "morning", "reason",
    "research", "girl", "guy",   "moment", "air",    "teacher", "force", "education", "good", "new", "first",
    "last",  "long",   "great",  "little", "own",    "other", "old",    "big",   "high",   "small", "large",
};

std::string random_prompt(std::mt19937_64& rng, int64_t words) {
    constexpr size_t n = sizeof(kWords) / sizeof(kWords[0]);
    std::string out;
    for (int64_t i = 0; i < words; ++i) {
        if (i) out += ' ';
        out += kWords[rng() % n];
    }
    return out;
}

std::string request_body(const settings& s, const std::string& prompt) {
    std::string out;
    server::json_writer w(out);
    w.begin_object();
    if (!s.model.empty()) w.member("model", s.model);
    if (s.chat) {
        w.key("messages").begin_array().begin_object();
        w.member("role", "user").member("content", prompt);
        w.end_object().end_array();
        w.member("max_completion_tokens", s.max_tokens);
    } else {
        w.member("prompt", prompt);
        w.member("max_tokens", s.max_tokens);
    }
    w.member("stream", true);
    w.key("stream_options").begin_object().member("include_usage", true).end_object();
    w.member("ignore_eos", true);
    w.member("temperature", 0.0);
    w.end_object();
    return out;
}

struct request_record {
    bool ok = false;
    std::string error;
    double ttft_s = 0, e2e_s = 0;
    std::vector<double> itl_s;
    int64_t prompt_tokens = 0, output_tokens = 0;
};

// The error message of an OpenAI error body, else the body's start.
std::string error_text(simdjson::dom::parser& parser, const std::string& body) {
    simdjson::dom::element root;
    std::string_view message;
    if (parser.parse(simdjson::padded_string(body)).get(root) == simdjson::SUCCESS &&
        root["error"]["message"].get_string().get(message) == simdjson::SUCCESS)
        return std::string(message);
    return body.substr(0, 200);
}

// What one SSE event contributes; false when the stream reported an error (in `r.error`).
struct stream_state {
    bool first_seen = false, done = false, usage_seen = false;
    int64_t text_events = 0;
    clock_type::time_point last_text;
};

bool on_event(std::string_view data, const settings& s, clock_type::time_point t0, simdjson::dom::parser& parser,
              stream_state& st, request_record& r) {
    if (data == "[DONE]") {
        st.done = true;
        return true;
    }
    simdjson::dom::element root;
    if (parser.parse(simdjson::padded_string(data)).get(root) != simdjson::SUCCESS) {
        r.error = "an event is not JSON: " + std::string(data.substr(0, 120));
        return false;
    }
    simdjson::dom::element err;
    if (root["error"].get(err) == simdjson::SUCCESS) {
        std::string_view m;
        r.error = "error in the stream: " +
                  std::string(err["message"].get_string().get(m) == simdjson::SUCCESS ? m : std::string_view("?"));
        return false;
    }
    simdjson::dom::array choices;
    if (root["choices"].get_array().get(choices) == simdjson::SUCCESS && choices.size() > 0) {
        simdjson::dom::element c = choices.at(0);
        size_t chars = 0;
        std::string_view t;
        if (s.chat) {
            for (const char* field : {"content", "reasoning_content", "reasoning"})
                if (c["delta"][field].get_string().get(t) == simdjson::SUCCESS) chars += t.size();
            simdjson::dom::array calls;
            if (c["delta"]["tool_calls"].get_array().get(calls) == simdjson::SUCCESS) chars += calls.size();
        } else if (c["text"].get_string().get(t) == simdjson::SUCCESS) {
            chars = t.size();
        }
        if (chars > 0) {
            const auto now = clock_type::now();
            if (!st.first_seen) {
                st.first_seen = true;
                r.ttft_s = std::chrono::duration<double>(now - t0).count();
            } else {
                r.itl_s.push_back(std::chrono::duration<double>(now - st.last_text).count());
            }
            st.last_text = now;
            ++st.text_events;
        }
    }
    simdjson::dom::object usage;
    if (root["usage"].get_object().get(usage) == simdjson::SUCCESS) {
        int64_t v = 0;
        if (usage["prompt_tokens"].get_int64().get(v) == simdjson::SUCCESS) r.prompt_tokens = v;
        if (usage["completion_tokens"].get_int64().get(v) == simdjson::SUCCESS) {
            r.output_tokens = v;
            st.usage_seen = true;
        }
    }
    return true;
}

asio::awaitable<request_record> run_request(const settings& s, const tcp::resolver::results_type& endpoints,
                                            std::string body) {
    request_record r;
    simdjson::dom::parser parser;
    beast::tcp_stream stream(co_await asio::this_coro::executor);
    const auto t0 = clock_type::now();
    stream.expires_after(s.timeout);
    auto [cec, ep] = co_await stream.async_connect(endpoints, use_nothrow);
    (void)ep;
    if (cec) {
        r.error = "connect: " + cec.message();
        co_return r;
    }
    http::request<http::string_body> req{http::verb::post, s.route(), 11};
    req.set(http::field::host, s.host + ":" + s.port);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.set(http::field::user_agent, "moestream-bench-serve");
    if (!s.api_key.empty()) req.set(http::field::authorization, "Bearer " + s.api_key);
    req.body() = std::move(body);
    req.prepare_payload();
    auto [wec, wn] = co_await http::async_write(stream, req, use_nothrow);
    (void)wn;
    if (wec) {
        r.error = "send: " + wec.message();
        co_return r;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> res;
    res.body_limit(1u << 30);
    stream.expires_after(s.timeout);
    auto [hec, hn] = co_await http::async_read_header(stream, buffer, res, use_nothrow);
    (void)hn;
    if (hec) {
        r.error = "no response: " + hec.message();
        co_return r;
    }
    if (res.get().result_int() != 200) {
        stream.expires_after(std::chrono::seconds(10));
        co_await http::async_read(stream, buffer, res, use_nothrow);
        r.error = "HTTP " + std::to_string(res.get().result_int()) + ": " + error_text(parser, res.get().body());
        co_return r;
    }
    stream_state st;
    size_t offset = 0;  // the events before it are handled
    auto handle_complete_events = [&](bool at_end) {
        std::string& text = res.get().body();
        for (;;) {
            size_t end = text.find("\n\n", offset);
            if (end == std::string::npos) {
                if (!at_end || offset >= text.size()) return true;
                end = text.size();
            }
            std::string_view block(text.data() + offset, end - offset);
            offset = std::min(text.size(), end + 2);
            size_t pos = 0;
            while (pos < block.size()) {
                size_t eol = block.find('\n', pos);
                if (eol == std::string_view::npos) eol = block.size();
                std::string_view line = block.substr(pos, eol - pos);
                pos = eol + 1;
                if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
                if (!line.starts_with("data:")) continue;  // comments (": ping"), event names
                line.remove_prefix(5);
                if (line.starts_with(' ')) line.remove_prefix(1);
                if (!on_event(line, s, t0, parser, st, r)) return false;
            }
        }
    };
    while (!res.is_done() && !st.done) {
        stream.expires_after(s.timeout);
        auto [ec, n] = co_await http::async_read_some(stream, buffer, res, use_nothrow);
        (void)n;
        if (ec) {
            r.error = "the stream broke: " + ec.message();
            co_return r;
        }
        if (!handle_complete_events(false)) co_return r;
    }
    if (!handle_complete_events(true)) co_return r;
    r.e2e_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (!st.done) {
        r.error = "the stream ended without data: [DONE]";
        co_return r;
    }
    if (st.text_events == 0) {
        r.error = "the stream carried no text";
        co_return r;
    }
    // Without a usage chunk, every text event counts as one token (vLLM re-tokenizes instead).
    if (!st.usage_seen) r.output_tokens = st.text_events;
    r.ok = true;
    co_return r;
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double rank = p / 100.0 * double(v.size() - 1);
    const size_t lo = size_t(std::floor(rank)), hi = size_t(std::ceil(rank));
    return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

double mean(const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / double(v.size());
}

void print_row(const char* label, double value, int decimals) { std::printf("%-40s %.*f\n", label, decimals, value); }

void print_section(const char* title, const char* metric, const std::vector<double>& seconds) {
    std::printf("%s\n", title);
    std::vector<double> ms;
    for (double x : seconds) ms.push_back(x * 1e3);
    const std::string m(metric);
    print_row(("Mean " + m + " (ms):").c_str(), mean(ms), 2);
    print_row(("Median " + m + " (ms):").c_str(), percentile(ms, 50), 2);
    print_row(("P99 " + m + " (ms):").c_str(), percentile(ms, 99), 2);
}

void print_report(const settings& s, const std::vector<request_record>& records, double duration_s) {
    int64_t ok = 0, input = 0, output = 0;
    std::vector<double> ttft, tpot, itl, e2e;
    std::map<std::string, int> errors;
    for (const auto& r : records) {
        if (!r.ok) {
            ++errors[r.error];
            continue;
        }
        ++ok;
        input += r.prompt_tokens;
        output += r.output_tokens;
        ttft.push_back(r.ttft_s);
        e2e.push_back(r.e2e_s);
        itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
        if (r.output_tokens > 1) tpot.push_back((r.e2e_s - r.ttft_s) / double(r.output_tokens - 1));
    }
    const int64_t failed = int64_t(records.size()) - ok;
    std::printf("============ Serving Benchmark Result ============\n");
    std::printf("%-40s %s%s\n", "Endpoint:", s.chat ? "chat " : "completions ", s.route().c_str());
    print_row("Successful requests:", double(ok), 0);
    print_row("Failed requests:", double(failed), 0);
    print_row("Maximum request concurrency:", double(s.concurrency), 0);
    print_row("Benchmark duration (s):", duration_s, 2);
    print_row("Total input tokens:", double(input), 0);
    print_row("Total generated tokens:", double(output), 0);
    print_row("Request throughput (req/s):", duration_s > 0 ? double(ok) / duration_s : 0, 2);
    print_row("Output token throughput (tok/s):", duration_s > 0 ? double(output) / duration_s : 0, 2);
    print_row("Total token throughput (tok/s):", duration_s > 0 ? double(input + output) / duration_s : 0, 2);
    print_section("---------------Time to First Token----------------", "TTFT", ttft);
    print_section("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot);
    print_section("---------------Inter-token Latency----------------", "ITL", itl);
    print_section("----------------End-to-end Latency----------------", "E2EL", e2e);
    std::printf("==================================================\n");
    if (!errors.empty()) {
        std::vector<std::pair<int, std::string>> by_count;
        for (const auto& [m, n] : errors) by_count.push_back({n, m});
        std::sort(by_count.rbegin(), by_count.rend());
        std::printf("errors:\n");
        for (size_t i = 0; i < by_count.size() && i < 5; ++i)
            std::printf("  %d x %s\n", by_count[i].first, by_count[i].second.c_str());
        if (by_count.size() > 5) std::printf("  ... and %zu other kinds\n", by_count.size() - 5);
    }
}

result<int64_t> bounded_int(const cli::args& a, std::string_view name, int64_t fallback, int64_t lo, int64_t hi) {
    auto v = a.get_int(name, fallback);
    if (!v) return v.err();
    if (*v < lo || *v > hi)
        return make_error("--" + std::string(name) + " must be between " + std::to_string(lo) + " and " +
                          std::to_string(hi));
    return *v;
}

int run(const cli::args& a) {
    if (!a.positional().empty()) return usage_error(kName, "unexpected argument '" + a.positional()[0] + "'");
    settings s;
    auto url = a.require("url");
    if (!url) return usage_error(kName, "missing required option --url");
    if (auto st = parse_url(*url, s); !st) return usage_error(kName, st.message());
    const std::string api = a.get_or("api", "completions");
    if (api != "chat" && api != "completions") return usage_error(kName, "--api must be chat or completions");
    s.chat = api == "chat";
    struct int_option {
        const char* name;
        int64_t* out;
        int64_t lo, hi;
    };
    int64_t seed = 0, timeout = 600;
    for (const auto& o : {int_option{"concurrency", &s.concurrency, 1, 4096}, int_option{"requests", &s.requests, 1, 1000000},
                          int_option{"prompt-tokens", &s.prompt_tokens, 1, 1000000},
                          int_option{"max-tokens", &s.max_tokens, 1, 1000000}, int_option{"seed", &seed, 0, INT64_MAX},
                          int_option{"timeout", &timeout, 1, 86400}}) {
        auto v = bounded_int(a, o.name, *o.out, o.lo, o.hi);
        if (!v) return usage_error(kName, v.message());
        *o.out = *v;
    }
    s.seed = uint64_t(seed);
    s.timeout = std::chrono::seconds(timeout);
    s.api_key = a.get_or("api-key", "");
    s.model = a.get_or("model", "");
    s.concurrency = std::min(s.concurrency, s.requests);

    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    boost::system::error_code ec;
    const auto endpoints = resolver.resolve(s.host, s.port, ec);
    if (ec) return fail(kName, "cannot resolve " + s.host + ": " + ec.message());

    std::mt19937_64 rng(s.seed);
    std::vector<std::string> bodies;
    for (int64_t i = 0; i < s.requests; ++i) bodies.push_back(request_body(s, random_prompt(rng, s.prompt_tokens)));
    std::printf("bench serve: %lld requests to http://%s:%s%s, at most %lld in flight, prompts of %lld words, "
                "%lld output tokens each\n",
                static_cast<long long>(s.requests), s.host.c_str(), s.port.c_str(), s.route().c_str(),
                static_cast<long long>(s.concurrency), static_cast<long long>(s.prompt_tokens),
                static_cast<long long>(s.max_tokens));
    std::fflush(stdout);

    std::vector<request_record> records(bodies.size());
    size_t next = 0;
    auto worker = [&]() -> asio::awaitable<void> {
        while (next < bodies.size()) {
            const size_t i = next++;
            records[i] = co_await run_request(s, endpoints, std::move(bodies[i]));
        }
    };
    const auto t0 = clock_type::now();
    for (int64_t c = 0; c < s.concurrency; ++c) asio::co_spawn(ioc, worker(), asio::detached);
    ioc.run();
    const double duration = std::chrono::duration<double>(clock_type::now() - t0).count();
    print_report(s, records, duration);
    const bool any_ok = std::any_of(records.begin(), records.end(), [](const auto& r) { return r.ok; });
    if (!any_ok) return fail(kName, "every request failed");
    return 0;
}

const command kCommand{
    kName,
    "--url http://HOST:PORT [--api chat|completions] [--concurrency N] [--requests M] [--prompt-tokens P] "
    "[--max-tokens T] [--api-key K] [--model NAME] [--seed S] [--timeout S]",
    "Benchmarks a running OpenAI-compatible server the way `vllm bench serve` does: M streaming requests (random "
    "word prompts of about P tokens, T output tokens with ignore_eos, usage included), at most N in flight; "
    "reports successful and failed requests, duration, request and token throughput, and mean / median / P99 of "
    "TTFT (to the first chunk that carries text), TPOT, ITL and end-to-end latency. Exit 1 when every request "
    "failed.",
    kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
