#include "server/tool_prompt.h"

#include <algorithm>

#include "config/assert.h"

namespace moestream::server {

namespace {

// The call format the model was trained on (DeepSeek-V3.1); output_parser reads it back.
constexpr std::string_view k_call_format =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
    "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>";

}  // namespace

std::string tool_definitions_text(const std::vector<tool_definition_view>& tools, std::string_view choice) {
    std::string out = "## Tools\nYou have access to the following tools:\n";
    for (const tool_definition_view& t : tools) {
        out += "\n### ";
        out += t.name;
        out += '\n';
        if (!t.description.empty()) {
            out += "Description: ";
            out += t.description;
            out += "\n\n";
        }
        out += "Parameters: ";
        out += t.parameters_json.empty() ? std::string_view("{}") : t.parameters_json;
        out += '\n';
    }
    out += "\nIMPORTANT: whenever you call tools, write the calls in exactly this format:\n";
    out += k_call_format;
    out += "\n\nWhere:\n"
           "- tool_call_name is the exact name of one of the tools listed above;\n"
           "- tool_call_arguments is one JSON object holding the call's arguments, as that tool's "
           "Parameters schema describes them;\n"
           "- {{additional_tool_calls}} stands for further calls written the same way, one after "
           "the other, when you need several tools at once; leave it out for a single call.\n"
           "Write nothing after <｜tool▁calls▁end｜>: the results of the calls come back to you in "
           "the next message.";
    if (choice == "required") {
        out += "\n\nIn this reply you must call at least one of the tools above.";
    } else if (choice != "auto") {
        const bool known = std::any_of(tools.begin(), tools.end(),
                                       [&](const tool_definition_view& t) { return t.name == choice; });
        MS_ASSERT_MSG(known, "tool_choice names a function that is not among the tools");
        out += "\n\nIn this reply you must call the tool ";
        out += choice;
        out += '.';
    }
    return out;
}

std::vector<chat_message> with_tool_definitions(std::vector<chat_message> messages,
                                                const std::vector<tool_definition_view>& tools,
                                                std::string_view choice) {
    if (tools.empty() || choice == "none") return messages;
    std::string block = tool_definitions_text(tools, choice);
    auto system = std::find_if(messages.begin(), messages.end(),
                               [](const chat_message& m) { return m.role == "system"; });
    if (system == messages.end()) {
        messages.insert(messages.begin(), chat_message{"system", std::move(block), {}});
        return messages;
    }
    std::string text = system->content.value_or(std::string());
    if (!text.empty()) text += "\n\n";
    text += block;
    system->content = std::move(text);
    return messages;
}

}  // namespace moestream::server
