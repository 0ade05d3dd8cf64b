// Receiving a generation's events in the engine tests: the engine runs on its own threads, so a
// test polls the request's channel until it has what it waits for, with a deadline.
#pragma once

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "scheduler/engine.h"

namespace moestream::test {

// Passes every event of g to on_event, in order, until on_event returns true (it is done: the
// final event came, or all it wanted). Fails the test when that takes longer than `limit`.
template <class OnEvent>
void receive_events(generation& g, std::chrono::seconds limit, OnEvent&& on_event) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    const std::string late = "no final event within " + std::to_string(limit.count()) + " s";
    for (bool done = false; !done;) {
        BOOST_TEST_REQUIRE((std::chrono::steady_clock::now() < deadline), late);
        const bool got = g.events().try_receive([&](boost::system::error_code, token_event e) { done = on_event(e); });
        if (!got) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

}  // namespace moestream::test
