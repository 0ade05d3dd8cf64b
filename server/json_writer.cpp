#include "server/json_writer.h"

#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "config/assert.h"

namespace moestream::server {

// ---------------------------------------------------------------- UTF-8

namespace {

inline bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The allowed range of the second byte after a given lead byte (RFC 3629 table 3-7): the narrow
// ranges after E0, ED, F0 and F4 are what exclude overlong forms, surrogates and > U+10FFFF.
struct lead_info {
    size_t length;  // 0: never a lead byte
    unsigned char second_lo, second_hi;
};

lead_info classify_lead(unsigned char c) {
    if (c < 0x80) return {1, 0, 0};
    if (c < 0xC2) return {0, 0, 0};  // continuation bytes and the overlong leads C0, C1
    if (c < 0xE0) return {2, 0x80, 0xBF};
    if (c == 0xE0) return {3, 0xA0, 0xBF};
    if (c == 0xED) return {3, 0x80, 0x9F};
    if (c < 0xF0) return {3, 0x80, 0xBF};
    if (c == 0xF0) return {4, 0x90, 0xBF};
    if (c < 0xF4) return {4, 0x80, 0xBF};
    if (c == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};  // F5..FF
}

// How many bytes from s[i] on form a valid prefix of the sequence s[i] leads (the maximal
// subpart when the whole sequence is not there).
size_t valid_prefix(std::string_view s, size_t i, const lead_info& lead) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
    if (lead.length == 0) return 0;
    size_t n = 1;
    if (lead.length == 1) return 1;
    if (i + 1 >= s.size() || b(1) < lead.second_lo || b(1) > lead.second_hi) return n;
    ++n;
    while (n < lead.length && i + n < s.size() && is_continuation(b(n))) ++n;
    return n;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
    MS_ASSERT(i < s.size());
    const lead_info lead = classify_lead(static_cast<unsigned char>(s[i]));
    const size_t n = valid_prefix(s, i, lead);
    return n == lead.length ? n : 0;
}

size_t utf8_invalid_length(std::string_view s, size_t i) {
    MS_ASSERT(i < s.size());
    const size_t n = valid_prefix(s, i, classify_lead(static_cast<unsigned char>(s[i])));
    return n == 0 ? 1 : n;
}

bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        if (static_cast<unsigned char>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t n = utf8_sequence_length(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

// ---------------------------------------------------------------- strings

void append_json_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out.reserve(out.size() + s.size() + 2);
    out.push_back('"');
    size_t run = 0;  // start of the pending run of bytes that need no escaping
    const auto flush = [&](size_t end) { out.append(s.data() + run, end - run); };
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0x80) {
            const size_t n = utf8_sequence_length(s, i);
            if (n != 0) {
                i += n;
                continue;
            }
            flush(i);
            out.append("\xEF\xBF\xBD");  // U+FFFD
            i += utf8_invalid_length(s, i);
            run = i;
            continue;
        }
        flush(i);
        switch (c) {
            case '"': out.append("\\\""); break;
            case '\\': out.append("\\\\"); break;
            case '\b': out.append("\\b"); break;
            case '\f': out.append("\\f"); break;
            case '\n': out.append("\\n"); break;
            case '\r': out.append("\\r"); break;
            case '\t': out.append("\\t"); break;
            default: {
                const char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xF]};
                out.append(esc, sizeof esc);
            }
        }
        ++i;
        run = i;
    }
    flush(s.size());
    out.push_back('"');
}

std::string json_escape(std::string_view s) {
    std::string out;
    append_json_string(out, s);
    return out;
}

// ---------------------------------------------------------------- writer

json_writer::json_writer(std::string& out) : out_(out) {}

void json_writer::before_value() {
    if (stack_.empty()) {
        MS_ASSERT_MSG(!root_done_, "json_writer: a second root value");
        return;
    }
    frame& f = stack_.back();
    if (f.is_object) {
        MS_ASSERT_MSG(f.key_pending, "json_writer: a value in an object needs a key first");
        f.key_pending = false;
    } else {
        if (f.has_members) out_.push_back(',');
        f.has_members = true;
    }
}

void json_writer::after_container_end() {
    if (stack_.empty()) root_done_ = true;
}

json_writer& json_writer::begin_object() {
    before_value();
    out_.push_back('{');
    stack_.push_back({true});
    return *this;
}

json_writer& json_writer::end_object() {
    MS_ASSERT_MSG(!stack_.empty() && stack_.back().is_object, "json_writer: end_object without an open object");
    MS_ASSERT_MSG(!stack_.back().key_pending, "json_writer: end_object after a key without its value");
    stack_.pop_back();
    out_.push_back('}');
    after_container_end();
    return *this;
}

json_writer& json_writer::begin_array() {
    before_value();
    out_.push_back('[');
    stack_.push_back({false});
    return *this;
}

json_writer& json_writer::end_array() {
    MS_ASSERT_MSG(!stack_.empty() && !stack_.back().is_object, "json_writer: end_array without an open array");
    stack_.pop_back();
    out_.push_back(']');
    after_container_end();
    return *this;
}

json_writer& json_writer::key(std::string_view k) {
    MS_ASSERT_MSG(!stack_.empty() && stack_.back().is_object, "json_writer: a key outside an object");
    frame& f = stack_.back();
    MS_ASSERT_MSG(!f.key_pending, "json_writer: two keys in a row");
    if (f.has_members) out_.push_back(',');
    f.has_members = true;
    f.key_pending = true;
    append_json_string(out_, k);
    out_.push_back(':');
    return *this;
}

json_writer& json_writer::value(std::string_view s) {
    before_value();
    append_json_string(out_, s);
    after_container_end();
    return *this;
}

json_writer& json_writer::value(const char* s) {
    MS_ASSERT_MSG(s != nullptr, "json_writer: value(nullptr); use null()");
    return value(std::string_view(s));
}

json_writer& json_writer::value(bool b) {
    before_value();
    out_.append(b ? "true" : "false");
    after_container_end();
    return *this;
}

namespace {
template <class T>
void append_number(std::string& out, T v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    MS_ASSERT(r.ec == std::errc());
    if constexpr (std::is_floating_point_v<T>) {
        // The shortest form of a large integral value is a plain digit string (1e20 ->
        // "100000000000000000000"), which simdjson and other int64-minded readers reject as an
        // integer out of range: beyond 2^53 write it with an exponent instead.
        if (std::fabs(v) >= T(9007199254740992.0) && std::string_view(buf, r.ptr).find_first_of(".e") == std::string_view::npos) {
            r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
            MS_ASSERT(r.ec == std::errc());
        }
    }
    out.append(buf, r.ptr);
}
}  // namespace

json_writer& json_writer::value(int32_t v) { return value(static_cast<int64_t>(v)); }
json_writer& json_writer::value(uint32_t v) { return value(static_cast<uint64_t>(v)); }

json_writer& json_writer::value(int64_t v) {
    before_value();
    append_number(out_, v);
    after_container_end();
    return *this;
}

json_writer& json_writer::value(uint64_t v) {
    before_value();
    append_number(out_, v);
    after_container_end();
    return *this;
}

json_writer& json_writer::value(double v) {
    if (!std::isfinite(v)) return null();
    before_value();
    append_number(out_, v);
    after_container_end();
    return *this;
}

json_writer& json_writer::value(float v) {
    if (!std::isfinite(v)) return null();
    before_value();
    append_number(out_, v);
    after_container_end();
    return *this;
}

json_writer& json_writer::null() {
    before_value();
    out_.append("null");
    after_container_end();
    return *this;
}

json_writer& json_writer::raw(std::string_view json) {
    MS_ASSERT_MSG(!json.empty(), "json_writer: raw() needs one JSON value, got nothing");
    before_value();
    out_.append(json);
    after_container_end();
    return *this;
}

}  // namespace moestream::server
