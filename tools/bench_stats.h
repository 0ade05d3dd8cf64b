// Small statistics the bench commands report (medians of rounds).
#pragma once

#include <algorithm>
#include <vector>

namespace moestream::tools {

// The median of `v` (the upper one of an even count), 0 when empty.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace moestream::tools
