// Row kernels of the CPU backend's non-matmul ops (model/cpu_backend.cpp drives them over rows
// and threads). Each kernel is compiled for AVX-512, AVX2 and baseline x86-64 and picked at load
// time; every clone performs the same IEEE operations in the same order (fixed lane structures,
// no fp contraction, no -ffast-math), so the clones, and therefore machines, agree bit for bit.
// A kernel's result for one row depends on that row's inputs only.
#pragma once

#include <cstdint>

namespace moestream::elementwise {

// out[h] = Σ_i q_h[i] key[i] for h < n_heads (q_h = q + h q_stride): fp32 products summed in
// fp32 over 32 fixed lanes (lane k takes i ≡ k mod 32, in order), then the lanes in a fixed tree
// (k += k + 16, + 8, + 4, + 2, + 1). The backend's former per-head dot, several heads at a time.
// The key in fp32 (the indexer's keys) or as an attention key (bf16 bits in the storage order of
// model/attention_keys.h): the same values, the same bits.
void dot_heads(const float* q, int64_t q_stride, int n_heads, const float* key, int64_t n, float* out);
void dot_heads(const float* q, int64_t q_stride, int n_heads, const uint16_t* key, int64_t n, float* out);

// out[j] = dot_heads' value for one head q against keys[j], j < n_keys: the same lanes and tree
// per key, several keys sharing each load of q (one head's scores over a row's keys).
// Keys stored as attention_row's (model/attention_keys.h).
void dot_keys(const float* q, const uint16_t* const* keys, int64_t n_keys, int64_t n, float* out);

// Σ x[i]² in double over 16 fixed lanes (i mod 16), then the lanes in a fixed tree. Each square
// is exact in double; only the order of the sum differs from a serial double loop (a relative
// difference of ~1e-16, far below the fp32 the statistic is used in).
double sum_of_squares(const float* x, int64_t n);

// Σ double((a[i] b[i]) c[i]) (fp32 products, double sum) over 16 fixed lanes as above.
double sum_of_triple_products(const float* a, const float* b, const float* c, int64_t n);

// 1 / sqrt(mean(x²) + eps) in fp32 from the double sum of squares.
float inv_rms(const float* x, int64_t n, float eps);

// y[i] = x[i] s (then · w[i] when w is not null), rounded to bf16 when round; y may alias x.
void scale_row(const float* x, float s, const float* w, float* y, int64_t n, bool round);

// y[i] = exp(x[i]) in fp32, evaluated in double (range reduction by ln 2, degree-11 Taylor
// polynomial, relative error ~1e-15) and rounded once to fp32: the correctly rounded value but
// within ~5e-8 ulp of a tie (2 of 747M inputs sampled over [-110, 90] were off, by one ulp, error
// 0.50000005 ulp; glibc's expf, within 0.502 ulp, was off on 56638 of them). +inf -> inf,
// -inf -> 0, overflow -> inf, underflow -> 0 or a subnormal, NaN -> NaN. The same bits on every
// machine (plain double arithmetic), unlike glibc, whose expf differs between its FMA and non-FMA
// variants. y may alias x.
void exp_floats(const float* x, float* y, int64_t n);

// g[i] = bf16(w · (min(g[i], limit) / (1 + exp(-min(g[i], limit)))) · clamp(u[i], ±limit)), in place.
void swiglu_row(float* g, const float* u, int64_t n, float limit, float w);

// out[d] = bf16(Σ_k p[k] H[k][d]) for d < width, the sum over k ascending from 0 (H: hc rows
// `stride` floats apart; a column range of the streams is H + d0 with the row stride).
void collapse_cols(const float* H, int hc, int64_t stride, int64_t width, const float* p, float* out);

// out[j][d] = bf16(post[j] f[d] + Σ_i C[i][j] H[i][d]) for d < width, the sum over i ascending
// from 0 (H and out: hc rows `stride` floats apart). Every column is computed alone, so a range
// of columns gives the bits of the whole row. out may be H itself (each block of d is read
// completely before it is written); hc <= kMaxHc.
inline constexpr int kMaxHc = 16;
void expand_cols(const float* f, const float* H, int hc, int64_t stride, int64_t width, const float* post,
                 const float* C, float* out);

// Interleaved pairs (t[2i], t[2i+1]) = bf16(a c_i - b s_i, a s_i + b c_i) for i < pairs.
void rotate_pairs(float* t, const float* c, const float* s, int64_t pairs);

// One slice [d0, d0 + width) of every head's attention output for one query row:
// out[h][d] = bf16((Σ_i p[h][i] key_i[d]) · inv[h]), the sum over keys ascending from 0
// (p: n_heads rows of n_keys weights, inv: n_heads factors; keys stored as attention_row's).
// width <= kAttentionSlice.
inline constexpr int64_t kAttentionSlice = 16;
void attend_slice(const uint16_t* const* keys, int64_t n_keys, const float* p, const float* inv, int n_heads,
                  int64_t head_dim, int64_t d0, int64_t width, float* out);

// Every slice of one head's attention output: out[d] = bf16((Σ_i p[i] key_i[d]) · inv) for
// d < head_dim, each value by attend_slice's operations (keys ascending from 0), the keys read
// once each rather than once per slice.
void attend_head(const uint16_t* const* keys, int64_t n_keys, const float* p, float inv, int64_t head_dim, float* out);

}  // namespace moestream::elementwise
