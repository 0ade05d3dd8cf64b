// Shared between quant.cpp (dispatch + scalar kernels), quant_avx2.cpp (AVX2/FMA/F16C kernels),
// quant_avx512.cpp (AVX-512 F/BW/VL kernels) and cpu_matmul.cpp. Not part of the public API.
#pragma once

#include <bit>
#include <cstdint>

#include "config/dtype.h"
#include "model/numeric.h"

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
constexpr float e8m0_half_to_f32(uint8_t e) { return numeric::e8m0_half_value(e); }

// 2^(E-128) for every e8m0 byte, so the SIMD loops read the block scale with one broadcast load.
// constexpr so it is valid even when a kernel runs during another file's static initialisation.
struct e8m0_half_table {
    float v[256] = {};
    constexpr e8m0_half_table() {
        for (int e = 0; e < 256; ++e) v[e] = e8m0_half_to_f32(uint8_t(e));
    }
};
inline constexpr e8m0_half_table kE8m0Half;

inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// dot(row, x) of n elements.
using dot_fn = float (*)(const void* row, const float* x, int64_t n);
// out[r] = dot(rows + r * stride, x, n) for r < 4. Four rows share the loads of x and the final
// horizontal sums; each value is bit-identical to the same kernel set's dot_fn on that row.
using dot4_fn = void (*)(const void* rows, int64_t stride, const float* x, int64_t n, float* out);

struct row_kernel {
    dot_fn one;
    dot4_fn four;
};

// The dispatcher's kernels for a compute-supported type (quant.cpp; what dot_row and matmul use).
row_kernel pick_row_kernel(ggml_type type);

// AVX2 kernels (quant_avx2.cpp). Only call when the CPU has avx2, fma and f16c.
float dot_f32_avx2(const void* row, const float* x, int64_t n);
float dot_f16_avx2(const void* row, const float* x, int64_t n);
float dot_bf16_avx2(const void* row, const float* x, int64_t n);
float dot_q8_0_avx2(const void* row, const float* x, int64_t n);
float dot_mxfp4_avx2(const void* row, const float* x, int64_t n);
void dequantize_f16_avx2(const void* src, float* dst, int64_t n);

// AVX-512 kernels (quant_avx512.cpp). Only call when the CPU also has avx512f, avx512bw and
// avx512vl. The dot4 versions are bit-identical to the single-row ones, row by row. F16 has none:
// on the target Xeon its four-row pass was slower than one row at a time (two-uop conversions).
float dot_f32_avx512(const void* row, const float* x, int64_t n);
float dot_f16_avx512(const void* row, const float* x, int64_t n);
float dot_bf16_avx512(const void* row, const float* x, int64_t n);
float dot_q8_0_avx512(const void* row, const float* x, int64_t n);
float dot_mxfp4_avx512(const void* row, const float* x, int64_t n);
void dot4_f32_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out);
void dot4_bf16_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out);
void dot4_q8_0_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out);
void dot4_mxfp4_avx512(const void* rows, int64_t stride, const float* x, int64_t n, float* out);

// Kernels for rows against an x whose every value is a bf16, passed as bf16 bits in a layout of
// the kernel's (its `pack` writes it, and says whether x qualifies), on CPUs with avx512_bf16.
// The dispatcher uses them exactly when x qualifies, for dot_row and matmul alike, so a value
// still depends only on (row, x). Decode's activations are norm outputs rounded to bf16.
//  - BF16 rows (pack_bf16_exact: x in order): AVX-512 BF16 dot products, exact products summed
//    in fp32 (the instruction treats denormal inputs as zero, far below anything a logit can
//    show), several times fewer instructions than widening the weights (LM head, routers).
//  - MXFP4 rows (pack_mxfp4_bf16x_avx512: x in pairs, stricter qualification): the same bits as
//    dot_mxfp4_avx512, with fewer shuffles (quant_avx512.cpp says why they are equal). Also
//    needs avx512_vbmi.
using dot_bf16x_fn = float (*)(const void* row, const uint16_t* xb, int64_t n);
using dot4_bf16x_fn = void (*)(const void* rows, int64_t stride, const uint16_t* xb, int64_t n, float* out);
// True when x qualifies; then out (n values) holds x in the kernel's layout (else anything).
using pack_bf16x_fn = bool (*)(const float* x, int64_t n, uint16_t* out);
struct bf16x_kernel {
    dot_bf16x_fn one = nullptr;
    dot4_bf16x_fn four = nullptr;
    pack_bf16x_fn pack = nullptr;
};
float dot_bf16x_avx512(const void* row, const uint16_t* xb, int64_t n);
void dot4_bf16x_avx512(const void* rows, int64_t stride, const uint16_t* xb, int64_t n, float* out);
float dot_mxfp4_bf16x_avx512(const void* row, const uint16_t* xp, int64_t n);
void dot4_mxfp4_bf16x_avx512(const void* rows, int64_t stride, const uint16_t* xp, int64_t n, float* out);
// The dispatcher's bf16-x kernels for rows of `type`; empty when the kernel set in use has none.
bf16x_kernel pick_bf16x_kernel(ggml_type type);
// True when every x[i] is exactly a bf16 (the low 16 bits of its fp32 are zero); then out[i]
// holds its bf16 bits. NaN payloads that do not survive count as not exact.
bool pack_bf16_exact(const float* x, int64_t n, uint16_t* out);
// Bounds on the nonzero |x| of pack_mxfp4_bf16x_avx512.
inline constexpr float kBf16xMin = 0x1p-100f, kBf16xMax = 0x1p100f;
// True when every x[i] is a bf16 that is zero or has kBf16xMin <= |x[i]| <= kBf16xMax (so no
// inf, NaN or subnormal); then out holds x in pairs per 32-value block: word 2i = x[i] and word
// 2i + 1 = x[i + 16] (bf16 bits). n % 32 == 0. Only call when the CPU has avx512f/bw/vl.
bool pack_mxfp4_bf16x_avx512(const float* x, int64_t n, uint16_t* out);

}  // namespace moestream::quant::detail
