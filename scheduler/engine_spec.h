// Speculative decoding in the engine (scheduler/engine.h): which drafter a sequence gets and the
// draft length of each step.
//
// One draft length a step, for every sequence of the batch, chosen by one policy
// (spec/draft_policy.h) that pools every sequence's acceptance and measures the step's time:
//  - the cost of drafting is a property of the step, not of a sequence: the verification rows of
//    every sequence go through one forward, whose time is the union of all rows' experts to read
//    and multiply; a sequence's own policy would charge itself the whole step, confounded by
//    what the others drafted;
//  - acceptance learnt across requests: most requests are too short for a policy of their own
//    to measure anything before they end (the policy starts optimistic and explores);
//  - sequences still differ where it is free to: a drafter proposes fewer tokens, or none (the
//    n-gram drafter has nothing to say on text that does not repeat, and then adds no row), a
//    request caps its own (speculative.n_max, 0: none), and every sequence stays within the
//    tokens it may still emit and its room.
// Steps with prompt rows are not timed for the policy (their cost is the prompt's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "spec/draft_policy.h"
#include "spec/drafter.h"

namespace moestream {

struct speculation_options {
    // "" or "none": off; "ngram": prompt lookup (spec/ngram_drafter.h); "dspark": the model's own
    // draft head (spec/dspark_drafter.h), which needs a model with one.
    std::string drafter;
    int k = spec::draft_policy::kMaxK;  // the most tokens drafted a step, 0..5 (0: off)
    bool adaptive = true;               // each step's length is the policy's choice (<= k)
    // When set, each request's drafter instead (measurement and tests: the oracle drafter over a
    // recorded continuation, spec/oracle_drafter.h); it may return null (no speculation).
    std::function<std::unique_ptr<spec::drafter>(const std::vector<int32_t>& prompt, const dsv41::sequence_state&)>
        make_drafter;
};

// Errors: an unknown drafter, k outside 0..5, dspark on a model without a draft head. The
// engine asserts it: check first (serve does, before it builds the engine).
status validate(const speculation_options& o, const dsv41::model& m);

class engine_speculation {
  public:
    // `o` has passed validate() for `m`.
    engine_speculation(dsv41::model& m, speculation_options o) : m_(m), o_(std::move(o)), policy_(o_.k) {}

    bool on() const { return o_.k > 0 && (o_.make_drafter || (!o_.drafter.empty() && o_.drafter != "none")); }
    const speculation_options& options() const { return o_; }
    // The most drafts a step for a request that asks for at most `request_max` (-1: no limit of
    // its own); 0: it is decoded without speculation.
    int64_t cap(int64_t request_max) const;
    // A drafter for a request with this prompt, decoded in `seq` (which it may read when it
    // drafts); null when off.
    std::unique_ptr<spec::drafter> drafter_for(const std::vector<int32_t>& prompt, const dsv41::sequence_state& seq) const;

    // The draft length of the next step with at least one speculating decoding sequence.
    int choose();
    // Verified: one sequence's drafts; the step (no prompt rows in it) that took `seconds` and in
    // which the longest draft had `most_drafted` tokens.
    void record_drafts(int drafted, int accepted) { policy_.record_drafts(drafted, accepted); }
    void record_step(int most_drafted, double seconds) { policy_.record_step(most_drafted, seconds); }

  private:
    dsv41::model& m_;
    speculation_options o_;
    spec::draft_policy policy_;
};

}  // namespace moestream
