// The DeepSeek-V3 chat format, rendered natively (no Jinja engine): it reproduces, quirks
// included, the `chat_template` of the DeepSeek-V3 tokenizer_config.json that the forged and the
// published models carry.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/result.h"

namespace moestream {

struct chat_tool_call {
    std::string type = "function";
    std::string name;
    std::string arguments;  // JSON text, inserted verbatim
};

struct chat_message {
    std::string role;                    // system, user, assistant, tool
    std::optional<std::string> content;  // nullopt = JSON null (assistant turns with tool calls)
    std::vector<chat_tool_call> tool_calls;
};

struct chat_special_tokens {
    std::string bos = "<｜begin▁of▁sentence｜>";
    std::string eos = "<｜end▁of▁sentence｜>";
};

// Parses an OpenAI-style messages array (JSON text: [{"role":..,"content":..,"tool_calls":[..]}]).
result<std::vector<chat_message>> parse_chat_messages(std::string_view json);

result<std::string> render_chat(const std::vector<chat_message>& messages, bool add_generation_prompt,
                                const chat_special_tokens& tokens = {});

}  // namespace moestream
