#include "spec/verify.h"

#include <algorithm>
#include <string>

namespace moestream::spec {

int draft_room(int64_t k, int64_t tokens_left, int64_t room) {
    return int(std::max<int64_t>(0, std::min<int64_t>({k, tokens_left - 1, room})));
}

status keep_rows(dsv41::model& m, dsv41::sequence_state& seq, int64_t before, int64_t fed, int64_t kept,
                 int64_t first_row) {
    if (kept < 0 || kept + 1 > fed || seq.size() != before + fed)
        return make_error("keep_rows: " + std::to_string(kept) + " kept drafts of " + std::to_string(fed) +
                          " rows do not fit a sequence of " + std::to_string(seq.size()) + " positions");
    if (kept + 1 == fed) return {};
    MS_TRY(seq.truncate(before + 1 + kept));
    if (m.has_draft()) MS_TRY(m.keep_main_hidden(seq, first_row + kept));
    return {};
}

}  // namespace moestream::spec
