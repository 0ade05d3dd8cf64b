// Routed experts in slots of a backend's memory (VRAM on the CUDA backend), filled when a layer
// needs them from the model's memory mapping or, given a `fill_from` source (the host tier of
// tiered_experts: O_DIRECT io_uring reads, nothing read through the mapping), from that: the least recently used unpinned slot is
// reused, and the model pins an expert from get() to release(), holding at most as many as
// there are slots. With as many slots as experts (--device-cache covering them all) every
// expert stays resident after its first use, or from the start with `preload`. Where an expert
// sits never changes a result: its bytes are the file's wherever it lies.
//
// This is the synchronous first version of the device tier (issue 15 streams it from the host
// tier and the disk through the coroutine scheduler): it keeps the default async_ready() (an
// answer at once, from acquire_ready), so a forward over it never suspends, and a fill takes
// its expert from the host tier with the tier's blocking get(), which blocks the calling thread
// (counted in tier_counters::blocking_waits).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/backend.h"
#include "scheduler/model_loader.h"

namespace moestream {

class device_experts final : public dsv41::expert_source {
  public:
    // Bytes one slot takes (the largest expert of the target and the draft, gate + up + down).
    static size_t slot_bytes(const loaded_model& m);
    // `slots` slots (at most m.total_experts()); an error names the bytes when the backend has no room.
    // With `fill_from`, the misses of need() are announced to it (its reads start at once), a
    // miss's bytes are uploaded from what it returns, and hints go to it; it must outlive this.
    static result<std::unique_ptr<device_experts>> create(backend& be, const loaded_model& m, int64_t slots,
                                                          bool preload, dsv41::expert_source* fill_from = nullptr);

    void need(int layer, std::span<const int32_t> experts) override;
    void hint(int layer, std::span<const int32_t> experts) override;
    result<dsv41::expert_weights> get(int layer, int32_t expert) override;
    void release(int layer, int32_t expert) override;
    int64_t max_held() const override { return int64_t(slots_.size()); }
    // Once every expert of the model sits in a slot (as many slots as experts, all loaded: with
    // `preload` from the start), each layer's table for the routed MoE ops; null before.
    const expert_slot_table* slot_table(int layer) override;

    struct counters {
        uint64_t hits = 0, misses = 0, bytes_uploaded = 0;
    };
    const counters& stats() const { return stats_; }
    int64_t slots() const { return int64_t(slots_.size()); }

  private:
    device_experts(backend& be, const loaded_model& m) : be_(be), m_(m) {}
    int64_t key_of(int layer, int32_t expert) const;
    std::span<const int32_t> misses_of(int layer, std::span<const int32_t> experts);
    // Uploads the slot of every expert and builds the layers' tables (every expert resident).
    void publish_tables();

    struct slot {
        int64_t key = -1;  // (layer, expert) flattened, -1: empty
        int pins = 0;
        uint64_t used = 0;
        dsv41::expert_weights views;
    };
    backend& be_;
    const loaded_model& m_;
    dsv41::expert_source* fill_from_ = nullptr;
    std::vector<int32_t> misses_;
    backend_array<std::byte> memory_;
    size_t slot_bytes_ = 0;
    std::vector<int64_t> layer_base_;  // first key of each layer
    std::vector<int32_t> slot_of_;     // per key: its slot, or -1
    std::vector<slot> slots_;
    int64_t loaded_ = 0;                         // slots holding an expert
    backend_array<int32_t> slot_of_device_;      // slot_of_, once every expert is resident
    std::vector<expert_slot_table> tables_;      // per layer, once every expert is resident
    uint64_t clock_ = 0;
    counters stats_;
};

}  // namespace moestream
