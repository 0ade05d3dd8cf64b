#include "spec/speculative.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "spec/verify.h"

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
    std::vector<int32_t> context(seq.tokens().begin(), seq.tokens().end()), rows;
    // False once the stop token is chosen (not emitted) or n tokens are out.
    const auto emit = [&](int32_t t) {
        if (t == o.stop_token) {
            st.stopped = true;
            return false;
        }
        rows_choice.emitted(t);
        out.push_back(t);
        context.push_back(t);
        if (o.on_token) o.on_token(t);
        return ++emitted < n;
    };
    if (n <= 0 || !emit(first)) return st;
    int32_t last = first;
    std::vector<float> logits;
    std::optional<step_recorder> own_recorder;
    if (!o.recorder) own_recorder.emplace(target.hp().n_layers);
    step_recorder& recorder = o.recorder ? *o.recorder : *own_recorder;
    std::array<int64_t, draft_policy::kMaxK + 1> kept_rows{};
    // A step's time runs from the previous step's record to its own: everything a step costs
    // (drafting, the forward, the walk, the rollback, the bookkeeping) is in it.
    auto step_start = std::chrono::steady_clock::now();
    for (;;) {
        // No more drafts than tokens still wanted beyond the one the step yields anyway, nor than
        // the sequence has room for.
        // A whole-block drafter (the DSpark head) is asked for the most once its confidences
        // choose the length (draft_policy::request).
        const int64_t k = o.policy ? std::min<int64_t>(o.k, o.policy->request(o.policy->choose(), d.drafts_whole_block(), 1))
                                   : o.k;
        const int want = draft_room(k, n - emitted, seq.capacity() - seq.size() - 1);
        recorder.begin();
        std::vector<int32_t> draft = want > 0 ? d.propose(context, want) : std::vector<int32_t>{};
        if (int64_t(draft.size()) > want) draft.resize(size_t(want));
        // Drafts with confidences are cut where one more row stops paying (draft_policy::trim).
        std::vector<float> confidences;
        if (const auto c = d.confidences(); !draft.empty() && c.size() >= draft.size()) {
            confidences.assign(c.begin(), c.begin() + std::ptrdiff_t(draft.size()));
            if (o.policy) {
                const int keep = o.policy->trim(1, std::span<const std::vector<float>>(&confidences, 1))[0];
                draft.resize(size_t(keep));
                confidences.resize(size_t(keep));
            }
        }
        rows.assign(1, last);
        rows.insert(rows.end(), draft.begin(), draft.end());
        const int64_t before = seq.size();
        dsv41::forward_item item{&seq, rows, true};
        if (auto f = target.forward({&item, 1}, logits); !f) return f.err();
        ++st.target_steps;
        st.drafted += int64_t(draft.size());
        const size_t kd = std::min<size_t>(draft.size(), draft_policy::kMaxK);
        ++st.steps_by_k[kd];
        const int64_t step_experts = target.last_forward_experts();
        if (step_experts >= 0) st.experts_by_k[kd] += step_experts, ++st.counted_by_k[kd];
        // Row j's choice follows rows[0..j] (spec/verify.h). A draft never reaches the n-th
        // token, and the stop token is never accepted, so the sequence never consumes either.
        const auto choose = [&](size_t j, int32_t& t) {
            return rows_choice.choose(std::span<const float>(logits.data() + j * size_t(vocab), size_t(vocab)), t);
        };
        auto v = verify_rows(draft, choose, emit);
        if (!v) return v.err();
        st.accepted += v->kept;
        const auto now = std::chrono::steady_clock::now();
        const double step_s = std::chrono::duration<double>(now - step_start).count();
        step_start = now;
        const union_record& rec = recorder.end(target, int(draft.size()), int(v->kept), int(rows.size()), step_s);
        if (o.policy) {
            o.policy->record_drafts(int(draft.size()), int(v->kept), confidences);
            o.policy->record_step(sample_of(rec));
        }
        // The next step's first row follows the kept rows, and neighbouring positions route
        // alike: their experts are its hint, sent before the next draft is made.
        if (o.hint_kept_rows && !draft.empty() && v->next >= 0) {
            for (int64_t r = 0; r <= v->kept; ++r) kept_rows[size_t(r)] = r;
            (void)target.hint_next_forward(std::span<const int64_t>(kept_rows.data(), size_t(v->kept + 1)));
        }
        // The rows after the last accepted draft are forgotten; the draft head continues from the
        // last kept row's features.
        MS_TRY(keep_rows(target, seq, before, int64_t(rows.size()), v->kept, 0));
        if (v->next < 0) return st;
        last = v->next;
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
