// Routed experts through two memory tiers fed by io_uring: a "device" tier (VRAM on the CUDA
// backend; on the CPU backend a RAM region with the same budget and semantics) and a host tier
// (page-aligned, optionally locked RAM slots), exclusive of each other (an expert lives in at
// most one of them), over the model file(s) on disk.
//
// Protocol (dsv41::expert_source): need(layer, ids) is the router's answer for a layer; every
// miss is submitted at once (all chunks of all of them), so the disk queue is deep from the
// start; a miss already loading is joined, never read twice. get() returns an expert once it is
// resident, promoting it from host to device (the device victim moves down into the host slot
// the promoted expert leaves). release() unpins it. The model holds at most max_held() experts.
//
// Results do not depend on any of this: the bytes computed from are the file's bytes wherever
// they sit, and the model's accumulation order is fixed (ascending expert id).
//
// Thread safety: need/get/release come from the compute thread; read completions arrive on the
// reader's thread; promotions ahead of demand run on a copy thread; one mutex guards the tier
// state, and no copy is made while holding it on the copy thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/result.h"
#include "model/thread_pool.h"
#include "model/arch/deepseek41.h"
#include "scheduler/model_loader.h"
#include "storage/aligned_buffer.h"
#include "storage/expert_cache.h"
#include "storage/io_uring_reader.h"

namespace moestream {

struct tier_options {
    uint64_t device_bytes = 0;  // 0: no device tier (compute reads the host slots); clamped like host_bytes
    uint64_t host_bytes = 0;    // at least one expert; more than every expert takes is clamped
    io::reader_options io;
    std::string policy = "lru";
    bool lock_host = false;     // mlock the host tier (pinned memory)
    // Baseline of the published port (--io-mode remap-sync): need() blocks until a pool of
    // `remap_threads` threads has pread() every part of every miss, one request per tensor part,
    // through the page cache; no queue, no overlap with compute. Kept to measure the difference.
    bool remap_sync = false;
    int remap_threads = 8;
    // Test hook: reads of experts for which this returns true complete with an error.
    std::function<bool(int layer, int32_t expert)> inject_read_error;
    // Test hook: microseconds to hold back the completion of a read part, and of a promotion by
    // the copy thread, of this expert (timing changes only: results must not move).
    std::function<uint32_t(int layer, int32_t expert)> inject_delay_us;
};

struct tier_counters {
    uint64_t demands = 0;        // get() calls
    uint64_t device_hits = 0;
    uint64_t host_hits = 0;      // found in the host tier (promoted)
    uint64_t joins = 0;          // demanded while already loading
    uint64_t disk_reads = 0;     // experts read from disk
    uint64_t disk_bytes = 0;
    uint64_t promoted_bytes = 0; // host -> device copies
    uint64_t demoted_bytes = 0;  // device -> host copies of evicted experts
    uint64_t read_errors = 0;
    uint64_t hint_reads = 0;     // reads started from look-ahead hints
    uint64_t hint_used = 0;      // of those, demanded afterwards (the rest was a wasted read)
    double wait_seconds = 0;     // compute thread blocked in get()
    // Times the compute thread blocked on a condition variable for an expert: the coroutine
    // scheduler (issue 15) brings it to zero.
    uint64_t blocking_waits = 0;
    double copy_seconds = 0;     // host <-> device copies made on the compute thread (it waited)
    double async_copy_seconds = 0;  // copies made by the copy thread, overlapping compute
    uint64_t async_promotions = 0;  // experts the copy thread moved up before compute asked
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
    result<std::vector<std::pair<int32_t, dsv41::expert_weights>>> acquire_ready(int layer,
                                                                                std::span<const int32_t> pending,
                                                                                int64_t max) override;
    int64_t max_held() const override { return max_held_; }
    // Look-ahead reads go out only while no demand chunk is waiting in the reader's queue, so a
    // prediction never delays a demand; a demand for a hinted expert joins its read.
    void hint(int layer, std::span<const int32_t> experts) override;

    tier_counters counters() const;
    io::reader_stats io_stats() const { return reader_->stats(); }
    uint32_t device_slots() const { return device_slots_; }
    uint32_t host_slots() const { return host_slots_; }
    // Bytes one expert takes in each tier (with its read alignment in the host tier).
    uint64_t device_slot_bytes() const { return device_slot_bytes_; }
    uint64_t host_slot_bytes() const { return host_slot_bytes_; }
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
    };

    tiered_experts(const loaded_model& m, tier_options opts);
    const layout& layout_of(int layer, int32_t expert) const;
    // Under the lock: starts the disk read of `key` into a host slot (returns false when no host
    // slot can be had now).
    bool start_read(storage::expert_key key, std::vector<io::read_request>& batch);
    dsv41::expert_weights views(const layout& l, const std::byte* base, bool host) const;
    std::byte* host_slot(storage::slot_id s) const { return host_buf_.data() + size_t(s) * host_slot_bytes_; }
    std::byte* device_slot(storage::slot_id s) const { return device_buf_.data() + size_t(s) * device_slot_bytes_; }
    void on_read(uint64_t tag, const status& st);
    std::optional<dsv41::expert_weights> take_if_resident(storage::expert_key key);
    void release_locked(int layer, int32_t expert);
    // Under the lock: host -> device (the device victim moves down); false when no device slot
    // can be had now.
    bool promote(storage::expert_key key);
    void copy_parts(const layout& l, const std::byte* from, bool from_host, std::byte* to, bool to_host);
    // The copy thread (coroutine mode with a device tier): promotes demanded experts as soon as
    // they are in the host tier (need() hits, completed reads), copying outside the lock, so the
    // host -> device transfer overlaps compute like a GPU's copy engine. The compute thread
    // promotes synchronously only what the copy thread has not reached.
    void copy_loop();
    void queue_promotion(storage::expert_key key);  // under the lock

    const loaded_model& m_;
    tier_options opts_;
    std::vector<layout> layouts_;  // [(n_layers + n_mtp) * max experts]
    int max_experts_ = 0;
    uint64_t host_slot_bytes_ = 0, device_slot_bytes_ = 0;
    // Where part p starts in a slot: host slots keep each part in the reader's staging window
    // (its bytes at offset % 4096, so O_DIRECT reads land in place); device slots pack them.
    uint64_t host_part_[3] = {}, device_part_[3] = {};
    uint32_t host_slots_ = 0, device_slots_ = 0;
    int64_t max_held_ = 1;
    io::aligned_buffer host_buf_, device_buf_;
    std::unique_ptr<io::uring_reader> reader_;
    std::vector<int> remap_fds_;              // remap-sync: buffered descriptors of the files
    std::unique_ptr<thread_pool> remap_pool_;  // remap-sync: the pread pool
    void remap_sync_reads(const std::vector<io::read_request>& batch);

    mutable std::mutex mu_;
    std::condition_variable changed_;
    std::unique_ptr<storage::expert_cache> host_, device_;
    std::map<storage::expert_key, load_state> loading_;
    // Read errors not yet reported, with the need() generation of their read: a failure from an
    // older forward (that already failed) is not reported again, its expert is read again.
    std::map<storage::expert_key, std::pair<uint64_t, std::string>> failed_;
    uint64_t generation_ = 0;
    // Host pins taken by need() for experts the model is about to get (so a demotion or another
    // read cannot evict them first); get() takes them over.
    std::vector<storage::expert_key> need_pins_;
    std::vector<storage::expert_key> hinted_;          // predicted, not yet read (newest layer only)
    std::set<storage::expert_key> hint_started_;       // read because of a hint, not yet demanded
    std::set<storage::expert_key> joined_;             // demanded while loading, this layer
    void submit_hints();                               // takes the lock; call without it
    uint64_t step_ = 0;
    tier_counters counters_;
    std::vector<bool> demanded_;  // [layer * max_experts + expert]: demanded at least once
    // Copy thread state (under mu_): keys to promote, device pins it made for demanded experts
    // (taken over by get(), dropped by the next need()), keys it promoted that get() has not
    // taken yet (their first take counts as a host hit, which is where they were found).
    std::vector<storage::expert_key> promote_queue_;
    std::vector<storage::expert_key> device_need_pins_;
    std::set<storage::expert_key> promoted_ahead_;
    std::condition_variable copy_wake_;
    bool copy_stop_ = false;
    std::thread copier_;
};

}  // namespace moestream
