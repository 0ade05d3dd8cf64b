// Eviction policies of one expert tier (see expert_cache.h): which resident, unpinned slot gives
// way when a load needs a slot and none is free. The cache owns the slot states and tells the
// policy what happens; the policy only ranks the slots it has been told are evictable.
//
// Every policy keeps the evictable slots in an ordered set, so each hook and each victim query
// is O(log n): with thousands of slots and a 15,360-expert model a linear scan per access or per
// eviction would cost more than the bookkeeping is worth.
//
// Determinism: a policy's victim depends only on the sequence of calls it received (no clocks,
// no hashing order, no addresses). Ties are broken by the LOWEST SLOT ID, in every policy.
//
// Thread safety: none; like the cache, a policy has a single owner (the scheduler's strand).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "config/result.h"

namespace moestream::storage {

// (layer, expert) packed as layer << 32 | expert: one integer hashes and compares cheaply, and
// keys order by layer first, which keeps sorted dumps readable.
using expert_key = uint64_t;
constexpr expert_key make_expert_key(uint32_t layer, uint32_t expert) {
    return (static_cast<uint64_t>(layer) << 32) | expert;
}
constexpr uint32_t key_layer(expert_key k) { return static_cast<uint32_t>(k >> 32); }
constexpr uint32_t key_expert(expert_key k) { return static_cast<uint32_t>(k); }

using slot_id = uint32_t;

// The hooks expert_cache calls, in its order of events. A slot is "held" from on_load until
// on_free; it is evictable only between set_evictable(s, true) and set_evictable(s, false) or
// on_free, which the cache calls exactly when the slot is resident and unpinned.
class eviction_policy {
public:
    virtual ~eviction_policy() = default;

    virtual std::string_view name() const = 0;
    // Once, by the cache's constructor: n_slots slots, all free.
    virtual void attach(uint32_t n_slots) = 0;
    // `slot` now holds `key`, loading (not evictable). `now` is the latest access step the cache
    // has seen, so a prefetched key that nobody has touched yet ranks as recent, not as ancient.
    virtual void on_load(slot_id slot, expert_key key, uint64_t now) = 0;
    // An access to `key` at `step` (non-decreasing). `slot` holds it (loading or resident), or is
    // empty when the key is absent: LRU and LFU ignore those, Belady consumes its trace position.
    virtual void on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) = 0;
    virtual void set_evictable(slot_id slot, bool evictable) = 0;
    // The slot is empty again (evicted, erased or a failed load); its history is forgotten.
    virtual void on_free(slot_id slot) = 0;
    // The slot to evict among the evictable ones; empty when there is none.
    virtual std::optional<slot_id> victim() const = 0;
};

// The ordered set every policy ranks with: evictable slots sorted by (primary, secondary, slot),
// the smallest first. Ranks of non-evictable (loading, pinned) slots are kept up to date but
// stay out of the set, so a pinned slot never has to be skipped over.
class slot_ranking {
public:
    void resize(uint32_t n_slots);
    void set_rank(slot_id slot, uint64_t primary, uint64_t secondary);
    void set_evictable(slot_id slot, bool evictable);
    void clear(slot_id slot);  // not evictable, rank zero
    uint64_t primary(slot_id slot) const;
    std::optional<slot_id> first() const;

private:
    struct entry {
        uint64_t primary = 0;
        uint64_t secondary = 0;
        bool evictable = false;
    };
    std::vector<entry> slots_;
    std::set<std::tuple<uint64_t, uint64_t, slot_id>> order_;
};

// Policies that keep the evictable slots ranked and evict the first: they differ only in the
// rank an access gives.
class ranked_policy : public eviction_policy {
public:
    void attach(uint32_t n_slots) override { rank_.resize(n_slots); }
    void set_evictable(slot_id slot, bool e) override { rank_.set_evictable(slot, e); }
    void on_free(slot_id slot) override { rank_.clear(slot); }
    std::optional<slot_id> victim() const override { return rank_.first(); }

protected:
    slot_ranking rank_;
};

// Least recently used: victim = smallest last-access step. The default.
class lru_policy final : public ranked_policy {
public:
    std::string_view name() const override { return "lru"; }
    void on_load(slot_id slot, expert_key key, uint64_t now) override;
    void on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) override;
};

// LRU with a head start for the early layers: an expert of layer L ranks as if last accessed
// head_start * (n_layers - 1 - L) / (n_layers - 1) steps later than it was (layer 0: the whole
// head start, the last layer: none; layers past the last, the draft's, none). Why: a forward
// visits the layers in order and predicts each a few layers ahead, so a late layer's miss is
// read while the layers before it compute and mostly costs disk time the step had spare, while
// an early layer's miss is read when the disk is already busy with the step's first reads and
// stalls the step. Plain LRU gives every layer the same share of the tier; this one moves misses
// from the early layers to the late ones at the same capacity.
class layered_lru_policy final : public ranked_policy {
public:
    layered_lru_policy(uint32_t n_layers, uint64_t head_start);
    std::string_view name() const override { return "layered"; }
    void on_load(slot_id slot, expert_key key, uint64_t now) override;
    void on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) override;
    uint64_t bonus(uint32_t layer) const;

private:
    uint32_t n_layers_;
    uint64_t head_start_;
};

// Least frequently used, counting the accesses since the key took its slot (in-cache LFU: an
// evicted key starts again from zero, so the tables stay bounded by the slot count and old
// popularity cannot keep a key alive forever). Equal counts: least recently used first.
class lfu_policy final : public ranked_policy {
public:
    std::string_view name() const override { return "lfu"; }
    void on_load(slot_id slot, expert_key key, uint64_t now) override;
    void on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) override;
};

// Belady's MIN, for offline replay of a recorded trace: evicts the key whose next use is
// farthest away, keys never used again first (ties among those: lowest slot id). With demand
// loads that complete before the next access, it gives the fewest possible misses.
//
// Position: the policy holds a cursor into the trace, position(), the index of the next access
// it expects. Each on_access (that is, each cache touch/demand that records an access, hit or
// miss) must be for trace()[position()] and moves the cursor by one; a mismatch is a programmer
// error (the replay drifted). The step argument is not used: the cursor is the oracle's clock.
// advance() consumes the next access without going through the cache (an access served
// elsewhere, or one the replay skips) so the cursor stays aligned with the trace.
// A demand that has to wait for a slot records no access, so its retry consumes the position.
class belady_policy final : public eviction_policy {
public:
    explicit belady_policy(std::vector<expert_key> future);

    std::string_view name() const override { return "belady"; }
    void attach(uint32_t n_slots) override;
    void on_load(slot_id slot, expert_key key, uint64_t now) override;
    void on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) override;
    void set_evictable(slot_id slot, bool e) override { rank_.set_evictable(slot, e); }
    void on_free(slot_id slot) override;
    std::optional<slot_id> victim() const override { return rank_.first(); }

    void advance();
    uint64_t position() const { return pos_; }
    const std::vector<expert_key>& trace() const { return trace_; }
    // Trace index of the next access to `key` at or after position(); never_used if none.
    uint64_t next_use(expert_key key) const;
    static constexpr uint64_t never_used = UINT64_MAX;

private:
    void consume(expert_key key);
    void rank(slot_id slot, uint64_t next);

    std::vector<expert_key> trace_;
    std::vector<uint64_t> next_after_;                  // next occurrence of trace_[i] after i
    std::unordered_map<expert_key, uint64_t> upcoming_;  // per key: its next unconsumed occurrence
    std::unordered_map<expert_key, slot_id> holder_;     // held keys, for advance()
    std::vector<expert_key> slot_key_;
    std::vector<bool> slot_held_;
    uint64_t pos_ = 0;
    slot_ranking rank_;
};

std::unique_ptr<eviction_policy> make_lru_policy();
std::unique_ptr<eviction_policy> make_lfu_policy();
std::unique_ptr<eviction_policy> make_belady_policy(std::vector<expert_key> future);
std::unique_ptr<eviction_policy> make_layered_policy(uint32_t n_layers, uint64_t head_start);
// What the "layered" policy needs to know of the model: its layer count and the head start of
// its first layer, in steps (accesses' step numbers, see on_access).
struct layer_profile {
    uint32_t n_layers = 0;
    uint64_t head_start = 0;
};
// By configuration name: "lru", "lfu" or "layered" (Belady needs a trace, so it has no name here).
result<std::unique_ptr<eviction_policy>> make_policy(std::string_view name, layer_profile layers = {});

}  // namespace moestream::storage
