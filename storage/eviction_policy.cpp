#include "storage/eviction_policy.h"

#include <string>

namespace moestream::storage {

// ---- slot_ranking ----

void slot_ranking::resize(uint32_t n_slots) {
    slots_.assign(static_cast<size_t>(n_slots), entry{});
    order_.clear();
}

void slot_ranking::set_rank(slot_id slot, uint64_t primary, uint64_t secondary) {
    MS_ASSERT(slot < slots_.size());
    entry& e = slots_[slot];
    if (e.evictable) {
        order_.erase({e.primary, e.secondary, slot});
        order_.insert({primary, secondary, slot});
    }
    e.primary = primary;
    e.secondary = secondary;
}

void slot_ranking::set_evictable(slot_id slot, bool evictable) {
    MS_ASSERT(slot < slots_.size());
    entry& e = slots_[slot];
    MS_ASSERT_MSG(e.evictable != evictable, "slot evictability set twice to the same value");
    e.evictable = evictable;
    if (evictable)
        order_.insert({e.primary, e.secondary, slot});
    else
        order_.erase({e.primary, e.secondary, slot});
}

void slot_ranking::clear(slot_id slot) {
    MS_ASSERT(slot < slots_.size());
    entry& e = slots_[slot];
    if (e.evictable) order_.erase({e.primary, e.secondary, slot});
    e = entry{};
}

uint64_t slot_ranking::primary(slot_id slot) const {
    MS_ASSERT(slot < slots_.size());
    return slots_[slot].primary;
}

std::optional<slot_id> slot_ranking::first() const {
    if (order_.empty()) return std::nullopt;
    return std::get<2>(*order_.begin());
}

// ---- LRU: rank (last access step, -) ----

void lru_policy::on_load(slot_id slot, expert_key, uint64_t now) { rank_.set_rank(slot, now, 0); }

void lru_policy::on_access(expert_key, std::optional<slot_id> slot, uint64_t step) {
    if (slot) rank_.set_rank(*slot, step, 0);
}

// ---- layered LRU: rank (last access step + the layer's head start, -) ----

layered_lru_policy::layered_lru_policy(uint32_t n_layers, uint64_t head_start)
    : n_layers_(n_layers), head_start_(head_start) {
    MS_ASSERT(n_layers >= 1);
}

uint64_t layered_lru_policy::bonus(uint32_t layer) const {
    if (layer >= n_layers_) return 0;
    if (n_layers_ == 1) return head_start_;
    return head_start_ * uint64_t(n_layers_ - 1 - layer) / uint64_t(n_layers_ - 1);
}

void layered_lru_policy::on_load(slot_id slot, expert_key key, uint64_t now) {
    rank_.set_rank(slot, now + bonus(key_layer(key)), 0);
}

void layered_lru_policy::on_access(expert_key key, std::optional<slot_id> slot, uint64_t step) {
    if (slot) rank_.set_rank(*slot, step + bonus(key_layer(key)), 0);
}

// ---- LFU: rank (accesses since loaded, last access step) ----

void lfu_policy::on_load(slot_id slot, expert_key, uint64_t now) { rank_.set_rank(slot, 0, now); }

void lfu_policy::on_access(expert_key, std::optional<slot_id> slot, uint64_t step) {
    if (slot) rank_.set_rank(*slot, rank_.primary(*slot) + 1, step);
}

// ---- Belady: rank (UINT64_MAX - next use, -) ----

belady_policy::belady_policy(std::vector<expert_key> future) : trace_(std::move(future)) {
    // One backward pass: next_after_[i] links each access to the next one of the same key, and
    // what is left in upcoming_ is every key's first occurrence. Afterwards a key's next use is
    // an O(1) update per consumed access instead of a search.
    next_after_.assign(trace_.size(), never_used);
    for (size_t i = trace_.size(); i-- > 0;) {
        auto [it, fresh] = upcoming_.try_emplace(trace_[i], static_cast<uint64_t>(i));
        if (!fresh) {
            next_after_[i] = it->second;
            it->second = static_cast<uint64_t>(i);
        }
    }
}

void belady_policy::attach(uint32_t n_slots) {
    rank_.resize(n_slots);
    slot_key_.assign(static_cast<size_t>(n_slots), 0);
    slot_held_.assign(static_cast<size_t>(n_slots), false);
    holder_.clear();
}

uint64_t belady_policy::next_use(expert_key key) const {
    auto it = upcoming_.find(key);
    return it == upcoming_.end() ? never_used : it->second;
}

// Smaller ranks are evicted first, so the farthest next use maps to the smallest primary; never
// used (UINT64_MAX) maps to 0, the front, with the slot id breaking ties among those.
void belady_policy::rank(slot_id slot, uint64_t next) { rank_.set_rank(slot, never_used - next, 0); }

void belady_policy::on_load(slot_id slot, expert_key key, uint64_t) {
    MS_ASSERT(slot < slot_held_.size() && !slot_held_[slot]);
    slot_held_[slot] = true;
    slot_key_[slot] = key;
    holder_[key] = slot;
    rank(slot, next_use(key));
}

void belady_policy::on_free(slot_id slot) {
    MS_ASSERT(slot < slot_held_.size() && slot_held_[slot]);
    slot_held_[slot] = false;
    holder_.erase(slot_key_[slot]);
    rank_.clear(slot);
}

void belady_policy::consume(expert_key key) {
    MS_ASSERT_MSG(pos_ < trace_.size(), "access beyond the end of the Belady trace");
    MS_ASSERT_MSG(trace_[pos_] == key, "access does not match the Belady trace at position()");
    uint64_t next = next_after_[pos_];
    if (next == never_used)
        upcoming_.erase(key);  // keeps the map to the keys still to come
    else
        upcoming_[key] = next;
    ++pos_;
    if (auto it = holder_.find(key); it != holder_.end()) rank(it->second, next);
}

void belady_policy::on_access(expert_key key, std::optional<slot_id> slot, uint64_t) {
    MS_ASSERT(!slot || (*slot < slot_held_.size() && slot_held_[*slot] && slot_key_[*slot] == key));
    consume(key);
}

void belady_policy::advance() {
    MS_ASSERT_MSG(pos_ < trace_.size(), "advance() beyond the end of the Belady trace");
    consume(trace_[pos_]);
}

// ---- factories ----

std::unique_ptr<eviction_policy> make_lru_policy() { return std::make_unique<lru_policy>(); }
std::unique_ptr<eviction_policy> make_lfu_policy() { return std::make_unique<lfu_policy>(); }
std::unique_ptr<eviction_policy> make_belady_policy(std::vector<expert_key> future) {
    return std::make_unique<belady_policy>(std::move(future));
}

std::unique_ptr<eviction_policy> make_layered_policy(uint32_t n_layers, uint64_t head_start) {
    return std::make_unique<layered_lru_policy>(n_layers, head_start);
}

result<std::unique_ptr<eviction_policy>> make_policy(std::string_view name, layer_profile layers) {
    if (name == "lru") return make_lru_policy();
    if (name == "lfu") return make_lfu_policy();
    if (name == "layered") {
        if (layers.n_layers == 0) return make_error("the layered eviction policy needs the model's layer count");
        return make_layered_policy(layers.n_layers, layers.head_start);
    }
    std::string msg("unknown eviction policy '");
    msg += name;
    msg += "' (expected lru, lfu or layered; belady is built from a recorded trace)";
    return make_error(std::move(msg));
}

}  // namespace moestream::storage
