// An independent JSON Schema validator for the tests: written from the specification (draft
// 2020-12, plus draft 4's boolean exclusive bounds and OpenAPI's nullable), sharing nothing with
// the constraint it checks (server/json_schema*). It covers the keywords the corpus uses and
// ignores annotations, as a validator must.
#pragma once

#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace moestream::test {

class schema_validator {
  public:
    explicit schema_validator(std::string_view schema_json) : text_(schema_json) {
        ok_ = parser_.parse(text_).get(root_) == simdjson::SUCCESS;
    }
    bool ok() const { return ok_; }

    // "" when `instance_json` is one valid JSON value that satisfies the schema; else why not.
    std::string check(std::string_view instance_json) const {
        if (!ok_) return "the schema does not parse";
        simdjson::dom::parser p;
        simdjson::dom::element v;
        const simdjson::padded_string text(instance_json);
        if (p.parse(text).get(v) != simdjson::SUCCESS) return "not JSON: " + std::string(instance_json);
        return validate(root_, v, "", 0);
    }

  private:
    using element = simdjson::dom::element;
    using type = simdjson::dom::element_type;

    // By value: a range-for over value_unsafe() of a temporary result would dangle.
    static simdjson::dom::array items_of(element e) { return e.get_array().value_unsafe(); }
    static bool is_number(element v) { return v.is_int64() || v.is_uint64() || v.is_double(); }
    static double number(element v) {
        if (v.is_int64()) return double(v.get_int64().value_unsafe());
        if (v.is_uint64()) return double(v.get_uint64().value_unsafe());
        return v.get_double().value_unsafe();
    }
    static bool integral(element v) {
        return v.is_int64() || v.is_uint64() || (v.is_double() && std::floor(number(v)) == number(v));
    }
    static size_t code_points(std::string_view s) {
        size_t n = 0;
        for (unsigned char c : s) n += (c & 0xC0) != 0x80;
        return n;
    }
    // JSON equality: numbers by value, objects by their members whatever the order.
    static bool equal(element a, element b) {
        if (is_number(a) && is_number(b)) return number(a) == number(b);
        if (a.type() != b.type()) return false;
        switch (a.type()) {
            case type::NULL_VALUE:
                return true;
            case type::BOOL:
                return a.get_bool().value_unsafe() == b.get_bool().value_unsafe();
            case type::STRING:
                return a.get_string().value_unsafe() == b.get_string().value_unsafe();
            case type::ARRAY: {
                auto x = a.get_array().value_unsafe(), y = b.get_array().value_unsafe();
                if (x.size() != y.size()) return false;
                for (size_t i = 0; i < x.size(); ++i)
                    if (!equal(x.at(i).value_unsafe(), y.at(i).value_unsafe())) return false;
                return true;
            }
            case type::OBJECT: {
                auto x = a.get_object().value_unsafe(), y = b.get_object().value_unsafe();
                if (x.size() != y.size()) return false;
                for (auto f : x) {
                    element other;
                    if (y.at_key(f.key).get(other) != simdjson::SUCCESS || !equal(f.value, other))
                        return false;
                }
                return true;
            }
            default:
                return false;
        }
    }
    static bool has_type(element v, std::string_view t) {
        if (t == "null") return v.is_null();
        if (t == "boolean") return v.is_bool();
        if (t == "object") return v.is_object();
        if (t == "array") return v.is_array();
        if (t == "string") return v.is_string();
        if (t == "number") return is_number(v);
        if (t == "integer") return is_number(v) && integral(v);
        return false;
    }
    element resolve(std::string_view ref) const {
        element at = root_;
        std::string_view rest = ref.substr(1);
        while (!rest.empty()) {
            rest.remove_prefix(1);
            const size_t end = std::min(rest.find('/'), rest.size());
            std::string token(rest.substr(0, end));
            rest.remove_prefix(end);
            for (size_t i = 0; (i = token.find('~', i)) != std::string::npos; ++i)
                token.replace(i, 2, token[i + 1] == '1' ? "/" : "~");
            element next;
            if (at.is_array())
                next = at.get_array().value_unsafe().at(std::stoul(token)).value_unsafe();
            else
                next = at.get_object().value_unsafe().at_key(token).value_unsafe();
            at = next;
        }
        return at;
    }

    std::string validate(element s, element v, const std::string& where, int depth) const {
        if (depth > 64) return where + ": schema too deep";
        bool b = false;
        if (s.get_bool().get(b) == simdjson::SUCCESS) return b ? "" : where + ": the schema is false";
        simdjson::dom::object o = s.get_object().value_unsafe();
        auto get = [&](std::string_view k, element& out) {
            return o.at_key(k).get(out) == simdjson::SUCCESS;
        };
        element k;
        bool nullable = false;
        if (get("nullable", k)) nullable = k.get_bool().value_unsafe();
        if (nullable && v.is_null()) return "";
        if (get("$ref", k)) {
            auto e = validate(resolve(k.get_string().value_unsafe()), v, where, depth + 1);
            if (!e.empty()) return e;
        }
        if (get("type", k)) {
            bool any = false;
            if (k.is_string())
                any = has_type(v, k.get_string().value_unsafe());
            else
                for (element t : items_of(k)) any = any || has_type(v, t.get_string().value_unsafe());
            if (!any) return where + ": wrong type";
        }
        if (get("enum", k)) {
            bool found = false;
            for (element x : items_of(k)) found = found || equal(x, v);
            if (!found) return where + ": not in enum";
        }
        if (get("const", k) && !equal(k, v)) return where + ": not the const";
        for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
            if (!get(comb, k)) continue;
            int passed = 0, total = 0;
            for (element alt : items_of(k)) {
                ++total;
                if (validate(alt, v, where, depth + 1).empty()) ++passed;
            }
            const std::string c = comb;
            if (c == "anyOf" && passed == 0) return where + ": matches no anyOf alternative";
            if (c == "oneOf" && passed != 1)
                return where + ": matches " + std::to_string(passed) + " oneOf alternatives";
            if (c == "allOf" && passed != total) return where + ": fails allOf";
        }
        if (v.is_string()) {
            const size_t len = code_points(v.get_string().value_unsafe());
            if (get("minLength", k) && len < uint64_t(number(k))) return where + ": shorter than minLength";
            if (get("maxLength", k) && len > uint64_t(number(k))) return where + ": longer than maxLength";
        }
        if (is_number(v)) {
            const double x = number(v);
            bool ex_min = false, ex_max = false;
            element e;
            if (get("exclusiveMinimum", e)) {
                if (e.is_bool())
                    ex_min = e.get_bool().value_unsafe();
                else if (!(x > number(e)))
                    return where + ": not above exclusiveMinimum";
            }
            if (get("exclusiveMaximum", e)) {
                if (e.is_bool())
                    ex_max = e.get_bool().value_unsafe();
                else if (!(x < number(e)))
                    return where + ": not below exclusiveMaximum";
            }
            if (get("minimum", k) && (ex_min ? !(x > number(k)) : !(x >= number(k))))
                return where + ": below minimum";
            if (get("maximum", k) && (ex_max ? !(x < number(k)) : !(x <= number(k))))
                return where + ": above maximum";
        }
        if (v.is_array()) {
            auto items = v.get_array().value_unsafe();
            if (get("minItems", k) && items.size() < uint64_t(number(k)))
                return where + ": fewer than minItems";
            if (get("maxItems", k) && items.size() > uint64_t(number(k)))
                return where + ": more than maxItems";
            if (get("items", k)) {
                size_t i = 0;
                for (element x : items) {
                    auto err = validate(k, x, where + "/" + std::to_string(i++), depth + 1);
                    if (!err.empty()) return err;
                }
            }
        }
        if (v.is_object()) {
            auto obj = v.get_object().value_unsafe();
            element props, additional;
            const bool has_props = get("properties", props);
            const bool has_additional = get("additionalProperties", additional);
            if (get("required", k))
                for (element r : items_of(k)) {
                    element present;
                    if (obj.at_key(r.get_string().value_unsafe()).get(present) != simdjson::SUCCESS)
                        return where + ": misses required " + std::string(r.get_string().value_unsafe());
                }
            for (auto f : obj) {
                element sub;
                const std::string at = where + "/" + std::string(f.key);
                if (has_props &&
                    props.get_object().value_unsafe().at_key(f.key).get(sub) == simdjson::SUCCESS) {
                    auto err = validate(sub, f.value, at, depth + 1);
                    if (!err.empty()) return err;
                } else if (has_additional) {
                    auto err = validate(additional, f.value, at, depth + 1);
                    if (!err.empty()) return err + " (additionalProperties)";
                }
            }
        }
        return "";
    }

    simdjson::padded_string text_;
    simdjson::dom::parser parser_;
    simdjson::dom::element root_;
    bool ok_ = false;
};

}  // namespace moestream::test
