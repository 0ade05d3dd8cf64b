// gguf::value: typed metadata values, checked conversions and display.
#include <cinttypes>
#include <cstdio>
#include <limits>

#include "storage/gguf.h"

namespace moestream::gguf {
namespace {

bool is_unsigned(value_type t) {
    return t == value_type::u8 || t == value_type::u16 || t == value_type::u32 || t == value_type::u64;
}
bool is_signed(value_type t) {
    return t == value_type::i8 || t == value_type::i16 || t == value_type::i32 || t == value_type::i64;
}

error type_mismatch(std::string_view expected, const value& v) {
    return make_error("expected " + std::string(expected) + ", got " + std::string(value_type_name(v.type)));
}

template <class T, class Elem>
value make_array(value_type elem, std::span<const Elem> items, T (*make)(Elem)) {
    std::vector<value> out;
    out.reserve(items.size());
    for (const auto& x : items) out.push_back(make(x));
    return value::array(elem, std::move(out));
}

std::string display_string(const std::string& s) {
    constexpr size_t kMaxChars = 64;  // long strings (chat templates) would swamp `inspect`
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < kMaxChars; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > kMaxChars) out += "...";
    out += '"';
    return out;
}

}  // namespace

std::string_view value_type_name(value_type t) {
    switch (t) {
        case value_type::u8: return "u8";
        case value_type::i8: return "i8";
        case value_type::u16: return "u16";
        case value_type::i16: return "i16";
        case value_type::u32: return "u32";
        case value_type::i32: return "i32";
        case value_type::f32: return "f32";
        case value_type::boolean: return "bool";
        case value_type::string: return "string";
        case value_type::array: return "array";
        case value_type::u64: return "u64";
        case value_type::i64: return "i64";
        case value_type::f64: return "f64";
    }
    return "unknown";
}

value value::u32_array(std::span<const uint32_t> v) { return make_array(value_type::u32, v, &value::u32); }
value value::i32_array(std::span<const int32_t> v) { return make_array(value_type::i32, v, &value::i32); }
value value::f32_array(std::span<const float> v) { return make_array(value_type::f32, v, &value::f32); }
value value::str_array(std::span<const std::string> v) {
    std::vector<value> out;
    out.reserve(v.size());
    for (const auto& s : v) out.push_back(value::str(s));
    return value::array(value_type::string, std::move(out));
}

bool value::is_integer() const { return is_unsigned(type) || is_signed(type); }

result<uint64_t> value::as_u64() const {
    if (const auto* u = std::get_if<uint64_t>(&data); u && is_unsigned(type)) return *u;
    if (const auto* i = std::get_if<int64_t>(&data); i && is_signed(type)) {
        if (*i < 0) return make_error("value " + std::to_string(*i) + " is negative, expected u64");
        return static_cast<uint64_t>(*i);
    }
    return type_mismatch("an integer", *this);
}

result<int64_t> value::as_i64() const {
    if (const auto* i = std::get_if<int64_t>(&data); i && is_signed(type)) return *i;
    if (const auto* u = std::get_if<uint64_t>(&data); u && is_unsigned(type)) {
        if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return make_error("value " + std::to_string(*u) + " does not fit in i64");
        return static_cast<int64_t>(*u);
    }
    return type_mismatch("an integer", *this);
}

result<double> value::as_f64() const {
    if (const auto* d = std::get_if<double>(&data); d && (type == value_type::f32 || type == value_type::f64))
        return *d;
    // Integers convert too: a float hyper-parameter written as an integer is still meaningful.
    if (const auto* u = std::get_if<uint64_t>(&data); u && is_unsigned(type)) return static_cast<double>(*u);
    if (const auto* i = std::get_if<int64_t>(&data); i && is_signed(type)) return static_cast<double>(*i);
    return type_mismatch("a number", *this);
}

result<bool> value::as_bool() const {
    if (const auto* b = std::get_if<bool>(&data); b && type == value_type::boolean) return *b;
    return type_mismatch("bool", *this);
}

result<std::string> value::as_string() const {
    if (const auto* s = std::get_if<std::string>(&data); s && type == value_type::string) return *s;
    return type_mismatch("string", *this);
}

const std::vector<value>* value::as_array() const {
    if (type != value_type::array) return nullptr;
    return std::get_if<std::vector<value>>(&data);
}

std::string value::to_display(size_t max_items) const {
    return std::visit(
        [&](const auto& x) -> std::string {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, int64_t>) {
                return std::to_string(x);
            } else if constexpr (std::is_same_v<T, double>) {
                char buf[32];
                std::snprintf(buf, sizeof buf, "%.9g", x);
                return buf;
            } else if constexpr (std::is_same_v<T, bool>) {
                return x ? "true" : "false";
            } else if constexpr (std::is_same_v<T, std::string>) {
                return display_string(x);
            } else {
                std::string out = "[";
                for (size_t i = 0; i < x.size() && i < max_items; ++i) {
                    if (i > 0) out += ", ";
                    out += x[i].to_display(max_items);
                }
                if (x.size() > max_items) out += ", ... (" + std::to_string(x.size()) + " items)";
                out += "]";
                return out;
            }
        },
        data);
}

}  // namespace moestream::gguf
