// Scalar numeric conversions shared by the CPU kernels and the CUDA kernels (MS_HD: callable
// from both), so the two backends encode and decode every format with the same operations:
// bf16 rounding, the minifloat formats of the reference's activations (fp8 e4m3, fp4 e2m1,
// e8m0 scales) and the fp32 exp that both backends' softmax and SwiGLU use.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define MS_HD __host__ __device__ __forceinline__ constexpr
#else
#define MS_HD [[gnu::always_inline]] constexpr inline
#endif

namespace moestream::numeric {

MS_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    return std::bit_cast<uint32_t>(f);
#endif
}

MS_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

MS_HD int64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
    return __double_as_longlong(d);
#else
    return std::bit_cast<int64_t>(d);
#endif
}

MS_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(u));
#else
    return std::bit_cast<double>(u);
#endif
}

// Round to the nearest bf16 value (ties to even), kept in float storage. Branch-free so loops
// over it vectorise: infinities survive the carry (0x7f80'0000 + 0x7fff truncates back), finite
// values overflowing to inf is the right RNE result, and NaN is the one case selected separately
// (kept a quiet NaN).
MS_HD float round_bf16(float f) {
    const uint32_t u = float_bits(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
    return bits_float((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// 2^k as a float for a k of the normal range [-126, 127] (exact).
MS_HD float pow2(int k) { return bits_float(uint32_t(k + 127) << 23); }

// ---- minifloats ----
// Layout of a small binary float format without inf: `mbits` mantissa bits, exponent `bias`,
// largest finite magnitude code `max_code` (codes are sign-less here).
struct minifloat {
    int mbits;
    int bias;
    uint32_t max_code;
};
// As functions, which device code can call (it cannot read a host constant of class type).
MS_HD minifloat f16_format() { return {10, 15, 0x7bff}; }
MS_HD minifloat e4m3_format() { return {3, 7, 0x7e}; }  // 0x7f is NaN, so 0x7e (448) is the largest
MS_HD minifloat e2m1_format() { return {1, 1, 0x7}; }
inline constexpr minifloat kF16 = f16_format();
inline constexpr minifloat kE4m3 = e4m3_format();
inline constexpr minifloat kE2m1 = e2m1_format();

// Round-to-nearest-even of the positive finite fp32 `a` into `fmt`, returning the magnitude code
// before any overflow handling (may exceed max_code; the caller saturates or makes inf). Works on
// the integer significand so the result does not depend on the FPU rounding mode or FTZ.
MS_HD uint32_t encode_minifloat(float a, const minifloat& fmt) {
    const uint32_t bits = float_bits(a);
    const int field = int(bits >> 23);
    if (bits == 0) return 0;
    const int e_unb = (field == 0 ? 1 : field) - 127;                  // exponent of the fp32 quantum + 23
    const uint32_t sig = (bits & 0x7fffffu) | (field ? 0x800000u : 0u);  // a = sig * 2^(e_unb-23)
    const int emin = 1 - fmt.bias;                                       // smallest normal exponent
    // Above the format's range by more than a binade: report "overflow" without shifting by
    // negative amounts (the target exponent field would not fit anyway).
    if (e_unb > emin + 40) return fmt.max_code + 1;
    const int e_tgt = e_unb > emin ? e_unb : emin;               // subnormals share emin's quantum
    const int shift = (e_tgt - fmt.mbits) - (e_unb - 23);        // >= 13 for every format here
    uint32_t q = 0;
    if (shift < 32) {
        q = sig >> shift;
        const uint32_t rem = sig & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) ++q;  // carry may bump the exponent
    }
    // Normal: field (e_tgt + bias) holds q - 2^mbits; subnormal: field 0 holds q. Both are this.
    return (uint32_t(e_tgt + fmt.bias - 1) << fmt.mbits) + q;
}

// OCP FP8 E4M3 (no inf; 0x7f/0xff are NaN; max 448).
MS_HD float e4m3_value(uint8_t v) {
    const int exp = (v >> 3) & 0xf;
    const int man = v & 0x7;
    if (exp == 0xf && man == 0x7) return bits_float(0x7fc00000u);
    const float mag = exp == 0 ? float(man) * pow2(-9)             // subnormal: m * 2^-9
                               : float(8 + man) * pow2(exp - 10);  // (1 + m/8) 2^(e-7)
    return (v & 0x80u) ? -mag : mag;
}

// RNE, saturating to +-448; NaN keeps its sign as 0x7f.
MS_HD uint8_t e4m3_code(float f) {
    const uint32_t bits = float_bits(f);
    const uint8_t sign = (bits >> 31) ? 0x80 : 0x00;
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint8_t(sign | 0x7f);
    constexpr minifloat fmt = e4m3_format();
    if (abs == 0x7f800000u) return uint8_t(sign | fmt.max_code);  // saturating: no inf in e4m3
    const uint32_t code = encode_minifloat(bits_float(abs), fmt);
    return uint8_t(sign | (code < fmt.max_code ? code : fmt.max_code));
}

// 2^(e-127); 0xff is NaN; e = 0 is the fp32 subnormal 2^-127, still exact.
MS_HD float e8m0_value(uint8_t e) {
    if (e == 0xff) return bits_float(0x7fc00000u);
    return e == 0 ? bits_float(0x00400000u) : bits_float(uint32_t(e) << 23);
}

// E2M1 codes doubled so they are small integers (exact in int8): ggml's kvalues_mxfp4; the
// matching block scale is then halved (2^(E-128)).
MS_HD int e2m1_doubled(uint8_t nibble) {
    const int mag = (nibble & 7) < 2 ? (nibble & 7) : (2 + (nibble & 1)) << (((nibble & 7) >> 1) - 1);
    return (nibble & 8) ? -mag : mag;
}

// {0,.5,1,1.5,2,3,4,6}, bit 3 = sign (code 8 is -0).
MS_HD float e2m1_value(uint8_t nibble) {
    const float mag = float(e2m1_doubled(nibble & 7)) * 0.5f;
    return (nibble & 8) ? -mag : mag;
}

// Nearest, ties to the even code, clamped to +-6; NaN decodes as 0 (E2M1 has no NaN).
MS_HD uint8_t e2m1_code(float f) {
    const uint32_t bits = float_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0;
    const uint8_t sign = (bits >> 31) ? 0x8 : 0x0;
    const float a = bits_float(bits & 0x7fffffffu);
    constexpr minifloat fmt = e2m1_format();
    if (a >= 6.0f) return uint8_t(sign | fmt.max_code);  // also catches inf
    const uint32_t code = encode_minifloat(a, fmt);
    return uint8_t(sign | (code < fmt.max_code ? code : fmt.max_code));
}

// 2^(e-128) exactly, the scale matching e2m1_doubled; NaN for e = 0xff. e <= 1 yields fp32
// subnormals (2^-128, 2^-127), which are still exact.
MS_HD float e8m0_half_value(uint8_t e) {
    if (e == 0xff) return bits_float(0x7fc00000u);
    if (e >= 2) return bits_float(uint32_t(e - 1) << 23);
    return bits_float(0x00200000u << e);  // 2^-128 = 0x00200000, 2^-127 = 0x00400000
}

// ---- exp ----
// exp(x) for a double x in [-128, 128] (a float widened: exact). x = k ln2 + r with k =
// round(x / ln2) (the 1.5·2^52 shift rounds to nearest and leaves k in the low mantissa bits),
// |r| <= ln2/2, ln2 split so k·ln2_hi is exact; exp(r) by the Taylor series to r^11 (truncation
// error < 7e-15 relative), times 2^k built from the bits. NaN propagates through the arithmetic.
// Every product and sum is rounded on its own (no fused multiply-add, in either compiler: the
// CPU build has -ffp-contract=off, the device code says so with the _rn intrinsics), so both
// backends give the same bits.
#if defined(__CUDA_ARCH__)
#define MS_DMUL(a, b) __dmul_rn(a, b)
#define MS_DADD(a, b) __dadd_rn(a, b)
#else
#define MS_DMUL(a, b) ((a) * (b))
#define MS_DADD(a, b) ((a) + (b))
#endif
MS_HD double exp_in_double(double x) {
    constexpr double log2e = 0x1.71547652b82fep0, shift = 0x1.8p52;
    constexpr double ln2_hi = 0x1.62e42fee00000p-1, ln2_lo = 0x1.a39ef35793c76p-33;
    const double shifted = MS_DADD(MS_DMUL(x, log2e), shift);
    const double k = MS_DADD(shifted, -shift);
    const int64_t ki = double_bits(shifted) - double_bits(shift);
    const double two_k = bits_double(uint64_t(ki + 1023) << 52);
    const double r = MS_DADD(MS_DADD(x, -MS_DMUL(k, ln2_hi)), -MS_DMUL(k, ln2_lo));
    double p = 1.0 / 39916800;
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 3628800);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 362880);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 40320);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 5040);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 720);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 120);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 24);
    p = MS_DADD(MS_DMUL(p, r), 1.0 / 6);
    p = MS_DADD(MS_DMUL(p, r), 0.5);
    p = MS_DADD(MS_DMUL(p, r), 1.0);
    p = MS_DADD(MS_DMUL(p, r), 1.0);
    return MS_DMUL(p, two_k);
}
#undef MS_DMUL
#undef MS_DADD

// exp for any float: magnitudes above 128 (inf included) are clamped to ±128, whose exp is
// already inf / 0 in fp32. The clamp works on the bits (integer selects) because a float
// compare-and-select here makes GCC branch on the constant instead of vectorising; NaN (bits
// above inf) is left alone and comes out NaN.
MS_HD float exp_float(float x) {
    const uint32_t u = float_bits(x);
    const uint32_t mag = u & 0x7fffffffu;
    constexpr uint32_t k128 = 0x43000000u, kInf = 0x7f800000u;
    const uint32_t clamped = (mag > k128 && mag <= kInf) ? ((u & 0x80000000u) | k128) : u;
    return float(exp_in_double(double(bits_float(clamped))));
}

}  // namespace moestream::numeric
