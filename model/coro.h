// The coroutine vocabulary of the forward (issue 15): a lazy task<T> awaited with symmetric
// transfer, the executor a suspended forward continues on, and two ways to run a task from
// outside a coroutine.
//
// Why our own and not Boost.Asio's awaitable: model/ knows nothing of Asio or the scheduler, and
// the forward needs only this much. A forward suspends only where it awaits something that is
// not there yet (its experts, dsv41::experts_ready); whoever completes that wait posts the
// forward's handle to the executor the forward was started with, so no thread ever sleeps inside
// the forward. The engine's executor is an Asio thread pool (scheduler/engine.cpp); tools that
// want a plain call use run_sync(), a local executor drained by the calling thread.
//
// Tasks are lazy (nothing runs until awaited or started), single-owner, awaited at most once.
// Exceptions are not part of the model's error handling (errors are values): one escaping a task
// terminates.
#pragma once

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

#include "config/assert.h"

namespace moestream::coro {

// Where a suspended coroutine continues. post() may be called from any thread; the handle is
// resumed later on one of the executor's threads, never inside post().
class executor {
  public:
    virtual ~executor() = default;
    virtual void post(std::coroutine_handle<> h) = 0;
};

// The hand-over between a coroutine suspending on a wait and the wake that ends the wait, which
// may come from another thread before, during or after the suspension: whichever of the two comes
// second continues the coroutine, the wake by posting it to the executor, the suspension by not
// suspending (the awaitables of the expert and engram sources and of the backend's downloads).
class wake_race {
  public:
    // The wake (any thread): posts `h` to `ex` when the coroutine has suspended already.
    void wake(executor& ex, std::coroutine_handle<> h) {
        if (second_.exchange(true, std::memory_order_acq_rel)) ex.post(h);
    }
    // await_suspend's answer once the call that may wake has returned: true to stay suspended.
    bool stay_suspended() { return !second_.exchange(true, std::memory_order_acq_rel); }

  private:
    std::atomic<bool> second_{false};
};

template <class T>
class task;

namespace detail {

struct promise_base {
    std::coroutine_handle<> continuation = std::noop_coroutine();
    std::suspend_always initial_suspend() noexcept { return {}; }
    // Symmetric transfer to whoever awaited us: no stack growth however many tasks nest.
    struct final_awaiter {
        bool await_ready() noexcept { return false; }
        template <class P>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
            return h.promise().continuation;
        }
        void await_resume() noexcept {}
    };
    final_awaiter final_suspend() noexcept { return {}; }
    void unhandled_exception() noexcept { std::terminate(); }
};

template <class T>
struct promise : promise_base {
    std::optional<T> value;
    task<T> get_return_object() noexcept;
    template <class U>
    void return_value(U&& v) {
        value.emplace(std::forward<U>(v));
    }
    T take() {
        MS_ASSERT_MSG(value.has_value(), "a task's value taken before it finished");
        return std::move(*value);
    }
};

template <>
struct promise<void> : promise_base {
    task<void> get_return_object() noexcept;
    void return_void() noexcept {}
    void take() noexcept {}
};

}  // namespace detail

template <class T = void>
class [[nodiscard]] task {
  public:
    using promise_type = detail::promise<T>;
    using value_type = T;
    using handle = std::coroutine_handle<promise_type>;

    task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
    task& operator=(task&& o) noexcept {
        if (this != &o) {
            destroy();
            h_ = std::exchange(o.h_, {});
        }
        return *this;
    }
    task(const task&) = delete;
    task& operator=(const task&) = delete;
    ~task() { destroy(); }

    // co_await t: starts t (symmetric transfer) and continues here with its value when it ends.
    auto operator co_await() && noexcept {
        struct awaiter {
            handle h;
            bool await_ready() noexcept { return false; }
            std::coroutine_handle<> await_suspend(std::coroutine_handle<> waiting) noexcept {
                h.promise().continuation = waiting;
                return h;
            }
            T await_resume() { return h.promise().take(); }
        };
        MS_ASSERT_MSG(h_ && !h_.done(), "a task awaited twice");
        return awaiter{h_};
    }

  private:
    friend struct detail::promise<T>;
    explicit task(handle h) noexcept : h_(h) {}
    void destroy() {
        if (h_) h_.destroy();
        h_ = {};
    }
    handle h_;
};

namespace detail {
template <class T>
task<T> promise<T>::get_return_object() noexcept {
    return task<T>(task<T>::handle::from_promise(*this));
}
inline task<void> promise<void>::get_return_object() noexcept {
    return task<void>(task<void>::handle::from_promise(*this));
}

// The frame that owns a started task: awaits it, hands its value to `done`, destroys itself.
struct detached {
    struct promise_type {
        detached get_return_object() noexcept { return {std::coroutine_handle<promise_type>::from_promise(*this)}; }
        std::suspend_always initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
    std::coroutine_handle<promise_type> h;
};

template <class T, class Done>
detached run_detached(task<T> t, Done done) {
    if constexpr (std::is_void_v<T>) {
        co_await std::move(t);
        done();
    } else {
        done(co_await std::move(t));
    }
}
}  // namespace detail

// Starts `t` on `ex` (its first step runs there, not inside start()) and calls done(value) on
// the thread that finishes it. The task's frame lives until then.
template <class T, class Done>
void start(task<T> t, executor& ex, Done done) {
    auto d = detail::run_detached(std::move(t), std::move(done));
    ex.post(d.h);
}

// An executor whose queue one thread drains: run_sync() below.
class local_executor final : public executor {
  public:
    void post(std::coroutine_handle<> h) override {
        {
            std::lock_guard lock(mu_);
            queue_.push_back(h);
        }
        wake_.notify_one();
    }
    // Resumes posted handles on the calling thread until `finished` is true (checked after each).
    void run_until(const bool& finished) {
        std::unique_lock lock(mu_);
        while (!finished) {
            wake_.wait(lock, [&] { return !queue_.empty(); });
            const auto h = queue_.front();
            queue_.pop_front();
            lock.unlock();
            h.resume();
            lock.lock();
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable wake_;
    std::deque<std::coroutine_handle<>> queue_;
};

// Runs the task that make(executor&) returns to completion on the calling thread, which is
// the task's executor meanwhile (it computes; between resumptions it idles in its own queue,
// outside the task). For callers that want a plain function call: tools, tests.
template <class Make>
auto run_sync(Make make) {
    local_executor ex;
    auto t = make(static_cast<executor&>(ex));
    using value_type = typename decltype(t)::value_type;
    bool finished = false;
    if constexpr (std::is_void_v<value_type>) {
        start(std::move(t), ex, [&] { finished = true; });
        ex.run_until(finished);
    } else {
        std::optional<value_type> out;
        start(std::move(t), ex, [&](value_type v) {
            out.emplace(std::move(v));
            finished = true;
        });
        ex.run_until(finished);
        return std::move(*out);
    }
}

}  // namespace moestream::coro
