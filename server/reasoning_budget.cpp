#include "server/reasoning_budget.h"

#include <algorithm>

#include "config/assert.h"

namespace moestream::server {

namespace {

constexpr size_t k_len = reasoning_budget::k_close.size();

// The longest prefix of "</think>" that `text` ends with, given it ended with `m` bytes of it
// before `b` (brute force over at most eight bytes: the marker is short).
size_t advance(size_t m, char b) {
    const std::string_view p = reasoning_budget::k_close;
    if (m < k_len && p[m] == b) return m + 1;
    // The text now ends with p[0..m) + b; find its longest suffix that is a prefix of p.
    for (size_t len = std::min(m, k_len - 1); len > 0; --len) {
        // The suffix of length len: p[m - len + 1 .. m) + b.
        const std::string_view head = p.substr(m + 1 - len, len - 1);
        if (p.substr(0, len - 1) == head && p[len - 1] == b) return len;
    }
    return 0;
}

}  // namespace

std::unique_ptr<reasoning_budget> reasoning_budget::make(std::shared_ptr<const token_table> table,
                                                         int32_t close_token, int64_t budget) {
    MS_ASSERT(table && budget >= 1);
    closing_tokens next;
    next.fill(-1);
    if (close_token >= 0) {
        MS_ASSERT(close_token < table->vocab() && table->bytes(close_token) == k_close);
        // The marker's own token closes from any partial match (the partial stays reasoning text).
        next.fill(close_token);
        return std::unique_ptr<reasoning_budget>(new reasoning_budget(std::move(table), next, 1, budget));
    }
    // Without it: for every partial match, the longest ordinary token spelling what follows.
    std::array<size_t, k_len> best_len{};
    for (int32_t id = 0; id < table->vocab(); ++id) {
        if (!table->ordinary(id)) continue;
        const std::string_view b = table->bytes(id);
        if (b.empty() || b.size() > k_len) continue;
        for (size_t m = 0; m + b.size() <= k_len; ++m) {
            if (k_close.substr(m, b.size()) == b && b.size() > best_len[m]) {
                best_len[m] = b.size();
                next[m] = id;
            }
        }
    }
    // Tokens the closing takes from each partial match, following the chosen tokens.
    int64_t worst = 0;
    for (size_t m = 0; m < k_len; ++m) {
        int64_t steps = 0;
        for (size_t at = m; at < k_len; at += best_len[at]) {
            if (next[at] < 0) return nullptr;
            ++steps;
        }
        worst = std::max(worst, steps);
    }
    return std::unique_ptr<reasoning_budget>(new reasoning_budget(std::move(table), next, worst, budget));
}

reasoning_budget::reasoning_budget(std::shared_ptr<const token_table> table, closing_tokens next,
                                   int64_t worst, int64_t budget)
    : table_(std::move(table)), next_(next), worst_(worst), budget_(budget) {}

bool reasoning_budget::closing() const {
    if (closed_) return false;
    // A free token is allowed only if the closing still fits after it, from whatever partial
    // match it leaves.
    return budget_ - used_ - 1 < worst_;
}

void reasoning_budget::allowed(std::span<uint8_t> mask) const {
    MS_ASSERT(int64_t(mask.size()) == table_->vocab());
    if (!closing()) {
        std::fill(mask.begin(), mask.end(), uint8_t(1));
        return;
    }
    std::fill(mask.begin(), mask.end(), uint8_t(0));
    mask[size_t(next_[matched_])] = 1;
}

void reasoning_budget::feed(std::string_view bytes) {
    for (char b : bytes) {
        matched_ = advance(matched_, b);
        if (matched_ == k_len) {
            closed_ = true;
            return;
        }
    }
}

void reasoning_budget::accept(int32_t token) {
    if (closed_) return;
    MS_ASSERT_MSG(!closing() || token == next_[matched_],
                  "reasoning_budget: a token it did not allow was accepted");
    ++used_;
    feed(table_->bytes(token));
}

budgeted_output::budgeted_output(std::shared_ptr<reasoning_budget> budget, std::shared_ptr<token_constraint> output)
    : budget_(std::move(budget)), output_(std::move(output)) {
    MS_ASSERT(budget_ && output_);
}

void budgeted_output::allowed(std::span<uint8_t> mask) const {
    output_->allowed(mask);
    budget_mask_.resize(mask.size());
    budget_->allowed(budget_mask_);
    for (size_t i = 0; i < mask.size(); ++i) mask[i] &= budget_mask_[i];
}

void budgeted_output::accept(int32_t token) {
    budget_->accept(token);
    output_->accept(token);
}

}  // namespace moestream::server
