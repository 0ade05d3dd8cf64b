// The one selection rule of the router, the indexer and the candidate blocks: the indices of the
// k largest of v[0..n), ordered by value (descending), ties to the lower index (the reference's
// torch.topk leaves the order among equal values unspecified, dsv41-architecture.md §3.4.8).
// Every backend selects by this rule, so picks agree exactly wherever the scores do.
#pragma once

#include <cstdint>

namespace moestream {

void top_k(const float* v, int64_t n, int64_t k, int32_t* out);

}  // namespace moestream
