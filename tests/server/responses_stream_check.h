// Checks a /v1/responses event stream the way the OpenAI SDK's accumulator and Codex read it
// (defined in responses_stream_test.cpp, used by the live tests too): every event names its type
// in both the `event:` line and the payload, sequence_number counts 0, 1, 2, ...; items are added
// at the next output_index and receive deltas only while open; each .done repeats exactly what
// the deltas added up to; response.created / .in_progress (keep-alives included) come before the
// first item only; the terminal event (completed, incomplete or failed) comes last and its
// response lists exactly the streamed items; usage adds up.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moestream::test {

// One SSE frame: the `event:` name and the `data:` payload.
struct sse_frame {
    std::string event, data;
};
// The frames of an SSE body (comment lines skipped; a trailing partial frame is dropped).
std::vector<sse_frame> sse_frames(std::string_view body);

struct checked_response_stream {
    bool ok = false;             // every check passed (failures are reported as test errors)
    std::string status;          // the terminal response's status
    std::string final_response;  // the terminal event's response object (JSON)
    std::string text;            // message text, all messages
    std::string reasoning;       // reasoning text
    std::vector<std::pair<std::string, std::string>> calls;  // function calls: name, arguments
    std::string error_code;      // failed: error.code
    int64_t output_tokens = -1, input_tokens = -1, cached_tokens = -1, reasoning_tokens = -1;
};

// `label` prefixes the failure messages.
checked_response_stream check_response_stream(const std::vector<sse_frame>& frames, const std::string& label);

}  // namespace moestream::test
