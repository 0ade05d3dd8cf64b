// POST /v1/responses bodies (OpenAI's Responses API, what the Codex CLI speaks) -> a chat
// completion_request plus what the response object repeats. The conversation is kept as
// Responses items (conversation_item) so a stored response can be continued; the route turns
// the items into chat messages (server/responses_conversation.h). General rules as in
// server/request.h: unknown fields are ignored, null is "absent", a known field of the wrong type
// or out of range is a 400 whose param is the field path ("input[2].content[0].type").
//
//   model              string, echoed ("")
//   instructions       string: a system message in front of the conversation (not carried over by
//                      previous_response_id, as OpenAI does)
//   input              string (one user message) | [items]; required unless previous_response_id
//                      is given. At most limits.max_messages items. Items:
//     message          {type?: "message", role: user|assistant|system|developer, content: string |
//                      [parts]}; parts input_text{text}, output_text{text}, refusal{refusal} are
//                      concatenated; input_image, input_file, input_audio -> 400 (text only)
//     function_call    {call_id, name, arguments: JSON text (an object is serialised)}
//     function_call_output  {call_id, output: string | [input_text parts]}; its call_id must be
//                      one of an earlier function_call (checked with the stored history)
//     reasoning        {summary?, content?, encrypted_content?}: accepted and dropped (the
//                      DeepSeek template does not replay earlier reasoning)
//     other types      (item_reference, custom_tool_call, web_search_call, ...) -> 400
//   tools              [{type: "function", name, description?, parameters?, strict?}] (flat); at
//                      most limits.max_tools function tools, names as on the chat route and unique.
//                      Tools of any other type (custom, namespace, web_search, mcp, ...) are
//                      skipped: listed in skipped_tools for the log, never refused.
//   tool_choice        "auto" | "none" | "required" | {type: "function", name}; other shapes
//                      (allowed_tools, hosted tools, custom) -> 400
//   parallel_tool_calls  bool (true)
//   max_output_tokens  integer >= 1 (a cap: a prompt plus it beyond the context is not an error)
//   temperature        [0, 2] (1), top_p (0, 1] (1)
//   reasoning          {effort: none|minimal|low|medium|high|xhigh, summary: auto|concise|detailed};
//                      effort turns on the model's thinking with a budget (reasoning_plan_of);
//                      summary is echoed (the model writes no summaries: summary [] in items)
//   text               {format: {type: text|json_object|json_schema, ...}, verbosity:
//                      low|medium|high}; format goes through the chat route's response_format
//                      parser (server/constraint_request.h parse_output_format), its errors
//                      naming text.format
//   store              bool (false: stateless by default); previous_response_id string
//   stream             bool (false)
//   metadata           object, echoed; prompt_cache_key, include, user, safety_identifier,
//                      service_tier, stream_options: accepted, no effect
//   Refused with a 400 because they would silently not happen: background: true, conversation,
//   prompt (templates), truncation: "auto", top_logprobs > 0, max_tool_calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/constraint_request.h"
#include "server/request.h"

namespace moestream::server {

// One item of a Responses conversation, reduced to what the prompt needs.
struct conversation_item {
    enum kind_t { message, function_call, function_call_output } kind = message;
    std::string role;             // message: system, user or assistant (developer is system)
    std::string text;             // message: its text; function_call_output: the output
    std::string call_id;          // function_call, function_call_output
    std::string name, arguments;  // function_call
};

// A function tool as the response object repeats it.
struct function_tool {
    std::string name, description, parameters_json;  // parameters_json: minified, "{}" when absent
    bool strict = false;
};

// What the response object repeats of its request (and the request's state options).
struct response_echo {
    std::string model;
    std::optional<std::string> instructions;
    std::optional<int64_t> max_output_tokens;
    bool parallel_tool_calls = true;
    std::string previous_response_id;  // "" = none
    bool store = false;
    std::string reasoning_effort, reasoning_summary;  // "" = null
    float temperature = 1.0f, top_p = 1.0f;
    std::string format_json = R"({"type":"text"})";  // text.format, minified as sent
    std::string verbosity = "medium";
    std::string tool_choice_json = R"("auto")";
    std::vector<function_tool> tools;
    std::string metadata_json = "{}";
};

struct responses_request {
    // route chat_completions; tools, choice, sampling, length, stream set; messages left empty
    // (the route builds them from the stored history, instructions and input).
    completion_request generation;
    constraint_spec constraint;  // from text.format
    response_echo echo;
    std::vector<conversation_item> input;
    bool input_given = false;
    std::vector<std::string> skipped_tools;  // "custom apply_patch", "web_search", ...: not served
};

api_result<responses_request> parse_responses_request(std::string_view body, const parse_limits& limits);

// reasoning.effort as the reply's thinking: absent or "none" -> none (DeepSeek's default mode);
// otherwise the reply starts inside the model's reasoning (its thinking mode), which ends within
// the effort's budget of tokens: minimal 512, low 2048, medium 8192, high 32768, xhigh no limit
// (-1). A reply whose shape is forced (a required or named tool call, text.format JSON, strict
// tools) gets no budget: the shape's own constraint closes the reasoning before it.
struct reasoning_plan {
    bool open = false;
    int64_t budget = -1;
};
reasoning_plan reasoning_plan_of(const responses_request& r);

}  // namespace moestream::server
