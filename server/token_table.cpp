#include "server/token_table.h"

#include <limits>
#include <mutex>

#include "config/assert.h"
#include "server/json_constraint.h"

namespace moestream::server {

namespace {

constexpr char32_t k_marker_bar = U'\uFF5C';

// Characters a string-text token adds to a string (an escape is one, a surrogate pair too).
uint32_t characters(std::string_view text, const json_automaton& in_string) {
    json_automaton a = in_string;
    uint32_t n = 0;
    for (char c : text) {
        if (a.in_string_text()) ++n;
        const bool ok = a.step(uint8_t(c));
        MS_ASSERT(ok);
    }
    return n;
}

}  // namespace

token_table::token_table(const tokenizer& tok) {
    const int32_t n = tok.vocab_size();
    const auto& types = tok.data().token_types;
    const bool typed = types.size() == size_t(n);
    offsets_.reserve(size_t(n) + 1);
    offsets_.push_back(0);
    ordinary_.resize(size_t(n));
    std::vector<int32_t> ordinary_ids, with_angle, added;
    bool single[256] = {};
    for (int32_t id = 0; id < n; ++id) {
        const std::string b = tok.token_bytes(id);
        bytes_ += b;
        MS_ASSERT_MSG(bytes_.size() <= std::numeric_limits<uint32_t>::max(),
                      "token_table: vocabulary too large");
        offsets_.push_back(uint32_t(bytes_.size()));
        // Added tokens (end of sequence, markers, padding) are not text the model writes as
        // such; an untyped vocabulary still names them through its added-token lookup.
        const bool normal =
            typed ? types[size_t(id)] == int32_t(token_type::normal) : tok.find_added(b) != id;
        if (b.empty()) continue;
        if (!normal) {
            added.push_back(id);
            continue;
        }
        ordinary_[size_t(id)] = 1;
        ordinary_ids.push_back(id);
        if (b.find('<') != std::string::npos) with_angle.push_back(id);
        max_length_ = std::max(max_length_, b.size());
        if (b.size() == 1) single[uint8_t(b[0])] = true;
    }
    every_byte_ = std::all_of(std::begin(single), std::end(single), [](bool x) { return x; });
    // String text, found by the automaton itself: what leaves a string's text as it was.
    json_limits probe_limits;
    probe_limits.object_only = false;
    probe_limits.banned_char = k_marker_bar;
    json_automaton in_string(probe_limits);
    MS_ASSERT(in_string.feed("\"") && in_string.in_string_text());
    std::vector<int32_t> other;
    std::vector<std::pair<uint32_t, int32_t>> plain, escaped;  // (characters, id)
    for (int32_t id : ordinary_ids) {
        json_automaton probe = in_string;
        const std::string_view b = bytes(id);
        if (!probe.feed(b) || !probe.in_string_text()) {
            other.push_back(id);
            continue;
        }
        const uint32_t chars = characters(b, in_string);
        (b.find('\\') == std::string_view::npos ? plain : escaped).push_back({chars, id});
    }
    // Each kind by characters, so "at most k characters" is a prefix of it.
    auto lay_out = [&](std::vector<std::pair<uint32_t, int32_t>>& list, std::vector<uint32_t>& upto) {
        std::sort(list.begin(), list.end());
        const uint32_t most = list.empty() ? 0 : list.back().first;
        upto.assign(size_t(most) + 1, 0);
        size_t i = 0;
        for (uint32_t k = 0; k <= most; ++k) {
            while (i < list.size() && list[i].first <= k) ++i;
            upto[k] = uint32_t(i);
        }
        for (const auto& [chars, id] : list) string_text_.push_back(id);
    };
    lay_out(plain, plain_upto_);
    plain_ = string_text_.size();
    lay_out(escaped, escaped_upto_);
    text_mask_.assign(size_t(n), 0);
    for (int32_t id : string_text_) text_mask_[size_t(id)] = 1;
    auto sort = [&](std::vector<int32_t> ids) {
        std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
            const auto ba = bytes(a), bb = bytes(b);
            return ba != bb ? ba < bb : a < b;
        });
        sorted_tokens out;
        out.shared.resize(ids.size());
        for (size_t i = 1; i < ids.size(); ++i) {
            const auto a = bytes(ids[i - 1]), b = bytes(ids[i]);
            const size_t m = std::min(a.size(), b.size());
            size_t k = 0;
            while (k < m && a[k] == b[k]) ++k;
            out.shared[i] = uint32_t(k);
        }
        out.ids = std::move(ids);
        return out;
    };
    all_ = sort(std::move(ordinary_ids));
    not_text_ = sort(std::move(other));
    with_angle_ = sort(std::move(with_angle));
    added_ = sort(std::move(added));
}

bool token_table::describes(const tokenizer& tok) const {
    if (tok.vocab_size() != vocab()) return false;
    const int32_t step = std::max(1, vocab() / 97);
    for (int32_t id = 0; id < vocab(); id += step)
        if (tok.token_bytes(id) != bytes(id)) return false;
    return vocab() == 0 || tok.token_bytes(vocab() - 1) == bytes(vocab() - 1);
}

std::shared_ptr<const token_table> token_table::of(const tokenizer& tok) {
    struct entry {
        const tokenizer* key;
        std::shared_ptr<const token_table> table;
    };
    constexpr size_t k_kept = 4;
    static std::mutex mu;
    static std::vector<entry> kept;  // most recently used last
    // Built under the lock: concurrent first requests wait for one build instead of each
    // making their own.
    std::lock_guard lock(mu);
    for (size_t i = 0; i < kept.size(); ++i) {
        if (kept[i].key != &tok) continue;
        entry e = kept[i];
        kept.erase(kept.begin() + std::ptrdiff_t(i));
        // Another tokenizer may live at a freed one's address.
        if (!e.table->describes(tok)) break;
        kept.push_back(e);
        return e.table;
    }
    auto table = std::make_shared<const token_table>(tok);
    if (kept.size() == k_kept) kept.erase(kept.begin());
    kept.push_back({&tok, table});
    return table;
}

}  // namespace moestream::server
