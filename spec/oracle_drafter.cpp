#include "spec/oracle_drafter.h"

#include <cstdio>

#include "model/sampler.h"

namespace moestream::spec {
oracle_drafter::oracle_drafter(std::vector<int32_t> continuation, int64_t prompt_len, double acceptance, int32_t vocab,
                               uint64_t seed)
    : continuation_(std::move(continuation)), prompt_len_(prompt_len), acceptance_(acceptance), vocab_(vocab), seed_(seed) {}

std::string oracle_drafter::name() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "oracle:%.2f", acceptance_);
    return buf;
}

std::vector<int32_t> oracle_drafter::propose(std::span<const int32_t> context, int k) {
    std::vector<int32_t> out;
    // The context ends with the token the next forward feeds: its successor is position size().
    for (int64_t pos = int64_t(context.size()); int64_t(out.size()) < k; ++pos) {
        const int64_t i = pos - prompt_len_;
        if (i < 0 || i >= int64_t(continuation_.size())) break;
        int32_t t = continuation_[size_t(i)];
        // The position's own stream of the sampler's generator: replaced or not, and by which.
        sampler_rng rng(seed_ ^ (uint64_t(pos) * 0x9e3779b97f4a7c15ull));
        if (rng.uniform() >= acceptance_) t = int32_t((uint64_t(t) + 1 + rng.next() % uint64_t(vocab_ - 1)) % uint64_t(vocab_));
        out.push_back(t);
    }
    return out;
}

}  // namespace moestream::spec
