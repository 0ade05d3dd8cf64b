#include "spec/speculative.h"

#include <algorithm>

namespace moestream::spec {

int32_t greedy_token(std::span<const float> logits) {
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

result<spec_stats> decode_greedy(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                 drafter& d, int k, std::vector<int32_t>& out) {
    spec_stats st;
    if (n <= 0) return st;
    const int64_t vocab = target.hp().vocab;
    out.push_back(first);
    int64_t emitted = 1;
    int32_t last = first;
    std::vector<int32_t> context(seq.tokens().begin(), seq.tokens().end()), rows;
    context.push_back(last);
    std::vector<float> logits;
    while (emitted < n) {
        // No more drafts than tokens still wanted beyond the one the step yields anyway.
        const int want = int(std::min<int64_t>(k, n - emitted - 1));
        std::vector<int32_t> draft = want > 0 ? d.propose(context, want) : std::vector<int32_t>{};
        if (int64_t(draft.size()) > want) draft.resize(size_t(want));
        rows.assign(1, last);
        rows.insert(rows.end(), draft.begin(), draft.end());
        const int64_t before = seq.size();
        dsv41::forward_item item{&seq, rows, true};
        if (auto f = target.forward({&item, 1}, logits); !f) return f.err();
        ++st.target_steps;
        st.drafted += int64_t(draft.size());
        // Row i's choice follows rows[0..i]; draft token i + 1 stands while it equals row i's.
        int64_t j = 0;
        int32_t next = greedy_token(std::span<const float>(logits.data(), size_t(vocab)));
        while (j < int64_t(draft.size()) && draft[size_t(j)] == next) {
            out.push_back(next);
            context.push_back(next);
            ++emitted, ++j;
            next = greedy_token(std::span<const float>(logits.data() + (j)*vocab, size_t(vocab)));
        }
        st.accepted += j;
        // The rows after the last accepted draft are forgotten; `next` comes from row j.
        if (j < int64_t(draft.size()))
            if (auto t = seq.truncate(before + 1 + j); !t) return t.err();
        out.push_back(next);
        context.push_back(next);
        ++emitted;
        last = next;
    }
    return st;
}

}  // namespace moestream::spec
