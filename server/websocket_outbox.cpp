#include "server/websocket_outbox.h"

#include "config/assert.h"

namespace moestream::server {

// An upper estimate of the delta's JSON text: the fixed members plus its strings (escaping rarely
// adds much to model text) and up to 11 bytes per token id.
size_t ws_outbox::delta_cost(const std::string& id, const ws_delta& d) {
    size_t n = 64 + id.size() + d.reasoning.size() + d.content.size() + 12 * d.token_ids.size();
    if (d.call) n += 48 + d.call->id.size() + d.call->name.size() + d.call->arguments.size();
    return n;
}

bool ws_outbox::push_text(std::string json, ws_stream_state* owner) {
    entry e;
    e.cost = json.size();
    e.text = std::move(json);
    bytes_ += e.cost;
    if (owner) {
        owner->last_position = popped_ + queue_.size();
        owner->last_is_delta = false;
    }
    queue_.push_back(std::move(e));
    return !over_hard();
}

bool ws_outbox::push_delta(ws_stream_state& owner, ws_delta d) {
    // The request's last message is still queued (not being written) and is a delta: merge there.
    if (bytes_ > soft_ && owner.last_is_delta && owner.last_position >= popped_) {
        MS_ASSERT(owner.last_position - popped_ < queue_.size());
        entry& last = queue_[size_t(owner.last_position - popped_)];
        MS_ASSERT(last.is_delta && last.id == owner.id);
        if (can_merge(last.delta, d)) {
            bytes_ -= last.cost;
            merge_into(last.delta, std::move(d));
            last.cost = delta_cost(last.id, last.delta);
            bytes_ += last.cost;
            ++merged_;
            return !over_hard();
        }
    }
    entry e;
    e.is_delta = true;
    e.id = owner.id;
    e.seq = owner.next_seq++;
    e.delta = std::move(d);
    e.cost = delta_cost(e.id, e.delta);
    bytes_ += e.cost;
    owner.last_position = popped_ + queue_.size();
    owner.last_is_delta = true;
    queue_.push_back(std::move(e));
    return !over_hard();
}

std::string ws_outbox::pop() {
    MS_ASSERT(!queue_.empty());
    entry e = std::move(queue_.front());
    queue_.pop_front();
    ++popped_;
    bytes_ -= e.cost;
    return e.is_delta ? delta_json(e.id, e.seq, e.delta) : std::move(e.text);
}

void ws_outbox::clear() {
    popped_ += queue_.size();
    queue_.clear();
    bytes_ = 0;
}

}  // namespace moestream::server
