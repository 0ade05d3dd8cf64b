#include "server/stop_matcher.h"

#include <deque>

#include "config/assert.h"

namespace moestream::server {

namespace {

bool is_utf8_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

stop_matcher::stop_matcher(std::vector<std::string> stops) {
    for (auto& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
    nodes_.emplace_back();
    for (size_t i = 0; i < stops_.size(); ++i) {
        uint32_t n = k_root;
        for (char ch : stops_[i]) {
            const auto c = static_cast<unsigned char>(ch);
            uint32_t next = child(n, c);
            if (next == k_root) {
                next = static_cast<uint32_t>(nodes_.size());
                nodes_.push_back(node{{}, k_root, nodes_[n].depth + 1, -1});
                nodes_[n].children.emplace_back(c, next);
            }
            n = next;
        }
        // A duplicate keeps the first index; both spell the same string.
        if (nodes_[n].match < 0) nodes_[n].match = static_cast<int32_t>(i);
    }
    // Breadth first, so a node's failure target (shallower) is complete before the node.
    std::deque<uint32_t> queue;
    for (const auto& [c, n] : nodes_[k_root].children) queue.push_back(n);
    while (!queue.empty()) {
        const uint32_t n = queue.front();
        queue.pop_front();
        for (const auto& [c, next] : nodes_[n].children) {
            nodes_[next].fail = advance(nodes_[n].fail, c);
            // Its own stop string, if any, is longer than any ending at a suffix node.
            if (nodes_[next].match < 0) nodes_[next].match = nodes_[nodes_[next].fail].match;
            queue.push_back(next);
        }
    }
}

uint32_t stop_matcher::child(uint32_t n, unsigned char c) const {
    for (const auto& [cc, next] : nodes_[n].children)
        if (cc == c) return next;
    return k_root;
}

uint32_t stop_matcher::advance(uint32_t n, unsigned char c) const {
    while (true) {
        const uint32_t next = child(n, c);
        if (next != k_root || n == k_root) return next;
        n = nodes_[n].fail;
    }
}

std::string stop_matcher::push(std::string_view text) {
    MS_ASSERT_MSG(!finished_, "stop_matcher::push after finish");
    if (stopped_) return {};
    std::string out = std::move(withheld_);
    withheld_.clear();
    const size_t base = out.size();
    out.append(text);
    for (size_t i = 0; i < text.size(); ++i) {
        state_ = advance(state_, static_cast<unsigned char>(text[i]));
        const int32_t m = nodes_[state_].match;
        if (m < 0) continue;
        const std::string& stop = stops_[static_cast<size_t>(m)];
        const size_t end = base + i + 1;
        MS_ASSERT(stop.size() <= end);
        out.resize(end - stop.size());
        matched_ = stop;
        stopped_ = true;
        return out;
    }
    // The automaton's depth is exactly the text that may still grow into a stop string.
    const size_t keep = nodes_[state_].depth;
    MS_ASSERT(keep <= out.size());
    size_t cut = out.size() - keep;
    while (cut > 0 && cut < out.size() && is_utf8_continuation(out[cut])) --cut;
    withheld_.assign(out, cut, std::string::npos);
    out.resize(cut);
    return out;
}

std::string stop_matcher::finish() {
    MS_ASSERT_MSG(!finished_, "stop_matcher::finish called twice");
    finished_ = true;
    if (stopped_) return {};
    std::string out = std::move(withheld_);
    withheld_.clear();
    return out;
}

}  // namespace moestream::server
