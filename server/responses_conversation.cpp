#include "server/responses_conversation.h"

#include <unordered_set>

#include "server/json_writer.h"

namespace moestream::server {

std::optional<api_error> check_call_ids(const std::vector<conversation_item>& history,
                                        const std::vector<conversation_item>& input) {
    std::unordered_set<std::string_view> calls;
    for (const auto& item : history)
        if (item.kind == conversation_item::function_call) calls.insert(item.call_id);
    for (size_t i = 0; i < input.size(); ++i) {
        const auto& item = input[i];
        if (item.kind == conversation_item::function_call) calls.insert(item.call_id);
        if (item.kind != conversation_item::function_call_output || calls.count(item.call_id)) continue;
        const std::string path = "input[" + std::to_string(i) + "].call_id";
        return bad_request(path, path + ": no function_call with call_id " + json_escape(item.call_id) +
                                     " comes before this function_call_output");
    }
    return std::nullopt;
}

std::vector<chat_message> chat_messages(const std::optional<std::string>& instructions,
                                        const std::vector<conversation_item>& history,
                                        const std::vector<conversation_item>& input) {
    std::vector<chat_message> out;
    out.reserve(history.size() + input.size() + 1);
    if (instructions) out.push_back(chat_message{"system", *instructions, {}});
    bool open_calls = false;  // out.back() is an assistant message collecting function calls
    auto add = [&](const conversation_item& item) {
        switch (item.kind) {
            case conversation_item::message:
                out.push_back(chat_message{item.role, item.text, {}});
                open_calls = false;
                return;
            case conversation_item::function_call:
                if (!open_calls) out.push_back(chat_message{"assistant", std::nullopt, {}});
                open_calls = true;
                out.back().tool_calls.push_back(chat_tool_call{"function", item.name, item.arguments});
                return;
            case conversation_item::function_call_output:
                out.push_back(chat_message{"tool", item.text, {}});
                open_calls = false;
                return;
        }
    };
    for (const auto& item : history) add(item);
    for (const auto& item : input) add(item);
    return out;
}

}  // namespace moestream::server
