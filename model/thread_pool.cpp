// Protocol. The dispatching thread writes the job (fn, ctx, n), publishes `call` = (call number,
// chunk count) and bumps `epoch`, which wakes workers. Chunk k belongs first to participant k
// (the dispatcher is 0); afterwards a worker takes its successor's chunk if still free and the
// dispatcher every chunk still free, so a worker slow to wake or descheduled does not hold the
// call up. Each chunk has its own slot (own cache line) holding
// (call number, taken | done): claiming is a CAS that succeeds only on a slot last used by an
// earlier call, finishing is a plain store, and the dispatcher waits by reading the slots, so no
// cache line is read-modify-written by every participant (on this kind of machine a line
// bouncing through 16 cores costs microseconds per call).
// A worker that wakes late for a finished call claims nothing (every slot of that call carries
// its number or a later one) and so never reads a job description that is being rewritten: a
// successful claim proves the call is still running, and the dispatcher rewrites the job only
// after every slot of the call says done.
// Piece mode (parallel_for_pieces) keeps that protocol for the chunk as a whole: whoever first
// takes a chunk's slot (its owner, or a helper when the owner is late) publishes its piece count;
// pieces are then handed out one at a time through a claim counter, to the owner and to helpers
// alike, and whoever finishes the chunk's last piece marks the slot done. Counters carry the call
// number, so a stale one reads as zero, and a worker that wakes late for a finished call finds
// every piece of it claimed; a successful piece claim proves the call is still running, so the
// job (fn, ctx, starts) it then reads is the current one.
// Sleeping uses C++20 atomic wait/notify (a futex on Linux); the sleeper flags make the common
// case (everybody spinning) free of system calls. Both sleep hand-shakes are Dekker-style (store
// my flag, then load the other's), hence seq_cst on those accesses.
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

constexpr int kMaxChunks = 0xffff;

// A chunk slot's word: call number << 2 | state; the call word: call number << 16 | chunk count.
enum : uint64_t { kTaken = 1, kDone = 2 };
constexpr uint64_t slot_word(uint64_t call, uint64_t state) { return call << 2 | state; }
constexpr uint64_t slot_call(uint64_t w) { return w >> 2; }
constexpr uint64_t call_word(uint64_t call, int64_t chunks) { return call << 16 | uint64_t(chunks); }
// Piece mode's counters: call number << 16 | count; a counter of an earlier call counts 0.
constexpr int64_t kMaxPiecesPerChunk = 0xffff;
constexpr uint64_t counter_word(uint64_t call, uint64_t count) { return call << 16 | count; }
constexpr uint64_t count_for(uint64_t w, uint64_t call) { return w >> 16 == call ? w & 0xffff : 0; }

// Chunk k of c over [0, n): [k*n/c, (k+1)*n/c). n is bounded in run() so k*n cannot overflow.
inline int64_t chunk_begin(int64_t k, int64_t n, int64_t c) { return k * n / c; }

}  // namespace

struct thread_pool::state {
    std::vector<std::thread> workers;

    // The job, written by the dispatcher before `call` is published (see the protocol above).
    task_fn fn = nullptr;
    const void* ctx = nullptr;
    int64_t n = 0;
    // Piece mode: chunk k is pieces [starts[k], starts[k + 1]); null for whole chunks. Atomic
    // (relaxed) because a worker reads it before it claims anything.
    std::atomic<const int64_t*> starts{nullptr};
    alignas(64) std::atomic<uint64_t> call{0};
    uint64_t calls = 0;  // the dispatcher's counter (call numbers start at 1)

    // One slot per chunk (chunks <= threads), each on its own cache line.
    struct alignas(64) chunk_slot {
        std::atomic<uint64_t> word{0};
        // Piece mode (counter words): the chunk's pieces, those handed out, those finished.
        std::atomic<uint64_t> pieces{0}, claimed{0}, ended{0};
    };
    std::unique_ptr<chunk_slot[]> slots;
    int64_t n_slots = 0;

    // The dispatcher sleeps on `finished` (bumped by a finishing worker that sees it asleep).
    alignas(64) std::atomic<uint32_t> finished{0};
    std::atomic<uint32_t> dispatcher_sleeping{0};
    alignas(64) std::atomic<uint32_t> epoch{0};
    std::atomic<uint32_t> sleepers{0};
    std::atomic<bool> stop{false};
    alignas(64) std::atomic<bool> busy{false};  // a call is running (nested calls go inline)

    // Takes chunk k's slot for call c if it is still free (last used by an earlier call).
    bool claim(uint64_t c, int64_t k) {
        std::atomic<uint64_t>& w = slots[size_t(k)].word;
        uint64_t seen = w.load(std::memory_order_relaxed);
        return slot_call(seen) < c &&
               w.compare_exchange_strong(seen, slot_word(c, kTaken), std::memory_order_acq_rel, std::memory_order_relaxed);
    }

    // Claims chunk k of call `c` if it is still free, and runs it.
    void try_chunk(uint64_t c, int64_t count, int64_t k) {
        if (!claim(c, k)) return;
        fn(ctx, chunk_begin(k, n, count), chunk_begin(k + 1, n, count));
        mark_done(c, k);
    }

    // Marks chunk k of call c done (the dispatcher may be waiting for it, asleep).
    void mark_done(uint64_t c, int64_t k) {
        slots[size_t(k)].word.store(slot_word(c, kDone), std::memory_order_seq_cst);
        if (dispatcher_sleeping.load(std::memory_order_seq_cst)) {
            finished.fetch_add(1, std::memory_order_seq_cst);
            finished.notify_one();
        }
    }

    // Piece mode: takes chunk k of call c if nobody has, and publishes its piece count.
    void open_chunk(uint64_t c, int64_t k) {
        if (!claim(c, k)) return;
        const int64_t* st = starts.load(std::memory_order_relaxed);  // the claim proves c is running: c's
        const int64_t total = st[k + 1] - st[k];
        MS_ASSERT_MSG(total >= 0 && total <= kMaxPiecesPerChunk, "thread_pool: too many pieces in a chunk");
        if (total == 0) return mark_done(c, k);
        slots[size_t(k)].pieces.store(counter_word(c, uint64_t(total)), std::memory_order_release);
    }

    // Piece mode: runs pieces of chunk k of call c while any is unclaimed; false if it ran none.
    bool run_pieces(uint64_t c, int64_t k) {
        chunk_slot& sl = slots[size_t(k)];
        bool ran = false;
        for (;;) {
            const uint64_t p = sl.pieces.load(std::memory_order_acquire);
            if (p >> 16 != c) return ran;  // not opened yet (its opener will run it), or a later call's
            const uint64_t total = p & 0xffff;
            uint64_t w = sl.claimed.load(std::memory_order_relaxed), have;
            do {
                if (w >> 16 > c) return ran;
                have = count_for(w, c);
                if (have >= total) return ran;
            } while (!sl.claimed.compare_exchange_weak(w, counter_word(c, have + 1), std::memory_order_acq_rel,
                                                       std::memory_order_relaxed));
            const int64_t piece = starts.load(std::memory_order_relaxed)[k] + int64_t(have);  // c is running
            fn(ctx, piece, piece + 1);
            ran = true;
            uint64_t e = sl.ended.load(std::memory_order_relaxed), ended_now;
            do {
                ended_now = count_for(e, c) + 1;
            } while (!sl.ended.compare_exchange_weak(e, counter_word(c, ended_now), std::memory_order_acq_rel,
                                                     std::memory_order_relaxed));
            if (ended_now == total) mark_done(c, k);
        }
    }

    // Piece mode: `self`'s chunk first, then pieces still unclaimed in the chunks after it (in a
    // ring): the dispatcher looks at every chunk (opening those whose owners are late), a worker
    // goes on until it meets one with nothing left (so slot lines stay shared by few cores).
    void work_pieces(int64_t self, uint64_t c, int64_t count) {
        if (self < count) {
            open_chunk(c, self);
            run_pieces(c, self);
        }
        for (int64_t i = 1; i < count; ++i) {
            const int64_t k = (self + i) % count;
            open_chunk(c, k);
            if (!run_pieces(c, k) && self != 0) break;
        }
    }

    // Participant `self`'s share of the current call: its own chunk, then, for a worker, the next
    // participant's if still free, for the dispatcher every chunk still free. Workers look no
    // further so that each slot's cache line is shared by three cores at most (its owner, its
    // predecessor, the dispatcher): when every worker read every slot after its chunk, the next
    // call's claims had to take the lines back from up to 15 readers, and an empty call cost
    // ~2.5 us on the H200 host against ~0.7 us for a bare spin barrier.
    void work(int64_t self) {
        const uint64_t cw = call.load(std::memory_order_acquire);
        const uint64_t c = cw >> 16;
        const int64_t count = std::min<int64_t>(int64_t(cw & 0xffff), n_slots);
        if (c == 0 || count <= 0) return;
        if (starts.load(std::memory_order_relaxed)) return work_pieces(self, c, count);
        if (self < count) try_chunk(c, count, self);
        if (self == 0) {
            for (int64_t k = 1; k < count; ++k) try_chunk(c, count, k);
        } else if (self + 1 < count) {
            try_chunk(c, count, self + 1);
        }
    }

    // The dispatcher's side of a call (busy already taken): publishes the job (whole chunks of
    // [0, n), or pieces by `piece_starts`), wakes the workers, runs participant 0's share, waits
    // for every chunk and frees the pool.
    void dispatch(task_fn job_fn, const void* job_ctx, int64_t job_n, const int64_t* piece_starts, int64_t chunks) {
        fn = job_fn;
        ctx = job_ctx;
        n = job_n;
        starts.store(piece_starts, std::memory_order_relaxed);
        const uint64_t c = ++calls;
        call.store(call_word(c, chunks), std::memory_order_release);
        epoch.store(epoch.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
        if (sleepers.load(std::memory_order_seq_cst) > 0) epoch.notify_all();
        work(0);
        wait_all_done(c, chunks);
        busy.store(false, std::memory_order_release);
    }

    // The dispatcher's wait for every chunk of call c: spinning, then asleep on `finished`.
    void wait_all_done(uint64_t c, int64_t count) {
        if (spin_until([&] { return all_done(c, count); })) return;
        dispatcher_sleeping.store(1, std::memory_order_seq_cst);
        for (;;) {
            const uint32_t f = finished.load(std::memory_order_seq_cst);
            if (all_done(c, count)) break;
            finished.wait(f, std::memory_order_seq_cst);
        }
        dispatcher_sleeping.store(0, std::memory_order_relaxed);
    }

    bool all_done(uint64_t c, int64_t count) const {
        for (int64_t k = 0; k < count; ++k)
            if (slots[size_t(k)].word.load(std::memory_order_seq_cst) != slot_word(c, kDone)) return false;
        return true;
    }

    void worker_loop(int64_t self) {
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
            work(self);
        }
    }
};

thread_pool::thread_pool(int threads) : threads_(threads), s_(std::make_unique<state>()) {
    MS_ASSERT_MSG(threads >= 1 && threads <= kMaxChunks, "thread_pool: thread count out of range");
    s_->slots = std::make_unique<state::chunk_slot[]>(size_t(threads));
    s_->n_slots = threads;
    s_->workers.reserve(size_t(threads - 1));
    for (int i = 1; i < threads; ++i) s_->workers.emplace_back([st = s_.get(), i] { st->worker_loop(i); });
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
    MS_ASSERT(chunks <= s.n_slots);
    s.dispatch(fn, ctx, n, nullptr, chunks);
}

void thread_pool::run_pieces(int64_t chunks, const int64_t* starts, task_fn fn, const void* ctx) {
    MS_ASSERT(fn != nullptr && starts != nullptr && starts[0] == 0);
    if (chunks <= 0) return;
    for (int64_t k = 0; k < chunks; ++k) MS_ASSERT_MSG(starts[k] <= starts[k + 1], "thread_pool: piece starts must ascend");
    state& s = *s_;
    if (chunks == 1 || s.busy.exchange(true, std::memory_order_acquire)) {
        for (int64_t p = 0; p < starts[chunks]; ++p) fn(ctx, p, p + 1);
        return;
    }
    MS_ASSERT_MSG(chunks <= s.n_slots, "thread_pool: more chunks than threads");
    s.dispatch(fn, ctx, 0, starts, chunks);
}

}  // namespace moestream
