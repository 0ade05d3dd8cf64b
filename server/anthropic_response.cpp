#include "server/anthropic_response.h"

#include <algorithm>
#include <random>

#include "server/json_writer.h"
#include "server/output_parser.h"

namespace moestream::server {

// ---- errors ----------------------------------------------------------------------------------

namespace {

int64_t extra_of(const api_error& e, std::string_view name, int64_t fallback) {
    for (const auto& [k, v] : e.extra)
        if (k == name) return v;
    return fallback;
}

const char* type_of_status(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 402:
            return "billing_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 413:
            return "request_too_large";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        case 504:
            return "timeout_error";
        default:
            return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

}  // namespace

api_error anthropic_error(const api_error& e) {
    api_error out = make_api_error(e.status, type_of_status(e.status), e.message, e.param);
    if (e.type == "exceed_context_size_error") {
        // The wording Claude Code and other clients parse to know how much to cut; the maximum is
        // the longest prompt that still leaves room for one token of reply.
        const int64_t n_prompt = extra_of(e, "n_prompt_tokens", 0), n_ctx = extra_of(e, "n_ctx", 0);
        out.message = "prompt is too long: " + std::to_string(n_prompt) + " tokens > " +
                      std::to_string(std::max<int64_t>(n_ctx - 1, 0)) + " maximum";
    }
    return out;
}

std::string anthropic_error_json(const api_error& e) {
    const api_error a = anthropic_error(e);
    std::string out;
    json_writer w(out);
    w.begin_object().member("type", "error").key("error").begin_object();
    w.member("type", a.type).member("message", a.message);
    w.end_object().end_object();
    return out;
}

http_response anthropic_error_response(const api_error& e) {
    http_response r;
    r.status = anthropic_error(e).status;
    r.body = anthropic_error_json(e);
    if (r.status == 429 || r.status == 503 || r.status == 529) r.headers.push_back({"retry-after", "1"});
    return r;
}

bool is_anthropic_path(std::string_view path) {
    return path == "/v1/messages" || path.starts_with("/v1/messages/");
}

std::string anthropic_tool_id(std::string_view call_id) {
    // The job's call ids restart with the process; a salt drawn once per process keeps ids
    // distinct across restarts, since clients keep them in their transcripts.
    static const uint64_t salt = [] {
        std::random_device rd;
        return (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }();
    uint64_t h = 14695981039346656037ull;  // FNV-1a of the call id
    for (unsigned char c : call_id) h = (h ^ c) * 1099511628211ull;
    return "toolu_" + tool_call_id(h ^ salt, 0).substr(5);
}

// ---- content ---------------------------------------------------------------------------------

bool anthropic_content::has_tool_use() const {
    return std::any_of(blocks_.begin(), blocks_.end(),
                       [](const content_block& b) { return b.kind == block_kind::tool_use; });
}

void anthropic_content::open_block(content_block b, std::vector<block_event>& events) {
    close_block(events);
    blocks_.push_back(std::move(b));
    block_open_ = true;
    events.push_back({block_event::start, blocks_.size() - 1, {}});
}

void anthropic_content::close_block(std::vector<block_event>& events) {
    if (!block_open_) return;
    block_open_ = false;
    events.push_back({block_event::stop, blocks_.size() - 1, {}});
}

void anthropic_content::append(block_kind kind, std::string_view text, std::vector<block_event>& events) {
    if (text.empty()) return;
    if (!block_open_ || blocks_.back().kind != kind) {
        content_block b;
        b.kind = kind;
        open_block(std::move(b), events);
    }
    if (kind == block_kind::thinking && !display_thinking_) return;
    blocks_.back().text += text;
    events.push_back({block_event::delta, blocks_.size() - 1, std::string(text)});
}

void anthropic_content::call_fragments(const tool_call_delta& d, std::vector<block_event>& events) {
    if (!d.id.empty()) {  // a new call's header
        held_call c;
        c.index = d.index;
        c.id = anthropic_tool_id(d.id);
        c.name = d.name;
        if (stream_tool_input_) {
            content_block b;
            b.kind = block_kind::tool_use;
            b.id = c.id;
            b.name = c.name;
            open_block(std::move(b), events);
            c.block = blocks_.size() - 1;
        }
        calls_.push_back(std::move(c));
        if (d.arguments.empty()) return;
    }
    auto it =
        std::find_if(calls_.begin(), calls_.end(), [&](const held_call& c) { return c.index == d.index; });
    MS_ASSERT_MSG(it != calls_.end(), "anthropic_content: arguments of a call that was never opened");
    if (d.arguments.empty()) return;
    if (!it->block) {
        it->arguments += d.arguments;
        return;
    }
    // A call's arguments end before anything else is written: its block is still the open one.
    MS_ASSERT(block_open_ && *it->block == blocks_.size() - 1);
    blocks_.back().input += d.arguments;
    events.push_back({block_event::delta, blocks_.size() - 1, d.arguments});
}

void anthropic_content::release_complete_calls(bool at_end, std::vector<block_event>& events) {
    const auto& parsed = parser_.tool_calls();
    while (!calls_.empty()) {
        held_call& c = calls_.front();
        const bool complete = c.index < int(parsed.size()) && parsed[size_t(c.index)].complete;
        if (!complete && !at_end) return;  // calls end in order: the later ones are not complete either
        const bool valid = complete && parsed[size_t(c.index)].arguments_valid;
        if (c.block) {
            blocks_[*c.block].input_valid = valid;
            if (block_open_ && *c.block == blocks_.size() - 1) close_block(events);
        } else if (valid) {
            content_block b;
            b.kind = block_kind::tool_use;
            b.id = c.id;
            b.name = c.name;
            b.input = c.arguments;
            b.input_valid = true;
            open_block(std::move(b), events);
            events.push_back({block_event::delta, blocks_.size() - 1, c.arguments});
            close_block(events);
        } else {
            append(block_kind::text,
                   "[tool call to " + c.name +
                       (complete ? " with arguments that are not a JSON object: "
                                 : " cut off before its end: ") +
                       c.arguments + "]",
                   events);
        }
        calls_.erase(calls_.begin());
    }
}

void anthropic_content::on_update(const job_update& u, std::vector<block_event>& events) {
    append(block_kind::thinking, u.delta.reasoning, events);
    // Fragments of calls already under way come before anything that follows them.
    std::vector<bool> done(u.delta.tool_calls.size(), false);
    for (size_t i = 0; i < u.delta.tool_calls.size(); ++i) {
        const auto& d = u.delta.tool_calls[i];
        const bool known =
            std::any_of(calls_.begin(), calls_.end(), [&](const held_call& c) { return c.index == d.index; });
        if (d.id.empty() && known) {
            call_fragments(d, events);
            done[i] = true;
        }
    }
    release_complete_calls(false, events);
    append(block_kind::text, u.delta.content, events);
    for (size_t i = 0; i < u.delta.tool_calls.size(); ++i)
        if (!done[i]) call_fragments(u.delta.tool_calls[i], events);
    release_complete_calls(false, events);
}

void anthropic_content::finish(std::vector<block_event>& events) {
    release_complete_calls(true, events);
    close_block(events);
}

// ---- message ---------------------------------------------------------------------------------

anthropic_usage anthropic_usage_of(const job_usage& u, bool cached_prompt) {
    anthropic_usage a;
    a.cache_read_input_tokens = u.cached_tokens;
    const int64_t processed = std::max<int64_t>(u.prompt_tokens - u.cached_tokens, 0);
    a.cache_creation_input_tokens = cached_prompt ? processed : 0;
    a.input_tokens = processed - a.cache_creation_input_tokens;
    a.output_tokens = u.completion_tokens;
    return a;
}

anthropic_stop anthropic_stop_of(const job_update& last, const anthropic_content& content,
                                 int64_t max_tokens) {
    anthropic_stop s;
    if (content.has_tool_use() && last.finish_reason == "tool_calls") {
        s.reason = "tool_use";
    } else if (last.stop_type == "word") {
        s.reason = "stop_sequence";
        s.sequence = last.stopping_word;
    } else if (last.finish_reason == "length") {
        // Generation stops at max_tokens or where the context ends, whichever comes first.
        s.reason = max_tokens > 0 && last.usage.completion_tokens >= max_tokens
                       ? "max_tokens"
                       : "model_context_window_exceeded";
    } else {
        s.reason = "end_turn";
    }
    return s;
}

namespace {

void write_usage(json_writer& w, const anthropic_usage& u) {
    w.key("usage").begin_object();
    w.member("input_tokens", u.input_tokens);
    w.member("cache_creation_input_tokens", u.cache_creation_input_tokens);
    w.member("cache_read_input_tokens", u.cache_read_input_tokens);
    w.member("output_tokens", u.output_tokens);
    w.end_object();
}

void write_stop(json_writer& w, const anthropic_stop& s) {
    w.member("stop_reason", s.reason);
    w.key("stop_sequence");
    if (s.reason == "stop_sequence")
        w.value(s.sequence);
    else
        w.null();
}

// A block as content_block_start announces it (empty) or as the whole message holds it.
void write_block(json_writer& w, const content_block& b, bool whole) {
    w.begin_object();
    switch (b.kind) {
        case block_kind::thinking:
            w.member("type", "thinking")
                .member("thinking", whole ? b.text : std::string())
                .member("signature", "");
            break;
        case block_kind::text:
            w.member("type", "text").member("text", whole ? b.text : std::string());
            break;
        case block_kind::tool_use:
            w.member("type", "tool_use").member("id", b.id).member("name", b.name).key("input");
            // The arguments were checked to be one JSON object (or are a forced call's, which
            // constrained decoding makes one).
            if (whole && b.input_valid)
                w.raw(b.input);
            else
                w.begin_object().end_object();
            break;
    }
    w.end_object();
}

std::string sse(std::string_view name, const std::string& json) {
    std::string out = "event: ";
    out.append(name).append("\ndata: ").append(json).append("\n\n");
    return out;
}

}  // namespace

std::string anthropic_message_json(const anthropic_meta& meta, const anthropic_content& content,
                                   const anthropic_stop& stop, const anthropic_usage& usage) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    w.member("id", meta.id).member("type", "message").member("role", "assistant").member("model", meta.model);
    w.key("content").begin_array();
    for (const auto& b : content.blocks()) write_block(w, b, true);
    w.end_array();
    write_stop(w, stop);
    write_usage(w, usage);
    w.end_object();
    return out;
}

std::string sse_message_start(const anthropic_meta& meta, const anthropic_usage& usage) {
    std::string out;
    json_writer w(out);
    w.begin_object().member("type", "message_start").key("message").begin_object();
    w.member("id", meta.id).member("type", "message").member("role", "assistant").member("model", meta.model);
    w.key("content").begin_array().end_array();
    w.key("stop_reason").null().key("stop_sequence").null();
    write_usage(w, usage);
    w.end_object().end_object();
    return sse("message_start", out);
}

std::string sse_ping() {
    return sse("ping", R"({"type":"ping"})");
}

std::string sse_blocks(const anthropic_content& content, const std::vector<block_event>& events) {
    std::string all;
    for (const auto& e : events) {
        const content_block& b = content.blocks()[e.index];
        std::string out;
        json_writer w(out);
        w.begin_object();
        switch (e.type) {
            case block_event::start:
                w.member("type", "content_block_start")
                    .member("index", int64_t(e.index))
                    .key("content_block");
                write_block(w, b, false);
                w.end_object();
                all += sse("content_block_start", out);
                break;
            case block_event::delta: {
                w.member("type", "content_block_delta")
                    .member("index", int64_t(e.index))
                    .key("delta")
                    .begin_object();
                if (b.kind == block_kind::text)
                    w.member("type", "text_delta").member("text", e.fragment);
                else if (b.kind == block_kind::thinking)
                    w.member("type", "thinking_delta").member("thinking", e.fragment);
                else
                    w.member("type", "input_json_delta").member("partial_json", e.fragment);
                w.end_object().end_object();
                all += sse("content_block_delta", out);
                break;
            }
            case block_event::stop:
                w.member("type", "content_block_stop").member("index", int64_t(e.index)).end_object();
                all += sse("content_block_stop", out);
                break;
        }
    }
    return all;
}

std::string sse_message_end(const anthropic_stop& stop, const anthropic_usage& usage) {
    std::string out;
    json_writer w(out);
    w.begin_object().member("type", "message_delta").key("delta").begin_object();
    write_stop(w, stop);
    w.end_object();
    write_usage(w, usage);
    w.end_object();
    return sse("message_delta", out) + sse("message_stop", R"({"type":"message_stop"})");
}

std::string sse_error(const api_error& e) {
    return sse("error", anthropic_error_json(e));
}

}  // namespace moestream::server
