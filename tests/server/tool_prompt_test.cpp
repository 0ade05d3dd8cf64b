// tool_prompt: the exact text of the tools block, where it goes, and that the DeepSeek-V3 chat
// template renders the result.
#include <boost/test/unit_test.hpp>

#include "server/tool_prompt.h"

namespace moestream::server {
namespace {

const std::string k_rules =
    "\nIMPORTANT: whenever you call tools, write the calls in exactly this format:\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
    "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n"
    "- tool_call_name is the exact name of one of the tools listed above;\n"
    "- tool_call_arguments is one JSON object holding the call's arguments, as that tool's "
    "Parameters schema describes them;\n"
    "- {{additional_tool_calls}} stands for further calls written the same way, one after the other, "
    "when you need several tools at once; leave it out for a single call.\n"
    "Write nothing after <｜tool▁calls▁end｜>: the results of the calls come back to you in the next "
    "message.";

const std::string k_weather_params = R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})";

const std::vector<tool_definition_view> k_one = {{"get_weather", "Current weather of a city.", k_weather_params}};
const std::vector<tool_definition_view> k_two = {{"get_weather", "Current weather of a city.", k_weather_params},
                                                 {"now", "", ""}};

const std::string k_one_text = "## Tools\nYou have access to the following tools:\n"
                               "\n### get_weather\nDescription: Current weather of a city.\n\nParameters: " +
                               k_weather_params + "\n" + k_rules;

chat_message msg(std::string role, std::optional<std::string> content) {
    return chat_message{std::move(role), std::move(content), {}};
}

std::string rendered(const std::vector<chat_message>& messages) {
    auto r = render_chat(messages, true);
    if (!r.ok()) BOOST_FAIL(r.message());
    return *r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tool_prompt_suite)

BOOST_AUTO_TEST_CASE(no_tools_leaves_the_messages_alone) {
    const std::vector<chat_message> in = {msg("user", "hi")};
    const auto out = with_tool_definitions(in, {}, "auto");
    BOOST_REQUIRE(out.size() == 1u);
    BOOST_TEST(rendered(out) == rendered(in));
    // tool_choice "none": the model must not call tools, so it is not told about them.
    BOOST_TEST(rendered(with_tool_definitions(in, k_one, "none")) == rendered(in));
}

BOOST_AUTO_TEST_CASE(one_tool_becomes_a_new_system_message) {
    const auto out = with_tool_definitions({msg("user", "Weather in Paris?")}, k_one, "auto");
    BOOST_REQUIRE(out.size() == 2u);
    BOOST_TEST(out[0].role == "system");
    BOOST_REQUIRE(out[0].content.has_value());
    BOOST_TEST(*out[0].content == k_one_text);
    BOOST_TEST(rendered(out) ==
               "<｜begin▁of▁sentence｜>" + k_one_text + "<｜User｜>Weather in Paris?<｜Assistant｜>");
}

BOOST_AUTO_TEST_CASE(two_tools_empty_description_and_parameters) {
    const auto out = with_tool_definitions({msg("user", "hi")}, k_two, "auto");
    const std::string want = "## Tools\nYou have access to the following tools:\n"
                             "\n### get_weather\nDescription: Current weather of a city.\n\nParameters: " +
                             k_weather_params + "\n\n### now\nParameters: {}\n" + k_rules;
    BOOST_REQUIRE(out.size() == 2u);
    BOOST_TEST(*out[0].content == want);
}

BOOST_AUTO_TEST_CASE(existing_system_message_keeps_its_text_first) {
    const std::vector<chat_message> in = {msg("user", "hi"), msg("system", "You are terse."),
                                          msg("system", "Answer in French.")};
    const auto out = with_tool_definitions(in, k_one, "auto");
    BOOST_REQUIRE(out.size() == 3u);
    BOOST_TEST(*out[1].content == "You are terse.\n\n" + k_one_text);
    BOOST_TEST(*out[2].content == "Answer in French.");
    BOOST_TEST(rendered(out) == "<｜begin▁of▁sentence｜>You are terse.\n\n" + k_one_text +
                                    "\n\nAnswer in French.<｜User｜>hi<｜Assistant｜>");
    // A null system content would make the template fail; it counts as empty.
    const auto from_null = with_tool_definitions({msg("system", std::nullopt), msg("user", "hi")}, k_one, "auto");
    BOOST_TEST(*from_null[0].content == k_one_text);
    BOOST_TEST(rendered(from_null).starts_with("<｜begin▁of▁sentence｜>" + k_one_text + "<｜User｜>"));
}

BOOST_AUTO_TEST_CASE(required_and_named_choices_add_an_instruction) {
    const auto required = with_tool_definitions({msg("user", "hi")}, k_two, "required");
    BOOST_TEST(required[0].content->ends_with(k_rules + "\n\nIn this reply you must call at least one of the tools above."));
    const auto named = with_tool_definitions({msg("user", "hi")}, k_two, "now");
    BOOST_TEST(named[0].content->ends_with(k_rules + "\n\nIn this reply you must call the tool now."));
    BOOST_TEST(tool_definitions_text(k_two, "auto").ends_with(k_rules));
}

BOOST_AUTO_TEST_CASE(the_template_renders_tool_history_after_the_block) {
    chat_message call = msg("assistant", std::nullopt);
    call.tool_calls.push_back(chat_tool_call{"function", "get_weather", R"({"city":"Paris"})"});
    const std::vector<chat_message> in = {msg("user", "Weather in Paris?"), call, msg("tool", "18C, sunny")};
    const std::string text = rendered(with_tool_definitions(in, k_one, "auto"));
    BOOST_TEST(text.starts_with("<｜begin▁of▁sentence｜>" + k_one_text + "<｜User｜>Weather in Paris?<｜Assistant｜>"));
    BOOST_TEST(text.ends_with("<｜tool▁outputs▁end｜>"));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::server
