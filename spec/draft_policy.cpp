#include "spec/draft_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace moestream::spec {
namespace {

constexpr double kAverage = 0.2;        // weight of a new step time in its k's average
constexpr uint64_t kExplore = 16;       // at most every this many steps, a k other than the best is tried
constexpr double kExploreShare = 0.02;  // of the time, what exploring may cost
constexpr double kCreditSteps = 8;      // the most credit kept, in steps of the best k
constexpr double kRecentDecay = 0.97;   // per recorded step, of each k's count of recent measurements
constexpr double kTrust = 3;            // recent measurements at which a k's own average weighs 1/2
constexpr double kCostForget = 0.98;    // per step, of the cost model's sums (it follows the machine)
constexpr double kUnionForget = 0.995;  // per step, of the union model's sums (routing drifts slowly)
// The union prior (a = one row's experts, b = 1): a pseudo-step on ln a, and on b the weight of
// a tenth of one two-row step (sum of (ln T)^2), so a few multi-row steps decide the curve.
constexpr double kUnionPriorA = 1, kUnionPriorB = 0.05;
constexpr double kAcceptForget = 0.99;  // per verified step, of the acceptance counts
constexpr double kShareAverage = 0.3;   // weight of a new step in the not-resident share
constexpr double kRowsVariance = 0.01;  // the cost model needs steps of more than one row count
constexpr double kCalibrationPrior = 4;  // drafts' worth of a bin's prior (its own sigmoid)

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Feature order: on equally good fits the union's features explain the time before the rows do
// (the premise of the accounting: a streamed step costs its union), the draft's fixed cost last.
enum feature { f_base, f_missing, f_resident, f_rows, f_draft };

}  // namespace

double draft_policy::acceptance(int position) const {
    if (position < 1 || position > max_k_) return 0.0;
    // The prior of a position is the estimate of the one before it (1/2 for the first), worth
    // two drafts: positions the chosen k never reaches are not taken for coin flips, which
    // would keep a policy that found good drafts from ever trying longer blocks.
    double p = 0.5;
    for (int i = 1; i <= position; ++i) p = (kept_[size_t(i)] + 2.0 * p) / (tried_[size_t(i)] + 2.0);
    return p;
}

double draft_policy::expected_tokens(int k) const {
    double e = 1.0, survive = 1.0;
    for (int i = 1; i <= k && i <= max_k_; ++i) {
        survive *= acceptance(i);
        e += survive;
    }
    return e;
}

double draft_policy::interpolated_seconds(int k) const {
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

double draft_policy::expected_union(double rows) const {
    const double per_row = shape_.experts_per_row > 0 ? shape_.experts_per_row : first_per_row_;
    if (per_row <= 0 || rows <= 0) return -1;
    // ln U = alpha + beta ln T, least squares over the steps with the prior's pseudo-steps.
    const double a0 = std::log(per_row);
    const double m00 = uw_ + kUnionPriorA, m01 = ux_, m11 = uxx_ + kUnionPriorB;
    const double r0 = uy_ + kUnionPriorA * a0, r1 = uxy_ + kUnionPriorB * 1.0;
    const double det = m00 * m11 - m01 * m01;
    double beta = det > 0 ? (m00 * r1 - m01 * r0) / det : 1.0;
    // A row adds at most its own experts and never removes any: 0 <= beta <= 1.
    beta = std::clamp(beta, 0.0, 1.0);
    const double alpha = (r0 - m01 * beta) / m00;
    double u = std::exp(alpha + beta * std::log(rows));
    if (shape_.experts_max > 0) u = std::min(u, shape_.experts_max);
    return u;
}

void draft_policy::refit() const {
    if (!fit_stale_) return;
    fit_stale_ = false;
    fit_ = {};
    if (tw_ < 3) return;
    const double mean = trows_ / tw_;
    if (trows2_ / tw_ - mean * mean < kRowsVariance) return;  // one row count: no slope to see
    // Non-negative least squares over the 5 features by trying every subset (31 tiny solves,
    // in order of size, so the first of equally good fits is the simplest): a cost per expert
    // or per row is never negative, and a fit that wants one is explained by the others.
    double best_err = 0;
    vec best{};
    bool found = false;
    for (int size = 1; size <= kFeatures; ++size)
        for (unsigned mask = 1; mask < (1u << kFeatures); ++mask) {
            if (std::popcount(mask) != size) continue;
            int idx[kFeatures], n = 0;
            bool informative = true;
            for (int f = 0; f < kFeatures; ++f)
                if (mask & (1u << f)) {
                    if (!(ata_[size_t(f)][size_t(f)] > 0)) informative = false;
                    idx[n++] = f;
                }
            if (!informative) continue;
            // Gaussian elimination with partial pivoting on the subset's normal equations (a
            // relative ridge keeps near-collinear features solvable).
            double m[kFeatures][kFeatures + 1];
            for (int i = 0; i < n; ++i) {
                for (int j = 0; j < n; ++j) m[i][j] = ata_[size_t(idx[i])][size_t(idx[j])];
                m[i][i] *= 1 + 1e-9;
                m[i][n] = atb_[size_t(idx[i])];
            }
            bool ok = true;
            for (int c = 0; c < n && ok; ++c) {
                int p = c;
                for (int r = c + 1; r < n; ++r)
                    if (std::fabs(m[r][c]) > std::fabs(m[p][c])) p = r;
                if (!(std::fabs(m[p][c]) > 0)) {
                    ok = false;
                    break;
                }
                if (p != c)
                    for (int j = 0; j <= n; ++j) std::swap(m[c][j], m[p][j]);
                for (int r = 0; r < n; ++r) {
                    if (r == c) continue;
                    const double f = m[r][c] / m[c][c];
                    for (int j = c; j <= n; ++j) m[r][j] -= f * m[c][j];
                }
            }
            if (!ok) continue;
            vec coef{};
            for (int i = 0; i < n && ok; ++i) {
                const double v = m[i][n] / m[i][i];
                if (!std::isfinite(v) || v < 0) ok = false;
                coef[size_t(idx[i])] = v;
            }
            if (!ok) continue;
            // The squared error up to a constant: c'Ac - 2c'b.
            double err = 0;
            for (int i = 0; i < kFeatures; ++i) {
                double ac = 0;
                for (int j = 0; j < kFeatures; ++j) ac += ata_[size_t(i)][size_t(j)] * coef[size_t(j)];
                err += coef[size_t(i)] * (ac - 2 * atb_[size_t(i)]);
            }
            if (!found || err < best_err - 1e-12 * std::fabs(best_err)) {
                best_err = err;
                best = coef;
                found = true;
            }
        }
    if (!found) return;
    fit_.base = best[f_base];
    fit_.draft = best[f_draft];
    fit_.per_row = best[f_rows];
    fit_.per_resident = best[f_resident];
    fit_.per_missing = best[f_missing];
    fit_.ready = true;
}

const draft_policy::cost_fit& draft_policy::cost() const {
    refit();
    return fit_;
}

double draft_policy::modelled_seconds(int k) const {
    refit();
    if (!fit_.ready || k < 0 || k > max_k_) return -1;
    const double rows = double(base_rows_) + double(drafting_) * double(k);
    const double u = union_seen_ ? std::max(0.0, expected_union(rows)) : 0.0;
    const double missing = u * miss_share_;
    return fit_.base + fit_.draft * (k > 0 ? double(drafting_) : 0.0) + fit_.per_row * rows +
           fit_.per_resident * (u - missing) + fit_.per_missing * missing;
}

double draft_policy::measured_weight(int k) const { return recent_[size_t(k)] / (recent_[size_t(k)] + kTrust); }

double draft_policy::step_seconds(int k) const {
    if (k < 0 || k > max_k_) return 0.0;
    const double model = modelled_seconds(k);
    if (model < 0) return interpolated_seconds(k);
    if (steps_[size_t(k)] == 0) return model;
    const double w = measured_weight(k);
    return w * seconds_[size_t(k)] + (1 - w) * model;
}

int draft_policy::choose(int base_rows, int drafting) {
    ++step_;
    explored_ = false;
    base_rows_ = std::max(1, base_rows);
    drafting_ = std::max(0, drafting);
    if (max_k_ == 0 || drafting_ == 0) return 0;
    // Cold start: a plain step, then one draft (the cheapest probe), before any longer block is
    // paid for: until both are measured every cost is a guess, and a guess that drafted 5 first
    // paid a block of rejected rows' experts from disk (bench spec on the H200, 2026-12-03).
    if (steps_[0] == 0) return 0;
    if (std::all_of(steps_.begin() + 1, steps_.end(), [](uint64_t n) { return n == 0; })) return 1;
    int best = 0;
    double best_rate = -1;
    for (int k = 0; k <= max_k_; ++k) {
        const double t = step_seconds(k);
        const double rate = t > 0 ? expected_tokens(k) / t : expected_tokens(k);
        if (rate > best_rate) best = k, best_rate = rate;
    }
    // Now and then a neighbour of the best, so that costs and acceptance stay measured, as
    // often as a share of the time pays for: each step earns kExploreShare of the best's time,
    // and a try spends what it is expected to lose (its time less what its tokens take at the
    // best rate). A neighbour that costs a few steps (a draft head dearer than the target's step)
    // is then tried rarely, a cheap one every kExplore steps.
    const double t_best = step_seconds(best);
    credit_ = std::min(credit_ + kExploreShare * t_best, kCreditSteps * t_best);
    if (step_ % kExplore == 0) {
        const int other = best == max_k_ ? best - 1 : (best == 0 ? 1 : (step_ / kExplore % 2 ? best + 1 : best - 1));
        const double loss = best_rate > 0 && t_best > 0
                                ? std::max(0.0, step_seconds(other) - expected_tokens(other) / best_rate)
                                : 0.0;
        if (loss <= credit_) {
            credit_ -= loss;
            explored_ = true;
            return other;
        }
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
    if (drafted == 0) return;
    for (size_t i = 1; i < tried_.size(); ++i) tried_[i] *= kAcceptForget, kept_[i] *= kAcceptForget;
    for (int i = 1; i <= drafted; ++i) {
        if (i > accepted + 1) break;  // positions after the first rejection were not tested
        tried_[size_t(i)] += 1;
        if (i <= accepted) kept_[size_t(i)] += 1;
    }
}

void draft_policy::record_drafts(int drafted, int accepted, std::span<const float> confidences) {
    record_drafts(drafted, accepted);
    if (drafted < 0 || drafted > max_k_ || accepted < 0 || accepted > drafted) return;
    if (drafted == 0 || confidences.size() < size_t(drafted)) return;
    for (int b = 0; b < kBins; ++b) bin_tried_[size_t(b)] *= kAcceptForget, bin_kept_[size_t(b)] *= kAcceptForget;
    // The drafts after the first rejection were not tested: they say nothing.
    for (int i = 0; i < drafted && i <= accepted; ++i) {
        const float c = confidences[size_t(i)];
        if (!std::isfinite(c)) continue;
        const int b = std::min(kBins - 1, int(sigmoid(c) * kBins));
        bin_tried_[size_t(b)] += 1;
        if (i < accepted) bin_kept_[size_t(b)] += 1;
    }
}

double draft_policy::calibrated(float confidence) const {
    if (!std::isfinite(confidence)) return 0.0;
    const double prior = sigmoid(confidence);
    const int b = std::min(kBins - 1, int(prior * kBins));
    return (bin_kept_[size_t(b)] + kCalibrationPrior * prior) / (bin_tried_[size_t(b)] + kCalibrationPrior);
}

double draft_policy::verify_seconds(double rows) const {
    const double u = union_seen_ ? std::max(0.0, expected_union(rows)) : 0.0;
    const double missing = u * miss_share_;
    return fit_.base + fit_.per_row * rows + fit_.per_resident * (u - missing) + fit_.per_missing * missing;
}

bool draft_policy::cuts_by_confidence(int base_rows) const {
    refit();
    // No cost model yet (or one that says nothing), or the step explores its k: every draft.
    return fit_.ready && verify_seconds(double(std::max(1, base_rows))) > 0 && !explored_;
}

int draft_policy::request(int k, bool whole_block, int base_rows) const {
    return k > 0 && whole_block && cuts_by_confidence(base_rows) ? max_k_ : k;
}

std::vector<int> draft_policy::trim(int base_rows, std::span<const std::vector<float>> confidences) const {
    std::vector<int> keep(confidences.size());
    for (size_t s = 0; s < confidences.size(); ++s) keep[s] = int(confidences[s].size());
    if (!cuts_by_confidence(base_rows)) return keep;
    const double rows0 = double(std::max(1, base_rows));
    const double t0 = verify_seconds(rows0);
    struct candidate {
        double survival;
        size_t seq;
        int position;  // 1-based
    };
    std::vector<candidate> all;
    for (size_t s = 0; s < confidences.size(); ++s) {
        double survival = 1;
        for (size_t j = 0; j < confidences[s].size(); ++j) {
            survival *= calibrated(confidences[s][j]);
            all.push_back({survival, s, int(j) + 1});
        }
    }
    // Decreasing survival; within a sequence survival never rises, and the stable sort keeps a
    // tie in draft order, so a draft always comes after the ones before it.
    std::stable_sort(all.begin(), all.end(), [](const candidate& a, const candidate& b) { return a.survival > b.survival; });
    std::fill(keep.begin(), keep.end(), 0);
    double tokens = rows0, rows = rows0;
    double best = tokens / t0;
    for (const candidate& c : all) {
        if (keep[c.seq] != c.position - 1) continue;  // its sequence stopped before it
        const double t = verify_seconds(rows + 1);
        const double rate = t > 0 ? (tokens + c.survival) / t : 0.0;
        if (!(rate > best)) break;  // the first that does not pay ends the block (the paper's rule)
        best = rate;
        tokens += c.survival;
        rows += 1;
        keep[c.seq] = c.position;
    }
    return keep;
}

void draft_policy::record_step(int drafted, double seconds) {
    step_sample s;
    s.drafted = drafted;
    s.seconds = seconds;
    record_step(s);
}

void draft_policy::record_step(const step_sample& s) {
    if (s.drafted < 0 || s.drafted > max_k_ || !(s.seconds >= 0) || !std::isfinite(s.seconds)) return;
    const size_t k = size_t(s.drafted);
    double& avg = seconds_[k];
    avg = steps_[k] == 0 ? s.seconds : (1 - kAverage) * avg + kAverage * s.seconds;
    ++steps_[k];
    for (double& r : recent_) r *= kRecentDecay;
    recent_[k] += 1;

    const double rows = s.rows > 0 ? double(s.rows) : double(s.drafted + 1);
    const double drafting = s.drafting >= 0 ? double(s.drafting) : (s.drafted > 0 ? 1.0 : 0.0);
    const bool known = s.experts > 0 && std::isfinite(s.experts);
    const double missing = known ? std::clamp(s.not_resident, 0.0, s.experts) : 0.0;
    if (known) {
        const double x = std::log(rows), y = std::log(s.experts);
        uw_ = kUnionForget * uw_ + 1, ux_ = kUnionForget * ux_ + x, uy_ = kUnionForget * uy_ + y;
        uxx_ = kUnionForget * uxx_ + x * x, uxy_ = kUnionForget * uxy_ + x * y;
        if (first_per_row_ <= 0) first_per_row_ = s.experts / rows;
        const double share = missing / s.experts;
        miss_share_ = union_seen_ ? (1 - kShareAverage) * miss_share_ + kShareAverage * share : share;
        union_seen_ = true;
    }
    vec phi{};
    phi[f_base] = 1;
    phi[f_missing] = missing;
    phi[f_resident] = known ? s.experts - missing : 0.0;
    phi[f_rows] = rows;
    phi[f_draft] = s.drafted > 0 ? drafting : 0.0;
    for (int i = 0; i < kFeatures; ++i) {
        for (int j = 0; j < kFeatures; ++j)
            ata_[size_t(i)][size_t(j)] = kCostForget * ata_[size_t(i)][size_t(j)] + phi[size_t(i)] * phi[size_t(j)];
        atb_[size_t(i)] = kCostForget * atb_[size_t(i)] + phi[size_t(i)] * s.seconds;
    }
    tw_ = kCostForget * tw_ + 1, trows_ = kCostForget * trows_ + rows, trows2_ = kCostForget * trows2_ + rows * rows;
    fit_stale_ = true;
}

}  // namespace moestream::spec
