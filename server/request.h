// Request bodies -> typed requests. The contract clients rely on (copied into docs/api.md):
//
// General
//   - The body must be one JSON object. Empty body, malformed JSON, invalid UTF-8 or a non-object
//     -> 400 invalid_request_error; for malformed JSON the message gives the byte offset of the
//     first error and `param` the path of the value being read there, when known.
//   - Unknown fields are ignored; a field set to null counts as absent (its default applies).
//   - A known field of the wrong type -> 400 naming it: param is the field path
//     ("messages[2].content"), the message e.g. "temperature: expected a number, got string".
//   - Numbers may be written as integers or decimals (`"temperature": 1`); integer fields accept
//     an integral decimal (`100.0`) but not `1.5`. A value out of its range -> 400 naming it;
//     numbers JSON allows but no 64-bit type holds (2^70, 1e400) -> 400 at that field.
//   - Duplicate keys: the first occurrence counts.
//
// Routes: chat = /v1/chat/completions; completions = /v1/completions; native = /completion;
// infill = /infill. "OAI" = chat and completions, "native" = native and infill.
//
// Prompt
//   chat        messages (required, non-empty array, at most limits.max_messages):
//                 role: system | user | assistant | tool | developer (developer -> system)
//                 content: string | null | [{"type":"text","text":...}, ...] (texts concatenated;
//                   any other part type -> 400 "only text content is supported"); required (not
//                   null) except for an assistant message with tool_calls. An assistant message
//                   whose content is "" and that has tool_calls gets content null (the DeepSeek
//                   template only renders tool calls of a content-less message).
//                 tool_calls (assistant): [{id?, type?: "function", function: {name, arguments}}],
//                   arguments a JSON string (an object is accepted and serialised).
//                 tool_call_id (tool), name, reasoning_content / reasoning (assistant): accepted,
//                   ignored.
//               tools: [{type?: "function", function: {name, description?, parameters?, strict?}}]
//                 (at most limits.max_tools; name [A-Za-z0-9_.-]{1,64}, unique; parameters an
//                 object, kept as JSON text, "{}" when absent; strict bool (false): the
//                 arguments follow parameters whenever the tool is called, see
//                 server/output_constraint.h)
//               tool_choice: "auto" (default) | "none" | "required" |
//                 {"type":"function","function":{"name":N}}; "required" and a named function need
//                 tools, and the name must be one of them.
//               parallel_tool_calls: bool (true)
//   completions prompt (required): "text" | ["text"] | [token ids] | [[token ids]]; several
//                 prompts -> 400 "only one prompt per request is supported"; mixed strings and
//                 ids -> 400. echo: bool (false). suffix: string ("").
//   native      prompt (required): the same shapes as completions.
//   infill      input_prefix: string (""), input_suffix: string (""), input_extra:
//                 [{filename?: string, text: string}] (at most limits.max_input_extra), prompt
//                 (optional, same shapes; appended after the prefix, as llama-server does).
//   Token ids are integers in [0, limits.vocab) (or [0, 2^31) when vocab is 0).
//
// Generation (every route)
//   model             string, echoed back ("")
//   stream            bool (false)
//   stream_options    {include_usage: bool (false)}; type-checked always, used only with stream
//   n_predict         integer >= -1 (-1: until EOS / the context is full)
//   max_completion_tokens, max_tokens   integer >= 0. Precedence n_predict > max_completion_tokens
//                     > max_tokens; none given -> -1
//   stop              string | [string] (at most limits.max_stop_strings, each at most
//                     limits.max_stop_bytes bytes; empty strings dropped)
//   ignore_eos        bool (false)
//   n, n_cmpl         integer; only 1 is supported
//   cache_prompt      bool (true): reuse the longest common prefix with a cached sequence
//   return_timings    bool (true): attach the `timings` object (moestream extension)
//   speculative.n_max integer >= 0 (llama-server's flat key): the most tokens drafted a step for
//                     this request, within the server's --spec-k; 0: no speculative decoding
//                     (the output is the same either way); absent: the server's
//   chat_template_kwargs  {enable_thinking: bool (true), thinking: bool (alias)} (chat only)
//   reasoning_format  "none" (thinking stays in content) | "auto" | "deepseek" |
//                     "deepseek-legacy" (chat only; default "auto")
//
// Sampling            default OAI / native        range
//   temperature       1.0 / 0.8                    OAI [0, 2], native [0, 100]; 0 = greedy
//   top_k             0 (off) / 40                 integer in [-1, 2^31) (-1 and 0: off)
//   top_p             1.0 / 0.95                   (0, 1]
//   min_p             0.0 / 0.05                   [0, 1]
//   presence_penalty, frequency_penalty   0.0      [-2, 2]
//   repeat_penalty    1.0 (alias repetition_penalty; repeat_penalty wins)   > 0 (and <= FLT_MAX)
//   repeat_last_n     64                           integer in [-1, 2^31) (-1: whole history, 0: none)
//   seed              drawn by the server          integer in [0, 2^64) or -1 (= drawn)
//   logit_bias        {"<token id>": bias | false} or [[token id, bias | false], ...]; bias in
//                     [-100, 100], false bans the token (-inf); ids < vocab; token strings
//                     -> 400 "logit_bias by string is not supported; use token ids"; at most
//                     limits.max_logit_bias entries
//   Log-probabilities (n_probs = how many alternatives per token, 0..20):
//     native/infill   n_probs (0); > 0 enables them
//     completions     logprobs: integer 0..20 (enables them, n_probs = logprobs)
//     chat            logprobs: bool (false), top_logprobs: 0..20 (> 0 needs logprobs true)
//     any route       n_probs given explicitly wins over the OAI fields
//
// Parsed separately (server/constraint_request.h): response_format.
// Ignored (accepted, no effect): user, metadata, store, service_tier, grammar, typical_p, mirostat*, dry_*, xtc_*, dynatemp_*, samplers, min_keep, n_keep,
// id_slot, t_max_*, timings_per_token, return_progress, reasoning_effort, ... (any unknown key).
//
// /tokenize {content: string (required), add_special: bool (false), parse_special: bool (true),
//            with_pieces: bool (false)}
// /detokenize {tokens: [token ids] ([])}
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/chat_template.h"
#include "model/sampler.h"
#include "server/api_error.h"

namespace moestream::server {

enum class api_route { chat_completions, completions, native_completion, infill };

struct tool_definition {
    std::string name, description, parameters_json;  // parameters_json: raw JSON text, "{}" if absent
    // The arguments must follow parameters_json exactly whenever the model calls it (OpenAI's
    // function.strict; server/output_constraint.h): tool_choice auto then constrains calls too.
    bool strict = false;
    // Where parameters_json came from, for errors about the schema; empty: the chat route's
    // "tools[i].function.parameters" (other routes: "tools[i].input_schema", ...).
    std::string schema_param;
};

struct tool_choice {
    enum kind_t { auto_, none, required, function } kind = auto_;
    std::string function_name;
};

struct completion_request {
    api_route route = api_route::chat_completions;
    std::string model;  // as sent (echoed back); empty if absent
    // Prompt: chat -> messages; completions/native -> prompt_text OR prompt_tokens (one of them)
    std::vector<chat_message> messages;
    std::vector<tool_definition> tools;
    tool_choice choice;
    bool parallel_tool_calls = true;
    std::optional<std::string> prompt_text;
    std::vector<int32_t> prompt_tokens;
    std::string suffix;         // completions "suffix"; infill input_suffix
    std::string infill_prefix;  // infill input_prefix
    std::vector<std::pair<std::string, std::string>> infill_extra;  // input_extra [{filename,text}]
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage (only with stream)
    int64_t max_tokens = -1;     // -1: until EOS / context. n_predict > max_completion_tokens > max_tokens
    sampling_params sampling;    // seed only meaningful when seed_given; n_probs mirrors n_probs below
    bool seed_given = false;     // seed absent or -1 -> false (the server then draws one)
    std::vector<std::string> stop;
    bool ignore_eos = false;
    bool echo = false;  // completions
    int32_t n_probs = 0;
    bool logprobs_enabled = false;
    bool cache_prompt = true;
    bool return_timings = true;
    int64_t spec_n_max = -1;            // speculative.n_max; -1: the server's
    bool reasoning_in_content = false;  // reasoning_format "none": thinking stays in content
    bool enable_thinking = true;        // chat_template_kwargs.enable_thinking
    int32_t n = 1;                      // n / n_cmpl: only 1 supported
};

struct parse_limits {
    size_t max_stop_strings = 16;
    size_t max_stop_bytes = 1024;
    size_t max_messages = 100000;
    size_t max_tools = 512;
    int64_t vocab = 0;  // token ids and logit_bias keys must be < vocab when > 0
    size_t max_logit_bias = 16384;
    size_t max_input_extra = 1024;  // infill input_extra entries
};

// The sampling defaults of a route (OpenAI's on chat/completions, llama-server's on native/infill).
sampling_params default_sampling(api_route route);

api_result<completion_request> parse_completion_request(std::string_view body, api_route route,
                                                        const parse_limits& limits);

struct tokenize_request {
    std::string content;
    bool add_special = false;
    bool parse_special = true;
    bool with_pieces = false;
};
api_result<tokenize_request> parse_tokenize_request(std::string_view body);

struct detokenize_request {
    std::vector<int32_t> tokens;
};
// Token ids must be in [0, vocab) when vocab > 0.
api_result<detokenize_request> parse_detokenize_request(std::string_view body, int64_t vocab);

}  // namespace moestream::server
