// A streaming JSON writer: every response body and SSE event of the server is built with it, never
// by string concatenation, so the output is always one well-formed JSON text in valid UTF-8:
//  - commas and colons are placed automatically;
//  - keys and strings are escaped per RFC 8259: '"' and '\\' with a backslash, the control
//    characters \b \f \n \r \t in their short form and every other one below 0x20 as \u00XX;
//  - ill-formed UTF-8 in a key or string becomes U+FFFD, one per maximal subpart of the broken
//    sequence (the Unicode / WHATWG decoding practice): a lone continuation byte, a truncated
//    sequence, an overlong form (C0 80), a surrogate (ED A0 80) or a value above U+10FFFF never
//    reaches the client, whatever the model or the tokenizer produced;
//  - finite doubles are written in the shortest form that reads back to the same value
//    (std::to_chars), NaN and infinities as null (JSON has no spelling for them).
// Misuse (a value in an object without a key, a key outside an object, an unbalanced end, a
// second root value) is a programmer error and asserts.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace moestream::server {

class json_writer {
public:
    // Appends to `out` (which may already hold text, e.g. an SSE "data: " prefix).
    explicit json_writer(std::string& out);

    json_writer& begin_object();
    json_writer& end_object();
    json_writer& begin_array();
    json_writer& end_array();
    json_writer& key(std::string_view k);

    json_writer& value(std::string_view s);  // a string
    json_writer& value(const char* s);       // a string (not a bool, as a pointer would convert)
    json_writer& value(const std::string& s) { return value(std::string_view(s)); }
    json_writer& value(bool b);
    json_writer& value(int32_t v);
    json_writer& value(uint32_t v);
    json_writer& value(int64_t v);
    json_writer& value(uint64_t v);
    // Any other integer type (long long, short, size_t where it is not uint64_t, ...).
    template <std::integral T>
        requires(!std::same_as<T, bool> && !std::same_as<T, char>)
    json_writer& value(T v) {
        if constexpr (std::is_signed_v<T>) return value(static_cast<int64_t>(v));
        else return value(static_cast<uint64_t>(v));
    }
    json_writer& value(double v);
    json_writer& value(float v);  // shortest form of the float itself: 0.8f is 0.8, not 0.800000011920929
    json_writer& value(char c) = delete;  // a number or a one-character string? Say which.
    json_writer& null();
    // A pre-serialised JSON value, inserted verbatim: the caller guarantees it is one valid JSON
    // value (e.g. a tool's "parameters" kept as text).
    json_writer& raw(std::string_view json);

    // key(k) then value(v).
    template <class T>
    json_writer& member(std::string_view k, const T& v) {
        key(k);
        return value(v);
    }

    // True once one complete root value has been written.
    bool complete() const { return root_done_ && stack_.empty(); }

private:
    struct frame {
        bool is_object;
        bool has_members = false;
        bool key_pending = false;  // objects: a key was written, its value is due
    };
    void before_value();  // comma / key bookkeeping for a value about to be written
    void after_container_end();

    std::string& out_;
    std::vector<frame> stack_;
    bool root_done_ = false;
};

// Appends `s` as a quoted, escaped JSON string to `out` (the writer's string rules).
void append_json_string(std::string& out, std::string_view s);
// `s` as a quoted, escaped JSON string.
std::string json_escape(std::string_view s);

// Length of the well-formed UTF-8 sequence that starts at s[i] (1 to 4), or 0 when the bytes from
// s[i] on are not a well-formed sequence (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF, no truncation). Requires i < s.size().
size_t utf8_sequence_length(std::string_view s, size_t i);
// For an ill-formed sequence at s[i]: the length of its maximal subpart (the bytes a decoder
// replaces with one U+FFFD), at least 1. Requires i < s.size().
size_t utf8_invalid_length(std::string_view s, size_t i);
// True when the whole of `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

}  // namespace moestream::server
