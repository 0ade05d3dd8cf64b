#include "server/responses_store.h"

#include <algorithm>

#include "config/assert.h"

namespace moestream::server {

void response_store::put(stored_response r) {
    if (capacity_ == 0) return;
    auto kept = std::make_shared<const stored_response>(std::move(r));
    std::lock_guard lock(mu_);
    auto [at, inserted] = by_id_.try_emplace(kept->id, kept);
    if (!inserted) {
        at->second = kept;
        std::erase(order_, kept->id);
    }
    order_.push_back(kept->id);
    while (order_.size() > capacity_) {
        by_id_.erase(order_.front());
        order_.pop_front();
    }
    MS_ASSERT(order_.size() == by_id_.size());
}

std::shared_ptr<const stored_response> response_store::find(std::string_view id) const {
    std::lock_guard lock(mu_);
    auto at = by_id_.find(std::string(id));
    return at == by_id_.end() ? nullptr : at->second;
}

size_t response_store::size() const {
    std::lock_guard lock(mu_);
    return by_id_.size();
}

}  // namespace moestream::server
