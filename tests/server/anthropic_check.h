// Checks of the Anthropic Messages wire shapes, shared by the route's suites (its own, the
// bad-input and the load suite): the error object, and the grammar of a stream's events.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server_fixture.h"

namespace moestream::test {

// {"type":"error","error":{"type":TYPE,"message":"..."}}
inline void check_anthropic_error_body(std::string_view body, std::string_view type) {
    json_doc d(body);
    BOOST_TEST_REQUIRE(d.ok(), "the error body is not JSON: " << body);
    BOOST_TEST(d.str({"type"}) == "error", body);
    BOOST_TEST(d.str({"error", "type"}) == type, body);
    BOOST_TEST(!d.str({"error", "message"}).empty(), body);
}

inline void check_anthropic_error(const http_reply& r, int status, std::string_view type) {
    BOOST_TEST(r.status == status, "status " << r.status << ", body " << r.body);
    BOOST_TEST(r.header("Content-Type") == "application/json");
    check_anthropic_error_body(r.body, type);
}

// What a stream said, once its grammar is checked.
struct anthropic_stream {
    std::string text, thinking;
    std::vector<std::string> tool_inputs;  // each tool_use block's concatenated partial_json
    std::string stop_reason, error_type;   // error_type: set when the stream ended with an error event
    int64_t output_tokens = -1, prompt_tokens = -1;  // from message_delta (input + cache figures)
    int pings = 0;
};

// The data payloads of a stream (sse_events), in order: message_start first; content blocks that
// start in index order, one open at a time, with deltas of their own kind; pings anywhere;
// message_delta then message_stop last, or an error event last. Tool inputs must parse as JSON
// objects.
inline anthropic_stream check_anthropic_stream(const std::vector<std::string>& events,
                                               const std::string& label) {
    anthropic_stream s;
    BOOST_TEST_REQUIRE(!events.empty(), label << ": no events");
    int64_t open = -1, blocks = 0;
    std::string open_type;
    bool delta_seen = false, stop_seen = false;
    for (size_t i = 0; i < events.size(); ++i) {
        json_doc d(events[i]);
        BOOST_TEST_REQUIRE(d.ok(), label << ": not JSON: " << events[i]);
        const std::string type = d.str({"type"});
        BOOST_TEST_REQUIRE(!stop_seen, label << ": an event after message_stop: " << events[i]);
        if (i == 0) {
            BOOST_TEST_REQUIRE(type == "message_start", label << ": first event " << events[i]);
            BOOST_TEST(d.str({"message", "role"}) == "assistant", label);
            continue;
        }
        if (type == "ping") {
            ++s.pings;
        } else if (type == "error") {
            BOOST_TEST(i + 1 == events.size(), label << ": the error event is not the last one");
            s.error_type = d.str({"error", "type"});
            BOOST_TEST(!d.str({"error", "message"}).empty(), label);
        } else if (type == "content_block_start") {
            BOOST_TEST_REQUIRE(open == -1, label << ": a block starts while one is open");
            BOOST_TEST_REQUIRE(d.integer({"index"}) == blocks, label << ": block index " << events[i]);
            open = blocks++;
            open_type = d.str({"content_block", "type"});
            BOOST_TEST((open_type == "text" || open_type == "thinking" || open_type == "tool_use"),
                       label << ": " << events[i]);
            if (open_type == "tool_use") {
                BOOST_TEST(d.str({"content_block", "id"}).starts_with("toolu_"), label);
                s.tool_inputs.emplace_back();
            }
        } else if (type == "content_block_delta") {
            BOOST_TEST_REQUIRE(d.integer({"index"}) == open,
                               label << ": a delta of a block that is not open");
            const std::string kind = d.str({"delta", "type"});
            if (kind == "text_delta") {
                BOOST_TEST(open_type == "text", label);
                s.text += d.str({"delta", "text"});
            } else if (kind == "thinking_delta") {
                BOOST_TEST(open_type == "thinking", label);
                s.thinking += d.str({"delta", "thinking"});
            } else {
                BOOST_TEST_REQUIRE(kind == "input_json_delta", label << ": " << events[i]);
                BOOST_TEST(open_type == "tool_use", label);
                s.tool_inputs.back() += d.str({"delta", "partial_json"});
            }
        } else if (type == "content_block_stop") {
            BOOST_TEST_REQUIRE(d.integer({"index"}) == open, label << ": stop of a block that is not open");
            open = -1;
        } else if (type == "message_delta") {
            BOOST_TEST(open == -1, label << ": message_delta with a block open");
            delta_seen = true;
            s.stop_reason = d.str({"delta", "stop_reason"});
            s.output_tokens = d.integer({"usage", "output_tokens"});
            s.prompt_tokens = d.integer({"usage", "input_tokens"}) +
                              d.integer({"usage", "cache_creation_input_tokens"}) +
                              d.integer({"usage", "cache_read_input_tokens"});
        } else if (type == "message_stop") {
            BOOST_TEST(delta_seen, label << ": message_stop without message_delta");
            stop_seen = true;
        } else {
            BOOST_TEST(false, label << ": unknown event " << events[i]);
        }
    }
    BOOST_TEST((stop_seen || !s.error_type.empty()),
               label << ": neither message_stop nor an error ends the stream");
    for (const auto& input : s.tool_inputs) {
        json_doc in(input);
        BOOST_TEST((in.ok() && in.root().is_object()),
                   label << ": tool input is not a JSON object: " << input);
    }
    return s;
}

}  // namespace moestream::test
