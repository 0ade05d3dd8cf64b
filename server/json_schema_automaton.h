// A byte-level, incremental recogniser of the values of one json_schema (server/json_schema.h),
// for constrained decoding: the schema counterpart of json_automaton (server/json_constraint.h),
// which it uses for the syntax of strings, numbers, literals and the parts the schema leaves free.
//
// The state is a few "threads", each a complete deterministic reading of the bytes so far: one
// normally; an anyOf/oneOf whose alternatives all fit the value's first byte (two object shapes,
// say) starts one thread per alternative, and a thread ends when its alternative stops fitting
// (at most k_threads at once: further alternatives are not followed, which narrows the choice
// but never admits an invalid value). A thread holds a stack of the constrained containers it is
// in (objects: which property comes next, the key being read; arrays: the items so far) and the
// innermost value's state (a string's length, a number's digits for its bounds, an enum text's
// trie node).
//
// As json_automaton: feed()/step() refuse bytes that cannot continue a valid value,
// min_bytes_to_complete() is exactly the fewest bytes that finish one (the minimum over the
// threads), and some byte always lowers it by one, so a constraint can force an ending.
// Whitespace between tokens is bounded by json_limits::max_whitespace, U+FF5C is refused raw
// in strings when json_limits::banned_char says so, and the root value is an object.
// Copies are cheap: only the live threads are copied.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "server/json_constraint.h"
#include "server/json_schema.h"

namespace moestream::server {

class schema_automaton {
  public:
    static constexpr int k_threads = 4;
    static constexpr int k_frames = json_schema::k_max_depth;

    schema_automaton() = default;  // recognises nothing (a placeholder in cursors)
    // `schema` must outlive the automaton (output_constraint keeps it).
    schema_automaton(const json_schema* schema, json_limits limits);
    schema_automaton(const schema_automaton& o) { copy_from(o); }
    schema_automaton& operator=(const schema_automaton& o) {
        copy_from(o);
        return *this;
    }

    // Feeds bytes; false (and the state unchanged) when they cannot continue a valid value.
    bool feed(std::string_view bytes);
    // One byte; on false the state is unspecified (step a copy).
    bool step(uint8_t b);
    bool complete() const;
    size_t min_bytes_to_complete() const;
    int threads() const { return n_; }
    bool valid() const { return schema_ != nullptr; }

    // For the mask's shortcut (output_constraint.h): inside a string's text, the text tokens
    // (whole characters and escapes, no closing quote) allowed at once, given that a token is
    // allowed when the cost after it is at most `limit`. applies: every thread is between
    // characters of a string whose text such tokens continue, so no text token needs a walk;
    // then the allowed ones are those without a backslash of at most plain_chars characters, and
    // those with one of at most escaped_chars (escaped: any at all).
    struct text_run {
        bool applies = false;
        uint32_t plain_chars = 0;
        bool escaped = false;
        uint32_t escaped_chars = 0;
    };
    text_run string_text(uint64_t limit) const;

  private:
    // No default member initializers: threads are made by value-initialisation (thread{},
    // zeroed) or copied, so the unused slots of an automaton cost nothing to construct.
    struct frame {
        uint16_t node;
        uint8_t phase;
        uint8_t flags;
        uint16_t pos;  // object: the next property that may come; array: items so far (saturating)
        uint32_t aux;  // object: the key's trie node while it is read, then its property
        bool operator==(const frame&) const = default;
    };
    struct thread {
        json_automaton scalar;  // the string, number, literal or free value being read; a key
        json_schema::number_prefix number;
        uint32_t number_rest;  // bounded numbers: json_schema::number_rest of the prefix
        uint32_t count;        // string: characters so far; enum text: trie node
        uint32_t node;         // the innermost value's schema node
        uint8_t depth, slot, ws;
        std::array<frame, k_frames> frames;  // [depth, k_frames) are zero
        bool operator==(const thread&) const = default;
    };
    // Threads an anyOf started at this byte, beyond the one stepped in place.
    using forks = std::vector<thread>;

    void copy_from(const schema_automaton& o);
    json_limits scalar_limits(const thread& t) const;
    bool step_thread(thread& t, uint8_t b, forks& f) const;
    bool start_value(thread& t, uint32_t node, uint8_t b, forks& f) const;
    bool start_plain(thread& t, uint32_t node, uint8_t b) const;
    bool start_scalar(thread& t, uint32_t node, uint8_t slot, uint8_t b) const;
    bool push(thread& t, uint32_t node, bool array) const;
    bool pop(thread& t) const;
    void value_done(thread& t) const;
    bool whitespace(thread& t) const;
    bool string_byte(thread& t, uint8_t b) const;
    bool number_byte(thread& t, uint8_t b, forks& f) const;
    bool track_number(thread& t, uint8_t b) const;
    bool literal_byte(thread& t, uint8_t b, forks& f) const;
    bool container_byte(thread& t, uint8_t b, forks& f) const;
    bool object_byte(thread& t, frame& fr, uint8_t b) const;
    bool array_byte(thread& t, frame& fr, uint8_t b, forks& f) const;
    bool begin_key(thread& t, frame& fr) const;
    bool key_byte(thread& t, frame& fr, uint8_t b) const;
    uint64_t allowed_properties(const frame& fr) const;
    bool free_key_allowed(const frame& fr) const;
    size_t thread_cost(const thread& t) const;
    size_t frame_rest(const thread& t, const frame& fr, bool top) const;
    size_t key_rest(const thread& t, const frame& fr, bool exact_costs_one) const;
    size_t free_key_rest(const thread& t, const frame& fr, bool assume_exact) const;

    const json_schema* schema_ = nullptr;
    json_limits limits_;
    uint8_t n_ = 0;
    std::array<thread, k_threads> t_;  // [0, n_) are live
};

}  // namespace moestream::server
