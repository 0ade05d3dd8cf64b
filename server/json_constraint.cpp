#include "server/json_constraint.h"

#include "config/assert.h"

namespace moestream::server {

namespace {

constexpr std::string_view k_literals[3] = {"true", "false", "null"};
// Digits per part of a number: 1e15 is exact in a double, and no exponent overflows it.
constexpr uint8_t k_max_integer_digits = 15, k_max_fraction_digits = 15, k_max_exponent_digits = 2;

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
int hex_value(uint8_t b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return -1;
}

// The values a \u escape with `digits` hex digits read so far (value `prefix`) can still take.
uint32_t range_lo(uint32_t prefix, int digits) { return prefix << (4 * (4 - digits)); }
uint32_t range_hi(uint32_t prefix, int digits) { return ((prefix + 1) << (4 * (4 - digits))) - 1; }
bool forced_high_surrogate(uint32_t prefix, int digits) {
    return digits >= 2 && range_lo(prefix, digits) >= 0xD800 && range_hi(prefix, digits) <= 0xDBFF;
}

}  // namespace

json_automaton::json_automaton(json_limits limits) : limits_(limits) {
    MS_ASSERT(limits_.max_depth >= 1 && limits_.max_depth <= 64);
}

bool json_automaton::feed(std::string_view bytes) {
    json_automaton next = *this;
    for (char c : bytes)
        if (!next.step(uint8_t(c))) return false;
    *this = next;
    return true;
}

bool json_automaton::complete() const {
    if (mode_ == mode::done) return true;
    return mode_ == mode::number && depth_ == 0 &&
           (sub_ == zero || sub_ == integer || sub_ == fraction || sub_ == exponent);
}

size_t json_automaton::string_rest() const {
    switch (sub_) {
        case plain: return 1;
        case utf8: return size_t(pos_) + 1;
        case escape: return 2;
        case hex: return size_t(4 - pos_) + (forced_high_surrogate(code_, pos_) ? 6 : 0) + 1;
        case low_backslash: return 7;
        case low_u: return 6;
        case low_hex: return size_t(4 - pos_) + 1;
    }
    MS_ASSERT_MSG(false, "json_automaton: bad string state");
    return 0;
}

size_t json_automaton::min_bytes_to_complete() const {
    const size_t closers = depth_;
    switch (mode_) {
        case mode::done: return 0;
        case mode::value:
            if (depth_ == 0) return limits_.object_only ? 2 : 1;  // "{}" or "0"
            return 1 + closers;
        case mode::array_first:
        case mode::object_first:
        case mode::after_value: return closers;
        case mode::key: return 4 + closers;  // "":0
        case mode::colon: return 2 + closers;  // :0
        case mode::string: return string_rest() + (key_ ? 2 : 0) + closers;
        case mode::number:
            return (sub_ == minus || sub_ == frac_start || sub_ == exp_start || sub_ == exp_sign ? 1 : 0) + closers;
        case mode::literal: return k_literals[sub_].size() - pos_ + closers;
    }
    MS_ASSERT_MSG(false, "json_automaton: bad mode");
    return 0;
}

void json_automaton::value_done() {
    mode_ = depth_ == 0 ? mode::done : mode::after_value;
    ws_ = 0;
}

bool json_automaton::open(bool object) {
    if (depth_ >= limits_.max_depth) return false;
    if (object) stack_ |= uint64_t(1) << depth_;
    else stack_ &= ~(uint64_t(1) << depth_);
    ++depth_;
    mode_ = object ? mode::object_first : mode::array_first;
    ws_ = 0;
    return true;
}

bool json_automaton::close(bool object) {
    if (depth_ == 0 || in_object() != object) return false;
    --depth_;
    value_done();
    return true;
}

bool json_automaton::whitespace(uint8_t b) {
    if (!is_ws(b) || ws_ >= limits_.max_whitespace) return false;
    ++ws_;
    return true;
}

bool json_automaton::start_value(uint8_t b) {
    if (depth_ == 0 && limits_.object_only && b != '{') return false;
    ws_ = 0;
    switch (b) {
        case '{': return open(true);
        case '[': return open(false);
        case '"':
            mode_ = mode::string;
            sub_ = plain;
            key_ = false;
            return true;
        case '-': mode_ = mode::number, sub_ = minus, pos_ = 0; return true;
        case '0': mode_ = mode::number, sub_ = zero, pos_ = 1; return true;
        case 't': mode_ = mode::literal, sub_ = 0, pos_ = 1; return true;
        case 'f': mode_ = mode::literal, sub_ = 1, pos_ = 1; return true;
        case 'n': mode_ = mode::literal, sub_ = 2, pos_ = 1; return true;
        default:
            if (b >= '1' && b <= '9') {
                mode_ = mode::number;
                sub_ = integer;
                pos_ = 1;
                return true;
            }
            return false;
    }
}

bool json_automaton::step_string(uint8_t b) {
    switch (sub_) {
        case plain:
            if (b == '"') {
                if (key_) {
                    mode_ = mode::colon;
                    ws_ = 0;
                } else {
                    value_done();
                }
                return true;
            }
            if (b == '\\') {
                sub_ = escape;
                return true;
            }
            if (b < 0x20) return false;
            if (b < 0x80) return true;
            // A UTF-8 lead byte: how many continuation bytes follow, and the range of the first
            // one (which excludes overlong forms, surrogates and values above U+10FFFF).
            lo_ = 0x80, hi_ = 0xBF;
            if (b >= 0xC2 && b <= 0xDF) {
                pos_ = 1, code_ = b & 0x1Fu;
            } else if (b >= 0xE0 && b <= 0xEF) {
                pos_ = 2, code_ = b & 0x0Fu;
                if (b == 0xE0) lo_ = 0xA0;
                if (b == 0xED) hi_ = 0x9F;
            } else if (b >= 0xF0 && b <= 0xF4) {
                pos_ = 3, code_ = b & 0x07u;
                if (b == 0xF0) lo_ = 0x90;
                if (b == 0xF4) hi_ = 0x8F;
            } else {
                return false;
            }
            sub_ = utf8;
            return true;
        case utf8:
            if (b < lo_ || b > hi_) return false;
            code_ = (code_ << 6) | (b & 0x3Fu);
            lo_ = 0x80, hi_ = 0xBF;
            if (--pos_ == 0) {
                if (limits_.banned_char != 0 && code_ == limits_.banned_char) return false;
                sub_ = plain;
            }
            return true;
        case escape:
            switch (b) {
                case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                    sub_ = plain;
                    return true;
                case 'u':
                    sub_ = hex, pos_ = 0, code_ = 0;
                    return true;
                default: return false;
            }
        case hex: {
            const int v = hex_value(b);
            if (v < 0) return false;
            code_ = (code_ << 4) | uint32_t(v);
            ++pos_;
            // A lone low surrogate is rejected as soon as every completion would be one.
            if (range_lo(code_, pos_) >= 0xDC00 && range_hi(code_, pos_) <= 0xDFFF) return false;
            if (pos_ == 4) sub_ = code_ >= 0xD800 && code_ <= 0xDBFF ? low_backslash : plain;
            return true;
        }
        case low_backslash:
            if (b != '\\') return false;
            sub_ = low_u;
            return true;
        case low_u:
            if (b != 'u') return false;
            sub_ = low_hex, pos_ = 0;
            return true;
        case low_hex: {
            const int v = hex_value(b);
            if (v < 0) return false;
            if (pos_ == 0 && v != 0xD) return false;
            if (pos_ == 1 && v < 0xC) return false;
            if (++pos_ == 4) sub_ = plain;
            return true;
        }
    }
    return false;
}

bool json_automaton::step_number(uint8_t b) {
    const bool digit = is_digit(b);
    switch (sub_) {
        case minus:
            if (!digit) return false;
            sub_ = b == '0' ? zero : integer;
            pos_ = 1;
            return true;
        case zero:
        case integer:
            if (digit && sub_ == integer) {
                if (pos_ >= k_max_integer_digits) return false;
                ++pos_;
                return true;
            }
            if (b == '.') {
                sub_ = frac_start;
                return true;
            }
            if (b == 'e' || b == 'E') {
                sub_ = exp_start;
                return true;
            }
            break;
        case frac_start:
            if (!digit) return false;
            sub_ = fraction;
            pos_ = 1;
            return true;
        case fraction:
            if (digit) {
                if (pos_ >= k_max_fraction_digits) return false;
                ++pos_;
                return true;
            }
            if (b == 'e' || b == 'E') {
                sub_ = exp_start;
                return true;
            }
            break;
        case exp_start:
            if (b == '+' || b == '-') {
                sub_ = exp_sign;
                return true;
            }
            if (!digit) return false;
            sub_ = exponent;
            pos_ = 1;
            return true;
        case exp_sign:
            if (!digit) return false;
            sub_ = exponent;
            pos_ = 1;
            return true;
        case exponent:
            if (digit) {
                if (pos_ >= k_max_exponent_digits) return false;
                ++pos_;
                return true;
            }
            break;
    }
    // The number ended before `b` (a digit after a leading zero lands here too and is refused
    // below, since no token may follow a value without a separator).
    value_done();
    return step(b);
}

bool json_automaton::step(uint8_t b) {
    switch (mode_) {
        case mode::value:
            if (depth_ > 0 && is_ws(b)) return whitespace(b);
            return start_value(b);
        case mode::array_first:
            if (is_ws(b)) return whitespace(b);
            if (b == ']') return close(false);
            return start_value(b);
        case mode::object_first:
        case mode::key:
            if (is_ws(b)) return whitespace(b);
            if (b == '}' && mode_ == mode::object_first) return close(true);
            if (b != '"') return false;
            mode_ = mode::string;
            sub_ = plain;
            key_ = true;
            return true;
        case mode::colon:
            if (is_ws(b)) return whitespace(b);
            if (b != ':') return false;
            mode_ = mode::value;
            ws_ = 0;
            return true;
        case mode::after_value:
            if (is_ws(b)) return whitespace(b);
            if (b == ',') {
                mode_ = in_object() ? mode::key : mode::value;
                ws_ = 0;
                return true;
            }
            if (b == '}' || b == ']') return close(b == '}');
            return false;
        case mode::string: return step_string(b);
        case mode::number: return step_number(b);
        case mode::literal: {
            const std::string_view lit = k_literals[sub_];
            if (b != uint8_t(lit[pos_])) return false;
            if (++pos_ == lit.size()) value_done();
            return true;
        }
        case mode::done: return false;
    }
    return false;
}

}  // namespace moestream::server
