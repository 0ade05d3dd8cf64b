// Request bodies -> typed requests (the accepted fields are listed in request.h). Parsed once into
// a simdjson DOM; every field is then looked up directly, so the cost is linear in the body and
// bounded lists (stop, messages, tools, logit_bias) are checked by their size before anything is
// built from them.
#include "server/request.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "server/request_fields.h"

namespace moestream::server {

using namespace detail;

namespace {

constexpr int64_t k_int64_max = std::numeric_limits<int64_t>::max();
constexpr int64_t k_int32_max = std::numeric_limits<int32_t>::max();
constexpr int64_t k_max_top_logprobs = 20;  // OpenAI's limit, and the sampler's

bool is_native(api_route r) { return r == api_route::native_completion || r == api_route::infill; }

std::string single_quoted(std::string_view s) {
    std::string q("'");
    q.append(s).push_back('\'');
    return q;
}

// ---------------------------------------------------------------- prompt

// "text" | ["text"] | [ids] | [[ids]]; anything holding several prompts is refused.
maybe_error parse_prompt(element e, std::string_view path, int64_t vocab, std::optional<std::string>& text,
                         std::vector<int32_t>& tokens) {
    std::string_view s;
    if (e.get_string().get(s) == simdjson::SUCCESS) {
        text = std::string(s);
        return std::nullopt;
    }
    array arr;
    if (e.get_array().get(arr)) return wrong_type(path, "a string or an array", e);
    const size_t n = arr.size();
    if (n == 0) return bad_request(std::string(path), std::string(path) + ": must not be empty");
    size_t numbers = 0, strings = 0, arrays = 0, i = 0;
    for (element v : arr) {
        if (v.is_number()) ++numbers;
        else if (v.is_string()) ++strings;
        else if (v.is_array()) ++arrays;
        else return wrong_type(path_index(path, i), "a string, a token id or an array of token ids", v);
        ++i;
    }
    const auto read_ids = [&](array ids, std::string_view ids_path) -> maybe_error {
        tokens.clear();
        tokens.reserve(ids.size());
        size_t j = 0;
        for (element id : ids) {
            int32_t t = 0;
            MS_API_TRY(read_token_id(id, path_index(ids_path, j++), vocab, t));
            tokens.push_back(t);
        }
        if (tokens.empty()) return bad_request(std::string(ids_path), std::string(ids_path) + ": must not be empty");
        return std::nullopt;
    };
    if (numbers == n) return read_ids(arr, path);
    if (numbers > 0)
        return bad_request(std::string(path),
                           std::string(path) + ": mixing strings and token ids in one prompt is not supported");
    if (n > 1) return bad_request(std::string(path), "only one prompt per request is supported");
    element only = arr.at(0).value_unsafe();
    if (strings == 1) {
        text = std::string(only.get_string().value_unsafe());
        return std::nullopt;
    }
    return read_ids(only.get_array().value_unsafe(), path_index(path, 0));
}

// ---------------------------------------------------------------- chat messages

maybe_error parse_content_parts(array parts, const std::string& path, std::string& out) {
    size_t j = 0;
    for (element part : parts) {
        const std::string part_path = path_index(path, j++);
        object o;
        if (part.get_object().get(o)) return wrong_type(part_path, "a content part object", part);
        const object_reader pr(o, part_path);
        std::string type;
        const auto t = pr.get("type");
        if (!t) return bad_request(pr.path("type"), pr.path("type") + ": required");
        MS_API_TRY(read_string(*t, pr.path("type"), type));
        if (type != "text")
            return bad_request(pr.path("type"), pr.path("type") + ": content part type " + single_quoted(type) +
                                                    ": only text content is supported");
        const auto text = pr.get("text");
        if (!text) return bad_request(pr.path("text"), pr.path("text") + ": required");
        std::string_view s;
        if (text->get_string().get(s)) return wrong_type(pr.path("text"), "a string", *text);
        out.append(s);
    }
    return std::nullopt;
}

maybe_error parse_tool_call(element e, const std::string& path, chat_tool_call& call) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, "an object", e);
    const object_reader r(o, path);
    std::string ignored_id;
    MS_API_TRY(r.opt_string("id", ignored_id));
    std::string type = "function";
    MS_API_TRY(r.opt_string("type", type));
    if (type != "function")
        return bad_request(r.path("type"), r.path("type") + ": only \"function\" tool calls are supported, got " +
                                               single_quoted(type));
    std::optional<object_reader> fn;
    MS_API_TRY(r.opt_object("function", fn));
    if (!fn) return bad_request(r.path("function"), r.path("function") + ": required");
    const auto name = fn->get("name");
    if (!name) return bad_request(fn->path("name"), fn->path("name") + ": required");
    MS_API_TRY(read_string(*name, fn->path("name"), call.name));
    call.arguments = "{}";
    if (const auto args = fn->get("arguments")) {
        // Some clients send the arguments as an object rather than as JSON text.
        if (args->is_object()) call.arguments = simdjson::minify(*args);
        else MS_API_TRY(read_string(*args, fn->path("arguments"), call.arguments));
    }
    return std::nullopt;
}

maybe_error parse_message(element e, const std::string& path, chat_message& m) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, "a message object", e);
    const object_reader r(o, path);
    const auto role = r.get("role");
    if (!role) return bad_request(r.path("role"), r.path("role") + ": required");
    MS_API_TRY(read_string(*role, r.path("role"), m.role));
    if (m.role == "developer") m.role = "system";  // OpenAI's newer name for the system prompt
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
        return bad_request(r.path("role"), r.path("role") + ": unknown role " + single_quoted(m.role) +
                                               " (expected system, developer, user, assistant or tool)");

    if (const auto c = r.get("content")) {
        std::string_view s;
        array parts;
        if (c->get_string().get(s) == simdjson::SUCCESS) {
            m.content = std::string(s);
        } else if (c->get_array().get(parts) == simdjson::SUCCESS) {
            std::string text;
            MS_API_TRY(parse_content_parts(parts, r.path("content"), text));
            m.content = std::move(text);
        } else {
            return wrong_type(r.path("content"), "a string, null or an array of text parts", *c);
        }
    }

    if (m.role == "assistant") {
        if (const auto calls = r.get("tool_calls")) {
            array arr;
            if (calls->get_array().get(arr)) return wrong_type(r.path("tool_calls"), "an array", *calls);
            m.tool_calls.reserve(arr.size());
            size_t j = 0;
            for (element c : arr) {
                chat_tool_call call;
                MS_API_TRY(parse_tool_call(c, path_index(r.path("tool_calls"), j++), call));
                m.tool_calls.push_back(std::move(call));
            }
        }
        // The DeepSeek template renders the tool calls of an assistant turn only when its content
        // is null; clients commonly send "" alongside tool calls.
        if (!m.tool_calls.empty() && m.content && m.content->empty()) m.content.reset();
        if (!m.content && m.tool_calls.empty())
            return bad_request(r.path("content"), r.path("content") + ": an assistant message needs content or tool_calls");
    } else if (!m.content) {
        return bad_request(r.path("content"), r.path("content") + ": required for a " + m.role + " message");
    }
    if (m.role == "tool") {
        std::string ignored_id;
        MS_API_TRY(r.opt_string("tool_call_id", ignored_id));
    }
    return std::nullopt;
}

maybe_error parse_messages(const object_reader& r, const parse_limits& limits, std::vector<chat_message>& out) {
    const auto e = r.get("messages");
    if (!e) return bad_request("messages", "messages: required (a non-empty array of messages)");
    array arr;
    if (e->get_array().get(arr)) return wrong_type("messages", "an array", *e);
    const size_t n = arr.size();
    if (n == 0) return bad_request("messages", "messages: must not be empty");
    if (n > limits.max_messages)
        return bad_request("messages", "messages: at most " + std::to_string(limits.max_messages) +
                                           " messages are supported, got " + std::to_string(n));
    out.resize(n);
    size_t i = 0;
    for (element m : arr) {
        MS_API_TRY(parse_message(m, path_index("messages", i), out[i]));
        ++i;
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- tools

bool valid_tool_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                        c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

maybe_error parse_tool(element e, const std::string& path, tool_definition& tool) {
    object o;
    if (e.get_object().get(o)) return wrong_type(path, "a tool object", e);
    const object_reader r(o, path);
    std::string type = "function";
    MS_API_TRY(r.opt_string("type", type));
    if (type != "function")
        return bad_request(r.path("type"), r.path("type") + ": only \"function\" tools are supported, got " + single_quoted(type));
    std::optional<object_reader> fn;
    MS_API_TRY(r.opt_object("function", fn));
    if (!fn) return bad_request(r.path("function"), r.path("function") + ": required");
    const auto name = fn->get("name");
    if (!name) return bad_request(fn->path("name"), fn->path("name") + ": required");
    MS_API_TRY(read_string(*name, fn->path("name"), tool.name));
    if (!valid_tool_name(tool.name))
        return bad_request(fn->path("name"), fn->path("name") + ": " + json_escape(tool.name) +
                                                 " must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '.' or '-'");
    MS_API_TRY(fn->opt_string("description", tool.description));
    tool.parameters_json = "{}";
    if (const auto p = fn->get("parameters")) {
        if (!p->is_object()) return wrong_type(fn->path("parameters"), "a JSON schema object", *p);
        tool.parameters_json = simdjson::minify(*p);
    }
    MS_API_TRY(fn->opt_bool("strict", tool.strict));
    return std::nullopt;
}

maybe_error parse_tools(const object_reader& r, const parse_limits& limits, std::vector<tool_definition>& out) {
    const auto e = r.get("tools");
    if (!e) return std::nullopt;
    array arr;
    if (e->get_array().get(arr)) return wrong_type("tools", "an array", *e);
    const size_t n = arr.size();
    if (n > limits.max_tools)
        return bad_request("tools", "tools: at most " + std::to_string(limits.max_tools) + " tools are supported, got " +
                                        std::to_string(n));
    out.resize(n);
    std::unordered_set<std::string_view> names;
    size_t i = 0;
    for (element t : arr) {
        const std::string path = path_index("tools", i);
        MS_API_TRY(parse_tool(t, path, out[i]));
        if (!names.insert(out[i].name).second)
            return bad_request(path + ".function.name", path + ".function.name: duplicate tool name " + single_quoted(out[i].name));
        ++i;
    }
    return std::nullopt;
}

maybe_error parse_tool_choice(const object_reader& r, const std::vector<tool_definition>& tools, tool_choice& out) {
    const auto e = r.get("tool_choice");
    if (!e) return std::nullopt;
    std::string_view s;
    object o;
    if (e->get_string().get(s) == simdjson::SUCCESS) {
        if (s == "auto") out.kind = tool_choice::auto_;
        else if (s == "none") out.kind = tool_choice::none;
        else if (s == "required") out.kind = tool_choice::required;
        else
            return bad_request("tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or "
                                              "{\"type\":\"function\",\"function\":{\"name\":...}}, got " +
                                                  json_escape(s));
        if (out.kind == tool_choice::required && tools.empty())
            return bad_request("tool_choice", "tool_choice: \"required\" needs a non-empty tools list");
        return std::nullopt;
    }
    if (e->get_object().get(o)) return wrong_type("tool_choice", "a string or an object", *e);
    const object_reader cr(o, "tool_choice");
    std::string type = "function";
    MS_API_TRY(cr.opt_string("type", type));
    if (type != "function")
        return bad_request(cr.path("type"), cr.path("type") + ": only \"function\" is supported, got " + single_quoted(type));
    std::optional<object_reader> fn;
    MS_API_TRY(cr.opt_object("function", fn));
    if (!fn) return bad_request(cr.path("function"), cr.path("function") + ": required");
    const auto name = fn->get("name");
    if (!name) return bad_request(fn->path("name"), fn->path("name") + ": required");
    MS_API_TRY(read_string(*name, fn->path("name"), out.function_name));
    bool found = false;
    for (const auto& t : tools) found = found || t.name == out.function_name;
    if (!found)
        return bad_request(fn->path("name"), fn->path("name") + ": no tool named " + json_escape(out.function_name) +
                                                 " in tools");
    out.kind = tool_choice::function;
    return std::nullopt;
}

// ---------------------------------------------------------------- generation options

maybe_error parse_stop(const object_reader& r, const parse_limits& limits, std::vector<std::string>& out) {
    const auto e = r.get("stop");
    if (!e) return std::nullopt;
    const auto add = [&](std::string_view s, const std::string& path) -> maybe_error {
        if (s.size() > limits.max_stop_bytes)
            return bad_request(path, path + ": a stop string may hold at most " + std::to_string(limits.max_stop_bytes) +
                                         " bytes, got " + std::to_string(s.size()));
        if (!s.empty()) out.emplace_back(s);
        return std::nullopt;
    };
    std::string_view s;
    if (e->get_string().get(s) == simdjson::SUCCESS) return add(s, "stop");
    array arr;
    if (e->get_array().get(arr)) return wrong_type("stop", "a string or an array of strings", *e);
    const size_t n = arr.size();
    if (n > limits.max_stop_strings)
        return bad_request("stop", "stop: at most " + std::to_string(limits.max_stop_strings) +
                                       " stop strings are supported, got " + std::to_string(n));
    out.reserve(n);
    size_t i = 0;
    for (element v : arr) {
        const std::string path = path_index("stop", i++);
        if (v.get_string().get(s)) return wrong_type(path, "a string", v);
        MS_API_TRY(add(s, path));
    }
    return std::nullopt;
}

maybe_error parse_length(const object_reader& r, int64_t& max_tokens) {
    std::optional<int64_t> n_predict, max_completion, max_tok;
    MS_API_TRY(r.opt_integer("n_predict", -1, k_int64_max, n_predict));
    MS_API_TRY(r.opt_integer("max_completion_tokens", 0, k_int64_max, max_completion));
    MS_API_TRY(r.opt_integer("max_tokens", 0, k_int64_max, max_tok));
    max_tokens = n_predict ? *n_predict : max_completion ? *max_completion : max_tok ? *max_tok : -1;
    return std::nullopt;
}

maybe_error parse_choice_count(const object_reader& r, int32_t& n) {
    for (std::string_view key : {std::string_view("n"), std::string_view("n_cmpl")}) {
        const auto e = r.get(key);
        if (!e) continue;
        int64_t v = 0;
        MS_API_TRY(read_integer(*e, r.path(key), v));
        if (v != 1)
            return bad_request(r.path(key), r.path(key) + ": only one choice per request (1) is supported, got " +
                                                std::to_string(v));
    }
    n = 1;
    return std::nullopt;
}

maybe_error parse_seed(const object_reader& r, completion_request& req) {
    const auto e = r.get("seed");
    if (!e) return std::nullopt;
    if (e->type() == simdjson::dom::element_type::UINT64) {  // above INT64_MAX, still a valid seed
        req.sampling.seed = e->get_uint64().value_unsafe();
        req.seed_given = true;
        return std::nullopt;
    }
    int64_t v = 0;
    MS_API_TRY(read_integer(*e, "seed", v));
    if (v < -1) return bad_request("seed", "seed: must be an integer >= 0, or -1 for a random seed, got " + std::to_string(v));
    req.seed_given = v >= 0;
    if (req.seed_given) req.sampling.seed = static_cast<uint64_t>(v);
    return std::nullopt;
}

// One logit_bias entry's bias: a number in [-100, 100], or false = ban.
maybe_error read_bias(element e, const std::string& path, float& bias) {
    bool b = true;
    if (e.get_bool().get(b) == simdjson::SUCCESS) {
        if (b) return bad_request(path, path + ": true is not a bias (use a number, or false to ban the token)");
        bias = -std::numeric_limits<float>::infinity();
        return std::nullopt;
    }
    if (!e.is_number()) return wrong_type(path, "a number in [-100, 100] or false", e);
    return read_float_in(e, path, real_range{-100.0, 100.0}, bias);
}

constexpr const char* k_bias_by_string = "logit_bias by string is not supported; use token ids";

maybe_error parse_logit_bias(const object_reader& r, const parse_limits& limits, std::vector<logit_bias_entry>& out) {
    const auto e = r.get("logit_bias");
    if (!e) return std::nullopt;
    const int64_t vocab = limits.vocab;
    object o;
    array arr;
    if (e->get_object().get(o) == simdjson::SUCCESS) {  // OpenAI: {"<token id>": bias}
        if (o.size() > limits.max_logit_bias)
            return bad_request("logit_bias", "logit_bias: at most " + std::to_string(limits.max_logit_bias) +
                                                 " entries are supported, got " + std::to_string(o.size()));
        out.reserve(o.size());
        for (const auto field : o) {
            const std::string_view k = field.key;
            const std::string path = path_key("logit_bias", k);
            bool digits = !k.empty() && k.size() <= 10;
            for (char c : k) digits = digits && c >= '0' && c <= '9';
            if (!digits) return bad_request("logit_bias", std::string(k_bias_by_string) + " (key " + json_escape(k) + ")");
            const int64_t id = std::stoll(std::string(k));
            if (id > k_int32_max || (vocab > 0 && id >= vocab))
                return bad_request("logit_bias", "logit_bias: token id " + std::string(k) + " is outside the vocabulary" +
                                                     (vocab > 0 ? " [0, " + std::to_string(vocab) + ")" : ""));
            logit_bias_entry entry;
            entry.token = static_cast<int32_t>(id);
            MS_API_TRY(read_bias(field.value, path, entry.bias));
            out.push_back(entry);
        }
        return std::nullopt;
    }
    if (e->get_array().get(arr)) return wrong_type("logit_bias", "an object or an array of [token id, bias] pairs", *e);
    // llama-server: [[token id, bias | false], ...]
    if (arr.size() > limits.max_logit_bias)
        return bad_request("logit_bias", "logit_bias: at most " + std::to_string(limits.max_logit_bias) +
                                             " entries are supported, got " + std::to_string(arr.size()));
    out.reserve(arr.size());
    size_t i = 0;
    for (element pair : arr) {
        const std::string path = path_index("logit_bias", i++);
        array p;
        if (pair.get_array().get(p)) return wrong_type(path, "a [token id, bias] pair", pair);
        if (p.size() != 2)
            return bad_request(path, path + ": expected a [token id, bias] pair, got " + std::to_string(p.size()) +
                                         " elements");
        const element id = p.at(0).value_unsafe();
        if (id.is_string()) return bad_request("logit_bias", std::string(k_bias_by_string) + " (at " + path + ")");
        logit_bias_entry entry;
        MS_API_TRY(read_token_id(id, path_index(path, 0), vocab, entry.token));
        MS_API_TRY(read_bias(p.at(1).value_unsafe(), path_index(path, 1), entry.bias));
        out.push_back(entry);
    }
    return std::nullopt;
}

maybe_error parse_sampling(const object_reader& r, api_route route, const parse_limits& limits,
                           completion_request& req) {
    sampling_params& s = req.sampling;
    const double max_temperature = is_native(route) ? 100.0 : 2.0;
    MS_API_TRY(r.opt_float("temperature", real_range{0.0, max_temperature}, s.temperature));
    std::optional<int64_t> top_k, repeat_last_n;
    MS_API_TRY(r.opt_integer("top_k", -1, k_int32_max, top_k));
    if (top_k) s.top_k = static_cast<int32_t>(std::max<int64_t>(*top_k, 0));  // -1 and 0: off
    MS_API_TRY(r.opt_float("top_p", real_range{0.0, 1.0, true}, s.top_p));
    MS_API_TRY(r.opt_float("min_p", real_range{0.0, 1.0}, s.min_p));
    MS_API_TRY(r.opt_float("presence_penalty", real_range{-2.0, 2.0}, s.presence_penalty));
    MS_API_TRY(r.opt_float("frequency_penalty", real_range{-2.0, 2.0}, s.frequency_penalty));
    const real_range positive{0.0, std::numeric_limits<double>::infinity(), true};
    // vLLM's name for the same multiplicative penalty; llama-server's name wins when both are sent.
    MS_API_TRY(r.opt_float("repetition_penalty", positive, s.repeat_penalty));
    MS_API_TRY(r.opt_float("repeat_penalty", positive, s.repeat_penalty));
    MS_API_TRY(r.opt_integer("repeat_last_n", -1, k_int32_max, repeat_last_n));
    if (repeat_last_n) s.repeat_last_n = static_cast<int32_t>(*repeat_last_n);
    MS_API_TRY(parse_seed(r, req));
    MS_API_TRY(parse_logit_bias(r, limits, s.logit_bias));
    return std::nullopt;
}

maybe_error parse_logprobs(const object_reader& r, api_route route, completion_request& req) {
    std::optional<int64_t> n_probs;
    MS_API_TRY(r.opt_integer("n_probs", 0, k_max_top_logprobs, n_probs));
    if (route == api_route::completions) {
        std::optional<int64_t> logprobs;
        MS_API_TRY(r.opt_integer("logprobs", 0, k_max_top_logprobs, logprobs));
        if (logprobs) {
            req.logprobs_enabled = true;
            req.n_probs = static_cast<int32_t>(*logprobs);
        }
    } else if (route == api_route::chat_completions) {
        bool logprobs = false;
        std::optional<int64_t> top;
        MS_API_TRY(r.opt_bool("logprobs", logprobs));
        MS_API_TRY(r.opt_integer("top_logprobs", 0, k_max_top_logprobs, top));
        if (top && *top > 0 && !logprobs)
            return bad_request("top_logprobs", "top_logprobs: needs \"logprobs\": true");
        req.logprobs_enabled = logprobs;
        req.n_probs = logprobs && top ? static_cast<int32_t>(*top) : 0;
    }
    if (n_probs) {
        req.n_probs = static_cast<int32_t>(*n_probs);
        req.logprobs_enabled = req.logprobs_enabled || *n_probs > 0;
    }
    req.sampling.n_probs = req.n_probs;
    return std::nullopt;
}

maybe_error parse_reasoning(const object_reader& r, completion_request& req) {
    std::string format;
    MS_API_TRY(r.opt_string("reasoning_format", format));
    if (format == "none") req.reasoning_in_content = true;
    else if (!format.empty() && format != "auto" && format != "deepseek" && format != "deepseek-legacy")
        return bad_request("reasoning_format", "reasoning_format: expected \"none\", \"auto\", \"deepseek\" or "
                                               "\"deepseek-legacy\", got " + json_escape(format));
    std::optional<object_reader> kwargs;
    MS_API_TRY(r.opt_object("chat_template_kwargs", kwargs));
    if (kwargs) {
        // "thinking" is the DeepSeek-V3.1 template's name; "enable_thinking" (Qwen's) wins.
        MS_API_TRY(kwargs->opt_bool("thinking", req.enable_thinking));
        MS_API_TRY(kwargs->opt_bool("enable_thinking", req.enable_thinking));
    }
    return std::nullopt;
}

maybe_error parse_common(const object_reader& r, const parse_limits& limits, completion_request& req) {
    MS_API_TRY(r.opt_string("model", req.model));
    MS_API_TRY(r.opt_bool("stream", req.stream));
    std::optional<object_reader> stream_options;
    MS_API_TRY(r.opt_object("stream_options", stream_options));
    if (stream_options) {
        bool include_usage = false;
        MS_API_TRY(stream_options->opt_bool("include_usage", include_usage));
        req.include_usage = req.stream && include_usage;
    }
    MS_API_TRY(parse_length(r, req.max_tokens));
    MS_API_TRY(parse_stop(r, limits, req.stop));
    MS_API_TRY(r.opt_bool("ignore_eos", req.ignore_eos));
    MS_API_TRY(parse_choice_count(r, req.n));
    MS_API_TRY(r.opt_bool("cache_prompt", req.cache_prompt));
    MS_API_TRY(r.opt_bool("return_timings", req.return_timings));
    std::optional<int64_t> n_max;
    MS_API_TRY(r.opt_integer("speculative.n_max", 0, k_int32_max, n_max));
    if (n_max) req.spec_n_max = *n_max;
    return std::nullopt;
}

maybe_error parse_infill(const object_reader& r, const parse_limits& limits, completion_request& req) {
    MS_API_TRY(r.opt_string("input_prefix", req.infill_prefix));
    MS_API_TRY(r.opt_string("input_suffix", req.suffix));
    if (const auto extra = r.get("input_extra")) {
        array arr;
        if (extra->get_array().get(arr)) return wrong_type("input_extra", "an array", *extra);
        if (arr.size() > limits.max_input_extra)
            return bad_request("input_extra", "input_extra: at most " + std::to_string(limits.max_input_extra) +
                                                  " entries are supported, got " + std::to_string(arr.size()));
        req.infill_extra.reserve(arr.size());
        size_t i = 0;
        for (element chunk : arr) {
            const std::string path = path_index("input_extra", i++);
            object o;
            if (chunk.get_object().get(o)) return wrong_type(path, "an object {filename, text}", chunk);
            const object_reader cr(o, path);
            std::string filename, text;
            MS_API_TRY(cr.opt_string("filename", filename));
            const auto t = cr.get("text");
            if (!t) return bad_request(cr.path("text"), cr.path("text") + ": required");
            MS_API_TRY(read_string(*t, cr.path("text"), text));
            req.infill_extra.emplace_back(std::move(filename), std::move(text));
        }
    }
    if (const auto p = r.get("prompt")) MS_API_TRY(parse_prompt(*p, "prompt", limits.vocab, req.prompt_text, req.prompt_tokens));
    return std::nullopt;
}

maybe_error parse_route_prompt(const object_reader& r, api_route route, const parse_limits& limits,
                               completion_request& req) {
    switch (route) {
        case api_route::chat_completions:
            MS_API_TRY(parse_messages(r, limits, req.messages));
            MS_API_TRY(parse_tools(r, limits, req.tools));
            MS_API_TRY(parse_tool_choice(r, req.tools, req.choice));
            MS_API_TRY(r.opt_bool("parallel_tool_calls", req.parallel_tool_calls));
            return parse_reasoning(r, req);
        case api_route::completions:
            MS_API_TRY(r.opt_bool("echo", req.echo));
            MS_API_TRY(r.opt_string("suffix", req.suffix));
            [[fallthrough]];
        case api_route::native_completion: {
            const auto p = r.get("prompt");
            if (!p) return bad_request("prompt", "prompt: required");
            return parse_prompt(*p, "prompt", limits.vocab, req.prompt_text, req.prompt_tokens);
        }
        case api_route::infill: return parse_infill(r, limits, req);
    }
    return std::nullopt;
}

}  // namespace

sampling_params default_sampling(api_route route) {
    sampling_params s;
    if (is_native(route)) {  // llama-server's defaults
        s.temperature = 0.8f;
        s.top_k = 40;
        s.top_p = 0.95f;
        s.min_p = 0.05f;
    } else {  // OpenAI's: temperature 1, no truncation
        s.temperature = 1.0f;
        s.top_k = 0;
        s.top_p = 1.0f;
        s.min_p = 0.0f;
    }
    return s;
}

api_result<completion_request> parse_completion_request(std::string_view body, api_route route,
                                                        const parse_limits& limits) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root.ok()) return root.error();
    const object_reader r(*root, "");

    completion_request req;
    req.route = route;
    req.sampling = default_sampling(route);
    MS_API_TRY(parse_route_prompt(r, route, limits, req));
    MS_API_TRY(parse_common(r, limits, req));
    MS_API_TRY(parse_sampling(r, route, limits, req));
    MS_API_TRY(parse_logprobs(r, route, req));
    // Every range above is at least as strict as the sampler's own check; this keeps them in step.
    const int64_t vocab = limits.vocab > 0 ? limits.vocab : k_int32_max;
    if (const status st = req.sampling.validate(vocab); !st.ok()) return bad_request("", st.message());
    return req;
}

api_result<tokenize_request> parse_tokenize_request(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root.ok()) return root.error();
    const object_reader r(*root, "");
    tokenize_request req;
    const auto content = r.get("content");
    if (!content) return bad_request("content", "content: required (the text to tokenize)");
    MS_API_TRY(read_string(*content, "content", req.content));
    MS_API_TRY(r.opt_bool("add_special", req.add_special));
    MS_API_TRY(r.opt_bool("parse_special", req.parse_special));
    MS_API_TRY(r.opt_bool("with_pieces", req.with_pieces));
    return req;
}

api_result<detokenize_request> parse_detokenize_request(std::string_view body, int64_t vocab) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root.ok()) return root.error();
    const object_reader r(*root, "");
    detokenize_request req;
    if (const auto tokens = r.get("tokens")) {
        array arr;
        if (tokens->get_array().get(arr)) return wrong_type("tokens", "an array of token ids", *tokens);
        req.tokens.reserve(arr.size());
        size_t i = 0;
        for (element t : arr) {
            int32_t id = 0;
            MS_API_TRY(read_token_id(t, path_index("tokens", i++), vocab, id));
            req.tokens.push_back(id);
        }
    }
    return req;
}

}  // namespace moestream::server
