#include "server/request_fields.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>
#include <vector>

#include "server/json_writer.h"

namespace moestream::server::detail {

// ---------------------------------------------------------------- paths and messages

std::string path_key(std::string_view parent, std::string_view key) {
    std::string p;
    p.reserve(parent.size() + key.size() + 1);
    p.append(parent);
    if (!parent.empty()) p.push_back('.');
    p.append(key);
    return p;
}

std::string path_index(std::string_view parent, size_t i) {
    std::string p(parent);
    p.push_back('[');
    p.append(std::to_string(i));
    p.push_back(']');
    return p;
}

const char* json_type_name(element e) {
    switch (e.type()) {
        case simdjson::dom::element_type::ARRAY: return "array";
        case simdjson::dom::element_type::OBJECT: return "object";
        case simdjson::dom::element_type::INT64:
        case simdjson::dom::element_type::UINT64:
        case simdjson::dom::element_type::DOUBLE: return "number";
        case simdjson::dom::element_type::STRING: return "string";
        case simdjson::dom::element_type::BOOL: return "boolean";
        case simdjson::dom::element_type::NULL_VALUE: return "null";
    }
    return "unknown";
}

api_error wrong_type(std::string_view path, std::string_view expected, element got) {
    std::string msg(path);
    msg.append(": expected ").append(expected).append(", got ").append(json_type_name(got));
    return bad_request(std::string(path), std::move(msg));
}

std::string format_number(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

namespace {

api_error out_of_range(std::string_view path, std::string_view requirement, std::string_view got) {
    std::string msg(path);
    msg.append(": must be ").append(requirement).append(", got ").append(got);
    return bad_request(std::string(path), std::move(msg));
}

std::string integer_requirement(int64_t lo, int64_t hi) {
    if (hi == std::numeric_limits<int64_t>::max()) return ">= " + std::to_string(lo);
    return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string real_requirement(const real_range& r) {
    if (std::isinf(r.hi))  // the value still has to fit a float
        return std::string(r.lo_open ? "> " : ">= ") + format_number(r.lo) + " and at most " +
               format_number(std::numeric_limits<float>::max());
    std::string s(r.lo_open ? "in (" : "in [");
    s.append(format_number(r.lo)).append(", ").append(format_number(r.hi)).append(r.hi_open ? ")" : "]");
    return s;
}

// Largest magnitude at which every integer is exactly a double: integral decimals beyond it are
// not trusted as integers.
constexpr double k_exact_integer_limit = 9007199254740992.0;  // 2^53

}  // namespace

// ---------------------------------------------------------------- value readers

maybe_error read_string(element e, std::string_view path, std::string& out) {
    std::string_view s;
    if (e.get_string().get(s)) return wrong_type(path, "a string", e);
    out.assign(s);
    return std::nullopt;
}

maybe_error read_bool(element e, std::string_view path, bool& out) {
    if (e.get_bool().get(out)) return wrong_type(path, "a boolean", e);
    return std::nullopt;
}

maybe_error read_number(element e, std::string_view path, double& out) {
    if (!e.is_number()) return wrong_type(path, "a number", e);
    if (e.get_double().get(out)) return wrong_type(path, "a number", e);
    return std::nullopt;
}

maybe_error read_integer(element e, std::string_view path, int64_t& out) {
    switch (e.type()) {
        case simdjson::dom::element_type::INT64: out = e.get_int64().value_unsafe(); return std::nullopt;
        case simdjson::dom::element_type::UINT64:  // only produced above INT64_MAX
            return out_of_range(path, "at most 9223372036854775807", std::to_string(e.get_uint64().value_unsafe()));
        case simdjson::dom::element_type::DOUBLE: {
            const double d = e.get_double().value_unsafe();
            if (std::floor(d) != d) {
                std::string msg(path);
                msg.append(": expected an integer, got ").append(format_number(d));
                return bad_request(std::string(path), std::move(msg));
            }
            if (std::fabs(d) > k_exact_integer_limit)
                return out_of_range(path, "an integer of magnitude at most 2^53 when written as a decimal",
                                    format_number(d));
            out = static_cast<int64_t>(d);
            return std::nullopt;
        }
        default: return wrong_type(path, "an integer", e);
    }
}

maybe_error read_integer_in(element e, std::string_view path, int64_t lo, int64_t hi, int64_t& out) {
    int64_t v = 0;
    MS_API_TRY(read_integer(e, path, v));
    if (v < lo || v > hi) return out_of_range(path, integer_requirement(lo, hi), std::to_string(v));
    out = v;
    return std::nullopt;
}

maybe_error read_token_id(element e, std::string_view path, int64_t vocab, int32_t& out) {
    const int64_t hi = vocab > 0 ? std::min<int64_t>(vocab, int64_t{1} << 31) - 1 : std::numeric_limits<int32_t>::max();
    int64_t v = 0;
    MS_API_TRY(read_integer(e, path, v));
    if (v < 0 || v > hi) {
        std::string msg(path);
        msg.append(": token id ").append(std::to_string(v));
        if (vocab > 0) msg.append(" is outside the vocabulary [0, ").append(std::to_string(vocab)).append(")");
        else msg.append(" must be in [0, 2^31)");
        return bad_request(std::string(path), std::move(msg));
    }
    out = static_cast<int32_t>(v);
    return std::nullopt;
}

maybe_error read_float_in(element e, std::string_view path, const real_range& range, float& out) {
    double v = 0;
    MS_API_TRY(read_number(e, path, v));
    const bool lo_ok = range.lo_open ? v > range.lo : v >= range.lo;
    const bool hi_ok = range.hi_open ? v < range.hi : v <= range.hi;
    // The float conversion must not overflow either (an unbounded range still ends at FLT_MAX).
    if (!lo_ok || !hi_ok || std::fabs(v) > std::numeric_limits<float>::max())
        return out_of_range(path, real_requirement(range), format_number(v));
    out = static_cast<float>(v);
    return std::nullopt;
}

// ---------------------------------------------------------------- object_reader

std::optional<element> object_reader::get(std::string_view key) const {
    element e;
    if (obj_.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
}

maybe_error object_reader::opt_string(std::string_view key, std::string& out) const {
    if (auto e = get(key)) return read_string(*e, path(key), out);
    return std::nullopt;
}

maybe_error object_reader::opt_bool(std::string_view key, bool& out) const {
    if (auto e = get(key)) return read_bool(*e, path(key), out);
    return std::nullopt;
}

maybe_error object_reader::opt_float(std::string_view key, const real_range& range, float& out) const {
    if (auto e = get(key)) return read_float_in(*e, path(key), range, out);
    return std::nullopt;
}

maybe_error object_reader::opt_integer(std::string_view key, int64_t lo, int64_t hi,
                                       std::optional<int64_t>& out) const {
    if (auto e = get(key)) {
        int64_t v = 0;
        MS_API_TRY(read_integer_in(*e, path(key), lo, hi, v));
        out = v;
    }
    return std::nullopt;
}

maybe_error object_reader::opt_object(std::string_view key, std::optional<object_reader>& out) const {
    if (auto e = get(key)) {
        object o;
        if (e->get_object().get(o)) return wrong_type(path(key), "an object", *e);
        out.emplace(o, path(key));
    }
    return std::nullopt;
}

// ---------------------------------------------------------------- body

api_result<object> parse_body_object(simdjson::dom::parser& parser, std::string_view body) {
    size_t skipped = 0;  // offsets in messages count from the start of the body as sent
    if (body.size() >= 3 && body.substr(0, 3) == "\xEF\xBB\xBF") {
        body.remove_prefix(3);
        skipped = 3;
    }
    element root;
    const auto err = parser.parse(body.data(), body.size()).get(root);
    if (err == simdjson::EMPTY) return bad_request("", "the request body is empty (expected a JSON object)");
    if (err) {
        const auto where = locate_json_error(body);
        if (!where) {
            if (err == simdjson::UTF8_ERROR) return bad_request("", "invalid UTF-8 in the request body");
            return bad_request("", std::string("invalid JSON: ") + simdjson::error_message(err));
        }
        std::string msg = where->invalid_utf8 ? "invalid UTF-8 in the request body at byte "
                                              : "invalid JSON at byte ";
        msg.append(std::to_string(where->offset + skipped));
        if (!where->path.empty()) msg.append(" (in ").append(where->path).append(")");
        msg.append(": ").append(where->what);
        return bad_request(where->path, std::move(msg));
    }
    object o;
    if (root.get_object().get(o))
        return bad_request("", std::string("the request body must be a JSON object, got ") + json_type_name(root));
    return o;
}

// ---------------------------------------------------------------- locating a JSON error

namespace {

// A strict RFC 8259 scanner that stops at the first error. It only runs on bodies simdjson has
// already rejected, to say where; acceptance follows simdjson's (same number limits, escape and
// UTF-8 rules, nesting depth).
class json_scanner {
public:
    explicit json_scanner(std::string_view s) : s_(s) {}

    std::optional<json_error_location> run();

private:
    struct level {
        bool is_object;
        size_t index = 0;  // arrays: the element being read
        std::optional<std::string> key;  // objects: the key of the member being read
    };
    enum class state { value, first_key, key, after_value };

    std::optional<json_error_location> fail(std::string what, bool utf8 = false) const {
        return json_error_location{i_, current_path(false), std::move(what), utf8};
    }
    // After a complete value, what is wrong concerns its container, not the value.
    std::optional<json_error_location> fail_in_container(std::string what) const {
        return json_error_location{i_, current_path(true), std::move(what), false};
    }
    std::string current_path(bool container_only) const;
    void skip_ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    }
    bool at_end() const { return i_ >= s_.size(); }
    std::optional<json_error_location> scan_string(std::string* text);
    std::optional<json_error_location> scan_number();
    std::optional<json_error_location> scan_literal();
    std::optional<json_error_location> unexpected_character();

    std::string_view s_;
    size_t i_ = 0;
    std::vector<level> stack_;
};

std::string json_scanner::current_path(bool container_only) const {
    std::string p;
    const size_t n = stack_.size() - (container_only && !stack_.empty() ? 1 : 0);
    for (size_t k = 0; k < n; ++k) {
        const level& l = stack_[k];
        if (!l.is_object) {
            p = path_index(p, l.index);
        } else {
            if (!l.key) break;  // between members: the object itself is the place
            p = path_key(p, *l.key);
        }
    }
    return p;
}

std::optional<json_error_location> json_scanner::unexpected_character() {
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c >= 0x80 && utf8_sequence_length(s_, i_) == 0) return fail("not a UTF-8 sequence", true);
    std::string what = "unexpected character";
    if (c >= 0x21 && c < 0x7F) what.append(" '").append(1, static_cast<char>(c)).append("'");
    return fail(std::move(what));
}

std::optional<json_error_location> json_scanner::scan_string(std::string* text) {
    const auto hex4 = [&](size_t at, uint32_t& cp) {
        if (at + 4 > s_.size()) return false;
        cp = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = s_[at + k];
            uint32_t d;
            if (c >= '0' && c <= '9') d = uint32_t(c - '0');
            else if (c >= 'a' && c <= 'f') d = uint32_t(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') d = uint32_t(c - 'A' + 10);
            else return false;
            cp = cp * 16 + d;
        }
        return true;
    };
    const size_t start = ++i_;  // past the opening quote
    while (true) {
        if (at_end()) return fail("unterminated string");
        const unsigned char c = static_cast<unsigned char>(s_[i_]);
        if (c == '"') break;
        if (c < 0x20) return fail("control character in a string (it must be escaped)");
        if (c >= 0x80) {
            const size_t n = utf8_sequence_length(s_, i_);
            if (n == 0) return fail("not a UTF-8 sequence", true);
            i_ += n;
            continue;
        }
        if (c != '\\') {
            ++i_;
            continue;
        }
        if (i_ + 1 >= s_.size()) return fail("unterminated string");
        const char e = s_[i_ + 1];
        if (e == 'u') {
            uint32_t cp = 0;
            if (!hex4(i_ + 2, cp)) return fail("\\u must be followed by four hexadecimal digits");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("a \\u escape holds a lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t low = 0;
                if (i_ + 7 >= s_.size() || s_[i_ + 6] != '\\' || s_[i_ + 7] != 'u' || !hex4(i_ + 8, low) ||
                    low < 0xDC00 || low > 0xDFFF)
                    return fail("a \\u escape holds a high surrogate without its low surrogate");
                i_ += 6;
            }
            i_ += 6;
            continue;
        }
        if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't')
            return fail("invalid escape sequence");
        i_ += 2;
    }
    // Keys are kept as written (escapes included): only used in paths for messages.
    if (text) text->assign(s_.substr(start, i_ - start));
    ++i_;  // the closing quote
    return std::nullopt;
}

std::optional<json_error_location> json_scanner::scan_number() {
    const size_t start = i_;
    const auto digit = [&](size_t k) { return k < s_.size() && s_[k] >= '0' && s_[k] <= '9'; };
    if (s_[i_] == '-') ++i_;
    if (!digit(i_)) return fail("a number needs digits");
    if (s_[i_] == '0' && digit(i_ + 1)) return fail("numbers must not have leading zeros");
    while (digit(i_)) ++i_;
    bool integral = true;
    if (i_ < s_.size() && s_[i_] == '.') {
        integral = false;
        ++i_;
        if (!digit(i_)) return fail("a decimal point must be followed by digits");
        while (digit(i_)) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
        integral = false;
        ++i_;
        if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
        if (!digit(i_)) return fail("an exponent needs digits");
        while (digit(i_)) ++i_;
    }
    // The range simdjson accepts: integers of int64_t or uint64_t, finite doubles (underflow to
    // zero is fine).
    const char* b = s_.data() + start;
    const char* e = s_.data() + i_;
    bool too_big = false;
    if (integral && *b == '-') {
        int64_t v;
        too_big = std::from_chars(b, e, v).ec == std::errc::result_out_of_range;
    } else if (integral) {
        uint64_t v;
        too_big = std::from_chars(b, e, v).ec == std::errc::result_out_of_range;
    } else {
        double v;
        if (std::from_chars(b, e, v).ec == std::errc::result_out_of_range) {
            // Out of range is overflow or underflow; only overflow is an error.
            simdjson::dom::parser single;
            simdjson::dom::element ignored;
            too_big = single.parse(simdjson::padded_string(std::string_view(b, size_t(e - b)))).get(ignored) !=
                      simdjson::SUCCESS;
        }
    }
    if (too_big) {
        i_ = start;
        return fail("the number " + std::string(b, size_t(std::min<ptrdiff_t>(e - b, 40))) +
                    (e - b > 40 ? "..." : "") + " is out of the supported range (64-bit integers, finite doubles)");
    }
    return std::nullopt;
}

std::optional<json_error_location> json_scanner::scan_literal() {
    for (std::string_view lit : {std::string_view("true"), std::string_view("false"), std::string_view("null")}) {
        if (s_[i_] != lit[0]) continue;
        if (s_.substr(i_, lit.size()) != lit) return fail("invalid literal (expected " + std::string(lit) + ")");
        i_ += lit.size();
        if (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_])))
            return fail("invalid literal (expected " + std::string(lit) + ")");
        return std::nullopt;
    }
    return unexpected_character();
}

std::optional<json_error_location> json_scanner::run() {
    // simdjson's default maximum depth.
    constexpr size_t k_max_depth = simdjson::DEFAULT_MAX_DEPTH;
    state st = state::value;
    while (true) {
        skip_ws();
        switch (st) {
            case state::value: {
                if (at_end()) return fail("unexpected end of the body (truncated JSON?)");
                const char c = s_[i_];
                if (c == '{' || c == '[') {
                    if (stack_.size() >= k_max_depth)
                        return fail("nesting deeper than " + std::to_string(k_max_depth) + " levels");
                    stack_.push_back(level{c == '{', 0, std::nullopt});
                    ++i_;
                    st = c == '{' ? state::first_key : state::value;
                    if (c == '[') {
                        skip_ws();
                        if (!at_end() && s_[i_] == ']') {
                            ++i_;
                            stack_.pop_back();
                            st = state::after_value;
                        }
                    }
                    continue;
                }
                std::optional<json_error_location> err;
                if (c == '"') err = scan_string(nullptr);
                else if (c == '-' || (c >= '0' && c <= '9')) err = scan_number();
                else if (c == 't' || c == 'f' || c == 'n') err = scan_literal();
                else err = unexpected_character();
                if (err) return err;
                st = state::after_value;
                continue;
            }
            case state::first_key:
                if (!at_end() && s_[i_] == '}') {
                    ++i_;
                    stack_.pop_back();
                    st = state::after_value;
                    continue;
                }
                [[fallthrough]];
            case state::key: {
                if (at_end()) return fail("unexpected end of the body (truncated JSON?)");
                if (s_[i_] != '"') {
                    if (static_cast<unsigned char>(s_[i_]) >= 0x80) return unexpected_character();
                    return fail("expected a string key");
                }
                std::string key;
                if (auto err = scan_string(&key)) return err;
                stack_.back().key = std::move(key);
                skip_ws();
                if (at_end()) return fail("unexpected end of the body (truncated JSON?)");
                if (s_[i_] != ':') return fail("expected ':' after a key");
                ++i_;
                st = state::value;
                continue;
            }
            case state::after_value: {
                if (stack_.empty()) {
                    if (!at_end()) return fail("unexpected content after the JSON value");
                    return std::nullopt;
                }
                if (at_end()) return fail_in_container("unexpected end of the body (truncated JSON?)");
                level& top = stack_.back();
                const char close = top.is_object ? '}' : ']';
                if (s_[i_] == ',') {
                    ++i_;
                    if (top.is_object) {
                        top.key.reset();
                        st = state::key;
                    } else {
                        ++top.index;
                        st = state::value;
                    }
                } else if (s_[i_] == close) {
                    ++i_;
                    stack_.pop_back();
                } else {
                    return fail_in_container(top.is_object ? "expected ',' or '}'" : "expected ',' or ']'");
                }
                continue;
            }
        }
    }
}

}  // namespace

std::optional<json_error_location> locate_json_error(std::string_view text) { return json_scanner(text).run(); }

}  // namespace moestream::server::detail
