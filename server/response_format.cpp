#include "server/response_format.h"

#include <cmath>

#include "server/json_writer.h"
#include "server/service.h"

namespace moestream::server {

namespace {

void write_meta(json_writer& w, const response_meta& m, const char* object) {
    w.key("id");
    w.value(m.id);
    w.key("object");
    w.value(object);
    w.key("created");
    w.value(m.created);
    w.key("model");
    w.value(m.model);
    w.key("system_fingerprint");
    w.value(m.fingerprint);
}

void write_usage(json_writer& w, const job_usage& u) {
    w.key("usage");
    w.begin_object();
    w.key("prompt_tokens");
    w.value(u.prompt_tokens);
    w.key("completion_tokens");
    w.value(u.completion_tokens);
    w.key("total_tokens");
    w.value(u.prompt_tokens + u.completion_tokens);
    w.key("prompt_tokens_details");
    w.begin_object();
    w.key("cached_tokens");
    w.value(u.cached_tokens);
    w.end_object();
    w.end_object();
}

double per_second(int64_t n, double s) { return s > 0 ? double(n) / s : 0.0; }

// llama-server's timings object (server-task.cpp result_timings), plus our queue time; draft_n and
// draft_n_accepted when speculative decoding drafted tokens for the request.
void write_timings(json_writer& w, const job_usage& u) {
    const int64_t prompt_n = u.prompt_tokens - u.cached_tokens;
    w.key("timings");
    w.begin_object();
    w.key("cache_n");
    w.value(u.cached_tokens);
    w.key("prompt_n");
    w.value(prompt_n);
    w.key("prompt_ms");
    w.value(u.prefill_s * 1e3);
    w.key("prompt_per_token_ms");
    w.value(prompt_n > 0 ? u.prefill_s * 1e3 / double(prompt_n) : 0.0);
    w.key("prompt_per_second");
    w.value(per_second(prompt_n, u.prefill_s));
    w.key("predicted_n");
    w.value(u.completion_tokens);
    w.key("predicted_ms");
    w.value(u.decode_s * 1e3);
    w.key("predicted_per_token_ms");
    w.value(u.completion_tokens > 0 ? u.decode_s * 1e3 / double(u.completion_tokens) : 0.0);
    w.key("predicted_per_second");
    w.value(per_second(u.completion_tokens, u.decode_s));
    w.key("queue_ms");
    w.value(u.queue_s * 1e3);
    // As llama-server: only when speculative decoding drafted something.
    if (u.draft_n > 0) {
        w.key("draft_n");
        w.value(u.draft_n);
        w.key("draft_n_accepted");
        w.value(u.draft_n_accepted);
    }
    w.end_object();
}

void write_bytes(json_writer& w, const std::string& b) {
    w.key("bytes");
    w.begin_array();
    for (unsigned char c : b) w.value(int64_t(c));
    w.end_array();
}

std::string token_text(const completion_job& job, int32_t id, const tokenizer* tok) {
    (void)job;
    return tok ? tok->token_bytes(id) : std::to_string(id);
}

// OpenAI chat logprobs: {"content":[{token, logprob, bytes, top_logprobs:[...]}]}.
// One token with its alternatives, as OpenAI chat logprobs and llama-server's
// completion_probabilities both write it: {id, token, logprob, bytes, top_logprobs:[{id, token,
// logprob, bytes}]}.
void write_token_probs(json_writer& w, const completion_job& job, const emitted_token& t, const tokenizer* tok) {
    auto entry = [&](int32_t id, const std::string& bytes, double logprob) {
        w.key("id");
        w.value(int64_t(id));
        w.key("token");
        w.value(bytes);
        w.key("logprob");
        w.value(logprob);
        write_bytes(w, bytes);
    };
    w.begin_object();
    entry(t.id, t.bytes, t.logprob);
    w.key("top_logprobs");
    w.begin_array();
    for (const auto& c : t.top) {
        w.begin_object();
        entry(c.token, token_text(job, c.token, tok), c.logprob);
        w.end_object();
    }
    w.end_array();
    w.end_object();
}

// OpenAI chat logprobs: {"content":[token entries]}.
void write_chat_logprobs(json_writer& w, const completion_job& job, const std::vector<emitted_token>& tokens,
                         const tokenizer* tok) {
    w.key("logprobs");
    if (!job.request().logprobs_enabled) {
        w.null();
        return;
    }
    w.begin_object();
    w.key("content");
    w.begin_array();
    for (const auto& t : tokens) write_token_probs(w, job, t, tok);
    w.end_array();
    w.end_object();
}

// OpenAI legacy completions logprobs: parallel arrays. With echo, the prompt's tokens come first
// (the first with null log-probabilities, as OpenAI's), offsets counted from the echoed text's
// start; the generated tokens' offsets then continue after the echoed text.
void write_text_logprobs(json_writer& w, const completion_job& job, const std::vector<emitted_token>& prompt,
                         const std::vector<emitted_token>& tokens, int64_t& offset, const tokenizer* tok) {
    w.key("logprobs");
    if (!job.request().logprobs_enabled) {
        w.null();
        return;
    }
    const std::vector<const std::vector<emitted_token>*> parts = {&prompt, &tokens};
    w.begin_object();
    w.key("tokens");
    w.begin_array();
    for (const auto* part : parts)
        for (const auto& t : *part) w.value(t.bytes);
    w.end_array();
    w.key("token_logprobs");
    w.begin_array();
    for (const auto* part : parts)
        for (const auto& t : *part) {
            if (t.scored) w.value(t.logprob);
            else w.null();
        }
    w.end_array();
    w.key("top_logprobs");
    w.begin_array();
    for (const auto* part : parts)
        for (const auto& t : *part) {
            if (!t.scored) {
                w.null();
                continue;
            }
            w.begin_object();
            for (const auto& c : t.top) {
                w.key(token_text(job, c.token, tok));
                w.value(c.logprob);
            }
            w.end_object();
        }
    w.end_array();
    w.key("text_offset");
    w.begin_array();
    if (!prompt.empty()) {
        int64_t at = 0;
        for (const auto& t : prompt) {
            w.value(at);
            at += int64_t(t.bytes.size());
        }
        offset = int64_t(job.prompt_text().size());
    }
    for (const auto& t : tokens) {
        w.value(offset);
        offset += int64_t(t.bytes.size());
    }
    w.end_array();
    w.end_object();
}

void write_tool_call_deltas(json_writer& w, const std::vector<tool_call_delta>& calls) {
    w.key("tool_calls");
    w.begin_array();
    for (const auto& c : calls) {
        w.begin_object();
        w.key("index");
        w.value(int64_t(c.index));
        if (!c.id.empty()) {
            w.key("id");
            w.value(c.id);
            w.key("type");
            w.value("function");
        }
        w.key("function");
        w.begin_object();
        if (!c.name.empty()) {
            w.key("name");
            w.value(c.name);
        }
        w.key("arguments");
        w.value(c.arguments);
        w.end_object();
        w.end_object();
    }
    w.end_array();
}

const tokenizer* tok_of(const completion_job& job);

// OpenAI has no "cancelled": a generation ended early from our side reads as a stop.
std::string openai_finish_reason(const job_update& u) {
    return u.finish_reason == "cancelled" ? std::string("stop") : u.finish_reason;
}

// The end of an OpenAI stream, chat and text alike: the finish chunk (empty delta for chat, empty
// text otherwise) with the timings, then, when asked for, the usage chunk with choices [].
void closing_chunks(const response_meta& meta, const char* object, bool chat, const completion_job& job,
                    const job_update& u, std::vector<std::string>& events) {
    {
        std::string out;
        json_writer w(out);
        w.begin_object();
        write_meta(w, meta, object);
        w.key("choices");
        w.begin_array();
        w.begin_object();
        w.key("index");
        w.value(int64_t(0));
        if (chat) {
            w.key("delta");
            w.begin_object();
            w.end_object();
        } else {
            w.key("text");
            w.value("");
        }
        w.key("logprobs");
        w.null();
        w.key("finish_reason");
        w.value(openai_finish_reason(u));
        w.end_object();
        w.end_array();
        write_timings(w, u.usage);
        w.end_object();
        events.push_back(std::move(out));
    }
    if (job.request().include_usage) {
        std::string out;
        json_writer w(out);
        w.begin_object();
        write_meta(w, meta, object);
        w.key("choices");
        w.begin_array();
        w.end_array();
        write_usage(w, u.usage);
        w.end_object();
        events.push_back(std::move(out));
    }
}

}  // namespace

void job_totals::add(const job_update& u) {
    content += u.delta.content;
    reasoning += u.delta.reasoning;
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    prompt_tokens.insert(prompt_tokens.end(), u.prompt_tokens.begin(), u.prompt_tokens.end());
    if (u.done) last = u;
}

// ---- chat ------------------------------------------------------------------------------------

void chat_stream::on_update(const job_update& u, std::vector<std::string>& events) {
    const bool has_text = !u.delta.content.empty() || !u.delta.reasoning.empty() || !u.delta.tool_calls.empty();
    const bool has_tokens = !u.tokens.empty();
    // The role goes out with the first token (never before: benchmark clients time TTFT at the
    // first chunk that has choices).
    if ((has_text || has_tokens) && u.finish_reason != "error") {
        std::string out;
        json_writer w(out);
        w.begin_object();
        write_meta(w, meta_, "chat.completion.chunk");
        w.key("choices");
        w.begin_array();
        w.begin_object();
        w.key("index");
        w.value(int64_t(0));
        w.key("delta");
        w.begin_object();
        if (!role_sent_) {
            w.key("role");
            w.value("assistant");
            role_sent_ = true;
        }
        if (!u.delta.content.empty() || (u.delta.reasoning.empty() && u.delta.tool_calls.empty())) {
            w.key("content");
            w.value(u.delta.content);
        }
        if (!u.delta.reasoning.empty()) {
            w.key("reasoning_content");
            w.value(u.delta.reasoning);
        }
        if (!u.delta.tool_calls.empty()) write_tool_call_deltas(w, u.delta.tool_calls);
        w.end_object();
        write_chat_logprobs(w, job_, u.tokens, tok_of(job_));
        w.key("finish_reason");
        w.null();
        w.end_object();
        w.end_array();
        w.end_object();
        events.push_back(std::move(out));
    }
    if (!u.done || u.finish_reason == "error") return;
    closing_chunks(meta_, "chat.completion.chunk", true, job_, u, events);
}

std::string chat_completion_json(const response_meta& meta, const completion_job& job, const job_totals& t) {
    const auto& parser = job.parser();
    std::string out;
    json_writer w(out);
    w.begin_object();
    write_meta(w, meta, "chat.completion");
    w.key("choices");
    w.begin_array();
    w.begin_object();
    w.key("index");
    w.value(int64_t(0));
    w.key("message");
    w.begin_object();
    w.key("role");
    w.value("assistant");
    w.key("content");
    if (parser.tool_calls().empty() || !parser.content().empty()) w.value(parser.content());
    else w.null();
    if (!parser.reasoning().empty()) {
        w.key("reasoning_content");
        w.value(parser.reasoning());
    }
    if (!parser.tool_calls().empty()) {
        w.key("tool_calls");
        w.begin_array();
        for (const auto& c : parser.tool_calls()) {
            w.begin_object();
            w.key("id");
            w.value(c.id);
            w.key("type");
            w.value("function");
            w.key("function");
            w.begin_object();
            w.key("name");
            w.value(c.name);
            w.key("arguments");
            w.value(c.arguments);
            w.end_object();
            w.end_object();
        }
        w.end_array();
    }
    w.end_object();
    write_chat_logprobs(w, job, t.tokens, tok_of(job));
    w.key("finish_reason");
    w.value(openai_finish_reason(t.last));
    w.end_object();
    w.end_array();
    write_usage(w, t.last.usage);
    write_timings(w, t.last.usage);
    w.end_object();
    return out;
}

// ---- text completions --------------------------------------------------------------------------

void text_stream::on_update(const job_update& u, std::vector<std::string>& events) {
    std::string text;
    if (!echo_sent_) {
        echo_sent_ = true;
        if (job_.request().echo) {
            text = job_.prompt_text();
            text_offset_ = int64_t(text.size());  // the generated tokens come after the echo
        }
    }
    text += u.delta.content;
    if ((!text.empty() || !u.tokens.empty() || !u.prompt_tokens.empty()) && u.finish_reason != "error") {
        std::string out;
        json_writer w(out);
        w.begin_object();
        write_meta(w, meta_, "text_completion");
        w.key("choices");
        w.begin_array();
        w.begin_object();
        w.key("index");
        w.value(int64_t(0));
        w.key("text");
        w.value(text);
        write_text_logprobs(w, job_, u.prompt_tokens, u.tokens, text_offset_, tok_of(job_));
        w.key("finish_reason");
        w.null();
        w.end_object();
        w.end_array();
        w.end_object();
        events.push_back(std::move(out));
    }
    if (!u.done || u.finish_reason == "error") return;
    closing_chunks(meta_, "text_completion", false, job_, u, events);
}

std::string text_completion_json(const response_meta& meta, const completion_job& job, const job_totals& t) {
    std::string out;
    json_writer w(out);
    w.begin_object();
    write_meta(w, meta, "text_completion");
    w.key("choices");
    w.begin_array();
    w.begin_object();
    w.key("index");
    w.value(int64_t(0));
    w.key("text");
    w.value(job.request().echo ? job.prompt_text() + t.content : t.content);
    int64_t offset = job.request().echo ? int64_t(job.prompt_text().size()) : 0;
    write_text_logprobs(w, job, t.prompt_tokens, t.tokens, offset, tok_of(job));
    w.key("finish_reason");
    w.value(openai_finish_reason(t.last));
    w.end_object();
    w.end_array();
    write_usage(w, t.last.usage);
    write_timings(w, t.last.usage);
    w.end_object();
    return out;
}

// ---- llama-server native -----------------------------------------------------------------------

namespace {

void write_native_probs(json_writer& w, const completion_job& job, const std::vector<emitted_token>& tokens) {
    if (job.request().n_probs <= 0) return;
    const tokenizer* tok = tok_of(job);
    w.key("completion_probabilities");
    w.begin_array();
    for (const auto& t : tokens) write_token_probs(w, job, t, tok);
    w.end_array();
}

void write_native_common(json_writer& w, const completion_job& job, const std::string& content,
                         const std::vector<emitted_token>& tokens, bool stop, const job_usage& usage) {
    w.key("index");
    w.value(int64_t(0));
    w.key("content");
    w.value(content);
    w.key("tokens");
    w.begin_array();
    for (const auto& t : tokens) w.value(int64_t(t.id));
    w.end_array();
    w.key("stop");
    w.value(stop);
    w.key("id_slot");
    w.value(int64_t(-1));
    w.key("tokens_predicted");
    w.value(usage.completion_tokens);
    w.key("tokens_evaluated");
    w.value(usage.prompt_tokens);
    write_native_probs(w, job, tokens);
}

void write_native_final(json_writer& w, const completion_job& job, const std::string& content,
                        const std::vector<emitted_token>& tokens, const job_update& last) {
    w.begin_object();
    write_native_common(w, job, content, tokens, true, last.usage);
    w.key("model");
    w.value(job.request().model.empty() ? job.model().name : job.request().model);
    w.key("stop_type");
    w.value(last.stop_type);
    w.key("stopping_word");
    w.value(last.stopping_word);
    w.key("tokens_cached");
    w.value(last.usage.cached_tokens);
    w.key("truncated");
    w.value(false);
    write_timings(w, last.usage);
    w.end_object();
}

}  // namespace

void native_stream_update(const completion_job& job, const job_update& u, std::vector<std::string>& events) {
    if (u.finish_reason == "error") return;
    if (!u.delta.content.empty() || !u.tokens.empty()) {
        std::string out;
        json_writer w(out);
        w.begin_object();
        write_native_common(w, job, u.delta.content, u.tokens, false, u.usage);
        w.end_object();
        events.push_back(std::move(out));
    }
    if (u.done) {
        std::string out;
        json_writer w(out);
        write_native_final(w, job, "", {}, u);
        events.push_back(std::move(out));
    }
}

std::string native_completion_json(const completion_job& job, const job_totals& t) {
    std::string out;
    json_writer w(out);
    write_native_final(w, job, t.content, t.tokens, t.last);
    return out;
}

namespace {
const tokenizer* tok_of(const completion_job& job) { return job.model().tok; }
}  // namespace

}  // namespace moestream::server
