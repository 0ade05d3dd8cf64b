// The part of a completion request that asks for a shape of output, read apart from the main
// parser (server/request.h, which ignores these fields): the handler calls both.
//
//   response_format   {"type": "text"} (the default: no constraint) | {"type": "json_object"}
//                     (the output is exactly one JSON object, see server/output_constraint.h);
//                     absent or null = text. {"type": "json_schema", ...} -> 400 (param
//                     "response_format") "response_format json_schema is not supported; use
//                     json_object"; llama-server's {"type": "json_object", "schema": {...}} -> 400
//                     (param "response_format.schema"), since the schema would not be enforced.
//                     Not an object, type missing or not a string, an unknown type -> 400 naming
//                     the field.
#pragma once

#include <string_view>

#include "server/api_error.h"

namespace moestream::server {

enum class output_format { text, json_object };

struct constraint_spec {
    output_format format = output_format::text;
};

// `body` is the whole request body (a JSON object; other bodies get the main parser's errors).
api_result<constraint_spec> parse_constraint_request(std::string_view body);

}  // namespace moestream::server
