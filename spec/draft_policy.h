// The draft length of each speculative step, chosen from measured costs (issue 16): k (0
// included) maximises expected committed tokens per expected second of the step.
//  - Acceptance: per draft position i, P(draft i accepted | drafts 1..i-1 were), counted over the
//    verified steps (with forgetting, so it follows the content), each position's prior the
//    estimate of the one before it (1/2 for the first); E(k) = 1 + sum_i prod_{j<=i} p_j.
//  - Cost: a model learnt online from the recorded steps (spec/expert_union.h):
//      * the union: distinct experts summed over the layers for T rows, U(T) = a * T^b (capped
//        at every expert), fitted by least squares in log space over the steps (b = 1, every row
//        bringing its own experts, is the prior: the pessimistic end);
//      * the step's time: t = c0 + c_draft * [drafting] + c_row * T + c_res * R + c_miss * M,
//        R and M the union's experts that were resident / not resident when announced, fitted by
//        non-negative least squares with forgetting (so it follows the machine), M for a k taken
//        as U(T) times the share not resident in the latest steps (the current residency).
//    The cost of a k is its measured time (an exponential average) blended with the model's by
//    how often it was measured lately: a k seldom or never measured costs what the union model
//    and the current residency say, not a line through its measured neighbours (which a concave
//    union and a residency that changed both make wrong). Before the model has seen two row
//    counts the old estimate stands: linear from the measured neighbours.
//  - The first steps are a plain one and then one draft, so a base cost and a draft's are
//    measured before anything longer is tried.
//  - At most every 16th step tries a neighbour of the best, so costs and acceptance stay
//    measured, and only as often as 2% of the time pays for its expected loss.
//  - Drafts with confidences (the DSpark head's: a raw logit per draft, whose sigmoid the paper
//    reads as the draft's conditional acceptance; the head drafts its whole block at one cost,
//    so once trim() cuts by confidence the engine asks it for the most, request()) are trimmed
//    once made (trim()): each draft's
//    acceptance is its confidence calibrated online (bins of the sigmoid, each starting at its
//    own value), a sequence's prefix survival the product; drafts join in decreasing survival
//    while expected committed tokens per modelled second of the verification rise (the DSpark
//    paper's Algorithm 1, with this cost model for its steps-per-second curve).
// With low acceptance, or rows that cost as much as a step each (a disk-bound machine), the
// choice converges to k = 0: plain decoding. Deterministic given its inputs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace moestream::spec {

// What the union model may assume before it has measured anything.
struct union_shape {
    double experts_per_row = 0;  // one row's experts summed over the layers (n_active * n_layers); 0: learnt
    double experts_max = 0;      // every expert of the layers (n_experts * n_layers); 0: no bound
};

// One step, as the cost model sees it (spec/expert_union.h's union_record, reduced).
struct step_sample {
    int drafted = 0;          // the step's k
    int rows = 0;             // rows of the forward (0: drafted + 1, one sequence)
    int drafting = -1;        // sequences that drafted (-1: one when drafted > 0)
    double experts = -1;      // distinct experts summed over the target's layers; < 0: unknown
    double not_resident = 0;  // of those, not resident in a tier when announced
    double seconds = 0;       // drafting + verification
};

class draft_policy {
  public:
    static constexpr int kMaxK = 5;
    explicit draft_policy(int max_k = kMaxK, union_shape shape = {})
        : max_k_(max_k < 0 ? 0 : (max_k < kMaxK ? max_k : kMaxK)), shape_(shape) {}

    // The draft length for the next step (0..max_k) of one sequence.
    int choose() { return choose(1, 1); }
    // For a batch: `base_rows` rows at k = 0 (every sequence's token, prompt rows excluded) and
    // `drafting` sequences that add k rows each.
    int choose(int base_rows, int drafting);
    // A verified step: `drafted` tokens proposed, the first `accepted` of them kept, the step
    // took `seconds` (record_drafts and record_step together), its union unknown.
    void record(int drafted, int accepted, double seconds);
    // The halves, for a batch (scheduler/engine.cpp): every sequence's drafts count towards the
    // acceptance, and the step's time once, under the most any sequence drafted.
    void record_drafts(int drafted, int accepted);
    // The same for drafts with confidences (one per draft): they calibrate acceptance too.
    void record_drafts(int drafted, int accepted, std::span<const float> confidences);
    void record_step(int drafted, double seconds);
    void record_step(const step_sample& s);

    // How many drafts to ask a drafter for when choose() said k: k, or, for a drafter whose
    // proposals cost the same at any length and come with confidences (whole_block), the most
    // (max_k) whenever k > 0 and trim() would cut them by their confidences (the cost model
    // ready, the step not exploring a k): the step's length is then chosen from the drafts'
    // own confidences, not from the average acceptance by position.
    int request(int k, bool whole_block, int base_rows) const;
    // Whether trim() would cut drafts by their confidences now (else it keeps every draft).
    bool cuts_by_confidence(int base_rows) const;
    // Drafts made (per sequence, their confidences in order), how many of each to verify:
    // `base_rows` rows go in without drafts. Every draft while the cost model is not ready, or
    // when the last choose() explored (its k is what is being measured).
    std::vector<int> trim(int base_rows, std::span<const std::vector<float>> confidences) const;
    // A draft's acceptance given its confidence (calibrated), 0..1.
    double calibrated(float confidence) const;

    // Estimates, for reports and tests.
    double acceptance(int position) const;  // p_i, position 1..max_k
    double expected_tokens(int k) const;    // E(k)
    // T(k) of the last choose()'s shape (one sequence until then): measured, modelled or
    // estimated; 0 before any step.
    double step_seconds(int k) const;
    // The union model: expected experts (summed over layers) of a forward of `rows` rows;
    // -1 before any union was seen and without a prior.
    double expected_union(double rows) const;
    // The cost model's time for k in the current shape; -1 while it is not ready.
    double modelled_seconds(int k) const;
    // Share of the union not resident when announced, over the latest steps.
    double not_resident_share() const { return miss_share_; }
    struct cost_fit {
        double base = 0, draft = 0, per_row = 0, per_resident = 0, per_missing = 0;
        bool ready = false;
    };
    const cost_fit& cost() const;
    int max_k() const { return max_k_; }

  private:
    static constexpr int kFeatures = 5;  // 1, drafting, rows, resident, not resident
    using vec = std::array<double, kFeatures>;
    double measured_weight(int k) const;
    double verify_seconds(double rows) const;  // the cost model's time for `rows`, no draft cost
    double interpolated_seconds(int k) const;
    void refit() const;

    int max_k_;
    union_shape shape_;
    // Per position: drafts verified and accepted, decayed per verified step (content changes:
    // the acceptance follows it).
    std::array<double, kMaxK + 1> tried_{}, kept_{};
    // Confidence calibration: per bin of sigmoid(confidence), drafts verified and accepted (decayed).
    static constexpr int kBins = 10;
    std::array<double, kBins> bin_tried_{}, bin_kept_{};
    bool explored_ = false;  // the last choose() tried a neighbour of the best
    std::array<double, kMaxK + 1> seconds_{};            // per k: averaged step time (0: none yet)
    std::array<uint64_t, kMaxK + 1> steps_{};
    std::array<double, kMaxK + 1> recent_{};             // per k: measurements, decayed per step
    uint64_t step_ = 0;
    double credit_ = 0;  // seconds exploration may still lose
    int base_rows_ = 1, drafting_ = 1;  // the shape of the step being chosen
    // Union model, log space (x = ln rows, y = ln experts), decayed sums.
    double uw_ = 0, ux_ = 0, uy_ = 0, uxx_ = 0, uxy_ = 0;
    double first_per_row_ = 0;  // the prior's a when the shape gave none: the first step's union per row
    // Cost model: decayed normal equations of t over the features.
    std::array<vec, kFeatures> ata_{};
    vec atb_{};
    double tw_ = 0, trows_ = 0, trows2_ = 0;  // decayed weight, sum and sum of squares of rows
    bool union_seen_ = false;
    double miss_share_ = 0;
    mutable bool fit_stale_ = true;
    mutable cost_fit fit_;
};

}  // namespace moestream::spec
