// Tests for model/thread_pool: coverage of every index exactly once, the documented partition,
// repeated and nested calls, and clean shutdown at every size.
#include "model/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "tests/common/test_support.h"

using namespace moestream;

namespace {

// Boost.Test assertions are not thread-safe, so tasks (which may run on workers) only record
// what they saw; the checks run on the test thread afterwards.

// Runs parallel_for(n, grain) and checks that every index of [0, n) was visited exactly once and
// that the chunks are exactly the documented ones.
void check_cover(thread_pool& pool, int64_t n, int64_t grain) {
    std::vector<std::atomic<int>> hits(size_t(std::max<int64_t>(n, 0)));
    std::mutex m;
    std::set<std::pair<int64_t, int64_t>> chunks;
    std::atomic<int> bad_ranges{0};
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        if (!(0 <= b && b < e && e <= n)) {
            ++bad_ranges;
            return;
        }
        for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
        std::lock_guard lock(m);
        chunks.emplace(b, e);
    });
    BOOST_REQUIRE_EQUAL(bad_ranges.load(), 0);
    for (int64_t i = 0; i < n; ++i) BOOST_REQUIRE_MESSAGE(hits[size_t(i)].load() == 1, "n=" << n << " i=" << i);
    const int64_t c = pool.chunk_count(n, grain);
    BOOST_REQUIRE_EQUAL(int64_t(chunks.size()), c);
    int64_t k = 0;
    for (const auto& [b, e] : chunks) {
        BOOST_REQUIRE_EQUAL(b, k * n / c);
        BOOST_REQUIRE_EQUAL(e, (k + 1) * n / c);
        BOOST_REQUIRE(e - b >= std::min(grain, n));
        ++k;
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(thread_pool_tests)

BOOST_AUTO_TEST_CASE(covers_every_index_once) {
    for (int threads = 1; threads <= 4; ++threads) {
        thread_pool pool(threads);
        BOOST_TEST(pool.size() == threads);
        for (int64_t n : {0, 1, 2, 3, 5, 17, 1000, 100003})
            for (int64_t grain : {1, 2, 7, 1000}) check_cover(pool, n, grain);
    }
}

BOOST_AUTO_TEST_CASE(chunk_count_rule) {
    thread_pool pool(4);
    BOOST_TEST(pool.chunk_count(0) == 0);
    BOOST_TEST(pool.chunk_count(-3) == 0);
    BOOST_TEST(pool.chunk_count(1) == 1);
    BOOST_TEST(pool.chunk_count(3) == 3);
    BOOST_TEST(pool.chunk_count(100) == 4);
    BOOST_TEST(pool.chunk_count(100, 30) == 3);
    BOOST_TEST(pool.chunk_count(100, 200) == 1);
    BOOST_TEST(pool.chunk_count(100, 0) == 4);
}

// Thousands of back-to-back calls (the decode pattern), including tiny ones: no lost wake-ups,
// no call returning before its chunks are done.
BOOST_AUTO_TEST_CASE(repeated_calls) {
    for (int threads = 1; threads <= 4; ++threads) {
        thread_pool pool(threads);
        std::vector<int64_t> v(64, 0);
        for (int it = 0; it < 3000; ++it) {
            const int64_t n = 1 + it % 64;
            pool.parallel_for(n, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) ++v[size_t(i)];
            });
        }
        int64_t total = 0;
        for (int64_t x : v) total += x;
        BOOST_TEST(total == 3000 / 64 * (64 * 65 / 2) + (3000 % 64) * (3000 % 64 + 1) / 2);
    }
}

// Calls separated by pauses long enough for the workers to fall asleep.
BOOST_AUTO_TEST_CASE(wakes_sleeping_workers) {
    thread_pool pool(3);
    for (int it = 0; it < 5; ++it) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        check_cover(pool, 999, 1);
    }
}

BOOST_AUTO_TEST_CASE(nested_calls_run_inline) {
    for (int threads = 1; threads <= 4; ++threads) {
        thread_pool pool(threads);
        std::vector<std::atomic<int>> hits(40 * 50);
        std::atomic<int> bad_partitions{0};
        const int64_t inner_chunks = pool.chunk_count(50);
        pool.parallel_for(40, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                // Inline, but with the same chunks, in order, as a top-level call.
                std::vector<std::pair<int64_t, int64_t>> seen;
                pool.parallel_for(50, [&](int64_t b2, int64_t e2) {
                    seen.emplace_back(b2, e2);
                    for (int64_t j = b2; j < e2; ++j) hits[size_t(i * 50 + j)].fetch_add(1);
                });
                bool ok = int64_t(seen.size()) == inner_chunks;
                for (size_t k = 0; ok && k < seen.size(); ++k)
                    ok = seen[k].first == int64_t(k) * 50 / inner_chunks;
                if (!ok) ++bad_partitions;
            }
        });
        BOOST_REQUIRE_EQUAL(bad_partitions.load(), 0);
        for (auto& h : hits) BOOST_REQUIRE_EQUAL(h.load(), 1);
    }
}

// Two threads sharing one pool: one of them runs inline, both get complete results.
BOOST_AUTO_TEST_CASE(concurrent_callers) {
    thread_pool pool(2);
    auto hammer = [&pool](std::vector<int>& v) {
        for (int it = 0; it < 500; ++it)
            pool.parallel_for(int64_t(v.size()), [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) ++v[size_t(i)];
            });
    };
    std::vector<int> a(300, 0), b(200, 0);
    std::thread other([&] { hammer(b); });
    hammer(a);
    other.join();
    for (int x : a) BOOST_REQUIRE_EQUAL(x, 500);
    for (int x : b) BOOST_REQUIRE_EQUAL(x, 500);
}

// The spec'd std::function form works too (the template takes any callable).
BOOST_AUTO_TEST_CASE(accepts_std_function_and_destroys_cleanly) {
    for (int round = 0; round < 20; ++round) {
        auto pool = std::make_unique<thread_pool>(1 + round % 4);
        std::atomic<int64_t> sum{0};
        const std::function<void(int64_t, int64_t)> fn = [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) sum += i;
        };
        pool->parallel_for(1000, fn);
        BOOST_TEST(sum.load() == 999 * 1000 / 2);
        pool.reset();  // joins workers that may be spinning or asleep
    }
}

// Piece mode: every piece runs exactly once, for chunk layouts with empty chunks, single pieces
// and long chunks, interleaved with whole-chunk calls on the same pool (the two modes share the
// slots), and with one chunk's pieces slow so that other participants take them over.
BOOST_AUTO_TEST_CASE(pieces_run_exactly_once_and_are_taken_over) {
    for (int threads = 1; threads <= 5; ++threads) {
        thread_pool pool(threads);
        for (int it = 0; it < 400; ++it) {
            const int64_t chunks = 1 + it % threads;
            std::vector<int64_t> starts(static_cast<size_t>(chunks + 1), 0);
            for (int64_t k = 0; k < chunks; ++k) starts[size_t(k + 1)] = starts[size_t(k)] + (it * 7 + k * 3) % 9;  // 0..8 pieces
            const int64_t total = starts.back();
            std::vector<std::atomic<int>> hits(static_cast<size_t>(total));
            std::atomic<int> bad{0};
            const bool slow = it % 50 == 0;
            pool.parallel_for_pieces(chunks, starts.data(), [&](int64_t piece) {
                if (piece < 0 || piece >= total) {
                    ++bad;
                    return;
                }
                if (slow && piece < starts[1]) std::this_thread::sleep_for(std::chrono::microseconds(300));
                hits[size_t(piece)].fetch_add(1);
            });
            BOOST_REQUIRE_EQUAL(bad.load(), 0);
            for (int64_t p = 0; p < total; ++p) BOOST_REQUIRE_MESSAGE(hits[size_t(p)].load() == 1, "it=" << it << " piece " << p);
            if (it % 3 == 0) check_cover(pool, 1 + it % 97, 1);
        }
    }
}

// A slow first chunk is finished by others: its owner does not run all of its pieces.
BOOST_AUTO_TEST_CASE(pieces_of_a_slow_chunk_go_to_idle_threads) {
    thread_pool pool(4);
    const std::vector<int64_t> starts{0, 8, 9, 10, 11};
    std::vector<std::thread::id> ran_by(11);
    pool.parallel_for_pieces(4, starts.data(), [&](int64_t piece) {
        if (piece < 8) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ran_by[size_t(piece)] = std::this_thread::get_id();
    });
    std::set<std::thread::id> first_chunk(ran_by.begin(), ran_by.begin() + 8);
    BOOST_TEST(first_chunk.size() > 1);
}

BOOST_AUTO_TEST_SUITE_END()
