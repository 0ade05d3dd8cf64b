#include "scheduler/engine_prefix.h"

#include <algorithm>

#include "config/assert.h"

namespace moestream {

prefix_pool::prefix_pool(const dsv41::model& m, prefix_pool_options opts)
    : opts_(opts), total_(opts.running + opts.cached) {
    MS_ASSERT(opts_.running >= 1 && opts_.cached >= 0 && opts_.context >= 1 && opts_.rollback >= 0);
    free_.reserve(size_t(total_));
    kept_.reserve(size_t(opts_.cached));
    for (int64_t i = 0; i < total_; ++i)
        free_.push_back(m.new_sequence(opts_.context, opts_.rollback));
}

int64_t prefix_pool::usable(const dsv41::sequence_state& held, std::span<const int32_t> prompt) const {
    const auto tokens = held.tokens();
    const auto [h, p] = std::mismatch(tokens.begin(), tokens.end(), prompt.begin(), prompt.end());
    (void)p;
    const int64_t common = int64_t(h - tokens.begin());
    const int64_t n = std::min<int64_t>(common, int64_t(prompt.size()) - 1);
    if (n <= 0) return 0;
    if (!held.can_truncate_to(n)) return 0;  // the rings no longer hold what lies there
    return n;
}

bool prefix_pool::covers(const dsv41::sequence_state& held, std::span<const int32_t> tokens) const {
    return held.size() >= int64_t(tokens.size()) && held.can_truncate_to(int64_t(tokens.size())) &&
           std::equal(tokens.begin(), tokens.end(), held.tokens().begin());
}

void prefix_pool::check_counts() const {
    const int64_t kept = int64_t(kept_.size()), free = int64_t(free_.size());
    MS_ASSERT(kept <= opts_.cached && free + kept <= total_);
    MS_ASSERT_MSG(total_ - free - kept <= opts_.running, "no more states out than running sequences");
}

std::unique_ptr<dsv41::sequence_state> prefix_pool::take_free() {
    MS_ASSERT_MSG(!free_.empty(), "a free state is always left for an admission (running < max)");
    auto s = std::move(free_.back());
    free_.pop_back();
    MS_ASSERT(s->size() == 0);
    return s;
}

std::unique_ptr<dsv41::sequence_state> prefix_pool::copy_truncated(const dsv41::sequence_state& from, int64_t n) {
    MS_ASSERT(from.can_truncate_to(n));
    auto copy = take_free();
    MS_ASSERT(copy->capacity() == from.capacity());
    copy->copy_from(from);  // same shapes: the memory is reused, nothing is allocated
    if (copy->size() > n) {
        const status st = copy->truncate(n);
        MS_ASSERT_MSG(st.ok(), "can_truncate_to(n)");
    }
    return copy;
}

void prefix_pool::release(std::unique_ptr<dsv41::sequence_state> s) {
    const status st = s->truncate(0);
    MS_ASSERT(st.ok());
    free_.push_back(std::move(s));
}

void prefix_pool::make_room() {
    if (int64_t(kept_.size()) < opts_.cached) return;
    auto lru = std::min_element(kept_.begin(), kept_.end(),
                                [](const kept_state& a, const kept_state& b) { return a.used < b.used; });
    release(std::move(lru->state));
    kept_.erase(lru);
}

uint64_t prefix_pool::add_kept(std::unique_ptr<dsv41::sequence_state> s) {
    MS_ASSERT(opts_.cached > 0 && s->size() > 0);
    make_room();
    kept_.push_back({std::move(s), ++clock_, ++next_id_});
    return next_id_;
}

prefix_pool::grant prefix_pool::acquire(std::span<const int32_t> prompt, bool reuse,
                                        std::span<const dsv41::sequence_state* const> running) {
    MS_ASSERT(!prompt.empty());
    MS_ASSERT(int64_t(running.size()) < opts_.running);
    MS_ASSERT(int64_t(free_.size() + kept_.size() + running.size()) <= total_);
    grant g;
    if (!reuse) {
        g.state = take_free();
        return g;
    }
    // Taking a kept state that is entirely a prefix of the prompt costs nothing; copying a state
    // costs a pass over its memory, which pays once the prefix would take longer to process.
    const auto pays = [&](int64_t n, bool in_place) {
        return n > 0 && (in_place || n >= opts_.min_copy || 2 * n > int64_t(prompt.size()));
    };
    struct choice {
        const dsv41::sequence_state* from = nullptr;
        int64_t kept_index = -1;  // from the pool, else a running sequence
        int64_t n = 0;
        bool in_place = false;
    } best;
    const auto consider = [&](const dsv41::sequence_state& s, int64_t kept_index) {
        const int64_t n = usable(s, prompt);
        const bool in_place = kept_index >= 0 && n == s.size();
        if (!pays(n, in_place)) return;
        // Longest first; at equal length, no copy rather than a copy.
        if (n > best.n || (n == best.n && in_place && !best.in_place)) best = {&s, kept_index, n, in_place};
    };
    for (size_t i = 0; i < kept_.size(); ++i) consider(*kept_[i].state, int64_t(i));
    for (const auto* s : running) consider(*s, -1);
    if (best.n == 0) {
        g.state = take_free();
        return g;
    }
    g.reused = best.n;
    if (best.in_place) {
        // The new sequence extends everything this state holds: it supersedes the kept one.
        g.state = std::move(kept_[size_t(best.kept_index)].state);
        kept_.erase(kept_.begin() + best.kept_index);
    } else {
        g.state = copy_truncated(*best.from, best.n);  // usable() checked can_truncate_to
        g.copied = true;
        if (best.kept_index >= 0) kept_[size_t(best.kept_index)].used = ++clock_;
    }
    MS_ASSERT(g.state->size() == g.reused);
    MS_ASSERT(std::equal(prompt.begin(), prompt.begin() + g.reused, g.state->tokens().begin()));
    check_counts();
    return g;
}

void prefix_pool::give_back(std::unique_ptr<dsv41::sequence_state> state, bool keep, uint64_t checkpoint) {
    MS_ASSERT(state != nullptr);
    if (!keep || state->size() == 0 || opts_.cached == 0) {
        release(std::move(state));
    } else {
        // A final state that covers its prompt's checkpoint serves, from a truncated copy, every
        // prompt that extends that prompt (and those that part from it less than rollback minus
        // what it generated before its end): one conversation need not hold two places.
        const auto cp =
            std::find_if(kept_.begin(), kept_.end(), [&](const kept_state& k) { return k.id == checkpoint; });
        if (checkpoint != 0 && cp != kept_.end() && covers(*state, cp->state->tokens())) {
            release(std::move(cp->state));
            kept_.erase(cp);
        }
        add_kept(std::move(state));
    }
    check_counts();
}

uint64_t prefix_pool::keep_prefix(const dsv41::sequence_state& running, int64_t n) {
    MS_ASSERT(n >= 0 && running.can_truncate_to(n));
    if (opts_.cached == 0 || n == 0) return 0;
    const auto prefix = running.tokens().first(size_t(n));
    for (auto& k : kept_)
        if (covers(*k.state, prefix)) {
            k.used = ++clock_;
            return 0;
        }
    // Evicting first leaves a free state even when every running sequence holds one (see
    // check_counts): the copy never takes the place of an admission.
    make_room();
    const uint64_t id = add_kept(copy_truncated(running, n));
    check_counts();
    return id;
}

}  // namespace moestream
