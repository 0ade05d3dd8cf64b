#include "server/constraint_request.h"

#include <spdlog/spdlog.h>

#include "server/output_constraint.h"
#include "server/request_fields.h"

namespace moestream::server {

using namespace detail;

namespace {

// The schema's JSON text compiled exactly, or any object when there is none.
api_result<constraint_spec> schema_spec(std::optional<element> schema, const std::string& param, std::string name) {
    constraint_spec spec;
    spec.name = std::move(name);
    if (!schema) {
        spec.format = output_format::json_object;
        return spec;
    }
    if (!schema->is_object() && !schema->is_bool()) return wrong_type(param, "a JSON schema object", *schema);
    auto compiled = json_schema::compile(simdjson::minify(*schema), param, schema_mode::exact);
    if (!compiled) return compiled.error();
    spec.format = output_format::json_schema;
    spec.schema = std::move(*compiled);
    return spec;
}

api_result<constraint_spec> read_format(const object_reader& format) {
    constraint_spec spec;
    const auto type = format.get("type");
    if (!type)
        return bad_request(format.path("type"), format.path("type") + ": required (text, json_object or json_schema)");
    std::string name;
    if (auto e = read_string(*type, format.path("type"), name)) return std::move(*e);
    if (name == "text") return spec;
    if (name == "json_object") {
        // llama-server's form of a schema.
        if (const auto schema = format.get("schema")) return schema_spec(schema, format.path("schema"), "");
        spec.format = output_format::json_object;
        return spec;
    }
    if (name != "json_schema")
        return bad_request(format.path("type"), format.path("type") + ": unknown type '" + name +
                                                    "' (expected text, json_object or json_schema)");
    // Chat nests the schema's fields in "json_schema"; the Responses API writes them flat.
    std::optional<object_reader> nested;
    if (auto e = format.opt_object("json_schema", nested)) return std::move(*e);
    const object_reader& fields = nested ? *nested : format;
    std::string schema_name;
    bool strict = false;
    if (auto e = fields.opt_string("name", schema_name)) return std::move(*e);
    if (auto e = fields.opt_bool("strict", strict)) return std::move(*e);
    std::string description;
    if (auto e = fields.opt_string("description", description)) return std::move(*e);
    return schema_spec(fields.get("schema"), fields.path("schema"), std::move(schema_name));
}

}  // namespace

api_result<constraint_spec> parse_constraint_request(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root) return root.error();
    const object_reader request(*root, "");
    std::optional<object_reader> format;
    if (auto e = request.opt_object("response_format", format)) return std::move(*e);
    if (format) {
        auto spec = read_format(*format);
        if (!spec || spec->format != output_format::text) return spec;
    }
    if (const auto schema = request.get("json_schema")) return schema_spec(schema, "json_schema", "");
    return constraint_spec{};
}

api_result<constraint_spec> parse_output_format(std::string_view format_json, std::string param) {
    simdjson::dom::parser parser;
    simdjson::dom::element e;
    if (parser.parse(simdjson::padded_string(format_json)).get(e) != simdjson::SUCCESS)
        return bad_request(param, param + ": not valid JSON");
    simdjson::dom::object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) return wrong_type(param, "an object", e);
    return read_format(object_reader(o, std::move(param)));
}

// ---- which constraint a request gets ---------------------------------------------------------------

api_result<std::shared_ptr<token_constraint>> constraint_for_request(const completion_request& r,
                                                                     const constraint_spec& spec,
                                                                     const tokenizer* tok, int64_t max_tokens,
                                                                     bool starts_in_reasoning) {
    using result = api_result<std::shared_ptr<token_constraint>>;
    const bool tools_on =
        r.route == api_route::chat_completions && !r.tools.empty() && r.choice.kind != tool_choice::none;
    const bool forced = tools_on && (r.choice.kind == tool_choice::required || r.choice.kind == tool_choice::function);
    const bool json = spec.format != output_format::text;
    const bool strict_tools = tools_on && r.choice.kind == tool_choice::auto_ &&
                              std::any_of(r.tools.begin(), r.tools.end(), [](const auto& t) { return t.strict; });
    if (!forced && !json && !strict_tools) return result(std::shared_ptr<token_constraint>());
    if (!tok) {
        return bad_request(forced ? "tool_choice" : json ? "response_format" : "tools",
                           "this model has no tokenizer, which constrained output needs");
    }
    constraint_limits limits;
    limits.max_tokens = max_tokens;
    auto table = token_table::of(*tok);
    using reasoning = output_constraint::reasoning_start;
    // An output that starts inside the reasoning closes it before a forced shape, unless the
    // reasoning is content anyway (reasoning_format none).
    const bool close_reasoning = starts_in_reasoning && !r.reasoning_in_content;
    if (json && !forced) {
        auto c = json_output_constraint(std::move(table), *tok, limits, spec.schema, close_reasoning);
        return result(std::shared_ptr<token_constraint>(std::move(c)));
    }
    // The tools whose calls are constrained, each with its schema: every allowed one for a forced
    // call (non-strict ones leniently), the strict ones for lazy calls.
    std::vector<tool_spec> tools;
    for (size_t i = 0; i < r.tools.size(); ++i) {
        const auto& t = r.tools[i];
        if (forced && r.choice.kind == tool_choice::function && t.name != r.choice.function_name) continue;
        tool_spec s{t.name, nullptr};
        if (forced || t.strict) {
            const std::string param =
                t.schema_param.empty() ? "tools[" + std::to_string(i) + "].function.parameters" : t.schema_param;
            const auto mode = t.strict ? schema_mode::exact : schema_mode::lenient;
            auto schema = json_schema::compile(t.parameters_json, param, mode);
            if (!schema) return schema.error();
            for (const auto& d : (*schema)->dropped())
                spdlog::warn("tool {}: {} is not enforced (the tool is not strict)", t.name, d);
            s.schema = std::move(*schema);
        }
        tools.push_back(std::move(s));
    }
    tool_call_options options;
    if (forced) {
        options.reasoning = close_reasoning ? reasoning::open : reasoning::none;
    } else {
        options.lazy = true;
        options.parallel = r.parallel_tool_calls;
        options.reasoning = r.reasoning_in_content ? reasoning::none
                            : starts_in_reasoning  ? reasoning::open
                                                   : reasoning::may_open;
    }
    auto c = tool_call_constraint(std::move(table), *tok, std::move(tools), limits, options);
    return result(std::shared_ptr<token_constraint>(std::move(c)));
}

}  // namespace moestream::server
