#include "spec/draft_policy.h"

namespace moestream::spec {
namespace {

constexpr double kAverage = 0.2;     // weight of a new step time in its k's average
constexpr uint64_t kExplore = 16;    // every this many steps, a k other than the best is tried

}  // namespace

double draft_policy::acceptance(int position) const {
    if (position < 1 || position > max_k_) return 0.0;
    return (double(kept_[size_t(position)]) + 1.0) / (double(tried_[size_t(position)]) + 2.0);
}

double draft_policy::expected_tokens(int k) const {
    double e = 1.0, survive = 1.0;
    for (int i = 1; i <= k && i <= max_k_; ++i) {
        survive *= acceptance(i);
        e += survive;
    }
    return e;
}

double draft_policy::step_seconds(int k) const {
    if (steps_[size_t(k)] > 0) return seconds_[size_t(k)];
    // The nearest measured k below and above, linear between or beyond them.
    int lo = -1, hi = -1;
    for (int j = k - 1; j >= 0 && lo < 0; --j)
        if (steps_[size_t(j)] > 0) lo = j;
    for (int j = k + 1; j <= max_k_ && hi < 0; ++j)
        if (steps_[size_t(j)] > 0) hi = j;
    if (lo >= 0 && hi >= 0)
        return seconds_[size_t(lo)] + (seconds_[size_t(hi)] - seconds_[size_t(lo)]) * double(k - lo) / double(hi - lo);
    const int a = lo >= 0 ? lo : hi;
    if (a < 0) return 0.0;
    // One side only: the slope between it and its nearest measured neighbour on that side, else
    // the optimistic guess that a row costs a tenth of a step (tried, then measured).
    int b = -1;
    for (int j = a + (lo >= 0 ? -1 : 1); j >= 0 && j <= max_k_ && b < 0; j += lo >= 0 ? -1 : 1)
        if (steps_[size_t(j)] > 0) b = j;
    const double slope = b >= 0 ? (seconds_[size_t(a)] - seconds_[size_t(b)]) / double(a - b) : 0.1 * seconds_[size_t(a)];
    const double t = seconds_[size_t(a)] + slope * double(k - a);
    return t > 0 ? t : seconds_[size_t(a)];
}

int draft_policy::choose() {
    ++step_;
    if (max_k_ == 0) return 0;
    int best = 0;
    double best_rate = -1;
    for (int k = 0; k <= max_k_; ++k) {
        const double t = step_seconds(k);
        const double rate = t > 0 ? expected_tokens(k) / t : expected_tokens(k);
        if (rate > best_rate) best = k, best_rate = rate;
    }
    // Now and then a neighbour of the best, so that costs and acceptance stay measured.
    if (step_ % kExplore == 0) {
        const int other = best == max_k_ ? best - 1 : (best == 0 ? 1 : (step_ / kExplore % 2 ? best + 1 : best - 1));
        return other;
    }
    return best;
}

void draft_policy::record(int drafted, int accepted, double seconds) {
    if (drafted < 0 || drafted > max_k_ || accepted < 0 || accepted > drafted) return;
    record_drafts(drafted, accepted);
    record_step(drafted, seconds);
}

void draft_policy::record_drafts(int drafted, int accepted) {
    if (drafted < 0 || drafted > max_k_ || accepted < 0 || accepted > drafted) return;
    for (int i = 1; i <= drafted; ++i) {
        if (i > accepted + 1) break;  // positions after the first rejection were not tested
        ++tried_[size_t(i)];
        if (i <= accepted) ++kept_[size_t(i)];
    }
}

void draft_policy::record_step(int drafted, double seconds) {
    if (drafted < 0 || drafted > max_k_ || !(seconds >= 0)) return;
    double& s = seconds_[size_t(drafted)];
    s = steps_[size_t(drafted)] == 0 ? seconds : (1 - kAverage) * s + kAverage * seconds;
    ++steps_[size_t(drafted)];
}

}  // namespace moestream::spec
