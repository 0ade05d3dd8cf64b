// The bounded store behind previous_response_id: the last N responses, oldest dropped first.
#include "server/responses_store.h"

#include <boost/test/unit_test.hpp>
#include <string>
#include <thread>
#include <vector>

using namespace moestream::server;

namespace {

stored_response response(std::string id, std::string text) {
    stored_response r;
    r.id = std::move(id);
    conversation_item m;
    m.role = "user";
    m.text = std::move(text);
    r.conversation.push_back(std::move(m));
    return r;
}

// "prefix" + n (appended: GCC 12 warns falsely about `"literal" + std::to_string(n)` at -O3).
std::string named(std::string_view prefix, int n) {
    std::string s(prefix);
    s += std::to_string(n);
    return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(responses_store)

BOOST_AUTO_TEST_CASE(keeps_the_last_n) {
    response_store store(3);
    for (int i = 0; i < 5; ++i) store.put(response(named("r", i), named("t", i)));
    BOOST_TEST(store.size() == 3u);
    BOOST_TEST(!store.find("r0"));
    BOOST_TEST(!store.find("r1"));
    for (int i = 2; i < 5; ++i) {
        auto r = store.find(named("r", i));
        BOOST_TEST_REQUIRE(r);
        BOOST_TEST(r->conversation.at(0).text == named("t", i));
    }
    BOOST_TEST(!store.find("nope"));
}

BOOST_AUTO_TEST_CASE(a_found_response_outlives_its_eviction) {
    response_store store(1);
    store.put(response("a", "first"));
    auto held = store.find("a");
    store.put(response("b", "second"));
    BOOST_TEST(!store.find("a"));
    BOOST_TEST_REQUIRE(held);
    BOOST_TEST(held->conversation.at(0).text == "first");
}

BOOST_AUTO_TEST_CASE(replacing_an_id_keeps_one_entry) {
    response_store store(2);
    store.put(response("a", "old"));
    store.put(response("a", "new"));
    BOOST_TEST(store.size() == 1u);
    BOOST_TEST(store.find("a")->conversation.at(0).text == "new");
    store.put(response("b", "b"));
    store.put(response("c", "c"));
    BOOST_TEST(!store.find("a"));
    BOOST_TEST(store.size() == 2u);
}

BOOST_AUTO_TEST_CASE(capacity_zero_keeps_nothing) {
    response_store store(0);
    store.put(response("a", "x"));
    BOOST_TEST(store.size() == 0u);
    BOOST_TEST(!store.find("a"));
}

BOOST_AUTO_TEST_CASE(concurrent_use_stays_bounded) {
    response_store store(16);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&store, t] {
            for (int i = 0; i < 500; ++i) {
                store.put(response(named(named("t", t) + "-", i), "x"));
                (void)store.find(named("t0-", i / 2));
            }
        });
    for (auto& th : threads) th.join();
    BOOST_TEST(store.size() == 16u);
}

BOOST_AUTO_TEST_SUITE_END()
