// Internal to the engine (engine.cpp, engine_rows.cpp): one running or waiting request.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "scheduler/engine.h"
#include "spec/drafter.h"

namespace moestream {

struct engine::active {
    using steady = std::chrono::steady_clock;
    generation_request req;
    std::shared_ptr<generation> gen;
    std::unique_ptr<dsv41::sequence_state> seq;  // from states_, returned there when finished
    std::unique_ptr<sampler> sample;
    int64_t prompt_done = 0;   // prompt tokens already in the sequence
    int64_t cached = 0;        // of those, reused from another state
    // Its prompt checkpoint (engine::checkpoint_prompt): still to be decided, and its id in the
    // pool (prefix_pool::keep_prefix), 0 when none was made.
    bool checkpoint_due = true;
    uint64_t checkpoint = 0;
    int32_t next = -1;         // sampled, not yet fed
    int64_t generated = 0;
    std::vector<prompt_score> scores;  // score_prompt: what is scored so far, until sent
    sample_result scratch;
    // For a constrained request (allocated at submit): the allowed tokens and the masked row.
    std::vector<uint8_t> allowed;
    std::vector<float> constrained_row;
    steady::time_point submitted;
    std::optional<steady::time_point> scheduled, first_token;
    // Speculative decoding: the drafter (null: decoded without), the most drafts a step for this
    // request, the rows fed this step while decoding (`next`, then the drafts), the context a
    // drafter reads (scratch), and the request's totals.
    std::unique_ptr<spec::drafter> drafter;
    int64_t spec_cap = 0;
    std::vector<int32_t> rows, context;
    std::vector<float> confidences;  // this step's drafts' (rows[1..]), when its drafter has them
    int64_t drafted = 0, accepted = 0;
};

}  // namespace moestream
