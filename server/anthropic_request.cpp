// Anthropic Messages bodies -> completion_request (the accepted fields are listed in
// anthropic_request.h). One simdjson DOM, every field looked up directly; lists are bounded by
// the same limits as the chat route's.
#include "server/anthropic_request.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <unordered_set>
#include <utility>

#include "server/request_fields.h"

namespace moestream::server {

using namespace detail;

namespace {

constexpr int64_t k_int64_max = std::numeric_limits<int64_t>::max();
constexpr int64_t k_int32_max = std::numeric_limits<int32_t>::max();
constexpr size_t k_max_tool_name = 128;  // the output parser's bound on a name

std::string json_quoted(std::string_view s) {
    return json_escape(s);
}

maybe_error required_field(const object_reader& r, std::string_view key, element& out) {
    const auto e = r.get(key);
    if (!e) return bad_request(r.path(key), r.path(key) + ": required");
    out = *e;
    return std::nullopt;
}

maybe_error required_string(const object_reader& r, std::string_view key, std::string& out) {
    element e;
    MS_API_TRY(required_field(r, key, e));
    return read_string(e, r.path(key), out);
}

// The object at `path`, or a wrong-type error.
maybe_error as_object(element e, const std::string& path, std::string_view what,
                      std::optional<object_reader>& out) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, what, e);
    out.emplace(o, path);
    return std::nullopt;
}

api_error unsupported_block(const std::string& path, std::string_view type) {
    if (type == "image" || type == "document")
        return bad_request(path + ".type", path + ".type: " + std::string(type) +
                                               " content is not supported: this model reads text only");
    return bad_request(path + ".type", path + ".type: unsupported content block type " + json_quoted(type));
}

// ---------------------------------------------------------------- text

// [{type: "text", text}] -> the texts, concatenated as sent. `skip_billing` drops Claude Code's
// attribution block (system prompt only).
maybe_error read_text_blocks(array blocks, const std::string& path, bool skip_billing, std::string& out) {
    size_t i = 0;
    for (element b : blocks) {
        const std::string bpath = path_index(path, i++);
        std::optional<object_reader> r;
        MS_API_TRY(as_object(b, bpath, "a content block object", r));
        std::string type, text;
        MS_API_TRY(required_string(*r, "type", type));
        if (type != "text") return unsupported_block(bpath, type);
        MS_API_TRY(required_string(*r, "text", text));
        if (skip_billing && std::string_view(text).starts_with(k_billing_header_prefix)) continue;
        out += text;
    }
    return std::nullopt;
}

// string | [text blocks]
maybe_error read_text_content(element e, const std::string& path, bool skip_billing, std::string& out) {
    std::string_view s;
    if (e.get_string().get(s) == simdjson::SUCCESS) {
        out.assign(s);
        return std::nullopt;
    }
    array blocks;
    if (e.get_array().get(blocks)) return wrong_type(path, "a string or an array of text blocks", e);
    return read_text_blocks(blocks, path, skip_billing, out);
}

maybe_error parse_system(const object_reader& r, std::vector<chat_message>& out) {
    const auto e = r.get("system");
    if (!e) return std::nullopt;
    std::string text;
    MS_API_TRY(read_text_content(*e, "system", true, text));
    if (!text.empty()) out.push_back(chat_message{"system", std::move(text), {}});
    return std::nullopt;
}

// ---------------------------------------------------------------- messages

struct message_state {
    std::vector<std::string> previous_tool_ids;  // tool_use ids of the assistant message just before
};

maybe_error parse_tool_result(const object_reader& b, const message_state& st, chat_message& out) {
    std::string id;
    MS_API_TRY(required_string(b, "tool_use_id", id));
    bool known = false;
    for (const auto& t : st.previous_tool_ids) known = known || t == id;
    if (!known)
        return bad_request(
            b.path("tool_use_id"),
            b.path("tool_use_id") + ": unexpected tool_use_id " + json_quoted(id) +
                " in a tool_result block: each tool_result must answer a tool_use block of the "
                "assistant message right before it");
    std::string text;
    if (const auto c = b.get("content")) MS_API_TRY(read_text_content(*c, b.path("content"), false, text));
    bool is_error = false;
    MS_API_TRY(b.opt_bool("is_error", is_error));
    out.role = "tool";
    out.content = is_error ? "Error: " + text : text;
    return std::nullopt;
}

maybe_error parse_tool_use(const object_reader& b, chat_tool_call& call, std::string& id) {
    MS_API_TRY(required_string(b, "id", id));
    MS_API_TRY(required_string(b, "name", call.name));
    element input;
    MS_API_TRY(required_field(b, "input", input));
    if (!input.is_object()) return wrong_type(b.path("input"), "an object", input);
    call.arguments = simdjson::minify(input);
    return std::nullopt;
}

// One message -> one or more chat messages (a user turn's tool results become tool messages).
maybe_error parse_message(element e, const std::string& path, message_state& st,
                          std::vector<chat_message>& out, std::vector<std::string>& tool_ids) {
    std::optional<object_reader> r;
    MS_API_TRY(as_object(e, path, "a message object", r));
    std::string role;
    MS_API_TRY(required_string(*r, "role", role));
    if (role != "user" && role != "assistant" && role != "system")
        return bad_request(r->path("role"), r->path("role") + ": unknown role " + json_quoted(role) +
                                                " (expected user, assistant or system)");
    element content;
    MS_API_TRY(required_field(*r, "content", content));
    const std::string cpath = r->path("content");
    if (role == "system") {
        std::string text;
        MS_API_TRY(read_text_content(content, cpath, false, text));
        out.push_back(chat_message{"system", std::move(text), {}});
        return std::nullopt;
    }
    std::string_view s;
    if (content.get_string().get(s) == simdjson::SUCCESS) {
        out.push_back(chat_message{role, std::string(s), {}});
        return std::nullopt;
    }
    array blocks;
    if (content.get_array().get(blocks))
        return wrong_type(cpath, "a string or an array of content blocks", content);
    if (blocks.size() == 0) return bad_request(cpath, cpath + ": must not be empty");

    std::string text;
    bool pending_text = false;  // user: text not yet flushed as a message
    std::vector<chat_tool_call> calls;
    size_t i = 0;
    for (element b : blocks) {
        const std::string bpath = path_index(cpath, i++);
        std::optional<object_reader> br;
        MS_API_TRY(as_object(b, bpath, "a content block object", br));
        std::string type;
        MS_API_TRY(required_string(*br, "type", type));
        if (type == "text") {
            std::string t;
            MS_API_TRY(required_string(*br, "text", t));
            text += t;
            pending_text = true;
        } else if (type == "tool_result") {
            if (role != "user")
                return bad_request(bpath + ".type",
                                   bpath + ".type: tool_result blocks belong in user messages");
            if (pending_text) out.push_back(chat_message{"user", std::exchange(text, {}), {}});
            pending_text = false;
            chat_message m;
            MS_API_TRY(parse_tool_result(*br, st, m));
            out.push_back(std::move(m));
        } else if (type == "tool_use") {
            if (role != "assistant")
                return bad_request(bpath + ".type",
                                   bpath + ".type: tool_use blocks belong in assistant messages");
            chat_tool_call call;
            std::string id;
            MS_API_TRY(parse_tool_use(*br, call, id));
            calls.push_back(std::move(call));
            tool_ids.push_back(std::move(id));
        } else if (type == "thinking" || type == "redacted_thinking") {
            if (role != "assistant")
                return bad_request(bpath + ".type",
                                   bpath + ".type: " + type + " blocks belong in assistant messages");
            // Earlier turns' reasoning is not part of the DeepSeek prompt.
        } else {
            return unsupported_block(bpath, type);
        }
    }
    if (role == "user") {
        if (pending_text) out.push_back(chat_message{"user", std::move(text), {}});
        return std::nullopt;
    }
    // The DeepSeek template renders an assistant turn's calls only when it has no content.
    if (!calls.empty()) {
        if (!text.empty()) out.push_back(chat_message{"assistant", std::move(text), {}});
        out.push_back(chat_message{"assistant", std::nullopt, std::move(calls)});
    } else {
        out.push_back(chat_message{"assistant", std::move(text), {}});
    }
    return std::nullopt;
}

// messages -> chat messages; a final assistant message becomes the reply's start.
maybe_error parse_messages(const object_reader& r, const parse_limits& limits, std::vector<chat_message>& out,
                           std::string& prefill) {
    element e;
    MS_API_TRY(required_field(r, "messages", e));
    array arr;
    if (e.get_array().get(arr)) return wrong_type("messages", "an array", e);
    const size_t n = arr.size();
    if (n == 0) return bad_request("messages", "messages: must not be empty");
    if (n > limits.max_messages)
        return bad_request("messages", "messages: at most " + std::to_string(limits.max_messages) +
                                           " messages are supported, got " + std::to_string(n));
    message_state st;
    size_t i = 0;
    for (element m : arr) {
        const std::string path = path_index("messages", i);
        const size_t before = out.size();
        std::vector<std::string> tool_ids;
        MS_API_TRY(parse_message(m, path, st, out, tool_ids));
        const bool last = ++i == n;
        const std::string_view role =
            out.size() > before ? std::string_view(out.back().role) : std::string_view();
        const bool assistant = role == "assistant";
        if (last && assistant) {
            if (!tool_ids.empty())
                return bad_request(path + ".content",
                                   path +
                                       ".content: the final assistant message (the start of "
                                       "the reply) may only hold text");
            prefill = out.back().content.value_or(std::string());
            out.pop_back();
        }
        // tool_result blocks answer the assistant message right before theirs (a system turn in
        // between does not count).
        if (assistant)
            st.previous_tool_ids = std::move(tool_ids);
        else if (role != "system")
            st.previous_tool_ids.clear();
    }
    if (out.empty() ||
        std::all_of(out.begin(), out.end(), [](const chat_message& m) { return m.role == "system"; }))
        return bad_request("messages", "messages: needs a user message");
    return std::nullopt;
}

// ---------------------------------------------------------------- tools

bool valid_tool_name(std::string_view name) {
    if (name.empty() || name.size() > k_max_tool_name) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                        c == '_' || c == '-' || c == '.';
        if (!ok) return false;
    }
    return true;
}

struct parsed_tool {
    tool_definition def;
    bool deferred = false;
};

maybe_error parse_tools(const object_reader& r, const parse_limits& limits, std::vector<parsed_tool>& out) {
    const auto e = r.get("tools");
    if (!e) return std::nullopt;
    array arr;
    if (e->get_array().get(arr)) return wrong_type("tools", "an array", *e);
    if (arr.size() > limits.max_tools)
        return bad_request("tools", "tools: at most " + std::to_string(limits.max_tools) +
                                        " tools are supported, got " + std::to_string(arr.size()));
    std::unordered_set<std::string> names;
    size_t i = 0;
    for (element t : arr) {
        const std::string path = path_index("tools", i++);
        std::optional<object_reader> tr;
        MS_API_TRY(as_object(t, path, "a tool object", tr));
        std::string type = "custom";
        MS_API_TRY(tr->opt_string("type", type));
        parsed_tool tool;
        MS_API_TRY(required_string(*tr, "name", tool.def.name));
        if (type != "custom") {
            spdlog::warn(
                "/v1/messages: {} ({}) is one of Anthropic's own tool types, which this server does not "
                "run: skipped",
                path, type);
            continue;
        }
        if (!valid_tool_name(tool.def.name))
            return bad_request(tr->path("name"),
                               tr->path("name") + ": " + json_quoted(tool.def.name) +
                                   " must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '-' or '.'");
        if (!names.insert(tool.def.name).second)
            return bad_request(tr->path("name"),
                               tr->path("name") + ": duplicate tool name " + json_quoted(tool.def.name));
        MS_API_TRY(tr->opt_string("description", tool.def.description));
        element schema;
        MS_API_TRY(required_field(*tr, "input_schema", schema));
        if (!schema.is_object()) return wrong_type(tr->path("input_schema"), "a JSON schema object", schema);
        tool.def.parameters_json = simdjson::minify(schema);
        tool.def.schema_param = tr->path("input_schema");
        MS_API_TRY(tr->opt_bool("strict", tool.def.strict));
        MS_API_TRY(tr->opt_bool("defer_loading", tool.deferred));
        out.push_back(std::move(tool));
    }
    return std::nullopt;
}

maybe_error parse_tool_choice(const object_reader& r, const std::vector<parsed_tool>& tools,
                              completion_request& req) {
    const auto e = r.get("tool_choice");
    if (!e) return std::nullopt;
    std::optional<object_reader> cr;
    MS_API_TRY(as_object(*e, "tool_choice", "an object {type: auto | any | tool | none}", cr));
    std::string type;
    MS_API_TRY(required_string(*cr, "type", type));
    bool no_parallel = false;
    MS_API_TRY(cr->opt_bool("disable_parallel_tool_use", no_parallel));
    req.parallel_tool_calls = !no_parallel;
    if (type == "auto") {
        req.choice.kind = tool_choice::auto_;
    } else if (type == "none") {
        req.choice.kind = tool_choice::none;
    } else if (type == "any" || type == "tool") {
        if (tools.empty())
            return bad_request("tool_choice.type",
                               "tool_choice.type: " + json_quoted(type) + " needs a non-empty tools list");
        if (type == "any") {
            req.choice.kind = tool_choice::required;
        } else {
            MS_API_TRY(required_string(*cr, "name", req.choice.function_name));
            bool found = false;
            for (const auto& t : tools) found = found || t.def.name == req.choice.function_name;
            if (!found)
                return bad_request(
                    "tool_choice.name",
                    "tool_choice.name: no tool named " + json_quoted(req.choice.function_name) + " in tools");
            req.choice.kind = tool_choice::function;
        }
    } else {
        return bad_request(
            "tool_choice.type",
            "tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\", got " + json_quoted(type));
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- generation

maybe_error parse_stop_sequences(const object_reader& r, const parse_limits& limits,
                                 std::vector<std::string>& out) {
    const auto e = r.get("stop_sequences");
    if (!e) return std::nullopt;
    array arr;
    if (e->get_array().get(arr)) return wrong_type("stop_sequences", "an array of strings", *e);
    if (arr.size() > limits.max_stop_strings)
        return bad_request("stop_sequences",
                           "stop_sequences: at most " + std::to_string(limits.max_stop_strings) +
                               " stop sequences are supported, got " + std::to_string(arr.size()));
    size_t i = 0;
    for (element v : arr) {
        const std::string path = path_index("stop_sequences", i++);
        std::string s;
        MS_API_TRY(read_string(v, path, s));
        if (s.size() > limits.max_stop_bytes)
            return bad_request(path, path + ": a stop sequence may hold at most " +
                                         std::to_string(limits.max_stop_bytes) + " bytes, got " +
                                         std::to_string(s.size()));
        if (!s.empty()) out.push_back(std::move(s));
    }
    return std::nullopt;
}

maybe_error parse_sampling(const object_reader& r, sampling_params& s) {
    MS_API_TRY(r.opt_float("temperature", real_range{0.0, 1.0}, s.temperature));
    MS_API_TRY(r.opt_float("top_p", real_range{0.0, 1.0, true}, s.top_p));
    std::optional<int64_t> top_k;
    MS_API_TRY(r.opt_integer("top_k", 0, k_int32_max, top_k));
    if (top_k) s.top_k = static_cast<int32_t>(*top_k);
    return std::nullopt;
}

struct thinking_request {
    bool enabled = false;
    int64_t budget = -1;
    bool display = true;
};

maybe_error parse_thinking(const object_reader& r, thinking_request& out) {
    std::optional<object_reader> t;
    MS_API_TRY(r.opt_object("thinking", t));
    if (!t) return std::nullopt;
    std::string type;
    MS_API_TRY(required_string(*t, "type", type));
    if (type == "enabled") {
        element b;
        MS_API_TRY(required_field(*t, "budget_tokens", b));
        MS_API_TRY(read_integer_in(b, t->path("budget_tokens"), 1, k_int64_max, out.budget));
        out.enabled = true;
    } else if (type != "disabled" && type != "adaptive") {
        return bad_request(t->path("type"), t->path("type") +
                                                ": expected \"enabled\", \"adaptive\" or \"disabled\", got " +
                                                json_quoted(type));
    }
    std::string display;
    MS_API_TRY(t->opt_string("display", display));
    out.display = display != "omitted";
    return std::nullopt;
}

maybe_error parse_ignored(const object_reader& r) {
    std::optional<object_reader> metadata;
    MS_API_TRY(r.opt_object("metadata", metadata));
    if (metadata) {
        std::string user;
        MS_API_TRY(metadata->opt_string("user_id", user));
    }
    if (const auto mcp = r.get("mcp_servers")) {
        array arr;
        if (mcp->get_array().get(arr)) return wrong_type("mcp_servers", "an array", *mcp);
        if (arr.size() > 0)
            return bad_request("mcp_servers",
                               "mcp_servers: this server does not connect to MCP servers (run them in "
                               "the client)");
    }
    return std::nullopt;
}

}  // namespace

api_result<anthropic_request> parse_anthropic_request(std::string_view body, anthropic_body kind,
                                                      const parse_limits& limits) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root.ok()) return root.error();
    const object_reader r(*root, "");

    anthropic_request out;
    completion_request& req = out.completion;
    req.route = api_route::chat_completions;
    req.sampling = default_sampling(api_route::chat_completions);
    MS_API_TRY(r.opt_string("model", req.model));

    std::optional<int64_t> max_tokens;
    MS_API_TRY(r.opt_integer("max_tokens", 1, k_int64_max, max_tokens));
    if (!max_tokens && kind == anthropic_body::messages)
        return bad_request("max_tokens", "max_tokens: required (an integer >= 1)");
    req.max_tokens = max_tokens.value_or(-1);

    MS_API_TRY(parse_system(r, req.messages));
    MS_API_TRY(parse_messages(r, limits, req.messages, out.options.assistant_prefix));

    std::vector<parsed_tool> tools;
    MS_API_TRY(parse_tools(r, limits, tools));
    MS_API_TRY(parse_tool_choice(r, tools, req));
    for (auto& t : tools)
        if (!t.deferred ||
            (req.choice.kind == tool_choice::function && req.choice.function_name == t.def.name))
            req.tools.push_back(std::move(t.def));
    if (req.tools.empty() &&
        (req.choice.kind == tool_choice::required || req.choice.kind == tool_choice::function))
        return bad_request("tool_choice",
                           "tool_choice: every tool is deferred (defer_loading): none can be forced");

    MS_API_TRY(parse_stop_sequences(r, limits, req.stop));
    MS_API_TRY(parse_sampling(r, req.sampling));
    MS_API_TRY(r.opt_bool("stream", req.stream));
    if (kind == anthropic_body::count_tokens) req.stream = false;
    MS_API_TRY(parse_ignored(r));

    thinking_request thinking;
    MS_API_TRY(parse_thinking(r, thinking));
    if (thinking.enabled) {
        if (max_tokens && thinking.budget >= *max_tokens)
            return bad_request("thinking.budget_tokens",
                               "thinking.budget_tokens: must be less than max_tokens (" +
                                   std::to_string(*max_tokens) + "), got " + std::to_string(thinking.budget));
        if (req.choice.kind == tool_choice::required || req.choice.kind == tool_choice::function)
            return bad_request("thinking",
                               "thinking: thinking may not be enabled when tool_choice forces tool use");
        if (!out.options.assistant_prefix.empty())
            return bad_request("messages",
                               "messages: a final assistant message (prefill) cannot be combined with "
                               "thinking enabled");
        out.options.open_reasoning = true;
        out.options.reasoning_budget = thinking.budget;
    }
    out.display_thinking = thinking.display;
    req.cache_prompt = true;
    const int64_t vocab = limits.vocab > 0 ? limits.vocab : k_int32_max;
    if (const status st = req.sampling.validate(vocab); !st.ok()) return bad_request("", st.message());
    return out;
}

}  // namespace moestream::server
