// Delivers a generation's token events to its channel in order, keeping any that try_send refused
// and sending them again later (engine strand only).
//
// Why refusals happen although every channel holds all of its request's events: Boost 1.81's
// channel (asio 1.24) leaves a buffered channel in its "block" send state when a receive on it is
// cancelled through per-operation cancellation (cancel_by_key sets `block` where it should set
// `buffer`; asio issue #1241, fixed in later asio). A client stream that races its receive
// against a keep-alive timer cancels receives routinely, so the next try_send returned false and
// that token vanished from the stream while usage still counted it. The receiver's next receive
// repairs the state, so what was refused goes out at the engine's next step.
#pragma once

#include <memory>
#include <vector>

#include "scheduler/engine.h"

namespace moestream {

class event_outbox {
  public:
    // Sends now, or queues behind what this generation still has queued.
    void send(const std::shared_ptr<generation>& gen, token_event e);
    // Sends what is queued, in order; drops the queue of a generation that nobody can receive
    // from any more (this outbox holds its last reference, or its channel is closed).
    void flush();
    bool empty() const { return queued_.empty(); }
    size_t queued_events() const;

  private:
    struct queue {
        std::shared_ptr<generation> gen;
        std::vector<token_event> events;  // oldest first
        size_t next = 0;
    };
    std::vector<queue> queued_;
};

}  // namespace moestream
