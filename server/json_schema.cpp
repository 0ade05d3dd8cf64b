// JSON Schema -> json_schema (the subset and its rules are in json_schema.h). One recursive pass
// over the schema document builds the nodes (a $ref target is compiled once and shared, so the
// nodes form a DAG); a second pass works out what the automaton needs from each node: the
// shortest valid value, the bytes the required properties still take, the nesting depth.
#include "server/json_schema.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "server/json_writer.h"
#include "server/request_fields.h"

namespace moestream::server {

using detail::path_index;
using detail::path_key;
using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;
using scaled = json_schema::scaled;

namespace {

constexpr uint32_t k_none = json_schema::k_none;
constexpr uint32_t k_any = 0;               // node 0 is the schema `true`: any value
constexpr uint32_t k_never = k_none - 1;    // the schema `false` (only while compiling)
constexpr uint32_t k_saturated = 1u << 30;  // lengths are capped here (far beyond any budget)

scaled pow10(int k) {
    static const auto table = [] {
        std::array<scaled, 32> t{};
        t[0] = 1;
        for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] * 10;
        return t;
    }();
    return table[size_t(k)];
}
const scaled k_scale = json_schema::k_scale;
// The largest magnitude a generated number reaches: 15 integer digits, 15 fraction digits.
const scaled k_reach = pow10(30) - 1;

uint32_t sat_add(uint32_t a, uint64_t b) {
    return uint32_t(std::min<uint64_t>(uint64_t(a) + b, k_saturated));
}

// The assertions this subset cannot enforce (annotations, and keywords JSON Schema does not
// define, are ignored: json_schema.h).
bool is_unsupported(std::string_view k) {
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
bool is_object_keyword(std::string_view k) {
    return k == "properties" || k == "required" || k == "additionalProperties";
}
bool is_array_keyword(std::string_view k) {
    return k == "items" || k == "minItems" || k == "maxItems";
}
bool is_string_keyword(std::string_view k) {
    return k == "minLength" || k == "maxLength";
}
bool is_number_keyword(std::string_view k) {
    return k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum";
}

// ceil / floor of x * 10^15, exactly (x is a double: mantissa * 2^exponent), clamped to what a
// generated number can reach.
scaled scaled_round(double x, bool up) {
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

scaled floor_div(scaled a, scaled b) {  // b > 0
    scaled q = a / b;
    if ((a % b != 0) && (a < 0)) --q;
    return q;
}
scaled ceil_div(scaled a, scaled b) {
    return -floor_div(-a, b);
}

// Magnitudes a + k * step (0 <= k, value <= b) with a value in [lo, hi] (signed by `negative`).
bool progression_hits(scaled a, scaled b, scaled step, bool negative, scaled lo, scaled hi) {
    if (a > b) return false;
    scaled mlo = negative ? -hi : lo, mhi = negative ? -lo : hi;  // bounds on the magnitude
    mlo = std::max(mlo, a);
    mhi = std::min(mhi, b);
    if (mlo > mhi) return false;
    const scaled k = ceil_div(mlo - a, step);
    return a + k * step <= mhi;
}

std::string escape_bar(std::string text) {
    // U+FF5C raw in a string would be marker text to a tool-call parser (output_constraint.h).
    for (size_t at = text.find("\xEF\xBD\x9C"); at != std::string::npos; at = text.find("\xEF\xBD\x9C", at))
        text.replace(at, 3, "\\uff5c");
    return text;
}

size_t code_points(std::string_view s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

uint8_t value_type(element e) {
    switch (e.type()) {
        case element_type::NULL_VALUE:
            return schema_types::null;
        case element_type::BOOL:
            return schema_types::boolean;
        case element_type::OBJECT:
            return schema_types::object;
        case element_type::ARRAY:
            return schema_types::array;
        case element_type::STRING:
            return schema_types::string;
        default:
            return schema_types::number;
    }
}

bool is_integral(element e) {
    if (e.type() == element_type::INT64 || e.type() == element_type::UINT64) return true;
    double d = 0;
    return e.get_double().get(d) == simdjson::SUCCESS && std::isfinite(d) && std::floor(d) == d;
}

}  // namespace

// ---- the number completions --------------------------------------------------------------------

uint32_t json_schema::number_rest(const node& n, const number_prefix& p) {
    if (!p.negative && !p.fraction && p.int_digits == 0) {  // nothing written yet: '-' is a choice too
        number_prefix positive = p, negative = p;
        positive.int_digits = 0;
        negative.negative = true;
        const uint32_t a = number_rest_signed(n, positive), b = number_rest_signed(n, negative);
        return b == k_none ? a : a == k_none ? b + 1 : std::min(a, b + 1);
    }
    return number_rest_signed(n, p);
}

uint32_t json_schema::number_rest_signed(const node& n, const number_prefix& p) {
    const scaled lo = n.bounded ? n.lo : -k_reach, hi = n.bounded ? n.hi : k_reach;
    if (p.fraction) {
        // Value so far v.f; g more fraction digits reach every multiple of 10^(15-f-g) in
        // [base, base + 10^(15-f) - step].
        const scaled base = scaled(p.int_value) * k_scale + scaled(p.frac_value) * pow10(15 - p.frac_digits);
        for (int g = p.frac_digits == 0 ? 1 : 0; p.frac_digits + g <= 15; ++g) {
            const scaled step = pow10(15 - p.frac_digits - g);
            if (progression_hits(base, base + pow10(15 - p.frac_digits) - step, step, p.negative, lo, hi))
                return uint32_t(g);
        }
        return k_none;
    }
    const bool leading_zero = p.int_digits == 1 && p.int_value == 0;
    const int m_min = p.int_digits == 0 ? 1 : 0;
    const int m_max = leading_zero ? 0 : 15 - p.int_digits;
    // In order of cost: m more integer digits, then (not for integers) '.' and g digits.
    for (int cost = m_min; cost <= m_max + 16; ++cost) {
        for (int m = m_min; m <= std::min(cost, m_max); ++m) {
            const int rest = cost - m;
            const int g = rest == 0 ? 0 : rest - 1;
            if (rest == 1 || (g > 0 && (n.integer || g > 15))) continue;
            // The integer parts m more digits give.
            scaled first, last;
            if (p.int_digits == 0) {
                first = m == 1 ? 0 : pow10(m - 1);
                last = pow10(m) - 1;
            } else {
                first = scaled(p.int_value) * pow10(m);
                last = first + pow10(m) - 1;
            }
            const scaled step = g == 0 ? k_scale : pow10(15 - g);
            const scaled a = first * k_scale, b = g == 0 ? last * k_scale : (last + 1) * k_scale - step;
            if (progression_hits(a, b, step, p.negative, lo, hi)) return uint32_t(cost);
        }
    }
    return k_none;
}

// ---- compiling -------------------------------------------------------------------------------------

class schema_compiler {
  public:
    using maybe_error = std::optional<api_error>;
    schema_compiler(element document, std::string param, schema_mode mode, json_schema& out)
        : doc_(document), param_(std::move(param)), mode_(mode), out_(out) {
        json_schema::node any;  // node 0: `true`
        any.free_object = true;
        any.free_array = true;
        any.additional = k_any;
        any.items = k_any;
        out_.nodes_.push_back(any);
        out_.tries_.push_back({});  // trie index 0 is never a node (0 means "no child")
    }

    api_result<uint32_t> compile(element e, const std::string& path);
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
    api_result<uint32_t> compile_union(array alts, const std::string& path, bool nullable);
    maybe_error read_types(object o, const std::string& path, json_schema::node& n, bool& typed);
    maybe_error read_literals(object o, const std::string& path, json_schema::node& n, bool typed);
    maybe_error read_string_bounds(object o, const std::string& path, json_schema::node& n);
    maybe_error read_number_bounds(object o, const std::string& path, json_schema::node& n);
    maybe_error read_object(object o, const std::string& path, json_schema::node& n);
    maybe_error read_array(object o, const std::string& path, json_schema::node& n);
    maybe_error read_count(object o, std::string_view key, const std::string& path, uint32_t& out,
                           uint32_t cap);
    uint32_t add_trie(uint32_t root, std::string_view bytes);
    bool literal_fits(element v, const json_schema::node& n) const;

    element doc_;
    std::string param_;
    schema_mode mode_;
    json_schema& out_;
    std::unordered_map<std::string, uint32_t> refs_;  // compiled $ref targets
    std::vector<std::string> ref_stack_;              // those being compiled (recursion)
};

uint32_t schema_compiler::add_trie(uint32_t root, std::string_view bytes) {
    auto& t = out_.tries_;
    if (root == k_none) {
        root = uint32_t(t.size());
        t.push_back({});
    }
    uint32_t at = root;
    for (char ch : bytes) {
        uint32_t c = out_.child(at, uint8_t(ch));
        if (c == 0) {
            c = uint32_t(t.size());
            json_schema::trie_node node;
            node.byte = uint8_t(ch);
            node.depth = uint16_t(t[at].depth + 1);
            node.next_sibling = t[at].first_child;
            t.push_back(node);
            t[at].first_child = c;
        }
        at = c;
    }
    t[at].end = true;
    return root;
}

api_result<uint32_t> schema_compiler::compile_ref(std::string_view ref, const std::string& path) {
    if (!ref.starts_with("#")) {
        if (auto e =
                unsupported(path, "$ref", "only references into the same document (\"#/...\") are supported"))
            return *e;
        return k_any;
    }
    const std::string key(ref);
    if (auto it = refs_.find(key); it != refs_.end()) return it->second;
    if (std::find(ref_stack_.begin(), ref_stack_.end(), key) != ref_stack_.end()) {
        if (auto e = unsupported(path, "$ref", "a recursive reference (" + key + ")")) return *e;
        return k_any;
    }
    // A JSON pointer (RFC 6901) after the '#'.
    element at = doc_;
    std::string target_path = param_;  // where the target sits in the document, for its errors
    std::string_view rest = ref.substr(1);
    while (!rest.empty()) {
        if (rest[0] != '/') return refuse(path, "$ref " + json_escape(ref) + " is not a JSON pointer");
        rest.remove_prefix(1);
        const size_t end = std::min(rest.find('/'), rest.size());
        std::string token(rest.substr(0, end));
        rest.remove_prefix(end);
        for (size_t i = 0; (i = token.find('~', i)) != std::string::npos; ++i) {
            if (i + 1 < token.size() && token[i + 1] == '1')
                token.replace(i, 2, "/");
            else if (i + 1 < token.size() && token[i + 1] == '0')
                token.replace(i, 2, "~");
        }
        element next;
        object o;
        array a;
        if (at.get_object().get(o) == simdjson::SUCCESS) {
            if (o.at_key(token).get(next) != simdjson::SUCCESS)
                return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        } else if (at.get_array().get(a) == simdjson::SUCCESS) {
            size_t i = 0;
            bool digits = !token.empty();
            for (char c : token) digits = digits && c >= '0' && c <= '9';
            if (!digits || (i = std::stoul(token)) >= a.size() || a.at(i).get(next) != simdjson::SUCCESS)
                return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        } else {
            return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        }
        at = next;
        target_path = path_key(target_path, token);
    }
    ref_stack_.push_back(key);
    auto n = compile(at, target_path);
    ref_stack_.pop_back();
    if (n) refs_[key] = *n;
    return n;
}

api_result<uint32_t> schema_compiler::compile_union(array alts, const std::string& path, bool nullable) {
    if (alts.size() == 0) return refuse(path, "must not be empty");
    std::vector<uint32_t> flat;
    size_t i = 0;
    for (element alt : alts) {
        auto n = compile(alt, path_index(path, i++));
        if (!n) return n.error();
        if (*n == k_never) continue;
        if (*n == k_any) return k_any;  // one alternative allows everything
        const auto& node = out_.nodes_[*n];
        for (uint32_t x : node.is_union() ? node.alternatives : std::vector<uint32_t>{*n})
            if (std::find(flat.begin(), flat.end(), x) == flat.end()) flat.push_back(x);
    }
    if (nullable) {
        json_schema::node null_node;
        null_node.types = schema_types::null;
        auto n = add(null_node, path);
        if (!n) return n.error();
        flat.push_back(*n);
    }
    if (flat.empty()) return k_never;
    if (flat.size() == 1) return flat[0];
    if (flat.size() > 64) return refuse(path, "more than 64 alternatives are not supported");
    json_schema::node u;
    u.alternatives = std::move(flat);
    return add(std::move(u), path);
}

schema_compiler::maybe_error schema_compiler::read_count(object o, std::string_view key,
                                                         const std::string& path, uint32_t& out,
                                                         uint32_t cap) {
    element v;
    if (o.at_key(key).get(v) != simdjson::SUCCESS) return std::nullopt;
    const std::string p = path_key(path, key);
    int64_t n = 0;
    if (auto e = detail::read_integer(v, p, n)) return e;
    if (n < 0) return refuse(p, "must be a non-negative integer");
    out = uint32_t(std::min<int64_t>(n, cap));
    return std::nullopt;
}

schema_compiler::maybe_error schema_compiler::read_types(object o, const std::string& path,
                                                         json_schema::node& n, bool& typed) {
    element t;
    typed = o.at_key("type").get(t) == simdjson::SUCCESS;
    if (typed) {
        const std::string p = path_key(path, "type");
        std::vector<std::string_view> names;
        std::string_view s;
        array a;
        if (t.get_string().get(s) == simdjson::SUCCESS) {
            names.push_back(s);
        } else if (t.get_array().get(a) == simdjson::SUCCESS && a.size() > 0) {
            for (element x : a) {
                if (x.get_string().get(s) != simdjson::SUCCESS)
                    return detail::wrong_type(p, "an array of type names", x);
                names.push_back(s);
            }
        } else {
            return detail::wrong_type(p, "a type name or a non-empty array of them", t);
        }
        uint8_t types = 0;
        bool number = false, integer = false;
        for (std::string_view name : names) {
            if (name == "null")
                types |= schema_types::null;
            else if (name == "boolean")
                types |= schema_types::boolean;
            else if (name == "object")
                types |= schema_types::object;
            else if (name == "array")
                types |= schema_types::array;
            else if (name == "string")
                types |= schema_types::string;
            else if (name == "number")
                number = true;
            else if (name == "integer")
                integer = true;
            else
                return refuse(p, "unknown type " + json_escape(name) +
                                     " (expected null, boolean, object, array, string, number or integer)");
        }
        if (number || integer) types |= schema_types::number;
        n.types = types;
        n.integer = integer && !number;
    } else {
        // Without `type`, the keywords say what kind of value is meant.
        uint8_t kinds = 0;
        for (const auto field : o) {
            if (is_object_keyword(field.key)) kinds |= schema_types::object;
            if (is_array_keyword(field.key)) kinds |= schema_types::array;
            if (is_string_keyword(field.key)) kinds |= schema_types::string;
            if (is_number_keyword(field.key)) kinds |= schema_types::number;
        }
        n.types = kinds ? kinds : schema_types::all;
    }
    element nullable;
    bool is_nullable = false;
    if (o.at_key("nullable").get(nullable) == simdjson::SUCCESS &&
        nullable.get_bool().get(is_nullable) == simdjson::SUCCESS && is_nullable)
        n.types |= schema_types::null;
    return std::nullopt;
}

schema_compiler::maybe_error schema_compiler::read_string_bounds(object o, const std::string& path,
                                                                 json_schema::node& n) {
    if (auto e = read_count(o, "minLength", path, n.min_length, 1u << 20)) return e;
    if (auto e = read_count(o, "maxLength", path, n.max_length, 0xFFFFFFFFu)) return e;
    if (n.min_length > n.max_length) return refuse(path_key(path, "minLength"), "is above maxLength");
    return std::nullopt;
}

schema_compiler::maybe_error schema_compiler::read_number_bounds(object o, const std::string& path,
                                                                 json_schema::node& n) {
    scaled lo = -k_reach, hi = k_reach;
    bool bounded = false;
    auto number_of = [&](std::string_view key, std::optional<double>& out, bool& flag) -> maybe_error {
        element v;
        if (o.at_key(key).get(v) != simdjson::SUCCESS) return std::nullopt;
        const std::string p = path_key(path, key);
        if (v.is_bool()) {  // draft 4: exclusiveMinimum/Maximum qualify minimum/maximum
            flag = v.get_bool().value_unsafe();
            return std::nullopt;
        }
        double d = 0;
        if (auto e = detail::read_number(v, p, d)) return e;
        out = d;
        return std::nullopt;
    };
    std::optional<double> minimum, maximum, ex_min, ex_max;
    bool draft4_ex_min = false, draft4_ex_max = false, ignored = false;
    if (auto e = number_of("minimum", minimum, ignored)) return e;
    if (auto e = number_of("maximum", maximum, ignored)) return e;
    if (auto e = number_of("exclusiveMinimum", ex_min, draft4_ex_min)) return e;
    if (auto e = number_of("exclusiveMaximum", ex_max, draft4_ex_max)) return e;
    if (minimum) {
        lo = std::max(lo, draft4_ex_min ? scaled_round(*minimum, false) + 1 : scaled_round(*minimum, true));
        bounded = true;
    }
    if (ex_min) lo = std::max(lo, scaled_round(*ex_min, false) + 1), bounded = true;
    if (maximum) {
        hi = std::min(hi, draft4_ex_max ? scaled_round(*maximum, true) - 1 : scaled_round(*maximum, false));
        bounded = true;
    }
    if (ex_max) hi = std::min(hi, scaled_round(*ex_max, true) - 1), bounded = true;
    if (!bounded) return std::nullopt;
    if (n.integer) {  // whole numbers only
        lo = ceil_div(lo, k_scale) * k_scale;
        hi = floor_div(hi, k_scale) * k_scale;
    }
    lo = std::max(lo, -k_reach);
    hi = std::min(hi, k_reach);
    if (lo > hi)
        return refuse(path, std::string("no ") + (n.integer ? "integer" : "number") +
                                " satisfies minimum/maximum (within 15 digits)");
    n.bounded = true;
    n.lo = lo;
    n.hi = hi;
    return std::nullopt;
}

bool schema_compiler::literal_fits(element v, const json_schema::node& n) const {
    const uint8_t t = value_type(v);
    if (!(n.types & t)) return false;
    if (t == schema_types::number) {
        if (n.integer && !is_integral(v)) return false;
        if (n.bounded) {
            double d = 0;
            if (v.get_double().get(d) != simdjson::SUCCESS) {
                int64_t i = 0;
                uint64_t u = 0;
                if (v.get_int64().get(i) == simdjson::SUCCESS)
                    d = double(i);
                else if (v.get_uint64().get(u) == simdjson::SUCCESS)
                    d = double(u);
            }
            if (scaled_round(d, false) < n.lo || scaled_round(d, true) > n.hi) return false;
        }
    }
    if (t == schema_types::string) {
        const size_t len = code_points(v.get_string().value_unsafe());
        if (len < n.min_length || len > n.max_length) return false;
    }
    return true;
}

schema_compiler::maybe_error schema_compiler::read_literals(object o, const std::string& path,
                                                            json_schema::node& n, bool typed) {
    element c, e;
    const bool has_const = o.at_key("const").get(c) == simdjson::SUCCESS;
    const bool has_enum = o.at_key("enum").get(e) == simdjson::SUCCESS;
    if (!has_const && !has_enum) return std::nullopt;
    std::vector<element> values;
    if (has_enum) {
        array a;
        if (e.get_array().get(a) != simdjson::SUCCESS)
            return detail::wrong_type(path_key(path, "enum"), "an array", e);
        if (a.size() == 0) return refuse(path_key(path, "enum"), "must not be empty");
        for (element v : a) values.push_back(v);
    }
    if (has_const) {  // const narrows enum to itself
        const std::string text = simdjson::minify(c);
        if (has_enum && std::none_of(values.begin(), values.end(),
                                     [&](element v) { return simdjson::minify(v) == text; }))
            return refuse(path_key(path, "const"), "is not one of enum");
        values = {c};
    }
    const bool container_keywords =
        std::any_of(o.begin(), o.end(), [](const simdjson::dom::key_value_pair& f) {
            return is_object_keyword(f.key) || is_array_keyword(f.key);
        });
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (element v : values) {
        const uint8_t t = value_type(v);
        if ((t == schema_types::object || t == schema_types::array) && container_keywords) {
            if (auto err =
                    unsupported(path_key(path, has_const ? "const" : "enum"), has_const ? "const" : "enum",
                                "object or array values next to properties or items"))
                return err;
        }
        if (typed || n.bounded || n.min_length > 0 || n.max_length != 0xFFFFFFFFu)
            if (!literal_fits(v, n)) continue;
        std::string text = escape_bar(simdjson::minify(v));
        if (std::find(texts.begin(), texts.end(), text) != texts.end()) continue;
        bytes += text.size();
        texts.push_back(std::move(text));
    }
    if (texts.empty())
        return refuse(path_key(path, has_const ? "const" : "enum"),
                      "no value satisfies the rest of the schema");
    if (bytes > json_schema::k_max_literal_bytes)
        return refuse(path_key(path, "enum"), "the values are too long (more than " +
                                                  std::to_string(json_schema::k_max_literal_bytes) +
                                                  " bytes in all)");
    uint32_t root = k_none;
    for (const auto& t : texts) root = add_trie(root, t);
    n.literals = root;
    return std::nullopt;
}

schema_compiler::maybe_error schema_compiler::read_object(object o, const std::string& path,
                                                          json_schema::node& n) {
    element props_e, required_e, additional_e;
    const bool has_props = o.at_key("properties").get(props_e) == simdjson::SUCCESS;
    const bool has_required = o.at_key("required").get(required_e) == simdjson::SUCCESS;
    const bool has_additional = o.at_key("additionalProperties").get(additional_e) == simdjson::SUCCESS;
    // additionalProperties: the schema of undeclared keys (k_none: none may be written).
    uint32_t additional = k_none;
    if (has_additional) {
        auto a = compile(additional_e, path_key(path, "additionalProperties"));
        if (!a) return a.error();
        additional = *a == k_never ? k_none : *a;
    }
    std::vector<std::string> required;
    if (has_required) {
        array a;
        const std::string p = path_key(path, "required");
        if (required_e.get_array().get(a) != simdjson::SUCCESS)
            return detail::wrong_type(p, "an array of strings", required_e);
        size_t i = 0;
        for (element r : a) {
            std::string_view s;
            if (r.get_string().get(s) != simdjson::SUCCESS)
                return detail::wrong_type(path_index(p, i), "a string", r);
            if (std::find(required.begin(), required.end(), s) == required.end()) required.emplace_back(s);
            ++i;
        }
    }
    std::vector<std::string> names;
    if (has_props) {
        object props;
        const std::string p = path_key(path, "properties");
        if (props_e.get_object().get(props) != simdjson::SUCCESS)
            return detail::wrong_type(p, "an object", props_e);
        for (const auto field : props) {
            const std::string name(field.key);
            if (std::find(names.begin(), names.end(), name) != names.end())
                continue;  // first occurrence counts
            auto v = compile(field.value, path_key(p, name));
            if (!v) return v.error();
            const bool req = std::find(required.begin(), required.end(), name) != required.end();
            if (*v == k_never) {
                if (req) return refuse(path_key(p, name), "is required but its schema allows no value");
                continue;
            }
            names.push_back(name);
            n.properties.push_back({std::string(), *v, req});
        }
    }
    // Required keys the properties do not declare: their values follow additionalProperties.
    for (const auto& r : required) {
        if (std::find(names.begin(), names.end(), r) != names.end()) continue;
        const bool additional_allowed = has_additional ? additional != k_none : true;
        if (!additional_allowed)
            return refuse(
                path_key(path, "required"),
                "requires " + json_escape(r) + ", which neither properties nor additionalProperties allow");
        names.push_back(r);
        n.properties.push_back({std::string(), has_additional ? additional : k_any, true});
    }
    if (n.properties.size() > json_schema::k_max_properties)
        return refuse(
            path_key(path, "properties"),
            "more than " + std::to_string(json_schema::k_max_properties) + " properties are not supported");
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i].size() > json_schema::k_max_key_bytes)
            return refuse(
                path_key(path, "properties"),
                "a property name longer than " + std::to_string(json_schema::k_max_key_bytes) + " bytes");
        std::string quoted = json_escape(names[i]);
        n.properties[i].key = escape_bar(quoted.substr(1, quoted.size() - 2));
    }
    // No declared properties and no additionalProperties: any object. Otherwise undeclared keys
    // only when additionalProperties says so (json_schema.h).
    n.additional = has_additional ? additional : (n.properties.empty() ? k_any : k_none);
    n.free_object = n.properties.empty() && n.additional == k_any;
    if (!n.properties.empty()) {
        for (size_t i = 0; i < n.properties.size(); ++i) {
            n.key_trie = add_trie(n.key_trie, n.properties[i].key);
            uint32_t at = n.key_trie;
            out_.tries_[at].below |= uint64_t(1) << i;
            for (char ch : n.properties[i].key) {
                at = out_.child(at, uint8_t(ch));
                out_.tries_[at].below |= uint64_t(1) << i;
            }
            out_.tries_[at].property = int16_t(i);
        }
        const bool empty_declared = std::any_of(n.properties.begin(), n.properties.end(),
                                                [](const auto& p) { return p.key.empty(); });
        n.free_key_min = empty_declared ? 1 : 0;
    }
    return std::nullopt;
}

schema_compiler::maybe_error schema_compiler::read_array(object o, const std::string& path,
                                                         json_schema::node& n) {
    element items;
    n.items = k_any;
    if (o.at_key("items").get(items) == simdjson::SUCCESS) {
        const std::string p = path_key(path, "items");
        if (items.is_array()) {
            if (auto e = unsupported(p, "items", "an array of schemas (tuple form)")) return e;
        } else {
            auto it = compile(items, p);
            if (!it) return it.error();
            if (*it == k_never)
                n.max_items = 0;
            else
                n.items = *it;
        }
    }
    if (auto e = read_count(o, "minItems", path, n.min_items, 1u << 16)) return e;
    uint32_t max_items = n.max_items;
    if (auto e = read_count(o, "maxItems", path, max_items, 0xFFFFFFFFu)) return e;
    n.max_items = std::min(n.max_items, max_items);
    if (n.min_items > n.max_items)
        return refuse(path_key(path, "minItems"), "is above maxItems (or items allows no value)");
    n.free_array = n.items == k_any && n.min_items == 0 && n.max_items == 0xFFFFFFFFu;
    return std::nullopt;
}

api_result<uint32_t> schema_compiler::compile(element e, const std::string& path) {
    bool flag = false;
    if (e.get_bool().get(flag) == simdjson::SUCCESS) return flag ? k_any : k_never;
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS)
        return detail::wrong_type(path, "a schema (an object or a boolean)", e);

    // What kinds of keywords are here.
    bool assertions = false, has_ref = false, has_any_of = false, has_one_of = false, has_all_of = false;
    for (const auto field : o) {
        const std::string_view k = field.key;
        if (k == "$ref")
            has_ref = true;
        else if (k == "anyOf")
            has_any_of = true;
        else if (k == "oneOf")
            has_one_of = true;
        else if (k == "allOf")
            has_all_of = true;
        else if (k == "type" || k == "enum" || k == "const" || is_object_keyword(k) || is_array_keyword(k) ||
                 is_string_keyword(k) || is_number_keyword(k))
            assertions = true;
        else if (k == "uniqueItems") {
            bool unique = false;
            if (field.value.get_bool().get(unique) != simdjson::SUCCESS)
                return detail::wrong_type(path_key(path, k), "a boolean", field.value);
            if (unique)
                if (auto err = unsupported(path_key(path, k), k)) return *err;
        } else if (is_unsupported(k)) {
            if (auto err = unsupported(path_key(path, k), k)) return *err;
        }
        // Annotations and keywords JSON Schema does not define are ignored.
    }
    const int combinators = int(has_ref) + int(has_any_of) + int(has_one_of) + int(has_all_of);
    if (combinators > 0 && (assertions || combinators > 1)) {
        const char* k = has_ref ? "$ref" : has_any_of ? "anyOf" : has_one_of ? "oneOf" : "allOf";
        if (auto err = unsupported(path_key(path, k), k,
                                   "next to other assertions; move them into the referenced "
                                   "schema or each alternative"))
            return *err;
    }
    element nullable_e;
    bool nullable = false;
    if (o.at_key("nullable").get(nullable_e) == simdjson::SUCCESS &&
        nullable_e.get_bool().get(nullable) != simdjson::SUCCESS)
        nullable = false;

    if (has_ref) {
        std::string_view ref;
        element r = o.at_key("$ref").value_unsafe();
        if (r.get_string().get(ref) != simdjson::SUCCESS)
            return detail::wrong_type(path_key(path, "$ref"), "a string", r);
        return compile_ref(ref, path_key(path, "$ref"));
    }
    if (has_any_of || has_one_of) {
        const char* k = has_any_of ? "anyOf" : "oneOf";
        element alts = o.at_key(k).value_unsafe();
        array a;
        if (alts.get_array().get(a) != simdjson::SUCCESS)
            return detail::wrong_type(path_key(path, k), "an array", alts);
        return compile_union(a, path_key(path, k), nullable);
    }
    if (has_all_of) {
        element all = o.at_key("allOf").value_unsafe();
        array a;
        if (all.get_array().get(a) != simdjson::SUCCESS || a.size() == 0)
            return detail::wrong_type(path_key(path, "allOf"), "a non-empty array", all);
        if (a.size() > 1)
            if (auto err = unsupported(path_key(path, "allOf"), "allOf", "with more than one entry"))
                return *err;
        return compile(a.at(0).value_unsafe(), path_index(path_key(path, "allOf"), 0));
    }

    json_schema::node n;
    bool typed = false;
    if (auto err = read_types(o, path, n, typed)) return *err;
    if (auto err = read_string_bounds(o, path, n)) return *err;
    if (auto err = read_number_bounds(o, path, n)) return *err;
    if (auto err = read_literals(o, path, n, typed)) return *err;
    if (n.literals == k_none) {
        if (n.types & schema_types::object) {
            if (auto err = read_object(o, path, n)) return *err;
        }
        if (n.types & schema_types::array) {
            if (auto err = read_array(o, path, n)) return *err;
        }
        if (n.types == schema_types::all && !n.bounded && n.min_length == 0 && n.max_length == 0xFFFFFFFFu &&
            n.free_object && n.free_array && !n.integer)
            return k_any;
    }
    return add(std::move(n), path);
}

api_result<uint32_t> schema_compiler::restrict_to_objects(uint32_t id, const std::string& path) {
    const auto refuse_root = [&] {
        return refuse(path, "must describe a JSON object (tool arguments and response formats are objects)");
    };
    if (id == k_never) return refuse_root();
    json_schema::node n = out_.nodes_[id];
    if (n.is_union()) {
        std::vector<uint32_t> kept;
        for (uint32_t alt : n.alternatives) {
            const auto& a = out_.nodes_[alt];
            const bool objects = a.literals != k_none ? out_.child(a.literals, '{') != 0
                                                      : (a.types & schema_types::object) != 0;
            if (!objects) continue;
            auto r = restrict_to_objects(alt, path);
            if (!r) return r.error();
            kept.push_back(*r);
        }
        if (kept.empty()) return refuse_root();
        if (kept.size() == 1) return kept[0];
        n.alternatives = std::move(kept);
        return add(std::move(n), path);
    }
    if (n.literals != k_none) {
        // Keep the object texts: a new trie holding the '{' branch only.
        const uint32_t brace = out_.child(n.literals, '{');
        if (brace == 0) return refuse_root();
        json_schema::trie_node root;
        root.first_child = brace;
        out_.tries_.push_back(root);
        n.literals = uint32_t(out_.tries_.size() - 1);
        // The brace node's siblings belong to the old root only: copy it without them.
        json_schema::trie_node only = out_.tries_[brace];
        only.next_sibling = 0;
        out_.tries_.push_back(only);
        out_.tries_[n.literals].first_child = uint32_t(out_.tries_.size() - 1);
        return add(std::move(n), path);
    }
    if (!(n.types & schema_types::object)) return refuse_root();
    if (n.types == schema_types::object && id != k_any) return id;
    n.types = schema_types::object;
    if (id == k_any) {  // `true` / {}: any object
        n.free_object = true;
        n.additional = k_any;
    }
    return add(std::move(n), path);
}

// ---- what the automaton needs from each node -----------------------------------------------------

namespace {

struct finisher {
    json_schema::node* nodes;
    size_t count;
    std::vector<json_schema::trie_node>& tries;
    std::vector<uint8_t> state;  // 0 new, 1 in progress, 2 done
    std::vector<int> depth;

    // Fewest bytes to a text's end below each node of a literal trie, children first (an
    // explicit stack: one enum text may be thousands of bytes deep).
    uint32_t literal_rest(uint32_t root) {
        std::vector<std::pair<uint32_t, bool>> stack{{root, false}};
        while (!stack.empty()) {
            auto [t, children_done] = stack.back();
            stack.pop_back();
            auto& node = tries[t];
            if (!children_done) {
                stack.push_back({t, true});
                for (uint32_t c = node.first_child; c != 0; c = tries[c].next_sibling)
                    stack.push_back({c, false});
                continue;
            }
            uint32_t best = node.end ? 0 : k_saturated;
            for (uint32_t c = node.first_child; c != 0; c = tries[c].next_sibling)
                best = std::min(best, sat_add(tries[c].min_rest, 1));
            node.min_rest = best;
        }
        return tries[root].min_rest;
    }

    void visit(uint32_t id) {
        if (state[id] == 2) return;
        MS_ASSERT_MSG(state[id] == 0, "json_schema: a cycle survived compilation");
        state[id] = 1;
        json_schema::node& n = nodes[id];
        int d = 0;
        uint32_t best = k_saturated;
        if (n.is_union()) {
            for (uint32_t a : n.alternatives) {
                visit(a);
                best = std::min(best, nodes[a].min_bytes);
                d = std::max(d, depth[a]);
            }
        } else if (n.literals != k_none) {
            best = literal_rest(n.literals);
        } else {
            namespace st = schema_types;
            if (n.types & (st::null | st::boolean)) best = std::min<uint32_t>(best, 4);
            if (n.types & st::string) best = std::min(best, sat_add(2, n.min_length));
            if (n.types & st::number) {
                const uint32_t r = json_schema::number_rest(n, {});
                if (r != k_none) best = std::min(best, r);
            }
            if (n.types & st::object) {
                uint32_t entries = 0;
                int child_depth = 0;
                if (n.additional != k_none && n.additional != k_any) {
                    visit(n.additional);
                    child_depth = depth[n.additional];
                }
                const size_t np = n.properties.size();
                n.required_rest.assign(np + 1, 0);
                n.next_required.assign(np + 1, uint16_t(np));
                for (size_t i = np; i-- > 0;) {
                    const auto& p = n.properties[i];
                    visit(p.node);
                    child_depth = std::max(child_depth, depth[p.node]);
                    const uint32_t entry =
                        sat_add(uint32_t(p.key.size()) + 4, nodes[p.node].min_bytes);  // ,"k":v
                    n.required_rest[i] =
                        p.required ? sat_add(n.required_rest[i + 1], entry) : n.required_rest[i + 1];
                    n.next_required[i] = p.required ? uint16_t(i) : n.next_required[i + 1];
                }
                entries = n.required_rest.empty() ? 0 : n.required_rest[0];
                const uint32_t first = entries > 0 ? entries - 1 : 0;  // the first entry has no comma
                best = std::min(best, sat_add(2, first));
                if (!n.free_object) d = std::max(d, 1 + child_depth);
            }
            if (n.types & st::array) {
                uint32_t item = 1;  // "0"
                int child_depth = 0;
                if (n.items != k_any) {
                    visit(n.items);
                    item = nodes[n.items].min_bytes;
                    child_depth = depth[n.items];
                }
                const uint64_t inside =
                    n.min_items == 0 ? 0 : uint64_t(n.min_items) * (uint64_t(item) + 1) - 1;
                best = std::min(best, sat_add(2, inside));
                if (!n.free_array) d = std::max(d, 1 + child_depth);
            }
        }
        n.min_bytes = best;
        depth[id] = d;
        state[id] = 2;
    }
};

}  // namespace

schema_compiler::maybe_error schema_compiler::finish() {
    finisher f{out_.nodes_.data(), out_.nodes_.size(), out_.tries_,
               std::vector<uint8_t>(out_.nodes_.size(), 0), std::vector<int>(out_.nodes_.size(), 0)};
    for (uint32_t i = 0; i < out_.nodes_.size(); ++i) f.visit(i);
    for (uint32_t i = 0; i < out_.nodes_.size(); ++i)
        if (out_.nodes_[i].min_bytes >= k_saturated)
            return refuse(param_, "the schema allows no value of bounded size");
    out_.depth_ = f.depth[out_.root_];
    if (out_.depth_ > json_schema::k_max_depth)
        return refuse(param_, "objects and arrays nested deeper than " +
                                  std::to_string(json_schema::k_max_depth) + " levels are not supported");
    return std::nullopt;
}

api_result<std::shared_ptr<const json_schema>> json_schema::compile(std::string_view schema_json,
                                                                    std::string param, schema_mode mode) {
    simdjson::dom::parser parser;
    element doc;
    if (parser.parse(simdjson::padded_string(schema_json)).get(doc) != simdjson::SUCCESS)
        return bad_request(param, param + ": the schema is not valid JSON");
    auto out = std::make_shared<json_schema>();
    schema_compiler c(doc, param, mode, *out);
    auto root = c.compile(doc, param);
    if (!root) return root.error();
    auto object_root = c.restrict_to_objects(*root, param);
    if (!object_root) return object_root.error();
    out->root_ = *object_root;
    if (auto e = c.finish()) return *e;
    return std::shared_ptr<const json_schema>(std::move(out));
}

}  // namespace moestream::server
