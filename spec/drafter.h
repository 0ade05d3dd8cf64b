// Drafters for speculative decoding: each proposes up to k tokens to follow a sequence's
// committed tokens; the target model verifies them in one forward (spec/speculative.h). A
// drafter sees only token ids, so it is backend-agnostic; the DSpark head (a drafter that needs
// the target's features) plugs in behind the same interface.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/coro.h"

namespace moestream::spec {

class drafter {
  public:
    virtual ~drafter() = default;
    virtual std::string name() const = 0;
    // Up to k tokens to follow `context` (every committed token, the prompt included, and the
    // token the next forward feeds last). Fewer (or none) when it has nothing to say.
    virtual std::vector<int32_t> propose(std::span<const int32_t> context, int k) = 0;
    // propose() as a coroutine that continues on `ex` after every wait, so a drafter that runs
    // the model (the DSpark head, whose experts may be on their way from disk) suspends instead
    // of holding the thread (the engine's drafts, issue 15). One that never waits answers at once.
    virtual coro::task<std::vector<int32_t>> propose_async(std::span<const int32_t> context, int k,
                                                          coro::executor& ex) {
        (void)ex;
        co_return propose(context, k);
    }
    // Proposals that failed (an error, so nothing was proposed) so far; decoding goes on without
    // drafts, which changes no token.
    virtual int64_t failures() const { return 0; }
    // The last proposal's confidence per token (raw logits: the DSpark head's, whose sigmoid is
    // read as the draft's conditional acceptance), or empty for a drafter that has none.
    virtual std::span<const float> confidences() const { return {}; }
    // Whether proposing fewer tokens costs it no less (the DSpark head drafts its whole block in
    // one forward whatever k): the engine may then ask for the most and let the confidences say
    // how many to verify (draft_policy::request).
    virtual bool drafts_whole_block() const { return false; }
};

}  // namespace moestream::spec
