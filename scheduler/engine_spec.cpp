#include "scheduler/engine_spec.h"

#include <algorithm>

#include "spec/dspark_drafter.h"
#include "spec/ngram_drafter.h"

namespace moestream {

status validate(const speculation_options& o, const dsv41::model& m) {
    if (o.k < 0 || o.k > spec::draft_policy::kMaxK)
        return make_error("speculative decoding drafts 0.." + std::to_string(spec::draft_policy::kMaxK) +
                          " tokens a step, not " + std::to_string(o.k));
    if (!o.drafter.empty() && o.drafter != "none" && o.drafter != "ngram" && o.drafter != "dspark")
        return make_error("the drafter must be dspark, ngram or none, not '" + o.drafter + "'");
    if (o.drafter == "dspark" && !m.has_draft())
        return make_error("the dspark drafter needs the model's draft head (--draft FILE.gguf)");
    return {};
}

int64_t engine_speculation::cap(int64_t request_max) const {
    if (!on()) return 0;
    return request_max < 0 ? o_.k : std::min<int64_t>(request_max, o_.k);
}

std::unique_ptr<spec::drafter> engine_speculation::drafter_for(const std::vector<int32_t>& prompt,
                                                                const dsv41::sequence_state& seq) const {
    if (!on()) return nullptr;
    if (o_.make_drafter) return o_.make_drafter(prompt, seq);
    if (o_.drafter == "dspark") return std::make_unique<spec::dspark_drafter>(m_, seq);
    return std::make_unique<spec::ngram_drafter>();
}

int engine_speculation::choose(int decoding, int drafting) {
    return o_.adaptive ? std::min(o_.k, policy_.choose(decoding, drafting)) : o_.k;
}

const spec::union_record& engine_speculation::end_step(int most_drafted, int rows, int drafting, double seconds) {
    // Accepted drafts are counted per sequence (record_drafts), after sampling.
    const spec::union_record& r = recorder_.end(m_, most_drafted, 0, rows, seconds);
    policy_.record_step(spec::sample_of(r, drafting));
    return r;
}

void engine_speculation::note_kept_rows(int64_t first_batch_row, int64_t rows) {
    // At most what the model keeps picks of (model::hint_next_forward refuses more): the rest
    // of a large batch goes without.
    for (int64_t r = 0; r < rows && kept_rows_.size() < kept_rows_.capacity(); ++r)
        kept_rows_.push_back(first_batch_row + r);
}

void engine_speculation::send_hints() {
    if (!kept_rows_.empty()) (void)m_.hint_next_forward(kept_rows_);
    kept_rows_.clear();
}

}  // namespace moestream
