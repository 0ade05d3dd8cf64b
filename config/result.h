// Expected errors as values (tier (b) of docs/errors.md). C++20 has no std::expected, so this is
// the small subset we need: a value or an error message, checked access, and MS_TRY to propagate.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "config/assert.h"

namespace moestream {

struct error {
    std::string message;
};

inline error make_error(std::string message) { return error{std::move(message)}; }

template <class T>
class [[nodiscard]] result {
public:
    result(T value) : data_(std::in_place_index<0>, std::move(value)) {}
    result(error err) : data_(std::in_place_index<1>, std::move(err)) {}

    bool ok() const { return data_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & {
        MS_ASSERT_MSG(ok(), "result::value() on an error");
        return std::get<0>(data_);
    }
    const T& value() const& {
        MS_ASSERT_MSG(ok(), "result::value() on an error");
        return std::get<0>(data_);
    }
    T&& value() && {
        MS_ASSERT_MSG(ok(), "result::value() on an error");
        return std::get<0>(std::move(data_));
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const error& err() const {
        MS_ASSERT_MSG(!ok(), "result::err() on a value");
        return std::get<1>(data_);
    }
    const std::string& message() const { return err().message; }

private:
    std::variant<T, error> data_;
};

// result<void>: success or an error.
template <>
class [[nodiscard]] result<void> {
public:
    result() = default;
    result(error err) : err_(std::move(err)), ok_(false) {}
    bool ok() const { return ok_; }
    explicit operator bool() const { return ok_; }
    const error& err() const {
        MS_ASSERT_MSG(!ok_, "result::err() on success");
        return err_;
    }
    const std::string& message() const { return err().message; }

private:
    error err_;
    bool ok_ = true;
};

using status = result<void>;

}  // namespace moestream

// Propagates an error from an expression of type result<U> out of a function returning result<T>.
#define MS_TRY(expr)                                        \
    do {                                                    \
        auto&& ms_try_r_ = (expr);                          \
        if (!ms_try_r_.ok()) return ms_try_r_.err();        \
    } while (0)
