#include "model/cpu_elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "config/assert.h"
#include "model/attention_keys.h"
#include "model/bf16.h"
#include "model/numeric.h"

namespace moestream::elementwise {
namespace {

// The hot loops are compiled for AVX-512, AVX2 and baseline x86-64 (picked at load time). Their
// arithmetic is the same lane by lane in every clone (no fp contraction, fixed lane sums), so the
// clones give identical bits.
#define MS_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

constexpr int kSumLanes = 16;

// 16 fp32 lanes as a GCC vector: one AVX-512 register, two AVX2 or four SSE registers, the same
// element-wise IEEE operations in every clone. Used where the compiler's own vectorisation of
// the equivalent scalar loops was poor (it vectorised across heads with permutes).
// The helpers taking or returning these are always inlined, so the psABI note GCC gives for
// 64-byte vector values outside an AVX-512 context concerns no real call.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
constexpr int64_t kVec = 16;

[[gnu::always_inline]] inline f32x16 load16(const float* p) {
    f32x16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

[[gnu::always_inline]] inline void store16(float* p, const f32x16& v) {
    std::memcpy(p, &v, sizeof v);
}

// 16 bf16 values (their bits) widened to fp32: exact.
typedef uint16_t u16x16 __attribute__((vector_size(32)));
[[gnu::always_inline]] inline f32x16 load16(const uint16_t* p) {
    u16x16 b;
    std::memcpy(&b, p, sizeof b);
    const u32x16 u = __builtin_convertvector(b, u32x16) << 16;
    f32x16 v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

// One stored value as fp32 (the scalar tails, which attention keys keep in order).
[[gnu::always_inline]] inline float value_at(const float* p, int64_t i) { return p[i]; }
[[gnu::always_inline]] inline float value_at(const uint16_t* p, int64_t i) { return bf16_value(p[i]); }

// Values 0..15 and 16..31 of a 32-value chunk: of floats, or of an attention key's chunk in its
// interleaved order (model/attention_keys.h: dword j holds value j in its low word and value
// j + 16 in its high word), as fp32 by one shift and one mask, no shuffle.
[[gnu::always_inline]] inline void load_halves(const float* p, f32x16& lo, f32x16& hi) {
    lo = load16(p);
    hi = load16(p + kVec);
}
[[gnu::always_inline]] inline void load_halves(const uint16_t* p, f32x16& lo, f32x16& hi) {
    u32x16 u;
    std::memcpy(&u, p, sizeof u);
    const u32x16 l = u << 16, h = u & 0xffff0000u;
    std::memcpy(&lo, &l, sizeof lo);
    std::memcpy(&hi, &h, sizeof hi);
}

// round_to_bf16 (model/bf16.h) lane by lane, the same integer operations.
[[gnu::always_inline]] inline f32x16 round16_to_bf16(const f32x16& x) {
    u32x16 u;
    std::memcpy(&u, &x, sizeof u);
    const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const u32x16 nan = (u | 0x00400000u) & 0xffff0000u;
    const u32x16 r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    f32x16 out;
    std::memcpy(&out, &r, sizeof out);
    return out;
}

// The lane tree of dot() for four vectors of partial sums at once: lane k of every head is
// added to lane k + 8, then k + 4, k + 2, k + 1 (the same additions of the same operands as the
// scalar tree); heads are packed side by side so each level is one vector add. Returns the four
// sums in lanes 0..3.
[[gnu::always_inline]] inline f32x16 reduce_four(const f32x16* s) {
    constexpr i32x16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    constexpr i32x16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    constexpr i32x16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    constexpr i32x16 hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    constexpr i32x16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13};
    constexpr i32x16 hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15};
    constexpr i32x16 lo1 = {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6};
    constexpr i32x16 hi1 = {1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7};
    const f32x16 ab =
        __builtin_shuffle(s[0], s[1], lo8) + __builtin_shuffle(s[0], s[1], hi8);  // 8 lanes each
    const f32x16 cd = __builtin_shuffle(s[2], s[3], lo8) + __builtin_shuffle(s[2], s[3], hi8);
    const f32x16 abcd = __builtin_shuffle(ab, cd, lo4) + __builtin_shuffle(ab, cd, hi4);  // 4 lanes each
    const f32x16 pairs = __builtin_shuffle(abcd, lo2) + __builtin_shuffle(abcd, hi2);     // 2 lanes each
    return __builtin_shuffle(pairs, lo1) + __builtin_shuffle(pairs, hi1);
}

// Adds the lanes pairwise in a fixed tree (8, 4, 2, 1 apart).
template <class T>
T reduce_lanes(T (&lane)[kSumLanes]) {
    for (int w = kSumLanes / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
    return lane[0];
}

using numeric::exp_float;  // shared with the CUDA kernels (model/numeric.h)

}  // namespace

namespace {

// Four dots against one vector b: lane g of the result is Σ_i a[g][i] b[i], fp32 products summed
// in fp32 over 32 interleaved lanes (lane k takes elements i ≡ k mod 32, in order), then the
// lanes in a fixed tree: a fixed order (reproducible) independent of the vector width. The eight
// accumulator chains share each load of b. a and b hold fp32 values or attention keys (bf16 bits
// in their storage order).
template <class A, class B>
[[gnu::always_inline]] inline f32x16 four_dots(const A* const (&a)[4], const B* b, int64_t n) {
    f32x16 lo[4] = {}, hi[4] = {};  // lanes 0..15, 16..31
    int64_t i = 0;
    for (; i + 2 * kVec <= n; i += 2 * kVec) {
        f32x16 b0, b1;
        load_halves(b + i, b0, b1);
        for (int g = 0; g < 4; ++g) {
            f32x16 a0, a1;
            load_halves(a[g] + i, a0, a1);
            lo[g] += a0 * b0;
            hi[g] += a1 * b1;
        }
    }
    for (int64_t k = 0; i + k < n; ++k)  // the tail: element i + k goes to lane k (i is a multiple of 32)
        for (int g = 0; g < 4; ++g) {
            const float prod = value_at(a[g], i + k) * value_at(b, i + k);
            if (k < kVec)
                lo[g][k] += prod;
            else
                hi[g][k - kVec] += prod;
        }
    f32x16 s[4];
    for (int g = 0; g < 4; ++g) s[g] = lo[g] + hi[g];  // lane k += lane k + 16
    return reduce_four(s);
}

// Four heads at a time against the key (a short group repeats its last head).
template <class Key>
[[gnu::always_inline]] inline void dot_heads_body(const float* q, int64_t q_stride, int n_heads, const Key* key, int64_t n,
                                                  float* out) {
    for (int h0 = 0; h0 < n_heads; h0 += 4) {
        const float* qh[4];
        for (int g = 0; g < 4; ++g) qh[g] = q + std::min(h0 + g, n_heads - 1) * q_stride;
        const f32x16 sums = four_dots(qh, key, n);
        for (int g = 0; g < 4 && h0 + g < n_heads; ++g) out[h0 + g] = sums[g];
    }
}

}  // namespace

MS_VECTOR_CLONES void dot_heads(const float* q, int64_t q_stride, int n_heads, const float* key, int64_t n,
                                float* out) {
    dot_heads_body(q, q_stride, n_heads, key, n, out);
}

MS_VECTOR_CLONES void dot_heads(const float* q, int64_t q_stride, int n_heads, const uint16_t* key, int64_t n,
                                float* out) {
    dot_heads_body(q, q_stride, n_heads, key, n, out);
}

MS_VECTOR_CLONES void dot_keys(const float* q, const uint16_t* const* keys, int64_t n_keys, int64_t n, float* out) {
    // dot_heads with the roles turned round: four keys against one q (a short group repeats its
    // last key); a product key * q is q * key, so each pair gets dot_heads' bits.
    for (int64_t j0 = 0; j0 < n_keys; j0 += 4) {
        const uint16_t* kg[4];
        for (int g = 0; g < 4; ++g) kg[g] = keys[std::min<int64_t>(j0 + g, n_keys - 1)];
        // Keys sit wherever their caches put them: fetch the next group's starts ahead.
        for (int64_t j = j0 + 4; j < std::min(n_keys, j0 + 8); ++j) __builtin_prefetch(keys[j], 0, 3);
        const f32x16 sums = four_dots(kg, q, n);
        for (int g = 0; g < 4 && j0 + g < n_keys; ++g) out[j0 + g] = sums[g];
    }
}

MS_VECTOR_CLONES double sum_of_squares(const float* x, int64_t n) {
    double lane[kSumLanes] = {};
    int64_t i = 0;
    for (; i + kSumLanes <= n; i += kSumLanes)
        for (int k = 0; k < kSumLanes; ++k) lane[k] += double(x[i + k]) * double(x[i + k]);
    for (; i < n; ++i) lane[i % kSumLanes] += double(x[i]) * double(x[i]);
    return reduce_lanes(lane);
}

MS_VECTOR_CLONES double sum_of_triple_products(const float* a, const float* b, const float* c, int64_t n) {
    double lane[kSumLanes] = {};
    int64_t i = 0;
    for (; i + kSumLanes <= n; i += kSumLanes)
        for (int k = 0; k < kSumLanes; ++k) lane[k] += double(a[i + k] * b[i + k] * c[i + k]);
    for (; i < n; ++i) lane[i % kSumLanes] += double(a[i] * b[i] * c[i]);
    return reduce_lanes(lane);
}

float inv_rms(const float* x, int64_t n, float eps) {
    MS_ASSERT(n >= 0);
    return 1.0f / std::sqrt(float(sum_of_squares(x, n) / double(n)) + eps);
}

MS_VECTOR_CLONES void scale_row(const float* x, float s, const float* w, float* y, int64_t n, bool round) {
    // Separate loops per case so each is a plain vector loop.
    if (w && round)
        for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i] * s * w[i]);
    else if (w)
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s * w[i];
    else if (round)
        for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i] * s);
    else
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

MS_VECTOR_CLONES void exp_floats(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = exp_float(x[i]);
}

MS_VECTOR_CLONES void swiglu_row(float* g, const float* u, int64_t n, float limit, float w) {
    // In blocks: the exponentials first, then the rest, each a plain vector loop.
    constexpr int64_t kBlock = 256;
    float e[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t m = std::min(kBlock, n - b);
        float* gb = g + b;
        const float* ub = u + b;
        for (int64_t i = 0; i < m; ++i) e[i] = exp_float(-std::min(gb[i], limit));
        for (int64_t i = 0; i < m; ++i) {
            const float gv = std::min(gb[i], limit);
            const float uv = std::clamp(ub[i], -limit, limit);
            gb[i] = round_to_bf16(w * (gv / (1.0f + e[i]) * uv));
        }
    }
}

MS_VECTOR_CLONES void collapse_cols(const float* H, int hc, int64_t stride, int64_t width, const float* p,
                                   float* out) {
    int64_t d = 0;
    for (; d + kVec <= width; d += kVec) {
        f32x16 acc = {};
        for (int k = 0; k < hc; ++k) acc += p[k] * load16(H + k * stride + d);
        store16(out + d, round16_to_bf16(acc));
    }
    for (; d < width; ++d) {
        float acc = 0.0f;
        for (int k = 0; k < hc; ++k) acc += p[k] * H[k * stride + d];
        out[d] = round_to_bf16(acc);
    }
}

// The full blocks of expand_cols for hc streams (a compile-time constant for the common hc = 4,
// so the stream loops unroll; 0 means "use hc").
template <int kHc>
[[gnu::always_inline]] inline int64_t expand_blocks(const float* f, const float* H, int hc, int64_t stride,
                                                    int64_t width, const float* post, const float* C, float* out) {
    if constexpr (kHc > 0) hc = kHc;
    int64_t d = 0;
    for (; d + kVec <= width; d += kVec) {
        f32x16 h[kMaxHc], o[kMaxHc];
        for (int i = 0; i < hc; ++i) h[i] = load16(H + i * stride + d);
        const f32x16 fv = load16(f + d);
        for (int j = 0; j < hc; ++j) {
            f32x16 t = {};
            for (int i = 0; i < hc; ++i) t += C[i * hc + j] * h[i];
            o[j] = round16_to_bf16(post[j] * fv + t);
        }
        // Every stream's block is loaded before any output block is stored, so out may be H.
        for (int j = 0; j < hc; ++j) store16(out + j * stride + d, o[j]);
    }
    return d;
}

MS_VECTOR_CLONES void expand_cols(const float* f, const float* H, int hc, int64_t stride, int64_t width,
                                  const float* post, const float* C, float* out) {
    MS_ASSERT(hc >= 1 && hc <= kMaxHc);
    int64_t d = hc == 4 ? expand_blocks<4>(f, H, hc, stride, width, post, C, out)
                        : expand_blocks<0>(f, H, hc, stride, width, post, C, out);
    for (; d < width; ++d) {
        float h[kMaxHc], o[kMaxHc];
        for (int i = 0; i < hc; ++i) h[i] = H[i * stride + d];
        for (int j = 0; j < hc; ++j) {
            float t = 0.0f;
            for (int i = 0; i < hc; ++i) t += C[i * hc + j] * h[i];
            o[j] = round_to_bf16(post[j] * f[d] + t);
        }
        for (int j = 0; j < hc; ++j) out[j * stride + d] = o[j];
    }
}

MS_VECTOR_CLONES void rotate_pairs(float* t, const float* c, const float* s, int64_t pairs) {
    for (int64_t i = 0; i < pairs; ++i) {
        const float a = t[2 * i], b = t[2 * i + 1];
        t[2 * i] = round_to_bf16(a * c[i] - b * s[i]);
        t[2 * i + 1] = round_to_bf16(a * s[i] + b * c[i]);
    }
}

namespace {

// The 16 values [d0, d0 + 16) of an attention key of n values as fp32: the low or high half of
// an interleaved chunk, or 16 values of the in-order tail (model/attention_keys.h).
struct key_slice {
    int64_t offset;  // of the chunk, or of the values in the tail
    int part;        // 0: low half, 1: high half, 2: in order
    key_slice(int64_t d0, int64_t n) {
        const int64_t chunk = d0 - d0 % kKeyChunk;
        if (chunk + kKeyChunk <= n) {
            offset = chunk;
            part = d0 % kKeyChunk < kVec ? 0 : 1;
        } else {
            offset = d0;
            part = 2;
        }
    }
};

template <int kPart>
[[gnu::always_inline]] inline f32x16 load_slice(const uint16_t* key) {
    if constexpr (kPart == 2) {
        return load16(key);
    } else {
        f32x16 lo, hi;
        load_halves(key, lo, hi);
        return kPart == 0 ? lo : hi;
    }
}

// attend_slice's full-width case for one group of heads.
template <int kPart, int kGroup>
[[gnu::always_inline]] inline void attend_slice_group(const uint16_t* const* keys, int64_t n_keys, int64_t offset,
                                                      const float* const (&ph)[kGroup], f32x16 (&acc)[kGroup],
                                                      bool prefetch) {
    for (int64_t i = 0; i < n_keys; ++i) {
        // Keys are scattered (no stream for the hardware to follow): fetch ahead by hand.
        if (prefetch && i + 8 < n_keys) __builtin_prefetch(keys[i + 8] + offset, 0, 3);
        const f32x16 k = load_slice<kPart>(keys[i] + offset);
        for (int g = 0; g < kGroup; ++g) acc[g] += ph[g][i] * k;
    }
}

// kChunks whole chunks [d0, d0 + 32 kChunks) of one head's attention output (attend_head).
template <int kChunks>
[[gnu::always_inline]] inline void attend_chunks(const uint16_t* const* keys, int64_t n_keys, const float* p, float inv,
                                                 int64_t d0, float* out) {
    f32x16 acc[2 * kChunks] = {};
    for (int64_t i = 0; i < n_keys; ++i) {
        if (i + 4 < n_keys) __builtin_prefetch(keys[i + 4] + d0, 0, 3);
        const uint16_t* k = keys[i] + d0;
        for (int c = 0; c < kChunks; ++c) {
            f32x16 lo, hi;
            load_halves(k + c * kKeyChunk, lo, hi);
            acc[2 * c] += p[i] * lo;
            acc[2 * c + 1] += p[i] * hi;
        }
    }
    for (int c = 0; c < kChunks; ++c) {
        store16(out + d0 + c * kKeyChunk, round16_to_bf16(acc[2 * c] * inv));
        store16(out + d0 + c * kKeyChunk + kVec, round16_to_bf16(acc[2 * c + 1] * inv));
    }
}

}  // namespace

MS_VECTOR_CLONES void attend_slice(const uint16_t* const* keys, int64_t n_keys, const float* p, const float* inv,
                                   int n_heads, int64_t head_dim, int64_t d0, int64_t width, float* out) {
    MS_ASSERT(n_heads >= 1 && width >= 1 && width <= kAttentionSlice && d0 + width <= head_dim);
    static_assert(kAttentionSlice == kVec && kKeyChunk == 2 * kVec);
    // Four heads at a time (four independent accumulator chains per key slice loaded); a short
    // group repeats its last head and drops the copies.
    constexpr int kGroup = 4;
    const key_slice at(d0, head_dim);
    for (int h0 = 0; h0 < n_heads; h0 += kGroup) {
        const float* ph[kGroup];
        for (int g = 0; g < kGroup; ++g) ph[g] = p + std::min(h0 + g, n_heads - 1) * n_keys;
        const int in_group = std::min(kGroup, n_heads - h0);
        if (width == kVec && d0 % kVec == 0) {
            f32x16 acc[kGroup] = {};
            const bool prefetch = h0 == 0;
            if (at.part == 0)
                attend_slice_group<0>(keys, n_keys, at.offset, ph, acc, prefetch);
            else if (at.part == 1)
                attend_slice_group<1>(keys, n_keys, at.offset, ph, acc, prefetch);
            else
                attend_slice_group<2>(keys, n_keys, at.offset, ph, acc, prefetch);
            for (int g = 0; g < in_group; ++g)
                store16(out + (h0 + g) * head_dim + d0, round16_to_bf16(acc[g] * inv[h0 + g]));
        } else {
            float acc[kGroup][kVec] = {};
            for (int64_t i = 0; i < n_keys; ++i)
                for (int g = 0; g < kGroup; ++g)
                    for (int64_t d = 0; d < width; ++d) acc[g][d] += ph[g][i] * key_value(keys[i], d0 + d, head_dim);
            for (int g = 0; g < in_group; ++g)
                for (int64_t d = 0; d < width; ++d)
                    out[(h0 + g) * head_dim + d0 + d] = round_to_bf16(acc[g][d] * inv[h0 + g]);
        }
    }
}

MS_VECTOR_CLONES void attend_head(const uint16_t* const* keys, int64_t n_keys, const float* p, float inv,
                                  int64_t head_dim, float* out) {
    // Up to four chunks (eight accumulators) at a time, each key's part of them loaded once; per
    // value the same products and sums in the same order as attend_slice.
    const int64_t whole = head_dim - head_dim % kKeyChunk;
    int64_t d0 = 0;
    for (; d0 + 4 * kKeyChunk <= whole; d0 += 4 * kKeyChunk) attend_chunks<4>(keys, n_keys, p, inv, d0, out);
    switch ((whole - d0) / kKeyChunk) {
        case 3: attend_chunks<3>(keys, n_keys, p, inv, d0, out); break;
        case 2: attend_chunks<2>(keys, n_keys, p, inv, d0, out); break;
        case 1: attend_chunks<1>(keys, n_keys, p, inv, d0, out); break;
        default: break;
    }
    // The in-order tail (head_dim not a multiple of 32): attend_slice itself, as one head.
    for (d0 = whole; d0 < head_dim; d0 += kAttentionSlice)
        attend_slice(keys, n_keys, p, &inv, 1, head_dim, d0, std::min(kAttentionSlice, head_dim - d0), out);
}

}  // namespace moestream::elementwise
