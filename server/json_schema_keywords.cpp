// The keywords of one schema node (types, enum/const, string and number bounds, object and
// array keywords), for the compiler in json_schema.cpp.
#include <simdjson.h>

#include "server/json_schema_compiler.h"
#include "server/json_writer.h"
#include "server/request_fields.h"

namespace moestream::server {

using detail::path_index;
using detail::path_key;
using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;
using namespace schema_detail;

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

}  // namespace moestream::server
