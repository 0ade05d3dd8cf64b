// Generated text -> what an OpenAI client expects: reasoning_content, content and tool calls,
// incrementally (one delta per pushed token text) and as the whole message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moestream::server {

// One entry of a streamed delta's "tool_calls" array. The first entry of a call (its header)
// carries id and name and empty arguments; later entries carry only argument fragments, so a
// handler can send the header in a chunk of its own as OpenAI does, or all entries of a delta in
// one chunk (clients merge entries by index).
struct tool_call_delta {
    int index = 0;          // call number in this message
    std::string id;         // set on the first delta of a call only
    std::string name;       // set on the first delta only (sent when the name is complete)
    std::string arguments;  // fragment; concatenation over the call's deltas = the arguments JSON text
};

struct output_delta {
    std::string content;    // may be empty
    std::string reasoning;  // may be empty
    std::vector<tool_call_delta> tool_calls;
    bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

struct parsed_tool_call {
    std::string id, name, arguments;
    bool complete = false;         // its end marker arrived (false: generation ended inside it)
    bool arguments_valid = false;  // arguments parse as a JSON object (checked at its end)
};

struct parser_options {
    bool tools_enabled = false;        // request had tools and tool_choice != none: parse tool calls; otherwise the markers stay text
    bool reasoning_enabled = true;     // split <think>..</think> into reasoning; false: everything is content
    bool starts_in_reasoning = false;  // the prompt ended inside <think>
    uint64_t id_seed = 0;              // tool call ids derive from it (reproducible responses)
};

// Recognises what DeepSeek models write:
//  - reasoning: "<think>" at the very start of the output (or from the start when
//    starts_in_reasoning) up to "</think>". Whitespace right after "<think>" and right after
//    "</think>" is dropped (the model's formatting, not part of either text). An unclosed "<think>"
//    leaves everything in reasoning. Markers inside reasoning are reasoning text.
//  - tool calls (tools_enabled), the DeepSeek-V3 form
//      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//    and the V3.1 form <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> (a V3.1 call to
//    a tool named "function" is told apart by ARGS not starting with a name character). Calls may
//    be separated by whitespace; "<｜tool▁calls▁end｜>" closes the section; a section may also
//    open directly with "<｜tool▁call▁begin｜>". Names are [A-Za-z0-9_.-], at most 128 bytes.
//
// Decisions (nothing the model wrote is lost, and the streamed deltas always add up to the final
// message, because a sent delta cannot be taken back):
//  - Text that may be the start of a marker is withheld until certain; nothing else is withheld.
//  - A call's header is sent once its name is complete; from then on it is a call: everything up
//    to "<｜tool▁call▁end｜>" is its arguments (with the ```json fence line and the closing "\n```"
//    removed), streamed as it arrives.
//  - Arguments that are not a JSON object are still reported as they are (arguments_valid false):
//    the client sees exactly what the model wrote.
//  - Malformed markup before a header was sent (e.g. "<｜tool▁calls▁begin｜>Sure", a bad name)
//    goes back into content verbatim and parsing continues after it.
//  - Text after "<｜tool▁calls▁end｜>", or after a call that is followed by something other than
//    another call, is content again (parsed as such, so a later section adds calls).
//  - finish() inside a call whose header was sent: the call stays, complete false, with the
//    arguments that arrived (a withheld tail, which can only be the start of the closing
//    "\n```<｜tool▁call▁end｜>", is dropped; an unfinished ``` line counts as arguments). Inside
//    markup before a header: that raw text becomes content, no call is reported. Whitespace
//    withheld after a finished call is dropped.
class output_parser {
  public:
    explicit output_parser(parser_options opts);

    output_delta push(std::string_view text);  // text is valid UTF-8
    output_delta finish();                     // end: flushes withheld text (see above)
    bool saw_tool_calls() const { return !calls_.empty(); }  // finish_reason "tool_calls"

    // The whole message so far (for non-streaming responses and the WebSocket final event).
    const std::string& content() const { return content_; }
    const std::string& reasoning() const { return reasoning_; }
    const std::vector<parsed_tool_call>& tool_calls() const { return calls_; }

  private:
    enum class state {
        start,               // may still begin with <think>
        reasoning,           // inside <think>
        content,             // plain text; watching for the start of a tool-call section
        section,             // between calls: whitespace, then a call or the section's end
        call_header,         // after <｜tool▁call▁begin｜>: "function" or a V3.1 name, up to the separator
        after_function_sep,  // "function<｜tool▁sep｜>": V3 (a name follows) or a V3.1 call to "function"
        call_name,           // V3 name, up to its newline
        fence,               // header sent; an optional ```json line
        arguments,           // header sent; up to <｜tool▁call▁end｜>
    };

    bool step(output_delta& d);  // consumes what the state can decide; false when it needs more text
    bool step_start();
    bool step_reasoning(output_delta& d);
    bool step_content(output_delta& d);
    bool step_section(output_delta& d);
    bool step_call_header(output_delta& d);
    bool step_after_function_sep(output_delta& d);
    bool step_call_name(output_delta& d);
    bool step_fence();
    bool step_arguments(output_delta& d);
    bool fall_back(output_delta& d);  // the markup in raw_ was not a call: it is content

    void emit_content(output_delta& d, std::string_view text);
    void emit_reasoning(output_delta& d, std::string_view text);
    void emit_arguments(output_delta& d, std::string_view text);
    void open_call(output_delta& d, std::string_view name);
    void close_call(bool complete);

    parser_options opts_;
    state state_;
    std::string pending_;    // received, not yet consumed by the state machine
    std::string raw_;        // markup consumed since the last point where no call was open (for fall_back)
    bool skip_ws_ = false;   // drop whitespace before the next content/reasoning text
    bool fenced_ = false;    // the current call's arguments opened with a ``` line
    bool finished_ = false;
    std::string content_, reasoning_;
    std::vector<parsed_tool_call> calls_;
};

// "call_" + 24 letters/digits derived from (seed, index): distinct per call, reproducible.
std::string tool_call_id(uint64_t seed, int index);

}  // namespace moestream::server
