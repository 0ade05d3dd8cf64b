// A fixed set of worker threads for data-parallel loops (the CPU matmuls run one parallel_for per
// weight matrix, thousands per token, so a call must cost about a microsecond, not a thread
// start or an allocation).
//
// parallel_for(n, grain, fn) splits [0, n) into c = chunk_count(n, grain) contiguous chunks,
// chunk k being [k*n/c, (k+1)*n/c), and calls fn(begin, end) once per chunk. The boundaries
// depend only on n, grain and size(), never on timing or nesting, so a caller may keep one
// partial result per chunk and combine them in chunk order reproducibly. Which thread runs which
// chunk is not fixed (idle threads claim chunks, so a worker that is slow to wake or descheduled
// does not hold the call up). The call returns when every chunk is done, with its writes visible.
//
// A call made while the pool is already running one (from inside a task, or from another thread)
// runs its chunks inline on the calling thread, in order: nesting never deadlocks.
// Workers spin briefly after each call (decode issues calls back to back), then sleep on a futex.
//
// Between calls the workers can also warm caches: prefetch(ranges) hands them memory the next
// calls will read (decode's next layer of weights), so the memory system keeps streaming while
// the dispatching thread does serial work, and the calls then find their data in cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace moestream {

// Memory a later call will read.
struct memory_range {
    const void* data = nullptr;
    size_t bytes = 0;
};

class thread_pool {
public:
    // threads >= 1: threads - 1 workers are started; the calling thread is the other one.
    explicit thread_pool(int threads);
    ~thread_pool();
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int size() const { return threads_; }

    // Chunks a call with these arguments is split into: 0 for n <= 0, else n / grain clamped to
    // [1, size()] (so no chunk is below grain items unless n itself is).
    int64_t chunk_count(int64_t n, int64_t grain = 1) const;

    // fn(int64_t begin, int64_t end), called once per chunk; fn must not throw.
    template <class F>
    void parallel_for(int64_t n, int64_t grain, F&& fn) {
        using fn_t = std::remove_reference_t<F>;
        run(n, grain, &call<fn_t>, static_cast<const void*>(std::addressof(fn)));
    }
    template <class F>
    void parallel_for(int64_t n, F&& fn) {
        parallel_for(n, 1, std::forward<F>(fn));
    }

    // Idle workers issue cache prefetches over these ranges, kPrefetchPiece bytes at a time,
    // checking for a call between pieces (a call always goes first). A new set replaces what is
    // left of the previous one; sleeping workers are woken for it. Only a hint: results never
    // change, and prefetch instructions cannot fault, so memory freed meanwhile is harmless.
    // At most kMaxPrefetchRanges ranges (the rest is ignored). Call from the dispatching thread
    // (the one that calls parallel_for), not from inside a task. A pool of one thread does nothing.
    static constexpr size_t kPrefetchPiece = 4096;
    static constexpr size_t kMaxPrefetchRanges = 64;
    void prefetch(std::span<const memory_range> ranges);
    // Pieces prefetched so far (tests and benchmarks).
    uint64_t prefetched_pieces() const;

private:
    using task_fn = void (*)(const void* ctx, int64_t begin, int64_t end);
    template <class Fn>
    static void call(const void* ctx, int64_t begin, int64_t end) {
        (*static_cast<Fn*>(const_cast<void*>(ctx)))(begin, end);
    }
    void run(int64_t n, int64_t grain, task_fn fn, const void* ctx);

    struct state;
    int threads_;
    std::unique_ptr<state> s_;
};

}  // namespace moestream
