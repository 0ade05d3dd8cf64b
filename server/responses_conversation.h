// A Responses conversation (its items) as the chat messages the prompt is rendered from, and the
// check that every function_call_output answers a call made before it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "server/api_error.h"
#include "server/responses_request.h"

namespace moestream::server {

// Each function_call_output of `input` must carry the call_id of a function_call earlier in
// `history` (the stored conversation it continues) or in `input`; otherwise a 400 naming the
// item ("input[4].call_id").
std::optional<api_error> check_call_ids(const std::vector<conversation_item>& history,
                                        const std::vector<conversation_item>& input);

// instructions (a system message), then the items in order: messages keep their role,
// consecutive function_calls become one assistant message with tool calls (the DeepSeek template
// renders the calls of an assistant message without content), function_call_outputs become tool
// messages.
std::vector<chat_message> chat_messages(const std::optional<std::string>& instructions,
                                        const std::vector<conversation_item>& history,
                                        const std::vector<conversation_item>& input);

}  // namespace moestream::server
