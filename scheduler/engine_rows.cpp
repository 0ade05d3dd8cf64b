// The engine's speculative rows: drafting before a step, and the walk over a sequence's rows
// after it (spec/verify.h), which a plain decode step or a prompt's last row takes too (a walk
// without drafts).
#include <algorithm>
#include <limits>

#include "scheduler/engine_active.h"
#include "scheduler/event_outbox.h"
#include "spec/verify.h"

namespace moestream {

namespace {

// `row` with the tokens the constraint forbids at -inf, into `out`; false when it allows none.
bool constrain_row(const token_constraint& c, std::span<const float> row, std::vector<uint8_t>& mask,
                   std::vector<float>& out) {
    c.allowed(mask);
    bool any = false;
    for (size_t v = 0; v < row.size(); ++v) {
        out[v] = mask[v] ? row[v] : -std::numeric_limits<float>::infinity();
        any |= mask[v] != 0;
    }
    return any;
}

}  // namespace

int engine::draft_room(active& a, int k) {
    // The tokens it may still emit (max_tokens, the context): the walk yields one more than the
    // drafts, so none of them reaches the end plain decoding would stop at.
    const int64_t left_in_context = opts_.context_tokens - a.prompt_done - a.generated;
    const int64_t left = a.req.max_tokens > 0 ? std::min(left_in_context, a.req.max_tokens - a.generated) : left_in_context;
    const int want = spec::draft_room(std::min<int64_t>(k, a.spec_cap), left, a.seq->capacity() - a.seq->size() - 1);
    if (want <= 0) return 0;
    a.context.assign(a.seq->tokens().begin(), a.seq->tokens().end());
    a.context.push_back(a.next);
    return want;
}

void engine::take_drafts(active& a, const std::vector<int32_t>& d, int want, int64_t failures_before) {
    // A token outside the vocabulary would fail everyone's forward: the drafts end before it.
    for (size_t i = 0; i < d.size() && int64_t(i) < want && d[i] >= 0 && d[i] < model_.hp().vocab; ++i)
        a.rows.push_back(d[i]);
    if (const int64_t f = a.drafter->failures() - failures_before; f > 0) {
        std::lock_guard lock(stats_mu_);
        stats_.spec_failures += uint64_t(f);
    }
}

std::string engine::sample_rows(active& a, const std::vector<float>& logits, size_t row0, int64_t batch_row,
                                int64_t drafts) {
    const int64_t vocab = model_.hp().vocab;
    const bool first = !a.first_token;
    if (first) a.first_token = std::chrono::steady_clock::now();
    token_constraint* constraint = a.req.constraint.get();
    std::string reason;
    // Row j's token: the sampler's (greedy at temperature 0), within the constraint.
    const auto choose = [&](size_t j, int32_t& t) -> status {
        const std::span<const float> row(logits.data() + (row0 + j) * size_t(vocab), size_t(vocab));
        std::span<const float> candidates = row;
        if (constraint) {
            if (!constrain_row(*constraint, row, a.allowed, a.constrained_row))
                return make_error("the output constraint allows no token");
            candidates = a.constrained_row;
        }
        MS_TRY(a.sample->sample(candidates, a.scratch));
        t = a.scratch.token;
        return {};
    };
    // Delivers a token; false when the request ends (a stop token, which is not emitted; the
    // constraint done; max_tokens; the context).
    bool first_event = first;
    const auto emit = [&](int32_t t) {
        if (std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), t) != a.req.stop_tokens.end()) {
            reason = "stop";
            return false;
        }
        if (constraint) constraint->accept(t);
        a.sample->accept(t);
        a.next = t;
        ++a.generated;
        token_event e;
        e.token = t;
        e.logprob = a.scratch.logprob;
        if (a.req.sampling.n_probs > 0) e.top = a.scratch.top;
        if (first_event) e.prompt_scores = std::move(a.scores), first_event = false;
        stamp(a, e);
        outbox_->send(a.gen, std::move(e));
        {
            std::lock_guard lock(stats_mu_);
            ++stats_.generated_tokens;
        }
        if (constraint && constraint->done()) reason = "stop";
        else if (a.req.max_tokens > 0 && a.generated >= a.req.max_tokens) reason = "length";
        else if (a.prompt_done + a.generated >= opts_.context_tokens) reason = "context";
        return reason.empty();
    };
    const int64_t before = a.seq->size() - drafts - 1;
    const auto draft = std::span<const int32_t>(a.rows).subspan(drafts > 0 ? 1 : 0, size_t(drafts));
    a.drafted += drafts;
    auto v = spec::verify_rows(draft, choose, emit);
    if (!v) reason = "error: " + v.message();
    if (drafts == 0) return reason;
    const int64_t kept = v ? v->kept : 0;
    a.accepted += kept;
    {
        std::lock_guard lock(stats_mu_);
        ++stats_.spec_drafts;
        stats_.spec_draft_tokens += uint64_t(drafts);
        stats_.spec_accepted_tokens += uint64_t(kept);
        for (int64_t p = 0; p < kept && p < int64_t(stats_.spec_accepted_by_position.size()); ++p)
            ++stats_.spec_accepted_by_position[size_t(p)];
    }
    spec_->record_drafts(int(drafts), int(kept), a.confidences);
    if (v && v->next >= 0 && reason.empty()) spec_->note_kept_rows(batch_row, kept + 1);
    // The rows after the kept drafts are forgotten now, so the state is consistent between steps
    // (a later prompt may start from it).
    if (auto k = spec::keep_rows(model_, *a.seq, before, drafts + 1, kept, batch_row); !k)
        reason = "error: " + k.message();
    return reason;
}

}  // namespace moestream
