#include "spec/ngram_drafter.h"

#include <algorithm>

namespace moestream::spec {

std::vector<int32_t> ngram_drafter::propose(std::span<const int32_t> context, int k) {
    const int64_t len = int64_t(context.size());
    for (int n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
        const auto suffix = context.subspan(size_t(len - n));
        // The latest earlier occurrence (it ends before the suffix itself starts).
        for (int64_t start = len - n - 1; start >= 0; --start) {
            if (!std::equal(suffix.begin(), suffix.end(), context.begin() + start)) continue;
            const int64_t from = start + n, upto = std::min<int64_t>(from + k, len);
            return std::vector<int32_t>(context.begin() + from, context.begin() + upto);
        }
    }
    return {};
}

}  // namespace moestream::spec
