#include "server/websocket_protocol.h"

#include <simdjson.h>

#include "server/json_writer.h"

namespace moestream::server {

namespace {

using simdjson::dom::element;
using simdjson::dom::object;

ws_bad_message bad(std::string message, std::string param = {}, std::string id = {}) {
    return ws_bad_message{bad_request(std::move(param), std::move(message)), std::move(id)};
}

// The member `key` of `o`: nullopt when absent or null (null counts as absent, as in HTTP bodies).
std::optional<element> member(const object& o, std::string_view key) {
    element e;
    if (o.at_key(key).get(e) != simdjson::SUCCESS) return std::nullopt;
    if (e.is_null()) return std::nullopt;
    return e;
}

const char* type_name(const element& e) {
    switch (e.type()) {
        case simdjson::dom::element_type::ARRAY: return "array";
        case simdjson::dom::element_type::OBJECT: return "object";
        case simdjson::dom::element_type::STRING: return "string";
        case simdjson::dom::element_type::BOOL: return "boolean";
        case simdjson::dom::element_type::NULL_VALUE: return "null";
        default: return "number";
    }
}

std::string expected(std::string_view field, std::string_view what, const element& got) {
    return std::string(field) + ": expected " + std::string(what) + ", got " + type_name(got);
}

std::variant<std::string, ws_bad_message> read_id(const object& o, const websocket_limits& limits) {
    auto e = member(o, "id");
    if (!e) return bad("id: required (a string naming the request on this connection)", "id");
    if (!e->is_string()) return bad(expected("id", "a string", *e), "id");
    const std::string_view id = e->get_string().value_unsafe();
    if (id.empty()) return bad("id: must not be empty", "id");
    if (id.size() > limits.max_id_bytes)
        return bad("id: longer than " + std::to_string(limits.max_id_bytes) + " bytes", "id");
    return std::string(id);
}

ws_client_message parse_create(const object& o, const websocket_limits& limits) {
    auto id_or = read_id(o, limits);
    if (auto* b = std::get_if<ws_bad_message>(&id_or)) return std::move(*b);
    ws_create c;
    c.id = std::move(std::get<std::string>(id_or));

    auto api = member(o, "api");
    if (!api) return bad("api: required (chat.completions, completions, completion or infill)", "api", c.id);
    if (!api->is_string()) return bad(expected("api", "a string", *api), "api", c.id);
    const std::string_view name = api->get_string().value_unsafe();
    if (name == "chat.completions") c.route = api_route::chat_completions;
    else if (name == "completions") c.route = api_route::completions;
    else if (name == "completion") c.route = api_route::native_completion;
    else if (name == "infill") c.route = api_route::infill;
    else
        return bad("api: unknown API \"" + std::string(name) +
                       "\" (expected chat.completions, completions, completion or infill)",
                   "api", c.id);

    auto body = member(o, "body");
    if (!body) return bad("body: required (the JSON body of the HTTP request)", "body", c.id);
    if (!body->is_object()) return bad(expected("body", "an object", *body), "body", c.id);
    c.body = simdjson::to_string(*body);

    if (auto opts = member(o, "options")) {
        if (!opts->is_object()) return bad(expected("options", "an object", *opts), "options", c.id);
        const object oo = opts->get_object().value_unsafe();
        struct flag {
            std::string_view key;
            bool* target;
        } flags[] = {{"include_usage", &c.options.include_usage},
                     {"timings", &c.options.timings},
                     {"token_ids", &c.options.token_ids}};
        for (const auto& f : flags) {
            auto v = member(oo, f.key);
            if (!v) continue;
            const std::string path = "options." + std::string(f.key);
            if (!v->is_bool()) return bad(expected(path, "a boolean", *v), path, c.id);
            *f.target = v->get_bool().value_unsafe();
        }
    }
    return c;
}

ws_client_message parse_session_update(const object& o, const websocket_limits& limits) {
    auto d = member(o, "defaults");
    if (!d) return bad("defaults: required (an object of request body fields; {} clears them)", "defaults");
    if (!d->is_object()) return bad(expected("defaults", "an object", *d), "defaults");
    // The prompt is per request by nature; a default one would silently answer the wrong question.
    static constexpr std::string_view per_request[] = {"messages",     "prompt",      "input_prefix",
                                                       "input_suffix", "input_extra", "suffix"};
    const object members = d->get_object().value_unsafe();
    for (auto field : members) {
        for (auto k : per_request)
            if (field.key == k)
                return bad("defaults." + std::string(k) + ": the prompt cannot have a session default",
                           "defaults." + std::string(k));
    }
    std::string text = simdjson::to_string(*d);
    if (text.size() > limits.max_defaults_bytes)
        return bad("defaults: larger than " + std::to_string(limits.max_defaults_bytes) + " bytes", "defaults");
    MS_ASSERT(text.size() >= 2 && text.front() == '{' && text.back() == '}');
    return ws_session_update{text.substr(1, text.size() - 2)};
}

}  // namespace

ws_client_message parse_client_message(std::string_view text, const websocket_limits& limits) {
    simdjson::dom::parser parser;
    element doc;
    if (auto err = parser.parse(text.data(), text.size()).get(doc))
        return bad(std::string("the message is not valid JSON: ") + simdjson::error_message(err));
    if (!doc.is_object()) return bad(std::string("the message must be a JSON object, got ") + type_name(doc));
    const object o = doc.get_object().value_unsafe();
    auto type = member(o, "type");
    if (!type) return bad("type: required (request.create, request.cancel, ping or session.update)", "type");
    if (!type->is_string()) return bad(expected("type", "a string", *type), "type");
    const std::string_view t = type->get_string().value_unsafe();
    if (t == "request.create") return parse_create(o, limits);
    if (t == "request.cancel") {
        auto id = read_id(o, limits);
        if (auto* b = std::get_if<ws_bad_message>(&id)) return std::move(*b);
        return ws_cancel{std::move(std::get<std::string>(id))};
    }
    if (t == "ping") {
        auto v = member(o, "t");
        std::string echo = v ? simdjson::to_string(*v) : std::string();
        if (echo.size() > limits.max_ping_bytes)
            return bad("t: larger than " + std::to_string(limits.max_ping_bytes) + " bytes of JSON", "t");
        return ws_ping{std::move(echo)};
    }
    if (t == "session.update") return parse_session_update(o, limits);
    return bad("type: unknown message type \"" + std::string(t) +
                   "\" (expected request.create, request.cancel, ping or session.update)",
               "type");
}

std::string body_with_defaults(const std::string& body, const std::string& defaults_members) {
    if (defaults_members.empty()) return body;
    MS_ASSERT(body.size() >= 2 && body.front() == '{' && body.back() == '}');
    std::string out = body.substr(0, body.size() - 1);
    if (body.size() > 2) out += ',';
    out += defaults_members;
    out += '}';
    return out;
}

// ---- deltas ----------------------------------------------------------------------------------------

std::vector<ws_delta> deltas_of(const job_update& u, bool token_ids) {
    std::vector<tool_call_delta> calls;
    for (const auto& tc : u.delta.tool_calls) {
        const bool continues = !calls.empty() && calls.back().index == tc.index && tc.id.empty() && tc.name.empty();
        if (continues) calls.back().arguments += tc.arguments;
        else calls.push_back(tc);
    }
    std::vector<ws_delta> out;
    ws_delta first;
    first.reasoning = u.delta.reasoning;
    first.content = u.delta.content;
    if (token_ids)
        for (const auto& t : u.tokens) first.token_ids.push_back(t.id);
    if (!calls.empty()) first.call = calls.front();
    if (first.has_text() || !first.token_ids.empty()) out.push_back(std::move(first));
    for (size_t i = 1; i < calls.size(); ++i) {
        ws_delta d;
        d.call = std::move(calls[i]);
        out.push_back(std::move(d));
    }
    return out;
}

bool can_merge(const ws_delta& earlier, const ws_delta& later) {
    if (later.call) {
        // Only more arguments of the call `earlier` ends with.
        return earlier.call && earlier.call->index == later.call->index && later.call->id.empty() &&
               later.call->name.empty() && later.reasoning.empty() && later.content.empty();
    }
    if (earlier.call) return false;  // text after a call would read as text before it
    return earlier.content.empty() || later.reasoning.empty();  // reasoning after content: keep apart
}

void merge_into(ws_delta& earlier, ws_delta&& later) {
    MS_ASSERT(can_merge(earlier, later));
    earlier.reasoning += later.reasoning;
    earlier.content += later.content;
    if (later.call) earlier.call->arguments += later.call->arguments;
    earlier.token_ids.insert(earlier.token_ids.end(), later.token_ids.begin(), later.token_ids.end());
}

// ---- server messages -------------------------------------------------------------------------------

std::string session_created_json(const ws_session_info& info, const websocket_limits& limits) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("type", "session.created");
    w.member("protocol", k_ws_subprotocol);
    w.member("server", info.server);
    w.member("model", info.model);
    w.member("n_ctx", info.n_ctx);
    w.member("max_parallel", info.max_parallel);
    w.key("limits").begin_object();
    w.member("max_message_bytes", limits.max_message_bytes);
    w.member("max_inflight", limits.max_inflight);
    w.member("soft_queue_bytes", limits.soft_queue_bytes);
    w.member("hard_queue_bytes", limits.hard_queue_bytes);
    w.member("max_id_bytes", limits.max_id_bytes);
    w.member("max_ping_bytes", limits.max_ping_bytes);
    w.end_object();
    w.end_object();
    return out;
}

std::string session_updated_json(const std::string& defaults_members) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("type", "session.updated");
    w.key("defaults");
    // The members were produced by simdjson's serializer from a parsed object: valid JSON.
    w.raw("{" + defaults_members + "}");
    w.end_object();
    return out;
}

std::string request_accepted_json(std::string_view id) {
    std::string out;
    json_writer w(out);
    w.begin_object().member("type", "request.accepted").member("id", id).end_object();
    return out;
}

std::string delta_json(std::string_view id, uint64_t seq, const ws_delta& d) {
    std::string out;
    out.reserve(64 + id.size() + d.content.size() + d.reasoning.size() + 8 * d.token_ids.size());
    json_writer w(out);
    w.begin_object();
    w.member("type", "delta");
    w.member("id", id);
    w.member("seq", seq);
    if (!d.reasoning.empty()) w.member("reasoning", d.reasoning);
    if (!d.content.empty()) w.member("content", d.content);
    if (d.call) {
        w.key("tool_call").begin_object();
        w.member("index", d.call->index);
        if (!d.call->id.empty()) w.member("id", d.call->id);
        if (!d.call->name.empty()) w.member("name", d.call->name);
        w.member("arguments", d.call->arguments);
        w.end_object();
    }
    if (!d.token_ids.empty()) {
        w.key("token_ids").begin_array();
        for (int32_t t : d.token_ids) w.value(t);
        w.end_array();
    }
    w.end_object();
    return out;
}

std::string request_done_json(std::string_view id, std::string_view finish_reason, const job_usage& u,
                              const ws_request_options& options) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("type", "request.done");
    w.member("id", id);
    w.member("finish_reason", finish_reason);
    if (options.include_usage) {
        w.key("usage").begin_object();
        w.member("prompt_tokens", u.prompt_tokens);
        w.member("completion_tokens", u.completion_tokens);
        w.member("total_tokens", u.prompt_tokens + u.completion_tokens);
        w.key("prompt_tokens_details").begin_object().member("cached_tokens", u.cached_tokens).end_object();
        w.end_object();
    }
    if (options.timings) {
        // llama-server's timings names (server-api-anchors.md §2.2), as on the HTTP routes.
        const int64_t prompt_n = u.prompt_tokens - u.cached_tokens;
        auto per_second = [](int64_t n, double s) { return s > 0 ? double(n) / s : 0.0; };
        w.key("timings").begin_object();
        w.member("cache_n", u.cached_tokens);
        w.member("prompt_n", prompt_n);
        w.member("prompt_ms", u.prefill_s * 1e3);
        w.member("prompt_per_token_ms", prompt_n > 0 ? u.prefill_s * 1e3 / double(prompt_n) : 0.0);
        w.member("prompt_per_second", per_second(prompt_n, u.prefill_s));
        w.member("predicted_n", u.completion_tokens);
        w.member("predicted_ms", u.decode_s * 1e3);
        w.member("predicted_per_token_ms",
                 u.completion_tokens > 0 ? u.decode_s * 1e3 / double(u.completion_tokens) : 0.0);
        w.member("predicted_per_second", per_second(u.completion_tokens, u.decode_s));
        w.member("queue_ms", u.queue_s * 1e3);
        if (u.draft_n > 0) w.member("draft_n", u.draft_n).member("draft_n_accepted", u.draft_n_accepted);
        w.end_object();
    }
    w.end_object();
    return out;
}

std::string error_json(std::string_view id, const api_error& e) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("type", "error");
    if (!id.empty()) w.member("id", id);
    w.key("error").begin_object();
    w.member("code", e.status).member("type", e.type).member("message", e.message);
    w.key("param");
    if (e.param.empty()) w.null();
    else w.value(e.param);
    for (const auto& [k, v] : e.extra) w.member(k, v);
    w.end_object();
    w.end_object();
    return out;
}

std::string pong_json(std::string_view t_json) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("type", "pong");
    if (!t_json.empty()) {
        w.key("t");
        w.raw(t_json);  // simdjson's serialization of a parsed value: valid JSON
    }
    w.end_object();
    return out;
}

}  // namespace moestream::server
