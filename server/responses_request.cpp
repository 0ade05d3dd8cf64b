// Responses request bodies (the accepted fields are listed in responses_request.h). The same
// field readers as the chat parser (request_fields.h), so errors read the same way.
#include "server/responses_request.h"

#include <limits>
#include <unordered_set>

#include "server/json_writer.h"
#include "server/request_fields.h"

namespace moestream::server {

using namespace detail;

namespace {

std::string single_quoted(std::string_view s) {
    std::string q("'");
    q.append(s).push_back('\'');
    return q;
}

api_error required(const std::string& path) { return bad_request(path, path + ": required"); }

// Reads the string field `key` of `r`, which must be present.
maybe_error required_string(const object_reader& r, std::string_view key, std::string& out) {
    const auto e = r.get(key);
    if (!e) return required(r.path(key));
    return read_string(*e, r.path(key), out);
}

// One value of a fixed set ("" when absent).
maybe_error opt_keyword(const object_reader& r, std::string_view key, std::initializer_list<std::string_view> allowed,
                        std::string& out) {
    std::string v;
    MS_API_TRY(r.opt_string(key, v));
    if (!r.get(key)) return std::nullopt;
    std::string list;
    for (std::string_view a : allowed) {
        if (v == a) {
            out = std::move(v);
            return std::nullopt;
        }
        list += (list.empty() ? "" : ", ") + std::string(a);
    }
    return bad_request(r.path(key), r.path(key) + ": expected one of " + list + ", got " + json_escape(v));
}

bool valid_tool_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                        c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// ---------------------------------------------------------------- input items

// Message content and function_call_output output: a string or an array of text parts
// (concatenated). `output` restricts the parts to input_text/output_text (no refusal).
maybe_error read_text_content(element e, const std::string& path, bool output, std::string& text) {
    std::string_view s;
    if (e.get_string().get(s) == simdjson::SUCCESS) {
        text = std::string(s);
        return std::nullopt;
    }
    array parts;
    if (e.get_array().get(parts)) return wrong_type(path, "a string or an array of content parts", e);
    size_t j = 0;
    for (element part : parts) {
        const std::string part_path = path_index(path, j++);
        object o;
        if (part.get_object().get(o)) return wrong_type(part_path, "a content part object", part);
        const object_reader pr(o, part_path);
        std::string type;
        MS_API_TRY(required_string(pr, "type", type));
        std::string_view field = "text";
        if (type == "refusal" && !output) field = "refusal";
        else if (type != "input_text" && type != "output_text")
            return bad_request(pr.path("type"), pr.path("type") + ": content part type " + single_quoted(type) +
                                                    ": only text content is supported (input_text, output_text" +
                                                    (output ? ")" : ", refusal)"));
        std::string piece;
        MS_API_TRY(required_string(pr, field, piece));
        text += piece;
    }
    return std::nullopt;
}

maybe_error parse_message_item(const object_reader& r, conversation_item& item) {
    item.kind = conversation_item::message;
    MS_API_TRY(required_string(r, "role", item.role));
    if (item.role == "developer") item.role = "system";  // the Responses name of the system prompt
    if (item.role != "user" && item.role != "assistant" && item.role != "system")
        return bad_request(r.path("role"), r.path("role") + ": unknown role " + single_quoted(item.role) +
                                               " (expected user, assistant, system or developer)");
    const auto content = r.get("content");
    if (!content) return required(r.path("content"));
    return read_text_content(*content, r.path("content"), false, item.text);
}

maybe_error parse_function_call_item(const object_reader& r, conversation_item& item) {
    item.kind = conversation_item::function_call;
    MS_API_TRY(required_string(r, "call_id", item.call_id));
    if (item.call_id.empty()) return bad_request(r.path("call_id"), r.path("call_id") + ": must not be empty");
    MS_API_TRY(required_string(r, "name", item.name));
    if (item.name.empty()) return bad_request(r.path("name"), r.path("name") + ": must not be empty");
    const auto args = r.get("arguments");
    if (!args) return required(r.path("arguments"));
    if (args->is_object()) item.arguments = simdjson::minify(*args);  // some clients send the object
    else MS_API_TRY(read_string(*args, r.path("arguments"), item.arguments));
    return std::nullopt;
}

maybe_error parse_function_call_output_item(const object_reader& r, conversation_item& item) {
    item.kind = conversation_item::function_call_output;
    MS_API_TRY(required_string(r, "call_id", item.call_id));
    const auto output = r.get("output");
    if (!output) return required(r.path("output"));
    return read_text_content(*output, r.path("output"), true, item.text);
}

// Reasoning items are checked for their shape and dropped.
maybe_error check_reasoning_item(const object_reader& r) {
    for (std::string_view key : {std::string_view("summary"), std::string_view("content")}) {
        const auto e = r.get(key);
        if (!e) continue;
        array arr;
        if (e->get_array().get(arr)) return wrong_type(r.path(key), "an array", *e);
    }
    std::string ignored;
    return r.opt_string("encrypted_content", ignored);
}

// Returns true in `keep` when the item adds to the conversation (reasoning does not).
maybe_error parse_item(element e, const std::string& path, conversation_item& item, bool& keep) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, "an item object", e);
    const object_reader r(o, path);
    std::string type;
    MS_API_TRY(r.opt_string("type", type));
    if (type.empty()) {
        if (!r.get("role")) return bad_request(r.path("type"), r.path("type") + ": required (or a message's role)");
        type = "message";
    }
    keep = true;
    if (type == "message") return parse_message_item(r, item);
    if (type == "function_call") return parse_function_call_item(r, item);
    if (type == "function_call_output") return parse_function_call_output_item(r, item);
    if (type == "reasoning") {
        keep = false;
        return check_reasoning_item(r);
    }
    return bad_request(r.path("type"), r.path("type") + ": item type " + single_quoted(type) +
                                           " is not supported (expected message, function_call, "
                                           "function_call_output or reasoning)");
}

maybe_error parse_input(const object_reader& r, const parse_limits& limits, responses_request& req) {
    const auto e = r.get("input");
    if (!e) return std::nullopt;
    req.input_given = true;
    std::string_view s;
    if (e->get_string().get(s) == simdjson::SUCCESS) {
        conversation_item item;
        item.role = "user";
        item.text = std::string(s);
        req.input.push_back(std::move(item));
        return std::nullopt;
    }
    array arr;
    if (e->get_array().get(arr)) return wrong_type("input", "a string or an array of items", *e);
    if (arr.size() > limits.max_messages)
        return bad_request("input", "input: at most " + std::to_string(limits.max_messages) +
                                        " items are supported, got " + std::to_string(arr.size()));
    req.input.reserve(arr.size());
    size_t i = 0;
    for (element v : arr) {
        conversation_item item;
        bool keep = false;
        MS_API_TRY(parse_item(v, path_index("input", i++), item, keep));
        if (keep) req.input.push_back(std::move(item));
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- tools

// A function tool into both the generation request and the echo; other types are skipped.
maybe_error parse_tool(element e, const std::string& path, responses_request& req) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, "a tool object", e);
    const object_reader r(o, path);
    std::string type;
    MS_API_TRY(required_string(r, "type", type));
    if (type != "function") {
        std::string name;
        if (const auto n = r.get("name"); n && n->is_string()) name = std::string(n->get_string().value_unsafe());
        req.skipped_tools.push_back(name.empty() ? type : type + " " + name);
        return std::nullopt;
    }
    function_tool t;
    const auto name = r.get("name");
    if (!name) {
        if (r.get("function"))  // the chat route's nesting
            return bad_request(r.path("name"), r.path("name") + ": required (Responses tools are flat: "
                                                                "{\"type\":\"function\",\"name\":...,\"parameters\":...})");
        return required(r.path("name"));
    }
    MS_API_TRY(read_string(*name, r.path("name"), t.name));
    if (!valid_tool_name(t.name))
        return bad_request(r.path("name"), r.path("name") + ": " + json_escape(t.name) +
                                               " must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '.' or '-'");
    MS_API_TRY(r.opt_string("description", t.description));
    t.parameters_json = "{}";
    if (const auto p = r.get("parameters")) {
        if (!p->is_object()) return wrong_type(r.path("parameters"), "a JSON schema object", *p);
        t.parameters_json = simdjson::minify(*p);
    }
    MS_API_TRY(r.opt_bool("strict", t.strict));
    // The schema goes where the chat route puts a function's "parameters", so whatever the chat
    // route does with it (the prompt, the schema constraint of strict or forced calls) happens
    // here too.
    tool_definition def;
    def.name = t.name;
    def.description = t.description;
    def.parameters_json = t.parameters_json;
    def.strict = t.strict;
    def.schema_param = r.path("parameters");
    req.generation.tools.push_back(std::move(def));
    req.echo.tools.push_back(std::move(t));
    return std::nullopt;
}

maybe_error parse_tools(const object_reader& r, const parse_limits& limits, responses_request& req) {
    const auto e = r.get("tools");
    if (!e) return std::nullopt;
    array arr;
    if (e->get_array().get(arr)) return wrong_type("tools", "an array", *e);
    std::unordered_set<std::string> names;
    size_t i = 0;
    for (element t : arr) {
        const std::string path = path_index("tools", i++);
        MS_API_TRY(parse_tool(t, path, req));
        if (req.generation.tools.size() > limits.max_tools)
            return bad_request("tools", "tools: at most " + std::to_string(limits.max_tools) +
                                            " function tools are supported");
        if (req.echo.tools.size() == names.size()) continue;  // skipped
        if (!names.insert(req.echo.tools.back().name).second)
            return bad_request(path + ".name", path + ".name: duplicate tool name " + single_quoted(req.echo.tools.back().name));
    }
    return std::nullopt;
}

maybe_error parse_tool_choice(const object_reader& r, responses_request& req) {
    const auto e = r.get("tool_choice");
    if (!e) return std::nullopt;
    tool_choice& out = req.generation.choice;
    const auto& tools = req.generation.tools;
    std::string_view s;
    if (e->get_string().get(s) == simdjson::SUCCESS) {
        if (s == "auto") out.kind = tool_choice::auto_;
        else if (s == "none") out.kind = tool_choice::none;
        else if (s == "required") out.kind = tool_choice::required;
        else
            return bad_request("tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or "
                                              "{\"type\":\"function\",\"name\":...}, got " + json_escape(s));
        if (out.kind == tool_choice::required && tools.empty())
            return bad_request("tool_choice", "tool_choice: \"required\" needs at least one function tool");
        req.echo.tool_choice_json = json_escape(s);
        return std::nullopt;
    }
    object o;
    if (e->get_object().get(o)) return wrong_type("tool_choice", "a string or an object", *e);
    const object_reader cr(o, "tool_choice");
    std::string type;
    MS_API_TRY(required_string(cr, "type", type));
    if (type != "function")
        return bad_request(cr.path("type"), cr.path("type") + ": only \"function\" is supported, got " + single_quoted(type) +
                                                " (this server runs function tools only)");
    MS_API_TRY(required_string(cr, "name", out.function_name));
    bool found = false;
    for (const auto& t : tools) found = found || t.name == out.function_name;
    if (!found)
        return bad_request(cr.path("name"), cr.path("name") + ": no function tool named " +
                                                json_escape(out.function_name) + " in tools");
    out.kind = tool_choice::function;
    req.echo.tool_choice_json = simdjson::minify(*e);
    return std::nullopt;
}

// ---------------------------------------------------------------- text.format

// The chat route's response_format parser reads the format (it knows the Responses API's flat
// form), so both routes constrain the same way; its errors name text.format.
maybe_error parse_text(const object_reader& r, responses_request& req) {
    std::optional<object_reader> text;
    MS_API_TRY(r.opt_object("text", text));
    if (!text) return std::nullopt;
    MS_API_TRY(opt_keyword(*text, "verbosity", {"low", "medium", "high"}, req.echo.verbosity));
    std::optional<object_reader> format;
    MS_API_TRY(text->opt_object("format", format));
    if (!format) return std::nullopt;
    req.echo.format_json = simdjson::minify(format->raw());
    auto spec = parse_output_format(req.echo.format_json, format->own_path());
    if (!spec) return spec.error();
    req.constraint = std::move(*spec);
    return std::nullopt;
}

// ---------------------------------------------------------------- the rest

maybe_error refuse_unsupported(const object_reader& r) {
    bool background = false;
    MS_API_TRY(r.opt_bool("background", background));
    if (background)
        return bad_request("background", "background: background responses are not supported (send the request "
                                         "and read its answer, or stream it)");
    if (r.get("conversation"))
        return bad_request("conversation", "conversation: conversations are not supported; continue a response "
                                           "with previous_response_id and store: true");
    if (r.get("prompt")) return bad_request("prompt", "prompt: prompt templates are not supported; send input");
    std::string truncation;
    MS_API_TRY(opt_keyword(r, "truncation", {"disabled", "auto"}, truncation));
    if (truncation == "auto")
        return bad_request("truncation", "truncation: \"auto\" is not supported: the server never drops input "
                                         "(a conversation longer than the context is refused)");
    std::optional<int64_t> top_logprobs;
    MS_API_TRY(r.opt_integer("top_logprobs", 0, 20, top_logprobs));
    if (top_logprobs && *top_logprobs > 0)
        return bad_request("top_logprobs", "top_logprobs: log-probabilities are not supported on /v1/responses "
                                           "(use /v1/chat/completions)");
    if (r.get("max_tool_calls"))
        return bad_request("max_tool_calls", "max_tool_calls: not supported (the model makes at most the calls "
                                             "of one turn; parallel_tool_calls: false asks for one)");
    return std::nullopt;
}

maybe_error parse_options(const object_reader& r, responses_request& req) {
    response_echo& echo = req.echo;
    completion_request& g = req.generation;
    MS_API_TRY(r.opt_string("model", echo.model));
    g.model = echo.model;
    if (const auto e = r.get("instructions")) {
        std::string s;
        MS_API_TRY(read_string(*e, "instructions", s));
        echo.instructions = std::move(s);
    }
    MS_API_TRY(r.opt_bool("stream", g.stream));
    MS_API_TRY(r.opt_bool("store", echo.store));
    MS_API_TRY(r.opt_string("previous_response_id", echo.previous_response_id));
    if (r.get("previous_response_id") && echo.previous_response_id.empty())
        return bad_request("previous_response_id", "previous_response_id: must not be empty");
    std::optional<int64_t> max_output;
    MS_API_TRY(r.opt_integer("max_output_tokens", 1, std::numeric_limits<int64_t>::max(), max_output));
    echo.max_output_tokens = max_output;
    g.max_tokens = max_output ? *max_output : -1;
    MS_API_TRY(r.opt_float("temperature", real_range{0.0, 2.0}, g.sampling.temperature));
    MS_API_TRY(r.opt_float("top_p", real_range{0.0, 1.0, true}, g.sampling.top_p));
    echo.temperature = g.sampling.temperature;
    echo.top_p = g.sampling.top_p;
    MS_API_TRY(r.opt_bool("parallel_tool_calls", g.parallel_tool_calls));
    echo.parallel_tool_calls = g.parallel_tool_calls;
    std::optional<object_reader> reasoning;
    MS_API_TRY(r.opt_object("reasoning", reasoning));
    if (reasoning) {
        MS_API_TRY(opt_keyword(*reasoning, "effort", {"none", "minimal", "low", "medium", "high", "xhigh"},
                               echo.reasoning_effort));
        MS_API_TRY(opt_keyword(*reasoning, "summary", {"auto", "concise", "detailed"}, echo.reasoning_summary));
        g.enable_thinking = echo.reasoning_effort != "none";
    }
    if (const auto m = r.get("metadata")) {
        if (!m->is_object()) return wrong_type("metadata", "an object", *m);
        echo.metadata_json = simdjson::minify(*m);
    }
    // Accepted without effect; their types are still checked.
    std::string ignored;
    for (std::string_view key : {"prompt_cache_key", "user", "safety_identifier", "service_tier"})
        MS_API_TRY(r.opt_string(key, ignored));
    if (const auto inc = r.get("include"); inc && !inc->is_array()) return wrong_type("include", "an array", *inc);
    std::optional<object_reader> stream_options;
    return r.opt_object("stream_options", stream_options);
}

}  // namespace

reasoning_plan reasoning_plan_of(const responses_request& r) {
    reasoning_plan plan;
    const std::string& effort = r.echo.reasoning_effort;
    if (effort.empty() || effort == "none") return plan;
    plan.open = true;
    // A forced call, JSON output or a strict tool's call follows the reasoning, which keeps its
    // budget (completion_job combines the two: server/reasoning_budget.h budgeted_output).
    plan.budget = effort == "minimal" ? 512 : effort == "low" ? 2048 : effort == "medium" ? 8192 : effort == "high" ? 32768 : -1;
    return plan;
}

api_result<responses_request> parse_responses_request(std::string_view body, const parse_limits& limits) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root.ok()) return root.error();
    const object_reader r(*root, "");

    responses_request req;
    req.generation.route = api_route::chat_completions;
    req.generation.sampling = default_sampling(api_route::chat_completions);
    MS_API_TRY(refuse_unsupported(r));
    MS_API_TRY(parse_options(r, req));
    MS_API_TRY(parse_input(r, limits, req));
    if (!req.input_given && req.echo.previous_response_id.empty())
        return bad_request("input", "input: required (a string or an array of items)");
    MS_API_TRY(parse_tools(r, limits, req));
    MS_API_TRY(parse_tool_choice(r, req));
    MS_API_TRY(parse_text(r, req));
    const int64_t vocab = limits.vocab > 0 ? limits.vocab : std::numeric_limits<int32_t>::max();
    if (const status st = req.generation.sampling.validate(vocab); !st.ok()) return bad_request("", st.message());
    return req;
}

}  // namespace moestream::server
