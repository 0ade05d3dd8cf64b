// Greedy speculative decoding: the drafter proposes k tokens, one forward of the target over
// [last, d1..dk] verifies them, the longest prefix the target agrees with is kept, and the
// rejected rows are rolled back (sequence_state::truncate: window rings, compressed and index
// cache lengths; the ratio-2 pending pairs sit in slots that later rows never overwrite). The
// output is the plain greedy output token for token (the target's rows do not depend on the
// other rows of a forward), so speculation changes only the time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/sampler.h"
#include "spec/draft_policy.h"
#include "spec/drafter.h"
#include "spec/expert_union.h"

namespace moestream::spec {

struct spec_stats {
    int64_t target_steps = 0;  // forwards of the target
    int64_t drafted = 0;       // tokens proposed
    int64_t accepted = 0;      // of those, kept
    bool stopped = false;      // ended at the stop token
    std::array<int64_t, draft_policy::kMaxK + 1> steps_by_k{};  // target steps by tokens drafted
    // Distinct experts the verification forwards loaded (summed over layers), by tokens
    // drafted; steps whose routing the host did not see (slot tables) are not counted.
    std::array<int64_t, draft_policy::kMaxK + 1> experts_by_k{}, counted_by_k{};
};

// The lowest index of the largest logit (the greedy choice; ties to the lower id).
int32_t greedy_token(std::span<const float> logits);

struct greedy_options {
    int k = 0;                // the most tokens drafted a step (0: plain decoding)
    // When set, each step's draft length (at most k) is the policy's choice, and the step's
    // drafting + verification time and acceptance are recorded into it.
    draft_policy* policy = nullptr;
    // Records every step's union (where its experts were, the bytes read, its time); without
    // one, a recorder of the model's own union figures (experts taken as resident) feeds the
    // policy.
    step_recorder* recorder = nullptr;
    // After each step that verified drafts, the kept rows' routing (the accepted draft's) is
    // the next step's look-ahead hint (model::hint_next_forward): I/O only.
    bool hint_kept_rows = true;
    int32_t stop_token = -1;  // chosen: decoding ends, the token is not emitted (-1: none)
    std::function<void(int32_t)> on_token;  // each emitted token, as soon as it is known
};

// Decodes up to n tokens greedily after `seq` (its last forward chose `first`, the first new
// token, not yet fed), proposing up to o.k tokens a step with `d`. Appends the emitted tokens to
// `out` (`first` included, unless it is the stop token). Drafts never run past the sequence's
// capacity, which needs room for the n tokens (the last is never fed) and a rollback of o.k.
result<spec_stats> decode_greedy(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                 drafter& d, const greedy_options& o, std::vector<int32_t>& out);

// Speculative sampling: as decode_greedy, but each row's token is the sampler's draw (one random
// number a position, in order) and a draft token stands when the draw equals it. Drafts are
// proposed with certainty, so a draft is accepted with the probability the sampler gives it and
// the output is plain sampling's for the same seed, token for token (distribution-preserving and
// reproducible whatever the draft lengths were). `first` was sampled from the prefill's logits
// and not accepted yet: every emitted token goes into the sampler's history.
result<spec_stats> decode_sampled(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                  drafter& d, const greedy_options& o, sampler& smp, std::vector<int32_t>& out);

}  // namespace moestream::spec
