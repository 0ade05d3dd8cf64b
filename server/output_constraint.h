// The output constraints of the server (scheduler/token_constraint.h): what OpenAI's
// tool_choice "required" / a named function, `strict` tools and response_format json_object /
// json_schema promise, made certain by masking the sampler instead of hoping the model complies.
//
// Shapes (byte level: a marker may come as its single added token or spelled by ordinary tokens;
// the output parser reads text, so both give the same result):
//  - JSON object: exactly one JSON object (server/json_constraint.h), or one valid against a JSON
//    Schema (server/json_schema.h), nothing before or after; the request ends ("stop") at its
//    closing brace.
//  - forced tool call: exactly one DeepSeek-V3 call, ending the request when complete:
//      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//    NAME one of the allowed names exactly, ARGS a JSON object following NAME's schema (any
//    object for a tool without one). One call even when parallel_tool_calls is true.
//    The output starts with the call; an output that starts inside the reasoning reasons first,
//    freely, and the call follows its "</think>" at once (the token limit, or a reasoning budget
//    beside it, closes the reasoning in time).
//  - strict tools under tool_choice auto (lazy): the output is free (text, reasoning, the end of
//    sequence) until it starts a tool-call section the way the output parser recognises one
//    (server/output_parser.h: "<｜tool▁calls▁begin｜>" or "<｜tool▁call▁begin｜>" in content, not
//    inside the reasoning); from there the calls follow the shape above, each call's arguments
//    its tool's schema (strict tools) or any object, more calls allowed when parallel, and the
//    request ends with the section.
// In all of them, strings may not contain a raw U+FF5C (every DeepSeek marker has it), so the
// JSON never holds text a tool-call parser would act on; it may be written as \uff5c.
// Added (special) tokens other than the markers the shape needs are never allowed inside a
// shape, in particular not the end-of-sequence token: the constraint itself ends the request
// (free text allows every token).
//
// Termination (needed even by a model that never wants to stop, e.g. our random-weight test
// models): cost() is an upper bound on the tokens that finish the output from a state (JSON
// bytes and name bytes count one each, an unstarted marker one, a partly spelled marker one per
// byte left; free text costs nothing, since it may end at any token); every state has a token
// that lowers it by at least one, as long as every single byte is itself a token (true of
// byte-level BPE vocabularies; token_table::has_every_byte()).
//  - Token limit: a token is only allowed if the cost after it fits in the tokens left, so the
//    output is complete when max_tokens is reached (if the limit is smaller than the shortest
//    output, the constraint closes as fast as it can and the request ends with "length").
//    Free text may start a call only when the shortest call fits.
//  - JSON budget: once the JSON has used json_budget_bytes bytes (whitespace included, every
//    call's arguments together) the constraint is closing: a token is only allowed if it lowers
//    the cost. A model writing sensible arguments closes them long before the default; a random
//    one is made to.
// Cost per step: every ordinary token is evaluated from the current state in byte order, sharing
// the work of common prefixes and skipping every token below a byte the state refuses; inside a
// JSON string's text (where a random model spends its time) the string-text tokens are decided
// at once, within a schema's length bounds too; free text decides the tokens without '<' at once
// (no trigger can start in them). `moestream bench constraint` measures it per schema.
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
#include "server/json_schema.h"
#include "server/json_schema_automaton.h"
#include "server/request.h"
#include "server/token_table.h"

namespace moestream::server {

struct constraint_limits {
    int64_t max_tokens = 0;          // the request's token limit; <= 0: none
    size_t json_budget_bytes = 8192;  // then closing (see above)
    json_limits json{32, 4, true, U'\uFF5C'};
};

// A sequence of byte-level pieces (fixed text, one of some names, one JSON object, free text),
// matched by the tokens of a token_table. Pieces follow one another in order unless they say
// otherwise (a name or a trigger may lead anywhere, so calls can repeat).
class output_constraint final : public token_constraint {
  public:
    static constexpr uint32_t k_next = 0xFFFFFFFFu;  // the following piece
    static constexpr uint32_t k_end = 0xFFFFFFFEu;   // the output is complete
    // Where free text is relative to the model's reasoning (the output parser's view).
    enum class reasoning_start {
        none,      // no reasoning: everything is content
        may_open,  // "<think>" at the very start opens it, "</think>" closes it
        open,      // the output starts inside the reasoning
    };
    struct piece {
        enum kind_t { text, name, json, free } kind = text;
        std::string literal;             // text
        std::vector<std::string> names;  // name: non-empty, unique; a name that is a prefix of
                                         // another must not be followed by a piece starting
                                         // with the longer one's next byte
        // name: the piece after each name; free: after each trigger (empty: k_next for all)
        std::vector<uint32_t> targets;
        std::shared_ptr<const json_schema> schema;  // json: null = any object
        std::vector<std::string> triggers;          // free: texts in content that end it
        reasoning_start reasoning = reasoning_start::none;  // free
        // free, with reasoning open and no triggers: the reasoning runs until "</think>", which
        // ends the piece (a forced shape after the reasoning). Nothing else ends the output in
        // it, and its cost counts the closing's bytes, so a token limit closes it in time.
        bool reasoning_closes = false;
        uint32_t next = k_next;                     // text, json
    };
    // `markers`: added tokens that may stand for their bytes inside text and name pieces. At most
    // one free piece, first.
    output_constraint(std::shared_ptr<const token_table> table, std::vector<piece> pieces,
                      std::vector<int32_t> markers, constraint_limits limits);
    output_constraint(const output_constraint&) = default;

    void allowed(std::span<uint8_t> mask) const override;
    void accept(int32_t token) override;
    bool done() const override;
    // One token, evaluated on its own (what allowed() computes for the whole vocabulary at once).
    bool allows(int32_t token) const;

    // Tokens that finish the output from here (the bound described above); 0 when done or free.
    uint32_t cost() const { return cost_of(cur_); }
    // Only tokens that lower cost() are allowed now (the JSON budget is spent, or the token limit
    // is below the shortest output).
    bool closing() const;
    // Free text is running (lazy tool calls before a call starts).
    bool free() const { return !done() && pieces_[cur_.piece].kind == piece::free; }

  private:
    struct cursor {
        json_automaton json;
        schema_automaton schema;
        uint32_t piece = 0;
        uint32_t pos = 0;  // text: bytes matched; name: the node in names_; free: the watch state
        uint32_t json_bytes = 0;
    };
    struct name_node {
        uint32_t first_child = 0, next_sibling = 0;  // 0: none (the root is never a child)
        uint32_t min_rest = 0;                        // cost to the end through a name below
        uint32_t target = 0;                          // is_end: the piece after the name
        uint8_t byte = 0;
        bool is_end = false;
    };

    bool step(cursor& c, uint8_t b) const;
    bool feed(cursor& c, std::string_view bytes) const;
    uint32_t cost_of(const cursor& c) const;
    void enter(cursor& c, uint32_t piece) const;
    uint32_t after(uint32_t piece, uint32_t next) const;  // resolves k_next / k_end
    void build_name_trie(size_t i);
    void build_free_watch(const piece& p);
    void settle_costs();
    // A token is allowed when its cost after is at most this.
    uint64_t cost_limit() const;
    // Marks the tokens of `list` that fit from cur_ with a cost after of at most `limit`.
    void mark(const token_table::sorted_tokens& list, uint64_t limit, std::span<uint8_t> mask) const;
    void mark_one(int32_t id, uint64_t limit, std::span<uint8_t> mask) const;
    void allowed_free(std::span<uint8_t> mask, uint64_t limit) const;

    std::shared_ptr<const token_table> table_;
    std::vector<piece> pieces_;
    std::vector<std::vector<uint32_t>> text_cost_;  // per text piece: tokens to finish it from each position
    std::vector<uint32_t> name_root_;               // per name piece: its root in names_
    std::vector<name_node> names_;
    std::vector<uint32_t> entry_cost_;              // per piece (+ the end): the cost from its start
    std::vector<uint8_t> watch_;                    // free: [state * 256 + byte] -> state, or k_fired + trigger
    std::vector<uint8_t> watch_root_;               // free: states no token without '<' leaves
    std::vector<uint8_t> watch_close_left_;         // free: bytes of "</think>" left from each state
    uint8_t watch_start_ = 0;
    std::vector<int32_t> markers_;
    constraint_limits limits_;
    cursor cur_;
    int64_t accepted_ = 0;
    bool over_limit_ = false;  // the token limit is below the shortest output: always closing
    mutable std::vector<cursor> stack_;  // allowed()'s per-byte states, sized once
};

// One JSON object; with `schema`, one valid against it.
std::unique_ptr<output_constraint> json_object_constraint(std::shared_ptr<const token_table> table,
                                                          constraint_limits limits,
                                                          std::shared_ptr<const json_schema> schema = nullptr);
// The same for a reply that may start inside the model's reasoning: with `close_reasoning` the
// object follows the reasoning's "</think>" (the vocabulary's marker token or spelled).
std::unique_ptr<output_constraint> json_output_constraint(std::shared_ptr<const token_table> table,
                                                          const tokenizer& tok, constraint_limits limits,
                                                          std::shared_ptr<const json_schema> schema,
                                                          bool close_reasoning);
// One DeepSeek tool call to one of `names` (non-empty, unique, [A-Za-z0-9_.-]), any object as
// its arguments.
std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<std::string> names, constraint_limits limits);

struct tool_spec {
    std::string name;
    std::shared_ptr<const json_schema> schema;  // the arguments' schema; null: any object
};
struct tool_call_options {
    bool lazy = false;      // free text until the model starts a call (see the header comment)
    bool parallel = false;  // further calls may follow the first (lazy only)
    // Where the output starts relative to the reasoning: lazy follows it; a forced call (or
    // JSON) inside an open reasoning follows its "</think>".
    output_constraint::reasoning_start reasoning = output_constraint::reasoning_start::none;
};
std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<tool_spec> tools, constraint_limits limits,
                                                        tool_call_options options);

// What a parsed request asks for, or null:
//  - a forced tool call when a chat request has tools and tool_choice is "required" (any of its
//    tools) or names a function: each tool's arguments follow its parameters schema (exactly for
//    `strict` tools; a non-strict tool's keywords the subset cannot enforce are dropped);
//  - else one JSON object when `spec` asks for json_object, one valid against the schema for
//    json_schema (a forced call takes precedence over response_format, which takes precedence
//    over strict tools);
//  - else, under tool_choice auto with at least one `strict` tool, lazy tool calls.
// `starts_in_reasoning`: the prompt ends inside the model's reasoning ("<think>").
// Errors: 400 when the model has no tokenizer to build it from, or a tool's schema is refused
// (param tools[i].function.parameters..., or the tool's own schema_param).
api_result<std::shared_ptr<token_constraint>> constraint_for_request(const completion_request& r,
                                                                     const constraint_spec& spec,
                                                                     const tokenizer* tok, int64_t max_tokens,
                                                                     bool starts_in_reasoning = false);

}  // namespace moestream::server
