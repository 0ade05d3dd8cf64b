// Shared between quant.cpp (dispatch + scalar kernels) and quant_avx2.cpp (AVX2/FMA/F16C
// kernels). Not part of the public API.
#pragma once

#include <bit>
#include <cstdint>

namespace moestream::quant::detail {

// ggml block layouts, byte for byte (no padding: both are all-byte members after the scale).
struct block_q8_0 {
    uint16_t d;      // fp16 scale
    int8_t qs[32];   // value = qs[i] * d
};
static_assert(sizeof(block_q8_0) == 34);

struct block_mxfp4 {
    uint8_t e;       // e8m0 shared exponent
    uint8_t qs[16];  // byte j: element j (low nibble), element j + 16 (high nibble)
};
static_assert(sizeof(block_mxfp4) == 17);

inline constexpr int kBlock = 32;

// E2M1 codes doubled so they are small integers (exact in int8); the block scale is then halved
// (2^(E-128)) to compensate. This is ggml's kvalues_mxfp4 table.
inline constexpr int8_t kE2m1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e-128) exactly, as the matching scale for kE2m1Doubled; NaN for e = 0xff. e <= 1 yields
// fp32 subnormals (2^-128, 2^-127), which are still exact.
constexpr float e8m0_half_to_f32(uint8_t e) {
    uint32_t bits = 0;
    if (e == 0xff) bits = 0x7fc00000u;
    else if (e >= 2) bits = uint32_t(e - 1) << 23;
    else bits = 0x00200000u << e;  // 2^-128 = 0x00200000, 2^-127 = 0x00400000
    return std::bit_cast<float>(bits);
}

inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// AVX2 kernels (quant_avx2.cpp). Only call when the CPU has avx2, fma and f16c.
float dot_f32_avx2(const void* row, const float* x, int64_t n);
float dot_f16_avx2(const void* row, const float* x, int64_t n);
float dot_bf16_avx2(const void* row, const float* x, int64_t n);
float dot_q8_0_avx2(const void* row, const float* x, int64_t n);
float dot_mxfp4_avx2(const void* row, const float* x, int64_t n);
void dequantize_f16_avx2(const void* src, float* dst, int64_t n);
// AVX-512F versions of the quantized dots (same file; only call when the CPU has avx512f too).
float dot_q8_0_avx512(const void* row, const float* x, int64_t n);
float dot_mxfp4_avx512(const void* row, const float* x, int64_t n);

}  // namespace moestream::quant::detail
