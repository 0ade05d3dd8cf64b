#include "server/output_parser.h"

#include <simdjson.h>

#include <algorithm>
#include <initializer_list>

#include "config/assert.h"

namespace moestream::server {

namespace {

constexpr std::string_view k_think_open = "<think>";
constexpr std::string_view k_think_close = "</think>";
constexpr std::string_view k_calls_begin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view k_calls_end = "<｜tool▁calls▁end｜>";
constexpr std::string_view k_call_begin = "<｜tool▁call▁begin｜>";
constexpr std::string_view k_call_end = "<｜tool▁call▁end｜>";
constexpr std::string_view k_sep = "<｜tool▁sep｜>";
constexpr std::string_view k_fence = "```";
constexpr std::string_view k_fence_close = "\n```";
constexpr std::string_view k_fenced_call_end = "\n```<｜tool▁call▁end｜>";

// Bounds on what is buffered while undecided; beyond them the markup is not a call.
constexpr size_t k_max_name = 128;
constexpr size_t k_max_fence_line = 32;  // "```json" and the like, up to its newline
constexpr size_t k_max_section_raw = 256;

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

bool all_name_chars(std::string_view s) { return std::all_of(s.begin(), s.end(), is_name_char); }

bool is_proper_prefix(std::string_view text, std::string_view marker) {
    return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

// Length of the longest suffix of text that is a proper prefix of one of the markers: the text
// that may still become a marker.
size_t partial_marker_suffix(std::string_view text, std::initializer_list<std::string_view> markers) {
    size_t best = 0;
    for (std::string_view m : markers) {
        for (size_t n = std::min(text.size(), m.size() - 1); n > best; --n) {
            if (text.substr(text.size() - n) == m.substr(0, n)) {
                best = n;
                break;
            }
        }
    }
    return best;
}

struct marker_hit {
    size_t pos = std::string_view::npos;
    std::string_view marker;
};

marker_hit find_first(std::string_view text, std::initializer_list<std::string_view> markers) {
    marker_hit hit;
    for (std::string_view m : markers) {
        const size_t p = text.find(m);
        if (p < hit.pos) hit = {p, m};
    }
    return hit;
}

bool is_json_object(std::string_view text) {
    const simdjson::padded_string padded(text);
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.parse(padded).get(root) != simdjson::SUCCESS) return false;
    return root.is_object();
}

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

std::string tool_call_id(uint64_t seed, int index) {
    static constexpr std::string_view alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = seed;
    const uint64_t mixed_seed = splitmix64(x);
    x = mixed_seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull);
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += alphabet[splitmix64(x) % alphabet.size()];
    return id;
}

output_parser::output_parser(parser_options opts) : opts_(opts) {
    if (!opts_.reasoning_enabled) {
        state_ = state::content;
    } else if (opts_.starts_in_reasoning) {
        state_ = state::reasoning;
        skip_ws_ = true;
    } else {
        state_ = state::start;
    }
}

output_delta output_parser::push(std::string_view text) {
    MS_ASSERT_MSG(!finished_, "output_parser::push after finish");
    output_delta d;
    pending_.append(text);
    while (step(d)) {
    }
    return d;
}

bool output_parser::step(output_delta& d) {
    switch (state_) {
        case state::start: return step_start();
        case state::reasoning: return step_reasoning(d);
        case state::content: return step_content(d);
        case state::section: return step_section(d);
        case state::call_header: return step_call_header(d);
        case state::after_function_sep: return step_after_function_sep(d);
        case state::call_name: return step_call_name(d);
        case state::fence: return step_fence();
        case state::arguments: return step_arguments(d);
    }
    MS_ASSERT_MSG(false, "output_parser: unknown state");
    return false;
}

bool output_parser::step_start() {
    if (pending_.starts_with(k_think_open)) {
        pending_.erase(0, k_think_open.size());
        state_ = state::reasoning;
        skip_ws_ = true;
        return true;
    }
    if (is_proper_prefix(pending_, k_think_open)) return false;
    state_ = state::content;
    return true;
}

bool output_parser::step_reasoning(output_delta& d) {
    const size_t p = pending_.find(k_think_close);
    if (p != std::string::npos) {
        emit_reasoning(d, std::string_view(pending_).substr(0, p));
        pending_.erase(0, p + k_think_close.size());
        state_ = state::content;
        skip_ws_ = true;
        return true;
    }
    const size_t safe = pending_.size() - partial_marker_suffix(pending_, {k_think_close});
    emit_reasoning(d, std::string_view(pending_).substr(0, safe));
    pending_.erase(0, safe);
    return false;
}

bool output_parser::step_content(output_delta& d) {
    if (!opts_.tools_enabled) {
        emit_content(d, pending_);
        pending_.clear();
        return false;
    }
    const marker_hit hit = find_first(pending_, {k_calls_begin, k_call_begin});
    if (hit.pos != std::string_view::npos) {
        emit_content(d, std::string_view(pending_).substr(0, hit.pos));
        raw_.assign(hit.marker);
        pending_.erase(0, hit.pos + hit.marker.size());
        skip_ws_ = false;
        state_ = hit.marker == k_calls_begin ? state::section : state::call_header;
        return true;
    }
    const size_t safe = pending_.size() - partial_marker_suffix(pending_, {k_calls_begin, k_call_begin});
    emit_content(d, std::string_view(pending_).substr(0, safe));
    pending_.erase(0, safe);
    return false;
}

bool output_parser::step_section(output_delta& d) {
    size_t ws = 0;
    while (ws < pending_.size() && is_ws(pending_[ws])) ++ws;
    raw_.append(pending_, 0, ws);
    pending_.erase(0, ws);
    if (raw_.size() > k_max_section_raw) return fall_back(d);
    if (pending_.starts_with(k_call_begin)) {
        raw_.append(k_call_begin);
        pending_.erase(0, k_call_begin.size());
        state_ = state::call_header;
        return true;
    }
    if (pending_.starts_with(k_calls_end)) {
        pending_.erase(0, k_calls_end.size());
        raw_.clear();
        state_ = state::content;
        return true;
    }
    if (is_proper_prefix(pending_, k_call_begin) || is_proper_prefix(pending_, k_calls_end)) return false;
    return fall_back(d);
}

bool output_parser::step_call_header(output_delta& d) {
    const size_t p = pending_.find(k_sep);
    const size_t judged = p != std::string::npos ? p : pending_.size() - partial_marker_suffix(pending_, {k_sep});
    const std::string_view header = std::string_view(pending_).substr(0, judged);
    if (header.size() > k_max_name || !all_name_chars(header)) return fall_back(d);
    if (p == std::string::npos) return false;
    if (header.empty()) return fall_back(d);
    const std::string name(header);
    raw_.append(name);
    raw_.append(k_sep);
    pending_.erase(0, p + k_sep.size());
    if (name == "function") {
        state_ = state::after_function_sep;
    } else {
        open_call(d, name);
        state_ = state::fence;
    }
    return true;
}

bool output_parser::step_after_function_sep(output_delta& d) {
    if (pending_.empty()) return false;
    if (is_name_char(pending_[0])) {
        state_ = state::call_name;
    } else {
        open_call(d, "function");
        state_ = state::fence;
    }
    return true;
}

bool output_parser::step_call_name(output_delta& d) {
    size_t n = 0;
    while (n < pending_.size() && is_name_char(pending_[n])) ++n;
    if (n > k_max_name) return fall_back(d);
    if (n == pending_.size()) return false;
    const std::string_view rest = std::string_view(pending_).substr(n);
    if (rest[0] == '\n') {
        open_call(d, std::string_view(pending_).substr(0, n));
        pending_.erase(0, n + 1);
        state_ = state::fence;
        return true;
    }
    if (rest.starts_with(k_call_end)) {  // a call without arguments
        open_call(d, std::string_view(pending_).substr(0, n));
        pending_.erase(0, n);
        fenced_ = false;
        state_ = state::arguments;
        return true;
    }
    if (is_proper_prefix(rest, k_call_end)) return false;
    return fall_back(d);
}

bool output_parser::step_fence() {
    fenced_ = false;
    if (pending_.starts_with(k_fence)) {
        const size_t nl = pending_.find('\n');
        if (nl != std::string::npos && nl <= k_max_fence_line) {
            pending_.erase(0, nl + 1);
            fenced_ = true;
            state_ = state::arguments;
            return true;
        }
        if (nl == std::string::npos && pending_.size() <= k_max_fence_line) return false;
    } else if (is_proper_prefix(pending_, k_fence)) {
        return false;
    }
    state_ = state::arguments;  // no fence line: the text is the arguments
    return true;
}

bool output_parser::step_arguments(output_delta& d) {
    const size_t p = pending_.find(k_call_end);
    if (p != std::string::npos) {
        std::string_view args = std::string_view(pending_).substr(0, p);
        if (fenced_ && args.ends_with(k_fence_close)) args.remove_suffix(k_fence_close.size());
        emit_arguments(d, args);
        pending_.erase(0, p + k_call_end.size());
        close_call(true);
        state_ = state::section;
        return true;
    }
    const size_t keep = fenced_ ? partial_marker_suffix(pending_, {k_fenced_call_end, k_call_end})
                                : partial_marker_suffix(pending_, {k_call_end});
    const size_t safe = pending_.size() - keep;
    emit_arguments(d, std::string_view(pending_).substr(0, safe));
    pending_.erase(0, safe);
    return false;
}

bool output_parser::fall_back(output_delta& d) {
    emit_content(d, raw_);
    raw_.clear();
    state_ = state::content;
    return true;
}

void output_parser::emit_content(output_delta& d, std::string_view text) {
    if (skip_ws_) {
        while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
        if (text.empty()) return;
        skip_ws_ = false;
    }
    d.content.append(text);
    content_.append(text);
}

void output_parser::emit_reasoning(output_delta& d, std::string_view text) {
    if (skip_ws_) {
        while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
        if (text.empty()) return;
        skip_ws_ = false;
    }
    d.reasoning.append(text);
    reasoning_.append(text);
}

void output_parser::open_call(output_delta& d, std::string_view name) {
    const int index = static_cast<int>(calls_.size());
    parsed_tool_call call;
    call.id = tool_call_id(opts_.id_seed, index);
    call.name = std::string(name);
    d.tool_calls.push_back(tool_call_delta{index, call.id, call.name, {}});
    calls_.push_back(std::move(call));
    raw_.clear();  // from here on the text belongs to this call, never back to content
}

void output_parser::emit_arguments(output_delta& d, std::string_view text) {
    MS_ASSERT(!calls_.empty());
    if (text.empty()) return;
    const int index = static_cast<int>(calls_.size()) - 1;
    calls_.back().arguments.append(text);
    // Fragments of one push merge; the header entry stays alone (see tool_call_delta).
    if (!d.tool_calls.empty() && d.tool_calls.back().index == index && d.tool_calls.back().id.empty())
        d.tool_calls.back().arguments.append(text);
    else
        d.tool_calls.push_back(tool_call_delta{index, {}, {}, std::string(text)});
}

void output_parser::close_call(bool complete) {
    MS_ASSERT(!calls_.empty());
    parsed_tool_call& call = calls_.back();
    call.complete = complete;
    call.arguments_valid = is_json_object(call.arguments);
}

output_delta output_parser::finish() {
    MS_ASSERT_MSG(!finished_, "output_parser::finish called twice");
    output_delta d;
    while (step(d)) {
    }
    finished_ = true;
    switch (state_) {
        case state::start:
        case state::content: emit_content(d, pending_); break;
        case state::reasoning: emit_reasoning(d, pending_); break;
        case state::section:
            // Only whitespace after a finished call is formatting; anything else was cut markup.
            if (!pending_.empty() || raw_.find_first_not_of(" \n\r\t") != std::string::npos) {
                emit_content(d, raw_);
                emit_content(d, pending_);
            }
            break;
        case state::call_header:
        case state::after_function_sep:
        case state::call_name:
            emit_content(d, raw_);
            emit_content(d, pending_);
            break;
        case state::fence:
            // The optional fence line never completed: whatever came is the arguments.
            emit_arguments(d, pending_);
            close_call(false);
            break;
        case state::arguments:
            // pending_ holds only a possible start of the closing markup, which is dropped.
            close_call(false);
            break;
    }
    pending_.clear();
    raw_.clear();
    return d;
}

}  // namespace moestream::server
