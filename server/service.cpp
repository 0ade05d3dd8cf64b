#include "server/service.h"

#include <boost/asio/this_coro.hpp>
#include <ctime>

#include "server/anthropic_response.h"
#include "server/anthropic_route.h"
#include "server/completion_job.h"
#include "server/constraint_request.h"
#include "server/json_writer.h"
#include "server/request.h"
#include "server/response_format.h"
#include "server/responses_route.h"
#include "server/responses_store.h"


namespace moestream::server {

namespace asio = boost::asio;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int k_route_chat = 0, k_route_text = 1, k_route_native = 2, k_route_infill = 3;

http_response json_response(std::string body, int status = 200) {
    http_response r;
    r.status = status;
    r.body = std::move(body);
    return r;
}

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

std::string sse_event(const std::string& json) { return "data: " + json + "\n\n"; }

}  // namespace

http_response error_response(const api_error& e) {
    http_response r;
    r.status = e.status;
    r.body = to_json(e);
    if (e.status == 429 || e.status == 503) r.headers.push_back({"Retry-After", "1"});
    return r;
}

std::string error_body(std::string_view path, const api_error& e) {
    return is_anthropic_path(path) ? anthropic_error_json(e) : to_json(e);
}

namespace {

// An error answered by the router: in the shape of the API the path belongs to.
http_response error_on(std::string_view path, const api_error& e) {
    return is_anthropic_path(path) ? anthropic_error_response(e) : error_response(e);
}

}  // namespace

service::service(service_limits limits)
    : limits_(limits),
      metrics_(std::make_unique<server_metrics>("")),
      responses_(std::make_shared<response_store>(limits.response_store_max)),
      anthropic_(std::make_shared<anthropic_route>(*this)) {}

void service::set_model(served_model m) {
    MS_ASSERT_MSG(!ready_.load(), "service::set_model called twice");
    model_ = std::move(m);
    metrics_ = std::make_unique<server_metrics>(model_.name);
    ready_ = true;
}

asio::awaitable<int> service::handle(const api_request& req, responder& out) {
    const std::string_view p = req.path;
    const bool get = req.method == "GET", post = req.method == "POST";
    auto reply = [&](http_response r) -> asio::awaitable<int> {
        const int status = r.status;
        co_await out.send(std::move(r));
        co_return status;
    };
    auto method_not_allowed = [&](const char* allowed) {
        auto r = error_on(p, make_api_error(405, "invalid_request_error",
                                            std::string(req.method) + " is not allowed on " + std::string(p) +
                                                " (use " + allowed + ")"));
        r.headers.push_back({"Allow", allowed});
        return r;
    };

    // Claude Code checks with HEAD / that the server is there.
    if (p == "/" && req.method == "HEAD") {
        http_response here;  // named: GCC 12 mishandles a braced temporary across co_await
        here.content_type = "text/plain";
        co_return co_await reply(std::move(here));
    }
    if (p == "/health" || p == "/v1/health") {
        if (!get) co_return co_await reply(method_not_allowed("GET"));
        co_return co_await reply(health());
    }
    struct route_entry {
        std::string_view path;
        bool is_post;
        int kind;  // 0..3 completions, 10+ small endpoints
    };
    static constexpr route_entry routes[] = {
        {"/v1/chat/completions", true, k_route_chat}, {"/chat/completions", true, k_route_chat},
        {"/v1/completions", true, k_route_text},      {"/completion", true, k_route_native},
        {"/completions", true, k_route_native},       {"/infill", true, k_route_infill},
        {"/tokenize", true, 10},                       {"/detokenize", true, 11},
        {"/v1/models", false, 12},                     {"/models", false, 12},
        {"/props", false, 13},                         {"/slots", false, 14},
        {"/metrics", false, 15},
        {"/v1/responses", true, 20},                   {"/responses", true, 20},
        {"/v1/messages", true, 30},                    {"/v1/messages/count_tokens", true, 31},
    };
    const route_entry* hit = nullptr;
    for (const auto& r : routes)
        if (r.path == p) hit = &r;
    for (std::string_view prefix : {std::string_view("/v1/models/"), std::string_view("/models/")}) {
        if (hit || !p.starts_with(prefix) || p.size() == prefix.size()) continue;
        if (!get) co_return co_await reply(method_not_allowed("GET"));
        if (!ready_ || draining_)
            co_return co_await reply(error_response(
                make_api_error(503, "unavailable_error", draining_ ? "the server is shutting down" : "Loading model")));
        co_return co_await reply(model(p.substr(prefix.size())));
    }
    if (!hit)
        co_return co_await reply(
            error_on(p, make_api_error(404, "not_found_error", "no route " + std::string(p))));
    if (hit->is_post != post || (!hit->is_post && !get))
        co_return co_await reply(method_not_allowed(hit->is_post ? "POST" : "GET"));
    if (!ready_ || draining_)
        co_return co_await reply(error_on(
            p, make_api_error(503, "unavailable_error", draining_ ? "the server is shutting down" : "Loading model")));
    switch (hit->kind) {
        case 10: co_return co_await reply(tokenize(req.body));
        case 11: co_return co_await reply(detokenize(req.body));
        case 12: co_return co_await reply(models());
        case 13: co_return co_await reply(props());
        case 14: co_return co_await reply(slots());
        case 15: co_return co_await reply(metrics_text());
        case 20: co_return co_await serve_responses(*this, req, out);
        case 30: co_return co_await anthropic_->messages(req, out);
        case 31: co_return co_await anthropic_->count_tokens(req, out);
        default: co_return co_await completion(req, out, hit->kind);
    }
}

http_response service::health() const {
    if (!ready_ || draining_)
        return error_response(
            make_api_error(503, "unavailable_error", draining_ ? "the server is shutting down" : "Loading model"));
    return json_response(R"({"status":"ok"})");
}

namespace {

// "%2F" -> "/": a model id in a path (the SDKs send ids with '/' raw, others encode them).
std::string percent_decoded(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        auto hex = [](char c) {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
        };
        if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
            out.push_back(char(hex(s[i + 1]) * 16 + hex(s[i + 2])));
            i += 2;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

}  // namespace

// GET /v1/models/{id} (the SDKs' models.retrieve): the served model's object, or OpenAI's 404.
http_response service::model(std::string_view id_in_path) const {
    const std::string id = percent_decoded(id_in_path);
    if (id != model_.name)
        return error_response(make_api_error(404, "invalid_request_error",
                                             "The model " + json_escape(id) + " does not exist (this server serves " +
                                                 json_escape(model_.name) + ")",
                                             "model"));
    std::string out;
    json_writer w(out);
    write_model(w);
    return json_response(std::move(out));
}

http_response service::models() const {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.key("object");
    w.value("list");
    w.key("data");
    w.begin_array();
    write_model(w);
    w.end_array();
    w.end_object();
    return json_response(std::move(out));
}

void service::write_model(json_writer& w) const {
    w.begin_object();
    w.key("id");
    w.value(model_.name);
    w.key("object");
    w.value("model");
    w.key("created");
    w.value(int64_t(std::chrono::duration_cast<std::chrono::seconds>(started_.time_since_epoch()).count()));
    w.key("owned_by");
    w.value("moestream");
    w.key("meta");
    w.begin_object();
    w.key("n_ctx");
    w.value(model_.n_ctx);
    w.key("n_ctx_train");
    w.value(model_.n_ctx_train);
    w.key("n_vocab");
    w.value(model_.n_vocab);
    w.key("n_params");
    w.value(model_.n_params);
    w.key("size");
    w.value(model_.size_bytes);
    w.end_object();
    w.key("max_model_len");
    w.value(model_.n_ctx);
    w.end_object();
}

http_response service::props() const {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.key("default_generation_settings");
    w.begin_object();
    w.key("n_ctx");
    w.value(model_.n_ctx);
    w.key("params");
    w.begin_object();
    w.key("temperature");
    w.value(0.8);
    w.key("top_k");
    w.value(int64_t(40));
    w.key("top_p");
    w.value(0.95);
    w.key("min_p");
    w.value(0.05);
    w.key("n_predict");
    w.value(int64_t(-1));
    w.key("speculative.n_max");
    w.value(model_.spec_n_max);
    w.end_object();
    w.end_object();
    w.key("total_slots");
    w.value(model_.slots);
    w.key("model_path");
    w.value(model_.path);
    w.key("chat_template");
    w.value(model_.tok ? model_.tok->data().chat_template : std::string());
    w.key("modalities");
    w.begin_object();
    w.key("vision");
    w.value(false);
    w.key("audio");
    w.value(false);
    w.end_object();
    w.key("build_info");
    w.value("moestream " MOESTREAM_VERSION);
    w.key("backend");
    w.value(model_.backend);
    w.key("device");
    w.value(model_.device);
    w.end_object();
    return json_response(std::move(out));
}

http_response service::slots() const {
    const auto s = model_.eng->stats();
    std::string out;
    json_writer w(out);
    w.begin_array();
    for (int64_t i = 0; i < model_.slots; ++i) {
        w.begin_object();
        w.key("id");
        w.value(i);
        w.key("n_ctx");
        w.value(model_.n_ctx);
        w.key("speculative");
        w.value(model_.spec_n_max > 0);
        w.key("is_processing");
        w.value(i < s.running);
        w.end_object();
    }
    w.end_array();
    return json_response(std::move(out));
}

http_response service::metrics_text() const {
    http_response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    streaming_figures f{};
    const bool streamed = bool(model_.streaming);
    if (streamed) f = model_.streaming();
    r.body = metrics_->render(model_.eng->stats(), streamed ? &f : nullptr);
    // Which backend and device run the model, as an info gauge (its labels are the answer).
    const auto label = [](std::string_view v) {
        std::string e;
        for (char c : v) {
            if (c == '\\' || c == '"') e += '\\';
            if (c == '\n') e += "\\n";
            else e += c;
        }
        return e;
    };
    r.body += "# HELP moestream:backend_info The backend and device that run the model.\n"
              "# TYPE moestream:backend_info gauge\n"
              "moestream:backend_info{model_name=\"" + label(model_.name) + "\",backend=\"" + label(model_.backend) +
              "\",device=\"" + label(model_.device) + "\"} 1\n";
    return r;
}

http_response service::tokenize(std::string_view body) const {
    auto parsed = parse_tokenize_request(body);
    if (!parsed) return error_response(parsed.error());
    const auto& r = *parsed;
    if (!model_.tok) return error_response(make_api_error(501, "not_supported_error", "this model has no tokenizer"));
    std::vector<int32_t> ids;
    if (r.add_special && model_.tok->data().add_bos) ids.push_back(model_.tok->data().bos_id);
    const auto body_ids = model_.tok->encode(r.content, r.parse_special);
    ids.insert(ids.end(), body_ids.begin(), body_ids.end());
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.key("tokens");
    w.begin_array();
    for (int32_t id : ids) {
        if (!r.with_pieces) {
            w.value(int64_t(id));
            continue;
        }
        const std::string piece = model_.tok->token_bytes(id);
        w.begin_object();
        w.key("id");
        w.value(int64_t(id));
        w.key("piece");
        if (is_valid_utf8(piece)) {
            w.value(piece);
        } else {  // llama-server: a byte array when the piece is not valid UTF-8 on its own
            w.begin_array();
            for (unsigned char c : piece) w.value(int64_t(c));
            w.end_array();
        }
        w.end_object();
    }
    w.end_array();
    w.end_object();
    return json_response(std::move(out));
}

http_response service::detokenize(std::string_view body) const {
    auto parsed = parse_detokenize_request(body, model_.n_vocab);
    if (!parsed) return error_response(parsed.error());
    const auto& r = *parsed;
    if (!model_.tok) return error_response(make_api_error(501, "not_supported_error", "this model has no tokenizer"));
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.key("content");
    w.value(model_.tok->decode(r.tokens));
    w.end_object();
    return json_response(std::move(out));
}

service::job_registration::job_registration(service& s, completion_job* job) : s_(s), job_(job) {
    std::lock_guard lock(s_.jobs_mu_);
    s_.jobs_.push_back(job_);
}

service::job_registration::~job_registration() {
    std::lock_guard lock(s_.jobs_mu_);
    std::erase(s_.jobs_, job_);
}

size_t service::live_jobs() const {
    std::lock_guard lock(jobs_mu_);
    return jobs_.size();
}

void service::cancel_all() {
    std::lock_guard lock(jobs_mu_);
    for (auto* j : jobs_) j->cancel();
}

void service::abandon_all() {
    std::lock_guard lock(jobs_mu_);
    for (auto* j : jobs_) j->abandon();
}

// ---- completions ---------------------------------------------------------------------------------

asio::awaitable<int> service::completion(const api_request& req, responder& out, int kind) {
    const auto arrival = clock_type::now();
    const api_route route = kind == k_route_chat   ? api_route::chat_completions
                            : kind == k_route_text ? api_route::completions
                            : kind == k_route_native ? api_route::native_completion
                                                     : api_route::infill;
    parse_limits limits;
    limits.vocab = model_.n_vocab;
    auto parsed = parse_completion_request(req.body, route, limits);
    if (!parsed) {
        co_await out.send(error_response(parsed.error()));
        co_return parsed.error().status;
    }
    auto constraint = parse_constraint_request(req.body);  // response_format
    if (!constraint) {
        co_await out.send(error_response(constraint.error()));
        co_return constraint.error().status;
    }
    auto started = completion_job::start(model_, std::move(*parsed), *constraint);
    if (!started) {
        co_await out.send(error_response(started.error()));
        co_return started.error().status;
    }
    auto job = std::move(*started);
    job_registration registered(*this, job.get());
    const auto& creq = job->request();

    response_meta meta;
    meta.id = std::string(route == api_route::chat_completions ? "chatcmpl-" : "cmpl-") + std::to_string(job->serial());
    meta.created = int64_t(std::time(nullptr));
    meta.model = creq.model.empty() ? model_.name : creq.model;
    meta.fingerprint = "moestream-" MOESTREAM_VERSION;

    request_observation obs;
    std::optional<clock_type::time_point> first_token, last_emit;
    const auto deadline = arrival + limits_.request_timeout;
    auto observe = [&](const job_update& u) {
        const auto now = clock_type::now();
        if (!u.tokens.empty()) {
            if (!first_token) first_token = now;
            else if (last_emit) obs.itl_s.push_back(seconds(now - *last_emit));
            last_emit = now;
        }
        if (u.done) {
            obs.queue_s = u.usage.queue_s;
            obs.prefill_s = u.usage.prefill_s;
            obs.decode_s = u.usage.decode_s;
            obs.ttft_s = first_token ? seconds(*first_token - arrival) : seconds(now - arrival);
            obs.e2e_s = seconds(now - arrival);
            obs.prompt_tokens = u.usage.prompt_tokens;
            obs.cached_tokens = u.usage.cached_tokens;
            obs.completion_tokens = u.usage.completion_tokens;
            obs.finish_reason = u.finish_reason == "error" ? "error"
                                : u.finish_reason == "cancelled" ? "abort"
                                : u.finish_reason == "length" ? "length"
                                                              : "stop";
            metrics_->observe_request(obs);
        }
    };
    // Waits for the next update, or for the deadline; a cancelled (shutdown) or timed-out job
    // becomes an error update.
    auto next_update = [&](std::chrono::milliseconds wait) -> asio::awaitable<std::optional<job_update>> {
        const auto now = clock_type::now();
        if (now >= deadline) {
            job->cancel();
            job_update u;
            u.done = true;
            u.finish_reason = "error";
            u.error = make_api_error(504, "timeout_error",
                                     "the request took longer than the server's limit of " +
                                         std::to_string(limits_.request_timeout.count()) + " s");
            co_return u;
        }
        auto w = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                                    std::chrono::milliseconds(1));
        auto u = co_await job->next(w);
        if (u && u->done && u->finish_reason == "cancelled") {
            u->finish_reason = "error";
            u->error = make_api_error(503, "unavailable_error", "the request was cancelled: the server is shutting down");
        }
        co_return u;
    };

    if (!creq.stream) {
        job_totals totals;
        for (;;) {
            auto u = co_await next_update(std::chrono::milliseconds(1000));
            if (!u) continue;
            observe(*u);
            totals.add(*u);
            if (u->done) break;
        }
        if (totals.last.finish_reason == "error") {
            co_await out.send(error_response(totals.last.error));
            co_return totals.last.error.status;
        }
        std::string body = route == api_route::chat_completions ? chat_completion_json(meta, *job, totals)
                           : route == api_route::completions   ? text_completion_json(meta, *job, totals)
                                                               : native_completion_json(*job, totals);
        co_await out.send(json_response(std::move(body)));
        co_return 200;
    }

    // Streaming. The first update decides between an HTTP error and a 200 stream; while the
    // prompt is processed the stream is kept alive with SSE comments.
    const bool oai = route == api_route::chat_completions || route == api_route::completions;
    std::optional<chat_stream> chat;
    std::optional<text_stream> text;
    if (route == api_route::chat_completions) chat.emplace(meta, *job);
    if (route == api_route::completions) text.emplace(meta, *job);
    bool begun = false;
    std::vector<std::string> events;
    const auto ping = std::chrono::duration_cast<std::chrono::milliseconds>(limits_.ping_interval);
    for (;;) {
        auto u = co_await next_update(ping);
        if (!u) {
            if (!begun) {
                co_await out.stream_begin("text/event-stream");
                begun = true;
            }
            co_await out.stream_write(": ping\n\n");
            continue;
        }
        observe(*u);
        if (u->finish_reason == "error" && !begun) {
            co_await out.send(error_response(u->error));
            co_return u->error.status;
        }
        if (!begun) {
            co_await out.stream_begin("text/event-stream");
            begun = true;
        }
        events.clear();
        if (chat) chat->on_update(*u, events);
        else if (text) text->on_update(*u, events);
        else native_stream_update(*job, *u, events);
        std::string data;
        for (const auto& e : events) data += sse_event(e);
        if (u->done) {
            if (u->finish_reason == "error") data += sse_event(to_json(u->error));
            else if (oai) data += "data: [DONE]\n\n";
        }
        if (!data.empty()) co_await out.stream_write(data);
        if (u->done) break;
    }
    co_await out.stream_end();
    co_return 200;
}

}  // namespace moestream::server
