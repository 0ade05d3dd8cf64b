// Tool definitions rendered into the prompt. The DeepSeek-V3 chat template has no place for them;
// DeepSeek-V3.1 documents them as a block of the system prompt, which is what is built here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"

namespace moestream::server {

// One tool as the prompt needs it (the request parser has its own struct; the handler converts).
struct tool_definition_view {
    std::string_view name, description, parameters_json;  // parameters_json: raw JSON; empty -> "{}"
};

// The "## Tools" block for these tools and this choice, without surrounding separators.
// choice: "auto", "required" (adds an instruction to call at least one tool) or a function name
// (adds an instruction to call that tool; it must be one of tools).
std::string tool_definitions_text(const std::vector<tool_definition_view>& tools, std::string_view choice);

// Returns messages with the tool definitions (and the choice) rendered into the system prompt, in
// DeepSeek-V3.1's documented layout: the block follows the existing text of the first system
// message after a blank line (V3.1 places tools after the system prompt), or becomes a new system
// message at the front when there is none (render_chat hoists every system message to the start
// anyway). No tools, or choice "none" (the model must not call any), returns messages unchanged.
// An "auto"/"required"/"none" keyword always wins over a function of the same name: the handler
// passes a name only for tool_choice {"type":"function",...}.
std::vector<chat_message> with_tool_definitions(std::vector<chat_message> messages,
                                                const std::vector<tool_definition_view>& tools,
                                                std::string_view choice /* "auto","required", or a function name */);

}  // namespace moestream::server
