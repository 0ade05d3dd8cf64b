// The part of a completion request that asks for a shape of output, read apart from the main
// parser (server/request.h, which ignores these fields): the handler calls both.
//
//   response_format   {"type": "text"} (the default: no constraint) | {"type": "json_object"}
//                     (the output is exactly one JSON object, see server/output_constraint.h) |
//                     {"type": "json_schema", "json_schema": {"name"?: string, "schema"?: schema,
//                     "strict"?: bool, "description"?: string}} (one object valid against the
//                     schema, server/json_schema.h; without a schema, any object). The flat form
//                     {"type": "json_schema", "name", "schema", ...} (the Responses API's) is
//                     read the same way. llama-server's {"type": "json_object", "schema": {...}}
//                     is json_schema. absent or null = text.
//                     The schema is always enforced exactly, whatever `strict` says: a keyword
//                     the subset does not support -> 400 naming it (param
//                     "response_format.json_schema.schema.<path>.<keyword>").
//                     Not an object, type missing or not a string, an unknown type, a field of
//                     the wrong type -> 400 naming the field.
//   json_schema       llama-server's top-level schema field (/completion): the same as a
//                     response_format json_schema with that schema; response_format wins.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/json_schema.h"

namespace moestream::server {

enum class output_format { text, json_object, json_schema };

struct constraint_spec {
    output_format format = output_format::text;
    std::shared_ptr<const json_schema> schema;  // json_schema: the compiled schema (root an object)
    std::string name;                           // json_schema: its name, when given
};

// `body` is the whole request body (a JSON object; other bodies get the main parser's errors).
api_result<constraint_spec> parse_constraint_request(std::string_view body);

// One format object on its own (routes that carry it under another name, e.g. the Responses
// API's text.format): either shape above; errors name `param` and the fields below it.
api_result<constraint_spec> parse_output_format(std::string_view format_json, std::string param);

}  // namespace moestream::server
