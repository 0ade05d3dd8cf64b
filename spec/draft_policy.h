// The draft length of each speculative step, chosen from measured costs (issue 16): k (0
// included) maximises expected committed tokens per expected second of the verification step.
//  - Acceptance: per draft position i, P(draft i accepted | drafts 1..i-1 were), counted over the
//    verified steps with a uniform prior; E(k) = 1 + sum_i prod_{j<=i} p_j tokens a step.
//  - Cost: the measured time of verification steps of each k (an exponential average), so
//    whatever makes k + 1 rows dear on this machine and at this moment (the union of their
//    experts to read, the bus, compute) is in the figure, not a constant. A k not yet measured is
//    estimated from its neighbours (linear in k from the ones measured), and every k is tried
//    now and then so the estimates follow the machine.
// With low acceptance, or verification rows that cost as much as a step each (a disk-bound
// machine), the choice converges to k = 0: plain decoding.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace moestream::spec {

class draft_policy {
  public:
    static constexpr int kMaxK = 5;
    explicit draft_policy(int max_k = kMaxK) : max_k_(max_k < kMaxK ? max_k : kMaxK) {}

    // The draft length for the next step (0..max_k).
    int choose();
    // A verified step: `drafted` tokens proposed, the first `accepted` of them kept, the step
    // took `seconds` (record_drafts and record_step together).
    void record(int drafted, int accepted, double seconds);
    // The two halves, for a batch (scheduler/engine.cpp): every sequence's drafts count towards
    // the acceptance, and the step's time once, under the most any sequence drafted.
    void record_drafts(int drafted, int accepted);
    void record_step(int drafted, double seconds);

    // Estimates, for reports and tests.
    double acceptance(int position) const;  // p_i, position 1..max_k
    double expected_tokens(int k) const;    // E(k)
    double step_seconds(int k) const;       // T(k): measured or estimated (0 before any step)
    int max_k() const { return max_k_; }

  private:
    int max_k_;
    std::array<uint64_t, kMaxK + 1> tried_{}, kept_{};  // per position: drafts verified, accepted
    std::array<double, kMaxK + 1> seconds_{};            // per k: averaged step time (0: none yet)
    std::array<uint64_t, kMaxK + 1> steps_{};
    uint64_t step_ = 0;
};

}  // namespace moestream::spec
