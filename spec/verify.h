// The pieces of a speculative step that every decoder shares: spec/speculative.cpp's single
// sequence and the server engine's batch (scheduler/engine.cpp). How many tokens a step may
// draft, the walk over the verification rows that decides which drafts stand, and the rollback
// of the rows that did not.
//
// A verification forward feeds [last, d1..dk] (k + 1 causal rows). Row j's token follows rows
// 0..j; draft j + 1 stands when it equals that token. The token is chosen by the caller (greedy,
// or the sampler's draw: speculative sampling, see speculative.h), so the walk emits exactly the
// tokens plain decoding would, one per row until the first draft that does not stand.
#pragma once

#include <cstdint>
#include <span>

#include "config/result.h"
#include "model/arch/deepseek41.h"

namespace moestream::spec {

// The most drafts a step may verify: at most `k`, fewer than `tokens_left` (the tokens the
// sequence may still emit: the row after the drafts yields one anyway, so a draft never reaches
// the last of them), and within `room` positions of the sequence beyond the fed token.
int draft_room(int64_t k, int64_t tokens_left, int64_t room);

struct verdict {
    int64_t kept = 0;   // drafts that stood: their rows, and the fed token's, stay
    int32_t next = -1;  // the token fed next (not yet fed); -1 when emit() ended decoding
};

// Walks the verification rows of `draft`: choose(j, token) -> status picks row j's token;
// emit(token) -> bool hands it on (false: decoding ends there, whether the token was emitted or
// not, e.g. a stop token). The first token that is not the next draft (or the row after every
// draft) is the one fed next.
template <class Choose, class Emit>
result<verdict> verify_rows(std::span<const int32_t> draft, Choose&& choose, Emit&& emit) {
    verdict v;
    for (size_t j = 0;; ++j) {
        int32_t t = -1;
        MS_TRY(choose(j, t));
        if (!emit(t)) {
            v.kept = int64_t(j);
            return v;
        }
        if (j < draft.size() && t == draft[j]) continue;
        v.kept = int64_t(j);
        v.next = t;
        return v;
    }
}

// After a verification forward that fed `fed` rows of `seq` (which had `before` positions) from
// batch row `first_row` on, keeps the fed token's row and `kept` drafts' and forgets the rest
// (sequence_state::truncate); with a draft head, the head continues from the last kept row's
// features (model::keep_main_hidden). Nothing to do when every row stays.
status keep_rows(dsv41::model& m, dsv41::sequence_state& seq, int64_t before, int64_t fed, int64_t kept,
                 int64_t first_row);

}  // namespace moestream::spec
