// The responses a client may continue with previous_response_id: the last `capacity` responses
// created with store: true (server.response_store_max), oldest dropped first. Each keeps its
// whole conversation as items (the chain of inputs and outputs, without instructions), so a
// continuation needs nothing else; its size is bounded by the context, since a conversation that
// does not fit it is refused before anything is stored. Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/responses_request.h"

namespace moestream::server {

struct stored_response {
    std::string id;
    std::vector<conversation_item> conversation;
};

class response_store {
  public:
    explicit response_store(size_t capacity) : capacity_(capacity) {}

    // Keeps `r` (nothing when the capacity is 0), dropping the oldest beyond the capacity. An id
    // already kept is replaced.
    void put(stored_response r);
    // The response with this id, or null (never stored, dropped, or stored without store: true).
    std::shared_ptr<const stored_response> find(std::string_view id) const;

    size_t size() const;
    size_t capacity() const { return capacity_; }

  private:
    const size_t capacity_;
    mutable std::mutex mu_;
    std::deque<std::string> order_;  // ids, oldest first
    std::unordered_map<std::string, std::shared_ptr<const stored_response>> by_id_;
};

}  // namespace moestream::server
