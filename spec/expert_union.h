// Expert-union accounting of speculative steps (issue 16). A verification forward over k + 1
// rows loads, at each layer, the union of the experts its rows route to; on a machine that
// streams experts that union, and how much of it was not resident, is most of the step's cost.
// Each step is recorded per layer: the distinct experts the rows routed to, where they were when
// the layer announced them (device tier, host tier, a read already in flight, or missing: read
// from disk for this step), the bytes read, the step's time and its accepted length. The records
// feed the draft-length policy's model of the union and of the cost per expert
// (spec/draft_policy.h), and the reports (generate, bench spec, the engine's metrics).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/arch/deepseek41.h"
#include "spec/draft_policy.h"

namespace moestream::spec {

inline constexpr int kMaxDraft = draft_policy::kMaxK;

// Where the experts announced at one layer were, summed over every announcement so far (the
// expert source keeps it; a step's figures are the difference around the step).
struct layer_tally {
    uint64_t needs = 0;       // announcements (forwards through the layer)
    uint64_t experts = 0;     // experts announced: the rows' union, summed over announcements
    uint64_t device = 0;      // found in the device tier (or on their way up to it)
    uint64_t host = 0;        // found in the host tier (a draft stage with a budget of its own: in it)
    uint64_t in_flight = 0;   // being read already (a look-ahead hint, or an earlier demand)
    uint64_t missing = 0;     // absent: read from disk for this announcement
    uint64_t bytes_read = 0;  // bytes of this layer's experts read from disk (demands and hints)

    layer_tally& operator-=(const layer_tally& o);
    layer_tally& operator+=(const layer_tally& o);
};

// Fills `out[layer]` for layers 0..out.size()-1 with the cumulative tallies; false when the
// source keeps none (every expert resident: the mapping, or device slots).
using tally_probe = std::function<bool(std::span<layer_tally> out)>;

// One verification step.
struct union_record {
    int drafted = 0;   // the step's k (in a batch: the most any sequence drafted)
    int accepted = 0;  // drafts that stood (in a batch: summed over the sequences)
    int rows = 0;      // rows of the verification forward
    double seconds = 0;  // drafting + verification
    // Distinct experts routed, summed over the target's layers; -1 when unknown (layers routed
    // on the device, whose picks the host does not see).
    int64_t experts = -1;
    bool residency_known = false;  // the tallies below come from the tiers (else all resident)
    int64_t device = 0, host = 0, in_flight = 0, missing = 0;
    uint64_t bytes_read = 0;
    // Experts that were not resident when announced: read for the step or joined in flight.
    int64_t not_resident() const { return in_flight + missing; }
};

// The union model's prior for a model: one row's experts and every expert, over the target's layers.
union_shape shape_of(const dsv41::hparams& hp);

// What the policy's cost model learns from a record (`drafting`: sequences that drafted).
step_sample sample_of(const union_record& r, int drafting = -1);

// Sums over the steps of one k.
struct union_totals {
    int64_t steps = 0;    // every step of this k
    int64_t counted = 0;  // of those, steps whose union is known
    int64_t experts = 0, device = 0, host = 0, in_flight = 0, missing = 0, accepted = 0;
    uint64_t bytes_read = 0;
    double seconds = 0;
    void add(const union_record& r);
};

// Records steps: begin() before the step's drafting, end() after its verification forward.
// Its buffers are sized at construction; a step allocates nothing.
class step_recorder {
  public:
    // `n_layers`: the target's layers (the draft stages after them are the draft's own cost,
    // inside the step's time). Without a probe, experts are taken as resident.
    explicit step_recorder(int n_layers, tally_probe probe = {});

    void begin();
    // The step's record: its union from the tallies (or from `target`'s last forward), where its
    // experts were, the bytes read since begin(), and what the caller says.
    const union_record& end(const dsv41::model& target, int drafted, int accepted, int rows, double seconds);

    const union_record& last() const { return last_; }
    // The last step's tallies per target layer (the union of each layer: `experts`).
    std::span<const layer_tally> last_layers() const { return step_; }
    const std::array<union_totals, kMaxDraft + 1>& by_k() const { return by_k_; }
    // Distinct experts per layer summed over the steps of each k, per target layer.
    std::span<const int64_t> layer_experts(int k) const;
    int n_layers() const { return n_layers_; }

  private:
    int n_layers_;
    tally_probe probe_;
    bool have_before_ = false;
    std::vector<layer_tally> before_, after_, step_;
    std::vector<int64_t> layer_experts_;  // [k][layer]
    union_record last_;
    std::array<union_totals, kMaxDraft + 1> by_k_{};
};

}  // namespace moestream::spec
