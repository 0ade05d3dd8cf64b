// Chat template tests: every case of fixtures/tokenizer/chat.json (rendered by the Jinja
// template with HF transformers) must render byte for byte and tokenize to the same ids.
#include <simdjson.h>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "tests/common/test_support.h"

namespace moestream {
namespace {

std::filesystem::path chat_fixture() { return test::fixtures_dir() / "tokenizer/chat.json"; }
std::filesystem::path tokenizer_json() {
    return test::source_dir() / ".deps/tokenizer-deepseek_v3/models/tokenizer.json";
}

chat_message msg(std::string role, std::optional<std::string> content) {
    return chat_message{std::move(role), std::move(content), {}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(chat_template_suite)

BOOST_AUTO_TEST_CASE(golden_chat, *test::requires_path(chat_fixture())) {
    std::optional<tokenizer> tok;
    if (std::filesystem::exists(tokenizer_json())) {
        auto data = load_hf_tokenizer(tokenizer_json().string(), 129280);
        BOOST_REQUIRE(data.ok());
        auto t = tokenizer::create(std::move(*data));
        BOOST_REQUIRE(t.ok());
        tok.emplace(std::move(*t));
    } else {
        BOOST_TEST_MESSAGE("tokenizer.json absent: checking rendered text only, not ids");
    }
    simdjson::dom::parser parser;
    simdjson::dom::element root = parser.load(chat_fixture().string());
    size_t n = 0;
    for (simdjson::dom::element c : root["cases"].get_array()) {
        BOOST_TEST_CONTEXT("case " << n) {
            auto messages = parse_chat_messages(simdjson::minify(c["messages"]));
            BOOST_REQUIRE_MESSAGE(messages.ok(), (messages.ok() ? "" : messages.message()));
            auto rendered = render_chat(*messages, bool(c["add_generation_prompt"]));
            if (!c["error"].is_null()) {
                BOOST_TEST(!rendered.ok());
            } else {
                BOOST_REQUIRE_MESSAGE(rendered.ok(), (rendered.ok() ? "" : rendered.message()));
                BOOST_TEST(*rendered == std::string(std::string_view(c["rendered"])));
                if (tok) {
                    std::vector<int32_t> want;
                    for (int64_t id : c["ids"].get_array()) want.push_back(int32_t(id));
                    BOOST_TEST(tok->encode(*rendered, true) == want, boost::test_tools::per_element());
                }
            }
        }
        ++n;
    }
    BOOST_TEST(n > 0u);
}

BOOST_AUTO_TEST_CASE(system_prompts_are_hoisted_and_joined) {
    std::vector<chat_message> m = {msg("system", "A"), msg("user", "u"), msg("system", "B")};
    auto r = render_chat(m, true);
    BOOST_REQUIRE(r.ok());
    BOOST_TEST(*r == "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>u<｜Assistant｜>");
}

BOOST_AUTO_TEST_CASE(tool_call_quirks) {
    // Two assistant turns with tool calls: ns.is_first is never reset, so the second turn's
    // first call uses the continuation form and closes the call list.
    chat_message a1 = msg("assistant", std::nullopt);
    a1.tool_calls = {{"function", "f", "{}"}, {"function", "g", "{\"x\":1}"}};
    chat_message a2 = msg("assistant", std::nullopt);
    a2.tool_calls = {{"function", "h", "[]"}};
    std::vector<chat_message> m = {msg("user", "q"), a1, msg("tool", "r1"), msg("tool", "r2"),
                                   msg("assistant", "done"), a2, msg("tool", "r3")};
    auto r = render_chat(m, true);
    BOOST_REQUIRE(r.ok());
    const std::string want =
        "<｜begin▁of▁sentence｜><｜User｜>q"
        "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"
        "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{\"x\":1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>r1<｜tool▁output▁end｜>"
        "\n<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜>done<｜end▁of▁sentence｜>"
        "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>h\n```json\n[]\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "\n<｜tool▁output▁begin｜>r3<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜>";  // no generation prompt after tool outputs
    BOOST_TEST(*r == want);
}

BOOST_AUTO_TEST_CASE(null_content_is_an_error_where_jinja_fails) {
    BOOST_TEST(!render_chat({msg("user", std::nullopt)}, true).ok());
    BOOST_TEST(!render_chat({msg("system", std::nullopt)}, true).ok());
    BOOST_TEST(!render_chat({msg("tool", std::nullopt)}, true).ok());
    auto r = render_chat({msg("developer", "x")}, true);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.message().find("messages[0].role") != std::string::npos);
    // An assistant turn with null content and no tool calls renders nothing.
    auto ok = render_chat({msg("user", "u"), msg("assistant", std::nullopt)}, false);
    BOOST_REQUIRE(ok.ok());
    BOOST_TEST(*ok == "<｜begin▁of▁sentence｜><｜User｜>u");
}

BOOST_AUTO_TEST_CASE(parse_messages) {
    auto m = parse_chat_messages(R"([
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"k\": 1}"}}]},
        {"role": "tool", "content": "out", "tool_call_id": "c1"}
    ])");
    BOOST_REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.message()));
    BOOST_REQUIRE(m->size() == 3u);
    BOOST_TEST((*m)[0].content.value() == "ab");
    BOOST_TEST(!(*m)[1].content.has_value());
    BOOST_REQUIRE((*m)[1].tool_calls.size() == 1u);
    BOOST_TEST((*m)[1].tool_calls[0].name == "f");
    BOOST_TEST((*m)[1].tool_calls[0].arguments == "{\"k\": 1}");
    BOOST_TEST((*m)[2].role == "tool");
}

BOOST_AUTO_TEST_CASE(parse_errors_name_the_field) {
    auto check = [](std::string_view json, std::string_view field) {
        auto m = parse_chat_messages(json);
        BOOST_REQUIRE(!m.ok());
        BOOST_TEST(m.message().find(field) != std::string::npos, m.message());
    };
    check("{", "invalid JSON");
    check("{}", "must be a JSON array");
    check(R"([{"content": "x"}])", "messages[0].role");
    check(R"([{"role": "user", "content": 5}])", "messages[0].content");
    check(R"([{"role": "user", "content": [{"type": "image_url"}]}])", "messages[0].content[0].type");
    check(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
              "tool_calls": [{"function": {"arguments": "{}"}}]}])",
          "messages[1].tool_calls[0].function.name");
    check(R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}])",
          "messages[0].tool_calls[0].function.arguments");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream
