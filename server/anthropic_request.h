// Anthropic Messages request bodies (POST /v1/messages and /v1/messages/count_tokens) -> the
// internal completion_request (server/request.h) plus how the reply starts (job_options), so the
// route shares the chat route's prompt rendering, tool-call parsing, constrained decoding, stop
// strings and prefix cache. The general rules of request.h hold (unknown fields ignored, null =
// absent, a known field of the wrong type or out of range -> 400 naming its path).
//
//   model            string (echoed back)
//   max_tokens       integer >= 1, required on /v1/messages (not on count_tokens); more than the
//                    context leaves is a cap, not an error
//   system           string | [{type: "text", text, cache_control?}] (texts concatenated as sent).
//                    A text block starting "x-anthropic-billing-header:" (Claude Code's per-request
//                    attribution, whose value changes between requests) is dropped, so consecutive
//                    turns share their prompt prefix; any other block type -> 400.
//   messages         non-empty array of {role: user | assistant | system, content: string | blocks}
//                    (Claude Code sends mid-conversation "system" turns); blocks:
//                      text {text, cache_control?, citations?}            every role
//                      image, document                                     -> 400 (text only)
//                      tool_use {id, name, input: object}                  assistant
//                      tool_result {tool_use_id, content?: string | [text blocks], is_error?}
//                                                                          user; the id must be a
//                        tool_use of the assistant message right before (else 400); is_error
//                        prefixes the text with "Error: "
//                      thinking {thinking, signature}, redacted_thinking   assistant; accepted and
//                        not rendered (the DeepSeek template drops earlier turns' reasoning)
//                      any other type, or a block in the wrong role        -> 400
//                    An assistant turn with text and tool_use becomes two turns (its text, then
//                    its calls: the DeepSeek template renders the calls of a content-less turn
//                    only). A final assistant message is the start of the reply (prefill).
//   tools            [{name, description?, input_schema: object, type?: "custom",
//                    cache_control?, defer_loading?, strict?}]; input_schema is kept as JSON text in
//                    tool_definition.parameters_json (the field the chat route's `parameters` use:
//                    the arguments of a forced call follow it, those of a strict tool always;
//                    schema errors name tools[i].input_schema). Tools of Anthropic's own types
//                    (web_search_*, bash_*, text_editor_*, ...) have no schema the model could
//                    follow: skipped, with a warning in the log. defer_loading tools are not shown
//                    to the model unless tool_choice names them.
//   tool_choice      {type: auto | any | tool | none, name (tool), disable_parallel_tool_use?}:
//                    auto -> auto, any -> required, tool -> that function (forced: constrained
//                    decoding), none -> none; disable_parallel_tool_use -> parallel_tool_calls
//                    false (the reply ends after its first call).
//   stop_sequences   [string] (at most 16 of at most 1 KiB: the stop-string limits)
//   temperature      [0, 1] (1); top_p (0, 1]; top_k integer >= 0 (0: off)
//   metadata         {user_id?: string}: accepted, not used
//   thinking         {type: "enabled", budget_tokens: integer in [1, max_tokens)} -> the reply
//                    starts inside the reasoning (the prompt ends with "<think>") and the reasoning
//                    ends within the budget (server/reasoning_budget.h); {type: "adaptive"} and
//                    {type: "disabled"}: the model decides (reasoning it writes still becomes
//                    thinking blocks). display: "omitted" sends thinking blocks without their text.
//                    enabled + a forced tool_choice, or + a prefill -> 400 (as Anthropic).
//   stream           bool (false)
//   Accepted and ignored: context_management, output_config, service_tier, container, mcp_servers
//   (refused when non-empty: no MCP client here), and any unknown field.
#pragma once

#include <string_view>

#include "server/api_error.h"
#include "server/completion_job.h"
#include "server/request.h"

namespace moestream::server {

struct anthropic_request {
    completion_request completion;  // route chat_completions
    job_options options;
    bool display_thinking = true;  // false: thinking blocks go out without their text
};

enum class anthropic_body { messages, count_tokens };

api_result<anthropic_request> parse_anthropic_request(std::string_view body, anthropic_body kind,
                                                      const parse_limits& limits);

// The text of a system block Claude Code adds to attribute the request; it changes every request.
constexpr std::string_view k_billing_header_prefix = "x-anthropic-billing-header:";

}  // namespace moestream::server
