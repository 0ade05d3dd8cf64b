// The model's coroutines (model/coro.h) driven from Asio: a coro::executor over an Asio
// executor, and an Asio awaitable that runs a coro::task there and completes on the awaiting
// coroutine's own executor (the engine's strand). model/ knows nothing of Asio; this is the one
// place the two meet.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <utility>

#include "model/coro.h"

namespace moestream {

// Resumes posted coroutines on an Asio executor (the engine's compute pool).
class asio_coro_executor final : public coro::executor {
  public:
    explicit asio_coro_executor(boost::asio::any_io_executor ex) : ex_(std::move(ex)) {}
    void post(std::coroutine_handle<> h) override {
        boost::asio::post(ex_, [h] { h.resume(); });
    }

  private:
    boost::asio::any_io_executor ex_;
};

// co_await run_task(t, ex): t's first step and every continuation after a wait run on `ex`;
// the awaiting coroutine is suspended meanwhile (no thread waits for t) and continues on its
// own executor with t's value.
template <class T>
boost::asio::awaitable<T> run_task(coro::task<T> t, coro::executor& ex) {
    co_return co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void(T)>(
        [&t, &ex](auto handler) {
            using handler_type = decltype(handler);
            auto h = std::make_shared<handler_type>(std::move(handler));
            coro::start(std::move(t), ex, [h](T value) {
                auto to = boost::asio::get_associated_executor(*h);
                boost::asio::post(to, [h, value = std::move(value)]() mutable { std::move (*h)(std::move(value)); });
            });
        },
        boost::asio::use_awaitable);
}

}  // namespace moestream
