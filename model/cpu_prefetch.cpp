// The CPU backend's prefetch hint: the weights' bytes go to the thread pool, whose idle workers
// pull them into their caches between calls (thread_pool::prefetch), so the memory system keeps
// streaming the next layer while the dispatching thread runs decode's serial parts.
#include "model/cpu_backend.h"

namespace moestream {

void cpu_backend::prefetch(std::span<const weight_view> weights) {
    prefetch_ranges_.clear();
    for (const weight_view& w : weights)
        if (!w.empty() && w.rows > 0) prefetch_ranges_.push_back({w.data, size_t(w.rows) * w.row_stride});
    pool_.prefetch(prefetch_ranges_);
}

}  // namespace moestream
