// A WebSocket connection's send queue, bounded in bytes. The engine never waits on a socket: each
// request's output is queued here at once, and the connection's one writer drains the queue at the
// client's pace. When the client reads slower than tokens arrive:
//   - over the soft limit, a request's new delta is merged into its last queued delta when that
//     changes nothing the client reconstructs (can_merge): fewer, larger messages, no text lost;
//   - over the hard limit the connection is a slow consumer: the caller cancels its requests and
//     closes it (push reports it).
// Sequence numbers are given when a delta is queued; a merged delta keeps the number of the
// delta it joined, so every request's numbers stay gap-free whatever was merged.
// Not thread-safe: one connection's strand owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>

#include "server/websocket_protocol.h"

namespace moestream::server {

// The outbox's view of one request: its id, next sequence number and where its last queued
// message is (the only place a new delta may be merged into).
struct ws_stream_state {
    std::string id;
    uint64_t next_seq = 0;
    uint64_t last_position = std::numeric_limits<uint64_t>::max();  // queue position of its last message
    bool last_is_delta = false;
};

class ws_outbox {
  public:
    ws_outbox(size_t soft_bytes, size_t hard_bytes) : soft_(soft_bytes), hard_(hard_bytes) {}

    // Queue a finished message (of `owner` when it concerns a request). False when the queue is
    // now over the hard limit.
    [[nodiscard]] bool push_text(std::string json, ws_stream_state* owner = nullptr);
    // Queue a delta of `owner`, merged into its last queued delta when over the soft limit.
    [[nodiscard]] bool push_delta(ws_stream_state& owner, ws_delta d);

    bool empty() const { return queue_.empty(); }
    // The next message's JSON text, removed from the queue. Requires !empty().
    std::string pop();
    // Drops everything queued (slow consumer: nothing more will be written).
    void clear();

    size_t bytes() const { return bytes_; }
    size_t size() const { return queue_.size(); }
    uint64_t merged() const { return merged_; }  // deltas merged into an earlier one, in total

  private:
    struct entry {
        std::string text;  // finished messages
        bool is_delta = false;
        std::string id;  // deltas: the request id, sequence number and content
        uint64_t seq = 0;
        ws_delta delta;
        size_t cost = 0;  // bytes accounted for it
    };
    static size_t delta_cost(const std::string& id, const ws_delta& d);
    bool over_hard() const { return bytes_ > hard_; }

    size_t soft_, hard_;
    std::deque<entry> queue_;
    uint64_t popped_ = 0;  // queue position of queue_.front()
    size_t bytes_ = 0;
    uint64_t merged_ = 0;
};

}  // namespace moestream::server
