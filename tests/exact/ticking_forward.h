// A forward (or any coroutine of the model: a DSpark draft) run on a one-thread io_context that
// also ticks a timer every 5 ms until it ends: ticks taken while it awaited an expert show that
// no thread blocked (the streaming and device-tier tests of issue 15).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "config/result.h"
#include "fixture_model.h"
#include "model/arch/deepseek41.h"
#include "scheduler/asio_task.h"

namespace moestream::test {

// Microseconds since it was made (the tests' shared time line for ticks and held reads).
struct since_start {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    int64_t operator()() const {
        return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
    }
};

// The fixture's resident logits for a whole prompt: what a run with reads held back must give.
inline std::vector<float> resident_logits(fixture_model& m, std::span<const int32_t> tokens) {
    std::vector<float> out;
    auto seq = m.sequence();
    dsv41::forward_item item{seq.get(), tokens, true};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, out).ok());
    return out;
}

struct ticking_run {
    std::optional<status> outcome;  // empty: the forward did not end within two minutes
    std::vector<int64_t> ticks;     // when each tick ran (since_start_us)
    int64_t ended_us = -1;          // when the forward ended
};

// `make(ex)` returns the task, which runs on (and continues on) ex.
inline ticking_run run_ticking(const std::function<coro::task<status>(coro::executor&)>& make,
                               const std::function<int64_t()>& since_start_us) {
    namespace asio = boost::asio;
    ticking_run r;
    asio::io_context io(1);
    asio_coro_executor ex(io.get_executor());
    coro::start(make(ex), ex, [&](status st) {
        r.outcome = std::move(st);
        r.ended_us = since_start_us();
    });
    asio::steady_timer ticker(io);
    std::function<void()> tick = [&] {
        ticker.expires_after(std::chrono::milliseconds(5));
        ticker.async_wait([&](const boost::system::error_code&) {
            if (r.outcome) return;
            r.ticks.push_back(since_start_us());
            tick();
        });
    };
    tick();
    io.run_for(std::chrono::minutes(2));
    return r;
}

inline ticking_run run_forward_ticking(dsv41::model& mdl, dsv41::forward_item& item, std::vector<float>& logits,
                                       const std::function<int64_t()>& since_start_us) {
    return run_ticking([&](coro::executor& ex) { return mdl.forward_async({&item, 1}, logits, ex); }, since_start_us);
}

}  // namespace moestream::test
