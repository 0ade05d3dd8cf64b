#include "model/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

// Draws must not depend on the compiler fusing a*b+c into an FMA (clang does so by default
// when the target has FMA, e.g. with -march=native); GCC in ISO mode already never contracts.
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

namespace moestream {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// exp(x) = 2^m * 2^(j/64) * exp(r), x = (64 m + j) ln2/64 + r, |r| <= ln2/128. The split of
// ln2/64 is fdlibm's ln 2 (hi part with 21 trailing zero bits, so k * kLn2Hi64 is exact for
// |k| < 2^17) divided by 64, which is exact.
constexpr double kLn2Hi64 = 6.93147180369123816490e-01 / 64;
constexpr double kLn2Lo64 = 1.90821492927058770002e-10 / 64;
constexpr double kInvLn2x64 = 1.44269504088896338700e+00 * 64;

// 2^(j/64), correctly rounded (written out: computing them here would go through the C library).
constexpr std::array<double, 64> kExp2Table{
    0x1.0000000000000p+0, 0x1.02c9a3e778061p+0, 0x1.059b0d3158574p+0, 0x1.0874518759bc8p+0,
    0x1.0b5586cf9890fp+0, 0x1.0e3ec32d3d1a2p+0, 0x1.11301d0125b51p+0, 0x1.1429aaea92de0p+0,
    0x1.172b83c7d517bp+0, 0x1.1a35beb6fcb75p+0, 0x1.1d4873168b9aap+0, 0x1.2063b88628cd6p+0,
    0x1.2387a6e756238p+0, 0x1.26b4565e27cddp+0, 0x1.29e9df51fdee1p+0, 0x1.2d285a6e4030bp+0,
    0x1.306fe0a31b715p+0, 0x1.33c08b26416ffp+0, 0x1.371a7373aa9cbp+0, 0x1.3a7db34e59ff7p+0,
    0x1.3dea64c123422p+0, 0x1.4160a21f72e2ap+0, 0x1.44e086061892dp+0, 0x1.486a2b5c13cd0p+0,
    0x1.4bfdad5362a27p+0, 0x1.4f9b2769d2ca7p+0, 0x1.5342b569d4f82p+0, 0x1.56f4736b527dap+0,
    0x1.5ab07dd485429p+0, 0x1.5e76f15ad2148p+0, 0x1.6247eb03a5585p+0, 0x1.6623882552225p+0,
    0x1.6a09e667f3bcdp+0, 0x1.6dfb23c651a2fp+0, 0x1.71f75e8ec5f74p+0, 0x1.75feb564267c9p+0,
    0x1.7a11473eb0187p+0, 0x1.7e2f336cf4e62p+0, 0x1.82589994cce13p+0, 0x1.868d99b4492edp+0,
    0x1.8ace5422aa0dbp+0, 0x1.8f1ae99157736p+0, 0x1.93737b0cdc5e5p+0, 0x1.97d829fde4e50p+0,
    0x1.9c49182a3f090p+0, 0x1.a0c667b5de565p+0, 0x1.a5503b23e255dp+0, 0x1.a9e6b5579fdbfp+0,
    0x1.ae89f995ad3adp+0, 0x1.b33a2b84f15fbp+0, 0x1.b7f76f2fb5e47p+0, 0x1.bcc1e904bc1d2p+0,
    0x1.c199bdd85529cp+0, 0x1.c67f12e57d14bp+0, 0x1.cb720dcef9069p+0, 0x1.d072d4a07897cp+0,
    0x1.d5818dcfba487p+0, 0x1.da9e603db3285p+0, 0x1.dfc97337b9b5fp+0, 0x1.e502ee78b3ff6p+0,
    0x1.ea4afa2a490dap+0, 0x1.efa1bee615a27p+0, 0x1.f50765b6e4540p+0, 0x1.fa7c1819e90d8p+0,
};

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

template <class... Parts>
status fail(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    return make_error(os.str());
}

// The one order every sort and every "best" uses: higher logit first, lower id on ties. It is a
// strict total order, so sorted prefixes are the same whatever algorithm a library uses.
struct better {
    template <class C>
    bool operator()(const C& a, const C& b) const {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    }
};

// Puts the best (mid - first) elements of [first, last) at the front, in order. nth_element then
// sort rather than partial_sort: partial_sort is a heap sort, several times slower for the
// thousands of elements a wide nucleus needs.
template <class It>
void sort_prefix(It first, It mid, It last) {
    if (mid != last) std::nth_element(first, mid, last, better{});
    std::sort(first, mid, better{});
}

}  // namespace

// ---------------------------------------------------------------- deterministic pieces

sampler_rng::sampler_rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) s = splitmix64(x);  // never all zero: four distinct splitmix outputs
}

uint64_t sampler_rng::next() {
    const uint64_t out = std::rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return out;
}

double sampler_rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

double deterministic_exp(double x) {
    if (!(x > -745.2)) return 0.0;  // -inf, NaN and anything below half the smallest subnormal
    if (x > 709.7) return kInf;
    // Adding and removing 1.5 * 2^52 rounds to the nearest integer (ties to even) in the default
    // rounding mode, without a library call.
    const double shifter = 0x1.8p52;
    const double k = (x * kInvLn2x64 + shifter) - shifter;
    const double r = (x - k * kLn2Hi64) - k * kLn2Lo64;
    // Taylor to degree 5: the remainder r^6/720 is below 4e-17.
    const double p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120)))));
    const int ki = int(k);
    const int m = ki >> 6;  // floor division: C++20 defines >> on negatives as arithmetic
    const double t = kExp2Table[size_t(ki & 63)] * p;
    // t * 2^m: exact while 2^m is a normal number; ldexp rounds correctly into the subnormals.
    if (m < -1022) return std::ldexp(t, m);
    return t * std::bit_cast<double>(uint64_t(1023 + m) << 52);
}

// ---------------------------------------------------------------- parameters

status sampling_params::validate(int64_t vocab) const {
    if (vocab <= 0 || vocab > INT32_MAX) return fail("the vocabulary size must be in [1, 2^31), got ", vocab);
    if (!std::isfinite(temperature)) return fail("temperature must be a finite number, got ", temperature);
    if (top_k < 0) return fail("top_k must be >= 0 (0 disables it), got ", top_k);
    if (!(top_p > 0.0f && top_p <= 1.0f)) return fail("top_p must be in (0, 1], got ", top_p);
    if (!(min_p >= 0.0f && min_p <= 1.0f)) return fail("min_p must be in [0, 1], got ", min_p);
    if (!std::isfinite(presence_penalty))
        return fail("presence_penalty must be a finite number, got ", presence_penalty);
    if (!std::isfinite(frequency_penalty))
        return fail("frequency_penalty must be a finite number, got ", frequency_penalty);
    if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
        return fail("repeat_penalty must be a finite number > 0 (1 disables it), got ", repeat_penalty);
    if (repeat_last_n < -1)
        return fail("repeat_last_n must be >= -1 (-1: the whole history, 0: no penalties), got ", repeat_last_n);
    if (n_probs < 0 || n_probs > 20) return fail("n_probs must be in [0, 20], got ", n_probs);
    for (const auto& b : logit_bias) {
        if (b.token < 0 || b.token >= vocab)
            return fail("logit_bias token ", b.token, " is outside the vocabulary of ", vocab);
        if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity())
            return fail("logit_bias for token ", b.token, " must be a finite number or -inf, got ", b.bias);
    }
    return {};
}

// ---------------------------------------------------------------- sampler

sampler::sampler(sampling_params params, int64_t vocab)
    : params_(std::move(params)), vocab_(vocab), rng_(params_.seed) {
    const status st = params_.validate(vocab);
    MS_ASSERT_MSG(st.ok(), st.ok() ? "" : st.message().c_str());
    const size_t v = size_t(vocab);
    cand_.resize(v);
    if (penalties_active()) {
        const size_t window = params_.repeat_last_n > 0 ? size_t(params_.repeat_last_n) : v;
        count_.assign(v, 0);
        slot_.assign(v, -1);
        distinct_.reserve(std::min(v, window));  // at most this many distinct tokens at once
        if (params_.repeat_last_n > 0) ring_.reserve(std::min<size_t>(window, 4096));
    }
}

bool sampler::penalties_active() const {
    return params_.repeat_last_n != 0 &&
           (params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f);
}

void sampler::count_in(int32_t token) {
    if (count_[size_t(token)]++ == 0) {
        slot_[size_t(token)] = int32_t(distinct_.size());
        distinct_.push_back(token);
    }
}

void sampler::count_out(int32_t token) {
    if (--count_[size_t(token)] > 0) return;
    // Swap-remove from distinct_: the order of distinct_ never matters (each token is penalised
    // independently of the others).
    const int32_t s = slot_[size_t(token)];
    const int32_t moved = distinct_.back();
    distinct_[size_t(s)] = moved;
    slot_[size_t(moved)] = s;
    distinct_.pop_back();
    slot_[size_t(token)] = -1;
}

void sampler::accept(int32_t token) {
    MS_ASSERT_MSG(token >= 0 && token < vocab_, "sampler::accept: token outside the vocabulary");
    if (!penalties_active()) return;
    if (params_.repeat_last_n > 0) {
        const size_t window = size_t(params_.repeat_last_n);
        if (ring_.size() < window) {
            ring_.push_back(token);
        } else {
            count_out(ring_[ring_head_]);
            ring_[ring_head_] = token;
            ring_head_ = (ring_head_ + 1) % window;
        }
    }
    count_in(token);
}

void sampler::reset(std::span<const int32_t> history) {
    rng_ = sampler_rng(params_.seed);
    for (int32_t t : distinct_) {
        count_[size_t(t)] = 0;
        slot_[size_t(t)] = -1;
    }
    distinct_.clear();
    ring_.clear();
    ring_head_ = 0;
    for (int32_t t : history) accept(t);
}

void sampler::apply_penalties(std::span<candidate> all) const {
    const double rp = params_.repeat_penalty;
    const double freq = params_.frequency_penalty;
    const double presence = params_.presence_penalty;
    for (int32_t t : distinct_) {
        double& x = all[size_t(t)].logit;
        // llama.cpp's rule: dividing a negative logit would raise it, so those are multiplied.
        if (rp != 1.0) x = x <= 0.0 ? x * rp : x / rp;
        x -= double(count_[size_t(t)]) * freq + presence;
    }
}

size_t sampler::truncate(size_t n, double max_logit) {
    const auto first = cand_.begin();

    if (params_.top_k > 0 && size_t(params_.top_k) < n) {
        sort_prefix(first, first + params_.top_k, first + ptrdiff_t(n));
        n = size_t(params_.top_k);
        sorted_ = true;
    }

    if (params_.top_p < 1.0f) {
        // The smallest prefix, by descending probability (temperature 1, as in llama.cpp's chain),
        // whose mass reaches top_p. That prefix is usually short, so it is sorted in growing
        // blocks rather than sorting the whole vocabulary.
        double total = 0.0;
        for (size_t i = 0; i < n; ++i) total += deterministic_exp(cand_[i].logit - max_logit);
        const double need = double(params_.top_p) * total;
        size_t sorted_len = sorted_ ? n : 0;
        size_t keep = n;
        double cum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            if (i == sorted_len) {
                sorted_len = std::min(n, std::max<size_t>(64, sorted_len * 4));
                sort_prefix(first + ptrdiff_t(i), first + ptrdiff_t(sorted_len), first + ptrdiff_t(n));
            }
            cum += deterministic_exp(cand_[i].logit - max_logit);
            if (cum >= need) {
                keep = i + 1;
                break;
            }
        }
        n = keep;  // if rounding never reached `need`, everything was sorted and is kept
        sorted_ = true;
    }

    if (params_.min_p > 0.0f) {
        // p >= min_p * p_max, i.e. exp(logit - max) >= min_p; keeps the order and the maximum.
        const double min_p = params_.min_p;
        size_t m = 0;
        for (size_t i = 0; i < n; ++i)
            if (deterministic_exp(cand_[i].logit - max_logit) >= min_p) cand_[m++] = cand_[i];
        n = m;
    }
    return n;
}

void sampler::fill_top(size_t n, double max_logit, double temp, double log_sum, sample_result& out) const {
    // cand_[0, n) is in id order here, so keeping the earlier of equal logits puts lower ids
    // first. `logprob` holds the logit until the final conversion.
    auto& top = out.top;
    top.reserve(size_t(params_.n_probs));
    const size_t want = std::min(size_t(params_.n_probs), n);
    for (size_t i = 0; i < n; ++i) {
        const double x = cand_[i].logit;
        if (top.size() == want) {
            if (!(x > top.back().logprob)) continue;
            top.pop_back();
        }
        size_t p = top.size();
        while (p > 0 && top[p - 1].logprob < x) --p;
        top.insert(top.begin() + ptrdiff_t(p), token_logprob{cand_[i].id, x});
    }
    for (auto& e : top) e.logprob = (e.logprob - max_logit) / temp - log_sum;
}

status sampler::sample(std::span<const float> logits, sample_result& out) {
    MS_ASSERT_MSG(int64_t(logits.size()) == vocab_, "sampler::sample: logits size differs from the vocabulary");
    out.token = -1;
    out.logprob = 0.0;
    out.top.clear();

    // Load in double (so bias and penalties cannot overflow). NaN is banned; +inf becomes the
    // largest finite float, its limit, so such tokens win without producing inf - inf.
    const size_t v = size_t(vocab_);
    for (size_t i = 0; i < v; ++i) {
        const float l = logits[i];
        const double x = std::isnan(l) ? -kInf : l == std::numeric_limits<float>::infinity() ? double(FLT_MAX) : double(l);
        cand_[i] = candidate{int32_t(i), x};
    }
    for (const auto& b : params_.logit_bias) cand_[size_t(b.token)].logit += double(b.bias);
    if (penalties_active()) apply_penalties(cand_);

    // Drop banned tokens, keeping id order.
    size_t n = 0;
    for (size_t i = 0; i < v; ++i)
        if (cand_[i].logit > -kInf) cand_[n++] = cand_[i];
    if (n == 0) return make_error("every token is banned: all logits are -inf or NaN after logit_bias and penalties");

    // The full-vocabulary distribution at the sampling temperature (1 when greedy), for the
    // reported log-probabilities. Weights use (x - max) / T, which cannot overflow even for a
    // tiny T. The argmax is the first maximum in id order, i.e. the lowest id on ties.
    const bool greedy = !(params_.temperature > 0.0f);
    const double temp = greedy ? 1.0 : double(params_.temperature);
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
        if (cand_[i].logit > cand_[best].logit) best = i;
    const double max_logit = cand_[best].logit;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += deterministic_exp((cand_[i].logit - max_logit) / temp);
    const double log_sum = std::log(sum);  // reporting only: never decides a token
    if (params_.n_probs > 0) fill_top(n, max_logit, temp, log_sum, out);
    auto pick = [&](size_t i) {
        out.token = cand_[i].id;
        out.logprob = (cand_[i].logit - max_logit) / temp - log_sum;
    };
    if (greedy) {
        pick(best);
        return {};
    }

    sorted_ = false;
    const size_t kept = truncate(n, max_logit);  // never drops the maximum, so max_logit still holds

    // Softmax over the kept tokens and one draw. Unchanged set and order: same sum, bit for bit.
    double total = sum;
    if (kept != n || sorted_) {
        total = 0.0;
        for (size_t i = 0; i < kept; ++i) total += deterministic_exp((cand_[i].logit - max_logit) / temp);
    }
    const double target = rng_.uniform() * total;
    double cum = 0.0;
    size_t last_nonzero = 0;
    for (size_t i = 0; i < kept; ++i) {
        const double w = deterministic_exp((cand_[i].logit - max_logit) / temp);
        if (w == 0.0) continue;  // an underflowed weight can never be chosen
        last_nonzero = i;
        cum += w;
        if (cum > target) {
            pick(i);
            return {};
        }
    }
    pick(last_nonzero);  // only if rounding left `target` at the very top of the range
    return {};
}

result<sample_result> sampler::sample(std::span<const float> logits) {
    sample_result r;
    MS_TRY(sample(logits, r));
    return r;
}

}  // namespace moestream
