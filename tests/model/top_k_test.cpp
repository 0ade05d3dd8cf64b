// Tests for the model's one selection rule (model/top_k.h): the k largest, ordered by
// score then lower index, identical on its small-k insertion path and its sort path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "model/top_k.h"
#include "tests/common/test_support.h"

using namespace moestream;

namespace {

std::vector<int32_t> expected_top(const std::vector<float>& v, int64_t k) {
    std::vector<int32_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)]; });
    idx.resize(size_t(k));
    return idx;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(top_k_tests)

// Random scores drawn from a handful of values (many ties, -inf masks) for every k from 0 to
// 40, so both the insertion path (k <= 16) and the sort path are compared with a stable sort.
BOOST_AUTO_TEST_CASE(largest_first_ties_to_the_lower_index) {
    std::mt19937 rng(7);
    const float inf = std::numeric_limits<float>::infinity();
    const float values[] = {-inf, -1.5f, 0.0f, 0.25f, 0.25f, 3.0f, inf};
    for (int trial = 0; trial < 300; ++trial) {
        const int64_t n = 1 + int64_t(rng() % 400);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = trial % 3 == 0 ? float(rng() % 1000) / 7.0f : values[rng() % 7];
        for (int64_t k = 0; k <= std::min<int64_t>(n, 40); ++k) {
            std::vector<int32_t> got(size_t(k) + 1, -7);
            top_k(v.data(), n, k, got.data());
            BOOST_REQUIRE_EQUAL(got[size_t(k)], -7);  // nothing written past k
            got.resize(size_t(k));
            const auto want = expected_top(v, k);
            BOOST_REQUIRE_MESSAGE(got == want, "n=" << n << " k=" << k << " trial=" << trial);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
