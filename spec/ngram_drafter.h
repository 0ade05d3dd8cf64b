// Prompt lookup: the longest suffix of the context (max_n down to min_n tokens) that occurred
// earlier in it, and the tokens that followed its latest earlier occurrence. No model: strong
// where the output repeats the context (an agent's edits of a file it was shown, quoted text).
#pragma once

#include "spec/drafter.h"

namespace moestream::spec {

class ngram_drafter final : public drafter {
  public:
    explicit ngram_drafter(int min_n = 2, int max_n = 4) : min_n_(min_n), max_n_(max_n) {}
    std::string name() const override { return "ngram"; }
    std::vector<int32_t> propose(std::span<const int32_t> context, int k) override;

  private:
    int min_n_, max_n_;
};

}  // namespace moestream::spec
