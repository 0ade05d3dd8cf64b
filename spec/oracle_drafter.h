// For measurement: proposes a recorded continuation (the target's own greedy output after the
// prompt), each proposed token kept with probability `acceptance` and otherwise replaced by another
// one (so 1.0 proposes the continuation exactly: the CLI's `--drafter oracle:RATE`), so acceptance
// can be dialled on synthetic models whose trained draft accepts little by nature. The replacement
// of a position depends only on the seed and the position, so runs are reproducible.
#pragma once

#include "spec/drafter.h"

namespace moestream::spec {

class oracle_drafter final : public drafter {
  public:
    // continuation[i] is the token at position prompt_len + i; `vocab` bounds the replacements.
    oracle_drafter(std::vector<int32_t> continuation, int64_t prompt_len, double acceptance, int32_t vocab,
                   uint64_t seed = 1);
    std::string name() const override;
    std::vector<int32_t> propose(std::span<const int32_t> context, int k) override;

  private:
    std::vector<int32_t> continuation_;
    int64_t prompt_len_;
    double acceptance_;
    int32_t vocab_;
    uint64_t seed_;
};

}  // namespace moestream::spec
