// Routed experts through two memory tiers fed by io_uring: a "device" tier (VRAM on the CUDA
// backend; on the CPU backend a RAM region with the same budget and semantics) and a host tier
// (page-aligned, optionally locked RAM slots), exclusive of each other (an expert lives in at
// most one of them), over the model file(s) on disk.
//
// Protocol (dsv41::expert_source): need(layer, ids) is the router's answer for a layer; every
// miss is submitted at once (all chunks of all of them), so the disk queue is deep from the
// start; a miss already loading is joined, never read twice. async_ready() answers, once at
// least one of the experts asked for is resident, with what is (a host-tier expert is first
// promoted to the device tier, whose victim moves down into the host slot the promoted expert
// leaves). release() unpins it. The model holds at most max_held() experts.
//
// The DSpark stages' experts (layers n_layers + s) have host slots of their own by default
// (tier_options::draft_bytes), so drafting never evicts the target's experts from either tier.
//
// Results do not depend on any of this: the bytes computed from are the file's bytes wherever
// they sit, and the model's accumulation order is fixed (ascending expert id).
//
// Thread safety (issue 15): one strand owns every piece of tier state (both caches, loading and
// joined reads, pins, hints, failures, counters, the waiting requests); there is no mutex.
// need(), hint(), release() and async_ready() only post to it and return. Read completions: the
// reader's reaper thread posts each to the strand (docs/streaming.md says why not the eventfd).
// A promotion's copy runs on a copy worker between two strand handlers (the first reserves the
// slots and pins the source, the second publishes the result), touching only those slots. An
// async_ready() that cannot be answered yet is kept as a waiter and answered by the handler that
// makes one of its experts resident, so no thread waits for an expert. The strand runs on
// tier_options::executor (the serving process's scheduler thread, scheduler/scheduler_thread.h,
// shared with the device tier's strand and the engine's), or on a thread of its own. The blocking
// forms (acquire_ready(), get(), counters(), resident_keys(), forget_resident(), the destructor)
// wait for the strand: for callers on other threads (start-up's preload, tools, /metrics on the
// HTTP server's threads), never from a thread running the strand's executor, where the answer
// could never come (they assert it). wait_totals() and layer_tallies() never wait.
// --io-mode remap-sync keeps the published port's blocking design on purpose: need() waits
// while the strand pread()s every miss through a pool, and promotions copy on the strand. (Called
// from the scheduler's thread, as the device tier's strand does on CUDA, need() cannot wait for
// the strand there: the reads then block that thread instead, before anything asked after them.)
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/result.h"
#include "model/thread_pool.h"
#include "model/arch/deepseek41.h"
#include "scheduler/model_loader.h"
#include "scheduler/scheduler_thread.h"
#include "spec/expert_union.h"
#include "storage/aligned_buffer.h"
#include "storage/expert_cache.h"
#include "storage/io_uring_reader.h"

namespace moestream {

struct tier_options {
    uint64_t device_bytes = 0;  // 0: no device tier (compute reads the host slots); clamped like host_bytes
    uint64_t host_bytes = 0;    // at least one expert; more than every expert takes is clamped
    // The DSpark stages' experts (layers n_layers + s) in host slots of their own, so drafting
    // never evicts the target's experts from the device or host tier (the published port kept
    // them in RAM: a draft that waits for the disk or pushes the target's hot experts out costs
    // more than it saves). kDraftAll (the default): every draft expert, resident once first
    // read, never evicted; 0: the draft shares the target's tiers; else at least one expert.
    static constexpr uint64_t kDraftAll = UINT64_MAX;
    uint64_t draft_bytes = kDraftAll;
    io::reader_options io;
    // Eviction policy of the tiers: "lru", "lfu" or "layered" (storage/eviction_policy.h: LRU
    // with a head start for the early layers, head_start_forwards whole forwards at layer 0).
    std::string policy = "lru";
    double head_start_forwards = 4;
    bool lock_host = false;     // mlock the host tier (pinned memory)
    // The first layer's experts stay in the host tier once read (while that takes at most an
    // eighth of it): nothing predicts the first layer (its router is the forward's first), so
    // each of its misses stalls the step for a whole read, where a later layer's miss is mostly
    // read while the layers before it compute.
    bool keep_first_layer = true;
    // Baseline of the published port (--io-mode remap-sync): need() blocks until a pool of
    // `remap_threads` threads has pread() every part of every miss, one request per tensor part,
    // through the page cache; no queue, no overlap with compute. Kept to measure the difference.
    bool remap_sync = false;
    int remap_threads = 8;
    // Test hook: reads of experts for which this returns true complete with an error.
    std::function<bool(int layer, int32_t expert)> inject_read_error;
    // Test hook: microseconds to hold back the completion of a read part, and of a promotion's
    // copy, of this expert (a timer on the strand: no thread sleeps; timing changes only, results
    // must not move). Called on the strand.
    std::function<uint32_t(int layer, int32_t expert)> inject_delay_us;
    // Where the tier's strand runs: the serving process's scheduler (scheduler_thread::executor(),
    // an io_context run by one thread; its io_context must outlive the tier); empty: a scheduler
    // thread of the tier's own.
    boost::asio::any_io_executor executor;
};

struct tier_counters {
    uint64_t demands = 0;        // get() calls
    uint64_t device_hits = 0;
    uint64_t host_hits = 0;      // found in the host tier (promoted)
    uint64_t draft_hits = 0;     // of the host hits, draft experts found in the draft's own slots
    uint64_t joins = 0;          // demanded while already loading
    uint64_t disk_reads = 0;     // experts read from disk
    uint64_t disk_bytes = 0;
    uint64_t promoted_bytes = 0; // host -> device copies
    uint64_t demoted_bytes = 0;  // device -> host copies of evicted experts
    uint64_t read_errors = 0;
    uint64_t hint_reads = 0;     // reads started from look-ahead hints
    uint64_t hint_used = 0;      // of those, demanded afterwards (the rest was a wasted read)
    // Seconds from a request for experts to its answer, for requests not answered at once (a
    // forward suspended there; remap-sync: also need()'s blocking reads).
    double wait_seconds = 0;
    // Times a thread blocked for an expert: the blocking acquire_ready()/get() (device_experts'
    // fills) and remap-sync's need(). The coroutine forward never does, so the streaming tests
    // assert zero.
    uint64_t blocking_waits = 0;
    double copy_seconds = 0;     // host <-> device copies made on the strand (remap-sync only)
    double async_copy_seconds = 0;  // copies made by the copy worker, overlapping compute
    uint64_t async_promotions = 0;  // experts the copy worker moved up
    // Read completions posted from the reaper to the strand, and the seconds from the reaper's
    // callback to the strand's handler summed over them (the host latency of that hop).
    uint64_t completions_posted = 0;
    double completion_post_seconds = 0;
    // Routing statistics: demands of an expert never demanded before (their count over tokens is
    // "new experts per token"), and how many distinct experts have been demanded (the working set).
    uint64_t first_demands = 0;
    uint64_t working_set = 0;
};

class tiered_experts final : public dsv41::expert_source {
  public:
    static result<std::unique_ptr<tiered_experts>> create(const loaded_model& m, tier_options opts);
    ~tiered_experts() override;

    void need(int layer, std::span<const int32_t> experts) override;
    result<dsv41::expert_weights> get(int layer, int32_t expert) override;
    void release(int layer, int32_t expert) override;
    // Blocking: waits for the strand's answer (counted in blocking_waits when not immediate).
    result<std::vector<std::pair<int32_t, dsv41::expert_weights>>> acquire_ready(int layer,
                                                                                std::span<const int32_t> pending,
                                                                                int64_t max) override;
    void async_ready(int layer, std::span<const int32_t> pending, int64_t max, dsv41::ready_callback done) override;
    int64_t max_held() const override { return max_held_; }
    // Look-ahead reads go out only while no demand chunk is waiting in the reader's queue, so a
    // prediction never delays a demand; a demand for a hinted expert joins its read.
    void hint(int layer, std::span<const int32_t> experts) override;

    tier_counters counters() const;  // a snapshot taken on the strand (blocks briefly)
    // tier_counters::wait_seconds and copy_seconds as the strand last left them, without waiting
    // for it: the engine's per-step split reads them on the scheduler's thread.
    struct wait_total {
        double wait_seconds = 0, copy_seconds = 0;
    };
    wait_total wait_totals() const {
        return {wait_total_.load(std::memory_order_relaxed), copy_total_.load(std::memory_order_relaxed)};
    }
    // Where each layer's announced experts were, cumulative (layers 0..out.size()-1; the draft
    // stages after the target's), for spec::step_recorder's per-step accounting (a
    // spec::tally_probe). Never blocks (see tallies_).
    bool layer_tallies(std::span<spec::layer_tally> out) const;
    enum class tier { device, host, draft };
    // The experts resident in a tier, ascending (tests, reports; blocks briefly).
    std::vector<storage::expert_key> resident_keys(tier which) const;
    // Drops every resident expert no forward holds, in every tier, so the next forward reads
    // from disk what it needs (benchmarks of new content). Not while a forward runs.
    void forget_resident();
    io::reader_stats io_stats() const { return reader_->stats(); }
    uint32_t device_slots() const { return device_slots_; }
    uint32_t host_slots() const { return host_slots_; }
    uint32_t draft_slots() const { return draft_slots_; }  // 0: the draft shares the target's tiers
    // Bytes one expert takes in each tier (with its read alignment in the host tier).
    uint64_t device_slot_bytes() const { return device_slot_bytes_; }
    uint64_t host_slot_bytes() const { return host_slot_bytes_; }
    // The host tier's slots (device_experts page-locks them for DMA while it copies from them).
    std::span<std::byte> host_region() const { return host_buf_.span(); }
    std::string notes() const { return reader_->notes(); }

  private:
    struct part {  // one of gate / up / down of an expert
        io::read_request where;  // file, offset, bytes (dst and tag filled per read)
        ggml_type type;
        int64_t cols, rows;
    };
    struct layout {
        part parts[3];
    };
    struct load_state {
        int parts_left = 0;
        bool failed = false;
        std::string error;
        uint64_t generation = 0;  // need() count when the read started
        bool hinted = false;      // started by a prediction (counted in hint_reads_in_flight_)
    };

    // A request for experts not answered yet (async_ready): answered, in arrival order, by the
    // strand handler that makes one of its experts resident.
    struct waiter {
        int layer;
        std::vector<int32_t> pending;
        int64_t max;
        dsv41::ready_callback done;
        bool blocking;  // a thread waits for the answer (acquire_ready)
        std::chrono::steady_clock::time_point since;
        bool waited = false;  // not answered by its first attempt
    };

    tiered_experts(const loaded_model& m, tier_options opts);
    const layout& layout_of(int layer, int32_t expert) const;
    dsv41::expert_weights views(const layout& l, const std::byte* base, bool host) const;
    std::byte* host_slot(storage::slot_id s) const { return host_buf_.data() + size_t(s) * host_slot_bytes_; }
    std::byte* device_slot(storage::slot_id s) const { return device_buf_.data() + size_t(s) * device_slot_bytes_; }
    std::byte* draft_slot(storage::slot_id s) const { return draft_buf_.data() + size_t(s) * host_slot_bytes_; }
    // A draft stage's expert with a budget of its own: it lives in the draft's slots only.
    bool draft_key(storage::expert_key k) const { return draft_ && int(storage::key_layer(k)) >= n_layers_; }
    // The host-memory cache an expert is read into: the draft's own, or the host tier.
    storage::expert_cache& home(storage::expert_key k) const { return draft_key(k) ? *draft_ : *host_; }
    std::byte* home_slot(storage::expert_key k, storage::slot_id s) const {
        return draft_key(k) ? draft_slot(s) : host_slot(s);
    }
    void copy_parts(const layout& l, const std::byte* from, bool from_host, std::byte* to, bool to_host) const;
    // Runs fn on the strand and waits for it (blocking forms and the destructor only; never on
    // the thread running the strand's executor).
    void run_on_strand(std::function<void()> fn) const;
    // The calling thread runs the strand's executor (the scheduler's thread, or the tier's own):
    // nothing there may wait for the strand.
    bool on_strand_thread() const;
    // Copies counters_' wait and copy seconds where wait_totals() reads them (strand only).
    void publish_waits();

    // ---- strand handlers and what they call (strand only) ----
    void on_need(int layer, const std::vector<int32_t>& experts);
    void on_hint(int layer, const std::vector<int32_t>& experts);
    void on_release(int layer, int32_t expert);
    void on_read(uint64_t tag, const status& st);      // a read part's completion (maybe held back)
    void finish_read(uint64_t tag, const status& st);  // its bookkeeping
    void enqueue(waiter w);
    // Answers every waiter that can be answered now, in order; re-entrant calls (from reads that
    // complete synchronously in remap-sync) are folded into the running one.
    void serve_waiters();
    // One attempt at a waiter: true when answered (with experts or an error).
    bool try_serve(waiter& w);
    // Starts the disk read of `key` into a host slot (false when no host slot can be had now).
    bool start_read(storage::expert_key key, std::vector<io::read_request>& batch);
    void submit(std::vector<io::read_request>& batch);  // the reader, or remap-sync's pool
    void submit_hints();
    std::optional<dsv41::expert_weights> take_if_resident(storage::expert_key key);
    void release_pin(int layer, int32_t expert);
    // Synchronous host -> device on the strand (remap-sync's copies on the compute path).
    bool promote(storage::expert_key key);
    // Host -> device through the copy worker: reserves the device slot (and the victim's host
    // slot) and pins the source here, copies there, publishes in finish_promotion(). `demanded`:
    // asked for by a waiter (else only when need() still protects it).
    void start_promotion(storage::expert_key key, bool demanded);
    struct promotion {
        storage::expert_key key;
        std::optional<storage::expert_key> victim;
        std::optional<storage::slot_id> victim_host_slot;
        double seconds = 0;
    };
    void finish_promotion(const promotion& p);

    const loaded_model& m_;
    tier_options opts_;
    std::vector<layout> layouts_;  // [(n_layers + n_mtp) * max experts]
    int max_experts_ = 0;
    uint64_t host_slot_bytes_ = 0, device_slot_bytes_ = 0;
    // Where part p starts in a slot: host slots keep each part in the reader's staging window
    // (its bytes at offset % 4096, so O_DIRECT reads land in place); device slots pack them.
    uint64_t host_part_[3] = {}, device_part_[3] = {};
    uint32_t host_slots_ = 0, device_slots_ = 0, draft_slots_ = 0;
    int n_layers_ = 0;  // the target's layers (the draft stages follow)
    int64_t max_held_ = 1;
    io::aligned_buffer host_buf_, device_buf_, draft_buf_;

    // The strand and what it runs on (declared before the reader and the copy worker, which post
    // to it, so it outlives them): tier_options::executor, or a scheduler thread of the tier's own.
    std::unique_ptr<scheduler_thread> own_;
    boost::asio::strand<boost::asio::any_io_executor> strand_;
    std::unique_ptr<boost::asio::thread_pool> copier_;  // with a device tier, not remap-sync

    std::unique_ptr<io::uring_reader> reader_;
    std::vector<int> remap_fds_;              // remap-sync: buffered descriptors of the files
    std::unique_ptr<thread_pool> remap_pool_;  // remap-sync: the pread pool
    void remap_sync_reads(const std::vector<io::read_request>& batch);

    // ---- strand-owned ----
    std::unique_ptr<storage::expert_cache> host_, device_, draft_;
    // Per layer (target, then draft stages): written on the strand only, read by
    // layer_tallies() from any thread without a round trip to the strand (it runs twice a
    // decode step). Relaxed atomics: a step's need() handlers all ran before its forward ended
    // (the forward awaited their answers), so a reader after the forward sees them.
    struct atomic_tally {
        std::atomic<uint64_t> needs{0}, experts{0}, device{0}, host{0}, in_flight{0}, missing{0}, bytes_read{0};
    };
    std::unique_ptr<atomic_tally[]> tallies_;
    size_t n_tallies_ = 0;
    std::map<storage::expert_key, load_state> loading_;
    // Read errors not yet reported, with the need() generation of their read: a failure from an
    // older forward (that already failed) is not reported again, its expert is read again.
    std::map<storage::expert_key, std::pair<uint64_t, std::string>> failed_;
    uint64_t generation_ = 0;
    // Host pins taken by need() for experts the model is about to get (so a demotion or another
    // read cannot evict them first); a take takes them over.
    std::vector<storage::expert_key> need_pins_;
    // Predicted, not yet read, by layer (nearest first): the layers after the one demanded last,
    // up to kHintLayers ahead, counting on into the next forward's first layers (lead()).
    std::vector<storage::expert_key> hinted_;
    // Layers from the one demanded last to `layer` (0: that layer): past the target's last layer
    // (or a draft stage after it) the count goes on with the next forward's first layers, which
    // the last layers' look-ahead predicts. kNotAhead: nothing sensible ahead.
    uint32_t lead(uint32_t layer) const;
    static constexpr uint32_t kNotAhead = UINT32_MAX;
    static constexpr uint32_t kHintLayers = uint32_t(kMaxLookaheadLayers);
    // Predictions read at once, at most (experts). The disk serves the reads in flight side by
    // side, so every read queued beside a demand or a nearer layer's prediction delays it: on the
    // H200 host's virtio disk one layer's few reads and the next layer's predictions finished
    // together, the nearer layer waiting for the farther one's bytes (MOESTREAM_TRACE timeline,
    // docs/streaming.md). A few experts (about 12 requests, ~1.5 GB/s there) keep the disk busy;
    // the rest wait here, nearest layer first, and go as these land.
    static constexpr int kHintReadsInFlight = 4;
    int hint_reads_in_flight_ = 0;
    uint32_t need_layer_ = 0;  // the layer of the latest need()
    std::set<storage::expert_key> hint_started_;       // read because of a hint, not yet demanded
    std::set<storage::expert_key> kept_;  // first-layer experts pinned in the host tier (keep_first_layer)
    size_t keep_budget_ = 0;
    std::set<storage::expert_key> joined_;             // demanded while loading, this layer
    uint64_t step_ = 0;
    tier_counters counters_;
    std::atomic<double> wait_total_{0}, copy_total_{0};  // publish_waits(): read by wait_totals()
    std::vector<bool> demanded_;  // [layer * max_experts + expert]: demanded at least once
    // Device pins a promotion made for demanded experts (taken over by a take, dropped by the
    // next need()), and keys promoted that no take has found yet (their first take counts as a
    // host hit, which is where they were found).
    std::vector<storage::expert_key> device_need_pins_;
    std::set<storage::expert_key> promoted_ahead_;
    std::vector<waiter> waiters_;
    bool serving_ = false, serve_again_ = false;
    int64_t in_progress_ = 0;  // timers and copies whose handler has not run yet
    bool stopping_ = false;    // the destructor started: nothing new is read or copied
};

}  // namespace moestream
