// The Responses event stream and response object (server/responses_stream.h), from synthetic job
// updates: the item sequence for reasoning, text and tool calls, the terminal statuses, error
// codes, keep-alives and token accounting. The stream checker shared with the live tests is
// defined here too.
#include "server/responses_stream.h"

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "responses_stream_check.h"
#include "server_fixture.h"

namespace moestream::test {

std::vector<sse_frame> sse_frames(std::string_view body) {
    std::vector<sse_frame> out;
    size_t at = 0;
    for (;;) {
        const size_t end = body.find("\n\n", at);
        if (end == std::string_view::npos) break;
        std::string_view frame = body.substr(at, end - at);
        at = end + 2;
        sse_frame f;
        bool any = false;
        while (!frame.empty()) {
            const size_t nl = frame.find('\n');
            std::string_view line = frame.substr(0, nl);
            frame = nl == std::string_view::npos ? std::string_view() : frame.substr(nl + 1);
            if (line.rfind("event: ", 0) == 0) f.event = std::string(line.substr(7)), any = true;
            else if (line.rfind("data: ", 0) == 0) f.data += std::string(line.substr(6)), any = true;
        }
        if (any) out.push_back(std::move(f));
    }
    return out;
}

namespace {

using simdjson::dom::element;

std::string str_of(element e, std::string_view key) {
    std::string_view s;
    if (e[key].get_string().get(s)) return {};
    return std::string(s);
}
int64_t int_of(element e, std::string_view key) {
    int64_t v = -1;
    if (e[key].get_int64().get(v)) return -1;
    return v;
}

struct streamed_item {
    std::string type, id, text, arguments, name, call_id;
    bool part_added = false, done = false;
};

}  // namespace

checked_response_stream check_response_stream(const std::vector<sse_frame>& frames, const std::string& label) {
    checked_response_stream out;
    bool ok = true;
    auto expect = [&](bool cond, const std::string& what) {
        if (!cond) {
            ok = false;
            BOOST_ERROR(label << ": " << what);
        }
        return cond;
    };
    if (!expect(frames.size() >= 3, "fewer than three events (" + std::to_string(frames.size()) + ")")) return out;
    std::vector<simdjson::dom::parser> parsers(frames.size());
    std::vector<streamed_item> items;
    std::string response_id;
    for (size_t i = 0; i < frames.size(); ++i) {
        const auto& f = frames[i];
        const std::string where = "event " + std::to_string(i) + " (" + f.event + ")";
        element e;
        simdjson::padded_string padded(f.data);
        if (!expect(parsers[i].parse(padded).get(e) == simdjson::SUCCESS, where + " is not JSON: " + f.data)) return out;
        const std::string type = str_of(e, "type");
        expect(type == f.event, where + ": the payload's type is " + type);
        expect(int_of(e, "sequence_number") == int64_t(i), where + ": sequence_number " +
                                                                  std::to_string(int_of(e, "sequence_number")));
        const bool terminal = type == "response.completed" || type == "response.incomplete" || type == "response.failed";
        expect(terminal == (i + 1 == frames.size()), where + ": the terminal event must be the last one");
        if (i == 0) expect(type == "response.created", where + ": the stream must start with response.created");
        if (type == "response.created" || type == "response.in_progress" || terminal) {
            element r;
            if (!expect(e["response"].get(r) == simdjson::SUCCESS, where + ": no response")) continue;
            expect(str_of(r, "object") == "response", where + ": object");
            if (response_id.empty()) response_id = str_of(r, "id");
            expect(str_of(r, "id") == response_id && response_id.rfind("resp_", 0) == 0, where + ": id " + str_of(r, "id"));
            if (!terminal) {
                expect(str_of(r, "status") == "in_progress", where + ": status " + str_of(r, "status"));
                // An SDK takes it for a fresh snapshot: it would drop the items streamed so far.
                expect(items.empty(), where + ": a lifecycle event after the first item");
                continue;
            }
            out.status = str_of(r, "status");
            out.final_response = simdjson::minify(r);
            expect(type == "response." + out.status, where + ": status " + out.status);
            for (const auto& it : items) expect(it.done, where + ": item " + it.id + " was not done");
            simdjson::dom::array output;
            if (expect(r["output"].get_array().get(output) == simdjson::SUCCESS, where + ": output")) {
                expect(output.size() == items.size(), where + ": output holds " + std::to_string(output.size()) +
                                                          " items, the stream " + std::to_string(items.size()));
                size_t k = 0;
                for (element o : output) {
                    if (k >= items.size()) break;
                    expect(str_of(o, "id") == items[k].id && str_of(o, "type") == items[k].type,
                           where + ": output[" + std::to_string(k) + "] is not the streamed item");
                    ++k;
                }
            }
            element usage;
            if (out.status == "failed") {
                element err;
                if (expect(r["error"].get(err) == simdjson::SUCCESS && err.is_object(), where + ": error"))
                    out.error_code = str_of(err, "code");
                expect(!str_of(err, "message").empty(), where + ": error.message");
            } else if (expect(r["usage"].get(usage) == simdjson::SUCCESS && usage.is_object(), where + ": usage")) {
                out.input_tokens = int_of(usage, "input_tokens");
                out.output_tokens = int_of(usage, "output_tokens");
                element d;
                if (usage["input_tokens_details"].get(d) == simdjson::SUCCESS) out.cached_tokens = int_of(d, "cached_tokens");
                if (usage["output_tokens_details"].get(d) == simdjson::SUCCESS)
                    out.reasoning_tokens = int_of(d, "reasoning_tokens");
                expect(out.input_tokens > 0 && out.output_tokens >= 0, where + ": token counts");
                expect(out.cached_tokens >= 0 && out.cached_tokens <= out.input_tokens, where + ": cached_tokens");
                expect(out.reasoning_tokens >= 0 && out.reasoning_tokens <= out.output_tokens, where + ": reasoning_tokens");
                expect(int_of(usage, "total_tokens") == out.input_tokens + out.output_tokens, where + ": total_tokens");
                if (out.status == "incomplete") {
                    element details;
                    expect(r["incomplete_details"].get(details) == simdjson::SUCCESS &&
                               str_of(details, "reason") == "max_output_tokens",
                           where + ": incomplete_details.reason");
                }
            }
            continue;
        }
        // Item events.
        const int64_t index = int_of(e, "output_index");
        if (type == "response.output_item.added") {
            element it;
            if (!expect(e["item"].get(it) == simdjson::SUCCESS, where + ": item")) continue;
            expect(index == int64_t(items.size()), where + ": output_index " + std::to_string(index));
            expect(items.empty() || items.back().done, where + ": an item starts while another is open");
            streamed_item s;
            s.type = str_of(it, "type");
            s.id = str_of(it, "id");
            s.name = str_of(it, "name");
            s.call_id = str_of(it, "call_id");
            expect(str_of(it, "status") == "in_progress", where + ": status");
            expect(s.type == "message" || s.type == "reasoning" || s.type == "function_call", where + ": type " + s.type);
            if (s.type == "function_call")
                expect(!s.name.empty() && s.call_id.rfind("call_", 0) == 0 && str_of(it, "arguments").empty(),
                       where + ": a call starts with its name, call_id and no arguments");
            items.push_back(std::move(s));
            continue;
        }
        if (!expect(index >= 0 && index < int64_t(items.size()), where + ": output_index " + std::to_string(index)))
            continue;
        streamed_item& s = items[size_t(index)];
        expect(!s.done, where + ": the item is already done");
        if (type != "response.output_item.done") expect(str_of(e, "item_id") == s.id, where + ": item_id");
        if (type == "response.content_part.added") {
            expect(!s.part_added && s.type != "function_call" && int_of(e, "content_index") == 0, where);
            s.part_added = true;
        } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
            expect(s.part_added && s.type == (type == "response.output_text.delta" ? "message" : "reasoning"),
                   where + ": a delta of the wrong item or before its part");
            expect(int_of(e, "content_index") == 0, where + ": content_index");
            s.text += str_of(e, "delta");
        } else if (type == "response.output_text.done" || type == "response.reasoning_text.done") {
            expect(str_of(e, "text") == s.text, where + ": the text differs from the deltas");
        } else if (type == "response.function_call_arguments.delta") {
            expect(s.type == "function_call", where);
            s.arguments += str_of(e, "delta");
        } else if (type == "response.function_call_arguments.done") {
            expect(str_of(e, "arguments") == s.arguments && str_of(e, "name") == s.name,
                   where + ": the arguments differ from the deltas");
        } else if (type == "response.content_part.done") {
            element part;
            expect(e["part"].get(part) == simdjson::SUCCESS && str_of(part, "text") == s.text, where + ": part text");
        } else if (type == "response.output_item.done") {
            element it;
            if (!expect(e["item"].get(it) == simdjson::SUCCESS, where + ": item")) continue;
            const std::string status = str_of(it, "status");
            expect(str_of(it, "id") == s.id && (status == "completed" || status == "incomplete"), where + ": id, status");
            if (s.type == "function_call") {
                expect(str_of(it, "arguments") == s.arguments && str_of(it, "call_id") == s.call_id &&
                           str_of(it, "name") == s.name,
                       where + ": the complete call differs from the streamed one");
                out.calls.emplace_back(s.name, s.arguments);
            } else {
                simdjson::dom::array content;
                std::string text;
                if (expect(it["content"].get_array().get(content) == simdjson::SUCCESS, where + ": content"))
                    for (element part : content) text += str_of(part, "text");
                expect(text == s.text, where + ": the complete item's text differs from the deltas");
                (s.type == "message" ? out.text : out.reasoning) += s.text;
            }
            s.done = true;
        } else {
            expect(false, where + ": unexpected event type");
        }
    }
    out.ok = ok;
    return out;
}

}  // namespace moestream::test

using namespace moestream;
using namespace moestream::server;
using moestream::test::check_response_stream;
using moestream::test::sse_frame;
using moestream::test::sse_frames;
using moestream::test::json_doc;

namespace {

job_update text_update(std::string content, std::string reasoning = {}, int tokens = 1) {
    job_update u;
    u.delta.content = std::move(content);
    u.delta.reasoning = std::move(reasoning);
    u.tokens.resize(size_t(tokens));
    return u;
}

job_update final_update(std::string reason, int64_t prompt, int64_t cached, int64_t completion) {
    job_update u;
    u.done = true;
    u.finish_reason = std::move(reason);
    u.usage.prompt_tokens = prompt;
    u.usage.cached_tokens = cached;
    u.usage.completion_tokens = completion;
    return u;
}

std::vector<sse_frame> frames_of(const std::vector<sse_event>& events) {
    std::string wire;
    for (const auto& e : events) wire += e.wire();
    return sse_frames(wire);
}

response_echo echo_with_tool() {
    response_echo e;
    e.instructions = "Be brief.";
    e.max_output_tokens = 64;
    function_tool t;
    t.name = "get_weather";
    t.parameters_json = R"({"type":"object"})";
    e.tools.push_back(t);
    e.tool_choice_json = R"("auto")";
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(responses_stream)

BOOST_AUTO_TEST_CASE(reasoning_text_and_calls_become_items) {
    response_builder b(new_response_id("resp_"), 1700000000, "tiny", echo_with_tool());
    std::vector<sse_event> ev;
    b.begin(&ev);
    job_update think;  // "<think>" held back: no text yet
    think.tokens.resize(1);
    b.on_update(think, &ev);
    b.on_update(text_update("", "Let me think"), &ev);
    b.on_update(text_update("", " more."), &ev);
    b.on_update(text_update("It is "), &ev);
    b.on_update(text_update("sunny."), &ev);
    job_update call = text_update("");
    call.delta.tool_calls.push_back(tool_call_delta{0, "call_parser0", "get_weather", ""});
    call.delta.tool_calls.push_back(tool_call_delta{0, "", "", R"({"city":)"});
    b.on_update(call, &ev);
    job_update rest = text_update("");
    rest.delta.tool_calls.push_back(tool_call_delta{0, "", "", R"("Paris"})"});
    rest.delta.tool_calls.push_back(tool_call_delta{1, "call_parser1", "get_weather", "{}"});
    b.on_update(rest, &ev);
    b.on_update(final_update("tool_calls", 40, 16, 9), &ev);
    BOOST_TEST(b.finished());
    BOOST_TEST(b.status() == "completed");

    const auto got = check_response_stream(frames_of(ev), "mixed");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(got.status == "completed");
    BOOST_TEST(got.reasoning == "Let me think more.");
    BOOST_TEST(got.text == "It is sunny.");
    BOOST_TEST_REQUIRE(got.calls.size() == 2u);
    BOOST_TEST(got.calls[0].second == R"({"city":"Paris"})");
    BOOST_TEST(got.calls[1].second == "{}");
    BOOST_TEST(got.input_tokens == 40);
    BOOST_TEST(got.cached_tokens == 16);
    BOOST_TEST(got.output_tokens == 9);
    BOOST_TEST(got.reasoning_tokens == 3, "the held-back <think> token and the two reasoning tokens");

    // The whole response object equals the stream's final one.
    BOOST_TEST(b.response_json() == got.final_response);
    json_doc d(b.response_json());
    BOOST_TEST_REQUIRE(d.ok());
    BOOST_TEST(d.str({"object"}) == "response");
    BOOST_TEST(d.str({"model"}) == "tiny");
    BOOST_TEST(d.integer({"created_at"}) == 1700000000);
    BOOST_TEST(d.str({"instructions"}) == "Be brief.");
    BOOST_TEST(d.integer({"max_output_tokens"}) == 64);
    BOOST_TEST(d.length({"output"}) == 4);
    BOOST_TEST(d.str({"output", "0", "type"}) == "reasoning");
    BOOST_TEST(d.str({"output", "0", "content", "0", "type"}) == "reasoning_text");
    BOOST_TEST(d.str({"output", "1", "content", "0", "type"}) == "output_text");
    BOOST_TEST(d.str({"output", "1", "role"}) == "assistant");
    BOOST_TEST(d.str({"output", "2", "id"}).rfind("fc_", 0) == 0u);
    BOOST_TEST(d.str({"output", "2", "call_id"}) != d.str({"output", "3", "call_id"}));
    BOOST_TEST(d.str({"tools", "0", "name"}) == "get_weather");
    BOOST_TEST(d.str({"tool_choice"}) == "auto");
    BOOST_TEST(d.str({"text", "format", "type"}) == "text");
    BOOST_TEST(d.is_null({"error"}));
    BOOST_TEST(d.is_null({"previous_response_id"}));

    // What a continuation replays: the text and the calls, not the reasoning.
    const auto items = b.output_items();
    BOOST_TEST_REQUIRE(items.size() == 3u);
    BOOST_TEST(items[0].kind == conversation_item::message);
    BOOST_TEST(items[0].role == "assistant");
    BOOST_TEST(items[0].text == "It is sunny.");
    BOOST_TEST(items[1].kind == conversation_item::function_call);
    BOOST_TEST(items[1].call_id == d.str({"output", "2", "call_id"}));
    BOOST_TEST(items[1].arguments == R"({"city":"Paris"})");
}

BOOST_AUTO_TEST_CASE(length_is_incomplete) {
    response_builder b(new_response_id("resp_"), 1, "tiny", {});
    std::vector<sse_event> ev;
    b.begin(&ev);
    b.on_update(text_update("abc", "", 2), &ev);
    b.on_update(final_update("length", 5, 0, 2), &ev);
    const auto got = check_response_stream(frames_of(ev), "length");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(got.status == "incomplete");
    json_doc d(got.final_response);
    BOOST_TEST(d.str({"incomplete_details", "reason"}) == "max_output_tokens");
    BOOST_TEST(d.str({"output", "0", "status"}) == "incomplete");
    BOOST_TEST(got.reasoning_tokens == 0);
}

BOOST_AUTO_TEST_CASE(failures_carry_the_codes_codex_reads) {
    const api_error busy = make_api_error(429, "rate_limit_error", "the server is busy: 64 requests are already waiting");
    const api_error overflow = context_exceeded(9000, 8192);
    const api_error broken = make_api_error(500, "server_error", "an expert could not be read");
    BOOST_TEST(response_error_code(busy) == "rate_limit_exceeded");
    BOOST_TEST(response_error_code(overflow) == "context_length_exceeded");
    BOOST_TEST(response_error_code(broken) == "server_error");
    for (const api_error* e : {&busy, &overflow}) {
        response_builder b(new_response_id("resp_"), 1, "tiny", {});
        std::vector<sse_event> ev;
        b.begin(&ev);
        b.fail(*e, &ev);
        const auto got = check_response_stream(frames_of(ev), "failed at admission");
        BOOST_TEST_REQUIRE(got.ok);
        BOOST_TEST(got.status == "failed");
        BOOST_TEST(got.error_code == response_error_code(*e));
        json_doc d(got.final_response);
        if (e->status == 429) BOOST_TEST(d.str({"error", "message"}).find("try again in 1s") != std::string::npos);
        else BOOST_TEST(d.str({"error", "message"}).find("maximum context length is 8192") != std::string::npos);
    }
    // Mid-stream: the open item ends incomplete, then response.failed.
    response_builder b(new_response_id("resp_"), 1, "tiny", {});
    std::vector<sse_event> ev;
    b.begin(&ev);
    b.on_update(text_update("partial"), &ev);
    job_update u = final_update("error", 5, 0, 1);
    u.error = broken;
    b.on_update(u, &ev);
    const auto got = check_response_stream(frames_of(ev), "failed mid-stream");
    BOOST_TEST_REQUIRE(got.ok);
    BOOST_TEST(got.error_code == "server_error");
    BOOST_TEST(got.text == "partial");
    BOOST_TEST(json_doc(got.final_response).str({"output", "0", "status"}) == "incomplete");
}

BOOST_AUTO_TEST_CASE(keep_alive_only_before_any_item) {
    response_builder b(new_response_id("resp_"), 1, "tiny", {});
    BOOST_TEST(!b.keep_alive().has_value(), "nothing before the stream began");
    std::vector<sse_event> ev;
    b.begin(&ev);
    auto k = b.keep_alive();
    BOOST_TEST_REQUIRE(k.has_value());
    BOOST_TEST(k->type == "response.in_progress");
    ev.push_back(*k);
    b.on_update(text_update("x"), &ev);
    BOOST_TEST(!b.keep_alive().has_value(), "an SDK would take a repeated in_progress for a fresh snapshot");
    b.on_update(final_update("stop", 3, 0, 1), &ev);
    BOOST_TEST(check_response_stream(frames_of(ev), "keep-alive").ok);
}

BOOST_AUTO_TEST_CASE(whole_responses_build_no_events) {
    response_builder b(new_response_id("resp_"), 1, "tiny", {});
    b.begin(nullptr);
    b.on_update(text_update("Hello"), nullptr);
    b.on_update(final_update("stop", 3, 1, 1), nullptr);
    json_doc d(b.response_json());
    BOOST_TEST(d.str({"status"}) == "completed");
    BOOST_TEST(d.str({"output", "0", "content", "0", "text"}) == "Hello");
    BOOST_TEST(d.integer({"usage", "input_tokens_details", "cached_tokens"}) == 1);
    BOOST_TEST(d.integer({"usage", "total_tokens"}) == 4);
}

BOOST_AUTO_TEST_CASE(ids_are_distinct) {
    const std::string a = new_response_id("resp_"), b = new_response_id("resp_");
    BOOST_TEST(a != b);
    BOOST_TEST(a.size() == 5u + 32u);
    BOOST_TEST(new_response_id("call_").rfind("call_", 0) == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
