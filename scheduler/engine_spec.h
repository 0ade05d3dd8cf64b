// Speculative decoding in the engine (scheduler/engine.h): which drafter a sequence gets and the
// draft length of each step.
//
// One draft length a step, for every sequence of the batch, chosen by one policy
// (spec/draft_policy.h) that pools every sequence's acceptance and measures the step's time:
//  - the cost of drafting is a property of the step, not of a sequence: the verification rows of
//    every sequence go through one forward, whose time is the union of all rows' experts to read
//    and multiply; a sequence's own policy would charge itself the whole step, confounded by
//    what the others drafted;
//  - acceptance learnt across requests: most requests are too short for a policy of their own
//    to measure anything before they end (the policy starts optimistic and explores);
//  - sequences still differ where it is free to: a drafter proposes fewer tokens, or none (the
//    n-gram drafter has nothing to say on text that does not repeat, and then adds no row), a
//    request caps its own (speculative.n_max, 0: none), and every sequence stays within the
//    tokens it may still emit and its room.
// Steps with prompt rows are not timed for the policy (their cost is the prompt's). Each timed
// step is recorded with its union and where its experts were (spec/expert_union.h), which the
// policy's cost model learns from, with the rows of the batch (the shape it chooses k for).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "spec/draft_policy.h"
#include "spec/drafter.h"
#include "spec/expert_union.h"

namespace moestream {

struct speculation_options {
    // "" or "none": off; "ngram": prompt lookup (spec/ngram_drafter.h); "dspark": the model's own
    // draft head (spec/dspark_drafter.h), which needs a model with one.
    std::string drafter;
    int k = spec::draft_policy::kMaxK;  // the most tokens drafted a step, 0..5 (0: off)
    bool adaptive = true;               // each step's length is the policy's choice (<= k)
    // When set, each request's drafter instead (measurement and tests: the oracle drafter over a
    // recorded continuation, spec/oracle_drafter.h); it may return null (no speculation).
    std::function<std::unique_ptr<spec::drafter>(const std::vector<int32_t>& prompt, const dsv41::sequence_state&)>
        make_drafter;
    // Where the step's experts were when announced (the streaming tiers: tiered_experts::
    // layer_tallies); empty: taken as resident. Called on the engine's strand around each timed
    // step; the tiers' answer blocks briefly, which is safe while their strand runs on a thread
    // of its own (docs/streaming.md); on a shared executor it must become asynchronous.
    spec::tally_probe tallies;
};

// Errors: an unknown drafter, k outside 0..5, dspark on a model without a draft head. The
// engine asserts it: check first (serve does, before it builds the engine).
status validate(const speculation_options& o, const dsv41::model& m);

class engine_speculation {
  public:
    // `o` has passed validate() for `m`.
    engine_speculation(dsv41::model& m, speculation_options o)
        : m_(m), o_(std::move(o)), policy_(o_.k, spec::shape_of(m.hp())), recorder_(m.hp().n_layers, o_.tallies) {
        kept_rows_.reserve(64);  // model::hint_next_forward's bound
    }

    bool on() const { return o_.k > 0 && (o_.make_drafter || (!o_.drafter.empty() && o_.drafter != "none")); }
    const speculation_options& options() const { return o_; }
    // The most drafts a step for a request that asks for at most `request_max` (-1: no limit of
    // its own); 0: it is decoded without speculation.
    int64_t cap(int64_t request_max) const;
    // A drafter for a request with this prompt, decoded in `seq` (which it may read when it
    // drafts); null when off.
    std::unique_ptr<spec::drafter> drafter_for(const std::vector<int32_t>& prompt, const dsv41::sequence_state& seq) const;

    // The draft length of the next step with at least one speculating decoding sequence:
    // `decoding` sequences feed a row each, `drafting` of them may add k drafts.
    int choose(int decoding, int drafting);
    // How many drafts to ask `d` for in a step whose length choose() made `step_k`
    // (draft_policy::request: the most, for the DSpark head once its confidences cut the block).
    int request(int step_k, const spec::drafter& d, int decoding) const {
        return o_.adaptive ? policy_.request(step_k, d.drafts_whole_block(), decoding) : step_k;
    }
    // Verified: one sequence's drafts (with their confidences, when its drafter has them).
    void record_drafts(int drafted, int accepted, std::span<const float> confidences = {}) {
        policy_.record_drafts(drafted, accepted, confidences);
    }
    // Drafts with confidences (per sequence), how many of each to verify (spec::draft_policy::
    // trim); all of them unless the draft length is adaptive.
    std::vector<int> trim(int base_rows, std::span<const std::vector<float>> confidences) const {
        if (o_.adaptive) return policy_.trim(base_rows, confidences);
        std::vector<int> all;
        for (const auto& c : confidences) all.push_back(int(c.size()));
        return all;
    }
    // Around a step without prompt rows: begin before its drafts, end after its forward (`rows`
    // fed, the longest draft `most_drafted`, `drafting` sequences drafted, `seconds` in all).
    void begin_step() { recorder_.begin(); }
    const spec::union_record& end_step(int most_drafted, int rows, int drafting, double seconds);
    const spec::step_recorder& recorder() const { return recorder_; }
    // The accepted draft's routing as the next step's hint: each verifying sequence's kept rows
    // (batch rows) are noted while its rows are walked; send_hints() hands them to the model
    // (model::hint_next_forward) once the step's walks are done.
    void note_kept_rows(int64_t first_batch_row, int64_t rows);
    void send_hints();

  private:
    dsv41::model& m_;
    speculation_options o_;
    spec::draft_policy policy_;
    spec::step_recorder recorder_;
    std::vector<int64_t> kept_rows_;  // this step's, for send_hints()
};

}  // namespace moestream
