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

}  // namespace

read_bandwidth_probe::read_bandwidth_probe(thread_pool& pool, size_t bytes)
    : pool_(pool), lines_(std::max<size_t>(bytes / kLine, 1)) {
    words_ = static_cast<uint64_t*>(::operator new[](lines_ * kLine, std::align_val_t(kLine)));
    uint64_t* const p = words_;
    // Touched by the threads that will read it (first touch places pages near them on NUMA).
    pool_.parallel_for(int64_t(lines_), [p](int64_t b, int64_t e) {
        for (size_t i = size_t(b) * kWordsPerLine; i < size_t(e) * kWordsPerLine; ++i) p[i] = i;
    });
}

read_bandwidth_probe::~read_bandwidth_probe() { ::operator delete[](words_, std::align_val_t(kLine)); }

double read_bandwidth_probe::measure(int repeats) {
    MS_ASSERT(repeats >= 1);
    const bool avx2 = __builtin_cpu_supports("avx2");
    const uint64_t* const p = words_;
    std::atomic<uint64_t> sink{0};
    double best = 1e30;
    for (int rep = 0; rep < repeats; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        pool_.parallel_for(int64_t(lines_), [&](int64_t b, int64_t e) {
            const uint64_t* q = p + size_t(b) * kWordsPerLine;
            const size_t n = size_t(e - b) * kWordsPerLine;
            sink.fetch_add(avx2 ? sum_avx2(q, n) : sum_portable(q, n), std::memory_order_relaxed);
        });
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // The sum of 0..words-1, repeats times: checking it keeps the reads observable.
    const uint64_t w = lines_ * kWordsPerLine;
    MS_ASSERT(sink.load() == uint64_t(repeats) * (w % 2 == 0 ? w / 2 * (w - 1) : (w - 1) / 2 * w));
    return double(lines_ * kLine) / std::max(best, 1e-9);
}

double measure_read_bandwidth(thread_pool& pool, size_t bytes, int repeats) {
    return read_bandwidth_probe(pool, bytes).measure(repeats);
}

}  // namespace moestream
