// The /metrics registry: histograms (buckets, concurrency), the request and HTTP counters, and a
// render that a line-by-line reader of the Prometheus text format 0.0.4 accepts (every family
// declared once, HELP and TYPE before its samples, escaped labels, cumulative buckets ending in
// +Inf == _count), with the values the inputs imply.
#include <boost/test/unit_test.hpp>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "scheduler/engine.h"
#include "scheduler/engram_stream.h"
#include "scheduler/tiered_experts.h"
#include "server/metrics.h"

namespace moestream::server::test {
namespace {

struct parsed_sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
};
struct parsed_family {
    std::string type, help;
    std::vector<parsed_sample> samples;
};
struct parsed {
    std::map<std::string, parsed_family> families;
    std::string error;  // empty when the text is valid
};

bool valid_name(std::string_view n, bool allow_colon) {
    if (n.empty()) return false;
    for (size_t i = 0; i < n.size(); ++i) {
        const char c = n[i];
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':') ||
                        (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

std::optional<double> parse_value(std::string_view v) {
    if (v == "+Inf") return INFINITY;
    if (v == "-Inf") return -INFINITY;
    if (v == "NaN") return NAN;
    double d = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), d);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) return std::nullopt;
    return d;
}

// The family a sample belongs to: its own name, or a histogram's name without the suffix.
std::string family_of(const std::string& sample, const std::map<std::string, parsed_family>& fams) {
    if (fams.count(sample)) return sample;
    for (std::string_view suffix : {"_bucket", "_sum", "_count"})
        if (sample.size() > suffix.size() && sample.compare(sample.size() - suffix.size(), suffix.size(), suffix) == 0) {
            const auto base = sample.substr(0, sample.size() - suffix.size());
            auto it = fams.find(base);
            if (it != fams.end() && it->second.type == "histogram") return base;
        }
    return "";
}

// A strict reader of what render() may write (no timestamps, no blank lines, no untyped samples).
parsed parse_exposition(const std::string& text, const std::string& model_name) {
    parsed p;
    auto fail = [&](size_t line_no, const std::string& why, const std::string& line) {
        p.error = "line " + std::to_string(line_no) + ": " + why + ": " + line;
        return p;
    };
    if (!text.empty() && text.back() != '\n') return fail(0, "the text does not end with a newline", "");
    std::istringstream in(text);
    std::string line, current;  // the family whose samples are being read
    std::set<std::string> finished;
    size_t no = 0;
    while (std::getline(in, line)) {
        ++no;
        if (line.empty()) return fail(no, "blank line", line);
        if (line.rfind("# HELP ", 0) == 0) {
            const auto rest = line.substr(7);
            const auto sp = rest.find(' ');
            const auto name = rest.substr(0, sp);
            if (!valid_name(name, true)) return fail(no, "bad metric name", line);
            if (p.families.count(name)) return fail(no, "family declared twice", line);
            if (!current.empty()) finished.insert(current);
            current = name;
            p.families[name].help = sp == std::string::npos ? "" : rest.substr(sp + 1);
            continue;
        }
        if (line.rfind("# TYPE ", 0) == 0) {
            const auto rest = line.substr(7);
            const auto sp = rest.find(' ');
            if (sp == std::string::npos) return fail(no, "TYPE without a type", line);
            const auto name = rest.substr(0, sp), type = rest.substr(sp + 1);
            if (name != current) return fail(no, "TYPE not right after its HELP", line);
            if (!p.families[name].type.empty()) return fail(no, "TYPE twice", line);
            if (type != "counter" && type != "gauge" && type != "histogram") return fail(no, "unknown type", line);
            if (type == "counter" && !(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0))
                return fail(no, "a counter not ending in _total", line);
            if (!p.families[name].samples.empty()) return fail(no, "TYPE after samples", line);
            p.families[name].type = type;
            continue;
        }
        if (line[0] == '#') return fail(no, "unexpected comment", line);
        // name{labels} value
        parsed_sample s;
        size_t i = 0;
        while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
        s.name = line.substr(0, i);
        if (!valid_name(s.name, true)) return fail(no, "bad sample name", line);
        if (i < line.size() && line[i] == '{') {
            ++i;
            while (i < line.size() && line[i] != '}') {
                size_t k = i;
                while (k < line.size() && line[k] != '=') ++k;
                const auto lname = line.substr(i, k - i);
                if (!valid_name(lname, false)) return fail(no, "bad label name", line);
                if (k + 1 >= line.size() || line[k + 1] != '"') return fail(no, "label value not quoted", line);
                std::string value;
                size_t j = k + 2;
                for (; j < line.size() && line[j] != '"'; ++j) {
                    if (line[j] == '\\') {
                        if (++j >= line.size()) return fail(no, "dangling escape", line);
                        if (line[j] == 'n') value += '\n';
                        else if (line[j] == '\\' || line[j] == '"') value += line[j];
                        else return fail(no, "bad escape", line);
                    } else {
                        value += line[j];
                    }
                }
                if (j >= line.size()) return fail(no, "unterminated label value", line);
                if (!s.labels.emplace(lname, value).second) return fail(no, "label twice", line);
                i = j + 1;
                if (i < line.size() && line[i] == ',') ++i;
                else if (i < line.size() && line[i] != '}') return fail(no, "junk between labels", line);
            }
            if (i >= line.size()) return fail(no, "unterminated label set", line);
            ++i;
        }
        if (i >= line.size() || line[i] != ' ') return fail(no, "no space before the value", line);
        const auto v = parse_value(std::string_view(line).substr(i + 1));
        if (!v) return fail(no, "bad value", line);
        s.value = *v;
        const auto fam = family_of(s.name, p.families);
        if (fam.empty() || p.families[fam].type.empty()) return fail(no, "sample before its HELP and TYPE", line);
        if (fam != current) return fail(no, "sample outside its family's block", line);
        if (finished.count(fam)) return fail(no, "family continued after another", line);
        if (s.labels["model_name"] != model_name) return fail(no, "model_name missing or wrong", line);
        const auto& type = p.families[fam].type;
        if (type == "counter" && !(s.value >= 0)) return fail(no, "negative counter", line);
        if (type != "histogram" && s.name != fam) return fail(no, "sample name differs from its family", line);
        if (type == "histogram" && (s.name == fam + "_bucket") != s.labels.count("le"))
            return fail(no, "le on a non-bucket or missing on a bucket", line);
        p.families[fam].samples.push_back(std::move(s));
    }
    // Histograms: per label set, buckets ascend in le, counts never drop, +Inf last and == _count.
    for (const auto& [name, f] : p.families) {
        if (f.type.empty()) return fail(0, "HELP without TYPE", name);
        if (f.type != "histogram") continue;
        std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> buckets;
        std::map<std::map<std::string, std::string>, double> counts;
        for (const auto& s : f.samples) {
            auto key = s.labels;
            if (s.name == name + "_bucket") {
                const auto le = parse_value(s.labels.at("le"));
                if (!le) return fail(0, "bad le", name);
                key.erase("le");
                buckets[key].emplace_back(*le, s.value);
            } else if (s.name == name + "_count") {
                counts[key] = s.value;
            }
        }
        if (buckets.empty()) return fail(0, "histogram without buckets", name);
        for (const auto& [key, bs] : buckets) {
            for (size_t k = 1; k < bs.size(); ++k)
                if (!(bs[k].first > bs[k - 1].first) || bs[k].second < bs[k - 1].second)
                    return fail(0, "buckets not ascending or not cumulative", name);
            if (!std::isinf(bs.back().first)) return fail(0, "no +Inf bucket last", name);
            if (!counts.count(key) || counts[key] != bs.back().second) return fail(0, "+Inf != _count", name);
        }
    }
    return p;
}

// The value of one sample (labels beyond model_name given as pairs); NaN when absent.
double value_of(const parsed& p, const std::string& family, const std::string& sample,
                std::map<std::string, std::string> labels = {}) {
    auto it = p.families.find(family);
    if (it == p.families.end()) return NAN;
    for (const auto& s : it->second.samples) {
        if (s.name != sample) continue;
        auto ls = s.labels;
        ls.erase("model_name");
        if (ls == labels) return s.value;
    }
    return NAN;
}
double value_of(const parsed& p, const std::string& name) { return value_of(p, name, name); }

engine_stats some_engine_stats() {
    engine_stats e;
    e.running = 3;
    e.waiting = 2;
    e.steps = 40;
    e.decode_rows = 100;
    e.tokens_max = 777;
    e.prefix_queries_tokens = 1000;
    e.prefix_hit_tokens = 600;
    e.cached_sequences = 4;
    e.prefix_checkpoints = 3;
    e.busy_s = 12.5;
    e.spec_drafts = 9;
    e.spec_draft_tokens = 30;
    e.spec_accepted_tokens = 12;
    e.spec_accepted_by_position = {7, 3, 1, 1, 0};
    e.spec_steps = 6;
    e.spec_failures = 1;
    e.step_experts = {500, 240, 90};
    e.step_experts_steps = {2, 6, 5};
    e.layers = 40;
    e.last_step = {0.032, 0.012, 0.016, 0.002, 0.0008, 0.0012};
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(metrics)

BOOST_AUTO_TEST_CASE(histogram_buckets_are_le_and_cumulative) {
    histogram h({1, 2, 5});
    for (double v : {0.5, 1.0, 1.5, 7.0, -3.0, 5.0}) h.observe(v);
    const auto s = h.read();
    BOOST_TEST(s.cumulative == (std::vector<uint64_t>{3, 4, 5, 6}), "le is inclusive; +Inf holds everything");
    BOOST_TEST(s.count == 6u);
    BOOST_TEST(s.sum == 12.0);
}

BOOST_AUTO_TEST_CASE(concurrent_observations_are_all_counted) {
    histogram h({1, 2, 3});
    server_metrics m("m");
    constexpr int kThreads = 4, kEach = 50000, kRequests = 2000;
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < kEach; ++i) h.observe(double(i % 4) + 0.5);  // exact in binary
            for (int i = 0; i < kRequests; ++i) {
                request_observation r;
                r.ttft_s = 0.25;
                r.e2e_s = 1;
                r.prefill_s = 0.25;
                r.decode_s = 0.5;
                r.itl_s = {0.125, 0.125};
                r.prompt_tokens = 10;
                r.cached_tokens = 4;
                r.completion_tokens = 3;
                r.finish_reason = i % 2 ? "stop" : "cancelled";
                m.observe_request(r);
                m.count_http(t % 2 ? "/v1/chat/completions" : "/metrics", "POST", 200);
            }
        });
    for (auto& t : ts) t.join();
    const auto s = h.read();
    const uint64_t quarter = uint64_t(kThreads) * kEach / 4;
    BOOST_TEST(s.cumulative == (std::vector<uint64_t>{quarter, 2 * quarter, 3 * quarter, 4 * quarter}));
    BOOST_TEST(s.sum == double(quarter) * (0.5 + 1.5 + 2.5 + 3.5));
    const auto p = parse_exposition(m.render(engine_stats{}, nullptr), "m");
    BOOST_TEST_REQUIRE(p.error.empty(), p.error);
    const double n = kThreads * kRequests;
    BOOST_TEST(value_of(p, "moestream:e2e_request_latency_seconds", "moestream:e2e_request_latency_seconds_count") == n);
    BOOST_TEST(value_of(p, "moestream:inter_token_latency_seconds", "moestream:inter_token_latency_seconds_count") ==
               2 * n);
    BOOST_TEST(value_of(p, "moestream:inter_token_latency_seconds", "moestream:inter_token_latency_seconds_sum") ==
               0.25 * n);
    BOOST_TEST(value_of(p, "moestream:request_success_total", "moestream:request_success_total",
                        {{"finished_reason", "stop"}}) == n / 2);
    BOOST_TEST(value_of(p, "moestream:request_success_total", "moestream:request_success_total",
                        {{"finished_reason", "abort"}}) == n / 2);
    BOOST_TEST(value_of(p, "llamacpp:prompt_tokens_total") == 6 * n);
    BOOST_TEST(value_of(p, "moestream:prompt_tokens_total") == 10 * n);
    BOOST_TEST(value_of(p, "llamacpp:tokens_predicted_total") == 3 * n);
    BOOST_TEST(value_of(p, "llamacpp:prompt_seconds_total") == 0.25 * n);
    BOOST_TEST(value_of(p, "moestream:http_requests_total", "moestream:http_requests_total",
                        {{"handler", "/metrics"}, {"method", "POST"}, {"status", "200"}}) == n / 2);
}

BOOST_AUTO_TEST_CASE(render_is_valid_exposition_with_the_expected_values) {
    const std::string model = "deep\"seek\\v4\nflash";  // every character that needs escaping
    server_metrics m(model);
    request_observation a;
    a.queue_s = 0.5;
    a.ttft_s = 2;
    a.e2e_s = 10;
    a.prefill_s = 1.5;
    a.decode_s = 8;
    a.itl_s = {0.1, 0.3};
    a.prompt_tokens = 100;
    a.cached_tokens = 40;
    a.completion_tokens = 16;
    a.finish_reason = "length";
    m.observe_request(a);
    request_observation b;  // aborted before its first token: no TTFT
    b.e2e_s = 0.2;
    b.queue_s = 0.2;
    b.prompt_tokens = 5;
    b.finish_reason = "error: expert 3 of layer 5 could not be read";
    m.observe_request(b);
    m.count_http("/v1/completions", "POST", 200);
    m.count_http("/v1/completions", "POST", 200);
    m.count_http("/odd\"path\\", "GET", 404);
    const auto e = some_engine_stats();
    streaming_figures f;
    f.demands = 50;
    f.device_hits = 30;
    f.device_misses = 20;
    f.disk_bytes = 1 << 20;
    f.reads_in_flight_mean = 3.5;
    f.reads_in_flight_max = 8;
    f.disk_seconds = 0.75;

    const auto text = m.render(e, &f);
    const auto p = parse_exposition(text, model);
    BOOST_TEST_REQUIRE(p.error.empty(), p.error << "\n" << text);
    // Every family the dashboards look for is there.
    for (const char* name :
         {"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:prompt_tokens_seconds",
          "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total",
          "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing", "llamacpp:requests_deferred",
          "llamacpp:n_tokens_max", "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode",
          "moestream:time_to_first_token_seconds", "moestream:inter_token_latency_seconds",
          "moestream:e2e_request_latency_seconds", "moestream:request_queue_time_seconds",
          "moestream:request_prefill_time_seconds", "moestream:request_decode_time_seconds",
          "moestream:request_prompt_tokens", "moestream:request_generation_tokens", "moestream:num_requests_running",
          "moestream:num_requests_waiting", "moestream:prefix_cache_queries_total", "moestream:prefix_cache_hits_total",
          "moestream:prefix_checkpoints_total",
          "moestream:prompt_tokens_total", "moestream:generation_tokens_total", "moestream:request_success_total",
          "moestream:http_requests_total", "moestream:expert_device_hits_total", "moestream:expert_disk_bytes_total",
          "moestream:expert_reads_in_flight_mean", "moestream:disk_read_seconds_total", "moestream:engram_bytes_total"})
        BOOST_TEST(p.families.count(name) == 1u, name);
    BOOST_TEST(value_of(p, "llamacpp:prompt_tokens_total") == 65.0);  // 60 + 5 processed
    BOOST_TEST(value_of(p, "llamacpp:prompt_seconds_total") == 1.5);
    BOOST_TEST(value_of(p, "llamacpp:prompt_tokens_seconds") == 65.0 / 1.5);
    BOOST_TEST(value_of(p, "llamacpp:predicted_tokens_seconds") == 2.0);
    BOOST_TEST(value_of(p, "llamacpp:requests_processing") == 3.0);
    BOOST_TEST(value_of(p, "llamacpp:requests_deferred") == 2.0);
    BOOST_TEST(value_of(p, "llamacpp:n_tokens_max") == 777.0);
    BOOST_TEST(value_of(p, "llamacpp:n_decode_total") == 40.0);
    BOOST_TEST(value_of(p, "llamacpp:n_busy_slots_per_decode") == 2.5);
    BOOST_TEST(value_of(p, "moestream:prefix_cache_queries_total") == 1000.0);
    BOOST_TEST(value_of(p, "moestream:prefix_cache_hits_total") == 600.0);
    BOOST_TEST(value_of(p, "moestream:prefix_cached_sequences") == 4.0);
    BOOST_TEST(value_of(p, "moestream:prefix_checkpoints_total") == 3.0);
    BOOST_TEST(value_of(p, "moestream:engine_busy_seconds_total") == 12.5);
    BOOST_TEST(value_of(p, "moestream:prompt_tokens_total") == 105.0);
    BOOST_TEST(value_of(p, "moestream:generation_tokens_total") == 16.0);
    const std::string ttft = "moestream:time_to_first_token_seconds";
    BOOST_TEST(value_of(p, ttft, ttft + "_count") == 1.0, "only the request with a token");
    BOOST_TEST(value_of(p, ttft, ttft + "_bucket", {{"le", "1"}}) == 0.0);
    BOOST_TEST(value_of(p, ttft, ttft + "_bucket", {{"le", "2"}}) == 1.0);
    const std::string e2e = "moestream:e2e_request_latency_seconds";
    BOOST_TEST(value_of(p, e2e, e2e + "_count") == 2.0);
    BOOST_TEST(value_of(p, e2e, e2e + "_sum") == 10.2);
    BOOST_TEST(value_of(p, e2e, e2e + "_bucket", {{"le", "0.25"}}) == 1.0);
    for (const char* reason : {"stop", "length", "abort", "error"})
        BOOST_TEST(value_of(p, "moestream:request_success_total", "moestream:request_success_total",
                            {{"finished_reason", reason}}) == (std::string(reason) == "length" || std::string(reason) == "error" ? 1.0 : 0.0),
                   reason);
    BOOST_TEST(value_of(p, "moestream:http_requests_total", "moestream:http_requests_total",
                        {{"handler", "/v1/completions"}, {"method", "POST"}, {"status", "200"}}) == 2.0);
    BOOST_TEST(value_of(p, "moestream:http_requests_total", "moestream:http_requests_total",
                        {{"handler", "/odd\"path\\"}, {"method", "GET"}, {"status", "404"}}) == 1.0);
    // The latest step per layer: 32 ms over 40 layers, 400 us of it waiting for experts.
    const std::string per_layer = "moestream:last_step_layer_microseconds";
    BOOST_TEST(value_of(p, per_layer, per_layer, {{"part", "total"}}) == 800.0, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(value_of(p, per_layer, per_layer, {{"part", "expert_wait"}}) == 400.0, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(value_of(p, per_layer, per_layer, {{"part", "scheduler"}}) == 30.0, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(value_of(p, "moestream:last_step_seconds", "moestream:last_step_seconds", {{"part", "compute"}}) == 0.012);
    BOOST_TEST(value_of(p, "moestream:expert_device_misses_total") == 20.0);
    BOOST_TEST(value_of(p, "moestream:expert_disk_bytes_total") == double(1 << 20));
    BOOST_TEST(value_of(p, "moestream:expert_reads_in_flight_mean") == 3.5);
    BOOST_TEST(value_of(p, "moestream:expert_reads_in_flight_max") == 8.0);
    // Speculative decoding, under both name sets, and the experts a step loads by kind.
    for (std::string prefix : {"llamacpp:", "moestream:"}) {
        BOOST_TEST(value_of(p, prefix + "spec_decode_num_drafts_total") == 9.0, prefix);
        BOOST_TEST(value_of(p, prefix + "spec_decode_num_draft_tokens_total") == 30.0, prefix);
        BOOST_TEST(value_of(p, prefix + "spec_decode_num_accepted_tokens_total") == 12.0, prefix);
        const std::string pos = prefix + "spec_decode_num_accepted_tokens_per_pos_total";
        BOOST_TEST(value_of(p, pos, pos, {{"position", "1"}}) == 7.0, prefix);
        BOOST_TEST(value_of(p, pos, pos, {{"position", "2"}}) == 3.0, prefix);
        BOOST_TEST(value_of(p, pos, pos, {{"position", "5"}}) == 0.0, prefix);
    }
    BOOST_TEST(value_of(p, "moestream:spec_verification_steps_total") == 6.0);
    BOOST_TEST(value_of(p, "moestream:spec_draft_failures_total") == 1.0);
    const std::string ex = "moestream:step_experts_total", exs = "moestream:step_experts_steps_total";
    BOOST_TEST(value_of(p, ex, ex, {{"kind", "prefill"}}) == 500.0);
    BOOST_TEST(value_of(p, ex, ex, {{"kind", "verify"}}) == 240.0);
    BOOST_TEST(value_of(p, ex, ex, {{"kind", "decode"}}) == 90.0);
    BOOST_TEST(value_of(p, exs, exs, {{"kind", "verify"}}) == 6.0);
    BOOST_TEST(value_of(p, exs, exs, {{"kind", "decode"}}) == 5.0);

    // Without streaming figures (experts resident) those families are absent; the text stays valid.
    const auto q = parse_exposition(m.render(e, nullptr), model);
    BOOST_TEST_REQUIRE(q.error.empty(), q.error);
    BOOST_TEST(q.families.count("moestream:expert_disk_bytes_total") == 0u);
    BOOST_TEST(q.families.count("llamacpp:n_decode_total") == 1u);
}

// The reader above rejects what it should (so its verdicts on render() mean something).
BOOST_AUTO_TEST_CASE(the_exposition_reader_rejects_malformed_text) {
    const std::string head = "# HELP a_total x\n# TYPE a_total counter\n";
    const std::string hist = "# HELP h x\n# TYPE h histogram\n";
    BOOST_TEST(parse_exposition(head + "a_total{model_name=\"m\"} 3\n", "m").error.empty());
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"a_total{model_name=\"m\"} 3\n", "sample before its HELP and TYPE"},
        {head + "a_total{model_name=\"x\"} 3\n", "model_name missing or wrong"},
        {head + "a_total{model_name=\"m\",k=\"a\\tb\"} 3\n", "bad escape"},
        {head + "a_total{model_name=\"m\"} three\n", "bad value"},
        {head + "a_total{model_name=\"m\"} -1\n", "negative counter"},
        {"# HELP a x\n# TYPE a counter\n", "a counter not ending in _total"},
        {head + head, "family declared twice"},
        {hist + "h_bucket{model_name=\"m\",le=\"1\"} 2\nh_bucket{model_name=\"m\",le=\"+Inf\"} 1\n"
                "h_sum{model_name=\"m\"} 1\nh_count{model_name=\"m\"} 1\n",
         "buckets not ascending or not cumulative"},
        {hist + "h_bucket{model_name=\"m\",le=\"1\"} 1\nh_bucket{model_name=\"m\",le=\"+Inf\"} 2\n"
                "h_sum{model_name=\"m\"} 1\nh_count{model_name=\"m\"} 3\n",
         "+Inf != _count"},
        {hist + "h_bucket{model_name=\"m\",le=\"1\"} 1\nh_sum{model_name=\"m\"} 1\nh_count{model_name=\"m\"} 1\n",
         "no +Inf bucket last"},
    };
    for (const auto& [text, why] : bad) {
        const auto err = parse_exposition(text, "m").error;
        BOOST_TEST(err.find(why) != std::string::npos, "expected '" << why << "', got '" << err << "'");
    }
}

BOOST_AUTO_TEST_CASE(http_series_are_bounded) {
    server_metrics m("m");
    const size_t n = server_metrics::kMaxHttpSeries + 44;
    for (size_t i = 0; i < n; ++i) m.count_http("/h" + std::to_string(i), "GET", 200);
    m.count_http("/h0", "GET", 200);  // an existing series still counts under its own labels
    const auto p = parse_exposition(m.render(engine_stats{}, nullptr), "m");
    BOOST_TEST_REQUIRE(p.error.empty(), p.error);
    const auto& samples = p.families.at("moestream:http_requests_total").samples;
    BOOST_TEST(samples.size() == server_metrics::kMaxHttpSeries + 1);
    double total = 0;
    for (const auto& s : samples) total += s.value;
    BOOST_TEST(total == double(n + 1));
    BOOST_TEST(value_of(p, "moestream:http_requests_total", "moestream:http_requests_total",
                        {{"handler", "other"}, {"method", "other"}, {"status", "other"}}) == 44.0);
    BOOST_TEST(value_of(p, "moestream:http_requests_total", "moestream:http_requests_total",
                        {{"handler", "/h0"}, {"method", "GET"}, {"status", "200"}}) == 2.0);
}

BOOST_AUTO_TEST_CASE(streaming_figures_follow_the_tier_counters) {
    tier_counters t;
    t.demands = 100;
    t.device_hits = 60;
    t.host_hits = 25;
    t.joins = 5;
    t.disk_reads = 10;
    t.disk_bytes = 12345;
    t.hint_reads = 7;
    t.hint_used = 4;
    t.wait_seconds = 1.25;
    io::reader_stats r;
    r.busy_seconds = 2.5;
    r.time_mean_in_flight = 6.5;
    r.max_in_flight = 32;
    engram_counters g;
    g.rows_requested = 80;
    g.rows_read = 30;
    g.bytes_read = 4096;
    g.wait_seconds = 0.5;
    const auto f = streaming_figures_from(t, r, &g);
    BOOST_TEST(f.device_hits == 60u);
    BOOST_TEST(f.device_misses == 40u);
    BOOST_TEST(f.host_hits == 25u);
    BOOST_TEST(f.host_misses == 15u);
    BOOST_TEST(f.disk_reads == 10u);
    BOOST_TEST(f.disk_bytes == 12345u);
    BOOST_TEST(f.disk_seconds == 2.5);
    BOOST_TEST(f.reads_in_flight_mean == 6.5);
    BOOST_TEST(f.reads_in_flight_max == 32u);
    BOOST_TEST(f.engram_rows_read == 30u);
    BOOST_TEST(f.engram_bytes == 4096u);
    BOOST_TEST(f.engram_wait_seconds == 0.5);
    const auto none = streaming_figures_from(t, r, nullptr);
    BOOST_TEST(none.engram_bytes == 0u);
    BOOST_TEST(finished_reason_label("tool_calls") == "stop");
    BOOST_TEST(finished_reason_label("context") == "length");
    BOOST_TEST(finished_reason_label("cancelled") == "abort");
    BOOST_TEST(finished_reason_label("error: x") == "error");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::server::test
