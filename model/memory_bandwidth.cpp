// The read is an integer sum (associative, so the compiler may vectorise the portable loop, and
// the result is used, so it cannot drop the loads), with an AVX2 version so the loop is limited by
// memory rather than by instruction throughput on older cores.
#include "model/memory_bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>

#include "config/assert.h"

namespace moestream {
namespace {

constexpr size_t kLine = 64;
constexpr size_t kWordsPerLine = kLine / sizeof(uint64_t);

// One 64-byte line per iteration; integer adds have one-cycle latency, so two accumulators keep
// up with any memory system.
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (size_t i = 0; i < n; i += kWordsPerLine) {  // n is whole lines
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(a0, a1));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_portable(const uint64_t* p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; ++i) s += p[i];
    return s;
}

struct line_deleter {
    void operator()(uint64_t* p) const { ::operator delete[](p, std::align_val_t(kLine)); }
};

}  // namespace

double measure_read_bandwidth(thread_pool& pool, size_t bytes, int repeats) {
    MS_ASSERT(repeats >= 1);
    const size_t lines = std::max<size_t>(bytes / kLine, 1);
    const size_t words = lines * kWordsPerLine;
    std::unique_ptr<uint64_t[], line_deleter> buf(
        static_cast<uint64_t*>(::operator new[](words * sizeof(uint64_t), std::align_val_t(kLine))));
    uint64_t* const p = buf.get();
    // Touched by the threads that will read it (first touch places pages near them on NUMA).
    pool.parallel_for(int64_t(lines), [p](int64_t b, int64_t e) {
        for (size_t i = size_t(b) * kWordsPerLine; i < size_t(e) * kWordsPerLine; ++i) p[i] = i;
    });

    const bool avx2 = __builtin_cpu_supports("avx2");
    std::atomic<uint64_t> sink{0};
    double best = 1e30;
    for (int rep = 0; rep < repeats; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(int64_t(lines), [&](int64_t b, int64_t e) {
            const uint64_t* q = p + size_t(b) * kWordsPerLine;
            const size_t n = size_t(e - b) * kWordsPerLine;
            sink.fetch_add(avx2 ? sum_avx2(q, n) : sum_portable(q, n), std::memory_order_relaxed);
        });
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // The sum of 0..words-1, repeats times: checking it keeps the reads observable.
    const uint64_t w = words;
    MS_ASSERT(sink.load() == uint64_t(repeats) * (w % 2 == 0 ? w / 2 * (w - 1) : (w - 1) / 2 * w));
    return double(lines * kLine) / std::max(best, 1e-9);
}

}  // namespace moestream
