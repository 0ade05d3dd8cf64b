// The model's expert source when the DSpark draft's experts have a tier of their own (issue 16:
// drafting never evicts the target's hot experts, nor the target the draft's): the target's
// layers (0..n_layers-1) go to one source, the draft's stages (n_layers + s) to the other. On the
// CUDA backend both are device_experts over the same fill source, each with its own VRAM slots
// (tools/model_session.cpp); the split is by layer only, so a result never depends on it.
#pragma once

#include <algorithm>

#include "model/arch/deepseek41.h"

namespace moestream {

class layer_split_experts final : public dsv41::expert_source {
  public:
    // Both sources must outlive this; layers from `first_draft_layer` on are the draft's.
    layer_split_experts(dsv41::expert_source& target, dsv41::expert_source& draft, int first_draft_layer)
        : target_(target), draft_(draft), first_draft_layer_(first_draft_layer) {}

    void need(int layer, std::span<const int32_t> experts) override { of(layer).need(layer, experts); }
    result<dsv41::expert_weights> get(int layer, int32_t expert) override { return of(layer).get(layer, expert); }
    result<dsv41::ready_experts> acquire_ready(int layer, std::span<const int32_t> pending, int64_t max) override {
        return of(layer).acquire_ready(layer, pending, max);
    }
    void async_ready(int layer, std::span<const int32_t> pending, int64_t max, dsv41::ready_callback done) override {
        of(layer).async_ready(layer, pending, max, std::move(done));
    }
    void release(int layer, int32_t expert) override { of(layer).release(layer, expert); }
    // The model takes one cap for every layer: the smaller source's, so neither is asked to hold
    // more than it has (the default draft tier holds every draft expert: the target's binds).
    int64_t max_held() const override { return std::min(target_.max_held(), draft_.max_held()); }
    const expert_slot_table* slot_table(int layer) override { return of(layer).slot_table(layer); }
    void hint(int layer, std::span<const int32_t> experts) override { of(layer).hint(layer, experts); }

  private:
    dsv41::expert_source& of(int layer) { return layer < first_draft_layer_ ? target_ : draft_; }

    dsv41::expert_source& target_;
    dsv41::expert_source& draft_;
    int first_draft_layer_;
};

}  // namespace moestream
