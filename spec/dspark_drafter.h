// The model's own DSpark head as a drafter: a block of up to dspark_block_size tokens after the
// token the next forward feeds, from the target's features of the last consumed row (the
// sequence's main hidden, which speculative decoding restores after a rollback) and its Markov
// chain. Needs a model with a draft head and the sequence it decodes.
#pragma once

#include "model/arch/deepseek41.h"
#include "spec/drafter.h"

namespace moestream::spec {

class dspark_drafter final : public drafter {
  public:
    dspark_drafter(dsv41::model& m, const dsv41::sequence_state& seq) : m_(m), seq_(seq) {}
    std::string name() const override { return "dspark"; }
    // propose_async() run to completion on the calling thread.
    std::vector<int32_t> propose(std::span<const int32_t> context, int k) override;
    coro::task<std::vector<int32_t>> propose_async(std::span<const int32_t> context, int k,
                                                  coro::executor& ex) override;
    // Set when a draft could not be made (the error of model::draft), else empty.
    const std::string& error() const { return error_; }
    int64_t failures() const override { return failures_; }
    std::span<const float> confidences() const override { return confidences_; }
    bool drafts_whole_block() const override { return true; }  // one head forward, any k

  private:
    dsv41::model& m_;
    const dsv41::sequence_state& seq_;
    dsv41::draft_output out_;
    std::vector<float> confidences_;  // of the last proposal's tokens
    std::string error_;
    int64_t failures_ = 0;
};

}  // namespace moestream::spec
