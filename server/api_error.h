// The server's error value: every failed request becomes one OpenAI-shaped error body,
//   {"error":{"code":<HTTP status>,"message":"...","type":"...","param":"..."|null, <extra>...}}
// (llama-server's and vLLM's shape: `code` is the integer HTTP status, which the OpenAI SDKs
// tolerate since they map errors by status). `api_result<T>` carries a value or such an error, in
// the style of config/result.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "config/assert.h"
#include "server/json_writer.h"

namespace moestream::server {

struct api_error {
    int status = 400;                            // HTTP status
    std::string type = "invalid_request_error";  // invalid_request_error, authentication_error,
                                                 // not_found_error, exceed_context_size_error,
                                                 // unavailable_error, server_error,
                                                 // not_supported_error, rate_limit_error
    std::string message;
    std::string param;  // offending field path ("messages[2].content", "temperature"), empty if none
    // Extra numeric fields some errors carry (context overflow: n_prompt_tokens, n_ctx).
    std::vector<std::pair<std::string, int64_t>> extra;
};

inline api_error make_api_error(int status, std::string type, std::string message, std::string param = {}) {
    api_error e;
    e.status = status;
    e.type = std::move(type);
    e.message = std::move(message);
    e.param = std::move(param);
    return e;
}

// 400 invalid_request_error naming the offending field (empty param: the body as a whole).
inline api_error bad_request(std::string param, std::string message) {
    return make_api_error(400, "invalid_request_error", std::move(message), std::move(param));
}

// 400 exceed_context_size_error with llama-server's numeric fields. The message holds both
// llama-server's sentence and the OpenAI/vLLM phrase "maximum context length", since agent
// frameworks detect overflow by substring.
inline api_error context_exceeded(int64_t n_prompt_tokens, int64_t n_ctx) {
    api_error e = make_api_error(
        400, "exceed_context_size_error",
        "request (" + std::to_string(n_prompt_tokens) + " tokens) exceeds the available context size (" +
            std::to_string(n_ctx) + " tokens): this model's maximum context length is " + std::to_string(n_ctx) +
            " tokens");
    e.extra = {{"n_prompt_tokens", n_prompt_tokens}, {"n_ctx", n_ctx}};
    return e;
}

// Writes the error object (the whole body) with `w`.
inline void write_error(json_writer& w, const api_error& e) {
    w.begin_object().key("error").begin_object();
    w.member("code", e.status).member("message", e.message).member("type", e.type);
    w.key("param");
    if (e.param.empty()) w.null();
    else w.value(e.param);
    for (const auto& [k, v] : e.extra) w.member(k, v);
    w.end_object().end_object();
}

// The error body as JSON text.
inline std::string to_json(const api_error& e) {
    std::string out;
    json_writer w(out);
    write_error(w, e);
    return out;
}

// A value or an api_error. A small class rather than a bare std::variant so that call sites read
// like config/result.h: `if (!r.ok()) return r.error(); use(*r);`.
template <class T>
class [[nodiscard]] api_result {
public:
    api_result(T value) : data_(std::in_place_index<0>, std::move(value)) {}
    api_result(api_error err) : data_(std::in_place_index<1>, std::move(err)) {}

    bool ok() const { return data_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & {
        MS_ASSERT_MSG(ok(), "api_result::value() on an error");
        return std::get<0>(data_);
    }
    const T& value() const& {
        MS_ASSERT_MSG(ok(), "api_result::value() on an error");
        return std::get<0>(data_);
    }
    T&& value() && {
        MS_ASSERT_MSG(ok(), "api_result::value() on an error");
        return std::get<0>(std::move(data_));
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const api_error& error() const {
        MS_ASSERT_MSG(!ok(), "api_result::error() on a value");
        return std::get<1>(data_);
    }

private:
    std::variant<T, api_error> data_;
};

}  // namespace moestream::server
