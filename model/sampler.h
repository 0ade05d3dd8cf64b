// Token sampling for `moestream generate` and the HTTP server (OpenAI and llama-server
// parameters). The chain follows llama.cpp's default order:
//
//   logit_bias -> penalties (repeat, frequency, presence over the last repeat_last_n accepted
//   tokens) -> greedy (temperature <= 0) | top_k -> top_p -> min_p -> temperature -> softmax -> draw
//
// Reproducibility is part of the contract: the same seed and the same logits give the same tokens
// on every machine and standard library. Hence the random stream is a fixed, specified generator
// (splitmix64-seeded xoshiro256**, a uniform double from its top 53 bits), every sort is a strict
// total order (higher logit first, lower id on ties), every sum runs in a fixed order, and the
// exponentials that decide a draw come from `deterministic_exp` (IEEE +,-,*,/ only) rather than
// the C library, whose last bits differ between implementations.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "config/result.h"

namespace moestream {

struct logit_bias_entry {
    int32_t token = 0;
    float bias = 0.0f;  // added to the logit; -inf (or a large negative value) bans the token
};

struct sampling_params {
    float temperature = 1.0f;        // <= 0: greedy (argmax)
    int32_t top_k = 0;               // 0: off
    float top_p = 1.0f;              // 1: off
    float min_p = 0.0f;              // 0: off; keeps tokens with p >= min_p * p_max
    float presence_penalty = 0.0f;   // OpenAI: subtracted once from every token in the window
    float frequency_penalty = 0.0f;  // OpenAI: subtracted once per occurrence in the window
    float repeat_penalty = 1.0f;     // llama.cpp: positive logits divided, negative multiplied; 1: off
    int32_t repeat_last_n = 64;      // window of all three penalties; -1: whole history, 0: none
    uint64_t seed = 0;               // the caller picks a random one when the user gives none
    std::vector<logit_bias_entry> logit_bias;  // entries for the same token add up
    int32_t n_probs = 0;             // top log-probabilities to report, 0..20

    // An error naming the offending field; the server returns it as an HTTP 400.
    status validate(int64_t vocab) const;
};

struct token_logprob {
    int32_t token = 0;
    double logprob = 0.0;
};

// Log-probabilities (chosen token and `top`) are those of the distribution after logit_bias,
// penalties and temperature (1 when greedy), over the whole vocabulary, i.e. BEFORE top_k / top_p
// / min_p truncation: truncated tokens would otherwise all read -inf and the alternatives a client
// asks for would be missing. Banned tokens (-inf, NaN) never appear in `top`, so it may hold fewer
// than n_probs entries; `top` is sorted by descending probability, lower id first on ties.
struct sample_result {
    int32_t token = -1;  // -1 only after an error
    double logprob = 0.0;
    std::vector<token_logprob> top;
};

// xoshiro256** seeded through splitmix64, exactly as specified at prng.di.unimi.it.
class sampler_rng {
public:
    explicit sampler_rng(uint64_t seed);
    uint64_t next();
    double uniform();  // [0, 1): the top 53 bits of next() times 2^-53
private:
    uint64_t s_[4];
};

// exp(x) from IEEE basic operations only (Cody-Waite reduction by ln2/64, a written-out table of
// 2^(j/64), a degree-5 polynomial), so it is bit-identical everywhere; within ~2 ulp of exp (plus
// one subnormal ulp below 2^-1022). -inf gives 0. The sampler only calls it with x <= 0.
double deterministic_exp(double x);

// One sampler per sequence (it holds that sequence's history and random stream); not thread-safe.
class sampler {
public:
    // `params` must have passed validate(vocab) (asserted). All scratch is allocated here.
    sampler(sampling_params params, int64_t vocab);

    // Samples one token from logits[vocab] into `out` (reusable: after its first use with a given
    // n_probs, filling it allocates nothing). Does not record the token: call accept() for that.
    // Non-greedy calls consume exactly one random number. NaN logits count as banned; +inf ones
    // as the largest finite float. An error (out.token = -1) when every token is banned.
    status sample(std::span<const float> logits, sample_result& out);
    // Convenience form returning a fresh result.
    result<sample_result> sample(std::span<const float> logits);

    // Records a token into the penalty history (generated tokens; prompt tokens via reset()).
    void accept(int32_t token);
    // Back to the state right after construction (history emptied, random stream restarted from
    // params.seed), then accepts `history` in order.
    void reset(std::span<const int32_t> history = {});

    const sampling_params& params() const { return params_; }
    int64_t vocab() const { return vocab_; }

private:
    struct candidate {
        int32_t id;
        double logit;
    };

    bool penalties_active() const;
    void count_in(int32_t token);
    void count_out(int32_t token);
    void apply_penalties(std::span<candidate> all) const;
    // top_k, top_p, min_p on cand_[0, n), whose largest logit is max_logit; returns the kept
    // count (never fewer than 1: the maximum always survives).
    size_t truncate(size_t n, double max_logit);
    void fill_top(size_t n, double max_logit, double temp, double log_sum, sample_result& out) const;

    sampling_params params_;
    int64_t vocab_;
    sampler_rng rng_;
    std::vector<candidate> cand_;  // vocab entries, reused every call
    bool sorted_ = false;          // cand_'s live prefix is in (logit desc, id asc) order

    // Penalty history: occurrence counts in the window, the distinct tokens with a non-zero
    // count (and each one's slot there, for O(1) removal), and a ring of the last repeat_last_n
    // accepted tokens (unused for -1). The ring grows up to repeat_last_n as tokens arrive, so it
    // only allocates while the window is filling, never once it is full.
    std::vector<int32_t> count_;
    std::vector<int32_t> distinct_;
    std::vector<int32_t> slot_;
    std::vector<int32_t> ring_;
    size_t ring_head_ = 0;  // oldest entry once the ring is full
};

}  // namespace moestream
