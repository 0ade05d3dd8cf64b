#include "spec/dspark_drafter.h"

#include <algorithm>

namespace moestream::spec {

std::vector<int32_t> dspark_drafter::propose(std::span<const int32_t> context, int k) {
    return coro::run_sync([&](coro::executor& ex) { return propose_async(context, k, ex); });
}

coro::task<std::vector<int32_t>> dspark_drafter::propose_async(std::span<const int32_t> context, int k,
                                                               coro::executor& ex) {
    confidences_.clear();
    if (context.empty() || k <= 0) co_return std::vector<int32_t>{};
    if (auto st = co_await m_.draft_async(seq_, context.back(), out_, {}, ex); !st) {
        error_ = st.message();
        ++failures_;
        co_return std::vector<int32_t>{};
    }
    const size_t n = std::min<size_t>(size_t(k), out_.tokens.size());
    if (out_.confidence.size() >= n) confidences_.assign(out_.confidence.begin(), out_.confidence.begin() + std::ptrdiff_t(n));
    co_return std::vector<int32_t>(out_.tokens.begin(), out_.tokens.begin() + n);
}

}  // namespace moestream::spec
