#include "spec/speculative.h"

#include <algorithm>
#include <chrono>

#include "config/assert.h"

namespace moestream::spec {

int32_t greedy_token(std::span<const float> logits) {
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

result<spec_stats> decode_greedy(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                 drafter& d, const greedy_options& o, std::vector<int32_t>& out) {
    spec_stats st;
    const int64_t vocab = target.hp().vocab;
    int64_t emitted = 0;
    // False once the stop token is chosen or n tokens are out.
    const auto emit = [&](int32_t t) {
        if (t == o.stop_token) {
            st.stopped = true;
            return false;
        }
        out.push_back(t);
        if (o.on_token) o.on_token(t);
        return ++emitted < n;
    };
    if (n <= 0 || !emit(first)) return st;
    int32_t last = first;
    std::vector<int32_t> context(seq.tokens().begin(), seq.tokens().end()), rows;
    context.push_back(last);
    std::vector<float> logits;
    for (;;) {
        // No more drafts than tokens still wanted beyond the one the step yields anyway, nor than
        // the sequence has room for.
        const int64_t room = seq.capacity() - seq.size() - 1;
        const int64_t k = o.policy ? std::min<int64_t>(o.k, o.policy->choose()) : o.k;
        const int want = int(std::max<int64_t>(0, std::min<int64_t>({k, n - emitted - 1, room})));
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<int32_t> draft = want > 0 ? d.propose(context, want) : std::vector<int32_t>{};
        if (int64_t(draft.size()) > want) draft.resize(size_t(want));
        rows.assign(1, last);
        rows.insert(rows.end(), draft.begin(), draft.end());
        const int64_t before = seq.size();
        dsv41::forward_item item{&seq, rows, true};
        if (auto f = target.forward({&item, 1}, logits); !f) return f.err();
        const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++st.target_steps;
        st.drafted += int64_t(draft.size());
        const size_t kd = std::min<size_t>(draft.size(), draft_policy::kMaxK);
        ++st.steps_by_k[kd];
        if (const int64_t ex = target.last_forward_experts(); ex >= 0) st.experts_by_k[kd] += ex, ++st.counted_by_k[kd];
        // Row i's choice follows rows[0..i]; draft token i + 1 stands while it equals row i's.
        int64_t j = 0;
        int32_t next = greedy_token(std::span<const float>(logits.data(), size_t(vocab)));
        // (A draft never reaches the n-th token, so accepting one never ends decoding; the stop
        // token is never accepted, so the sequence never consumes it.)
        while (j < int64_t(draft.size()) && draft[size_t(j)] == next && next != o.stop_token) {
            const bool more = emit(next);
            MS_ASSERT(more);
            context.push_back(next);
            ++j;
            next = greedy_token(std::span<const float>(logits.data() + j * vocab, size_t(vocab)));
        }
        st.accepted += j;
        if (o.policy) o.policy->record(int(draft.size()), int(j), step_s);
        // The rows after the last accepted draft are forgotten; `next` comes from row j.
        if (j < int64_t(draft.size())) {
            if (auto t = seq.truncate(before + 1 + j); !t) return t.err();
            // The draft head continues from the last kept row's features.
            if (target.has_draft())
                if (auto h = target.keep_main_hidden(seq, j); !h) return h.err();
        }
        if (!emit(next)) return st;
        context.push_back(next);
        last = next;
    }
}

}  // namespace moestream::spec
