// A byte-level, incremental recogniser of one JSON document (RFC 8259), for constrained decoding
// (server/output_constraint.h): it tells whether some bytes can continue a valid document and how
// many bytes at least finish it, so a sampler can be kept on documents that are valid and that
// end. Its state is a small copyable value (no allocation), so a caller can try many
// continuations from one state.
//
// What it accepts, beyond the RFC's grammar (all deliberate, for generated text):
//  - Exactly one value and nothing around it: no whitespace before the top-level value, no byte
//    after a top-level container or string (a top-level number may always take more digits).
//    With `object_only` (the default) the value must be an object.
//  - Whitespace between tokens is bounded: at most `max_whitespace` consecutive bytes (a random
//    model would otherwise emit spaces forever).
//  - Nesting is bounded: opening a container at `max_depth` open ones is rejected.
//  - Strings hold valid UTF-8 only (no overlong forms, surrogates or code points above
//    U+10FFFF), no raw control characters, only the RFC's escapes; a \u escape of a high
//    surrogate must be followed by the escape of a low one, a lone low surrogate is rejected
//    (as soon as its first two hex digits make it certain), so every accepted document decodes.
//  - `banned_char`: a code point strings may not contain raw (it may still be written as a \u
//    escape). DeepSeek's control markers all contain U+FF5C, so banning it keeps a generated
//    JSON text from ever containing marker text that a tool-call parser would act on.
//  - Numbers are bounded so that every JSON parser reads them as finite doubles (simdjson, for
//    one, refuses 1e400): at most 15 integer digits, 15 fraction digits and 2 exponent digits.
//  - Empty keys and duplicate keys are accepted (both are valid JSON; tracking duplicates would
//    need unbounded state).
// Every state it can reach can still complete: min_bytes_to_complete() is finite and some byte
// decreases it by exactly one (the closing path), which is what makes forced endings possible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moestream::server {

struct json_limits {
    uint8_t max_depth = 32;       // 1..64
    uint8_t max_whitespace = 4;   // consecutive whitespace bytes between tokens
    bool object_only = true;      // the top-level value must be an object
    char32_t banned_char = 0;     // 0: none
    bool operator==(const json_limits&) const = default;
};

class json_automaton {
  public:
    explicit json_automaton(json_limits limits = {});

    // Feeds bytes; false (and the state unchanged) when they cannot continue a valid document.
    bool feed(std::string_view bytes);
    // One byte, for hot loops that try continuations on copies: on false the state is left
    // unspecified, so step a copy.
    bool step(uint8_t b);

    // A whole value has been read (for a top-level object or array: its closing bracket came).
    bool complete() const;
    // The fewest bytes that finish the document from here (0 when complete).
    size_t min_bytes_to_complete() const;
    int depth() const { return depth_; }
    // Inside a string, between characters: any whole UTF-8 character other than controls, '"',
    // '\\' and the banned one leaves the state as it is (but for the length).
    bool in_string_text() const { return mode_ == mode::string && sub_ == plain; }
    const json_limits& limits() const { return limits_; }
    bool operator==(const json_automaton&) const = default;

  private:
    enum class mode : uint8_t {
        value,         // a value must come: the top level, after ':' or after ',' in an array
        array_first,   // after '[': a value or ']'
        object_first,  // after '{': a key or '}'
        key,           // after ',' in an object: a key
        colon,         // after a key
        after_value,   // after a value in a container: ',' or its closer
        string,        // inside a string (key_ says whether it is a key); sub_ is a string_part
        number,        // sub_ is a number_part
        literal,       // true / false / null; sub_ = which, pos_ = bytes matched
        done,          // the top-level value is complete; nothing may follow
    };
    enum string_part : uint8_t { plain, utf8, escape, hex, low_backslash, low_u, low_hex };
    enum number_part : uint8_t { minus, zero, integer, frac_start, fraction, exp_start, exp_sign, exponent };

    bool start_value(uint8_t b);
    bool step_string(uint8_t b);
    bool step_number(uint8_t b);
    bool whitespace(uint8_t b);
    bool open(bool object);
    bool close(bool object);
    void value_done();
    bool in_object() const { return depth_ > 0 && ((stack_ >> (depth_ - 1)) & 1u) != 0; }
    size_t string_rest() const;

    uint64_t stack_ = 0;  // bit d: the container at depth d + 1 is an object
    uint32_t code_ = 0;   // code point or \u value being read
    json_limits limits_;
    mode mode_ = mode::value;
    uint8_t sub_ = 0;
    uint8_t pos_ = 0;     // literal bytes matched; UTF-8 continuation bytes left; hex digits read;
                          // digits in the number's current part
    uint8_t depth_ = 0;
    uint8_t ws_ = 0;      // consecutive whitespace bytes so far
    uint8_t lo_ = 0, hi_ = 0;  // the range of the next UTF-8 continuation byte
    bool key_ = false;
};

}  // namespace moestream::server
