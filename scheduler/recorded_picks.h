// The picks recorded in a reference fixture (prompt_lenN.safetensors: router / indexer / candidate
// selections of the prefill and of every teacher-forced decode step, DSpark router picks) served
// through the model's pick hook, so a comparison against the reference is free of top-k ambiguity.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"

namespace moestream {

class recorded_picks final : public dsv41::pick_hook {
  public:
    static result<recorded_picks> load(const std::string& path, const dsv41::hparams& hp);

    const std::vector<int32_t>& input_ids() const { return input_ids_; }
    const std::vector<int32_t>& generated_ids() const { return generated_ids_; }
    // DSpark router picks are recorded per decode step: say which step the next draft belongs to.
    void set_draft_step(int64_t step) { draft_step_ = step; }
    // Picks that had no record (e.g. decode steps beyond the fixture's): counted, left as computed.
    int64_t unmatched() const { return unmatched_; }

    void picks(const dsv41::pick_site& site, std::span<int32_t> ids) override;
    void mask(const dsv41::pick_site& site, std::span<uint8_t> entries) override;

  private:
    struct table {
        std::vector<int64_t> shape;
        std::vector<int64_t> values;
        const int64_t* row(std::initializer_list<int64_t> index) const;  // nullptr when out of range
        int64_t width() const { return shape.back(); }
    };
    dsv41::hparams hp_;
    int64_t prompt_len_ = 0;
    int64_t draft_step_ = 0;
    int64_t unmatched_ = 0;
    std::vector<int32_t> input_ids_, generated_ids_;
    table router_prefill_, router_decode_, draft_router_;
    std::map<int, table> indexer_prefill_, indexer_decode_, cand_prefill_;
};

}  // namespace moestream
