// Private to server/json_schema*.cpp: the compiler of json_schema (one pass over the schema
// document: json_schema.cpp has the structure, $ref and unions; json_schema_keywords.cpp reads
// the keywords of one node) and the helpers both files use.
#pragma once

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "server/api_error.h"
#include "server/json_schema.h"

namespace moestream::server {

namespace schema_detail {

using scaled = json_schema::scaled;

inline constexpr uint32_t k_none = json_schema::k_none;
inline constexpr uint32_t k_any = 0;               // node 0 is the schema `true`: any value
inline constexpr uint32_t k_never = k_none - 1;    // the schema `false` (only while compiling)
inline constexpr uint32_t k_saturated = 1u << 30;  // lengths are capped here (far beyond any budget)

inline scaled pow10(int k) {
    static const auto table = [] {
        std::array<scaled, 32> t{};
        t[0] = 1;
        for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] * 10;
        return t;
    }();
    return table[size_t(k)];
}
inline const scaled k_scale = json_schema::k_scale;
// The largest magnitude a generated number reaches: 15 integer digits, 15 fraction digits.
inline const scaled k_reach = pow10(30) - 1;

inline uint32_t sat_add(uint32_t a, uint64_t b) {
    return uint32_t(std::min<uint64_t>(uint64_t(a) + b, k_saturated));
}

// The assertions this subset cannot enforce (annotations, and keywords JSON Schema does not
// define, are ignored: json_schema.h).
inline bool is_unsupported(std::string_view k) {
    static const std::unordered_set<std::string_view> names = {"pattern",
                                                               "patternProperties",
                                                               "propertyNames",
                                                               "minProperties",
                                                               "maxProperties",
                                                               "dependentRequired",
                                                               "dependentSchemas",
                                                               "dependencies",
                                                               "if",
                                                               "then",
                                                               "else",
                                                               "not",
                                                               "multipleOf",
                                                               "contains",
                                                               "minContains",
                                                               "maxContains",
                                                               "prefixItems",
                                                               "additionalItems",
                                                               "unevaluatedProperties",
                                                               "unevaluatedItems",
                                                               "$dynamicRef",
                                                               "$recursiveRef",
                                                               "$recursiveAnchor",
                                                               "contentSchema"};
    return names.contains(k);
}
inline bool is_object_keyword(std::string_view k) {
    return k == "properties" || k == "required" || k == "additionalProperties";
}
inline bool is_array_keyword(std::string_view k) {
    return k == "items" || k == "minItems" || k == "maxItems";
}
inline bool is_string_keyword(std::string_view k) {
    return k == "minLength" || k == "maxLength";
}
inline bool is_number_keyword(std::string_view k) {
    return k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum";
}

// ceil / floor of x * 10^15, exactly (x is a double: mantissa * 2^exponent), clamped to what a
// generated number can reach.
inline scaled scaled_round(double x, bool up) {
    if (x == 0) return 0;
    if (x > 1e16) return up ? k_reach + 1 : k_reach;
    if (x < -1e16) return up ? -k_reach : -k_reach - 1;
    int e = 0;
    const double f = std::frexp(std::fabs(x), &e);
    const int64_t mantissa = int64_t(std::ldexp(f, 53));
    const int shift = e - 53;  // |x| = mantissa * 2^shift
    scaled magnitude = scaled(mantissa) * k_scale;
    bool inexact = false;
    if (shift >= 0) {
        magnitude <<= shift;  // |x| <= 1e16: stays below 2^110
    } else if (-shift >= 120) {
        inexact = magnitude != 0;
        magnitude = 0;
    } else {
        const scaled whole = magnitude >> -shift;
        inexact = (whole << -shift) != magnitude;
        magnitude = whole;
    }
    // magnitude = floor(|x| * 10^15); rounding away from zero for a positive x going up, etc.
    const bool negative = x < 0;
    scaled v = negative ? -magnitude : magnitude;
    if (inexact && up && !negative) v += 1;
    if (inexact && !up && negative) v -= 1;
    return std::clamp(v, -k_reach - 1, k_reach + 1);
}

inline scaled floor_div(scaled a, scaled b) {  // b > 0
    scaled q = a / b;
    if ((a % b != 0) && (a < 0)) --q;
    return q;
}
inline scaled ceil_div(scaled a, scaled b) {
    return -floor_div(-a, b);
}

// Magnitudes a + k * step (0 <= k, value <= b) with a value in [lo, hi] (signed by `negative`).
inline bool progression_hits(scaled a, scaled b, scaled step, bool negative, scaled lo, scaled hi) {
    if (a > b) return false;
    scaled mlo = negative ? -hi : lo, mhi = negative ? -lo : hi;  // bounds on the magnitude
    mlo = std::max(mlo, a);
    mhi = std::min(mhi, b);
    if (mlo > mhi) return false;
    const scaled k = ceil_div(mlo - a, step);
    return a + k * step <= mhi;
}

inline std::string escape_bar(std::string text) {
    // U+FF5C raw in a string would be marker text to a tool-call parser (output_constraint.h).
    for (size_t at = text.find("\xEF\xBD\x9C"); at != std::string::npos; at = text.find("\xEF\xBD\x9C", at))
        text.replace(at, 3, "\\uff5c");
    return text;
}

inline size_t code_points(std::string_view s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

inline uint8_t value_type(simdjson::dom::element e) {
    switch (e.type()) {
        case simdjson::dom::element_type::NULL_VALUE:
            return schema_types::null;
        case simdjson::dom::element_type::BOOL:
            return schema_types::boolean;
        case simdjson::dom::element_type::OBJECT:
            return schema_types::object;
        case simdjson::dom::element_type::ARRAY:
            return schema_types::array;
        case simdjson::dom::element_type::STRING:
            return schema_types::string;
        default:
            return schema_types::number;
    }
}

inline bool is_integral(simdjson::dom::element e) {
    if (e.type() == simdjson::dom::element_type::INT64 || e.type() == simdjson::dom::element_type::UINT64)
        return true;
    double d = 0;
    return e.get_double().get(d) == simdjson::SUCCESS && std::isfinite(d) && std::floor(d) == d;
}

}  // namespace schema_detail

class schema_compiler {
  public:
    using maybe_error = std::optional<api_error>;
    schema_compiler(simdjson::dom::element document, std::string param, schema_mode mode, json_schema& out)
        : doc_(document), param_(std::move(param)), mode_(mode), out_(out) {
        json_schema::node any;  // node 0: `true`
        any.free_object = true;
        any.free_array = true;
        any.additional = schema_detail::k_any;
        any.items = schema_detail::k_any;
        out_.nodes_.push_back(any);
        out_.tries_.push_back({});  // trie index 0 is never a node (0 means "no child")
    }

    api_result<uint32_t> compile(simdjson::dom::element e, const std::string& path);
    api_result<uint32_t> restrict_to_objects(uint32_t n, const std::string& path);
    maybe_error finish();

  private:
    api_error refuse(const std::string& path, std::string why) const {
        return bad_request(path, path + ": " + why);
    }
    // An assertion this subset cannot enforce: a 400 (exact) or dropped (lenient).
    maybe_error unsupported(const std::string& path, std::string_view keyword, std::string why = {}) {
        if (mode_ == schema_mode::lenient) {
            out_.dropped_.push_back(path);
            return std::nullopt;
        }
        return refuse(
            path, "the JSON Schema keyword '" + std::string(keyword) + "' is not supported" +
                      (why.empty() ? std::string() : " (" + why + ")") +
                      "; constrained output supports type, enum, const, properties, required, "
                      "additionalProperties, items, minItems, maxItems, minLength, maxLength, "
                      "minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf, oneOf and local $ref");
    }
    api_result<uint32_t> add(json_schema::node n, const std::string& path) {
        if (out_.nodes_.size() >= json_schema::k_max_nodes)
            return refuse(path, "the schema is too large (more than " +
                                    std::to_string(json_schema::k_max_nodes) + " parts)");
        out_.nodes_.push_back(std::move(n));
        return uint32_t(out_.nodes_.size() - 1);
    }
    api_result<uint32_t> compile_ref(std::string_view ref, const std::string& path);
    api_result<uint32_t> compile_union(simdjson::dom::array alts, const std::string& path, bool nullable);
    maybe_error read_types(simdjson::dom::object o, const std::string& path, json_schema::node& n,
                           bool& typed);
    maybe_error read_literals(simdjson::dom::object o, const std::string& path, json_schema::node& n,
                              bool typed);
    maybe_error read_string_bounds(simdjson::dom::object o, const std::string& path, json_schema::node& n);
    maybe_error read_number_bounds(simdjson::dom::object o, const std::string& path, json_schema::node& n);
    maybe_error read_object(simdjson::dom::object o, const std::string& path, json_schema::node& n);
    maybe_error read_array(simdjson::dom::object o, const std::string& path, json_schema::node& n);
    maybe_error read_count(simdjson::dom::object o, std::string_view key, const std::string& path,
                           uint32_t& out, uint32_t cap);
    uint32_t add_trie(uint32_t root, std::string_view bytes);
    bool literal_fits(simdjson::dom::element v, const json_schema::node& n) const;

    simdjson::dom::element doc_;
    std::string param_;
    schema_mode mode_;
    json_schema& out_;
    std::unordered_map<std::string, uint32_t> refs_;  // compiled $ref targets
    std::vector<std::string> ref_stack_;              // those being compiled (recursion)
};

}  // namespace moestream::server
