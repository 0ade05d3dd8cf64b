#include "server/constraint_request.h"

#include "server/request_fields.h"

namespace moestream::server {

using namespace detail;

api_result<constraint_spec> parse_constraint_request(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_body_object(parser, body);
    if (!root) return root.error();
    const object_reader request(*root, "");
    constraint_spec spec;
    std::optional<object_reader> format;
    if (auto e = request.opt_object("response_format", format)) return std::move(*e);
    if (!format) return spec;
    const auto type = format->get("type");
    if (!type) return bad_request(format->path("type"), format->path("type") + ": required (text or json_object)");
    std::string name;
    if (auto e = read_string(*type, format->path("type"), name)) return std::move(*e);
    if (name == "json_schema")
        return bad_request(format->own_path(), "response_format json_schema is not supported; use json_object");
    if (name == "text") return spec;
    if (name != "json_object")
        return bad_request(format->path("type"),
                           format->path("type") + ": unknown type '" + name + "' (expected text or json_object)");
    if (format->get("schema"))
        return bad_request(format->path("schema"), format->path("schema") +
                                                       ": JSON schemas are not supported; only a JSON object is enforced");
    spec.format = output_format::json_object;
    return spec;
}

}  // namespace moestream::server
