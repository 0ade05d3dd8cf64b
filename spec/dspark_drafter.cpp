#include "spec/dspark_drafter.h"

#include <algorithm>

namespace moestream::spec {

std::vector<int32_t> dspark_drafter::propose(std::span<const int32_t> context, int k) {
    if (context.empty() || k <= 0) return {};
    if (auto st = m_.draft(seq_, context.back(), out_); !st) {
        error_ = st.message();
        ++failures_;
        return {};
    }
    const size_t n = std::min<size_t>(size_t(k), out_.tokens.size());
    return std::vector<int32_t>(out_.tokens.begin(), out_.tokens.begin() + n);
}

}  // namespace moestream::spec
