// Protocol. The dispatching thread writes the job (fn, ctx, n, chunks), resets `done`, then
// publishes `claim` = (epoch, next chunk 0, chunk count) and bumps `epoch`, which wakes workers.
// Every participant (the dispatcher included) claims chunks with a CAS on `claim` that also checks
// the epoch, so a worker that wakes late for an already finished call claims nothing and never
// reads a job description that is being rewritten: a successful claim proves the call is still
// running, and the dispatcher rewrites the job only after `done` reaches the chunk count.
// Sleeping uses C++20 atomic wait/notify (a futex on Linux); the sleeper counters make the
// common case (everybody spinning) free of system calls. Both sleep hand-shakes are Dekker-style
// (store my flag, then load the other's), hence seq_cst on those accesses.
#include "model/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "config/assert.h"

namespace moestream {
namespace {

// How long an idle thread spins before sleeping. Decode issues matmuls microseconds apart, so
// this keeps workers awake across a token; an idle server sleeps after it.
constexpr auto kSpin = std::chrono::microseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Spins until pred() holds or kSpin has passed; true when pred() held.
template <class Pred>
bool spin_until(Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (pred()) return true;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() >= deadline) return false;
    }
}

// claim word: epoch (32 bits) | next chunk (16) | chunk count (16).
constexpr int kMaxChunks = 0xffff;
constexpr uint64_t pack(uint32_t epoch, uint64_t next, uint64_t count) {
    return uint64_t(epoch) << 32 | next << 16 | count;
}

// Chunk k of c over [0, n): [k*n/c, (k+1)*n/c). n is bounded in run() so k*n cannot overflow.
inline int64_t chunk_begin(int64_t k, int64_t n, int64_t c) { return k * n / c; }

}  // namespace

struct thread_pool::state {
    std::vector<std::thread> workers;

    // The job, written by the dispatcher before `claim` is published (see the protocol above).
    task_fn fn = nullptr;
    const void* ctx = nullptr;
    int64_t n = 0;

    // Separate cache lines: `claim` and `done` bounce between cores on every chunk, `epoch` and
    // the sleeper counts are read by spinning workers.
    alignas(64) std::atomic<uint64_t> claim{0};
    alignas(64) std::atomic<uint32_t> done{0};
    std::atomic<uint32_t> dispatcher_sleeping{0};
    alignas(64) std::atomic<uint32_t> epoch{0};
    std::atomic<uint32_t> sleepers{0};
    std::atomic<bool> stop{false};
    alignas(64) std::atomic<bool> busy{false};  // a call is running (nested calls go inline)

    // Claims and runs chunks of call `e` until none is left.
    void work(uint32_t e) {
        uint64_t c = claim.load(std::memory_order_acquire);
        for (;;) {
            if (uint32_t(c >> 32) != e) return;
            const uint64_t next = (c >> 16) & 0xffff, count = c & 0xffff;
            if (next >= count) return;
            if (!claim.compare_exchange_weak(c, c + (uint64_t(1) << 16), std::memory_order_acq_rel,
                                             std::memory_order_acquire))
                continue;
            const int64_t k = int64_t(next), cnt = int64_t(count);
            fn(ctx, chunk_begin(k, n, cnt), chunk_begin(k + 1, n, cnt));
            if (done.fetch_add(1, std::memory_order_seq_cst) + 1 == count &&
                dispatcher_sleeping.load(std::memory_order_seq_cst))
                done.notify_one();
            c = claim.load(std::memory_order_acquire);
        }
    }

    void worker_loop() {
        uint32_t seen = 0;
        for (;;) {
            uint32_t e = seen;
            const bool woke = spin_until([&] {
                e = epoch.load(std::memory_order_acquire);
                return e != seen;
            });
            if (!woke) {
                sleepers.fetch_add(1, std::memory_order_seq_cst);
                while ((e = epoch.load(std::memory_order_seq_cst)) == seen) epoch.wait(seen, std::memory_order_seq_cst);
                sleepers.fetch_sub(1, std::memory_order_relaxed);
            }
            if (stop.load(std::memory_order_acquire)) return;
            seen = e;
            work(e);
        }
    }
};

thread_pool::thread_pool(int threads) : threads_(threads), s_(std::make_unique<state>()) {
    MS_ASSERT_MSG(threads >= 1 && threads <= kMaxChunks, "thread_pool: thread count out of range");
    s_->workers.reserve(size_t(threads - 1));
    for (int i = 1; i < threads; ++i) s_->workers.emplace_back([st = s_.get()] { st->worker_loop(); });
}

thread_pool::~thread_pool() {
    MS_ASSERT_MSG(!s_->busy.load(), "thread_pool destroyed while a call is running");
    s_->stop.store(true, std::memory_order_release);
    s_->epoch.fetch_add(1, std::memory_order_seq_cst);
    s_->epoch.notify_all();
    for (auto& t : s_->workers) t.join();
}

int64_t thread_pool::chunk_count(int64_t n, int64_t grain) const {
    if (n <= 0) return 0;
    return std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, threads_);
}

void thread_pool::run(int64_t n, int64_t grain, task_fn fn, const void* ctx) {
    MS_ASSERT(fn != nullptr);
    const int64_t chunks = chunk_count(n, grain);
    if (chunks == 0) return;
    MS_ASSERT_MSG(n <= INT64_MAX / kMaxChunks, "thread_pool: range too large to partition");
    state& s = *s_;
    // One chunk, or the pool is taken (nested or concurrent call): same chunks, run here.
    if (chunks == 1 || s.busy.exchange(true, std::memory_order_acquire)) {
        for (int64_t k = 0; k < chunks; ++k) fn(ctx, chunk_begin(k, n, chunks), chunk_begin(k + 1, n, chunks));
        return;
    }
    s.fn = fn;
    s.ctx = ctx;
    s.n = n;
    s.done.store(0, std::memory_order_relaxed);
    const uint32_t e = s.epoch.load(std::memory_order_relaxed) + 1;
    s.claim.store(pack(e, 0, uint64_t(chunks)), std::memory_order_release);
    s.epoch.store(e, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) s.epoch.notify_all();

    s.work(e);

    const auto all_done = [&] { return s.done.load(std::memory_order_acquire) == uint32_t(chunks); };
    if (!spin_until(all_done)) {
        s.dispatcher_sleeping.store(1, std::memory_order_seq_cst);
        uint32_t d;
        while ((d = s.done.load(std::memory_order_seq_cst)) != uint32_t(chunks)) s.done.wait(d, std::memory_order_seq_cst);
        s.dispatcher_sleeping.store(0, std::memory_order_relaxed);
    }
    s.busy.store(false, std::memory_order_release);
}

}  // namespace moestream
