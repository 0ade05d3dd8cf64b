#include "storage/expert_cache.h"

#include <algorithm>
#include <string>

namespace moestream::storage {

expert_cache::expert_cache(uint32_t n_slots, std::unique_ptr<eviction_policy> policy)
    : slots_(static_cast<size_t>(n_slots)), policy_(std::move(policy)) {
    MS_ASSERT_MSG(n_slots > 0, "an expert tier needs at least one slot");
    MS_ASSERT(policy_ != nullptr);
    for (slot_id s = 0; s < n_slots; ++s) free_.insert(free_.end(), s);
    index_.reserve(static_cast<size_t>(n_slots));
    policy_->attach(n_slots);
}

lookup_result expert_cache::lookup(expert_key key) const {
    auto it = index_.find(key);
    if (it == index_.end()) return {};
    return {slots_[it->second].state, it->second};
}

slot_id expert_cache::held(expert_key key, const char* what) const {
    auto it = index_.find(key);
    MS_ASSERT_MSG(it != index_.end(), what);
    return it->second;
}

// Back to free: the policy forgets the slot and the next begin_load may take it.
void expert_cache::release(slot_id id) {
    slot& s = slots_[id];
    index_.erase(s.key);
    policy_->on_free(id);
    s = slot{};
    free_.insert(id);
}

demand_result expert_cache::demand(expert_key key, uint64_t step) {
    lookup_result found = lookup(key);
    demand_result out;
    switch (found.state) {
    case residency::resident:
        ++counters_.hits;
        out = {demand_action::hit, found.slot, std::nullopt};
        break;
    case residency::loading:
        ++counters_.joins;
        out = {demand_action::join, found.slot, std::nullopt};
        break;
    case residency::absent: {
        auto grant = begin_load(key);
        if (!grant.ok()) {
            ++counters_.stalls;
            return {};  // wait; no access recorded
        }
        ++counters_.misses;
        out = {demand_action::load, grant->slot, grant->evicted};
        break;
    }
    }
    // After begin_load, so the access lands on the new slot's history (LFU counts it, LRU
    // stamps it) and, for Belady, the victim was chosen before this access was consumed.
    touch(key, step);
    return out;
}

result<load_grant> expert_cache::begin_load(expert_key key) {
    MS_ASSERT_MSG(!index_.contains(key),
                  "begin_load of a key that is loading or resident: join it (see demand)");
    load_grant grant;
    if (!free_.empty()) {
        grant.slot = *free_.begin();
        free_.erase(free_.begin());
    } else {
        std::optional<slot_id> victim = policy_->victim();
        if (!victim) {
            std::string msg("no slot available: all ");
            msg += std::to_string(slots_.size());
            msg += " slots are pinned or loading";
            return make_error(std::move(msg));
        }
        slot& v = slots_[*victim];
        MS_ASSERT_MSG(v.state == residency::resident && v.pins == 0,
                      "the policy chose a slot that is not resident and unpinned");
        grant.evicted = v.key;
        --resident_;
        ++counters_.evictions;
        release(*victim);
        free_.erase(*victim);
        grant.slot = *victim;
    }
    slot& s = slots_[grant.slot];
    s.key = key;
    s.state = residency::loading;
    s.pins = 0;
    index_.emplace(key, grant.slot);
    ++loading_;
    ++counters_.loads_started;
    policy_->on_load(grant.slot, key, now_);
    return grant;
}

void expert_cache::finish_load(expert_key key, bool ok) {
    auto it = index_.find(key);
    MS_ASSERT_MSG(it != index_.end() && slots_[it->second].state == residency::loading,
                  "finish_load of a key that is not loading");
    slot_id id = it->second;
    --loading_;
    if (!ok) {
        ++counters_.loads_failed;
        release(id);
        return;
    }
    slot& s = slots_[id];
    s.state = residency::resident;
    ++resident_;
    if (s.pins == 0) policy_->set_evictable(id, true);
}

void expert_cache::pin(expert_key key) {
    slot_id id = held(key, "pin of a key that is neither loading nor resident");
    slot& s = slots_[id];
    MS_ASSERT(s.pins < UINT32_MAX);
    if (s.pins++ == 0 && s.state == residency::resident) policy_->set_evictable(id, false);
}

void expert_cache::unpin(expert_key key) {
    slot_id id = held(key, "unpin of a key that is neither loading nor resident");
    slot& s = slots_[id];
    MS_ASSERT_MSG(s.pins > 0, "unpin of a key that is not pinned");
    if (--s.pins == 0 && s.state == residency::resident) policy_->set_evictable(id, true);
}

uint32_t expert_cache::pins(expert_key key) const {
    auto it = index_.find(key);
    return it == index_.end() ? 0 : slots_[it->second].pins;
}

erase_outcome expert_cache::erase(expert_key key) {
    auto it = index_.find(key);
    if (it == index_.end()) return erase_outcome::absent;
    slot_id id = it->second;
    const slot& s = slots_[id];
    if (s.state != residency::resident || s.pins > 0) return erase_outcome::busy;
    --resident_;
    ++counters_.erased;
    release(id);
    return erase_outcome::erased;
}

void expert_cache::touch(expert_key key, uint64_t step) {
    MS_ASSERT_MSG(step >= now_, "access steps must not go backwards");
    now_ = step;
    auto it = index_.find(key);
    policy_->on_access(key, it == index_.end() ? std::nullopt : std::optional<slot_id>(it->second),
                       step);
}

std::optional<expert_key> expert_cache::key_in(slot_id id) const {
    MS_ASSERT(id < slots_.size());
    if (slots_[id].state == residency::absent) return std::nullopt;
    return slots_[id].key;
}

std::vector<expert_key> expert_cache::resident_keys() const {
    std::vector<expert_key> keys;
    keys.reserve(resident_);
    for (const slot& s : slots_)
        if (s.state == residency::resident) keys.push_back(s.key);
    std::sort(keys.begin(), keys.end());
    return keys;
}

}  // namespace moestream::storage
