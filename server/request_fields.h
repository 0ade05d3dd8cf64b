// Private to the request parser (request.cpp): reading typed fields out of a simdjson DOM with
// errors that name the field path, and parsing a body into its root object with an error that
// says where the JSON is broken.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace moestream::server::detail {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

// No error, or the error that ends the parse.
using maybe_error = std::optional<api_error>;

// Returns the error from a function returning maybe_error or api_result<T>.
#define MS_API_TRY(expr)                                  \
    do {                                                  \
        if (auto ms_api_e_ = (expr)) return std::move(*ms_api_e_); \
    } while (0)

// "parent.key" / "key" and "parent[i]": field paths for `param` and messages.
std::string path_key(std::string_view parent, std::string_view key);
std::string path_index(std::string_view parent, size_t i);

// "string", "number", "boolean", "array", "object", "null".
const char* json_type_name(element e);
// 400 "<path>: expected <expected>, got <type>".
api_error wrong_type(std::string_view path, std::string_view expected, element got);
// Shortest round-trip text of a double, for messages.
std::string format_number(double v);

// Value readers: the value at `path` must have the type, else a wrong_type error.
maybe_error read_string(element e, std::string_view path, std::string& out);
maybe_error read_bool(element e, std::string_view path, bool& out);
maybe_error read_number(element e, std::string_view path, double& out);
// An integer, or a decimal with an integral value (100.0); out of int64_t -> 400 out of range.
maybe_error read_integer(element e, std::string_view path, int64_t& out);
// An integer in [lo, hi] (message "must be in [lo, hi]" or "must be >= lo").
maybe_error read_integer_in(element e, std::string_view path, int64_t lo, int64_t hi, int64_t& out);
// A token id: an integer in [0, vocab) (vocab <= 0: [0, 2^31)).
maybe_error read_token_id(element e, std::string_view path, int64_t vocab, int32_t& out);

// A number in a range, converted to float. lo_open / hi_open: the bound itself is excluded.
struct real_range {
    double lo, hi;
    bool lo_open = false, hi_open = false;
};
maybe_error read_float_in(element e, std::string_view path, const real_range& range, float& out);

// The fields of one JSON object, with the object's own path for messages.
class object_reader {
public:
    object_reader(object o, std::string path) : obj_(o), path_(std::move(path)) {}

    // The value of `key`, or nullopt when it is absent or null (null means "use the default").
    std::optional<element> get(std::string_view key) const;
    std::string path(std::string_view key) const { return path_key(path_, key); }
    const std::string& own_path() const { return path_; }
    object raw() const { return obj_; }

    // Optional fields: `out` is left unchanged when the field is absent or null.
    maybe_error opt_string(std::string_view key, std::string& out) const;
    maybe_error opt_bool(std::string_view key, bool& out) const;
    maybe_error opt_float(std::string_view key, const real_range& range, float& out) const;
    maybe_error opt_integer(std::string_view key, int64_t lo, int64_t hi, std::optional<int64_t>& out) const;
    // An object field, or nullopt when absent or null; another type -> wrong_type.
    maybe_error opt_object(std::string_view key, std::optional<object_reader>& out) const;

private:
    object obj_;
    std::string path_;
};

// Parses `body` with `parser` (which owns the returned DOM) and returns its root object. A
// leading UTF-8 byte order mark is skipped. Errors: empty body, invalid UTF-8, malformed JSON
// (with the byte offset and the path of the first error), a root that is not an object.
api_result<object> parse_body_object(simdjson::dom::parser& parser, std::string_view body);

// Where a text simdjson rejected is broken: the byte offset, the path of the value being read
// there ("" at the root) and what is wrong. nullopt when no error is found (then simdjson's own
// message is all there is). Runs in linear time and bounded memory (nesting capped at
// simdjson's depth limit).
struct json_error_location {
    size_t offset = 0;
    std::string path;
    std::string what;
    bool invalid_utf8 = false;
};
std::optional<json_error_location> locate_json_error(std::string_view text);

}  // namespace moestream::server::detail
