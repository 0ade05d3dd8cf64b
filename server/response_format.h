// Wire shapes of completion responses (server-api-anchors.md §2.2, §3.2-§3.4): OpenAI chat and
// text completions (whole and streamed chunks) and llama-server's native /completion objects.
// Everything is written with json_writer (escaping, U+FFFD for broken UTF-8), never by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/completion_job.h"

namespace moestream::server {

struct response_meta {
    std::string id;           // chatcmpl-..., cmpl-...
    int64_t created = 0;      // unix seconds
    std::string model;        // what the client sent, or the served alias
    std::string fingerprint;  // system_fingerprint: the build
};

// What a whole (non-streamed) response needs: every update folded together.
struct job_totals {
    std::string content, reasoning;
    std::vector<parsed_tool_call> tool_calls;
    std::vector<emitted_token> tokens;
    std::vector<emitted_token> prompt_tokens;  // echo with logprobs: the scored prompt
    job_update last;  // the final update (finish reason, usage)
    void add(const job_update& u);
};

class chat_stream {
  public:
    chat_stream(response_meta meta, const completion_job& job) : meta_(std::move(meta)), job_(job) {}
    // Appends the SSE payloads (JSON, without "data: ") for one update.
    void on_update(const job_update& u, std::vector<std::string>& events);

  private:
    response_meta meta_;
    const completion_job& job_;
    bool role_sent_ = false;
};

class text_stream {
  public:
    text_stream(response_meta meta, const completion_job& job) : meta_(std::move(meta)), job_(job) {}
    void on_update(const job_update& u, std::vector<std::string>& events);

  private:
    response_meta meta_;
    const completion_job& job_;
    bool echo_sent_ = false;
    int64_t text_offset_ = 0;
};

// llama-server /completion and /infill streaming: partial objects, then the final one; no [DONE].
void native_stream_update(const completion_job& job, const job_update& u, std::vector<std::string>& events);

std::string chat_completion_json(const response_meta& meta, const completion_job& job, const job_totals& t);
std::string text_completion_json(const response_meta& meta, const completion_job& job, const job_totals& t);
std::string native_completion_json(const completion_job& job, const job_totals& t);

}  // namespace moestream::server
