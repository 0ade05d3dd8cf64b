#include "model/top_k.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "config/assert.h"

namespace moestream {

void top_k(const float* v, int64_t n, int64_t k, int32_t* out) {
    MS_ASSERT(k >= 0 && k <= n);
    if (k == 0) return;
    // Small k (the router's picks): insertion into the sorted prefix, no allocation. Entries come
    // in ascending index, so an equal score never displaces an earlier one: the same order as
    // the sort below (score descending, then lower index).
    if (k <= 16) {
        int64_t held = 0;
        for (int64_t i = 0; i < n; ++i) {
            const float x = v[i];
            if (held == k && !(x > v[out[k - 1]])) continue;
            int64_t at = held < k ? held++ : k - 1;
            while (at > 0 && x > v[out[at - 1]]) {
                out[at] = out[at - 1];
                --at;
            }
            out[at] = int32_t(i);
        }
        return;
    }
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return v[a] > v[b] || (v[a] == v[b] && a < b);
    });
    std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace moestream
