// AVX-512 (F, BW, VL) row-dot kernels. Like quant_avx2.cpp, every function carries a target
// attribute (the binary is built for baseline x86-64) and quant.cpp only calls them after
// checking the CPU.
//
// Each kernel is a template over R, the number of weight rows dotted with one x in one pass:
// R = 1 is dot_row, R = 4 is what the GEMV uses (x loads, x shuffles and the final horizontal
// sums are shared by the four rows). A row's accumulators, the order they are combined in and the
// horizontal-sum tree are the same for every R, so each value is bit-identical whatever R
// computed it (the reproducibility contract of cpu_matmul.h relies on this).
//
// Products are formed exactly as the scalar kernels form them (a widened weight times the fp32
// x, or a block's integer codes times x and then the block scale); only the summation order
// differs.
#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "config/assert.h"
#include "model/prefetch.h"
#include "model/quant_internal.h"

#define MS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// GCC 12's AVX-512 intrinsics seed their unused merge operand with a self-initialised
// _mm512_undefined_*(), which -Wmaybe-uninitialized (and, for _mm512_shuffle_f32x4,
// -Wuninitialized) reports once inlined; it is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace moestream::quant::detail {
namespace {

// ---------------------------------------------------------------- horizontal sums

// Lane 0 of each 128-bit lane becomes (v0 + v2) + (v1 + v3) of that lane.
MS_AVX512 inline __m512 sum_within_128(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}

// The fixed tree every kernel ends with: lanes i + (i+8), then i + (i+4), then within 128 bits.
MS_AVX512 inline float hsum1(__m512 v) {
    const __m256 hi256 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), hi256);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return _mm512_cvtss_f32(sum_within_128(_mm512_castps128_ps512(q)));
}

// The same tree for four rows at once (same additions with the same operand order, so the same
// bits as hsum1 on each row), with a quarter of the shuffles.
MS_AVX512 inline void hsum4(const __m512 (&v)[4], float* out) {
    // Level 1, per pair of rows: low 256 bits (lanes 0-1) + high 256 bits (lanes 2-3).
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
    // Level 2: 128-bit lane r of the sum holds row r's low 128 + high 128 bits.
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 s = sum_within_128(abcd);
    const __m512 lane0s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
    _mm_storeu_ps(out, _mm512_castps512_ps128(lane0s));
}

template <int R>
MS_AVX512 inline void store_sums(const __m512 (&v)[R], float* out) {
    static_assert(R == 1 || R == 4);
    if constexpr (R == 1) out[0] = hsum1(v[0]);
    else hsum4(v, out);
}

// ---------------------------------------------------------------- software prefetch

// A GEMV pass gives each thread a short run of consecutive rows (tens of KiB), and the hardware
// prefetchers ramp up too slowly for that: on the H200 host's Xeon a decode-like pass (1 MiB of
// Q8_0, 16 threads) read 60 GB/s, a plain read of the same bytes 110 GB/s, and the kernel with
// this prefetch 105 GB/s. So each kernel prefetches (to L2), next to the bytes it reads, the same
// offsets one row group further on (the rows its next call takes), at least kPrefetchMin bytes
// ahead (model/prefetch.h: prefetches never fault, addresses past the weights are fine).
constexpr int64_t kPrefetchMin = 4096;

// Bytes ahead for a kernel over R rows `stride` apart (R = 1: the next row follows this one).
inline int64_t prefetch_distance(int R, int64_t stride, int64_t row_bytes) {
    const int64_t group = R == 1 ? row_bytes : R * stride;
    if (group <= 0) return kPrefetchMin;
    return group * ((kPrefetchMin + group - 1) / group);
}

// First m bits set (m <= 32).
inline __mmask32 low_mask32(int64_t m) { return m >= 32 ? ~__mmask32(0) : __mmask32((1u << m) - 1); }
inline __mmask16 low_mask16(int64_t m) { return __mmask16(low_mask32(std::clamp<int64_t>(m, 0, 16))); }

// ---------------------------------------------------------------- F32, F16

// 16 elements widened to fp32; the masked form reads only the first m and zeroes the rest.
struct f32_format {
    static constexpr int kBytes = 4;
    MS_AVX512 static __m512 load(const uint8_t* p) { return _mm512_loadu_ps(p); }
    MS_AVX512 static __m512 load_first(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

struct f16_format {
    static constexpr int kBytes = 2;
    MS_AVX512 static __m512 load(const uint8_t* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    MS_AVX512 static __m512 load_first(const uint8_t* p, __mmask16 m) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    }
};

// Four accumulators per row (64 elements a step) hide the FMA latency; the tail goes 16 at a
// time into the first, the last partial 16 with masked loads (dense rows have any length).
template <class Fmt, int R>
MS_AVX512 void dot_dense_rows(const uint8_t* w, int64_t stride, const float* x, int64_t n, float* out) {
    __m512 acc[R][4];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, n * Fmt::kBytes);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 xv[4];
        for (int k = 0; k < 4; ++k) xv[k] = _mm512_loadu_ps(x + i + 16 * k);
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = w + r * stride + i * Fmt::kBytes;
            prefetch_to_l2(p, 64 * Fmt::kBytes, ahead);
            for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_fmadd_ps(Fmt::load(p + 16 * k * Fmt::kBytes), xv[k], acc[r][k]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 m = low_mask16(n - i);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        for (int r = 0; r < R; ++r)
            acc[r][0] = _mm512_fmadd_ps(Fmt::load_first(w + r * stride + i * Fmt::kBytes, m), xv, acc[r][0]);
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r)
        sums[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    store_sums<R>(sums, out);
}

// ---------------------------------------------------------------- BF16

// 32 values split by parity: lane k of `even` is element 2k, of `odd` element 2k+1.
struct pair32 {
    __m512 even, odd;
};

// A bf16 is the top half of an fp32, so 32 of them widen with one shift (even elements) and one
// mask (odd elements), no cross-lane shuffle; the weight stream needs one load per 32 values.
MS_AVX512 inline pair32 widen_bf16x32(__m512i w) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))))};
}

// x split the same way (two shuffles per 32 values, shared by every row of the pass).
MS_AVX512 inline pair32 split_x(__m512 lo, __m512 hi) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return {_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi)};
}

// Per row: even/odd accumulators of two 32-value steps (64 values an iteration); the tail goes
// 32 at a time into the first pair, the last partial step with masked loads.
template <int R>
MS_AVX512 void dot_bf16_rows(const uint8_t* w, int64_t stride, const float* x, int64_t n, float* out) {
    __m512 acc[R][4];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, 2 * n);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const pair32 x0 = split_x(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16));
        const pair32 x1 = split_x(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(x + i + 48));
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = w + r * stride + 2 * i;
            prefetch_to_l2(p, 128, ahead);
            const pair32 a = widen_bf16x32(_mm512_loadu_si512(p));
            const pair32 b = widen_bf16x32(_mm512_loadu_si512(p + 64));
            acc[r][0] = _mm512_fmadd_ps(a.even, x0.even, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a.odd, x0.odd, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(b.even, x1.even, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(b.odd, x1.odd, acc[r][3]);
        }
    }
    for (; i < n; i += 32) {
        const int64_t left = n - i;
        const pair32 xs = split_x(_mm512_maskz_loadu_ps(low_mask16(left), x + i),
                                  _mm512_maskz_loadu_ps(low_mask16(left - 16), x + i + 16));
        for (int r = 0; r < R; ++r) {
            const pair32 a = widen_bf16x32(_mm512_maskz_loadu_epi16(low_mask32(left), w + r * stride + 2 * i));
            acc[r][0] = _mm512_fmadd_ps(a.even, xs.even, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a.odd, xs.odd, acc[r][1]);
        }
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r)
        sums[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    store_sums<R>(sums, out);
}

// ---------------------------------------------------------------- BF16 x BF16 (avx512_bf16)

#define MS_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

MS_AVX512_BF16 inline __m512 dp_bf16(__m512 acc, __m512i w, __m512i x) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(w), reinterpret_cast<__m512bh&>(x));
}

// BF16 weights against x given as bf16 bits: one vdpbf16ps per 32 products (products of two
// bf16 are exact in fp32; each lane adds its pair in fp32). Four accumulators per row over 128
// values an iteration; the tail goes 32 at a time into the first, the last step masked.
template <int R>
MS_AVX512_BF16 void dot_bf16x_rows(const uint8_t* w, int64_t stride, const uint16_t* xb, int64_t n, float* out) {
    __m512 acc[R][4];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, 2 * n);
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m512i xv[4];
        for (int k = 0; k < 4; ++k) xv[k] = _mm512_loadu_si512(xb + i + 32 * k);
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = w + r * stride + 2 * i;
            prefetch_to_l2(p, 256, ahead);
            for (int k = 0; k < 4; ++k) acc[r][k] = dp_bf16(acc[r][k], _mm512_loadu_si512(p + 64 * k), xv[k]);
        }
    }
    for (; i < n; i += 32) {
        const __mmask32 m = low_mask32(n - i);
        const __m512i xv = _mm512_maskz_loadu_epi16(m, xb + i);
        for (int r = 0; r < R; ++r) acc[r][0] = dp_bf16(acc[r][0], _mm512_maskz_loadu_epi16(m, w + r * stride + 2 * i), xv);
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r)
        sums[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    store_sums<R>(sums, out);
}

// ---------------------------------------------------------------- Q8_0

constexpr int64_t kQ8Bytes = sizeof(block_q8_0);
// Blocks whose scales are converted together (one gather, one conversion).
constexpr int64_t kScaleGroup = 16;

// The fp16 scales of the first m (<= 16) blocks at `blocks`, as fp32, in one gather and one
// conversion instead of a scalar load, move, conversion and broadcast per block. Each gathered
// dword is a block's scale plus its first two codes, inside the block.
MS_AVX512 inline __m512 q8_0_scales(const uint8_t* blocks, int64_t m) {
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(int(kQ8Bytes)));
    const __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), low_mask16(m), offsets, blocks, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

// 16 int8 codes as fp32 (exact).
MS_AVX512 inline __m512 q8x16(const uint8_t* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

// Block `blk`'s 32 products summed unscaled, then times the block scale into `acc`: the scalar
// kernel's association (only the order inside the block differs).
MS_AVX512 inline __m512 q8_0_block(const uint8_t* blk, __m512 x0, __m512 x1, float d, __m512 acc) {
    const __m512 s = _mm512_fmadd_ps(q8x16(blk + 18), x1, _mm512_mul_ps(q8x16(blk + 2), x0));
    return _mm512_fmadd_ps(s, _mm512_set1_ps(d), acc);
}

// Per row: even blocks into acc[r][0], odd blocks into acc[r][1], so consecutive blocks do not
// wait on one FMA chain.
template <int R>
MS_AVX512 void dot_q8_0_rows(const uint8_t* w, int64_t stride, const float* x, int64_t n, float* out) {
    MS_ASSERT(n % kBlock == 0);
    const int64_t nb = n / kBlock;
    __m512 acc[R][2];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, nb * kQ8Bytes);
    for (int64_t g = 0; g < nb; g += kScaleGroup) {
        const int64_t m = std::min(kScaleGroup, nb - g);  // g is even, so block parity is j's
        alignas(64) float d[R][kScaleGroup];
        for (int r = 0; r < R; ++r) _mm512_store_ps(d[r], q8_0_scales(w + r * stride + g * kQ8Bytes, m));
        int64_t j = 0;
        for (; j + 2 <= m; j += 2) {
            const float* xb = x + (g + j) * kBlock;
            const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            const __m512 x2 = _mm512_loadu_ps(xb + 32), x3 = _mm512_loadu_ps(xb + 48);
            for (int r = 0; r < R; ++r) {
                const uint8_t* blk = w + r * stride + (g + j) * kQ8Bytes;
                prefetch_to_l2(blk, 2 * kQ8Bytes, ahead);
                acc[r][0] = q8_0_block(blk, x0, x1, d[r][j], acc[r][0]);
                acc[r][1] = q8_0_block(blk + kQ8Bytes, x2, x3, d[r][j + 1], acc[r][1]);
            }
        }
        if (j < m) {
            const float* xb = x + (g + j) * kBlock;
            const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            for (int r = 0; r < R; ++r)
                acc[r][0] = q8_0_block(w + r * stride + (g + j) * kQ8Bytes, x0, x1, d[r][j], acc[r][0]);
        }
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_add_ps(acc[r][0], acc[r][1]);
    store_sums<R>(sums, out);
}

// ---------------------------------------------------------------- MXFP4

constexpr int64_t kMxBytes = sizeof(block_mxfp4);

// Block `blk`'s 32 products (doubled E2M1 values, exact in fp32) summed unscaled, then times the
// halved e8m0 scale into `acc`. With a 16-entry vpermps the nibble -> float lookup is one
// instruction per 16 elements; vpermps reads only the low 4 bits of each index, so the low
// nibble needs no masking.
MS_AVX512 inline __m512 mxfp4_block(const uint8_t* blk, __m512 x0, __m512 x1, __m512 acc) {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1)));
    const __m512 lo = _mm512_permutexvar_ps(q, table);                        // elements 0..15
    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);  // elements 16..31
    const __m512 s = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
    return _mm512_fmadd_ps(s, _mm512_set1_ps(kE8m0Half.v[blk[0]]), acc);
}

// Per row: even blocks into acc[r][0], odd blocks into acc[r][1].
template <int R>
MS_AVX512 void dot_mxfp4_rows(const uint8_t* w, int64_t stride, const float* x, int64_t n, float* out) {
    MS_ASSERT(n % kBlock == 0);
    const int64_t nb = n / kBlock;
    __m512 acc[R][2];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, nb * kMxBytes);
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const float* xb = x + ib * kBlock;
        const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        const __m512 x2 = _mm512_loadu_ps(xb + 32), x3 = _mm512_loadu_ps(xb + 48);
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = w + r * stride + ib * kMxBytes;
            prefetch_to_l2(blk, 2 * kMxBytes, ahead);
            acc[r][0] = mxfp4_block(blk, x0, x1, acc[r][0]);
            acc[r][1] = mxfp4_block(blk + kMxBytes, x2, x3, acc[r][1]);
        }
    }
    if (ib < nb) {
        const float* xb = x + ib * kBlock;
        const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        for (int r = 0; r < R; ++r) acc[r][0] = mxfp4_block(w + r * stride + ib * kMxBytes, x0, x1, acc[r][0]);
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_add_ps(acc[r][0], acc[r][1]);
    store_sums<R>(sums, out);
}

// ---------------------------------------------------------------- MXFP4 x BF16 (avx512_bf16)

#define MS_AVX512_MXBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c")))

// 32 words: the bf16 bits of kE2m1Doubled, twice (vpermw reads the low 5 bits of an index).
struct e2m1_bf16_table {
    uint16_t v[32] = {};
    constexpr e2m1_bf16_table() {
        for (int i = 0; i < 32; ++i) v[i] = uint16_t(std::bit_cast<uint32_t>(float(kE2m1Doubled[i % 16])) >> 16);
    }
};
inline constexpr e2m1_bf16_table kE2m1Bf16;

// vpermb indices from a ymm holding the 16 code bytes (low half) and them shifted right by 4
// (high half): word 2i takes byte i (element i in its low nibble), word 2i + 1 byte 16 + i
// (element i + 16). Both bytes of a word get the index; vpermw reads only the low one.
struct pair_spread_table {
    uint8_t v[64] = {};
    constexpr pair_spread_table() {
        for (int j = 0; j < 64; ++j) v[j] = uint8_t(j / 4 + (j / 2 % 2 ? 16 : 0));
    }
};
inline constexpr pair_spread_table kPairSpread;

// Block `blk` against its 32 x values packed in pairs (word 2i = x[i], word 2i+1 = x[i+16];
// pack_mxfp4_bf16x_avx512): the codes as bf16 words in the same order (a 16-byte broadcast
// load, so nothing past the block is read; a 256-bit shift of its high half; vpermb; a vpermw
// lookup: two shuffles per block where mxfp4_block has three), then lane i's
// lo_i * x[i] + hi_i * x[i+16] in one vdpbf16ps instead of a multiply and an FMA.
// Why it is mxfp4_block's s bit for bit: a code times a bf16 x is exact in fp32 (8 significant
// bits times at most 2), and a packed x is 0 or within [2^-100, 2^100], so every product and
// every nonzero pair sum is a normal fp32 (DAZ/FTZ never apply) and nothing overflows. The
// instruction's sum is then the one rounding of the exact sum whatever order it adds the two
// products in, which is what fma(hi, x1, lo * x0) gives; starting it from -0 keeps the sign of
// an exact zero as there (-0 only when both products are -0). The scale FMA is mxfp4_block's.
MS_AVX512_MXBF16 inline __m512 mxfp4_bf16x_block(const uint8_t* blk, __m512i xp, __m512 acc) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1)));
    const __m256i halves = _mm256_srlv_epi16(both, _mm256_setr_epi32(0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004));
    const __m512i codes = _mm512_permutexvar_epi8(_mm512_loadu_si512(kPairSpread.v), _mm512_castsi256_si512(halves));
    const __m512i wv = _mm512_permutexvar_epi16(codes, _mm512_loadu_si512(kE2m1Bf16.v));
    const __m512 s = _mm512_dpbf16_ps(_mm512_set1_ps(-0.0f), reinterpret_cast<const __m512bh&>(wv),
                                      reinterpret_cast<const __m512bh&>(xp));
    return _mm512_fmadd_ps(s, _mm512_set1_ps(kE8m0Half.v[blk[0]]), acc);
}

// dot_mxfp4_rows with mxfp4_bf16x_block: the same accumulators in the same order.
template <int R>
MS_AVX512_MXBF16 void dot_mxfp4_bf16x_rows(const uint8_t* w, int64_t stride, const uint16_t* xp, int64_t n, float* out) {
    MS_ASSERT(n >= 0 && n % kBlock == 0);
    const int64_t nb = n / kBlock;
    __m512 acc[R][2];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    const int64_t ahead = prefetch_distance(R, stride, nb * kMxBytes);
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const __m512i x0 = _mm512_loadu_si512(xp + ib * kBlock), x1 = _mm512_loadu_si512(xp + ib * kBlock + kBlock);
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = w + r * stride + ib * kMxBytes;
            prefetch_to_l2(blk, 2 * kMxBytes, ahead);
            acc[r][0] = mxfp4_bf16x_block(blk, x0, acc[r][0]);
            acc[r][1] = mxfp4_bf16x_block(blk + kMxBytes, x1, acc[r][1]);
        }
    }
    if (ib < nb) {
        const __m512i x0 = _mm512_loadu_si512(xp + ib * kBlock);
        for (int r = 0; r < R; ++r) acc[r][0] = mxfp4_bf16x_block(w + r * stride + ib * kMxBytes, x0, acc[r][0]);
    }
    __m512 sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_add_ps(acc[r][0], acc[r][1]);
    store_sums<R>(sums, out);
}

// Adapters from the templates to the dot_fn / dot4_fn signatures.
template <void (*Rows1)(const uint8_t*, int64_t, const float*, int64_t, float*)>
MS_AVX512 float one_row(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n >= 0);
    float out;
    Rows1(static_cast<const uint8_t*>(row), 0, x, n, &out);
    return out;
}

template <void (*Rows4)(const uint8_t*, int64_t, const float*, int64_t, float*)>
MS_AVX512 void four_rows(const void* rows, int64_t stride, const float* x, int64_t n, float* out) {
    MS_ASSERT(n >= 0);
    Rows4(static_cast<const uint8_t*>(rows), stride, x, n, out);
}

}  // namespace

MS_AVX512 float dot_f32_avx512(const void* row, const float* x, int64_t n) {
    return one_row<dot_dense_rows<f32_format, 1>>(row, x, n);
}
MS_AVX512 float dot_f16_avx512(const void* row, const float* x, int64_t n) {
    return one_row<dot_dense_rows<f16_format, 1>>(row, x, n);
}
MS_AVX512 float dot_bf16_avx512(const void* row, const float* x, int64_t n) {
    return one_row<dot_bf16_rows<1>>(row, x, n);
}
MS_AVX512 float dot_q8_0_avx512(const void* row, const float* x, int64_t n) {
    return one_row<dot_q8_0_rows<1>>(row, x, n);
}
MS_AVX512 float dot_mxfp4_avx512(const void* row, const float* x, int64_t n) {
    return one_row<dot_mxfp4_rows<1>>(row, x, n);
}

MS_AVX512 void dot4_f32_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out) {
    four_rows<dot_dense_rows<f32_format, 4>>(rows, stride, x, n, out);
}
MS_AVX512 void dot4_bf16_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out) {
    four_rows<dot_bf16_rows<4>>(rows, stride, x, n, out);
}
MS_AVX512 void dot4_q8_0_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out) {
    four_rows<dot_q8_0_rows<4>>(rows, stride, x, n, out);
}
MS_AVX512 void dot4_mxfp4_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out) {
    four_rows<dot_mxfp4_rows<4>>(rows, stride, x, n, out);
}

MS_AVX512_BF16 float dot_bf16x_avx512(const void* row, const uint16_t* xb, int64_t n) {
    MS_ASSERT(n >= 0);
    float out;
    dot_bf16x_rows<1>(static_cast<const uint8_t*>(row), 0, xb, n, &out);
    return out;
}
MS_AVX512_BF16 void dot4_bf16x_avx512(const void* rows, int64_t stride, const uint16_t* xb, int64_t n, float* out) {
    MS_ASSERT(n >= 0);
    dot_bf16x_rows<4>(static_cast<const uint8_t*>(rows), stride, xb, n, out);
}

MS_AVX512_MXBF16 float dot_mxfp4_bf16x_avx512(const void* row, const uint16_t* xp, int64_t n) {
    float out;
    dot_mxfp4_bf16x_rows<1>(static_cast<const uint8_t*>(row), 0, xp, n, &out);
    return out;
}
MS_AVX512_MXBF16 void dot4_mxfp4_bf16x_avx512(const void* rows, int64_t stride, const uint16_t* xp, int64_t n, float* out) {
    dot_mxfp4_bf16x_rows<4>(static_cast<const uint8_t*>(rows), stride, xp, n, out);
}

// Per 32 values: the bf16 halves of x[i] and x[i+16] side by side in dword i (a shift and a
// masked merge), after the qualification tests (low halves, then the magnitudes of the nonzero
// values); the first block that fails ends it (x that is not bf16 costs one block).
MS_AVX512 bool pack_mxfp4_bf16x_avx512(const float* x, int64_t n, uint16_t* out) {
    MS_ASSERT(n >= 0 && n % kBlock == 0);
    const __m512i low_half = _mm512_set1_epi32(0xffff), magnitude = _mm512_set1_epi32(0x7fffffff);
    const __m512i least = _mm512_set1_epi32(int(std::bit_cast<uint32_t>(kBf16xMin)));
    const __m512i span = _mm512_set1_epi32(int(std::bit_cast<uint32_t>(kBf16xMax) - std::bit_cast<uint32_t>(kBf16xMin)));
    for (int64_t b = 0; b < n; b += kBlock) {
        const __m512i lo = _mm512_loadu_si512(x + b), hi = _mm512_loadu_si512(x + b + 16);
        // Nonzero magnitudes outside [least, least + span]: one unsigned compare of m - least.
        const __m512i mlo = _mm512_and_si512(lo, magnitude), mhi = _mm512_and_si512(hi, magnitude);
        const __mmask16 bad = _mm512_test_epi32_mask(_mm512_or_si512(lo, hi), low_half) |
                              _mm512_mask_cmpgt_epu32_mask(_mm512_test_epi32_mask(mlo, mlo), _mm512_sub_epi32(mlo, least), span) |
                              _mm512_mask_cmpgt_epu32_mask(_mm512_test_epi32_mask(mhi, mhi), _mm512_sub_epi32(mhi, least), span);
        if (bad) return false;
        // dword i = (x[i] >> 16) | (x[i+16] & 0xffff0000): ternary logic A | (B & C) = 0xf8.
        _mm512_storeu_si512(out + b, _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 16), hi, _mm512_set1_epi32(int(0xffff0000u)), 0xf8));
    }
    return true;
}

}  // namespace moestream::quant::detail

#pragma GCC diagnostic pop
