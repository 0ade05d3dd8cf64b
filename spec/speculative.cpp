#include "spec/speculative.h"

#include <algorithm>
#include <chrono>

#include "config/assert.h"

namespace moestream::spec {

int32_t greedy_token(std::span<const float> logits) {
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

namespace {

// How a verification row's token is chosen: greedily, or by the sampler. A draft token stands
// when the row before it chose it.
struct greedy_rows {
    status choose(std::span<const float> row, int32_t& token) {
        token = greedy_token(row);
        return {};
    }
    void emitted(int32_t) {}
};

// A row's token is the sampler's draw, as plain sampling's (one random number a position, in
// position order), so a draft token stands when the draw equals it. With a drafter that proposes
// tokens with certainty this is speculative sampling at its best coupling: a draft is accepted
// with the probability the sampler gives it, and the output is plain sampling's output for the
// same seed, token for token, whatever was drafted.
struct sampled_rows {
    sampler& smp;
    sample_result r;
    status choose(std::span<const float> row, int32_t& token) {
        MS_TRY(smp.sample(row, r));
        token = r.token;
        return {};
    }
    void emitted(int32_t t) { smp.accept(t); }
};

template <class Rows>
result<spec_stats> decode(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n, drafter& d,
                          const greedy_options& o, Rows& rows_choice, std::vector<int32_t>& out) {
    spec_stats st;
    const int64_t vocab = target.hp().vocab;
    int64_t emitted = 0;
    // False once the stop token is chosen or n tokens are out.
    const auto emit = [&](int32_t t) {
        if (t == o.stop_token) {
            st.stopped = true;
            return false;
        }
        rows_choice.emitted(t);
        out.push_back(t);
        if (o.on_token) o.on_token(t);
        return ++emitted < n;
    };
    if (n <= 0 || !emit(first)) return st;
    int32_t last = first;
    std::vector<int32_t> context(seq.tokens().begin(), seq.tokens().end()), rows;
    context.push_back(last);
    std::vector<float> logits;
    const auto row = [&](int64_t i) { return std::span<const float>(logits.data() + i * vocab, size_t(vocab)); };
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
        // Row i's choice follows rows[0..i]: draft token i + 1 stands when it equals it; the first
        // that does not gives the step's last token, and when every draft stands the row after
        // them does. (A draft never
        // reaches the n-th token, so accepting one never ends decoding; the stop token is never
        // accepted, so the sequence never consumes it.)
        int64_t j = 0;
        int32_t next = -1;
        for (;; ++j) {
            MS_TRY(rows_choice.choose(row(j), next));
            if (j == int64_t(draft.size()) || next != draft[size_t(j)] || next == o.stop_token) break;
            const bool more = emit(next);
            MS_ASSERT(more);
            context.push_back(next);
        }
        st.accepted += j;
        if (o.policy) o.policy->record(int(draft.size()), int(j), step_s);
        // The rows after the last accepted draft are forgotten; `next` came from row j.
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

}  // namespace

result<spec_stats> decode_greedy(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                 drafter& d, const greedy_options& o, std::vector<int32_t>& out) {
    greedy_rows g;
    return decode(target, seq, first, n, d, o, g, out);
}

result<spec_stats> decode_sampled(dsv41::model& target, dsv41::sequence_state& seq, int32_t first, int64_t n,
                                  drafter& d, const greedy_options& o, sampler& smp, std::vector<int32_t>& out) {
    sampled_rows r{smp, {}};
    return decode(target, seq, first, n, d, o, r, out);
}

}  // namespace moestream::spec
