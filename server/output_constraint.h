// The output constraints of the server (scheduler/token_constraint.h): what OpenAI's
// tool_choice "required" / a named function and response_format json_object promise, made
// certain by masking the sampler instead of hoping the model complies.
//
// Shapes (byte level: a marker may come as its single added token or spelled by ordinary tokens;
// the output parser reads text, so both give the same result):
//  - JSON object: exactly one JSON object (server/json_constraint.h), nothing before or after;
//    the request ends ("stop") at its closing brace.
//  - forced tool call: exactly one DeepSeek-V3 call, ending the request when complete:
//      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//    NAME one of the allowed names exactly, ARGS a JSON object. One call even when
//    parallel_tool_calls is true (a later extension could allow a further call after the first).
//    The output starts with the call: the model does not reason first.
// In both, strings may not contain a raw U+FF5C (every DeepSeek marker has it), so the JSON never
// holds text a tool-call parser would act on; it may be written as \uff5c.
// Added (special) tokens other than the markers the shape needs are never allowed, in
// particular not the end-of-sequence token: the constraint itself ends the request.
//
// Termination (needed even by a model that never wants to stop, e.g. our random-weight test
// models): cost() is an upper bound on the tokens that finish the output from a state (JSON
// bytes and name bytes count one each, an unstarted marker one, a partly spelled marker one per
// byte left); every state has a token that lowers it by one, as long as every single byte is
// itself a token (true of byte-level BPE vocabularies; token_table::has_every_byte()).
//  - Token limit: a token is only allowed if the cost after it fits in the tokens left, so the
//    output is complete when max_tokens is reached (if the limit is smaller than the shortest
//    output, the constraint closes as fast as it can and the request ends with "length").
//  - JSON budget: once the JSON has used json_budget_bytes bytes (whitespace included) the
//    constraint is closing: a token is only allowed if it lowers the cost. A model writing
//    sensible arguments closes them long before the default; a random one is made to.
// Cost per step: every ordinary token is evaluated from the current state in byte order, sharing
// the work of common prefixes and skipping every token below a byte the state refuses; inside a
// JSON string's text (where a random model spends its time) the string-text tokens are decided
// at once. Measured over DeepSeek's 129k tokens in Release: ~0.1-0.3 ms per step on average, a few
// ms at worst (tests/server/output_constraint_test.cpp prints it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "scheduler/token_constraint.h"
#include "server/api_error.h"
#include "server/constraint_request.h"
#include "server/json_constraint.h"
#include "server/request.h"

namespace moestream::server {

// Every token's bytes, laid out for evaluating the whole vocabulary against a byte automaton:
// the ordinary tokens (type normal, non-empty) sorted by their bytes, each with the length of
// the prefix it shares with the one before; and apart, the "string text" tokens, which inside a
// JSON string's text leave it there, between characters (whole UTF-8 characters but controls and
// U+FF5C, complete escapes; no closing quote): from such a state they change nothing but the
// length, so they are decided together. Most of a vocabulary is string text. Immutable once
// built.
class token_table {
  public:
    explicit token_table(const tokenizer& tok);
    // The table of `tok`, built on first use and then shared (thread-safe). Tables of the last
    // few tokenizers are kept.
    static std::shared_ptr<const token_table> of(const tokenizer& tok);

    int32_t vocab() const { return int32_t(offsets_.size()) - 1; }
    std::string_view bytes(int32_t id) const {
        return std::string_view(bytes_).substr(offsets_[size_t(id)], offsets_[size_t(id) + 1] - offsets_[size_t(id)]);
    }
    bool ordinary(int32_t id) const { return ordinary_[size_t(id)] != 0; }
    struct sorted_tokens {
        std::vector<int32_t> ids;       // in byte order
        std::vector<uint32_t> shared;   // [i]: bytes ids[i] shares with ids[i - 1] (0 for i = 0)
    };
    const sorted_tokens& ordinary_tokens() const { return all_; }
    const sorted_tokens& other_than_string_text() const { return not_text_; }
    std::span<const int32_t> string_text() const { return string_text_; }
    size_t max_length() const { return max_length_; }
    // Every byte value is an ordinary token of its own (what guarantees forced endings).
    bool has_every_byte() const { return every_byte_; }
    // Same vocabulary as `tok` (checked on a sample of ids).
    bool describes(const tokenizer& tok) const;

  private:
    std::string bytes_;
    std::vector<uint32_t> offsets_;  // [vocab + 1]
    std::vector<uint8_t> ordinary_;
    sorted_tokens all_, not_text_;
    std::vector<int32_t> string_text_;
    size_t max_length_ = 0;
    bool every_byte_ = false;
};

struct constraint_limits {
    int64_t max_tokens = 0;          // the request's token limit; <= 0: none
    size_t json_budget_bytes = 8192;  // then closing (see above)
    json_limits json{32, 4, true, U'\uFF5C'};
};

// A sequence of byte-level pieces (fixed text, one of some names, one JSON object), matched by
// the tokens of a token_table.
class output_constraint final : public token_constraint {
  public:
    struct piece {
        enum kind_t { text, name, json } kind = text;
        std::string literal;             // text
        std::vector<std::string> names;  // name: non-empty, unique; the next piece must not start with a name byte
    };
    // `markers`: added tokens that may stand for their bytes inside text pieces.
    output_constraint(std::shared_ptr<const token_table> table, std::vector<piece> pieces,
                      std::vector<int32_t> markers, constraint_limits limits);

    void allowed(std::span<uint8_t> mask) const override;
    void accept(int32_t token) override;
    bool done() const override;
    // One token, evaluated on its own (what allowed() computes for the whole vocabulary at once).
    bool allows(int32_t token) const;

    // Tokens that finish the output from here (the bound described above); 0 when done.
    uint32_t cost() const { return cost_of(cur_); }
    // Only tokens that lower cost() are allowed now (the JSON budget is spent, or the token limit
    // is below the shortest output).
    bool closing() const;

  private:
    struct cursor {
        json_automaton json;
        uint32_t piece = 0;
        uint32_t pos = 0;  // text: bytes matched; name: the node in names_
        uint32_t json_bytes = 0;
    };
    struct name_node {
        uint32_t first_child = 0, next_sibling = 0;  // 0: none (the root is never a child)
        uint32_t min_rest = 0;                        // fewest bytes that end a name below
        uint8_t byte = 0;
        bool is_end = false;
    };

    bool step(cursor& c, uint8_t b) const;
    bool feed(cursor& c, std::string_view bytes) const;
    uint32_t cost_of(const cursor& c) const;
    void enter(cursor& c) const;
    // A token is allowed when its cost after is at most this.
    uint64_t cost_limit() const;
    // Marks the tokens of `list` that fit from cur_ with a cost after of at most `limit`.
    void mark(const token_table::sorted_tokens& list, uint64_t limit, std::span<uint8_t> mask) const;

    std::shared_ptr<const token_table> table_;
    std::vector<piece> pieces_;
    std::vector<std::vector<uint32_t>> text_cost_;  // per text piece: tokens to finish it from each position
    std::vector<uint32_t> name_root_;               // per name piece: its root in names_
    std::vector<name_node> names_;
    std::vector<uint32_t> tail_cost_;               // per piece: the cost of every piece after it
    std::vector<int32_t> markers_;
    constraint_limits limits_;
    cursor cur_;
    int64_t accepted_ = 0;
    bool over_limit_ = false;  // the token limit is below the shortest output: always closing
    mutable std::vector<cursor> stack_;  // allowed()'s per-byte states, sized once
};

// One JSON object.
std::unique_ptr<output_constraint> json_object_constraint(std::shared_ptr<const token_table> table,
                                                          constraint_limits limits);
// One DeepSeek tool call to one of `names` (non-empty, unique, [A-Za-z0-9_.-]).
std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<std::string> names, constraint_limits limits);

// What a parsed request forces, or null: a tool call when a chat request has tools and
// tool_choice is "required" (any of its tools) or names a function; otherwise one JSON object
// when `spec` asks for it (a forced tool call takes precedence over response_format). Errors:
// 400 when the model has no tokenizer to build it from.
api_result<std::shared_ptr<token_constraint>> constraint_for_request(const completion_request& r,
                                                                     const constraint_spec& spec,
                                                                     const tokenizer* tok, int64_t max_tokens);

}  // namespace moestream::server
