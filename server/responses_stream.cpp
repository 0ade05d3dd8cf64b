#include "server/responses_stream.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>

#include "server/json_writer.h"

namespace moestream::server {

namespace {

uint64_t process_salt() {
    static const uint64_t salt = [] {
        std::random_device rd;
        return (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }();
    return salt;
}

std::atomic<uint64_t> g_next_id{1};

}  // namespace

std::string new_response_id(std::string_view prefix) {
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(process_salt()),
                  static_cast<unsigned long long>(g_next_id.fetch_add(1)));
    return std::string(prefix) + hex;
}

std::string response_error_code(const api_error& e) {
    if (e.type == "exceed_context_size_error") return "context_length_exceeded";
    if (e.status == 429) return "rate_limit_exceeded";
    return "server_error";
}

response_builder::response_builder(std::string id, int64_t created_at, std::string model, response_echo echo)
    : id_(std::move(id)), created_at_(created_at), model_(std::move(model)), echo_(std::move(echo)) {}

sse_event response_builder::event(std::string_view type, const std::function<void(json_writer&)>& fields) {
    sse_event e;
    e.type = std::string(type);
    json_writer w(e.data);
    w.begin_object().member("type", type).member("sequence_number", sequence_++);
    fields(w);
    w.end_object();
    return e;
}

// ---- the response object ---------------------------------------------------------------------

void response_builder::write_item(json_writer& w, const item& it) const {
    w.begin_object().member("id", it.id);
    switch (it.kind) {
        case item::reasoning:
            w.member("type", "reasoning").key("summary").begin_array().end_array();
            w.key("content").begin_array();
            w.begin_object().member("type", "reasoning_text").member("text", it.text).end_object();
            w.end_array();
            break;
        case item::message:
            w.member("type", "message").member("role", "assistant").key("content").begin_array();
            w.begin_object().member("type", "output_text").member("text", it.text);
            w.key("annotations").begin_array().end_array().key("logprobs").begin_array().end_array();
            w.end_object().end_array();
            break;
        case item::function_call:
            w.member("type", "function_call").member("call_id", it.call_id).member("name", it.name);
            w.member("arguments", it.arguments);
            break;
    }
    w.member("status", it.status).end_object();
}

void response_builder::write_response(json_writer& w) const {
    w.begin_object();
    w.member("id", id_).member("object", "response").member("created_at", created_at_);
    w.member("status", status_).member("background", false);
    w.key("error");
    if (error_) {
        w.begin_object().member("code", response_error_code(*error_)).member("message", error_->message).end_object();
    } else {
        w.null();
    }
    w.key("incomplete_details");
    if (status_ == "incomplete") w.begin_object().member("reason", "max_output_tokens").end_object();
    else w.null();
    w.key("instructions");
    if (echo_.instructions) w.value(*echo_.instructions);
    else w.null();
    w.key("max_output_tokens");
    if (echo_.max_output_tokens) w.value(*echo_.max_output_tokens);
    else w.null();
    w.key("max_tool_calls").null();
    w.member("model", model_);
    w.key("output").begin_array();
    for (const auto& it : items_) write_item(w, it);
    w.end_array();
    w.member("parallel_tool_calls", echo_.parallel_tool_calls);
    w.key("previous_response_id");
    if (echo_.previous_response_id.empty()) w.null();
    else w.value(echo_.previous_response_id);
    w.key("reasoning").begin_object();
    w.key("effort");
    if (echo_.reasoning_effort.empty()) w.null();
    else w.value(echo_.reasoning_effort);
    w.key("summary");
    if (echo_.reasoning_summary.empty()) w.null();
    else w.value(echo_.reasoning_summary);
    w.end_object();
    w.member("store", echo_.store).member("temperature", echo_.temperature);
    w.key("text").begin_object().key("format").raw(echo_.format_json).member("verbosity", echo_.verbosity).end_object();
    w.key("tool_choice").raw(echo_.tool_choice_json);
    w.key("tools").begin_array();
    for (const auto& t : echo_.tools) {
        w.begin_object().member("type", "function").member("name", t.name);
        w.key("description");
        if (t.description.empty()) w.null();
        else w.value(t.description);
        w.key("parameters").raw(t.parameters_json).member("strict", t.strict).end_object();
    }
    w.end_array();
    w.member("top_p", echo_.top_p).member("truncation", "disabled");
    w.key("usage");
    if (usage_known_) {
        w.begin_object().member("input_tokens", usage_.prompt_tokens);
        w.key("input_tokens_details").begin_object().member("cached_tokens", usage_.cached_tokens).end_object();
        w.member("output_tokens", usage_.completion_tokens);
        w.key("output_tokens_details").begin_object().member("reasoning_tokens", reasoning_tokens_).end_object();
        w.member("total_tokens", usage_.prompt_tokens + usage_.completion_tokens).end_object();
    } else {
        w.null();
    }
    w.key("user").null();
    w.key("metadata").raw(echo_.metadata_json);
    w.end_object();
}

std::string response_builder::response_json() const {
    std::string out;
    json_writer w(out);
    write_response(w);
    return out;
}

std::vector<conversation_item> response_builder::output_items() const {
    std::vector<conversation_item> out;
    for (const auto& it : items_) {
        conversation_item c;
        if (it.kind == item::reasoning) continue;
        if (it.kind == item::message) {
            c.role = "assistant";
            c.text = it.text;
        } else {
            c.kind = conversation_item::function_call;
            c.call_id = it.call_id;
            c.name = it.name;
            c.arguments = it.arguments;
        }
        out.push_back(std::move(c));
    }
    return out;
}

// ---- events ----------------------------------------------------------------------------------

void response_builder::begin(std::vector<sse_event>* out) {
    MS_ASSERT_MSG(sequence_ == 0, "response_builder::begin after other events");
    if (!out) return;
    for (std::string_view type : {"response.created", "response.in_progress"})
        out->push_back(event(type, [&](json_writer& w) {
            w.key("response");
            write_response(w);
        }));
}

std::optional<sse_event> response_builder::keep_alive() {
    if (!items_.empty() || finished() || sequence_ == 0) return std::nullopt;
    return event("response.in_progress", [&](json_writer& w) {
        w.key("response");
        write_response(w);
    });
}

void response_builder::open_item(item it, std::vector<sse_event>* out) {
    items_.push_back(std::move(it));
    open_ = int(items_.size()) - 1;
    if (!out) return;
    const item& cur = items_.back();
    const int64_t index = open_;
    out->push_back(event("response.output_item.added", [&](json_writer& w) {
        w.member("output_index", index).key("item").begin_object().member("id", cur.id);
        switch (cur.kind) {
            case item::reasoning:
                w.member("type", "reasoning").key("summary").begin_array().end_array();
                w.key("content").begin_array().end_array();
                break;
            case item::message:
                w.member("type", "message").member("role", "assistant").key("content").begin_array().end_array();
                break;
            case item::function_call:
                w.member("type", "function_call").member("call_id", cur.call_id).member("name", cur.name);
                w.member("arguments", "");
                break;
        }
        w.member("status", "in_progress").end_object();
    }));
    if (cur.kind == item::function_call) return;
    const bool reasoning = cur.kind == item::reasoning;
    out->push_back(event("response.content_part.added", [&](json_writer& w) {
        w.member("item_id", cur.id).member("output_index", index).member("content_index", 0);
        w.key("part").begin_object().member("type", reasoning ? "reasoning_text" : "output_text").member("text", "");
        if (!reasoning) w.key("annotations").begin_array().end_array().key("logprobs").begin_array().end_array();
        w.end_object();
    }));
}

void response_builder::close_open_item(std::string status, std::vector<sse_event>* out) {
    if (open_ < 0) return;
    item& it = items_[size_t(open_)];
    const int64_t index = open_;
    open_ = -1;
    it.status = std::move(status);
    if (!out) return;
    if (it.kind == item::function_call) {
        out->push_back(event("response.function_call_arguments.done", [&](json_writer& w) {
            w.member("item_id", it.id).member("output_index", index).member("name", it.name);
            w.member("arguments", it.arguments);
        }));
    } else {
        const bool reasoning = it.kind == item::reasoning;
        out->push_back(event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                             [&](json_writer& w) {
                                 w.member("item_id", it.id).member("output_index", index).member("content_index", 0);
                                 w.member("text", it.text);
                                 if (!reasoning) w.key("logprobs").begin_array().end_array();
                             }));
        out->push_back(event("response.content_part.done", [&](json_writer& w) {
            w.member("item_id", it.id).member("output_index", index).member("content_index", 0);
            w.key("part").begin_object().member("type", reasoning ? "reasoning_text" : "output_text");
            w.member("text", it.text);
            if (!reasoning) w.key("annotations").begin_array().end_array().key("logprobs").begin_array().end_array();
            w.end_object();
        }));
    }
    out->push_back(event("response.output_item.done", [&](json_writer& w) {
        w.member("output_index", index).key("item");
        write_item(w, it);
    }));
}

void response_builder::append_text(item::kind_t kind, const std::string& text, std::vector<sse_event>* out) {
    if (open_ < 0 || items_[size_t(open_)].kind != kind) {
        close_open_item("completed", out);
        item it;
        it.kind = kind;
        it.id = new_response_id(kind == item::reasoning ? "rs_" : "msg_");
        open_item(std::move(it), out);
    }
    item& it = items_[size_t(open_)];
    it.text += text;
    if (!out) return;
    const bool reasoning = kind == item::reasoning;
    const int64_t index = open_;
    out->push_back(event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", [&](json_writer& w) {
        w.member("item_id", it.id).member("output_index", index).member("content_index", 0).member("delta", text);
        if (!reasoning) w.key("logprobs").begin_array().end_array();
    }));
}

void response_builder::on_call(const tool_call_delta& d, std::vector<sse_event>* out) {
    if (!d.id.empty()) {  // a call's first delta: a new item
        close_open_item("completed", out);
        item it;
        it.kind = item::function_call;
        it.id = new_response_id("fc_");
        it.call_id = new_response_id("call_");
        it.name = d.name;
        open_item(std::move(it), out);
        calls_[d.index] = size_t(open_);
    }
    if (d.arguments.empty()) return;
    const auto at = calls_.find(d.index);
    MS_ASSERT_MSG(at != calls_.end(), "tool-call arguments before the call's first delta");
    item& it = items_[at->second];
    it.arguments += d.arguments;
    if (!out) return;
    const int64_t index = int64_t(at->second);
    out->push_back(event("response.function_call_arguments.delta", [&](json_writer& w) {
        w.member("item_id", it.id).member("output_index", index).member("delta", d.arguments);
    }));
}

// Tokens count as reasoning up to the end of the reasoning: those of an update that adds
// reasoning text, and the ones held back before it (a "<think>" marker); held-back tokens
// followed by answer text (the "</think>" marker) do not.
void response_builder::count_tokens(const job_update& u) {
    const int64_t n = int64_t(u.tokens.size());
    if (!u.delta.content.empty() || !u.delta.tool_calls.empty()) {
        undecided_tokens_ = 0;
    } else if (!u.delta.reasoning.empty()) {
        reasoning_tokens_ += undecided_tokens_ + n;
        undecided_tokens_ = 0;
    } else {
        undecided_tokens_ += n;
    }
}

void response_builder::end(std::string_view event_type, std::vector<sse_event>* out) {
    if (!out) return;
    out->push_back(event(event_type, [&](json_writer& w) {
        w.key("response");
        write_response(w);
    }));
}

void response_builder::on_update(const job_update& u, std::vector<sse_event>* out) {
    MS_ASSERT_MSG(!finished(), "response_builder: an update after the end");
    count_tokens(u);
    if (!u.delta.reasoning.empty()) append_text(item::reasoning, u.delta.reasoning, out);
    if (!u.delta.content.empty()) append_text(item::message, u.delta.content, out);
    for (const auto& d : u.delta.tool_calls) on_call(d, out);
    if (!u.done) return;
    usage_ = u.usage;
    usage_known_ = true;
    reasoning_tokens_ = std::min(reasoning_tokens_, usage_.completion_tokens);
    if (u.finish_reason == "error" || u.finish_reason == "cancelled") {
        api_error e = u.error;
        if (u.finish_reason == "cancelled") e = make_api_error(503, "unavailable_error", "the request was cancelled");
        fail(e, out);
        return;
    }
    const bool incomplete = u.finish_reason == "length";
    close_open_item(incomplete ? "incomplete" : "completed", out);
    status_ = incomplete ? "incomplete" : "completed";
    end(incomplete ? "response.incomplete" : "response.completed", out);
}

void response_builder::fail(const api_error& e, std::vector<sse_event>* out) {
    MS_ASSERT_MSG(!finished(), "response_builder: failed after the end");
    close_open_item("incomplete", out);
    error_ = e;
    // Codex retries a rate-limited response after the delay it reads from the message.
    if (e.status == 429 && e.message.find("try again in") == std::string::npos)
        error_->message += "; try again in 1s";
    status_ = "failed";
    end("response.failed", out);
}

}  // namespace moestream::server
