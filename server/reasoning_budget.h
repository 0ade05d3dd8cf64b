// A thinking budget made certain (Anthropic's thinking.budget_tokens): the reply starts inside the
// model's reasoning (the prompt ends with "<think>", DeepSeek-V3.1's thinking mode) and the
// reasoning ends with "</think>" within `budget` tokens, the closing marker included. Until then
// every token is allowed (the model may close its reasoning itself, or end the reply); once only
// the tokens the closing takes are left, the closing is written: the marker's own added token when
// the vocabulary has one, else the longest ordinary tokens that spell the rest of "</think>". Once
// closed, nothing is restricted. It never ends the request itself (done() stays false).
//
// A budget smaller than the closing itself (one token with the added marker, a few without)
// closes at once and ends after the closing. Cost per step: the whole mask is written (the
// engine's contract); the closing tokens are found once, at construction (one scan of the
// vocabulary).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "scheduler/token_constraint.h"
#include "server/token_table.h"

namespace moestream::server {

class reasoning_budget final : public token_constraint {
  public:
    static constexpr std::string_view k_close = "</think>";

    // close_token: the vocabulary's "</think>" added token, or -1 when it has none. Null when
    // the vocabulary cannot spell the marker at all. budget >= 1.
    static std::unique_ptr<reasoning_budget> make(std::shared_ptr<const token_table> table,
                                                  int32_t close_token, int64_t budget);

    void allowed(std::span<uint8_t> mask) const override;
    void accept(int32_t token) override;
    bool done() const override { return false; }

    // The reasoning has ended ("</think>" was written).
    bool closed() const { return closed_; }
    // Reasoning tokens so far (the closing marker's included).
    int64_t used() const { return used_; }
    // Only the closing may come next.
    bool closing() const;
    // The most tokens the closing takes (1 with the marker's own token).
    int64_t closing_cost() const { return worst_; }

  private:
    // next[m]: the token that continues the closing when the output ends with m bytes of it.
    using closing_tokens = std::array<int32_t, k_close.size()>;
    reasoning_budget(std::shared_ptr<const token_table> table, closing_tokens next, int64_t worst,
                     int64_t budget);
    void feed(std::string_view bytes);

    std::shared_ptr<const token_table> table_;
    closing_tokens next_;
    int64_t worst_;  // the most tokens the closing takes, from any partial match
    int64_t budget_;
    int64_t used_ = 0;
    size_t matched_ = 0;  // bytes of "</think>" the output ends with (the longest such prefix)
    bool closed_ = false;
};

// A reasoning budget together with the constraint of what follows the reasoning (a forced call,
// JSON, strict tools: server/output_constraint.h, built for an output that starts inside the
// reasoning): a token is allowed only if both allow it, and both accept every token. The budget
// ends the reasoning in time; the output constraint lets it run (a forced shape waits for
// "</think>" and closes it itself when its token limit gets near) and alone ends the request.
// Their masks always meet: while the budget is closing, its one token continues "</think>",
// which the output constraint allows there.
class budgeted_output final : public token_constraint {
  public:
    budgeted_output(std::shared_ptr<reasoning_budget> budget, std::shared_ptr<token_constraint> output);

    void allowed(std::span<uint8_t> mask) const override;
    void accept(int32_t token) override;
    bool done() const override { return output_->done(); }

    const reasoning_budget& budget() const { return *budget_; }

  private:
    std::shared_ptr<reasoning_budget> budget_;
    std::shared_ptr<token_constraint> output_;
    mutable std::vector<uint8_t> budget_mask_;
};

}  // namespace moestream::server
