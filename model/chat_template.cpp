// Native rendering of the DeepSeek-V3 chat_template (tokenizer_config.json). The Jinja source is
// followed statement by statement, including its quirks:
//  - every system message, wherever it appears, is hoisted to the start, joined by "\n\n";
//  - ns.is_first is set by the first tool call of the conversation and never reset, so later
//    tool calls (even in later assistant turns) use the "\n<｜tool▁call▁begin｜>" form and each
//    closes with "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
//  - ns.is_output_first is likewise never reset;
//  - a user turn after tool outputs does not emit <｜tool▁outputs▁end｜>; an assistant turn does;
//  - the generation prompt is omitted when the conversation ends with tool outputs.
// Where Jinja would raise (string + None), render_chat returns an error instead.
#include "model/chat_template.h"

#include <simdjson.h>

namespace moestream {

namespace {

const std::string k_user = "<｜User｜>";
const std::string k_assistant = "<｜Assistant｜>";
const std::string k_calls_begin = "<｜tool▁calls▁begin｜>";
const std::string k_calls_end = "<｜tool▁calls▁end｜>";
const std::string k_call_begin = "<｜tool▁call▁begin｜>";
const std::string k_call_end = "<｜tool▁call▁end｜>";
const std::string k_sep = "<｜tool▁sep｜>";
const std::string k_outputs_begin = "<｜tool▁outputs▁begin｜>";
const std::string k_outputs_end = "<｜tool▁outputs▁end｜>";
const std::string k_output_begin = "<｜tool▁output▁begin｜>";
const std::string k_output_end = "<｜tool▁output▁end｜>";

std::string where(size_t i) { return "messages[" + std::to_string(i) + "]"; }

result<std::string> required_content(const chat_message& m, size_t i) {
    if (!m.content) return make_error(where(i) + ".content: a " + m.role + " message needs string content, not null");
    return *m.content;
}

// The body of one tool call as the template writes it after "<｜tool▁call▁begin｜>".
std::string tool_call_body(const chat_tool_call& t) {
    return t.type + k_sep + t.name + "\n```json\n" + t.arguments + "\n```" + k_call_end;
}

}  // namespace

result<std::string> render_chat(const std::vector<chat_message>& messages, bool add_generation_prompt,
                                const chat_special_tokens& tokens) {
    // Jinja ignores roles it does not know; silently dropping e.g. a "developer" prompt would
    // surprise a client, so it is an error here.
    for (size_t i = 0; i < messages.size(); ++i) {
        const auto& r = messages[i].role;
        if (r != "system" && r != "user" && r != "assistant" && r != "tool")
            return make_error(where(i) + ".role: unknown role '" + r + "' (expected system, user, assistant or tool)");
    }
    std::string system_prompt;
    bool first_sp = true;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role != "system") continue;
        auto content = required_content(messages[i], i);
        MS_TRY(content);
        if (!first_sp) system_prompt += "\n\n";
        system_prompt += *content;
        first_sp = false;
    }

    std::string out = tokens.bos + system_prompt;
    bool is_first = false, is_tool = false, is_output_first = true;
    for (size_t i = 0; i < messages.size(); ++i) {
        const chat_message& m = messages[i];
        if (m.role == "user") {
            auto content = required_content(m, i);
            MS_TRY(content);
            is_tool = false;
            out += k_user + *content;
        } else if (m.role == "assistant" && !m.content) {
            is_tool = false;
            for (const auto& t : m.tool_calls) {
                if (!is_first) {
                    out += k_assistant + k_calls_begin + k_call_begin + tool_call_body(t);
                    is_first = true;
                } else {
                    out += "\n" + k_call_begin + tool_call_body(t) + k_calls_end + tokens.eos;
                }
            }
        } else if (m.role == "assistant") {
            if (is_tool) {
                out += k_outputs_end + *m.content + tokens.eos;
                is_tool = false;
            } else {
                out += k_assistant + *m.content + tokens.eos;
            }
        } else if (m.role == "tool") {
            auto content = required_content(m, i);
            MS_TRY(content);
            is_tool = true;
            if (is_output_first) {
                out += k_outputs_begin + k_output_begin + *content + k_output_end;
                is_output_first = false;
            } else {
                out += "\n" + k_output_begin + *content + k_output_end;
            }
        }
    }
    if (is_tool) out += k_outputs_end;
    if (add_generation_prompt && !is_tool) out += k_assistant;
    return out;
}

// ---- parsing --------------------------------------------------------------------------------

namespace {

using simdjson::dom::element;

// content: null, a string, or an array of {"type": "text", "text": ...} parts (concatenated).
result<std::optional<std::string>> parse_content(element v, const std::string& at) {
    if (v.is_null()) return std::optional<std::string>{};
    std::string_view s;
    if (v.get_string().get(s) == simdjson::SUCCESS) return std::optional<std::string>(std::string(s));
    simdjson::dom::array parts;
    if (v.get_array().get(parts))
        return make_error(at + ": must be a string, null or an array of text parts");
    std::string text;
    size_t j = 0;
    for (element part : parts) {
        const std::string pat = at + "[" + std::to_string(j++) + "]";
        std::string_view type, t;
        if (part["type"].get_string().get(type)) return make_error(pat + ".type: missing or not a string");
        if (type != "text") return make_error(pat + ".type: unsupported content part '" + std::string(type) + "' (only text)");
        if (part["text"].get_string().get(t)) return make_error(pat + ".text: missing or not a string");
        text += t;
    }
    return std::optional<std::string>(std::move(text));
}

result<chat_tool_call> parse_tool_call(element v, const std::string& at) {
    chat_tool_call call;
    std::string_view s;
    if (!v.is_object()) return make_error(at + ": must be an object");
    if (element t; v["type"].get(t) == simdjson::SUCCESS) {
        if (t.get_string().get(s)) return make_error(at + ".type: must be a string");
        call.type = std::string(s);
    }
    element fn;
    if (v["function"].get(fn) || !fn.is_object()) return make_error(at + ".function: missing or not an object");
    if (fn["name"].get_string().get(s)) return make_error(at + ".function.name: missing or not a string");
    call.name = std::string(s);
    if (fn["arguments"].get_string().get(s))
        return make_error(at + ".function.arguments: missing or not a string (JSON text)");
    call.arguments = std::string(s);
    return call;
}

result<chat_message> parse_message(element v, const std::string& at) {
    if (!v.is_object()) return make_error(at + ": must be an object");
    chat_message m;
    std::string_view role;
    if (v["role"].get_string().get(role)) return make_error(at + ".role: missing or not a string");
    m.role = std::string(role);
    element c;
    if (v["content"].get(c) == simdjson::SUCCESS) {
        auto content = parse_content(c, at + ".content");
        MS_TRY(content);
        m.content = std::move(*content);
    }
    element calls;
    if (v["tool_calls"].get(calls) == simdjson::SUCCESS && !calls.is_null()) {
        simdjson::dom::array arr;
        if (calls.get_array().get(arr)) return make_error(at + ".tool_calls: must be an array");
        size_t j = 0;
        for (element t : arr) {
            auto call = parse_tool_call(t, at + ".tool_calls[" + std::to_string(j++) + "]");
            MS_TRY(call);
            m.tool_calls.push_back(std::move(*call));
        }
    }
    return m;
}

}  // namespace

result<std::vector<chat_message>> parse_chat_messages(std::string_view json) {
    simdjson::dom::parser parser;
    element root;
    if (auto e = parser.parse(json.data(), json.size()).get(root))
        return make_error(std::string("messages: invalid JSON (") + simdjson::error_message(e) + ")");
    simdjson::dom::array arr;
    if (root.get_array().get(arr)) return make_error("messages: must be a JSON array");
    std::vector<chat_message> out;
    size_t i = 0;
    for (element v : arr) {
        auto m = parse_message(v, where(i++));
        MS_TRY(m);
        out.push_back(std::move(*m));
    }
    return out;
}

}  // namespace moestream
