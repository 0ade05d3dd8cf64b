// Bookkeeping of one expert tier (device slot cache or pinned host tier): a fixed number of
// equal-sized slots, allocated at start-up by someone else, and which expert each slot holds.
// No I/O, no threads, no memory beyond its tables: the scheduler's strand is the single owner,
// issues the reads/copies itself and reports back with finish_load.
//
// A slot is free, loading (reserved for a key whose bytes are in flight: not valid yet) or
// resident. Resident slots may be pinned (counted) while a computation uses them; only resident,
// unpinned slots are ever evicted, and the policy (eviction_policy.h) picks which one. Free slots
// are always used before anything is evicted, lowest slot id first.
//
// In-flight joining: a key has at most one slot, so a second demand for a key that is loading
// finds it with lookup()/demand() and JOINS that load (waits for the same finish_load) instead of
// starting another one. begin_load on a key that is already loading or resident is a programmer
// error. demand() is the usual entry point and makes this automatic: only its `load` answer asks
// the caller to issue I/O. This is what lets short-look-ahead prefetch pay for a read once (the
// llama.cpp fork this project measures against paid twice; see docs/streaming-anchors.md).
//
// Tier exclusivity is the caller's decision: when an expert moves up a tier it calls erase() on
// the lower tier, and when begin_load evicts a key it gets that key back to demote or drop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "config/result.h"
#include "storage/eviction_policy.h"

namespace moestream::storage {

enum class residency : uint8_t { absent, loading, resident };

struct lookup_result {
    residency state = residency::absent;
    slot_id slot = 0;  // meaningful unless absent; a loading slot's contents are not valid yet
};

struct load_grant {
    slot_id slot = 0;
    std::optional<expert_key> evicted;  // the key that held the slot, for the caller to demote
};

// What demand() asks the caller to do.
enum class demand_action : uint8_t {
    hit,   // resident in `slot`: use it
    join,  // loading into `slot` by an earlier demand or prefetch: wait for that load
    load,  // reserved `slot` (evicting `evicted`): read the expert, then finish_load
    wait,  // no slot: everything is pinned or loading. Retry after an unpin or a finish_load
};

struct demand_result {
    demand_action action = demand_action::wait;
    slot_id slot = 0;
    std::optional<expert_key> evicted;
};

enum class erase_outcome : uint8_t {
    erased,  // the slot is free
    absent,  // nothing to do: the tier did not hold the key
    busy,    // loading (I/O writes the slot) or pinned (a computation reads it): nothing done
};

struct cache_counters {
    uint64_t hits = 0;           // demands that found the key resident
    uint64_t joins = 0;          // demands that found it loading (no second load)
    uint64_t misses = 0;         // demands that found it absent and started a load
    uint64_t stalls = 0;         // demands answered `wait` (not accesses: the retry counts)
    uint64_t evictions = 0;      // resident keys displaced by begin_load
    uint64_t loads_started = 0;  // begin_load calls that got a slot (misses + prefetches)
    uint64_t loads_failed = 0;   // finish_load(key, false)
    uint64_t erased = 0;         // erase() that freed a slot
};

class expert_cache {
public:
    explicit expert_cache(uint32_t n_slots, std::unique_ptr<eviction_policy> policy = make_lru_policy());

    // Where the key is; no side effects (no counters, no policy update).
    lookup_result lookup(expert_key key) const;

    // One access at `step` (non-decreasing across calls): lookup, then begin_load if absent,
    // then touch, with the counters. A `wait` answer records no access, so a retried demand
    // is still one access for the policy (this matters to Belady's trace position).
    demand_result demand(expert_key key, uint64_t step);

    // Reserves a slot for an absent key: a free one, else the policy's victim among resident
    // unpinned slots (loading slots are never victims). Does not record an access, so a
    // prefetch is a plain begin_load. Error ("no slot available") when every slot is pinned or
    // loading: an expected condition; the caller waits for an unpin or a finish_load.
    result<load_grant> begin_load(expert_key key);

    // The load of `key` ended. ok: the slot becomes resident (evictable once unpinned). Failure:
    // the slot is freed and the key is absent again, so a later demand retries; pins taken while
    // it was loading are dropped with it (the waiters learn of the failure from the loader and
    // must not unpin).
    void finish_load(expert_key key, bool ok);

    // Pins are counted; a key pinned while loading stays pinned once resident. Pinning an absent
    // key or unpinning an unpinned one is a programmer error.
    void pin(expert_key key);
    void unpin(expert_key key);
    uint32_t pins(expert_key key) const;  // 0 when absent

    // Drops a resident, unpinned key without counting an eviction (exclusive tiers).
    [[nodiscard]] erase_outcome erase(expert_key key);

    // Records an access for the policy. `step` must not go backwards; an absent key is passed
    // on too (only Belady uses it: every access consumes its trace position).
    void touch(expert_key key, uint64_t step);

    const cache_counters& counters() const { return counters_; }
    uint32_t slot_count() const { return static_cast<uint32_t>(slots_.size()); }
    uint32_t resident_count() const { return resident_; }
    uint32_t loading_count() const { return loading_; }
    std::optional<expert_key> key_in(slot_id slot) const;  // held key (loading or resident)
    std::vector<expert_key> resident_keys() const;         // sorted ascending
    const eviction_policy& policy() const { return *policy_; }
    eviction_policy& policy() { return *policy_; }

private:
    struct slot {
        expert_key key = 0;
        residency state = residency::absent;  // absent = free
        uint32_t pins = 0;
    };
    slot_id held(expert_key key, const char* what) const;
    void release(slot_id id);

    std::vector<slot> slots_;
    std::unordered_map<expert_key, slot_id> index_;  // held keys only
    std::set<slot_id> free_;                         // ordered: lowest free slot first
    std::unique_ptr<eviction_policy> policy_;
    cache_counters counters_;
    uint32_t resident_ = 0;
    uint32_t loading_ = 0;
    uint64_t now_ = 0;  // latest access step
};

}  // namespace moestream::storage
