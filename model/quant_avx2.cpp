// AVX2/FMA/F16C kernels. The build does not pass -mavx2 (the binary must run on any x86-64), so
// every function carries a target attribute and quant.cpp only calls them after checking the CPU.
// Accumulation is fp32 in 8-wide lanes with several independent accumulators so the FMA latency
// is hidden; the weights stream from memory, x (one activation row) stays in L1/L2.
#include <immintrin.h>

#include <cstring>

#include "config/assert.h"
#include "model/quant_internal.h"

#define MS_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace moestream::quant::detail {
namespace {

MS_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 8 consecutive bf16 values widened to fp32 (bf16 is the top half of an fp32).
MS_AVX2 inline __m256 load_bf16x8(const uint8_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

MS_AVX2 inline __m256 load_f16x8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

MS_AVX2 inline __m256 load_f32x8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }

// 8 int8 -> 8 fp32 (exact).
MS_AVX2 inline __m256 load_i8x8(const void* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

MS_AVX2 inline __m256 low8_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
MS_AVX2 inline __m256 high8_i8(__m128i v) { return low8_i8(_mm_srli_si128(v, 8)); }

// The element loop shared by the dense types: `Load` widens 8 elements, `One` reads one element
// for the tail (dense rows may have any length). Template parameters so both inline.
template <int ElemBytes, __m256 (*Load)(const uint8_t*), float (*One)(const uint8_t*)>
MS_AVX2 inline float dot_dense(const uint8_t* w, const float* x, int64_t n) {

    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(Load(w + (i + 0) * ElemBytes), _mm256_loadu_ps(x + i + 0), a0);
        a1 = _mm256_fmadd_ps(Load(w + (i + 8) * ElemBytes), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(Load(w + (i + 16) * ElemBytes), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(Load(w + (i + 24) * ElemBytes), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(Load(w + i * ElemBytes), _mm256_loadu_ps(x + i), a0);
    float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) acc += One(w + i * ElemBytes) * x[i];
    return acc;
}

float one_f32(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}
MS_AVX2 float one_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
float one_bf16(const uint8_t* p) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return bf16_bits_to_f32(b);
}

}  // namespace

MS_AVX2 float dot_f32_avx2(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n >= 0);
    return dot_dense<4, load_f32x8, one_f32>(static_cast<const uint8_t*>(row), x, n);
}

MS_AVX2 float dot_f16_avx2(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n >= 0);
    return dot_dense<2, load_f16x8, one_f16>(static_cast<const uint8_t*>(row), x, n);
}

MS_AVX2 float dot_bf16_avx2(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n >= 0);
    return dot_dense<2, load_bf16x8, one_bf16>(static_cast<const uint8_t*>(row), x, n);
}

// Per block the 32 products are summed unscaled, then multiplied by the block scale once, the
// same association as the scalar kernel (only the order inside the block differs).
MS_AVX2 float dot_q8_0_avx2(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    const auto* b = static_cast<const uint8_t*>(row);
    const int64_t nb = n / kBlock;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ++ib, b += sizeof(block_q8_0), x += kBlock) {
        uint16_t dh;
        std::memcpy(&dh, b, 2);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
        const uint8_t* q = b + 2;
        __m256 s0 = _mm256_mul_ps(load_i8x8(q + 0), _mm256_loadu_ps(x + 0));
        __m256 s1 = _mm256_mul_ps(load_i8x8(q + 8), _mm256_loadu_ps(x + 8));
        s0 = _mm256_fmadd_ps(load_i8x8(q + 16), _mm256_loadu_ps(x + 16), s0);
        s1 = _mm256_fmadd_ps(load_i8x8(q + 24), _mm256_loadu_ps(x + 24), s1);
        // Two block accumulators so consecutive blocks do not wait on one FMA chain.
        if (ib & 1) acc1 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), d, acc1);
        else acc0 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), d, acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

// One MXFP4 block as the sum of its 32 products, unscaled. The nibbles become fp16 bit patterns
// with one pshufb: every doubled E2M1 value (0, +-1 .. +-12) is an fp16 whose low byte is zero,
// so the table holds only the high byte, unpack puts it in place and F16C widens exactly.
MS_AVX2 inline __m256 mxfp4_block_sum(const uint8_t* qs, const float* x) {
    const __m128i table = _mm_setr_epi8(0x00, 0x3c, 0x40, 0x42, 0x44, 0x46, 0x48, 0x4a,  //
                                        char(0x80), char(0xbc), char(0xc0), char(0xc2), char(0xc4),
                                        char(0xc6), char(0xc8), char(0xca));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m128i zero = _mm_setzero_si128();
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, low4));                     // 0..15
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), low4));  // 16..31
    __m256 s0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(zero, lo)), _mm256_loadu_ps(x + 0));
    __m256 s1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(zero, lo)), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(zero, hi)), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(zero, hi)), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

// Doubled E2M1 values times the halved e8m0 scale 2^(E-128): every product is exact before
// accumulation. Two blocks per iteration into two accumulators hide the FMA latency.
MS_AVX2 float dot_mxfp4_avx2(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    const auto* b = static_cast<const uint8_t*>(row);
    const int64_t nb = n / kBlock;
    constexpr int64_t bb = sizeof(block_mxfp4);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2, b += 2 * bb, x += 2 * kBlock) {
        acc0 = _mm256_fmadd_ps(mxfp4_block_sum(b + 1, x), _mm256_broadcast_ss(&kE8m0Half.v[b[0]]), acc0);
        acc1 = _mm256_fmadd_ps(mxfp4_block_sum(b + bb + 1, x + kBlock), _mm256_broadcast_ss(&kE8m0Half.v[b[bb]]), acc1);
    }
    if (ib < nb) acc0 = _mm256_fmadd_ps(mxfp4_block_sum(b + 1, x), _mm256_broadcast_ss(&kE8m0Half.v[b[0]]), acc0);
    MS_ASSERT(ib + 1 >= nb);
    return hsum(_mm256_add_ps(acc0, acc1));
}

MS_AVX2 void dequantize_f16_avx2(const void* src, float* dst, int64_t n) {
    MS_ASSERT(n >= 0);
    const auto* p = static_cast<const uint8_t*>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(p + 2 * i));
    for (; i < n; ++i) dst[i] = one_f16(p + 2 * i);
}

}  // namespace moestream::quant::detail
