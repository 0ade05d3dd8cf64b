#include "scheduler/event_outbox.h"

#include <algorithm>

namespace moestream {

void event_outbox::send(const std::shared_ptr<generation>& gen, token_event e) {
    auto it = std::find_if(queued_.begin(), queued_.end(), [&](const queue& q) { return q.gen == gen; });
    if (it == queued_.end()) {
        token_event copy = e;  // try_send may or may not have consumed its arguments when it refuses
        if (gen->events().try_send(boost::system::error_code{}, std::move(copy))) return;
        queued_.push_back({gen, {}, 0});
        it = queued_.end() - 1;
    }
    it->events.push_back(std::move(e));
}

void event_outbox::flush() {
    for (size_t i = 0; i < queued_.size();) {
        queue& q = queued_[i];
        while (q.next < q.events.size()) {
            token_event copy = q.events[q.next];
            if (!q.gen->events().try_send(boost::system::error_code{}, std::move(copy))) break;
            ++q.next;
        }
        const bool delivered = q.next == q.events.size();
        const bool unreachable = q.gen.use_count() == 1 || !q.gen->events().is_open();
        if (delivered || unreachable) {
            queued_.erase(queued_.begin() + std::ptrdiff_t(i));
        } else {
            ++i;
        }
    }
}

size_t event_outbox::queued_events() const {
    size_t n = 0;
    for (const auto& q : queued_) n += q.events.size() - q.next;
    return n;
}

}  // namespace moestream
