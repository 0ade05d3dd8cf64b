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
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace moestream {

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

    // Piece-wise, for passes whose threads run at uneven speeds: chunk k (k < chunks <= size())
    // is pieces [starts[k], starts[k + 1]) (starts: chunks + 1 ascending values from 0, at most
    // 65535 pieces a chunk). Participant k runs its chunk's pieces in order; one that runs out
    // takes pieces still unclaimed in later chunks (a slower or descheduled participant's), so
    // fn(int64_t piece) runs exactly once per piece, on any thread. starts must stay valid
    // until the call returns.
    template <class F>
    void parallel_for_pieces(int64_t chunks, const int64_t* starts, F&& fn) {
        using fn_t = std::remove_reference_t<F>;
        run_pieces(chunks, starts, &call_piece<fn_t>, static_cast<const void*>(std::addressof(fn)));
    }

private:
    using task_fn = void (*)(const void* ctx, int64_t begin, int64_t end);
    template <class Fn>
    static void call_piece(const void* ctx, int64_t piece, int64_t) {
        (*static_cast<Fn*>(const_cast<void*>(ctx)))(piece);
    }
    void run_pieces(int64_t chunks, const int64_t* starts, task_fn fn, const void* ctx);
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
